"""Probes of module 13 (transformers): see tito/probes/__init__.py. Substitutes (one bug charged once): 13.2
runs the reference LayerNormFunction; 13.3 also the reference TransformerBlock.forward; 13.4 also the
reference GPT.forward."""
import numpy as np

from . import probe

LN = ("LayerNormFunction.forward", "LayerNormFunction.backward")


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _grads(rng, out, *inputs):
    from tinytorch.core.tensor import Tensor

    (out * Tensor(f32(rng, *out.shape))).sum().backward()
    return [None if t.grad is None else t.grad.data for t in inputs]


@probe("13.1")
def layernorm(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.models.gpt import LayerNorm

    ln = LayerNorm(6)
    ln.weight.data[:] = rng.uniform(0.5, 2, 6)
    ln.bias.data[:] = f32(rng, 6)
    x = Tensor(f32(rng, 2, 3, 6) * 3 + 1, requires_grad=True)
    rec.call("out", ln, x)
    rec.call("grads", lambda: _grads(rng, ln(x), x, ln.weight, ln.bias))
    big_eps = LayerNorm(4, eps=0.5)
    small = Tensor((f32(rng, 3, 4) * 0.1).astype(np.float32), requires_grad=True)
    rec.call("eps", big_eps, small)
    rec.call("eps_grads", lambda: _grads(rng, big_eps(small), small, big_eps.weight))
    rec.call("f64", lambda: LayerNorm(3)(Tensor(rng.standard_normal((2, 3)), dtype=np.float64)))


def _block(rng, dropout=0.0):
    from tinytorch.models.gpt import TransformerBlock

    return TransformerBlock(8, 2, dropout=dropout, rng=int(rng.integers(0, 2 ** 30)))


@probe("13.2", uses=LN)
def block(rng, rec):
    from tinytorch.core.tensor import Tensor

    b = _block(rng)
    x = Tensor(f32(rng, 2, 5, 8), requires_grad=True)
    rec.call("out", b, x)
    rec.call("grads", lambda: _grads(rng, b(x), x, b.ln1.weight, b.attn.q_proj.weight))
    y = f32(rng, 1, 5, 8)
    z = y.copy()
    z[0, 3:] = f32(rng, 2, 8)  # changing later positions must not change earlier outputs
    rec.call("causal_a", b, Tensor(y))
    rec.call("causal_b", b, Tensor(z))
    d = _block(rng, dropout=0.5)
    x2 = Tensor(f32(rng, 2, 4, 8))
    rec.call("dropout_train", d, x2)
    d.eval()
    rec.call("dropout_eval", d, x2)


def _gpt(rng):
    from tinytorch.models.gpt import GPT

    return GPT(11, 8, 16, 2, 2, rng=int(rng.integers(0, 2 ** 30)))


@probe("13.3", uses=LN + ("TransformerBlock.forward",))
def gpt_forward(rng, rec):
    from tinytorch.core.tensor import Tensor

    g = _gpt(rng)
    g.eval()
    idx = rng.integers(0, 11, size=(2, 6))
    rec.call("logits", g, idx)
    rec.call("tensor_ids", g, Tensor(idx))
    rec.call("full", g, rng.integers(0, 11, size=(1, 8)))
    rec.call("too_long", g, rng.integers(0, 11, size=(1, 9)))
    g.train()
    rec.call("grads", lambda: _grads(rng, g(idx), g.tok_emb.weight, g.head.weight))


@probe("13.4", uses=LN + ("TransformerBlock.forward", "GPT.forward"))
def generate(rng, rec):
    g = _gpt(rng)
    idx = rng.integers(0, 11, size=(2, 3))
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("greedy", g.generate, idx, 7, temperature=0)
    rec.call("sample", g.generate, idx, 10, seed=seed)
    rec.call("same_seed", g.generate, idx, 10, seed=seed)
    rec.call("temp", g.generate, idx, 10, temperature=0.3, seed=seed)
    rec.call("hot", g.generate, idx, 10, temperature=3.0, seed=seed)
    rec.call("top3", g.generate, idx, 12, top_k=3, seed=seed)
    rec.call("top1", g.generate, idx, 5, top_k=1, seed=seed)
    rec["mode_after"] = bool(g.training)
    g.eval()
    rec.call("mode_kept", lambda: (g.generate(idx, 1, seed=1), bool(g.training))[1])
    rec.call("bad_temp", g.generate, idx, 2, temperature=-1.0)
    rec.call("bad_k", g.generate, idx, 2, top_k=0)
