"""Module 15 (quantization and mixed precision): the exported `tinytorch.perf.quantization` against PyTorch and torchao.

- `to_bfloat16` / `to_float16` equal `torch.tensor(x).to(torch.bfloat16 / float16).float()` bit for
  bit on hypothesis-drawn float32 values (any bit pattern: subnormals, huge values, ties) and on
  the edge cases (+-0, +-inf, NaN, overflow thresholds, FP16 subnormals). NaN only has to stay NaN:
  PyTorch's own NaN bit pattern depends on which of its kernels runs.
- `autocast` against `torch.autocast("cpu", dtype=...)` for Linear and Conv2d; master weights and
  gradients stay float32; the backward uses the rounded operands; the mode is per thread (two threads
  interleaved, each sees its own).
- `GradScaler` against `torch.amp.GradScaler("cpu")`: the same sequence of scales, the same
  unscaled gradients and the same skipped steps on a drawn sequence of finite and inf/NaN gradients
  spread over several parameters (an inf in an earlier parameter is not forgotten).
- `quantize` / `dequantize` equal `torch.quantize_per_tensor` / `quantize_per_channel`
  (`.int_repr()`, `.dequantize()`) element for element, also on 600,000 near-ties (values one float32
  rounding from a half step, where PyTorch's per-tensor kernel uses a fused multiply-add and its
  per-channel kernel does not); checked against torchao's `quantize_affine` / `dequantize_affine`
  (equal except at near-ties with a nonzero zero point, where torchao rounds before it adds);
  `compute_qparams` and `Observer` equal `MinMaxObserver` / `PerChannelMinMaxObserver`;
  `QuantizedLinear` matches `torch.ao.nn.quantized.Linear` (QNNPACK engine) within one integer step;
  `quantize_model` calibrates and converts as its parts say.
- Every dtype argument takes a name or a NumPy dtype (`np.int8`).
- Properties: `dequantize(quantize(x))` is within scale / 2 of x inside the range; the ternary
  STE gradient equals PyTorch's `w + (q - w).detach()` formulation.
- Bad input: zero, negative or NaN scales, zero points outside the range, mismatched per-channel
  parameters: errors that name the value.

The references come from `tests/support/systems.py`: PyTorch (and torchao) where installed, else NumPy
formulas written from the definitions (the rounding grid, NumPy's float16, a fused multiply-add in extended
precision, the observers' formulas, the scaler's rule), so a student edition compares against something too.
A test of an exercise that builds on an earlier one checks that one first and names it, or replaces it by a
stand-in. Run one exercise with `pytest tests/modules/test_15_quantization.py --exercise 15.5`.
"""
from __future__ import annotations

import copy
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Linear, Module, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.core.spatial import Conv2d
from tinytorch.core.tensor import Tensor
from tinytorch.perf.quantization import (
    GradScaler, Observer, QuantizedLinear, TernaryLinear, autocast, autocast_dtype, compute_qparams, dequantize,
    float_bits, fma_float32, int_matmul, model_nbytes, pack_ternary, quantize, quantize_model, round_to, ternarize,
    to_bfloat16, to_float16, unpack_ternary,
)
from tests.support import laid_out, property_settings
from tests.support.systems import (
    QRANGE, ReferenceScaler, near_ties, ref_bfloat16, ref_dequantize_affine, ref_float16, ref_qparams,
    ref_quantize_affine, ref_quantize_per_channel, ref_quantize_per_tensor, torch_quiet, torchao_or_none,
)

pytestmark = pytest.mark.module("15")

PROPERTY = property_settings(40)
warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)


def require(*exercises):
    """Check the earlier exercises a test depends on; a wrong one fails the test with its own name, so that a
    downstream failure says which exercise to fix first (a stub is reported as "not implemented yet" by name)."""
    checks = {
        "15.1": ("to_bfloat16", lambda: float(to_bfloat16(np.float32(1 + 3 * 2**-8))) == 1.015625),
        "15.2": ("to_float16", lambda: float(to_float16(np.float32(1 + 3 * 2**-11))) == 1 + 2**-9),
        "15.5": ("quantize", lambda: quantize([-1.0, 0.25, 0.75, 100.0], 0.5, 0).tolist() == [-2, 0, 2, 127]),
        "15.6": ("compute_qparams", lambda: [float(v) for v in compute_qparams(-1.0, 3.0, "uint8")] == [float(np.float32(4 / 255)), 64.0]),
        "15.7": ("Observer", lambda: Observer()(np.array([1.0], np.float32)) is not None),
        "15.8": ("QuantizedLinear.forward", lambda: np.allclose(QuantizedLinear(
            np.array([[100]], np.int8), np.array([0.01], np.float32), None, 0.1, 0, act_dtype="int8")(
            np.array([[2.0]], np.float32)).data, [[2.0]])),
    }
    for number in exercises:
        name, check = checks[number]
        try:
            ok = check()
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - a crash of the earlier exercise is its failure
            ok, why = False, f"it raised {type(err).__name__}: {err}"
        else:
            why = "it is wrong on the example of its docstring"
        if not ok:
            pytest.fail(f"not checked on its own: it uses {name} (Exercise {number}), and {why}. Fix Exercise {number} first",
                        pytrace=False)


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


@pytest.mark.exercise("15.2", "to_float16")
def test_to_float16_equals_torch_and_numpy():
    assert_same_bits(to_float16(EDGES), ref_float16(EDGES), "to_float16 on the edge cases", EDGES)
    bits = np.random.default_rng(1).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    assert_same_bits(to_float16(x), ref_float16(x), "to_float16 of 1,000,000 random bit patterns", x)
    with np.errstate(over="ignore"):
        assert_same_bits(to_float16(x), x.astype(np.float16).astype(np.float32), "to_float16 vs NumPy's float16")


@pytest.mark.exercise("15.2", "to_float16")
@PROPERTY
@given(float32_values)
def test_to_float16_equals_torch_on_drawn_floats(x):
    assert_same_bits(to_float16(x), ref_float16(x), f"to_float16 of shape {x.shape}", x)


# ---------------------------------------------------------------------------------------------
# Exercise 15.3: the autocast observer, against torch.autocast; the mode per thread
# ---------------------------------------------------------------------------------------------
def coarse_round(x, dtype):
    "A stand-in for round_to (not BF16 or FP16: a grid of 1/8 or 1/64): 15.3 checked without 15.1 and 15.2."
    step = {"bfloat16": 8.0, "float16": 64.0}[dtype]
    return (np.rint(np.asarray(x, np.float32) * step) / step).astype(np.float32)


@pytest.mark.exercise("15.3", "_autocast_observer")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_observer_rounds_operands_and_result_with_round_to(monkeypatch, dtype):
    from tinytorch.perf import quantization

    monkeypatch.setattr(quantization, "round_to", coarse_round)
    rng = np.random.default_rng(4)
    a = Tensor(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal((5, 2)).astype(np.float32), requires_grad=True)
    with autocast(dtype):
        c = a @ b
    expected = coarse_round(coarse_round(a.data, dtype) @ coarse_round(b.data, dtype), dtype)
    assert c.dtype == np.float32 and np.array_equal(c.data, expected), \
        f"autocast({dtype!r}): the product of the rounded operands, rounded (with round_to); largest difference {np.abs(c.data - expected).max():.3g}"
    g = rng.standard_normal((3, 2)).astype(np.float32)
    c.backward(g)
    np.testing.assert_allclose(b.grad.data, coarse_round(a.data, dtype).T @ g, rtol=1e-6, atol=1e-6,
                               err_msg="backward multiplies by the rounded operands: the observer replaces node.saved")
    with autocast(dtype):
        d = a + 1.0
    assert np.array_equal(d.data, a.data + 1.0), "only matmuls (and convolutions) are autocast: an add stays float32"


@pytest.mark.exercise("15.3", "_autocast_observer")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_linear_matches_torch_autocast(dtype):
    require("15.1", "15.2")
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


@pytest.mark.exercise("15.3", "_autocast_observer")
def test_autocast_conv2d_matches_torch_autocast():
    require("15.1")
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


@pytest.mark.exercise("15.3", "_autocast_observer")
def test_autocast_keeps_master_weights_and_gradients_float32():
    require("15.1")
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


@pytest.mark.exercise("15.3", "_autocast_observer")
def test_autocast_nests_takes_numpy_dtypes_and_leaves_no_trace():
    require("15.1", "15.2")
    layer = Linear(16, 4, rng=0)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    before = layer(x).data
    with autocast("bfloat16"):
        with autocast(np.float16) as inner_name:
            assert autocast_dtype() == "float16" and inner_name == "float16", "np.float16 is the name 'float16'"
            inner = layer(x).data
        assert autocast_dtype() == "bfloat16"
    assert autocast_dtype() is None
    assert np.array_equal(layer(x).data, before), "after the block, matmuls are float32 again"
    assert not np.array_equal(inner, before)
    with pytest.raises(ValueError, match=r"autocast: dtype must be one of 'bfloat16', 'float16' \(a name or a NumPy dtype, as np.int8\); got 'int8'"):
        with autocast("int8"):
            pass
    with pytest.raises(ValueError, match="autocast: dtype must be one of .*; got float64"):
        with autocast(np.float64):
            pass
    assert autocast_dtype() is None
    assert np.array_equal(round_to(x, np.float16), to_float16(x)) and np.array_equal(round_to(x, "bfloat16"), to_bfloat16(x))


@pytest.mark.exercise("15.3", "_autocast_observer")
def test_autocast_is_per_thread_as_in_pytorch():
    """Thread A enters autocast, B enters another dtype, A exits, B exits: inside each block each thread sees its own
    dtype, the other's matmuls are not rounded, and afterwards neither thread is left in autocast."""
    require("15.1", "15.2")
    layer = Linear(16, 4, rng=0)
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    plain = layer(x).data
    bf16, fp16 = to_bfloat16(to_bfloat16(x) @ to_bfloat16(layer.weight.data).T), to_float16(to_float16(x) @ to_float16(layer.weight.data).T)
    b1, b2, b3 = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    seen, errors = {}, []

    def a_thread():
        try:
            with autocast("bfloat16"):
                b1.wait()                       # both blocks are open
                seen["a_in"] = (autocast_dtype(), layer(x).data)
                b2.wait()
            seen["a_after"] = (autocast_dtype(), layer(x).data)   # A left its block while B is still in its own
            b3.wait()
        except Exception as err:  # noqa: BLE001
            errors.append(repr(err))
            for b in (b1, b2, b3):
                b.abort()

    def b_thread():
        try:
            with autocast("float16"):
                b1.wait()
                seen["b_in"] = (autocast_dtype(), layer(x).data)
                b2.wait()
                b3.wait()
                seen["b_late"] = (autocast_dtype(), layer(x).data)
            seen["b_after"] = (autocast_dtype(), layer(x).data)
        except Exception as err:  # noqa: BLE001
            errors.append(repr(err))
            for b in (b1, b2, b3):
                b.abort()

    threads = [threading.Thread(target=a_thread), threading.Thread(target=b_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    expected = {"a_in": ("bfloat16", bf16), "b_in": ("float16", fp16), "a_after": (None, plain),
                "b_late": ("float16", fp16), "b_after": (None, plain)}
    for key, (dtype, values) in expected.items():
        got_dtype, got = seen[key]
        assert got_dtype == dtype, f"{key}: autocast_dtype() is {got_dtype!r} on that thread; expected {dtype!r}"
        np.testing.assert_allclose(got, values, rtol=2**-7, atol=1e-6, err_msg=f"{key}: the thread's matmul")
    assert autocast_dtype() is None and np.array_equal(layer(x).data, plain), "the main thread was never in autocast"


# ---------------------------------------------------------------------------------------------
# Exercise 15.4: GradScaler against torch.amp.GradScaler
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("15.4", "GradScaler.update")
@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["ok", "ok", "ok", "inf", "nan"]), st.integers(0, 2)), min_size=1, max_size=40),
       st.sampled_from([1.0, 3.0, 1024.0, 2.0 ** 16, 2.0 ** 120]), st.integers(1, 5),
       st.sampled_from([(2.0, 0.5), (4.0, 0.25), (1.5, 0.9)]))
def test_grad_scaler_scale_sequence_equals_torch(steps, init_scale, interval, factors):
    """Three parameters; a step's inf or NaN lands in any of them (the first, a middle one, the last): the scale,
    the unscaled gradients and the skipped steps equal torch.amp.GradScaler's."""
    torch = torch_quiet()
    growth, backoff = factors
    rng = np.random.default_rng(len(steps))
    params = [Tensor(np.ones(n, np.float32), requires_grad=True) for n in (4, 3, 5)]
    opt = SGD(params, lr=0.1)
    ours = GradScaler(init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    if torch is not None:
        tparams = [torch.ones(n, requires_grad=True) for n in (4, 3, 5)]
        topt = torch.optim.SGD(tparams, lr=0.1)
        ref = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                   growth_interval=interval)
        ref.scale(torch.ones(()))  # creates torch's scale tensor
    else:
        ref = ReferenceScaler(init_scale, growth, backoff, interval)
    for step, (kind, where) in enumerate(steps):
        grads = []
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape).astype(np.float32)
            with np.errstate(over="ignore"):
                scaled = g * np.float32(ours.get_scale())   # may overflow at a huge scale: that is an overflow step too
            if kind != "ok" and i == where:
                scaled[step % p.shape[0]] = np.inf if kind == "inf" else np.nan
            grads.append(scaled)
            p.grad = Tensor(scaled.copy())
        before = [p.data.copy() for p in params]
        stepped = ours.step(opt)
        found = not all(np.isfinite(g).all() for g in grads)
        if torch is not None:
            for tp, g in zip(tparams, grads):
                tp.grad = torch.from_numpy(g.copy())
            ref.step(topt)
            ref_grads = [tp.grad.numpy() for tp in tparams]
            ref.update()
            ref_scale = ref.get_scale()
        else:
            ref_grads = None
            ref_scale = ref.update(found)
        ours.update()
        assert stepped == (not found), (f"step {step}: an {kind} in parameter {where} of 3: step() returned {stepped}; "
                                        f"expected {not found} (an inf found in an earlier parameter must not be forgotten)")
        if found:
            assert all(np.array_equal(p.data, b) for p, b in zip(params, before)), f"step {step}: an inf/NaN gradient must skip the update"
        elif ref_grads is not None:
            for i, (p, rg) in enumerate(zip(params, ref_grads)):
                assert np.array_equal(p.grad.data, rg), f"step {step}: parameter {i}'s unscaled gradient {p.grad.data} vs torch {rg}"
        assert ours.get_scale() == ref_scale, \
            f"after step {step} of {steps[:step + 1]}: scale {ours.get_scale()}; torch.amp.GradScaler has {ref_scale}"


@pytest.mark.exercise("15.4", "GradScaler.unscale_")
def test_unscale_finds_an_inf_in_any_parameter_and_unscales_every_one():
    for where in range(3):
        params = [Tensor(np.ones(2, np.float32), requires_grad=True) for _ in range(3)]
        for i, p in enumerate(params):
            p.grad = Tensor(np.array([np.inf if i == where else 8.0, 4.0], np.float32))
        found = GradScaler(init_scale=4.0).unscale_(SGD(params, lr=0.1))
        assert found, f"an inf in parameter {where} of 3 must be found (an earlier one must not be overwritten by later finite ones)"
        for i, p in enumerate(params):
            assert p.grad.data[1] == 1.0, f"parameter {i}'s gradient is unscaled too: got {p.grad.data}"


@pytest.mark.exercise("15.4", "GradScaler.unscale_")
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
# Exercise 15.5: quantize / dequantize against torch.quantize_per_tensor / per_channel, and torchao
# ---------------------------------------------------------------------------------------------
QDTYPES = {"int8": (-128, 127), "uint8": (0, 255)}


def ref_quantize(x, scale, zero_point, dtype, axis=None):
    "(integers, their dequantized values) of PyTorch's kernels, or of the NumPy references of tests/support/systems.py."
    if axis is None:
        q = ref_quantize_per_tensor(x, scale, zero_point, dtype)
        return q, (q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
    q = ref_quantize_per_channel(x, scale, zero_point, axis, dtype)
    shape = [1] * np.ndim(x)
    shape[axis] = -1
    s = np.asarray(scale, np.float32).reshape(shape)
    z = np.asarray(zero_point, np.int64).reshape(shape)
    return q, (q.astype(np.float32) - z.astype(np.float32)) * s


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


@pytest.mark.exercise("15.5", "quantize")
@PROPERTY
@given(quant_cases())
def test_quantize_per_tensor_equals_torch(case):
    x, scale, zp, dtype, _ = case
    q = quantize(x, scale, zp, dtype)
    ref_q, _ = ref_quantize(x, scale, zp, dtype)
    assert q.dtype == {"int8": np.int8, "uint8": np.uint8}[dtype] and q.shape == x.shape, f"quantize({dtype}): {q.dtype} {q.shape}; expected {ref_q.dtype} {x.shape}"
    bad = q != ref_q
    assert not bad.any(), (f"quantize(scale={scale!r}, zero_point={zp}, {dtype}): {int(bad.sum())} of {q.size} differ from "
                           f"torch.quantize_per_tensor; first x={x[bad][0]!r}: got {q[bad][0]}, expected {ref_q[bad][0]}")


@pytest.mark.exercise("15.5", "quantize")
@PROPERTY
@given(quant_cases(per_channel=True))
def test_quantize_per_channel_equals_torch(case):
    x, scales, zps, dtype, axis = case
    q = quantize(x, scales, zps, dtype, axis=axis)
    ref_q, _ = ref_quantize(x, scales, zps, dtype, axis)
    bad = q != ref_q
    assert q.shape == x.shape and not bad.any(), \
        f"quantize per channel (axis {axis}, {dtype}): {int(bad.sum())} of {q.size} differ from torch.quantize_per_channel"


@pytest.mark.exercise("15.5", "dequantize")
@PROPERTY
@given(st.one_of(quant_cases(), quant_cases(per_channel=True)))
def test_dequantize_equals_torch(case):
    x, scale, zp, dtype, axis = case
    ref_q, ref_d = ref_quantize(x, scale, zp, dtype, axis)
    got = dequantize(ref_q.astype({"int8": np.int8, "uint8": np.uint8}[dtype]), scale, zp, axis=axis)
    assert got.dtype == np.float32, f"dequantize returns float32; got {got.dtype}"
    assert np.array_equal(got, ref_d), f"dequantize vs torch's dequantize(): largest difference {np.abs(got - ref_d).max()}"


@pytest.mark.exercise("15.5", "quantize")
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


@pytest.mark.exercise("15.5", "quantize")
@pytest.mark.parametrize("dtype,zero_point", [("int8", 0), ("int8", 3), ("int8", -7), ("uint8", 128), ("uint8", 77)])
def test_quantize_equals_torch_on_near_ties(dtype, zero_point):
    """600,000 values within one float32 rounding of a half step (`x / scale + zero_point` near k + 1/2), where the
    order of the roundings decides the integer: per tensor equal to torch.quantize_per_tensor (a fused multiply-add),
    per channel to torch.quantize_per_channel (multiply, round, add)."""
    rng = np.random.default_rng(abs(zero_point) + len(dtype))
    scale = np.float32(rng.uniform(0.005, 0.2))
    x = near_ties(rng, 120_000, scale, zero_point, dtype)
    got, want = quantize(x, scale, zero_point, dtype).astype(np.int64), ref_quantize_per_tensor(x, scale, zero_point, dtype)
    bad = got != want
    assert not bad.any(), (f"per tensor, scale {scale!r}, zero point {zero_point}, {dtype}: {int(bad.sum())} of {x.size} near-ties "
                           f"differ from torch.quantize_per_tensor; first x={x[bad][0]!r}: got {got[bad][0]}, expected {want[bad][0]} "
                           f"(PyTorch rounds x * (1 / scale) + zero_point once: fma_float32)")
    rows = x.reshape(-1, 4)
    got = quantize(rows, [scale] * 4, [zero_point] * 4, dtype, axis=1).astype(np.int64)
    want = ref_quantize_per_channel(rows, [scale] * 4, [zero_point] * 4, 1, dtype)
    bad = got != want
    assert not bad.any(), (f"per channel, scale {scale!r}, zero point {zero_point}, {dtype}: {int(bad.sum())} of {rows.size} near-ties "
                           f"differ from torch.quantize_per_channel; first x={rows[bad][0]!r}: got {got[bad][0]}, expected {want[bad][0]}")


def test_fma_float32_rounds_once_as_a_fused_multiply_add():
    "The given fma_float32 against `a * b + c` in extended precision (64-bit mantissa: exact here), then float32."
    rng = np.random.default_rng(12)
    for scale, zp in ((0.05, 3), (0.0371, -7), (2.0**-5, 0)):
        x = np.concatenate([near_ties(rng, 20_000, np.float32(scale), zp), rng.standard_normal(5_000).astype(np.float32)])
        inv = np.float32(1) / np.float32(scale)
        ref = (x.astype(np.longdouble) * np.longdouble(inv) + zp).astype(np.float32)
        assert_same_bits(fma_float32(x, inv, zp), ref, f"fma_float32(x, 1 / {scale}, {zp})", x)
    assert fma_float32(np.float32(1.5), np.float32(2), 1).shape == (), "a 0-d result for 0-d operands"


@pytest.mark.exercise("15.5", "quantize")
@pytest.mark.parametrize("zero_point", [0, 5, -64])
def test_quantize_agrees_with_torchao_quantize_affine(zero_point):
    """torchao's `quantize_affine` (where PyTorch's quantization lives on; the NumPy formula where torchao is not
    installed): equal on ordinary values; on near-ties equal when the zero point is 0, and otherwise at most one
    step apart, only there (torchao rounds x * (1 / scale) before it adds the zero point)."""
    rng = np.random.default_rng(abs(11 + zero_point))
    scale = np.float32(0.0371)
    x = (rng.standard_normal(50_000) * 2).astype(np.float32)
    got = quantize(x, scale, zero_point).astype(np.int64)
    ao = ref_quantize_affine(x, scale, zero_point)
    ties = near_ties(rng, 50_000, scale, zero_point)
    frac = np.abs((x.astype(np.float64) / np.float64(scale)) % 1 - 0.5)
    away = frac > 1e-4                       # farther than float32 rounding from a half step
    assert np.array_equal(got[away], ao[away]), f"{int((got[away] != ao[away]).sum())} ordinary values differ from torchao's quantize_affine"
    diff = np.abs(quantize(ties, scale, zero_point).astype(np.int64) - ref_quantize_affine(ties, scale, zero_point))
    if zero_point == 0:
        assert not diff.any(), f"zero point 0: {int(diff.astype(bool).sum())} near-ties differ from torchao"
    else:
        assert diff.max() <= 1, f"zero point {zero_point}: near-ties differ from torchao by up to {diff.max()} steps; expected at most 1"
    q = quantize(x, scale, zero_point)
    np.testing.assert_array_equal(dequantize(q, scale, zero_point), ref_dequantize_affine(q, scale, zero_point),
                                  err_msg="dequantize vs torchao's dequantize_affine")


@pytest.mark.exercise("15.5", "quantize")
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.dtype("int8"), "int8"])
def test_every_dtype_argument_takes_a_numpy_dtype(dtype):
    name = np.dtype(dtype).name
    x = np.array([0.3, -0.2, 1.7], np.float32)
    zp = 128 if name == "uint8" else 0
    q = quantize(x, 0.1, zp, dtype=dtype)
    assert q.dtype == np.dtype(name) and np.array_equal(q, quantize(x, 0.1, zp, dtype=name)), \
        f"quantize(dtype={dtype!r}) must equal quantize(dtype={name!r}); got {q!r}"
    if name != "int32":
        s, z = compute_qparams(-1.0, 3.0, dtype)
        s2, z2 = compute_qparams(-1.0, 3.0, name)
        assert s == s2 and z == z2, f"compute_qparams(dtype={dtype!r})"
        assert Observer()(x) is x


@pytest.mark.exercise("15.5", "quantize")
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
    with pytest.raises(ValueError, match=r"quantize: dtype must be one of 'int8', 'uint8', 'int32' \(a name or a NumPy dtype, as np.int8\); got 'int4'"):
        quantize(x, 0.1, 0, "int4")
    with pytest.raises(ValueError, match="quantize: dtype must be one of .*; got float16"):
        quantize(x, 0.1, 0, np.float16)
    with pytest.raises(TypeError, match="dequantize: expected an int8, uint8 or int32 array; got dtype float32"):
        dequantize(x, 0.1, 0)


# ---------------------------------------------------------------------------------------------
# Exercise 15.6: compute_qparams against PyTorch's observers; Exercise 15.7: the Observer
# ---------------------------------------------------------------------------------------------
def observer_range(a, axis):
    "The min/max range of `a`, per tensor or per channel along `axis`."
    if axis is None:
        return a.min(), a.max()
    reduce = tuple(i for i in range(a.ndim) if i != axis)
    return a.min(axis=reduce), a.max(axis=reduce)


@pytest.mark.exercise("15.6", "compute_qparams")
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
    rs, rz = ref_qparams(*observer_range(a, axis), dtype, symmetric)
    assert np.asarray(s).dtype == np.float32 and np.asarray(z).dtype == np.int64, f"dtypes {np.asarray(s).dtype}, {np.asarray(z).dtype}"
    assert np.array_equal(np.asarray(s), rs), f"{dtype} symmetric={symmetric} axis={axis}: scale {s} vs torch observer {rs}"
    assert np.array_equal(np.asarray(z), rz), f"{dtype} symmetric={symmetric} axis={axis}: zero_point {z} vs torch observer {rz}"


@pytest.mark.exercise("15.7", "Observer.__call__")
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_observer_running_range_equals_torch_minmax_observers(axis):
    torch = torch_quiet()
    rng = np.random.default_rng(7)
    batches = [(rng.standard_normal((6, 5)) * (i + 1) + i).astype(np.float32) for i in range(4)]
    obs = Observer(axis=axis)
    for b in batches:
        obs(b)
    if torch is not None:
        from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

        ref = MinMaxObserver() if axis is None else PerChannelMinMaxObserver(ch_axis=axis)
        for b in batches:
            ref(torch.from_numpy(b))
        want = (ref.min_val.numpy(), ref.max_val.numpy())
    else:
        stacked = np.stack(batches)                      # (batch, 6, 5): a channel is one index of `axis` in every batch
        reduce = None if axis is None else tuple(i for i in range(3) if i != axis + 1)
        want = (stacked.min(axis=reduce), stacked.max(axis=reduce))
    lo, hi = obs.range()
    assert np.array_equal(np.ravel(lo), np.ravel(want[0])) and np.array_equal(np.ravel(hi), np.ravel(want[1])), \
        f"axis {axis}: the running range after four batches is ({lo}, {hi}); PyTorch's observer has {want}"
    if axis is None:
        assert all(type(v) is float for v in (lo, hi)), f"per tensor the range is two Python floats; got {type(lo).__name__}"
    else:
        assert lo.dtype == np.float32 and lo.shape == (batches[0].shape[axis],), f"per channel: float32, one per channel; got {lo.dtype} {lo.shape}"


@pytest.mark.exercise("15.7", "Observer.range")
def test_observers_minmax_over_batches_and_percentile():
    require("15.6")
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
@pytest.mark.exercise("15.8", "int_matmul")
def test_int_matmul_is_exact_int32_accumulation():
    rng = np.random.default_rng(0)
    for k, lo, hi in ((64, -128, 128), (3000, -255, 256), (40000, -128, 128)):
        a = rng.integers(lo, hi, (5, k)).astype(np.int32)
        b = rng.integers(-128, 128, (k, 3)).astype(np.int32)
        got = int_matmul(a, b)
        exact = a.astype(np.int64) @ b.astype(np.int64)
        assert got.dtype == np.int32 and np.array_equal(got, exact), f"K={k}: int_matmul differs from the int64 product"
    with pytest.raises(OverflowError, match="int_matmul: a sum of 200000 products of up to 255 x 127 can reach "
                                            "6,477,000,000, beyond an int32 accumulator"):
        int_matmul(np.full((1, 200000), 255, np.int32), np.full((200000, 1), 127, np.int32))
    assert int_matmul(np.full((1, 4), 2**12, np.int32), np.full((4, 1), 2**10, np.int32)).tolist() == [[2**24]], \
        "a bound of exactly 2**24 is still exact in float32"
    got = int_matmul(np.full((1, 300), 12700, np.int32), np.full((300, 1), 127, np.int32))
    assert got.tolist() == [[300 * 12700 * 127]], \
        f"a sum of 483,870,000 (above 2**24: float32 cannot hold it exactly, float64 can): got {got.tolist()}"
    with pytest.raises(TypeError, match="integer operands expected"):
        int_matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.int8))


@pytest.mark.exercise("15.8", "QuantizedLinear.forward")
@pytest.mark.parametrize("per_channel", [True, False])
def test_quantized_linear_equals_torch_quantized_linear(per_channel):
    require("15.5", "15.6")
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


@pytest.mark.exercise("15.8", "QuantizedLinear.forward")
def test_quantized_linear_shapes_and_errors():
    require("15.5", "15.6")
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


class StandInObserver:
    "Stands in for Exercise 15.7's Observer in 15.9's own test: counts what it is fed; its qparams are data, not a calibration."

    def __init__(self, method="minmax", percentile=99.99, axis=None):
        self.method, self.calls, self.values = method, 0, 0

    def __call__(self, x):
        a = np.asarray(x.data if isinstance(x, Tensor) else x)
        self.calls += 1
        self.values += a.size
        return x

    def qparams(self, dtype="int8", symmetric=False):
        return 0.5 + 0.25 * self.calls, self.values % 50


class StandInLayer(Module):
    "What the stand-in from_float returns: the arguments it was given, kept for the test."

    def __init__(self, linear, input_qparams, output_qparams, per_channel, act_dtype):
        super().__init__()
        self.args = (linear.weight.shape, tuple(input_qparams), tuple(output_qparams), per_channel, act_dtype)

    def forward(self, x):
        return x


@pytest.mark.exercise("15.9", "quantize_model")
def test_quantize_model_calibrates_every_linear_and_converts_a_copy(monkeypatch):
    """15.9 on its own: the Observer and QuantizedLinear.from_float replaced by stand-ins, so that only the
    calibration (hooks, eval mode, no graph, the batches) and the conversion (a copy, every Linear replaced,
    the observers' parameters passed on) are checked."""
    from tinytorch.perf import quantization

    monkeypatch.setattr(quantization, "Observer", StandInObserver)
    monkeypatch.setattr(quantization.QuantizedLinear, "from_float",
                        classmethod(lambda cls, *args: StandInLayer(*args)))
    modes = []
    net = Sequential(Linear(6, 5, rng=0), ReLU(), Linear(5, 3, rng=1))
    watcher = net.layers[0].register_forward_hook(lambda m, args, out: modes.append((m.training, out.requires_grad)))
    batches = [np.ones((4, 6), np.float32), np.ones((2, 6), np.float32), np.ones((7, 6), np.float32)]
    q = quantization.quantize_model(net, batches, per_channel=False, act_dtype=np.int8)
    watcher.remove()
    assert modes == [(False, False)] * 3, f"every batch runs in eval mode without a graph: (training, output requires grad) {modes}"
    assert net.training and isinstance(net.layers[0], Linear), "the float model keeps its layers and its training mode"
    assert not net.layers[0]._forward_hooks and not net.layers[2]._forward_hooks, "the calibration hooks are removed"
    layers = [m for m in q.layers if isinstance(m, StandInLayer)]
    assert len(layers) == 2 and isinstance(q.layers[1], ReLU) and q is not net, f"a copy with both Linears replaced: {q}"
    n_in, n_out = 13 * 6, 13 * 5
    assert layers[0].args == ((5, 6), (1.25, n_in % 50), (1.25, n_out % 50), False, "int8"), \
        f"Linear 0 is converted with its input and output observers' qparams (three calls each), per_channel and act_dtype: {layers[0].args}"
    assert layers[1].args[1] == (1.25, n_out % 50), f"Linear 1's input observer saw Linear 0's outputs after ReLU: {layers[1].args}"
    assert not q.training, "the converted copy is in eval mode"
    single = quantization.quantize_model(Linear(6, 2, rng=3), batches[:1])
    assert isinstance(single, StandInLayer), f"a model that is one Linear becomes the converted layer itself; got {type(single).__name__}"

    class Breaks(Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(6, 2, rng=0)

        def forward(self, x):
            self.fc(x)
            raise RuntimeError("the model broke")
    broken = Breaks()
    with pytest.raises(RuntimeError, match="the model broke"):
        quantization.quantize_model(broken, batches)
    assert not broken.fc._forward_hooks and broken.training, "hooks removed and mode restored when the model raises"
    with pytest.raises(ValueError, match="quantize_model: the calibration data gave no batch"):
        quantization.quantize_model(net, [])


@pytest.mark.exercise("15.9", "model_nbytes")
def test_model_nbytes_counts_each_layer_in_its_stored_format():
    require("15.8")
    float_model = Sequential(Linear(6, 5, rng=0), ReLU(), Linear(5, 3, rng=1))
    assert model_nbytes(float_model) == 4 * (6 * 5 + 5 + 5 * 3 + 3), "a float model: 4 bytes per parameter"
    ql = QuantizedLinear(np.ones((4, 6), np.int8), np.full(4, 0.01, np.float32), np.zeros(4, np.float32), 0.1, 0)
    assert model_nbytes(Sequential(ql, ReLU(), Linear(4, 2, rng=2))) == 24 + 16 + 16 + 4 * 10, "int8 weights, float32 scales and bias"
    tied = Linear(6, 6, rng=0)
    assert model_nbytes(Sequential(tied, ReLU(), tied)) == 4 * 42, "a layer used twice is stored once"
    ternary = TernaryLinear(20, 10, rng=0)
    assert model_nbytes(Sequential(ternary)) == ternary.packed_nbytes, "a ternary layer stores its packed digits, not its float latent weight"


@pytest.mark.exercise("15.8", "QuantizedLinear.forward")
def test_quantized_linear_forward_on_grid_values_is_exact():
    """15.8 on its own: power-of-two scales and inputs on the quantization grid, so every rounding in the forward
    pass is exact and any correct quantize gives the same integers."""
    rng = np.random.default_rng(8)
    wq = rng.integers(-127, 128, (3, 5)).astype(np.int8)
    w_scale = np.array([2.0**-7, 2.0**-6, 2.0**-8], np.float32)
    bias = (rng.integers(-20, 20, 3) * 2.0**-10).astype(np.float32)
    in_s, in_z = 2.0**-4, 130
    qx = rng.integers(0, 256, (6, 5))
    x = ((qx - in_z) * in_s).astype(np.float32)
    acc = (qx - in_z) @ wq.T.astype(np.int64)
    expected = (acc.astype(np.float64) * in_s * w_scale + bias).astype(np.float32)
    layer = QuantizedLinear(wq, w_scale, bias, in_s, in_z)
    got = layer(Tensor(x)).data
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6,
                               err_msg="the int32 sums of (qx - zero point) * weight_q, times input_scale * weight_scale, plus bias")
    out_s = 2.0**-12     # the finest grid of the outputs: in_s * the smallest weight scale
    req = QuantizedLinear(wq, w_scale, None, in_s, in_z, out_s, 0, act_dtype="int32")(Tensor(x)).data
    np.testing.assert_allclose(req, (acc.astype(np.float64) * in_s * w_scale).astype(np.float32), rtol=0, atol=1e-6,
                               err_msg="requantized on a grid that holds every output exactly: the same values")


@pytest.mark.exercise("15.9", "quantize_model")
def test_quantize_model_is_smaller_accurate_and_leaves_the_float_model():
    require("15.5", "15.6", "15.7", "15.8")
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
@pytest.mark.exercise("15.10", "ternarize")
@PROPERTY
@given(arrays(np.float32, array_shapes(max_dims=2, max_side=20), elements=st.floats(-10, 10, width=32)))
def test_ternarize_is_absmean_round_clip(w):
    t, scale = ternarize(w)
    expected_scale = np.float32(np.abs(w).mean() + 1e-8)
    assert isinstance(scale, np.float32) and scale == expected_scale, f"scale {scale!r}; expected the absmean {expected_scale!r}"
    expected = np.clip(np.rint(w / expected_scale), -1, 1)
    assert t.dtype == np.int8 and t.shape == w.shape and np.array_equal(t, expected), f"ternary values {t} vs {expected}"


@pytest.mark.exercise("15.10", "ternarize")
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
