"""References that need no PyTorch: float64 NumPy formulas and float64 central differences.

PyTorch is the reference where it is installed; a student edition has no torch, and there every
comparison falls back to what this file computes, so a wrong gradient fails there too instead of
skipping. Everything here is written from the textbook definitions, independently of the course's
solutions, and trusts nothing of the package under test:

- `numeric_grads` differentiates any NumPy function by central differences in float64 and marks the
  elements where the function has a kink (a tie of a max, ReLU at 0): there the two one-sided
  differences disagree and no gradient is defined, so comparisons leave those elements out.
- The forward references of modules 05-13, one function per op family: `conv2d`, `max_pool2d`,
  `avg_pool2d`, `batch_norm_train` / `batch_norm_eval`, `layer_norm`, `embedding`, `linear`,
  `causal_allowed`, `sdpa`, `multi_head_attention`, `gelu_tanh`, and the optimizers' update rules in closed form
  (`sgd_trajectory`, `adam_trajectory` with and without decoupled weight decay).
- `reference_backend()`: "torch" or "numpy", the one switch the module tests read.

Keep the shapes small where `numeric_grads` runs: it evaluates the function twice per element.
"""
from __future__ import annotations

import math

import numpy as np

# Student float32 gradients against float64 central differences (kinks left out).
FD_RTOL, FD_ATOL = 1e-4, 1e-5


def torch_or_none():
    "The torch module, or None where it is not installed (or hidden by `tests.support.no_torch`)."
    try:
        import torch
    except ImportError:
        return None
    return torch


def reference_backend() -> str:
    "'torch' where PyTorch is importable, else 'numpy' (the references of this file)."
    return "torch" if torch_or_none() is not None else "numpy"


def fd_upstream(shape, seed: int) -> np.ndarray:
    """A float32 upstream gradient with |g| in [0.25, 1] (random signs): a kink then changes the
    one-sided differences by at least 0.25 times its jump, so `numeric_grads` cannot miss it."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.25, 1.0, shape)
    return (np.where(rng.random(shape) < 0.5, -mag, mag)).astype(np.float32)


def numeric_grads(f, args, upstream, wrt=None, rel_step: float = 1e-6, kink_tol: float = 1e-3):
    """Central-difference gradients of L = sum(f(*args) * upstream), all in float64.

    `args`: arrays (or anything else, passed as it is); `wrt`: the indices of the arrays to
    differentiate (default: every floating array). Returns a list of (gradient, defined) pairs, one
    per `wrt` index: `defined` is False where the forward and backward one-sided differences
    disagree by more than `kink_tol * (1 + |gradient|)`, i.e. where f has a kink within one step
    (ties of a max, ReLU at 0); compare only where it is True (`assert_grad_close` does).
    """
    xs = [np.array(a, dtype=np.float64, order="C") if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    if wrt is None:
        wrt = [i for i, a in enumerate(xs) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    up = np.asarray(upstream, dtype=np.float64)

    def loss() -> float:
        with np.errstate(all="ignore"):
            return float(np.sum(np.asarray(f(*xs), dtype=np.float64) * up))

    base = loss()
    out = []
    for i in wrt:
        x = xs[i]
        grad, defined = np.zeros(x.shape), np.ones(x.shape, dtype=bool)
        flat_x, flat_g, flat_d = x.reshape(-1), grad.reshape(-1), defined.reshape(-1)
        for j in range(flat_x.size):
            old = flat_x[j]
            step = rel_step * max(1.0, abs(old))
            flat_x[j] = old + step
            fp = loss()
            flat_x[j] = old - step
            fm = loss()
            flat_x[j] = old
            central = (fp - fm) / (2 * step)
            one_sided = abs((fp - base) - (base - fm)) / step
            flat_g[j] = central
            flat_d[j] = one_sided <= kink_tol * (1.0 + abs(central))
        out.append((grad, defined))
    return out


def assert_grad_close(got, expected, defined=None, *, op: str, what: str, rtol=FD_RTOL, atol=FD_ATOL,
                      reference: str = "float64 central differences", inputs=None) -> None:
    """`got` must equal `expected` wherever `defined` (kinks of the reference are left out)."""
    from .compare import _array, assert_close

    g = np.asarray(_array(got))
    e = np.asarray(_array(expected), dtype=np.float64)
    if defined is not None and g.shape == e.shape:
        e = np.where(defined, e, g.astype(np.float64))
    assert_close(g, e, op=op, what=what, rtol=rtol, atol=atol, reference=reference, inputs=inputs)


# ---------------------------------------------------------------------------------------------
# Forward references (float64), module by module
# ---------------------------------------------------------------------------------------------
def linear(x, w, b=None):
    "y[..., o] = sum_i x[..., i] w[o, i] + b[o] (PyTorch's weight layout)."
    y = np.einsum("...i,oi->...o", x, w)
    return y if b is None else y + b


def gelu_tanh(x):
    "GELU, tanh approximation (Hendrycks and Gimpel 2016, eq. 2)."
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * np.power(x, 3))))


def softmax(z, axis=-1):
    m = np.max(z, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(z - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(z, axis=-1):
    m = np.max(z, axis=axis, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), axis=axis, keepdims=True))


def cross_entropy(logits, labels):
    "Mean negative log-likelihood of integer labels under softmax(logits)."
    lp = log_softmax(logits, axis=-1)
    return -np.mean(np.take_along_axis(lp, np.asarray(labels)[..., None], axis=-1))


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d(x, w, b=None, stride=1, padding=0):
    "Cross-correlation of NCHW `x` with OIHW `w`, one einsum per kernel offset."
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    xp = np.pad(np.asarray(x, dtype=np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    _, _, kh, kw = w.shape
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    out = np.zeros((xp.shape[0], w.shape[0], oh, ow))
    for p in range(kh):
        for q in range(kw):
            patch = xp[:, :, p:p + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, p, q])
    return out if b is None else out + np.asarray(b)[None, :, None, None]


def _windows(x, kernel, stride):
    "Every pooling window of NCHW `x`: an array (N, C, OH, OW, kh*kw)."
    (kh, kw) = _pair(kernel)
    (sh, sw) = _pair(stride if stride is not None else kernel)
    oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    parts = [x[:, :, p:p + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw] for p in range(kh) for q in range(kw)]
    return np.stack(parts, axis=-1)


def max_pool2d(x, kernel, stride=None):
    return np.max(_windows(x, kernel, stride), axis=-1)


def avg_pool2d(x, kernel, stride=None):
    return np.mean(_windows(x, kernel, stride), axis=-1)


def batch_norm_train(x, weight, bias, running_mean, running_var, momentum=0.1, eps=1e-5):
    """Training-mode BatchNorm2d: (output, new running mean, new running var).

    Normalizes with the batch's biased variance; the running variance takes the unbiased one
    (Ioffe and Szegedy 2015, Algorithm 2; PyTorch's convention)."""
    axes = (0, 2, 3)
    count = x.size // x.shape[1]  # values per channel
    mean = x.mean(axis=axes)
    var = ((x - mean[None, :, None, None]) ** 2).mean(axis=axes)
    xhat = (x - mean[None, :, None, None]) / np.sqrt(var + eps)[None, :, None, None]
    y = xhat * np.asarray(weight)[None, :, None, None] + np.asarray(bias)[None, :, None, None]
    new_mean = (1 - momentum) * np.asarray(running_mean, np.float64) + momentum * mean
    new_var = (1 - momentum) * np.asarray(running_var, np.float64) + momentum * var * count / (count - 1)
    return y, new_mean, new_var


def batch_norm_eval(x, weight, bias, running_mean, running_var, eps=1e-5):
    "Eval-mode BatchNorm2d: the running statistics, never the batch's."
    c = (None, slice(None), None, None)
    return (x - np.asarray(running_mean)[c]) / np.sqrt(np.asarray(running_var)[c] + eps) * np.asarray(weight)[c] \
        + np.asarray(bias)[c]


def layer_norm(x, weight, bias, eps=1e-5):
    "LayerNorm over the last axis (biased variance, eps inside the square root)."
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def embedding(weight, ids):
    "Rows of the table: out[..., :] = weight[ids[...], :]."
    return np.asarray(weight)[np.asarray(ids)]


def embedding_grad_coo(ids, grad):
    """The table's gradient in coordinate form, as torch's coalesced `nn.Embedding(sparse=True)` gradient:
    (sorted distinct ids, the summed gradient row of each), by an explicit loop over positions."""
    ids = np.asarray(ids).reshape(-1)
    grad = np.asarray(grad, dtype=np.float64).reshape(ids.size, -1)
    rows = sorted(set(ids.tolist()))
    values = np.zeros((len(rows), grad.shape[1]))
    where = {r: i for i, r in enumerate(rows)}
    for n, r in enumerate(ids.tolist()):
        values[where[r]] += grad[n]
    return np.array(rows, dtype=np.int64), values


def sinusoidal_positions(positions, dim):
    """The encodings of "Attention Is All You Need" for the given positions, one element at a time:
    column 2i is sin(p / 10000^(2i/dim)), column 2i + 1 its cosine."""
    positions = np.asarray(positions)
    out = np.zeros(positions.shape + (dim,))
    for idx in np.ndindex(positions.shape):
        p = float(positions[idx])
        for j in range(dim):
            angle = p / 10000.0 ** ((j - j % 2) / dim)
            out[idx + (j,)] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return out


def causal_allowed(tq, tk, align="top_left"):
    """Boolean (tq, tk), True where query i may attend to key j: j <= i for "top_left" (PyTorch's
    `causal_upper_left`, the `is_causal` of `F.scaled_dot_product_attention`), j <= i + (tk - tq) for
    "bottom_right" (`causal_lower_right`: the queries are the last tq positions, as with a KV cache)."""
    return np.tril(np.ones((tq, tk), dtype=bool), k=(tk - tq) if align == "bottom_right" else 0)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, causal_align="top_left", empty_rows="nan"):
    """softmax(q k^T * scale + mask) v, as `torch.nn.functional.scaled_dot_product_attention`.

    A boolean `mask` is True where a query may attend (torch's convention for this function); a
    float mask is added to the scores; `is_causal` keeps key j for query i where
    `causal_allowed(tq, tk, causal_align)` (top-left by default, as PyTorch's flag). A query with no
    key left gets NaN (as torch) or, with `empty_rows="zero"`, a zero output (as tinytorch)."""
    d = q.shape[-1]
    s = np.einsum("...qd,...kd->...qk", q, k) * (1.0 / math.sqrt(d) if scale is None else scale)
    tq, tk = q.shape[-2], k.shape[-2]
    if is_causal:
        s = np.where(causal_allowed(tq, tk, causal_align), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if empty_rows == "zero":
        with np.errstate(invalid="ignore"):
            w = np.where(np.isneginf(s).all(axis=-1, keepdims=True), 0.0, softmax(s, axis=-1))
    else:
        w = softmax(s, axis=-1)
    return np.einsum("...qk,...kd->...qd", w, v)


def multi_head_attention(xq, xk, xv, wq, bq, wk, bk, wv, bv, wo, bo, num_heads, mask=None, is_causal=False,
                         key_padding_mask=None, causal_align="top_left", empty_rows="nan"):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2) on (B, T, E) inputs with PyTorch's
    (out, in) weights: project, split E into heads of E / H, attend per head, concatenate, project.
    `mask` and the other options are `sdpa`'s (boolean True = may attend); `key_padding_mask`
    (B, Tk) is `nn.MultiheadAttention`'s: True = a padding key that no query attends to."""
    def heads(t):
        b, n, e = t.shape
        return t.reshape(b, n, num_heads, e // num_heads).swapaxes(1, 2)

    q, k, v = heads(linear(xq, wq, bq)), heads(linear(xk, wk, bk)), heads(linear(xv, wv, bv))
    if key_padding_mask is not None:
        keep = ~np.asarray(key_padding_mask, dtype=bool)[:, None, None, :]
        if mask is None:
            mask = keep
        else:
            mask = np.asarray(mask)
            mask = (mask & keep) if mask.dtype == bool else np.where(keep, mask, -np.inf)
    o = sdpa(q, k, v, mask=mask, is_causal=is_causal, causal_align=causal_align, empty_rows=empty_rows)
    b, h, n, dh = o.shape
    return linear(o.swapaxes(1, 2).reshape(b, n, h * dh), wo, bo)


# ---------------------------------------------------------------------------------------------
# Optimizers: the update rules in closed form, one step at a time, on float64 copies
# ---------------------------------------------------------------------------------------------
def sgd_step(p, g, buf, *, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, first=False):
    """One SGD step (PyTorch's formulation, Sutskever et al. 2013 for momentum): returns (p, buf).

    d = g + wd p; b = d on the first step, else momentum b + (1 - dampening) d; the step uses
    d + momentum b (Nesterov) or b; p <- p - lr step."""
    d = g + weight_decay * p if weight_decay else g
    if momentum:
        buf = d.copy() if first or buf is None else momentum * buf + (1 - dampening) * d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf


def adam_step(p, g, m, v, t, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    """One Adam step (Kingma and Ba 2015, Algorithm 1) at step number t >= 1; `decoupled` gives
    AdamW (Loshchilov and Hutter 2019): p <- p (1 - lr wd) before the Adam update, instead of
    adding wd p to the gradient. Returns (p, m, v)."""
    b1, b2 = betas
    if decoupled:
        p = p * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


class ReferenceOptimizer:
    """The update rules above as an optimizer over arrays: `step(params, grads)` updates `params` (a
    list of arrays, in place) where the gradient is not None, PyTorch's way: a parameter without a
    gradient is left alone, its state too. `rule`: 'SGD', 'Adam' or 'AdamW' (weight_decay 0.01 by
    default, as torch.optim.AdamW). `state[k]` holds what torch.optim's state holds:
    momentum_buffer (SGD with momentum), or step, exp_avg, exp_avg_sq (Adam, AdamW). Computes in
    the parameters' dtype (float32 arrays stay float32, as the optimizers under test do)."""

    def __init__(self, rule: str, **kw):
        if rule not in ("SGD", "Adam", "AdamW"):
            raise ValueError(f"ReferenceOptimizer: unknown rule {rule!r}; expected 'SGD', 'Adam' or 'AdamW'")
        self.rule, self.kw = rule, dict(kw)
        if rule == "AdamW":
            self.kw.setdefault("weight_decay", 0.01)
        self.state: dict[int, dict] = {}

    def step(self, params, grads) -> None:
        for k, (p, g) in enumerate(zip(params, grads)):
            if g is None:
                continue
            g = np.asarray(g, dtype=p.dtype)
            if self.rule == "SGD":
                s = self.state.get(k)
                new, buf = sgd_step(p, g, None if s is None else s["momentum_buffer"], first=s is None, **self.kw)
                if self.kw.get("momentum"):
                    self.state[k] = {"momentum_buffer": np.asarray(buf, dtype=p.dtype)}
            else:
                s = self.state.setdefault(k, {"step": 0, "exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)})
                s["step"] += 1
                new, s["exp_avg"], s["exp_avg_sq"] = adam_step(p, g, s["exp_avg"], s["exp_avg_sq"], s["step"],
                                                               decoupled=self.rule == "AdamW", **self.kw)
            p[...] = new


def max_pool2d_grad(x, kernel, stride, upstream):
    """The input gradient of max pooling with each window's gradient routed to its *first* maximum
    (row-major order inside the window, PyTorch's CPU convention for ties)."""
    (kh, kw), (sh, sw) = _pair(kernel), _pair(stride if stride is not None else kernel)
    n, c, oh, ow = upstream.shape
    grad = np.zeros(x.shape)
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].reshape(n, c, -1)
            first = np.argmax(win, axis=-1)
            for b in range(n):
                for ch in range(c):
                    p, q = divmod(int(first[b, ch]), kw)
                    grad[b, ch, i * sh + p, j * sw + q] += upstream[b, ch, i, j]
    return grad


def transformer_block(x, p: dict, num_heads: int, prefix: str = ""):
    """A pre-norm GPT block (GPT-2's layout) from parameters named as tinytorch names them:
    x + attn(ln1(x)) with a causal mask, then x + proj(gelu(fc(ln2(x))))."""
    def w(name):
        return p[prefix + name]

    t = x.shape[-2]
    h = layer_norm(x, w("ln1.weight"), w("ln1.bias"))
    x = x + multi_head_attention(h, h, h, *(w(f"attn.{n}_proj.{k}") for n in "qkv" for k in ("weight", "bias")),
                                 w("attn.out_proj.weight"), w("attn.out_proj.bias"), num_heads,
                                 mask=np.tril(np.ones((t, t), dtype=bool)))
    h = gelu_tanh(linear(layer_norm(x, w("ln2.weight"), w("ln2.bias")), w("mlp.fc.weight"), w("mlp.fc.bias")))
    return x + linear(h, w("mlp.proj.weight"), w("mlp.proj.bias"))


def gpt_logits(ids, p: dict, num_heads: int, num_layers: int, start_pos: int = 0):
    """GPT logits from parameters by their documented names (token + learned position embeddings of positions
    start_pos.., blocks, ln_f, head)."""
    ids = np.asarray(ids)
    x = embedding(p["tok_emb.weight"], ids) + np.asarray(p["pos_emb.weight"])[start_pos:start_pos + ids.shape[1]]
    for i in range(num_layers):
        x = transformer_block(x, p, num_heads, prefix=f"blocks.{i}.")
    return linear(layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]), p["head.weight"])


# ---------------------------------------------------------------------------------------------
# Module 08: schedules and gradient clipping in closed form
# ---------------------------------------------------------------------------------------------
def step_lr(base, epoch, step_size, gamma):
    "StepLR: the rate decays by `gamma` once per completed block of `step_size` epochs."
    return base * gamma ** math.floor(epoch / step_size)


def cosine_lr(base, epoch, t_max, eta_min=0.0):
    "CosineAnnealingLR's closed form (SGDR, Loshchilov and Hutter 2017, eq. 5 without restarts)."
    return eta_min + 0.5 * (base - eta_min) * (1.0 + np.cos(np.pi * epoch / t_max))


def linear_warmup_lr(base, epoch, warmup, start_factor):
    "LinearLR from `start_factor` to 1 over `warmup` epochs, then constant."
    frac = min(epoch, warmup) / warmup
    return base * (start_factor + (1.0 - start_factor) * frac)


def clip_by_total_norm(grads, max_norm):
    """(clipped copies, total norm): the global L2 norm over every gradient (None skipped); all are
    scaled by max_norm / (norm + 1e-6) when that is below 1 (PyTorch's clip_grad_norm_)."""
    present = [np.asarray(g, dtype=np.float64) for g in grads if g is not None]
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in present))
    factor = min(1.0, max_norm / (norm + 1e-6))
    return [None if g is None else np.asarray(g, dtype=np.float64) * factor for g in grads], norm


# ---------------------------------------------------------------------------------------------
# Module 19: the statistics of benchmarking, written from their definitions
# ---------------------------------------------------------------------------------------------
def bootstrap_percentile_interval(statistic, resamples, confidence):
    """The percentile-bootstrap interval: the `50 (1 -+ confidence)` percentiles of `statistic` over the rows of
    `resamples` (Efron and Tibshirani, 1993, ch. 13; `scipy.stats.bootstrap(method="percentile")`)."""
    values = np.array([statistic(row) for row in np.asarray(resamples, dtype=np.float64)])
    lo, hi = np.percentile(values, [50 * (1 - confidence), 50 * (1 + confidence)])
    return float(lo), float(hi)


def dominated(costs):
    """Row i of `costs` (every column a cost to minimize) is dominated when some row j is no larger in every
    column and smaller in one: the definition, one pair of rows at a time."""
    c = np.asarray(costs, dtype=np.float64)
    return [any(np.all(c[j] <= c[i]) and np.any(c[j] < c[i]) for j in range(len(c))) for i in range(len(c))]


def three_outcomes(low, high, target, at_least=True):
    """An engineer's verdict on a target from an interval: "met" when the whole interval satisfies it, "not met"
    when no point of it does, else "too noisy to tell" (the interval straddles the target)."""
    ok = (lambda v: v >= target) if at_least else (lambda v: v <= target)
    if ok(low) and ok(high):
        return "met"
    if not ok(low) and not ok(high):
        return "not met"
    return "too noisy to tell"
