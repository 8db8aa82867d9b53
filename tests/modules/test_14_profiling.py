"""Module 14 (profiling): `tinytorch.perf.profiler` checked against PyTorch's FLOP counter and tracemalloc.

- FLOPs: `op_flops` on drawn matmul and convolution shapes, and `count_flops` on `Linear`,
  `Conv2d`, multi-head attention and the whole GPT, each equal to
  `torch.utils.flop_counter.FlopCounterMode` on the same computation in PyTorch (same shapes, same
  arrangement of ops). PyTorch 2.13 counts 0 FLOPs for `scaled_dot_product_attention` on the CPU, so
  the reference attention is written with `torch.matmul`, the way PyTorch's math backend computes it.
  Without PyTorch (a student edition) the same tests compare with the closed forms
  (`2 * M * N * K`, `2 * N * O * OH * OW * C * kh * kw`, the GPT's `L * 2BT(12E^2 + 2TE) + 2BTEV`).
- Bytes: `op_bytes` against the arrays' own `nbytes` (views move nothing, gathers read what they
  write); the activation memory a graph holds (`graph_memory`) against what `tracemalloc` sees
  retained after the forward pass.
- The profiler: every op of a GPT training step is an event with its module path; the Chrome trace
  loads as JSON with the fields Perfetto and chrome://tracing require, its op events nest inside
  their module spans; an unwritable path raises an error naming it; the table grouping, the
  roofline and Amdahl's law on drawn inputs; `latency` returns one call per repeat.

Run one exercise with `pytest tests/modules/test_14_profiling.py --exercise 14.3`.
"""
from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinytorch.core.activations import ReLU
from tinytorch.core.attention import MultiHeadAttention
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.spatial import Conv2d, Flatten, MaxPool2d
from tinytorch.core.tensor import Tensor, active_op_observers
from tinytorch.models.gpt import GPT
from tinytorch.perf.profiler import (
    DATA_MOVEMENT_OPS, Event, FlopCounter, ModulePaths, Profiler, amdahl, arithmetic_intensity, count_flops,
    count_parameters, format_table, graph_memory, latency, op_bytes, op_flops, parameter_bytes, record_function,
    roofline, summarize,
)
from tests.support import property_settings
from tests.support.refs import torch_or_none
from tests.support.strategies import matmul_shapes

pytestmark = pytest.mark.module("14")


def torch_flops(fn) -> int:
    "FLOPs PyTorch's FlopCounterMode counts for `fn()`, run under no_grad."
    torch = torch_or_none()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


def matmul_closed_form(a: tuple, b: tuple) -> int:
    "Multiply-adds of a @ b counted by NumPy itself: with all-ones operands each output element is its K. Times 2."
    return 2 * int(np.matmul(np.ones(a), np.ones(b)).sum())


# ---------------------------------------------------------------------------------------------
# Exercise 14.1: FLOPs of one record
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.1", "op_flops")
@property_settings(40)
@given(shapes=matmul_shapes())
def test_matmul_flops_equal_flop_counter_mode(shapes):
    a, b = shapes
    out = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    got = op_flops("matmul", [a, b], out)
    torch = torch_or_none()
    # FlopCounterMode has no formula for aten.dot and aten.mv, which torch.matmul dispatches to for some 1-D
    # operands (and counts them as 0): there, and without torch, the count is NumPy's own.
    expected = matmul_closed_form(a, b) if torch is None or min(len(a), len(b)) == 1 else \
        torch_flops(lambda: torch.matmul(torch.zeros(a), torch.zeros(b)))
    assert got == (expected, 0), f"op_flops('matmul') for {a} @ {b} -> {out}: {got}; expected ({expected}, 0)"


@pytest.mark.exercise("14.1", "op_flops")
@property_settings(30)
@given(n=st.integers(1, 3), c=st.integers(1, 4), o=st.integers(1, 5), size=st.integers(3, 9),
       k=st.integers(1, 3), stride=st.integers(1, 2), padding=st.integers(0, 1), bias=st.booleans())
def test_conv_flops_equal_flop_counter_mode(n, c, o, size, k, stride, padding, bias):
    oh = (size + 2 * padding - k) // stride + 1
    got = op_flops("Conv2dFunction", [(n, c, size, size), (o, c, k, k), (o,) if bias else None], (n, o, oh, oh))
    torch = torch_or_none()
    if torch is None:
        expected = 2 * n * o * oh * oh * c * k * k
    else:
        x, w, b = torch.zeros(n, c, size, size), torch.zeros(o, c, k, k), torch.zeros(o) if bias else None
        expected = torch_flops(lambda: torch.nn.functional.conv2d(x, w, b, stride=stride, padding=padding))
    assert got == (expected, 0), f"Conv2d {c}->{o}, k={k}, stride {stride}, padding {padding} on {size}x{size}: {got}; expected ({expected}, 0)"


@pytest.mark.exercise("14.1", "op_flops")
@pytest.mark.parametrize("op", sorted(DATA_MOVEMENT_OPS))
def test_data_movement_does_no_arithmetic(op):
    assert op_flops(op, [(4, 5), None], (5, 4)) == (0, 0)


@pytest.mark.exercise("14.1", "op_flops")
@pytest.mark.parametrize("op,shapes,out,expected", [
    ("add", [(8, 16), (16,)], (8, 16), 128), ("mul", [(3, 4), None], (3, 4), 12), ("sum", [(4, 5)], (), 20),
    ("softmax", [(2, 7)], (2, 7), 14), ("cross_entropy", [(6, 10), None], (), 60), ("relu", [()], (), 1),
])
def test_other_ops_count_one_flop_per_element(op, shapes, out, expected):
    got = op_flops(op, shapes, out)
    assert got == (0, expected) and all(type(v) is int for v in got), f"op_flops({op!r}, {shapes}, {out}) = {got}"


# ---------------------------------------------------------------------------------------------
# Exercise 14.2: bytes
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.2", "op_bytes")
@property_settings(30)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple), dtype=st.sampled_from([np.float32, np.float64]))
def test_bytes_of_an_elementwise_op_are_its_arrays(shape, dtype):
    a, b = np.ones(shape, dtype), np.ones(shape, dtype)
    assert op_bytes("add", [a, b], a + b) == (2 * a.nbytes, a.nbytes)
    assert op_bytes("mul", [a, None], a * 2) == (a.nbytes, a.nbytes), "a constant operand is not read from memory"
    assert op_bytes("transpose", [a], a.T) == (0, 0), "a transpose is a view"
    assert op_bytes("reshape", [a], a.reshape(-1)) == (0, 0), "a reshape of a contiguous array is a view"


@pytest.mark.exercise("14.2", "op_bytes")
def test_a_gather_reads_only_the_rows_it_picks():
    table = np.ones((10_000, 8), np.float32)
    ids = np.array([[3, 3, 9]])
    assert op_bytes("EmbeddingLookup", [table, None], table[ids]) == (96, 96)
    assert op_bytes("getitem", [table], table[[0, 5]]) == (64, 64)
    assert op_bytes("getitem", [table], table[2:4]) == (0, 0), "a basic slice is a view"
    assert arithmetic_intensity(24, 12) == 2.0 and arithmetic_intensity(5, 0) == math.inf


# ---------------------------------------------------------------------------------------------
# Exercise 14.3: count_flops against FlopCounterMode on whole layers and models
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.3", "count_flops")
@pytest.mark.parametrize("shape", [(8, 32), (2, 5, 32), (1, 32)])
def test_linear_flops_equal_flop_counter_mode(shape):
    layer = Linear(32, 24, rng=0)
    got = count_flops(layer, Tensor(np.ones(shape, np.float32)))
    torch = torch_or_none()
    rows = math.prod(shape[:-1])
    expected = 2 * rows * 32 * 24 if torch is None else \
        torch_flops(lambda: torch.nn.Linear(32, 24)(torch.zeros(shape)))
    assert got.matmul == expected, f"Linear(32, 24) on {shape}: {got.matmul} FLOPs; FlopCounterMode {expected}"
    assert got.other == rows * 24, f"the bias add is one FLOP per output element: {got.other}"
    assert layer.weight.grad is None


@pytest.mark.exercise("14.3", "count_flops")
@pytest.mark.parametrize("stride,padding,bias", [(1, 1, True), (2, 0, False), (1, 2, True)])
def test_conv2d_flops_equal_flop_counter_mode(stride, padding, bias):
    conv = Conv2d(3, 8, 3, stride=stride, padding=padding, bias=bias, rng=0)
    x = np.ones((2, 3, 10, 10), np.float32)
    got = count_flops(conv, Tensor(x))
    torch = torch_or_none()
    if torch is None:
        oh = (10 + 2 * padding - 3) // stride + 1
        expected = 2 * 2 * 8 * oh * oh * 3 * 9
    else:
        expected = torch_flops(lambda: torch.nn.Conv2d(3, 8, 3, stride=stride, padding=padding, bias=bias)(torch.zeros(x.shape)))
    assert got.matmul == expected, f"Conv2d(3, 8, 3, stride={stride}, padding={padding}): {got.matmul}; FlopCounterMode {expected}"


def torch_attention(torch, x, heads, causal=True):
    "Multi-head self-attention in PyTorch with the matmuls written out (PyTorch's math backend)."
    F = torch.nn.functional
    b, t, e = x.shape
    d = e // heads
    w = torch.zeros(e, e, requires_grad=True)   # a weight, as nn.Linear's: its gradient counts in backward
    q, k, v = (F.linear(x, w, torch.zeros(e)).reshape(b, t, heads, d).transpose(1, 2) for _ in range(3))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, e)
    return F.linear(out, w, torch.zeros(e))


@pytest.mark.exercise("14.3", "count_flops")
@pytest.mark.parametrize("b,t,e,heads", [(2, 6, 16, 4), (1, 9, 12, 3), (3, 1, 8, 1)])
def test_attention_flops_equal_flop_counter_mode(b, t, e, heads):
    attn = MultiHeadAttention(e, heads, rng=0)
    x = np.random.default_rng(0).standard_normal((b, t, e)).astype(np.float32)
    got = count_flops(lambda inp: attn(inp, is_causal=True), Tensor(x))
    torch = torch_or_none()
    expected = 2 * b * t * (4 * e * e + 2 * t * e) if torch is None else \
        torch_flops(lambda: torch_attention(torch, torch.zeros(b, t, e), heads))
    assert got.matmul == expected, f"attention B={b} T={t} E={e} H={heads}: {got.matmul}; FlopCounterMode {expected}"


def torch_gpt_forward(torch, V, T, E, H, L, ids):
    "The GPT's forward in PyTorch (the arrangement of module 13); weights are zeros: FLOPs depend on shapes only."
    nn, F = torch.nn, torch.nn.functional
    tok, pos = nn.Embedding(V, E), nn.Parameter(torch.zeros(T, E))
    blocks = [dict(ln1=nn.LayerNorm(E), ln2=nn.LayerNorm(E), fc=nn.Linear(E, 4 * E), proj=nn.Linear(4 * E, E))
              for _ in range(L)]
    ln_f, head = nn.LayerNorm(E), nn.Linear(E, V, bias=False)
    x = tok(torch.tensor(ids)) + pos[: ids.shape[1]]
    for blk in blocks:
        x = x + torch_attention(torch, blk["ln1"](x), H)
        x = x + blk["proj"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh"))
    params = sum(p.numel() for m in [tok, ln_f, head] + [m for blk in blocks for m in blk.values()] for p in m.parameters())
    params += pos.numel() + L * 4 * (E * E + E)   # the four attention projections
    return head(ln_f(x)), params


@pytest.mark.exercise("14.3", "count_flops")
@pytest.mark.parametrize("V,T,E,H,L,B", [(37, 8, 16, 4, 2, 2), (65, 16, 32, 2, 1, 3)])
def test_whole_gpt_flops_and_parameters_equal_torch(V, T, E, H, L, B):
    model = GPT(V, T, E, H, L, rng=0)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    got = count_flops(model, ids)
    torch = torch_or_none()
    if torch is None:
        expected, params = L * 2 * B * T * (12 * E * E + 2 * T * E) + 2 * B * T * E * V, \
            2 * V * E + T * E + L * (12 * E * E + 13 * E) + 2 * E
    else:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            _, params = torch_gpt_forward(torch, V, T, E, H, L, ids)
        expected = counter.get_total_flops()
    assert got.matmul == expected, f"GPT V={V} T={T} E={E} H={H} L={L} B={B}: {got.matmul:,}; FlopCounterMode {expected:,}"
    assert count_parameters(model) == params, f"count_parameters: {count_parameters(model):,}; torch's model has {params:,}"
    assert parameter_bytes(model) == 4 * params
    assert got.by_op["matmul"][0] == got.matmul and got.by_op["EmbeddingLookup"] == [0, 0]


@pytest.mark.exercise("14.3", "FlopCounter.__call__")
def test_flop_counter_is_an_observer_that_is_removed_after_use():
    counter = FlopCounter()
    a = Tensor(np.ones((3, 4), np.float32))
    counter_ops_before = len(active_op_observers())
    from tinytorch.core.tensor import observe_ops

    with observe_ops(counter):
        (a @ a.T).sum()
    assert counter.by_op == {"permute": [0, 0], "matmul": [2 * 3 * 3 * 4, 0], "sum": [0, 9]}, counter.by_op

    def broken(x):
        x * 2
        raise KeyError("the model failed")

    with pytest.raises(KeyError):
        count_flops(broken, a)
    assert len(active_op_observers()) == counter_ops_before, "count_flops must remove its observer when the model raises"


# ---------------------------------------------------------------------------------------------
# Exercises 14.4 and 14.5: module paths and the profiler's events
# ---------------------------------------------------------------------------------------------
def gpt_step(model, ids, V):
    loss = CrossEntropyLoss()(model(ids).reshape(-1, V), ids.reshape(-1))
    model.zero_grad()
    with record_function("backward"):
        loss.backward()
    return loss


@pytest.mark.exercise("14.4", "ModulePaths.attach")
def test_every_op_of_a_gpt_step_gets_its_module_path():
    V, T, E, H, L, B = 23, 8, 16, 4, 2, 2
    model = GPT(V, T, E, H, L, rng=0)
    ids = np.random.default_rng(0).integers(0, V, (B, T))
    with Profiler(model) as prof:
        gpt_step(model, ids, V)
    matmul_paths = sorted({e.module for e in prof.events if e.name == "matmul"})
    expected = sorted([f"blocks.{i}.{p}" for i in range(L) for p in
                       ("attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.fc", "mlp.proj")]
                      + ["head"])
    assert matmul_paths == expected, f"modules whose ops include a matmul: {matmul_paths}; expected {expected}"
    q_proj = [e for e in prof.events if e.module == "blocks.0.attn.q_proj" and e.name == "matmul"]
    assert len(q_proj) == 1 and q_proj[0].input_shapes == ((B, T, E), (E, E)) and q_proj[0].output_shape == (B, T, E)
    assert prof._stack == [], f"the path stack is empty after the step: {prof._stack}"
    assert not any(m._forward_hooks or m._forward_pre_hooks for _, m in model.named_modules()), "all hooks removed"
    assert sum(e.flops for e in prof.events if e.kind == "op") == count_flops(model, ids).matmul, \
        "the forward ops of a profiled step count the forward's FLOPs"


@pytest.mark.exercise("14.4", "ModulePaths.pop")
def test_module_path_hooks_leave_outputs_unchanged():
    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 3, rng=1))
    x = Tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    expected = net(x).data
    paths = ModulePaths().attach(net)
    try:
        got = net(x)
    finally:
        paths.remove()
    assert isinstance(got, Tensor) and np.array_equal(got.data, expected), "hooks must return None: the output changed"
    assert paths.stack == [] and paths.handles == []
    assert paths.names == {id(m): n for n, m in net.named_modules()}


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_events_carry_shapes_dtype_flops_bytes_and_do_not_overlap():
    a = Tensor(np.ones((16, 8), np.float32))
    b = Tensor(np.ones((8, 4)), dtype=np.float64)
    with Profiler() as prof:
        c = a @ b.astype(np.float32)
        d = (c + 1.0).reshape(64)
    names = [e.name for e in prof.events]
    assert names == ["astype", "matmul", "add", "reshape"], names
    cast, mm, add, reshape = prof.events
    assert (cast.bytes_read, cast.bytes_written, cast.dtype) == (256, 128, "float32")
    assert mm.flops == 2 * 16 * 4 * 8 and mm.bytes_read == 16 * 8 * 4 + 8 * 4 * 4 and mm.bytes_written == 16 * 4 * 4
    assert add.other_flops == 64 and add.input_shapes == ((16, 4), None)
    assert (reshape.bytes_read, reshape.bytes_written) == (0, 0) and reshape.output_shape == (64,)
    for first, second in zip(prof.events, prof.events[1:]):
        assert second.start_ns >= first.start_ns + first.dur_ns, "events are consecutive and do not overlap"
    assert d.shape == (64,)


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_record_function_spans_and_their_own_time():
    net = Sequential(Linear(6, 6, rng=0), ReLU())
    x = Tensor(np.ones((4, 6), np.float32), requires_grad=True)
    with Profiler(net) as prof:
        with record_function("outer"):
            y = net(x).sum()
            with record_function("backward"):
                y.backward()
    spans = {name: (start, end) for name, cat, start, end, _ in prof.spans if cat == "user"}
    assert set(spans) == {"outer", "backward"}
    assert spans["outer"][0] <= spans["backward"][0] <= spans["backward"][1] <= spans["outer"][1], "spans nest"
    own = {e.name: e.dur_ns for e in prof.events if e.kind == "span"}
    op_ns = sum(e.dur_ns for e in prof.events if e.kind == "op")
    assert own["outer"] <= spans["outer"][1] - spans["outer"][0] - op_ns + 1, "a span's own time excludes its ops"
    assert x.grad is not None and prof.total_time() > 0
    with record_function("no profiler"):   # outside a profiler it does nothing
        pass


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_profiler_rejects_a_model_that_is_no_module():
    with pytest.raises(TypeError, match="Profiler: model must be a tinytorch Module or None; got str"):
        Profiler("gpt")


# ---------------------------------------------------------------------------------------------
# The Chrome trace
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_chrome_trace_loads_with_the_required_fields_and_nests_ops_in_modules(tmp_path):
    V, T, E, H, L, B = 19, 6, 8, 2, 1, 2
    model = GPT(V, T, E, H, L, rng=0)
    ids = np.random.default_rng(0).integers(0, V, (B, T))
    with Profiler(model) as prof:
        gpt_step(model, ids, V)
    path = prof.export_chrome_trace(tmp_path / "step.json")
    assert path == str(tmp_path / "step.json")
    with open(path) as f:
        trace = json.load(f)
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] in ("ms", "ns")
    events = trace["traceEvents"]
    for e in events:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert e["cat"] in ("op", "backward", "module", "user"), e
    ops = [e for e in events if e.get("cat") == "op"]
    assert len(ops) == sum(ev.kind == "op" for ev in prof.events)
    for e in ops:
        assert set(e["args"]) >= {"module", "input_shapes", "output_shape", "dtype", "flops", "bytes_read", "bytes_written"}, e
    spans = {e["name"]: e for e in events if e.get("cat") == "module"}
    assert {"GPT", "blocks.0", "blocks.0.attn", "blocks.0.attn.q_proj", "head"} <= set(spans), sorted(spans)
    eps = 1e-3   # microseconds: rounding of the ns clock
    for e in ops:
        if e["args"]["module"]:
            span = spans[e["args"]["module"]]
            assert span["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + eps, \
                f"op {e['name']} of {e['args']['module']} at [{e['ts']}, {e['ts'] + e['dur']}] lies outside its module span [{span['ts']}, {span['ts'] + span['dur']}]"
    inner, outer = spans["blocks.0.attn.q_proj"], spans["blocks.0"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + eps
    assert any(e["name"] == "backward" and e["cat"] == "user" for e in events)


@pytest.mark.exercise("14.5", "Profiler._on_op")
@pytest.mark.parametrize("where,reason", [("missing/folder/trace.json", "No such file or directory"), (".", "Is a directory")])
def test_chrome_trace_to_an_unwritable_path_names_it(tmp_path, where, reason):
    with Profiler() as prof:
        Tensor(np.ones(3)) * 2
    path = str(tmp_path / where)
    with pytest.raises(OSError) as err:
        prof.export_chrome_trace(path)
    assert str(err.value) == (f"Profiler.export_chrome_trace: cannot write the trace to {path} ({reason}); "
                              f"pass a path in an existing folder you can write to")


# ---------------------------------------------------------------------------------------------
# Exercise 14.6: the table
# ---------------------------------------------------------------------------------------------
event_lists = st.lists(st.tuples(st.sampled_from(["matmul", "add", "relu"]), st.sampled_from(["a", "b", ""]),
                                 st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**4),
                                 st.integers(0, 10**5)), max_size=20)


@pytest.mark.exercise("14.6", "summarize")
@property_settings(50)
@given(raw=event_lists, group_by=st.sampled_from(["op", "module"]), sort_by=st.sampled_from(["time", "flops", "memory"]))
def test_summarize_keeps_every_total_and_sorts(raw, group_by, sort_by):
    events = [Event(n, m, (), (), "float32", 0, t, flops=f, other_flops=o, bytes_read=b, bytes_written=b // 2)
              for n, m, t, f, o, b in raw]
    rows = summarize(events, group_by=group_by, sort_by=sort_by)
    keys = [e.name if group_by == "op" else e.module for e in events]
    assert set(r["key"] for r in rows) == set(keys)
    for field, total in (("time_ns", sum(e.dur_ns for e in events)), ("flops", sum(e.flops for e in events)),
                         ("other_flops", sum(e.other_flops for e in events)), ("bytes", sum(e.bytes for e in events)),
                         ("calls", len(events))):
        assert sum(r[field] for r in rows) == total, f"the rows' {field} must add up to the events' total"
    fields = {"time": ("time_ns",), "flops": ("flops", "other_flops"), "memory": ("bytes",)}[sort_by]

    def value(row):
        return sum(row[f] for f in fields)

    assert [value(r) for r in rows] == sorted((value(r) for r in rows), reverse=True)
    first_seen = list(dict.fromkeys(keys))
    for r1, r2 in zip(rows, rows[1:]):
        if value(r1) == value(r2):
            assert first_seen.index(r1["key"]) < first_seen.index(r2["key"]), "ties keep the order of first appearance"
    assert format_table(rows, group_by).splitlines()[0].split()[0] == group_by


@pytest.mark.exercise("14.6", "summarize")
@pytest.mark.parametrize("kwargs,text", [
    ({"sort_by": "speed"}, "summarize: sort_by must be one of 'time', 'flops', 'memory'; got 'speed'"),
    ({"group_by": "layer"}, "summarize: group_by must be one of 'op', 'module'; got 'layer'"),
])
def test_summarize_names_a_bad_choice(kwargs, text):
    with pytest.raises(ValueError) as err:
        summarize([], **kwargs)
    assert str(err.value) == text


@pytest.mark.exercise("14.6", "summarize")
def test_profiler_table_of_a_cnn_step():
    cnn = Sequential(Conv2d(1, 4, 3, padding=1, rng=0), ReLU(), MaxPool2d(2), Flatten(), Linear(4 * 4 * 4, 10, rng=1))
    x = Tensor(np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32))
    with Profiler(cnn) as prof:
        loss = CrossEntropyLoss()(cnn(x), np.arange(8) % 10)
        with record_function("backward"):
            loss.backward()
    by_module = {r["key"]: r for r in summarize(prof.events, group_by="module", sort_by="flops")}
    conv = 2 * 8 * 4 * 64 * 9
    assert by_module["layers.0"]["flops"] == 2 * conv, \
        f"first convolution: forward {conv:,} + the weight's gradient {conv:,} (the images need none); got {by_module['layers.0']}"
    assert list(by_module)[0] == "layers.0", "the convolution has the most FLOPs"
    text = prof.table(sort_by="memory", group_by="module")
    assert "layers.0" in text and "(top level)" in text and text.splitlines()[-1].startswith("total:")


# ---------------------------------------------------------------------------------------------
# Exercise 14.7: roofline and Amdahl
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.7", "roofline")
@property_settings(50)
@given(intensity=st.floats(0, 1e4), peak=st.floats(1e6, 1e13), bandwidth=st.floats(1e6, 1e12))
def test_roofline_is_the_lower_roof(intensity, peak, bandwidth):
    got = float(roofline(intensity, peak, bandwidth))
    assert math.isclose(got, min(peak, bandwidth * intensity), rel_tol=1e-12, abs_tol=1e-300)
    ridge = peak / bandwidth
    assert math.isclose(float(roofline(ridge, peak, bandwidth)), peak, rel_tol=1e-9)
    arr = roofline(np.array([intensity, 2 * intensity]), peak, bandwidth)
    assert arr.shape == (2,) and arr[1] >= arr[0]


@pytest.mark.exercise("14.7", "amdahl")
@property_settings(50)
@given(f=st.floats(0, 1), s=st.floats(1, 1e6))
def test_amdahl_is_bounded_by_the_serial_part(f, s):
    got = amdahl(f, s)
    assert 1.0 <= got * (1 + 1e-12) and got <= s * (1 + 1e-12)
    if f < 1:
        assert got <= 1 / (1 - f) * (1 + 1e-12), "never more than 1 / (1 - f)"
    assert math.isclose(amdahl(f, math.inf), 1 / (1 - f)) if f < 1 else amdahl(f, math.inf) == math.inf


@pytest.mark.exercise("14.7", "amdahl")
@pytest.mark.parametrize("args,text", [((1.5, 2), "amdahl: fraction must be in [0, 1]; got 1.5"),
                                       ((-0.1, 2), "amdahl: fraction must be in [0, 1]; got -0.1"),
                                       ((0.5, 0), "amdahl: speedup must be > 0; got 0")])
def test_amdahl_names_a_bad_value(args, text):
    with pytest.raises(ValueError) as err:
        amdahl(*args)
    assert str(err.value) == text


# ---------------------------------------------------------------------------------------------
# Given tools: activation memory and latency
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [4, 16])
def test_graph_memory_agrees_with_tracemalloc(batch):
    model = GPT(31, 16, 32, 4, 2, rng=0)
    ids = np.random.default_rng(0).integers(0, 31, (batch, 16))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        loss = CrossEntropyLoss()(model(ids).reshape(-1, 31), ids.reshape(-1))
        retained = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    held = graph_memory(loss)
    assert held["parameters"] == parameter_bytes(model), f"{held['parameters']} vs {parameter_bytes(model)}"
    assert 0.85 * retained <= held["activations"] <= 1.05 * retained, \
        f"batch {batch}: the graph holds {held['activations']:,} bytes of activations; tracemalloc sees {retained:,} retained"
    loss.backward()
    assert graph_memory(loss)["activations"] == loss.data.nbytes, "backward releases the records' arrays"
    with no_grad():
        assert graph_memory(model(ids))["activations"] == ids.shape[0] * 16 * 31 * 4, "no graph under no_grad"


def test_latency_times_one_call_per_repeat():
    calls = []
    timing = latency(lambda: calls.append(1), warmup=3, repeats=7)
    assert len(calls) == 10 and timing.number == 1 and len(timing.times) == 7
    assert timing.best <= timing.median <= timing.percentile(90) <= max(timing.times)


# ---------------------------------------------------------------------------------------------
# Backward rules: timed while the profiler is active, FLOPs of a whole training step
# ---------------------------------------------------------------------------------------------
def rules_now():
    from tinytorch.core import autograd
    from tinytorch.core import tensor as tensor_module

    return dict(autograd.BACKWARD_RULES), {cls: cls.__dict__["rule"] for cls in tensor_module._NODE_TYPES.values()
                                           if cls.__dict__.get("rule") is not None}


@pytest.mark.exercise("14.5", "Profiler._on_op")
@pytest.mark.parametrize("V,T,E,H,L,B", [(37, 8, 16, 4, 2, 2), (29, 12, 24, 3, 1, 3)])
def test_training_step_flops_forward_and_backward_equal_flop_counter_mode(V, T, E, H, L, B):
    model = GPT(V, T, E, H, L, rng=0)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    before = rules_now()
    with Profiler(model) as prof:
        gpt_step(model, ids, V)
    assert rules_now() == before, "the backward rules must be put back when the profiler exits"
    forward = sum(e.flops for e in prof.events if e.kind == "op")
    backward = sum(e.flops for e in prof.events if e.kind == "backward")
    torch = torch_or_none()
    if torch is None:
        expected_fwd = L * 2 * B * T * (12 * E * E + 2 * T * E) + 2 * B * T * E * V
        expected = 3 * expected_fwd   # every matmul operand of the GPT needs a gradient: two matmuls back per matmul
    else:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            logits, _ = torch_gpt_forward(torch, V, T, E, H, L, ids)
            torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.tensor(ids).reshape(-1)).backward()
        expected = counter.get_total_flops()
    assert forward + backward == prof.total_flops() == expected, \
        f"training step: forward {forward:,} + backward {backward:,} FLOPs; FlopCounterMode counts {expected:,}"
    names = {e.name for e in prof.events if e.kind == "backward"}
    assert {"MatmulBackward", "LayerNormFunctionBackward", "EmbeddingLookupBackward", "CrossEntropyBackward"} <= names, names
    q = [e for e in prof.events if e.kind == "backward" and e.name == "MatmulBackward" and e.module == "blocks.0.attn.q_proj"]
    assert len(q) == 1 and q[0].flops == 2 * 2 * B * T * E * E, "q_proj's backward: grad of input and of weight"


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_rules_are_put_back_after_an_error_and_without_backward_nothing_is_swapped():
    before = rules_now()
    with pytest.raises(ZeroDivisionError):
        with Profiler():
            1 / 0
    assert rules_now() == before
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    with Profiler(backward=False) as prof:
        assert rules_now() == before, "backward=False swaps no rule"
        (x * x).sum().backward()
    assert [e.kind for e in prof.events] == ["op", "op"] and x.grad is not None
