"""Checkpoint 15: can your package train in mixed precision and ship the model in 8 bits?

Modules 01-09 and 15 together: the bundled digits (05) through an MLP (02, 03) trained with
cross-entropy (04), backward (06) and SGD with momentum (07), three ways: float32, BF16 autocast
and FP16 autocast with a GradScaler (15). All must learn the digits, the low-precision runs within
a few points of float32. The float32 model is then quantized after training with calibration data
(`quantize_model`): at least 3.5x fewer bytes of weights for at most 2 points of accuracy. Where
PyTorch is installed, the BF16 rounding and the INT8 integers equal PyTorch's.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.data.loader import DataLoader, load_digits
from tinytorch.perf.quantization import (
    GradScaler, QuantizedLinear, autocast, model_nbytes, quantize, quantize_model, to_bfloat16,
)

pytestmark = pytest.mark.module("15")


def make_mlp():
    rng = np.random.default_rng(0)
    return Sequential(Linear(64, 64, rng=rng), ReLU(), Linear(64, 10, rng=rng))


@no_grad()
def accuracy(model, dataset) -> float:
    x, y = dataset.tensors
    return float((model(x).data.argmax(axis=1) == y.data).mean())


def train(precision=None, scaler=None, epochs=4):
    data = load_digits("train")
    model = make_mlp()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        for x, y in DataLoader(data, batch_size=32, shuffle=True, seed=epoch):
            opt.zero_grad()
            with autocast(precision) if precision else contextlib.nullcontext():
                loss = CrossEntropyLoss()(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
    for p in model.parameters():
        assert p.data.dtype == np.float32, "master weights must stay float32"
    return model


def test_mixed_precision_training_and_int8_deployment():
    test = load_digits("test")
    fp32 = train()
    bf16 = train("bfloat16")
    scaler = GradScaler(init_scale=2.0 ** 16, growth_interval=20)
    fp16 = train("float16", scaler)
    acc = {"float32": accuracy(fp32, test), "bfloat16": accuracy(bf16, test), "float16": accuracy(fp16, test)}
    assert acc["float32"] >= 0.93, f"float32 MLP: test accuracy {acc['float32']:.3f}; expected at least 0.93"
    for name in ("bfloat16", "float16"):
        assert acc[name] >= acc["float32"] - 0.03, f"{name} autocast accuracy {acc[name]:.3f} vs float32 {acc['float32']:.3f}"
    assert scaler.get_scale() > 2.0 ** 16, f"no overflow in this run: the scale should have grown; got {scaler.get_scale()}"

    calibration = DataLoader(load_digits("train"), batch_size=128, shuffle=True, seed=3)
    int8 = quantize_model(fp32, calibration)
    assert all(isinstance(m, (QuantizedLinear, ReLU)) for m in int8.layers), f"every Linear is quantized: {int8}"
    int8_acc = accuracy(int8, test)
    assert int8_acc >= acc["float32"] - 0.02, f"int8 accuracy {int8_acc:.3f} vs float32 {acc['float32']:.3f}: more than 2 points lost"
    ratio = model_nbytes(fp32) / model_nbytes(int8)
    assert ratio >= 3.5, f"int8 model is only {ratio:.2f}x smaller than float32; expected at least 3.5x"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bfloat16_and_int8_equal_torch():
    torch = pytest.importorskip("torch")
    bits = np.random.default_rng(0).integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    ref = torch.from_numpy(x.copy()).to(torch.bfloat16).float().numpy()
    assert np.array_equal(to_bfloat16(x).view(np.uint32), ref.view(np.uint32)), "to_bfloat16 differs from torch's bfloat16"
    w = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    q = torch.quantize_per_tensor(torch.from_numpy(w), 0.03, 5, torch.qint8).int_repr().numpy()
    assert np.array_equal(quantize(w, 0.03, 5, "int8"), q), "quantize differs from torch.quantize_per_tensor"
