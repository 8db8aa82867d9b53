"""The instructor loop: thin wrappers around nbgrader that need no server and no network.

Course layout (all under `settings.ini` [nbgrader] root, ignored by git):

    modules/NN_name/NN_name.ipynb                 source (nbgrader's source directory is modules/)
    nbgrader/release/NN_name/NN_name.ipynb        student version
    nbgrader/submitted/STUDENT/NN_name/...        what students handed in (`tito nbgrader collect`)
    nbgrader/autograded/STUDENT/NN_name/...       executed and scored
    nbgrader/feedback/STUDENT/NN_name/*.html      feedback reports
    nbgrader/gradebook.db                         the gradebook; nbgrader/grades.csv its export

nbgrader creates the gradebook by running the `alembic` executable found on PATH, so every call
puts this Python's `bin` folder first on PATH.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .course import CODE_STUB, CourseError, Module, Settings, edition_env
from .notebooks import read

STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def course_args(settings: Settings) -> list[str]:
    root = settings.root
    nbroot = settings.nbgrader_root
    rel = lambda p: os.path.relpath(p, root)  # noqa: E731
    gradebook = settings.path("nbgrader", "gradebook", "nbgrader/gradebook.db")
    timeout = int(settings.number("execution", "cell_timeout", 300))
    return [
        f"--CourseDirectory.root={root}",
        f"--CourseDirectory.course_id={settings.course_id}",
        "--CourseDirectory.source_directory=modules",
        f"--CourseDirectory.release_directory={rel(nbroot / 'release')}",
        f"--CourseDirectory.submitted_directory={rel(nbroot / 'submitted')}",
        f"--CourseDirectory.autograded_directory={rel(nbroot / 'autograded')}",
        f"--CourseDirectory.feedback_directory={rel(nbroot / 'feedback')}",
        f"--CourseDirectory.db_url=sqlite:///{gradebook}",
        f"--ExecutePreprocessor.timeout={timeout}",
        f"--ClearSolutions.code_stub=python={CODE_STUB}",
    ]


def nbgrader_env(settings: Settings) -> dict:
    env = edition_env(settings.root)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_nbgrader(settings: Settings, *args: str, capture: bool = True) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` for this course; raises CourseError with nbgrader's own words on failure."""
    if shutil.which("alembic", path=nbgrader_env(settings)["PATH"]) is None:
        raise CourseError("nbgrader needs the `alembic` command, which is not installed next to this Python: "
                          "reinstall with `pip install nbgrader`")
    settings.nbgrader_root.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "nbgrader", *args, *course_args(settings)]
    proc = subprocess.run(cmd, cwd=settings.root, env=nbgrader_env(settings), capture_output=capture, text=True)
    if proc.returncode != 0:
        out = (proc.stderr or "") + (proc.stdout or "")
        lines = [ln for ln in out.splitlines() if "[" in ln and ("ERROR" in ln or "CRITICAL" in ln)] or out.splitlines()
        raise CourseError(f"nbgrader {args[0]} failed:\n" + "\n".join(lines[-15:]))
    return proc


def generate(settings: Settings, module: Module) -> Path:
    run_nbgrader(settings, "generate_assignment", module.slug, "--force")
    out = settings.nbgrader_root / "release" / module.slug / module.notebook.name
    if not out.exists():
        raise CourseError(f"nbgrader reported success but {out} was not written")
    return out


def collect(settings: Settings, module: Module, student: str, notebook: Path) -> Path:
    """Put one student's notebook where nbgrader expects a submission."""
    if not STUDENT_ID_RE.match(student):
        raise CourseError(f"student id {student!r} may only contain letters, digits, '.', '_' and '-'")
    notebook = Path(notebook)
    if notebook.is_dir():
        candidate = notebook / "modules" / module.slug / module.notebook.name
        notebook = candidate if candidate.exists() else notebook / module.notebook.name
    read(notebook)  # a damaged file is reported now, not at grading time
    dest = settings.nbgrader_root / "submitted" / student / module.slug
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(notebook, dest / module.notebook.name)
    (dest / "timestamp.txt").write_text(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    return dest / module.notebook.name


def submitted_students(settings: Settings, module: Module) -> list[str]:
    sub = settings.nbgrader_root / "submitted"
    return sorted(d.name for d in sub.iterdir() if (d / module.slug).is_dir()) if sub.is_dir() else []


def autograde(settings: Settings, module: Module, student: str | None = None) -> subprocess.CompletedProcess:
    release = settings.nbgrader_root / "release" / module.slug / module.notebook.name
    if not release.exists():
        generate(settings, module)  # the gradebook must know the assignment and its test cells
    students = [student] if student else submitted_students(settings, module)
    if not students:
        raise CourseError(f"no submissions for {module.slug} under {settings.nbgrader_root / 'submitted'}: "
                          f"add them with `tito nbgrader collect {module.number} --student ID NOTEBOOK`")
    for s in students:
        if not (settings.nbgrader_root / "submitted" / s / module.slug).is_dir():
            raise CourseError(f"student {s!r} has no submission for {module.slug}")
    args = ["autograde", module.slug, "--force"] + ([f"--student={student}"] if student else [])
    return run_nbgrader(settings, *args)


def feedback(settings: Settings, module: Module, student: str | None = None) -> Path:
    args = ["generate_feedback", module.slug, "--force"] + ([f"--student={student}"] if student else [])
    run_nbgrader(settings, *args)
    return settings.nbgrader_root / "feedback"


def export_grades(settings: Settings) -> tuple[Path, list[dict]]:
    out = settings.path("nbgrader", "grades_csv", "nbgrader/grades.csv")
    tmp = out.with_name(out.name + ".tmp")
    run_nbgrader(settings, "export", f"--to={tmp}")
    os.replace(tmp, out)
    with out.open(newline="") as f:
        return out, list(csv.DictReader(f))


def scores(settings: Settings, module: Module) -> dict[str, tuple[float, float]]:
    """student -> (score, max_score) for `module`, read from the gradebook."""
    from nbgrader.api import Gradebook

    gradebook = settings.path("nbgrader", "gradebook", "nbgrader/gradebook.db")
    out = {}
    with Gradebook(f"sqlite:///{gradebook}", course_id=settings.course_id) as gb:
        for s in gb.students:
            try:
                sub = gb.find_submission(module.slug, s.id)
            except Exception:
                continue
            out[s.id] = (float(sub.score), float(sub.max_score))
    return out
