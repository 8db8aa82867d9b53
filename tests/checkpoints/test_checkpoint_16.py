"""Checkpoint 16: can your package make a trained model smaller and keep what it learned?

Modules 01-07, 09 and 16 together: a 64-128-128-10 MLP trained on the bundled digits with Adam,
then compressed four ways, each fine-tuned briefly and evaluated on the test digits:

- global magnitude pruning to 80%, the masks applied after every step: the zeros must survive
  fine-tuning and the accuracy stay within 5 points of the dense model;
- structured pruning to half the hidden neurons: really smaller matrices, at least 90% accuracy;
- low rank 16 on every layer where it saves parameters: at least 90% accuracy;
- distillation into a 64-32-10 student from the teacher's outputs alone (no labels): at least 85%.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import Adam
from tinytorch.data.loader import DataLoader, TensorDataset, load_digits
from tinytorch.perf.compression import (
    distillation_loss, low_rank_model, model_cost, prune_magnitude, prune_mlp_neurons, storage_bytes,
)

pytestmark = pytest.mark.module("16")


def mlp(widths, seed=0):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(Linear(a, b, rng=seed + i))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Sequential(*layers)


@no_grad()
def accuracy(model, dataset) -> float:
    x, y = dataset.tensors
    return float((model(x).data.argmax(axis=1) == y.data).mean())


def fit(model, dataset, epochs, lr=3e-3, after_step=None, loss_of=None):
    opt, ce = Adam(model.parameters(), lr=lr), CrossEntropyLoss()
    for epoch in range(epochs):
        for batch in DataLoader(dataset, batch_size=64, shuffle=True, seed=epoch):
            loss = loss_of(model, batch) if loss_of else ce(model(batch[0]), batch[1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if after_step:
                after_step()
    return model


@pytest.fixture(scope="module")
def trained():
    train, test = load_digits("train"), load_digits("test")
    model = fit(mlp([64, 128, 128, 10]), train, epochs=6)
    return model, train, test, accuracy(model, test)


def test_the_dense_model_learns(trained):
    _, _, _, acc = trained
    assert acc >= 0.93, f"the 64-128-128-10 MLP reaches {acc:.1%} on the test digits after 6 epochs; expected at least 93%"


def test_magnitude_pruning_keeps_its_zeros_and_its_accuracy(trained):
    base, train, test, base_acc = trained
    model = copy.deepcopy(base)
    masks = prune_magnitude(model, 0.8)
    fit(model, train, epochs=2, lr=1e-3, after_step=masks.apply)
    acc = accuracy(model, test)
    assert masks.sparsity() >= 0.8 - 1e-6, f"after fine-tuning only {masks.sparsity():.1%} of the weights are zero; the masks must keep 80%"
    assert acc >= base_acc - 0.05, f"80% pruned and fine-tuned: {acc:.1%}; the dense model has {base_acc:.1%} (allowed: 5 points less)"
    assert storage_bytes(model, sparse=True) < 0.5 * storage_bytes(model), "in CSR the 80%-sparse model must take less than half the bytes"


def test_structured_pruning_really_shrinks_the_matrices(trained):
    base, train, test, _ = trained
    model = fit(prune_mlp_neurons(base, 0.5), train, epochs=2, lr=1e-3)
    shapes = [layer.weight.shape for layer in model.layers if isinstance(layer, Linear)]
    assert shapes == [(64, 64), (64, 64), (10, 64)], f"half the hidden neurons kept: weights {shapes}"
    assert model_cost(model)["flops"] < 0.4 * model_cost(base)["flops"]
    acc = accuracy(model, test)
    assert acc >= 0.9, f"structured pruning to half the neurons, fine-tuned: {acc:.1%}; expected at least 90%"


def test_low_rank_keeps_the_accuracy(trained):
    base, train, test, _ = trained
    model = fit(low_rank_model(base, rank=16), train, epochs=2, lr=1e-3)
    assert model.num_parameters() < 0.4 * base.num_parameters()
    acc = accuracy(model, test)
    assert acc >= 0.9, f"low rank 16, fine-tuned: {acc:.1%}; expected at least 90%"


def test_distillation_teaches_a_small_student_without_labels(trained):
    teacher, train, test, _ = trained
    x, y = train.tensors
    with no_grad():
        logits = teacher(x).data
    transfer = TensorDataset(x.data, logits, y.data)
    student = fit(mlp([64, 32, 10], seed=7), transfer, epochs=8,
                  loss_of=lambda m, b: distillation_loss(m(b[0]), b[1], b[2], temperature=4.0, alpha=0.0))
    acc = accuracy(student, test)
    assert acc >= 0.85, f"a 64-32-10 student distilled from the teacher's outputs alone: {acc:.1%}; expected at least 85%"
