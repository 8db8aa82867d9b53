"""A course copy per test, and a module's nbgrader release generated once per test run.

The instructor-loop tests (tests/test_grading.py, tests/test_cheats.py) each work on their own copy of the course
and need the release of module 01 or 02 in it. `tito nbgrader generate NN` (nbgrader's generate_assignment, about
5 s of CPU each time) writes the same release whatever the copy: it depends on the module's source notebook only.
So the real command runs once per module and test run, in a copy of its own (pytest-xdist's workers share it through
a lock), and `add_release(course, NN)` copies what it left into a test's course: the release folder and a gradebook
that knows that module only, and the nbgrader_config.py that the command would have written for this course.

    from tests.support.releases import copy_course, add_release
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def copy_course(dest: Path) -> Path:
    """The course's tracked files (no .git, .venv nor nbgrader folder) copied to `dest`, file times kept."""
    from tito.student import tracked_files

    for rel in tracked_files(ROOT):
        if rel.startswith((".git/", ".venv/", "nbgrader/")):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def _shared(tmp_path_factory) -> Path:
    """This test run's folder: every xdist worker's base folder is under it; without xdist, the base folder itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def generated_release(tmp_path_factory, number: str) -> Path:
    """The nbgrader folder of a course copy in which `tito nbgrader generate NUMBER` ran (once per test run)."""
    from filelock import FileLock

    shared = _shared(tmp_path_factory)
    where, status = shared / f"release-{number}", shared / f"release-{number}.status"
    with FileLock(str(shared / f"release-{number}.lock")):
        if not status.exists():
            shutil.rmtree(where, ignore_errors=True)  # a copy left by a run that died while generating
            course = copy_course(where / "course")
            env = dict(os.environ, PYTHONPATH=str(course), COLUMNS="250")
            env.pop("TITO_ROOT", None)
            proc = subprocess.run([sys.executable, "-m", "tito.main", "nbgrader", "generate", number], cwd=course,
                                  env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
            ok = proc.returncode == 0 and "release written" in proc.stdout
            status.write_text("ok" if ok else f"`tito nbgrader generate {number}` exited with {proc.returncode}:\n"
                                              f"{proc.stdout}{proc.stderr}")
    if status.read_text() != "ok":
        pytest.fail(status.read_text())
    return where / "course" / "nbgrader"


@pytest.fixture
def add_release(tmp_path_factory):
    """`add_release(course, "02")`: `course` as `tito nbgrader generate 02` leaves it (run once, copied)."""

    def add(course: Path, number: str) -> Path:
        from tito.course import Settings, get_module
        from tito.grading import release_path, write_config

        made = generated_release(tmp_path_factory, number)
        settings = Settings.load(course)
        module = get_module(course, number)
        nbroot = settings.nbgrader_root
        assert not (nbroot / "gradebook.db").exists(), "add_release: the course has a gradebook already"
        shutil.copytree(made / "release" / module.slug, nbroot / "release" / module.slug)  # file times kept: the
        shutil.copy2(made / "gradebook.db", nbroot / "gradebook.db")  # release is newer than its notebook
        write_config(settings)  # this course's paths and settings, as the command writes them
        out = release_path(settings, module)
        assert out.exists(), out
        return out

    return add
