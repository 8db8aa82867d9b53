"""What does the training stack cost over hand-written NumPy? Ratios measured in one process.

    python tests/benchmarks/bench_training.py [--repeats 5] [--hidden 128] [--batch-size 32] [--threads 1]

- **epoch**: one epoch of the bundled digits (1,437 images) through a 64-H-H-10 ReLU MLP with
  cross-entropy and momentum SGD, once with `Trainer.train_epoch` (tinytorch: Tensor ops, the
  recorded graph, autograd, the optimizer) and once as hand-written NumPy forward, backward and
  update on the same arrays, in the same batch order. The ratio is the price of the framework.
- **checkpoint**: `save_checkpoint` / `load_checkpoint` of that model and its momentum buffers
  against a bare `np.savez` / `np.load` of the same arrays (the price of the metadata, the
  `fsync` and the checks).

Median of `repeats` runs after a warm-up. `--threads` sets NumPy's BLAS threads before NumPy is
imported (default 1: these matrices are small, and on a busy machine extra BLAS threads wait for
each other). Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    sys.path.insert(0, str(ROOT))

    import numpy as np

    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.training import Trainer, load_checkpoint, save_checkpoint
    from tinytorch.data.loader import DataLoader, TensorDataset, load_digits

    try:
        from tinytorch.core.optimizers import SGD
        which = "tinytorch.core.optimizers.SGD"
    except ImportError:  # before module 07 is in the package: the tests' stand-in with the same interface
        sys.path.insert(0, str(ROOT / "tests" / "modules"))
        from _sgd_standin import SGD
        which = "tests/modules/_sgd_standin.SGD (module 07 not in this package)"

    ds = load_digits("train")
    x_all = ds.tensors[0].data
    x_all = ((x_all - x_all.mean(axis=0)) / (x_all.std(axis=0) + 1.0)).astype(np.float32)
    y_all = ds.tensors[1].data
    data = TensorDataset(x_all, y_all)
    h, bs, lr, mom = args.hidden, args.batch_size, 0.01, 0.9

    model = Sequential(Linear(64, h, rng=0), ReLU(), Linear(h, h, rng=1), ReLU(), Linear(h, 10, rng=2))
    trainer = Trainer(model, CrossEntropyLoss(), SGD(model.parameters(), lr=lr, momentum=mom), progress=False)
    loader = DataLoader(data, batch_size=bs, shuffle=True, seed=0)

    # the same network, by hand: weights (out, in) as in Linear, momentum buffers as in SGD
    ws = [p.data.copy() for p in model.parameters()]
    vs = [None] * len(ws)
    order_rng = np.random.default_rng(0)

    def numpy_epoch():
        order = order_rng.permutation(len(x_all))
        for start in range(0, len(order), bs):
            idx = order[start:start + bs]
            x, y = x_all[idx], y_all[idx]
            w1, b1, w2, b2, w3, b3 = ws
            z1 = x @ w1.T + b1
            a1 = np.maximum(z1, 0)
            z2 = a1 @ w2.T + b2
            a2 = np.maximum(z2, 0)
            z3 = a2 @ w3.T + b3
            e = np.exp(z3 - z3.max(axis=1, keepdims=True))
            prob = e / e.sum(axis=1, keepdims=True)
            g3 = prob
            g3[np.arange(len(y)), y] -= 1
            g3 /= len(y)
            g_a2 = g3 @ w3
            g2 = g_a2 * (z2 > 0)
            g_a1 = g2 @ w2
            g1 = g_a1 * (z1 > 0)
            grads = [g1.T @ x, g1.sum(axis=0), g2.T @ a1, g2.sum(axis=0), g3.T @ a2, g3.sum(axis=0)]
            for i, g in enumerate(grads):
                vs[i] = g.copy() if vs[i] is None else vs[i] * mom + g
                ws[i] -= lr * vs[i]

    rows = [("epoch: Trainer.train_epoch vs NumPy by hand", median_seconds(lambda: trainer.train_epoch(loader), args.repeats),
             median_seconds(numpy_epoch, args.repeats))]

    folder = Path(tempfile.mkdtemp())
    path = folder / "c.npz"
    raw = folder / "raw.npz"
    arrays = {f"a{i}": w for i, w in enumerate(ws + [v for v in vs if v is not None])}
    rows.append(("checkpoint save vs np.savez", median_seconds(lambda: save_checkpoint(path, model, trainer.optimizer, 1), args.repeats),
                 median_seconds(lambda: np.savez(raw, **arrays), args.repeats)))

    def raw_load():
        with np.load(raw, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    rows.append(("checkpoint load vs np.load", median_seconds(lambda: load_checkpoint(path, model, trainer.optimizer), args.repeats),
                 median_seconds(raw_load, args.repeats)))

    print(f"digits MLP 64-{h}-{h}-10, batch {bs}, {len(x_all)} images per epoch; optimizer {which}; "
          f"BLAS threads {args.threads}; checkpoint {path.stat().st_size:,} bytes")
    print(f"{'case':<46}{'tinytorch ms':>14}{'numpy ms':>11}{'ratio':>8}")
    for name, ours, base in rows:
        print(f"{name:<46}{ours * 1e3:>14.2f}{base * 1e3:>11.2f}{ours / base:>7.1f}x")


if __name__ == "__main__":
    main()
