"""Module 14 (profiling): `tinytorch.perf.profiler` checked against PyTorch's FLOP counter, its profiler and tracemalloc.

- FLOPs: `op_flops` on drawn matmul and convolution shapes, `backward_flops` on drawn needs-grad patterns,
  and `count_flops` on `Linear`, `Conv2d`, multi-head attention and the whole GPT, each equal to
  `torch.utils.flop_counter.FlopCounterMode` on the same computation in PyTorch (same shapes, same
  arrangement of ops), and to `torch.profiler`'s `with_flops` on the products. PyTorch 2.13 counts 0 FLOPs
  for `scaled_dot_product_attention` on the CPU, so the reference attention is written with
  `torch.matmul`, the way PyTorch's math backend computes it. Without PyTorch (a student edition) the same
  tests compare with the closed forms of `tests/support/systems.py`.
- Bytes: `op_bytes` against the arrays' own `nbytes` (views move nothing, gathers read what they write,
  in-place ops write over their operand); the activation memory a graph holds (`graph_memory`) against
  what `tracemalloc` sees retained after the forward pass.
- The profiler: every op of a GPT training step is an event with its module path (also after a forward
  that raised); backward rules are timed through module 06's backward observer, on the profiler's thread
  only (two threads profile at once, neither sees the other's ops, no rule table changes); the Chrome
  trace loads as JSON with the fields Perfetto and chrome://tracing require, its op events nest inside
  their module spans; an unwritable path raises an error naming it; the table grouping, the roofline, the
  placement of an op under it and Amdahl's law on drawn inputs; `latency` stays within its budget.
- Each exercise is checked on its own inputs where it can be (14.3 and 14.5 with a stand-in `op_flops`
  that returns drawn numbers); a test that needs an earlier exercise checks it first and names it
  ("not checked on its own: it uses op_flops (Exercise 14.1) ... fix 14.1 first").

Run one exercise with `pytest tests/modules/test_14_profiling.py --exercise 14.3`.
"""
from __future__ import annotations

import json
import math
import threading
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
    DATA_MOVEMENT_OPS, OVERWRITING_OPS, Event, FlopCounter, ModulePaths, Profiler, RooflinePoint, amdahl,
    arithmetic_intensity, backward_flops, count_flops, count_parameters, format_table, graph_memory, latency,
    op_bytes, op_flops, parameter_bytes, place_on_roofline, record_function, roofline, summarize,
)
from tests.support import laid_out, property_settings
from tests.support.refs import torch_or_none
from tests.support.strategies import matmul_shapes
from tests.support.systems import conv_flops, matmul_flops, torch_flops, torch_profiler_flops

pytestmark = pytest.mark.module("14")


def _upstream_checks():
    "Small cases of the exercises later ones build on: (number, function, check) ; a check returns '' or what is wrong."
    a, m = np.ones(4, np.float32), np.ones((3, 2), np.float32)

    def flops():
        got = (op_flops("matmul", [(8, 32), (32, 16)], (8, 16)), op_flops("add", [(8, 16), (16,)], (8, 16)))
        return "" if got == ((8192, 0), (0, 128)) else f"op_flops gave {got[0]} and {got[1]}, expected (8192, 0) and (0, 128)"

    def nbytes():
        got = (op_bytes("add", [a, a], a + a), op_bytes("transpose", [m], m.T))
        return "" if got == ((32, 16), (0, 0)) else f"op_bytes gave {got[0]} and {got[1]}, expected (32, 16) and (0, 0)"

    def paths():
        why = pop_returns_nothing()
        if why:
            return why
        net, stack = Sequential(Linear(2, 2, rng=0)), []
        tracker = ModulePaths(stack).attach(net)
        try:
            out = net(Tensor(np.ones((1, 2), np.float32)))
        finally:
            tracker.remove()
        ok = isinstance(out, Tensor) and stack == []
        return "" if ok else f"a Sequential with its hooks returned {type(out).__name__} and left the stack {stack}"
    return {"14.1": ("op_flops", flops), "14.2": ("op_bytes", nbytes), "14.4": ("ModulePaths", paths)}


def pop_returns_nothing() -> str:
    "'' when ModulePaths.push and pop return None; else what they returned, named (a hook's result replaces an output)."
    layer, tracker = Linear(2, 2, rng=0), ModulePaths(["outer"])
    tracker.names[id(layer)] = "fc"
    pushed = tracker.push(layer, ())
    popped = tracker.pop(layer, (), Tensor(np.ones(2)))
    if pushed is not None or popped is not None:
        return (f"ModulePaths.push returned {pushed!r} and ModulePaths.pop returned {popped!r}: what a forward (pre-)hook "
                f"returns replaces the module's arguments or output, so both must return None")
    return ""


def require(*exercises):
    """Check the earlier exercises a test depends on; a wrong one fails the test with its own name, so a
    downstream failure says which exercise to fix first. A stub is reported as "not implemented yet" by name."""
    checks = _upstream_checks()
    for number in exercises:
        name, check = checks[number]
        try:
            why = check()
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - a crash of the earlier exercise is its failure
            why = f"{name} raised {type(err).__name__}: {err}"
        if why:
            pytest.fail(f"not checked on its own: it uses {name} (Exercise {number}), which is wrong: {why}. "
                        f"Fix Exercise {number} first", pytrace=False)


def fake_op_flops(op, shapes, out):
    "A stand-in for op_flops that returns drawn-looking numbers (not FLOPs): a test of 14.3 or 14.5 alone."
    return 1000 * len(op) + 10 * len(shapes) + len(out), 7 * len(op) + sum(s is None for s in shapes)


def fake_op_bytes(op, inputs, out):
    "A stand-in for op_bytes: numbers that depend on the record, so that passing them on is all that is checked."
    return 100 * len(op) + len(inputs), 3 * out.size


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
    expected = matmul_flops(a, b) if torch is None or min(len(a), len(b)) == 1 else \
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
        expected = conv_flops(n, c, o, oh, oh, k, k)
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


@pytest.mark.exercise("14.1", "backward_flops")
@property_settings(30)
@given(shapes=matmul_shapes().filter(lambda ab: len(ab[0]) > 1 and len(ab[1]) > 1), needs=st.tuples(st.booleans(), st.booleans()))
def test_backward_flops_of_a_matmul_equal_flop_counter_mode(shapes, needs):
    a, b = shapes
    out = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    got = backward_flops("matmul", [a, b], out, needs)
    torch = torch_or_none()
    if torch is None:
        expected = sum(needs) * matmul_flops(a, b)
    else:
        ta, tb = torch.zeros(a, requires_grad=needs[0]), torch.zeros(b, requires_grad=needs[1])
        total = torch_flops(lambda: torch.matmul(ta, tb).sum().backward() if any(needs) else torch.matmul(ta, tb),
                            backward=True)
        expected = total - torch_flops(lambda: torch.matmul(torch.zeros(a), torch.zeros(b)))
    assert got == (expected, 0) and all(type(v) is int for v in got), \
        f"backward_flops('matmul', [{a}, {b}], {out}, needs_grad={needs}) = {got}; FlopCounterMode counts ({expected}, 0)"


@pytest.mark.exercise("14.1", "backward_flops")
@pytest.mark.parametrize("needs", [(False, True, True), (True, True, False), (True, False, True)])
def test_backward_flops_of_a_convolution_equal_flop_counter_mode(needs):
    shapes, out = [(2, 3, 7, 7), (4, 3, 3, 3), (4,)], (2, 4, 5, 5)
    got = backward_flops("Conv2dFunction", shapes, out, needs)
    torch = torch_or_none()
    if torch is None:
        expected = sum(needs[:2]) * conv_flops(2, 3, 4, 5, 5, 3, 3)
    else:
        x, w, b = (torch.zeros(s, requires_grad=n) for s, n in zip(shapes, needs))
        expected = torch_flops(lambda: torch.nn.functional.conv2d(x, w, b).sum().backward(), backward=True) - \
            torch_flops(lambda: torch.nn.functional.conv2d(x, w, b))
    assert got == (expected, 0), f"the backward of a convolution with needs_grad={needs}: {got}; FlopCounterMode counts ({expected}, 0)"
    assert backward_flops("relu", [(3, 4)], (3, 4), (True,)) == op_flops("relu", [(3, 4)], (3, 4)), \
        "an op that is no product counts its forward's estimate once"


@pytest.mark.exercise("14.1", "op_flops")
def test_product_flops_equal_torch_profiler_with_flops():
    torch = torch_or_none()
    if torch is None:
        pytest.skip("torch.profiler is PyTorch's own: compared where torch is installed")
    a, b = (6, 20), (20, 9)
    x, w = torch.zeros(2, 3, 8, 8), torch.zeros(5, 3, 3, 3)
    ours = op_flops("matmul", [a, b], (6, 9))[0] + op_flops("Conv2dFunction", [(2, 3, 8, 8), (5, 3, 3, 3), None],
                                                            (2, 5, 6, 6))[0]
    theirs = torch_profiler_flops(lambda: (torch.mm(torch.zeros(a), torch.zeros(b)), torch.nn.functional.conv2d(x, w)))
    assert ours == theirs, f"a (6, 20) @ (20, 9) matmul and a 3 -> 5 convolution: {ours:,} FLOPs; torch.profiler (with_flops) {theirs:,}"


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


@pytest.mark.exercise("14.2", "op_bytes")
@property_settings(30)
@given(data=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
def test_in_place_ops_write_their_tensor_and_read_what_they_use(data, shape):
    base = data.draw(laid_out(shape), label="tensor")   # any layout: an in-place op writes through a view too
    other = np.ones(shape, np.float32)
    n = base.nbytes
    for op, operands, expected in (("add_", [base, other], (2 * n, n)), ("sub_", [base, None], (n, n)),
                                   ("mul_", [base, other[..., :1]], (n + other[..., :1].nbytes, n)),
                                   ("fill_", [base, None], (0, n)), ("zero_", [base, None], (0, n)),
                                   ("copy_", [base, other], (other.nbytes, n))):
        got = op_bytes(op, operands, base)
        assert got == expected, (f"in-place {op} on a {base.dtype} {shape} tensor (its result is its first operand, "
                                 f"changed: no view): got {got}; expected {expected}")
    assert OVERWRITING_OPS == {"fill_", "zero_", "copy_"}


@pytest.mark.exercise("14.2", "op_bytes")
def test_a_profiled_optimizer_style_update_counts_its_bytes():
    require("14.1")
    w = Tensor(np.ones(1000, np.float32))
    g = Tensor(np.full(1000, 0.5, np.float32))
    with Profiler() as prof:
        w.mul_(0.9)
        w.sub_(g, alpha=0.1)
        g.zero_()
    got = [(e.name, e.bytes_read, e.bytes_written) for e in prof.events]
    assert got == [("mul_", 4000, 4000), ("sub_", 8000, 4000), ("zero_", 0, 4000)], \
        f"three in-place updates of 1000 float32: {got}; in-place ops are not views: each writes 4000 bytes"


# ---------------------------------------------------------------------------------------------
# Exercise 14.3: count_flops against FlopCounterMode on whole layers and models
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.3", "count_flops")
@pytest.mark.parametrize("shape", [(8, 32), (2, 5, 32), (1, 32)])
def test_linear_flops_equal_flop_counter_mode(shape):
    require("14.1")
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
    require("14.1")
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
    require("14.1")
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
    require("14.1")
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
def test_flop_counter_adds_what_op_flops_gives_for_each_record(monkeypatch):
    """14.3 on its own inputs: op_flops replaced by a stand-in that returns other numbers, so only the adding
    up is checked (a wrong 14.1 does not fail this test)."""
    from tinytorch.core.tensor import observe_ops
    from tinytorch.perf import profiler

    monkeypatch.setattr(profiler, "op_flops", fake_op_flops)
    a = Tensor(np.ones((3, 4), np.float32))
    b = Tensor(np.ones((4, 2), np.float32))
    counter = FlopCounter()
    with observe_ops(counter):
        c = a @ b
        (c * 2.0 + c).sum()
        a @ b
    records = [("matmul", ((3, 4), (4, 2)), (3, 2)), ("mul", ((3, 2), None), (3, 2)),
               ("add", ((3, 2), (3, 2)), (3, 2)), ("sum", ((3, 2),), ()), ("matmul", ((3, 4), (4, 2)), (3, 2))]
    expected = {}
    for op, shapes, out in records:
        mm, other = fake_op_flops(op, shapes, out)
        entry = expected.setdefault(op, [0, 0])
        entry[0] += mm
        entry[1] += other
    assert counter.by_op == expected, f"by_op after five records: {counter.by_op}; expected the sums of op_flops per op name {expected}"
    total = count_flops(lambda x: x @ b, a)
    assert (total.matmul, total.other) == fake_op_flops("matmul", ((3, 4), (4, 2)), (3, 2)), \
        f"count_flops sums by_op: got {total}"


@pytest.mark.exercise("14.3", "FlopCounter.__call__")
def test_flop_counter_is_an_observer_that_is_removed_after_use():
    require("14.1")
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


@pytest.mark.exercise("14.4", "ModulePaths.pop")
def test_push_and_pop_return_nothing_and_keep_the_stack():
    net = Linear(2, 3, rng=0)
    stack = ["outer"]
    paths = ModulePaths(stack)
    paths.names[id(net)] = "fc"
    pushed = paths.push(net, ())
    assert pushed is None and stack == ["outer", "fc"], f"push returned {pushed!r} and left the stack {stack}; expected None and ['outer', 'fc']"
    popped = paths.pop(net, (), Tensor(np.ones(3)))
    assert popped is None, (f"pop returned {popped!r}: a forward hook's return value replaces the module's output, "
                            f"so pop must return None (not what list.pop gives back)")
    assert stack == ["outer"], f"pop takes the top path off: the stack is {stack}, expected ['outer']"


@pytest.mark.exercise("14.4", "ModulePaths.attach")
def test_a_forward_that_raises_leaves_no_path_on_the_stack():
    why = pop_returns_nothing()
    assert not why, why
    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 2, rng=1))
    paths = ModulePaths().attach(net)
    try:
        with pytest.raises(ValueError):
            net(Tensor(np.ones((3, 5), np.float32)))    # Linear(4, 8) refuses a width of 5
        assert paths.stack == [], (f"after a forward that raised the stack holds {paths.stack}: register pop with "
                                   f"always_call=True, so that it runs when forward raises")
        seen = []
        from tinytorch.core.tensor import observe_ops

        with observe_ops(lambda node, out: seen.append((paths.stack[-1] if paths.stack else None, node.op))):
            net(Tensor(np.ones((3, 4), np.float32)))
        assert [w for w, op in seen if op == "matmul"] == ["layers.0", "layers.2"], f"paths after the error: {seen}"
    finally:
        paths.remove()


@pytest.mark.exercise("14.4", "ModulePaths.attach")
def test_every_op_of_a_gpt_step_gets_its_module_path():
    require("14.1", "14.2")
    why = pop_returns_nothing()
    assert not why, why
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
    why = pop_returns_nothing()
    assert not why, why
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
def test_an_event_carries_what_op_flops_and_op_bytes_give(monkeypatch):
    """14.5 on its own inputs: op_flops and op_bytes replaced by stand-ins, and the module path pushed by hand,
    so that a wrong 14.1, 14.2 or 14.4 does not fail this test."""
    from tinytorch.perf import profiler

    monkeypatch.setattr(profiler, "op_flops", fake_op_flops)
    monkeypatch.setattr(profiler, "op_bytes", fake_op_bytes)
    a = Tensor(np.ones((5, 3), np.float32))
    with Profiler() as prof:
        b = a * 2.0
        prof._stack.append("encoder.fc")
        c = b.exp()
        prof._stack.pop()
    first, second = prof.events
    assert (first.name, first.module, first.input_shapes, first.output_shape) == ("mul", "", ((5, 3), None), (5, 3)), first
    assert (first.flops, first.other_flops) == fake_op_flops("mul", ((5, 3), None), (5, 3)), \
        f"flops and other_flops come from op_flops: got {(first.flops, first.other_flops)}"
    assert (first.bytes_read, first.bytes_written) == fake_op_bytes("mul", [a.data, None], b.data), \
        f"bytes_read and bytes_written come from op_bytes on the operands' arrays (None for a constant)"
    assert second.module == "encoder.fc" and second.dtype == "float32", f"the module on top of the stack: {second}"
    assert c.shape == (5, 3)


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_events_carry_shapes_dtype_flops_bytes_and_do_not_overlap():
    require("14.1", "14.2")
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
    require("14.1", "14.2", "14.4")
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
def test_module_spans_close_when_a_forward_raises_inside_the_profiler():
    require("14.4")
    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 2, rng=1))
    with Profiler(net) as prof:
        with pytest.raises(ValueError):
            net(Tensor(np.ones((3, 5), np.float32)))
        net(Tensor(np.ones((3, 4), np.float32)))
    assert prof._stack == [] and prof._starts == [], f"open paths {prof._stack}, open spans {prof._starts}"
    names = [name for name, cat, *_ in prof.spans if cat == "module"]
    assert names.count("Sequential") == 2 and names.count("layers.0") == 2, \
        f"the span of the forward that raised is closed too (as PyTorch's profiler closes it): {names}"
    assert [e.module for e in prof.events if e.name == "matmul"] == ["layers.0", "layers.2"], \
        "after the error, ops are charged to the modules that ran them"


def _rules():
    from tinytorch.core import autograd
    from tinytorch.core import tensor as tensor_module

    return {op: id(rule) for op, rule in autograd.BACKWARD_RULES.items()}, \
        {cls: id(cls.__dict__["rule"]) for cls in tensor_module._NODE_TYPES.values() if cls.__dict__.get("rule") is not None}


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_two_threads_profile_at_once_and_each_sees_only_its_own_work():
    """Backward is observed through module 06's per-thread backward observer: no rule table or node type changes
    while a profiler runs, and a profiler sees its own thread only (a server trains on one thread and serves on
    another)."""
    require("14.1", "14.2")
    before = _rules()
    barrier = threading.Barrier(2, timeout=60)
    results, errors = {}, []

    def work(name, width, steps):
        try:
            x = Tensor(np.ones((4, width), np.float32), requires_grad=True)
            w = Tensor(np.ones((width, width), np.float32), requires_grad=True)
            with Profiler() as prof:
                barrier.wait()   # both profilers are active now
                for _ in range(steps):
                    (x @ w).sum().backward()
                    barrier.wait()
                results[name] = (prof, _rules())
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {type(err).__name__}: {err}")
            barrier.abort()

    threads = [threading.Thread(target=work, args=("a", 3, 2)), threading.Thread(target=work, args=("b", 5, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, width in (("a", 3), ("b", 5)):
        prof, during = results[name]
        assert during == before, "a profiler must not swap module 06's rules or node types (observe backward instead)"
        shapes = {e.input_shapes for e in prof.events if e.name in ("matmul", "MatmulBackward")}
        assert shapes == {((4, width), (width, width))}, f"thread {name}'s profiler saw other work: {shapes}"
        kinds = [e.kind for e in prof.events if e.name in ("matmul", "MatmulBackward")]
        assert kinds == ["op", "backward"] * 2, f"thread {name}: two forward matmuls and their two backward rules; got {kinds}"
        bwd = [e for e in prof.events if e.name == "MatmulBackward"]
        assert all(e.flops == 2 * 2 * 4 * width * width for e in bwd), [e.flops for e in bwd]
    assert _rules() == before


@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_profiler_rejects_a_model_that_is_no_module():
    with pytest.raises(TypeError, match="Profiler: model must be a tinytorch Module or None; got str"):
        Profiler("gpt")


# ---------------------------------------------------------------------------------------------
# The Chrome trace
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.5", "Profiler._on_op")
def test_chrome_trace_loads_with_the_required_fields_and_nests_ops_in_modules(tmp_path):
    require("14.1", "14.2", "14.4")
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
    require("14.1", "14.2", "14.4")
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
# Exercise 14.8: the roofline and an op's place under it; Exercise 14.9: Amdahl
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("14.8", "roofline")
@property_settings(50)
@given(intensity=st.floats(0, 1e4), peak=st.floats(1e6, 1e13), bandwidth=st.floats(1e6, 1e12))
def test_roofline_is_the_lower_roof(intensity, peak, bandwidth):
    got = float(roofline(intensity, peak, bandwidth))
    assert math.isclose(got, min(peak, bandwidth * intensity), rel_tol=1e-12, abs_tol=1e-300)
    ridge = peak / bandwidth
    assert math.isclose(float(roofline(ridge, peak, bandwidth)), peak, rel_tol=1e-9)
    arr = roofline(np.array([intensity, 2 * intensity]), peak, bandwidth)
    assert arr.shape == (2,) and arr[1] >= arr[0]


@pytest.mark.exercise("14.8", "place_on_roofline")
@property_settings(60)
@given(flops=st.floats(1, 1e12), nbytes=st.one_of(st.just(0.0), st.floats(1, 1e10)), seconds=st.floats(1e-7, 10),
       peak=st.floats(1e8, 1e13), bandwidth=st.floats(1e8, 1e12), kind=st.sampled_from([float, np.float64, int]))
def test_place_on_roofline_puts_attained_beside_bound(flops, nbytes, seconds, peak, bandwidth, kind):
    args = [kind(v) if kind is not int else max(1, int(v)) for v in (flops, nbytes)] + [seconds, peak, bandwidth]
    if kind is int and nbytes == 0:
        args[1] = 0
    f, b = float(args[0]), float(args[1])
    p = place_on_roofline(*args)
    assert isinstance(p, RooflinePoint), f"got {type(p).__name__}"
    assert all(type(v) is float for v in (p.intensity, p.attained, p.bound, p.fraction)), f"Python floats: {p}"
    intensity = math.inf if b == 0 else f / b
    bound = min(peak, bandwidth * intensity)
    expected = (intensity, f / seconds, bound, "memory" if bandwidth * intensity < peak else "compute",
                f / seconds / bound)
    got = (p.intensity, p.attained, p.bound, p.limit, p.fraction)
    assert got[3] == expected[3] and all(
        g == e or math.isclose(g, e, rel_tol=1e-9) for g, e in zip(got[:3] + got[4:], expected[:3] + expected[4:])), \
        f"place_on_roofline{tuple(args)}: got {got}; expected intensity, attained, bound, limit, fraction = {expected}"


@pytest.mark.exercise("14.8", "place_on_roofline")
@pytest.mark.parametrize("args,text", [
    ((0, 10, 1.0, 1e9, 1e9), "place_on_roofline: flops must be > 0; got 0"),
    ((5, -1, 1.0, 1e9, 1e9), "place_on_roofline: nbytes must be >= 0; got -1"),
    ((5, 10, 0.0, 1e9, 1e9), "place_on_roofline: seconds must be > 0; got 0.0"),
    ((5, 10, 1.0, -1.0, 1e9), "place_on_roofline: peak_flops must be > 0; got -1.0"),
    ((5, 10, 1.0, 1e9, 0), "place_on_roofline: bandwidth must be > 0; got 0"),
])
def test_place_on_roofline_names_a_bad_argument(args, text):
    with pytest.raises(ValueError) as err:
        place_on_roofline(*args)
    assert str(err.value) == text


@pytest.mark.exercise("14.9", "amdahl")
@property_settings(50)
@given(f=st.floats(0, 1), s=st.floats(1, 1e6))
def test_amdahl_is_bounded_by_the_serial_part(f, s):
    got = amdahl(f, s)
    assert 1.0 <= got * (1 + 1e-12) and got <= s * (1 + 1e-12)
    if f < 1:
        assert got <= 1 / (1 - f) * (1 + 1e-12), "never more than 1 / (1 - f)"
    assert math.isclose(amdahl(f, math.inf), 1 / (1 - f)) if f < 1 else amdahl(f, math.inf) == math.inf


@pytest.mark.exercise("14.9", "amdahl")
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
@pytest.mark.exercise("14.7", "graph_memory")
def test_graph_memory_counts_each_buffer_once():
    x = Tensor(np.ones((4, 3), np.float32))
    w = Tensor(np.ones((3, 2), np.float32), requires_grad=True)
    h = x @ w
    views = [h.reshape(8), h.T, h[1:3]]
    out = (views[0] * views[0]).sum() + views[1].sum() + views[2].sum()
    held = graph_memory(out)
    expected_acts = x.data.nbytes + h.data.nbytes + 8 * 4 + 3 * 4 + 4 + out.data.nbytes   # x, h, h * h, 3 sums, s1 + s2, out
    assert held == {"parameters": w.data.nbytes, "activations": expected_acts}, \
        (f"three views of h (charged to h once), h * h, three sums, their partial and whole total: got {held}; expected parameters "
         f"{w.data.nbytes}, activations {expected_acts}")
    long = Tensor(np.ones(5, np.float32), requires_grad=True)
    y = long
    for _ in range(5000):
        y = y * 1.0
    assert graph_memory(y)["parameters"] == 20, "a graph deeper than Python's recursion limit is walked with a loop"


@pytest.mark.exercise("14.7", "graph_memory")
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


def test_latency_times_one_call_per_repeat_within_its_budget():
    calls = []
    timing = latency(lambda: calls.append(1), warmup=3, repeats=7)
    assert len(calls) == 10 and timing.number == 1 and len(timing.times) == 7
    assert timing.best <= timing.median <= timing.percentile(90) <= max(timing.times)

    def work():
        calls.append(np.ones(2000).sum())   # some nanoseconds on any machine
    calls.clear()
    timing = latency(work, warmup=0, repeats=50, budget_s=1e-12)
    assert len(timing.times) == len(calls) == 3, "a budget spent by the first call still times three calls"
    calls.clear()
    timing = latency(work, warmup=1, repeats=6, budget_s=1e6)
    assert len(timing.times) == 6 and len(calls) == 7, "a budget never spent stops at repeats"
    with pytest.raises(ValueError, match="budget_s > 0"):
        latency(work, budget_s=0)


# ---------------------------------------------------------------------------------------------
# Backward rules: observed while the profiler is active, FLOPs of a whole training step
# ---------------------------------------------------------------------------------------------
def rules_now():
    from tinytorch.core import autograd
    from tinytorch.core import tensor as tensor_module

    return dict(autograd.BACKWARD_RULES), {cls: cls.__dict__["rule"] for cls in tensor_module._NODE_TYPES.values()
                                           if cls.__dict__.get("rule") is not None}


@pytest.mark.exercise("14.5", "Profiler._on_op")
@pytest.mark.parametrize("V,T,E,H,L,B", [(37, 8, 16, 4, 2, 2), (29, 12, 24, 3, 1, 3)])
def test_training_step_flops_forward_and_backward_equal_flop_counter_mode(V, T, E, H, L, B):
    require("14.1", "14.2", "14.4")
    model = GPT(V, T, E, H, L, rng=0)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    before = rules_now()
    with Profiler(model) as prof:
        gpt_step(model, ids, V)
        assert rules_now() == before, "the profiler observes backward (module 06's backward observer): no rule is swapped"
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
def test_observers_are_removed_after_an_error_and_backward_false_observes_no_rule():
    from tinytorch.core import autograd

    before, observers = rules_now(), len(active_op_observers())
    with pytest.raises(ZeroDivisionError):
        with Profiler():
            1 / 0
    assert rules_now() == before and len(active_op_observers()) == observers and not autograd._BACKWARD.fns
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    with Profiler(backward=False) as prof:
        assert not autograd._BACKWARD.fns, "backward=False registers no backward observer"
        (x * x).sum().backward()
    assert [e.kind for e in prof.events] == ["op", "op"] and x.grad is not None
