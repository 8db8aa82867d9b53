"""How far is tinytorch's convolution from PyTorch's? Ratios measured in one process, same data.

    python tests/benchmarks/bench_conv.py [--repeats 30] [--threads N] [--batch 32] [--no-loop]

The workload of the module 09 issue: Conv2d(3 -> 16, 3x3, padding 1) followed by MaxPool2d(2),
forward and backward (input, weight and bias gradients) on a 32x3x32x32 float32 batch. Rows:

- tinytorch: `Conv2d` + `MaxPool2d` + `Tensor.backward`, the package as exported;
- NumPy floor: the same algorithm (im2col + one matmul, running max, col2im) in plain NumPy
  with no Tensor, graph or Function machinery: what the framework's bookkeeping costs on top;
- PyTorch CPU (`torch.nn.functional.conv2d` + `max_pool2d` + autograd), the goal being at most 3x;
- the loop convolution of Exercise 9.1, forward only, timed once (the original course ran a
  seven-loop version, about 6,300x slower than PyTorch).

Rounds interleave the candidates (each round times each once) so that a change in machine load
hits all of them; the medians over rounds are compared. `--threads N` pins both NumPy's BLAS and
PyTorch to N threads (set before NumPy loads); without it each library uses its default, and on
an oversubscribed machine a multi-threaded BLAS can be many times slower than one thread.
Not a test: nothing here fails, it reports.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Conv2d + MaxPool2d forward + backward: tinytorch vs NumPy vs PyTorch")
    p.add_argument("--repeats", type=int, default=30, help="interleaved rounds (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="BLAS and torch threads (default: libraries' defaults)")
    p.add_argument("--batch", type=int, default=32, help="batch size (default %(default)s)")
    p.add_argument("--no-loop", action="store_true", help="skip timing the loop convolution of Exercise 9.1")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else parse_args([])
if ARGS.threads is not None:  # must happen before NumPy loads its BLAS
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tinytorch.core.spatial import Conv2d, MaxPool2d, conv2d_loop  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402


# ----------------------------------------------------------------------------- the NumPy floor
def numpy_conv_pool_step(x, w, b, g):
    "Conv (3x3, padding 1) + 2x2 max-pool, forward and backward, in plain NumPy: (grad_x, grad_w, grad_b)."
    n, c, h, wd = x.shape
    o = w.shape[0]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = sliding_window_view(xp, (3, 3), axis=(2, 3)).transpose(1, 4, 5, 0, 2, 3).reshape(c * 9, n * h * wd)
    w2 = w.reshape(o, -1)
    out = w2 @ cols
    out += b[:, None]
    y = np.ascontiguousarray(out.reshape(o, n, h, wd).transpose(1, 0, 2, 3))
    # 2x2 max-pool, first maximum wins
    best = y[:, :, 0::2, 0::2].copy()
    arg = np.zeros(best.shape, np.uint8)
    for k, (i, j) in enumerate([(0, 1), (1, 0), (1, 1)], start=1):
        v = y[:, :, i::2, j::2]
        better = (v > best) | np.isnan(v)
        arg = np.where(better, np.uint8(k), arg)
        np.maximum(best, v, out=best)
    gy = np.zeros(y.shape, np.float32)
    for k, (i, j) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        gy[:, :, i::2, j::2] = g * (arg == k)
    g2 = gy.transpose(1, 0, 2, 3).reshape(o, -1)
    grad_w = (g2 @ cols.T).reshape(w.shape)
    grad_b = gy.sum(axis=(0, 2, 3))
    gcols = (w2.T @ g2).reshape(c, 3, 3, n, h, wd)
    gxp = np.zeros(xp.shape, np.float32)
    for i in range(3):
        for j in range(3):
            gxp[:, :, i:i + h, j:j + wd] += gcols[:, i, j].transpose(1, 0, 2, 3)
    return gxp[:, :, 1:-1, 1:-1], grad_w, grad_b


def main() -> None:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((ARGS.batch, 3, 32, 32)).astype(np.float32)
    g_np = rng.standard_normal((ARGS.batch, 16, 16, 16)).astype(np.float32)
    conv, pool = Conv2d(3, 16, 3, padding=1, rng=0), MaxPool2d(2)
    w_np, b_np = conv.weight.data, conv.bias.data

    def tinytorch_step():
        x = Tensor(x_np, requires_grad=True)
        conv.zero_grad()
        pool(conv(x)).backward(g_np)
        return x.grad, conv.weight.grad, conv.bias.grad

    def numpy_step():
        return numpy_conv_pool_step(x_np, w_np, b_np, g_np)

    candidates = {"tinytorch": tinytorch_step, "NumPy floor": numpy_step}
    ours = tinytorch_step()
    floor = numpy_step()
    for got, ref, name in zip(ours, floor, ("input", "weight", "bias")):
        assert np.allclose(got.data, ref, rtol=1e-4, atol=1e-3), f"tinytorch and the NumPy floor disagree on the {name} gradient"
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: install the test extra (pip install -e '.[test]') for the PyTorch row")
    if torch is not None:
        if ARGS.threads is not None:
            torch.set_num_threads(ARGS.threads)
        xt = torch.from_numpy(x_np.copy()).requires_grad_(True)
        wt = torch.from_numpy(w_np.copy()).requires_grad_(True)
        bt = torch.from_numpy(b_np.copy()).requires_grad_(True)
        gt = torch.from_numpy(g_np.copy())

        def torch_step():
            xt.grad = wt.grad = bt.grad = None
            torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(xt, wt, bt, padding=1), 2).backward(gt)
            return xt.grad, wt.grad, bt.grad

        for got, ref, name in zip(ours, torch_step(), ("input", "weight", "bias")):
            assert np.allclose(got.data, ref.numpy(), rtol=1e-4, atol=1e-3), f"tinytorch and PyTorch disagree on the {name} gradient"
        candidates["PyTorch CPU"] = torch_step

    for fn in candidates.values():  # warm-up
        fn()
    times = {name: [] for name in candidates}
    for _ in range(ARGS.repeats):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(ts) for name, ts in times.items()}

    threads = ARGS.threads if ARGS.threads is not None else "default"
    torch_threads = torch.get_num_threads() if torch is not None else "-"
    print(f"Conv2d(3->16, 3x3, padding 1) + MaxPool2d(2), forward + backward, batch {ARGS.batch}x3x32x32 float32")
    print(f"threads: --threads {threads} (torch uses {torch_threads}); median of {ARGS.repeats} interleaved rounds\n")
    base = median.get("PyTorch CPU")
    print(f"{'':<34}{'median':>10}{'best':>10}{'vs NumPy floor':>16}{'vs PyTorch':>12}")
    for name in candidates:
        vs_torch = f"{median[name] / base:11.2f}x" if base else f"{'-':>12}"
        print(f"{name:<34}{median[name] * 1e3:8.2f}ms{min(times[name]) * 1e3:8.2f}ms"
              f"{median[name] / median['NumPy floor']:15.2f}x{vs_torch}")
    if not ARGS.no_loop:
        x_small = x_np[:1]
        t0 = time.perf_counter()
        conv2d_loop(x_small, w_np, b_np, 1, 1)
        loop_forward = (time.perf_counter() - t0) * ARGS.batch  # one image timed, scaled to the batch
        fwd_only = {}
        for name, fn in (("tinytorch", lambda: conv(Tensor(x_np))),):
            fn()
            fwd_only[name] = statistics.median(_time(fn) for _ in range(10))
        print(f"\nloop convolution (Exercise 9.1), forward only: {loop_forward * 1e3:8.0f} ms for the batch "
              f"(1 image timed x {ARGS.batch}) = {loop_forward / fwd_only['tinytorch']:,.0f}x tinytorch's im2col forward"
              + (f", {loop_forward / base:,.0f}x PyTorch's whole forward + backward" if base else ""))


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
