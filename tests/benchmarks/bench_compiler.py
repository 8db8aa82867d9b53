"""Module 17's performance goals: a 10-op elementwise chain on 16M float32 elements, one thread.

    python tests/benchmarks/bench_compiler.py [--rounds 5] [--size 16777216] [--no-torch]

Times, in turns in one process (tests/support/bench.interleaved, best of `--rounds`):
- eager NumPy: the chain as ten NumPy calls (each reads and writes a 64 MB array);
- tinytorch eager: the same chain on tinytorch Tensors;
- compiled: `tinytorch.perf.compiler.compile` of the tinytorch chain (one fused C kernel);
- torch.compile: the chain in PyTorch compiled by inductor on the CPU, `torch.set_num_threads(1)`
  (skipped with --no-torch or without torch; compiling takes ~20 s).
Two chains: an arithmetic one (mul/add/sub/div) and one with tanh/exp. Goals (issue 17):
compiled >= 2.5x faster than eager NumPy, and compiled time <= 1.2x torch.compile's. Then the
matmul report (no goal, the lesson is the gap): GFLOP/s of the naive Python loops (n = 64), the
blocked matmul with NumPy tiles (tile from the L2 size) and BLAS at n = 64 and 512 (`--no-matmul`
skips it). Then the kernels' compiler flags, A/B in this process: the compiled chain's kernel built
with `C_FLAGS` (no -ffast-math: NaN and infinity as in NumPy, vector exp/tanh declared by
`vector_math_prelude`) and the same source built with -ffast-math (the flags before issue 31), timed
in turns (`--no-flags` skips it). Not a test: it reports, nothing fails.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ.get("TINYTORCH_BENCH_BLAS_THREADS", "1"))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests.support.bench import interleaved  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.perf import compiler as cc  # noqa: E402
from tinytorch.perf.compiler import compile as tt_compile  # noqa: E402
from tinytorch.perf.kernels import (  # noqa: E402
    block_size_for, blocked_matmul, cache_sizes, matmul_gflops, naive_matmul,
)
from tinytorch.perf.measure import time_call  # noqa: E402


def matmul_report() -> None:
    "GFLOP/s of naive loops, blocked NumPy tiles and BLAS (one thread)."
    caches = cache_sizes()
    tile = block_size_for(caches.get("L2", 1024 ** 2))
    print(f"\nmatmul, float32, 1 thread; L2 {caches.get('L2', 0) // 1024} KiB ({caches['source']}) -> tile {tile}")
    rng = np.random.default_rng(0)
    for n in (64, 512):
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        row = {}
        if n <= 64:
            row["naive loops"] = matmul_gflops(n, time_call(lambda: naive_matmul(a, b), warmup=0, repeats=1, number=1).best)
        row[f"blocked (tile {tile})"] = matmul_gflops(n, time_call(lambda: blocked_matmul(a, b, tile), repeats=5).best)
        row["blocked (tile 32)"] = matmul_gflops(n, time_call(lambda: blocked_matmul(a, b, 32), repeats=5).best)
        row["BLAS (a @ b)"] = matmul_gflops(n, time_call(lambda: a @ b, repeats=5).best)
        blas = row["BLAS (a @ b)"]
        print(f"  n = {n}: " + ", ".join(f"{k} {v:.3g} GFLOP/s ({v / blas:.3g}x BLAS)" for k, v in row.items()))


def arith_chain(x, y):
    "Ten elementwise ops, all arithmetic: works for NumPy arrays, tinytorch and torch tensors alike."
    t = x * 1.5          # 1
    t = t + y            # 2
    t = t - 0.25         # 3
    t = t * t            # 4
    t = t / 3.0          # 5
    t = t + x            # 6
    t = t * y            # 7
    t = t - 1.0          # 8
    t = t * 0.5          # 9
    return t + 2.0       # 10


def transcendental_chain(x, y, exp, tanh):
    "Ten elementwise ops, two of them transcendental (exp, tanh)."
    t = x * 0.5
    t = t + y
    t = tanh(t)
    t = t * 2.0
    t = t - y
    t = exp(t * -1.0)
    t = t + 1.0
    t = t * x
    return t / 4.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-matmul", action="store_true")
    parser.add_argument("--no-flags", action="store_true", help="skip the A/B of the kernels' compiler flags")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    xa = rng.standard_normal(args.size).astype(np.float32)
    ya = rng.standard_normal(args.size).astype(np.float32)
    x, y = Tensor(xa), Tensor(ya)
    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            torch = None
    chains = {
        "arithmetic (10 ops)": arith_chain,
        "tanh/exp (10 ops)": None,
    }
    print(f"{args.size:,} float32 elements ({args.size * 4 / 2**20:.0f} MB per array), 1 thread, best of {args.rounds}")
    for title, chain in chains.items():
        if chain is None:
            np_fn = lambda a, b: transcendental_chain(a, b, np.exp, np.tanh)  # noqa: E731
            tt_fn = lambda a, b: transcendental_chain(a, b, Tensor.exp, Tensor.tanh)  # noqa: E731
            th_fn = (lambda a, b: transcendental_chain(a, b, torch.exp, torch.tanh)) if torch else None  # noqa: E731
        else:
            np_fn = tt_fn = th_fn = chain
        compiled = tt_compile(tt_fn)
        got, want = compiled(x, y).data, np_fn(xa, ya)
        err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
        candidates = {"eager NumPy": lambda: np_fn(xa, ya), "tinytorch eager": lambda: tt_fn(x, y),
                      "compiled (tinytorch)": lambda: compiled(x, y)}
        if torch is not None:
            xt, yt = torch.from_numpy(xa), torch.from_numpy(ya)
            th_compiled = torch.compile(th_fn, backend="inductor")
            with torch.no_grad():
                th_compiled(xt, yt)  # compile once, outside the timing
            candidates["torch.compile (inductor)"] = (lambda: th_compiled(xt, yt), lambda: torch.set_num_threads(1))
            terr = float(np.max(np.abs(th_compiled(xt, yt).numpy() - want) / (1 + np.abs(want))))
        best = interleaved(candidates, args.rounds)
        base = best["eager NumPy"]
        print(f"\n{title}: compiled vs NumPy max rel. error {err:.2e}"
              + (f", torch.compile vs NumPy {terr:.2e}" if torch is not None else ""))
        print(f"  backend: {compiled.explain().splitlines()[1].split('->')[-1].strip()}")
        for name, t in best.items():
            print(f"  {name:<26} {t * 1e3:8.1f} ms   {base / t:5.2f}x NumPy")
        ratio = best["compiled (tinytorch)"]
        print(f"  goal compiled >= 2.5x NumPy: {base / ratio:.2f}x -> {'met' if base / ratio >= 2.5 else 'NOT met'}")
        if torch is not None:
            r = ratio / best["torch.compile (inductor)"]
            print(f"  goal compiled time <= 1.2x torch.compile's: {r:.2f}x -> {'met' if r <= 1.2 else 'NOT met'}")
        if not args.no_flags and cc.c_compiler() is not None:
            flags_report(compiled, x, y, args.rounds)
    if not args.no_matmul:
        matmul_report()


def flags_report(compiled, x, y, rounds: int) -> None:
    "The chain's fused kernel built twice from one source, with C_FLAGS and with -ffast-math, timed in turns."
    import ctypes

    plan = next(iter(compiled.plans.values()))
    node = next(n for n in plan.nodes if n.op == "fused")
    kernel = node.attrs["kernel"]
    if kernel.backend != "c":
        return
    strict = kernel.fn
    saved = list(cc.C_FLAGS)
    try:
        cc.C_FLAGS[:] = [f for f in saved if f not in ("-fno-math-errno", "-ffp-contract=off")] + ["-ffast-math"]
        fast = cc.build_c_kernel(kernel.source, kernel.name)
    finally:
        cc.C_FLAGS[:] = saved
    fast.restype, fast.argtypes = None, [ctypes.c_void_p] * (len(kernel.arg_shapes) + 1) + [ctypes.c_int64]
    out = np.empty(node.shape, np.float32)
    a, b = np.ascontiguousarray(x.data), np.ascontiguousarray(y.data)
    n_outer = out.size // kernel.inner

    def run(fn):
        return lambda: fn(a.ctypes.data, b.ctypes.data, out.ctypes.data, n_outer)
    best = interleaved({"C_FLAGS (strict)": run(strict), "-ffast-math": run(fast)}, rounds)
    s, f = best["C_FLAGS (strict)"], best["-ffast-math"]
    print(f"  kernel flags, same source, in turns: strict {s * 1e3:.1f} ms, -ffast-math {f * 1e3:.1f} ms "
          f"(strict / fast-math = {s / f:.2f}); {cc.C_FLAGS}"
          + ("" if cc.vector_math_prelude() else " (no libmvec declarations here: scalar expf/tanhf)"))


if __name__ == "__main__":
    main()
