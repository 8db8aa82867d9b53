"""Probes of module 10 (tokenization): see tito/probes/__init__.py. 10.4-10.6 replay the reference's recorded
outcomes of `count_pairs` and `merge_pair` (the issue's one-character `merge_pair` bug is then charged to 10.3 only)."""
import numpy as np

from . import probe

PAIRS = ("count_pairs", "merge_pair")
TEXT = ("the quick brown fox jumps over the lazy dog; the dog sleeps. "
        "naïve café — 東京 and emoji 🙂🙂 too! ") * 3


def _words(rng, n=12, vocab=6):
    return [[int(i) for i in rng.integers(0, vocab, size=int(rng.integers(1, 8)))] for _ in range(n)]


@probe("10.1")
def char_tokenizer(rng, rec):
    from tinytorch.text.tokenizers import CharTokenizer

    chars = "".join(sorted(set(TEXT[:60])))
    tok = rec.call("tok", CharTokenizer, chars, special_tokens=("<eos>",), unk_token="<unk>")
    if tok is not None:
        rec.call("itos", lambda: list(tok.itos))
        rec.call("stoi", lambda: dict(tok.stoi))
        rec.call("vocab_size", lambda: tok.vocab_size)
        rec.call("enc", tok.encode, "the lazy fox<eos>")
        rec.call("enc_unk", tok.encode, "ZZ top<eos>x")
        ids = [int(i) for i in rng.integers(0, len(chars), size=20)]
        rec.call("dec", tok.decode, ids)
        rec.call("dec_special", tok.decode, ids[:3] + [len(chars)])
        rec.call("dec_bad", tok.decode, [10 ** 6])
    plain = rec.call("plain", CharTokenizer, "abc")
    if plain is not None:
        rec.call("plain_unknown", plain.encode, "abd")
        rec.call("plain_enc", plain.encode, "cab")
    rec.call("from_text", lambda: CharTokenizer.from_text("hello world").encode("low"))


@probe("10.2")
def count_pairs(rng, rec):
    from tinytorch.text.tokenizers import count_pairs as cp

    words = _words(rng)
    freqs = [int(f) for f in rng.integers(1, 5, size=len(words))]
    rec.call("weighted", cp, words, freqs)
    rec.call("plain", cp, words)
    rec.call("overlap", cp, [[7, 7, 7], (7, 7)], [2, 1])
    rec.call("short", cp, [[1], []])


@probe("10.3")
def merge_pair(rng, rec):
    from tinytorch.text.tokenizers import merge_pair as mp

    for i in range(6):
        ids = [int(v) for v in rng.integers(0, 4, size=int(rng.integers(0, 15)))]
        pair = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
        rec.call(f"m{i}", lambda ids=ids, pair=pair: list(mp(ids, pair, 99)))
    ids = [7, 7, 7, 1, 2, 1, 2, 2]
    rec.call("overlap", lambda: list(mp(ids, (7, 7), 9)))
    rec["not_modified"] = ids
    rec.call("tail", lambda: list(mp([1, 2, 1], (2, 1), 5)))
    rec.call("tuple_in", lambda: list(mp((1, 2, 1, 2), (1, 2), 5)))


@probe("10.4", replay=PAIRS)
def train_naive(rng, rec):
    from tinytorch.text.tokenizers import train_merges_naive

    words = [list(w.encode()) for w in TEXT.split()]
    freqs = [int(f) for f in rng.integers(1, 4, size=len(words))]
    calls = []
    rec.call("merges", train_merges_naive, words, freqs, 25, 256, lambda k, p, c: calls.append([k, list(p), c]))
    rec["callback"] = calls
    rec.call("early_stop", train_merges_naive, [[1, 2], [3]], [1, 1], 10)
    rec["words_kept"] = words[:3]


def _tokenizer():
    from tinytorch.text.tokenizers import BPETokenizer

    tok = BPETokenizer()
    tok.train(TEXT, vocab_size=256 + 40, special_tokens=("<|endoftext|>",))
    return tok


@probe("10.5", replay=PAIRS)
def decode(rng, rec):
    tok = _tokenizer()
    ids = [int(i) for i in rng.integers(0, 256 + 40, size=25)]
    rec.call("ids", tok.decode, ids)
    rec.call("text", tok.decode, list("café 🙂".encode()) + [256 + 40])
    emoji = list("🙂".encode())
    rec.call("cut_replace", tok.decode, emoji[:1] + [104, 105])
    rec.call("cut_strict", tok.decode, emoji[:2], errors="strict")
    rec.call("bad_id", tok.decode, [10 ** 6])


@probe("10.6", replay=PAIRS)
def encode_chunk(rng, rec):
    tok = _tokenizer()
    for i, piece in enumerate(TEXT.split()[:12] + [" the", " dog", "🙂🙂", "東京"]):
        rec.call(f"c{i}", lambda p=piece: list(tok.encode_chunk(p.encode())))
    rec.call("empty", lambda: list(tok.encode_chunk(b"")))
    rec.call("roundtrip", lambda: tok.decode([i for p in TEXT.split() for i in tok.encode_chunk(p.encode())]))
