"""Module 01 (tensor): the exported `tinytorch.core.tensor` checked against NumPy.

Every operation a student writes is stated once in the course's reference table
(`tests/support/ops.py`: its TinyTorch form, its NumPy and torch forms, the inputs it is defined on
and its exercise); one property test per kind of operation drives the table. Hypothesis draws the shapes, the broadcasting pairs, Python scalars on either side and
the memory layout of each input (contiguous, transposed, strided or reversed views of a larger base
array), so a method that only works on fresh contiguous arrays fails here.

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("1.4", "Tensor.matmul")`:
run one exercise with `pytest tests/modules/test_01_tensor.py --exercise 1.4`.
"""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import (
    ANY, ATOL, phases, RTOL, assert_close, axis_specs, broadcast_pairs, check_close, incompatible_pairs, laid_out,
    layout, matmul_shapes, params, property_settings, rows, shape_id, shapes, to_torch, tt_args,
)
from tests.support import BY_NAME as OP
import tinytorch.core.tensor as tensor_module
from tinytorch.core.tensor import Tensor, broadcast_shape, concatenate, set_grad_enabled, stack, where

pytestmark = pytest.mark.module("01")

# Modest budget: the whole file runs in seconds on two cores.
PROPERTY = property_settings(max_examples=50)

# ---------------------------------------------------------------------------------------------
# Rows of the shared reference table (tests/support/ops.py) these tests drive
# ---------------------------------------------------------------------------------------------
BINARY_OPS = [OP[name] for name in ("add", "sub", "mul", "div", "pow")]
BINARY_IDS = [op.name for op in BINARY_OPS]
UNARY_OPS = [("neg", OP["neg"].tt, OP["neg"].ref, ANY)]
REDUCTIONS = [(name, OP[name].tt, OP[name].ref) for name in ("sum", "mean", "max", "var")]
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
    a = data.draw(laid_out(pair[0], op.domains[0]), label="a")
    b = data.draw(laid_out(pair[1], op.domains[1]), label="b")
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
        x = data.draw(laid_out(shape, op.domains[0]), label="x")
        s = data.draw(op.domains[1].scalars(), label="scalar")
        got, expected, what = op.tt(Tensor(x), s), op.ref(x, s), f"Tensor[{layout(x)}] {op.symbol} {s!r}"
    else:  # scalar op Tensor: the reflected method (__radd__, __rsub__, ...)
        x = data.draw(laid_out(shape, op.domains[1]), label="x")
        s = data.draw(op.domains[0].scalars(), label="scalar")
        got, expected, what = op.tt(s, Tensor(x)), op.ref(s, x), f"{s!r} {op.symbol} Tensor[{layout(x)}]"
    # NumPy keeps float32 when a Python scalar meets a float32 array; so must we.
    check_close(got, expected, fn="Tensor._elementwise", what=what)


@pytest.mark.exercise("1.3", "Tensor._elementwise")
@pytest.mark.parametrize("op", BINARY_OPS, ids=BINARY_IDS)
@PROPERTY
@given(data=st.data(), pair=broadcast_pairs(max_dims=3))
def test_binary_with_ndarray_on_either_side(op, data, pair):
    a = data.draw(laid_out(pair[0], op.domains[0]), label="a")
    b = data.draw(laid_out(pair[1], op.domains[1]), label="b")
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
@settings(max_examples=25, deadline=None, phases=phases())
@given(data=st.data(), pair=matmul_shapes())
def test_matmul_matches_torch(data, pair):
    torch = pytest.importorskip("torch")
    a = data.draw(laid_out(pair[0]), label="a")
    b = data.draw(laid_out(pair[1]), label="b")
    expected = torch.matmul(to_torch(a), to_torch(b)).numpy()
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
@settings(max_examples=25, deadline=None, phases=phases())
@given(data=st.data(), shape=shapes(min_dims=1, max_side=4), keepdims=st.booleans())
def test_reductions_match_torch(data, shape, keepdims):
    torch = pytest.importorskip("torch")
    x = data.draw(laid_out(shape), label="x")
    axis = data.draw(axis_specs(len(shape), allow_empty=False), label="axis")
    tx = to_torch(x)  # a fresh C-ordered copy: torch rejects negative strides, even on size-1 axes
    atol = 1e-6 * max(1.0, float(np.abs(x, dtype=np.float64).sum()))
    for name, tt, _ in REDUCTIONS:
        expected = OP[name].torch(tx, axis=axis, keepdims=keepdims).numpy()
        check_close(tt(Tensor(x), axis=axis, keepdims=keepdims), expected, fn="Tensor._reduce",
                    what=f"{name}(axis={axis!r}, keepdims={keepdims}) on {shape} vs torch", atol=atol, reference="torch")


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


# ---------------------------------------------------------------------------------------------
# The whole module-01 part of the reference table: forward values against NumPy
# (exercises 1.3-1.8; rows without an exercise check code the notebook gives)
# ---------------------------------------------------------------------------------------------
MODULE_01 = rows(module="01")


@pytest.mark.parametrize("op", params(MODULE_01, "forward"))
@property_settings(max_examples=25)
@given(data=st.data())
def test_table_forward_matches_numpy(op, data):
    case = data.draw(op.inputs(), label="case")
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
    got = op.tt(*tt_args(case), **case.kwargs)
    expected = np.asarray(op.ref(*case.args, **case.kwargs))
    fn = op.exercise[1] if op.exercise else op.name
    dtype = np.bool_ if expected.dtype == np.bool_ else np.float32
    check_close(got, expected, fn=fn, what=f"{op.name}", inputs=case.describe(), rtol=op.rtol, atol=op.atol,
                dtype=dtype)
    for a, b in zip(case.args, before):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b, equal_nan=True), f"{op.name} modified its input in place"


@pytest.mark.parametrize("op", params(rows(module="01", differentiable=True), "forward"))
@property_settings(max_examples=10)
@given(data=st.data())
def test_results_record_their_op_iff_an_input_requires_grad(op, data):
    "Op records: the result's grad_fn names the op (MulBackward) exactly when an input requires grad."
    case = data.draw(op.inputs(), label="case")
    out = op.tt(*tt_args(case, requires_grad=True), **case.kwargs)
    assert out.requires_grad is True, f"{op.name} of inputs with requires_grad=True gave requires_grad={out.requires_grad}"
    assert type(out.grad_fn).__name__ == op.grad_fn, (
        f"{op.name}: result.grad_fn is {type(out.grad_fn).__name__}; expected {op.grad_fn} (leave the arrays for the "
        f"given Tensor.from_op line)")
    assert not out.is_leaf, f"{op.name}: a recorded result is not a leaf"
    plain = op.tt(*tt_args(case, requires_grad=False), **case.kwargs)
    assert plain.requires_grad is False and plain.grad_fn is None, (
        f"{op.name} of inputs without requires_grad gave requires_grad={plain.requires_grad}, grad_fn={plain.grad_fn!r}")
    previous = set_grad_enabled(False)
    try:
        off = op.tt(*tt_args(case, requires_grad=True), **case.kwargs)
    finally:
        set_grad_enabled(previous)
    assert off.requires_grad is False and off.grad_fn is None, (
        f"{op.name} with grad mode off (set_grad_enabled(False)) gave requires_grad={off.requires_grad}; expected False")


@pytest.mark.exercise("1.3", "Tensor._elementwise")
def test_comparisons_are_boolean_and_never_recorded():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    for name, got in [("<", x < 2), ("<=", x <= 2.0), (">", x > Tensor([0.0, 5.0, 3.0])), (">=", x >= 3),
                      ("==", x == 2), ("!=", x != 2)]:
        assert got.dtype == np.bool_, f"x {name} ... has dtype {got.dtype}; expected bool"
        assert got.requires_grad is False and got.grad_fn is None, f"x {name} ...: a comparison is never part of the graph"
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        x < Tensor([1.0, 2.0])


@pytest.mark.exercise("1.3", "Tensor._elementwise")
def test_dtype_rules_with_python_numbers():
    f32 = Tensor([1.0, 2.0])
    for what, got in [("x * 2", f32 * 2), ("x * 0.5", f32 * 0.5), ("2 - x", 2 - f32), ("x ** 2", f32 ** 2),
                      ("1.5 / x", 1.5 / f32)]:
        assert got.dtype == np.float32, f"float32 tensor: {what} has dtype {got.dtype}; expected float32"
    i = Tensor([1, 2, 3])
    for what, got in [("x * 0.5", i * 0.5), ("0.5 * x", 0.5 * i), ("x / 2.0", i / 2.0), ("x + 0.25", i + 0.25)]:
        assert got.dtype == np.float32, f"int tensor: {what} has dtype {got.dtype}; expected float32 (not float64)"
    f64 = Tensor([1.0, 2.0], dtype=np.float64)
    for what, got in [("x * 0.5", f64 * 0.5), ("x + x", f64 + f64), ("x.exp()", f64.exp()), ("x.sum()", f64.sum())]:
        assert got.dtype == np.float64, f"float64 tensor: {what} has dtype {got.dtype}; expected float64 (kept)"


@pytest.mark.exercise("1.7", "Tensor._unary")
def test_unary_on_integers_computes_in_float32_and_follows_numpy_outside_the_domain():
    got = Tensor([1, 4, 9]).sqrt()
    check_close(got, [1.0, 2.0, 3.0], fn="Tensor._unary", what="Tensor([1, 4, 9]).sqrt()", atol=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        logs = Tensor([-1.0, 0.0]).log().data
    assert np.isnan(logs[0]) and logs[1] == -np.inf, f"log([-1, 0]) gave {logs}; expected [nan, -inf] as NumPy"


@pytest.mark.exercise("1.2", "Tensor.__init__")
@pytest.mark.parametrize("data", [np.array([1, 2]), [1, 2], np.array([True]), 3])
def test_requires_grad_on_integer_data_is_a_clear_error(data):
    with pytest.raises(TypeError) as info:
        Tensor(data, requires_grad=True)
    dtype = str(np.asarray(data).dtype)
    assert "requires_grad" in str(info.value) and dtype in str(info.value), (
        f"Tensor({data!r}, requires_grad=True): the TypeError must name requires_grad and the dtype {dtype}; "
        f"got: {info.value}")


def test_detach_shares_data_and_leaves_the_graph():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * 2).detach()
    assert y.requires_grad is False and y.grad_fn is None and y.is_leaf, "detach() gives a leaf without requires_grad"
    z = x * 2
    assert np.shares_memory(z.detach().data, z.data), "detach() shares the data (no copy)"


@pytest.mark.exercise("1.8", "where")
def test_where_errors_name_the_problem():
    with pytest.raises(TypeError, match="bool"):
        where(Tensor([1.0, 0.0]), 1.0, 0.0)
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)|\(3,\).*\(2,\)"):
        where(Tensor([True, False]), Tensor([1.0, 2.0, 3.0]), 0.0)
    got = where(Tensor([True, False]), Tensor([1.0, 2.0]), 0.0)
    check_close(got, [1.0, 0.0], fn="where", what="where([True, False], [1, 2], 0.0)", atol=0)


@pytest.mark.exercise("1.8", "concatenate")
def test_concatenate_and_stack_errors_name_both_shapes():
    a, b = Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones((3, 4), np.float32))
    for fn, args in [(concatenate, ([a, b], 1)), (stack, ([a, Tensor(np.ones((2, 4), np.float32))], 0))]:
        with pytest.raises(ValueError) as info:
            fn(*args)
        msg = str(info.value)
        assert "(2, 3)" in msg and ("(3, 4)" in msg or "(2, 4)" in msg), f"{fn.__name__}: the error must name both shapes; got {msg}"
    with pytest.raises(ValueError, match="axis"):
        concatenate([a, a], axis=2)
    with pytest.raises(ValueError):
        stack([], axis=0)
    check_close(concatenate([a, Tensor(np.zeros((2, 1), np.float32))], axis=1), np.hstack([np.ones((2, 3)), np.zeros((2, 1))]),
                fn="concatenate", what="(2, 3) and (2, 1) along axis 1", atol=0)


def test_masked_fill_needs_a_boolean_mask_that_keeps_the_shape():
    x = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="boolean"):
        x.masked_fill(np.ones((2, 3)), 1.0)
    with pytest.raises(ValueError, match=r"\(2, 2, 3\)|\(2, 3\)"):
        x.masked_fill(np.ones((2, 2, 3), bool), 1.0)


# ----- op records: attrs, output shape and dtype; observers (the extension points of modules 14-20) -----

def _record(make, grad=True):
    "The record of the last op `make()` runs, taken from its grad_fn (grad=True) or from an observer."
    seen = []
    with tensor_module.observe_ops(lambda node, out: seen.append((node, out))):
        out = make()
    node = out.grad_fn if grad else seen[-1][0]
    assert seen and seen[-1][1] is out, f"the observer must see the result itself; saw {[n.op for n, _ in seen]}"
    return node, out


@pytest.mark.parametrize("what, make, op, attrs", [
    ("x.reshape(3, -1)", lambda x: x.reshape(3, -1), "reshape", {"shape": (3, 2)}),
    ("x.sum(axis=1, keepdims=True)", lambda x: x.sum(axis=1, keepdims=True), "sum", {"axis": 1, "keepdims": True}),
    ("x.mean()", lambda x: x.mean(), "mean", {"axis": None, "keepdims": False}),
    ("x.max(axis=(0, 1))", lambda x: x.max(axis=(0, 1)), "max", {"axis": (0, 1), "keepdims": False}),
    ("x.transpose(0, 1)", lambda x: x.transpose(0, 1), "transpose", {"dim0": 0, "dim1": 1}),
    ("x.T", lambda x: x.T, "permute", {"dims": (1, 0)}),
    ("x[1:, 0]", lambda x: x[1:, 0], "getitem", {"index": (slice(1, None), 0)}),
    ("x * 0.5", lambda x: x * 0.5, "mul", {"other": 0.5}),
    ("x ** 2", lambda x: x ** 2, "pow", {"other": 2}),
    ("x + x", lambda x: x + x, "add", {}),
    ("x @ x.T", lambda x: x @ x.T, "matmul", {}),
    ("x.astype(float64)", lambda x: x.astype(np.float64), "astype", {"dtype": np.dtype(np.float64)}),
    ("concatenate([x, x], axis=1)", lambda x: concatenate([x, x], axis=1), "concatenate", {"axis": 1}),
    ("stack([x, x], axis=-1)", lambda x: stack([x, x], axis=-1), "stack", {"axis": -1}),
])
def test_records_hold_the_forward_arguments_and_the_output_shape_and_dtype(what, make, op, attrs):
    for grad in (True, False):
        x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=grad)
        node, out = _record(lambda: make(x), grad=grad)
        assert node.op == op and node.attrs == attrs, (
            f"{what} (requires_grad={grad}): record op={node.op!r} attrs={node.attrs}; expected op={op!r} attrs={attrs}")
        assert node.shape == out.shape and node.dtype == out.dtype, (
            f"{what}: record shape/dtype {node.shape}/{node.dtype}; expected the output's {out.shape}/{out.dtype}")


def test_where_and_masked_fill_record_their_constants():
    x = Tensor([1.0, -2.0, 3.0])
    node, _ = _record(lambda: where(x > 0, x, 0.0), grad=False)
    assert node.op == "where" and node.attrs == {"y": 0.0} and node.inputs[1] is x and node.inputs[0] is not None, (
        f"where(x > 0, x, 0.0): inputs {node.inputs}, attrs {node.attrs}; expected the condition and x as inputs, "
        f"y=0.0 in attrs")
    mask = np.array([True, False, False])
    node, _ = _record(lambda: x.masked_fill(mask, -1.0), grad=False)
    assert node.attrs["value"] == -1.0 and node.attrs["mask"] is mask, f"masked_fill attrs: {node.attrs}"


def test_observers_fire_in_every_grad_mode_and_stop_after_remove():
    ops = []
    handle = tensor_module.add_op_observer(lambda node, out: ops.append(node.op))
    try:
        a = Tensor([1.0, 2.0])
        (a * 2).sum()
        previous = set_grad_enabled(False)
        try:
            (Tensor([1.0], requires_grad=True) + 1.0).exp()
        finally:
            set_grad_enabled(previous)
        a > 1.0
    finally:
        handle.remove()
    handle.remove()  # twice is harmless
    (a * 3).sum()
    assert ops == ["mul", "sum", "add", "exp", "gt"], (
        f"observed {ops}; expected ['mul', 'sum', 'add', 'exp', 'gt'] (no requires_grad, no_grad, a comparison; "
        f"nothing after remove())")


def test_observer_ops_are_not_observed_and_nothing_is_attached_without_grad():
    seen = []

    def observer(node, out):
        seen.append(node.op)
        (out * 1.0).sum()  # an observer's own ops are not observed (no recursion)

    with tensor_module.observe_ops(observer):
        y = Tensor([1.0, 2.0]) * 2.0
    assert seen == ["mul"], f"observed {seen}; expected ['mul'] only"
    assert y.grad_fn is None and y.requires_grad is False, "observing must not attach a record to a tensor that needs no grad"
    with pytest.raises(TypeError, match="callable"):
        tensor_module.add_op_observer("not a function")


def test_comparisons_record_their_inputs_but_never_join_the_graph():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    node, out = _record(lambda: x > Tensor([0.0, 5.0, 3.0]), grad=False)
    assert node.op == "gt" and node.inputs[0] is x and out.grad_fn is None and out.requires_grad is False, (
        f"x > y: record {node.op} with inputs {node.inputs}; out.requires_grad={out.requires_grad}; expected a record "
        f"for observers and no graph")


@pytest.mark.exercise("1.5", "Tensor._reduce")
def test_mean_and_var_of_integers_are_float32():
    i = Tensor(np.arange(6).reshape(2, 3))
    for what, got, expected in [("mean()", i.mean(), 2.5), ("mean(axis=0)", i.mean(axis=0), [1.5, 2.5, 3.5]),
                                ("var(axis=1)", i.var(axis=1), [2 / 3, 2 / 3])]:
        assert got.dtype == np.float32, f"int tensor .{what} has dtype {got.dtype}; expected float32 (as int / int)"
        check_close(got, expected, fn="Tensor._reduce", what=f"int tensor .{what}", atol=1e-6)
    assert i.sum().dtype == np.int64, f"the sum of int64 stays int64; got {i.sum().dtype}"


# ---------------------------------------------------------------------------------------------
# In-place ops (given code): the same buffer, a version count, PyTorch's refusals
# ---------------------------------------------------------------------------------------------
def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def test_inplace_ops_change_the_buffer_count_versions_and_match_torch():
    x = Tensor(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32))
    buf = x.data
    assert x._version == 0, f"a new tensor has _version 0; got {x._version}"
    steps = [("add_", lambda t: t.add_(1)), ("add_ alpha", lambda t: t.add_(2.0, alpha=0.5)),
             ("sub_ row", lambda t: t.sub_(Tensor([1.0, 0.0, 1.0]))), ("mul_", lambda t: t.mul_(2)),
             ("copy_", lambda t: t.copy_(np.arange(3, dtype=np.float64))), ("fill_", lambda t: t.fill_(7)),
             ("zero_", lambda t: t.zero_())]
    torch = _torch_or_none()
    tx = None if torch is None else torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    torch_steps = [lambda t: t.add_(1), lambda t: t.add_(2.0, alpha=0.5), lambda t: t.sub_(torch.tensor([1.0, 0.0, 1.0])),
                   lambda t: t.mul_(2), lambda t: t.copy_(torch.arange(3, dtype=torch.float64)), lambda t: t.fill_(7),
                   lambda t: t.zero_()]
    for k, ((name, step), tstep) in enumerate(zip(steps, torch_steps), 1):
        assert step(x) is x, f"{name} must return the tensor itself"
        assert x.data is buf and x.dtype == np.float32, f"{name} must change the same buffer, keeping float32"
        assert x._version == k, f"after {k} in-place ops _version is {x._version}; expected {k}"
        if tx is not None:
            tstep(tx)
            np.testing.assert_allclose(x.data, tx.numpy(), err_msg=f"{name}: values differ from torch's")
            assert tx._version == x._version, f"{name}: torch counts version {tx._version}, we count {x._version}"


def test_views_share_the_version_and_data_bypasses_it():
    x = Tensor(np.ones((2, 3), np.float32))
    views = [x.reshape(3, 2), x.T, x[0], x.detach(), x.transpose(0, 1)]
    x.mul_(2)
    views[0].add_(1)
    assert [v._version for v in views] == [2] * 5 and x._version == 2, (
        f"views share their base's count (as in torch): {[v._version for v in views]}, base {x._version}")
    copy = x.clone()
    copy.zero_()
    assert x._version == 2 and copy._version == 1 and x.data[0, 0] == 3.0, "clone() has its own buffer"
    x.data += 1  # writing to .data bypasses the counter, as in PyTorch
    assert x._version == 2, f"x.data += 1 must not count; _version is {x._version}"


def test_inplace_refusals_under_grad_mode_and_no_grad_allows_them():
    w = Tensor([1.0, 2.0], requires_grad=True)
    for name, step in [("add_", lambda: w.add_(1)), ("mul_", lambda: w.mul_(2)), ("zero_", lambda: w.zero_()),
                       ("copy_", lambda: w.copy_([0.0, 0.0]))]:
        with pytest.raises(RuntimeError, match=rf"{name}: a leaf tensor that requires grad.*no_grad"):
            step()
    assert w._version == 0 and np.array_equal(w.data, [1.0, 2.0]), "a refused in-place op must change nothing"
    h = w * 3
    with pytest.raises(RuntimeError, match=r"mul_: this tensor is the result of MulBackward.*out-of-place.*no_grad"):
        h.mul_(2)
    plain = Tensor([1.0, 1.0])
    with pytest.raises(RuntimeError, match=r"add_: the operand requires grad"):
        plain.add_(w)
    previous = set_grad_enabled(False)
    try:
        w.sub_(Tensor([0.5, 0.5]))
        h.mul_(2)
        plain.add_(w)
    finally:
        set_grad_enabled(previous)
    assert np.array_equal(w.data, [0.5, 1.5]) and w._version == 1 and w.requires_grad, "under no_grad a leaf changes in place"
    torch = _torch_or_none()
    if torch is not None:  # torch refuses the same change of a leaf
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            torch.tensor([1.0, 2.0], requires_grad=True).add_(1)


def test_inplace_bad_operands_name_the_problem():
    x = Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"add_: an operand of shape \(4, 2, 3\) would change the shape \(2, 3\)"):
        x.add_(np.ones((4, 2, 3)))
    with pytest.raises(ValueError, match=r"mul_: shapes \(2, 3\) and \(2,\) cannot be broadcast"):
        x.mul_(Tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"add_: the result would be float64 \(this tensor is int64"):
        Tensor([1, 2]).add_(0.5)
    with pytest.raises(ValueError, match=r"fill_: the value must be a single number"):
        x.fill_([1.0, 2.0, 3.0])
    assert x._version == 0, "a failed in-place op must not count"
