"""The references of modules 14-16 (profiling, quantization, compression): the practitioners' tool where it is
installed, an independent NumPy computation where it is not.

The same pattern as `refs.py` and `families.py` for modules 01-13: each reference below returns what
PyTorch (or torchao) computes when it is importable, and otherwise what a NumPy formula written from the
definition computes, never the course's code. A student edition has no torch, and its tests still compare
against something; `tests/support/no_torch.py` hides torch to run that path here, and each module's tests
hold a check that the two paths agree where both exist (`*_numpy` against the torch answer).

- Module 14: `torch_flops` (FlopCounterMode, forward or forward + backward), `matmul_flops` and
  `conv_flops` (closed forms counted by NumPy itself), `torch_profiler_flops` (torch.profiler's
  `with_flops`).
- Module 15: `grid_round` (round to a binary grid, ties to even), `ref_bfloat16`, `ref_float16`,
  `ref_quantize_per_tensor` (a fused multiply-add, as PyTorch's vectorised kernel), `ref_quantize_per_channel`
  (a multiply, then an add, as PyTorch's per-channel kernel), `ref_quantize_affine` (torchao's order: round,
  then add the zero point), `ref_dequantize`, `ref_qparams` (the min/max observers), `ReferenceScaler`
  (`torch.amp.GradScaler("cpu")`'s update rule), `near_ties` (inputs one float32 rounding from a half step).
- Module 16: `ref_magnitude_mask` (`torch.nn.utils.prune.l1_unstructured`), `ref_ln_structured`
  (`prune.ln_structured`), `ref_distillation` (softened KL + cross-entropy, float64).
"""
from __future__ import annotations

import warnings

import numpy as np

from .refs import torch_or_none


def torch_quiet():
    "torch (or None), with the deprecation warnings of its quantized tensors silenced."
    torch = torch_or_none()
    if torch is not None:
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
    return torch


def torchao_or_none():
    "torchao's `quant_primitives` (quantize_affine, dequantize_affine), or None where torchao is not installed."
    if torch_or_none() is None:
        return None
    try:
        import logging
        logging.getLogger("torchao").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization import quant_primitives
    except Exception:  # not installed, or built for another torch: the check stays optional
        return None
    return quant_primitives


# ---------------------------------------------------------------------------------------------
# Module 14: FLOPs
# ---------------------------------------------------------------------------------------------
def torch_flops(fn, backward: bool = False) -> int:
    """FLOPs `torch.utils.flop_counter.FlopCounterMode` counts for `fn()` (under no_grad unless `backward`,
    in which case `fn` runs its own backward pass inside the counter)."""
    torch = torch_or_none()
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    if backward:
        with counter:
            fn()
    else:
        with counter, torch.no_grad():
            fn()
    return counter.get_total_flops()


def matmul_flops(a: tuple, b: tuple) -> int:
    "Multiply-adds of a @ b counted by NumPy itself (with all-ones operands each output element is its K), times 2."
    return 2 * int(np.matmul(np.ones(a), np.ones(b)).sum())


def conv_flops(n: int, c: int, o: int, oh: int, ow: int, kh: int, kw: int) -> int:
    "2 multiply-add FLOPs per filter tap per output element (the bias is not counted, as FlopCounterMode)."
    return 2 * n * o * oh * ow * c * kh * kw


def torch_profiler_flops(fn) -> int:
    "The FLOPs torch.profiler attributes to the ops of `fn()` (`with_flops=True`: its own formulas, not FlopCounterMode's code)."
    torch = torch_or_none()
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    return int(sum(e.flops for e in prof.key_averages()))


# ---------------------------------------------------------------------------------------------
# Module 15: rounding and quantization
# ---------------------------------------------------------------------------------------------
def grid_round(x, mantissa_bits: int, min_exp: int) -> np.ndarray:
    "Round to the nearest multiple of 2**(e - mantissa_bits - 1) (not below 2**min_exp), ties to even."
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(x)
        spacing = np.ldexp(np.float32(1), np.maximum(e - mantissa_bits - 1, min_exp)).astype(np.float32)
        out = (np.rint(x / spacing) * spacing).astype(np.float32)
    return np.where(np.isfinite(x), out, x)


def ref_bfloat16(x) -> np.ndarray:
    "`torch.tensor(x).to(torch.bfloat16).float()`, or the BF16 grid (8 significant bits, float32's range)."
    torch = torch_quiet()
    if torch is not None:
        return torch.from_numpy(np.array(x, np.float32)).to(torch.bfloat16).float().numpy()
    return grid_round(x, 7, -133)


def ref_float16(x) -> np.ndarray:
    "`torch.tensor(x).to(torch.float16).float()`, or NumPy's own float16 conversion."
    torch = torch_quiet()
    if torch is not None:
        return torch.from_numpy(np.array(x, np.float32)).to(torch.float16).float().numpy()
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-2 ** 31, 2 ** 31 - 1)}


def _torch_qdtype(torch, dtype: str):
    return {"int8": torch.qint8, "uint8": torch.quint8, "int32": torch.qint32}[dtype]


def ref_quantize_per_tensor(x, scale, zero_point: int, dtype: str = "int8") -> np.ndarray:
    """`torch.quantize_per_tensor(x, scale, zero_point, dtype).int_repr()` as int64, or: `x * (1 / scale) +
    zero_point` in float32 with one rounding (a fused multiply-add, computed exactly in extended precision),
    rounded half to even, clamped. PyTorch's vectorised kernel (FBGEMM) uses that fused multiply-add."""
    x = np.asarray(x, np.float32)
    torch = torch_quiet()
    if torch is not None:
        q = torch.quantize_per_tensor(torch.from_numpy(x.copy()), float(scale), int(zero_point), _torch_qdtype(torch, dtype))
        return q.int_repr().numpy().astype(np.int64)
    qmin, qmax = QRANGE[dtype]
    inv = np.float32(1.0) / np.float32(scale)
    exact = x.astype(np.longdouble) * np.longdouble(inv) + np.longdouble(int(zero_point))   # 64-bit mantissa: exact here
    with np.errstate(over="ignore", invalid="ignore"):
        return np.clip(np.rint(exact.astype(np.float32)), qmin, qmax).astype(np.int64)


def ref_quantize_per_channel(x, scales, zero_points, axis: int, dtype: str = "int8") -> np.ndarray:
    """`torch.quantize_per_channel(...).int_repr()` as int64, or: `x * (1 / scale)` rounded to float32, plus the
    zero point rounded to float32 (PyTorch's per-channel kernel: a multiply, then an add), half to even, clamped."""
    x = np.asarray(x, np.float32)
    scales, zero_points = np.asarray(scales, np.float32), np.asarray(zero_points, np.int64)
    torch = torch_quiet()
    if torch is not None:
        q = torch.quantize_per_channel(torch.from_numpy(x.copy()), torch.from_numpy(scales.astype(np.float64)),
                                       torch.from_numpy(zero_points), axis, _torch_qdtype(torch, dtype))
        return q.int_repr().numpy().astype(np.int64)
    qmin, qmax = QRANGE[dtype]
    shape = [1] * x.ndim
    shape[axis] = -1
    inv = (np.float32(1.0) / scales).reshape(shape)
    t = (x * inv).astype(np.float32) + zero_points.reshape(shape).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.clip(np.rint(t), qmin, qmax).astype(np.int64)


def ref_quantize_affine(x, scale, zero_point: int, dtype: str = "int8") -> np.ndarray:
    """torchao's `quantize_affine` (per tensor): `clamp(round(x * (1 / scale)) + zero_point)`, rounding *before*
    the zero point is added; the NumPy formula where torchao is not installed."""
    x = np.asarray(x, np.float32)
    qmin, qmax = QRANGE[dtype]
    ao = torchao_or_none()
    if ao is not None:
        torch = torch_or_none()
        out = ao.quantize_affine(torch.from_numpy(x.copy()), tuple(x.shape), torch.tensor([float(np.float32(scale))]),
                                 torch.tensor([int(zero_point)]), torch.int32, qmin, qmax)
        return out.numpy().astype(np.int64)
    inv = np.float32(1.0) / np.float32(scale)
    return np.clip(np.rint((x * inv).astype(np.float32)) + int(zero_point), qmin, qmax).astype(np.int64)


def ref_dequantize_affine(q, scale, zero_point: int) -> np.ndarray:
    "torchao's `dequantize_affine` (per tensor, float32 output), or `(q - zero_point) * scale` in float32."
    q = np.asarray(q)
    ao = torchao_or_none()
    if ao is not None:
        torch = torch_or_none()
        out = ao.dequantize_affine(torch.from_numpy(q.astype(np.int32)), tuple(q.shape),
                                   torch.tensor([float(np.float32(scale))]), torch.tensor([int(zero_point)]),
                                   torch.int32, output_dtype=torch.float32)
        return out.numpy()
    return (q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)


def near_ties(rng, n: int, scale, zero_point: int, dtype: str = "int8") -> np.ndarray:
    """float32 values `(k + 1/2) * scale`, each off by up to a millionth: where `x / scale + zero_point` lies
    within float32 rounding of a half step, so the order of the roundings decides the integer."""
    qmin, qmax = QRANGE[dtype]
    k = rng.integers(qmin - zero_point, qmax - zero_point, n)
    return ((k + 0.5) * np.float64(scale) * (1 + rng.uniform(-1e-6, 1e-6, n))).astype(np.float32)


def ref_qparams(lo, hi, dtype: str = "int8", symmetric: bool = False) -> tuple:
    """`(scale float32, zero_point int64)` of PyTorch's `MinMaxObserver` / `PerChannelMinMaxObserver`
    (`calculate_qparams` on a range [lo, hi]), or their formulas in float32."""
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    torch = torch_quiet()
    qmin, qmax = QRANGE[dtype]
    if torch is not None and dtype in ("int8", "uint8"):
        from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

        scheme = ((torch.per_channel_symmetric if symmetric else torch.per_channel_affine) if lo.ndim else
                  (torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine))
        obs = (PerChannelMinMaxObserver(ch_axis=0, dtype=_torch_qdtype(torch, dtype), qscheme=scheme) if lo.ndim else
               MinMaxObserver(dtype=_torch_qdtype(torch, dtype), qscheme=scheme))
        s, z = obs._calculate_qparams(torch.from_numpy(lo.copy()), torch.from_numpy(hi.copy()))
        return s.numpy().astype(np.float32).reshape(lo.shape), z.numpy().astype(np.int64).reshape(lo.shape)
    lo0, hi0 = np.minimum(lo, np.float32(0)), np.maximum(hi, np.float32(0))
    eps = np.finfo(np.float32).eps
    if symmetric:
        scale = np.maximum(np.maximum(-lo0, hi0) / np.float32((qmax - qmin) / 2), eps).astype(np.float32)
        return scale, np.full(scale.shape, 128 if dtype == "uint8" else 0, np.int64)
    scale = np.maximum((hi0 - lo0) / np.float32(qmax - qmin), eps).astype(np.float32)
    return scale, np.clip(qmin - np.rint(lo0 / scale).astype(np.int64), qmin, qmax).astype(np.int64)


class ReferenceScaler:
    """`torch.amp.GradScaler("cpu")` driven by found-inf flags, or its update rule (`_amp_update_scale_`) in
    NumPy: the scale (float32) after every `update(found_inf)`, and the count of good steps."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.torch = torch_or_none()
        self.args = (init_scale, growth_factor, backoff_factor, growth_interval)
        self.scale, self.tracker = np.float32(init_scale), 0

    def update(self, found_inf: bool) -> float:
        init, growth, backoff, interval = self.args
        torch = self.torch
        if torch is not None:
            scale = torch.tensor([float(self.scale)], dtype=torch.float32)
            tracker = torch.tensor([self.tracker], dtype=torch.int32)
            torch._amp_update_scale_(scale, tracker, torch.tensor([1.0 if found_inf else 0.0]), growth, backoff, interval)
            self.scale, self.tracker = np.float32(scale.item()), int(tracker.item())
            return float(self.scale)
        if found_inf:
            self.scale, self.tracker = np.float32(np.float64(self.scale) * backoff), 0
        else:
            good = self.tracker + 1
            if good == interval:
                with np.errstate(over="ignore"):
                    grown = np.float32(np.float64(self.scale) * growth)
                if np.isfinite(grown):
                    self.scale = grown
                good = 0
            self.tracker = good
        return float(self.scale)


# ---------------------------------------------------------------------------------------------
# Module 16: pruning and distillation
# ---------------------------------------------------------------------------------------------
def ref_magnitude_mask(w, sparsity: float) -> np.ndarray:
    """Keep-mask of `torch.nn.utils.prune.l1_unstructured(amount=sparsity)`; without torch, the `round(s * n)`
    smallest |w| pruned by a stable sort (ties: the earlier position goes first)."""
    w = np.asarray(w)
    torch = torch_or_none()
    if torch is not None:
        import torch.nn.utils.prune as prune

        t = torch.from_numpy(np.array(w, dtype=np.float64))
        return prune.L1Unstructured(amount=float(sparsity)).compute_mask(t, torch.ones_like(t)).numpy().astype(bool)
    k = int(round(sparsity * w.size))
    mask = np.ones(w.size, bool)
    mask[np.argsort(np.abs(w).ravel(), kind="stable")[:k]] = False
    return mask.reshape(w.shape)


def ref_ln_structured(w, n_keep: int, n: float = 2) -> np.ndarray:
    """The sorted indices of the output units `torch.nn.utils.prune.ln_structured(n=n, dim=0)` keeps when it
    prunes all but `n_keep`; without torch, the `n_keep` largest L-n norms of the rows (float64)."""
    w = np.asarray(w, np.float64)
    rows = w.reshape(w.shape[0], -1)
    torch = torch_or_none()
    if torch is not None:
        import torch.nn.utils.prune as prune

        t = torch.from_numpy(rows.copy())
        mask = prune.LnStructured(amount=rows.shape[0] - n_keep, n=n, dim=0).compute_mask(t, torch.ones_like(t))
        return np.flatnonzero(mask.numpy()[:, 0] > 0)
    norms = np.linalg.norm(rows, ord=n, axis=1)
    return np.sort(np.argsort(-norms, kind="stable")[:n_keep])


def ref_distillation(student_logits, teacher_logits, labels, temperature: float, alpha: float) -> float:
    """`alpha * CE(student, labels) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))`,
    batch-mean, in float64 (Hinton et al., 2015, as `F.kl_div(log_softmax(s/T), log_softmax(t/T), log_target=True,
    reduction="batchmean")`)."""
    s = np.asarray(student_logits, np.float64)
    t = np.asarray(teacher_logits, np.float64)

    def log_softmax(z):
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    ls, lt = log_softmax(s / temperature), log_softmax(t / temperature)
    kl = float((np.exp(lt) * (lt - ls)).sum(axis=-1).mean())
    ce = float(-log_softmax(s)[np.arange(len(labels)), np.asarray(labels)].mean())
    return alpha * ce + (1 - alpha) * temperature ** 2 * kl
