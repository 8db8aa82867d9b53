"""Module 04 (losses): the exported `tinytorch.core.losses` checked against float64 references.

Each loss is written a second time in plain float64 NumPy (the `ref_*` functions of the shared
reference table, tests/support/ops.py), and
hypothesis draws batch sizes, class counts, logit scales, label dtypes and containers (Tensor,
ndarray, list) and compares the two. Inputs are cast to float32 *before* the reference sees them,
so the comparison measures the loss's own arithmetic, not the rounding of its inputs. Stability is
checked with warnings turned into errors: an overflow in `exp` or a `log(0)` fails the test.
PyTorch, when installed, is a second reference (never required).

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("4.3",
"CrossEntropyLoss.forward")`: run one exercise with
`pytest tests/modules/test_04_losses.py --exercise 4.3`.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from tests.support import (
    check_close, no_warnings, params, ref_bce, ref_cross_entropy, ref_log_sum_exp, ref_mse, rows, to_torch, tt_args,
)
from tinytorch.core.losses import BinaryCrossEntropyLoss, CrossEntropyLoss, MSELoss, log_sum_exp
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("04")

PROPERTY = settings(max_examples=50, deadline=None)

# float32 loss compared with float64 arithmetic on the same float32 inputs.
RTOL, ATOL = 1e-5, 1e-6


# The float64 references (`ref_*`) and the warning guard live in tests/support, written once.


def check_scalar(out, name: str, dtype=np.float32):
    assert isinstance(out, Tensor), f"{name} returned a {type(out).__name__}; expected a Tensor"
    assert out.shape == (), f"{name} returned shape {out.shape}; expected a 0-d Tensor (shape ()) holding the mean"
    assert out.dtype == dtype, f"{name} returned dtype {out.dtype}; expected {np.dtype(dtype)}"


def names_value(message: str, value) -> bool:
    "True when `value` (an int) appears in `message` as a whole number."
    return re.search(rf"(?<![\d.]){re.escape(str(value))}(?![\d.])", message) is not None


def as_container(labels: np.ndarray, kind: str):
    return {"tensor": Tensor(labels), "ndarray": labels, "list": labels.tolist()}[kind]


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------
def floats32(lo, hi):
    return st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False)


@st.composite
def classification_batch(draw, max_scale=1e4):
    """(logits float32 (N, C), labels (N,)) with N in 1..16, C in 1..12 and a drawn logit scale.

    The logits may be a non-contiguous (transposed) view; the labels have a drawn integer dtype.
    """
    n = draw(st.integers(1, 16))
    c = draw(st.integers(1, 12))
    scale = draw(st.sampled_from([1e-3, 1.0, 10.0, 100.0, max_scale]))
    unit = draw(arrays(np.float64, (n, c), elements=st.floats(-1, 1)))
    logits = (unit * scale).astype(np.float32)
    if draw(st.booleans()):
        logits = np.ascontiguousarray(logits.T).T  # same values, Fortran-ordered view
    label_dtype = draw(st.sampled_from([np.int64, np.int32, np.uint8]))
    labels = np.asarray(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=label_dtype)
    return logits, labels


# =============================================================================================
# Exercise 4.1: log_sum_exp
# =============================================================================================
@pytest.mark.exercise("4.1", "log_sum_exp")
@PROPERTY
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
       scale=st.sampled_from([1.0, 50.0, 1e4]), keepdims=st.booleans())
def test_log_sum_exp_matches_reference(data, shape, scale, keepdims):
    x = data.draw(arrays(np.float32, shape, elements=floats32(-1, 1))) * np.float32(scale)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    out = no_warnings(lambda: log_sum_exp(Tensor(x), axis=axis, keepdims=keepdims))
    expected = ref_log_sum_exp(x, axis=axis, keepdims=keepdims)
    assert isinstance(out, Tensor), f"log_sum_exp returned a {type(out).__name__}; expected a Tensor"
    assert out.shape == expected.shape, (
        f"log_sum_exp(x of shape {shape}, axis={axis}, keepdims={keepdims}) has shape {out.shape}; expected {expected.shape}")
    assert out.dtype == np.float32, f"log_sum_exp of float32 input gave dtype {out.dtype}; expected float32"
    np.testing.assert_allclose(out.data, expected, rtol=RTOL, atol=1e-4 * scale / 1e4 + ATOL,
                               err_msg=f"log_sum_exp(axis={axis}) at logit scale {scale}")


@pytest.mark.exercise("4.1", "log_sum_exp")
def test_log_sum_exp_is_stable_at_1e4():
    x = Tensor([[1e4, 1e4, 0.0], [-1e4, -1e4, -1e4]])
    out = no_warnings(lambda: log_sum_exp(x))
    expected = [1e4 + np.log(2), -1e4 + np.log(3)]
    np.testing.assert_allclose(out.data, expected, rtol=1e-6,
                               err_msg="log_sum_exp at |x| = 1e4: subtract the row max before exp")


@pytest.mark.exercise("4.1", "log_sum_exp")
def test_log_sum_exp_handles_minus_infinity_rows():
    out = no_warnings(lambda: log_sum_exp(Tensor([[-np.inf, -np.inf], [0.0, -np.inf]])))
    assert out.data[0] == -np.inf, f"a row of all -inf has log-sum-exp -inf; got {out.data[0]} (max 0 must replace the -inf max)"
    assert np.isclose(out.data[1], 0.0), f"log_sum_exp([0, -inf]) is log(1) = 0; got {out.data[1]}"


@pytest.mark.exercise("4.1", "log_sum_exp")
def test_log_sum_exp_keeps_float64_and_accepts_arrays():
    x = np.random.default_rng(0).standard_normal((3, 4)) * 300
    out = log_sum_exp(Tensor(x, dtype=np.float64), axis=0)
    assert out.dtype == np.float64, f"float64 input gave dtype {out.dtype}; expected float64"
    np.testing.assert_allclose(out.data, ref_log_sum_exp(x, axis=0), rtol=1e-12)
    arr = log_sum_exp([[0.0, 0.0]])
    np.testing.assert_allclose(arr.data, [np.log(2)], rtol=1e-6, err_msg="log_sum_exp of a nested list")


# =============================================================================================
# Exercise 4.2: MSELoss.forward
# =============================================================================================
@pytest.mark.exercise("4.2", "MSELoss.forward")
@PROPERTY
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
def test_mse_matches_reference(data, shape):
    pred = data.draw(arrays(np.float32, shape, elements=floats32(-100, 100)))
    target = data.draw(arrays(np.float32, shape, elements=floats32(-100, 100)))
    out = no_warnings(lambda: MSELoss()(Tensor(pred), Tensor(target)))
    check_scalar(out, "MSELoss")
    expected = ref_mse(pred, target)
    np.testing.assert_allclose(out.item(), expected, rtol=1e-5, atol=1e-6,
                               err_msg=f"MSELoss on shape {shape}: mean((pred - target) ** 2)")


@pytest.mark.exercise("4.2", "MSELoss.forward")
@PROPERTY
@given(pred=arrays(np.float32, array_shapes(min_dims=1, max_dims=3, max_side=5), elements=floats32(-1e4, 1e4)))
def test_mse_of_a_perfect_prediction_is_zero(pred):
    out = MSELoss()(Tensor(pred), Tensor(pred.copy()))
    assert out.item() == 0.0, f"MSELoss of a prediction equal to its target gave {out.item()}; expected exactly 0"


@pytest.mark.exercise("4.2", "MSELoss.forward")
def test_mse_accepts_arrays_lists_and_integer_predictions():
    loss = MSELoss()
    assert np.isclose(loss.forward(np.array([1.0, 2.0, 3.0]), [1.0, 2.0, 5.0]).item(), 4 / 3), \
        "MSELoss.forward(ndarray, list) should give 4/3"
    out = loss(Tensor([1, 2]), Tensor([2.0, 4.0]))
    check_scalar(out, "MSELoss of integer predictions")
    assert np.isclose(out.item(), 2.5), f"MSELoss([1, 2], [2, 4]) gave {out.item()}; expected 2.5"
    x = np.random.default_rng(1).standard_normal((5, 2))
    y = np.random.default_rng(2).standard_normal((5, 2))
    out64 = loss(Tensor(x, dtype=np.float64), Tensor(y, dtype=np.float64))
    check_scalar(out64, "MSELoss of float64 tensors", np.float64)
    np.testing.assert_allclose(out64.item(), ref_mse(x, y), rtol=1e-12)


@pytest.mark.exercise("4.2", "MSELoss.forward")
@pytest.mark.parametrize("pred_shape, target_shape", [((4, 1), (4,)), ((4,), (4, 1)), ((3, 2), (2, 3)), ((5,), (1,))])
def test_mse_refuses_to_broadcast_and_names_shapes(pred_shape, target_shape):
    with pytest.raises(ValueError) as info:
        MSELoss()(Tensor(np.zeros(pred_shape)), Tensor(np.zeros(target_shape)))
    msg = str(info.value)
    assert str(pred_shape) in msg and str(target_shape) in msg, (
        f"MSELoss with pred {pred_shape} and target {target_shape}: the error must name both shapes; got: {msg}")


# =============================================================================================
# Exercise 4.3: CrossEntropyLoss.forward
# =============================================================================================
@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@PROPERTY
@given(batch=classification_batch(), container=st.sampled_from(["tensor", "ndarray", "list"]),
       logits_as_tensor=st.booleans())
def test_cross_entropy_matches_reference(batch, container, logits_as_tensor):
    logits, labels = batch
    z = Tensor(logits) if logits_as_tensor else logits
    out = no_warnings(lambda: CrossEntropyLoss()(z, as_container(labels, container)))
    check_scalar(out, "CrossEntropyLoss")
    expected = ref_cross_entropy(logits, labels)
    np.testing.assert_allclose(
        out.item(), expected, rtol=RTOL, atol=ATOL,
        err_msg=(f"CrossEntropyLoss on logits {logits.shape} (max |z| {np.abs(logits).max():.3g}) with "
                 f"{labels.dtype} labels as {container}: compute log_sum_exp(s) - s[y] on shifted logits s"))


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@PROPERTY
@given(n=st.integers(1, 32), c=st.integers(1, 50))
def test_cross_entropy_of_equal_logits_is_log_c(n, c):
    labels = np.random.default_rng(n * 100 + c).integers(0, c, n)
    out = CrossEntropyLoss()(Tensor(np.full((n, c), 3.0)), labels)
    assert np.isclose(out.item(), np.log(c), rtol=1e-6, atol=1e-7), (
        f"equal logits over {c} classes should give log({c}) = {np.log(c):.6f}; got {out.item()}")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@pytest.mark.parametrize("magnitude", [1e2, 1e3, 1e4, 1e6])
def test_cross_entropy_is_stable_for_huge_logits(magnitude):
    rng = np.random.default_rng(int(np.log10(magnitude)))
    logits = (rng.uniform(-1, 1, (32, 10)) * magnitude).astype(np.float32)
    logits[0, 0] = magnitude  # at least one logit of the full magnitude
    labels = rng.integers(0, 10, 32)
    out = no_warnings(lambda: CrossEntropyLoss()(Tensor(logits), labels))
    assert np.isfinite(out.item()), f"logits of magnitude {magnitude:g} gave a non-finite loss {out.item()}"
    np.testing.assert_allclose(out.item(), ref_cross_entropy(logits, labels), rtol=RTOL,
                               err_msg=f"CrossEntropyLoss at logit magnitude {magnitude:g}")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
def test_cross_entropy_of_a_confident_correct_batch_is_accurate():
    # Every label is its row's largest logit, by a margin: the loss is a small number computed
    # from logits of size 1e4. Subtracting unshifted logits (lse(z) - z[y]) loses it to rounding.
    rng = np.random.default_rng(7)
    logits = (rng.uniform(-1, 1, (64, 10)) * 1e4).astype(np.float32)
    labels = rng.integers(0, 10, 64)
    logits[np.arange(64), labels] = logits.max(axis=1) + 5.0
    expected = ref_cross_entropy(logits, labels)
    out = no_warnings(lambda: CrossEntropyLoss()(Tensor(logits), labels))
    np.testing.assert_allclose(
        out.item(), expected, rtol=1e-4, atol=1e-7,
        err_msg=("confident batch with logits of size 1e4 (true loss %.3g): work on shifted logits "
                 "s = z - max(z) and return log_sum_exp(s) - s[y], so no two large numbers are subtracted" % expected))


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
def test_cross_entropy_dtypes_and_call():
    z = np.random.default_rng(3).standard_normal((6, 4))
    y = np.array([0, 1, 2, 3, 0, 1])
    loss = CrossEntropyLoss()
    out64 = loss(Tensor(z, dtype=np.float64), y)
    check_scalar(out64, "CrossEntropyLoss of float64 logits", np.float64)
    np.testing.assert_allclose(out64.item(), ref_cross_entropy(z, y), rtol=1e-12)
    assert loss.forward(Tensor(z), Tensor(y)).item() == loss(Tensor(z), Tensor(y)).item(), \
        "loss(logits, target) must return what loss.forward(logits, target) returns"
    out_int = loss(Tensor(np.zeros((2, 3), dtype=np.int64)), y[:2])
    check_scalar(out_int, "CrossEntropyLoss of integer logits")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@PROPERTY
@given(n=st.integers(1, 10), c=st.integers(1, 8), data=st.data())
def test_cross_entropy_names_an_out_of_range_label(n, c, data):
    labels = np.asarray(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    position = data.draw(st.integers(0, n - 1))
    bad = data.draw(st.one_of(st.integers(-5, -1), st.integers(c, c + 5)))
    labels[position] = bad
    with pytest.raises(ValueError) as info:
        CrossEntropyLoss()(Tensor(np.zeros((n, c))), Tensor(labels))
    msg = str(info.value)
    assert names_value(msg, bad) and names_value(msg, c), (
        f"labels {labels.tolist()} with {c} classes: the error must name the bad label {bad} and the number "
        f"of classes {c}; got: {msg}")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@pytest.mark.parametrize("logits_shape, target_shape", [((4, 3), (3,)), ((4, 3), (4, 1)), ((2, 5), (5,)), ((3, 2), ())])
def test_cross_entropy_names_mismatched_shapes(logits_shape, target_shape):
    with pytest.raises(ValueError) as info:
        CrossEntropyLoss()(Tensor(np.zeros(logits_shape)), Tensor(np.zeros(target_shape, dtype=np.int64)))
    msg = str(info.value)
    assert str(logits_shape) in msg and str(target_shape) in msg, (
        f"logits {logits_shape} with targets {target_shape}: the error must name both shapes; got: {msg}")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
@pytest.mark.parametrize("logits_shape", [(5,), (2, 3, 4), (0, 3), (3, 0)])
def test_cross_entropy_requires_2d_logits(logits_shape):
    with pytest.raises(ValueError) as info:
        CrossEntropyLoss()(Tensor(np.zeros(logits_shape)), Tensor(np.zeros(logits_shape[:1], dtype=np.int64)))
    assert str(logits_shape) in str(info.value), (
        f"logits of shape {logits_shape}: the error must name the shape and ask for (N, C); got: {info.value}")


@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
def test_cross_entropy_rejects_float_targets():
    with pytest.raises(TypeError) as info:
        CrossEntropyLoss()(Tensor(np.zeros((2, 3))), Tensor([0.0, 2.0]))
    assert "float32" in str(info.value), f"float targets: the TypeError should name the dtype float32; got: {info.value}"


# =============================================================================================
# Exercise 4.4: BinaryCrossEntropyLoss.forward
# =============================================================================================
@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
@PROPERTY
@given(data=st.data(), shape=array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
def test_bce_matches_reference(data, shape):
    p = data.draw(arrays(np.float32, shape, elements=floats32(float(np.float32(1e-4)), float(np.float32(1 - 1e-4)))))
    t = data.draw(arrays(np.float32, shape, elements=st.sampled_from([0.0, 1.0])))
    out = no_warnings(lambda: BinaryCrossEntropyLoss()(Tensor(p), Tensor(t)))
    check_scalar(out, "BinaryCrossEntropyLoss")
    np.testing.assert_allclose(out.item(), ref_bce(p, t), rtol=RTOL, atol=ATOL,
                               err_msg=f"BinaryCrossEntropyLoss on shape {shape}")


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
@pytest.mark.parametrize("eps", [1e-7, 1e-3, 0.1])
def test_bce_clips_confident_wrong_predictions_to_minus_log_eps(eps):
    loss = BinaryCrossEntropyLoss(eps=eps)
    out = no_warnings(lambda: loss(Tensor([0.0], dtype=np.float64), Tensor([1.0], dtype=np.float64)))
    assert np.isclose(out.item(), -np.log(eps), rtol=1e-9), (
        f"p = 0 with target 1 and eps = {eps:g} should cost -log(eps) = {-np.log(eps):.6f}; got {out.item()}")
    out = no_warnings(lambda: loss(Tensor([1.0], dtype=np.float64), Tensor([0.0], dtype=np.float64)))
    assert np.isclose(out.item(), -np.log(eps), rtol=1e-6), (
        f"p = 1 with target 0 and eps = {eps:g} should cost -log(eps) = {-np.log(eps):.6f}; got {out.item()}")


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
@pytest.mark.parametrize("eps", [1e-7, 1e-8, 1e-12])
def test_bce_float32_clip_bound_stays_below_one(eps):
    # In float32, 1 - 1e-8 rounds to exactly 1.0: log(1 - p) would be log(0).
    out = no_warnings(lambda: BinaryCrossEntropyLoss(eps=eps)(Tensor([1.0, 0.0, 1.0]), Tensor([0.0, 1.0, 1.0])))
    check_scalar(out, f"BinaryCrossEntropyLoss(eps={eps:g})")
    assert np.isfinite(out.item()), (
        f"float32 p = 1 with target 0 and eps = {eps:g} gave {out.item()}: the upper clip bound must stay below 1 "
        f"in float32 (np.nextafter(1, 0))")


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
def test_bce_dtypes_containers_and_call():
    rng = np.random.default_rng(4)
    p = rng.uniform(0.05, 0.95, (4, 3))
    t = rng.integers(0, 2, (4, 3))
    loss = BinaryCrossEntropyLoss()
    out64 = loss(Tensor(p, dtype=np.float64), t)
    check_scalar(out64, "BinaryCrossEntropyLoss of float64 probabilities", np.float64)
    np.testing.assert_allclose(out64.item(), ref_bce(p, t), rtol=1e-12, err_msg="float64 probabilities, integer targets")
    assert np.isclose(loss.forward(p.tolist(), Tensor(t)).item(), ref_bce(p, t), rtol=1e-5), "lists of probabilities work"
    assert loss(Tensor(p), t).item() == loss.forward(Tensor(p), t).item(), "loss(p, t) must equal loss.forward(p, t)"


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
@pytest.mark.parametrize("pred_shape, target_shape", [((4, 1), (4,)), ((3,), (4,)), ((2, 2), (4,))])
def test_bce_names_mismatched_shapes(pred_shape, target_shape):
    with pytest.raises(ValueError) as info:
        BinaryCrossEntropyLoss()(Tensor(np.full(pred_shape, 0.5)), Tensor(np.ones(target_shape)))
    msg = str(info.value)
    assert str(pred_shape) in msg and str(target_shape) in msg, (
        f"pred {pred_shape} with targets {target_shape}: the error must name both shapes; got: {msg}")


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
@pytest.mark.parametrize("bad", [[-0.5, 0.5], [0.5, 1.5], [3.0, -2.0]])
def test_bce_rejects_logits_as_predictions(bad):
    with pytest.raises(ValueError) as info:
        BinaryCrossEntropyLoss()(Tensor(bad), Tensor([1.0, 0.0]))
    assert "sigmoid" in str(info.value).lower(), (
        f"pred {bad} is outside [0, 1]: the error should say these look like logits and to apply Sigmoid; got: {info.value}")


@pytest.mark.exercise("4.4", "BinaryCrossEntropyLoss.forward")
def test_bce_rejects_targets_outside_0_1():
    with pytest.raises(ValueError) as info:
        BinaryCrossEntropyLoss()(Tensor([0.5, 0.5, 0.5]), Tensor([1.0, 0.0, 2.0]))
    assert names_value(str(info.value), 2), f"target 2 is outside [0, 1]: the error must name it; got: {info.value}"


# =============================================================================================
# PyTorch as a second reference (skipped when torch is not installed)
# =============================================================================================
@pytest.mark.exercise("4.3", "CrossEntropyLoss.forward")
def test_losses_agree_with_pytorch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    z = rng.standard_normal((16, 7)) * 20
    y = rng.integers(0, 7, 16)
    ours = CrossEntropyLoss()(Tensor(z, dtype=np.float64), y).item()
    theirs = F.cross_entropy(to_torch(z), to_torch(y)).item()
    assert np.isclose(ours, theirs, rtol=1e-10), f"CrossEntropyLoss {ours} vs torch {theirs}"
    p, q = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    ours = MSELoss()(Tensor(p, dtype=np.float64), Tensor(q, dtype=np.float64)).item()
    theirs = F.mse_loss(to_torch(p), to_torch(q)).item()
    assert np.isclose(ours, theirs, rtol=1e-10), f"MSELoss {ours} vs torch {theirs}"
    pr, t = rng.uniform(0.01, 0.99, (5, 3)), rng.integers(0, 2, (5, 3)).astype(np.float64)
    ours = BinaryCrossEntropyLoss()(Tensor(pr, dtype=np.float64), Tensor(t, dtype=np.float64)).item()
    theirs = F.binary_cross_entropy(to_torch(pr), to_torch(t)).item()
    assert np.isclose(ours, theirs, rtol=1e-8), f"BinaryCrossEntropyLoss {ours} vs torch {theirs}"


# =============================================================================================
# The module-04 rows of the shared reference table, on non-contiguous inputs too
# =============================================================================================
@pytest.mark.parametrize("op", params(rows(module="04"), "forward"))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_table_forward_matches_reference(op, data):
    case = data.draw(op.inputs(), label="case")
    got = no_warnings(lambda: op.tt(*tt_args(case), **case.kwargs))
    expected = np.asarray(op.ref(*case.args, **case.kwargs))
    check_close(got, expected, fn=op.exercise[1], what=op.name, inputs=case.describe(), rtol=op.rtol, atol=op.atol,
                reference="the float64 reference")
