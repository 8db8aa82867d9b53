"""Checkpoint 07: can your framework train a network, end to end?

Everything from module 01 to 07 works together here: Tensors (01) through Linear layers (03) and
activations (02), a loss (04) on batches from the DataLoader (05), gradients from backward (06),
and the optimizers (07) that turn them into progress. A two-layer network must solve XOR (which
no single layer can), an MLP must learn the bundled digits, a frozen layer must stay frozen, and a
run interrupted, saved to disk and resumed must end exactly where the uninterrupted run does.
"""
from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np
import pytest

from tinytorch.core.activations import ReLU, Tanh
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import BinaryCrossEntropyLoss, CrossEntropyLoss
from tinytorch.core.optimizers import SGD, Adam, AdamW
from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, load_digits

pytestmark = pytest.mark.module("07")


def digits_mlp(seed=0):
    return Sequential(Linear(64, 64, rng=seed), ReLU(), Linear(64, 10, rng=seed + 1))


def train_epochs(model, opt, data, epochs, first_epoch=0, batch_size=64):
    "Mini-batch training; epoch e shuffles with seed e, so a resumed run sees the same batches."
    loss_fn, losses = CrossEntropyLoss(), []
    for epoch in range(first_epoch, first_epoch + epochs):
        total, n = 0.0, 0
        for x, y in DataLoader(data, batch_size=batch_size, shuffle=True, seed=epoch):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        losses.append(total / n)
    return losses


def accuracy(model, data):
    x, y = data.tensors
    return float((model(x).data.argmax(axis=1) == y.data).mean())


def test_a_hidden_layer_solves_xor():
    x = Tensor(np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=np.float32))
    t = Tensor(np.array([[0], [1], [1], [0]], dtype=np.float32))
    net = Sequential(Linear(2, 8, init="xavier", rng=3), Tanh(), Linear(8, 1, init="xavier", rng=4))
    opt = SGD(net.parameters(), lr=0.5, momentum=0.9)
    loss_fn = BinaryCrossEntropyLoss()
    for _ in range(300):
        opt.zero_grad()
        p = 1 / (1 + (-net(x)).exp())
        loss = loss_fn(p, t)
        loss.backward()
        opt.step()
    predictions = (net(x).data > 0).astype(np.float32)
    assert np.array_equal(predictions, t.data), (
        f"after 300 SGD-momentum steps a 2-8-1 tanh network should classify XOR perfectly; "
        f"predicted {predictions.ravel()} for targets {t.data.ravel()} (loss {loss.item():.3f})")


@pytest.mark.parametrize("make", [lambda ps: Adam(ps, lr=3e-3), lambda ps: AdamW(ps, lr=3e-3, weight_decay=0.01),
                                  lambda ps: SGD(ps, lr=0.05, momentum=0.9)], ids=["Adam", "AdamW", "SGD-momentum"])
def test_an_mlp_learns_the_digits(make):
    train, test = load_digits("train"), load_digits("test")
    model = digits_mlp()
    before = accuracy(model, test)
    losses = train_epochs(model, make(model.parameters()), train, epochs=5)
    after = accuracy(model, test)
    assert losses[-1] < 0.5 * losses[0], f"the training loss should at least halve in 5 epochs; per epoch {losses}"
    assert after >= 0.9, f"test accuracy after 5 epochs should reach 90%; it went from {before:.1%} to {after:.1%}"


def test_parameters_left_out_of_the_optimizer_stay_frozen():
    train = load_digits("train")
    model = digits_mlp(seed=5)
    frozen = [p.data.copy() for p in model.layers[0].parameters()]
    head = [p.data.copy() for p in model.layers[2].parameters()]
    opt = Adam(model.layers[2].parameters(), lr=3e-3)
    train_epochs(model, opt, train, epochs=1)
    for p, before in zip(model.layers[0].parameters(), frozen):
        np.testing.assert_array_equal(p.data, before, err_msg="the first layer is not in the optimizer: it must not change")
        assert p.grad is not None, "backward still computes the frozen layer's gradient; only the optimizer skips it"
    assert all(not np.array_equal(p.data, b) for p, b in zip(model.layers[2].parameters(), head)), "the head must train"
    assert set(opt.state) == {0, 1}, f"state only for the optimizer's own parameters; got {sorted(opt.state)}"


def save_checkpoint(path, model, opt):
    """Weights and optimizer state to one .npz (arrays) with a JSON header (everything else), atomically."""
    sd = opt.state_dict()
    arrays = {f"param_{i}": p.data for i, p in enumerate(model.parameters())}
    numbers = {}
    for i, entry in sd["state"].items():
        for key, item in entry.items():
            if isinstance(item, np.ndarray):
                arrays[f"state_{i}_{key}"] = item
            else:
                numbers[f"{i}/{key}"] = item
    header = {"optimizer": sd["optimizer"], "hyperparameters": sd["hyperparameters"], "numbers": numbers,
              "positions": sorted(sd["state"])}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with open(fd, "wb", closefd=True) as out:
        np.savez(out, **arrays)
    os.replace(tmp, path)


def load_checkpoint(path, model, opt):
    with np.load(path) as f:
        header = json.loads(f["header"].tobytes().decode())
        for i, p in enumerate(model.parameters()):
            p.data[...] = f[f"param_{i}"]
        state = {}
        for i in header["positions"]:
            entry = {name: f[f"state_{i}_{name}"] for name in opt.state_arrays}
            entry.update({name: header["numbers"][f"{i}/{name}"] for name in opt.state_numbers})
            state[i] = entry
    opt.load_state_dict({"optimizer": header["optimizer"], "hyperparameters": header["hyperparameters"],
                         "state": state})


@pytest.mark.parametrize("make", [lambda ps: Adam(ps, lr=3e-3), lambda ps: SGD(ps, lr=0.05, momentum=0.9)],
                         ids=["Adam", "SGD-momentum"])
def test_a_run_saved_to_disk_and_resumed_ends_where_the_uninterrupted_run_does(make, tmp_path):
    train = load_digits("train")
    straight = digits_mlp()
    train_epochs(straight, make(straight.parameters()), train, epochs=2)

    first = digits_mlp()
    opt = make(first.parameters())
    train_epochs(first, opt, train, epochs=1)
    path = tmp_path / "run.npz"
    save_checkpoint(path, first, opt)

    resumed = digits_mlp(seed=42)  # different initial weights: the checkpoint must overwrite them
    opt2 = make(resumed.parameters())
    load_checkpoint(path, resumed, opt2)
    train_epochs(resumed, opt2, train, epochs=1, first_epoch=1)
    for k, (p, q) in enumerate(zip(resumed.parameters(), straight.parameters())):
        np.testing.assert_array_equal(p.data, q.data, err_msg=f"parameter {k}: 1 epoch + resume + 1 epoch must equal 2 epochs")

    restarted = digits_mlp(seed=42)
    opt3 = make(restarted.parameters())
    for p, q in zip(restarted.parameters(), first.parameters()):
        p.data[...] = q.data
    train_epochs(restarted, opt3, train, epochs=1, first_epoch=1)
    gap = max(float(np.abs(p.data - q.data).max()) for p, q in zip(restarted.parameters(), straight.parameters()))
    assert gap > 1e-4, f"without the optimizer state the run should diverge from the uninterrupted one; max gap {gap:.2e}"
    assert math.isfinite(gap)
