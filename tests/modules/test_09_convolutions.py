"""Module 09 (convolutions): the exported `tinytorch.core.spatial` checked against PyTorch and NumPy.

- Every op is compared with `torch.nn.functional` (`conv2d`, `max_pool2d`, `avg_pool2d`,
  `batch_norm` in training and evaluation mode): outputs, and the gradients of the input and of
  every parameter for a random upstream gradient, on shapes, strides, paddings and kernel sizes
  drawn by hypothesis, with inputs laid out contiguously or as non-contiguous views (an NHWC
  array transposed to NCHW, every other row of a larger array, a reversed axis).
- Without PyTorch (a student edition) the same tests compare with the NumPy references of
  `tests/support/refs.py` (an einsum convolution, pooling over stacked windows, the BatchNorm
  formulas) and with float64 central differences for the gradients, on smaller shapes; the
  im2col/col2im adjoint identity and pooling through reshapes run everywhere.
- The layers (`Conv2d`, `MaxPool2d`, `AvgPool2d`, `BatchNorm2d`, `Flatten`) are checked for
  PyTorch's parameter names and shapes, initialization statistics, running statistics, train/eval
  behaviour and error messages that name the shapes.

Run one exercise with `pytest tests/modules/test_09_convolutions.py --exercise 9.3`.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.spatial import (
    AvgPool2d, AvgPool2dFunction, BatchNorm2d, Conv2d, Conv2dFunction, Flatten, MaxPool2d, MaxPool2dFunction,
    col2im, conv2d_forward, conv2d_loop, im2col,
)
from tinytorch.core.tensor import Tensor
from tests.support import params, refs, to_torch
from tests.support.families import check_row, family_rows
from tests.support.refs import numeric_grads, reference_backend, torch_or_none

pytestmark = pytest.mark.module("09")
# Central differences evaluate the reference twice per input element: smaller drawn shapes without torch.
FALLBACK = reference_backend() == "numpy"

PROPERTY = settings(max_examples=30, deadline=None)
RTOL, ATOL = 1e-4, 1e-4


# ---------------------------------------------------------------------------------------------
# Inputs: shapes and memory layouts
# ---------------------------------------------------------------------------------------------
LAYOUTS = ["contiguous", "nhwc-transposed", "strided", "reversed"]


def laid_out(shape, layout: str, seed: int) -> np.ndarray:
    """A float32 array of exactly `shape` (N, C, H, W) with the given memory layout."""
    rng = np.random.default_rng(seed)
    n, c, h, w = shape
    if layout == "contiguous":
        return rng.standard_normal(shape).astype(np.float32)
    if layout == "nhwc-transposed":
        return rng.standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)
    if layout == "strided":
        return rng.standard_normal((n, c, 2 * h, w + 3)).astype(np.float32)[:, :, ::2, 1:w + 1]
    if layout == "reversed":
        return rng.standard_normal(shape).astype(np.float32)[:, :, ::-1, ::-1]
    raise ValueError(layout)


def describe(x: np.ndarray) -> str:
    kind = "contiguous" if x.flags["C_CONTIGUOUS"] else "non-contiguous"
    return f"input shape {x.shape}, strides {x.strides} ({kind})"


@st.composite
def conv_cases(draw, max_batch=3, max_channels=4, max_side=9):
    """(x_shape, weight_shape, stride, padding, layout, seed) with at least one output position."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, kh - 2 * ph), max_side))
    w = draw(st.integers(max(1, kw - 2 * pw), max_side))
    n, c, o = draw(st.integers(1, max_batch)), draw(st.integers(1, max_channels)), draw(st.integers(1, max_channels))
    return (n, c, h, w), (o, c, kh, kw), (sh, sw), (ph, pw), draw(st.sampled_from(LAYOUTS)), draw(st.integers(0, 2**16))


@st.composite
def pool_cases(draw, max_side=9):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    h, w = draw(st.integers(kh, max_side)), draw(st.integers(kw, max_side))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), h, w)
    return shape, (kh, kw), stride, draw(st.sampled_from(LAYOUTS)), draw(st.integers(0, 2**16))


def check_close(got, expected, what: str, rtol=RTOL, atol=ATOL, defined=None):
    """`got` against `expected` (torch, or a NumPy reference); `defined`: where a central-difference
    reference is defined (kinks such as tied maxima left out)."""
    got = got.data if isinstance(got, Tensor) else got
    expected = expected.detach().numpy() if hasattr(expected, "detach") else np.asarray(expected)
    assert got is not None, f"{what}: no gradient was computed (got None)"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    if defined is not None:
        expected = np.where(defined, expected, got)
    if not np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True):
        worst = np.unravel_index(np.nanargmax(np.abs(got - expected)), got.shape)
        raise AssertionError(f"{what}: element {tuple(int(i) for i in worst)} is {got[worst]:.6g}, "
                             f"expected {expected[worst]:.6g} (largest difference {np.nanmax(np.abs(got - expected)):.3g})")


einsum_conv = refs.conv2d  # float64, one einsum per kernel offset (independent of im2col)


def fd_check(fn, arrays, upstream, ours, what, atol=ATOL):
    "Without torch: each of `ours` (Tensors) against the central-difference gradient of `fn` at `arrays`."
    for (name, t), (grad, ok) in zip(ours, numeric_grads(fn, arrays, upstream)):
        check_close(t.grad, grad, f"{what}: gradient of {name} (central differences)", atol=atol, defined=ok)


# ---------------------------------------------------------------------------------------------
# Exercise 9.1: conv2d_loop
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.1", "conv2d_loop")
@PROPERTY
@given(conv_cases(max_batch=2, max_channels=3, max_side=7), st.booleans())
def test_conv2d_loop_matches_einsum_reference(case, with_bias):
    x_shape, w_shape, stride, padding, layout, seed = case
    x = laid_out(x_shape, layout, seed)
    rng = np.random.default_rng(seed + 1)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    got = conv2d_loop(x, w, b, stride, padding)
    check_close(got, einsum_conv(x, w, b, stride, padding),
                f"conv2d_loop, weight {w_shape}, stride {stride}, padding {padding}, {describe(x)}")
    assert got.dtype == np.float32, f"conv2d_loop of float32 arrays returned {got.dtype}; expected float32"


@pytest.mark.exercise("9.1", "conv2d_loop")
def test_conv2d_loop_errors_name_both_shapes():
    x, w = np.zeros((2, 3, 6, 6), np.float32), np.zeros((4, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"\(2, 3, 6, 6\).*\(4, 2, 3, 3\)"):
        conv2d_loop(x, w)
    with pytest.raises(ValueError, match="smaller than the kernel"):
        conv2d_loop(np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32))


# ---------------------------------------------------------------------------------------------
# Exercise 9.2: im2col, conv2d_forward
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.2", "im2col")
@PROPERTY
@given(conv_cases())
def test_im2col_columns_are_the_windows(case):
    x_shape, w_shape, stride, padding, layout, seed = case
    x = laid_out(x_shape, layout, seed)
    (kh, kw), (sh, sw), (ph, pw) = w_shape[2:], stride, padding
    cols, (oh, ow) = im2col(x, (kh, kw), stride, padding)
    n, c = x_shape[:2]
    assert cols.shape == (c * kh * kw, n * oh * ow), \
        f"im2col of {x_shape}, kernel {(kh, kw)}: cols {cols.shape}; expected (C * kh * kw, N * OH * OW) = {(c * kh * kw, n * oh * ow)}"
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    rng = np.random.default_rng(seed)
    for _ in range(3):   # spot-check windows: column (b, i, j) is window (b, i, j) flattened as (c, p, q)
        b, i, j = rng.integers(n), rng.integers(oh), rng.integers(ow)
        expected = xp[b, :, i * sh:i * sh + kh, j * sw:j * sw + kw].ravel()
        got = cols[:, (b * oh + i) * ow + j]
        assert np.array_equal(got, expected), \
            f"column for window (n={b}, oh={i}, ow={j}) is {got.tolist()}; expected {expected.tolist()} ({describe(x)})"


@pytest.mark.exercise("9.2", "conv2d_forward")
@PROPERTY
@given(conv_cases(), st.booleans())
def test_conv2d_forward_matches_torch(case, with_bias):
    torch = torch_or_none()
    x_shape, w_shape, stride, padding, layout, seed = case
    x = laid_out(x_shape, layout, seed)
    rng = np.random.default_rng(seed + 1)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    got, cols = conv2d_forward(x, w, b, stride, padding)
    expected = refs.conv2d(x, w, b, stride, padding) if torch is None else torch.nn.functional.conv2d(
        to_torch(x), to_torch(w), None if b is None else to_torch(b), stride=stride, padding=padding)
    check_close(got, expected, f"conv2d_forward vs torch conv2d, weight {w_shape}, stride {stride}, padding {padding}, {describe(x)}")
    assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"], f"result must be C-contiguous float32; got {got.dtype}"
    assert cols.shape == (w_shape[1] * w_shape[2] * w_shape[3], x_shape[0] * got.shape[2] * got.shape[3]), \
        f"cols has shape {cols.shape}: expected (C * kh * kw, N * OH * OW)"


@pytest.mark.exercise("9.2", "conv2d_forward")
@PROPERTY
@given(conv_cases())
def test_conv2d_forward_matches_the_loop_version(case):
    x_shape, w_shape, stride, padding, layout, seed = case
    x = laid_out(x_shape, layout, seed)
    w = np.random.default_rng(seed).standard_normal(w_shape).astype(np.float32)
    check_close(conv2d_forward(x, w, None, stride, padding)[0], einsum_conv(x, w, None, stride, padding),
                f"conv2d_forward vs a float64 einsum reference, weight {w_shape}, stride {stride}, padding {padding}")


# ---------------------------------------------------------------------------------------------
# Exercise 9.3: col2im, Conv2dFunction.backward
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.3", "col2im")
@PROPERTY
@given(conv_cases())
def test_col2im_is_the_adjoint_of_im2col(case):
    x_shape, w_shape, stride, padding, _, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    cols, _ = im2col(x, w_shape[2:], stride, padding)
    c = rng.standard_normal(cols.shape)
    back = col2im(c, x_shape, w_shape[2:], stride, padding)
    assert back.shape == x_shape, f"col2im returned shape {back.shape}; expected the input shape {x_shape}"
    lhs, rhs = float(np.sum(cols * c)), float(np.sum(x * back))
    assert np.isclose(lhs, rhs, rtol=1e-9, atol=1e-9), \
        f"<im2col(x), c> = {lhs:.9g} but <x, col2im(c)> = {rhs:.9g} (kernel {w_shape[2:]}, stride {stride}, padding {padding})"


@pytest.mark.exercise("9.3", "Conv2dFunction.backward")
@PROPERTY
@given(conv_cases(max_batch=2, max_channels=2, max_side=5) if FALLBACK else conv_cases(), st.booleans())
def test_conv2d_gradients_match_torch(case, with_bias):
    torch = torch_or_none()
    x_shape, w_shape, stride, padding, layout, seed = case
    x_arr = laid_out(x_shape, layout, seed)
    rng = np.random.default_rng(seed + 1)
    w_arr = rng.standard_normal(w_shape).astype(np.float32)
    b_arr = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    x, w = Tensor(x_arr, requires_grad=True), Tensor(w_arr, requires_grad=True)
    b = None if b_arr is None else Tensor(b_arr, requires_grad=True)
    y = Conv2dFunction.apply(x, w, b, stride=stride, padding=padding)
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(g)
    if torch is None:
        where = f"weight {w_shape}, stride {stride}, padding {padding}, {describe(x_arr)}"
        check_close(y, refs.conv2d(x_arr, w_arr, b_arr, stride, padding), f"Conv2dFunction output, {where}")
        fd_check(lambda *a: refs.conv2d(a[0], a[1], a[2] if with_bias else None, stride, padding),
                 [x_arr, w_arr] + ([b_arr] if with_bias else []), g, [("x", x), ("weight", w), ("bias", b)], where,
                 atol=1e-3)
        return
    tx, tw = to_torch(x_arr, requires_grad=True), to_torch(w_arr, requires_grad=True)
    tb = None if b_arr is None else to_torch(b_arr, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=padding)
    ty.backward(torch.from_numpy(g))
    where = f"weight {w_shape}, stride {stride}, padding {padding}, {describe(x_arr)}"
    check_close(y, ty, f"Conv2dFunction output, {where}")
    check_close(x.grad, tx.grad, f"input gradient, {where}")
    check_close(w.grad, tw.grad, f"weight gradient, {where}", atol=1e-3)
    if with_bias:
        check_close(b.grad, tb.grad, f"bias gradient, {where}", atol=1e-3)
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32, "gradients of float32 inputs are float32"


# ---------------------------------------------------------------------------------------------
# Exercise 9.4: Conv2d
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.4", "Conv2d.__init__")
def test_conv2d_parameters_named_and_shaped_as_in_torch():
    conv = Conv2d(3, 16, (3, 5), stride=2, padding=(1, 2), rng=0)
    shapes = {name: p.shape for name, p in conv.named_parameters()}
    assert shapes == {"weight": (16, 3, 3, 5), "bias": (16,)}, f"Conv2d(3, 16, (3, 5)) parameters {shapes}"
    assert conv.kernel_size == (3, 5) and conv.stride == (2, 2) and conv.padding == (1, 2), \
        f"kernel_size, stride, padding stored as pairs; got {conv.kernel_size}, {conv.stride}, {conv.padding}"
    assert np.all(conv.bias.data == 0) and conv.weight.dtype == np.float32
    assert Conv2d(3, 4, 3, bias=False).bias is None and Conv2d(3, 4, 3, bias=False).num_parameters() == 4 * 27
    assert np.array_equal(Conv2d(2, 2, 3, rng=7).weight.data, Conv2d(2, 2, 3, rng=7).weight.data), "rng=7 twice: same weights"


@pytest.mark.exercise("9.4", "Conv2d.__init__")
def test_conv2d_kaiming_normal_init():
    conv = Conv2d(32, 128, 3, rng=0)
    expected = np.sqrt(2.0 / (32 * 9))
    std = float(conv.weight.data.std())
    assert abs(std - expected) < 0.03 * expected, f"weight std {std:.5f}; expected sqrt(2 / fan_in) = {expected:.5f}"
    assert abs(float(conv.weight.data.mean())) < 0.03 * expected, "weights are centred on zero"


@pytest.mark.exercise("9.4", "Conv2d.__init__")
@pytest.mark.parametrize("args", [(0, 4, 3), (3, -1, 3), (3, 4, 0), (3, 4, (3,)), (3, 4, 3, 0), (3, 4, 3, 1, -1), (3.0, 4, 3)])
def test_conv2d_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match="Conv2d"):
        Conv2d(*args)


@pytest.mark.exercise("9.4", "Conv2d.forward")
def test_conv2d_forward_checks_the_input():
    conv = Conv2d(3, 8, 3, rng=0)
    with pytest.raises(ValueError, match=r"\(2, 4, 8, 8\).*\(8, 3, 3, 3\)"):
        conv(Tensor(np.ones((2, 4, 8, 8))))
    with pytest.raises(ValueError, match=r"\(3, 8, 8\)"):
        conv(Tensor(np.ones((3, 8, 8))))
    assert conv(np.ones((1, 3, 5, 5), np.float32)).shape == (1, 8, 3, 3), "a NumPy input is wrapped in a Tensor"


@pytest.mark.exercise("9.4", "Conv2d.forward")
def test_conv2d_layer_matches_torch_forward_and_backward():
    torch = torch_or_none()
    conv = Conv2d(3, 5, 3, stride=2, padding=1, rng=0)
    x_arr = laid_out((4, 3, 9, 8), "nhwc-transposed", 3)
    x = Tensor(x_arr, requires_grad=True)
    if torch is None:
        x_arr = x_arr[:2, :, :5, :6]
        x = Tensor(x_arr, requires_grad=True)
        y = conv(x)
        check_close(y, refs.conv2d(x_arr, conv.weight.data, conv.bias.data, 2, 1), "Conv2d(3, 5, 3, stride=2, padding=1) output")
        y.sum().backward()
        fd_check(lambda a, w, b: refs.conv2d(a, w, b, 2, 1), [x_arr, conv.weight.data, conv.bias.data],
                 np.ones(y.shape), [("x", x), ("weight", conv.weight), ("bias", conv.bias)], "Conv2d", atol=1e-3)
        return
    ref = torch.nn.Conv2d(3, 5, 3, stride=2, padding=1)
    with torch.no_grad():                       # a state dict maps one-to-one
        for name, p in conv.named_parameters():
            getattr(ref, name).copy_(torch.from_numpy(p.data))
    tx = to_torch(x_arr, requires_grad=True)
    y, ty = conv(x), ref(tx)
    check_close(y, ty, "Conv2d(3, 5, 3, stride=2, padding=1) output vs torch.nn.Conv2d")
    y.sum().backward()
    ty.sum().backward()
    check_close(x.grad, tx.grad, "Conv2d input gradient")
    check_close(conv.weight.grad, ref.weight.grad, "Conv2d weight gradient", atol=1e-3)
    check_close(conv.bias.grad, ref.bias.grad, "Conv2d bias gradient", atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Exercise 9.5: MaxPool2d
# ---------------------------------------------------------------------------------------------
def pool_torch_check(torch, fn_ours, fn_torch, case, what, fn_ref=None):
    shape, kernel, stride, layout, seed = case
    x_arr = laid_out(shape, layout, seed)
    x = Tensor(x_arr, requires_grad=True)
    y = fn_ours(kernel, stride)(x)
    g = np.random.default_rng(seed + 1).standard_normal(y.shape).astype(np.float32)
    y.backward(g)
    where = f"{what}(kernel {kernel}, stride {stride}), {describe(x_arr)}"
    if torch is None:
        check_close(y, fn_ref(x_arr, kernel, stride), f"{where}: output")
        fd_check(lambda a: fn_ref(a, kernel, stride), [x_arr], g, [("x", x)], where)
        return
    tx = to_torch(x_arr, requires_grad=True)
    ty = fn_torch(tx, kernel, stride)
    ty.backward(torch.from_numpy(g))
    check_close(y, ty, f"{where}: output")
    check_close(x.grad, tx.grad, f"{where}: input gradient")


@pytest.mark.exercise("9.5", "MaxPool2dFunction.forward")
@PROPERTY
@given(pool_cases(max_side=6) if FALLBACK else pool_cases())
def test_maxpool_matches_torch(case):
    torch = torch_or_none()
    pool_torch_check(torch, lambda k, s: MaxPool2d(k, s),
                     lambda t, k, s: torch.nn.functional.max_pool2d(t, k, s), case, "MaxPool2d", refs.max_pool2d)


@pytest.mark.exercise("9.5", "MaxPool2dFunction.backward")
@pytest.mark.parametrize("kernel,stride", [(2, None), (3, 1), ((2, 3), (1, 2))])
def test_maxpool_ties_route_to_the_first_maximum_as_torch(kernel, stride):
    torch = torch_or_none()
    x_arr = np.random.default_rng(0).integers(0, 3, (2, 3, 7, 7)).astype(np.float32)   # many ties
    x = Tensor(x_arr, requires_grad=True)
    y = MaxPool2d(kernel, stride)(x)
    g = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
    y.backward(g)
    if torch is None:
        expected = refs.max_pool2d_grad(x_arr, kernel, stride, g)
    else:
        tx = to_torch(x_arr, requires_grad=True)
        torch.nn.functional.max_pool2d(tx, kernel, stride).backward(torch.from_numpy(g))
        expected = tx.grad
    check_close(x.grad, expected, f"MaxPool2d({kernel}, {stride}) input gradient with tied maxima")


@pytest.mark.exercise("9.5", "MaxPool2dFunction.forward")
def test_maxpool_numpy_reference_and_nan():
    x = np.random.default_rng(2).standard_normal((2, 3, 6, 8)).astype(np.float32)
    check_close(MaxPool2d(2)(Tensor(x)), x.reshape(2, 3, 3, 2, 4, 2).max(axis=(3, 5)), "MaxPool2d(2) vs a reshape-max")
    x[0, 0, 1, 1] = np.nan
    out = MaxPool2d(2)(Tensor(x)).data
    assert np.isnan(out[0, 0, 0, 0]) and np.isfinite(np.delete(out.ravel(), 0)).all(), \
        "a NaN makes its own window's maximum NaN and no other"
    with pytest.raises(ValueError, match=r"4-D.*\(6, 8\)"):
        MaxPool2d(2)(Tensor(np.ones((6, 8))))


# ---------------------------------------------------------------------------------------------
# Exercise 9.6: AvgPool2d
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.6", "AvgPool2dFunction.forward")
@PROPERTY
@given(pool_cases(max_side=6) if FALLBACK else pool_cases())
def test_avgpool_matches_torch(case):
    torch = torch_or_none()
    pool_torch_check(torch, lambda k, s: AvgPool2d(k, s),
                     lambda t, k, s: torch.nn.functional.avg_pool2d(t, k, s), case, "AvgPool2d", refs.avg_pool2d)


@pytest.mark.exercise("9.6", "AvgPool2dFunction.backward")
def test_avgpool_numpy_reference():
    x_arr = np.random.default_rng(3).standard_normal((2, 2, 6, 4)).astype(np.float32)
    x = Tensor(x_arr, requires_grad=True)
    y = AvgPool2dFunction.apply(x, kernel_size=(3, 2), stride=(3, 2))
    check_close(y, x_arr.reshape(2, 2, 2, 3, 2, 2).mean(axis=(3, 5)), "AvgPool2d((3, 2)) vs a reshape-mean")
    y.sum().backward()
    check_close(x.grad, np.full(x_arr.shape, 1 / 6, np.float32), "each element of a 3x2 window receives 1/6")


# ---------------------------------------------------------------------------------------------
# Exercise 9.7: BatchNorm2d
# ---------------------------------------------------------------------------------------------
@st.composite
def bn_cases(draw):
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    if shape[0] * shape[2] * shape[3] < 2:
        shape = (2,) + shape[1:]
    return shape, draw(st.sampled_from(LAYOUTS)), draw(st.integers(0, 2**16))


@pytest.mark.exercise("9.7", "BatchNorm2dFunction.backward")
@PROPERTY
@given(bn_cases(), st.integers(1, 3))
def test_batchnorm_train_matches_torch(case, steps):
    torch = torch_or_none()
    shape, layout, seed = case
    rng = np.random.default_rng(seed)
    c = shape[1]
    bn = BatchNorm2d(c)
    bn.weight.data[:] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[:] = rng.standard_normal(c)
    if torch is None:
        mean, var = np.zeros(c), np.ones(c)
        for step in range(steps):
            x_arr = laid_out(shape, layout, seed + step) * 2 + 1
            x = Tensor(x_arr, requires_grad=True)
            bn.zero_grad()
            y = bn(x)
            g = rng.standard_normal(shape).astype(np.float32)
            y.backward(g)
            w_arr, b_arr = bn.weight.data.copy(), bn.bias.data.copy()
            expected, mean, var = refs.batch_norm_train(x_arr.astype(np.float64), w_arr, b_arr, mean, var)
            where = f"BatchNorm2d({c}) training step {step + 1}, {describe(x_arr)}"
            check_close(y, expected, f"{where}: output", atol=2e-4)
            fd_check(lambda a, w, b: refs.batch_norm_train(a, w, b, mean, var)[0], [x_arr, w_arr, b_arr], g,
                     [("x", x), ("weight", bn.weight), ("bias", bn.bias)], where, atol=1e-3)
            check_close(bn.running_mean.data, mean, f"{where}: running_mean")
            check_close(bn.running_var.data, var, f"{where}: running_var (unbiased batch variance)")
        return
    ref = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(bn.weight.data))
        ref.bias.copy_(torch.from_numpy(bn.bias.data))
    for step in range(steps):
        x_arr = laid_out(shape, layout, seed + step) * 2 + 1
        x = Tensor(x_arr, requires_grad=True)
        bn.zero_grad()
        ref.zero_grad()
        y = bn(x)
        g = rng.standard_normal(shape).astype(np.float32)
        y.backward(g)
        tx = to_torch(x_arr, requires_grad=True)
        ty = ref(tx)
        ty.backward(torch.from_numpy(g))
        where = f"BatchNorm2d({c}) training step {step + 1}, {describe(x_arr)}"
        check_close(y, ty, f"{where}: output", atol=2e-4)
        check_close(x.grad, tx.grad, f"{where}: input gradient", rtol=1e-3, atol=1e-3)
        check_close(bn.weight.grad, ref.weight.grad, f"{where}: weight gradient", atol=1e-3)
        check_close(bn.bias.grad, ref.bias.grad, f"{where}: bias gradient", atol=1e-3)
        check_close(bn.running_mean.data, ref.running_mean, f"{where}: running_mean")
        check_close(bn.running_var.data, ref.running_var, f"{where}: running_var (unbiased batch variance)")


@pytest.mark.exercise("9.7", "BatchNorm2d.forward")
@PROPERTY
@given(bn_cases())
def test_batchnorm_eval_matches_torch_functional(case):
    torch = torch_or_none()
    shape, layout, seed = case
    rng = np.random.default_rng(seed)
    c = shape[1]
    bn = BatchNorm2d(c, eps=1e-3)
    bn.running_mean.data = rng.standard_normal(c).astype(np.float32)
    bn.running_var.data = rng.uniform(0.2, 3.0, c).astype(np.float32)
    bn.weight.data[:] = rng.uniform(0.5, 1.5, c)
    bn.eval()
    x_arr = laid_out(shape, layout, seed)
    x = Tensor(x_arr, requires_grad=True)
    y = bn(x)
    g = rng.standard_normal(shape).astype(np.float32)
    y.backward(g)
    if torch is None:
        rm, rv = bn.running_mean.data.copy(), bn.running_var.data.copy()
        ref = lambda a, w, b: refs.batch_norm_eval(a, w, b, rm, rv, eps=1e-3)  # noqa: E731
        where = f"BatchNorm2d eval mode, {describe(x_arr)}"
        check_close(y, ref(x_arr, bn.weight.data, bn.bias.data), f"{where}: output")
        fd_check(ref, [x_arr, bn.weight.data.copy(), bn.bias.data.copy()], g,
                 [("x", x), ("weight", bn.weight), ("bias", bn.bias)], where, atol=1e-3)
        return
    tx, tw, tb = (to_torch(a, requires_grad=True) for a in (x_arr, bn.weight.data, bn.bias.data))
    ty = torch.nn.functional.batch_norm(tx, torch.from_numpy(bn.running_mean.data.copy()),
                                        torch.from_numpy(bn.running_var.data.copy()), tw, tb, training=False, eps=1e-3)
    ty.backward(torch.from_numpy(g))
    where = f"BatchNorm2d eval mode, {describe(x_arr)}"
    check_close(y, ty, f"{where}: output")
    check_close(x.grad, tx.grad, f"{where}: input gradient")
    check_close(bn.weight.grad, tw.grad, f"{where}: weight gradient", atol=1e-3)
    check_close(bn.bias.grad, tb.grad, f"{where}: bias gradient", atol=1e-3)


@pytest.mark.exercise("9.7", "BatchNorm2d.forward")
def test_batchnorm_state_modes_and_errors():
    bn = BatchNorm2d(3, momentum=0.5)
    assert [n for n, _ in bn.named_parameters()] == ["weight", "bias"], "running statistics are not parameters"
    x = np.random.default_rng(0).standard_normal((8, 3, 4, 4)).astype(np.float32) * 3 + 2
    bn(Tensor(x))
    m = 8 * 16
    check_close(bn.running_mean.data, 0.5 * x.mean(axis=(0, 2, 3)), "running_mean with momentum 0.5")
    check_close(bn.running_var.data, 0.5 + 0.5 * x.var(axis=(0, 2, 3)) * m / (m - 1), "running_var with momentum 0.5")
    before = bn.running_mean.data.copy()
    one = x[:1]
    bn.eval()
    alone, in_batch = bn(Tensor(one)).data, bn(Tensor(x)).data[:1]
    check_close(alone, in_batch, "in eval mode an image's output does not depend on the rest of the batch")
    assert np.array_equal(bn.running_mean.data, before), "eval mode must leave the running statistics alone"
    bn.train()
    with pytest.raises(ValueError, match=r"more than 1 value per channel.*\(1, 3, 1, 1\)"):
        bn(Tensor(np.ones((1, 3, 1, 1))))
    with pytest.raises(ValueError, match=r"\(2, 4, 3, 3\).*num_features=3"):
        bn(Tensor(np.ones((2, 4, 3, 3))))


# ---------------------------------------------------------------------------------------------
# Exercise 9.8: Flatten
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("9.8", "Flatten.forward")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_flatten_matches_reshape_and_passes_gradients(layout):
    x_arr = laid_out((2, 3, 4, 5), layout, 0)
    x = Tensor(x_arr, requires_grad=True)
    y = Flatten()(x)
    check_close(y, x_arr.reshape(2, -1), f"Flatten() of {describe(x_arr)}")
    assert Flatten(2)(x).shape == (2, 3, 20)
    g = np.random.default_rng(1).standard_normal((2, 60)).astype(np.float32)
    y.backward(g)
    check_close(x.grad, g.reshape(2, 3, 4, 5), "the gradient through Flatten is the upstream gradient reshaped")
    with pytest.raises(ValueError, match=r"\(5,\)"):
        Flatten()(Tensor(np.ones(5)))


@pytest.mark.exercise("9.3", "Conv2dFunction.backward")
def test_conv_backward_skips_the_input_gradient_when_nobody_needs_it(monkeypatch):
    import tinytorch.core.spatial as spatial
    rng = np.random.default_rng(7)
    w = Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), requires_grad=True)
    b = Tensor(np.zeros(4, np.float32), requires_grad=True)
    calls = []
    real = spatial.col2im
    monkeypatch.setattr(spatial, "col2im", lambda *a, **k: calls.append(1) or real(*a, **k))
    images = Tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    spatial.Conv2dFunction.apply(images, w, b, padding=1).sum().backward()
    assert images.grad is None and not calls, (
        f"x without requires_grad: x.grad is {type(images.grad).__name__} and col2im ran {len(calls)} time(s); "
        f"expected no input gradient and no col2im (ctx.needs_input_grad[0] is False)")
    assert w.grad is not None and b.grad is not None, "the weight and bias still get their gradients"
    inner = Tensor(images.data, requires_grad=True)
    spatial.Conv2dFunction.apply(inner, w, b, padding=1).sum().backward()
    assert inner.grad is not None and inner.grad.shape == inner.shape and calls == [1], (
        f"x with requires_grad: x.grad {None if inner.grad is None else inner.grad.shape}, col2im calls {len(calls)}; "
        f"expected a gradient of shape {inner.shape} from one col2im")
    node = spatial.Conv2dFunction.apply(inner, w, b, stride=2, padding=1).grad_fn
    assert node.attrs == {"stride": 2, "padding": 1}, f"the conv's record holds its arguments: {node.attrs}"


# ---------------------------------------------------------------------------------------------
# The module's rows of the shared reference table (tests/support/families.py): value and every
# input's gradient against torch, or without torch against NumPy and central differences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", params(family_rows("09"), "grad"))
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_family_rows_match_the_reference(op, data, seed):
    check_row(op, data.draw(op.inputs(), label="case"), seed)


# =============================================================================================
# Speed checks (issue 15): the point of exercises 9.2 and 9.3 is speed, so each is timed against
# a vectorised NumPy reference written here, in the same process, calls taken in turns (the same
# machine load for both), the best call of each kept. The limits are generous ratios, never a
# wall-clock limit: the reference solution measures 0.4-0.7x these references on a loaded 2-core
# machine; a loop convolution measures hundreds of times slower, a col2im looping over windows
# 6-17x. Keep this section at the end of the file.
# =============================================================================================
def _best_call_ratio(fn, reference, rounds: int = 7, budget: float = 6.0) -> tuple[float, float, float]:
    """(ratio, fn seconds, reference seconds): the best single call of each, timed in turns.

    Each round times a few calls of one then the other (the order alternates), with the garbage
    collector paused; rounds stop after `budget` seconds once three have run (a very slow `fn`).
    """
    import gc
    import time

    fn()
    reference()  # warm-up: first calls allocate and import
    t0 = time.perf_counter()
    fn()
    calls = max(1, min(10, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
    best = {"fn": float("inf"), "ref": float("inf")}
    start, gc_was_on = time.perf_counter(), gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            turns = [("fn", fn, calls), ("ref", reference, max(calls, 5))]
            for name, f, n in turns if r % 2 == 0 else turns[::-1]:
                for _ in range(n):
                    t = time.perf_counter()
                    f()
                    best[name] = min(best[name], time.perf_counter() - t)
            if r >= 2 and time.perf_counter() - start > budget:
                break
    finally:
        if gc_was_on:
            gc.enable()
    return best["fn"] / best["ref"], best["fn"], best["ref"]


def _padded(x: np.ndarray, pad: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))


def _reference_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """Stride-1 convolution as one tensordot over a sliding-window view (no Python loop)."""
    from numpy.lib.stride_tricks import sliding_window_view

    views = sliding_window_view(_padded(x, pad), w.shape[2:], axis=(2, 3))  # (N, C, OH, OW, kh, kw)
    nhwo = np.tensordot(views, w, axes=([1, 4, 5], [1, 2, 3]))
    return np.ascontiguousarray(np.moveaxis(nhwo, 3, 1)) + b[None, :, None, None]


def _reference_conv_grads(x, w, b, pad, g):
    """Output and the three gradients of a stride-1 convolution for upstream `g`, vectorised:
    the input gradient is the full convolution of `g` with the flipped kernel."""
    from numpy.lib.stride_tricks import sliding_window_view

    out = _reference_conv(x, w, b, pad)
    views = sliding_window_view(_padded(x, pad), w.shape[2:], axis=(2, 3))
    grad_w = np.tensordot(g, views, axes=([0, 2, 3], [0, 2, 3]))
    k = w.shape[2]
    g_views = sliding_window_view(_padded(g, k - 1 - pad), (k, k), axis=(2, 3))  # (N, O, H, W, kh, kw)
    grad_x = np.moveaxis(np.tensordot(g_views, w[:, :, ::-1, ::-1], axes=([1, 4, 5], [0, 2, 3])), 3, 1)
    return out, grad_x, grad_w, g.sum(axis=(0, 2, 3))


def _reference_col2im(grad_cols: np.ndarray, x_shape, k: int, pad: int) -> np.ndarray:
    """Stride-1 col2im: one strided add per kernel offset (k * k adds, each over every window)."""
    n, c, h, w = x_shape
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    blocks = grad_cols.reshape(c, k, k, n, oh, ow)
    acc = np.zeros((n, c, h + 2 * pad, w + 2 * pad), grad_cols.dtype)
    for di in range(k):
        for dj in range(k):
            acc[:, :, di:di + oh, dj:dj + ow] += np.moveaxis(blocks[:, di, dj], 0, 1)
    return acc[:, :, pad:pad + h, pad:pad + w]


SPEED_FORWARD_FACTOR = 20
SPEED_COL2IM_FACTOR = 5
SPEED_LAYER_FACTOR = 3


@pytest.mark.exercise("9.2", "conv2d_forward")
def test_speed_conv2d_forward_is_one_matmul_not_loops():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 16, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(conv2d_forward(x, w, b, 1, 1)[0], _reference_conv(x, w, b, 1), rtol=1e-4, atol=1e-4,
                               err_msg="conv2d_forward(x (4, 8, 16, 16), w (16, 8, 3, 3), padding 1) vs the reference")
    ratio, mine, ref = _best_call_ratio(lambda: conv2d_forward(x, w, b, 1, 1), lambda: _reference_conv(x, w, b, 1))
    assert ratio <= SPEED_FORWARD_FACTOR, (
        f"conv2d_forward is {ratio:.0f}x slower than a vectorised convolution ({mine * 1e3:.2f} ms against "
        f"{ref * 1e3:.3f} ms per call on x (4, 8, 16, 16), w (16, 8, 3, 3)); expected at most "
        f"{SPEED_FORWARD_FACTOR}x: the point of exercise 9.2 is one im2col and one matmul, with no Python loop "
        f"over the batch, the channels or the output positions")


@pytest.mark.exercise("9.3", "col2im")
def test_speed_col2im_loops_over_kernel_offsets_only():
    rng = np.random.default_rng(1)
    shape = (8, 4, 16, 16)
    grad_cols = rng.standard_normal((4 * 9, 8 * 16 * 16)).astype(np.float32)
    np.testing.assert_allclose(col2im(grad_cols, shape, 3, 1, 1), _reference_col2im(grad_cols, shape, 3, 1),
                               rtol=1e-5, atol=1e-5, err_msg="col2im(grad_cols, (8, 4, 16, 16), 3, 1, 1) vs the reference")
    ratio, mine, ref = _best_call_ratio(lambda: col2im(grad_cols, shape, 3, 1, 1),
                                        lambda: _reference_col2im(grad_cols, shape, 3, 1))
    assert ratio <= SPEED_COL2IM_FACTOR, (
        f"col2im is {ratio:.1f}x slower than one strided add per kernel offset ({mine * 1e3:.2f} ms against "
        f"{ref * 1e3:.3f} ms per call for x_shape (8, 4, 16, 16), a 3x3 kernel); expected at most "
        f"{SPEED_COL2IM_FACTOR}x: loop over the kh * kw kernel offsets, never over the batch or the windows")


@pytest.mark.exercise("9.3", "Conv2dFunction.backward")
def test_speed_conv2d_layer_forward_and_backward():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 4, 16, 16)).astype(np.float32)
    g = rng.standard_normal((8, 8, 16, 16)).astype(np.float32)
    conv = Conv2d(4, 8, 3, padding=1, rng=0)
    w, b = conv.weight.data, conv.bias.data

    def step():
        xt = Tensor(x, requires_grad=True)
        conv.weight.grad = conv.bias.grad = None
        conv(xt).backward(g)
        return xt

    _, grad_x, grad_w, _ = _reference_conv_grads(x, w, b, 1, g)
    np.testing.assert_allclose(step().grad.data, grad_x, rtol=1e-4, atol=1e-4,
                               err_msg="Conv2d(4, 8, 3, padding=1) input gradient vs the reference")
    np.testing.assert_allclose(conv.weight.grad.data, grad_w, rtol=1e-3, atol=1e-3,
                               err_msg="Conv2d(4, 8, 3, padding=1) weight gradient vs the reference")
    ratio, mine, ref = _best_call_ratio(step, lambda: _reference_conv_grads(x, w, b, 1, g))
    assert ratio <= SPEED_LAYER_FACTOR, (
        f"Conv2d forward + backward is {ratio:.1f}x slower than a vectorised reference ({mine * 1e3:.2f} ms against "
        f"{ref * 1e3:.3f} ms per step on x (8, 4, 16, 16), 8 filters 3x3); expected at most {SPEED_LAYER_FACTOR}x: "
        f"Conv2dFunction.backward is two matmuls and one col2im, with no Python loop over the batch, the channels "
        f"or the positions (the speed tests of conv2d_forward and col2im name the slow one)")
