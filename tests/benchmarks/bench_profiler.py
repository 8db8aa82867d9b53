"""What does module 14's Profiler cost? A GPT training step with and without it, in one process.

    python tests/benchmarks/bench_profiler.py [--rounds 15] [--threads 1]

The step of `bench_gpt.py` (module 13): a GPT of 2 layers, 4 heads, 128 dims, context 32, batch 16,
vocabulary 65; forward, cross-entropy, backward, SGD update. Rows, interleaved round by round so
that all see the same machine load:

- the plain step;
- the same step inside `with Profiler(model):` (an event per forward op and per backward rule,
  with shapes, FLOPs, bytes and module path; module spans from forward hooks; the backward pass
  and the update as `record_function` spans);
- a small GPT (1 layer, 32 dims, batch 2) both ways: there the step is a few milliseconds of
  small ops, the worst case for a per-op profiler;
- for reference, PyTorch's own step plain and inside `torch.profiler.profile(record_shapes=True,
  with_flops=True)`, when torch is installed.

Prints the median and best milliseconds of each and the ratios profiled / plain (goal for the
GPT step: at most 1.3x). Not a test: nothing here fails, it reports.

`--against FILE` adds the same rows for another version of the profiler (a `profiler.py` saved from
another commit, e.g. `git show main:tinytorch/perf/profiler.py > /tmp/old_profiler.py`), loaded into this
process beside the current one: an A/B of two versions under the same load, round by round.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

if __name__ == "__main__":
    _threads = "1"
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            _threads = sys.argv[i + 1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, _threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.models.gpt import GPT  # noqa: E402
from tinytorch.perf.measure import time_call  # noqa: E402
from tinytorch.perf.profiler import Profiler, record_function  # noqa: E402

V = 65


def make_step(model, x, y, lr=1e-3):
    def step():
        loss = CrossEntropyLoss()(model(x).reshape(-1, V), y.reshape(-1))
        for p in model.parameters():
            p.grad = None
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer.step"), no_grad():
            for p in model.parameters():
                p.data -= lr * p.grad.data
        return loss
    return step


def profiled(model, step, profiler=None):
    cls = profiler or Profiler

    def run():
        with cls(model):
            step()
    return run


def load_profiler(path: str):
    "The `Profiler` class of another version of tinytorch/perf/profiler.py, loaded beside the current one."
    spec = importlib.util.spec_from_file_location("tinytorch.perf._profiler_against", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Profiler


def rounds_of(candidates: dict, rounds: int) -> dict:
    """Seconds per call of each candidate, one timed call each per round, in turns (after one warm-up each). The
    order of the turns is reversed every other round, so that no candidate always follows the same one."""
    for fn in candidates.values():
        fn()
    times = {name: [] for name in candidates}
    order = list(candidates.items())
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            times[name].append(time_call(fn, warmup=0, repeats=1, number=1).best)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (default 1)")
    ap.add_argument("--against", default=None, help="another profiler.py to time beside this one (an in-process A/B)")
    args = ap.parse_args()
    other = load_profiler(args.against) if args.against else None
    rng = np.random.default_rng(0)
    cases, models = {}, {}
    for label, (T, E, H, L, B) in {"GPT 2x128, T=32, B=16": (32, 128, 4, 2, 16),
                                   "small GPT 1x32, T=16, B=2": (16, 32, 2, 1, 2)}.items():
        model = GPT(V, T, E, H, L, rng=0)
        x, y = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
        step = make_step(model, x, y)
        with Profiler(model) as prof:
            step()
        cases[label] = (step, profiled(model, step), len(prof.events))
        models[label] = model
    candidates = {}
    for label, (plain, prof_step, _) in cases.items():
        candidates[f"{label}: plain"] = plain
        candidates[f"{label}: Profiler"] = prof_step
        if other is not None:
            candidates[f"{label}: Profiler (against)"] = profiled(models[label], plain, other)
    torch = None
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: no torch.profiler reference row")
    if torch is not None:
        from bench_gpt import B as TB, T as TT, torch_model
        torch.set_num_threads(args.threads)
        net = torch_model(torch)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        tx, ty = torch.tensor(rng.integers(0, V, (TB, TT))), torch.tensor(rng.integers(0, V, (TB, TT)))

        def torch_step():
            loss = torch.nn.functional.cross_entropy(net(tx).reshape(-1, V), ty.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()

        def torch_profiled():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                        with_flops=True):
                torch_step()

        candidates["PyTorch GPT 2x128: plain"] = torch_step
        candidates["PyTorch GPT 2x128: torch.profiler"] = torch_profiled
    times = rounds_of(candidates, args.rounds)
    print(f"{args.rounds} interleaved rounds, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    for name, ts in times.items():
        print(f"  {name:<45} median {statistics.median(ts) * 1e3:8.2f} ms, best {min(ts) * 1e3:8.2f} ms")
    pairs = [(label, f"{label}: plain", f"{label}: Profiler", f"{n} events") for label, (_, _, n) in cases.items()]
    if torch is not None:
        pairs.append(("PyTorch GPT 2x128", "PyTorch GPT 2x128: plain", "PyTorch GPT 2x128: torch.profiler", "torch.profiler"))
    for label, plain, prof, note in pairs:
        med = statistics.median(times[prof]) / statistics.median(times[plain])
        best = min(times[prof]) / min(times[plain])
        goal = " (goal: at most 1.3x)" if label.startswith("GPT 2x128") else ""
        print(f"  profiled / plain, {label} ({note}): {med:.2f}x median, {best:.2f}x best{goal}")
    if other is not None:
        rng = np.random.default_rng(0)
        for label in cases:
            now, then = np.array(times[f"{label}: Profiler"]), np.array(times[f"{label}: Profiler (against)"])
            ratios = now / then
            boot = np.median(ratios[rng.integers(0, len(ratios), (2000, len(ratios)))], axis=1)
            lo, hi = np.percentile(boot, [2.5, 97.5])
            verdict = ("no slower (the interval lies below 1.05x)" if hi <= 1.05 else
                       "slower (the interval lies above 1.05x)" if lo > 1.05 else
                       "too noisy to tell at 1.05x: run more rounds on a quieter machine")
            print(f"  this profiler / {args.against}, {label}: {np.median(ratios):.3f}x median of {len(ratios)} paired "
                  f"rounds, 95% bootstrap interval {lo:.3f}x to {hi:.3f}x: {verdict}")


if __name__ == "__main__":
    main()
