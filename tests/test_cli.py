"""The student and instructor loops, driven through the `tito` CLI in temporary folders.

A student edition is made once per session with `tito student init`; each test works on its own
copy, running that edition's own `tito` and `tinytorch` (PYTHONPATH points at the copy).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tito import notebooks as nbs
from tito.course import Settings, find_stubs, load_modules
from tito.progress import Progress, atomic_write_text
from tito.student import find_leaks, tracked_files

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]
MODULES = load_modules(ROOT)


def tito(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd), MPLBACKEND="Agg", COLUMNS="200", TITO_STATE_DIR="")
    env.pop("TITO_STATE_DIR")
    env.pop("TITO_ROOT", None)
    proc = subprocess.run([sys.executable, "-m", "tito.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    proc.output = proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="session")
def student_edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("student") / "edition"
    proc = tito(ROOT, "student", "init", str(dest))
    assert proc.returncode == 0, proc.output
    return dest


@pytest.fixture
def edition(student_edition, tmp_path) -> Path:
    """A private copy of the student edition."""
    dest = tmp_path / "mine"
    shutil.copytree(student_edition, dest, symlinks=True)
    return dest


def use_reference(edition: Path, slug: str) -> None:
    """Put the instructor's solution notebook in place of the student's."""
    shutil.copy2(ROOT / "modules" / slug / f"{slug}.ipynb", edition / "modules" / slug / f"{slug}.ipynb")


# ----------------------------------------------------------------- the student edition


def test_student_edition_has_no_solutions(student_edition):
    lines = nbs.course_solution_lines([nbs.read(m.notebook) for m in MODULES])
    assert lines, "the source notebooks should have solution lines to look for"
    assert find_leaks(student_edition, lines) == []
    assert not (student_edition / ".git").exists() and not (student_edition / "nbgrader").exists()
    assert Settings.load(student_edition).edition == "student"
    for m in MODULES:
        nb_path = student_edition / "modules" / m.slug / f"{m.slug}.ipynb"
        text = nb_path.read_text()
        assert nbs.BEGIN_SOLUTION not in text and nbs.BEGIN_HIDDEN not in text
        assert (nb_path.parent / ".release.ipynb").read_text() == text
        stubs = find_stubs(m.package_file(student_edition))
        assert stubs, f"{m.package_module} in the student edition should be stubs"


def test_student_edition_package_imports_and_stubs_raise_only_when_called(student_edition):
    code = ("import tinytorch.core.tensor as t\n"
            "try:\n    t.Tensor([1.0])\nexcept NotImplementedError:\n    print('stub raised')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=student_edition, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(student_edition)))
    assert proc.returncode == 0 and "stub raised" in proc.stdout, proc.stderr


def test_student_init_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = tito(ROOT, "student", "init", str(tmp_path))
    assert proc.returncode == 2 and "not empty" in proc.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_student_init_force_replaces_only_after_a_complete_build(tmp_path):
    (tmp_path / "old.txt").write_text("previous edition")
    proc = tito(ROOT, "student", "init", str(tmp_path), "--force")
    assert proc.returncode == 0, proc.output
    assert not (tmp_path / "old.txt").exists() and (tmp_path / "modules" / "01_tensor" / ".release.ipynb").exists()
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}.partial"))


def test_student_init_refused_inside_a_student_edition(edition, tmp_path):
    proc = tito(edition, "student", "init", str(tmp_path / "again"))
    assert proc.returncode == 2 and "already a student edition" in proc.output


# ----------------------------------------------------------------- the student loop


def test_stubs_fail_naming_the_functions_to_fix(edition):
    proc = tito(edition, "test", "01")
    assert proc.returncode == 1, proc.output
    out = proc.output
    for fn in ("broadcast_shape", "Tensor.__init__"):
        assert f"not implemented yet: {fn}" in out, out
    assert "Traceback" not in out, "stubs must be reported as a line, not a traceback wall"
    assert re.search(r"notebook score 0/\d+", out)


def test_reference_solution_completes_and_unlocks(edition):
    proc = tito(edition, "module", "start", "02", "--no-lab")
    assert proc.returncode == 2 and "01 (Tensor)" in proc.output, proc.output

    use_reference(edition, "01_tensor")
    proc = tito(edition, "module", "complete", "01")
    assert proc.returncode == 0, proc.output
    assert "completed" in proc.output and "unlocked: module 02" in proc.output
    assert find_stubs(edition / "tinytorch" / "core" / "tensor.py") == []

    data = json.loads((edition / ".tito" / "progress.json").read_text())
    assert data["schema_version"] == 1 and data["modules"]["01"]["completed"]
    assert data["modules"]["01"]["score"] == data["modules"]["01"]["max_score"] > 0

    status = tito(edition, "module", "status")
    assert re.search(r"01\s.*completed", status.output) and re.search(r"02\s.*ready", status.output)
    proc = tito(edition, "module", "start", "02", "--no-lab")
    assert proc.returncode == 0 and "02_activations.ipynb" in proc.output
    assert re.search(r"02\s.*in progress", tito(edition, "module", "list").output)

    proc = tito(edition, "checkpoint", "01")
    assert proc.returncode == 0 and "checkpoint 01 passed" in proc.output, proc.output


def test_checkpoint_fails_on_stubs(edition):
    proc = tito(edition, "checkpoint", "01")
    assert proc.returncode == 1 and "not implemented yet" in proc.output


def test_module_reset_backs_up_and_restores(edition):
    nb_path = edition / "modules" / "01_tensor" / "01_tensor.ipynb"
    nb = nbs.read(nb_path)
    nb.cells[0].source += "\n\nmy notes"
    nbs.write(nb, nb_path)
    proc = tito(edition, "module", "reset", "01", "--yes")
    assert proc.returncode == 0, proc.output
    assert nb_path.read_text() == (nb_path.parent / ".release.ipynb").read_text()
    backups = list((edition / ".tito" / "backups").glob("01_tensor-*.ipynb"))
    assert len(backups) == 1 and "my notes" in backups[0].read_text()


def test_reset_refused_in_the_instructor_edition():
    proc = tito(ROOT, "module", "reset", "01", "--yes")
    assert proc.returncode == 2 and "instructor edition" in proc.output


# ----------------------------------------------------------------- bad input


def test_unknown_module_is_named(edition):
    for args in (("test", "99"), ("module", "start", "nope", "--no-lab"), ("export", "42")):
        proc = tito(edition, *args)
        assert proc.returncode == 2, proc.output
        assert "unknown module" in proc.output and "01_tensor" in proc.output
        assert "Traceback" not in proc.output


def test_corrupt_progress_file_is_reported_and_backed_up(edition):
    state = edition / ".tito"
    state.mkdir()
    (state / "progress.json").write_text("{this is not json")
    proc = tito(edition, "module", "status")
    assert proc.returncode == 0, proc.output
    assert "could not be read" in proc.output and "moved to" in proc.output
    backups = list(state.glob("progress.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_text() == "{this is not json"
    assert json.loads((state / "progress.json").read_text())["schema_version"] == 1


def test_progress_from_a_future_version_is_kept_aside(tmp_path):
    (tmp_path / "progress.json").write_text(json.dumps({"schema_version": 99, "modules": {}}))
    p = Progress.load(tmp_path)
    assert p.warnings and "schema_version" in p.warnings[0]
    assert list(tmp_path.glob("progress.json.corrupt-*"))


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "progress.json"
    target.write_text("old")

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"], "no temporary file may be left behind"


def test_syntax_error_names_the_cell(edition):
    nb_path = edition / "modules" / "01_tensor" / "01_tensor.ipynb"
    nb = nbs.read(nb_path)
    cell = next(c for c in nb.cells if nbs.nbgrader_meta(c).get("grade_id") == "tensor_broadcast_shape")
    cell.source = cell.source.replace("raise NotImplementedError()", "return (1, 2")
    nbs.write(nb, nb_path)
    proc = tito(edition, "test", "01")
    assert proc.returncode == 1
    assert "tensor_broadcast_shape" in proc.output and "SyntaxError" in proc.output, proc.output


def test_unreadable_notebook_is_reported_not_crashed_on(edition):
    nb_path = edition / "modules" / "01_tensor" / "01_tensor.ipynb"
    nb_path.write_text('{"cells": [ this is broken')
    proc = tito(edition, "test", "01")
    assert proc.returncode == 2 and "cannot be read" in proc.output and "tito module reset" in proc.output
    assert "Traceback" not in proc.output
    assert nb_path.read_text() == '{"cells": [ this is broken', "the student's file must not be touched"


def test_doctor_passes_here():
    proc = tito(ROOT, "doctor")
    assert proc.returncode == 0, proc.output
    assert "alembic" in proc.output and "loopback" in proc.output


def test_module_list_reads_titles_from_metadata():
    out = tito(ROOT, "module", "list").output
    for m in MODULES:
        assert m.title in out and m.number in out


# ----------------------------------------------------------------- the instructor loop


@pytest.fixture
def instructor_copy(tmp_path) -> Path:
    dest = tmp_path / "course"
    for rel in tracked_files(ROOT):
        if rel.startswith((".git/", ".venv/", "nbgrader/")):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def test_instructor_loop_grades_correct_and_stub_differently(instructor_copy, tmp_path):
    course = instructor_copy
    proc = tito(course, "nbgrader", "generate", "01")
    assert proc.returncode == 0, proc.output
    release = course / "nbgrader" / "release" / "01_tensor" / "01_tensor.ipynb"
    assert release.exists() and nbs.BEGIN_SOLUTION not in release.read_text()

    assert tito(course, "nbgrader", "collect", "01", "--student", "alice",
                str(course / "modules" / "01_tensor" / "01_tensor.ipynb")).returncode == 0
    assert tito(course, "nbgrader", "collect", "01", "--student", "bob", str(release)).returncode == 0
    bad = tito(course, "nbgrader", "collect", "01", "--student", "../eve", str(release))
    assert bad.returncode == 2 and "student id" in bad.output

    proc = tito(course, "nbgrader", "autograde", "01")
    assert proc.returncode == 0, proc.output
    total = sum(float(nbs.nbgrader_meta(c)["points"]) for c in nbs.read(MODULES[0].notebook).cells
                if nbs.is_test_cell(c))
    assert re.search(rf"alice[\s│]+{total:g}[\s│]+{total:g}", proc.output), proc.output
    assert re.search(rf"bob[\s│]+0[\s│]+{total:g}", proc.output), proc.output

    proc = tito(course, "nbgrader", "feedback", "01")
    assert proc.returncode == 0, proc.output
    assert (course / "nbgrader" / "feedback" / "bob" / "01_tensor" / "01_tensor.html").exists()

    proc = tito(course, "nbgrader", "export")
    assert proc.returncode == 0, proc.output
    rows = (course / "nbgrader" / "grades.csv").read_text().splitlines()
    assert len(rows) == 3 and any(r.startswith("01_tensor") and ",alice," in r for r in rows)


def test_autograde_without_submissions_says_what_to_do(instructor_copy):
    proc = tito(instructor_copy, "nbgrader", "autograde", "01")
    assert proc.returncode == 2 and "tito nbgrader collect" in proc.output


@pytest.mark.parametrize("module", MODULES[1:], ids=[m.slug for m in MODULES[1:]])
def test_student_loop_for_later_modules(edition, module):
    """With its prerequisites done, a module's stubs fail naming functions, and its reference completes."""
    for slug in [m.slug for m in MODULES if m.number in module.prerequisites]:
        use_reference(edition, slug)
        proc = tito(edition, "export", slug)
        assert proc.returncode == 0, proc.output
    proc = tito(edition, "test", module.number)
    assert proc.returncode == 1, proc.output
    assert "not implemented yet:" in proc.output and "Traceback" not in proc.output

    use_reference(edition, module.slug)
    proc = tito(edition, "module", "complete", module.number)
    assert proc.returncode == 0, proc.output
    assert f"module {module.number} ({module.title}) completed" in proc.output
    assert find_stubs(module.package_file(edition)) == []
