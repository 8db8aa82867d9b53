"""Module 15 (quantization and mixed precision): the exported `tinytorch.perf.quantization` against PyTorch.

- `to_bfloat16` / `to_float16` equal `torch.tensor(x).to(torch.bfloat16 / float16).float()` bit for
  bit on hypothesis-drawn float32 values (any bit pattern: subnormals, huge values, ties) and on
  the edge cases (+-0, +-inf, NaN, overflow thresholds, FP16 subnormals). NaN only has to stay NaN:
  PyTorch's own NaN bit pattern depends on which of its kernels runs.
- `autocast` against `torch.autocast("cpu", dtype=...)` for Linear and Conv2d; master weights and
  gradients stay float32; the backward uses the rounded operands.
- `GradScaler` against `torch.amp.GradScaler("cpu")`: the same sequence of scales, the same
  unscaled gradients and the same skipped steps on a drawn sequence of finite and inf/NaN gradients.
- `quantize` / `dequantize` equal `torch.quantize_per_tensor` / `quantize_per_channel`
  (`.int_repr()`, `.dequantize()`) element for element; `compute_qparams` equals
  `MinMaxObserver` / `PerChannelMinMaxObserver.calculate_qparams()`; `QuantizedLinear` matches
  `torch.ao.nn.quantized.Linear` (QNNPACK engine) within one integer step.
- Properties: `dequantize(quantize(x))` is within scale / 2 of x inside the range; the ternary
  STE gradient equals PyTorch's `w + (q - w).detach()` formulation.
- Bad input: zero, negative or NaN scales, zero points outside the range, mismatched per-channel
  parameters: errors that name the value.

Without torch (a student edition) every comparison falls back to a NumPy reference written here
(the rounding grid, NumPy's float16, the observer and quantization formulas, the scaler's rule).
Run one exercise with `pytest tests/modules/test_15_quantization.py --exercise 15.3`.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.core.spatial import Conv2d
from tinytorch.core.tensor import Tensor
from tinytorch.perf.quantization import (
    GradScaler, Observer, QuantizedLinear, TernaryLinear, autocast, autocast_dtype, compute_qparams, dequantize,
    float_bits, int_matmul, model_nbytes, pack_ternary, quantize, quantize_model, ternarize, to_bfloat16, to_float16,
    unpack_ternary,
)
from tests.support.refs import torch_or_none

pytestmark = pytest.mark.module("15")

PROPERTY = settings(max_examples=40, deadline=None)
warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)


def torch_quiet():
    "torch (or None), with its quantized-tensor deprecation warnings silenced."
    torch = torch_or_none()
    warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
    return torch


# ---------------------------------------------------------------------------------------------
# References that need no torch
# ---------------------------------------------------------------------------------------------
def grid_round(x: np.ndarray, mantissa_bits: int, min_exp: int) -> np.ndarray:
    "Round to the nearest multiple of 2**(e - mantissa_bits - 1) (not below 2**min_exp), ties to even."
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(x)
        spacing = np.ldexp(np.float32(1), np.maximum(e - mantissa_bits - 1, min_exp)).astype(np.float32)
        out = (np.rint(x / spacing) * spacing).astype(np.float32)
    return np.where(np.isfinite(x), out, x)


def ref_bfloat16(x):
    torch = torch_quiet()
    if torch is not None:
        return torch.from_numpy(np.array(x, np.float32)).to(torch.bfloat16).float().numpy()
    return grid_round(x, 7, -133)


def ref_float16(x):
    torch = torch_quiet()
    if torch is not None:
        return torch.from_numpy(np.array(x, np.float32)).to(torch.float16).float().numpy()
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, 0.1, 3.3895314e38, 3.3961776e38,
                  np.finfo(np.float32).max, 65504, 65519.996, 65520, 65536, 1e-45, 1e-40, 2**-24, 2**-25,
                  2**-25 * 1.0000001, 2**-14, 2**-14 * (1 - 2**-11), 6e-8, 1e-8, 9.18e-41, 1.17e-38],
                 np.float32)
EDGES = np.concatenate([EDGES, -EDGES])


def assert_same_bits(got, expected, what, x=None):
    "Bit-for-bit equality (NaN only has to stay NaN); the failure names the input, its bits and both results."
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == np.float32, f"{what}: result dtype {got.dtype}; expected float32"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}; expected {expected.shape}"
    nan = np.isnan(expected)
    bad = (np.isnan(got) != nan) | ((np.ascontiguousarray(got).view(np.uint32) != np.ascontiguousarray(expected).view(np.uint32)) & ~nan)
    if bad.any():
        i = np.flatnonzero(bad.ravel())[0]
        g, e = np.ascontiguousarray(got).ravel(), np.ascontiguousarray(expected).ravel()
        given = "" if x is None else (f"input {np.ascontiguousarray(x, np.float32).ravel()[i]!r} (bits "
                                      f"{int(np.ascontiguousarray(x, np.float32).view(np.uint32).ravel()[i]):#010x}) ")
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values differ; first: {given}gave {g[i]!r} "
                             f"(bits {int(g.view(np.uint32)[i]):#010x}), expected {e[i]!r} (bits {int(e.view(np.uint32)[i]):#010x})")


float32_values = arrays(np.float32, array_shapes(max_dims=2, max_side=40),
                        elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True))
bit_patterns = arrays(np.uint32, st.integers(1, 300), elements=st.integers(0, 2**32 - 1))


# ---------------------------------------------------------------------------------------------
# Exercise 15.1: to_bfloat16 (and the given to_float16)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("15.1", "to_bfloat16")
def test_to_bfloat16_edge_cases_equal_torch():
    assert_same_bits(to_bfloat16(EDGES), ref_bfloat16(EDGES), "to_bfloat16 on the edge cases", EDGES)


@pytest.mark.exercise("15.1", "to_bfloat16")
@PROPERTY
@given(float32_values)
def test_to_bfloat16_equals_torch_on_drawn_floats(x):
    assert_same_bits(to_bfloat16(x), ref_bfloat16(x), f"to_bfloat16 of shape {x.shape}", x)


@pytest.mark.exercise("15.1", "to_bfloat16")
@PROPERTY
@given(bit_patterns)
def test_to_bfloat16_equals_torch_on_every_kind_of_bit_pattern(bits):
    x = bits.view(np.float32)
    assert_same_bits(to_bfloat16(x), ref_bfloat16(x), "to_bfloat16 of random bit patterns", x)


@pytest.mark.exercise("15.1", "to_bfloat16")
def test_to_bfloat16_million_random_patterns_and_layouts():
    bits = np.random.default_rng(0).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    assert_same_bits(to_bfloat16(x), ref_bfloat16(x), "to_bfloat16 of 1,000,000 random bit patterns", x)
    m = x[:600].reshape(20, 30)
    assert_same_bits(to_bfloat16(m.T), ref_bfloat16(m.T), "to_bfloat16 of a transposed (non-contiguous) view")
    assert_same_bits(to_bfloat16(Tensor(m[::2])), ref_bfloat16(m[::2]), "to_bfloat16 of a Tensor of a strided view")
    assert to_bfloat16(1.5).shape == (), "a number gives a 0-d array"


def test_to_float16_equals_torch_and_numpy():
    assert_same_bits(to_float16(EDGES), ref_float16(EDGES), "to_float16 on the edge cases", EDGES)
    bits = np.random.default_rng(1).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    assert_same_bits(to_float16(x), ref_float16(x), "to_float16 of 1,000,000 random bit patterns", x)
    with np.errstate(over="ignore"):
        assert_same_bits(to_float16(x), x.astype(np.float16).astype(np.float32), "to_float16 vs NumPy's float16")


@PROPERTY
@given(float32_values)
def test_to_float16_equals_torch_on_drawn_floats(x):
    assert_same_bits(to_float16(x), ref_float16(x), f"to_float16 of shape {x.shape}", x)


# ---------------------------------------------------------------------------------------------
# autocast (given code): against torch.autocast
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_linear_matches_torch_autocast(dtype):
    torch = torch_quiet()
    rng = np.random.default_rng(0)
    layer = Linear(48, 24, bias=False, rng=0)
    x = rng.standard_normal((16, 48)).astype(np.float32)
    with autocast(dtype):
        assert autocast_dtype() == dtype
        y = layer(Tensor(x)).data
    rounding = to_bfloat16 if dtype == "bfloat16" else to_float16
    assert_same_bits(y, rounding(y), f"autocast({dtype!r}): Linear outputs must be {dtype} values")
    if torch is not None:
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            ref = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(layer.weight.data.copy())).float().numpy()
    else:
        ref = rounding(rounding(x) @ rounding(layer.weight.data).T)
    ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
    np.testing.assert_allclose(y, ref, rtol=ulp, atol=1e-6, err_msg=f"autocast({dtype!r}) Linear vs torch.autocast")
    full = x @ layer.weight.data.T
    assert np.abs(y - full).max() > 1e-5, f"autocast({dtype!r}) must change the float32 result (rounded inputs)"


def test_autocast_conv2d_matches_torch_autocast():
    torch = torch_quiet()
    rng = np.random.default_rng(1)
    conv = Conv2d(3, 4, 3, padding=1, rng=0)
    conv.bias.data[:] = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    with autocast("bfloat16"):
        y = conv(Tensor(x)).data
    assert_same_bits(y, to_bfloat16(y), "autocast Conv2d outputs must be bfloat16 values")
    if torch is not None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(conv.weight.data.copy()),
                                             torch.from_numpy(conv.bias.data.copy()), padding=1).float().numpy()
        np.testing.assert_allclose(y, ref, rtol=2**-7, atol=1e-2, err_msg="autocast Conv2d vs torch.autocast conv2d")
    full = conv(Tensor(x)).data
    assert np.abs(y - full).max() < 0.05 * np.abs(full).max(), "autocast Conv2d is close to float32"
    assert np.abs(y - full).max() > 1e-5, "autocast must change the float32 convolution"


def test_autocast_keeps_master_weights_and_gradients_float32():
    layer = Linear(32, 8, bias=False, rng=3)
    w0 = layer.weight.data.copy()
    x = Tensor(np.random.default_rng(2).standard_normal((5, 32)).astype(np.float32), requires_grad=True)
    g = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    with autocast("bfloat16"):
        y = layer(x)
    y.backward(g)
    assert np.array_equal(layer.weight.data, w0), "autocast must not change the master weights"
    assert layer.weight.grad.dtype == np.float32 and x.grad.dtype == np.float32, "gradients stay float32"
    np.testing.assert_allclose(layer.weight.grad.data, g.T @ to_bfloat16(x.data), rtol=1e-5, atol=1e-5,
                               err_msg="the weight gradient multiplies by the rounded input, as the forward did")
    np.testing.assert_allclose(x.grad.data, g @ to_bfloat16(w0), rtol=1e-5, atol=1e-5,
                               err_msg="the input gradient multiplies by the rounded weight")


def test_autocast_nests_and_leaves_no_trace():
    layer = Linear(16, 4, rng=0)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    before = layer(x).data
    with autocast("bfloat16"):
        with autocast("float16"):
            assert autocast_dtype() == "float16"
            inner = layer(x).data
        assert autocast_dtype() == "bfloat16"
    assert autocast_dtype() is None
    assert np.array_equal(layer(x).data, before), "after the block, matmuls are float32 again"
    assert not np.array_equal(inner, before)
    with pytest.raises(ValueError, match=r"autocast: dtype must be one of \('bfloat16', 'float16'\); got 'int8'"):
        with autocast("int8"):
            pass
    assert autocast_dtype() is None


# ---------------------------------------------------------------------------------------------
# Exercise 15.2: GradScaler against torch.amp.GradScaler
# ---------------------------------------------------------------------------------------------
class RefScaler:
    "The update rule of torch's _amp_update_scale_, for editions without torch."

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.scale, self.g, self.b, self.n, self.tracker = np.float32(init_scale), growth_factor, backoff_factor, growth_interval, 0

    def get_scale(self):
        return float(self.scale)

    def unscale(self, grad):
        return grad * np.float32(1.0 / np.float64(self.scale)), not np.isfinite(grad).all()

    def update(self, found_inf):
        if found_inf:
            self.scale, self.tracker = np.float32(np.float64(self.scale) * self.b), 0
        elif self.tracker + 1 == self.n:
            grown = np.float32(np.float64(self.scale) * self.g)
            self.scale = grown if np.isfinite(grown) else self.scale
            self.tracker = 0
        else:
            self.tracker += 1


@pytest.mark.exercise("15.2", "GradScaler.update")
@PROPERTY
@given(st.lists(st.sampled_from(["ok", "ok", "ok", "inf", "nan"]), min_size=1, max_size=40),
       st.sampled_from([1.0, 3.0, 1024.0, 2.0 ** 16, 2.0 ** 120]), st.integers(1, 5),
       st.sampled_from([(2.0, 0.5), (4.0, 0.25), (1.5, 0.9)]))
def test_grad_scaler_scale_sequence_equals_torch(kinds, init_scale, interval, factors):
    torch = torch_quiet()
    growth, backoff = factors
    rng = np.random.default_rng(len(kinds))
    p = Tensor(np.ones(6, np.float32), requires_grad=True)
    opt = SGD([p], lr=0.1)
    ours = GradScaler(init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    if torch is not None:
        tp = torch.ones(6, requires_grad=True)
        topt = torch.optim.SGD([tp], lr=0.1)
        ref = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                   growth_interval=interval)
        ref.scale(torch.ones(()))  # creates torch's scale tensor
    else:
        ref = RefScaler(init_scale, growth, backoff, interval)
    for step, kind in enumerate(kinds):
        g = rng.standard_normal(6).astype(np.float32)
        with np.errstate(over="ignore"):
            scaled = g * np.float32(ours.get_scale())   # may overflow at a huge scale: that is an overflow step too
        if kind != "ok":
            scaled[step % 6] = np.inf if kind == "inf" else np.nan
        p.grad = Tensor(scaled.copy())
        before = p.data.copy()
        stepped = ours.step(opt)
        if torch is not None:
            tp.grad = torch.from_numpy(scaled.copy())
            ref.step(topt)
            ref_grad, ref_found = tp.grad.numpy(), not np.isfinite(scaled).all()
            ref.update()
        else:
            ref_grad, ref_found = ref.unscale(scaled)
            ref.update(ref_found)
        ours.update()
        assert stepped == (not ref_found), f"step {step} ({kind}): step() returned {stepped}; expected {not ref_found}"
        if ref_found:
            assert np.array_equal(p.data, before), f"step {step}: an inf/NaN gradient must skip the update"
        else:
            assert np.array_equal(p.grad.data, ref_grad), f"step {step}: unscaled gradient {p.grad.data} vs {ref_grad}"
        assert ours.get_scale() == ref.get_scale(), \
            f"after step {step} of {kinds[:step + 1]}: scale {ours.get_scale()}; torch.amp.GradScaler has {ref.get_scale()}"


@pytest.mark.exercise("15.2", "GradScaler.unscale_")
def test_grad_scaler_unscale_in_place_and_errors():
    p, q = Tensor(np.array([4.0, 8.0], np.float32), requires_grad=True), Tensor(np.ones(2, np.float32), requires_grad=True)
    opt = SGD([p, q], lr=0.1)
    s = GradScaler(init_scale=4.0)
    p.grad = Tensor(np.array([4.0, -8.0], np.float32))
    buffer = p.grad.data
    assert s.unscale_(opt) is False or not s.unscale_.__self__.found_inf_per_optimizer[id(opt)]
    assert p.grad.data is buffer and buffer.tolist() == [1.0, -2.0], f"unscale_ works in place: got {buffer}"
    with pytest.raises(RuntimeError, match="already called"):
        s.unscale_(opt)
    s.step(opt)
    s.update()
    with pytest.raises(RuntimeError, match="no step"):
        s.update()
    for bad, name in ((0.0, "init_scale"), (-1.0, "init_scale"), (float("inf"), "init_scale")):
        with pytest.raises(ValueError, match=f"GradScaler: {name} must be a positive finite number; got {bad!r}"):
            GradScaler(init_scale=bad)
    with pytest.raises(ValueError, match="growth_interval must be a positive integer; got 0"):
        GradScaler(growth_interval=0)
    off = GradScaler(enabled=False)
    p.grad = Tensor(np.array([1.0, 1.0], np.float32))
    assert off.get_scale() == 1.0 and off.step(opt), "a disabled scaler steps plainly"


# ---------------------------------------------------------------------------------------------
# Exercise 15.3: quantize / dequantize against torch.quantize_per_tensor / per_channel
# ---------------------------------------------------------------------------------------------
QDTYPES = {"int8": (-128, 127), "uint8": (0, 255)}


def ref_quantize(x, scale, zero_point, dtype, axis=None):
    "torch's integers, or the formula without torch: clamp(rint(x * float32(1 / scale) + zp))."
    torch = torch_quiet()
    if torch is not None:
        tdt = {"int8": torch.qint8, "uint8": torch.quint8}[dtype]
        t = torch.from_numpy(np.ascontiguousarray(x, np.float32))
        if axis is None:
            q = torch.quantize_per_tensor(t, float(scale), int(zero_point), tdt)
        else:
            q = torch.quantize_per_channel(t, torch.from_numpy(np.asarray(scale, np.float64)),
                                           torch.from_numpy(np.asarray(zero_point, np.int64)), axis, tdt)
        return q.int_repr().numpy(), q.dequantize().numpy()
    lo, hi = QDTYPES[dtype]
    s, z = np.asarray(scale, np.float32), np.asarray(zero_point)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    q = np.clip(np.rint(x * (np.float32(1) / s) + z.astype(np.float32)), lo, hi)
    return q.astype(np.int8 if dtype == "int8" else np.uint8), (q.astype(np.float32) - z.astype(np.float32)) * s


@st.composite
def quant_cases(draw, per_channel=False):
    shape = draw(array_shapes(min_dims=1, max_dims=3, max_side=7))
    dtype = draw(st.sampled_from(list(QDTYPES)))
    lo, hi = QDTYPES[dtype]
    spread = draw(st.floats(0.01, 100))
    seed = draw(st.integers(0, 2**16))
    x = (np.random.default_rng(seed).standard_normal(shape) * spread).astype(np.float32)
    if draw(st.booleans()):   # exact ties: multiples of half a power-of-two scale
        x = (np.rint(x * 8) / 8 + np.float32(1 / 16)).astype(np.float32)
    scale_of = st.one_of(st.floats(1e-3, 10), st.sampled_from([0.0625, 0.125, 0.5, 1.0]))
    if not per_channel:
        return x, np.float32(draw(scale_of)), draw(st.integers(lo, hi)), dtype, None
    axis = draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    scales = np.array([draw(scale_of) for _ in range(n)], np.float32)
    zps = np.array([draw(st.integers(lo, hi)) for _ in range(n)], np.int64)
    return x, scales, zps, dtype, axis


@pytest.mark.exercise("15.3", "quantize")
@PROPERTY
@given(quant_cases())
def test_quantize_per_tensor_equals_torch(case):
    x, scale, zp, dtype, _ = case
    q = quantize(x, scale, zp, dtype)
    ref_q, _ = ref_quantize(x, scale, zp, dtype)
    assert q.dtype == ref_q.dtype and q.shape == x.shape, f"quantize({dtype}): {q.dtype} {q.shape}; expected {ref_q.dtype} {x.shape}"
    bad = q != ref_q
    assert not bad.any(), (f"quantize(scale={scale!r}, zero_point={zp}, {dtype}): {int(bad.sum())} of {q.size} differ from "
                           f"torch.quantize_per_tensor; first x={x[bad][0]!r}: got {q[bad][0]}, expected {ref_q[bad][0]}")


@pytest.mark.exercise("15.3", "quantize")
@PROPERTY
@given(quant_cases(per_channel=True))
def test_quantize_per_channel_equals_torch(case):
    x, scales, zps, dtype, axis = case
    q = quantize(x, scales, zps, dtype, axis=axis)
    ref_q, _ = ref_quantize(x, scales, zps, dtype, axis)
    bad = q != ref_q
    assert q.shape == x.shape and not bad.any(), \
        f"quantize per channel (axis {axis}, {dtype}): {int(bad.sum())} of {q.size} differ from torch.quantize_per_channel"


@pytest.mark.exercise("15.3", "dequantize")
@PROPERTY
@given(st.one_of(quant_cases(), quant_cases(per_channel=True)))
def test_dequantize_equals_torch(case):
    x, scale, zp, dtype, axis = case
    ref_q, ref_d = ref_quantize(x, scale, zp, dtype, axis)
    got = dequantize(ref_q, scale, zp, axis=axis)
    assert got.dtype == np.float32, f"dequantize returns float32; got {got.dtype}"
    assert np.array_equal(got, ref_d), f"dequantize vs torch's dequantize(): largest difference {np.abs(got - ref_d).max()}"


@pytest.mark.exercise("15.3", "quantize")
@PROPERTY
@given(st.floats(-50, 50), st.floats(0.01, 50), st.sampled_from(list(QDTYPES)), st.integers(0, 2**16))
def test_round_trip_is_within_half_a_step_inside_the_range(lo, width, dtype, seed):
    hi = lo + width
    qmin, qmax = QDTYPES[dtype]     # the asymmetric min/max parameters, written out (not Exercise 15.4's code)
    scale = np.float32((np.float32(max(hi, 0)) - np.float32(min(lo, 0))) / np.float32(qmax - qmin))
    zp = int(np.clip(qmin - np.rint(np.float32(min(lo, 0)) / scale), qmin, qmax))
    x = np.random.default_rng(seed).uniform(min(lo, 0), max(hi, 0), 500).astype(np.float32)
    back = dequantize(quantize(x, scale, zp, dtype), scale, zp)
    err = np.abs(back - x).max()
    assert err <= float(scale) / 2 * (1 + 1e-4) + 1e-6, \
        f"range [{lo:.4g}, {hi:.4g}] {dtype}: round-trip error {err:.6g} exceeds scale / 2 = {float(scale) / 2:.6g}"


@pytest.mark.exercise("15.3", "quantize")
def test_bad_quantization_parameters_name_the_value():
    x = np.ones((2, 3), np.float32)
    for bad in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"quantize: scale must be positive and finite; got {bad!r}"):
            quantize(x, bad, 0)
        with pytest.raises(ValueError, match=rf"dequantize: scale must be positive and finite; got {bad!r}"):
            dequantize(np.zeros(3, np.int8), bad, 0)
    with pytest.raises(ValueError, match=r"zero_point must be in \[-128, 127\] for int8; got 200"):
        quantize(x, 0.1, 200)
    with pytest.raises(ValueError, match=r"zero_point must be in \[0, 255\] for uint8; got -1"):
        quantize(x, 0.1, -1, "uint8")
    with pytest.raises(TypeError, match="zero_point must be an integer; got 0.5"):
        quantize(x, 0.1, 0.5)
    with pytest.raises(ValueError, match=r"needs 3 scales and zero points; got shapes \(2,\) and \(2,\)"):
        quantize(x, [0.1, 0.2], [0, 0], axis=1)
    with pytest.raises(ValueError, match=r"axis 2 is out of range for a tensor of shape \(2, 3\)"):
        quantize(x, [0.1, 0.2], [0, 0], axis=2)
    with pytest.raises(ValueError, match="one scale and one zero_point"):
        quantize(x, [0.1, 0.2], [0, 0])
    with pytest.raises(ValueError, match="quantization dtype must be one of"):
        quantize(x, 0.1, 0, "int4")
    with pytest.raises(TypeError, match="dequantize: expected an int8, uint8 or int32 array; got dtype float32"):
        dequantize(x, 0.1, 0)


# ---------------------------------------------------------------------------------------------
# Exercise 15.4: compute_qparams against PyTorch's observers
# ---------------------------------------------------------------------------------------------
def ref_qparams(a, dtype, symmetric, axis):
    torch = torch_quiet()
    lo_all = a.min() if axis is None else a.min(axis=tuple(i for i in range(a.ndim) if i != axis))
    hi_all = a.max() if axis is None else a.max(axis=tuple(i for i in range(a.ndim) if i != axis))
    if torch is None:
        qmin, qmax = QDTYPES[dtype]
        lo, hi = np.minimum(np.float32(lo_all), 0), np.maximum(np.float32(hi_all), 0)
        eps = np.finfo(np.float32).eps
        if symmetric:
            s = np.maximum(np.maximum(-lo, hi) / np.float32((qmax - qmin) / 2), eps)
            return s, np.full(np.shape(s), 128 if dtype == "uint8" else 0)
        s = np.maximum((hi - lo) / np.float32(qmax - qmin), eps)
        return s, np.clip(qmin - np.rint(lo / s), qmin, qmax)
    from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
    tdt = {"int8": torch.qint8, "uint8": torch.quint8}[dtype]
    if axis is None:
        scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
        obs = MinMaxObserver(dtype=tdt, qscheme=scheme)
    else:
        scheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        obs = PerChannelMinMaxObserver(ch_axis=axis, dtype=tdt, qscheme=scheme)
    obs(torch.from_numpy(a))
    s, z = obs.calculate_qparams()
    return s.numpy().reshape(np.shape(lo_all)), z.numpy().reshape(np.shape(lo_all))


@pytest.mark.exercise("15.4", "compute_qparams")
@PROPERTY
@given(array_shapes(min_dims=1, max_dims=3, max_side=6), st.sampled_from(list(QDTYPES)), st.booleans(),
       st.floats(1e-3, 100), st.floats(-3, 3), st.booleans(), st.integers(0, 2**16))
def test_compute_qparams_equals_torch_observers(shape, dtype, symmetric, spread, shift, per_channel, seed):
    a = (np.random.default_rng(seed).standard_normal(shape) * spread + shift * spread).astype(np.float32)
    axis = (seed % len(shape)) if per_channel and len(shape) > 1 else None
    if axis is None:
        s, z = compute_qparams(a.min(), a.max(), dtype, symmetric)
    else:
        reduce = tuple(i for i in range(a.ndim) if i != axis)
        s, z = compute_qparams(a.min(axis=reduce), a.max(axis=reduce), dtype, symmetric)
    rs, rz = ref_qparams(a, dtype, symmetric, axis)
    assert np.asarray(s).dtype == np.float32 and np.asarray(z).dtype == np.int64, f"dtypes {np.asarray(s).dtype}, {np.asarray(z).dtype}"
    assert np.array_equal(np.asarray(s), rs), f"{dtype} symmetric={symmetric} axis={axis}: scale {s} vs torch observer {rs}"
    assert np.array_equal(np.asarray(z), rz), f"{dtype} symmetric={symmetric} axis={axis}: zero_point {z} vs torch observer {rz}"


@pytest.mark.exercise("15.4", "compute_qparams")
def test_observers_minmax_over_batches_and_percentile():
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((10, 4)).astype(np.float32) * (i + 1) for i in range(3)]
    obs = Observer()
    for b in batches:
        assert obs(b) is b, "an observer returns what it saw"
    allx = np.concatenate(batches)
    assert obs.range() == (float(allx.min()), float(allx.max()))
    s, z = obs.qparams("uint8")
    rs, rz = compute_qparams(allx.min(), allx.max(), "uint8")
    assert s == float(rs) and z == int(rz)
    per = Observer(axis=1)
    for b in batches:
        per(b)
    lo, hi = per.range()
    assert np.array_equal(lo, allx.min(axis=0)) and np.array_equal(hi, allx.max(axis=0)), "per-channel ranges along axis 1"
    pct = Observer("percentile", percentile=99.0)
    for b in batches:
        pct(b)
    lo, hi = pct.range()
    assert np.isclose(lo, np.percentile(allx, 1.0)) and np.isclose(hi, np.percentile(allx, 99.0)), \
        f"percentile range ({lo}, {hi}); expected the 1st and 99th percentiles of all values"
    with pytest.raises(RuntimeError, match="nothing observed yet"):
        Observer().range()
    with pytest.raises(ValueError, match=r"Observer: percentile must be in \(50, 100\]; got 20"):
        Observer("percentile", percentile=20)
    with pytest.raises(ValueError, match="min_val must be <= max_val; got min 2.0 > max 1.0"):
        compute_qparams(2.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Exercise 15.5: QuantizedLinear against torch.ao.nn.quantized.Linear
# ---------------------------------------------------------------------------------------------
def test_int_matmul_is_exact_int32_accumulation():
    rng = np.random.default_rng(0)
    for k, lo, hi in ((64, -128, 128), (3000, -255, 256), (40000, -128, 128)):
        a = rng.integers(lo, hi, (5, k)).astype(np.int32)
        b = rng.integers(-128, 128, (k, 3)).astype(np.int32)
        got = int_matmul(a, b)
        exact = a.astype(np.int64) @ b.astype(np.int64)
        assert got.dtype == np.int32 and np.array_equal(got, exact), f"K={k}: int_matmul differs from the int64 product"
    with pytest.raises(OverflowError, match="beyond an int32 accumulator"):
        int_matmul(np.full((1, 200000), 255, np.int32), np.full((200000, 1), 127, np.int32))


@pytest.mark.exercise("15.5", "QuantizedLinear.forward")
@pytest.mark.parametrize("per_channel", [True, False])
def test_quantized_linear_equals_torch_quantized_linear(per_channel):
    torch = torch_quiet()
    rng = np.random.default_rng(int(per_channel))
    lin = Linear(64, 32, rng=1)
    lin.bias.data[:] = rng.standard_normal(32).astype(np.float32) * 0.1
    x = rng.standard_normal((50, 64)).astype(np.float32)
    y = x @ lin.weight.data.T + lin.bias.data
    in_s, in_z = compute_qparams(x.min(), x.max(), "uint8")
    out_s, out_z = compute_qparams(y.min(), y.max(), "uint8")
    ql = QuantizedLinear.from_float(lin, (float(in_s), int(in_z)), (float(out_s), int(out_z)), per_channel)
    ours = quantize(ql(Tensor(x)).data, float(out_s), int(out_z), "uint8").astype(np.int64)
    if torch is None:   # the same integer pipeline written out in NumPy
        qx = quantize(x, float(in_s), int(in_z), "uint8").astype(np.int64) - int(in_z)
        acc = (qx @ ql.weight_q.T.astype(np.int64)).astype(np.float32)
        ref = quantize(acc * (np.float32(in_s) * ql.weight_scale) + lin.bias.data, float(out_s), int(out_z), "uint8")
    else:
        import torch.ao.nn.quantized as nnq
        from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
        w = torch.from_numpy(lin.weight.data.copy())
        if per_channel:
            obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
            obs(w)
            s, z = obs.calculate_qparams()
            wq = torch.quantize_per_channel(w, s.double(), z, 0, torch.qint8)
        else:
            obs = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
            obs(w)
            s, z = obs.calculate_qparams()
            wq = torch.quantize_per_tensor(w, float(s), int(z), torch.qint8)
        assert np.array_equal(wq.int_repr().numpy(), ql.weight_q), "from_float's int8 weights vs torch's observer + quantize"
        engine = torch.backends.quantized.engine
        torch.backends.quantized.engine = "qnnpack"   # exact int32 accumulation (x86 FBGEMM saturates 16-bit pairs)
        try:
            tl = nnq.Linear(64, 32)
            tl.set_weight_bias(wq, torch.from_numpy(lin.bias.data.copy()))
            tl.scale, tl.zero_point = float(out_s), int(out_z)
            ref = tl(torch.quantize_per_tensor(torch.from_numpy(x), float(in_s), int(in_z), torch.quint8)).int_repr().numpy()
        finally:
            torch.backends.quantized.engine = engine
    diff = np.abs(ours - ref.astype(np.int64))
    assert diff.max() <= 1, f"output integers differ from torch's quantized Linear by up to {diff.max()} steps; expected at most 1"
    assert (diff > 0).mean() < 0.02, f"{(diff > 0).mean():.1%} of the outputs differ by one step from torch; expected under 2%"


@pytest.mark.exercise("15.5", "QuantizedLinear.forward")
def test_quantized_linear_shapes_and_errors():
    lin = Linear(8, 3, bias=False, rng=0)
    ql = QuantizedLinear.from_float(lin, (0.05, 0), act_dtype="int8")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 5, 8)).astype(np.float32)
    y = ql(x)
    assert isinstance(y, Tensor) and y.shape == (2, 5, 3) and y.dtype == np.float32 and not y.requires_grad
    np.testing.assert_allclose(y.data, x @ lin.weight.data.T, atol=0.15, err_msg="close to the float layer (input step 0.05)")
    with pytest.raises(ValueError, match=r"QuantizedLinear.forward: input of shape \(2, 7\) does not match weight of shape \(3, 8\)"):
        ql(np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="QuantizedLinear \\(input\\): scale must be positive and finite; got -1.0"):
        QuantizedLinear.from_float(lin, (-1.0, 0))
    with pytest.raises(TypeError, match="expected a Linear; got ReLU"):
        QuantizedLinear.from_float(ReLU(), (0.1, 0))


def trained_mlp(epochs=3, seed=0):
    from tinytorch.data.loader import DataLoader, load_digits

    train = load_digits("train")
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(64, 64, rng=rng), ReLU(), Linear(64, 10, rng=rng))
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        for xb, yb in DataLoader(train, batch_size=32, shuffle=True, seed=epoch):
            opt.zero_grad()
            CrossEntropyLoss()(model(xb), yb).backward()
            opt.step()
    return model, train


def test_quantize_model_is_smaller_accurate_and_leaves_the_float_model():
    from tinytorch.data.loader import DataLoader, load_digits

    model, train = trained_mlp()
    x, y = load_digits("test").tensors
    weights = [p.data.copy() for p in model.parameters()]
    acc = lambda m: float((m(x).data.argmax(axis=1) == y.data).mean())
    float_acc = acc(model)
    for data in (DataLoader(train, batch_size=128), train.tensors[0].data[:256], [train.tensors[0][:100]]):
        q = quantize_model(model, data)
        assert [type(m).__name__ for m in q.layers] == ["QuantizedLinear", "ReLU", "QuantizedLinear"]
        assert acc(q) >= float_acc - 0.02, f"int8 accuracy {acc(q):.3f} vs float {float_acc:.3f}: more than 2 points lost"
    assert all(np.array_equal(p.data, w) for p, w in zip(model.parameters(), weights)), "the float model must be unchanged"
    assert all(isinstance(m, (Linear, ReLU)) for m in model.layers) and model.training, "the float model keeps its layers and mode"
    ratio = model_nbytes(model) / model_nbytes(q)
    assert 3.5 < ratio < 4.0, f"int8 weights: {ratio:.2f}x fewer bytes; expected between 3.5x and 4x"
    with pytest.raises(ValueError, match="has no Linear layer to quantize"):
        quantize_model(Sequential(ReLU()), train.tensors[0].data)
    with pytest.raises(ValueError, match="the calibration data gave no batch"):
        quantize_model(model, [])


# ---------------------------------------------------------------------------------------------
# Exercise 15.6: ternarize and the straight-through estimator
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("15.6", "ternarize")
@PROPERTY
@given(arrays(np.float32, array_shapes(max_dims=2, max_side=20), elements=st.floats(-10, 10, width=32)))
def test_ternarize_is_absmean_round_clip(w):
    t, scale = ternarize(w)
    expected_scale = np.float32(np.abs(w).mean() + 1e-8)
    assert isinstance(scale, np.float32) and scale == expected_scale, f"scale {scale!r}; expected the absmean {expected_scale!r}"
    expected = np.clip(np.rint(w / expected_scale), -1, 1)
    assert t.dtype == np.int8 and t.shape == w.shape and np.array_equal(t, expected), f"ternary values {t} vs {expected}"


@pytest.mark.exercise("15.6", "ternarize")
def test_ternary_linear_ste_gradient_equals_torch():
    torch = torch_quiet()
    layer = TernaryLinear(12, 5, rng=0)
    layer.bias.data[:] = np.linspace(-1, 1, 5, dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((7, 12)).astype(np.float32)
    g = np.random.default_rng(2).standard_normal((7, 5)).astype(np.float32)
    y = layer(Tensor(x))
    y.backward(g)
    t, scale = ternarize(layer.weight.data)
    wq = t.astype(np.float32) * scale
    np.testing.assert_allclose(y.data, x @ wq.T + layer.bias.data, rtol=1e-5, atol=1e-5, err_msg="forward uses t * scale")
    if torch is not None:
        w = torch.from_numpy(layer.weight.data.copy()).requires_grad_(True)
        q = torch.from_numpy(wq)
        ste = w + (q - w).detach()          # the STE as written in PyTorch code (BitNet's reference)
        out = torch.from_numpy(x) @ ste.T + torch.from_numpy(layer.bias.data.copy())
        out.backward(torch.from_numpy(g))
        ref = w.grad.numpy()
    else:
        ref = g.T @ x
    np.testing.assert_allclose(layer.weight.grad.data, ref, rtol=1e-5, atol=1e-5, err_msg="STE weight gradient")


@PROPERTY
@given(arrays(np.int8, st.integers(0, 60), elements=st.sampled_from([-1, 0, 1])))
def test_pack_ternary_round_trip_and_size(t):
    packed = pack_ternary(t)
    assert packed.dtype == np.uint8 and packed.size == -(-t.size // 5), f"{t.size} digits need {-(-t.size // 5)} bytes"
    assert np.array_equal(unpack_ternary(packed, t.size), t), "unpack(pack(t)) == t"
