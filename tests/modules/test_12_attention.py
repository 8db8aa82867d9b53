"""Module 12 (attention): `tinytorch.core.attention` against PyTorch.

Scaled dot-product attention (plain, causal, boolean and additive masks) is compared with
`torch.nn.functional.scaled_dot_product_attention`, forward and the gradients of q, k and v, on
hypothesis-drawn shapes; multi-head attention with `torch.nn.MultiheadAttention(batch_first=True)`
loaded with the same weights. Causality is a property: changing a future token never changes the
outputs at earlier positions. Without PyTorch (a student edition) the same tests compare with the
NumPy references of `tests/support/refs.py` (`sdpa`, `multi_head_attention`) and float64 central
differences for the gradients, so nothing skips.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from tinytorch.core.tensor import Tensor
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
    if torch is None:
        fn = lambda *a: refs.sdpa(*a, **kw)  # noqa: E731
        grads = numeric_grads(fn, [q, k, v], up)
        return out, ours, Reference(fn(q, k, v)), [Reference(g, g, ok) for g, ok in grads]
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    tkw = dict(kw)
    if "mask" in tkw:
        tkw["attn_mask"] = torch.tensor(tkw.pop("mask"))
    tout = torch.nn.functional.scaled_dot_product_attention(*theirs, **tkw)
    (tout * torch.tensor(up)).sum().backward()
    return out, ours, tout, theirs


def assert_same(out, ours, tout, theirs, what):
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{what}: output")
    for name, a, b in zip("qkv", ours, theirs):
        expected = _grad_view(b, a.grad.data) if isinstance(b, Reference) else b.grad.numpy()
        np.testing.assert_allclose(a.grad.data, expected, rtol=RTOL, atol=ATOL, err_msg=f"{what}: gradient of {name}")


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    assert_same(*run_both(q, k, v), f"attention of shapes {shapes}")


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_causal_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q_shape, k_shape, v_shape = shapes
    k_shape = k_shape[:-2] + (q_shape[-2],) + k_shape[-1:]   # torch's is_causal needs Tq <= Tk to be row-safe
    v_shape = v_shape[:-2] + (q_shape[-2],) + v_shape[-1:]
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, k_shape, v_shape))
    assert_same(*run_both(q, k, v, is_causal=True), f"causal attention of shapes {(q_shape, k_shape, v_shape)}")


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
@PROPERTY
@given(shapes=qkv_shapes(), seed=st.integers(0, 2**16))
def test_sdpa_boolean_mask_matches_torch(shapes, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    mask = rng.random((q.shape[-2], k.shape[-2])) < 0.6
    mask[:, 0] = True                     # every query may attend to something (else NaN in both)
    assert_same(*run_both(q, k, v, mask=mask), f"masked attention of shapes {shapes}")


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
def test_sdpa_additive_mask_matches_torch():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 3), (2, 5, 3), (2, 5, 2)))
    bias = rng.standard_normal((4, 5)).astype(np.float32)
    assert_same(*run_both(q, k, v, mask=bias), "attention with an additive float mask")


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
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


@pytest.mark.exercise("12.1", "scaled_dot_product_attention")
def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(3, 5\)"):
        scaled_dot_product_attention(Tensor(np.ones((2, 4))), Tensor(np.ones((3, 5))), Tensor(np.ones((3, 2))))


def test_causal_mask_is_lower_triangular():
    m = causal_mask(3, 4)
    assert m.dtype == bool and m.tolist() == [[True, False, False, False], [True, True, False, False], [True, True, True, False]]


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


@pytest.mark.exercise("12.2", "MultiHeadAttention.split_heads")
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
        mask = causal_mask(t) if causal else None

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
    if causal:  # torch.nn.MultiheadAttention's boolean mask means the opposite: True = NOT allowed
        kw = {"attn_mask": torch.tensor(~causal_mask(t)), "is_causal": True}
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


@pytest.mark.exercise("12.2", "MultiHeadAttention.merge_heads")
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
        assert w in str(info.value)


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
