"""How fast is an optimizer step? tinytorch against bare NumPy (and torch.optim when installed).

    python tests/benchmarks/bench_optimizers.py [--repeats 20]

For two parameter sets (the 784-256-128-10 MLP, 235k parameters, and four 1024x1024 matrices,
4.2M parameters) every parameter gets a fixed gradient, and one `step()` of each optimizer is timed
(median of `repeats` after a warm-up) beside the same update written as bare NumPy expressions on
the arrays (no objects, no checks, no state dicts), run in the same process. The ratio is what the
`Optimizer` machinery costs. The effective bandwidth counts the bytes a rule must at least move
(read and write each parameter and state array, read the gradient). torch.optim runs with one
thread (NumPy's elementwise ops use one) in its single-tensor (`foreach=False`) form. Not a test:
nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tinytorch.core.optimizers import SGD, Adam, AdamW  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402

LR, MU, WD, B1, B2, EPS = 1e-3, 0.9, 1e-2, 0.9, 0.999, 1e-8
# bytes per float32 element a rule must move: p read+write, g read, each state array read+write
BYTES = {"SGD": 12, "SGD momentum": 20, "Adam": 28, "AdamW": 28}


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (creates the optimizer state)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def numpy_rule(name, arrays):
    """The update of `name` as bare NumPy on a list of (param, grad) arrays, state kept in lists."""
    bufs = [np.zeros_like(p) for p, _ in arrays]
    ms = [np.zeros_like(p) for p, _ in arrays]
    vs = [np.zeros_like(p) for p, _ in arrays]
    t = [0]

    def sgd():
        for p, g in arrays:
            p -= LR * g

    def momentum():
        for (p, g), buf in zip(arrays, bufs):
            buf *= MU
            buf += g
            p -= LR * buf

    def adam(decoupled=False):
        t[0] += 1
        c1, c2 = 1 - B1 ** t[0], math.sqrt(1 - B2 ** t[0])
        for (p, g), m, v in zip(arrays, ms, vs):
            if decoupled:
                p *= 1 - LR * WD
            m *= B1
            m += (1 - B1) * g
            v *= B2
            v += (1 - B2) * (g * g)
            p -= (LR / c1) * m / (np.sqrt(v) / c2 + EPS)

    return {"SGD": sgd, "SGD momentum": momentum, "Adam": adam, "AdamW": lambda: adam(True)}[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    sets = {
        "MLP 784-256-128-10": [(256, 784), (256,), (128, 256), (128,), (10, 128), (10,)],
        "4 x 1024x1024": [(1024, 1024)] * 4,
    }
    makers = {
        "SGD": (lambda ps: SGD(ps, lr=LR), lambda ps: torch.optim.SGD(ps, lr=LR, foreach=False)),
        "SGD momentum": (lambda ps: SGD(ps, lr=LR, momentum=MU),
                         lambda ps: torch.optim.SGD(ps, lr=LR, momentum=MU, foreach=False)),
        "Adam": (lambda ps: Adam(ps, lr=LR), lambda ps: torch.optim.Adam(ps, lr=LR, foreach=False)),
        "AdamW": (lambda ps: AdamW(ps, lr=LR, weight_decay=WD),
                  lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WD, foreach=False)),
    }
    header = f"{'parameters':<20} {'optimizer':<13} {'tinytorch':>10} {'NumPy':>10} {'ratio':>6} {'GB/s':>6}"
    if torch is not None:
        header += f" {'torch':>10} {'vs torch':>8}"
    print(header)
    for set_name, shapes in sets.items():
        values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        grads = [rng.standard_normal(s).astype(np.float32) * 0.01 for s in shapes]
        n = sum(v.size for v in values)
        for name, (make, make_torch) in makers.items():
            params = [Tensor(v.copy(), requires_grad=True) for v in values]
            for p, g in zip(params, grads):
                p.grad = Tensor(g)
            opt = make(params)
            t_ours = median_seconds(opt.step, args.repeats)
            t_np = median_seconds(numpy_rule(name, [(v.copy(), g) for v, g in zip(values, grads)]), args.repeats)
            line = (f"{set_name:<20} {name:<13} {t_ours * 1e3:8.3f}ms {t_np * 1e3:8.3f}ms {t_ours / t_np:6.2f} "
                    f"{BYTES[name] * n / t_ours / 1e9:6.2f}")
            if torch is not None:
                tparams = [torch.tensor(v.copy(), requires_grad=True) for v in values]
                for p, g in zip(tparams, grads):
                    p.grad = torch.from_numpy(g)
                t_torch = median_seconds(make_torch(tparams).step, args.repeats)
                line += f" {t_torch * 1e3:8.3f}ms {t_ours / t_torch:8.2f}"
            print(line)
    print(f"\n(ratio = tinytorch / bare NumPy; GB/s = at least {BYTES} bytes per parameter element / tinytorch time)")


if __name__ == "__main__":
    main()
