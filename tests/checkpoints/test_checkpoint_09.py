"""Checkpoint 09: can your package train a convolutional network?

Modules 01-09 together: the bundled digits as (N, 1, 8, 8) images from the DataLoader (05), a CNN
built from Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d and Flatten (09) with ReLU (02) and Linear
(03), cross-entropy (04), backward (06) and a plain SGD step written inline. It must learn the
digits to a stated accuracy, and the whole network's loss and every parameter gradient must equal
PyTorch's for the same weights and batch (when PyTorch is installed).
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.spatial import AvgPool2d, BatchNorm2d, Conv2d, Flatten, MaxPool2d
from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, load_digits

pytestmark = pytest.mark.module("09")


def make_cnn(seed=0):
    # (N, 1, 8, 8) -> conv 8x8 -> pool 4x4 -> conv 4x4 -> avg-pool 2x2 -> 16 * 2 * 2 features -> 10 classes
    return Sequential(
        Conv2d(1, 8, 3, padding=1, rng=seed), BatchNorm2d(8), ReLU(), MaxPool2d(2),
        Conv2d(8, 16, 3, padding=1, rng=seed + 1), ReLU(), AvgPool2d(2),
        Flatten(), Linear(16 * 2 * 2, 10, rng=seed + 2),
    )


@no_grad()
def accuracy(model, dataset) -> float:
    model.eval()
    x, y = dataset.tensors
    predicted = model(x).data.argmax(axis=1)
    model.train()
    return float((predicted == y.data).mean())


def test_a_cnn_learns_the_digits():
    train, test = load_digits("train", flatten=False), load_digits("test", flatten=False)
    model, loss_fn, lr = make_cnn(), CrossEntropyLoss(), 0.1
    before = accuracy(model, test)
    first_epoch_loss = last_epoch_loss = None
    for epoch in range(4):
        losses = []
        for x, y in DataLoader(train, batch_size=16, shuffle=True, seed=epoch):
            loss = loss_fn(model(x), y)
            model.zero_grad()
            loss.backward()
            with no_grad():
                for p in model.parameters():
                    p.data -= lr * p.grad.data
            losses.append(loss.item())
        first_epoch_loss = first_epoch_loss or float(np.mean(losses))
        last_epoch_loss = float(np.mean(losses))
    after = accuracy(model, test)
    assert last_epoch_loss < 0.5 * first_epoch_loss, \
        f"mean training loss went from {first_epoch_loss:.3f} (epoch 1) to {last_epoch_loss:.3f} (epoch 4): it should halve"
    assert after >= 0.9, f"test accuracy after 4 epochs is {after:.3f} (before training {before:.3f}); expected at least 0.9"
    bn = model.layers[1]
    assert not np.allclose(bn.running_mean.data, 0), "training must have updated BatchNorm2d's running statistics"


def test_whole_cnn_gradients_equal_torch():
    torch = pytest.importorskip("torch")
    model = make_cnn(seed=3)
    ref = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 2 * 2, 10),
    )
    ours = dict(model.named_parameters())
    theirs = dict(ref.named_parameters())
    # ours: "layers.0.weight", torch: "0.weight": the same names once the list prefix is dropped
    assert [n.removeprefix("layers.") for n in ours] == list(theirs), f"parameter names {list(ours)} vs torch {list(theirs)}"
    with torch.no_grad():   # same weights, matched in order (names differ only by the list prefix)
        for (name, p), (tname, tp) in zip(ours.items(), theirs.items()):
            assert p.shape == tuple(tp.shape), f"{name} has shape {p.shape}; torch's {tname} has {tuple(tp.shape)}"
            tp.copy_(torch.from_numpy(p.data))
    x, y = next(iter(DataLoader(load_digits("train", flatten=False), batch_size=64, shuffle=True, seed=0)))
    loss = CrossEntropyLoss()(model(x), y)
    loss.backward()
    tloss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x.data.copy())), torch.from_numpy(y.data.copy()))
    tloss.backward()
    assert abs(loss.item() - tloss.item()) < 1e-4, f"loss {loss.item():.6f}; torch gives {tloss.item():.6f}"
    for (name, p), (tname, tp) in zip(ours.items(), theirs.items()):
        np.testing.assert_allclose(p.grad.data, tp.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=f"gradient of {name} (torch: {tname})")
    np.testing.assert_allclose(model.layers[1].running_mean.data, ref[1].running_mean.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg="BatchNorm2d running_mean after one training batch")
    np.testing.assert_allclose(model.layers[1].running_var.data, ref[1].running_var.numpy(), rtol=1e-5,
                               err_msg="BatchNorm2d running_var after one training batch")
