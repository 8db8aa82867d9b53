"""Checkpoint 10: can your tokenizer turn the bundled corpus into training data for a language model?

Uses modules 01 (Tensor), 05 (the corpus, TensorDataset, DataLoader) and 10 (tokenizers) together.
A byte-level BPE tokenizer of 512 ids is trained on the stories joined by `<|endoftext|>`; it must
round-trip the whole corpus, beat bytes and characters on sequence length, survive a save/load
cycle, and its ids must drive a next-token dataset: windows of ids batched by a DataLoader,
looked up in an embedding table with Tensor indexing, and decoded back to the exact text slices
they came from.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, TensorDataset, load_text_corpus
from tinytorch.text.tokenizers import BPETokenizer, CharTokenizer

pytestmark = pytest.mark.module("10")

EOT = "<|endoftext|>"


@lru_cache(maxsize=None)
def setup():
    stories = [s.strip() for s in load_text_corpus().split("\n\n") if s.strip()]
    text = EOT.join(stories)
    tok = BPETokenizer().train(text, 512, special_tokens=[EOT])
    return stories, text, tok, tok.encode(text)


def test_the_corpus_round_trips_and_is_compressed():
    stories, text, tok, ids = setup()
    assert tok.vocab_size == 512 and tok.special_tokens == {EOT: 511}
    assert tok.decode(ids) == text, "decode(encode(corpus)) must give the corpus back exactly"
    assert ids.count(511) == len(stories) - 1, "one <|endoftext|> id between consecutive stories"
    n_bytes = len(text.encode("utf-8"))
    chars = CharTokenizer.from_text(text, special_tokens=[EOT])
    n_chars = len(chars.encode(text))
    assert n_bytes / len(ids) > 2.0, f"512 ids should carry over 2 bytes per token on this corpus; got {n_bytes / len(ids):.2f}"
    assert len(ids) < n_chars / 2, f"BPE 512 gave {len(ids)} tokens vs {n_chars} characters"
    assert chars.decode(chars.encode(text)) == text


def test_saved_tokenizer_encodes_identically(tmp_path):
    _, text, tok, ids = setup()
    tok.save(tmp_path / "tok.json")
    assert BPETokenizer.load(tmp_path / "tok.json").encode(text) == ids


def test_ids_feed_a_next_token_dataset_and_an_embedding_table():
    _, text, tok, ids = setup()
    context = 16
    arr = np.asarray(ids, dtype=np.int64)
    n = (len(arr) - 1) // context
    x = arr[: n * context].reshape(n, context)
    y = arr[1: n * context + 1].reshape(n, context)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, seed=0)
    table = Tensor(np.random.default_rng(0).standard_normal((tok.vocab_size, 8)).astype(np.float32))
    seen = 0
    for xb, yb in loader:
        assert xb.shape[1] == context and np.array_equal(xb.data[:, 1:], yb.data[:, :-1]), "targets are inputs shifted by one"
        vectors = table[xb.data]
        assert vectors.shape == (xb.shape[0], context, 8), f"embedding lookup gave {vectors.shape}"
        np.testing.assert_array_equal(vectors.data[0, 3], table.data[xb.data[0, 3]])
        seen += xb.shape[0]
    assert seen == n
    assert text.startswith(tok.decode(x.reshape(-1))), "the windows, decoded in order, are the start of the corpus"
    start = len(tok.decode(arr[: (n - 1) * context + 1]))    # the text before the last target window
    assert text[start:].startswith(tok.decode(y[-1])), "the last target window decodes to the text that follows"
