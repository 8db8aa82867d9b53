"""Checkpoint 06: do your Tensor, activations, layers, losses, data loader and autograd train a model?

Modules 01-06 together, no optimizer yet (module 07): a small MLP (Linear, ReLU, Linear) on the
bundled digits, trained for a few epochs with plain SGD written by hand (`p.data -= lr * p.grad.data`
under `no_grad`), must drive the training loss down and classify held-out digits well above chance.
The gradients of a Linear / ReLU / CrossEntropy stack must equal PyTorch's (skipped without torch).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.support import GRAD_ATOL, GRAD_RTOL, assert_close, to_torch, torch_or_skip
from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, load_digits

pytestmark = pytest.mark.module("06")


def accuracy(model, ds) -> float:
    x, y = ds.tensors
    with no_grad():
        pred = model(x).data.argmax(axis=1)
    return float((pred == y.data).mean())


def test_hand_written_sgd_trains_an_mlp_on_the_digits():
    train, test = load_digits("train"), load_digits("test")
    model = Sequential(Linear(64, 32, rng=0), ReLU(), Linear(32, 10, rng=1))
    loss_fn = CrossEntropyLoss()
    loader = DataLoader(train, batch_size=32, shuffle=True, seed=0)
    lr, epoch_losses = 0.1, []
    for _ in range(5):
        total, n = 0.0, 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            model.zero_grad()
            loss.backward()
            with no_grad():
                for p in model.parameters():
                    p.data -= lr * p.grad.data
            total += loss.item() * len(y)
            n += len(y)
        epoch_losses.append(total / n)
    assert epoch_losses[-1] < 0.5 * epoch_losses[0], (
        f"training loss per epoch {[round(v, 3) for v in epoch_losses]}: expected the last epoch below half the first")
    assert all(np.isfinite(epoch_losses)), f"training produced a non-finite loss: {epoch_losses}"
    acc = accuracy(model, test)
    assert acc > 0.85, f"held-out accuracy {acc:.3f} after 5 epochs of SGD; expected > 0.85 (chance is 0.1)"


def test_linear_relu_cross_entropy_gradients_match_torch():
    torch = torch_or_skip()
    x, y = load_digits("test").tensors
    x, y = x[:48], y[:48]
    model = Sequential(Linear(64, 20, rng=3), ReLU(), Linear(20, 10, rng=4))
    loss = CrossEntropyLoss()(model(x), y)
    loss.backward()
    w1, b1, w2, b2 = (to_torch(p, requires_grad=True) for p in model.parameters())
    F = torch.nn.functional
    tloss = F.cross_entropy(F.linear(F.linear(to_torch(x), w1, b1).relu(), w2, b2), to_torch(y))
    tloss.backward()
    assert_close(loss, tloss, op="checkpoint 06", what="loss", rtol=GRAD_RTOL, atol=GRAD_ATOL, reference="torch")
    for (name, p), tp in zip(model.named_parameters(), (w1, b1, w2, b2)):
        assert_close(p.grad, tp.grad, op="checkpoint 06", what=f"gradient of {name}", rtol=GRAD_RTOL, atol=GRAD_ATOL,
                     reference="torch.autograd")
