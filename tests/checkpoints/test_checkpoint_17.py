"""Checkpoint 17: can your package compile the inference of the models it trained?

Modules 01-13 and 17 together: an MLP trained on the bundled digits (01-08) is compiled for
inference (17) and gives the same predictions as eager; the GPT of module 13 has each block's MLP
(Linear-GELU-Linear) compiled into matmuls around one fused C (or chunked NumPy) kernel, equal to
eager within float32 tolerance; compiling the whole GPT forward, whose attention uses ops the
compiler has no compiled form for, runs eagerly and says which op.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, load_digits
from tinytorch.models.gpt import GPT
from tinytorch.perf.compiler import compile as tt_compile

pytestmark = pytest.mark.module("17")


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(tmp_path / "kernels"))


def test_a_trained_mlp_compiled_predicts_like_eager():
    data = load_digits("train")
    model = Sequential(Linear(64, 64, rng=0), ReLU(), Linear(64, 10, rng=1))
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        for x, y in DataLoader(data, batch_size=32, shuffle=True, seed=epoch):
            opt.zero_grad()
            CrossEntropyLoss()(model(x), y).backward()
            opt.step()
    model.eval()
    x_test, y_test = load_digits("test").tensors
    with no_grad():
        eager = model(x_test).data
        compiled = tt_compile(model)
        got = compiled(x_test).data
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)
    assert (got.argmax(axis=1) == eager.argmax(axis=1)).all(), "compiled and eager predictions differ"
    assert (got.argmax(axis=1) == y_test.data).mean() >= 0.9, "the trained MLP should classify the digits"


def test_gpt_mlp_blocks_compile_and_the_whole_forward_falls_back_by_name():
    model = GPT(vocab_size=37, context_length=16, embed_dim=32, num_heads=4, num_layers=2, rng=0).eval()
    h = Tensor(np.random.default_rng(1).standard_normal((2, 16, 32)).astype(np.float32))
    with no_grad():
        for block in model.blocks:
            mlp = tt_compile(block.mlp)
            np.testing.assert_allclose(mlp(h).data, block.mlp(h).data, rtol=1e-4, atol=1e-5)
            ops = [n.op for n in mlp.graph(h).nodes]
            assert ops.count("matmul") == 2 and "fused" in ops, f"compiled MLP block: {ops}"
        idx = np.random.default_rng(2).integers(0, 37, (2, 16))
        whole = tt_compile(lambda i: model(i))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logits = whole(Tensor(idx))
        np.testing.assert_allclose(logits.data, model(idx).data, rtol=1e-5, atol=1e-5)
    messages = [str(w.message) for w in caught]
    assert any("has no compiled form" in m for m in messages), f"expected a fallback warning naming the op; got {messages}"
