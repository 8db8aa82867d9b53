"""The reference table of modules 09-13: one row per op family, as `ops.py` is for 01-04.

Each row (an `Op`) gives the tinytorch call, the NumPy reference of `refs.py`, the torch call, the
inputs it is defined on (small shapes, so that central differences stay cheap) and the exercises
that write its forward and backward passes. `check_row` checks one drawn case: the value and the
gradient of every input against torch where it is installed, else against the NumPy reference and
float64 central differences, so the same test catches a wrong gradient in a student edition.

    @pytest.mark.parametrize("op", params(family_rows("09"), "grad"))
    @given(data=st.data(), seed=st.integers(0, 2**16))
    def test_family_rows_match_the_reference(op, data, seed):
        check_row(op, data.draw(op.inputs()), seed)

Modules 05-08 have no op of their own (data loading, optimizers, training): their references are
the closed forms of `refs.py` (`ReferenceOptimizer`, the schedules, `clip_by_total_norm`).
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from . import refs
from .ops import Case, Op, grad_leaves, ref_value_and_grads, torch_args, torch_kwargs, tt_args
from .strategies import Domain, laid_out

NORMAL = Domain(-2.0, 2.0)


def _F():
    import torch.nn.functional as F
    return F


def _t():
    import torch
    return torch


def _spread(x: np.ndarray, seed: int) -> np.ndarray:
    """`x` plus unit noise, in place (its memory layout kept): normalizing a constant channel or row
    divides rounding noise by sqrt(eps), a case no float32 implementation gets to 1e-4."""
    np.add(x, np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype), out=x)
    return x


def _rng_arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


# ---------------------------------------------------------------------------------------------
# Inputs (small: every gradient element costs two reference evaluations without torch)
# ---------------------------------------------------------------------------------------------
@st.composite
def _conv_case(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h, w = draw(st.integers(max(1, kh - 2 * ph), 5)), draw(st.integers(max(1, kw - 2 * pw), 5))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    x = draw(laid_out((n, c, h, w), NORMAL), label="x")
    wt, b = _rng_arrays(draw(st.integers(0, 2**16)), (o, c, kh, kw), (o,))
    return Case((x, wt, b), (True,) * 3, (True,) * 3, {"stride": (sh, sw), "padding": (ph, pw)})


@st.composite
def _pool_case(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 2), st.integers(1, 2))))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(kh, 5)), draw(st.integers(kw, 5)))
    return Case((draw(laid_out(shape, NORMAL), label="x"),), (True,), (True,), {"kernel": (kh, kw), "stride": stride})


@st.composite
def _bn_case(draw, eval_mode: bool):
    c = draw(st.integers(1, 3))
    shape = (draw(st.integers(1, 3)), c, draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    if shape[0] * shape[2] * shape[3] < 2:
        shape = (2,) + shape[1:]
    seed = draw(st.integers(0, 2**16))
    x = _spread(draw(laid_out(shape, NORMAL), label="x"), seed)
    assume(float(np.min(x.std(axis=(0, 2, 3)))) > 0.1)  # a well-conditioned normalization
    rng = np.random.default_rng(seed + 1)
    w, b = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    if not eval_mode:
        return Case((x, w, b), (True,) * 3, (True,) * 3)
    rm, rv = rng.standard_normal(c).astype(np.float32), rng.uniform(0.2, 3.0, c).astype(np.float32)
    return Case((x, w, b, rm, rv), (True, True, True, False, False), (True, True, True, False, False))


@st.composite
def _ln_case(draw):
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    d = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**16))
    x = _spread(draw(laid_out(lead + (d,), Domain(-3.0, 3.0)), label="x"), seed)
    assume(float(np.min(x.std(axis=-1))) > 0.1)  # a well-conditioned normalization
    w, b = _rng_arrays(seed + 1, (d,), (d,))
    return Case((x, w, b), (True,) * 3, (True,) * 3)


@st.composite
def _embedding_case(draw):
    v, d = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    ids_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    ids = np.asarray(draw(st.lists(st.integers(0, v - 1), min_size=int(np.prod(ids_shape)),
                                   max_size=int(np.prod(ids_shape))), label="ids"), np.int64).reshape(ids_shape)
    [w] = _rng_arrays(draw(st.integers(0, 2**16)), (v, d))
    return Case((w, ids), (True, False), (True, False))


@st.composite
def _sdpa_case(draw):
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    tq, d, dv = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["none", "causal", "bool", "float"]))
    tk = draw(st.integers(tq, 4) if kind == "causal" else st.integers(1, 4))  # causal: bottom-right, Tk >= Tq
    seed = draw(st.integers(0, 2**16))
    q, k, v = _rng_arrays(seed, batch + (tq, d), batch + (tk, d), batch + (tk, dv))
    rng = np.random.default_rng(seed + 1)
    kwargs = {}
    if kind == "causal":
        kwargs["is_causal"] = True
    elif kind == "bool":
        mask = rng.random((tq, tk)) < 0.6
        mask[:, 0] = True  # every query attends to something
        kwargs["mask"] = mask
    elif kind == "float":
        kwargs["mask"] = rng.standard_normal((tq, tk)).astype(np.float32)
    return Case((q, k, v), (True,) * 3, (True,) * 3, kwargs)


@st.composite
def _mha_case(draw):
    heads, hd = draw(st.sampled_from([1, 2])), draw(st.integers(1, 2))
    e = heads * hd
    b, t = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    arrays = _rng_arrays(seed, (b, t, e), *[s for _ in range(4) for s in ((e, e), (e,))])
    arrays = [arrays[0]] + [a * np.float32(0.5) for a in arrays[1:]]
    return Case(tuple(arrays), (True,) * 9, (True,) * 9, {"num_heads": heads, "is_causal": draw(st.booleans())})


# ---------------------------------------------------------------------------------------------
# tinytorch and torch calls
# ---------------------------------------------------------------------------------------------
def _tt_conv(x, w, b, stride, padding):
    from tinytorch.core.spatial import Conv2dFunction
    return Conv2dFunction.apply(x, w, b, stride=stride, padding=padding)


def _tt_pool(cls):
    def call(x, kernel, stride):
        from tinytorch.core import spatial
        return getattr(spatial, cls)(kernel, stride)(x)
    return call


def _tt_bn(x, w, b, rm=None, rv=None):
    from tinytorch.core.spatial import BatchNorm2d
    bn = BatchNorm2d(x.shape[1])
    bn.weight, bn.bias = w, b  # the case's leaves, so their gradients can be read
    if rm is not None:
        bn.running_mean.data[...] = rm
        bn.running_var.data[...] = rv
        bn.eval()
    return bn(x)


def _torch_bn(x, w, b, rm=None, rv=None):
    return _F().batch_norm(x, rm, rv, w, b, training=rm is None)


def _tt_ln(x, w, b):
    from tinytorch.models.gpt import LayerNormFunction
    return LayerNormFunction.apply(x, w, b)


def _tt_embedding(w, ids):
    from tinytorch.text.embeddings import EmbeddingLookup
    return EmbeddingLookup.apply(w, ids)


def _tt_sdpa(q, k, v, mask=None, is_causal=False):
    "tinytorch's attention on a case drawn in torch's mask convention (boolean True = may attend)."
    from tinytorch.core.attention import scaled_dot_product_attention
    if mask is not None and np.asarray(mask).dtype == bool:
        mask = ~np.asarray(mask)  # tinytorch's boolean masks say True = masked, as nn.MultiheadAttention
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)


def _ref_sdpa(q, k, v, mask=None, is_causal=False):
    return refs.sdpa(q, k, v, mask=mask, is_causal=is_causal, causal_align="bottom_right")


def _torch_sdpa(q, k, v, mask=None, is_causal=False):
    if is_causal:  # tinytorch's is_causal is bottom-right aligned (torch's flag is top-left): pass the mask
        torch = _t()
        tq, tk = q.shape[-2], k.shape[-2]
        return _F().scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq))
    return _F().scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _tt_mha(x, wq, bq, wk, bk, wv, bv, wo, bo, num_heads, is_causal):
    from tinytorch.core.attention import MultiHeadAttention
    mha = MultiHeadAttention(x.shape[-1], num_heads)
    for proj, w, b in ((mha.q_proj, wq, bq), (mha.k_proj, wk, bk), (mha.v_proj, wv, bv), (mha.out_proj, wo, bo)):
        proj.weight, proj.bias = w, b
    return mha(x, is_causal=is_causal)


def _torch_mha(x, wq, bq, wk, bk, wv, bv, wo, bo, num_heads, is_causal):
    torch = _t()
    t = x.shape[1]
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1) if is_causal else None
    xt = x.transpose(0, 1)  # (T, B, E): the functional form's layout
    out, _ = _F().multi_head_attention_forward(
        xt, xt, xt, x.shape[-1], num_heads, torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv]), None, None, False, 0.0,
        wo, bo, training=False, need_weights=False, attn_mask=mask)
    return out.transpose(0, 1)


def _ref_mha(x, wq, bq, wk, bk, wv, bv, wo, bo, num_heads, is_causal):
    t = x.shape[1]
    mask = np.tril(np.ones((t, t), dtype=bool)) if is_causal else None
    return refs.multi_head_attention(x, x, x, wq, bq, wk, bk, wv, bv, wo, bo, num_heads, mask=mask)


FAMILIES: list[Op] = [
    Op("conv2d", _tt_conv, refs.conv2d, lambda x, w, b, stride, padding: _F().conv2d(x, w, b, stride=stride,
       padding=padding), _conv_case, "09", ("9.2", "conv2d_forward"), ("9.3", "Conv2dFunction.backward"),
       None, atol=1e-4),
    Op("max_pool2d", _tt_pool("MaxPool2d"), refs.max_pool2d, lambda x, kernel, stride: _F().max_pool2d(x, kernel, stride),
       _pool_case, "09", ("9.5", "MaxPool2dFunction.forward"), ("9.5", "MaxPool2dFunction.backward"), None),
    Op("avg_pool2d", _tt_pool("AvgPool2d"), refs.avg_pool2d, lambda x, kernel, stride: _F().avg_pool2d(x, kernel, stride),
       _pool_case, "09", ("9.6", "AvgPool2dFunction.forward"), ("9.6", "AvgPool2dFunction.backward"), None),
    Op("batch_norm_train", _tt_bn, lambda x, w, b: refs.batch_norm_train(x, w, b, 0.0, 1.0)[0], _torch_bn,
       lambda: _bn_case(False), "09", ("9.7", "BatchNorm2d.forward"), ("9.7", "BatchNorm2dFunction.backward"),
       None, rtol=1e-3, atol=2e-4),
    Op("batch_norm_eval", _tt_bn, refs.batch_norm_eval, _torch_bn, lambda: _bn_case(True), "09",
       ("9.7", "BatchNorm2d.forward"), ("9.7", "BatchNorm2dFunction.backward"), None, atol=1e-4),
    Op("embedding", _tt_embedding, refs.embedding, lambda w, ids: _F().embedding(ids, w), _embedding_case, "11",
       ("11.1", "EmbeddingLookup.forward"), ("11.2", "EmbeddingLookup.backward"), None),
    Op("sdpa", _tt_sdpa, _ref_sdpa, _torch_sdpa, _sdpa_case, "12", ("12.5", "scaled_dot_product_attention"),
       ("12.4", "MaskedSoftmax.backward"), None, atol=1e-5),
    Op("multi_head_attention", _tt_mha, _ref_mha, _torch_mha, _mha_case, "12", ("12.7", "MultiHeadAttention.forward"),
       ("12.7", "MultiHeadAttention.forward"), None, atol=1e-5),
    Op("layer_norm", _tt_ln, refs.layer_norm, lambda x, w, b: _F().layer_norm(x, (x.shape[-1],), w, b), _ln_case,
       "13", ("13.1", "LayerNormFunction.forward"), ("13.2", "LayerNormFunction.backward"), None,
       rtol=1e-3, atol=1e-4),
]
FAMILY_BY_NAME = {op.name: op for op in FAMILIES}


def family_rows(module: str | None = None) -> list[Op]:
    return [op for op in FAMILIES if module is None or op.module == module]


def check_row(op: Op, case: Case, seed: int, rtol: float = 1e-4, grad_atol: float = 1e-4) -> None:
    """The row's value and the gradient of every input that requires grad, for one drawn case: against
    torch where it is installed, else against the NumPy reference and float64 central differences
    (elements at a kink of the reference left out). A row's own `rtol` applies where it is looser
    (normalizations divide by a standard deviation that can be small)."""
    from .compare import assert_close, to_torch

    rtol = max(rtol, op.rtol)
    ins = case.describe()
    tt = tt_args(case, requires_grad=True)
    out = op.tt(*tt, **case.kwargs)
    assert out.requires_grad, f"{op.name}: the result on inputs with requires_grad=True must require grad"
    g = refs.fd_upstream(out.shape, seed)
    out.backward(g)
    torch = refs.torch_or_none()
    if torch is None:
        value, grads = ref_value_and_grads(op, case, g)
        expected = [(e, ok) for e, ok in grads]
        reference = "NumPy and float64 central differences"
    else:
        th = torch_args(case, requires_grad=True)
        tout = op.torch(*th, **torch_kwargs(case))
        tout.backward(to_torch(g))
        value = tout
        leaves = [a for a, gr in zip(th, case.grad) if gr]
        expected = [(torch.zeros_like(a) if a.grad is None else a.grad, None) for a in leaves]
        reference = "torch"
    assert_close(out, value, op=op.name, what="forward value", inputs=ins, rtol=rtol, atol=max(op.atol, 1e-5),
                 dtype=np.float32, reference=reference)
    for (label, leaf), (e, ok) in zip(grad_leaves(case, tt), expected):
        assert leaf.grad is not None, f"{op.name}: {label}.grad is None after backward(); expected a gradient"
        refs.assert_grad_close(leaf.grad, e, ok, op=f"{op.name} backward", what=f"gradient of {label}", inputs=ins,
                               rtol=rtol, atol=grad_atol, reference=reference)
