"""Module 10 (tokenization): the exported `tinytorch.text.tokenizers` checked against references written here.

The references are deliberately plain: pair counts with `collections.Counter`, a merge written as
a different loop, a BPE trainer that recounts everything and picks the winner with `max` and the
tie rule spelled out, and encoding by replaying every merge in order. Hypothesis draws arbitrary
Unicode text (`st.text()`: emoji, combining marks, NUL, any plane) for the round trip
`decode(encode(s)) == s`, and random small "corpora" on which the naive trainer, the incremental
trainer and the reference must learn the same merges.

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("10.6",
"BPETokenizer.encode_chunk")`: run one exercise with
`pytest tests/modules/test_10_tokenization.py --exercise 10.6`. Tests of the given code (input
checks, save/load, the incremental trainer) carry no exercise mark.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import load_text_corpus
from tinytorch.text.tokenizers import (
    SPLIT_PATTERN,
    BPETokenizer,
    CharTokenizer,
    count_pairs,
    merge_pair,
    most_frequent_pair,
    split_special,
    train_merges_incremental,
    train_merges_naive,
)

pytestmark = pytest.mark.module("10")

PROPERTY = settings(max_examples=60, deadline=None)
EOT = "<|endoftext|>"
AWKWARD = ["", "\x00", "a\x00b", "👍🏽", "e\u0301", "日本語のテキスト", "naïve café", "  \n\t x", "__init__",
           "it's 'll 've", "1234567890", EOT, f"a{EOT}b", f"{EOT}{EOT}", "<|endoftext", "\U0010ffff\uffff"]


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------
def ref_count(words, freqs):
    counts = Counter()
    for w, f in zip(words, freqs):
        for i in range(len(w) - 1):
            counts[(w[i], w[i + 1])] += f
    return dict(counts)


def ref_merge(ids, pair, new_id):
    out, skip = [], False
    for i, x in enumerate(ids):
        if skip:
            skip = False
        elif i + 1 < len(ids) and (x, ids[i + 1]) == tuple(pair):
            out.append(new_id)
            skip = True
        else:
            out.append(x)
    return out


def ref_train(words, freqs, n_merges, first_id=256):
    "BPE by the book: recount, take the highest count (ties: smallest a, then smallest b), merge everywhere."
    words = [list(w) for w in words]
    merges = []
    for k in range(n_merges):
        counts = ref_count(words, freqs)
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        merges.append(pair)
        words = [ref_merge(w, pair, first_id + k) for w in words]
    return merges


def ref_encode_piece(tok, data: bytes):
    "Encode one piece by applying every learned merge, in order, to the whole byte sequence."
    ids = list(data)
    for k, pair in enumerate(tok.merges):
        ids = ref_merge(ids, pair, 256 + k)
    return ids


@lru_cache(maxsize=None)
def corpus_tokenizer() -> BPETokenizer:
    "BPE with 600 ids trained on the stories joined by <|endoftext|> (trained once per test process)."
    stories = [s for s in load_text_corpus().split("\n\n") if s.strip()]
    return BPETokenizer().train(EOT.join(stories), 600, special_tokens=[EOT])


words_st = st.lists(st.lists(st.integers(0, 5), max_size=12), max_size=12)
small_text = st.text(alphabet="abcab c,.'\nxyé", max_size=200)


# ---------------------------------------------------------------------------------------------
# 10.1 CharTokenizer
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("10.1", "CharTokenizer.__init__")
def test_char_tables_follow_the_documented_layout():
    tok = CharTokenizer("xay", special_tokens=["<eos>", "<pad>"])
    assert tok.itos == ["x", "a", "y", "<eos>", "<pad>"], f"itos: characters in the given order, then specials; got {tok.itos}"
    assert tok.stoi == {"x": 0, "a": 1, "y": 2}, f"stoi: characters only; got {tok.stoi}"
    assert tok.special_ids == {"<eos>": 3, "<pad>": 4}, f"special_ids: after the characters; got {tok.special_ids}"
    assert tok.vocab_size == 5
    unk = CharTokenizer("ab", unk_token="<unk>")
    assert unk.special_ids == {"<unk>": 2} and unk.vocab_size == 3, "unk_token becomes a special token"
    assert CharTokenizer("ab", ["<unk>"], unk_token="<unk>").vocab_size == 3, "an unk_token already listed is not added twice"


@pytest.mark.exercise("10.1", "CharTokenizer.encode")
@PROPERTY
@given(text=st.text(max_size=120))
@example(text="a\x00👍🏽e\u0301")
def test_char_round_trip_on_its_own_text(text):
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert len(ids) == len(text), f"one id per character: {len(text)} characters gave {len(ids)} ids"
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids), f"ids must be ints in [0, {tok.vocab_size}); got {ids}"
    assert [tok.itos[i] for i in ids] == list(text), "each id must be the id of its character"
    assert tok.decode(ids) == text, f"decode(encode({text!r})) gave {tok.decode(ids)!r}"


@pytest.mark.exercise("10.1", "CharTokenizer.encode")
def test_char_special_tokens_are_single_ids():
    text = f"Pip sat.{EOT}Tom ran.{EOT}"
    tok = CharTokenizer.from_text(text, special_tokens=[EOT])
    assert "<" not in tok.chars and "|" not in tok.chars, f"from_text must not split special tokens into characters; chars {tok.chars}"
    ids = tok.encode(text)
    eot = tok.special_ids[EOT]
    assert ids.count(eot) == 2 and ids[-1] == eot, f"{EOT} must be encoded as its single id {eot}; got {ids}"
    assert tok.decode(ids) == text


@pytest.mark.exercise("10.1", "CharTokenizer.encode")
def test_char_unknown_character_error_names_it_and_its_position():
    tok = CharTokenizer("abc", special_tokens=["<eos>"])
    with pytest.raises(ValueError) as info:
        tok.encode("ab<eos>cé")
    msg = str(info.value)
    assert "'é'" in msg and "position 8" in msg and "unk_token" in msg, \
        f"the error must name the character, its position in the text (8) and the unk_token fix; got: {msg}"


@pytest.mark.exercise("10.1", "CharTokenizer.encode")
def test_char_unknown_character_with_unk_token():
    tok = CharTokenizer("abc", unk_token="<unk>")
    ids = tok.encode("aéb👍")
    assert ids == [0, 3, 1, 3], f"unknown characters map to the unk id 3; got {ids}"
    assert tok.decode(ids) == "a<unk>b<unk>", "the unk id decodes to the unk_token string (lossy by design)"


@pytest.mark.exercise("10.1", "CharTokenizer.decode")
def test_char_decode_accepts_arrays_and_tensors():
    tok = CharTokenizer("abc")
    assert tok.decode(np.array([2, 0], dtype=np.int64)) == "ca"
    assert tok.decode(Tensor(np.array([1, 1]))) == "bb"
    assert tok.decode(()) == ""


@pytest.mark.exercise("10.1", "CharTokenizer.encode")
def test_char_save_load_round_trip(tmp_path):
    tok = CharTokenizer.from_text("héllo wörld", special_tokens=[EOT], unk_token="<unk>")
    path = tmp_path / "char.json"
    tok.save(path)
    again = CharTokenizer.load(path)
    assert again.itos == tok.itos and again.unk_token == "<unk>"
    assert again.encode(f"wölf{EOT}") == tok.encode(f"wölf{EOT}")


@pytest.mark.parametrize("chars, specials, match", [
    ("abca", (), r"\['a'\] appear more than once"),
    (["ab", "c"], (), "single character"),
    ("abc", ("a",), "also ordinary characters"),
    ("abc", ("",), "non-empty"),
    ("abc", ("<e>", "<e>"), "distinct"),
])
def test_char_constructor_errors(chars, specials, match):
    with pytest.raises(ValueError, match=match):
        CharTokenizer(chars, special_tokens=specials)


@pytest.mark.parametrize("ids, error, match", [
    ([0, 258], ValueError, r"ids\[1\] = 258 is not a token id; this tokenizer has ids 0..257"),
    ([-1], ValueError, "ids 0..257"),
    (np.array([3, 258, 1]), ValueError, r"ids\[1\] = 258 is not a token id"),
    (np.array([-2], dtype=np.int8), ValueError, r"ids\[0\] = -2"),
    (np.array([1.0]), TypeError, "dtype float64"),
    ([0.0], TypeError, "integers"),
    ([True], TypeError, "integers"),
    ("ab", TypeError, "list of integer"),
    (np.zeros((2, 2), dtype=int), TypeError, "1-D"),
])
def test_decode_rejects_bad_ids(ids, error, match):
    untrained = BPETokenizer.from_merges([], special_tokens=["<a>", "<b>"])     # ids 0..257
    with pytest.raises(error, match=match):
        untrained.decode(ids)


def test_bytes_and_lone_surrogates_are_rejected_with_the_fix():
    with pytest.raises(TypeError, match=r"decode\('utf-8'\)"):
        BPETokenizer().encode(b"abc")
    with pytest.raises(ValueError, match=r"lone surrogate .*U\+D800.* position 1"):
        BPETokenizer().encode("a\ud800")
    with pytest.raises(ValueError, match="lone surrogate"):
        BPETokenizer().train("ab\udfff", 260)


# ---------------------------------------------------------------------------------------------
# 10.2 count_pairs, 10.3 merge_pair
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("10.2", "count_pairs")
@PROPERTY
@given(words=words_st, data=st.data())
def test_count_pairs_matches_counter(words, data):
    freqs = data.draw(st.lists(st.integers(1, 9), min_size=len(words), max_size=len(words)))
    got = count_pairs(words, freqs)
    assert got == ref_count(words, freqs), f"count_pairs({words}, {freqs}) gave {got}; expected {ref_count(words, freqs)}"
    assert count_pairs(words) == ref_count(words, [1] * len(words)), "freqs=None means 1 per word"


@pytest.mark.exercise("10.2", "count_pairs")
def test_count_pairs_counts_overlaps_and_skips_short_words():
    assert count_pairs([[7, 7, 7]]) == {(7, 7): 2}, "[7, 7, 7] holds the pair (7, 7) twice"
    assert count_pairs([[1], [], (2, 3)]) == {(2, 3): 1}


def test_count_pairs_rejects_mismatched_frequencies():
    with pytest.raises(ValueError, match="2 words but 1 frequencies"):
        count_pairs([[1, 2], [3]], [4])


@pytest.mark.exercise("10.3", "merge_pair")
@PROPERTY
@given(ids=st.lists(st.integers(0, 3), max_size=30), a=st.integers(0, 3), b=st.integers(0, 3))
def test_merge_pair_matches_reference(ids, a, b):
    before = list(ids)
    got = merge_pair(ids, (a, b), 99)
    assert got == ref_merge(ids, (a, b), 99), f"merge_pair({ids}, {(a, b)}, 99) gave {got}; expected {ref_merge(ids, (a, b), 99)}"
    assert ids == before, "merge_pair must not modify its input"
    assert isinstance(got, list)


@pytest.mark.exercise("10.3", "merge_pair")
def test_merge_pair_is_left_to_right_without_overlap():
    assert merge_pair([7, 7, 7], (7, 7), 9) == [9, 7]
    assert merge_pair([7, 7, 7, 7], (7, 7), 9) == [9, 9]
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]


# ---------------------------------------------------------------------------------------------
# 10.4 training
# ---------------------------------------------------------------------------------------------
def test_most_frequent_pair_tie_rule():
    assert most_frequent_pair({(5, 1): 3, (2, 9): 3, (2, 4): 3, (0, 0): 1}) == (2, 4)
    assert most_frequent_pair({}) is None


@pytest.mark.exercise("10.4", "train_merges_naive")
def test_naive_training_on_the_classic_example():
    word = [0, 0, 0, 1, 3, 0, 0, 0, 1, 0, 2]                     # a a a b d a a a b a c
    got = train_merges_naive([word], [1], 5, first_id=4)
    assert got == ref_train([word], [1], 5, first_id=4) == [(0, 0), (0, 1), (4, 5), (0, 2), (3, 6)], \
        f"train_merges_naive on 'aaabdaaabac' gave {got}"


@pytest.mark.exercise("10.4", "train_merges_naive")
@PROPERTY
@given(words=words_st, n=st.integers(0, 12), data=st.data())
def test_naive_training_matches_reference(words, n, data):
    freqs = data.draw(st.lists(st.integers(1, 5), min_size=len(words), max_size=len(words)))
    seen = []
    got = train_merges_naive(words, freqs, n, callback=lambda k, p, c: seen.append((k, p)))
    expected = ref_train(words, freqs, n)
    assert got == expected, f"train_merges_naive({words}, {freqs}, {n}) gave {got}; the reference learns {expected}"
    assert seen == list(enumerate(got)), "callback(k, pair, count) must be called once per merge, in order"


@pytest.mark.exercise("10.3", "merge_pair")          # the given incremental trainer uses your merge_pair
@PROPERTY
@given(words=words_st, n=st.integers(0, 12), data=st.data())
def test_incremental_training_matches_reference(words, n, data):
    freqs = data.draw(st.lists(st.integers(1, 5), min_size=len(words), max_size=len(words)))
    counts = []
    got = train_merges_incremental(words, freqs, n, callback=lambda k, p, c: counts.append(c))
    assert got == ref_train(words, freqs, n)
    assert len(counts) == len(got) and all(c >= 1 for c in counts)


@pytest.mark.exercise("10.3", "merge_pair")
def test_incremental_training_on_one_long_word_matches_reference():
    word = list(load_text_corpus()[:3000].encode("utf-8")) + [7] * 9      # long, and ends in a run of repeats
    assert train_merges_incremental([word], [2], 120) == ref_train([word], [2], 120)


@pytest.mark.exercise("10.4", "train_merges_naive")
@PROPERTY
@given(text=small_text, vocab=st.integers(256, 300))
def test_naive_and_incremental_tokenizers_learn_the_same_merges(text, vocab):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                            # small texts run out of pairs
        naive = BPETokenizer().train(text, vocab, method="naive")
        fast = BPETokenizer().train(text, vocab, method="incremental")
    assert naive.merges == fast.merges, f"on {text!r}: naive learned {naive.merges}, incremental {fast.merges}"


@pytest.mark.exercise("10.4", "train_merges_naive")
def test_naive_and_incremental_agree_on_the_corpus():
    corpus = load_text_corpus()
    naive = BPETokenizer().train(corpus, 256 + 100, method="naive")
    assert naive.merges == BPETokenizer().train(corpus, 256 + 100).merges


@pytest.mark.exercise("10.3", "merge_pair")          # BPETokenizer.train (given) uses your merge_pair
def test_training_is_deterministic_and_independent_of_story_order():
    stories = [s for s in load_text_corpus().split("\n\n") if s.strip()]
    a = BPETokenizer().train("\n\n".join(stories), 700)
    b = BPETokenizer().train("\n\n".join(stories), 700)
    c = BPETokenizer().train("\n\n".join(reversed(stories)), 700)
    assert a.merges == b.merges, "the same text must give the same merges"
    assert a.merges == c.merges, "the order of the stories (same word counts) must not change the merges"


@pytest.mark.exercise("10.3", "merge_pair")
def test_a_shorter_training_run_is_a_prefix_of_a_longer_one():
    corpus = load_text_corpus()
    long_run = BPETokenizer().train(corpus, 900).merges
    assert BPETokenizer().train(corpus, 300).merges == long_run[:44], "the first k merges must not depend on vocab_size"


@pytest.mark.exercise("10.3", "merge_pair")
def test_training_is_the_same_under_any_hash_seed(root, python_env):
    assert merge_pair([1, 2], (1, 2), 3) == [3], "merge_pair must work before training can be checked in a subprocess"
    script = ("from tinytorch.text.tokenizers import BPETokenizer; from tinytorch.data.loader import load_text_corpus; "
              "print(BPETokenizer().train(load_text_corpus(), 400, special_tokens=['<|endoftext|>']).merges)")
    outputs = set()
    for seed in ("1", "2"):
        env = dict(python_env, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs.add(proc.stdout)
    assert len(outputs) == 1, "string hashing (PYTHONHASHSEED) must not change what is learned"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(vocab_size=255), ValueError, "at least 256"),
    (dict(vocab_size=256, special_tokens=[EOT]), ValueError, r"at least 257 \(256 bytes \+ 1 special"),
    (dict(vocab_size=300.0), ValueError, "integer"),
    (dict(vocab_size=True), ValueError, "integer"),
    (dict(vocab_size=300, method="fast"), ValueError, r"\['incremental', 'naive'\]"),
    (dict(vocab_size=300, special_tokens=[""]), ValueError, "non-empty"),
])
def test_train_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        BPETokenizer().train("hello world", **kwargs)


@pytest.mark.exercise("10.3", "merge_pair")
def test_train_warns_and_stops_when_the_text_runs_out_of_pairs():
    with pytest.warns(UserWarning, match="no pairs left to merge after 3 merges, so vocab_size is 259 instead of 400"):
        tok = BPETokenizer().train("abab abab", 400)
    assert tok.vocab_size == 259 and len(tok.merges) == 3


def test_train_rejects_non_text():
    with pytest.raises(TypeError, match="expected a str"):
        BPETokenizer().train(["hello"], 300)


# ---------------------------------------------------------------------------------------------
# 10.5 decode, 10.6 encode_chunk and the round trip
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("10.5", "BPETokenizer.decode")
@PROPERTY
@given(text=st.text(max_size=80))
def test_decode_of_raw_bytes_is_the_text(text):
    tok = BPETokenizer.from_merges([(104, 105)])
    assert tok.decode(list(text.encode("utf-8"))) == text, "byte ids 0..255 decode as the UTF-8 bytes they are"


@pytest.mark.exercise("10.5", "BPETokenizer.decode")
def test_decode_joins_bytes_before_decoding():
    tok = BPETokenizer.from_merges([(195, 169), (256, 32)], special_tokens=[EOT])   # 256 = "é", 257 = "é "
    assert tok.decode([99, 97, 102, 257, 258]) == f"café {EOT}"
    assert tok.decode([195]) == "\ufffd", "half a character decodes to U+FFFD by default"
    with pytest.raises(UnicodeDecodeError):
        tok.decode([195], errors="strict")
    assert tok.decode([]) == ""


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
@PROPERTY
@given(text=small_text)
def test_encode_chunk_equals_replaying_every_merge(text):
    tok = corpus_tokenizer()
    data = text.encode("utf-8")
    assert tok.encode_chunk(data) == ref_encode_piece(tok, data), f"encode_chunk({data!r}) must equal applying the merges in order"


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
@PROPERTY
@given(text=st.text())
def test_round_trip_any_unicode_text(text):
    tok = corpus_tokenizer()
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids), "ids must be ints in [0, vocab_size)"
    assert tok.decode(ids) == text, f"decode(encode({text!r})) gave {tok.decode(ids)!r}"


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
@pytest.mark.parametrize("text", AWKWARD)
def test_round_trip_awkward_strings(text):
    tok = corpus_tokenizer()
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, allow_special=False)) == text


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
def test_encoding_compresses_the_training_text_and_uses_learned_tokens():
    tok = corpus_tokenizer()
    text = "Once upon a time there was a little cat."
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) / 2.5, f"{len(text)} characters gave {len(ids)} tokens with 600 ids"
    the = [i for i, b in tok.vocab.items() if b == b" the"]
    assert the and tok.encode(" the") == the, f"' the' is a learned token ({the}); encode(' the') gave {tok.encode(' the')}"


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
def test_special_tokens_are_single_ids_and_never_merged():
    text = f"a{EOT}b{EOT}{EOT}ab" * 40
    tok = BPETokenizer().train(text, 259, special_tokens=[EOT])   # the text supports 2 merges
    assert tok.special_tokens == {EOT: tok.vocab_size - 1}, "the special token takes the last id"
    assert all(b"<" not in tok.vocab[256 + k] for k in range(len(tok.merges))), \
        f"no learned token may contain a piece of a special token: {[tok.vocab[256 + k] for k in range(len(tok.merges))]}"
    ids = tok.encode(f"ab{EOT}")
    assert ids[-1] == tok.special_tokens[EOT] and ids.count(tok.special_tokens[EOT]) == 1
    plain = tok.encode(EOT, allow_special=False)
    assert tok.special_tokens[EOT] not in plain and len(plain) > 1, "allow_special=False encodes it as ordinary text"
    assert tok.decode(plain) == EOT


def test_overlapping_special_tokens_prefer_the_longest():
    pieces = split_special("x<ab>y<a", ["<a", "<ab>"])
    assert pieces == [("x", False), ("<ab>", True), ("y", False), ("<a", True)]


@PROPERTY
@given(text=st.text())
@example(text="it's  a__b\n\n  x  ")
def test_pre_split_pieces_join_back_to_the_text(text):
    pieces = re.findall(SPLIT_PATTERN, text)
    assert "".join(pieces) == text, f"SPLIT_PATTERN lost characters of {text!r}: {pieces}"


@PROPERTY
@given(parts=st.lists(st.one_of(st.text(max_size=5), st.sampled_from([EOT, "<pad>"])), max_size=8))
def test_split_special_pieces_join_back(parts):
    text = "".join(parts)
    pieces = split_special(text, [EOT, "<pad>"])
    assert "".join(p for p, _ in pieces) == text and all(p for p, _ in pieces)
    assert all((p in (EOT, "<pad>")) == special for p, special in pieces)


@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")
def test_no_pre_split_pattern_still_round_trips():
    tok = BPETokenizer(pattern=None).train("abab cdcd " * 20, 268)   # 12 merges: all there are
    learned = [tok.vocab[256 + k] for k in range(len(tok.merges))]
    assert any(re.search(rb"\w \w", b) for b in learned), f"without pre-split, merges cross spaces: {learned}"
    assert tok.decode(tok.encode("cdab abcd")) == "cdab abcd"


def test_invalid_pattern_is_rejected():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        BPETokenizer(pattern="(")


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("10.6", "BPETokenizer.encode_chunk")   # trains and encodes, then saves and loads (given)
def test_bpe_save_load_round_trip(tmp_path):
    tok = corpus_tokenizer()
    path = tmp_path / "bpe.json"
    tok.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "tinytorch-bpe" and data["version"] == 1 and data["special_tokens"] == {EOT: 599}
    again = BPETokenizer.load(path)
    assert again.merges == tok.merges and again.special_tokens == tok.special_tokens and again.pattern == tok.pattern
    text = f"Pip and Tom 👋 ran home.{EOT}"
    assert again.encode(text) == tok.encode(text) and again.vocab_size == 600
    none = BPETokenizer(pattern=None).train("aaab aaab", 258)
    none.save(path)
    assert BPETokenizer.load(path).pattern is None


@pytest.mark.parametrize("content, match", [
    ("not json at all", "is not a JSON tokenizer file"),
    ('["a list"]', "not a 'tinytorch-bpe' file"),
    ('{"format": "tinytorch-char", "version": 1}', "format field is 'tinytorch-char'"),
    ('{"format": "tinytorch-bpe", "version": 2}', "format version 2; this tinytorch reads version 1"),
    ('{"format": "tinytorch-bpe", "version": 1, "merges": []}', "damaged: 'special_tokens'"),
    ('{"format": "tinytorch-bpe", "version": 1, "pattern": null, "merges": [[97, 300]], "special_tokens": {}}',
     r"merge 0 is \[97, 300\]"),
    ('{"format": "tinytorch-bpe", "version": 1, "pattern": null, "merges": [[97, 98, 99]], "special_tokens": {}}', "merge 0"),
    ('{"format": "tinytorch-bpe", "version": 1, "pattern": null, "merges": [[97, 98], [97, 98]], "special_tokens": {}}',
     "more than once"),
    ('{"format": "tinytorch-bpe", "version": 1, "pattern": null, "merges": [], "special_tokens": {"<e>": 300}}',
     "should be"),
    ('{"format": "tinytorch-bpe", "version": 1, "pattern": 5, "merges": [], "special_tokens": {}}', "pattern a string"),
])
def test_bpe_load_rejects_bad_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        BPETokenizer.load(path)
    assert str(path) in str(info.value), "the error must name the file"


def test_load_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        BPETokenizer.load(tmp_path / "nope.json")


def test_char_load_rejects_a_bpe_file_and_damage(tmp_path):
    path = tmp_path / "t.json"
    BPETokenizer().save(path)
    with pytest.raises(ValueError, match="not a 'tinytorch-char' file"):
        CharTokenizer.load(path)
    path.write_text('{"format": "tinytorch-char", "version": 1, "chars": ["ab"], "special_tokens": [], "unk_token": null}')
    with pytest.raises(ValueError, match="damaged"):
        CharTokenizer.load(path)


def test_repr_says_what_the_vocabulary_holds():
    assert "259: 256 bytes + 2 merges + 1 special token)" in repr(BPETokenizer.from_merges([(1, 2), (3, 256)], [EOT]))
