"""Checkpoint 14: can you measure where a training step's time, FLOPs and memory go?

Modules 01-14 together: a small GPT (11-13) trained with SGD (07) for a few steps on the bundled
story corpus (05), then one training step profiled with your `Profiler`: every op of the forward
pass charged to the module it ran in, the backward pass and the optimizer step as spans, the
forward's matmul FLOPs equal to `count_flops` and to the closed form of the architecture, a Chrome
trace that loads, the activation memory of the graph within a few percent of `tracemalloc`, and
the roofline and Amdahl's law applied to the measured profile. The CNN of module 09 gets the same
FLOP check.
"""
from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.core.spatial import BatchNorm2d, Conv2d, Flatten, MaxPool2d
from tinytorch.data.loader import load_digits, load_text_corpus
from tinytorch.models.gpt import GPT
from tinytorch.perf.profiler import (
    Profiler, amdahl, count_flops, count_parameters, graph_memory, latency, parameter_bytes, record_function,
    roofline, summarize,
)

pytestmark = pytest.mark.module("14")


def test_profile_a_gpt_training_step(tmp_path):
    text = load_text_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text[:20_000]], dtype=np.int64)
    V, T, E, H, L, B = len(chars), 16, 32, 4, 2, 8
    model = GPT(V, T, E, H, L, rng=0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)

    def step():
        starts = rng.integers(0, len(data) - T - 1, B)
        x = np.stack([data[s:s + T] for s in starts])
        y = np.stack([data[s + 1:s + T + 1] for s in starts])
        loss = CrossEntropyLoss()(model(x).reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer.step"):
            opt.step()
        return x, loss.item()

    losses = [step()[1] for _ in range(30)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), f"the GPT should learn: loss {losses[0]:.2f} -> {losses[-1]:.2f}"

    with Profiler(model) as prof:
        x, _ = step()
    forward = [e for e in prof.events if e.kind == "op"]
    closed = L * 2 * B * T * (12 * E * E + 2 * T * E) + 2 * B * T * E * V
    profiled = sum(e.flops for e in forward)
    assert profiled == count_flops(model, x).matmul == closed, \
        f"matmul FLOPs of the step's forward: profiler {profiled:,}, count_flops {count_flops(model, x).matmul:,}, closed form {closed:,}"
    assert prof.total_flops() == 3 * closed, "backward: two matmuls of the same size per forward matmul"
    assert {"backward", "optimizer.step"} <= {e.name for e in prof.events if e.kind == "span"}
    assert "MatmulBackward" in {e.name for e in prof.events if e.kind == "backward"}
    modules = {e.module for e in forward}
    assert {"blocks.0.attn.q_proj", "blocks.1.mlp.fc", "head", "tok_emb"} <= modules, sorted(modules)
    rows = summarize(prof.events, group_by="module", sort_by="flops")
    assert rows[0]["key"].endswith(("mlp.fc", "mlp.proj")), f"the MLP layers hold the most FLOPs at E={E}, T={T}: {rows[0]}"
    assert "matmul" in prof.table() and "blocks.0.attn" in prof.table(group_by="module")

    with open(prof.export_chrome_trace(tmp_path / "gpt.json")) as f:
        trace = json.load(f)["traceEvents"]
    assert sum(e.get("cat") == "op" for e in trace) == len(forward)

    step_ns = sum(e.dur_ns for e in prof.events)
    backward = sum(e.dur_ns for e in prof.events if e.kind != "op")
    assert 0 < backward < step_ns
    bound = amdahl(backward / step_ns, math.inf)
    assert bound >= 1 and math.isclose(bound, step_ns / (step_ns - backward))
    mm = [e for e in forward if e.name == "matmul"]
    intensity = sum(e.flops for e in mm) / sum(e.bytes for e in mm)
    assert float(roofline(intensity, 1e12, 1e9)) == pytest.approx(1e9 * intensity)

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        loss = CrossEntropyLoss()(model(x).reshape(-1, V), x.reshape(-1))
        retained = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    held = graph_memory(loss)
    assert held["parameters"] == parameter_bytes(model) == 4 * count_parameters(model)
    assert 0.85 * retained <= held["activations"] <= 1.05 * retained, \
        f"the graph holds {held['activations']:,} bytes of activations; tracemalloc sees {retained:,}"
    timing = latency(lambda: model(x[:1]), warmup=1, repeats=5)
    assert len(timing.times) == 5 and timing.best > 0


def test_count_the_flops_of_the_1998_cnn():
    side = 8
    cnn = Sequential(Conv2d(1, 16, 3, padding=1, rng=2), BatchNorm2d(16), ReLU(), MaxPool2d(2),
                     Conv2d(16, 16, 3, padding=1, rng=3), BatchNorm2d(16), ReLU(), MaxPool2d(2),
                     Flatten(), Linear(16 * (side // 4) ** 2, 10, rng=4))
    x, _ = load_digits("test", flatten=False).tensors
    x = x[:32]
    count = count_flops(cnn, x)
    expected = 2 * 32 * (16 * 8 * 8 * 1 * 9 + 16 * 4 * 4 * 16 * 9 + 16 * 2 * 2 * 10)
    assert count.matmul == expected, f"CNN forward on 32 digits: {count.matmul:,} FLOPs; closed form {expected:,}"
    assert count_parameters(cnn) == (16 * 9 + 16) + 2 * 16 + (16 * 16 * 9 + 16) + 2 * 16 + (64 * 10 + 10)
