"""Probes of module 15 (quantization): see tito/probes/__init__.py. Substitutes (one bug charged once): 15.4
runs the reference `quantize` (none needed: it is only arithmetic), 15.5 the reference `quantize`,
`dequantize` and `compute_qparams` (`from_float` builds the weights with them)."""
import numpy as np

from . import probe


@probe("15.1", rtol=0, atol=0)
def bfloat16(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import to_bfloat16

    rec.call("example", to_bfloat16, [1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 0.1, -2.5])
    rec.call("big", to_bfloat16, [np.finfo(np.float32).max, -np.inf, np.inf, 3.3e38, -3.3e38])
    rec.call("special", to_bfloat16, [np.nan, -0.0, 1e-45, 0.0, -1e-45])
    rec.call("ties", to_bfloat16, np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 5 * 2 ** -8), 2 + 2 ** -7], np.float32))
    rec.call("matrix", to_bfloat16, np.arange(6, dtype=np.float32).reshape(2, 3))
    bits = rng.integers(0, 2 ** 32, 20_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    with np.errstate(all="ignore"):
        out = rec.call("random_bits", to_bfloat16, x)
    if isinstance(out, np.ndarray):
        rec["random_bits"] = np.ascontiguousarray(out).view(np.uint32) if out.dtype == np.float32 else out
    rec.call("normal", lambda: np.ascontiguousarray(to_bfloat16(rng.standard_normal(500) * 10)).view(np.uint32))
    rec.call("subnormal", to_bfloat16, (rng.uniform(-1, 1, 50) * 1e-39).astype(np.float32))
    rec.call("tensor", to_bfloat16, Tensor([3.0, 0.1]))
    rec.call("f64", to_bfloat16, np.array([0.1, 1 / 3], np.float64))


@probe("15.2", messages=False)
def grad_scaler(rng, rec):
    from tinytorch.core.optimizers import SGD
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import GradScaler

    w = Tensor(np.array([1.0, 1.0], np.float32), requires_grad=True)
    opt = SGD([w], lr=0.5)
    s = GradScaler(init_scale=1024.0, growth_interval=2)
    w.grad = Tensor(np.array([2048.0, 512.0], np.float32))
    rec.call("found", lambda: bool(s.unscale_(opt)))
    rec["grad"] = w.grad.data.copy()
    rec.call("again", s.unscale_, opt)
    rec.call("stepped", s.step, opt)
    rec["w"] = w.data.copy()
    rec.call("update", s.update)
    rec["state1"] = [s.get_scale(), s.growth_tracker, type(s.scale_value).__name__]
    trace = []
    s2 = GradScaler(init_scale=8.0, growth_interval=2)
    for g in ([1.0], [1.0], [np.nan], [1.0], [np.inf], [1.0], [1.0], [1.0], [-np.inf], [1.0]):
        w.grad = Tensor(np.array(g * 2, np.float32))
        before = w.data.copy()
        stepped = rec.call("seq_step", s2.step, opt)
        rec.call("seq_update", s2.update)
        trace.append([stepped, s2.get_scale(), s2.growth_tracker, bool(np.array_equal(before, w.data))])
    rec["trace"] = trace
    factors = GradScaler(init_scale=float(rng.uniform(10, 1000)), growth_factor=3.0, backoff_factor=0.25,
                         growth_interval=1)
    scales = []
    for g in ([1.0], [np.inf], [1.0]):
        w.grad = Tensor(np.array(g * 2, np.float32))
        factors.step(opt)
        rec.call("factors_update", factors.update)
        scales.append(factors.get_scale())
    rec["factors"] = scales
    big = GradScaler(init_scale=float(np.finfo(np.float32).max) / 1.5, growth_interval=1)
    w.grad = Tensor(np.array([0.0, 0.0], np.float32))
    big.step(opt)
    rec.call("big_update", big.update)
    rec["big"] = big.get_scale()
    t = GradScaler(init_scale=3.0)
    g = rng.standard_normal(2).astype(np.float32) * 5
    w.grad = Tensor(g.copy())
    rec.call("third", lambda: bool(t.unscale_(opt)))
    rec["third_grad"] = w.grad.data.copy()
    none_grad = Tensor(np.array([1.0], np.float32), requires_grad=True)
    rec.call("none_grad", lambda: bool(GradScaler().unscale_(SGD([none_grad], lr=0.1))))
    w2 = Tensor(np.ones(3, np.float32), requires_grad=True)
    w2.grad = Tensor(np.array([1.0, np.nan, 2.0], np.float32))
    rec.call("nan_found", lambda: bool(GradScaler(init_scale=2.0).unscale_(SGD([w, w2], lr=0.1))))


@probe("15.3", messages=False, rtol=0, atol=0)
def quant(rng, rec):
    from tinytorch.perf.quantization import dequantize, quantize

    rec.call("example", quantize, [-1.0, 0.25, 0.75, 100.0], 0.5, 0)
    rec.call("uint8", quantize, [0.0, 0.5, -1.0, 300.0], 0.5, 128, dtype="uint8")
    rec.call("ties", quantize, [0.25, 0.75, -0.25, -0.75, 1.25], 0.5, 1)
    rec.call("neg_ties", quantize, [-0.25, -0.75, -1.25, 0.25], 0.5, 0)
    w = np.array([[1.0, -1.0], [10.0, 5.0]], np.float32)
    rec.call("channel0", quantize, w, [0.5, 5.0], [0, 0], axis=0)
    rec.call("deq", dequantize, np.array([-2, 0, 2, 127], np.int8), 0.5, 0)
    rec.call("deq_zp", dequantize, np.array([0, 10, 255], np.uint8), 0.1, 128)
    rec.call("deq_channel", dequantize, np.array([[2, -2], [2, 1]], np.int8), [0.5, 5.0], [0, 0], axis=0)
    x = (rng.standard_normal((13, 5)) * 3).astype(np.float32)
    s, zp = np.float32(rng.uniform(0.01, 0.1)), int(rng.integers(-20, 20))
    rec.call("random", quantize, x, s, zp)
    sc = rng.uniform(0.01, 0.2, 5).astype(np.float32)
    zc = rng.integers(0, 256, 5)
    q = rec.call("channel1", quantize, x, sc, zc, "uint8", axis=1)
    rec.call("deq_channel1", dequantize, np.clip(np.rint(x / sc) + zc, 0, 255).astype(np.uint8), sc, zc, axis=1)
    rec.call("roundtrip", lambda: dequantize(quantize(x, s, zp), s, zp))
    rec.call("int32", quantize, [1e6, -3.0], 0.5, 0, "int32")
    rec.call("zp_nonzero", quantize, (rng.standard_normal(20) * 2).astype(np.float32), 0.05, -37)
    rec.call("bad_scale", quantize, [1.0], 0.0, 0)
    del q


@probe("15.4", messages=True, rtol=0, atol=0)
def qparams(rng, rec):
    from tinytorch.perf.quantization import compute_qparams

    rec.call("uint8", compute_qparams, -1.0, 3.0, "uint8")
    rec.call("sym_int8", compute_qparams, -1.0, 3.0, "int8", symmetric=True)
    rec.call("widened", compute_qparams, 2.0, 5.0, "int8")
    rec.call("widened_neg", compute_qparams, -5.0, -2.0, "uint8")
    rec.call("zero", compute_qparams, 0.0, 0.0, "int8")
    rec.call("channel_sym", compute_qparams, np.array([-1.0, -2.0], np.float32), np.array([1.0, 6.0], np.float32),
             "uint8", symmetric=True)
    lo = -rng.uniform(0, 3, 6).astype(np.float32)
    hi = rng.uniform(0, 3, 6).astype(np.float32)
    lo[0], hi[1] = 0.5, -0.5
    for dtype in ("int8", "uint8"):
        for sym in (False, True):
            rec.call(f"channel_{dtype}_{sym}", compute_qparams, lo, hi, dtype, symmetric=sym)
            a, b = float(rng.uniform(-4, 0)), float(rng.uniform(0, 4))
            rec.call(f"tensor_{dtype}_{sym}", compute_qparams, a, b, dtype, symmetric=sym)
    rec.call("int32", compute_qparams, -1.0, 1.0, "int32")
    rec.call("sym_uint8", compute_qparams, -2.0, 1.0, "uint8", symmetric=True)
    rec.call("bad", compute_qparams, 3.0, 1.0)


@probe("15.5", replay=("quantize", "dequantize", "compute_qparams"), rtol=1e-5, atol=1e-6)
def qlinear(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import QuantizedLinear

    one = QuantizedLinear(np.array([[100]], np.int8), np.array([0.01], np.float32), np.array([0.5], np.float32), 0.1, 0,
                          act_dtype="int8")
    rec.call("one", one, np.array([[2.0]], np.float32))
    lin = Linear(16, 8, rng=int(rng.integers(0, 2 ** 30)))
    lin.bias.data[:] = rng.uniform(-0.5, 0.5, 8).astype(np.float32)
    xs = rng.uniform(-1, 1, (12, 16)).astype(np.float32)
    ql = QuantizedLinear.from_float(lin, (2 / 255, 128))
    rec.call("channel", ql, Tensor(xs))
    rec.call("outside", ql, xs * 3)
    ref = xs @ lin.weight.data.T + lin.bias.data
    out_q = (float(np.float32((ref.max() - min(ref.min(), 0)) / 255)), int(rng.integers(0, 40)))
    rec.call("requant", QuantizedLinear.from_float(lin, (2 / 255, 128), out_q), xs)
    rec.call("tensor_scale", QuantizedLinear.from_float(lin, (2 / 255, 128), per_channel=False), xs[:3])
    nob = Linear(16, 4, bias=False, rng=2)
    qn = QuantizedLinear.from_float(nob, (2 / 255, 0), act_dtype="int8")
    rec.call("int8_nobias", qn, xs[:2, None, :])
    rec.call("int8_requant", QuantizedLinear.from_float(nob, (2 / 255, 0), (0.02, -3), act_dtype="int8"), xs[:4])


@probe("15.6", rtol=0, atol=1e-7)
def ternary(rng, rec):
    from tinytorch.perf.quantization import ternarize

    def run(w):
        t, s = ternarize(w)
        return [t, s, type(s).__name__]
    rec.call("example", run, [0.4, -0.05, -1.2, 0.1])
    rec.call("gauss", run, rng.standard_normal((32, 16)).astype(np.float32))
    rec.call("zeros", run, np.zeros(5, np.float32))
    rec.call("hidden", run, np.array([0.5, 1.5, -0.5, 2.0], np.float32))
    rec.call("ties", run, np.array([1.5, -1.5, 0.5, -0.5], np.float32))
    rec.call("f64", run, rng.standard_normal((3, 4)))
    rec.call("scaled", run, (rng.standard_normal(40) * 1e-3).astype(np.float32))
