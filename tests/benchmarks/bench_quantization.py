"""INT8 `QuantizedLinear` forward vs FP32 `Linear` forward: ratios measured in one process, same data.

    python tests/benchmarks/bench_quantization.py [--batch 64] [--features 512] [--threads N] [--repeats 7]

Rows, all on the same input and the same (float) weights:

- tinytorch FP32 `Linear` (no_grad): the baseline;
- tinytorch INT8 `QuantizedLinear` (module 15): quantize the input, exact int32 accumulation
  through float BLAS (`int_matmul`), scale, bias, requantize the output;
- the same integer product with NumPy's own int32 matmul (no BLAS: what a naive int8 path costs);
- tinytorch BF16 `autocast` Linear (rounding emulated around a float32 matmul);
- PyTorch FP32 `nn.Linear` and PyTorch's INT8 `ao.nn.quantized.Linear` on each quantized engine
  this build has (FBGEMM / x86 / oneDNN use int8 dot-product instructions; QNNPACK is the mobile
  kernel), when torch is installed.

The point it measures: fewer bytes per weight turn into less time only where int8 arithmetic
runs in int8 hardware instructions; an emulation on float BLAS pays extra passes over memory.
Timing with `tinytorch.perf.measure.time_call` (median of repeats). Not a test: nothing fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="INT8 QuantizedLinear vs FP32 Linear forward")
    p.add_argument("--batch", type=int, default=64, help="rows of the input (default %(default)s)")
    p.add_argument("--features", type=int, default=512, help="in and out features (default %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="BLAS and torch threads (default: libraries' defaults)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per row (default %(default)s)")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else parse_args([])
if ARGS.threads is not None:  # before NumPy loads its BLAS
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.layers import Linear  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.perf.measure import time_call  # noqa: E402
from tinytorch.perf.quantization import (  # noqa: E402
    QuantizedLinear, autocast, compute_qparams, model_nbytes, quantize,
)


def main() -> None:
    n, f = ARGS.batch, ARGS.features
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((n, f)).astype(np.float32)
    lin = Linear(f, f, rng=0)
    lin.bias.data[:] = rng.standard_normal(f).astype(np.float32) * 0.1
    y_np = x_np @ lin.weight.data.T + lin.bias.data
    in_q = tuple(v.item() for v in compute_qparams(x_np.min(), x_np.max(), "uint8"))
    out_q = tuple(v.item() for v in compute_qparams(y_np.min(), y_np.max(), "uint8"))
    qlin = QuantizedLinear.from_float(lin, in_q, out_q)
    x = Tensor(x_np)
    err = np.abs(qlin(x).data - y_np).max() / np.abs(y_np).max()

    qx = quantize(x_np, *in_q, "uint8").astype(np.int32) - np.int32(in_q[1])
    wq_t = np.ascontiguousarray(qlin.weight_q.T).astype(np.int32)

    def numpy_int32():
        return qx @ wq_t

    def bf16_linear():
        with autocast("bfloat16"):
            return lin(x)

    rows = {
        "tinytorch FP32 Linear": no_grad()(lambda: lin(x)),
        "tinytorch INT8 QuantizedLinear": lambda: qlin(x),
        "  its integer matmul in NumPy int32": numpy_int32,
        "tinytorch BF16 autocast Linear": no_grad()(bf16_linear),
    }
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: the PyTorch rows are left out")
    if torch is not None:
        warnings.filterwarnings("ignore", category=UserWarning)
        import torch.ao.nn.quantized as nnq

        if ARGS.threads is not None:
            torch.set_num_threads(ARGS.threads)
        tx = torch.from_numpy(x_np)
        tlin = torch.nn.Linear(f, f)
        with torch.no_grad():
            tlin.weight.copy_(torch.from_numpy(lin.weight.data))
            tlin.bias.copy_(torch.from_numpy(lin.bias.data))
        rows["PyTorch FP32 nn.Linear"] = torch.no_grad()(lambda: tlin(tx))
        wq = torch.quantize_per_channel(torch.from_numpy(lin.weight.data.copy()),
                                        torch.from_numpy(qlin.weight_scale.astype(np.float64)),
                                        torch.zeros(f, dtype=torch.long), 0, torch.qint8)
        for engine in torch.backends.quantized.supported_engines:
            if engine == "none":
                continue
            torch.backends.quantized.engine = engine
            try:
                tq = nnq.Linear(f, f)
                tq.set_weight_bias(wq, torch.from_numpy(lin.bias.data.copy()))
                tq.scale, tq.zero_point = out_q
                qtx = torch.quantize_per_tensor(tx, in_q[0], in_q[1], torch.quint8)
                tq(qtx)
            except Exception as e:  # an engine this CPU cannot run
                print(f"PyTorch INT8 engine {engine}: skipped ({type(e).__name__})")
                continue

            def run(tq=tq, engine=engine):
                torch.backends.quantized.engine = engine
                return tq(torch.quantize_per_tensor(tx, in_q[0], in_q[1], torch.quint8)).dequantize()

            rows[f"PyTorch INT8 quantized.Linear ({engine})"] = run

    med = {name: time_call(fn, repeats=ARGS.repeats).median for name, fn in rows.items()}
    threads = ARGS.threads if ARGS.threads is not None else "default"
    print(f"Linear({f}, {f}) forward on a {n}x{f} float32 batch; threads: {threads}; median of {ARGS.repeats} repeats")
    print(f"weights: FP32 {model_nbytes(lin):,} bytes, INT8 {qlin.nbytes:,} bytes ({model_nbytes(lin) / qlin.nbytes:.2f}x "
          f"smaller); INT8 output error {err:.2%} of the largest output\n")
    base = med["tinytorch FP32 Linear"]
    torch_base = med.get("PyTorch FP32 nn.Linear")
    print(f"{'':<44}{'median':>11}{'vs tinytorch FP32':>19}{'vs PyTorch FP32':>17}")
    for name, t in med.items():
        vs_torch = f"{t / torch_base:16.2f}x" if torch_base else f"{'-':>17}"
        print(f"{name:<44}{t * 1e6:9.1f}us{t / base:18.2f}x{vs_torch}")


if __name__ == "__main__":
    main()
