"""Module 18 (memoization): `tinytorch.perf.kv_cache` against uncached generation and PyTorch.

`KVCache.update` is compared with concatenation on hypothesis-drawn chunk sizes (values, views of
the buffers, the exact overflow error). Cached generation must give `GPT.generate`'s tokens
exactly, over drawn seeds, prompt lengths, temperatures, top-k and lengths up to and past the
context (where the window slides), and its logits the full forward's within float32 tolerance;
with PyTorch installed, the same cached generation written in PyTorch
(`tests/support/torch_kv.py`: `F.scaled_dot_product_attention` over a preallocated cache) gives
the same tokens and logits, and the bytes per cached token equal those of PyTorch's cache tensors.
`PagedKVCache`: random add/allocate/free sequences keep the pool consistent (no block owned twice,
every block free or owned, a refused allocation changes nothing); write/gather round-trips in
position order; attention over a paged cache equals attention over a contiguous one (PyTorch's
SDPA when installed); decoding several sequences interleaved from one pool gives each sequence's
contiguous logits; running out of blocks in the middle of a model call raises and leaves the
cache usable.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.attention import scaled_dot_product_attention
from tinytorch.core.autograd import no_grad
from tinytorch.core.tensor import Tensor
from tinytorch.models.gpt import GPT
from tinytorch.perf.fused import FusedGPT
from tinytorch.perf.kv_cache import (KVCache, PagedKVCache, cache_bytes_per_token, generate_cached,
                                     make_caches)
from tests.support import laid_out, property_settings, refs
from tests.support.refs import torch_or_none

pytestmark = pytest.mark.module("18")


def small_model(seed=0, context=12):
    return GPT(vocab_size=13, context_length=context, embed_dim=16, num_heads=4, num_layers=2, rng=seed).eval()


# ---------------------------------------------------------------- 18.1 KVCache.update

@pytest.mark.exercise("18.1", "KVCache.update")
@property_settings(25)
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5), b=st.integers(1, 3), data=st.data())
def test_kvcache_equals_concatenation_and_returns_views(chunks, b, data):
    """New keys and values in any memory layout (`laid_out`: transposed, strided, reversed views) land in the
    preallocated buffers: the result equals concatenation and is a view of the buffers."""
    cache = KVCache(b, 2, 20, 3)
    ks, vs = [], []
    for n in chunks:
        k, v = (data.draw(laid_out((b, 2, n, 3))) for _ in range(2))
        ks.append(k), vs.append(v)
        k_all, v_all = cache.update(Tensor(k), Tensor(v))
        np.testing.assert_array_equal(k_all.data, np.concatenate(ks, axis=2), err_msg=f"keys after chunks {chunks}")
        np.testing.assert_array_equal(v_all.data, np.concatenate(vs, axis=2), err_msg=f"values after chunks {chunks}")
        assert np.shares_memory(k_all.data, cache.k) and np.shares_memory(v_all.data, cache.v), \
            "update must return views of the preallocated buffers, not copies"
    assert cache.seq_len == sum(chunks)
    assert cache.bytes_written == 2 * sum(chunks) * b * 2 * 3 * 4, "each position is copied in exactly once"


@pytest.mark.exercise("18.1", "KVCache.update")
def test_kvcache_errors_are_exact_and_change_nothing():
    cache = KVCache(1, 2, 8, 4)
    cache.update(np.zeros((1, 2, 6, 4)), np.zeros((1, 2, 6, 4)))
    with pytest.raises(ValueError) as e:
        cache.update(np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)))
    assert str(e.value) == ("KVCache.update: 3 new position(s) after the 6 cached exceed max_len=8; the cache is full: "
                            "reset() it and run the window again, or make the cache with a larger max_len")
    assert cache.seq_len == 6 and not cache.k.any(), "a refused update writes nothing"
    with pytest.raises(ValueError, match=r"KVCache.update: k and v must both have shape \(B, H, T_new, Dh\) = "
                                         r"\(1, 2, T_new, 4\); got k \(1, 3, 1, 4\), v \(1, 3, 1, 4\)"):
        cache.update(np.zeros((1, 3, 1, 4)), np.zeros((1, 3, 1, 4)))
    with pytest.raises(ValueError, match="KVCache: max_len must be a positive integer"):
        KVCache(1, 2, 0, 4)


@pytest.mark.exercise("18.1", "cache_bytes_per_token")
def test_bytes_per_token_formula_matches_the_buffers_and_torch():
    model = GPT(vocab_size=20, context_length=16, embed_dim=24, num_heads=3, num_layers=3, rng=0)
    caches = make_caches(model, 2)
    per_token = cache_bytes_per_token(model)
    assert per_token == 2 * 3 * 24 * 4, f"2 (key and value) x 3 layers x 24 numbers x 4 bytes = 576; got {per_token}"
    assert cache_bytes_per_token(model, itemsize=2) == 288, "itemsize 2 (16-bit numbers) halves it"
    assert sum(c.nbytes for c in caches) == per_token * 16 * 2, "caches for B=2 x 16 positions"
    torch = torch_or_none()
    if torch is not None:
        from tests.support.torch_kv import TorchCachedGPT
        tc = TorchCachedGPT(torch, model).new_cache(2)
        assert sum(t.element_size() * t.nelement() for layer in tc for t in layer) == per_token * 16 * 2


# ---------------------------------------------------------------- 18.2 cached_decode

@pytest.mark.exercise("18.2", "cached_decode")
@property_settings(30)
@given(seed=st.integers(0, 2**16), t=st.integers(1, 12), new=st.integers(0, 16),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_k=st.sampled_from([None, 1, 3, 13, 50]),
       b=st.integers(1, 2))
def test_cached_generation_is_token_identical(seed, t, new, temperature, top_k, b):
    """Up to the context (12) and past it (the window slides): the same tokens as generate."""
    model = small_model(seed % 4)
    prompt = np.random.default_rng(seed).integers(0, 13, (b, t))
    plain = model.generate(prompt, new, temperature=temperature, top_k=top_k, seed=seed)
    fast = generate_cached(model, prompt, new, temperature=temperature, top_k=top_k, seed=seed)
    np.testing.assert_array_equal(fast, plain, err_msg=f"prompt {t}, {new} new, T={temperature}, top_k={top_k}")


@pytest.mark.exercise("18.2", "cached_decode")
def test_gpt_generate_with_the_cached_decoder():
    """`GPT.generate(..., decoder=generate_cached)` (module 13's given seam: the model imports nothing of module
    18) decodes through the cache: the same tokens as without it, one prefill then one token per forward; the
    engine is chosen the same way (`functools.partial(generate_cached, engine="fused")`)."""
    import functools
    model = small_model(1)
    prompt = np.random.default_rng(5).integers(0, 13, (2, 4))
    plain = model.generate(prompt, 6, temperature=0.9, top_k=5, seed=3)
    lengths = []
    hook = model.register_forward_pre_hook(lambda m, args: lengths.append(np.shape(getattr(args[0], "data", args[0]))[1]))
    try:
        cached = model.generate(prompt, 6, temperature=0.9, top_k=5, seed=3, decoder=generate_cached)
    finally:
        hook.remove()
    np.testing.assert_array_equal(cached, plain, err_msg="generate(decoder=generate_cached) must give generate's tokens")
    assert lengths == [4, 1, 1, 1, 1, 1], f"expected one prefill of 4 then 1 token per step; forward saw {lengths}"
    fused = model.generate(prompt, 6, temperature=0.9, top_k=5, seed=3,
                           decoder=functools.partial(generate_cached, engine="fused"))
    np.testing.assert_array_equal(fused, plain, err_msg="generate(decoder=partial(generate_cached, engine='fused'))")
    with pytest.raises(TypeError, match="generate: decoder must be a function like module 18's generate_cached"):
        model.generate(prompt, 2, decoder="kv")


@pytest.mark.exercise("18.2", "cached_decode")
def test_cached_logits_equal_the_full_forward_and_torch():
    model = small_model(1, context=24)
    ids = np.random.default_rng(0).integers(0, 13, (2, 24))
    with no_grad():
        full = model(ids).data
        caches = make_caches(model, 2)
        got = [model(ids[:, :7], cache=caches).data] + [model(ids[:, p:p + 1], start_pos=p, cache=caches).data
                                                      for p in range(7, 24)]
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, rtol=0, atol=1e-5)
    params = {name: p.data.astype(np.float64) for name, p in model.named_parameters()}   # the NumPy reference GPT
    np.testing.assert_allclose(np.concatenate(got, axis=1), refs.gpt_logits(ids, params, 4, 2), rtol=0, atol=1e-4,
                               err_msg="cached logits vs tests/support/refs.gpt_logits (float64, no cache)")
    torch = torch_or_none()
    if torch is not None:
        from tests.support.torch_kv import TorchCachedGPT
        ref = TorchCachedGPT(torch, model)
        tc = ref.new_cache(2)
        with torch.no_grad():
            theirs = [ref.forward(ids[:, :7], 0, tc)] + [ref.forward(ids[:, p:p + 1], p, tc) for p in range(7, 24)]
        np.testing.assert_allclose(np.concatenate(got, axis=1), torch.cat(theirs, 1).numpy(), rtol=0, atol=1e-5)


@pytest.mark.exercise("18.2", "cached_decode")
@pytest.mark.parametrize("temperature,top_k", [(0.0, None), (1.0, None), (0.8, 5)])
def test_cached_generation_matches_the_torch_cached_generation(temperature, top_k):
    torch = torch_or_none()
    model = GPT(vocab_size=65, context_length=48, embed_dim=32, num_heads=4, num_layers=2, rng=3)
    prompt = np.random.default_rng(1).integers(0, 65, (2, 16))
    ours = generate_cached(model, prompt, 32, temperature=temperature, top_k=top_k, seed=11)
    if torch is None:
        expected = model.generate(prompt, 32, temperature=temperature, top_k=top_k, seed=11)
    else:
        from tests.support.torch_kv import TorchCachedGPT
        expected = TorchCachedGPT(torch, model).generate(prompt, 32, temperature=temperature, top_k=top_k, seed=11)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.exercise("18.2", "cached_decode")
def test_one_prefill_then_one_token_per_step():
    model = small_model(0)
    calls = []
    h = model.register_forward_pre_hook(lambda m, args: calls.append((np.shape(args[0]), m.blocks[0].attn is not None)))
    generate_cached(model, np.zeros((1, 4), np.int64), 3, temperature=0)
    h.remove()
    assert [c[0] for c in calls] == [(1, 4), (1, 1), (1, 1)]


@pytest.mark.exercise("18.2", "cached_decode")
def test_generate_cached_restores_training_mode():
    model = small_model(0).train()
    generate_cached(model, np.zeros((1, 2), np.int64), 2, temperature=0)
    assert model.training


@pytest.mark.parametrize("kwargs,message", [
    (dict(idx=np.zeros((1, 13), np.int64)), "generate_cached: a prompt of 13 tokens is longer than the context "
                                            "(context_length=12); crop it to its last 12 tokens"),
    (dict(top_k=0), "generate_cached: top_k must be a positive integer or None (None keeps every token); got 0"),
    (dict(temperature=-1.0), "generate_cached: temperature must be >= 0 (0 is greedy); got -1.0"),
    (dict(max_new_tokens=-2), "generate_cached: max_new_tokens must be a non-negative integer; got -2"),
    (dict(idx=np.zeros((3,), np.int64)), "generate_cached: idx must be token ids of shape (batch, seq) with seq >= 1; got (3,)"),
])
def test_generate_cached_errors_are_exact(kwargs, message):
    args = dict(idx=np.zeros((1, 3), np.int64), max_new_tokens=2) | kwargs
    with pytest.raises(ValueError) as e:
        generate_cached(small_model(0), **args)
    assert str(e.value) == message


# ---------------------------------------------------------------- 4.1 FusedGPT (given code)

@pytest.mark.exercise("18.1", "KVCache.update")
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 3), prefill=st.integers(1, 8), steps=st.integers(0, 4),
       pad=st.integers(0, 3))
def test_fused_engine_logits_equal_the_models(seed, b, prefill, steps, pad):
    """FusedGPT's logits equal GPT.forward's within float32 rounding: a full forward, a left-padded batch
    (attention_mask), and a prefill followed by one-token steps through KVCaches; the caches it fills
    hold the model's keys and values."""
    model = small_model(seed % 4, context=16)
    engine = FusedGPT(model)
    ids = np.random.default_rng(seed).integers(0, 13, (b, prefill + steps))
    mask = np.ones(ids.shape, np.int64)
    mask[0, :min(pad, ids.shape[1] - 1)] = 0
    with no_grad():
        for kw in ({}, {"attention_mask": mask}):
            np.testing.assert_allclose(engine(ids, **kw).data, model(ids, **kw).data, rtol=1e-5, atol=1e-5,
                                       err_msg=f"full forward {kw and 'with a padding mask'}, ids {ids.shape}")
        ours, theirs = make_caches(model, b), make_caches(model, b)
        got = [engine(ids[:, :prefill], cache=ours).data]
        want = [model(ids[:, :prefill], cache=theirs).data]
        for p in range(prefill, prefill + steps):
            got.append(engine(ids[:, p:p + 1], start_pos=p, cache=ours).data)
            want.append(model(ids[:, p:p + 1], start_pos=p, cache=theirs).data)
    np.testing.assert_allclose(np.concatenate(got, 1), np.concatenate(want, 1), rtol=1e-5, atol=1e-5)
    for a, c in zip(ours, theirs):
        assert a.seq_len == c.seq_len == prefill + steps
        np.testing.assert_allclose(a.k[:, :, :a.seq_len], c.k[:, :, :c.seq_len], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a.v[:, :, :a.seq_len], c.v[:, :, :c.seq_len], rtol=1e-5, atol=1e-5)


@pytest.mark.exercise("18.2", "cached_decode")
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), t=st.integers(1, 12), new=st.integers(0, 16),
       temperature=st.sampled_from([0.0, 0.5, 1.0]), top_k=st.sampled_from([None, 1, 3, 50]), b=st.integers(1, 2))
def test_fused_cached_generation_is_token_identical(seed, t, new, temperature, top_k, b):
    """engine="fused": generate's tokens, up to the context (12) and past it (the window slides)."""
    model = small_model(seed % 4)
    prompt = np.random.default_rng(seed).integers(0, 13, (b, t))
    plain = model.generate(prompt, new, temperature=temperature, top_k=top_k, seed=seed)
    fused = generate_cached(model, prompt, new, temperature=temperature, top_k=top_k, seed=seed, engine="fused")
    np.testing.assert_array_equal(fused, plain, err_msg=f"prompt {t}, {new} new, T={temperature}, top_k={top_k}")
@pytest.mark.exercise("18.2", "cached_decode")
def test_fused_generation_matches_torch_and_makes_no_op_records():
    from tinytorch.core.tensor import observe_ops
    model = GPT(vocab_size=65, context_length=48, embed_dim=32, num_heads=4, num_layers=2, rng=3)
    prompt = np.random.default_rng(1).integers(0, 65, (2, 16))
    seen = []
    with observe_ops(lambda node, out: seen.append(node.op)):
        ours = generate_cached(model, prompt, 32, temperature=0.8, top_k=5, seed=11, engine="fused")
    assert seen == [], f"the fused engine must run on arrays, without Tensor ops; observed {sorted(set(seen))}"
    torch = torch_or_none()
    if torch is None:
        expected = model.generate(prompt, 32, temperature=0.8, top_k=5, seed=11)
    else:
        from tests.support.torch_kv import TorchCachedGPT
        expected = TorchCachedGPT(torch, model).generate(prompt, 32, temperature=0.8, top_k=5, seed=11)
    np.testing.assert_array_equal(ours, expected)
@pytest.mark.exercise("18.4", "PagedKVCache.gather")
def test_fused_engine_works_through_a_paged_cache_and_refuses_what_it_cannot_run():
    model = small_model(2, context=16)
    ids = np.random.default_rng(4).integers(0, 13, (1, 9))
    pool = PagedKVCache(num_blocks=6, block_size=4, num_layers=2, num_heads=4, head_dim=4)
    with no_grad():
        engine = FusedGPT(model)
        caches = pool.layer_caches("a")
        got = [engine(ids[:, :5], cache=caches).data] + [engine(ids[:, p:p + 1], start_pos=p, cache=caches).data
                                                      for p in range(5, 9)]
        np.testing.assert_allclose(np.concatenate(got, 1), model(ids).data, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="generate_cached: engine must be 'eager'"):
        generate_cached(model, ids, 2, engine="jit")
    model.pos_emb = object()
    with pytest.raises(TypeError, match="FusedGPT: expects module 13's GPT"):
        FusedGPT(model)


# ---------------------------------------------------------------- 18.3 allocate

@pytest.mark.exercise("18.3", "PagedKVCache.allocate")
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 3), st.integers(0, 30)), max_size=25))
def test_random_allocations_keep_the_pool_consistent(ops):
    pool = PagedKVCache(num_blocks=10, block_size=4, num_layers=1, num_heads=1, head_dim=1)
    want = {}
    for op, s, n in ops:
        if op == "free":
            if s in pool.block_tables:
                pool.free(s)
                del want[s]
            continue
        if s not in pool.block_tables:
            pool.add_sequence(s)
            want[s] = 0
        before = (dict((k, list(v)) for k, v in pool.block_tables.items()), list(pool.free_blocks))
        need = max(-(-n // 4) - len(before[0][s]), 0)
        try:
            new = pool.allocate(s, n)
            want[s] = max(want[s], n)
            assert new == before[1][::-1][:need], (f"allocate({s}, {n}) with free list {before[1]}: expected the "
                                                   f"{need} block(s) free_blocks.pop() gives, {before[1][::-1][:need]}; got {new}")
        except RuntimeError as e:
            assert need > len(before[1]), f"allocate({s}, {n}) needs {need} block(s) and {len(before[1])} are free: no refusal"
            assert "free a finished sequence or make the pool larger" in str(e)
            assert (pool.block_tables, pool.free_blocks) == before, "a refused allocation must change nothing"
        owned = [b for t in pool.block_tables.values() for b in t]
        assert len(owned) == len(set(owned)), f"a block is owned twice: {pool.block_tables}"
        assert sorted(owned + pool.free_blocks) == list(range(10)), "every block is either free or owned once"
        for k, t in pool.block_tables.items():
            assert len(t) >= -(-want[k] // 4), f"sequence {k} needs {want[k]} slots, holds {len(t)} blocks"


@pytest.mark.exercise("18.3", "PagedKVCache.allocate")
def test_allocate_takes_an_exact_fit_and_reuses_freed_blocks_first():
    pool = PagedKVCache(num_blocks=3, block_size=4, num_layers=1, num_heads=1, head_dim=1)
    pool.add_sequence("a")
    pool.add_sequence("b")
    assert pool.allocate("a", 6) == [0, 1], "the free list is a stack: pop() hands out block 0 first"
    assert pool.allocate("b", 4) == [2], "one block is missing and one is free: take it"
    assert pool.allocate("a", 8) == [] and pool.free_blocks == [], "nothing missing: no refusal, even with no block free"
    pool.free("a")
    assert pool.allocate("b", 12) == [0, 1], "the blocks freed last are handed out first, in their table's order"


@pytest.mark.exercise("18.3", "PagedKVCache.allocate")
def test_unknown_and_duplicate_sequences_are_named():
    pool = PagedKVCache(4, 2, 1, 1, 1)
    with pytest.raises(KeyError, match=r"PagedKVCache.allocate: unknown sequence 'q'; call add_sequence\('q'\) first"):
        pool.allocate("q", 1)
    pool.add_sequence("q")
    with pytest.raises(ValueError, match=r"PagedKVCache: sequence 'q' already exists"):
        pool.add_sequence("q")


# ---------------------------------------------------------------- 18.4 write / gather

@pytest.mark.exercise("18.4", "PagedKVCache.gather")
@settings(max_examples=25, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1, max_size=10),
       block_size=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_paged_attention_equals_contiguous_attention(plan, block_size, seed):
    """Interleaved writes of three sequences, then attention of a query over each sequence's
    gathered keys equals attention over its contiguous keys (PyTorch's SDPA when installed)."""
    rng = np.random.default_rng(seed)
    pool = PagedKVCache(num_blocks=200, block_size=block_size, num_layers=2, num_heads=2, head_dim=4)
    ref = {}
    for s, n in plan:
        if s not in pool.block_tables:
            pool.add_sequence(s)
            ref[s] = np.zeros((2, 2, 0, 4), np.float32), np.zeros((2, 2, 0, 4), np.float32)
        k, v = rng.standard_normal((2, 2, 2, n, 4)).astype(np.float32)    # (layers, H, n, Dh)
        for layer in range(2):
            pool.write(s, layer, k[layer], v[layer])
        ref[s] = np.concatenate([ref[s][0], k], axis=2), np.concatenate([ref[s][1], v], axis=2)
    torch = torch_or_none()
    for s, (k_ref, v_ref) in ref.items():
        for layer in range(2):
            k, v = pool.gather(s, layer)
            np.testing.assert_array_equal(k, k_ref[layer]), np.testing.assert_array_equal(v, v_ref[layer])
            q = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
            paged = scaled_dot_product_attention(Tensor(q), Tensor(k[None]), Tensor(v[None])).data
            if torch is None:   # the shared NumPy reference of module 12's attention
                contiguous = refs.sdpa(q.astype(np.float64), k_ref[layer][None].astype(np.float64),
                                       v_ref[layer][None].astype(np.float64))
            else:
                contiguous = torch.nn.functional.scaled_dot_product_attention(
                    torch.tensor(q), torch.tensor(k_ref[layer][None]), torch.tensor(v_ref[layer][None])).numpy()
            np.testing.assert_allclose(paged, contiguous, rtol=0, atol=1e-6)


@pytest.mark.exercise("18.4", "PagedKVCache.write")
def test_interleaved_sequences_from_one_pool_give_contiguous_logits():
    model = small_model(2, context=16)
    pool = PagedKVCache(num_blocks=12, block_size=3, num_layers=2, num_heads=4, head_dim=4)
    seqs = {0: np.arange(16) % 13, 1: (np.arange(9) * 5) % 13, 2: (np.arange(13) * 7) % 13}
    with no_grad():
        out = {s: [model(ids[None, :2], cache=pool.layer_caches(s)).data] for s, ids in seqs.items()}
        for t in range(2, 16):
            for s, ids in seqs.items():
                if t < len(ids):
                    out[s].append(model(ids[None, t:t + 1], start_pos=t, cache=pool.layer_caches(s)).data)
                elif t == len(ids):
                    pool.free(s)       # finished: its blocks go back to the pool
        for s, ids in seqs.items():
            np.testing.assert_allclose(np.concatenate(out[s], axis=1), model(ids[None]).data, rtol=0, atol=1e-5)
    assert pool.num_free_blocks == 12 - 6, "only sequence 0 (16 tokens = 6 blocks) is still held"


@pytest.mark.exercise("18.4", "PagedKVCache.write")
def test_running_out_of_blocks_mid_forward_corrupts_nothing():
    model = small_model(0, context=16)
    pool = PagedKVCache(num_blocks=3, block_size=2, num_layers=2, num_heads=4, head_dim=4)
    ids = np.arange(8)[None] % 13
    with no_grad():
        model(ids[:, :4], cache=pool.layer_caches("a"))         # 2 blocks
        model(ids[:, :2], cache=pool.layer_caches("b"))         # 1 block: pool full
        state = ({k: list(v) for k, v in pool.block_tables.items()}, {k: list(v) for k, v in pool.lengths.items()},
                 pool.k_pool.copy())
        with pytest.raises(RuntimeError, match=r"PagedKVCache: sequence 'a' needs 1 more block\(s\) for 5 tokens but "
                                               r"only 0 of 3 are free"):
            model(ids[:, 4:5], start_pos=4, cache=pool.layer_caches("a"))
        assert ({k: list(v) for k, v in pool.block_tables.items()}, {k: list(v) for k, v in pool.lengths.items()}) == state[:2]
        np.testing.assert_array_equal(pool.k_pool, state[2])
        pool.free("b")
        got = model(ids[:, 4:5], start_pos=4, cache=pool.layer_caches("a")).data
        np.testing.assert_allclose(got[:, -1], model(ids[:, :5]).data[:, -1], rtol=0, atol=1e-5)


@pytest.mark.exercise("18.1", "make_caches")
def test_make_caches_one_per_block_shaped_for_its_attention():
    model = GPT(vocab_size=20, context_length=10, embed_dim=24, num_heads=3, num_layers=4, rng=0)
    caches = make_caches(model, 2)
    assert len(caches) == 4 and all(isinstance(c, KVCache) and c.seq_len == 0 for c in caches), \
        f"one empty KVCache per block expected; got {caches}"
    assert {c.k.shape for c in caches} == {(2, 3, 10, 8)}, f"(batch, heads, context, head_dim) = (2, 3, 10, 8); got {caches}"
    assert make_caches(model, 1, max_len=4)[0].k.shape == (1, 3, 4, 8), "max_len sets the positions"
    assert len({id(c.k) for c in caches}) == 4, "every block needs buffers of its own"


@pytest.mark.exercise("18.3", "PagedKVCache.free")
def test_free_gives_the_blocks_back_first_in_table_order_and_forgets_the_sequence():
    pool = PagedKVCache(6, 2, 1, 1, 1)
    for s, n in (("a", 5), ("b", 2)):
        pool.add_sequence(s)
        pool.allocate(s, n)
    table = list(pool.block_tables["a"])
    pool.free("a")
    assert "a" not in pool.block_tables and "a" not in pool.lengths, "free must forget the sequence's table and lengths"
    pool.add_sequence("c")
    assert pool.allocate("c", 6) == table, f"a's blocks {table} come back first, in a's order; got {pool.block_tables['c']}"
    pool.add_sequence("a")   # a freed id can be used again
    with pytest.raises(KeyError, match=r"PagedKVCache.free: unknown sequence"):
        pool.free("zz")


@pytest.mark.exercise("18.4", "PagedLayerCache.update")
def test_layer_caches_view_one_layer_of_one_sequence_through_the_pool():
    rng = np.random.default_rng(0)
    pool = PagedKVCache(num_blocks=8, block_size=2, num_layers=3, num_heads=2, head_dim=4)
    caches = pool.layer_caches("s")
    assert [c.layer for c in caches] == [0, 1, 2] and "s" in pool.block_tables, "one cache per layer; the sequence added"
    keys = np.zeros((1, 2, 0, 4), np.float32)
    for n in (3, 1, 2):
        k = rng.standard_normal((1, 2, n, 4)).astype(np.float32)
        keys = np.concatenate([keys, k], axis=2)
        k_all, v_all = caches[1].update(Tensor(k), Tensor(-k))
        assert isinstance(k_all, Tensor) and k_all.shape == keys.shape, f"(1, H, T, Dh) = {keys.shape}; got {k_all.shape}"
        np.testing.assert_array_equal(k_all.data, keys, err_msg="every cached key of this layer, in position order")
        np.testing.assert_array_equal(v_all.data, -keys)
    assert caches[1].seq_len == 6 and caches[0].seq_len == 0 and caches[2].seq_len == 0, "only layer 1 was written"
    again = pool.layer_caches("s")
    assert again[1].seq_len == 6, "layer_caches of a known sequence continues it"


def test_paged_layer_cache_refuses_a_batch():
    pool = PagedKVCache(4, 2, 1, 2, 3)
    with pytest.raises(ValueError, match=r"PagedLayerCache.update: one sequence per cache \(batch 1\)"):
        pool.layer_caches("s")[0].update(np.zeros((2, 2, 1, 3)), np.zeros((2, 2, 1, 3)))


# ---------------------------------------------------------------- 18.5 gradient checkpointing

def _block_grads(block, x0, up, use_checkpoint):
    from tinytorch.core.autograd import backward
    from tinytorch.perf.checkpoint import checkpoint
    for p in block.parameters():
        p.grad = None
    x = Tensor(x0, requires_grad=True)
    y = checkpoint(block, x) if use_checkpoint else block(x)
    backward((y * Tensor(up)).sum())
    missing = [name for name, p in block.named_parameters() if p.grad is None]
    assert x.grad is not None and not missing, (f"checkpoint={use_checkpoint}: no gradient reached "
                                                f"{'the input' if x.grad is None else missing}: the recomputed "
                                                f"graph must be backpropagated (module 06's backward)")
    return [x.grad.data] + [p.grad.data for p in block.parameters()]


@pytest.mark.exercise("18.5", "CheckpointFunction.backward")
@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_checkpointed_block_gradients_equal_plain_backward_exactly(b, t, seed):
    from tinytorch.models.gpt import TransformerBlock
    rng = np.random.default_rng(seed)
    block = TransformerBlock(16, 4, rng=seed % 7)
    x0, up = rng.standard_normal((2, b, t, 16)).astype(np.float32)
    plain, ckpt = _block_grads(block, x0, up, False), _block_grads(block, x0, up, True)
    for i, (a, c) in enumerate(zip(plain, ckpt)):
        np.testing.assert_array_equal(c, a, err_msg=f"gradient {i} (0 = input, then parameters) with checkpointing")


@pytest.mark.exercise("18.5", "CheckpointFunction.backward")
def test_checkpointing_a_gpt_step_keeps_gradients_and_lowers_peak_memory():
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.perf.checkpoint import checkpoint
    from tinytorch.perf.measure import peak_memory
    gpt = GPT(vocab_size=30, context_length=32, embed_dim=32, num_heads=4, num_layers=4, rng=0)
    xb = np.random.default_rng(0).integers(0, 30, (4, 32))
    yb = np.random.default_rng(1).integers(0, 30, (4, 32))

    def step(use_checkpoint):
        for p in gpt.parameters():
            p.grad = None
        if use_checkpoint:
            x = gpt.drop(gpt.pos_emb(gpt.tok_emb(xb)))
            for block in gpt.blocks:
                x = checkpoint(block, x)
            logits = gpt.head(gpt.ln_f(x))
        else:
            logits = gpt(xb)
        CrossEntropyLoss()(logits.reshape(-1, 30), yb.reshape(-1)).backward()
        missing = [name for name, p in gpt.named_parameters() if p.grad is None]
        assert not missing, f"checkpoint={use_checkpoint}: no gradient reached {missing[:3]}"
        return [p.grad.data.copy() for p in gpt.parameters()]

    for a, c in zip(step(False), step(True)):
        np.testing.assert_array_equal(c, a)
    plain, ckpt = peak_memory(lambda: step(False)), peak_memory(lambda: step(True))
    assert ckpt < 0.75 * plain, f"checkpointing 4 blocks should cut the step's peak memory: {ckpt:,} vs {plain:,} bytes"


@pytest.mark.exercise("18.5", "CheckpointFunction.backward")
def test_checkpoint_recomputes_with_gradients_on_under_no_grad():
    from tinytorch.core.autograd import backward, no_grad
    from tinytorch.perf.checkpoint import checkpoint
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    loss = checkpoint(lambda p: (p * p).sum(), a)
    with no_grad():  # backward called with grad mode off: the recomputation must still record its graph
        backward(loss)
    np.testing.assert_array_equal(a.grad.data, 2 * a.data, err_msg="checkpoint's backward under no_grad")


def _counted(fns):
    """Wrap each function to count its calls (a checkpointed one runs twice: forward, then recomputation)."""
    calls = [0] * len(fns)

    def wrap(i, f):
        def g(x):
            calls[i] += 1
            return f(x)
        return g
    return [wrap(i, f) for i, f in enumerate(fns)], calls


@pytest.mark.exercise("18.6", "checkpoint_sequential")
@pytest.mark.parametrize("n, segments", [(4, 4), (4, 2), (5, 2), (3, 1), (7, 3)])
def test_checkpoint_sequential_recomputes_all_runs_but_the_last_as_pytorch_does(n, segments):
    """Gradients equal the plain chain's exactly; which functions run twice is what
    `torch.utils.checkpoint.checkpoint_sequential` does on the same split (checked when torch is installed)."""
    from tinytorch.core.autograd import backward
    from tinytorch.perf.checkpoint import checkpoint_sequential
    blocks = [_small_block(i) for i in range(n)]
    x0 = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)
    up = np.random.default_rng(4).standard_normal((2, 5, 16)).astype(np.float32)
    grads = {}
    for how in ("plain", "sequential"):
        for blk in blocks:
            for p in blk.parameters():
                p.grad = None
        fns, calls = _counted(blocks)
        x = Tensor(x0, requires_grad=True)
        if how == "plain":
            y = x
            for f in fns:
                y = f(y)
        else:
            y = checkpoint_sequential(fns, segments, x)
        backward(y, up)
        grads[how] = [x.grad.data] + [p.grad.data for blk in blocks for p in blk.parameters()]
        grads[how + " calls"] = calls
    for i, (a, c) in enumerate(zip(grads["plain"], grads["sequential"])):
        np.testing.assert_array_equal(c, a, err_msg=f"gradient {i} (0 = input) with checkpoint_sequential({n}, {segments})")
    size = n // segments
    expected = [2] * (size * (segments - 1)) + [1] * (n - size * (segments - 1))
    assert grads["sequential calls"] == expected, (
        f"checkpoint_sequential({n} functions, {segments} segments): calls per function {grads['sequential calls']}, "
        f"expected {expected} (every run but the last recomputed once in backward)")
    torch = torch_or_none()
    if torch is not None:
        from torch.utils.checkpoint import checkpoint_sequential as torch_sequential
        tfns, tcalls = _counted([torch.nn.Linear(4, 4) for _ in range(n)])
        torch_sequential(tfns, segments, torch.ones(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
        assert tcalls == expected, f"torch.utils.checkpoint.checkpoint_sequential ran {tcalls}; ours {expected}"


def _small_block(seed):
    from tinytorch.models.gpt import TransformerBlock
    return TransformerBlock(16, 4, rng=seed)


@pytest.mark.exercise("18.6", "checkpoint_sequential")
def test_checkpoint_sequential_errors_are_named():
    from tinytorch.perf.checkpoint import checkpoint_sequential
    x = Tensor(np.zeros((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"checkpoint_sequential: segments must be an int from 1 to 2 .*got 3"):
        checkpoint_sequential([abs, abs], 3, x)
    with pytest.raises(ValueError, match=r"segments must be an int from 1 to 2 .*got 0"):
        checkpoint_sequential([abs, abs], 0, x)
    with pytest.raises(TypeError, match=r"functions must be a non-empty sequence of callables; got \['int'\]"):
        checkpoint_sequential([3], 1, x)


def test_checkpoint_errors_are_named():
    from tinytorch.perf.checkpoint import checkpoint
    with pytest.raises(TypeError, match="checkpoint: fn must be callable"):
        checkpoint(3, Tensor(np.zeros(2)))
    with pytest.raises(TypeError, match=r"checkpoint: inputs must be one or more Tensors; got \['ndarray'\]"):
        checkpoint(lambda x: x, np.zeros(2))


@pytest.mark.exercise("18.5", "CheckpointFunction.backward")
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), shape=st.sampled_from([(3,), (2, 4), (2, 3, 5)]))
def test_checkpoint_keeps_float64_in_forward_and_backward(seed, shape):
    """A float64 segment is recomputed in float64 (a new Tensor made from an array would be float32):
    the output, the input's gradient and a parameter's gradient equal the plain float64 run's to float64
    rounding, and the gradient agrees with float64 central differences."""
    from tinytorch.core.autograd import backward
    from tinytorch.perf.checkpoint import checkpoint
    from tests.support.refs import numeric_grads
    rng = np.random.default_rng(seed)
    x0, w0 = rng.standard_normal(shape), rng.standard_normal(shape[-1:])
    f = lambda x, w: ((x * w).tanh() * x).sum(axis=-1)  # noqa: E731
    runs = {}
    for how in ("plain", "checkpoint"):
        x = Tensor(x0, dtype=np.float64, requires_grad=True)
        w = Tensor(w0, dtype=np.float64, requires_grad=True)
        y = f(x, w) if how == "plain" else checkpoint(f, x, w)
        assert y.dtype == np.float64, f"{how}: a float64 segment must give a float64 output; got {y.dtype}"
        backward(y.sum())
        assert x.grad.dtype == np.float64 and w.grad.dtype == np.float64, \
            f"{how}: float64 inputs need float64 gradients; got {x.grad.dtype}, {w.grad.dtype}"
        runs[how] = (y.data, x.grad.data, w.grad.data)
    for name, a, c in zip(("output", "input gradient", "weight gradient"), runs["plain"], runs["checkpoint"]):
        np.testing.assert_allclose(c, a, rtol=1e-13, atol=1e-15, err_msg=f"{name} under checkpoint vs plain, float64")
    (gx, ok), = numeric_grads(lambda x: np.sum(np.tanh(x * w0) * x, axis=-1), [x0], np.ones(shape[:-1]))
    np.testing.assert_allclose(runs["checkpoint"][1][ok], gx[ok], rtol=1e-7, atol=1e-9,
                               err_msg="float64 gradient under checkpoint vs float64 central differences")


@pytest.mark.exercise("18.5", "CheckpointFunction.backward")
@pytest.mark.parametrize("placement", ["every block", "checkpoint_sequential"])
def test_dropout_under_checkpoint_equals_the_plain_run(placement):
    """A GPT with dropout in training mode, built twice from one seed (same weights, same generators): the
    checkpointed step recomputes with the masks its forward drew (PyTorch's `preserve_rng_state`), so logits,
    loss and every gradient equal the plain step's exactly, and the generators end where the plain step leaves
    them (the recomputation draws nothing from the caller's stream)."""
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.perf.checkpoint import checkpoint, checkpoint_sequential
    xb = np.random.default_rng(0).integers(0, 30, (3, 12))
    yb = np.random.default_rng(1).integers(0, 30, (3, 12))

    def step(checkpointed):
        gpt = GPT(vocab_size=30, context_length=12, embed_dim=16, num_heads=2, num_layers=3, dropout=0.3, rng=0)
        gpt.train()
        x = gpt.drop(gpt.pos_emb(gpt.tok_emb(xb)))
        if not checkpointed:
            for block in gpt.blocks:
                x = block(x)
        elif placement == "every block":
            for block in gpt.blocks:
                x = checkpoint(block, x)
        else:
            x = checkpoint_sequential(gpt.blocks, len(gpt.blocks), x)
        logits = gpt.head(gpt.ln_f(x))
        loss = CrossEntropyLoss()(logits.reshape(-1, 30), yb.reshape(-1))
        loss.backward()
        states = [g.bit_generator.state for g in {id(d.rng): d.rng for d in gpt.modules() if hasattr(d, "rng")}.values()]
        return [logits.data, loss.data] + [p.grad.data for p in gpt.parameters()], states

    (plain, plain_states), (ckpt, ckpt_states) = step(False), step(True)
    for i, (a, c) in enumerate(zip(plain, ckpt)):
        what = ["logits", "loss"][i] if i < 2 else f"gradient {i - 2}"
        assert np.array_equal(c, a), (
            f"{placement}: with dropout in training mode the checkpointed step's {what} differs from the plain step's "
            f"(max |diff| {np.abs(np.asarray(c, np.float64) - a).max():.3g}): the recomputation in backward must run "
            "with the generators as forward found them (forward captures an RNGState, backward runs fn inside its "
            "restored())")
    assert ckpt_states == plain_states, ("after the step the dropout generators must be where the plain step leaves "
                                         "them: restored() must give each generator back the state it had on entry")


@pytest.mark.exercise("18.5", "RNGState.restored")
def test_rng_state_restored_replays_the_captured_draws_and_then_puts_the_stream_back():
    from tinytorch.perf.checkpoint import RNGState
    g, h = np.random.default_rng(1), np.random.default_rng(2)
    state = RNGState(lambda: None)
    state.states = [(g, g.bit_generator.state), (h, h.bit_generator.state)]
    first = g.random(3), h.random(2)
    with state.restored() as same:
        again = g.random(3), h.random(2)
    after = g.random(), h.random()
    assert same is state, "`with state.restored() as s` gives the RNGState itself"
    np.testing.assert_array_equal(again[0], first[0], err_msg="inside restored() the captured draws repeat")
    np.testing.assert_array_equal(again[1], first[1], err_msg="inside restored() the captured draws repeat")
    assert after == (np.random.default_rng(1).random(4)[3], np.random.default_rng(2).random(3)[2]), \
        "after restored() each generator goes on from where it was before the with"
    try:
        with state.restored():
            g.random(10)
            raise KeyError("inside")
    except KeyError:
        pass
    assert g.random() == np.random.default_rng(1).random(5)[4], "an exception inside restored() still puts the stream back"


@pytest.mark.exercise("18.5", "CheckpointFunction.forward")
def test_preserve_rng_state_false_draws_new_masks():
    """`preserve_rng_state=False` (as in PyTorch) recomputes with new draws: the gradients then differ from the plain
    run's, which shows what the default prevents."""
    from tinytorch.core.autograd import backward
    from tinytorch.models.gpt import TransformerBlock
    from tinytorch.perf.checkpoint import checkpoint
    x0 = np.random.default_rng(2).standard_normal((2, 5, 16)).astype(np.float32)
    grads = {}
    for keep in (True, False):
        blk = TransformerBlock(16, 4, dropout=0.5, rng=3)
        x = Tensor(x0, requires_grad=True)
        backward(checkpoint(blk, x, preserve_rng_state=keep).sum())
        grads[keep] = x.grad.data
    blk = TransformerBlock(16, 4, dropout=0.5, rng=3)
    x = Tensor(x0, requires_grad=True)
    backward(blk(x).sum())
    assert not np.array_equal(grads[False], x.grad.data), (
        "checkpoint(..., preserve_rng_state=False) must not capture the generators (RNGState(fn, enabled=False) in "
        "forward): the recomputation then draws other masks, as in PyTorch")


def test_find_generators_sees_modules_closures_defaults_and_partials():
    import functools
    from tinytorch.models.gpt import TransformerBlock
    from tinytorch.perf.checkpoint import find_generators
    a, b = TransformerBlock(8, 2, dropout=0.1, rng=0), TransformerBlock(8, 2, dropout=0.1, rng=1)
    assert find_generators(a) == [a.drop.rng]   # one generator shared by the block's dropouts (made from one rng)
    assert find_generators(lambda h: b(a(h))) == [b.drop.rng, a.drop.rng] or \
        set(map(id, find_generators(lambda h: b(a(h))))) == {id(a.drop.rng), id(b.drop.rng)}
    assert find_generators(lambda h, run=[a]: run[0](h)) == [a.drop.rng]
    assert find_generators(functools.partial(lambda m, h: m(h), b)) == [b.drop.rng]
    assert find_generators(a.forward) == [a.drop.rng]
    assert find_generators(abs) == []


def test_layers_import_nothing_from_the_tools_that_optimize_them():
    """`core/` imports nothing from `perf/`, and the model (module 13) imports none of the tools that optimize it:
    module 18's cache reaches `generate` as an argument (`decoder=`), not by an import."""
    import ast
    from pathlib import Path
    import tinytorch
    root = Path(tinytorch.__file__).parent
    bad = []
    for path in [*sorted((root / "core").glob("*.py")), root / "models" / "gpt.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [("." * node.level) + (node.module or "")] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(root)}: {n}" for n in names if "perf" in n.split(".")]
    assert not bad, f"imports of tinytorch.perf from the layers and the model: {bad}"
