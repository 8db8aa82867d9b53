"""Module 13 (transformers): `tinytorch.models.gpt` against an equivalent PyTorch model.

LayerNorm is compared with `torch.nn.functional.layer_norm` on hypothesis-drawn shapes; a
transformer block and a whole GPT with a PyTorch model built from `nn.Embedding`, `nn.LayerNorm`,
`nn.MultiheadAttention` and `nn.Linear` in the same arrangement, loaded with the same weights
through the documented parameter names: logits and every parameter's gradient must agree.
Causality and generation (seeded reproducibility, top-k, greedy) are properties. Without PyTorch
(a student edition) the same tests compare with the NumPy references of `tests/support/refs.py`
(`layer_norm`, `transformer_block`, `gpt_logits`) and float64 central differences for the
gradients, so nothing skips.

The serving seams: a forward over the first k tokens with one `ConcatCache` per block, then the
next tokens at `start_pos=k`, gives the full forward's logits; an `attention_mask` with left or
right padding gives each sequence's unpadded logits; wrong caches and masks are named. Sampling
(`sample_next`) is checked statistically against the distribution PyTorch computes
(`softmax(topk-filtered logits / temperature)`), and `generate` against the bugs that slip past a
quick look: an ignored temperature or top_k, a generator re-seeded at every step.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.attention import ConcatCache
from tinytorch.core.autograd import no_grad
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.tensor import Tensor
from tinytorch.models.gpt import GPT, LayerNorm, LayerNormFunction, TransformerBlock, sample_next
from tests.support import params, refs
from tests.support.families import check_row, family_rows
from tests.support.refs import numeric_grads, torch_or_none

pytestmark = pytest.mark.module("13")


def check_fd(pairs, fn, arrays, upstream, what, rtol=1e-3, atol=1e-4):
    "Without torch: each (name, Tensor) of `pairs` against the central-difference gradient of `fn` at `arrays`."
    for (name, t), (g, ok) in zip(pairs, numeric_grads(fn, arrays, upstream)):
        np.testing.assert_allclose(t.grad.data, np.where(ok, g, t.grad.data), rtol=rtol, atol=atol,
                                   err_msg=f"{what}: gradient of {name} (central differences)")


LN_SHAPES = st.tuples(st.lists(st.integers(1, 4), max_size=2), st.integers(2, 8)).map(lambda t: (*t[0], t[1]))


@pytest.mark.exercise("13.1", "LayerNormFunction.forward")
@settings(max_examples=30, deadline=None)
@given(shape=LN_SHAPES, seed=st.integers(0, 2**16))
def test_layernorm_forward_matches_torch(shape, seed):
    torch = torch_or_none()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    out = LayerNormFunction.apply(Tensor(x), Tensor(w), Tensor(b))
    if torch is None:
        expected = refs.layer_norm(x.astype(np.float64), w, b)
    else:
        expected = torch.nn.functional.layer_norm(torch.tensor(x), (shape[-1],), torch.tensor(w), torch.tensor(b)).numpy()
    assert out.dtype == np.float32 and out.shape == x.shape, f"LayerNorm keeps shape and dtype; got {out.shape} {out.dtype}"
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-4,
                               err_msg=f"LayerNorm forward (biased variance, eps inside the square root), shape {shape}")


@pytest.mark.exercise("13.2", "LayerNormFunction.backward")
@settings(max_examples=30, deadline=None)
@given(shape=LN_SHAPES, seed=st.integers(0, 2**16))
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
    # the reference in float64: two float32 implementations both round, and on a row whose values nearly agree
    # (two values 5.40 and 5.35) PyTorch's float32 gradient was further from the exact one than ours. The float32
    # error grows with the row's conditioning, max |x| / std (3,000 random cases: at most 41 x eps x that x max |g|)
    tt = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b)]
    tout = torch.nn.functional.layer_norm(tt[0], (shape[-1],), tt[1], tt[2], eps=1e-5)
    (tout * torch.tensor(up, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg=f"LayerNorm forward, shape {shape}")
    x64 = x.astype(np.float64)
    cond = float((np.abs(x64).max(-1) / np.sqrt(x64.var(-1) + 1e-5)).max())
    for name, a, c in zip(("x", "weight", "bias"), ts, tt):
        g = c.grad.numpy()
        atol = 1e-4 + 100 * np.finfo(np.float32).eps * cond * max(float(np.abs(g).max()), 1.0)
        np.testing.assert_allclose(a.grad.data, g, rtol=1e-3, atol=atol,
                                   err_msg=f"LayerNorm gradient of {name}, shape {shape} (conditioning {cond:.0f})")


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


@pytest.mark.exercise("13.3", "TransformerBlock.forward")
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


@pytest.mark.exercise("13.5", "GPT.forward")
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


@pytest.mark.exercise("13.5", "GPT.forward")
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


@pytest.mark.exercise("13.6", "GPT.generate")
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


@pytest.mark.exercise("13.6", "GPT.generate")
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


@pytest.mark.exercise("13.3", "TransformerBlock.forward")
def test_block_passes_cache_and_padding_mask_to_the_attention():
    block = TransformerBlock(8, 2, rng=3)
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    with no_grad():
        full = block(Tensor(x)).data
        cache = ConcatCache()
        parts = [block(Tensor(x[:, :2]), cache=cache).data, block(Tensor(x[:, 2:3]), cache=cache).data,
                 block(Tensor(x[:, 3:]), cache=cache).data]
        assert cache.seq_len == 5, f"the block must hand its cache to the attention: it holds {cache.seq_len} of 5 positions"
        np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=1e-5, atol=1e-5,
                                   err_msg="block over 2 + 1 + 2 cached positions vs the full block")
        pad = np.zeros((2, 5), bool)
        pad[0, :2] = True
        h = block.ln1(Tensor(x))
        want = Tensor(x) + block.attn(h, is_causal=True, key_padding_mask=pad)
        want = (want + block.mlp(block.ln2(want))).data
        np.testing.assert_allclose(block(Tensor(x), key_padding_mask=pad).data, want, rtol=1e-5, atol=1e-5,
                                   err_msg="key_padding_mask must reach the attention unchanged")


@pytest.mark.exercise("13.3", "TransformerBlock.forward")
def test_block_keeps_both_residuals():
    """With the attention and MLP outputs zeroed, a pre-norm block is the identity (both residuals kept)."""
    block = TransformerBlock(8, 2, rng=1)
    for lin in (block.attn.out_proj, block.mlp.proj):
        lin.weight.data[:] = 0
        lin.bias.data[:] = 0
    x = np.random.default_rng(2).standard_normal((1, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(block(Tensor(x)).data, x, atol=1e-6,
                               err_msg="with zero sub-layer outputs the block must return its input (x + 0 + 0)")


# ---------------------------------------------------------------------------------------------
# Exercise 13.4: sampling, against the distribution PyTorch computes
# ---------------------------------------------------------------------------------------------
def expected_probs(row, temperature, top_k):
    "softmax(logits / temperature) after keeping the top_k largest (torch where installed, else NumPy)."
    torch = torch_or_none()
    if torch is None:
        z = np.asarray(row, np.float64) / temperature
        if top_k is not None and top_k < z.size:
            z = np.where(z < np.sort(z)[-top_k], -np.inf, z)
        return refs.softmax(z)
    z = torch.tensor(row, dtype=torch.float64) / temperature
    if top_k is not None and top_k < z.numel():
        kth = torch.topk(z, top_k).values[-1]
        z = z.masked_fill(z < kth, float("-inf"))
    return torch.softmax(z, dim=-1).numpy()


@pytest.mark.exercise("13.4", "sample_next")
@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (2.0, None), (1.0, 2), (0.7, 3), (3.0, 1)])
def test_sampling_frequencies_match_the_distribution(temperature, top_k):
    row = np.array([0.3, -1.0, 1.2, 0.9, -0.2])
    n = 8000
    draws = sample_next(np.tile(row, (n, 1)), temperature=temperature, top_k=top_k, rng=11)
    assert draws.shape == (n,) and draws.dtype == np.int64, f"one int64 id per row; got {draws.shape} {draws.dtype}"
    freq = np.bincount(draws, minlength=5) / n
    p = expected_probs(row, temperature, top_k)
    assert np.all(freq[p == 0] == 0), f"temperature {temperature}, top_k {top_k}: tokens outside the top k were sampled: {freq.round(3)}"
    tol = 5 * np.sqrt(p * (1 - p) / n) + 1e-3
    assert np.all(np.abs(freq - p) <= tol), (
        f"temperature {temperature}, top_k {top_k}: sampled frequencies {freq.round(3)}, expected {p.round(3)}")


@pytest.mark.exercise("13.4", "sample_next")
def test_sampling_greedy_ties_seeds_and_generators():
    logits = np.array([[0.0, 5.0, 1.0], [2.0, -1.0, 0.5]])
    assert sample_next(logits, temperature=0).tolist() == [1, 0]
    gen = np.random.default_rng(0)
    state = gen.bit_generator.state
    sample_next(logits, temperature=0, rng=gen)
    assert gen.bit_generator.state == state, "greedy decoding must not draw random numbers"
    tied = np.tile([1.0, 3.0, 3.0, 0.0], (4000, 1))
    freq = np.bincount(sample_next(tied, top_k=1, rng=0), minlength=4) / 4000
    assert freq[0] == freq[3] == 0 and 0.45 < freq[1] < 0.55, f"top_k=1 with a tie keeps both tied tokens; got {freq}"
    big = np.tile(np.linspace(0, 1, 6), (64, 1))
    assert np.array_equal(sample_next(big, rng=5), sample_next(big, rng=5)), "the same seed gives the same draws"
    gen = np.random.default_rng(9)
    assert not np.array_equal(sample_next(big, rng=gen), sample_next(big, rng=gen)), "a Generator passed in must advance"
    assert sample_next(big, top_k=100, rng=0).shape == (64,), "top_k larger than the vocabulary keeps everything"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "sample_next: temperature must be >= 0 (0 is greedy); got -0.5"),
    (dict(top_k=0), "sample_next: top_k must be a positive integer or None; got 0"),
    (dict(top_k=2.0), "sample_next: top_k must be a positive integer or None; got 2.0"),
])
def test_sampling_errors_are_named(kwargs, message):
    with pytest.raises(ValueError) as info:
        sample_next(np.zeros((1, 3)), **kwargs)
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        sample_next(np.zeros(3))
    assert str(info.value) == "sample_next: logits must be 2-D (batch, vocab); got shape (3,)"


# ---------------------------------------------------------------------------------------------
# Exercise 13.5: the serving seams of GPT.forward (start_pos, caches, padding)
# ---------------------------------------------------------------------------------------------
def cache_model(seed=0):
    return GPT(vocab_size=13, context_length=12, embed_dim=16, num_heads=4, num_layers=2, rng=seed).eval()


@pytest.mark.exercise("13.5", "GPT.forward")
@settings(max_examples=15, deadline=None)
@given(t=st.integers(2, 12), data=st.data(), seed=st.integers(0, 2**16))
def test_cached_forward_equals_the_full_forward(t, data, seed):
    """forward(first k tokens, caches) then forward(next token, start_pos=k, caches), token by token to the
    end, gives the full forward's logits at every position (atol 1e-5)."""
    model = cache_model(seed % 5)
    ids = np.random.default_rng(seed).integers(0, 13, (2, t))
    k = data.draw(st.integers(1, t - 1), label="k (cached prefix)")
    with no_grad():
        full = model(ids).data
        caches = [ConcatCache() for _ in model.blocks]
        got = [model(ids[:, :k], cache=caches).data]
        for pos in range(k, t):
            got.append(model(ids[:, pos:pos + 1], start_pos=pos, cache=caches).data)
    assert all(c.seq_len == t for c in caches), f"every block's cache must hold all {t} positions: {[c.seq_len for c in caches]}"
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, rtol=0, atol=1e-5,
                               err_msg=f"cached decoding of {t} tokens after a prefix of {k} vs the full forward")


@pytest.mark.exercise("13.5", "GPT.forward")
def test_start_pos_without_a_cache_moves_the_positions():
    model = cache_model()
    ids = np.random.default_rng(0).integers(0, 13, (1, 4))
    with no_grad():
        shifted = model(ids, start_pos=3).data
    expected = refs.gpt_logits(ids, {n: p.data for n, p in model.named_parameters()}, 4, 2, start_pos=3)
    np.testing.assert_allclose(shifted, expected, rtol=1e-4, atol=1e-4, err_msg="positions 3..6 must use rows 3..6 of pos_emb")


@pytest.mark.exercise("13.5", "GPT.forward")
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_with_attention_mask_gives_the_unpadded_logits(side):
    model = cache_model(1)
    rng = np.random.default_rng(2)
    lengths = [7, 4, 1]
    seqs = [rng.integers(0, 13, n) for n in lengths]
    width = max(lengths)
    ids = np.full((3, width), 5, dtype=np.int64)   # padding id 5: any real id, the mask must hide it
    mask = np.zeros((3, width), dtype=np.int64)
    for r, sq in enumerate(seqs):
        cols = slice(width - len(sq), width) if side == "left" else slice(0, len(sq))
        ids[r, cols], mask[r, cols] = sq, 1
    with no_grad():
        batched = model(ids, attention_mask=mask).data
        for r, sq in enumerate(seqs):
            alone = model(sq[None]).data[0]
            real = batched[r][mask[r] == 1]
            np.testing.assert_allclose(real, alone, rtol=0, atol=1e-5,
                                       err_msg=f"{side} padding: row {r} ({len(sq)} tokens) differs from the unpadded sequence")
        assert np.isfinite(batched).all(), "padding positions must not produce NaN"


@pytest.mark.exercise("13.5", "GPT.forward")
def test_left_padded_batch_decodes_with_caches():
    """Batched serving: a left-padded batch, prefilled with caches, then one token per step with the growing mask."""
    model = cache_model(2)
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 13, 6), rng.integers(0, 13, 3)
    ids = np.zeros((2, 6), np.int64)
    ids[0], ids[1, 3:] = a, b
    mask = np.ones((2, 6), np.int64)
    mask[1, :3] = 0
    nxt = rng.integers(0, 13, (2, 3))
    with no_grad():
        caches = [ConcatCache() for _ in model.blocks]
        model(ids, cache=caches, attention_mask=mask)
        for step in range(3):
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
            out = model(nxt[:, step:step + 1], start_pos=6 + step, cache=caches, attention_mask=mask).data[:, 0]
            for r, prompt in enumerate((a, b)):
                alone = model(np.concatenate([prompt, nxt[r, :step + 1]])[None]).data[0, -1]
                np.testing.assert_allclose(out[r], alone, rtol=0, atol=1e-5,
                                           err_msg=f"step {step}, row {r}: cached, padded decoding vs the sequence alone")


@pytest.mark.parametrize("call, message", [
    (lambda m, ids: m(ids, cache=[ConcatCache()]),
     "GPT: cache must be a list of 2 layer caches (one per block); got list of length 1"),
    (lambda m, ids: m(ids, cache=ConcatCache()),
     "GPT: cache must be a list of 2 layer caches (one per block); got ConcatCache"),
    (lambda m, ids: m(ids, attention_mask=np.ones((2, 4))),
     "GPT: attention_mask must have shape (batch, start_pos + seq) = (2, 3) for ids of shape (2, 3) at start_pos=0; got (2, 4)"),
    (lambda m, ids: m(ids, start_pos=2, attention_mask=np.ones((2, 3))),
     "GPT: attention_mask must have shape (batch, start_pos + seq) = (2, 5) for ids of shape (2, 3) at start_pos=2; got (2, 3)"),
    (lambda m, ids: m(ids, attention_mask=np.full((2, 3), 2)),
     "GPT: attention_mask must hold 1 (token) and 0 (padding) only; got values [2]"),
    (lambda m, ids: m(ids, start_pos=10),
     "GPT: start_pos=10 + 3 tokens = 13 exceeds context_length=12: the positional table has no row for position 12"),
    (lambda m, ids: m(ids, start_pos=-1), "GPT: start_pos must be a non-negative integer; got -1"),
    (lambda m, ids: m(np.zeros((2, 13), np.int64)),
     "GPT: a sequence of 13 tokens is longer than context_length=12; crop it to the last 12 tokens"),
])
def test_serving_errors_name_the_shapes(call, message):
    model = GPT(13, 12, 8, 2, 2, rng=0)
    with pytest.raises(ValueError) as info:
        call(model, np.zeros((2, 3), np.int64))
    assert str(info.value) == message


@pytest.mark.exercise("13.5", "GPT.forward")
def test_a_cache_of_the_wrong_length_is_named():
    model = GPT(13, 12, 8, 2, 2, rng=0)
    caches = [ConcatCache() for _ in model.blocks]
    with no_grad():
        model(np.zeros((1, 4), np.int64), cache=caches)
    with pytest.raises(ValueError) as info:
        model(np.zeros((1, 1), np.int64), start_pos=3, cache=caches)
    assert str(info.value) == ("GPT: the cache of block 0 holds 4 positions but start_pos=3: the new tokens must start where "
                               "the cached ones end (start_pos = 4)")


# ---------------------------------------------------------------------------------------------
# Exercise 13.6: generate, against the bugs a quick look misses
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("13.6", "GPT.generate")
def test_generate_uses_one_generator_for_the_whole_loop():
    model = GPT(9, 8, 8, 2, 1, rng=0)
    model.head.weight.data[:] = 0.0   # uniform next-token distribution at every step
    new = model.generate(np.array([[1, 2]]), 40, seed=0)[0, 2:]
    assert len(set(new.tolist())) > 3, f"40 tokens from a uniform distribution over 9: {new.tolist()}: is the generator re-seeded each step?"
    expected, rng = [], np.random.default_rng(0)
    for _ in range(40):
        expected.append(int(sample_next(np.zeros((1, 9)), 1.0, None, rng)[0]))
    assert new.tolist() == expected, "generate must draw with sample_next from ONE generator made from the seed"


@pytest.mark.exercise("13.6", "GPT.generate")
def test_generate_samples_from_the_eval_mode_model_even_with_dropout():
    model = GPT(12, 6, 16, 2, 2, dropout=0.5, rng=4)
    prompt = np.array([[3, 1, 4], [2, 2, 7]])
    got = model.generate(prompt, 8, temperature=0)
    seq = prompt
    model.eval()
    with no_grad():
        for _ in range(8):
            seq = np.concatenate([seq, model(seq[:, -6:]).data[:, -1].argmax(-1)[:, None]], axis=1)
    model.train()
    assert np.array_equal(got, seq), (f"greedy tokens of a model with dropout 0.5: got {got[:, 3:].tolist()}, the "
                                      f"eval-mode model gives {seq[:, 3:].tolist()}: is dropout on while generate samples?")
    assert model.training, "generate must give the model back in training mode when it was training"


@pytest.mark.exercise("13.6", "GPT.generate")
def test_generate_passes_temperature_and_top_k_on():
    model = GPT(12, 6, 16, 2, 1, rng=3)
    prompt = np.array([[3, 1, 4]])
    greedy = model.generate(prompt, 8, temperature=0)
    assert np.array_equal(model.generate(prompt, 8, temperature=1e-6, seed=0), greedy), \
        "a temperature near 0 gives the greedy tokens: is the temperature passed to sample_next?"
    assert np.array_equal(model.generate(prompt, 8, top_k=1, seed=0), greedy), "top_k=1 gives the greedy tokens: is top_k passed on?"
    hot = [model.generate(prompt, 8, temperature=50.0, seed=s)[0, 3:] for s in range(5)]
    assert any(not np.array_equal(h, greedy[0, 3:]) for h in hot), "a high temperature must leave the greedy path"
    model.eval()
    model.generate(prompt, 1, seed=0)
    assert not model.training, "generate must restore eval mode as it found it"


@pytest.mark.exercise("13.6", "GPT.generate")
def test_generate_is_unchanged_by_the_serving_seams():
    """Generation without a cache: the same tokens as the loop of forward + sample_next on the cropped window."""
    model = GPT(10, 5, 8, 2, 2, rng=4)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, 6, temperature=0.9, top_k=4, seed=8)
    seq, rng = prompt.copy(), np.random.default_rng(8)
    model.eval()
    with no_grad():
        for _ in range(6):
            logits = model(seq[:, -5:]).data[:, -1, :]
            seq = np.concatenate([seq, sample_next(logits, 0.9, 4, rng)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)


def test_parameter_count_matches_torch():
    torch = torch_or_none()
    model = GPT(13, 8, 16, 4, 2, rng=0)
    per_block = 12 * 16 * 16 + 13 * 16
    assert model.num_parameters() == 13 * 16 + 8 * 16 + 2 * per_block + 2 * 16 + 13 * 16
    if torch is not None:
        nn = torch.nn
        blocks = [TorchBlock(torch, 16, 4) for _ in range(2)]
        theirs = 13 * 16 + 8 * 16 + sum(p.numel() for b in blocks for m in (b.ln1, b.ln2, b.attn, b.fc, b.proj)
                                          for p in m.parameters()) + sum(p.numel() for p in nn.LayerNorm(16).parameters()) \
            + nn.Linear(16, 13, bias=False).weight.numel()
        assert model.num_parameters() == theirs, f"ours {model.num_parameters():,}, the same torch model {theirs:,}"


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
