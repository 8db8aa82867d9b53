"""Probes of module 12 (attention): see tito/probes/__init__.py. 12.2's multi-head forward runs the reference
`scaled_dot_product_attention` (split_heads and merge_heads are the student's)."""
import numpy as np

from . import probe


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _grads(rng, out, *inputs):
    from tinytorch.core.tensor import Tensor

    (out * Tensor(f32(rng, *out.shape))).sum().backward()
    return [None if t.grad is None else t.grad.data for t in inputs]


@probe("12.1")
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
    allowed = rng.random((5, 5)) > 0.3
    allowed[:, 0] = True
    rec.call("bool_mask", attn, q, k, v, mask=allowed)
    rec.call("float_mask", attn, q, k, v, mask=f32(rng, 5, 5))
    rec.call("both", attn, q, k, v, mask=allowed, is_causal=True)
    nothing = np.ones((5, 5), dtype=bool)
    nothing[2] = False
    rec.call("empty_row", attn, q, k, v, mask=nothing)
    q, k, v = qkv(1, tq=3, tk=7)
    rec.call("rect_causal", attn, q, k, v, is_causal=True)
    rec.call("bcast", attn, Tensor(f32(rng, 2, 3, 4, 4)), Tensor(f32(rng, 1, 1, 6, 4)), Tensor(f32(rng, 1, 1, 6, 2)))
    rec.call("arrays", attn, f32(rng, 3, 4), f32(rng, 5, 4), f32(rng, 5, 2))
    rec.call("bad", attn, Tensor(f32(rng, 2, 3, 4)), Tensor(f32(rng, 2, 3, 5)), Tensor(f32(rng, 2, 3, 5)))


@probe("12.2", uses=("scaled_dot_product_attention",))
def mha(rng, rec):
    from tinytorch.core.attention import MultiHeadAttention
    from tinytorch.core.tensor import Tensor

    m = MultiHeadAttention(8, 2, rng=int(rng.integers(0, 2 ** 30)))
    x = Tensor(f32(rng, 2, 5, 8), requires_grad=True)
    rec.call("split", m.split_heads, x)
    rec.call("merge", m.merge_heads, Tensor(f32(rng, 2, 2, 5, 4)))
    rec.call("roundtrip", lambda: m.merge_heads(m.split_heads(x)))
    rec.call("self", m, x)
    rec.call("causal", m, x, is_causal=True)
    rec.call("grads", lambda: _grads(rng, m(x, is_causal=True), x, m.q_proj.weight, m.out_proj.weight))
    mem = Tensor(f32(rng, 2, 7, 8))
    rec.call("cross", m, x, mem)
    m4 = MultiHeadAttention(12, 4, rng=1)
    rec.call("four_heads", m4, Tensor(f32(rng, 1, 3, 12)))
