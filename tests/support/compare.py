"""One comparison helper with explicit tolerances, warning guards, and a safe bridge to PyTorch.

`assert_close` is the only place a test decides "equal enough": its failure message names the op,
each input's shape and memory layout, the largest error and the first element that differs
(received vs expected), so a student sees what to fix without a debugger.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np
import pytest

from .strategies import layout

# float32 results of the same float32 inputs, against a NumPy reference.
RTOL, ATOL = 1e-5, 1e-6
# Values and gradients against torch.autograd (float32 on both sides).
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5


def _array(x) -> np.ndarray:
    "A NumPy array of a Tensor, a torch tensor, an array or a number."
    if isinstance(x, np.ndarray):
        return x
    data = getattr(x, "data", None)
    if isinstance(data, np.ndarray):  # tinytorch Tensor
        return data
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def describe_inputs(inputs) -> str:
    "'a: shape (2, 3), strides (12, 4) (contiguous); b: 1.5' for failure messages."
    if not inputs:
        return ""
    items = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
    parts = []
    for name, v in items:
        arr = _array(v)
        parts.append(f"{name}: {layout(arr) if arr.ndim else repr(arr.item() if arr.size == 1 else v)}")
    return "; ".join(parts)


def assert_close(got, expected, *, op: str, what: str = "", inputs=None, rtol: float = RTOL, atol: float = ATOL,
                 dtype=None, reference: str = "the reference") -> None:
    """`got` (Tensor, array or torch tensor) must have `expected`'s shape (and `dtype`) and values.

    Values agree when |got - expected| <= atol + rtol * |expected| everywhere (NaN only where the
    reference is NaN, infinities equal). The failure message names `op`, `what` was computed, the
    inputs' shapes and layouts, the largest error, and the first differing element.
    """
    g, e = _array(got), _array(expected)
    head = f"{op}: {what}" if what else op
    ins = describe_inputs(inputs)
    tail = f" [inputs: {ins}]" if ins else ""
    assert g.shape == e.shape, f"{head}: result has shape {g.shape}; expected {e.shape} (as {reference}){tail}"
    if dtype is not None:
        assert g.dtype == np.dtype(dtype), f"{head}: result has dtype {g.dtype}; expected {np.dtype(dtype)}{tail}"
    if g.dtype.kind in "biu" and e.dtype.kind in "biu":
        bad = g != e
    else:
        g64, e64 = g.astype(np.float64), e.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if not np.any(bad):
        return
    g64, e64 = g.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g64 - e64)
    finite = err[np.isfinite(err)]
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if g.ndim else ()
    raise AssertionError(
        f"{head}: {int(np.sum(bad))} of {bad.size} values differ from {reference} "
        f"(max abs error {finite.max() if finite.size else float('nan'):.3g}, rtol {rtol:g}, atol {atol:g}); "
        f"at index {first}: received {g[first].item()!r}, expected {e[first].item()!r}{tail}")


def check_close(got, expected, *, fn: str, what: str, rtol=RTOL, atol=ATOL, dtype=np.float32, inputs=None,
                reference: str = "NumPy"):
    """`got` must be a Tensor with the reference's shape, the expected dtype and values."""
    from tinytorch.core.tensor import Tensor

    assert isinstance(got, Tensor), f"{fn}: {what} returned a {type(got).__name__}; expected a Tensor"
    assert_close(got, np.asarray(_array(expected)), op=fn, what=what, inputs=inputs, rtol=rtol, atol=atol,
                 dtype=dtype, reference=reference)


# ---------------------------------------------------------------------------------------------
# Warning guards
# ---------------------------------------------------------------------------------------------
@contextmanager
def no_float_warnings(what: str):
    """Fail (naming `what`) if NumPy reports overflow, an invalid value or a division by zero."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(over="warn", invalid="warn", divide="warn", under="ignore"):
            try:
                yield
            except RuntimeWarning as w:
                pytest.fail(f"{what} raised RuntimeWarning({w}); expected no overflow, invalid value or "
                            f"division by zero for inputs of magnitude up to 1e4 (only exponentiate numbers <= 0)")


def no_warnings(fn):
    "Call fn() with every warning (overflow, divide by zero, invalid value) turned into an error."
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


# ---------------------------------------------------------------------------------------------
# PyTorch, the reference (an optional dependency: tests that need it skip without it)
# ---------------------------------------------------------------------------------------------
def torch_or_skip():
    "The torch module, or skip the calling test when it is not installed."
    return pytest.importorskip("torch")


def to_torch(x, requires_grad: bool = False, dtype=None):
    """A torch tensor holding a *copy* of `x` (an array, Tensor or number).

    `torch.from_numpy` rejects negative strides, and `np.ascontiguousarray` keeps them on size-1
    axes; a fresh C-ordered copy has none. The copy also means that torch never shares memory with
    the array a tinytorch op reads.
    """
    import torch

    arr = np.array(_array(x), dtype=dtype, order="C", copy=True)
    assert all(s >= 0 for s in arr.strides), f"to_torch: the copy has negative strides {arr.strides}"
    t = torch.from_numpy(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t
