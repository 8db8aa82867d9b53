"""Fast checks of the student loop's reporting: failure reasons, the package-test table, cell
names, progress-file shapes. The CLI end to end is in test_cli.py."""
from __future__ import annotations

import builtins
import json
import types

import nbformat
import numpy as np
import pytest

from tito import notebooks as nbs
from tito.commands import check
from tito.progress import Progress
from tito.pytest_plugin import qualname, summarize


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the test wants the exception object
        return e
    raise AssertionError("expected an exception")


def test_numpy_testing_message_is_not_lost():
    e = _raised(lambda: np.testing.assert_allclose([1.0, 2.0], [1.0, 3.0], err_msg="ReLU.forward on shape (2,)"))
    reason = summarize(e)
    assert reason.startswith("AssertionError: Not equal to tolerance"), reason
    assert "ReLU.forward on shape (2,)" in reason and "Mismatched elements" in reason


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


def test_qualname_without_co_qualname_uses_the_class():
    class Tensor:
        def matmul(self):
            pass

    code = types.SimpleNamespace(co_name="matmul")  # what Python 3.10 offers: no co_qualname
    frame = types.SimpleNamespace(f_code=code, f_locals={"self": Tensor()})
    assert qualname(frame).endswith("Tensor.matmul")
    assert qualname(types.SimpleNamespace(f_code=code, f_locals={})) == "matmul"


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
    assert [f.name for f in tmp_path.iterdir()] == ["progress.json"]


@pytest.mark.parametrize("missing", [["pytest"], ["pytest", "hypothesis"]])
def test_missing_test_tools_name_the_install_command(monkeypatch, missing, tmp_path):
    real = check.importlib.util.find_spec
    monkeypatch.setattr(check.importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    ctx = types.SimpleNamespace(root=tmp_path)
    with pytest.raises(check.CourseError) as e:
        check.require_test_tools(ctx)
    assert " and ".join(missing) in str(e.value) and 'pip install -e ".[test]"' in str(e.value)
