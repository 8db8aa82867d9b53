"""What module 20's tests (package, checkpoint, CLI, milestone) share: references written apart from the
package, hypothesis strategies for request queues and generation workloads, a clock the test moves, and
models whose batches the test holds.

    from tests.support.serving import FakeClock, Gated, workloads, ref_batch_window, ref_time_average

The references are the rules as the contracts state them, written the plain way (loops, no NumPy
tricks), so a vectorized or otherwise clever implementation is checked against something that shares
none of its code: `ref_batch_window` (the dynamic batcher's window), `ref_admit` (admission),
`check_calls` (what a packing of one step's rows must satisfy), `ref_slot_mapping` (a loop over
tokens), `ref_time_average` (N(t) integrated exactly between its event times) and `solo_tokens`
(module 18's `generate_cached`, which never batches); `ref_schedule` replays one step of the scheduler's
contract on plain numbers.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref

import numpy as np
from hypothesis import strategies as st

from tinytorch.core.layers import Module

# ---------------------------------------------------------------------------------------------
# Time: a clock the test moves, and waits that fail with a message instead of hanging
# ---------------------------------------------------------------------------------------------


class FakeClock:
    """A clock the test moves (`advance`), passed as the server's `clock=`: queue delays, service times and latencies
    are then read in its seconds, and nothing the machine does (load, stalls) can change them."""

    def __init__(self, start: float = 100.0):
        self.t, self.lock = float(start), threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


class Gate(threading.Event):
    """Open, until the test closes it (`clear`) to hold work inside the server. A test that fails while a gate is
    closed would leave that work waiting, and the server's drain on the way out with it (the wrong answer then
    reads as a hang at the time limit): every gate opens when a wait of the test fails (`until`) or a served app's
    block ends in an error (`open_all_gates`), so the failure is reported at once, with its own message."""

    _every: "weakref.WeakSet[Gate]" = weakref.WeakSet()

    def __init__(self):
        super().__init__()
        self.set()
        Gate._every.add(self)


def open_all_gates() -> None:
    "Open every gate a test has closed (on a failure: the server's work and drain then finish)."
    for gate in list(Gate._every):
        gate.set()


class Gated(Module):
    """A classifier whose every batch costs `seconds` on `clock` (no real time passes) and, while `gate` is closed,
    waits for the test to open it: the test decides when a batch is done. `batches` lists their sizes."""

    def __init__(self, clock: FakeClock, seconds: float = 0.0, sizes=(4, 3)):
        from tinytorch.serving.models import mlp_classifier

        super().__init__()
        self.clock, self.seconds, self.inner = clock, seconds, mlp_classifier(list(sizes), rng=0)
        self.gate = Gate()
        self.batches: list = []

    def forward(self, x):
        assert self.gate.wait(60), "the test never opened the gate"
        self.clock.advance(self.seconds)
        self.batches.append(len(x.data))
        return self.inner(x)


async def until(condition, what: str, seconds: float = 30.0, watch=()) -> None:
    """Wait (polling the event loop) until `condition()` holds; fail naming `what` after `seconds` of real time.
    `watch`: request tasks that must still be in flight meanwhile: one that ends first (an error of the code under
    test, say an unfinished exercise) ends the wait at once with its exception, or with what it answered."""
    deadline = time.perf_counter() + seconds
    while not condition():
        for task in watch:
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    open_all_gates()
                    raise task.exception()
                r = task.result()
                open_all_gates()
                raise AssertionError(f"waiting for {what}, a request ended first: "
                                     f"{getattr(r, 'status_code', r)} {getattr(r, 'text', '')[:300]}")
        if time.perf_counter() > deadline:
            open_all_gates()
            raise AssertionError(f"{what} did not happen within {seconds:.0f} s")
        await asyncio.sleep(0.001)


def run(coro, timeout: float = 60):
    "Run a coroutine on a fresh event loop, bounded in time."
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------


def ref_batch_window(pending: list, now: float, max_batch_size: int, max_wait: float, max_queue_delay=None):
    "The window's contract on a list of (arrival, request): (batch, expired, wake_at, left)."
    left = list(pending)
    expired = []
    while max_queue_delay is not None and left and now - left[0][0] > max_queue_delay:
        expired.append(left.pop(0))
    batch = []
    if left and (len(left) >= max_batch_size or now - left[0][0] >= max_wait):
        batch, left = left[:max_batch_size], left[max_batch_size:]
    return batch, expired, (left[0][0] + max_wait if left else None), left


def ref_admit(in_system: int, bound: int, max_wait, seconds_per_request: float) -> str:
    "'rejected', 'late' or 'admitted': admission's contract for one request."
    if in_system >= bound:
        return "rejected"
    if max_wait is not None and in_system * seconds_per_request > max_wait:
        return "late"
    return "admitted"


def check_calls(calls, past, widths, context_length: int, pack_padding: int) -> str:
    """'' when `calls` is a valid packing of the rows (each row once; every call within the context and, unless it
    is one row, within the padding budget; first fit), else what is wrong."""
    rows = sorted(int(i) for call in calls for i in call)
    if rows != list(range(len(past))):
        return f"every row in exactly one call: rows {rows} of {len(past)}"
    opened = []
    for i in range(len(past)):   # first fit, replayed
        for call in opened:
            cand = call + [i]
            wide = max(widths[r] for r in cand)
            if (max(past[r] for r in cand) + wide <= context_length
                    and len(cand) * wide - sum(widths[r] for r in cand) <= pack_padding):
                call.append(i)
                break
        else:
            opened.append([i])
    if [list(map(int, c)) for c in calls] != opened:
        return f"first fit gives {opened}; got {calls}"
    return ""


def ref_schedule(running, waiting, held, free: int, block_size: int, max_batch_size: int, policy: str):
    """The scheduler's contract on plain data. `running`, `waiting`: lists of `(id, length)` (length: prompt plus
    tokens so far); `held`: {id: blocks its table holds}; `free`: free blocks. Returns `(decoded ids, joined ids,
    running ids, waiting ids, free blocks, preemptions)` after one `schedule()`."""
    running, waiting, held = list(running), list(waiting), dict(held)
    need = lambda sid, n: max(0, -(-n // block_size) - held.get(sid, 0))  # noqa: E731
    decoded, preempted = [], 0
    while len(decoded) < len(running):
        sid, n = running[len(decoded)]
        if need(sid, n) <= free:
            free -= need(sid, n)
            held[sid] = held.get(sid, 0) + need(sid, n)
            decoded.append(sid)
        else:                                  # the last to join gives its blocks back, perhaps sid itself
            victim = running.pop()
            free += held.pop(victim[0])
            waiting.insert(0, victim)
            preempted += 1
    joined = []
    if policy == "continuous" or not running:
        while waiting and len(running) < max_batch_size and need(*waiting[0]) <= free:
            sid, n = waiting.pop(0)
            free -= need(sid, n)
            held[sid] = -(-n // block_size)
            running.append((sid, n))
            joined.append(sid)
    return decoded, joined, [r[0] for r in running], [w[0] for w in waiting], free, preempted


def ref_slot_mapping(tables, past, counts, block_size: int):
    "(rows, positions, blocks, slots) of every new token, one token at a time."
    out = [[], [], [], []]
    for i, (p, c) in enumerate(zip(past, counts)):
        for pos in range(int(p), int(p) + int(c)):
            for lst, v in zip(out, (i, pos, int(tables[i][pos // block_size]), pos % block_size)):
                lst.append(v)
    return [np.array(x, dtype=np.int64) for x in out]


def ref_time_average(arrivals, departures, start: float, end: float) -> float:
    "N(t) is piecewise constant between event times: integrate it exactly over [start, end], divide by its length."
    a, d = np.asarray(arrivals, float), np.asarray(departures, float)
    cuts = np.unique(np.clip(np.concatenate([a, d, [start, end]]), start, end))
    mids = (cuts[:-1] + cuts[1:]) / 2
    n_at = ((a[None, :] <= mids[:, None]) & (mids[:, None] < d[None, :])).sum(axis=1)
    return float((n_at * np.diff(cuts)).sum() / (end - start))


def tiny_gpt(seed: int = 0, context: int = 24, vocab: int = 20):
    from tinytorch.models.gpt import GPT

    return GPT(vocab_size=vocab, context_length=context, embed_dim=16, num_heads=2, num_layers=2, rng=seed).eval()


def solo_tokens(gpt, prompt, n: int, **kw) -> list:
    "The tokens `prompt` gets alone (module 18's cached generation, one sequence, no batching)."
    from tinytorch.perf.kv_cache import generate_cached

    prompt = np.asarray(prompt, dtype=np.int64)
    kw.setdefault("temperature", 0.0)
    return generate_cached(gpt, prompt[None], n, **kw)[0, len(prompt):].tolist()


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

SAMPLING = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=5)]


@st.composite
def queues(draw, max_size: int = 12):
    "A pending queue (arrival, request id), oldest first, and a `now` at or after its oldest arrival."
    gaps = draw(st.lists(st.floats(0, 1), max_size=max_size))
    arrivals = np.cumsum(gaps).tolist()
    now = (arrivals[0] if arrivals else 0.0) + draw(st.floats(0, 3))
    return [(t, i) for i, t in enumerate(arrivals)], now


@st.composite
def workloads(draw, n=(1, 8), vocab: int = 20, context: int = 24, prompt=(1, 9), new=(1, 12), shared: bool = True):
    """Generation requests `(prompt, max_new_tokens, sampling kwargs)` that each fit `context`: mixed lengths and
    sampling settings, and (with `shared`) repeated prompts and prompts that extend one another (prefix-cache hits)."""
    out = []
    for i in range(draw(st.integers(*n))):
        t = draw(st.integers(prompt[0], min(prompt[1], context - 1)))
        if shared and out and draw(st.booleans()):
            base = list(out[draw(st.integers(0, len(out) - 1))][0])
            extra = draw(st.lists(st.integers(0, vocab - 1), max_size=3))
            ids = (base + extra)[:context - 1]
        else:
            ids = draw(st.lists(st.integers(0, vocab - 1), min_size=t, max_size=t))
        m = draw(st.integers(new[0], max(new[0], min(new[1], context - len(ids)))))
        kw = dict(SAMPLING[i % 3])
        if kw["temperature"]:
            kw["seed"] = draw(st.integers(0, 999))
        out.append((ids, m, kw))
    return out


def at_the_context_limit(context: int, rng, n: int, vocab: int = 16):
    """Requests whose prompt plus answer fill the context exactly: long prompts, one repeated (a prefix-cache hit
    beside a long joiner), and short ones that decode to the last position."""
    long_prompt = rng.integers(0, vocab, context - 12).tolist()
    reqs = [(long_prompt, 12, dict(temperature=0.0)), (long_prompt, 12, dict(temperature=0.0)),
            ([7] * (context - 12), 12, dict(temperature=0.9, seed=3))]
    while len(reqs) < n:
        t = int(rng.integers(1, context))
        reqs.append((rng.integers(0, vocab, t).tolist(), context - t, dict(temperature=0.0)))
    return reqs


def pool_blocks(context: int, block_size: int) -> int:
    return math.ceil(context / block_size)


__all__ = ["FakeClock", "Gated", "until", "run", "ref_batch_window", "ref_admit", "ref_schedule", "check_calls",
           "ref_slot_mapping", "ref_time_average", "tiny_gpt", "solo_tokens", "SAMPLING", "queues", "workloads",
           "at_the_context_limit", "pool_blocks"]
