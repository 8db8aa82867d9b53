"""Module 01 (tensor): the exported `tinytorch.core.tensor` checked against NumPy.

Every operation a student writes is stated once in a reference table below (its TinyTorch form, its
NumPy form and the inputs it is defined on); one property test per kind of operation drives the
whole table. Hypothesis draws the shapes, the broadcasting pairs, Python scalars on either side and
the memory layout of each input (contiguous, transposed, strided or reversed views of a larger base
array), so a method that only works on fresh contiguous arrays fails here.

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("1.4", "Tensor.matmul")`:
run one exercise with `pytest tests/modules/test_01_tensor.py --exercise 1.4`.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays, mutually_broadcastable_shapes

from tinytorch.core.tensor import Tensor, broadcast_shape

pytestmark = pytest.mark.module("01")

# Modest budget: the whole file runs in seconds on two cores. The `explain` phase is left out: on a
# failing test it costs seconds per test and adds nothing to a minimal (shrunk) counterexample.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
PROPERTY = settings(max_examples=50, deadline=None, phases=PHASES)

# Tolerances for float32 results compared with NumPy on the same float32 inputs.
RTOL, ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------------
# Inputs: value domains, memory layouts, shapes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Domain:
    """Where an operand's values may lie: [lo, hi], and |v| >= min_abs (e.g. away from 0 for /)."""

    lo: float
    hi: float
    min_abs: float = 0.0

    def elements(self) -> st.SearchStrategy[float]:
        "float32-representable values for array elements."
        if self.min_abs:
            return st.one_of(
                st.floats(self.lo, -self.min_abs, width=32), st.floats(self.min_abs, self.hi, width=32)
            )
        return st.floats(self.lo, self.hi, width=32)

    def scalars(self) -> st.SearchStrategy[int | float]:
        "Python ints and floats (never NumPy scalars) for the scalar side of an operator."
        ok = lambda v: abs(v) >= self.min_abs  # noqa: E731
        ints = st.integers(math.ceil(self.lo), math.floor(self.hi)).filter(ok)
        floats = st.floats(self.lo, self.hi, allow_nan=False, allow_infinity=False).filter(ok)
        return st.one_of(ints, floats)


ANY = Domain(-10.0, 10.0)
NONZERO = Domain(-5.0, 5.0, min_abs=0.5)  # divisors
POSITIVE = Domain(0.25, 4.0)  # bases of **
EXPONENT = Domain(-3.0, 3.0)  # exponents of **


@st.composite
def laid_out(draw, shape, domain: Domain = ANY) -> np.ndarray:
    """A float32 array of exactly `shape` whose memory layout is drawn too.

    It is a view of a larger base array: every axis is sliced with a step of 1 or 2, forwards or
    backwards, then the axes are permuted. Identity permutation and unit steps give an ordinary
    C-contiguous array; anything else is a non-contiguous view (strides that skip, run backwards
    or are out of order).
    """
    shape = tuple(shape)
    ndim = len(shape)
    perm = draw(st.permutations(range(ndim))) if ndim else []
    steps = draw(st.lists(st.sampled_from([1, 2, -1, -2]), min_size=ndim, max_size=ndim))
    pre = [0] * ndim  # shape before the permutation: pre[perm[i]] == shape[i]
    for i, p in enumerate(perm):
        pre[p] = shape[i]
    base = draw(arrays(np.float32, tuple(n * abs(s) for n, s in zip(pre, steps)), elements=domain.elements()))
    # the trailing Ellipsis keeps a 0-d result an array view (base[()] would be a NumPy scalar)
    view = base[tuple(slice(None, None, s) for s in steps) + (Ellipsis,)].transpose(perm)
    assert view.shape == shape
    return view


def layout(x: np.ndarray) -> str:
    "How an input is laid out, for failure messages."
    kind = "contiguous" if x.flags["C_CONTIGUOUS"] else "non-contiguous"
    return f"shape {x.shape}, strides {x.strides} ({kind})"


def shape_id(shape) -> str:
    "A test id for a shape: (2, 3) -> '2x3'."
    return "x".join(map(str, shape)) or "scalar"


def shapes(min_dims=0, max_dims=4, min_side=1, max_side=3):
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_pairs(min_dims=0, max_dims=4, min_side=1, max_side=3):
    "Two shapes that broadcast together (either may have fewer dimensions or size-1 axes)."
    return mutually_broadcastable_shapes(
        num_shapes=2, min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
    ).map(lambda s: s.input_shapes)


@st.composite
def incompatible_pairs(draw):
    "Two shapes that do NOT broadcast: one aligned axis has sizes x != y, both > 1."
    a, b = draw(broadcast_pairs(min_dims=1))
    k = draw(st.integers(1, min(len(a), len(b))))  # axis -k, aligned from the right
    x = draw(st.integers(2, 5))
    y = draw(st.integers(2, 5).filter(lambda v: v != x))
    a = a[: len(a) - k] + (x,) + a[len(a) - k + 1 :]
    b = b[: len(b) - k] + (y,) + b[len(b) - k + 1 :]
    return a, b


@st.composite
def axis_specs(draw, ndim: int, allow_empty: bool = True):
    "None, an int or a tuple of distinct axes, each written as a positive or negative index."
    if ndim == 0:
        return None
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    spell = lambda ax: ax - ndim if draw(st.booleans()) else ax  # noqa: E731
    if kind == "int":
        return spell(draw(st.integers(0, ndim - 1)))
    axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=0 if allow_empty else 1, max_size=ndim))
    return tuple(spell(ax) for ax in axes)


def check_close(got, expected, *, fn: str, what: str, rtol=RTOL, atol=ATOL, dtype=np.float32):
    """`got` must be a Tensor with NumPy's shape, the expected dtype and NumPy's values."""
    expected = np.asarray(expected)
    assert isinstance(got, Tensor), f"{fn}: {what} returned a {type(got).__name__}; expected a Tensor"
    assert got.shape == expected.shape, f"{fn}: {what} has shape {got.shape}; expected {expected.shape} (as NumPy)"
    if dtype is not None:
        assert got.dtype == dtype, f"{fn}: {what} has dtype {got.dtype}; expected {np.dtype(dtype)}"
    np.testing.assert_allclose(
        got.data, expected, rtol=rtol, atol=atol,
        err_msg=f"{fn}: {what}: values differ from NumPy (ACTUAL = received, DESIRED = expected)",
    )


# ---------------------------------------------------------------------------------------------
# Reference tables: each operation written once, in TinyTorch and in NumPy
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BinaryOp:
    name: str  # the op name the error messages use ("add" ...)
    symbol: str
    tt: Callable  # applied to Tensors, ndarrays and Python scalars: exercises the reflected forms
    ref: Callable  # NumPy reference
    left: Domain
    right: Domain

    def __repr__(self) -> str:
        return self.name


BINARY_OPS = [
    BinaryOp("add", "+", operator.add, np.add, ANY, ANY),
    BinaryOp("sub", "-", operator.sub, np.subtract, ANY, ANY),
    BinaryOp("mul", "*", operator.mul, np.multiply, ANY, ANY),
    BinaryOp("div", "/", operator.truediv, np.true_divide, ANY, NONZERO),
    BinaryOp("pow", "**", operator.pow, np.power, POSITIVE, EXPONENT),
]
BINARY_IDS = [op.name for op in BINARY_OPS]

UNARY_OPS = [("neg", operator.neg, np.negative, ANY)]

REDUCTIONS = [
    ("sum", Tensor.sum, np.sum),
    ("mean", Tensor.mean, np.mean),
    ("max", Tensor.max, np.max),
]
REDUCTION_IDS = [r[0] for r in REDUCTIONS]


# ---------------------------------------------------------------------------------------------
# Exercise 1.1: broadcast_shape
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("1.1", "broadcast_shape")
@PROPERTY
@given(pair=broadcast_pairs(max_dims=5, min_side=0, max_side=4))
def test_broadcast_shape_matches_numpy(pair):
    a, b = pair
    expected = np.broadcast_shapes(a, b)
    got = broadcast_shape(a, b)
    assert isinstance(got, tuple), f"broadcast_shape{a, b} returned a {type(got).__name__}; expected a tuple"
    assert got == expected, f"broadcast_shape{a, b} returned {got}; expected {expected} (np.broadcast_shapes)"
    assert broadcast_shape(b, a) == expected, f"broadcast_shape{b, a} returned {broadcast_shape(b, a)}; expected {expected}"
    assert broadcast_shape(list(a), list(b)) == expected, "broadcast_shape must accept lists as well as tuples"


@pytest.mark.exercise("1.1", "broadcast_shape")
@PROPERTY
@given(pair=incompatible_pairs(), op=st.sampled_from(["add", "mul", "my_op"]))
def test_broadcast_shape_error_names_op_and_shapes(pair, op):
    a, b = pair
    with pytest.raises(ValueError) as info:
        broadcast_shape(a, b, op)
    msg = str(info.value)
    for part in (op, str(a), str(b)):
        assert part in msg, f"broadcast_shape{a, b, op}: the error must contain {part!r}; got: {msg!r}"


@pytest.mark.exercise("1.1", "broadcast_shape")
def test_broadcast_shape_examples():
    cases = {((2, 3), (3,)): (2, 3), ((32, 1, 4), (3, 1)): (32, 3, 4), ((), (5, 2)): (5, 2),
             ((), ()): (), ((0,), (1,)): (0,), ((4, 1), (1, 4)): (4, 4)}
    for (a, b), expected in cases.items():
        got = broadcast_shape(a, b)
        assert got == expected, f"broadcast_shape({a}, {b}) returned {got}; expected {expected}"
    with pytest.raises(ValueError):
        broadcast_shape((0,), (3,))


# ---------------------------------------------------------------------------------------------
# Exercise 1.2: Tensor.__init__ (dtype policy, no needless copies, flags, metadata)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("1.2", "Tensor.__init__")
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_init_floating_data_defaults_to_float32(dtype):
    arr = np.arange(6, dtype=dtype).reshape(2, 3) / 4
    t = Tensor(arr)
    assert t.dtype == np.float32, f"Tensor(array of {np.dtype(dtype)}) has dtype {t.dtype}; expected float32"
    np.testing.assert_allclose(t.data, arr.astype(np.float32), rtol=0, atol=0, err_msg="Tensor.__init__ changed the values")
    for data in ([1.5, 2.5], [[1.0, 2.0], [3.0, 4.0]], 3.0, [1, 2.5]):
        got = Tensor(data)
        assert got.dtype == np.float32, f"Tensor({data!r}) has dtype {got.dtype}; expected float32"
        assert got.shape == np.shape(data), f"Tensor({data!r}) has shape {got.shape}; expected {np.shape(data)}"


@pytest.mark.exercise("1.2", "Tensor.__init__")
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_])
def test_init_keeps_integer_and_bool_dtypes(dtype):
    arr = np.arange(4).astype(dtype)
    t = Tensor(arr)
    assert t.dtype == dtype, f"Tensor(array of {np.dtype(dtype)}) has dtype {t.dtype}; expected {np.dtype(dtype)} (kept)"
    assert np.array_equal(t.data, arr), f"Tensor.__init__ changed the values: received {t.data}, expected {arr}"


@pytest.mark.exercise("1.2", "Tensor.__init__")
def test_init_python_data_and_explicit_dtype():
    assert Tensor([1, 2, 3]).dtype.kind == "i", f"Tensor([1, 2, 3]) has dtype {Tensor([1, 2, 3]).dtype}; expected an integer dtype"
    assert Tensor(2).dtype.kind == "i" and Tensor(2).shape == (), "Tensor(2) should be a 0-d integer tensor"
    assert Tensor(True).dtype == np.bool_, f"Tensor(True) has dtype {Tensor(True).dtype}; expected bool"
    assert Tensor(3.0).shape == () and Tensor(3.0).item() == 3.0, "a Python float becomes a 0-d tensor"
    for data, dtype in [([1.0, 2.0], np.float64), ([1, 2], np.float32), ([1.5], np.float16), ([1.0, 2.0], np.int32),
                        ([1, 2], "float64")]:
        t = Tensor(data, dtype=dtype)
        assert t.dtype == np.dtype(dtype), f"Tensor({data}, dtype={dtype!r}) has dtype {t.dtype}; expected {np.dtype(dtype)}"
    src = Tensor([[1.0, 2.0]])
    copy = Tensor(src)
    assert isinstance(copy.data, np.ndarray) and not isinstance(copy.data, Tensor), "Tensor(tensor).data must be an ndarray"
    assert copy.dtype == np.float32 and np.array_equal(copy.data, src.data), f"Tensor(tensor) gave {copy!r}; expected {src!r}"


@pytest.mark.exercise("1.2", "Tensor.__init__")
def test_init_requires_grad_and_grad():
    t = Tensor([1.0, 2.0])
    assert t.requires_grad is False and t.grad is None, (
        f"defaults: requires_grad={t.requires_grad!r}, grad={t.grad!r}; expected False and None")
    for flag in (True, 1):
        r = Tensor([1.0], requires_grad=flag)
        assert r.requires_grad is True, f"Tensor(..., requires_grad={flag!r}).requires_grad is {r.requires_grad!r}; expected True"
        assert r.grad is None, f"a new tensor's grad is {r.grad!r}; expected None"
    r.grad = np.ones(1, dtype=np.float32)  # a gradient can be stored (module 06 fills it in)
    assert r.grad is not None


@pytest.mark.exercise("1.2", "Tensor.__init__")
@pytest.mark.parametrize("data", [["a", "b"], "abc", None, {"a": 1}, [1, "a"], object()],
                         ids=["strings", "string", "None", "dict", "mixed", "object"])
def test_init_rejects_non_numeric_data(data):
    found = str(np.asarray(data).dtype)
    with pytest.raises(TypeError) as info:
        Tensor(data)
    assert found in str(info.value), (
        f"Tensor({data!r}) raised TypeError({str(info.value)!r}); the message should name the dtype found, {found!r}")


@pytest.mark.exercise("1.2", "Tensor.__init__")
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_init_does_not_copy_float32_arrays_or_views(data, shape):
    x = data.draw(laid_out(shape))
    t = Tensor(x)
    assert np.shares_memory(t.data, x) or x.size == 0, (
        f"Tensor(float32 array with {layout(x)}) copied the buffer; expected a view (np.asarray does not copy)")
    assert t.strides == x.strides, f"Tensor(array with {layout(x)}) has strides {t.strides}; expected {x.strides}"
    assert (t.shape, t.ndim, t.size, t.nbytes) == (x.shape, x.ndim, x.size, x.nbytes), (
        f"shape/ndim/size/nbytes are {(t.shape, t.ndim, t.size, t.nbytes)}; expected {(x.shape, x.ndim, x.size, x.nbytes)}")
    assert t.is_contiguous() == bool(x.flags["C_CONTIGUOUS"]), f"is_contiguous() is wrong for {layout(x)}"
    c = t.contiguous()
    assert c.is_contiguous() and np.array_equal(c.data, x), f"contiguous() of {layout(x)} must be a row-major copy with equal values"
    # Views made by the given methods stay views because __init__ does not copy.
    assert np.shares_memory(t.T.data, x) and t.T.shape == x.T.shape, ".T must be a view with the axes reversed"
    if x.ndim:
        assert np.shares_memory(t[..., ::2].data, x), "slicing t[..., ::2] must be a view"


@pytest.mark.exercise("1.2", "Tensor.__init__")
def test_repr_item_len():
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    text = repr(t)
    assert "(2, 3)" in text and "float32" in text, f"repr must show the shape (2, 3) and dtype float32; got {text!r}"
    assert "int" in repr(Tensor([1, 2])), f"repr of an integer tensor must show its dtype; got {repr(Tensor([1, 2]))!r}"
    assert len(t) == 2, f"len(Tensor of shape (2, 3)) is {len(t)}; expected 2"
    one = Tensor([[4.5]])
    assert one.item() == 4.5 and isinstance(one.item(), float), f"Tensor([[4.5]]).item() gave {one.item()!r}; expected 4.5"
    with pytest.raises(ValueError):
        t.item()


# ---------------------------------------------------------------------------------------------
# Exercise 1.3: Tensor._elementwise (+ - * / ** with broadcasting, scalars, reflected forms; neg)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("op", BINARY_OPS, ids=BINARY_IDS)
@PROPERTY
@given(data=st.data(), pair=broadcast_pairs())
def test_binary_tensor_tensor_matches_numpy(op, data, pair):
    a = data.draw(laid_out(pair[0], op.left), label="a")
    b = data.draw(laid_out(pair[1], op.right), label="b")
    a_before, b_before = a.copy(), b.copy()
    got = op.tt(Tensor(a), Tensor(b))
    check_close(got, op.ref(a, b), fn="Tensor._elementwise",
                what=f"Tensor[{layout(a)}] {op.symbol} Tensor[{layout(b)}]")
    assert np.array_equal(a, a_before) and np.array_equal(b, b_before), f"{op.symbol} modified its inputs in place"


@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("scalar_side", ["right", "left"])
@pytest.mark.parametrize("op", BINARY_OPS, ids=BINARY_IDS)
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_binary_with_python_scalar(op, scalar_side, data, shape):
    if scalar_side == "right":  # Tensor op scalar
        x = data.draw(laid_out(shape, op.left), label="x")
        s = data.draw(op.right.scalars(), label="scalar")
        got, expected, what = op.tt(Tensor(x), s), op.ref(x, s), f"Tensor[{layout(x)}] {op.symbol} {s!r}"
    else:  # scalar op Tensor: the reflected method (__radd__, __rsub__, ...)
        x = data.draw(laid_out(shape, op.right), label="x")
        s = data.draw(op.left.scalars(), label="scalar")
        got, expected, what = op.tt(s, Tensor(x)), op.ref(s, x), f"{s!r} {op.symbol} Tensor[{layout(x)}]"
    # NumPy keeps float32 when a Python scalar meets a float32 array; so must we.
    check_close(got, expected, fn="Tensor._elementwise", what=what)


@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("op", BINARY_OPS, ids=BINARY_IDS)
@PROPERTY
@given(data=st.data(), pair=broadcast_pairs(max_dims=3))
def test_binary_with_ndarray_on_either_side(op, data, pair):
    a = data.draw(laid_out(pair[0], op.left), label="a")
    b = data.draw(laid_out(pair[1], op.right), label="b")
    expected = op.ref(a, b)
    # ndarray op Tensor: NumPy must defer to Tensor's reflected method (__array_priority__),
    # so the result is one Tensor, not an object array of Tensors.
    check_close(op.tt(a, Tensor(b)), expected, fn="Tensor._elementwise",
                what=f"ndarray[{layout(a)}] {op.symbol} Tensor[{layout(b)}]")
    check_close(op.tt(Tensor(a), b), expected, fn="Tensor._elementwise",
                what=f"Tensor[{layout(a)}] {op.symbol} ndarray[{layout(b)}]")


@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("name, tt, ref, domain", UNARY_OPS, ids=[u[0] for u in UNARY_OPS])
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_unary_matches_numpy(name, tt, ref, domain, data, shape):
    x = data.draw(laid_out(shape, domain))
    check_close(tt(Tensor(x)), ref(x), fn=f"Tensor.__{name}__", what=f"{name}(Tensor[{layout(x)}])")


@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("op", BINARY_OPS, ids=BINARY_IDS)
@PROPERTY
@given(pair=incompatible_pairs())
def test_binary_shape_mismatch_names_op_and_shapes(op, pair):
    a, b = pair
    with pytest.raises(ValueError) as info:
        op.tt(Tensor(np.ones(a, np.float32)), Tensor(np.ones(b, np.float32)))
    msg = str(info.value)
    for part in (op.name, str(a), str(b)):
        assert part in msg, (
            f"Tensor{a} {op.symbol} Tensor{b}: the ValueError must contain {part!r} (the op and both shapes); got: {msg!r}")


@pytest.mark.exercise("1.3", "Tensor._elementwise")
def test_integer_tensors_and_scalars():
    i = Tensor([1, 2, 3])
    s = i + 1
    assert s.dtype.kind == "i" and np.array_equal(s.data, [2, 3, 4]), f"Tensor([1, 2, 3]) + 1 gave {s!r}; expected integers [2, 3, 4]"
    h = i * 0.5
    assert h.dtype == np.float32, f"Tensor([1, 2, 3]) * 0.5 has dtype {h.dtype}; expected float32 (a float result)"
    np.testing.assert_allclose(h.data, [0.5, 1.0, 1.5], rtol=0, atol=0, err_msg="Tensor([1, 2, 3]) * 0.5")
    d = Tensor([1, 2]) / 2
    np.testing.assert_allclose(d.data, [0.5, 1.0], rtol=0, atol=0, err_msg="Tensor([1, 2]) / 2 must be true division")
    f = Tensor([1.0, 2.0]) + Tensor([1, 2])
    assert f.dtype == np.float32, f"float32 + int tensor has dtype {f.dtype}; expected float32"


# ---------------------------------------------------------------------------------------------
# Exercise 1.4: Tensor.matmul
# ---------------------------------------------------------------------------------------------
@st.composite
def matmul_shapes(draw, aligned: bool = True):
    """Shapes of `a @ b`: each operand a vector, a matrix or a batch of matrices
    (batch dimensions broadcast). With aligned=False the inner sizes differ."""
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    k_b = k if aligned else draw(st.integers(1, 5).filter(lambda v: v != k))
    batch_a, batch_b = draw(broadcast_pairs(min_dims=1, max_dims=2))
    kind_a = draw(st.sampled_from(["vector", "matrix", "batched"]))
    kind_b = draw(st.sampled_from(["vector", "matrix", "batched"]))
    a = {"vector": (k,), "matrix": (n, k), "batched": batch_a + (n, k)}[kind_a]
    b = {"vector": (k_b,), "matrix": (k_b, m), "batched": batch_b + (k_b, m)}[kind_b]
    return a, b


@pytest.mark.exercise("1.4", "Tensor.matmul")
@PROPERTY
@given(data=st.data(), pair=matmul_shapes())
def test_matmul_matches_numpy(data, pair):
    a = data.draw(laid_out(pair[0]), label="a")
    b = data.draw(laid_out(pair[1]), label="b")
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    what = f"Tensor[{layout(a)}] @ Tensor[{layout(b)}]"
    check_close(Tensor(a) @ Tensor(b), expected, fn="Tensor.matmul", what=what, rtol=1e-5, atol=1e-4)
    check_close(Tensor(a).matmul(Tensor(b)), expected, fn="Tensor.matmul", what=what.replace(" @ ", ".matmul(") + ")",
                rtol=1e-5, atol=1e-4)
    check_close(Tensor(a) @ b, expected, fn="Tensor.matmul", what=f"Tensor @ ndarray ({pair[0]} @ {pair[1]})",
                rtol=1e-5, atol=1e-4)
    check_close(a @ Tensor(b), expected, fn="Tensor.matmul", what=f"ndarray @ Tensor ({pair[0]} @ {pair[1]})",
                rtol=1e-5, atol=1e-4)


@pytest.mark.exercise("1.4", "Tensor.matmul")
def test_matmul_examples():
    a = Tensor([[1.0, 2.0], [3.0, 4.0]])
    b = Tensor([[5.0, 6.0], [7.0, 8.0]])
    check_close(a @ b, [[19.0, 22.0], [43.0, 50.0]], fn="Tensor.matmul", what="[[1, 2], [3, 4]] @ [[5, 6], [7, 8]]", atol=0)
    v = Tensor([1.0, 1.0])
    check_close(a @ v, [3.0, 7.0], fn="Tensor.matmul", what="matrix @ vector", atol=0)
    check_close(v @ a, [4.0, 6.0], fn="Tensor.matmul", what="vector @ matrix", atol=0)
    check_close(v @ v, np.float32(2.0), fn="Tensor.matmul", what="vector @ vector (a 0-d result)", atol=0)


@pytest.mark.exercise("1.4", "Tensor.matmul")
@PROPERTY
@given(pair=matmul_shapes(aligned=False))
def test_matmul_mismatch_names_both_shapes(pair):
    a, b = pair
    with pytest.raises(ValueError) as info:
        Tensor(np.ones(a, np.float32)) @ Tensor(np.ones(b, np.float32))
    msg = str(info.value)
    for part in (str(a), str(b)):
        assert part in msg, f"Tensor{a} @ Tensor{b}: the ValueError must name both shapes ({part} missing); got: {msg!r}"


@pytest.mark.exercise("1.4", "Tensor.matmul")
def test_matmul_rejects_scalars_and_unbroadcastable_batches():
    for a, b in [((), (2, 2)), ((2, 2), ())]:
        with pytest.raises(ValueError) as info:
            Tensor(np.ones(a, np.float32)) @ Tensor(np.ones(b, np.float32))
        assert "matmul" in str(info.value), f"Tensor{a} @ Tensor{b}: the error should name matmul; got {info.value}"
    with pytest.raises(ValueError) as info:
        Tensor(np.ones((2, 3, 4), np.float32)) @ Tensor(np.ones((3, 4, 5), np.float32))
    assert "matmul" in str(info.value), f"batch sizes 2 vs 3: the error should name matmul; got {info.value}"


@pytest.mark.exercise("1.4", "Tensor.matmul")
@settings(max_examples=25, deadline=None, phases=PHASES)
@given(data=st.data(), pair=matmul_shapes())
def test_matmul_matches_torch(data, pair):
    torch = pytest.importorskip("torch")
    a = data.draw(laid_out(pair[0]), label="a")
    b = data.draw(laid_out(pair[1]), label="b")
    expected = torch.matmul(torch.from_numpy(a.copy()), torch.from_numpy(b.copy())).numpy()
    check_close(Tensor(a) @ Tensor(b), expected, fn="Tensor.matmul", what=f"{pair[0]} @ {pair[1]} vs torch.matmul",
                rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Exercise 1.5: Tensor._reduce (sum, mean, max)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("1.5", "Tensor._reduce")
@pytest.mark.parametrize("name, tt, ref", REDUCTIONS, ids=REDUCTION_IDS)
@PROPERTY
@given(data=st.data(), shape=shapes(max_side=4), keepdims=st.booleans())
def test_reduction_matches_numpy(name, tt, ref, data, shape, keepdims):
    x = data.draw(laid_out(shape), label="x")
    axis = data.draw(axis_specs(len(shape)), label="axis")
    before = x.copy()
    got = tt(Tensor(x), axis=axis, keepdims=keepdims)
    expected = ref(x, axis=axis, keepdims=keepdims)
    # float32 accumulation: allow rounding proportional to the magnitude summed.
    atol = 1e-6 * max(1.0, float(np.abs(x, dtype=np.float64).sum()))
    check_close(got, expected, fn="Tensor._reduce", what=f"Tensor[{layout(x)}].{name}(axis={axis!r}, keepdims={keepdims})",
                atol=atol)
    assert np.array_equal(x, before), f"{name} modified its input in place"
    assert tt(Tensor(x), axis, keepdims).shape == got.shape, f"{name}(axis, keepdims) must also accept positional arguments"


@pytest.mark.exercise("1.5", "Tensor._reduce")
def test_reduction_examples():
    x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    total = x.sum()
    assert total.shape == () and total.item() == 21.0, f"x.sum() gave {total!r}; expected a 0-d tensor holding 21.0"
    check_close(x.mean(axis=1), [2.0, 5.0], fn="Tensor._reduce", what="x.mean(axis=1)", atol=0)
    check_close(x.max(axis=0), [4.0, 5.0, 6.0], fn="Tensor._reduce", what="x.max(axis=0)", atol=0)
    check_close(x.sum(axis=-1, keepdims=True), [[6.0], [15.0]], fn="Tensor._reduce", what="x.sum(axis=-1, keepdims=True)", atol=0)
    check_close(x.sum(axis=(0, 1), keepdims=True), [[21.0]], fn="Tensor._reduce", what="x.sum(axis=(0, 1), keepdims=True)", atol=0)
    check_close(Tensor(3.0).sum(), np.float32(3.0), fn="Tensor._reduce", what="Tensor(3.0).sum()", atol=0)
    m = Tensor([1, 2]).mean()
    assert m.dtype.kind == "f" and m.item() == 1.5, f"Tensor([1, 2]).mean() gave {m!r}; expected 1.5 as a float"


@pytest.mark.exercise("1.5", "Tensor._reduce")
@pytest.mark.parametrize("name, tt, ref", REDUCTIONS, ids=REDUCTION_IDS)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 3, 4)], ids=shape_id)
def test_reduction_bad_axis_names_op_axis_and_shape(name, tt, ref, shape):
    ndim = len(shape)
    x = Tensor(np.ones(shape, np.float32))
    for axis in (ndim, -ndim - 1, (0, ndim)):
        with pytest.raises(ValueError) as info:
            tt(x, axis=axis)
        msg = str(info.value)
        for part in (name, str(shape)):
            assert part in msg, (
                f"Tensor{shape}.{name}(axis={axis!r}): the ValueError must contain {part!r} (the op and the shape); got: {msg!r}")


@pytest.mark.exercise("1.5", "Tensor._reduce")
@settings(max_examples=25, deadline=None, phases=PHASES)
@given(data=st.data(), shape=shapes(min_dims=1, max_side=4), keepdims=st.booleans())
def test_reductions_match_torch(data, shape, keepdims):
    torch = pytest.importorskip("torch")
    x = data.draw(laid_out(shape), label="x")
    axis = data.draw(axis_specs(len(shape), allow_empty=False), label="axis")
    tx = torch.from_numpy(x.copy())  # a fresh C-ordered copy: torch rejects negative strides, even on size-1 axes
    atol = 1e-6 * max(1.0, float(np.abs(x, dtype=np.float64).sum()))
    for name, tt, torch_fn in [("sum", Tensor.sum, torch.sum), ("mean", Tensor.mean, torch.mean),
                               ("max", Tensor.max, torch.amax)]:
        if axis is None:
            expected = torch_fn(tx).numpy().reshape((1,) * x.ndim if keepdims else ())
        else:
            expected = torch_fn(tx, dim=axis, keepdim=keepdims).numpy()
        check_close(tt(Tensor(x), axis=axis, keepdims=keepdims), expected, fn="Tensor._reduce",
                    what=f"{name}(axis={axis!r}, keepdims={keepdims}) on {shape} vs torch", atol=atol)


# ---------------------------------------------------------------------------------------------
# Exercise 1.6: Tensor.reshape and Tensor.transpose (views)
# ---------------------------------------------------------------------------------------------
@st.composite
def reshape_pairs(draw):
    """(source shape, target shape) with equal element counts: both group the same factors."""
    dims = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))

    def group(ds):
        cuts = draw(st.lists(st.booleans(), min_size=len(ds) - 1, max_size=len(ds) - 1))
        out = [ds[0]]
        for d, cut in zip(ds[1:], cuts):
            if cut:
                out.append(d)
            else:
                out[-1] *= d
        return tuple(out)

    return group(dims), group(draw(st.permutations(dims)))


@pytest.mark.exercise("1.6", "Tensor.reshape")
@PROPERTY
@given(data=st.data(), pair=reshape_pairs(), form=st.sampled_from(["args", "tuple", "list"]), infer=st.booleans())
def test_reshape_matches_numpy(data, pair, form, infer):
    source, target = pair
    x = data.draw(laid_out(source), label="x")
    request = list(target)
    if infer:  # one dimension left for reshape to infer
        request[data.draw(st.integers(0, len(request) - 1), label="inferred axis")] = -1
    call = {"args": lambda t: t.reshape(*request), "tuple": lambda t: t.reshape(tuple(request)),
            "list": lambda t: t.reshape(list(request))}[form]
    got = call(Tensor(x))
    what = f"Tensor[{layout(x)}].reshape({request if form == 'list' else tuple(request)})"
    check_close(got, x.reshape(target), fn="Tensor.reshape", what=what, rtol=0, atol=0)
    if x.flags["C_CONTIGUOUS"]:
        assert np.shares_memory(got.data, x), f"{what} copied contiguous data; expected a view sharing memory"


@pytest.mark.exercise("1.6", "Tensor.reshape")
def test_reshape_is_a_view_and_keeps_requires_grad():
    base = np.arange(6, dtype=np.float32)
    r = Tensor(base).reshape(2, 3)
    base[4] = 40.0
    assert r.data[1, 1] == 40.0, "a reshape of contiguous data must see writes to the original buffer (a view)"
    g = Tensor(np.zeros((2, 3), np.float32), requires_grad=True).reshape(-1)
    assert g.shape == (6,) and g.requires_grad is True, f"reshape(-1) gave shape {g.shape}, requires_grad={g.requires_grad}; expected (6,), True"
    assert Tensor(np.ones((1, 1), np.float32)).reshape(()).shape == (), "a one-element tensor reshapes to shape ()"


@pytest.mark.exercise("1.6", "Tensor.reshape")
@pytest.mark.parametrize("shape, target", [((6,), (4, 2)), ((2, 3), (5,)), ((6,), (-1, 4)), ((2, 3), (7, -1)), ((4,), (3, 2))],
                         ids=lambda s: shape_id(s) if isinstance(s[0], int) else None)
def test_reshape_bad_size_names_both_shapes(shape, target):
    with pytest.raises(ValueError) as info:
        Tensor(np.ones(shape, np.float32)).reshape(*target)
    msg = str(info.value)
    for part in (str(shape), str(target)):
        assert part in msg, f"Tensor{shape}.reshape{target}: the ValueError must contain {part} (both shapes); got: {msg!r}"


@pytest.mark.exercise("1.6", "Tensor.reshape")
def test_reshape_two_inferred_dimensions_is_an_error():
    with pytest.raises(ValueError):
        Tensor(np.ones(6, np.float32)).reshape(-1, -1)


@st.composite
def transpose_args(draw):
    shape = draw(shapes(min_dims=2, max_dims=4, max_side=4))
    nd = len(shape)
    return shape, draw(st.integers(-nd, nd - 1)), draw(st.integers(-nd, nd - 1))


@pytest.mark.exercise("1.6", "Tensor.transpose")
@PROPERTY
@given(data=st.data(), args=transpose_args())
def test_transpose_matches_numpy_and_is_a_view(data, args):
    shape, d0, d1 = args
    x = data.draw(laid_out(shape), label="x")
    t = Tensor(x)
    what = f"Tensor[{layout(x)}].transpose({d0}, {d1})"
    got = t.transpose(d0, d1)
    check_close(got, np.swapaxes(x, d0, d1), fn="Tensor.transpose", what=what, rtol=0, atol=0)
    assert np.shares_memory(got.data, x), f"{what} copied the data; expected a view"
    check_close(t.transpose(), np.swapaxes(x, -2, -1), fn="Tensor.transpose", what=f"Tensor[{layout(x)}].transpose()",
                rtol=0, atol=0)
    check_close(t.transpose(dim0=d0, dim1=d1), np.swapaxes(x, d0, d1), fn="Tensor.transpose",
                what=f"Tensor[{layout(x)}].transpose(dim0={d0}, dim1={d1})", rtol=0, atol=0)


@pytest.mark.exercise("1.6", "Tensor.transpose")
def test_transpose_small_and_contiguity():
    v = Tensor([1.0, 2.0, 3.0])
    check_close(v.transpose(), [1.0, 2.0, 3.0], fn="Tensor.transpose", what="a 1-D tensor's transpose()", atol=0)
    check_close(Tensor(2.0).transpose(), np.float32(2.0), fn="Tensor.transpose", what="a 0-d tensor's transpose()", atol=0)
    m = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    t = m.transpose()
    assert not t.is_contiguous(), "a transposed (2, 3) tensor is not contiguous"
    assert t.strides == m.strides[::-1], f"transpose should swap the strides: got {t.strides}, expected {m.strides[::-1]}"
    assert t.requires_grad is True, "transpose must keep requires_grad"


@pytest.mark.exercise("1.6", "Tensor.transpose")
@pytest.mark.parametrize("dims", [(0, 2), (-3, 0), (5, 1)], ids=lambda d: f"dims{d[0]},{d[1]}")
def test_transpose_bad_axis_names_shape(dims):
    with pytest.raises(ValueError) as info:
        Tensor(np.ones((2, 3), np.float32)).transpose(*dims)
    assert "(2, 3)" in str(info.value), f"Tensor(2, 3).transpose{dims}: the ValueError must name the shape; got: {info.value}"


@pytest.mark.exercise("1.3", "Tensor._elementwise")
def test_python_int_keeps_an_integer_tensor_dtype():
    x = Tensor(np.array([1, 2], dtype=np.int32))
    assert (x + 2).dtype == np.int32, f"int32 tensor + 2 gave {(x + 2).dtype}; NumPy keeps int32"
    assert (x * 0.5).dtype.kind == "f", "an int tensor times a float becomes floating point"


@pytest.mark.exercise("1.4", "Tensor.matmul")
def test_batched_matmul_mismatch_names_both_full_shapes():
    with pytest.raises(ValueError) as info:
        Tensor(np.ones((2, 3, 4))) @ Tensor(np.ones((3, 4, 5)))
    assert "(2, 3, 4)" in str(info.value) and "(3, 4, 5)" in str(info.value), str(info.value)
