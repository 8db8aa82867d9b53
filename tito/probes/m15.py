"""Probes of module 15 (quantization): see tito/probes/__init__.py.

No substitutes: each exercise is checked on its own inputs. In 15.3 the calls of `to_bfloat16` and `to_float16`
are answered with the reference's recorded results for the same arguments (replay), so a wrong 15.1 or 15.2 is not
charged to it, whichever way the student's autocast reaches them; 15.8 runs its layers on
power-of-two scales and inputs on the quantization grid, where every rounding is exact, so any quantize that
rounds correctly elsewhere gives the same integers; 15.9 runs with the Observer and `QuantizedLinear.from_float`
replaced by stand-ins that count what they are given (data, not a calibration). 15.4 draws infs in any of
several parameters, 15.5 near-ties, where the order of the roundings decides (PyTorch's per-tensor fused
multiply-add, its per-channel multiply-then-add).
"""

import numpy as np

from . import probe, replaced


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


@probe("15.2", rtol=0, atol=0)
def float16(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import to_float16

    rec.call("example", to_float16, [1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 65519.0, 65520.0, -2.5])
    rec.call("grid", to_float16, np.array([2049.0, 2051.0, 2 ** -14 * (1 + 2 ** -11), 2 ** -24 * 1.5, 2 ** -25, 0.1, -3e-8,
                                           1e-8, 65504.0, -65520.0, 6.1e-5, 4096.0 + 3.0], np.float32))
    rec.call("special", to_float16, [np.nan, -np.inf, np.inf, -0.0, 0.0, 1e38, -1e-45])
    bits = rng.integers(0, 2 ** 32, 20_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    with np.errstate(all="ignore"):
        out = rec.call("random_bits", to_float16, x[np.isfinite(x)])
    if isinstance(out, np.ndarray) and out.dtype == np.float32:
        rec["random_bits"] = np.ascontiguousarray(out).view(np.uint32)
    rec.call("normal", lambda: np.ascontiguousarray(to_float16(rng.standard_normal(500) * 100)).view(np.uint32))
    rec.call("subnormal", to_float16, (rng.uniform(-1, 1, 50) * 1e-5).astype(np.float32))
    rec.call("matrix", to_float16, (np.arange(12, dtype=np.float32).reshape(3, 4) * 0.3).T)
    rec.call("tensor", to_float16, Tensor([3.0, 0.1]))


@probe("15.3", rtol=0, atol=0, replay=("to_bfloat16", "to_float16"))
def observer(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import autocast

    a = Tensor(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal((5, 4)).astype(np.float32), requires_grad=True)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    # the roundings of 15.1 and 15.2 are answered with the reference's (replay): a wrong one is not charged here
    for dtype in ("bfloat16", "float16", np.float16):
        batched = Tensor(rng.standard_normal((2, 3, 5)).astype(np.float32))

        def run():
            a.grad = b.grad = None
            with autocast(dtype):
                c = a @ b
                d = a * 2.0 + 1.0
                e = batched @ b
            c.backward(g)
            return [c, d, e, a.grad, b.grad, str(c.dtype)]
        rec.call(f"run_{np.dtype(dtype).name if not isinstance(dtype, str) else dtype}_{type(dtype).__name__}", run)
    plain = rec.call("after", lambda: (a @ b).data)
    del plain


@probe("15.4", messages=False)
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
    # an inf or NaN in any one of several parameters, the others finite: found, and every gradient unscaled
    for where in range(3):
        for bad in (np.inf, np.nan):
            params = [Tensor(np.ones(3, np.float32), requires_grad=True) for _ in range(3)]
            for i, p in enumerate(params):
                p.grad = Tensor((rng.standard_normal(3) * 4).astype(np.float32))
                if i == where:
                    p.grad.data[1] = bad
            popt = SGD(params, lr=0.1)
            before = [p.data.copy() for p in params]
            scaler = GradScaler(init_scale=4.0, growth_interval=1)

            def run():
                stepped = scaler.step(popt)
                scaler.update()
                return [bool(stepped), [p.grad.data for p in params], [bool(np.array_equal(p.data, b)) for p, b in
                                                                       zip(params, before)], scaler.get_scale()]
            rec.call(f"several_{where}_{bad}", run)


@probe("15.5", messages=False, rtol=0, atol=0)
def quant(rng, rec):
    from tinytorch.perf.quantization import dequantize, quantize

    rec.call("example", quantize, [-1.0, 0.25, 0.75, 100.0], 0.5, 0)
    rec.call("uint8", quantize, [0.0, 0.5, -1.0, 300.0], 0.5, 128, dtype="uint8")
    rec.call("np_dtype", quantize, [0.0, 0.5, -1.0, 300.0], 0.5, 128, dtype=np.uint8)
    rec.call("ties", quantize, [0.25, 0.75, -0.25, -0.75, 1.25], 0.5, 1)
    rec.call("neg_ties", quantize, [-0.25, -0.75, -1.25, 0.25], 0.5, 0)
    rec.call("near_tie", quantize, [np.float32(-1.05)], 0.1, 3)
    rec.call("near_tie_channel", quantize, [[np.float32(-1.05)]], [0.1], [3], axis=0)
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
    rec.call("channel1", quantize, x, sc, zc, "uint8", axis=1)
    rec.call("deq_channel1", dequantize, np.clip(np.rint(x / sc) + zc, 0, 255).astype(np.uint8), sc, zc, axis=1)
    rec.call("roundtrip", lambda: dequantize(quantize(x, s, zp), s, zp))
    rec.call("int32", quantize, [1e6, -3.0], 0.5, 0, "int32")
    rec.call("zp_nonzero", quantize, (rng.standard_normal(20) * 2).astype(np.float32), 0.05, -37)
    # near-ties: x / scale + zero point within one float32 rounding of k + 1/2 (the rounding order decides)
    for zp_t, dtype in ((3, "int8"), (-7, "int8"), (128, "uint8"), (0, "int8")):
        scale = np.float32(rng.uniform(0.005, 0.2))
        lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
        k = rng.integers(lo - zp_t, hi - zp_t, 3000)
        near = ((k + 0.5) * np.float64(scale) * (1 + rng.uniform(-1e-6, 1e-6, 3000))).astype(np.float32)
        rec.call(f"near_tensor_{zp_t}", quantize, near, scale, zp_t, dtype)
        rec.call(f"near_channel_{zp_t}", quantize, near.reshape(-1, 3), [scale] * 3, [zp_t] * 3, dtype, axis=1)
    rec.call("bad_scale", quantize, [1.0], 0.0, 0)
    rec.call("bad_dtype", quantize, [1.0], 0.1, 0, np.float16)


@probe("15.6", messages=True, rtol=0, atol=0)
def qparams(rng, rec):
    from tinytorch.perf.quantization import compute_qparams

    rec.call("uint8", compute_qparams, -1.0, 3.0, "uint8")
    rec.call("np_uint8", compute_qparams, -1.0, 3.0, np.uint8)
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
    rec.call("half_step", compute_qparams, -0.5 * 255 / 255, 254.5 / 255, "uint8")
    rec.call("int32", compute_qparams, -1.0, 1.0, "int32")
    rec.call("sym_uint8", compute_qparams, -2.0, 1.0, "uint8", symmetric=True)
    rec.call("bad", compute_qparams, 3.0, 1.0)


@probe("15.7", rtol=0, atol=0)
def calibration(rng, rec):
    from tinytorch.perf.quantization import Observer

    batches = [(rng.standard_normal((6, 5)) * (i + 1) + i).astype(np.float32) for i in range(3)]
    for method, pct in (("minmax", 99.99), ("percentile", 90.0)):
        for axis in (None, 0, 1):
            obs = Observer(method, percentile=pct, axis=axis)

            def run():
                returned = [obs(b) is b for b in batches]
                lo, hi = obs.range()
                return [returned, lo, hi, type(lo).__name__, obs.min_val, obs.max_val]
            rec.call(f"{method}_{axis}", run)
    empty = Observer()
    rec.call("empty", lambda: [empty(np.zeros((0, 3), np.float32)) is not None, empty.min_val])
    rec.call("nothing", Observer().range)
    one = Observer()
    rec.call("one", lambda: [one(np.array([[2.0, -3.0]], np.float32)) is not None, one.range()])


@probe("15.8", rtol=0, atol=1e-6)
def qlinear(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import QuantizedLinear, int_matmul

    rec.call("example", int_matmul, np.array([[127, -128]], np.int8), np.array([[2], [3]], np.int8))
    a = rng.integers(-128, 128, (4, 70)).astype(np.int8)
    b = rng.integers(-128, 128, (70, 3)).astype(np.int8)
    rec.call("int8", int_matmul, a, b)
    rec.call("float64_needed", int_matmul, np.full((1, 300), 12700, np.int32), np.full((300, 1), 127, np.int32))
    rec.call("exactly_2_24", int_matmul, np.full((1, 4), 2 ** 12, np.int32), np.full((4, 1), 2 ** 10, np.int32))
    rec.call("batched", int_matmul, rng.integers(0, 256, (2, 3, 9)).astype(np.uint8), rng.integers(-5, 5, (9, 2)).astype(np.int8))
    rec.call("overflow", int_matmul, np.full((1, 16), 30000, np.int32), np.full((16, 1), 30000, np.int32))
    rec.call("floats", int_matmul, np.ones((2, 2), np.float32), np.ones((2, 2), np.int8))
    # layers on power-of-two scales with inputs on the grid: every rounding in forward is exact
    wq = rng.integers(-127, 128, (3, 5)).astype(np.int8)
    w_scale = np.array([2.0 ** -7, 2.0 ** -6, 2.0 ** -8], np.float32)
    bias = (rng.integers(-20, 20, 3) * 2.0 ** -10).astype(np.float32)
    in_s, in_z = 2.0 ** -4, int(rng.integers(100, 156))
    x = ((rng.integers(0, 256, (6, 5)) - in_z) * in_s).astype(np.float32)
    rec.call("channel", QuantizedLinear(wq, w_scale, bias, in_s, in_z), Tensor(x))
    rec.call("tensor_scale", QuantizedLinear(wq, np.float32(2.0 ** -7), None, in_s, in_z), x)
    rec.call("lead_dims", QuantizedLinear(wq, w_scale, bias, in_s, in_z), x.reshape(2, 3, 5))
    rec.call("int8_act", QuantizedLinear(wq, w_scale, bias, in_s, 0, act_dtype=np.int8),
             ((rng.integers(-128, 128, (4, 5))) * in_s).astype(np.float32))
    rec.call("requant", QuantizedLinear(wq, w_scale, None, in_s, in_z, 2.0 ** -12, 0, act_dtype="int32"), Tensor(x))
    rec.call("requant_clamped", QuantizedLinear(wq, w_scale, bias, in_s, in_z, 2.0 ** -12, 128), Tensor(x))
    rec.call("one", QuantizedLinear(np.array([[100]], np.int8), np.array([0.01], np.float32), np.array([0.5], np.float32),
                                    0.1, 0, act_dtype="int8"), np.array([[2.0]], np.float32))
    rec.call("bad_width", QuantizedLinear(wq, w_scale, bias, in_s, in_z), np.zeros((2, 7), np.float32))


class _Counting:
    "A stand-in for 15.7's Observer: counts what it is fed; its qparams are data, not a calibration."

    def __init__(self, method="minmax", percentile=99.99, axis=None):
        self.method, self.calls, self.values, self.total = method, 0, 0, 0.0

    def __call__(self, x):
        a = np.asarray(getattr(x, "data", x), dtype=np.float64)
        self.calls += 1
        self.values += int(a.size)
        self.total += float(np.abs(a).sum())
        return x

    def qparams(self, dtype="int8", symmetric=False):
        return round(0.5 + 0.25 * self.calls + self.total % 7, 6), self.values % 50


@probe("15.9")
def ptq(rng, rec):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Module, Sequential
    from tinytorch.perf import quantization

    class Converted(Module):
        def __init__(self, linear, input_qparams, output_qparams, per_channel=True, act_dtype="uint8"):
            super().__init__()
            self.args = [list(linear.weight.shape), list(input_qparams), list(output_qparams), bool(per_channel),
                         str(act_dtype)]

        def forward(self, x):
            return x

    def describe(model):
        return [[name, type(m).__name__, getattr(m, "args", None), bool(m.training)] for name, m in model.named_modules()]

    net = Sequential(Linear(6, 5, rng=int(rng.integers(0, 2 ** 30))), ReLU(), Linear(5, 3, rng=int(rng.integers(0, 2 ** 30))))
    batches = [rng.standard_normal((int(n), 6)).astype(np.float32) for n in rng.integers(1, 8, 3)]
    with replaced(quantization, Observer=_Counting), \
            replaced(quantization.QuantizedLinear, from_float=classmethod(lambda cls, *a: Converted(*a))):
        modes = []
        watch = net.layers[0].register_forward_hook(lambda m, args, out: modes.append([bool(m.training),
                                                                                       bool(out.requires_grad)]))

        def run(**kwargs):
            q = quantization.quantize_model(net, batches, **kwargs)
            return [describe(q), q is net, describe(net)]
        rec.call("default", run)
        rec.call("options", run, per_channel=False, act_dtype=np.int8, method="percentile", percentile=99.0)
        watch.remove()
        rec["modes"] = modes
        rec["hooks_left"] = [len(net.layers[0]._forward_hooks), len(net.layers[2]._forward_hooks)]
        rec.call("single", lambda: describe(quantization.quantize_model(Linear(6, 2, rng=3), batches[0])))
        rec.call("no_batch", quantization.quantize_model, net, [])
        rec.call("no_linear", quantization.quantize_model, Sequential(ReLU()), batches[0])

        class Breaks(Module):
            def __init__(self):
                super().__init__()
                self.fc = Linear(6, 2, rng=0)

            def forward(self, x):
                self.fc(x)
                raise RuntimeError("the model broke")
        broken = Breaks()
        rec.call("broken", quantization.quantize_model, broken, batches)
        rec["broken_after"] = [len(broken.fc._forward_hooks), bool(broken.training)]

    class Packed(Module):
        "A layer that stores its weights packed (as TernaryLinear), its float latent weight aside."

        def __init__(self, n):
            super().__init__()
            self.latent = Tensor(np.ones((n, 3), np.float32), requires_grad=True)
            self.n = n

        @property
        def packed_nbytes(self):
            return 7 * self.n + 1
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.quantization import QuantizedLinear, model_nbytes

    wq = rng.integers(-127, 128, (4, 6)).astype(np.int8)
    ql = QuantizedLinear(wq, np.full(4, 0.01, np.float32), np.zeros(4, np.float32), 0.1, 0)
    tied = Linear(6, 6, rng=0)
    rec.call("bytes_float", model_nbytes, Sequential(Linear(6, 5, rng=0), ReLU(), Linear(5, 3, bias=False, rng=1)))
    rec.call("bytes_quantized", model_nbytes, Sequential(ql, ReLU(), Linear(4, 2, rng=2)))
    rec.call("bytes_packed", model_nbytes, Sequential(Packed(int(rng.integers(5, 50))), Linear(3, 2, rng=3)))
    rec.call("bytes_tied", model_nbytes, Sequential(tied, ReLU(), tied))


@probe("15.10", rtol=0, atol=1e-7)
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
