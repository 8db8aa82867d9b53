"""How far is tinytorch from plain NumPy? Ratios measured in one process, same data, same machine.

    python tests/benchmarks/bench_overhead.py [--repeats 30]

Each row times the tinytorch operation and the plain NumPy expression that computes the same
result (median of `repeats` runs after a warm-up) and prints their ratio. A ratio near 1 means the
framework adds only its Python-level wrapping; small sizes expose that per-call overhead, large
sizes show the arithmetic. Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tinytorch.core.activations import ReLU, Softmax  # noqa: E402
from tinytorch.core.layers import Linear  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.data.loader import DataLoader, TensorDataset  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_cross_entropy(z, y):
    m = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=1)) + m[:, 0]
    return (lse - z[np.arange(len(y)), y]).mean()


def cases(rng):
    for n in (64, 1024):
        a32 = rng.standard_normal((n, n)).astype(np.float32)
        b32 = rng.standard_normal((n, n)).astype(np.float32)
        a, b = Tensor(a32), Tensor(b32)
        yield f"add {n}x{n}", lambda: a + b, lambda: a32 + b32
        yield f"matmul {n}x{n}", lambda: a @ b, lambda: a32 @ b32
        yield f"sum axis=0 {n}x{n}", lambda: a.sum(axis=0), lambda: a32.sum(axis=0)
        yield f"transpose+reshape {n}x{n}", lambda: a.T.reshape(-1), lambda: a32.T.reshape(-1)
        relu, softmax = ReLU(), Softmax(dim=-1)
        yield f"ReLU {n}x{n}", lambda: relu(a), lambda: np.maximum(a32, 0)
        yield f"Softmax {n}x{n}", lambda: softmax(a), lambda: np_softmax(a32)
    x32 = rng.standard_normal((256, 784)).astype(np.float32)
    layer = Linear(784, 256, rng=0)
    w32, bias32 = layer.weight.data, layer.bias.data
    x = Tensor(x32)
    yield "Linear 784->256, batch 256", lambda: layer(x), lambda: x32 @ w32.T + bias32
    logits32 = rng.standard_normal((512, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 512)
    logits, loss = Tensor(logits32), CrossEntropyLoss()
    yield "CrossEntropy 512x10", lambda: loss(logits, Tensor(labels)), lambda: np_cross_entropy(logits32, labels)
    data32 = rng.standard_normal((4096, 64)).astype(np.float32)
    ys = rng.integers(0, 10, 4096)
    loader = DataLoader(TensorDataset(Tensor(data32), Tensor(ys)), batch_size=128, shuffle=True, seed=0)

    def np_epoch():
        perm = np.random.default_rng(0).permutation(len(data32))
        for i in range(0, len(perm), 128):
            idx = perm[i:i + 128]
            data32[idx], ys[idx]

    yield "DataLoader epoch 4096x64, batch 128", lambda: [None for _ in loader], np_epoch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'operation':<36} {'tinytorch':>12} {'numpy':>12} {'ratio':>7}")
    for name, ours, baseline in cases(rng):
        t_ours, t_np = median_seconds(ours, args.repeats), median_seconds(baseline, args.repeats)
        print(f"{name:<36} {t_ours * 1e6:10.1f}us {t_np * 1e6:10.1f}us {t_ours / t_np:6.2f}x")


if __name__ == "__main__":
    main()
