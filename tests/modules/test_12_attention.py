"""Module 12 (attention): `tinytorch.core.attention` against PyTorch.

By exercise: the scores (12.1) against `q k^T / sqrt(d)` with their gradients; `causal_mask` (12.2)
in both alignments against torch's `causal_lower_right` / `causal_upper_left`; `MaskedSoftmax`
(12.3, 12.4) against torch's softmax of the `-inf`-filled scores, forward and backward, with rows
that are masked entirely giving zeros (not NaN); scaled dot-product attention (12.5: plain, causal
bottom-right, boolean and additive masks) against `torch.nn.functional.scaled_dot_product_attention`,
forward and the gradients of q, k and v, on hypothesis-drawn shapes; split/merge heads (12.6);
multi-head attention (12.7) against `torch.nn.MultiheadAttention(batch_first=True)` loaded with the
same weights, with key padding masks and with a KV cache (chunked decoding equals the full causal
forward). The matmul FLOPs counted from the op records equal the closed form and torch's
`FlopCounterMode`. Causality is a property: changing a future token never changes the outputs at
earlier positions. Without PyTorch (a student edition) the same tests compare with the NumPy
references of `tests/support/refs.py` (`sdpa`, `multi_head_attention`, `causal_allowed`) and
float64 central differences for the gradients, so nothing skips.

Mask conventions: tinytorch's boolean masks say True = masked (as `nn.MultiheadAttention`); torch's
functional `scaled_dot_product_attention` and `refs.sdpa` say True = may attend. The tests translate.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import math

from tinytorch.core.attention import (ConcatCache, MaskedSoftmax, MultiHeadAttention, attention_scores, causal_mask,
                                     scaled_dot_product_attention)
from tinytorch.core.autograd import no_grad
from tinytorch.core.tensor import Tensor, observe_ops
from tests.support import params, refs
from tests.support.families import check_row, family_rows
from tests.support.refs import numeric_grads, torch_or_none

pytestmark = pytest.mark.module("12")
PROPERTY = settings(max_examples=30, deadline=None)
RTOL, ATOL = 1e-4, 1e-5


class Reference:
    "A NumPy stand-in for torch's result: `.detach().numpy()` gives the value, `.grad` holds a central-difference gradient."

    def __init__(self, value, grad=None, defined=None):
        self.value, self.grad, self.defined = np.asarray(value), grad, defined

    def detach(self):
        return self

    def numpy(self):
        return self.value


def _grad_view(ref: Reference, ours) -> np.ndarray:
    "The reference gradient with kinks (none in attention, but kept general) replaced by ours."
    return ref.grad if ref.defined is None else np.where(ref.defined, ref.grad, ours)


@st.composite
def qkv_shapes(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="batch axes"))
    tq = draw(st.integers(1, 6), label="Tq")
    tk = draw(st.integers(1, 6), label="Tk")
    d = draw(st.integers(1, 8), label="d")
    dv = draw(st.integers(1, 5), label="dv")
    return batch + (tq, d), batch + (tk, d), batch + (tk, dv)


def run_both(q, k, v, **kw):
    """Our attention and the reference's on the same float32 inputs: outputs and the three input
    gradients. The reference is torch's, or without torch `refs.sdpa` and central differences."""
    torch = torch_or_none()
    up = np.random.default_rng(7).standard_normal(q.shape[:-1] + (v.shape[-1],)).astype(np.float32)
    ours = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = scaled_dot_product_attention(*ours, **kw)
    (out * Tensor(up)).sum().backward()
    rkw = dict(kw)  # the reference's keywords: torch's convention, boolean True = may attend
    if "mask" in rkw and np.asarray(rkw["mask"]).dtype == bool:
        rkw["mask"] = ~np.asarray(rkw["mask"])
    if torch is None:
        fn = lambda *a: refs.sdpa(*a, **rkw, causal_align="bottom_right")  # noqa: E731
        grads = numeric_grads(fn, [q, k, v], up)
        return out, ours, Reference(fn(q, k, v)), [Reference(g, g, ok) for g, ok in grads]
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    if "mask" in rkw:
        rkw["attn_mask"] = torch.tensor(rkw.pop("mask"))
    if rkw.pop("is_causal", False):  # tinytorch's is_causal is torch's causal_lower_right
        rkw["attn_mask"] = causal_lower_right(q.shape[-2], k.shape[-2])
    tout = torch.nn.functional.scaled_dot_product_attention(*theirs, **rkw)
    (tout * torch.tensor(up)).sum().backward()
    return out, ours, tout, theirs


def assert_same(out, ours, tout, theirs, what):
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{what}: output")
    for name, a, b in zip("qkv", ours, theirs):
        expected = _grad_view(b, a.grad.data) if isinstance(b, Reference) else b.grad.numpy()
        np.testing.assert_allclose(a.grad.data, expected, rtol=RTOL, atol=ATOL, err_msg=f"{what}: gradient of {name}")


@pytest.mark.exercise("12.1", "attention_scores")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_scores_match_the_definition_with_gradients(shapes, seed):
    rng = np.random.default_rng(seed)
    q, k, _ = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    up = rng.standard_normal(q.shape[:-1] + (k.shape[-2],)).astype(np.float32)
    tq, tk = Tensor(q, requires_grad=True), Tensor(k, requires_grad=True)
    out = attention_scores(tq, tk)
    assert isinstance(out, Tensor) and out.shape == up.shape, f"scores of q {q.shape}, k {k.shape}: {getattr(out, 'shape', out)}"
    (out * Tensor(up)).sum().backward()
    torch = torch_or_none()
    if torch is None:
        fn = lambda a, b: np.einsum("...qd,...kd->...qk", a, b) / math.sqrt(a.shape[-1])  # noqa: E731
        value, (gq, _), (gk, _) = fn(q, k), *numeric_grads(fn, [q, k], up)
    else:
        a, b = torch.tensor(q, requires_grad=True), torch.tensor(k, requires_grad=True)
        t = a @ b.transpose(-2, -1) / math.sqrt(q.shape[-1])
        (t * torch.tensor(up)).sum().backward()
        value, gq, gk = t.detach().numpy(), a.grad.numpy(), b.grad.numpy()
    np.testing.assert_allclose(out.data, value, rtol=RTOL, atol=ATOL, err_msg=f"attention_scores of q {q.shape}, k {k.shape}")
    np.testing.assert_allclose(tq.grad.data, gq, rtol=RTOL, atol=ATOL, err_msg="gradient of q")
    np.testing.assert_allclose(tk.grad.data, gk, rtol=RTOL, atol=ATOL, err_msg="gradient of k")


@pytest.mark.exercise("12.1", "attention_scores")
def test_scores_shape_error_names_both_shapes():
    with pytest.raises(ValueError) as info:
        attention_scores(np.ones((2, 3, 4)), np.ones((2, 5, 3)))
    assert str(info.value) == ("attention_scores: q (2, 3, 4), k (2, 5, 3) do not fit: expected q (..., Tq, d), "
                               "k (..., Tk, d) with the same number of dimensions")


@st.composite
def scores_and_mask(draw):
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="leading axes")) + (draw(st.integers(1, 6), label="Tk"),)
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1.0, 30.0]), label="score scale")
    s = (rng.standard_normal(shape) * scale).astype(np.float32)
    kind = draw(st.sampled_from(["none", "full", "rows"]), label="mask")
    if kind == "none":
        return s, None
    mask = rng.random(shape if kind == "full" else shape[-2:] if len(shape) > 1 else shape) < 0.4
    if draw(st.booleans(), label="a row masked entirely"):
        mask.reshape(-1, mask.shape[-1])[0] = True
    return s, mask


def softmax_reference(s, mask, up):
    """The reference weights and score gradients: torch's softmax of the -inf-filled scores, or NumPy and
    central differences; rows masked entirely are zero in both (torch gives NaN there, replaced)."""
    full = np.broadcast_to(mask, s.shape) if mask is not None else np.zeros(s.shape, bool)
    empty = full.all(-1, keepdims=True)
    torch = torch_or_none()
    if torch is None:
        def fn(x):
            z = np.where(full, -np.inf, x)
            with np.errstate(invalid="ignore"):
                return np.where(empty, 0.0, refs.softmax(z, axis=-1))
        [(g, ok)] = numeric_grads(fn, [s], up)
        return fn(s), np.where(ok, g, np.nan)
    t = torch.tensor(s, requires_grad=True)
    w = torch.softmax(t.masked_fill(torch.tensor(full), float("-inf")), dim=-1)
    w = torch.where(torch.tensor(empty), torch.zeros(()), w)
    (w * torch.tensor(up)).sum().backward()
    return w.detach().numpy(), torch.nan_to_num(t.grad).numpy()


@pytest.mark.exercise("12.3", "MaskedSoftmax.forward")
@settings(max_examples=40, deadline=None)
@given(case=scores_and_mask())
def test_masked_softmax_matches_torch(case):
    s, mask = case
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        w = MaskedSoftmax.apply(Tensor(s), mask)
    ref, _ = softmax_reference(s, mask, np.ones_like(s))
    assert w.shape == s.shape and w.dtype == np.float32, f"weights {w.shape} {w.dtype}; expected {s.shape} float32"
    np.testing.assert_allclose(w.data, ref, rtol=RTOL, atol=1e-6, err_msg=f"masked softmax of scores {s.shape}, mask {None if mask is None else mask.shape}")
    if mask is not None:
        assert np.all(w.data[np.broadcast_to(mask, s.shape)] == 0), "masked entries must weigh exactly 0"


@pytest.mark.exercise("12.3", "MaskedSoftmax.forward")
def test_masked_softmax_edge_cases():
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        w = MaskedSoftmax.apply(Tensor(np.array([[1e4, -1e4, 0.0], [0.0, 1e4, 3.0], [7.0, 7.0, 7.0]], np.float32)),
                                np.array([[True, False, False], [False, False, True], [True, True, True]])).data
    np.testing.assert_allclose(w, [[0, 0, 1], [0, 1, 0], [0, 0, 0]], atol=1e-6,
                               err_msg="huge scores must not overflow, the max must ignore masked entries, a row masked entirely is zero")
    w = MaskedSoftmax.apply(Tensor(np.array([[0.0, -np.inf], [-np.inf, -np.inf]], np.float32)), None).data
    assert w.tolist() == [[1.0, 0.0], [0.0, 0.0]], f"-inf scores weigh 0 and a row of -inf is all zero; got {w.tolist()}"
    w = MaskedSoftmax.apply(Tensor(np.zeros((2, 3), np.float32)), np.array([False, True, False]))
    assert w.shape == (2, 3) and w.data.tolist() == [[0.5, 0.0, 0.5]] * 2, f"a (Tk,) mask broadcasts over rows; got {w.data.tolist()}"


@pytest.mark.exercise("12.4", "MaskedSoftmax.backward")
@settings(max_examples=40, deadline=None)
@given(case=scores_and_mask(), seed=st.integers(0, 2**16))
def test_masked_softmax_gradient_matches_torch(case, seed):
    s, mask = case
    s = s / np.float32(10.0) if np.abs(s).max() > 10 else s   # central differences need unsaturated rows
    up = refs.fd_upstream(s.shape, seed)
    t = Tensor(s, requires_grad=True)
    (MaskedSoftmax.apply(t, mask) * Tensor(up)).sum().backward()
    _, g = softmax_reference(s, mask, up)
    assert t.grad is not None and t.grad.shape == s.shape, "backward must give the scores a gradient of their shape"
    keep = ~np.isnan(g)
    np.testing.assert_allclose(t.grad.data[keep], g[keep], rtol=1e-3, atol=1e-5, err_msg=f"gradient of masked softmax, scores {s.shape}")
    assert np.isfinite(t.grad.data).all(), f"the gradient of the scores holds NaN or inf: {t.grad.data}"
    if mask is not None:
        assert np.all(t.grad.data[np.broadcast_to(mask, s.shape)] == 0), "masked entries get exactly zero gradient"


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    assert_same(*run_both(q, k, v), f"attention of shapes {shapes}")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_causal_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q_shape, k_shape, v_shape = shapes
    tk = max(q_shape[-2], k_shape[-2])                      # bottom-right alignment needs Tk >= Tq
    k_shape = k_shape[:-2] + (tk,) + k_shape[-1:]
    v_shape = v_shape[:-2] + (tk,) + v_shape[-1:]
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, k_shape, v_shape))
    assert_same(*run_both(q, k, v, is_causal=True), f"causal attention of shapes {(q_shape, k_shape, v_shape)}")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_boolean_mask_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    mask = rng.random((q.shape[-2], k.shape[-2])) < 0.4   # True = masked
    mask[:, 0] = False                    # every query may attend to something (torch gives NaN otherwise)
    assert_same(*run_both(q, k, v, mask=mask), f"masked attention of shapes {shapes}")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
def test_sdpa_additive_mask_matches_torch():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 3), (2, 5, 3), (2, 5, 2)))
    bias = rng.standard_normal((4, 5)).astype(np.float32)
    assert_same(*run_both(q, k, v, mask=bias), "attention with an additive float mask")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 8), pos=st.data(), seed=st.integers(0, 2**16))
def test_changing_a_future_token_never_changes_earlier_outputs(t, pos, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, t, 4)).astype(np.float32)
    p = pos.draw(st.integers(1, t - 1), label="changed position")
    y = x.copy()
    y[0, p] += rng.standard_normal(4).astype(np.float32) * 5
    a = scaled_dot_product_attention(Tensor(x), Tensor(x), Tensor(x), is_causal=True).data
    b = scaled_dot_product_attention(Tensor(y), Tensor(y), Tensor(y), is_causal=True).data
    np.testing.assert_allclose(a[0, :p], b[0, :p], rtol=0, atol=1e-6,
                               err_msg=f"changing token {p} changed outputs at positions < {p}: the causal mask leaks the future")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(3, 5\)"):
        scaled_dot_product_attention(Tensor(np.ones((2, 4))), Tensor(np.ones((3, 5))), Tensor(np.ones((3, 2))))


def causal_lower_right(tq, tk):
    "torch's bottom-right causal mask as a boolean attn_mask (True = may attend)."
    import torch
    return torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)


@pytest.mark.exercise("12.2", "causal_mask")
def test_causal_mask_examples():
    assert causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    assert causal_mask(2, 4).tolist() == [[False, False, False, True], [False, False, False, False]], (
        f"bottom-right: 2 new queries over 4 keys see keys 0-2 and 0-3; got {causal_mask(2, 4).tolist()}")
    assert causal_mask(2, 4, align="top_left").tolist() == [[False, True, True, True], [False, False, True, True]]
    assert causal_mask(3, 2, align="top_left").tolist() == [[False, True], [False, False], [False, False]]
    assert causal_mask(1, 5).tolist() == [[False] * 5], "one new query over a cache sees every key"
    assert causal_mask(3, 4).dtype == bool


@pytest.mark.exercise("12.2", "causal_mask")
@settings(max_examples=40, deadline=None)
@given(tq=st.integers(1, 9), extra=st.integers(0, 6), align=st.sampled_from(["bottom_right", "top_left"]))
def test_causal_mask_matches_torch_alignments(tq, extra, align):
    tk = tq + extra
    ours = causal_mask(tq, tk, align=align)
    torch = torch_or_none()
    if torch is None:
        allowed = refs.causal_allowed(tq, tk, align)
    else:
        from torch.nn.attention.bias import causal_lower_right, causal_upper_left
        bias = (causal_lower_right if align == "bottom_right" else causal_upper_left)(tq, tk)
        allowed = bias._materialize().numpy()  # the CausalBias's boolean mask (True = may attend)
        diag = tk - tq if align == "bottom_right" else 0
        assert np.array_equal(allowed, torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=diag).numpy())
    assert ours.shape == (tq, tk) and ours.dtype == bool
    assert np.array_equal(ours, ~allowed), f"causal_mask({tq}, {tk}, align={align!r}):\n{ours.astype(int)}\nexpected\n{(~allowed).astype(int)}"


@pytest.mark.exercise("12.2", "causal_mask")
@pytest.mark.parametrize("args, kw, message", [
    ((3, 2), {}, "causal_mask: align='bottom_right' needs k_len >= q_len (the queries are the last q_len of the "
                 "k_len positions); got q_len=3, k_len=2. Pass align='top_left' if query i should see keys 0..i"),
    ((3, 4), {"align": "bottom-right"}, "causal_mask: align must be 'bottom_right' or 'top_left'; got 'bottom-right'"),
    ((0,), {}, "causal_mask: q_len must be a positive integer; got 0"),
    ((2, 2.0), {}, "causal_mask: k_len must be a positive integer; got 2.0"),
])
def test_causal_mask_bad_input_is_named(args, kw, message):
    with pytest.raises(ValueError) as info:
        causal_mask(*args, **kw)
    assert str(info.value) == message, f"error text: {info.value}\nexpected:   {message}"


def load_into_torch(mha: MultiHeadAttention):
    import torch

    E, H = mha.embed_dim, mha.num_heads
    t = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        t.in_proj_weight.copy_(torch.tensor(np.concatenate([mha.q_proj.weight.data, mha.k_proj.weight.data, mha.v_proj.weight.data])))
        t.in_proj_bias.copy_(torch.tensor(np.concatenate([mha.q_proj.bias.data, mha.k_proj.bias.data, mha.v_proj.bias.data])))
        t.out_proj.weight.copy_(torch.tensor(mha.out_proj.weight.data))
        t.out_proj.bias.copy_(torch.tensor(mha.out_proj.bias.data))
    return t


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 6), heads=st.sampled_from([1, 2, 4]), hd=st.integers(1, 4),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_multi_head_attention_matches_torch(b, t, heads, hd, causal, seed):
    torch = torch_or_none()
    E = heads * hd
    mha = MultiHeadAttention(E, heads, rng=seed)
    x = np.random.default_rng(seed).standard_normal((b, t, E)).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    out = mha(xt, is_causal=causal)
    (out * out).sum().backward()
    if torch is None:
        projs = (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj)
        weights = [a for p in projs for a in (p.weight.data, p.bias.data)]
        mask = ~causal_mask(t) if causal else None  # refs take torch's sdpa convention: True = may attend

        def ref(x_, *ws):
            y = refs.multi_head_attention(x_, x_, x_, *ws, num_heads=heads, mask=mask)
            return y * y  # the loss is sum(out * out): differentiate it with an upstream of ones

        value = refs.multi_head_attention(x, x, x, *weights, num_heads=heads, mask=mask)
        np.testing.assert_allclose(out.data, value, rtol=RTOL, atol=ATOL, err_msg="MHA output (NumPy reference)")
        grads = numeric_grads(ref, [x] + weights, np.ones(out.shape), wrt=[0, 1, 3, 5, 7])
        named = [("input", xt)] + [(f"{n}_proj.weight", p.weight) for n, p in zip(("q", "k", "v", "out"), projs)]
        for (name, tensor), (g, _) in zip(named, grads):
            np.testing.assert_allclose(tensor.grad.data, g, rtol=1e-3, atol=1e-4,
                                       err_msg=f"MHA gradient of {name} (central differences)")
        return
    tmha = load_into_torch(mha)
    tx = torch.tensor(x, requires_grad=True)
    kw = {}
    if causal:  # torch.nn.MultiheadAttention's boolean mask means what ours means: True = NOT allowed
        kw = {"attn_mask": torch.tensor(causal_mask(t)), "is_causal": True}
    tout, _ = tmha(tx, tx, tx, need_weights=False, **kw)
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg="MHA output")
    np.testing.assert_allclose(xt.grad.data, tx.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg="MHA input gradient")
    w = tmha.in_proj_weight.grad.numpy()
    for i, proj in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
        np.testing.assert_allclose(proj.weight.grad.data, w[i * E:(i + 1) * E], rtol=1e-3, atol=1e-4,
                                   err_msg=f"gradient of {'qkv'[i]}_proj.weight")
    np.testing.assert_allclose(mha.out_proj.weight.grad.data, tmha.out_proj.weight.grad.numpy(), rtol=1e-3, atol=1e-4,
                               err_msg="gradient of out_proj.weight")


@pytest.mark.exercise("12.6", "MultiHeadAttention.split_heads")
@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 5), heads=st.sampled_from([1, 2, 3, 4]), hd=st.integers(1, 4))
def test_split_heads_is_pytorchs_layout_and_a_view(b, t, heads, hd):
    mha = MultiHeadAttention(heads * hd, heads, rng=0)
    x = np.arange(b * t * heads * hd, dtype=np.float32).reshape(b, t, heads * hd)
    out = mha.split_heads(Tensor(x))
    expected = np.stack([x[..., h * hd:(h + 1) * hd] for h in range(heads)], axis=1)   # (B, H, T, Dh)
    assert out.shape == (b, heads, t, hd), f"split_heads of {x.shape} with {heads} heads: {out.shape}; expected {(b, heads, t, hd)}"
    np.testing.assert_array_equal(out.data, expected, err_msg="head h holds features h*Dh .. (h+1)*Dh-1 of every position")
    assert np.shares_memory(out.data, x), "splitting a contiguous (B, T, E) input into heads needs no copy"


@pytest.mark.exercise("12.6", "MultiHeadAttention.merge_heads")
def test_cross_attention_shapes_and_merge_inverts_split():
    mha = MultiHeadAttention(6, 3, rng=0)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 6)))
    assert np.array_equal(mha.merge_heads(mha.split_heads(x)).data, x.data)
    mem = Tensor(np.random.default_rng(1).standard_normal((2, 7, 6)))
    assert mha(x, mem).shape == (2, 4, 6), "cross-attention: queries (2, 4, 6) over a memory of 7 positions"


@pytest.mark.parametrize("args, words", [((6, 4), ["divisible"]), ((0, 1), ["embed_dim"]), ((4, 0), ["num_heads"])])
def test_bad_configuration_is_named(args, words):
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(*args)
    for w in words:
        assert w in str(info.value), f"MultiHeadAttention{args}: the error must name {w!r}; got: {info.value}"


def test_wrong_input_width_is_named():
    with pytest.raises(ValueError, match=r"\(batch, seq, 8\).*\(2, 3, 5\)"):
        MultiHeadAttention(8, 2)(Tensor(np.ones((2, 3, 5))))


# ---------------------------------------------------------------------------------------------
# The module's rows of the shared reference table (tests/support/families.py): value and every
# input's gradient against torch, or without torch against NumPy and central differences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", params(family_rows("12"), "grad"))
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_family_rows_match_the_reference(op, data, seed):
    check_row(op, data.draw(op.inputs(), label="case"), seed)


# ---------------------------------------------------------------------------------------------
# The serving seam (given code): a KV cache, bottom-right causal attention, key padding masks
# ---------------------------------------------------------------------------------------------
def mha_weights(mha: MultiHeadAttention) -> list:
    return [a for p in (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj) for a in (p.weight.data, p.bias.data)]


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), t=st.integers(2, 9), heads=st.sampled_from([1, 2, 4]), data=st.data(),
       seed=st.integers(0, 2**16))
def test_chunked_decoding_with_a_cache_equals_the_full_causal_forward(b, t, heads, data, seed):
    """Prefill the first k tokens, then feed the rest in chunks (one at a time or more): every chunk's
    output equals the matching rows of one causal forward over the whole sequence."""
    E = heads * 2
    mha = MultiHeadAttention(E, heads, rng=seed)
    x = np.random.default_rng(seed).standard_normal((b, t, E)).astype(np.float32)
    k = data.draw(st.integers(1, t - 1), label="prefill length")
    with no_grad():
        full = mha(Tensor(x), is_causal=True).data
        cache, outs, start = ConcatCache(), [], 0
        cuts = [k] + list(range(k + 1, t + 1)) if data.draw(st.booleans(), label="one token at a time") else [k, t]
        for end in cuts:
            outs.append(mha(Tensor(x[:, start:end]), cache=cache).data)
            start = end
    assert cache.seq_len == t, f"after feeding {t} tokens the cache holds {cache.seq_len}"
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5,
                               err_msg=f"chunks {cuts} through a ConcatCache vs the full causal forward")


@pytest.mark.exercise("12.5", "scaled_dot_product_attention")
def test_cached_decoding_matches_torch_causal_lower_right():
    "Two new queries over 6 keys (4 cached), per head, as torch's sdpa with causal_lower_right sees them."
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 2, 4), (2, 3, 6, 4), (2, 3, 6, 5)))
    ours = scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), is_causal=True).data
    torch = torch_or_none()
    if torch is None:
        theirs = refs.sdpa(q, k, v, is_causal=True, causal_align="bottom_right")
    else:
        from torch.nn.attention.bias import causal_lower_right as lower_right
        theirs = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)),
                                                                  attn_mask=lower_right(2, 6)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def padded_batch(seed, b=3, t=6, e=8):
    "Inputs and a key padding mask (True = padding) with right and left padding and one full row."
    x = np.random.default_rng(seed).standard_normal((b, t, e)).astype(np.float32)
    pad = np.zeros((b, t), dtype=bool)
    pad[0, 4:] = True   # right padding
    pad[1, :2] = True   # left padding
    return x, pad       # row 2: no padding


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_matches_torch_on_the_kept_positions(causal):
    x, pad = padded_batch(0)
    mha = MultiHeadAttention(8, 2, rng=1)
    xt = Tensor(x, requires_grad=True)
    out = mha(xt, key_padding_mask=pad, is_causal=causal)
    keep = ~pad
    up = np.where(keep[..., None], 1.0, 0.0).astype(np.float32)   # the loss reads the kept positions only
    (out * Tensor(up)).sum().backward()
    assert np.isfinite(out.data).all() and np.isfinite(xt.grad.data).all(), "padding must never produce NaN or inf"
    torch = torch_or_none()
    if torch is None:
        mask = ~causal_mask(6) if causal else None
        ref = refs.multi_head_attention(x, x, x, *mha_weights(mha), num_heads=2, mask=mask, key_padding_mask=pad,
                                        empty_rows="zero")
        np.testing.assert_allclose(out.data[keep], ref[keep], rtol=1e-4, atol=1e-5, err_msg="padded MHA (NumPy reference)")
        [(g, _)] = numeric_grads(lambda x_: refs.multi_head_attention(
            x_, x_, x_, *mha_weights(mha), num_heads=2, mask=mask, key_padding_mask=pad, empty_rows="zero"),
            [x], up)
        np.testing.assert_allclose(xt.grad.data, g, rtol=1e-3, atol=1e-4, err_msg="padded MHA input gradient (central differences)")
        return
    tmha = load_into_torch(mha)
    tx = torch.tensor(x, requires_grad=True)
    kw = {"attn_mask": torch.tensor(causal_mask(6))} if causal else {}
    tout, _ = tmha(tx, tx, tx, key_padding_mask=torch.tensor(pad), need_weights=False, **kw)
    np.testing.assert_allclose(out.data[keep], tout.detach().numpy()[keep], rtol=1e-4, atol=1e-5,
                               err_msg="padded MHA vs nn.MultiheadAttention(key_padding_mask=...) on the kept positions")
    (torch.nan_to_num(tout) * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(xt.grad.data, tx.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg="padded MHA input gradient")
    # and scaled_dot_product_attention with the padding as a boolean mask, per head, as torch's sdpa
    q = np.random.default_rng(2).standard_normal((3, 2, 6, 4)).astype(np.float32)
    ours = scaled_dot_product_attention(Tensor(q), Tensor(q), Tensor(q), mask=pad[:, None, None, :], is_causal=causal).data
    allowed = torch.tensor(~pad[:, None, None, :]) & (causal_lower_right(6, 6) if causal else True)
    theirs = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, (q, q, q)), attn_mask=allowed).numpy()
    rows = ~np.isnan(theirs).any(-1)
    np.testing.assert_allclose(ours[rows], theirs[rows], rtol=1e-5, atol=1e-6, err_msg="sdpa with a padding mask vs torch")


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
def test_a_query_with_no_key_gets_a_zero_attention_output_not_nan():
    "Left padding + causal: the padding query at position 0 sees only a padding key. tinytorch: zeros (torch: NaN)."
    x, pad = padded_batch(3)
    mha = MultiHeadAttention(8, 2, rng=0)
    xt = Tensor(x, requires_grad=True)
    out = mha(xt, key_padding_mask=pad, is_causal=True)
    out.sum().backward()
    assert np.isfinite(out.data).all(), f"a padding query with no key to see must get a finite output, not NaN: {out.data[1, :2]}"
    assert np.isfinite(xt.grad.data).all(), "the input gradient must stay finite when a query sees no key"
    np.testing.assert_allclose(out.data[1, :2], np.broadcast_to(mha.out_proj.bias.data, (2, 8)), rtol=0, atol=1e-6,
                               err_msg="a query that may attend to no key: zero attention, so the output is out_proj's bias")
    q = Tensor(np.ones((1, 2, 3), np.float32), requires_grad=True)
    w = scaled_dot_product_attention(q, q, q, mask=np.array([[True, True], [False, True]]))
    w.sum().backward()
    assert w.data[0, 0].tolist() == [0.0, 0.0, 0.0] and np.isfinite(q.grad.data).all()


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
def test_left_padded_batch_decoded_with_a_cache_equals_each_sequence_alone():
    "Batched serving: two prompts of different lengths, left-padded, decoded with one cache, equal each prompt alone."
    mha = MultiHeadAttention(8, 2, rng=4)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((1, 5, 8)).astype(np.float32), rng.standard_normal((1, 3, 8)).astype(np.float32)
    batch = np.concatenate([a, np.concatenate([np.zeros((1, 2, 8), np.float32), b], axis=1)])
    pad = np.array([[False] * 5, [True, True, False, False, False]])
    nxt = rng.standard_normal((2, 2, 8)).astype(np.float32)  # two more tokens for each
    with no_grad():
        cache = ConcatCache()
        first = mha(Tensor(batch), cache=cache, key_padding_mask=pad).data
        steps = [mha(Tensor(nxt[:, i:i + 1]), cache=cache, key_padding_mask=np.pad(pad, ((0, 0), (0, i + 1)))).data
                 for i in range(2)]
        alone = [mha(Tensor(np.concatenate([s, n[None]], axis=1)), is_causal=True).data for s, n in ((a, nxt[0]), (b, nxt[1]))]
    np.testing.assert_allclose(first[0], alone[0][0, :5], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first[1, 2:], alone[1][0, :3], rtol=1e-5, atol=1e-5)
    for i in range(2):
        np.testing.assert_allclose(steps[i][0, 0], alone[0][0, 5 + i], rtol=1e-5, atol=1e-5, err_msg=f"step {i}, prompt a")
        np.testing.assert_allclose(steps[i][1, 0], alone[1][0, 3 + i], rtol=1e-5, atol=1e-5, err_msg=f"step {i}, prompt b")


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
@pytest.mark.parametrize("pad, message", [
    (np.zeros((2, 4), np.int64), "MultiHeadAttention: key_padding_mask must be boolean (True = padding, ignored); got "
                                 "dtype int64. From an attention_mask of 1 (keep) / 0 (pad) pass attention_mask == 0"),
    (np.zeros((2, 3), bool), "MultiHeadAttention: key_padding_mask must have shape (batch, keys) = (2, 4) (cached keys "
                             "included); got (2, 3)"),
])
def test_bad_key_padding_mask_is_named(pad, message):
    with pytest.raises((TypeError, ValueError)) as info:
        MultiHeadAttention(8, 2, rng=0)(Tensor(np.ones((2, 4, 8), np.float32)), key_padding_mask=pad)
    assert str(info.value) == message, f"error text: {info.value}\nexpected:   {message}"


def test_concat_cache_appends_and_names_bad_shapes():
    cache = ConcatCache()
    assert cache.seq_len == 0, f"an empty cache holds 0 positions; got {cache.seq_len}"
    k1, v1 = Tensor(np.ones((1, 2, 3, 4), np.float32)), Tensor(np.zeros((1, 2, 3, 5), np.float32))
    k, v = cache.update(k1, v1)
    assert k.shape == (1, 2, 3, 4) and v.shape == (1, 2, 3, 5) and cache.seq_len == 3, f"first update: {k.shape}, {v.shape}"
    k, v = cache.update(Tensor(np.full((1, 2, 1, 4), 2.0, np.float32)), Tensor(np.ones((1, 2, 1, 5), np.float32)))
    assert k.shape == (1, 2, 4, 4) and v.shape == (1, 2, 4, 5) and cache.seq_len == 4, f"second update: {k.shape}, {v.shape}"
    assert k.data[0, 0, :, 0].tolist() == [1, 1, 1, 2], "new keys go after the cached ones"
    with pytest.raises(ValueError, match=r"ConcatCache.update: new keys \(1, 3, 1, 4\) do not continue the cached keys \(1, 2, 4, 4\)"):
        cache.update(Tensor(np.ones((1, 3, 1, 4))), Tensor(np.ones((1, 3, 1, 5))))
    with pytest.raises(ValueError, match=r"ConcatCache.update: k and v must be \(B, H, T_new, Dh\)"):
        cache.update(Tensor(np.ones((2, 1, 4))), Tensor(np.ones((2, 1, 5))))


# ---------------------------------------------------------------------------------------------
# The systems numbers of the notebook, against the tool practitioners use
# ---------------------------------------------------------------------------------------------
class MatmulFlops:
    "The notebook's counter: 2 * (output elements) * (inner size) for every recorded matmul."

    def __init__(self):
        self.flops, self.shapes = 0, []

    def __call__(self, node, out):
        if node.op == "matmul":
            self.flops += 2 * out.size * node.inputs[0].shape[-1]
            self.shapes.append((node.inputs[0].shape, node.inputs[1].shape))


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
@pytest.mark.parametrize("b, t, e, h", [(1, 32, 64, 4), (2, 128, 64, 4), (1, 40, 24, 3)])
def test_counted_flops_equal_the_closed_form_and_torch_flop_counter(b, t, e, h):
    mha = MultiHeadAttention(e, h, rng=0)
    x = np.random.default_rng(0).standard_normal((b, t, e)).astype(np.float32)
    counter = MatmulFlops()
    with no_grad(), observe_ops(counter):
        mha(Tensor(x), is_causal=True)
    predicted = 8 * b * t * e * e + 4 * b * t * t * e
    assert counter.flops == predicted, (f"matmul FLOPs counted from the records {counter.flops:,}; closed form "
                                        f"8 B T E^2 + 4 B T^2 E = {predicted:,}")
    assert len(counter.shapes) == 6, f"4 projections + scores + weighted values: 6 matmuls; recorded {counter.shapes}"
    torch = torch_or_none()
    if torch is None:
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    tmha = load_into_torch(mha)
    flop_counter = FlopCounterMode(display=False)
    # the math backend: FlopCounterMode has no formula for torch's fused CPU attention kernel (it counts 0 there)
    with flop_counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        tmha(*(torch.tensor(x),) * 3, need_weights=False, attn_mask=torch.tensor(causal_mask(t)))
    assert flop_counter.get_total_flops() == counter.flops, (
        f"torch's FlopCounterMode counts {flop_counter.get_total_flops():,} FLOPs in nn.MultiheadAttention; the records "
        f"of ours give {counter.flops:,}")


@pytest.mark.exercise("12.7", "MultiHeadAttention.forward")
def test_a_cached_step_costs_the_predicted_flops_and_the_cache_holds_2E_numbers_per_token():
    e, h, n = 32, 4, 20
    mha = MultiHeadAttention(e, h, rng=0)
    x = np.random.default_rng(1).standard_normal((1, n, e)).astype(np.float32)
    cache = ConcatCache()
    with no_grad():
        mha(Tensor(x[:, :n - 1]), cache=cache)
        counter = MatmulFlops()
        with observe_ops(counter):
            mha(Tensor(x[:, n - 1:]), cache=cache)
    assert counter.flops == 8 * e * e + 4 * n * e, f"one cached step at position {n}: {counter.flops:,} FLOPs; predicted {8 * e * e + 4 * n * e:,}"
    assert cache.k.nbytes + cache.v.nbytes == n * 2 * e * 4, "a float32 KV cache holds 2 x E x 4 bytes per token"
    torch = torch_or_none()
    if torch is None:
        return
    from torch.utils.flop_counter import FlopCounterMode

    flop_counter = FlopCounterMode(display=False)
    with flop_counter, torch.no_grad():
        for a, b in counter.shapes:
            torch.matmul(torch.zeros(a), torch.zeros(b))
    assert flop_counter.get_total_flops() == counter.flops, f"FlopCounterMode {flop_counter.get_total_flops():,} vs records {counter.flops:,}"
