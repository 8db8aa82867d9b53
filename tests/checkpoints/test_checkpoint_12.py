"""Checkpoint 12: can attention learn to look back?

Modules 01-06, 11 and 12 together: a one-layer causal self-attention model (token + learned
position embeddings, multi-head attention, a Linear head) is trained with plain gradient descent
on a task only attention can solve: output, at every position, the token seen two steps earlier.
It must reach at least 90% accuracy on fresh sequences, and give the same predictions when it
decodes one token at a time through a KV cache (`ConcatCache`) as when it reads the whole sequence.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.attention import ConcatCache, MultiHeadAttention
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.text.embeddings import Embedding, LearnedPositionalEmbedding

pytestmark = pytest.mark.module("12")

V, T, E = 8, 10, 32


def batch(rng, n=64):
    x = rng.integers(0, V, (n, T))
    y = np.roll(x, 2, axis=1)
    return x, y


def test_attention_learns_to_copy_from_two_steps_back():
    tok, pos = Embedding(V, E, rng=0), LearnedPositionalEmbedding(T, E, rng=1)
    attn, head = MultiHeadAttention(E, 4, rng=2), Linear(E, V, rng=3)
    params = tok.parameters() + pos.parameters() + attn.parameters() + head.parameters()

    def forward(x):
        h = pos(tok(x))
        return head(attn(h, is_causal=True) + h)

    rng = np.random.default_rng(0)
    m = [np.zeros_like(p.data) for p in params]
    for step in range(300):
        x, y = batch(rng)
        logits = forward(x)[:, 2:]
        loss = CrossEntropyLoss()(logits.reshape(-1, V), y[:, 2:].reshape(-1))
        for p in params:
            p.grad = None
        loss.backward()
        with no_grad():
            for p, buf in zip(params, m):
                buf *= 0.9
                buf += p.grad.data
                p.data -= 0.05 * buf
    x, y = batch(np.random.default_rng(99), 256)
    with no_grad():
        pred = forward(x).data[:, 2:].argmax(-1)
    acc = (pred == y[:, 2:]).mean()
    assert acc >= 0.9, f"copying the token two steps back: accuracy {acc:.1%} after 300 steps; expected >= 90%"
    with no_grad():   # the same model, one token at a time through a KV cache (the serving path)
        full = forward(x[:8]).data
        cache, steps = ConcatCache(), []
        for t in range(T):
            h = tok(x[:8, t:t + 1]) + pos.weight[t:t + 1]   # the new token at its position t
            steps.append((head(attn(h, cache=cache) + h)).data)
    cached = np.concatenate(steps, axis=1)
    assert np.allclose(cached, full, atol=1e-4), (
        f"decoding through a ConcatCache differs from the full forward by {np.abs(cached - full).max():.2e}")
    assert (cached.argmax(-1) == full.argmax(-1)).all(), "cached decoding must predict the same tokens"
