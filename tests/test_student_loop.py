"""Fast checks of the student loop's reporting: failure reasons, the package-test table, cell
names, progress-file shapes. The CLI end to end is in test_cli.py."""
from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import nbformat
import numpy as np
import pytest

from tito import notebooks as nbs
from tito.commands import check
from tito import failures
from tito.course import load_modules
from _harness import Run
from tito.progress import LOCK_NAME, Progress
from tito.pytest_plugin import summarize


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the test wants the exception object
        return e
    raise AssertionError("expected an exception")


def test_numpy_testing_message_is_not_lost():
    e = _raised(lambda: np.testing.assert_allclose([1.0, 2.0], [1.0, 3.0], err_msg="ReLU.forward on shape (2,)"))
    reason = summarize(e)
    assert reason.startswith("AssertionError: ReLU.forward on shape (2,); Not equal to tolerance"), reason
    assert "Mismatched elements" in reason and "ACTUAL: array([1., 2.])" in reason, reason


def test_pytest_explanation_after_the_message_is_dropped():
    e = AssertionError("gelu_backward is 24.8x slower than a vectorised formula; expected at most 3x\n"
                       "assert 24.763546856405483 <= 3")
    assert summarize(e) == "AssertionError: gelu_backward is 24.8x slower than a vectorised formula; expected at most 3x"
    bare = AssertionError("assert 2 == 3\n +  where 2 = f()")
    assert summarize(bare) == "AssertionError: assert 2 == 3; + where 2 = f()", summarize(bare)


def test_empty_assertion_says_so():
    assert summarize(AssertionError()) == "AssertionError (no message)"


def test_hypothesis_group_shows_the_first_failure_and_its_example():
    group_type = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup
    first = AssertionError("\nvalues differ\nMax absolute difference: 1.")
    first.__notes__ = ["Falsifying example: test_relu(\n    shape=(2, 3),\n)"]  # add_note() is 3.11+
    group = group_type("Hypothesis found 2 distinct failures.", [first, ValueError("bad dim")])
    reason = summarize(group)
    assert "2 different failures" in reason and "values differ" in reason
    assert "Falsifying example: test_relu( shape=(2, 3), )" in reason
    assert "ExceptionGroup" not in reason


def test_package_table_skips_are_not_failures_and_unmarked_tests_are_named(capsys):
    data = {"exitstatus": 0, "tests": [
        {"nodeid": "t.py::test_relu[a]", "outcome": "passed", "exercise": "2.1", "function": "ReLU.forward", "reason": ""},
        {"nodeid": "t.py::test_torch[ReLU]", "outcome": "skipped", "exercise": "2.1", "function": "ReLU.forward",
         "reason": "needs torch, not installed"},
        {"nodeid": "t.py::test_harness_catches_naive", "outcome": "passed", "exercise": "", "function": "", "reason": ""},
    ]}
    assert check.print_pytest_report(data, "package tests") is True
    out = capsys.readouterr().out
    assert "1/1" in out and "1 skipped: needs torch" in out and "0/1" not in out
    assert "test_harness_catches_naive" in out and "other" in out


def test_package_table_says_how_to_see_the_whole_failure(capsys):
    data = {"exitstatus": 1, "tests": [
        {"nodeid": "t.py::test_relu", "outcome": "failed", "exercise": "2.1", "function": "ReLU.forward",
         "reason": "AssertionError: Not equal; ReLU.forward differs"},
    ]}
    assert check.print_pytest_report(data, "package tests", rerun="tito test 02") is False
    out = capsys.readouterr().out
    assert "differs" in out and "tito test 02 -e 2.1 -v" in out


def test_cells_are_named_by_exercise_or_heading():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("## 2. Activations\n### Exercise 2.1: `ReLU`"),
        nbformat.v4.new_code_cell("#| export\nclass ReLU: ..."),
        nbformat.v4.new_code_cell("# Exercise 2.1: ReLU.forward\nassert True"),
        nbformat.v4.new_markdown_cell("### 3.1 Cost per element"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("y = 2"),
    ]
    nb.cells[1].metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "relu"}
    nb.cells[2].metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": "t", "points": 1}
    labels = nbs.cell_labels(nb)
    assert labels[1] == "Exercise 2.1: ReLU (your solution)"
    assert labels[2] == "Exercise 2.1: ReLU.forward"
    assert labels[4:] == ["3.1 Cost per element (code cell)", "3.1 Cost per element (code cell 2)"]


def test_exported_cell_syntax_error_names_the_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("### Exercise 1.1: broadcast_shape"),
                nbformat.v4.new_code_cell("#| export\ndef broadcast_shape(a, b):\n    return (1, 2\n"),
                nbformat.v4.new_code_cell("this is not exported (\n")]
    path = tmp_path / "nb.ipynb"
    nbs.write(nb, path)
    problems = nbs.exported_cell_errors(path)
    assert len(problems) == 1 and problems[0].startswith("Exercise 1.1: broadcast_shape (code cell): SyntaxError on line 3")


def test_wrong_shaped_progress_entries_are_reported_and_kept(tmp_path):
    original = {"schema_version": 1, "modules": {"01": {"completed": "2024-01-01T00:00:00", "score": 16},
                                                 "2": {}, "03": "done", "04": {"score": "lots"}}}
    (tmp_path / "progress.json").write_text(json.dumps(original))
    p = Progress.load(tmp_path)
    assert list(p.modules) == ["01"]
    assert len(p.warnings) == 1
    for bit in ("'2'", "'03'", "'04'", "two digits", "expected a number"):
        assert bit in p.warnings[0], p.warnings[0]
    backups = list(tmp_path.glob("progress.json.corrupt-*"))
    assert len(backups) == 1 and json.loads(backups[0].read_text()) == original


def test_well_formed_progress_loads_silently(tmp_path):
    data = {"schema_version": 1, "modules": {"01": {"started": "x", "completed": "y", "score": 1.5, "max_score": 2}}}
    (tmp_path / "progress.json").write_text(json.dumps(data))
    p = Progress.load(tmp_path)
    assert p.warnings == [] and p.modules == data["modules"]
    assert sorted(f.name for f in tmp_path.iterdir()) == [LOCK_NAME, "progress.json"]


@pytest.mark.parametrize("missing", [["pytest"], ["pytest", "hypothesis"]])
def test_missing_test_tools_name_the_install_command(monkeypatch, missing, tmp_path):
    real = check.importlib.util.find_spec
    monkeypatch.setattr(check.importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    ctx = types.SimpleNamespace(root=tmp_path)
    with pytest.raises(check.CourseError) as e:
        check.require_test_tools(ctx)
    assert " and ".join(missing) in str(e.value) and 'pip install -e ".[test]"' in str(e.value)


# ----------------------------------------------------------------- progress under concurrency

_RACER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from tito.progress import Progress
    state, number, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    p = Progress.load(state)          # every racer reads the file before any of them writes it
    (state / f"loaded-{number}").touch()
    while not go.exists():
        time.sleep(0.005)
    p.mark_completed(number, 1, 1)
    p.save()
""")


def test_concurrent_completions_are_all_kept(tmp_path):
    """Seven processes load the progress file, wait until all have loaded, then each records its own
    completion: read at the start and written at the end, six would be lost (last writer wins)."""
    Progress.load(tmp_path).save()
    numbers = [f"{n:02d}" for n in range(1, 8)]
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path), n, str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in numbers]
    try:
        for _ in range(6000):
            if all((tmp_path / f"loaded-{n}").exists() for n in numbers) or any(p.poll() for p in procs):
                break
            __import__("time").sleep(0.01)
        go.touch()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), outputs
    recorded = Progress.load(tmp_path).modules
    lost = [n for n in numbers if not recorded.get(n, {}).get("completed")]
    assert not lost, f"completions of modules {lost} were lost; recorded: {sorted(recorded)}; expected all of {numbers}"


def test_save_keeps_changes_made_by_another_command(tmp_path):
    mine, theirs = Progress.load(tmp_path), Progress.load(tmp_path)
    theirs.mark_completed("02", 3, 3)
    theirs.save()
    mine.mark_started("03")
    mine.mark_checkpoint("01")
    mine.save()
    assert mine.is_completed("02") and mine.modules["02"]["score"] == 3, mine.modules
    on_disk = Progress.load(tmp_path)
    assert on_disk.is_completed("02") and on_disk.is_started("03") and on_disk.modules["01"]["checkpoint"]
    theirs.mark_incomplete("02")
    theirs.save()
    assert not Progress.load(tmp_path).is_completed("02") and Progress.load(tmp_path).is_started("03")


# ----------------------------------------------------------------- failures that teach


def test_numpy_assert_equal_puts_the_test_message_first():
    e = _raised(lambda: np.testing.assert_array_equal([1, 2], [1, 3], err_msg="temperature=0.5: sampled ids"))
    reason = summarize(e)
    assert reason.startswith("AssertionError: temperature=0.5: sampled ids; Arrays are not equal"), reason
    assert "DESIRED: array([1, 3])" in reason, reason


def test_notebook_cell_reason_keeps_the_informative_lines():
    cell = nbs.CellResult(0, "t", "Exercise 4.2: cross_entropy", True, 1.0, status="failed", ename="AssertionError",
                          evalue="\nNot equal to tolerance rtol=1e-05, atol=0\ncross_entropy of 2 rows: got 0.9, "
                                 "expected 0.7\nMismatched elements: 1 / 1 (100%)\n ACTUAL: array(0.9)")
    reason = cell.reason()
    assert reason.startswith("cross_entropy of 2 rows: got 0.9, expected 0.7; Not equal to tolerance"), reason
    assert "\n" not in reason and "ACTUAL: array(0.9)" in reason, reason


def _recursive_walk(node, depth=0):
    return _recursive_walk(node, depth + 1)


def test_recursion_error_names_the_recursive_function():
    reason = summarize(_raised(lambda: _recursive_walk(None)))
    assert reason.startswith("RecursionError: _recursive_walk called itself"), reason
    assert "explicit stack" in reason, reason
    tb = ("RecursionError Traceback (most recent call last)\nCell In[3], line 2\n"
          "File /x/tinytorch/core/autograd.py:40, in Tensor.backward.<locals>.visit(node)\n"
          "    [... skipping similar frames: Tensor.backward.<locals>.visit at line 40 (2968 times)]\n")
    cell = nbs.CellResult(0, "t", "Exercise 6.9: backward", True, 1.0, status="failed", ename="RecursionError",
                          evalue="maximum recursion depth exceeded", traceback=tb)
    assert cell.reason().startswith("RecursionError: Tensor.backward.<locals>.visit called itself 2968 times"), \
        cell.reason()


def test_failure_inside_an_earlier_module_names_it():
    root = Path(__file__).resolve().parents[1]
    modules = load_modules(root)
    frames = [(str(root / "tests/modules/test_13_transformers.py"), "test_gpt"),
              (str(root / "tinytorch/models/transformer.py"), "GPT.forward"),
              (str(root / "tinytorch/core/attention.py"), "scaled_dot_product_attention"),
              ("/usr/lib/python3/numpy/core.py", "matmul")]
    attention = next(m for m in modules if m.number == "12")
    rel = attention.package_module.replace(".", "/") + ".py"
    frames[2] = (str(root / rel), "scaled_dot_product_attention")
    where = failures.where_it_failed(frames, modules, "13", root)
    assert where == f"the failure surfaced in module 12's scaled_dot_product_attention ({rel})", where
    assert failures.where_it_failed(frames, modules, "12", root) == "", "a module's own code is not attributed"
    ipython = "".join(f"File {f}:10, in {fn}(x)\n" for f, fn in frames)
    assert failures.where_it_failed(failures.text_frames(ipython), modules, "13") == where
    layers = next(m for m in modules if m.number == "03").package_module.replace(".", "/") + ".py"
    deeper = frames[:3] + [(str(root / layers), "Linear.forward")]  # a bad shape from 12 refused by 03
    assert failures.where_it_failed(deeper, modules, "13", root) == (
        f"the failure surfaced in module 03's Linear.forward ({layers}), called from module 12's "
        f"scaled_dot_product_attention ({rel})")


def run_with_tito_report(test: Path) -> tuple[dict[str, str], str]:
    """Run pytest with tito's plugin on the file `test` in a child process, as `tito test` does: ({test name: the
    reason tito reports}, pytest's output)."""
    report = test.parent / "r.json"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tito.pytest_plugin", "-p", "no:cacheprovider",
                          f"--tito-report={report}", str(test)], cwd=test.parent, env=env, capture_output=True,
                         text=True, timeout=120).stdout
    return {t["nodeid"].split("::")[-1]: t["reason"] for t in json.loads(report.read_text())["tests"]}, out


def test_skipped_torch_says_how_to_install_it(tmp_path):
    test = tmp_path / "test_needs_torch.py"
    test.write_text("import pytest\n\ndef test_x():\n    pytest.importorskip('no_such_module_torch')\n"
                    "\ndef test_t(monkeypatch):\n    import builtins\n    real = builtins.__import__\n"
                    "    monkeypatch.setattr(builtins, '__import__', lambda n, *a, **k: (_ for _ in ()).throw("
                    "ModuleNotFoundError('no torch')) if n == 'torch' else real(n, *a, **k))\n"
                    "    pytest.importorskip('torch')\n")
    reasons, _ = run_with_tito_report(test)
    assert reasons["test_t"] == 'needs torch, not installed: pip install -e ".[reference]"', reasons
    assert reasons["test_x"] == "needs no_such_module_torch, not installed", reasons


def test_milestone_plot_is_readable_like_any_new_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    old = os.umask(0o022)
    try:
        out = Run.save_plot(types.SimpleNamespace(args=types.SimpleNamespace(out=tmp_path / "p.png")), fig)
    finally:
        os.umask(old)
    mode = out.stat().st_mode & 0o777
    assert mode == 0o644, f"plot written with mode {oct(mode)}; expected 0o644 under umask 022"


def test_own_stub_called_back_by_an_earlier_module_is_not_blamed_on_it():
    "Module 14's Profiler._on_op stub raises inside module 01's op observer call: the stub is the notebook's own."
    from tito.commands.check import cell_reason

    root = Path(__file__).resolve().parents[1]
    modules = load_modules(root)
    tb = ("Cell In[22], line 3, in <module>\n"
          "File /e/tinytorch/core/tensor.py:290, in Tensor.from_op(data, op, inputs, saved, attrs)\n"
          "File /e/tinytorch/core/tensor.py:200, in _notify(node, out)\n"
          "Cell In[21], line 120, in Profiler._on_op(self, node, out)\n")
    cell = nbs.CellResult(0, "t", "Exercise 14.5", True, 3, status="not_implemented", function="Profiler._on_op",
                          traceback=tb)
    assert cell_reason(cell, modules, "14") == "not implemented yet: Profiler._on_op"
    earlier = nbs.CellResult(0, "t", "x", True, 3, status="not_implemented", function="Tensor.matmul",
                             traceback=tb.rsplit("Cell In[21]", 1)[0] + "File /e/tinytorch/core/tensor.py:600, in Tensor.matmul(self)\n")
    assert cell_reason(earlier, modules, "14") == "not implemented yet: Tensor.matmul (module 01, tinytorch/core/tensor.py)"


def test_an_export_never_writes_back_a_file_another_export_changed_meanwhile(tmp_path, monkeypatch):
    """Two terminals: while module 05 exports, module 02's export lands. The 05 export must move into place
    only what nbdev changed in its own staging copy, not its stale copy of activations.py."""
    from tests.test_notebooks import make_edition_copy
    from tito import proc

    edition = make_edition_copy(tmp_path / "edition")
    live = edition / "tinytorch" / "core" / "activations.py"
    landed = live.read_text() + "\n# written by the other terminal's export\n"
    real_run = proc.run

    def run_while_the_other_export_lands(args, **kw):
        if "nbdev_export" in " ".join(map(str, args)):
            live.write_text(landed)
        return real_run(args, **kw)

    monkeypatch.setattr(proc, "run", run_while_the_other_export_lands)
    changed = nbs.export(edition, edition / "modules" / "05_dataloader" / "05_dataloader.ipynb")
    assert live.read_text() == landed, f"the 05 export overwrote activations.py (it moved {changed} into place)"
    assert "core/activations.py" not in changed


def test_stub_failures_are_one_line_and_other_failures_keep_their_traceback(tmp_path):
    """A stub's failure (also inside a hypothesis test) is reported by its one line, without pytest building its
    traceback report (which parses every source file of the traceback: most of a fresh release's test time)."""
    test = tmp_path / "test_stubs.py"
    test.write_text(
        "from hypothesis import given, strategies as st\n\n"
        "def broadcast_shape(a, b):\n    raise NotImplementedError('write this')  # STUB-LINE\n\n"
        "@given(st.integers())\ndef test_property(n):\n    broadcast_shape(n, n)\n\n"
        "def test_plain():\n    broadcast_shape(1, 2)\n\n"
        "def test_wrong():\n    got = 3\n    assert got == 4  # WRONG-LINE\n")
    (tmp_path / "conftest.py").write_text(  # counts the traceback reports pytest builds, per test
        "import _pytest._code.code as code\n"
        "built = {}\nfull = code.ExceptionInfo.getrepr\n"
        "def getrepr(self, *a, **k):\n"
        "    import inspect\n"
        "    test = next((f.function for f in inspect.stack() if f.function.startswith('test_')), '?')\n"
        "    built[test] = built.get(test, 0) + 1\n"
        "    return full(self, *a, **k)\n"
        "code.ExceptionInfo.getrepr = getrepr\n"
        "def pytest_sessionfinish(session):\n"
        "    print('REPORTS BUILT', sorted(built.items()))\n")
    reasons, out = run_with_tito_report(test)
    assert reasons["test_property"] == reasons["test_plain"] == "not implemented yet: broadcast_shape", reasons
    assert "test_stubs.py::test_plain: not implemented yet: broadcast_shape" in out, out
    assert "STUB-LINE" not in out, f"a stub's failure should not print its traceback:\n{out}"
    built = re.search(r"REPORTS BUILT (.*)", out)
    assert built and "test_property" not in built.group(1) and "test_plain" not in built.group(1), \
        f"pytest built a traceback report for a stub's failure: {built and built.group(1)}\n{out}"
    assert "WRONG-LINE" in out and "assert 3 == 4" in out, f"a wrong result keeps pytest's report:\n{out}"


# ----------------------------------------------------------------- whose code to fix (issue 29) and time limits (33)

_BOX = '''
class Box:
    "Given code of module 01: a box holds a number."
    def __init__(self, data):
        if not isinstance(data, (int, float)):
            raise TypeError(f"Box data must be a number; got {type(data).__name__}")
        self.data = data
'''

# module 02's exercises, as the instructor writes them; `BUGS` swaps in a student's wrong line
_CHAIN_CELLS = {
    "double": ('''def double(x: float) -> float:
    """TODO (Exercise 2.1): twice `x`."""
    ### BEGIN SOLUTION
    return x * 2
    ### END SOLUTION''', "2.1"),
    "quad": ('''def quad(x: float) -> Box:
    """TODO (Exercise 2.2): a Box of four times `x`. HINTS: `double`."""
    ### BEGIN SOLUTION
    return Box(double(double(x)))
    ### END SOLUTION''', "2.2"),
    "spin": ('''def spin(n: int) -> int:
    """TODO (Exercise 2.3): count to `n`."""
    ### BEGIN SOLUTION
    i = 0
    while i < n:
        i += 1
    return i
    ### END SOLUTION''', "2.3"),
}
_CHAIN_TESTS = '''import threading

import pytest

from tinytorch.chain import double, quad, spin

pytestmark = pytest.mark.module("02")


@pytest.mark.exercise("2.3", "spin")
def test_spin():
    assert spin(3) == 3, f"spin(3) = {spin(3)!r}; expected 3"


@pytest.mark.exercise("2.3", "spin")
def test_spin_in_a_thread_the_test_waits_for():
    out = []
    worker = threading.Thread(target=lambda: out.append(spin(5)), name="spinner")
    worker.start()
    worker.join()
    assert out == [5]


@pytest.mark.exercise("2.1", "double")
def test_double():
    assert double(3) == 6, f"double(3) = {double(3)!r}; expected 6"


@pytest.mark.exercise("2.2", "quad")
def test_quad():
    assert quad(1).data == 4, f"quad(1).data = {quad(1).data!r}; expected 4"


def test_quad_of_zero():
    assert quad(0).data == 0
'''


def synthetic_course(root: Path, bugs: dict | None = None) -> Path:
    """A two-module course at `root`: module 01 gives `Box` (tinytorch/core/box.py); module 02's notebook
    has exercises 2.1 double, 2.2 quad (uses double and Box) and 2.3 spin, exported to tinytorch/chain.py
    with the student's code (`bugs`: {function: replacement body lines}), and package tests."""
    bugs = bugs or {}
    root.mkdir(parents=True)
    (root / "settings.ini").write_text("[course]\nedition = student\n")
    for number, name, title in (("01", "core", "Core"), ("02", "chain", "Chain")):
        folder = root / "modules" / f"{number}_{name}"
        folder.mkdir(parents=True)
        (folder / "module.toml").write_text(f'title = "{title}"\nprerequisites = {[] if number == "01" else ["01"]}\n')
    (root / "tinytorch" / "core").mkdir(parents=True)
    for init in ("tinytorch/__init__.py", "tinytorch/core/__init__.py"):
        (root / init).write_text("")
    (root / "tinytorch" / "core" / "box.py").write_text(_BOX)
    core = nbformat.v4.new_notebook()
    core.cells = [nbformat.v4.new_code_cell("#| default_exp core.box"), nbformat.v4.new_code_cell("#| export\n" + _BOX)]
    nbs.write(core, root / "modules" / "01_core" / "01_core.ipynb")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("#| default_exp chain"),
                nbformat.v4.new_code_cell("#| export\nfrom tinytorch.core.box import Box")]
    package = ["from tinytorch.core.box import Box", ""]
    for fn, (source, number) in _CHAIN_CELLS.items():
        cell = nbformat.v4.new_code_cell("#| export\n" + source)
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": fn, "locked": False,
                                     "schema_version": 3}
        test = nbformat.v4.new_code_cell(f"# Exercise {number}: {fn}\nassert {fn}")
        test.metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": f"test_{fn}", "points": 1,
                                     "locked": True, "schema_version": 3}
        nb.cells += [cell, test]
        if fn in bugs:
            head, body = source.split("### BEGIN SOLUTION")
            source = head + "### BEGIN SOLUTION\n" + textwrap.indent(bugs[fn], "    ") + "\n    ### END SOLUTION"
        package += [source, ""]
    nbs.write(nb, root / "modules" / "02_chain" / "02_chain.ipynb")
    (root / "tinytorch" / "chain.py").write_text("\n".join(package))
    (root / "tests" / "modules").mkdir(parents=True)
    (root / "tests" / "modules" / "test_02_chain.py").write_text(_CHAIN_TESTS)
    return root


def run_package_tests(root: Path, *args: str, timeout: float = 120) -> tuple[dict, str, float]:
    """pytest on the synthetic course's package tests with tito's plugin, as `tito test` runs them: (the JSON
    report, the output, seconds)."""
    import time

    report = root / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(Path(__file__).resolve().parents[1])]))
    env.pop("TITO_ROOT", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tito.pytest_plugin", "-p", "no:cacheprovider",
                           "--rootdir", str(root), f"--tito-report={report}", *args, str(root / "tests" / "modules")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    return json.loads(report.read_text()), proc.stdout + proc.stderr, time.monotonic() - t0


def reasons(report: dict) -> dict[str, str]:
    return {t["nodeid"].split("::")[-1]: t["reason"] for t in report["tests"] if t["outcome"] == "failed"}


def test_exercise_functions_are_read_from_solution_regions_and_release_stubs():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "#| export\nclass Paths:\n    def attach(self):\n        \"TODO (Exercise 14.4a)\"\n        ### BEGIN SOLUTION\n"
        "        return self\n        ### END SOLUTION\n    def remove(self):\n        return None\n"),
        nbformat.v4.new_code_cell("#| export\ndef op_flops(op):\n    def helper():\n        return 1\n"
                                  "    # YOUR CODE HERE\n    raise NotImplementedError()\n"),
        nbformat.v4.new_code_cell("# Exercise 14.1: op_flops\nassert op_flops")]
    nb.cells[0].metadata["nbgrader"] = nb.cells[1].metadata["nbgrader"] = {"solution": True}
    nb.cells[2].metadata["nbgrader"] = {"grade": True, "solution": False, "points": 1}
    assert failures.exercise_functions(nb) == {"Paths.attach": "14.4", "op_flops": "14.1"}, \
        "the docstring's exercise first, else the next test cell's; given methods and nested helpers are not exercises"


def test_a_wrong_upstream_exercise_is_named_where_the_failure_surfaces_in_an_earlier_module(tmp_path):
    """issue 29: double (2.1) returns a list; quad (2.2, correct) passes it to module 01's Box, which refuses it.
    quad's failure names 2.1 as the exercise to fix first, with what it returned, and Box as where it surfaced."""
    root = synthetic_course(tmp_path / "course", bugs={"double": "return [x, x]"})
    report, out, _ = run_package_tests(root)
    got = reasons(report)
    assert got["test_double"] == ("double returned a list where its annotation says float: AssertionError: double(3) "
                                  "= [3, 3]; expected 6"), got
    assert got["test_quad"] == (
        "not checked on its own: fix 2.1 double first (its own tests fail): it returned a list where its annotation "
        "says float; the failure surfaced in module 01's Box.__init__ (tinytorch/core/box.py), called from your 2.2 "
        "quad: TypeError: Box data must be a number; got list"), got["test_quad"]
    assert got["test_quad_of_zero"].startswith("not checked on its own: fix 2.1 double first"), got
    quad = next(t for t in report["tests"] if t["nodeid"].endswith("test_quad"))
    assert quad["upstream"] == ["2.1"]
    assert "what to fix" not in out or "fix 2.1 double first" in out, out


def test_the_package_table_puts_the_exercise_to_fix_first_and_says_so(tmp_path, capsys):
    root = synthetic_course(tmp_path / "course", bugs={"double": "return [x, x]"})
    report, _, _ = run_package_tests(root)
    assert check.print_pytest_report(report, "package tests", rerun="tito test 02") is False
    out = capsys.readouterr().out
    assert "fix first: 2.1 double (2 other failing tests ran it)" in out, out
    rows = [ln for ln in out.splitlines() if re.match(r"│ (2\.\d|other)", ln)]
    assert [r.split("│")[1].strip() for r in rows] == ["2.1", "2.2", "2.3", "other"], rows


def test_an_own_bug_is_not_blamed_on_an_earlier_module(tmp_path):
    "quad (2.2) wraps a list itself: its own exercise, named by its annotation, with module 01 as where it surfaced."
    root = synthetic_course(tmp_path / "course", bugs={"quad": "return Box([double(x)])"})
    got = reasons(run_package_tests(root)[0])
    assert set(got) == {"test_quad", "test_quad_of_zero"}, got
    assert got["test_quad"] == ("the failure surfaced in module 01's Box.__init__ (tinytorch/core/box.py), called "
                                "from your 2.2 quad: TypeError: Box data must be a number; got list"), got["test_quad"]


def test_a_failed_test_is_watched_on_a_second_run_outside_tito_test(tmp_path):
    "A plain pytest run (CI) watches no test that passes; a failed one runs once more, watched, to name the culprit."
    root = synthetic_course(tmp_path / "course", bugs={"double": "return [x, x]"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(Path(__file__).resolve().parents[1])]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tito.pytest_plugin", "-p", "no:cacheprovider",
                           "--rootdir", str(root), str(root / "tests" / "modules"), "-k", "quad or double"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert ("Exercise 2.2 (quad): not checked on its own: fix 2.1 double first (its own tests fail): it returned a "
            "list where its annotation says float") in proc.stdout, proc.stdout


def test_a_test_past_its_time_limit_names_the_exercise_and_the_run_goes_on(tmp_path):
    """issue 33: spin (2.3) never ends; each of its tests stops at the limit with a line naming the exercise and
    where it was (the main thread, or a thread the test waits for), and the other tests still run."""
    root = synthetic_course(tmp_path / "course", bugs={"spin": "i = 0\nwhile i < n:\n    i *= 1\nreturn i"})
    report, out, seconds = run_package_tests(root, "--tito-timeout=3")
    got = reasons(report)
    assert got["test_spin"] == (
        "2.3 spin: test did not finish in 3 s (stopped there; the other tests ran on); when stopped it was in your "
        "2.3 spin: a loop that never ends, or a wait for something that never comes (a block never freed, a request "
        "never answered)? If your machine is only busy or slow, raise [execution] test_timeout in settings.ini"), got
    assert "when stopped it was in your 2.3 spin (thread spinner)" in got["test_spin_in_a_thread_the_test_waits_for"], got
    passed = {t["nodeid"].split("::")[-1] for t in report["tests"] if t["outcome"] == "passed"}
    assert passed == {"test_double", "test_quad", "test_quad_of_zero"}, report
    assert seconds < 60, f"the run took {seconds:.0f} s: a thread left spinning must not keep the process alive"


def test_a_run_killed_from_outside_names_the_test_it_was_running(tmp_path):
    report = tmp_path / "report.json"
    report.with_name("report.json.running").write_text(json.dumps(
        {"nodeid": "tests/modules/test_18.py::test_free", "exercise": "18.4", "function": "PagedKVCache.free"}))
    text = check.killed_run_message(report, 900)
    assert text.startswith("pytest did not finish within 900 s ([execution] pytest_timeout in settings.ini): it was "
                           "still running tests/modules/test_18.py::test_free (18.4 PagedKVCache.free)"), text
    assert "look for a loop" in check.killed_run_message(tmp_path / "none.json", 900)


def test_notebook_cells_name_the_exercise_to_fix_first_from_the_source():
    """The notebook's cells: 2.2's test runs double through quad; with 2.1's test failing, 2.2's failure and a given
    cell using quad say to fix 2.1 first; 2.1's own failure and a cell that does not run double say nothing more."""
    nb = nbformat.v4.new_notebook()
    sources = ["#| export\ndef double(x):\n    ### BEGIN SOLUTION\n    return x * 2\n    ### END SOLUTION",
               "# Exercise 2.1: double\nassert double(3) == 6",
               "#| export\nclass Quad:\n    def __call__(self, x):\n        ### BEGIN SOLUTION\n        return self.twice(x)\n"
               "        ### END SOLUTION\n    def twice(self, x):\n        return double(double(x))",
               "# Exercise 2.2: Quad\nassert Quad()(1) == 4",
               "PIPELINE = [Quad()]\nprint(PIPELINE[0](2))",
               "print(3 * 4)"]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    for i in (0, 2):
        nb.cells[i].metadata["nbgrader"] = {"solution": True}
    for i in (1, 3):
        nb.cells[i].metadata["nbgrader"] = {"grade": True, "solution": False, "points": 1}
    ex = check.NotebookExercises(nb)
    assert ex.reach == {0: set(), 1: {"2.1"}, 2: set(), 3: {"2.1", "2.2"}, 4: {"2.1", "2.2"}, 5: set()}, ex.reach
    cells = [nbs.CellResult(i, None, label, test, 1.0, status="passed" if ok else "failed")
             for i, label, test, ok in [(1, "Exercise 2.1: double", True, False), (3, "Exercise 2.2: Quad", True, False),
                                        (4, "a given cell", False, False), (5, "another", False, False)]]
    assert ex.upstream(cells) == {3: ["2.1"], 4: ["2.1"]}
    assert ex.first_text(["2.1"]) == "not checked on its own: fix Exercise 2.1 (double) first (its test fails)"
    cells[0].status = "passed"
    assert ex.upstream(cells) == {4: ["2.2"]}, "with 2.1 passing, the failing 2.2 is the one to fix"


def _timed_out(tmp_path, cells) -> nbs.CellResult:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## 3.4 Measured")]
    for source, kind in cells:
        cell = nbformat.v4.new_code_cell(source)
        if kind == "solution":
            cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "spin", "schema_version": 3}
        elif kind == "test":
            cell.metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": "t", "points": 1,
                                         "locked": True, "schema_version": 3}
        nb.cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbs.write(nb, path)
    report = nbs.execute(path, cwd=tmp_path, timeout=3)
    assert report.timed_out is not None, [(c.label, c.status, c.evalue) for c in report.cells]
    return report.timed_out


def test_a_cell_past_its_time_limit_is_blamed_on_the_code_that_was_running(tmp_path):
    """issue 33: a given cell that runs long (a busy machine) is not the student's infinite loop; the message names the
    cell's section, whose code was running when it was stopped, and how to raise the limit."""
    given = _timed_out(tmp_path, [("import time\ndef measure():\n    time.sleep(60)", "given"),
                                  ("x = 1\nmeasure()", "given")])
    assert given.evalue.startswith(
        "3.4 Measured (code cell 2) (a given cell) did not finish within 3 s, the per-cell limit; when stopped it was "
        "running given code, not yours: measure in 3.4 Measured (code cell), line 3. The machine is probably busy or "
        "slow: raise [execution] student_cell_timeout in settings.ini (now 3) and run it again"), given.evalue
    assert "infinite loop" not in given.evalue
    mine = _timed_out(tmp_path, [("def spin(n):\n    i = 0\n    while i < n:\n        i *= 1\n    return i", "solution"),
                                 ("# Exercise 1.1: spin\nassert spin(3) == 3", "test")])
    checked = _timed_out(tmp_path, [("import time\ndef add(a, b):\n    time.sleep(0.05)\n    return a + b", "solution"),
                                    ("# Exercise 1.1: add\nassert add(1, 2) == 3", "test"),
                                    ("for _ in range(10 ** 6):\n    add(1, 2)", "given")])
    assert checked.evalue.startswith(
        "3.4 Measured (code cell) (a given cell) did not finish within 3 s, the per-cell limit; when stopped it was "
        "running your code (add in 3.4 Measured (your solution), line 3), whose tests passed: this given cell does "
        "much work with it, and the machine is probably busy or slow: raise [execution] student_cell_timeout"), \
        checked.evalue
    assert re.match(
        r"Exercise 1\.1: spin \(a graded test\) did not finish within 3 s, the per-cell limit; when stopped it was "
        r"running your code: spin in 3\.4 Measured \(your solution\), line [34]\. A loop that never ends", mine.evalue), \
        mine.evalue


def test_tito_never_imports_the_package_itself():
    """issue 31: `tito` imports the student's package only through its probes (in processes of their own): loading
    every tito module and running `tito doctor`'s checks leaves `tinytorch` unimported (doctor asks a child)."""
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        from pathlib import Path
        import tito
        for info in pkgutil.walk_packages(tito.__path__, "tito."):
            # (tito.compete_kernels: the competition's example kernels, which issue 31 moves out of tito)
            if not info.name.startswith(("tito.probes", "tito.compete_kernels")):
                importlib.import_module(info.name)
        from tito.course import Settings
        from tito.doctor import run_checks
        root = Path(sys.argv[1])
        checks = {name: (ok, detail) for name, ok, detail in run_checks(root, Settings.load(root))}
        print(checks["tinytorch"])
        print("imported:", sorted(m for m in sys.modules if m == "tinytorch" or m.startswith("tinytorch.")))
    """)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(root)), cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert f"(True, '{root / 'tinytorch'}')" in proc.stdout, proc.stdout
    assert "imported: []" in proc.stdout, proc.stdout


# ----------------------------------------------------------------- the real cases of issue 29, on the course's modules

_INSTRUCTOR = (Path(__file__).resolve().parents[1] / "settings.ini").read_text().count("edition = instructor") == 1


def got_text(got: dict) -> list[str]:
    return [reason for _, reason in got.values()]


def _failing_reasons(module: str, *bugs) -> dict[str, tuple[str, str]]:
    """{test name: (exercise, reason)} of the failing package tests of `module` with `bugs` (Mutations) in the
    reference package, run as `tito test` runs them, with the course's notebooks beside the package (where the
    exercises are read from)."""
    from tests.support.mutation import mutated_edition, run_module_tests

    root = Path(__file__).resolve().parents[1]
    with mutated_edition(root, *bugs) as copy:
        shutil.copytree(root / "modules", copy / "modules", ignore=shutil.ignore_patterns("__pycache__", ".*"))
        run = run_module_tests(copy, module)
        report = json.loads((copy / ".tito-report.json").read_text())
    assert run.failed, run.output[-3000:]
    return {t["nodeid"].split("::")[-1]: (t["exercise"], t["reason"]) for t in report["tests"] if t["outcome"] == "failed"}


@pytest.mark.slow
@pytest.mark.skipif(not _INSTRUCTOR, reason="needs the instructor edition (the reference package)")
def test_module_14_pop_returning_the_stack_is_named_not_modules_01_to_03():
    "issue 29: a wrong 14.4 (`pop` returning the stack) was reported as a failure inside module 01's Tensor.__init__."
    from tests.support.mutation import Mutation

    bug = Mutation("14", "perf/profiler.py", "ModulePaths.pop", "self.stack.pop()",
                   "return [self.stack.pop()] and self.stack", "the forward hook returns the stack", "14.4")
    got = _failing_reasons("14", bug)
    own = {name: reason for name, (ex, reason) in got.items() if ex == "14.4"}
    assert own and all(r.startswith("ModulePaths.pop returned a list where its annotation says None")
                       for r in own.values()), own
    assert not any("Tensor.__init__" in r or "module 01" in r for r in got_text(got)), got
    others = {name: reason for name, (ex, reason) in got.items() if ex != "14.4"}
    assert others and all(r.startswith("not checked on its own: fix 14.4 ModulePaths.pop first (its own tests fail): "
                                       "it returned a list where its annotation says None") for r in others.values()), others


@pytest.mark.slow
@pytest.mark.skipif(not _INSTRUCTOR, reason="needs the instructor edition (the reference package)")
@pytest.mark.parametrize("module,bug", [
    ("14", ("perf/profiler.py", "op_flops", "2 * math.prod(output_shape) * input_shapes[0][-1]",
            "math.prod(output_shape) * input_shapes[0][-1]", "matmul FLOPs without the factor 2", "14.1")),
    ("17", ("perf/compiler.py", "dead_code_elimination", "live.update(n.args)", "live.update(n.args[:1])",
            "DCE keeps only the first argument's producer alive", "17.4")),
], ids=["14.1-op_flops", "17.4-dead_code_elimination"])
def test_an_upstream_exercise_is_the_one_to_fix_first_in_the_real_modules(module, bug):
    """issue 29: a wrong 14.1 failed 14.3 and 14.5 without naming op_flops; a DCE bug (17.1) failed the compiler's
    tests with `KeyError: '%6'` (DCE is 17.4 since the re-cut). Every other failing test now names the upstream
    exercise and its function to fix first."""
    from tests.support.mutation import Mutation

    m = Mutation(module, *bug)
    got = _failing_reasons(module, m)
    own = {name for name, (ex, _) in got.items() if ex == m.exercise}
    assert own, f"{m.exercise}'s own tests must catch the bug: {got}"
    others = {name: reason for name, (ex, reason) in got.items() if ex != m.exercise}
    assert others, got
    wrong = {name: r for name, r in others.items()
             if not (r.startswith(f"not checked on its own: fix {m.exercise} ") and m.function in r.split(" first")[0])}
    assert not wrong, wrong


@pytest.mark.skipif(not _INSTRUCTOR, reason="needs the instructor edition (the source notebooks)")
def test_the_real_notebooks_name_the_upstream_exercise_of_a_failing_cell():
    """The notebook side of the same cases, from the notebooks' source: 14.3's and 14.5's test cells run op_flops
    (14.1); 17.8's test cell runs fusion_groups (17.7); 14.1's and 17.7's own cells name nobody else (the passes are
    tested on graphs given as data, so a wrong DCE no longer fails the later passes' cells)."""
    root = Path(__file__).resolve().parents[1]
    for slug, upstream, downstream in (("14_profiling", "14.1", ("14.3", "14.5")), ("17_acceleration", "17.7", ("17.8",))):
        nb = nbs.read(root / "modules" / slug / f"{slug}.ipynb")
        ex = check.NotebookExercises(nb)
        labels = nbs.cell_labels(nb)
        cells = [nbs.CellResult(i, None, labels[i], True, 1.0, status="failed") for i, c in enumerate(nb.cells)
                 if nbs.is_test_cell(c) and failures.exercise_of_label(labels[i]) in (upstream, *downstream)]
        assert {failures.exercise_of_label(c.label) for c in cells} == {upstream, *downstream}, [c.label for c in cells]
        first = ex.upstream(cells)
        for c in cells:
            expected = [] if failures.exercise_of_label(c.label) == upstream else [upstream]
            assert first.get(c.index, []) == expected, (c.label, first)


BATCHING_LOGIC = ("(batch_window or admission_follows or retry_after_is or schedule or abort or solo or pack_rows or "
                  "slot_mapping or time_average) and not generations")


@pytest.mark.slow
@pytest.mark.skipif(not _INSTRUCTOR, reason="needs the instructor edition (the reference package)")
def test_a_scheduler_that_never_preempts_stops_at_the_time_limit_naming_the_exercise():
    """issue 33: a forgotten `pool.free` hung the package tests for 15 minutes, ending "no tests ran" (since the
    re-cut its test fails at once: "every block back in the pool: 44 of 48 free"). A scheduler that never preempts a
    running sequence when the pool runs dry loops for ever: the tests that run it stop at their limit naming the
    exercise's function, and every other test runs. The run is the tests of the batching logic (20.1-20.6): the three
    that spin and about fifteen that do not, not the servers' end-to-end tests, which take half a minute more and
    would show nothing the plain tests do not."""
    from tests.support.mutation import Mutation, mutated_edition, run_module_tests

    bug = Mutation("20", "serving/server.py", "ContinuousBatcher.schedule", "preempt(self.running[-1])",
                   "running[-1].id", "nobody preempted when the pool runs dry: the loop spins", "20.3")
    root = Path(__file__).resolve().parents[1]
    with mutated_edition(root, bug) as copy:
        shutil.copytree(root / "modules", copy / "modules", ignore=shutil.ignore_patterns("__pycache__", ".*"))
        run = run_module_tests(copy, "20", extra_args=["--tito-timeout=5", "-k", BATCHING_LOGIC], timeout=900)
        report = json.loads((copy / ".tito-report.json").read_text())
    stopped = [t for t in report["tests"] if "did not finish in 5 s" in t["reason"]]
    assert stopped, run.output[-3000:]
    assert all(t["reason"].startswith(f"{t['exercise']} {t['function']}: test did not finish in 5 s" if t["exercise"]
                                      else "test did not finish") for t in stopped), [t["reason"] for t in stopped]
    assert any(t["exercise"] == "20.3" for t in stopped), [t["nodeid"] for t in stopped]
    ran = [t for t in report["tests"] if t["outcome"] == "passed"]
    assert len(ran) > len(report["tests"]) // 2, "the other tests ran on"


def test_the_time_limit_stops_a_loop_where_there_is_no_alarm_signal():
    """Off the main thread (or on Windows, which has no SIGALRM) the limit raises asynchronously in the test's
    thread, with the stacks of every thread, as the alarm does."""
    from tito.pytest_plugin import TimeLimitExceeded, _Limit

    caught = []

    def spin():
        try:
            with _Limit(0.5):
                while True:
                    pass
        except TimeLimitExceeded as e:
            caught.append(e)

    worker = threading.Thread(target=spin, name="not-main")
    worker.start()
    worker.join(30)
    assert not worker.is_alive() and caught, "the loop was not stopped"
    assert caught[0].seconds == 0.5 and "not-main" in caught[0].stacks, caught[0].stacks.keys()
    assert any(name.endswith("spin") for _, name in caught[0].stacks["not-main"]), caught[0].stacks["not-main"]


def test_export_imports_every_module_in_one_process_and_names_the_first_that_fails(tmp_path):
    """The export's import check: one process for every module, each with its own time limit."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("print('a prints while importing')\nX = 1\n")
    (pkg / "b.py").write_text("from pkg.a import X\nimport no_such_module_anywhere\n")
    (pkg / "loops.py").write_text("while True:\n    pass\n")
    (pkg / "dies.py").write_text("import os\nos._exit(5)\n")
    assert nbs._first_import_failure(tmp_path, ["pkg.a"], 30) is None
    mod, lines = nbs._first_import_failure(tmp_path, ["pkg.a", "pkg.b", "pkg.loops"], 30)
    assert mod == "pkg.b" and lines[-1] == "ModuleNotFoundError: No module named 'no_such_module_anywhere'", lines
    assert any("pkg/b.py" in ln and ln.strip().startswith("File ") for ln in lines), lines
    assert nbs._first_import_failure(tmp_path, ["pkg.a", "pkg.loops", "pkg.b"], 1) == ("pkg.loops", None)
    mod, lines = nbs._first_import_failure(tmp_path, ["pkg.a", "pkg.dies"], 30)
    assert mod == "pkg.dies" and lines[-1].startswith("the importing process ended with exit code 5"), lines


def test_an_interrupted_command_gives_the_signal_handlers_back_as_it_found_them():
    """A tito command run inside a process that goes on (a test's CliRunner, a notebook) leaves SIGINT and SIGTERM as
    they were, also after an interrupt: `Interrupted` ignores both while cleaning up, and a process started later
    would inherit the ignored SIGINT (a `tito serve` started from it stopped on Ctrl-C with exit code 0)."""
    import signal

    import typer

    from tito.ui import Interrupted, handle_errors

    @handle_errors
    def interrupted():
        signal.raise_signal(signal.SIGINT)  # tito's handler raises Interrupted, ignoring both signals from then on
        raise AssertionError("not interrupted")

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(typer.Exit) as e:
        interrupted()
    assert e.value.exit_code == 130
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert issubclass(Interrupted, KeyboardInterrupt)
