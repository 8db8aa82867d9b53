"""Probes of module 20 (serving): see tito/probes/__init__.py. Every exercise is probed on data alone: the window
(20.1) on queues of made-up arrival times, admission (20.2) on service times, the scheduler (20.3) on model-free
steps (each scheduled sequence is given a token by hand, so no forward pass and no other exercise runs), the packing
and layout of a step's rows (20.4) and the slot mapping (20.5) on the numbers a step would feed them, Little's law
(20.6) on arrival and departure times. No probe calls another exercise's code, so one bug is charged once."""
from collections import deque

import numpy as np

from . import probe


@probe("20.1")
def batch_window(rng, rec):
    from tinytorch.serving.server import batch_window

    def run(arrivals, now, size, wait, delay=None):
        q = deque((float(t), i) for i, t in enumerate(arrivals))
        batch, expired, wake_at = batch_window(q, now, size, wait, delay)
        pairs = lambda xs: [[float(t), int(i)] for t, i in xs]  # noqa: E731
        return [pairs(batch), pairs(expired), None if wake_at is None else float(wake_at), pairs(q)]

    rec.call("full", run, [0.0, 0.1, 0.2], 0.2, 2, 1.0)
    rec.call("wait", run, [0.0, 0.1, 0.2], 0.5, 8, 1.0)
    rec.call("waited", run, [0.0, 0.1, 0.2], 1.0, 8, 1.0)
    rec.call("empty", run, [], 5.0, 4, 0.0)
    rec.call("no_wait", run, [3.0], 3.0, 4, 0.0)
    rec.call("exact_size", run, [0.0, 0.5], 0.5, 2, 10.0)
    rec.call("expire", run, [0.0, 0.1, 0.2], 0.5, 8, 1.0, 0.35)
    rec.call("expire_exact", run, [0.0, 0.5], 0.5, 8, 0.1, 0.5)
    rec.call("expire_then_batch", run, [0.0, 0.0, 0.4], 0.6, 1, 0.1, 0.5)
    rec.call("two_batches_due", run, [0.0, 0.1, 0.2, 0.3, 0.4], 5.0, 2, 1.0)
    for i in range(10):
        n = int(rng.integers(0, 10))
        arrivals = np.cumsum(rng.uniform(0, 0.5, n)).tolist()
        size, wait = int(rng.integers(1, 6)), float(rng.choice([0.0, 0.3, 1.0, 2.5]))
        delay = None if i % 2 else float(rng.choice([0.2, 1.0, 3.0]))
        now = (arrivals[0] if arrivals else 0.0) + float(rng.uniform(0, 3))
        rec.call(f"rand{i}", run, arrivals, now, size, wait, delay)


@probe("20.2", messages=True)
def admission(rng, rec):
    from tinytorch.serving.server import AdmissionController

    ac = AdmissionController(2)
    rec["decisions"] = [ac.try_admit() for _ in range(3)]
    rec["counts"] = [ac.in_system, ac.admitted, ac.rejected, ac.late]
    ac.release()
    rec["after_release"] = [ac.try_admit(), ac.in_system, ac.admitted, ac.rejected]
    rec.call("retry_full", ac.retry_after, 0.3)
    timed = AdmissionController(10, max_wait=0.12)
    rec["timed"] = [timed.try_admit(0.01) for _ in range(3)] + [timed.try_admit(0.05), timed.try_admit(0.04)]
    rec["timed_counts"] = [timed.in_system, timed.admitted, timed.rejected, timed.late]
    full = AdmissionController(2, max_wait=0.01)
    rec["full_before_late"] = [full.try_admit(0.0), full.try_admit(0.001), full.try_admit(0.0), full.rejected, full.late]
    big = AdmissionController(20, max_wait=float(rng.choice([0.1, 0.5, 2.0])))
    trace = []
    for _ in range(60):
        if rng.random() < 0.7:
            trace.append(big.try_admit(float(rng.choice([0.0, 0.01, 0.05, 0.2]))))
        elif big.in_system:
            big.release()
        trace.append(big.in_system)
    rec["trace"] = trace
    rec["big_counts"] = [big.in_system, big.admitted, big.rejected, big.late]
    for i, spr in enumerate([0.0, 0.01, 0.3, 0.5, 1.0, 2.5, float(rng.uniform(0, 2))]):
        rec.call(f"wait{i}", big.predicted_wait, spr)
        rec.call(f"retry{i}", big.retry_after, spr)
    rec.call("retry_type", lambda: type(big.retry_after(0.7)).__name__)
    rec.call("retry_empty", AdmissionController(1).retry_after, 5.0)
    seven = AdmissionController(10)
    for _ in range(7):
        seven.try_admit()
    rec.call("retry_up", lambda: [seven.retry_after(s) for s in (0.3, 0.2, 1.0, 0.01)])  # 2.1 -> 3, not 2


def _gpt(rng):
    from tinytorch.models.gpt import GPT

    return GPT(vocab_size=20, context_length=24, embed_dim=16, num_heads=2, num_layers=1,
               rng=int(rng.integers(0, 2 ** 30))).eval()


def _steps(cb, max_steps=80):
    """Model-free steps: each decoded or joining sequence gets token 7 by hand; per step the decisions and the pool."""
    out = []
    for _ in range(max_steps):
        if not cb.waiting and not cb.running:
            break
        before = cb.preemptions
        decoding, joining = cb.schedule()
        for seq in list(decoding) + list(joining):
            seq.tokens.append(7)
        left = cb.leave()
        out.append([[s.id for s in decoding], [s.id for s in joining], [s.id for s in left],
                    [s.id for s in cb.running], [s.id for s in cb.waiting], cb.pool.num_free_blocks,
                    cb.preemptions - before, {str(k): list(v) for k, v in cb.pool.block_tables.items()}])
    return out


@probe("20.3")
def scheduler(rng, rec):
    from tinytorch.serving.engine import Sequence
    from tinytorch.serving.server import ContinuousBatcher

    gpt = _gpt(rng)

    def batcher(blocks, slots, policy, reqs):
        cb = ContinuousBatcher(gpt, num_blocks=blocks, block_size=4, max_batch_size=slots, policy=policy)
        for i, (t, n) in enumerate(reqs):
            cb.add(Sequence(i, [1] * t, n))
        return cb

    rec.call("example", _steps, batcher(12, 2, "continuous", [(3, 1), (3, 3), (3, 2)]))
    rec.call("preempt", _steps, batcher(3, 4, "continuous", [(3, 4), (3, 4)]))
    rec.call("fcfs", _steps, batcher(4, 4, "continuous", [(8, 8), (8, 8), (1, 1)]))
    rec.call("static", _steps, batcher(12, 2, "static", [(2, 1), (2, 4), (2, 2)]))
    rec.call("preempt_self", _steps, batcher(2, 2, "continuous", [(4, 4), (4, 4)]))
    rec.call("slots", _steps, batcher(12, 2, "continuous", [(2, 4), (2, 4), (2, 4)]))
    rec.call("no_overtaking", _steps, batcher(4, 3, "continuous", [(8, 4), (12, 4), (1, 1)]))
    for policy in ("continuous", "static"):
        for j, (blocks, slots) in enumerate(((5, 3), (7, 4), (14, 2), (30, 1))):
            reqs = []
            for _ in range(6):
                t = int(rng.integers(1, 10))
                reqs.append((t, int(rng.integers(1, min(12, 4 * blocks - t, 24 - t) + 1))))
            rec.call(f"{policy}{j}", _steps, batcher(blocks, slots, policy, reqs))

    def aborts():
        cb = batcher(12, 2, "continuous", [(5, 6)] * 4)
        _ = cb.schedule()
        got = [getattr(cb.abort(i), "id", None) for i in (1, 3, "nobody")]
        return [got, [s.id for s in cb.running], [s.id for s in cb.waiting], cb.pool.num_free_blocks,
                {str(k): list(v) for k, v in cb.pool.block_tables.items()}, _steps(cb)]

    rec.call("abort", aborts)


@probe("20.4")
def packing(rng, rec):
    from tinytorch.serving.server import call_layout, pack_rows

    def pack(past, widths, context, pad):
        return [[int(i) for i in call] for call in pack_rows(list(past), list(widths), context, pad)]

    rec.call("fits", pack, [5, 9, 0], [1, 1, 20], 32, 64)
    rec.call("context", pack, [5, 9, 0], [1, 1, 20], 24, 64)
    rec.call("prefix_hit", pack, [19, 0], [1, 20], 32, 64)
    rec.call("padding", pack, [3, 4, 0, 0], [1, 1, 6, 6], 32, 9)
    rec.call("exact_context", pack, [6, 0], [1, 1], 7, 0)
    rec.call("exact_padding", pack, [1, 1], [1, 3], 32, 2)
    rec.call("first_fit", pack, [0, 0, 0], [2, 4, 2], 32, 1)
    rec.call("one", pack, [0], [7], 7, 0)
    for i in range(8):
        n = int(rng.integers(1, 9))
        context = int(rng.integers(16, 48))
        widths = rng.integers(1, context // 2, n).tolist()
        past = [int(rng.integers(0, context - w + 1)) for w in widths]
        rec.call(f"pack{i}", pack, past, widths, context, int(rng.choice([0, 3, 16, 64])))

    def layout(past, news):
        ids, mask, start = call_layout(past, news)
        return [np.asarray(ids), np.asarray(mask), int(start)]

    rec.call("layout", layout, [2, 0], [[7], [3, 4, 5]])
    rec.call("layout_empty_row", layout, [3, 1], [[5], []])
    rec.call("layout_square", layout, [0, 0], [[1, 2], [3, 4]])
    for i in range(4):
        n = int(rng.integers(1, 5))
        past = rng.integers(0, 8, n).tolist()
        news = [rng.integers(0, 20, int(rng.integers(0 if j else 1, 5))).tolist() for j in range(n)]
        rec.call(f"layout{i}", layout, past, news)


@probe("20.5")
def slots(rng, rec):
    from tinytorch.serving.server import slot_mapping

    def run(tables, past, counts, block_size):
        return [np.asarray(a) for a in slot_mapping(np.asarray(tables), np.asarray(past), np.asarray(counts), block_size)]

    rec.call("example", run, [[5, 2], [7, 0]], [3, 0], [2, 1], 4)
    rec.call("mixed", run, [[4, 9, 1], [3, 0, 0], [6, 0, 0]], [5, 2, 0], [1, 0, 6], 2)
    rec.call("nothing_new", run, [[0], [0]], [0, 0], [0, 0], 16)
    rec.call("one_block", run, [[8, 3, 5]], [9], [3], 4)
    for i in range(5):
        b = int(rng.integers(1, 6))
        bs = int(rng.choice([1, 2, 4, 16]))
        past = rng.integers(0, 20, b)
        counts = rng.integers(0, 8, b)
        need = int(-(-(past + counts).max() // bs)) + 1
        rec.call(f"rand{i}", run, rng.permutation(b * need).reshape(b, need), past, counts, bs)


@probe("20.6", messages=True, rtol=1e-9, atol=1e-12)
def time_average(rng, rec):
    from tinytorch.serving.server import time_average_in_system as f

    rec.call("example", f, np.array([0.0, 1.0]), np.array([2.0, 4.0]), 0.0, 4.0)
    rec.call("inner", f, [0.0, 1.0], [2.0, 4.0], 1.0, 2.0)
    rec.call("inf", f, [5.0, 0.5], [6.0, np.inf], 0.0, 2.0)
    rec.call("outside", f, [0.0], [1.0], 5.0, 6.0)
    rec.call("type", lambda: type(f([0.0], [1.0], 0.0, 2.0)).__name__)
    rec.call("lengths", f, [0.0, 1.0], [1.0], 0, 1)
    rec.call("precedes", f, [2.0], [1.0], 0, 3)
    rec.call("one_precedes", f, [0.0, 2.0, 1.0], [1.0, 1.5, 3.0], 0, 3)  # one bad pair among good ones
    rec.call("empty_window", f, [0.0], [1.0], 2.0, 2.0)
    rec.call("two_d", f, np.zeros((2, 2)), np.zeros((2, 2)), 0, 1)
    rec.call("zero_stay", f, [1.0, 0.5], [1.0, 3.0], 0.0, 2.0)  # a request that leaves as it arrives
    for i in range(4):
        n = int(rng.integers(1, 40))
        a = rng.uniform(0, 10, n)
        d = a + rng.exponential(1.0, n)
        start = float(rng.uniform(-2, 6))
        rec.call(f"rand{i}", f, a, d, start, start + float(rng.uniform(0.5, 6)))
