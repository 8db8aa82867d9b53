"""Timing helpers of the benchmark scripts in tests/benchmarks/ (never used by timed unit tests).

The scripts ask NumPy's BLAS for one thread before anything imports NumPy
(`OPENBLAS_NUM_THREADS=1`, the BLAS of the NumPy wheels, overridable with `TINYTORCH_BENCH_BLAS_THREADS`): on a shared machine
busy-waiting BLAS threads make timings swing by 10x, and one thread is the like-for-like
comparison with `torch.set_num_threads(1)`.
"""
from __future__ import annotations

from tinytorch.perf.measure import time_call


def interleaved(candidates: dict, rounds: int) -> dict:
    """Best seconds per call of each candidate, timed in turns (one `time_call` repeat each per round).

    Taking turns means every candidate sees the same machine load: on a shared machine the load
    changes over seconds, and timing one candidate after the other would put that change into the
    ratios. `candidates` maps a name to `fn` or `(fn, setup)`; `setup()` runs before each timing
    (e.g. to set torch's thread count) and is not timed. A None fn is skipped (reported as None).
    """
    norm = {k: (v if isinstance(v, tuple) else (v, None)) for k, v in candidates.items()}
    numbers, best = {}, {k: None for k in norm}
    for name, (fn, setup) in norm.items():
        if fn is None:
            continue
        if setup:
            setup()
        numbers[name] = time_call(fn, repeats=1).number  # warm-up, and calls per repeat
    for _ in range(rounds):
        for name, (fn, setup) in norm.items():
            if fn is None:
                continue
            if setup:
                setup()
            t = time_call(fn, warmup=0, repeats=1, number=numbers[name]).best
            best[name] = t if best[name] is None else min(best[name], t)
    return best
