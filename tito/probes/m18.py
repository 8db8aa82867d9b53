"""Probes of module 18 (memoization): see tito/probes/__init__.py. Substitutes (one bug charged once): 18.2
runs the reference KVCache.update (the caches `generate_cached` makes); 18.4 the reference
PagedKVCache.allocate (called by the given `_prepare_write`)."""
import numpy as np

from . import probe


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@probe("18.1", messages=True)
def kv_update(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.kv_cache import KVCache

    cache = KVCache(2, 3, 8, 4)
    k1, v1 = f32(rng, 2, 3, 5, 4), f32(rng, 2, 3, 5, 4)
    out = rec.call("first", cache.update, Tensor(k1), Tensor(v1))
    rec["first_len"] = cache.seq_len
    k2, v2 = f32(rng, 2, 3, 1, 4), f32(rng, 2, 3, 1, 4)
    out = rec.call("second", cache.update, k2, v2)  # arrays too
    rec["second_len"] = cache.seq_len
    rec["buffers"] = [cache.k.copy(), cache.v.copy()]
    if isinstance(out, tuple) and len(out) == 2:
        # views of the buffers: a change to the buffers shows through the returned Tensors
        cache.k[:, :, :6] += 1.0
        cache.v[:, :, :6] -= 1.0
        rec.call("views", lambda: [np.array(out[0].data), np.array(out[1].data)])
    rec.call("overflow", cache.update, np.zeros((2, 3, 3, 4), np.float32), np.zeros((2, 3, 3, 4), np.float32))
    rec["after_overflow_len"] = cache.seq_len
    cache.reset()
    rec.call("after_reset", cache.update, k2, v2)
    rec["after_reset_len"] = cache.seq_len
    c64 = KVCache(1, 2, 4, 3, dtype=np.float64)
    k3 = rng.standard_normal((1, 2, 4, 3))
    rec.call("f64_full", c64.update, Tensor(k3.astype(np.float32)), k3)
    rec["f64_len"] = c64.seq_len


def _model(rng, context=12):
    from tinytorch.models.gpt import GPT

    return GPT(vocab_size=20, context_length=context, embed_dim=16, num_heads=2, num_layers=2,
               rng=int(rng.integers(0, 2 ** 30)))


@probe("18.2", replay=("KVCache.update",))
def decode(rng, rec):
    from tinytorch.perf.kv_cache import generate_cached

    model = _model(rng)
    prompt = rng.integers(0, 20, (2, 5))
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("greedy", generate_cached, model, prompt, 6, temperature=0)
    rec.call("sample", generate_cached, model, prompt, 6, temperature=1.0, seed=seed)
    rec.call("top_k", generate_cached, model, prompt, 6, temperature=0.7, top_k=4, seed=seed)
    rec.call("slides", generate_cached, model, prompt, 20, temperature=0.9, seed=seed)  # 25 tokens > context 12
    rec.call("full_prompt", generate_cached, model, rng.integers(0, 20, (1, 12)), 3, temperature=0)
    rec.call("zero", generate_cached, model, prompt, 0)
    calls = []
    h = model.register_forward_pre_hook(lambda m, args: calls.append(list(np.shape(args[0]))))
    try:
        rec.call("counted", generate_cached, model, prompt, 4, temperature=0)
        rec["calls"] = list(calls)
        calls.clear()
        rec.call("counted_slide", generate_cached, model, prompt[:1], 10, temperature=0)
        rec["calls_slide"] = list(calls)
    finally:
        h.remove()


def _pool(**kw):
    from tinytorch.perf.kv_cache import PagedKVCache

    return PagedKVCache(**kw)


@probe("18.3", messages=True)
def allocate(rng, rec):
    pool = _pool(num_blocks=5, block_size=4, num_layers=1, num_heads=1, head_dim=2)
    pool.add_sequence("a")
    pool.add_sequence("b")
    steps = [("a", 6), ("a", 8), ("b", 1), ("a", 9), ("b", 8), ("b", 12), ("a", 0), ("b", 4)]  # b 8: exactly the last free block
    for i, (s, n) in enumerate(steps):
        rec.call(f"alloc{i}", pool.allocate, s, n)
        rec[f"state{i}"] = [dict(pool.block_tables), list(pool.free_blocks)]
    pool.free("a")
    rec.call("reuse", pool.allocate, "b", 12)
    rec["reuse_state"] = [dict(pool.block_tables), list(pool.free_blocks)]
    big = _pool(num_blocks=int(rng.integers(6, 12)), block_size=int(rng.integers(1, 5)), num_layers=1, num_heads=1,
                head_dim=1)
    for s in range(3):
        big.add_sequence(s)
    for i, n in enumerate(rng.integers(0, 9, 8)):
        rec.call(f"rand{i}", big.allocate, i % 3, int(n) + i)
        rec[f"rand_state{i}"] = [dict(big.block_tables), list(big.free_blocks)]
    rec.call("unknown", pool.allocate, "zz", 1)


@probe("18.4", replay=("PagedKVCache.allocate",))
def paged(rng, rec):
    pool = _pool(num_blocks=8, block_size=3, num_layers=2, num_heads=2, head_dim=4)
    for s in ("x", "y"):
        pool.add_sequence(s)
    for i, (s, n) in enumerate((("x", 4), ("y", 2), ("x", 1), ("y", 5), ("x", 3))):
        for layer in range(2):
            k = f32(rng, 2, n, 4)
            rec.call(f"write{i}_{layer}", pool.write, s, layer, k, f32(rng, 2, n, 4))
        rec[f"tables{i}"] = dict(pool.block_tables)
        for layer in range(2):
            rec.call(f"gather{i}_{layer}", pool.gather, s, layer)
    rec["pools"] = [pool.k_pool.copy(), pool.v_pool.copy()]
    for s in ("x", "y"):
        for layer in range(2):
            rec.call(f"final_{s}{layer}", pool.gather, s, layer)
    pool.add_sequence("z")
    rec.call("empty", pool.gather, "z", 0)
    rec.call("one", lambda: (pool.write("z", 1, f32(rng, 2, 1, 4), f32(rng, 2, 1, 4)), pool.gather("z", 1))[1])
    rec.call("layer0_still_empty", pool.gather, "z", 0)
    pool.free("y")
    rec.call("reuse", lambda: (pool.write("z", 0, f32(rng, 2, 7, 4), f32(rng, 2, 7, 4)), pool.gather("z", 0))[1])
    rec["reuse_table"] = list(pool.block_tables["z"])
    rec.call("x_intact", pool.gather, "x", 1)
    one = _pool(num_blocks=3, block_size=1, num_layers=1, num_heads=3, head_dim=2)
    one.add_sequence(0)
    rec.call("bs1", lambda: (one.write(0, 0, f32(rng, 3, 2, 2), f32(rng, 3, 2, 2)),
                             one.write(0, 0, f32(rng, 3, 1, 2), f32(rng, 3, 1, 2)), one.gather(0, 0))[2])


@probe("18.5")
def checkpointing(rng, rec):
    from tinytorch.core.autograd import backward, no_grad
    from tinytorch.core.tensor import Tensor
    from tinytorch.models.gpt import TransformerBlock
    from tinytorch.perf.kv_cache import checkpoint

    blk = TransformerBlock(8, 2, rng=int(rng.integers(0, 2 ** 30)))
    x0, up = f32(rng, 2, 5, 8), f32(rng, 2, 5, 8)

    def block_grads():
        for p in blk.parameters():
            p.grad = None
        x = Tensor(x0, requires_grad=True)
        y = checkpoint(blk, x)
        backward((y * Tensor(up)).sum())
        return [None if x.grad is None else x.grad.data] + [None if p.grad is None else p.grad.data
                                                            for p in blk.parameters()]
    rec.call("block", block_grads)
    rec.call("forward", lambda: checkpoint(blk, Tensor(x0, requires_grad=True)))

    a0, b0, g0 = f32(rng, 3, 4), f32(rng, 4, 2), f32(rng, 3, 2)

    def two_inputs(need_a, need_b, mode_off=False):
        a, b = Tensor(a0, requires_grad=need_a), Tensor(b0, requires_grad=need_b)
        y = checkpoint(lambda p, q: (p @ q).tanh() * p.sum(), a, b)
        loss = (y * Tensor(g0)).sum()
        if mode_off:  # the caller's grad mode is off: the recomputation still records its graph
            with no_grad():
                backward(loss)
        else:
            backward(loss)
        return [None if a.grad is None else a.grad.data, None if b.grad is None else b.grad.data]
    rec.call("both", two_inputs, True, True)
    rec.call("only_b", two_inputs, False, True)
    rec.call("under_no_grad", two_inputs, True, True, True)

    c0 = f32(rng, 3)

    def unused_input():
        a, c = Tensor(a0, requires_grad=True), Tensor(c0, requires_grad=True)
        y = checkpoint(lambda p, q: p * p, a, c)
        backward(y.sum())
        return [None if a.grad is None else a.grad.data, None if c.grad is None else c.grad.data]
    rec.call("unused", unused_input)

    w = Tensor(f32(rng, 4, 4), requires_grad=True)

    def twice():
        a = Tensor(a0, requires_grad=True)
        h = checkpoint(lambda p: (p @ w).tanh(), a)
        h = checkpoint(lambda p: p @ w, h)
        backward(h.sum())
        return [a.grad.data if a.grad is not None else None, w.grad.data if w.grad is not None else None]
    rec.call("stacked", twice)
