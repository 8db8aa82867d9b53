"""Probes of module 20 (serving): see tito/probes/__init__.py. No substitutes: each exercise calls only given
code of its module (20.4 the batcher's `_forward`, `_reserve`, `_emit`) and module 18's reference."""
from collections import deque

import numpy as np

from . import probe


@probe("20.1")
def take_batch(rng, rec):
    from tinytorch.serving.server import take_batch

    def run(arrivals, size, wait, now):
        q = deque((float(t), i) for i, t in enumerate(arrivals))
        got = take_batch(q, size, wait, now)
        return [[float(t), int(i)] for t, i in got], [[float(t), int(i)] for t, i in q]

    rec.call("full", run, [0.0, 0.1, 0.2], 2, 1.0, 0.2)
    rec.call("wait", run, [0.0, 0.1, 0.2], 8, 1.0, 0.5)
    rec.call("waited", run, [0.0, 0.1, 0.2], 8, 1.0, 1.0)
    rec.call("empty", run, [], 4, 0.0, 5.0)
    rec.call("no_wait", run, [3.0], 4, 0.0, 3.0)
    rec.call("exact_size", run, [0.0, 0.5], 2, 10.0, 0.5)
    for i in range(8):
        n = int(rng.integers(0, 10))
        arrivals = np.cumsum(rng.uniform(0, 0.5, n)).tolist()
        size, wait = int(rng.integers(1, 6)), float(rng.choice([0.0, 0.3, 1.0, 2.5]))
        now = (arrivals[0] if arrivals else 0.0) + float(rng.uniform(0, 3))
        rec.call(f"rand{i}", run, arrivals, size, wait, now)


@probe("20.2", messages=True)
def admission(rng, rec):
    from tinytorch.serving.server import AdmissionController

    ac = AdmissionController(2)
    rec["decisions"] = [ac.try_admit() for _ in range(3)]
    rec["counts"] = [ac.in_system, ac.admitted, ac.rejected]
    ac.release()
    rec["after_release"] = [ac.try_admit(), ac.in_system, ac.admitted, ac.rejected]
    rec.call("retry_full", ac.retry_after, 0.3)
    big = AdmissionController(20)
    ops = rng.random(40) < 0.7
    trace = []
    for admit in ops:
        if admit:
            trace.append(big.try_admit())
        elif big.in_system:
            big.release()
        trace.append(big.in_system)
    rec["trace"] = trace
    rec["big_counts"] = [big.in_system, big.admitted, big.rejected]
    for i, spr in enumerate([0.0, 0.01, 0.3, 0.5, 1.0, 2.5, float(rng.uniform(0, 2))]):
        rec.call(f"retry{i}", big.retry_after, spr)
    rec.call("retry_type", lambda: type(big.retry_after(0.7)).__name__)
    empty = AdmissionController(1)
    rec.call("retry_empty", empty.retry_after, 5.0)
    seven = AdmissionController(10)
    for _ in range(7):
        seven.try_admit()
    rec.call("retry_up", lambda: [seven.retry_after(s) for s in (0.3, 0.2, 1.0, 0.01)])  # 2.1 -> 3, not 2


@probe("20.3", messages=True)
def validate(rng, rec):
    from tinytorch.serving.server import RequestError, parse_generate_request

    def run(obj, vocab=10, context=32, limit=16):
        try:
            r = parse_generate_request(obj, vocab, context, limit)
        except RequestError as e:
            return ["refused", e.status, e.message]
        prompt = r.get("prompt")
        return [np.asarray(prompt), {k: v for k, v in r.items() if k != "prompt"}, type(prompt).__name__]

    cases = [{"prompt": [1, 2]},
             {"prompt": [9], "max_new_tokens": 3, "temperature": 0.5, "top_k": 4, "seed": 7, "stream": True},
             {"prompt": [1], "temperature": 1},
             {"prompt": [1] * 20, "max_new_tokens": 12},
             {"prompt": [1], "tokens": 3}, {"prompt": [1], "a": 1, "b": 2}, {"prompt": []}, {"prompt": [1, 10]},
             {"prompt": "hello"}, {"prompt": [1, True]}, {"prompt": [1.5]}, {"prompt": [-1]}, {},
             {"prompt": [1], "max_new_tokens": 0}, {"prompt": [1], "max_new_tokens": 17},
             {"prompt": [1], "max_new_tokens": 2.0}, {"prompt": [1] * 20, "max_new_tokens": 13},
             {"prompt": [1], "temperature": -1}, {"prompt": [1], "temperature": "hot"},
             {"prompt": [1], "top_k": 0}, {"prompt": [1], "seed": -3}, {"prompt": [1], "stream": "yes"},
             {"prompt": [1] * 40}, {"prompt": [1], "temperature": True}, {"prompt": [1], "temperature": float("nan")}]
    for i, obj in enumerate(cases):
        rec.call(f"case{i}", run, obj)
    v = int(rng.integers(5, 50))
    prompt = rng.integers(0, v, int(rng.integers(1, 10))).tolist()
    rec.call("random", run, {"prompt": prompt, "max_new_tokens": int(rng.integers(1, 8))}, v, 16, 8)
    rec.call("random_long", run, {"prompt": prompt, "max_new_tokens": 8}, v, len(prompt) + 7, 8)


def _workload(rng, n):
    out = []
    for i in range(n):
        prompt = rng.integers(0, 20, int(rng.integers(1, 8)))
        kw = [dict(temperature=0.0), dict(temperature=1.0, seed=int(rng.integers(1000))),
              dict(temperature=0.8, top_k=5, seed=int(rng.integers(1000)))][i % 3]
        out.append((prompt, int(rng.integers(1, 10)), kw))
    return out


@probe("20.4")
def continuous(rng, rec):
    from tinytorch.models.gpt import GPT
    from tinytorch.serving.server import ContinuousBatcher, Sequence

    gpt = GPT(vocab_size=20, context_length=24, embed_dim=16, num_heads=2, num_layers=2,
              rng=int(rng.integers(0, 2 ** 30))).eval()

    def trace(cb, max_steps=60):
        steps = []
        for _ in range(max_steps):
            if not cb.waiting and not cb.running:
                break
            left = cb.step()
            steps.append([[s.id for s in left], [s.id for s in cb.running], [s.id for s in cb.waiting],
                          cb.pool.num_free_blocks, {str(s.id): list(s.tokens) for s in left}])
        return [steps, cb.steps, list(cb.batch_sizes.values)]

    cb = ContinuousBatcher(gpt, num_blocks=12, block_size=4, max_batch_size=2)
    for i, n in enumerate((1, 3, 2)):
        cb.add(Sequence(i, [1 + i, 2, 3], n))
    rec.call("example", trace, cb)
    for policy in ("continuous", "static"):
        for j, (blocks, slots) in enumerate(((14, 3), (6, 4), (30, 1))):
            cb = ContinuousBatcher(gpt, num_blocks=blocks, block_size=4, max_batch_size=slots, policy=policy)
            for i, (prompt, n, kw) in enumerate(_workload(rng, 6)):
                cb.add(Sequence(i, prompt, n, **kw))
            rec.call(f"{policy}{j}", trace, cb)
    cb = ContinuousBatcher(gpt, num_blocks=4, block_size=4, max_batch_size=4)
    cb.add(Sequence("a", [1] * 8, 8))
    cb.add(Sequence("b", [1] * 8, 8))
    cb.add(Sequence("c", [1], 1))
    rec.call("fcfs", trace, cb)
    calls = []
    cb = ContinuousBatcher(gpt, num_blocks=20, block_size=4, max_batch_size=3)
    for i in range(3):
        cb.add(Sequence(i, [1, 2, 3], 4))
    h = gpt.register_forward_pre_hook(lambda m, args: calls.append(list(np.shape(args[0]))))
    try:
        rec.call("hooked", trace, cb)
    finally:
        h.remove()
    rec["calls"] = calls


@probe("20.5", messages=True, rtol=1e-9, atol=1e-12)
def time_average(rng, rec):
    from tinytorch.serving.server import time_average_in_system as f

    rec.call("example", f, np.array([0.0, 1.0]), np.array([2.0, 4.0]), 0.0, 4.0)
    rec.call("inner", f, [0.0, 1.0], [2.0, 4.0], 1.0, 2.0)
    rec.call("inf", f, [5.0, 0.5], [6.0, np.inf], 0.0, 2.0)
    rec.call("outside", f, [0.0], [1.0], 5.0, 6.0)
    rec.call("type", lambda: type(f([0.0], [1.0], 0.0, 2.0)).__name__)
    rec.call("lengths", f, [0.0, 1.0], [1.0], 0, 1)
    rec.call("precedes", f, [2.0], [1.0], 0, 3)
    rec.call("empty_window", f, [0.0], [1.0], 2.0, 2.0)
    rec.call("two_d", f, np.zeros((2, 2)), np.zeros((2, 2)), 0, 1)
    rec.call("zero_stay", f, [1.0, 0.5], [1.0, 3.0], 0.0, 2.0)  # a request that leaves as it arrives
    for i in range(4):
        n = int(rng.integers(1, 40))
        a = rng.uniform(0, 10, n)
        d = a + rng.exponential(1.0, n)
        start = float(rng.uniform(-2, 6))
        rec.call(f"rand{i}", f, a, d, start, start + float(rng.uniform(0.5, 6)))
