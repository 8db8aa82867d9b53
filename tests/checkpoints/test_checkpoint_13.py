"""Checkpoint 13: does a GPT built from your modules learn text and generate it?

Modules 01-06 and 11-13 together: a one-block character-level GPT trained for a few seconds on the
bundled story corpus (plain momentum SGD written inline, so only modules up to 13 are used) must
drive its loss well below the uniform guess, then generate text that is reproducible with a seed
and made of characters of the corpus. Then the trained model is served the way module 18 will: greedy
decoding token by token with one `ConcatCache` per block (the prompt once, then one token per step at
`start_pos`) must give exactly `generate`'s tokens, and a left-padded batch of two prompts the same
next token as each prompt alone.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.attention import ConcatCache
from tinytorch.core.autograd import no_grad
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.data.loader import load_text_corpus
from tinytorch.models.gpt import GPT

pytestmark = pytest.mark.module("13")


def test_tiny_gpt_learns_the_corpus_and_generates():
    text = load_text_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    V, T = len(chars), 16
    model = GPT(V, T, 48, 4, 1, rng=0)
    params = model.parameters()
    bufs = [np.zeros_like(p.data) for p in params]
    rng = np.random.default_rng(0)
    losses = []
    for step in range(150):
        starts = rng.integers(0, len(ids) - T - 1, 32)
        x = np.stack([ids[s:s + T] for s in starts])
        y = np.stack([ids[s + 1:s + T + 1] for s in starts])
        loss = CrossEntropyLoss()(model(x).reshape(-1, V), y.reshape(-1))
        for p in params:
            p.grad = None
        loss.backward()
        with no_grad():
            for p, b in zip(params, bufs):
                b *= 0.9
                b += p.grad.data
                p.data -= 0.1 * b
        losses.append(loss.item())
    uniform = np.log(V)
    assert np.mean(losses[-20:]) < uniform - 1.2, \
        f"after 150 steps the loss is {np.mean(losses[-20:]):.2f} nats; expected below log(V) - 1.2 = {uniform - 1.2:.2f}"
    prompt = np.array([[stoi[c] for c in "Once upon a"]])
    a = model.generate(prompt, 40, temperature=0.8, top_k=10, seed=1)
    b = model.generate(prompt, 40, temperature=0.8, top_k=10, seed=1)
    assert np.array_equal(a, b), "generation with the same seed must be reproducible"
    sample = "".join(chars[i] for i in a[0])
    assert sample.startswith("Once upon a") and len(sample) == 51, sample

    model.eval()
    greedy = model.generate(prompt[:, -8:], 8, temperature=0)
    seq = prompt[:, -8:].copy()
    with no_grad():
        caches = [ConcatCache() for _ in model.blocks]
        logits = model(seq, cache=caches).data[:, -1]
        for step in range(8):
            nxt = logits.argmax(-1)[:, None]
            seq = np.concatenate([seq, nxt], axis=1)
            if step < 7:
                logits = model(nxt, start_pos=seq.shape[1] - 1, cache=caches).data[:, -1]
    np.testing.assert_array_equal(seq, greedy, err_msg="cached greedy decoding must give generate's tokens")
    short = np.array([[stoi[c] for c in "upon"]])
    batch = np.concatenate([prompt[:, -8:], np.concatenate([np.zeros((1, 4), np.int64), short], axis=1)])
    mask = np.ones((2, 8), np.int64)
    mask[1, :4] = 0
    with no_grad():
        both = model(batch, attention_mask=mask).data[:, -1].argmax(-1)
        alone = [model(prompt[:, -8:]).data[0, -1].argmax(), model(short).data[0, -1].argmax()]
    assert both.tolist() == [int(a) for a in alone], f"padded batch predicts {both.tolist()}, each prompt alone {alone}"
