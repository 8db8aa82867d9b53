"""Checkpoint 11: can token ids from the bundled corpus become trainable vectors?

Modules 01-06 and 11 together: the bundled story corpus is turned into character ids, embedded
with token + learned position tables, projected back to the vocabulary with a Linear layer, and
trained for a few steps of plain gradient descent on next-character prediction. The loss must
fall, and only the table rows of characters that occurred may have changed; embedding the text in
chunks (each at its `start_pos`, as a cached generator will) gives the whole sequence's vectors.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.data.loader import load_text_corpus
from tinytorch.text.embeddings import Embedding, LearnedPositionalEmbedding

pytestmark = pytest.mark.module("11")


def test_next_character_model_learns_and_touches_only_used_rows():
    text = load_text_corpus()[:4000]
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.int64)
    vocab, dim, seq = len(chars) + 5, 16, 16      # 5 ids that never occur
    tok, pos, head = Embedding(vocab, dim, rng=0), LearnedPositionalEmbedding(seq, dim, rng=1), Linear(dim, vocab, rng=2)
    params = tok.parameters() + pos.parameters() + head.parameters()
    start = tok.weight.data.copy()
    rng = np.random.default_rng(0)
    losses = []
    for step in range(60):
        starts = rng.integers(0, len(ids) - seq - 1, 32)
        x = np.stack([ids[s:s + seq] for s in starts])
        y = np.stack([ids[s + 1:s + seq + 1] for s in starts])
        logits = head(pos(tok(x)))
        loss = CrossEntropyLoss()(logits.reshape(-1, vocab), y.reshape(-1))
        for p in params:
            p.grad = None
        loss.backward()
        with no_grad():
            for p in params:
                p.data -= 0.5 * p.grad.data
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 0.5, \
        f"the loss should fall by more than 0.5 nats in 60 steps; first {np.mean(losses[:5]):.3f}, last {np.mean(losses[-10:]):.3f}"
    unused = np.arange(len(chars), vocab)
    np.testing.assert_array_equal(tok.weight.data[unused], start[unused],
                                  err_msg="rows of ids that never occur must not change (their gradient is zero)")
    with no_grad():
        x = ids[None, :seq]
        whole = pos(tok(x)).data
        chunks = [pos(tok(x[:, a:b]), start_pos=a).data for a, b in ((0, 5), (5, 6), (6, seq))]
    np.testing.assert_allclose(np.concatenate(chunks, axis=1), whole, rtol=0, atol=1e-6,
                               err_msg="chunks embedded at their start_pos must equal the whole sequence")
