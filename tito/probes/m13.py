"""Probes of module 13 (transformers): see tito/probes/__init__.py. Replayed (one bug charged once): 13.2 the
reference's recorded outcomes of `LayerNormFunction.forward`; 13.3 of `LayerNormFunction`; 13.5 also of
`TransformerBlock.forward`; 13.6 also of `GPT.forward` and `sample_next` (where their results can be given back).
13.4 (sampling) is checked statistically in the trusted process."""
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
    from tinytorch.models.gpt import LayerNorm, LayerNormFunction

    ln = LayerNorm(6)
    ln.weight.data[:] = rng.uniform(0.5, 2, 6)
    ln.bias.data[:] = f32(rng, 6)
    x = Tensor(f32(rng, 2, 3, 6) * 3 + 1)
    rec.call("out", ln, x)
    small = Tensor(np.array([[1.0, 2.0, 3.0]], np.float32))
    ones, zeros = Tensor(np.ones(3, np.float32)), Tensor(np.zeros(3, np.float32))
    rec.call("example", LayerNormFunction.apply, small, ones, zeros)
    rec.call("eps", LayerNormFunction.apply, small, ones, zeros, eps=1.0)
    rec.call("eps_small", LayerNorm(4, eps=0.5), Tensor((f32(rng, 3, 4) * 0.1).astype(np.float32)))
    rec.call("f64", lambda: LayerNorm(3)(Tensor(rng.standard_normal((2, 3)), dtype=np.float64)))
    rec.call("big_mean", lambda: LayerNorm(5)(Tensor(f32(rng, 4, 5) + 1000.0)))


@probe("13.2", replay=("LayerNormFunction.forward",), rtol=1e-3, atol=1e-5)
def layernorm_backward(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.models.gpt import LayerNorm

    ln = LayerNorm(6)
    ln.weight.data[:] = rng.uniform(0.5, 2, 6)
    ln.bias.data[:] = f32(rng, 6)
    x = Tensor(f32(rng, 2, 3, 6) * 3 + 1, requires_grad=True)
    rec.call("grads", lambda: _grads(rng, ln(x), x, ln.weight, ln.bias))
    big_eps = LayerNorm(4, eps=0.5)
    small = Tensor((f32(rng, 3, 4) * 0.1).astype(np.float32), requires_grad=True)
    rec.call("eps_grads", lambda: _grads(rng, big_eps(small), small, big_eps.weight, big_eps.bias))
    ln64 = LayerNorm(5)
    x64 = Tensor(rng.standard_normal((4, 5)), dtype=np.float64, requires_grad=True)
    rec.call("f64_grads", lambda: _grads(rng, ln64(x64), x64, ln64.weight))


def _block(rng, dropout=0.0):
    from tinytorch.models.gpt import TransformerBlock

    return TransformerBlock(8, 2, dropout=dropout, rng=int(rng.integers(0, 2 ** 30)))


@probe("13.3", replay=LN)
def block(rng, rec):
    from tinytorch.core.attention import ConcatCache
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor

    b = _block(rng)
    xa = f32(rng, 2, 5, 8)
    x = Tensor(xa, requires_grad=True)
    rec.call("out", b, x)
    rec.call("grads", lambda: _grads(rng, b(x), x, b.ln1.weight, b.ln2.weight, b.attn.q_proj.weight,
                                     b.mlp.fc.weight))
    y = f32(rng, 1, 5, 8)
    z = y.copy()
    z[0, 3:] = f32(rng, 2, 8)  # changing later positions must not change earlier outputs
    rec.call("causal_a", b, Tensor(y))
    rec.call("causal_b", b, Tensor(z))

    def cached():
        with no_grad():
            cache = ConcatCache()
            return [b(Tensor(xa[:, :3]), cache=cache), b(Tensor(xa[:, 3:]), cache=cache), cache.seq_len]
    rec.call("cached", cached)
    pad = np.zeros((2, 5), dtype=bool)
    pad[1, :2] = True
    rec.call("padding", b, Tensor(xa), key_padding_mask=pad)
    d = _block(rng, dropout=0.5)
    x2 = Tensor(f32(rng, 2, 4, 8))
    rec.call("dropout_train", d, x2)
    d.eval()
    rec.call("dropout_eval", d, x2)


N_DRAWS = 4000
ROW = np.array([0.0, 1.0, 1.5, -1.0, 0.5])
SAMPLED = {"t1": (1.0, None), "t05": (0.5, None), "t2": (2.0, None), "k2": (1.0, 2), "k3t": (0.7, 3), "k9": (1.0, 9)}


def _sample_check(got, want):
    from . import compare, Probe

    exact = Probe("13.4", "13", None)
    for key in want:
        if key in SAMPLED or key in ("seed_a", "seed_b", "gen_a", "gen_b"):
            continue
        why = compare(got[key], want[key], exact, key)
        if why:
            return why
    row = want["row"].a
    for key, (tau, k) in SAMPLED.items():
        g = got[key]
        if not hasattr(g, "a") or g.a.shape != (N_DRAWS,) or g.a.dtype.kind not in "iu":
            return f"{key}: expected {N_DRAWS} integer token ids"
        if g.a.min() < 0 or g.a.max() >= row.size:
            return f"{key}: token ids outside 0..{row.size - 1}"
        z = row / tau
        keep = np.ones(row.size, bool) if k is None or k >= row.size else z >= np.sort(z)[-k]
        p = np.where(keep, np.exp(z - z.max()), 0.0)
        p /= p.sum()
        freq = np.bincount(g.a, minlength=row.size) / N_DRAWS
        if (freq[~keep] > 0).any():
            return f"{key} (temperature {tau}, top_k {k}): tokens outside the top {k} were sampled"
        if np.abs(freq - p).max() > 0.04:
            return (f"{key} (temperature {tau}, top_k {k}): sampled frequencies {freq.round(3).tolist()}, "
                    f"expected about {p.round(3).tolist()}")
    if not np.array_equal(got["seed_a"].a, got["seed_b"].a):
        return "the same seed gave different draws"
    if np.array_equal(got["gen_a"].a, got["gen_b"].a):
        return "two calls with one Generator gave the same draws: the Generator passed in must be used (and advance)"
    return ""


@probe("13.4", check=_sample_check)
def sample(rng, rec):
    from tinytorch.models.gpt import sample_next

    rec["row"] = ROW
    logits = f32(rng, 3, 6)
    rec.call("greedy", sample_next, logits, temperature=0)
    rec.call("greedy_tensor", lambda: sample_next(logits.astype(np.float64), 0))
    rec.call("top1", sample_next, logits, top_k=1, rng=int(rng.integers(0, 2 ** 30)))
    rec.call("cold", sample_next, logits * 10, temperature=1e-4, rng=1)
    for key, (tau, k) in SAMPLED.items():
        rec.call(key, sample_next, np.tile(ROW, (N_DRAWS, 1)), temperature=tau, top_k=k,
                 rng=int(rng.integers(0, 2 ** 30)))
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("seed_a", sample_next, np.tile(ROW, (50, 1)), rng=seed)
    rec.call("seed_b", sample_next, np.tile(ROW, (50, 1)), rng=seed)
    gen = np.random.default_rng(int(rng.integers(0, 2 ** 30)))
    rec.call("gen_a", sample_next, np.tile(ROW, (50, 1)), rng=gen)
    rec.call("gen_b", sample_next, np.tile(ROW, (50, 1)), rng=gen)
    rec.call("bad_k", sample_next, logits, top_k=0)
    rec.call("bad_temp", sample_next, logits, temperature=-1.0)
    rec.call("bad_shape", sample_next, ROW)


def _gpt(rng, vocab=11, ctx=8):
    from tinytorch.models.gpt import GPT

    return GPT(vocab, ctx, 16, 2, 2, rng=int(rng.integers(0, 2 ** 30)))


@probe("13.5", replay=LN + ("TransformerBlock.forward",), rtol=1e-3, atol=1e-5)
def gpt_forward(rng, rec):
    from tinytorch.core.attention import ConcatCache
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor

    g = _gpt(rng)
    g.eval()
    idx = rng.integers(0, 11, size=(2, 6))
    rec.call("logits", g, idx)
    rec.call("tensor_ids", g, Tensor(idx))
    rec.call("full", g, rng.integers(0, 11, size=(1, 8)))
    rec.call("too_long", g, rng.integers(0, 11, size=(1, 9)))
    rec.call("start_pos", g, idx[:, 2:4], start_pos=2)

    def cached():
        with no_grad():
            caches = [ConcatCache() for _ in g.blocks]
            return [g(idx[:, :4], cache=caches), g(idx[:, 4:5], start_pos=4, cache=caches),
                    g(idx[:, 5:], start_pos=5, cache=caches)]
    rec.call("cached", cached)
    padded = np.concatenate([np.zeros((2, 2), dtype=np.int64), idx], axis=1)
    mask = np.concatenate([np.zeros((2, 2)), np.ones((2, 6))], axis=1).astype(np.int64)
    mask[0, :2] = 1
    rec.call("left_pad", g, padded, attention_mask=mask)
    rec.call("right_pad", g, padded[:, ::-1].copy(), attention_mask=mask[:, ::-1].copy())
    g.train()
    rec.call("grads", lambda: _grads(rng, g(idx), g.tok_emb.weight, g.pos_emb.weight, g.ln_f.weight, g.head.weight))


@probe("13.6", replay=LN + ("TransformerBlock.forward", "GPT.forward", "sample_next"))
def generate(rng, rec):
    g = _gpt(rng, vocab=7, ctx=4)
    idx = rng.integers(0, 7, size=(2, 3))
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("greedy", g.generate, idx, 7, temperature=0)
    rec.call("sample", g.generate, idx, 10, seed=seed)
    rec.call("same_seed", g.generate, idx, 10, seed=seed)
    rec.call("temp", g.generate, idx, 10, temperature=0.3, seed=seed)
    rec.call("hot", g.generate, idx, 10, temperature=3.0, seed=seed)
    rec.call("top3", g.generate, idx, 12, top_k=3, seed=seed)
    rec.call("top1", g.generate, idx, 5, top_k=1, seed=seed)
    rec.call("tensor_in", lambda: g.generate(idx[:1], 3, seed=seed))
    rec["mode_after"] = bool(g.training)
    g.eval()
    rec.call("mode_kept", lambda: (g.generate(idx, 1, seed=1), bool(g.training))[1])
    g.train()
    rec.call("bad_temp", g.generate, idx, 2, temperature=-1.0)
    rec.call("bad_k", g.generate, idx, 2, top_k=0)
    rec["mode_after_error"] = bool(g.training)
    # with dropout in the model, a loop left in training mode samples from a different, random model: greedy
    # tokens differ from the eval-mode model's
    from tinytorch.models.gpt import GPT

    d = GPT(7, 4, 16, 2, 2, dropout=0.5, rng=int(rng.integers(0, 2 ** 30)))
    rec.call("dropout_model_greedy", d.generate, idx, 8, temperature=0)
