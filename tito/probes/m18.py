"""Probes of module 18 (memoization): see tito/probes/__init__.py.

One bug is charged once without substituting anyone's source: an exercise that builds on an earlier one
gets the earlier one's output as data. 18.2 decodes through plain concatenating caches (module 12's
`ConcatCache`, given, with a `reset`), not the student's `KVCache`; 18.4 runs on pools whose block tables
and free lists are set as data beforehand, with `allocate` (18.3) replaced on the instance by a function
that takes nothing (the tables already cover every write); 18.6 checks the checkpointed runs it builds
by calling them, never by backpropagating through 18.5's code. Numbers are recorded as Python floats, so
an int, a float and a NumPy scalar of the same value compare equal.
"""
import numbers

import numpy as np

from . import probe


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def num(v):
    "A real number as a float (Python or NumPy, int or float); anything else unchanged."
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v


def _model(rng, context=12, layers=2, heads=2, width=16):
    from tinytorch.models.gpt import GPT

    return GPT(vocab_size=20, context_length=context, embed_dim=width, num_heads=heads, num_layers=layers,
               rng=int(rng.integers(0, 2 ** 30)))


@probe("18.1", messages=True)
def kv_update(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.kv_cache import KVCache, cache_bytes_per_token, make_caches

    cache = KVCache(2, 3, 8, 4)
    k1, v1 = f32(rng, 2, 3, 5, 4), f32(rng, 2, 3, 5, 4)
    out = rec.call("first", cache.update, Tensor(k1), Tensor(v1))
    rec["first_len"] = num(cache.seq_len)
    k2, v2 = f32(rng, 2, 3, 1, 4), f32(rng, 2, 3, 1, 4)
    out = rec.call("second", cache.update, k2, v2)  # arrays too
    rec["second_len"] = num(cache.seq_len)
    rec["buffers"] = [cache.k.copy(), cache.v.copy()]
    if isinstance(out, tuple) and len(out) == 2:
        # views of the buffers: a change to the buffers shows through the returned Tensors
        cache.k[:, :, :6] += 1.0
        cache.v[:, :, :6] -= 1.0
        rec.call("views", lambda: [np.array(out[0].data), np.array(out[1].data)])
    rec.call("overflow", cache.update, np.zeros((2, 3, 3, 4), np.float32), np.zeros((2, 3, 3, 4), np.float32))
    rec["after_overflow_len"] = num(cache.seq_len)
    cache.reset()
    rec.call("after_reset", cache.update, k2, v2)
    rec["after_reset_len"] = num(cache.seq_len)
    c64 = KVCache(1, 2, 4, 3, dtype=np.float64)
    k3 = rng.standard_normal((1, 2, 4, 3))
    rec.call("f64_full", c64.update, Tensor(k3.astype(np.float32)), k3)
    rec["f64_len"] = num(c64.seq_len)
    # make_caches and the bytes per token, on models of drawn sizes (the heads split the width)
    for i in range(2):
        heads = int(rng.integers(1, 4))
        model = _model(rng, context=int(rng.integers(4, 10)), layers=int(rng.integers(1, 4)), heads=heads,
                       width=heads * int(rng.integers(1, 5)) * 2)
        batch = int(rng.integers(1, 4))
        rec.call(f"caches{i}", lambda: [(type(c).__name__, list(c.k.shape), list(c.v.shape), num(c.seq_len))
                                        for c in make_caches(model, batch)])
        rec.call(f"caches{i}_max_len", lambda: [list(c.k.shape) for c in make_caches(model, 1, max_len=3)])
        rec.call(f"bytes{i}", lambda: num(cache_bytes_per_token(model)))
        rec.call(f"bytes{i}_fp16", lambda: num(cache_bytes_per_token(model, itemsize=2)))


def _concat_caches(model, batch_size):
    "Module 12's concatenating cache (given code) with a reset: 18.2 is checked on caches that are not 18.1's."
    from tinytorch.core.attention import ConcatCache

    class Cache(ConcatCache):
        def reset(self):
            self.k = self.v = None

    return [Cache() for _ in model.blocks]


@probe("18.2")
def decode(rng, rec):
    from tinytorch.perf.kv_cache import generate_cached

    model = _model(rng)
    prompt = rng.integers(0, 20, (2, 5))
    seed = int(rng.integers(0, 2 ** 30))
    run = lambda *a, **kw: generate_cached(model, *a, cache_factory=_concat_caches, **kw)  # noqa: E731
    rec.call("greedy", run, prompt, 6, temperature=0)
    rec.call("sample", run, prompt, 6, temperature=1.0, seed=seed)
    rec.call("top_k", run, prompt, 6, temperature=0.7, top_k=4, seed=seed)
    rec.call("slides", run, prompt, 20, temperature=0.9, seed=seed)  # 25 tokens > context 12
    rec.call("full_prompt", run, rng.integers(0, 20, (1, 12)), 3, temperature=0)
    rec.call("zero", run, prompt, 0)
    calls = []
    h = model.register_forward_pre_hook(lambda m, args: calls.append(list(np.shape(args[0]))))
    try:
        rec.call("counted", run, prompt, 4, temperature=0)
        rec["calls"] = list(calls)
        calls.clear()
        rec.call("counted_slide", run, prompt[:1], 10, temperature=0)
        rec["calls_slide"] = list(calls)
    finally:
        h.remove()


def _pool(**kw):
    from tinytorch.perf.kv_cache import PagedKVCache

    return PagedKVCache(**kw)


def _state(pool):
    return [{str(k): list(v) for k, v in pool.block_tables.items()}, list(pool.free_blocks),
            {str(k): list(v) for k, v in pool.lengths.items()}]


@probe("18.3", messages=True)
def allocate(rng, rec):
    pool = _pool(num_blocks=5, block_size=4, num_layers=1, num_heads=1, head_dim=2)
    pool.add_sequence("a")
    pool.add_sequence("b")
    steps = [("a", 6), ("a", 8), ("b", 1), ("a", 9), ("b", 8), ("b", 12), ("a", 0), ("b", 4)]  # b 8: exactly the last free block
    for i, (s, n) in enumerate(steps):
        rec.call(f"alloc{i}", pool.allocate, s, n)
        rec[f"state{i}"] = _state(pool)
    rec.call("free_a", pool.free, "a")
    rec["after_free"] = _state(pool)
    rec.call("reuse", pool.allocate, "b", 12)
    rec["reuse_state"] = _state(pool)
    rec.call("free_unknown", pool.free, "a")
    rec.call("readd", pool.add_sequence, "a")
    rec.call("free_b", pool.free, "b")
    rec.call("after_b", pool.allocate, "a", 20)
    rec["after_b_state"] = _state(pool)
    big = _pool(num_blocks=int(rng.integers(6, 12)), block_size=int(rng.integers(1, 5)), num_layers=1, num_heads=1,
                head_dim=1)
    for s in range(3):
        big.add_sequence(s)
    for i, n in enumerate(rng.integers(0, 9, 10)):
        if i in (4, 7):
            rec.call(f"rand_free{i}", big.free, i % 3)
            rec.call(f"rand_add{i}", big.add_sequence, i % 3)
        rec.call(f"rand{i}", big.allocate, i % 3, int(n) + i)
        rec[f"rand_state{i}"] = _state(big)
    rec.call("unknown", pool.allocate, "zz", 1)


def _preset(pool, tables: dict):
    """Block tables set as data (what 18.3 would have built), the free list the rest of the pool, and `allocate`
    replaced on this instance by one that takes nothing: the tables cover every write of the probe."""
    used = {b for t in tables.values() for b in t}
    for s, table in tables.items():
        pool.block_tables[s] = list(table)
        pool.lengths[s] = [0] * pool.num_layers
    pool.free_blocks = [b for b in range(pool.num_blocks - 1, -1, -1) if b not in used]
    pool.allocate = lambda seq_id, num_tokens: []
    return pool


@probe("18.4")
def paged(rng, rec):
    from tinytorch.core.tensor import Tensor

    # tables interleaved through the pool, as allocations of two sequences in turns leave them
    pool = _preset(_pool(num_blocks=9, block_size=3, num_layers=2, num_heads=2, head_dim=4),
                   {"x": [0, 2, 5, 7], "y": [1, 3, 4, 8]})
    for i, (s, n) in enumerate((("x", 4), ("y", 2), ("x", 1), ("y", 5), ("x", 3))):
        for layer in range(2):
            rec.call(f"write{i}_{layer}", pool.write, s, layer, f32(rng, 2, n, 4), f32(rng, 2, n, 4))
        for layer in range(2):
            rec.call(f"gather{i}_{layer}", pool.gather, s, layer)
    rec["pools"] = [pool.k_pool.copy(), pool.v_pool.copy()]
    pool.add_sequence("z")
    rec.call("empty", pool.gather, "z", 0)
    pool.block_tables["z"] = [6]
    rec.call("one", lambda: (pool.write("z", 1, f32(rng, 2, 1, 4), f32(rng, 2, 1, 4)), pool.gather("z", 1))[1])
    rec.call("layer0_still_empty", pool.gather, "z", 0)
    rec.call("x_intact", pool.gather, "x", 1)
    one = _preset(_pool(num_blocks=4, block_size=1, num_layers=1, num_heads=3, head_dim=2), {0: [3, 0, 2]})
    rec.call("bs1", lambda: (one.write(0, 0, f32(rng, 3, 2, 2), f32(rng, 3, 2, 2)),
                             one.write(0, 0, f32(rng, 3, 1, 2), f32(rng, 3, 1, 2)), one.gather(0, 0))[2])
    # the module-12 protocol: layer_caches and PagedLayerCache.update
    lay = _preset(_pool(num_blocks=6, block_size=2, num_layers=2, num_heads=2, head_dim=3), {"s": [4, 1, 5]})
    caches = rec.call("layer_caches", lambda: [(type(c).__name__, num(c.layer), num(c.seq_len))
                                               for c in lay.layer_caches("s")])
    got = lay.layer_caches("s")
    for step, n in enumerate((3, 1, 2)):
        k = f32(rng, 1, 2, n, 3)
        rec.call(f"update{step}", lambda: [t.data if isinstance(t, Tensor) else t
                                          for t in got[1].update(Tensor(k), Tensor(-k))])
    rec["update_pool"] = lay.k_pool.copy()
    rec["update_lengths"] = [num(x) for x in lay.lengths["s"]]
    fresh = rec.call("new_sequence", lambda: [num(c.layer) for c in lay.layer_caches("t")])
    rec["new_registered"] = "t" in lay.block_tables and "t" in lay.lengths
    rec["caches"], rec["fresh"] = caches is not None, fresh is not None


@probe("18.5")
def checkpointing(rng, rec):
    from tinytorch.core.autograd import backward, no_grad
    from tinytorch.core.tensor import Tensor
    from tinytorch.models.gpt import TransformerBlock
    from tinytorch.perf.checkpoint import RNGState, checkpoint

    # RNGState.restored on generators captured by hand (the given capture is not what is checked)
    seed = int(rng.integers(0, 2 ** 30))
    g1, g2 = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    state = RNGState(lambda: None)
    state.states = [(g1, g1.bit_generator.state), (g2, g2.bit_generator.state)]
    rec["drawn"] = [g1.random(2), g2.random(3)]

    def replay():
        with state.restored() as s:
            inside = [g1.random(2), g2.random(3), s is state]
        return inside + [g1.random(), g2.random()]
    rec.call("restored", replay)

    def raising():
        try:
            with state.restored():
                g1.random(5)
                raise KeyError("inside")
        except KeyError:
            pass
        return [g1.random(), g2.random()]
    rec.call("restored_raises", raising)

    blk = TransformerBlock(8, 2, rng=int(rng.integers(0, 2 ** 30)))
    x0, up = f32(rng, 2, 5, 8), f32(rng, 2, 5, 8)

    def block_grads(block):
        for p in block.parameters():
            p.grad = None
        x = Tensor(x0, requires_grad=True)
        y = checkpoint(block, x)
        backward((y * Tensor(up)).sum())
        return [None if x.grad is None else x.grad.data] + [None if p.grad is None else p.grad.data
                                                            for p in block.parameters()]
    rec.call("block", block_grads, blk)
    rec.call("forward", lambda: checkpoint(blk, Tensor(x0, requires_grad=True)))
    drop_seed = int(rng.integers(0, 2 ** 30))
    rec.call("dropout", lambda: block_grads(TransformerBlock(8, 2, dropout=0.4, rng=drop_seed)))
    dblk = TransformerBlock(8, 2, dropout=0.4, rng=drop_seed)
    rec.call("dropout_then", lambda: (block_grads(dblk), dblk.drop.rng.random(3))[1])  # the stream goes on

    a0, b0, g0 = f32(rng, 3, 4), f32(rng, 4, 2), f32(rng, 3, 2)

    def two_inputs(need_a, need_b, mode_off=False, dtype=np.float32):
        a = Tensor(a0.astype(dtype), dtype=dtype, requires_grad=need_a)
        b = Tensor(b0.astype(dtype), dtype=dtype, requires_grad=need_b)
        y = checkpoint(lambda p, q: (p @ q).tanh() * p.sum(), a, b)
        loss = (y * Tensor(g0.astype(dtype), dtype=dtype)).sum()
        if mode_off:  # the caller's grad mode is off: the recomputation still records its graph
            with no_grad():
                backward(loss)
        else:
            backward(loss)
        return [y.data, None if a.grad is None else a.grad.data, None if b.grad is None else b.grad.data]
    rec.call("both", two_inputs, True, True)
    rec.call("only_b", two_inputs, False, True)
    rec.call("under_no_grad", two_inputs, True, True, True)
    rec.call("float64", two_inputs, True, True, False, np.float64)

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


@probe("18.6", messages=True)
def sequential(rng, rec):
    """The runs `checkpoint_sequential` builds, seen without backpropagating: which functions each
    checkpointed node's `fn` applies (called on data), in which order, and what comes out."""
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.checkpoint import checkpoint_sequential

    for n, segments in ((5, 2), (4, 4), (3, 1), (7, 3), (int(rng.integers(2, 8)), None)):
        segments = segments or int(rng.integers(1, n + 1))
        scale = rng.uniform(0.5, 1.5, n)
        calls = []

        def fn(i):
            def f(h):
                calls.append(i)
                return h * float(scale[i]) + float(i)
            return f
        fns = [fn(i) for i in range(n)]
        x = Tensor(f32(rng, 2, 3), requires_grad=True)
        out = rec.call(f"out{n}_{segments}", checkpoint_sequential, fns, segments, x)
        rec[f"forward_calls{n}_{segments}"] = list(calls)
        runs, node = [], getattr(out, "grad_fn", None)
        while node is not None and len(runs) <= n:   # walk back through the chain's recorded nodes
            if node.op == "CheckpointFunction" and callable((node.attrs or {}).get("fn")):
                calls.clear()
                probe_in = Tensor(np.ones((1, 1), np.float32))
                val = node.attrs["fn"](probe_in)
                runs.append([list(calls), np.asarray(val.data if isinstance(val, Tensor) else val)])
            parents = [t for t in (node.inputs or ()) if t is not None and getattr(t, "grad_fn", None) is not None]
            node = parents[0].grad_fn if parents else None
        rec[f"runs{n}_{segments}"] = runs[::-1]
    rec.call("bad_segments", checkpoint_sequential, [abs, abs], 3, Tensor(np.zeros(2), requires_grad=True))
    rec.call("bad_functions", checkpoint_sequential, [3], 1, Tensor(np.zeros(2), requires_grad=True))
