"""Checkpoint 02: can your Tensor and activations run a classifier's forward pass?

A two-layer network is written by hand from Module 01's `Tensor` (matmul, broadcasting bias) and
Module 02's activations: hidden units through ReLU, GELU or Tanh, class probabilities through
Softmax, log-probabilities through LogSoftmax, a negative log-likelihood picked out with integer
labels. Every step is recomputed in NumPy (float64) and compared. The same network then runs with
weights a thousand times too large (logits of magnitude ~1e4) and must still give valid
probabilities without a single floating-point warning.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tinytorch.core.activations import GELU, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("02")

RTOL, ATOL = 1e-4, 1e-5
N, D, H, C = 64, 10, 32, 5


def close(got, expected, step: str, rtol=RTOL, atol=ATOL):
    assert isinstance(got, Tensor), f"{step}: got a {type(got).__name__}; expected a Tensor"
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{step}: shape {got.shape}; expected {expected.shape}"
    assert got.dtype == np.float32, f"{step}: dtype {got.dtype}; expected float32"
    np.testing.assert_allclose(got.data, expected, rtol=rtol, atol=atol, err_msg=f"{step}: values differ from NumPy")


def make_problem(scale: float = 1.0):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, D)).astype(np.float32)
    w1 = (rng.standard_normal((D, H)) * math.sqrt(2 / D) * scale).astype(np.float32)
    b1 = (rng.standard_normal(H) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((H, C)) * math.sqrt(1 / H) * scale).astype(np.float32)
    b2 = (rng.standard_normal(C) * 0.1).astype(np.float32)
    labels = rng.integers(0, C, size=N)
    return x, w1, b1, w2, b2, labels


HIDDEN = {
    "ReLU": (ReLU, lambda h: np.maximum(h, 0)),
    "GELU": (GELU, lambda h: 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))),
    "Tanh": (Tanh, np.tanh),
}


@pytest.mark.parametrize("hidden", list(HIDDEN))
def test_softmax_classifier_forward_pass(hidden):
    make_act, ref_act = HIDDEN[hidden]
    x, w1, b1, w2, b2, labels = make_problem()
    r = {k: v.astype(np.float64) for k, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2).items()}

    # 1. Hidden layer: (N, D) @ (D, H) + (H,), then the nonlinearity.
    h = make_act()(Tensor(x) @ Tensor(w1) + Tensor(b1))
    ref_h = ref_act(r["x"] @ r["w1"] + r["b1"])
    close(h, ref_h, f"{hidden}(x @ W1 + b1)")

    # 2. Output layer and class probabilities.
    logits = h @ Tensor(w2) + Tensor(b2)
    ref_logits = ref_h @ r["w2"] + r["b2"]
    close(logits, ref_logits, "logits = h @ W2 + b2")
    probs = Softmax()(logits)
    ref_e = np.exp(ref_logits - ref_logits.max(axis=1, keepdims=True))
    ref_probs = ref_e / ref_e.sum(axis=1, keepdims=True)
    close(probs, ref_probs, "Softmax()(logits)")
    assert np.all((probs.data >= 0) & (probs.data <= 1)), "probabilities must lie in [0, 1]"
    close(probs.sum(axis=1), np.ones(N), "probabilities sum to 1 per example")
    np.testing.assert_array_equal(probs.data.argmax(axis=1), logits.data.argmax(axis=1),
                                  err_msg="softmax must not change which class scores highest")

    # 3. Log-probabilities and the negative log-likelihood of the labels (integer indexing).
    log_probs = LogSoftmax()(logits)
    close(log_probs, np.log(ref_probs), "LogSoftmax()(logits)")
    picked = log_probs[np.arange(N), Tensor(labels)]
    nll = -picked.mean()
    ref_nll = -np.log(ref_probs[np.arange(N), labels]).mean()
    assert nll.shape == () and nll.item() > 0, f"the NLL must be a positive scalar; got {nll!r}"
    np.testing.assert_allclose(nll.item(), ref_nll, rtol=RTOL, err_msg="negative log-likelihood of the labels")
    np.testing.assert_allclose(nll.item(), math.log(C), rtol=0.5,
                               err_msg=f"an untrained {C}-class network should score near log({C}) = {math.log(C):.3f}")


def test_huge_logits_still_give_valid_probabilities():
    x, w1, b1, w2, b2, labels = make_problem(scale=1e3)  # logits of magnitude ~1e4 and beyond
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(over="warn", invalid="warn", divide="warn", under="ignore"):
            logits = ReLU()(Tensor(x) @ Tensor(w1) + Tensor(b1)) @ Tensor(w2) + Tensor(b2)
            try:
                probs = Softmax()(logits)
                log_probs = LogSoftmax()(logits)
                gates = Sigmoid()(logits)
            except RuntimeWarning as w:
                pytest.fail(f"the forward pass with logits up to {np.abs(logits.data).max():.3g} warned: {w}; "
                            "Softmax, LogSoftmax and Sigmoid must be stable")
    big = float(np.abs(logits.data).max())
    assert big > 1e3, f"the test needs large logits; the largest is only {big:.3g}"
    for name, t in (("Softmax", probs), ("LogSoftmax", log_probs), ("Sigmoid", gates)):
        assert np.all(np.isfinite(t.data)), f"{name} of logits up to {big:.3g} gave NaN or inf"
    close(probs.sum(axis=1), np.ones(N), "probabilities of huge logits sum to 1 per example")
    ref = logits.data.astype(np.float64)
    ref_log_probs = ref - ref.max(axis=1, keepdims=True)
    ref_log_probs -= np.log(np.exp(ref_log_probs).sum(axis=1, keepdims=True))
    close(log_probs, ref_log_probs, "LogSoftmax of huge logits", rtol=1e-5, atol=1e-2)
    assert np.all(log_probs.data <= 0), "log-probabilities must be <= 0"


def test_activations_compose_with_tensor_arithmetic():
    z = Tensor(np.linspace(-6, 6, 25, dtype=np.float32).reshape(5, 5))
    sigmoid, tanh = Sigmoid(), Tanh()
    close(sigmoid(z) + sigmoid(-z), np.ones((5, 5)), "sigmoid(z) + sigmoid(-z)", atol=1e-6)
    close(sigmoid(z * 2) * 2 - 1, np.tanh(z.data.astype(np.float64)), "2 sigmoid(2z) - 1 = tanh(z)", atol=1e-6)
    close(tanh(z.T), np.tanh(z.data.T.astype(np.float64)), "tanh of a transposed (non-contiguous) view", atol=1e-6)
    # ReLU(z) - ReLU(-z) = z, and softmax over a batch of columns via dim=0 equals softmax of the transpose.
    close(ReLU()(z) - ReLU()(-z), z.data, "ReLU(z) - ReLU(-z)", atol=0)
    close(Softmax(dim=0)(z), Softmax(dim=-1)(z.T).data.T, "Softmax(dim=0)(z) = Softmax(dim=-1)(z.T).T", atol=1e-6)
