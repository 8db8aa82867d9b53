"""The op records as the seams of modules 14-20: a profiler, a tracer and per-module paths, built on
module 01's op observers and module 03's forward hooks, checked on the GPT of module 13.

These are prototypes of what the systems modules build (a FLOP counter for 14, a tracer that replays a
forward pass for 17, a per-layer breakdown for 14 and 19): if they can be written in a few lines
against the records, the records are complete enough.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.tensor import Tensor, observe_ops
from tinytorch.models.gpt import GPT

pytestmark = pytest.mark.module("13")

B, T, E, H, L, V = 2, 8, 16, 4, 2, 37


def small_gpt() -> GPT:
    return GPT(vocab_size=V, context_length=T, embed_dim=E, num_heads=H, num_layers=L, rng=0).eval()


def tokens() -> np.ndarray:
    return np.random.default_rng(1).integers(0, V, (B, T))


class FlopProfiler:
    """Counts matmul FLOPs from the op records: 2 * (output elements) * (inner size), batch axes included."""

    def __init__(self):
        self.flops, self.shapes = 0, []

    def __call__(self, node, out):
        if node.op == "matmul":
            a, b = node.inputs[0].shape, node.inputs[1].shape
            self.flops += 2 * math.prod(node.shape) * a[-1]
            self.shapes.append((a, b))


def closed_form_flops(b, t, e, n_layers, vocab) -> int:
    "q, k, v, out projections (4 e^2), scores and weighted values (2 t e), MLP (8 e^2) per token and block; head."
    per_block = 2 * b * t * (4 * e * e + 2 * t * e + 8 * e * e)
    return n_layers * per_block + 2 * b * t * e * vocab


def test_a_profiler_counts_the_matmul_flops_of_a_no_grad_gpt_forward():
    model, idx = small_gpt(), tokens()
    profiler = FlopProfiler()
    with no_grad(), observe_ops(profiler):
        logits = model(idx)
    expected = closed_form_flops(B, T, E, L, V)
    assert logits.grad_fn is None, "a no_grad forward records no graph: the profiler saw the ops through the observer"
    assert profiler.flops == expected, (
        f"matmul FLOPs counted from the records: {profiler.flops:,}; closed form 2*B*T*(12 E^2 + 2 T E) per block "
        f"+ 2*B*T*E*V = {expected:,}")
    assert len(profiler.shapes) == L * 8 + 1, (
        f"{len(profiler.shapes)} matmuls recorded; expected 8 per block (4 projections, 2 in attention, 2 in the MLP) "
        f"+ the head = {L * 8 + 1}")
    before = profiler.flops
    model(idx)
    assert profiler.flops == before, "outside the with block the profiler sees nothing"


def test_the_profiler_agrees_with_torch_flop_counter_on_the_same_matmul_shapes():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    model, idx = small_gpt(), tokens()
    profiler = FlopProfiler()
    with no_grad(), observe_ops(profiler):
        model(idx)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        for a, b in profiler.shapes:
            torch.matmul(torch.zeros(a), torch.zeros(b))
    assert counter.get_total_flops() == profiler.flops, (
        f"torch's FlopCounterMode on the recorded matmul shapes counts {counter.get_total_flops():,} FLOPs; the "
        f"profiler counted {profiler.flops:,}")


def torch_gpt_math(torch, model: GPT):
    """The same GPT in PyTorch with attention written out as matmuls (what FlopCounterMode counts on CPU;
    the fused scaled_dot_product_attention kernel of nn.MultiheadAttention is not counted there)."""
    F = torch.nn.functional
    p = {n: torch.tensor(t.data) for n, t in model.named_parameters()}

    def forward(ids, start=0):
        x = p["tok_emb.weight"][torch.tensor(ids)] + p["pos_emb.weight"][start:start + ids.shape[1]]
        b, t, e = x.shape
        for i, block in enumerate(model.blocks):
            w = {k[len(f"blocks.{i}."):]: v for k, v in p.items() if k.startswith(f"blocks.{i}.")}
            h = F.layer_norm(x, (e,), w["ln1.weight"], w["ln1.bias"])
            heads = block.attn.num_heads
            q, k, v = (F.linear(h, w[f"attn.{n}_proj.weight"], w[f"attn.{n}_proj.bias"]).reshape(b, t, heads, -1).transpose(1, 2)
                       for n in "qkv")
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
            o = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, e)
            x = x + F.linear(o, w["attn.out_proj.weight"], w["attn.out_proj.bias"])
            h = F.gelu(F.linear(F.layer_norm(x, (e,), w["ln2.weight"], w["ln2.bias"]), w["mlp.fc.weight"], w["mlp.fc.bias"]),
                       approximate="tanh")
            x = x + F.linear(h, w["mlp.proj.weight"], w["mlp.proj.bias"])
        return F.linear(F.layer_norm(x, (e,), p["ln_f.weight"], p["ln_f.bias"]), p["head.weight"])

    return forward


def test_flops_from_the_records_equal_flop_counter_mode_on_the_same_torch_gpt():
    """Module 13's section 7.2: FLOPs counted from the op records of a no_grad forward = PyTorch's FlopCounterMode
    on the identical model written in torch = the closed form 2 N T + 4 L T^2 E (matmul weights only)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    model, idx = small_gpt(), tokens()
    profiler = FlopProfiler()
    with no_grad(), observe_ops(profiler):
        ours = model(idx).data
    forward = torch_gpt_math(torch, model)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        theirs = forward(idx)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-4, atol=1e-4, err_msg="the torch model must be the same model")
    n_matmul = L * 12 * E * E + V * E
    closed = 2 * n_matmul * B * T + 4 * L * B * T * T * E
    assert profiler.flops == counter.get_total_flops() == closed, (
        f"FLOPs: op records {profiler.flops:,}, torch FlopCounterMode {counter.get_total_flops():,}, closed form {closed:,}")


def test_a_cached_decode_step_gives_the_full_logits_for_linear_flops():
    """The KV-cache seam (modules 11-13, used by 18): a forward of the first k tokens with one ConcatCache per
    block, then the next token at start_pos=k, gives the full forward's last logits (atol 1e-5); the step's
    matmul FLOPs, counted from the records, are those of one token: 2 N + 4 L (k + 1) E, not the whole prefix's."""
    from tinytorch.core.attention import ConcatCache

    model, idx = small_gpt(), tokens()
    k = T - 1
    with no_grad():
        full = model(idx).data
        caches = [ConcatCache() for _ in model.blocks]
        model(idx[:, :k], cache=caches)
        profiler = FlopProfiler()
        with observe_ops(profiler):
            step = model(idx[:, k:], start_pos=k, cache=caches).data
    np.testing.assert_allclose(step[:, -1], full[:, -1], rtol=0, atol=1e-5,
                               err_msg="the cached step's logits must equal the full forward's last logits")
    n_matmul = L * 12 * E * E + V * E
    expected = B * (2 * n_matmul + 4 * L * (k + 1) * E)
    assert profiler.flops == expected, f"one cached token: {profiler.flops:,} matmul FLOPs counted; expected {expected:,}"


REPLAY = {
    "matmul": lambda a, b, **_: np.matmul(a, b),
    "add": lambda a, b=None, other=None: a + (other if b is None else b),
    "permute": lambda a, dims: np.transpose(a, dims),
    "relu": lambda a: np.maximum(a, 0),
    "sum": lambda a, axis, keepdims: np.sum(a, axis=axis, keepdims=keepdims),
}


def trace(fn, x: Tensor) -> list:
    "The records of every op `fn(x)` runs, in order, as (node, output) pairs."
    records = []
    with no_grad(), observe_ops(lambda node, out: records.append((node, out))):
        fn(x)
    return records


def replay(records, x: Tensor, new_x: np.ndarray) -> np.ndarray:
    "Re-run the recorded ops from op name + attrs + input values, with `new_x` in place of the traced input `x`."
    values = {id(x): new_x}
    for node, out in records:
        args = [values.get(id(t), t.data) for t in node.inputs if t is not None]  # parameters: their own data
        values[id(out)] = REPLAY[node.op](*args, **node.attrs)
    return values[id(records[-1][1])]


def test_a_tracer_replays_an_mlp_forward_from_the_records():
    net = Sequential(Linear(5, 8, rng=0), ReLU(), Linear(8, 3, rng=1))
    x = Tensor(np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32))
    records = trace(lambda t: net(t).sum(axis=1), x)
    assert [n.op for n, _ in records] == ["permute", "matmul", "add", "relu", "permute", "matmul", "add", "sum"], (
        f"recorded ops: {[n.op for n, _ in records]}")
    assert records[-1][0].attrs == {"axis": 1, "keepdims": False}, f"sum's attrs: {records[-1][0].attrs}"
    np.testing.assert_allclose(replay(records, x, x.data), records[-1][1].data, rtol=1e-6,
                               err_msg="replaying the trace on the traced input must give the recorded output")
    new_x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    with no_grad():
        expected = net(Tensor(new_x)).sum(axis=1).data
    np.testing.assert_allclose(replay(records, x, new_x), expected, rtol=1e-5, atol=1e-6,
                               err_msg="replaying the trace on a new input must give the model's output for it")


def test_forward_hooks_give_every_op_of_the_gpt_its_module_path():
    model, idx = small_gpt(), tokens()
    path, per_op = [], []
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, args, name=name: path.append(name)))
        handles.append(module.register_forward_hook(lambda m, args, out: path.pop() and None))
    try:
        with no_grad(), observe_ops(lambda node, out: per_op.append((path[-1], node.op, node.shape))):
            model(idx)
    finally:
        for handle in handles:
            handle.remove()
    assert path == [], f"every pre-hook push has its pop; left {path}"
    q_proj = [(op, shape) for where, op, shape in per_op if where == "blocks.0.attn.q_proj"]
    assert ("matmul", (B, T, E)) in q_proj, f"ops charged to blocks.0.attn.q_proj: {q_proj}; expected its (B, T, E) matmul"
    matmul_paths = sorted({where for where, op, _ in per_op if op == "matmul"})
    expected = sorted([f"blocks.{i}.{p}" for i in range(L) for p in
                       ("attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.fc", "mlp.proj")]
                      + ["head"])
    assert matmul_paths == expected, f"modules whose ops include a matmul: {matmul_paths}; expected {expected}"
    assert not any(m._forward_hooks or m._forward_pre_hooks for _, m in model.named_modules()), "all hooks removed"


# ------------------------------------------------------------------ in-place ops are shown to the observers too
def inplace_records(fn) -> list:
    records = []
    with observe_ops(lambda node, out: records.append((node, out))):
        fn()
    return records


@pytest.mark.parametrize("grad_mode", ["no_grad", "plain"])
def test_in_place_ops_report_a_record_to_the_observers(grad_mode):
    w = Tensor(np.zeros((2, 3), np.float32), requires_grad=grad_mode == "no_grad")
    u = Tensor(np.ones(3, np.float32))
    calls = [("add_", lambda: w.add_(u), (w, u), {}),
             ("add_", lambda: w.add_(u, alpha=0.5), (w, u), {"alpha": 0.5}),
             ("sub_", lambda: w.sub_(2.0), (w, None), {"other": 2.0}),
             ("mul_", lambda: w.mul_(u), (w, u), {}),
             ("fill_", lambda: w.fill_(3), (w, None), {"value": 3}),
             ("zero_", lambda: w.zero_(), (w, None), {"value": 0}),
             ("copy_", lambda: w.copy_(u), (w, u), {})]
    for op, call, inputs, attrs in calls:
        def run():
            if grad_mode == "no_grad":
                with no_grad():
                    call()
            else:
                call()
        records = inplace_records(run)
        assert len(records) == 1, f"{op} must report exactly one record; got {[n.op for n, _ in records]}"
        node, out = records[0]
        assert node.op == op and out is w, f"{op}: record of op {node.op!r}, out is the changed tensor: {out is w}"
        assert len(node.inputs) == len(inputs) and all(a is b for a, b in zip(node.inputs, inputs)), (
            f"{op}: inputs must be (the tensor, the operand or None for a constant); got {node.inputs}")
        assert dict(node.attrs) == attrs, f"{op}: attrs {dict(node.attrs)}; expected {attrs}"
        assert node.shape == (2, 3) and node.dtype == np.float32 and w.grad_fn is None
    with no_grad():
        records = inplace_records(lambda: w.copy_(np.full((2, 3), 7.0)))
    assert records[0][0].inputs == (w, None) and np.array_equal(records[0][0].attrs["src"], np.full((2, 3), 7.0))
    assert np.array_equal(w.data, np.full((2, 3), 7.0)), "the record is made after the change: out holds the new values"


def test_refused_in_place_ops_report_nothing_and_an_observer_sees_an_optimizer_step():
    from tinytorch.core.tensor import INPLACE_OPS

    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    records = []
    with observe_ops(lambda node, out: records.append(node.op)):
        with pytest.raises(RuntimeError, match="cannot be changed in place"):
            w.add_(1.0)
        with pytest.raises(RuntimeError, match="the operand requires grad"):
            Tensor(np.ones(3, np.float32)).add_(w, alpha=2)   # alpha does not bypass the check
    assert records == [], f"a refused in-place op changes nothing and reports nothing; got {records}"
    assert INPLACE_OPS == {"add_", "sub_", "mul_", "fill_", "zero_", "copy_"}
    # an SGD-like step under no_grad: every update is an in-place record on the parameter
    model = Sequential(Linear(4, 3, rng=0), ReLU(), Linear(3, 2, rng=1))
    model(Tensor(np.ones((5, 4), np.float32))).sum().backward()
    seen = []
    with no_grad(), observe_ops(lambda node, out: seen.append((node.op, out))):
        for p in model.parameters():
            p.sub_(p.grad, alpha=0.1)
    assert [op for op, _ in seen] == ["sub_"] * len(model.parameters()) and all(
        out is p for (_, out), p in zip(seen, model.parameters())), f"one sub_ record per parameter; got {seen}"
