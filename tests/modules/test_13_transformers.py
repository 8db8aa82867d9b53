"""Module 13 (transformers): `tinytorch.models.gpt` against an equivalent PyTorch model.

LayerNorm is compared with `torch.nn.functional.layer_norm` on hypothesis-drawn shapes; a
transformer block and a whole GPT with a PyTorch model built from `nn.Embedding`, `nn.LayerNorm`,
`nn.MultiheadAttention` and `nn.Linear` in the same arrangement, loaded with the same weights
through the documented parameter names: logits and every parameter's gradient must agree.
Causality and generation (seeded reproducibility, top-k, greedy) are properties. Without PyTorch
(a student edition) the same tests compare with the NumPy references of `tests/support/refs.py`
(`layer_norm`, `transformer_block`, `gpt_logits`) and float64 central differences for the
gradients, so nothing skips.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.autograd import no_grad
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.tensor import Tensor
from tinytorch.models.gpt import GPT, LayerNorm, LayerNormFunction, TransformerBlock
from tests.support import params, refs
from tests.support.families import check_row, family_rows
from tests.support.refs import numeric_grads, torch_or_none

pytestmark = pytest.mark.module("13")


def check_fd(pairs, fn, arrays, upstream, what, rtol=1e-3, atol=1e-4):
    "Without torch: each (name, Tensor) of `pairs` against the central-difference gradient of `fn` at `arrays`."
    for (name, t), (g, ok) in zip(pairs, numeric_grads(fn, arrays, upstream)):
        np.testing.assert_allclose(t.grad.data, np.where(ok, g, t.grad.data), rtol=rtol, atol=atol,
                                   err_msg=f"{what}: gradient of {name} (central differences)")


@pytest.mark.exercise("13.1", "LayerNormFunction.forward")
@settings(max_examples=30, deadline=None)
@given(shape=st.tuples(st.lists(st.integers(1, 4), max_size=2), st.integers(2, 8)).map(lambda t: (*t[0], t[1])), seed=st.integers(0, 2**16))
def test_layernorm_matches_torch(shape, seed):
    torch = torch_or_none()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)  # a normalised axis of size 1 has gradient 0 exactly: size >= 2
    w, b = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    up = rng.standard_normal(shape).astype(np.float32)
    ts = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    out = LayerNormFunction.apply(*ts)
    (out * Tensor(up)).sum().backward()
    if torch is None:
        np.testing.assert_allclose(out.data, refs.layer_norm(x.astype(np.float64), w, b), rtol=1e-4, atol=1e-4,
                                   err_msg=f"LayerNorm forward (NumPy reference), shape {shape}")
        check_fd(list(zip(("x", "weight", "bias"), ts)), refs.layer_norm, [x, w, b], up, f"LayerNorm, shape {shape}")
        return
    tt = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    tout = torch.nn.functional.layer_norm(tt[0], (shape[-1],), tt[1], tt[2], eps=1e-5)
    (tout * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg=f"LayerNorm forward, shape {shape}")
    for name, a, c in zip(("x", "weight", "bias"), ts, tt):
        np.testing.assert_allclose(a.grad.data, c.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=f"LayerNorm gradient of {name}, shape {shape}")


def test_layernorm_rejects_wrong_width():
    with pytest.raises(ValueError, match="size 4"):
        LayerNorm(4)(Tensor(np.ones((2, 3))))


class TorchBlock:
    "The same pre-norm block in PyTorch, built from torch.nn modules."

    def __init__(self, torch, E, H):
        nn = torch.nn
        self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.fc, self.proj = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)
        self.torch = torch

    def load(self, block: TransformerBlock):
        t = self.torch
        with t.no_grad():
            for mine, theirs in ((block.ln1, self.ln1), (block.ln2, self.ln2), (block.mlp.fc, self.fc), (block.mlp.proj, self.proj)):
                theirs.weight.copy_(t.tensor(mine.weight.data))
                theirs.bias.copy_(t.tensor(mine.bias.data))
            a = block.attn
            self.attn.in_proj_weight.copy_(t.tensor(np.concatenate([a.q_proj.weight.data, a.k_proj.weight.data, a.v_proj.weight.data])))
            self.attn.in_proj_bias.copy_(t.tensor(np.concatenate([a.q_proj.bias.data, a.k_proj.bias.data, a.v_proj.bias.data])))
            self.attn.out_proj.weight.copy_(t.tensor(a.out_proj.weight.data))
            self.attn.out_proj.bias.copy_(t.tensor(a.out_proj.bias.data))
        return self

    def __call__(self, x):
        t = self.torch
        n = x.shape[1]
        mask = t.triu(t.ones(n, n, dtype=t.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.proj(t.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def pairs(self, block):
        a = block.attn
        return [(block.ln1.weight, self.ln1.weight), (block.mlp.fc.weight, self.fc.weight), (block.mlp.proj.weight, self.proj.weight),
                (a.out_proj.weight, self.attn.out_proj.weight)]


@pytest.mark.exercise("13.2", "TransformerBlock.forward")
@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 2), t=st.integers(1, 6), heads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_block_matches_torch(b, t, heads, seed):
    torch = torch_or_none()
    E = 8
    block = TransformerBlock(E, heads, rng=seed)
    x = np.random.default_rng(seed).standard_normal((b, t, E)).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    y = block(xt)
    (y * y).sum().backward()
    if torch is None:
        params = {n: p.data for n, p in block.named_parameters()}
        checked = ["ln1.weight", "mlp.fc.weight", "mlp.proj.weight", "attn.out_proj.weight"]

        def loss(x_, *ws):
            out = refs.transformer_block(x_, {**params, **dict(zip(checked, ws))}, heads)
            return out * out

        np.testing.assert_allclose(y.data, refs.transformer_block(x, params, heads), rtol=1e-4, atol=1e-4,
                                   err_msg="block output (NumPy reference)")
        named = dict(block.named_parameters())
        check_fd([("x", xt)] + [(n, named[n]) for n in checked], loss, [x] + [params[n] for n in checked],
                 np.ones(y.shape), "block", atol=1e-3)
        return
    tb = TorchBlock(torch, E, heads).load(block)
    tx = torch.tensor(x, requires_grad=True)
    ty = tb(tx)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.data, ty.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg="block output")
    np.testing.assert_allclose(xt.grad.data, tx.grad.numpy(), rtol=1e-3, atol=1e-3, err_msg="block input gradient")
    for ours, theirs in tb.pairs(block):
        np.testing.assert_allclose(ours.grad.data, theirs.grad.numpy(), rtol=1e-3, atol=1e-3, err_msg="block parameter gradient")


def torch_gpt(torch, model: GPT):
    "An equivalent torch model, loaded through the documented parameter names; returns (forward, params by name)."
    nn = torch.nn
    E = model.tok_emb.embedding_dim
    state = dict(model.named_parameters())
    tok, pos = nn.Embedding(*model.tok_emb.weight.shape), nn.Parameter(torch.tensor(state["pos_emb.weight"].data))
    blocks = [TorchBlock(torch, E, b.attn.num_heads).load(b) for b in model.blocks]
    ln_f, head = nn.LayerNorm(E), nn.Linear(E, model.vocab_size, bias=False)
    with torch.no_grad():
        tok.weight.copy_(torch.tensor(state["tok_emb.weight"].data))
        ln_f.weight.copy_(torch.tensor(state["ln_f.weight"].data))
        ln_f.bias.copy_(torch.tensor(state["ln_f.bias"].data))
        head.weight.copy_(torch.tensor(state["head.weight"].data))

    def forward(ids):
        x = tok(torch.tensor(ids)) + pos[: ids.shape[1]]
        for b in blocks:
            x = b(x)
        return head(ln_f(x))

    named = {"tok_emb.weight": tok.weight, "pos_emb.weight": pos, "ln_f.weight": ln_f.weight, "head.weight": head.weight}
    for i, b in enumerate(blocks):
        named[f"blocks.{i}.mlp.fc.weight"] = b.fc.weight
        named[f"blocks.{i}.ln2.bias"] = b.ln2.bias
    return forward, named


@pytest.mark.exercise("13.3", "GPT.forward")
def test_gpt_logits_and_gradients_match_torch():
    torch = torch_or_none()
    model = GPT(vocab_size=13, context_length=8, embed_dim=16, num_heads=4, num_layers=2, rng=0)
    ids = np.random.default_rng(1).integers(0, 13, (3, 7))
    targets = np.random.default_rng(2).integers(0, 13, (3, 7))
    logits = model(ids)
    loss = CrossEntropyLoss()(logits.reshape(-1, 13), targets.reshape(-1))
    loss.backward()
    if torch is None:
        params = {n: p.data for n, p in model.named_parameters()}
        np.testing.assert_allclose(logits.data, refs.gpt_logits(ids, params, 4, 2), rtol=1e-4, atol=1e-4,
                                   err_msg="GPT logits (NumPy reference)")
        checked = ["tok_emb.weight", "pos_emb.weight", "ln_f.weight", "head.weight", "blocks.0.ln2.bias",
                   "blocks.1.ln2.bias", "blocks.1.attn.out_proj.weight"]

        def ce(*ws):
            z = refs.gpt_logits(ids, {**params, **dict(zip(checked, ws))}, 4, 2)
            return refs.cross_entropy(z.reshape(-1, 13), targets.reshape(-1))

        ours = dict(model.named_parameters())
        check_fd([(n, ours[n]) for n in checked], ce, [params[n] for n in checked], 1.0, "GPT", atol=1e-5)
        return
    forward, named = torch_gpt(torch, model)
    tlogits = forward(ids)
    tloss = torch.nn.functional.cross_entropy(tlogits.reshape(-1, 13), torch.tensor(targets.reshape(-1)))
    tloss.backward()
    np.testing.assert_allclose(logits.data, tlogits.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg="GPT logits")
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    ours = dict(model.named_parameters())
    for name, theirs in named.items():
        np.testing.assert_allclose(ours[name].grad.data, theirs.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=f"gradient of {name}")


def test_parameter_names_are_documented_and_complete():
    model = GPT(10, 6, 8, 2, 3, rng=0)
    names = [n for n, _ in model.named_parameters()]
    per_block = ["ln1.weight", "ln1.bias", "attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight", "attn.k_proj.bias",
                 "attn.v_proj.weight", "attn.v_proj.bias", "attn.out_proj.weight", "attn.out_proj.bias", "ln2.weight", "ln2.bias",
                 "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
    expected = ["tok_emb.weight", "pos_emb.weight"] + [f"blocks.{i}.{n}" for i in range(3) for n in per_block] + \
               ["ln_f.weight", "ln_f.bias", "head.weight"]
    assert names == expected, f"parameter names differ from the documented layout:\n{names}"


@pytest.mark.exercise("13.3", "GPT.forward")
@settings(max_examples=15, deadline=None)
@given(t=st.integers(2, 8), data=st.data(), seed=st.integers(0, 2**16))
def test_future_tokens_never_change_earlier_logits(t, data, seed):
    model = GPT(9, 8, 8, 2, 2, rng=seed % 7)
    ids = np.random.default_rng(seed).integers(0, 9, (2, t))
    p = data.draw(st.integers(1, t - 1), label="changed position")
    changed = ids.copy()
    changed[:, p] = (changed[:, p] + 1 + data.draw(st.integers(0, 7))) % 9
    with no_grad():
        a, b = model(ids).data, model(changed).data
    np.testing.assert_allclose(a[:, :p], b[:, :p], rtol=0, atol=1e-5,
                               err_msg=f"changing token {p} changed the logits at earlier positions")


@pytest.mark.exercise("13.4", "GPT.generate")
def test_generate_is_reproducible_and_respects_top_k():
    model = GPT(12, 6, 16, 2, 1, rng=0)
    prompt = np.array([[3, 1, 4]])
    a, b = model.generate(prompt, 10, seed=5), model.generate(prompt, 10, seed=5)
    assert a.shape == (1, 13) and np.array_equal(a, b), "the same seed must give the same 10 tokens"
    for seed in range(20):
        seq = model.generate(prompt, 3, top_k=3, seed=seed, temperature=2.0)
        for step in range(3):
            with no_grad():
                logits = model(seq[:, :3 + step][:, -6:]).data[0, -1]
            allowed = np.argsort(logits)[-3:]
            assert seq[0, 3 + step] in allowed, f"top_k=3 sampled {seq[0, 3 + step]} outside the top 3 {allowed} (seed {seed})"


@pytest.mark.exercise("13.4", "GPT.generate")
def test_greedy_generation_and_context_cropping():
    model = GPT(8, 4, 8, 2, 1, rng=1)
    seq = model.generate(np.array([[1, 2, 3, 4]]), 4, temperature=0)
    for i in range(4):
        with no_grad():
            expected = model(seq[:, :4 + i][:, -4:]).data[0, -1].argmax()
        assert seq[0, 4 + i] == expected, "temperature 0 must pick the argmax of the last 4 tokens' logits"
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([[1]]), 1, temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(np.array([[1]]), 1, top_k=0)


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="num_layers"):
        GPT(10, 4, 8, 2, 0)
    with pytest.raises(ValueError, match="divisible"):
        GPT(10, 4, 10, 3, 1)


# ---------------------------------------------------------------------------------------------
# The module's rows of the shared reference table (tests/support/families.py): value and every
# input's gradient against torch, or without torch against NumPy and central differences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", params(family_rows("13"), "grad"))
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_family_rows_match_the_reference(op, data, seed):
    check_row(op, data.draw(op.inputs(), label="case"), seed)
