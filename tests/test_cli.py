"""The student and instructor loops, driven through the `tito` CLI in temporary folders.

A student edition is made once per session with `tito student init`; each test works on its own
copy, running that edition's own `tito` and `tinytorch` (PYTHONPATH points at the copy).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tito import notebooks as nbs
from tito.course import Settings, all_prerequisites, find_stubs, load_modules
from tito.progress import Progress, atomic_write_text
from tito.student import find_leaks

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]
MODULES = load_modules(ROOT)


# A student edition does not need PyTorch (its quick start installs `.[test]` only), so the student's processes
# here run as on such a machine: a `sitecustomize` on their PYTHONPATH (tests/support/no_torch_site) hides torch
# from tito, the notebook's kernel and the package tests alike. The package tests then take their NumPy references,
# and a notebook that needed torch would fail here. Where torch is installed, its comparisons run in the module tests.
NO_TORCH_SITE = ROOT / "tests" / "support" / "no_torch_site"


def student_env(edition: Path, **extra: str) -> dict:
    """The environment of a student's `tito` in `edition`: its own package first, torch hidden, no tito overrides."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(edition), str(NO_TORCH_SITE)]), MPLBACKEND="Agg",
               COLUMNS="200", **extra)
    env.pop("TITO_STATE_DIR", None)
    env.pop("TITO_ROOT", None)
    return env


def tito(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = student_env(cwd)
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


def edit_solution(edition: Path, grade_id: str, code: str, slug: str = "01_tensor") -> None:
    """Put `code` where the release's stub (`raise NotImplementedError()`) is in solution cell `grade_id`."""
    nb_path = edition / "modules" / slug / f"{slug}.ipynb"
    nb = nbs.read(nb_path)
    cell = next(c for c in nb.cells if nbs.nbgrader_meta(c).get("grade_id") == grade_id)
    assert "raise NotImplementedError()" in cell.source
    cell.source = cell.source.replace("raise NotImplementedError()", code, 1)
    nbs.write(nb, nb_path)


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
    dest = tmp_path / "my edition é"  # the `cd` line must work when pasted: the path is quoted
    dest.mkdir()
    (dest / "old.txt").write_text("previous edition")
    proc = tito(ROOT, "student", "init", str(dest), "--force")
    assert proc.returncode == 0, proc.output
    assert '.venv/bin/pip install -e ".[test]"' in proc.output, "the next: lines name the one install command"
    assert f"cd {shlex.quote(str(dest))}\n" in proc.output, proc.output
    assert not (dest / "old.txt").exists() and (dest / "modules" / "01_tensor" / ".release.ipynb").exists()
    assert not list(dest.parent.glob(f".{dest.name}.partial"))


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
    assert "trusted checks" not in out, "the note on the autograder's own checks is for a run that passed"


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
    assert "tito module restore 01" in proc.output, "reset says how to bring the notebook back"

    proc = tito(edition, "module", "restore", "01", "--yes")  # the latest backup by default
    assert proc.returncode == 0, proc.output
    assert "my notes" in nb_path.read_text(), "restore brings back the backed-up notebook"
    new = sorted(set((edition / ".tito" / "backups").glob("01_tensor-*.ipynb")) - set(backups))
    assert len(new) == 1 and "my notes" not in new[0].read_text(), "the notebook it replaced is backed up"
    assert str(new[0]) in proc.output, proc.output

    proc = tito(edition, "module", "restore", "01", new[0].name, "--yes")  # a named backup
    assert proc.returncode == 0, proc.output
    assert "my notes" not in nb_path.read_text()
    proc = tito(edition, "module", "restore", "01", "01_tensor-nope.ipynb", "--yes")
    assert proc.returncode == 2 and "not found" in proc.output and new[0].name in proc.output, proc.output
    proc = tito(edition, "module", "restore", "02", "--yes")
    assert proc.returncode == 2 and "no backup of module 02" in proc.output, proc.output


def test_the_students_processes_run_without_torch(edition):
    """The student's tito, kernel and package tests here cannot import torch (see NO_TORCH_SITE)."""
    code = "try:\n    import torch\nexcept ModuleNotFoundError as e:\n    print('no torch:', e)\nelse:\n    print('torch', torch.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=edition, env=student_env(edition), capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.startswith("no torch:") and "hidden by tests.support.no_torch" in proc.stdout, proc.stdout + proc.stderr


def test_reset_refused_in_the_instructor_edition():
    proc = tito(ROOT, "module", "reset", "01", "--yes")
    assert proc.returncode == 2 and "instructor edition" in proc.output


def test_complete_refuses_a_module_whose_prerequisites_are_incomplete(edition):
    use_reference(edition, "13_transformers")
    write_progress(edition, {n: {"completed": "2024-01-01T00:00:00"} for n in ("01", "02", "03", "04", "05", "06", "07", "11")})
    proc = tito(edition, "module", "complete", "13")
    assert proc.returncode == 2, proc.output
    assert "needs 12 (" in proc.output and "`tito module complete 12`" in proc.output and "--force" in proc.output
    assert "completed" not in json.loads((edition / ".tito" / "progress.json").read_text())["modules"].get("13", {})
    assert "milestone ready" not in proc.output


def test_concurrent_completions_in_two_terminals_are_both_recorded(edition):
    use_reference(edition, "01_tensor")
    assert tito(edition, "export", "01").returncode == 0
    write_progress(edition, {"01": {"completed": "2024-01-01T00:00:00"}})
    for slug in ("02_activations", "05_dataloader"):
        use_reference(edition, slug)
    env = student_env(edition)
    procs = [subprocess.Popen([sys.executable, "-m", "tito.main", "module", "complete", n], cwd=edition, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
             for n in ("02", "05")]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    recorded = json.loads((edition / ".tito" / "progress.json").read_text())["modules"]
    kept = {n for n, e in recorded.items() if e.get("completed")}
    assert kept == {"01", "02", "05"}, f"completed in the progress file: {sorted(kept)}; expected 01, 02 and 05"


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
    edit_solution(edition, "tensor_broadcast_shape", "return (1, 2")
    proc = tito(edition, "test", "01")
    assert proc.returncode == 1
    assert "Exercise 1.1: broadcast_shape (your solution)" in proc.output and "SyntaxError" in proc.output, proc.output
    assert not re.search(r"\bcell \d+", proc.output), "JupyterLab shows no cell numbers: name the exercise"


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


# The instructor loop (nbgrader) is tested end to end on simulated classes in tests/test_grading.py.


# The whole loop per module costs about a minute (a stub run and a reference run of the notebook and the
# package tests). Every module's parts are checked elsewhere: its stubs fail their graded cells
# (test_notebooks) and package tests (test_references), its reference passes both, and module.toml names
# every module it imports (test_notebooks). Here the loop runs end to end for the modules whose plumbing
# differs: the first with a prerequisite, autograd's and the GPT's forward references, the C compiler,
# the caches, and asyncio and HTTP (the newest); TINYTORCH_EVERY_STUDENT_LOOP=1 runs it for every module.
# The stub half (`tito test` on the release fails naming the functions) is the same path for every module
# (test_stubs_fail_naming_the_functions_to_fix runs it for 01): here it runs for the first and the newest.
EVERY_LOOP = os.environ.get("TINYTORCH_EVERY_STUDENT_LOOP") == "1"
LOOP_MODULES = ("02", "06", "13", "17", "18", "20")
STUB_LOOP = ("02", "20")
LATER = [m for m in MODULES[1:] if m.number in LOOP_MODULES or EVERY_LOOP]


@pytest.mark.parametrize("module", LATER, ids=[m.slug for m in LATER])
def test_student_loop_for_later_modules(edition, module):
    """With its prerequisites done, a module's stubs fail naming functions, and its reference completes."""
    for slug in [m.slug for m in MODULES if m.number in module.prerequisites]:
        use_reference(edition, slug)
    proc = tito(edition, "export")  # one nbdev run for all of them (later modules export their stubs)
    assert proc.returncode == 0, proc.output
    if module.number in STUB_LOOP or EVERY_LOOP:
        proc = tito(edition, "test", module.number)
        assert proc.returncode == 1, proc.output
        assert "not implemented yet:" in proc.output and "Traceback" not in proc.output

    use_reference(edition, module.slug)
    first = min(module.prerequisites)
    proc = tito(edition, "module", "complete", module.number)  # exported is not completed
    assert proc.returncode == 2, proc.output
    assert f"needs {first} (" in proc.output and f"tito module complete {first}" in proc.output, proc.output
    write_progress(edition, {n: {"completed": "2024-01-01T00:00:00"} for n in all_prerequisites(ROOT, module)})
    proc = tito(edition, "module", "complete", module.number)
    assert proc.returncode == 0, proc.output
    assert f"module {module.number} ({module.title}) completed" in proc.output
    assert find_stubs(module.package_file(edition)) == []


# ----------------------------------------------------------------- the student loop, hardened


def set_setting(edition: Path, key: str, value: str) -> None:
    ini = edition / "settings.ini"
    text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", ini.read_text())
    assert n == 1, f"settings.ini has no {key}"
    ini.write_text(text)


def write_progress(edition: Path, modules: dict) -> str:
    text = json.dumps({"schema_version": 1, "modules": modules}, indent=2) + "\n"
    atomic_write_text(edition / ".tito" / "progress.json", text)
    return text


def test_failed_export_leaves_the_package_and_uncompletes_the_module(edition):
    package = edition / "tinytorch" / "core" / "tensor.py"
    before = package.read_bytes()
    write_progress(edition, {"01": {"started": "2024-01-01T00:00:00", "completed": "2024-01-01T01:00:00",
                                    "score": 16, "max_score": 16}})
    edit_solution(edition, "tensor_broadcast_shape", "return (1, 2")
    proc = tito(edition, "export", "01")
    assert proc.returncode == 2, proc.output
    assert "Exercise 1.1: broadcast_shape (your solution): SyntaxError on line" in proc.output, proc.output
    assert "package was not changed" in proc.output and "no longer marked completed" in proc.output
    assert package.read_bytes() == before, "a failed export must not touch the package"
    status = tito(edition, "module", "status").output
    assert re.search(r"01\s.*in progress", status) and "tito module complete 01" in status, status
    assert "next: tito module start 01" not in status

    # valid Python that does not import is refused too
    nb_path = edition / "modules" / "01_tensor" / "01_tensor.ipynb"
    shutil.copy2(nb_path.parent / ".release.ipynb", nb_path)
    nb = nbs.read(nb_path)
    cell = next(c for c in nb.cells if nbs.nbgrader_meta(c).get("grade_id") == "tensor_broadcast_shape")
    cell.source = cell.source.replace("#| export\n", "#| export\nimport tinytorch_no_such_module\n", 1)
    nbs.write(nb, nb_path)
    proc = tito(edition, "export", "01")
    assert proc.returncode == 2 and "does not import" in proc.output and "tinytorch_no_such_module" in proc.output, proc.output
    assert package.read_bytes() == before
    assert not [p for p in (edition / "tinytorch").rglob("*tito*")], "no temporary files left in the package"


def test_infinite_loop_stops_at_the_first_cell_past_the_limit(edition):
    set_setting(edition, "student_cell_timeout", "2")
    edit_solution(edition, "tensor_broadcast_shape", "while True:\n        pass")
    proc = tito(edition, "test", "01", timeout=120)
    out = proc.output
    assert proc.returncode == 1, out
    assert "Exercise 1.1: broadcast_shape (a graded test) did not finish within 2 s" in out, out
    assert "when stopped it was running your code: broadcast_shape in " in out and "student_cell_timeout" in out, out
    assert "not run: the run stopped at Exercise 1.1: broadcast_shape" in out
    assert re.search(r"\[ ?\d+/\d+\] ok .*Exercise 1.1: broadcast_shape \(your solution\)", out), "progress per cell"
    assert "package tests not run" in out
    assert "without encryption" not in out, "the kernel's TCP warning is noise for a student"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_everything_and_keeps_progress(edition, sig):
    psutil = pytest.importorskip("psutil")
    edit_solution(edition, "tensor_broadcast_shape", "while True:\n        pass")
    progress = write_progress(edition, {"01": {"started": "2024-01-01T00:00:00"}})
    env = student_env(edition, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tito.main", "module", "complete", "01"], cwd=edition, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:  # wait until the looping cell is running
            seen.append(line)
            if "broadcast_shape (your solution)" in line:
                break
        else:
            pytest.fail("tito ended before the loop:\n" + "".join(seen))
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the kernel should be running"
        started = time.monotonic()
        os.kill(proc.pid, sig)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(seen) + rest
    assert proc.returncode == 128 + sig, out
    assert time.monotonic() - started < 15
    assert out.count("interrupted (") == 1 and "progress was not changed" in out, out
    assert "Traceback" not in out and "took too long" not in out and "package tests" not in rest
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"left behind: {[p.cmdline() for p in alive]}"
    assert (edition / ".tito" / "progress.json").read_text() == progress


def test_deleted_graded_cell_is_graded_as_released(edition):
    use_reference(edition, "01_tensor")
    nb_path = edition / "modules" / "01_tensor" / "01_tensor.ipynb"
    nb = nbs.read(nb_path)
    victim = next(c for c in nb.cells if nbs.is_test_cell(c) and nbs.exercise_label(c).startswith("Exercise 1.2"))
    nb.cells.remove(victim)
    nbs.write(nb, nb_path)
    release = nbs.read(nb_path.parent / ".release.ipynb")
    total = sum(float(nbs.nbgrader_meta(c)["points"]) for c in release.cells if nbs.is_test_cell(c))

    # not exported yet: `tito test` exports first, so the package tests do not run on the stale stubs
    proc = tito(edition, "test", "01", "-e", "1.1")
    assert proc.returncode == 0, proc.output
    assert re.search(r"graded test cell Exercise 1\.2: Tensor\.__init__ \[[\w-]+\]: the graded test cell was deleted",
                     proc.output), proc.output
    assert f"notebook score {total:g}/{total:g}" in proc.output and "not implemented yet" not in proc.output
    assert "inputs of its own (trusted checks)" in proc.output, "a passing run says the autograder checks more"

    proc = tito(edition, "module", "complete", "01")
    assert proc.returncode == 0, proc.output
    entry = json.loads((edition / ".tito" / "progress.json").read_text())["modules"]["01"]
    assert entry["max_score"] == total, "the deleted cell's points still count"
    assert nbs.read(nb_path).cells == nb.cells, "the student's notebook is not rewritten"


def test_unknown_exercise_lists_the_module_exercises(student_edition):
    proc = tito(student_edition, "test", "02", "-e", "9.9")
    assert proc.returncode == 2, proc.output
    assert "unknown exercise 9.9; exercises of module 02 are 2.1, 2.2" in proc.output


def test_missing_test_tools_are_named_once_and_doctor_checks_them(student_edition):
    blocked = ("import sys; sys.modules['pytest'] = None; sys.modules['hypothesis'] = None; "
               "sys.argv[0] = 'tito'; from tito.main import app; app()")
    env = dict(os.environ, PYTHONPATH=str(student_edition), COLUMNS="200")
    env.pop("TITO_ROOT", None)
    run = lambda *args: subprocess.run([sys.executable, "-c", blocked, *args], cwd=student_edition, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=300)
    proc = run("test", "01")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert out.count("pytest and hypothesis are not installed") == 1 and 'pip install -e ".[test]"' in out, out
    proc = run("doctor")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and re.search(r"package pytest\s.*FAIL", out), out
    assert 'pip install -e ".[test]"' in out


def test_student_edition_documents_itself(student_edition):
    readme = (student_edition / "README.md").read_text()
    assert "student edition" in readme and 'pip install -e ".[test]"' in readme
    assert "instructor edition" not in readme and "complete solutions" not in readme
    page = json.loads((student_edition / ".jupyter" / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"]["@jupyter/nbgrader:create-assignment"] is True
    # what jupyter_server itself reads under the environment `tito module start` gives JupyterLab
    from tito.student import student_jupyter_env

    code = ("from jupyter_core.paths import jupyter_config_path\n"
            "from jupyter_server.extension.config import ExtensionConfigManager\n"
            "ext = ExtensionConfigManager(read_config_path=jupyter_config_path()).get_jpserver_extensions()\n"
            "print(sorted(k for k, on in ext.items() if 'nbgrader' in k and on))\n"
            "print(sorted(k for k, on in ext.items() if 'nbgrader' in k and not on))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=student_edition, capture_output=True, text=True,
                          env=student_jupyter_env(student_edition, dict(os.environ)), timeout=120)
    enabled, disabled = proc.stdout.splitlines()
    assert enabled == "[]" and "nbgrader.server_extensions.formgrader" in disabled, proc.stdout + proc.stderr
