"""How far is tinytorch from plain NumPy, and how much did per-op overhead change? One process, same data.

    python tests/benchmarks/bench_overhead.py [--rounds 5] [--before 5bd477c]

Each row times (with `tinytorch.perf.measure.time_call`, in turns, best of `--rounds`) the tinytorch operation,
the same operation with the tensor module as it was at git revision `--before` (the module 01
Tensor before op records, `__slots__` and the fast result path; read with `git show` and imported
under another name), and the plain NumPy expression. Ratios are against NumPy in the same run: a
ratio near 1 means the framework adds only its Python-level wrapping. 10-element and 64x64 inputs
expose the per-call overhead, 1024x1024 ones the arithmetic. "-" means the old module lacks the
op, or git is not available. Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# One BLAS thread for NumPy, set before anything imports NumPy (see tests/support/bench.py).
for _var in ("OPENBLAS_NUM_THREADS",):  # not MKL_NUM_THREADS: torch reads it too
    os.environ.setdefault(_var, os.environ.get("TINYTORCH_BENCH_BLAS_THREADS", "1"))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.bench import interleaved  # noqa: E402

import numpy as np  # noqa: E402

from tinytorch.core.activations import ReLU, Softmax  # noqa: E402
from tinytorch.core.layers import Linear  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.data.loader import DataLoader, TensorDataset  # noqa: E402


def load_old_tensor(rev: str):
    "The tensor module as it was at git revision `rev`, imported as `tinytorch_old_tensor`; None without git."
    try:
        src = subprocess.run(["git", "show", f"{rev}:tinytorch/core/tensor.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    tmp = Path(tempfile.mkdtemp(prefix="tinytorch-before-")) / "tinytorch_old_tensor.py"
    tmp.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tinytorch_old_tensor", tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_cross_entropy(z, y):
    m = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=1)) + m[:, 0]
    return (lse - z[np.arange(len(y)), y]).mean()


def observed(fn):
    "`fn` run with a do-nothing op observer registered (module 01's `observe_ops`): what observing costs."
    from tinytorch.core.tensor import observe_ops

    def run():
        with observe_ops(lambda node, out: None):
            return fn()
    return run


def cases(rng, Old):
    """(name, tinytorch fn, old-module fn or None, NumPy fn) for every row."""
    x10 = rng.standard_normal(10).astype(np.float32)
    t10, o10 = Tensor(x10), Old(x10) if Old else None
    yield "x * 0.999 (10 elements)", lambda: t10 * 0.999, Old and (lambda: o10 * 0.999), lambda: x10 * 0.999
    yield "x + y (10 elements)", lambda: t10 + t10, Old and (lambda: o10 + o10), lambda: x10 + x10
    g10 = Tensor(x10, requires_grad=True)
    og10 = Old(x10, requires_grad=True) if Old else None
    yield "x * 0.999 recorded (requires_grad)", lambda: g10 * 0.999, Old and (lambda: og10 * 0.999), lambda: x10 * 0.999
    hundred = lambda: [t10 * 0.999 for _ in range(100)]
    yield "100 x (x * 0.999), not observed", hundred, None, lambda: [x10 * 0.999 for _ in range(100)]
    yield "100 x (x * 0.999), observed", observed(hundred), None, lambda: [x10 * 0.999 for _ in range(100)]
    for n in (64, 1024):
        a32 = rng.standard_normal((n, n)).astype(np.float32)
        b32 = rng.standard_normal((n, n)).astype(np.float32)
        a, b = Tensor(a32), Tensor(b32)
        oa, ob = (Old(a32), Old(b32)) if Old else (None, None)
        yield f"add {n}x{n}", lambda: a + b, Old and (lambda: oa + ob), lambda: a32 + b32
        yield f"matmul {n}x{n}", lambda: a @ b, Old and (lambda: oa @ ob), lambda: a32 @ b32
        yield f"sum axis=0 {n}x{n}", lambda: a.sum(axis=0), Old and (lambda: oa.sum(axis=0)), lambda: a32.sum(axis=0)
        yield (f"transpose+reshape {n}x{n}", lambda: a.T.reshape(-1), Old and (lambda: oa.T.reshape(-1)),
               lambda: a32.T.reshape(-1))
        relu, softmax = ReLU(), Softmax(dim=-1)
        yield f"ReLU {n}x{n}", lambda: relu(a), None, lambda: np.maximum(a32, 0)
        yield f"Softmax {n}x{n}", lambda: softmax(a), None, lambda: np_softmax(a32)
    x32 = rng.standard_normal((256, 784)).astype(np.float32)
    layer = Linear(784, 256, rng=0)
    w32, bias32 = layer.weight.data, layer.bias.data
    x = Tensor(x32)
    yield "Linear 784->256, batch 256", lambda: layer(x), None, lambda: x32 @ w32.T + bias32
    logits32 = rng.standard_normal((512, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 512)
    logits, loss, tlabels = Tensor(logits32), CrossEntropyLoss(), Tensor(labels)
    yield "CrossEntropy 512x10", lambda: loss(logits, tlabels), None, lambda: np_cross_entropy(logits32, labels)
    data32 = rng.standard_normal((4096, 64)).astype(np.float32)
    ys = rng.integers(0, 10, 4096)
    loader = DataLoader(TensorDataset(Tensor(data32), Tensor(ys)), batch_size=128, shuffle=True, seed=0)

    def np_epoch():
        perm = np.random.default_rng(0).permutation(len(data32))
        for i in range(0, len(perm), 128):
            idx = perm[i:i + 128]
            data32[idx], ys[idx]

    yield "DataLoader epoch 4096x64, batch 128", lambda: [None for _ in loader], None, np_epoch


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.2f}us"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="timing rounds per row (the best of each is reported)")
    p.add_argument("--before", default="5bd477c", help="git revision of the 'before' tensor module")
    args = p.parse_args(argv)
    old = load_old_tensor(args.before)
    Old = old.Tensor if old is not None else None
    rng = np.random.default_rng(0)
    print(f"tinytorch vs NumPy, best of {args.rounds} interleaved rounds (time_call); 'before' = tensor.py at "
          f"{args.before}; NumPy's BLAS single-threaded")
    print(f"{'operation':<36} {'numpy':>11} {'before':>11} {'now':>11} {'before/np':>9} {'now/np':>8}")
    for name, ours, before, baseline in cases(rng, Old):
        t = interleaved({"numpy": baseline, "before": before or None, "now": ours}, args.rounds)
        t_np, t_before, t_now = t["numpy"], t["before"], t["now"]
        r_before = "-" if t_before is None else f"{t_before / t_np:.2f}x"
        print(f"{name:<36} {fmt(t_np):>11} {fmt(t_before):>11} {fmt(t_now):>11} {r_before:>9} {t_now / t_np:7.2f}x")


if __name__ == "__main__":
    main()
