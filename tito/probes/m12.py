"""Probes of module 12 (attention): see tito/probes/__init__.py. Replayed (one bug charged once): 12.4 the
reference's recorded outcomes of `MaskedSoftmax.forward`; 12.5 of the mask and the softmax (the scores join the
autograd graph: the student's own `attention_scores` runs); 12.7 also of `scaled_dot_product_attention`,
`split_heads` and `merge_heads` where their results can be given back."""
import numpy as np

from . import probe

SOFTMAX = ("MaskedSoftmax.forward", "MaskedSoftmax.backward")
PARTS = ("attention_scores", "causal_mask") + SOFTMAX


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _grads(rng, out, *inputs):
    from tinytorch.core.tensor import Tensor

    (out * Tensor(f32(rng, *out.shape))).sum().backward()
    return [None if t.grad is None else t.grad.data for t in inputs]


@probe("12.1", messages=True)
def scores(rng, rec):
    from tinytorch.core.attention import attention_scores
    from tinytorch.core.tensor import Tensor

    rec.call("example", attention_scores, Tensor([[1.0, 0.0], [0.0, 2.0]]), Tensor([[1.0, 1.0], [3.0, 0.0], [0.0, 0.0]]))
    q, k = f32(rng, 2, 3, 4, 8), f32(rng, 2, 3, 5, 8)
    rec.call("heads", attention_scores, q, k)
    tq, tk = Tensor(q, requires_grad=True), Tensor(k, requires_grad=True)
    rec.call("grads", lambda: _grads(rng, attention_scores(tq, tk), tq, tk))
    rec.call("bcast", attention_scores, Tensor(f32(rng, 2, 1, 3, 4)), Tensor(f32(rng, 1, 2, 6, 4)))
    rec.call("f64", attention_scores, Tensor(rng.standard_normal((3, 5)), dtype=np.float64),
             Tensor(rng.standard_normal((2, 5)), dtype=np.float64))
    rec.call("bad", attention_scores, q, k[..., :3])


@probe("12.2", messages=True)
def mask(rng, rec):
    from tinytorch.core.attention import causal_mask

    sizes = [(1, 1), (3, None), (4, 4), (2, 4), (1, 7), (3, 8), (int(rng.integers(2, 6)), int(rng.integers(6, 10)))]
    for q, k in sizes:
        rec.call(f"br{q}_{k}", causal_mask, q, k)
        rec.call(f"tl{q}_{k}", causal_mask, q, k, align="top_left")
    rec.call("tl_tall", causal_mask, 5, 3, align="top_left")
    rec.call("br_tall", causal_mask, 3, 2)
    rec.call("bad_align", causal_mask, 2, 3, align="bottom-right")
    rec.call("bad_len", causal_mask, 0)


@probe("12.3")
def softmax_forward(rng, rec):
    from tinytorch.core.attention import MaskedSoftmax
    from tinytorch.core.tensor import Tensor

    def run(s, m=None):
        with np.errstate(all="ignore"):
            return MaskedSoftmax.apply(Tensor(s), m)
    rec.call("example", run, np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]], np.float32),
             np.array([[False, False, True], [True, True, True]]))
    s = f32(rng, 2, 4, 6)
    rec.call("plain", run, s)
    m = rng.random((4, 6)) < 0.5
    m[0] = True
    rec.call("masked", run, s, m)
    rec.call("huge", run, np.array([[1e4, -1e4, 0.0], [0.0, 1e4, 3.0]], np.float32),
             np.array([[True, False, False], [False, False, True]]))
    rec.call("big", run, f32(rng, 3, 5) * 1e3)
    rec.call("neg_inf", run, np.array([[0.0, -np.inf], [-np.inf, -np.inf]], np.float32))
    rec.call("f64", run, rng.standard_normal((3, 4)) * 50, rng.random((3, 4)) < 0.3)

    def strict(s, m=None):  # the contract: no overflow, 0 / 0 or inf - inf anywhere (a FloatingPointError here)
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            return MaskedSoftmax.apply(Tensor(s), m)
    rec.call("strict_huge", strict, np.array([[1e4, -1e4, 0.0], [0.0, 1e4, 3.0]], np.float32),
             np.array([[True, False, False], [False, False, True]]))
    rec.call("strict_inf", strict, np.array([[0.0, -np.inf], [-np.inf, -np.inf]], np.float32))
    rec.call("strict_all_masked", strict, f32(rng, 2, 3), np.ones((2, 3), dtype=bool))


@probe("12.4", replay=("MaskedSoftmax.forward",))
def softmax_backward(rng, rec):
    from tinytorch.core.attention import MaskedSoftmax
    from tinytorch.core.tensor import Tensor

    mask = np.array([[False, False, True, False], [True, True, True, True], [False, True, False, False]])
    s = Tensor(f32(rng, 2, 3, 4), requires_grad=True)
    rec.call("masked", lambda: _grads(rng, MaskedSoftmax.apply(s, mask), s))
    s2 = Tensor(rng.standard_normal((4, 5)) * 3, dtype=np.float64, requires_grad=True)
    rec.call("plain_f64", lambda: _grads(rng, MaskedSoftmax.apply(s2, None), s2))
    s3 = Tensor(f32(rng, 2, 2, 5), requires_grad=True)
    rec.call("bcast_mask", lambda: _grads(rng, MaskedSoftmax.apply(s3, rng.random((1, 5)) < 0.4), s3))


@probe("12.5", replay=PARTS)
def sdpa(rng, rec):
    from tinytorch.core.attention import scaled_dot_product_attention as attn
    from tinytorch.core.tensor import Tensor

    def qkv(*lead, tq=5, tk=5, d=4, dv=3):
        return [Tensor(f32(rng, *lead, t, dd), requires_grad=True) for t, dd in ((tq, d), (tk, d), (tk, dv))]
    q, k, v = qkv(2)
    rec.call("plain", attn, q, k, v)
    rec.call("plain_grads", lambda: _grads(rng, attn(q, k, v), q, k, v))
    q, k, v = qkv(2, 3, tq=4, tk=6)
    rec.call("heads", attn, q, k, v)
    q, k, v = qkv(2, 2)
    rec.call("causal", attn, q, k, v, is_causal=True)
    rec.call("causal_grads", lambda: _grads(rng, attn(q, k, v, is_causal=True), q, k, v))
    masked = rng.random((5, 5)) < 0.3
    masked[:, 0] = False
    rec.call("bool_mask", attn, q, k, v, mask=masked)
    rec.call("float_mask", attn, q, k, v, mask=f32(rng, 5, 5))
    bias = np.zeros((5, 5), np.float32)
    bias[:, 1] = -np.inf
    rec.call("inf_bias", attn, q, k, v, mask=bias)
    rec.call("both", attn, q, k, v, mask=masked, is_causal=True)
    nothing = np.zeros((5, 5), dtype=bool)
    nothing[2] = True
    rec.call("empty_row", attn, q, k, v, mask=nothing)
    q, k, v = qkv(1, tq=3, tk=7)
    rec.call("rect_causal", attn, q, k, v, is_causal=True)
    rec.call("rect_causal_grads", lambda: _grads(rng, attn(q, k, v, is_causal=True), q, k, v))
    rec.call("bcast", attn, Tensor(f32(rng, 2, 3, 4, 4)), Tensor(f32(rng, 1, 1, 6, 4)), Tensor(f32(rng, 1, 1, 6, 2)))
    rec.call("arrays", attn, f32(rng, 3, 4), f32(rng, 5, 4), f32(rng, 5, 2))
    rec.call("tall_causal", attn, f32(rng, 4, 2), f32(rng, 2, 2), f32(rng, 2, 2), is_causal=True)
    rec.call("bad", attn, Tensor(f32(rng, 2, 3, 4)), Tensor(f32(rng, 2, 3, 5)), Tensor(f32(rng, 2, 3, 5)))


@probe("12.6")
def heads(rng, rec):
    from tinytorch.core.attention import MultiHeadAttention
    from tinytorch.core.tensor import Tensor

    m = MultiHeadAttention(8, 2, rng=int(rng.integers(0, 2 ** 30)))
    x = Tensor(f32(rng, 2, 5, 8), requires_grad=True)
    rec.call("split", m.split_heads, x)
    rec.call("merge", m.merge_heads, Tensor(f32(rng, 2, 2, 5, 4)))
    rec.call("roundtrip", lambda: m.merge_heads(m.split_heads(x)))
    rec.call("grads", lambda: _grads(rng, m.merge_heads(m.split_heads(x)), x))
    m3 = MultiHeadAttention(6, 3, rng=1)
    x3 = Tensor(f32(rng, 1, 4, 6), requires_grad=True)
    rec.call("split3", m3.split_heads, x3)
    rec.call("merge3", m3.merge_heads, Tensor(f32(rng, 1, 3, 4, 2)))
    rec.call("split_grads", lambda: _grads(rng, m3.split_heads(x3), x3))


@probe("12.7", replay=PARTS + ("scaled_dot_product_attention", "MultiHeadAttention.split_heads",
                             "MultiHeadAttention.merge_heads"))
def mha(rng, rec):
    from tinytorch.core.attention import ConcatCache, MultiHeadAttention
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor

    m = MultiHeadAttention(8, 2, rng=int(rng.integers(0, 2 ** 30)))
    xa = f32(rng, 2, 5, 8)
    x = Tensor(xa, requires_grad=True)
    rec.call("self", m, x)
    rec.call("causal", m, x, is_causal=True)
    rec.call("grads", lambda: _grads(rng, m(x, is_causal=True), x, m.q_proj.weight, m.k_proj.weight,
                                     m.v_proj.weight, m.out_proj.weight, m.out_proj.bias))
    mem = Tensor(f32(rng, 2, 7, 8))
    rec.call("cross", m, x, mem)
    rec.call("cross_kv", m, x, mem, Tensor(f32(rng, 2, 7, 8)))
    masked = rng.random((5, 5)) < 0.3
    masked[:, 0] = False
    rec.call("mask", m, x, mask=masked)

    def cached():
        with no_grad():
            cache = ConcatCache()
            return [m(Tensor(xa[:, :3]), cache=cache)] + [m(Tensor(xa[:, t:t + 1]), cache=cache) for t in (3, 4)]
    rec.call("cached", cached)
    pad = np.array([[False] * 5, [True, True, False, False, False]])
    rec.call("padding", m, Tensor(xa), key_padding_mask=pad, is_causal=True)
    rec.call("padding_mask", m, Tensor(xa), mask=masked, key_padding_mask=pad)
    m4 = MultiHeadAttention(12, 4, rng=1)
    rec.call("four_heads", m4, Tensor(f32(rng, 1, 3, 12)), is_causal=True)
    rec.call("bad", m, Tensor(np.ones((2, 3, 5), np.float32)))
