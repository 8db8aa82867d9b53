"""Checkpoint 08: can your framework train a classifier, stop, and resume exactly where it stopped?

Modules 01 to 08 together: Tensor ops and autograd (01, 06) through Linear, ReLU and Dropout (02,
03), cross-entropy (04), the bundled digits in a shuffled DataLoader (05), SGD with momentum from
module 07, and module 08's Trainer with a cosine schedule and gradient clipping. The model must
reach 95% test accuracy, and a run interrupted by a checkpoint (saved to disk, loaded into freshly
built objects) must end with exactly the weights of the uninterrupted run.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Dropout, Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.training import CosineAnnealingLR, Trainer, evaluate
from tinytorch.data.loader import DataLoader, TensorDataset, load_digits

pytestmark = pytest.mark.module("08")

EPOCHS = 8


def standardized():
    train, test = load_digits("train"), load_digits("test")
    x = train.tensors[0].data
    mean, std = x.mean(axis=0), x.std(axis=0) + 1.0
    prep = lambda ds: TensorDataset(((ds.tensors[0].data - mean) / std).astype(np.float32), ds.tensors[1].data)
    return prep(train), prep(test)


def build():
    optimizers = pytest.importorskip("tinytorch.core.optimizers", reason="module 07 (optimizers) is not in this edition")
    train, test = standardized()
    model = Sequential(Linear(64, 128, rng=0), ReLU(), Dropout(0.1, seed=1), Linear(128, 10, rng=2))
    opt = optimizers.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, CrossEntropyLoss(), opt, scheduler=CosineAnnealingLR(opt, T_max=EPOCHS),
                      max_grad_norm=5.0, progress=False)
    return trainer, DataLoader(train, batch_size=32, shuffle=True, seed=3), DataLoader(test, batch_size=120)


def test_trainer_reaches_95_percent_on_the_digits():
    trainer, train, test = build()
    history = trainer.fit(train, EPOCHS, val_loader=test)
    acc = evaluate(trainer.model, test, CrossEntropyLoss())["accuracy"]
    assert acc >= 0.95, f"test accuracy {acc:.1%} after {EPOCHS} epochs; expected at least 95%. History: {history}"
    assert history[-1]["lr"] < history[0]["lr"], "the cosine schedule must lower the learning rate"
    assert trainer.model.training, "evaluation must leave the model in training mode"


def test_interrupted_run_resumes_bit_identically(tmp_path):
    straight, train, _ = build()
    straight.fit(train, 4)
    first, train1, _ = build()
    first.fit(train1, 2)
    path = first.save_checkpoint(tmp_path / "run" / "epoch2.npz", train1)
    second, train2, _ = build()  # fresh objects, as in a new process
    second.load_checkpoint(path, train2)
    second.fit(train2, 2)
    assert [r["epoch"] for r in second.history] == [1, 2, 3, 4]
    for (name, a), b in zip(straight.model.named_parameters(), second.model.parameters()):
        assert np.array_equal(a.data, b.data), f"{name}: the resumed run differs from the uninterrupted one"
