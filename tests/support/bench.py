"""Timing helpers of the benchmark scripts in tests/benchmarks/ (never used by timed unit tests).

The scripts ask NumPy's BLAS for one thread before anything imports NumPy
(`OPENBLAS_NUM_THREADS=1`, the BLAS of the NumPy wheels, overridable with `TINYTORCH_BENCH_BLAS_THREADS`): on a shared machine
busy-waiting BLAS threads make timings swing by 10x, and one thread is the like-for-like
comparison with `torch.set_num_threads(1)`.
"""
from __future__ import annotations

import os

from tinytorch.perf.measure import time_call

RESULTS: list[dict] = []  # what this script reported with `result`, in order


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


def result(label: str, value, unit: str = "", *, goal: str | None = None, verdict: str | None = None) -> dict:
    """Report one headline number of a benchmark (`result("tinytorch / torch, MLP step", 0.76, "x", goal="<= 1.3x",
    verdict="met")`). It is kept in RESULTS and, when `TINYTORCH_RESULT_FILE` is set (`tito guide measure
    bench NAME` sets it), written there at once as JSON, so the lab guide's measured page shows the number
    with the machine it was measured on. Printing stays the script's own business."""
    import sys

    entry = {"label": label, "value": value if isinstance(value, (str, type(None))) else float(value), "unit": unit,
             "goal": goal, "verdict": verdict}
    RESULTS.append(entry)
    path = os.environ.get("TINYTORCH_RESULT_FILE")
    if path:
        from tito.measured import write_json

        write_json(path, {"script": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "results": RESULTS})
    return entry
