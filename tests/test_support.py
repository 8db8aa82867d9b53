"""The shared test support (tests/support) can fail: its comparison helper, torch bridge and table.

These tests check the harness the module suites rely on, so that a module test that passes is
evidence and not an artefact of a helper that never complains.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import (
    OPS, assert_close, laid_out, no_float_warnings, property_settings, rows, shapes, to_torch,
)


def test_assert_close_names_op_inputs_error_and_element():
    x = np.arange(6, dtype=np.float32).reshape(2, 3).T
    got = np.array([1.0, 2.0, 3.5], np.float32)
    with pytest.raises(AssertionError) as info:
        assert_close(got, [1.0, 2.0, 3.0], op="mul", what="x * 2", inputs={"x": x}, rtol=1e-5, atol=1e-6)
    msg = str(info.value)
    for part in ("mul: x * 2", "1 of 3 values differ", "max abs error 0.5", "at index (2,)", "received 3.5",
                 "expected 3.0", "shape (3, 2)", "non-contiguous"):
        assert part in msg, f"assert_close's message lacks {part!r}: {msg}"
    with pytest.raises(AssertionError, match=r"shape \(3,\); expected \(2,\)"):
        assert_close(got, [1.0, 2.0], op="add")
    with pytest.raises(AssertionError, match="dtype float32; expected float64"):
        assert_close(got, got, op="add", dtype=np.float64)
    assert_close(got, got.astype(np.float64) * (1 + 1e-7), op="mul")  # within tolerance: no error
    with pytest.raises(AssertionError):
        assert_close(np.array([np.nan], np.float32), [1.0], op="log")  # NaN only where the reference has one


def test_to_torch_copies_negative_strides_on_size_one_axes():
    torch = pytest.importorskip("torch")
    base = np.arange(6, dtype=np.float32).reshape(1, 6)
    view = base[::-1, ::-2]  # negative strides, one of them on a size-1 axis
    t = to_torch(view, requires_grad=True)
    assert t.requires_grad and np.array_equal(t.detach().numpy(), view)
    t.detach().numpy()[0, 0] = -1.0
    assert view[0, 0] != -1.0, "to_torch must copy: the torch tensor shares memory with the array"
    with pytest.raises(ValueError):
        torch.from_numpy(view)  # what to_torch protects the tests from


@property_settings(max_examples=60)
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=3, min_side=2))
def test_laid_out_draws_the_shape_and_non_contiguous_layouts(data, shape):
    x = data.draw(laid_out(shape))
    assert x.shape == tuple(shape) and x.dtype == np.float32


def test_laid_out_reaches_every_kind_of_layout():
    kinds = set()

    @property_settings(max_examples=150)
    @given(data=st.data())
    def collect(data):
        x = data.draw(laid_out((3, 4)))
        kinds.add("contiguous" if x.flags["C_CONTIGUOUS"] else "transposed" if x.flags["F_CONTIGUOUS"] else
                  "reversed" if any(s < 0 for s in x.strides) else "strided")

    collect()
    assert kinds >= {"contiguous", "transposed", "reversed", "strided"}, f"laid_out only drew {kinds}"


def test_no_float_warnings_fails_on_overflow():
    with pytest.raises(pytest.fail.Exception, match="overflow"):
        with no_float_warnings("exp(1e4)"):
            np.exp(np.float32(1e4))


def test_the_table_is_complete_and_consistent():
    names = {op.name for op in OPS}
    for needed in ("add", "sub", "mul", "div", "pow", "neg", "matmul", "sum", "mean", "max", "var", "reshape",
                   "transpose", "T", "getitem_slices", "getitem_int_array", "concatenate", "stack", "exp", "log",
                   "sqrt", "tanh", "abs", "where", "masked_fill", "relu", "sigmoid", "gelu", "softmax",
                   "log_softmax", "mse", "cross_entropy", "binary_cross_entropy"):
        assert needed in names, f"the reference table has no row {needed!r}"
    for op in rows(differentiable=True):
        assert op.torch is not None and op.grad_fn, f"{op.name}: a differentiable row needs a torch call and a grad_fn name"
        assert op.grad_exercise[0].startswith("6."), f"{op.name}: the gradient is written in module 06"
    for op in OPS:
        assert op.exercise is None or op.exercise[0].startswith(op.module.lstrip("0") + "."), (
            f"{op.name}: exercise {op.exercise} does not belong to module {op.module}")


def test_the_warm_pytest_runs_as_a_fresh_interpreter_would_and_stops_at_its_time_limit(tmp_path):
    """tests/support/warm_pytest.py: each run is a fork of a process that imported pytest and hypothesis but not the
    course: the copy's own `tinytorch` and `tests` are imported, with the run's folder, environment and path; a copy
    that would test another package is refused; a run past its time limit is killed and the next run still works."""
    import os
    import subprocess
    import time
    from pathlib import Path

    from tests.support.warm_pytest import WRONG_PACKAGE, WarmPytest

    def edition(name: str, mark: str) -> Path:
        root = tmp_path / name
        (root / "tinytorch").mkdir(parents=True)
        (root / "tinytorch" / "__init__.py").write_text(f"MARK = {mark!r}\n")
        (root / "tests").mkdir()
        (root / "tests" / "__init__.py").write_text("")
        (root / "tests" / "test_it.py").write_text(
            "import os, sys, time\nimport tinytorch, tests\n"
            "def test_mark():\n"
            "    assert tinytorch.MARK == os.environ['WANT'], tinytorch.MARK\n"
            "    assert os.path.dirname(tests.__file__) == os.path.join(os.getcwd(), 'tests'), tests.__file__\n"
            "    assert sys.path[0] in ('', os.getcwd()) or os.environ['PYTHONPATH'] in sys.path\n"
            "def test_sleep():\n"
            "    if os.environ.get('HANG'): time.sleep(600)\n")
        return root

    runner = WarmPytest()
    try:
        for name in ("one", "two"):
            root = edition(name, name)
            env = dict(os.environ, PYTHONPATH=str(root), WANT=name)
            rc, out, err = runner.run(["-q", "-p", "no:xdist", "-p", "no:randomly", "tests/test_it.py"], root, env, 120)
            assert rc == 0 and "2 passed" in out, (rc, out, err)
        other = edition("three", "three")
        rc, out, err = runner.run(["-q", "tests/test_it.py"], other, dict(os.environ, PYTHONPATH=str(root), WANT="x"), 120)
        assert rc == WRONG_PACKAGE and "would test" in err, (rc, out, err)
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            runner.run(["-q", "-p", "no:xdist", "tests/test_it.py"], root, dict(env, HANG="1"), 5)
        assert time.monotonic() - started < 60
        rc, out, err = runner.run(["-q", "-p", "no:xdist", "-p", "no:randomly", "tests/test_it.py"], root, env, 120)
        assert rc == 0 and "2 passed" in out, (rc, out, err)
    finally:
        runner.close()


def test_tito_test_stops_a_failing_property_test_at_its_first_example_even_with_torch_hidden(tmp_path):
    """Under `tito test`'s report (its hypothesis profile) a property test does not shrink, also when
    `-p tests.support.no_torch` imports tests.support before the profile is loaded (the mutation harness's runs)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    probe = root / "tests" / "modules" / f"test_zz_phases_{tmp_path.name}.py"
    probe.write_text("from tests.support import property_settings\n"
                     "def test_phases():\n    print('PHASES', sorted(p.name for p in property_settings().phases))\n")
    try:
        def phases(*extra):
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:randomly",
                                  "-p", "tests.support.no_torch", str(probe), *extra], cwd=root, capture_output=True,
                                 text=True, timeout=300).stdout
            return next(line for line in out.splitlines() if line.startswith("PHASES"))
        assert "shrink" in phases(), "the suite's own runs shrink a failing example"
        assert "shrink" not in phases(f"--tito-report={tmp_path / 'r.json'}"), "tito test's runs must not shrink"
    finally:
        probe.unlink()
