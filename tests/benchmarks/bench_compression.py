"""Does compression make a model faster? Pruned, structured and low-rank models against the dense one,
and a sparse (CSR) matmul against dense BLAS over density, timed in one process.

    python tests/benchmarks/bench_compression.py [--rounds 15] [--batch 256] [--size 512] [--cols 64]

Part 1, the model of module 16's table (the 64-256-256-10 digits MLP; weights drawn at random,
speed does not depend on their values), forward pass of a batch under `no_grad`, at the settings of
the notebook's table:

- unstructured magnitude pruning (global) at 50/80/90/95% sparsity, run three ways: the tinytorch
  model as it is (zeros stored densely), the same layers as `CSRMatrix` (module 16's NumPy
  kernel) and as `scipy.sparse.csr_matrix` (compiled), each computing `W @ x.T` per layer;
- structured pruning keeping 50/25/12.5% of the hidden neurons (`prune_mlp_neurons`);
- low rank 32/16/8 on every layer where it saves parameters (`low_rank_model`).

Each row prints the FLOPs the variant needs (nonzeros for the sparse rows), the predicted speed-up
(dense FLOPs / its FLOPs), the measured time and the measured speed-up against the dense model.

Part 2: `W @ X` for a `size x size` W and a `size x cols` X against the density of W (random
positions, as magnitude pruning leaves them): dense BLAS, `CSRMatrix.matmul`, `scipy.sparse`; the
crossover density where a sparse kernel starts to win is interpolated in log-log.

Candidates are timed in turns (`tests/support/bench.interleaved`, best of `--rounds`), NumPy's
BLAS on one thread (`TINYTORCH_BENCH_BLAS_THREADS` changes it). Not a test: nothing here fails.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

# One BLAS thread for NumPy, set before anything imports NumPy (see tests/support/bench.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("TINYTORCH_BENCH_BLAS_THREADS", "1"))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tests.support.bench import interleaved  # noqa: E402
from tinytorch.core.activations import ReLU  # noqa: E402
from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.layers import Linear, Sequential  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.perf.compression import (  # noqa: E402
    CSRMatrix, low_rank_model, model_cost, prune_magnitude, prune_mlp_neurons, storage_bytes,
)

try:
    import scipy.sparse as scipy_sparse
except ImportError:  # the scipy rows are left out
    scipy_sparse = None

# The settings of the table in modules/16_compression (section 7.1).
SPARSITIES = [0.5, 0.8, 0.9, 0.95]
KEEP = [0.5, 0.25, 0.125]
RANKS = [32, 16, 8]
DENSITIES = [0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0]


def mlp(widths, seed=0):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(Linear(a, b, rng=seed + i))
        if i < len(widths) - 2:
            layers.append(ReLU())
    return Sequential(*layers)


def sparse_forward(layers, xt):
    """The MLP forward on the transposed batch `xt (features, batch)`: per layer `W @ xt + b[:, None]`
    with W sparse (CSRMatrix or scipy), ReLU between layers. Returns the logits `(batch, classes)`."""
    h = xt
    for i, (w, b) in enumerate(layers):
        h = w @ h
        h += b[:, None]
        if i < len(layers) - 1:
            np.maximum(h, 0, out=h)
    return h.T


def crossover(densities, sparse_times, dense_time):
    "Density where the sparse time meets the dense one (log-log interpolation); None when it never does."
    d, t = np.log(np.asarray(densities)), np.log(np.asarray(sparse_times)) - np.log(dense_time)
    for i in range(len(d) - 1):
        if t[i] <= 0 < t[i + 1]:
            return float(np.exp(d[i] + (d[i + 1] - d[i]) * (-t[i]) / (t[i + 1] - t[i])))
    return None


def part_models(rounds: int, batch: int) -> None:
    dense = mlp([64, 256, 256, 10], seed=0)
    x = Tensor(np.random.default_rng(0).standard_normal((batch, 64)).astype(np.float32))
    xt = np.ascontiguousarray(x.data.T)
    dense_flops = model_cost(dense)["flops"]

    rows = {}  # name -> (fn, FLOPs per sample, bytes)

    def tiny(model):
        def run():
            with no_grad():
                return model(x)
        return run

    rows["dense"] = (tiny(dense), dense_flops, storage_bytes(dense))
    with no_grad():
        reference = dense(x).data
    for s in SPARSITIES:
        pruned = mlp([64, 256, 256, 10], seed=0)
        prune_magnitude(pruned, s)
        nnz_flops = 2 * sum(int(np.count_nonzero(layer.weight.data)) for layer in pruned.layers if isinstance(layer, Linear))
        linears = [layer for layer in pruned.layers if isinstance(layer, Linear)]
        ours = [(CSRMatrix.from_dense(layer.weight.data), layer.bias.data) for layer in linears]
        with no_grad():
            expected = pruned(x).data
        assert np.allclose(sparse_forward(ours, xt), expected, atol=1e-4), "CSRMatrix forward differs from the dense one"
        rows[f"{s:.0%} sparse, dense storage"] = (tiny(pruned), dense_flops, storage_bytes(pruned))
        rows[f"{s:.0%} sparse, CSRMatrix"] = (lambda ours=ours: sparse_forward(ours, xt), nnz_flops,
                                              storage_bytes(pruned, sparse=True))
        if scipy_sparse is not None:
            theirs = [(scipy_sparse.csr_matrix(layer.weight.data), layer.bias.data) for layer in linears]
            assert np.allclose(sparse_forward(theirs, xt), expected, atol=1e-4)
            rows[f"{s:.0%} sparse, scipy.sparse"] = (lambda theirs=theirs: sparse_forward(theirs, xt), nnz_flops,
                                                     storage_bytes(pruned, sparse=True))
    for keep in KEEP:
        small = prune_mlp_neurons(dense, keep)
        rows[f"structured, keep {keep:.1%}"] = (tiny(small), model_cost(small)["flops"], storage_bytes(small))
    for r in RANKS:
        factored = low_rank_model(dense, rank=r)
        rows[f"low rank {r}"] = (tiny(factored), model_cost(factored)["flops"], storage_bytes(factored))
    assert reference.shape == (batch, 10)

    best = interleaved({name: fn for name, (fn, _, _) in rows.items()}, rounds)
    print(f"\nPart 1: 64-256-256-10 MLP forward, batch {batch}, best of {rounds} interleaved rounds")
    print(f"{'variant':<30}{'bytes':>9}{'FLOPs/sample':>14}{'predicted':>11}{'time':>11}{'measured':>10}")
    for name, (_, flops, nbytes) in rows.items():
        print(f"{name:<30}{nbytes:>9,}{flops:>14,}{dense_flops / flops:>10.2f}x{best[name] * 1e6:>9.0f}us"
              f"{best['dense'] / best[name]:>9.2f}x")


def part_matmul(rounds: int, size: int, cols: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((size, size)).astype(np.float32)
    x = rng.standard_normal((size, cols)).astype(np.float32)
    candidates = {"dense": lambda: w @ x}
    for d in DENSITIES:
        wd = w * (rng.random(w.shape) < d)
        ours = CSRMatrix.from_dense(wd)
        assert np.allclose(ours @ x, wd @ x, atol=1e-3)
        candidates[f"ours {d}"] = lambda ours=ours: ours @ x
        if scipy_sparse is not None:
            theirs = scipy_sparse.csr_matrix(wd)
            candidates[f"scipy {d}"] = lambda theirs=theirs: theirs @ x
    best = interleaved(candidates, rounds)
    t_dense = best["dense"]
    print(f"\nPart 2: W @ X, W {size}x{size} at falling density, X {size}x{cols}; dense BLAS "
          f"{t_dense * 1e3:.3f} ms ({2 * size * size * cols / t_dense / 1e9:.1f} GFLOP/s), best of {rounds} rounds")
    head = f"{'density':>8}{'predicted':>11}{'CSRMatrix':>11}{'/ dense':>9}"
    print(head + (f"{'scipy':>11}{'/ dense':>9}" if scipy_sparse is not None else ""))
    for d in DENSITIES:
        t = best[f"ours {d}"]
        line = f"{d:>8.3f}{d * t_dense * 1e3:>9.3f}ms{t * 1e3:>9.3f}ms{t / t_dense:>8.2f}x"
        if scipy_sparse is not None:
            ts = best[f"scipy {d}"]
            line += f"{ts * 1e3:>9.3f}ms{ts / t_dense:>8.2f}x"
        print(line)
    for name in ("ours", "scipy") if scipy_sparse is not None else ("ours",):
        c = crossover(DENSITIES, [best[f"{name} {d}"] for d in DENSITIES], t_dense)
        label = "CSRMatrix (NumPy)" if name == "ours" else "scipy.sparse"
        print(f"crossover, {label}: " + ("below the smallest density measured" if c is None else
                                          f"{c:.2%} density ({1 - c:.1%} sparsity)"))
    ours_full, flops = best["ours 1.0"], 2 * size * size * cols
    print(f"FLOP rate at density 1: BLAS {flops / t_dense / 1e9:.1f} GFLOP/s, CSRMatrix {flops / ours_full / 1e9:.2f}"
          + (f", scipy {flops / best['scipy 1.0'] / 1e9:.2f}" if scipy_sparse is not None else "") + " GFLOP/s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default %(default)s)")
    parser.add_argument("--batch", type=int, default=256, help="batch of the MLP forward (default %(default)s)")
    parser.add_argument("--size", type=int, default=512, help="W is size x size in part 2 (default %(default)s)")
    parser.add_argument("--cols", type=int, default=64, help="columns of X in part 2 (default %(default)s)")
    args = parser.parse_args(argv)
    print(f"{platform.machine()}, Python {platform.python_version()}, NumPy {np.__version__}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, "
          f"scipy {'not installed' if scipy_sparse is None else __import__('scipy').__version__}")
    part_models(args.rounds, args.batch)
    part_matmul(args.rounds, args.size, args.cols)
    return 0


if __name__ == "__main__":
    sys.exit(main())
