"""Does module 19's harness agree with the tools practitioners use, and what does its statistics cost?

    python tests/benchmarks/bench_benchmark.py [--rounds 5] [--threads 1]

1. Agreement: four workloads from about a microsecond to a millisecond (a NumPy add of 10
   elements, a 64x64 matmul, a batch-64 forward of the 1986 MLP in tinytorch, a sort of 100,000
   floats), each timed in turns, round by round, by `tinytorch.perf.benchmark.benchmark`,
   `timeit.Timer.repeat` (with the loop size our calibration chose) and, when PyTorch is
   installed, `torch.utils.benchmark.Timer.blocked_autorange`. Prints each harness's median per
   call (the median over rounds) and the ratios ours / timeit and ours / torch: a harness that
   times the same work must land near 1x.
2. Cost of the statistics: `bootstrap_median_ci` (one vectorized draw of 2,000 resamples) against
   `scipy.stats.bootstrap(method="percentile")` with the same number of resamples, for 20 and 200
   samples, and the two intervals side by side.

Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit

if __name__ == "__main__":
    _threads = "1"
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            _threads = sys.argv[i + 1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, _threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tinytorch.core.activations import ReLU  # noqa: E402
from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.layers import Linear, Sequential  # noqa: E402
from tinytorch.perf.benchmark import benchmark, bootstrap_median_ci, format_seconds  # noqa: E402
from tinytorch.perf.measure import time_call  # noqa: E402


def workloads():
    rng = np.random.default_rng(0)
    a10, b10 = rng.random(10), rng.random(10)
    m = rng.standard_normal((64, 64)).astype(np.float32)
    mlp = Sequential(Linear(64, 128, rng=0), ReLU(), Linear(128, 128, rng=1), ReLU(), Linear(128, 10, rng=2)).eval()
    x = rng.standard_normal((64, 64)).astype(np.float32)
    s = rng.random(100_000)

    def forward():
        with no_grad():
            return mlp(x)

    return {"np.add, 10 elements": lambda: np.add(a10, b10), "matmul 64x64": lambda: m @ m,
            "MLP 64-128-128-10 forward, batch 64": forward, "np.sort, 100,000 floats": lambda: np.sort(s)}


def agreement(rounds: int) -> None:
    try:
        import torch
        import torch.utils.benchmark as tb
        torch.set_num_threads(1)
    except ImportError:
        tb = None
    print(f"1. median seconds per call, the median of {rounds} interleaved rounds")
    print(f"{'workload':<38} {'ours':>10} {'timeit':>10} {'torch':>10} {'ours/timeit':>12} {'ours/torch':>11}")
    for name, fn in workloads().items():
        ours, ref, tor = [], [], []
        for _ in range(rounds):
            r = benchmark(fn, min_time=0.02, repeats=10, check_machine=False)
            ours.append(r.median)
            ref.append(float(np.median(timeit.Timer(fn).repeat(repeat=10, number=r.number))) / r.number)
            if tb is not None:
                tor.append(tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1).blocked_autorange(min_run_time=0.2).median)
        o, t = float(np.median(ours)), float(np.median(ref))
        p = float(np.median(tor)) if tor else None
        print(f"{name:<38} {format_seconds(o):>10} {format_seconds(t):>10} {format_seconds(p) if p else '-':>10} "
              f"{o / t:11.3f}x {(f'{o / p:10.3f}x') if p else '-':>11}")


def statistics_cost() -> None:
    try:
        from scipy import stats
    except ImportError:
        print("\n2. scipy is not installed: skipped")
        return
    print("\n2. bootstrap interval of the median, 2,000 resamples: time per call and the intervals")
    for n in (20, 200):
        x = np.random.default_rng(n).lognormal(0, 0.3, n)
        ours = time_call(lambda: bootstrap_median_ci(x, n_resamples=2000, rng=0), repeats=5).median
        ref = time_call(lambda: stats.bootstrap((x,), np.median, n_resamples=2000, method="percentile",
                                                random_state=0), repeats=5).median
        lo, hi = bootstrap_median_ci(x, n_resamples=2000, rng=0)
        ci = stats.bootstrap((x,), np.median, n_resamples=2000, method="percentile", random_state=0).confidence_interval
        print(f"  {n:4d} samples: ours {format_seconds(ours)}, scipy {format_seconds(ref)} ({ref / ours:.1f}x ours); "
              f"intervals ({lo:.4f}, {hi:.4f}) vs ({ci.low:.4f}, {ci.high:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (read before NumPy is imported)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; BLAS threads {args.threads}\n")
    agreement(args.rounds)
    statistics_cost()


if __name__ == "__main__":
    main()
