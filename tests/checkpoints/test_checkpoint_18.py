"""Checkpoint 18: does your GPT generate faster from a cache, with the same text, and share a paged pool?

Modules 01-06 and 11-13 train a small character-level GPT on the bundled corpus for a few seconds;
module 18 then serves it: `generate_cached` (a preallocated `KVCache` per block) must write exactly
the story `generate` writes for the same seed, at several temperatures and past the context (where
the window slides), with a single prefill and one one-token forward per step, and so must the same
loop run by `FusedGPT` (`engine="fused"`). Three prompts are then
decoded interleaved from one small `PagedKVCache`, a finished one freeing its blocks for a new
request, and each must get the tokens of its own contiguous greedy decoding; a request the pool
cannot hold is refused without disturbing the others.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.autograd import no_grad
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.data.loader import load_text_corpus
from tinytorch.models.gpt import GPT
from tinytorch.perf.kv_cache import PagedKVCache, generate_cached

pytestmark = pytest.mark.module("18")


def train_tiny_gpt():
    text = load_text_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    V, T = len(chars), 24
    model = GPT(V, T, 48, 4, 2, rng=0)
    params = model.parameters()
    bufs = [np.zeros_like(p.data) for p in params]
    rng = np.random.default_rng(0)
    for _ in range(60):
        starts = rng.integers(0, len(ids) - T - 1, 32)
        x = np.stack([ids[s:s + T] for s in starts])
        y = np.stack([ids[s + 1:s + T + 1] for s in starts])
        loss = CrossEntropyLoss()(model(x).reshape(-1, V), y.reshape(-1))
        for p in params:
            p.grad = None
        loss.backward()
        with no_grad():
            for p, b in zip(params, bufs):
                b *= 0.9
                b += p.grad.data
                p.data -= 0.1 * b
    return model.eval(), chars, stoi, loss.item()


def test_cached_and_paged_serving_of_a_trained_gpt():
    model, chars, stoi, loss = train_tiny_gpt()
    assert loss < np.log(len(chars)) - 0.8, f"the GPT did not learn (loss {loss:.2f}); fix modules 01-13 first"
    prompt = np.array([[stoi[c] for c in "Once upon a time"]])
    for kw in (dict(temperature=0), dict(temperature=0.8, top_k=10, seed=1), dict(temperature=1.2, seed=7)):
        plain = model.generate(prompt, 30, **kw)                 # 46 tokens > context 24: the window slides
        cached = generate_cached(model, prompt, 30, **kw)
        assert np.array_equal(cached, plain), (f"{kw}: cached text {''.join(chars[i] for i in cached[0])!r} differs "
                                               f"from generate's {''.join(chars[i] for i in plain[0])!r}")
        fused = generate_cached(model, prompt, 30, engine="fused", **kw)   # the same loop on FusedGPT
        assert np.array_equal(fused, plain), (f"{kw}: fused-engine text {''.join(chars[i] for i in fused[0])!r} "
                                              f"differs from generate's {''.join(chars[i] for i in plain[0])!r}")
    calls = []
    h = model.register_forward_pre_hook(lambda m, args: calls.append(np.shape(args[0])[1]))
    generate_cached(model, prompt, 5, temperature=0)
    h.remove()
    assert calls == [16, 1, 1, 1, 1], f"one prefill of 16 tokens, then one token per step; got lengths {calls}"

    E, H = model.tok_emb.embedding_dim, model.blocks[0].attn.num_heads
    pool = PagedKVCache(num_blocks=9, block_size=4, num_layers=len(model.blocks), num_heads=H, head_dim=E // H)
    requests = {"a": ("Once upon", 6), "b": ("The little", 5), "c": ("a little girl named", 4)}
    seqs = {r: np.array([stoi[c] for c in p])[None] for r, (p, _) in requests.items()}
    expected = {r: model.generate(seqs[r], n, temperature=0) for r, (_, n) in requests.items()}
    active = ["a", "b"]
    with no_grad():
        logits = {r: model(seqs[r], cache=pool.layer_caches(r)).data[:, -1] for r in active}
        with pytest.raises(RuntimeError, match="free a finished sequence or make the pool larger"):
            model(seqs["c"], cache=pool.layer_caches("c"))       # 19 tokens need 5 blocks, 3 are free
        pool.free("c")
        while active:
            for r in list(active):
                seqs[r] = np.concatenate([seqs[r], logits[r].argmax(-1)[:, None]], axis=1)
                if seqs[r].shape[1] == expected[r].shape[1]:
                    active.remove(r)
                    pool.free(r)
                    if r == "b":                                  # b's blocks serve the waiting request c
                        active.append("c")
                        logits["c"] = model(seqs["c"], cache=pool.layer_caches("c")).data[:, -1]
                else:
                    logits[r] = model(seqs[r][:, -1:], start_pos=seqs[r].shape[1] - 1,
                                      cache=pool.layer_caches(r)).data[:, -1]
    for r in requests:
        assert np.array_equal(seqs[r], expected[r]), \
            f"request {r}: paged decoding gave {''.join(chars[i] for i in seqs[r][0])!r}, " \
            f"contiguous greedy {''.join(chars[i] for i in expected[r][0])!r}"
    assert pool.num_free_blocks == 9 and not pool.block_tables, "every block is back in the pool"
