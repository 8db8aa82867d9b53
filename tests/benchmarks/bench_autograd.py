"""Autograd speed: tinytorch vs PyTorch (CPU) vs the NumPy floor, side by side in one process.

    python tests/benchmarks/bench_autograd.py [--rounds 7] [--skip-100k]

Rows (each timed with `tinytorch.perf.measure.time_call`; the candidates of a row take turns, and
the best of `--rounds` rounds is reported):

- MLP 784-256-128-10 train step at batch 64: forward, cross-entropy, backward, SGD update (written
  inline under `no_grad`; the optimizer module is separate). Goal: at most 1.3x PyTorch.
- 1,000-op elementwise chain (`y = y * 0.999`) on a 10-element tensor, forward + backward: the
  per-op overhead of recording and replaying the graph. Goal: at most 0.7x PyTorch.
- 100,000-op chain, forward + backward: completes with the default recursion limit (timed once).

PyTorch runs twice: with one intra-op thread (`torch.set_num_threads(1)`) and with its default
thread count. NumPy's BLAS (used by tinytorch and the NumPy floor) runs with one thread unless
`TINYTORCH_BENCH_BLAS_THREADS` (or `OPENBLAS_NUM_THREADS`) says otherwise, so "torch 1 thread" is
the like-for-like column. The NumPy floor is the same computation
written by hand in NumPy (forward and backward formulas, no graph): what any framework built on
NumPy would pay for the arithmetic alone. Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# One BLAS thread for NumPy, set before anything imports NumPy (see tests/support/bench.py).
for _var in ("OPENBLAS_NUM_THREADS",):  # not MKL_NUM_THREADS: torch reads it too
    os.environ.setdefault(_var, os.environ.get("TINYTORCH_BENCH_BLAS_THREADS", "1"))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.bench import interleaved, result  # noqa: E402

import numpy as np  # noqa: E402

from tinytorch.core.activations import ReLU  # noqa: E402
from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.layers import Linear, Sequential  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.perf.measure import time_call  # noqa: E402

SIZES = (784, 256, 128, 10)
BATCH, LR = 64, 0.01
CHAIN, FACTOR = 1_000, 0.999


# ---------------------------------------------------------------------------------------------
# MLP train step
# ---------------------------------------------------------------------------------------------
def make_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], BATCH)


def tinytorch_step_fn(x, y):
    model = Sequential(Linear(784, 256, rng=0), ReLU(), Linear(256, 128, rng=1), ReLU(), Linear(128, 10, rng=2))
    params, loss_fn, xt, yt = model.parameters(), CrossEntropyLoss(), Tensor(x), Tensor(y)

    def step():
        loss = loss_fn(model(xt), yt)
        for p in params:
            p.grad = None
        loss.backward()
        with no_grad():
            for p in params:
                p.data -= LR * p.grad.data
        return loss

    return step, [p.data.copy() for p in params]


def torch_step_fn(torch, x, y, init):
    F = torch.nn.functional
    params = [torch.tensor(a, requires_grad=True) for a in init]
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        h = F.relu(F.linear(xt, params[0], params[1]))
        h = F.relu(F.linear(h, params[2], params[3]))
        loss = F.cross_entropy(F.linear(h, params[4], params[5]), yt)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= LR * p.grad
        return loss

    return step


def numpy_step_fn(x, y, init):
    w1, b1, w2, b2, w3, b3 = (a.copy() for a in init)
    rows = np.arange(BATCH)

    def step():
        nonlocal w1, b1, w2, b2, w3, b3
        h1 = np.maximum(x @ w1.T + b1, 0)
        h2 = np.maximum(h1 @ w2.T + b2, 0)
        z = h2 @ w3.T + b3
        s = z - z.max(axis=1, keepdims=True)
        e = np.exp(s)
        lse = np.log(e.sum(axis=1))
        loss = (lse - s[rows, y]).mean()
        dz = e / e.sum(axis=1, keepdims=True)
        dz[rows, y] -= 1
        dz /= BATCH
        dw3, db3 = dz.T @ h2, dz.sum(axis=0)
        dh2 = (dz @ w3) * (h2 > 0)
        dw2, db2 = dh2.T @ h1, dh2.sum(axis=0)
        dh1 = (dh2 @ w2) * (h1 > 0)
        dw1, db1 = dh1.T @ x, dh1.sum(axis=0)
        for p, g in ((w1, dw1), (b1, db1), (w2, dw2), (b2, db2), (w3, dw3), (b3, db3)):
            p -= LR * g
        return loss

    return step


# ---------------------------------------------------------------------------------------------
# Elementwise chains
# ---------------------------------------------------------------------------------------------
def tinytorch_chain(n: int):
    x = Tensor(np.linspace(-1, 1, 10, dtype=np.float32), requires_grad=True)

    def run():
        x.grad = None
        y = x
        for _ in range(n):
            y = y * FACTOR
        y.sum().backward()
        return x.grad

    return run


def torch_chain(torch, n: int):
    x = torch.linspace(-1, 1, 10, requires_grad=True)

    def run():
        x.grad = None
        y = x
        for _ in range(n):
            y = y * FACTOR
        y.sum().backward()
        return x.grad

    return run


def numpy_chain(n: int):
    x = np.linspace(-1, 1, 10, dtype=np.float32)

    def run():
        y = x
        for _ in range(n):
            y = y * FACTOR
        g = np.ones_like(y)
        for _ in range(n):
            g = g * FACTOR
        return g

    return run


# ---------------------------------------------------------------------------------------------
def row(name: str, times: dict, goal: float | None = None) -> None:
    tt, t1, td, npf = times["tinytorch"], times["torch 1 thread"], times["torch default"], times["numpy floor"]
    verdict = ""
    if goal is not None:
        verdict = f"goal <= {goal}x torch: " + ("met" if tt <= goal * min(t1, td) else "MISSED")
    print(f"{name:<38} {tt * 1e3:10.3f} {t1 * 1e3:10.3f} {td * 1e3:10.3f} {npf * 1e3:10.3f}"
          f" {tt / t1:7.2f}x {tt / td:7.2f}x {tt / npf:7.2f}x  {verdict}")
    result(f"{name}: tinytorch / faster torch", tt / min(t1, td), "x", goal=f"<= {goal}x" if goal else None,
           verdict=verdict.rsplit(": ", 1)[-1] if goal else None)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="timing rounds (the best of each candidate is reported)")
    p.add_argument("--skip-100k", action="store_true", help="leave out the 100,000-op chain")
    args = p.parse_args(argv)
    # torch's OpenMP workers spin for a while after each parallel region; that steals the cores from
    # whichever candidate runs next (NumPy's BLAS threads included). Passive waiting keeps turns fair.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError:
        sys.exit("bench_autograd.py compares with PyTorch, which is not installed here: "
                 "pip install -e '.[reference]' (the pinned CPU build), then run it again")

    default_threads = torch.get_num_threads()
    one_thread = lambda: torch.set_num_threads(1)  # noqa: E731
    default = lambda: torch.set_num_threads(default_threads)  # noqa: E731
    nothing = lambda: None  # noqa: E731

    print(f"torch {torch.__version__} (default {default_threads} threads), numpy {np.__version__}; best of "
          f"{args.rounds} interleaved rounds, milliseconds per call; ratios are tinytorch / the column")
    print(f"{'case':<38} {'tinytorch':>10} {'torch 1t':>10} {'torch dflt':>10} {'np floor':>10}"
          f" {'vs 1t':>8} {'vs dflt':>8} {'vs np':>8}")
    x, y = make_data()
    step, init = tinytorch_step_fn(x, y)
    row("MLP 784-256-128-10 step, batch 64", interleaved({
        "tinytorch": (step, nothing), "torch 1 thread": (torch_step_fn(torch, x, y, init), one_thread),
        "torch default": (torch_step_fn(torch, x, y, init), default), "numpy floor": (numpy_step_fn(x, y, init), nothing),
    }, args.rounds), goal=1.3)
    row(f"{CHAIN:,}-op chain fwd+bwd, 10 elements", interleaved({
        "tinytorch": (tinytorch_chain(CHAIN), nothing), "torch 1 thread": (torch_chain(torch, CHAIN), one_thread),
        "torch default": (torch_chain(torch, CHAIN), default), "numpy floor": (numpy_chain(CHAIN), nothing),
    }, args.rounds), goal=0.7)
    if not args.skip_100k:
        n = 100_000
        limit = sys.getrecursionlimit()
        once = {"tinytorch": (tinytorch_chain(n), nothing), "torch 1 thread": (torch_chain(torch, n), one_thread),
                "torch default": (torch_chain(torch, n), default), "numpy floor": (numpy_chain(n), nothing)}
        times = {}
        for name, (fn, setup) in once.items():
            setup()
            times[name] = time_call(fn, warmup=0, repeats=1, number=1).best
        default()
        assert sys.getrecursionlimit() == limit
        row(f"{n:,}-op chain fwd+bwd (once)", times)
        print(f"100,000-op chain: backward completed with the default recursion limit ({limit})")


if __name__ == "__main__":
    main()
