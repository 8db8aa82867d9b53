"""Module 02 (activations): the exported `tinytorch.core.activations` checked against NumPy.

Each activation is written once more as a float64 NumPy reference formula, in the course's shared
reference table (`tests/support/ops.py`, with its torch call and tolerances), and compared with
PyTorch too when it happens to be installed. Hypothesis draws the shapes, the values (moderate ones
for precision, values up to magnitude 1e4 for stability), the `dim` and the memory layout of the
input (contiguous, transposed, strided or reversed views), so an activation that only works on
fresh contiguous rows fails here. Stability tests turn every NumPy floating-point RuntimeWarning
(overflow, invalid value, divide by zero) into an error.

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("2.5", "Softmax.forward")`:
run one exercise with `pytest tests/modules/test_02_activations.py --exercise 2.5`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import (
    EXTREME, HUGE, MODERATE, laid_out, layout, no_float_warnings, property_settings, ref_gelu, ref_log_softmax,
    ref_softmax, to_torch,
)
from tests.support import BY_NAME as OP
from tests.support import shapes as any_shapes
from tinytorch.core.activations import GELU, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("02")

# Modest budget: the whole file runs in seconds on two cores.
PROPERTY = property_settings(max_examples=40)


@dataclass(frozen=True)
class Activation:
    exercise: str
    function: str  # the method a failure names
    make: Callable  # make(dim) -> activation object (dim ignored by elementwise ones)
    ref: Callable  # ref(x64, dim) -> float64 result
    rtol: float
    atol: float
    has_dim: bool = False
    torch: Callable | None = None  # the torch call of the table row

    def __repr__(self) -> str:
        return self.function


# The rows of the shared reference table (tests/support/ops.py): reference formula, torch call,
# tolerances and exercise are stated there once.
_CLASSES = {"relu": ReLU, "sigmoid": Sigmoid, "Tanh": Tanh, "gelu": GELU, "softmax": Softmax, "log_softmax": LogSoftmax}


def _activation(name: str) -> Activation:
    row, cls = OP[name], _CLASSES[name]
    has_dim = cls in (Softmax, LogSoftmax)
    make = (lambda dim=-1: cls(dim=dim)) if has_dim else (lambda dim=-1: cls())
    return Activation(row.exercise[0], row.exercise[1], make, row.ref, row.rtol, row.atol, has_dim, row.torch)


ACTIVATIONS = [_activation(name) for name in _CLASSES]
BY_NAME = {a.function.split(".")[0]: a for a in ACTIVATIONS}
DIM_ACTIVATIONS = [a for a in ACTIVATIONS if a.has_dim]


def each(activations):
    "Parametrize over activations, marking each case with its exercise."
    return pytest.mark.parametrize(
        "act", [pytest.param(a, id=a.function.split(".")[0], marks=pytest.mark.exercise(a.exercise, a.function))
                for a in activations])


# ---------------------------------------------------------------------------------------------
# Inputs: shapes (at least one dimension) and memory layouts (tests.support.laid_out)
# ---------------------------------------------------------------------------------------------
def shapes(min_dims=1, max_dims=4):
    return any_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=5)


def check(act: Activation, x: np.ndarray, dim: int = -1, *, rtol=None, atol=None, strict: bool = False):
    """Run `act` on Tensor(x) and compare with its float64 reference; return the result array."""
    before = x.copy()
    what = f"{act.function.split('.')[0]}(dim={dim})" if act.has_dim else act.function.split(".")[0]
    what += f" on an input with {layout(x)}"
    if strict:
        with no_float_warnings(f"{act.function}: {what}"):
            got = act.make(dim)(Tensor(x))
    else:
        got = act.make(dim)(Tensor(x))
    expected = act.ref(x.astype(np.float64), dim)
    assert isinstance(got, Tensor), f"{act.function}: {what} returned a {type(got).__name__}; expected a Tensor"
    assert got.shape == x.shape, f"{act.function}: {what} returned shape {got.shape}; expected {x.shape}"
    assert got.dtype == np.float32, f"{act.function}: {what} returned dtype {got.dtype}; expected float32"
    assert np.all(np.isfinite(got.data)), (
        f"{act.function}: {what} returned non-finite values {got.data[~np.isfinite(got.data)][:5].tolist()} "
        f"for inputs {x[~np.isfinite(got.data)][:5].tolist()}; expected finite values")
    np.testing.assert_allclose(
        got.data, expected, rtol=act.rtol if rtol is None else rtol, atol=act.atol if atol is None else atol,
        err_msg=f"{act.function}: {what}: values differ from the NumPy reference (ACTUAL = received, DESIRED = expected)")
    assert np.array_equal(x, before), f"{act.function} modified its input in place"
    return got.data


# ---------------------------------------------------------------------------------------------
# All exercises: values against the reference, on any shape and layout
# ---------------------------------------------------------------------------------------------
@each(ACTIVATIONS)
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_matches_numpy_reference(act, data, shape):
    x = data.draw(laid_out(shape, MODERATE), label="x")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim") if act.has_dim else -1
    check(act, x, dim)


@each(ACTIVATIONS)
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_stable_for_inputs_of_magnitude_1e4(act, data, shape):
    x = data.draw(laid_out(shape, EXTREME), label="x")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim") if act.has_dim else -1
    check(act, x, dim, strict=True)


@each(ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_output_dtype_is_float32_or_the_input_float_dtype(act, dtype):
    x = np.array([[-3, -1, 0], [1, 2, 5]]).astype(dtype)
    got = act.make()(Tensor(x, dtype=dtype))
    assert isinstance(got, Tensor), f"{act.function} returned a {type(got).__name__}; expected a Tensor"
    want = np.float64 if dtype == np.float64 else np.float32  # integers compute in float32; floats keep their dtype
    assert got.dtype == want, f"{act.function} on a {np.dtype(dtype)} tensor returned {got.dtype}; expected {np.dtype(want)}"
    np.testing.assert_allclose(got.data, act.ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6,
                               err_msg=f"{act.function} on a {np.dtype(dtype)} tensor")


@each(ACTIVATIONS)
def test_call_is_forward_and_elementwise_ones_accept_0d(act):
    x = Tensor(np.array([[0.5, -1.5, 2.0]], dtype=np.float32))
    obj = act.make()
    np.testing.assert_array_equal(obj(x).data, obj.forward(x).data,
                                  err_msg=f"{act.function}: obj(x) and obj.forward(x) must agree")
    if not act.has_dim:  # elementwise activations accept 0-d tensors
        got = obj(Tensor(np.float32(1.5)))
        assert got.shape == (), f"{act.function} on a 0-d tensor returned shape {got.shape}; expected ()"
        np.testing.assert_allclose(got.data, act.ref(np.float64(1.5)), rtol=1e-5, atol=1e-6)


@pytest.mark.exercise("2.1", "ReLU.forward")
@PROPERTY
@given(data=st.data(), shape=shapes(min_dims=0))
def test_relu_is_exact(data, shape):
    x = data.draw(laid_out(shape, HUGE))
    got = ReLU()(Tensor(x))
    np.testing.assert_array_equal(got.data, np.maximum(x, 0), err_msg=f"ReLU.forward on {layout(x)}: must equal max(x, 0) exactly")


@pytest.mark.exercise("2.2", "Sigmoid.forward")
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_sigmoid_symmetry_and_tiny_values(data, shape):
    x = data.draw(laid_out(shape, st.floats(-85.0, 85.0, width=32)))
    s, s_neg = Sigmoid()(Tensor(x)).data, Sigmoid()(Tensor(-x)).data
    np.testing.assert_allclose(s + s_neg, 1.0, atol=1e-6, err_msg="Sigmoid.forward: sigmoid(x) + sigmoid(-x) must be 1")
    assert np.all((s >= 0) & (s <= 1)), f"Sigmoid.forward returned values outside [0, 1]: {s[(s < 0) | (s > 1)][:5].tolist()}"
    # Relative precision on the negative side: no `1 - something` for x < 0.
    tiny = Sigmoid()(Tensor(np.array([-80.0, -50.0, -30.0], dtype=np.float32))).data
    np.testing.assert_allclose(tiny, np.exp([-80.0, -50.0, -30.0]), rtol=1e-5,
                               err_msg="Sigmoid.forward([-80, -50, -30]) must keep relative precision (about exp(x))")


@pytest.mark.exercise("2.3", "Tanh.forward")
def test_tanh_accurate_near_zero_and_saturated():
    small = np.array([1e-7, -1e-6, 1e-4, 3e-3], dtype=np.float32)
    got = Tanh()(Tensor(small)).data
    np.testing.assert_allclose(got, np.tanh(small.astype(np.float64)), rtol=1e-5, atol=0,
                               err_msg="Tanh.forward near 0: digits lost to cancellation (try np.tanh or np.expm1)")
    with no_float_warnings("Tanh.forward([-1e4, -100, 100, 1e4])"):
        big = Tanh()(Tensor([-1e4, -100.0, 100.0, 1e4])).data
    np.testing.assert_array_equal(big, [-1, -1, 1, 1], err_msg="Tanh.forward must saturate to exactly -1 and 1")


@pytest.mark.exercise("2.4", "GELU.forward")
def test_gelu_known_values_and_limits():
    x = np.array([-1e4, -10.0, -1.0, 0.0, 1.0, 10.0, 1e4], dtype=np.float32)
    with no_float_warnings("GELU.forward"):
        got = GELU()(Tensor(x)).data
    np.testing.assert_allclose(got, ref_gelu(x.astype(np.float64)), rtol=1e-5, atol=1e-6,
                               err_msg="GELU.forward must use the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))")
    # Known values of the tanh approximation (as PyTorch's gelu(approximate="tanh")).
    np.testing.assert_allclose(got[[2, 4]], [-0.15880801, 0.84119199], rtol=1e-5,
                               err_msg="GELU.forward([-1, 1])")


# ---------------------------------------------------------------------------------------------
# Exercises 2.5 and 2.6: the dim argument, probabilities, shift invariance, errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("2.5", "Softmax.forward")
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_softmax_is_a_distribution_along_dim(data, shape):
    x = data.draw(laid_out(shape, EXTREME), label="x")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    with no_float_warnings(f"Softmax(dim={dim}) on {layout(x)}"):
        p = Softmax(dim=dim)(Tensor(x)).data
    assert np.all((p >= 0) & (p <= 1)), f"Softmax(dim={dim}) returned values outside [0, 1]: {p[(p < 0) | (p > 1)][:5].tolist()}"
    np.testing.assert_allclose(p.sum(axis=dim), 1.0, atol=1e-5,
                               err_msg=f"Softmax(dim={dim}) on shape {x.shape}: sums along dim {dim} must be 1")
    # The largest logit gets the largest probability.
    at_argmax = np.take_along_axis(p, np.expand_dims(x.argmax(axis=dim), dim), axis=dim)
    np.testing.assert_array_equal(at_argmax, p.max(axis=dim, keepdims=True),
                                  err_msg=f"Softmax(dim={dim}): the largest logit must get the largest probability")


@pytest.mark.exercise("2.5", "Softmax.forward")
@PROPERTY
@given(data=st.data(), shape=shapes(), shift=st.integers(-50, 50))
def test_softmax_is_shift_invariant(data, shape, shift):
    x = data.draw(laid_out(shape, MODERATE), label="x")
    a = Softmax()(Tensor(x)).data
    b = Softmax()(Tensor(x + np.float32(shift))).data
    np.testing.assert_allclose(b, a, atol=1e-5, err_msg=f"Softmax.forward(x + {shift}) must equal Softmax.forward(x)")


@pytest.mark.exercise("2.6", "LogSoftmax.forward")
@PROPERTY
@given(data=st.data(), shape=shapes())
def test_log_softmax_agrees_with_softmax(data, shape):
    x = data.draw(laid_out(shape, MODERATE), label="x")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    lp = LogSoftmax(dim=dim)(Tensor(x)).data
    assert np.all(lp <= 1e-6), f"LogSoftmax(dim={dim}) returned positive values {lp[lp > 1e-6][:5].tolist()}; log-probabilities are <= 0"
    np.testing.assert_allclose(np.exp(lp.astype(np.float64)).sum(axis=dim), 1.0, atol=1e-5,
                               err_msg=f"LogSoftmax(dim={dim}): exp of the result must sum to 1 along dim")
    np.testing.assert_allclose(np.exp(lp), Softmax(dim=dim)(Tensor(x)).data, atol=1e-6,
                               err_msg=f"LogSoftmax(dim={dim}): exp(log_softmax(x)) must equal softmax(x)")


@pytest.mark.exercise("2.6", "LogSoftmax.forward")
def test_log_softmax_never_takes_log_of_zero():
    x = np.array([[0.0, -1e4, -50.0], [1e4, -1e4, 0.0]], dtype=np.float32)
    with no_float_warnings("LogSoftmax.forward"):
        got = LogSoftmax()(Tensor(x)).data
    expected = ref_log_softmax(x.astype(np.float64))
    assert np.all(np.isfinite(got)), f"LogSoftmax.forward({x.tolist()}) gave {got.tolist()}: -inf means log(0) was taken"
    np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg="LogSoftmax.forward with logits of magnitude 1e4")


@each(DIM_ACTIVATIONS)
@PROPERTY
@given(shape=shapes(), data=st.data())
def test_bad_dim_error_names_the_shape(act, shape, data):
    ndim = len(shape)
    dim = data.draw(st.one_of(st.integers(ndim, ndim + 3), st.integers(-ndim - 3, -ndim - 1)), label="dim")
    cls = act.function.split(".")[0]
    with pytest.raises(ValueError) as info:
        act.make(dim)(Tensor(np.zeros(shape, dtype=np.float32)))
    msg = str(info.value)
    for part in (str(tuple(shape)), str(dim)):
        assert part in msg, f"{cls}(dim={dim}) on shape {shape}: the ValueError must contain {part!r}; got: {msg!r}"


@each(DIM_ACTIVATIONS)
def test_default_dim_is_last(act):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    cls = act.function.split(".")[0]
    default = act.make()(Tensor(x)).data
    np.testing.assert_allclose(default, act.ref(x.astype(np.float64), -1), rtol=1e-5, atol=1e-6,
                               err_msg=f"{cls}() must normalise along the last dimension by default")
    np.testing.assert_allclose(act.make(0)(Tensor(x)).data, act.ref(x.astype(np.float64), 0), rtol=1e-5, atol=1e-6,
                               err_msg=f"{cls}(dim=0) must normalise along dimension 0")


# ---------------------------------------------------------------------------------------------
# The harness itself, and PyTorch when it happens to be installed
# ---------------------------------------------------------------------------------------------
def test_harness_catches_the_naive_formulas():
    "The stability checks above can fail: the textbook formulas trip them."
    x = np.array([[1e4, 0.0, -1e4]], dtype=np.float32)
    naive = {
        "softmax": (lambda: np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True), "overflow"),
        "sigmoid": (lambda: 1 / (1 + np.exp(-x)), "overflow"),
        "log(softmax)": (lambda: np.log(ref_softmax(x)), "divide by zero"),
    }
    for name, (formula, expected) in naive.items():
        with pytest.warns(RuntimeWarning) as record:
            formula()
        messages = [str(w.message) for w in record]
        assert any(expected in m for m in messages), f"naive {name}: warnings {messages}; expected {expected!r}"


@each(ACTIVATIONS)
def test_matches_torch_when_installed(act):
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(0).standard_normal((4, 3, 5)) * 5).astype(np.float32)
    tx = to_torch(x)
    reference = (act.torch(tx, dim=1) if act.has_dim else act.torch(tx)).numpy()
    got = act.make(1)(Tensor(x)).data
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=f"{act.function} differs from PyTorch")
