"""Checkpoint 04: can your Tensor, activations and losses score a classifier?

A linear classifier is built from Tensor matmul on random data (no Linear layer: this checkpoint
needs modules 01, 02 and 04 only). At a small random initialisation its cross-entropy must be close
to log(C), the loss of a uniform guess; the same loss must equal the mean of -LogSoftmax picked at
the labels (module 02) and stay finite when the logits are scaled to 1e4. A perfect regression
prediction must have an MSE of exactly 0, and a sigmoid output scored with binary cross-entropy
must match a float64 reference. Every step is recomputed in NumPy and compared.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tinytorch.core.losses import BinaryCrossEntropyLoss, CrossEntropyLoss, MSELoss
from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("04")


def ref_cross_entropy(logits, labels):
    z = np.asarray(logits, dtype=np.float64)
    s = z - z.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(s).sum(axis=1)) - s[np.arange(len(labels)), labels]))


def linear_classifier(n=128, d=20, c=10, weight_scale=0.01, seed=0):
    "Random data, integer labels and the logits x @ W.T + b of a linear classifier with small weights."
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((n, d)))
    w = Tensor(rng.standard_normal((c, d)) * weight_scale)  # (out, in), as Linear stores it
    b = Tensor(np.zeros(c))
    y = Tensor(rng.integers(0, c, n))
    return x, w, b, y, x @ w.T + b


def test_untrained_linear_classifier_loss_is_about_log_c():
    n, c = 128, 10
    x, w, b, y, logits = linear_classifier(n=n, c=c)
    assert logits.shape == (n, c) and logits.dtype == np.float32, (
        f"x @ W.T + b gave shape {logits.shape}, dtype {logits.dtype}; expected ({n}, {c}), float32")
    assert y.dtype.kind == "i", f"labels have dtype {y.dtype}; expected integers"
    loss = CrossEntropyLoss()(logits, y)
    assert isinstance(loss, Tensor) and loss.shape == (), f"CrossEntropyLoss returned {loss!r}; expected a 0-d Tensor"
    assert abs(loss.item() - math.log(c)) < 0.05, (
        f"small random weights give near-uniform predictions, so the loss should be close to log({c}) = "
        f"{math.log(c):.4f}; got {loss.item():.4f}")
    np.testing.assert_allclose(loss.item(), ref_cross_entropy(logits.data, y.data), rtol=1e-5,
                               err_msg="CrossEntropyLoss of the classifier's logits vs a float64 reference")


def test_cross_entropy_agrees_with_log_softmax_and_softmax():
    from tinytorch.core.activations import LogSoftmax, Softmax

    x, w, b, y, _ = linear_classifier(weight_scale=1.0, seed=1)
    logits = x @ w.T + b
    n = logits.shape[0]
    picked = LogSoftmax(dim=-1)(logits)[np.arange(n), y]
    via_log_softmax = -picked.mean().item()
    loss = CrossEntropyLoss()(logits, y).item()
    np.testing.assert_allclose(loss, via_log_softmax, rtol=1e-5,
                               err_msg="CrossEntropyLoss must equal -mean(LogSoftmax(logits)[i, y_i])")
    probs = Softmax(dim=-1)(logits)
    predicted = probs.data.argmax(axis=1)
    assert np.array_equal(predicted, logits.data.argmax(axis=1)), "Softmax must not change which class is largest"
    accuracy = float(np.mean(predicted == y.data))
    assert 0.0 <= accuracy <= 1.0


def test_cross_entropy_survives_huge_logits():
    _, _, _, y, logits = linear_classifier(weight_scale=1.0, seed=2)
    huge = logits * (1e4 / float(np.abs(logits.data).max()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = CrossEntropyLoss()(huge, y)
    assert np.isfinite(loss.item()), f"logits scaled to 1e4 gave a non-finite loss {loss.item()}"
    np.testing.assert_allclose(loss.item(), ref_cross_entropy(huge.data, y.data), rtol=1e-5,
                               err_msg="CrossEntropyLoss at logit magnitude 1e4 vs a float64 reference")


def test_mse_of_a_perfect_regression_is_zero():
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((64, 5)))
    w = Tensor(rng.standard_normal((1, 5)))
    pred = x @ w.T                              # (64, 1)
    target = Tensor(pred.data.copy())
    mse = MSELoss()
    assert mse(pred, target).item() == 0.0, "MSE of a prediction equal to its target must be exactly 0"
    noisy = target + 0.1
    np.testing.assert_allclose(mse(pred, noisy).item(), 0.01, rtol=1e-4, err_msg="MSE of an offset of 0.1 is 0.01")
    with pytest.raises(ValueError):
        mse(pred, target.reshape(-1))           # (64, 1) vs (64,): must not broadcast to (64, 64)


def test_sigmoid_then_binary_cross_entropy():
    from tinytorch.core.activations import ReLU, Sigmoid

    rng = np.random.default_rng(4)
    x = Tensor(rng.standard_normal((32, 6)))
    w1 = Tensor(rng.standard_normal((8, 6)) * 0.5)
    w2 = Tensor(rng.standard_normal((1, 8)) * 0.5)
    hidden = ReLU()(x @ w1.T)
    p = Sigmoid()(hidden @ w2.T)
    t = Tensor((rng.random((32, 1)) < 0.5).astype(np.float32))
    loss = BinaryCrossEntropyLoss()(p, t)
    p64 = np.clip(p.data.astype(np.float64), 1e-7, 1 - 1e-7)
    t64 = t.data.astype(np.float64)
    expected = -np.mean(t64 * np.log(p64) + (1 - t64) * np.log(1 - p64))
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-5, err_msg="BCE of a two-layer sigmoid network's outputs")
    with pytest.raises(ValueError):
        BinaryCrossEntropyLoss()(hidden @ w2.T, t)  # logits, not probabilities
