"""Module 11 (embeddings): `tinytorch.text.embeddings` against PyTorch and the formulas.

The lookup and its gradient are compared with `torch.nn.functional.embedding` on hypothesis-drawn
table sizes and id shapes (repeated ids included); the positional encodings with the formula of
"Attention Is All You Need" computed independently in float64. Without PyTorch (a student edition)
the torch comparisons fall back to `tests/support/refs.py` (`embedding`, `linear`) and float64
central differences, so nothing skips.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.layers import Linear
from tinytorch.core.tensor import Tensor
from tinytorch.text.embeddings import (Embedding, EmbeddingLookup, LearnedPositionalEmbedding,
                                       SinusoidalPositionalEncoding, check_ids, sinusoidal_positions,
                                       sparse_embedding_grad)
from tests.support import params, refs
from tests.support.families import check_row, family_rows
from tests.support.refs import numeric_grads, torch_or_none

pytestmark = pytest.mark.module("11")
PROPERTY = settings(max_examples=40, deadline=None)


@st.composite
def tables_and_ids(draw):
    v = draw(st.integers(1, 30), label="num_embeddings")
    d = draw(st.integers(1, 8), label="embedding_dim")
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=3), label="ids shape"))
    ids = np.array(draw(st.lists(st.integers(0, v - 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                   dtype=np.int64).reshape(shape)
    return v, d, ids


@pytest.mark.exercise("11.1", "EmbeddingLookup.forward")
@PROPERTY
@given(case=tables_and_ids(), seed=st.integers(0, 2**16))
def test_lookup_matches_numpy_gather(case, seed):
    v, d, ids = case
    w = np.random.default_rng(seed).standard_normal((v, d)).astype(np.float32)
    out = EmbeddingLookup.apply(Tensor(w), ids)
    assert out.shape == ids.shape + (d,), f"ids of shape {ids.shape} in a ({v}, {d}) table gave {out.shape}"
    np.testing.assert_array_equal(out.data, w[ids], err_msg="the lookup must return the rows the ids name")


@pytest.mark.exercise("11.2", "EmbeddingLookup.backward")
@PROPERTY
@given(case=tables_and_ids(), seed=st.integers(0, 2**16))
def test_lookup_gradient_matches_torch(case, seed):
    torch = torch_or_none()
    v, d, ids = case
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((v, d)).astype(np.float32)
    up = rng.standard_normal(ids.shape + (d,)).astype(np.float32)
    emb = Embedding(v, d)
    emb.weight.data[...] = w
    (emb(ids) * Tensor(up)).sum().backward()
    if torch is None:
        [(expected, _)] = numeric_grads(lambda t: refs.embedding(t, ids), [w], up)
    else:
        tw = torch.tensor(w, requires_grad=True)
        (torch.nn.functional.embedding(torch.tensor(ids), tw) * torch.tensor(up)).sum().backward()
        expected = tw.grad.numpy()
    np.testing.assert_allclose(emb.weight.grad.data, expected, rtol=1e-5, atol=1e-5,
                               err_msg=f"table gradient differs from torch for ids {ids.tolist()} (repeated ids must add up)")


@pytest.mark.exercise("11.2", "EmbeddingLookup.backward")
def test_unused_rows_get_zero_gradient_and_repeats_accumulate():
    emb = Embedding(6, 3, rng=0)
    emb(np.array([[4, 4], [4, 1]])).sum().backward()
    g = emb.weight.grad.data
    assert np.allclose(g[4], 3) and np.allclose(g[1], 1), f"id 4 was used 3 times, id 1 once; got rows {g[4]}, {g[1]}"
    assert np.allclose(g[[0, 2, 3, 5]], 0), "rows no id used must have zero gradient"


def test_embedding_in_a_graph_with_linear_matches_torch():
    torch = torch_or_none()
    emb, lin = Embedding(10, 4, rng=1), Linear(4, 3, rng=2)
    ids = np.array([[1, 2, 2], [9, 0, 1]])
    y = lin(emb(ids)).tanh().sum()
    y.backward()
    if torch is None:
        def f(t, w, b):
            return np.tanh(refs.linear(refs.embedding(t, ids), w, b))
        arrays = [emb.weight.data, lin.weight.data, lin.bias.data]
        np.testing.assert_allclose(y.item(), np.sum(f(*[a.astype(np.float64) for a in arrays])), rtol=1e-5)
        for ours, (g, _), name in zip((emb.weight, lin.weight, lin.bias), numeric_grads(f, arrays, 1.0),
                                      ("embedding", "linear weight", "bias")):
            np.testing.assert_allclose(ours.grad.data, g, rtol=1e-4, atol=1e-5, err_msg=f"{name} (central differences)")
        return
    tw = torch.tensor(emb.weight.data, requires_grad=True)
    tl = torch.tensor(lin.weight.data, requires_grad=True)
    tb = torch.tensor(lin.bias.data, requires_grad=True)
    ty = torch.tanh(torch.nn.functional.embedding(torch.tensor(ids), tw) @ tl.T + tb).sum()
    ty.backward()
    np.testing.assert_allclose(y.item(), ty.item(), rtol=1e-5)
    for ours, theirs, name in ((emb.weight, tw, "embedding"), (lin.weight, tl, "linear weight"), (lin.bias, tb, "bias")):
        np.testing.assert_allclose(ours.grad.data, theirs.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("bad, error, words", [
    (np.array([0, 7]), IndexError, ["7", "0..5", "(1,)"]),
    (np.array([[0, -1]]), IndexError, ["-1", "(0, 1)"]),
    (np.array([0.0, 1.0]), TypeError, ["integer", "float64"]),
])
def test_bad_ids_are_named(bad, error, words):
    with pytest.raises(error) as info:
        Embedding(6, 2, rng=0)(bad)
    for w in words:
        assert w in str(info.value), f"the error should mention {w!r}; got: {info.value}"


def test_check_ids_accepts_tensors_and_lists():
    assert check_ids(Tensor([1, 2]), 3).tolist() == [1, 2]
    assert check_ids([[0]], 1).shape == (1, 1)


@pytest.mark.parametrize("n, d, message", [
    (0, 4, "Embedding: num_embeddings must be a positive integer; got 0"),
    (4, 0, "Embedding: embedding_dim must be a positive integer; got 0"),
    (2.5, 4, "Embedding: num_embeddings must be a positive integer; got 2.5"),
    (4, True, "Embedding: embedding_dim must be a positive integer; got True"),
])
def test_embedding_rejects_bad_sizes(n, d, message):
    with pytest.raises(ValueError) as info:
        Embedding(n, d)
    assert str(info.value) == message


@pytest.mark.exercise("11.3", "sinusoidal_positions")
@settings(max_examples=30, deadline=None)
@given(max_len=st.integers(1, 64), dim=st.integers(1, 33))
def test_sinusoidal_formula(max_len, dim):
    pe = sinusoidal_positions(max_len, dim)
    assert pe.shape == (max_len, dim) and pe.dtype == np.float32
    p = np.arange(max_len)[:, None].astype(np.float64)
    j = np.arange(dim)[None, :]
    angle = p / 10000.0 ** ((j - j % 2) / dim)
    ref = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    np.testing.assert_allclose(pe, ref, atol=2e-6, err_msg=f"sinusoidal_positions({max_len}, {dim}) differs from the formula")


@pytest.mark.parametrize("args, message", [
    ((0, 4), "sinusoidal_positions: max_len must be a positive integer; got 0"),
    ((4, -1), "sinusoidal_positions: dim must be a positive integer; got -1"),
    ((2.0, 4), "sinusoidal_positions: max_len must be a positive integer; got 2.0"),
])
def test_sinusoidal_rejects_bad_sizes(args, message):
    with pytest.raises(ValueError) as info:
        sinusoidal_positions(*args)
    assert str(info.value) == message


@pytest.mark.exercise("11.4", "LearnedPositionalEmbedding.forward")
def test_learned_positions_match_torch_and_only_used_rows_learn():
    torch = torch_or_none()
    lpe = LearnedPositionalEmbedding(12, 5, rng=3)
    x = np.random.default_rng(0).standard_normal((3, 7, 5)).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    y = lpe(xt)
    (y * y).sum().backward()
    if torch is None:
        def f(a, w):
            out = a + w[:7]
            return out * out
        w = lpe.weight.data.copy()
        np.testing.assert_allclose(y.data, x + w[:7], rtol=1e-6)
        (gx, _), (gw, _) = numeric_grads(f, [x, w], np.ones(x.shape))
        np.testing.assert_allclose(lpe.weight.grad.data, gw, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(xt.grad.data, gx, rtol=1e-5, atol=1e-5)
        assert np.allclose(lpe.weight.grad.data[7:], 0), "positions beyond the sequence must get no gradient"
        return
    tw = torch.tensor(lpe.weight.data, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    ty = tx + tw[:7]
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.data, ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(lpe.weight.grad.data, tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(xt.grad.data, tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert np.allclose(lpe.weight.grad.data[7:], 0), "positions beyond the sequence must get no gradient"


@pytest.mark.exercise("11.4", "LearnedPositionalEmbedding.forward")
def test_positions_check_length_and_width():
    lpe = LearnedPositionalEmbedding(4, 3, rng=0)
    with pytest.raises(ValueError, match="max_len=4"):
        lpe(Tensor(np.zeros((5, 3))))
    with pytest.raises(ValueError, match=r"\(batch, seq, 3\)"):
        lpe(Tensor(np.zeros((2, 2))))


@st.composite
def positions_case(draw):
    max_len = draw(st.integers(1, 24), label="max_len")
    seq = draw(st.integers(1, max_len), label="T")
    start = draw(st.integers(0, max_len - seq), label="start_pos")
    batch = draw(st.sampled_from([(), (1,), (3,)]), label="batch")
    return max_len, seq, start, batch


@pytest.mark.exercise("11.4", "LearnedPositionalEmbedding.forward")
@settings(max_examples=40, deadline=None)
@given(case=positions_case(), dim=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_learned_positions_from_start_pos_slice_the_full_table(case, dim, seed):
    """Positions start_pos..start_pos+T-1: the rows of the full table (what a KV cache needs), and the
    gradient reaches exactly those rows."""
    max_len, seq, start, batch = case
    lpe = LearnedPositionalEmbedding(max_len, dim, rng=seed)
    x = np.random.default_rng(seed).standard_normal(batch + (seq, dim)).astype(np.float32)
    y = lpe(Tensor(x), start_pos=start)
    np.testing.assert_array_equal(y.data, x + lpe.weight.data[start:start + seq],
                                  err_msg=f"start_pos={start}, T={seq}: position t must get row start_pos + t")
    y.sum().backward()
    used = np.flatnonzero(np.abs(lpe.weight.grad.data).sum(axis=1))
    assert used.tolist() == list(range(start, start + seq)), (
        f"start_pos={start}, T={seq}: rows with a gradient {used.tolist()}; expected {list(range(start, start + seq))}")
    full = np.random.default_rng(seed + 1).standard_normal(batch + (start + seq, dim)).astype(np.float32)
    np.testing.assert_array_equal(lpe(Tensor(full[..., start:, :]), start_pos=start).data, lpe(Tensor(full)).data[..., start:, :],
                                  err_msg="encoding the last T tokens at start_pos must equal the full sequence's last T")


@settings(max_examples=40, deadline=None)
@given(case=positions_case(), dim=st.integers(1, 7))
def test_sinusoidal_positions_from_start_pos(case, dim):
    max_len, seq, start, batch = case
    spe = SinusoidalPositionalEncoding(max_len, dim)
    x = np.zeros(batch + (seq, dim), np.float32)
    expected = refs.sinusoidal_positions(np.arange(start, start + seq), dim)
    np.testing.assert_allclose(spe(Tensor(x), start_pos=start).data, np.broadcast_to(expected, x.shape), atol=2e-6,
                               err_msg=f"sinusoidal encodings of positions {start}..{start + seq - 1}")


@pytest.mark.parametrize("cls", [LearnedPositionalEmbedding, SinusoidalPositionalEncoding])
def test_start_pos_past_max_len_names_both_numbers(cls):
    enc = cls(16, 4)
    with pytest.raises(ValueError) as info:
        enc(Tensor(np.zeros((2, 3, 4))), start_pos=14)
    assert str(info.value) == (f"{cls.__name__}: start_pos=14 + 3 positions = 17 exceeds max_len=16: create the encoding "
                               "with a larger max_len (or crop the sequence)")
    enc(Tensor(np.zeros((2, 3, 4))), start_pos=13)  # the last position, 15, exists
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError) as info:
            enc(Tensor(np.zeros((1, 4))), start_pos=bad)
        assert str(info.value) == f"{cls.__name__}: start_pos must be a non-negative integer; got {bad!r}"


@pytest.mark.parametrize("cls", [LearnedPositionalEmbedding, SinusoidalPositionalEncoding])
def test_per_token_positions_of_a_padded_batch(cls):
    """Given code: `positions` (B, T) replace start_pos, one position id per token (left padding shifts rows)."""
    enc = cls(10, 3)
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3], [0, 0, 0, 1]])
    table = enc.weight.data if cls is LearnedPositionalEmbedding else sinusoidal_positions(10, 3)
    np.testing.assert_allclose(enc(Tensor(x), positions=pos).data, x + table[pos], rtol=1e-6)
    np.testing.assert_allclose(enc(Tensor(x), positions=np.arange(2, 6)).data, enc(Tensor(x), start_pos=2).data, rtol=1e-6)
    with pytest.raises(ValueError) as info:
        enc(Tensor(x), positions=np.array([[0, 1, 2, 10], [0, 0, 0, 1]]))
    assert str(info.value) == f"{cls.__name__}: position 10 is outside 0..9 (max_len=10)"
    with pytest.raises(ValueError) as info:
        enc(Tensor(x), positions=np.zeros((2, 3), np.int64))
    assert str(info.value) == (f"{cls.__name__}: positions must be integers of shape (2, 4) (one per token of x (2, 4, 3)) "
                               "or (4,); got int64 (2, 3)")
    if cls is LearnedPositionalEmbedding:
        enc(Tensor(x), positions=pos).sum().backward()
        counts = np.bincount(pos.ravel(), minlength=10)
        np.testing.assert_allclose(enc.weight.grad.data, np.repeat(counts[:, None], 3, axis=1),
                                   err_msg="each position id's row gets one gradient per token that used it")


@pytest.mark.parametrize("cls", [LearnedPositionalEmbedding, SinusoidalPositionalEncoding])
def test_positional_sizes_use_the_shared_check(cls):
    with pytest.raises(ValueError) as info:
        cls(0, 4)
    assert str(info.value) == f"{cls.__name__}: max_len must be a positive integer; got 0"
    with pytest.raises(ValueError) as info:
        cls(4, 2.0)
    assert str(info.value) == f"{cls.__name__}: dim must be a positive integer; got 2.0"


# ---------------------------------------------------------------------------------------------
# Exercise 11.5: the sparse (coordinate) gradient, against torch's nn.Embedding(sparse=True)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("11.5", "sparse_embedding_grad")
@PROPERTY
@given(case=tables_and_ids(), seed=st.integers(0, 2**16))
def test_sparse_gradient_matches_torch_sparse_embedding(case, seed):
    torch = torch_or_none()
    v, d, ids = case
    up = np.random.default_rng(seed).standard_normal(ids.shape + (d,)).astype(np.float32)
    indices, values = sparse_embedding_grad(ids, up)
    if torch is None:
        exp_idx, exp_val = refs.embedding_grad_coo(ids, up)
    else:
        emb = torch.nn.Embedding(v, d, sparse=True)
        (emb(torch.tensor(ids)) * torch.tensor(up)).sum().backward()
        g = emb.weight.grad.coalesce()
        exp_idx, exp_val = g.indices()[0].numpy(), g.values().numpy()
    assert indices.dtype == np.int64 and values.dtype == np.float32, f"indices int64, values float32; got {indices.dtype}, {values.dtype}"
    np.testing.assert_array_equal(indices, exp_idx, err_msg=f"the distinct ids of {ids.tolist()}, in increasing order")
    np.testing.assert_allclose(values, exp_val, rtol=1e-5, atol=1e-5,
                               err_msg=f"summed gradient rows for ids {ids.tolist()} (repeated ids add up)")


@pytest.mark.exercise("11.5", "sparse_embedding_grad")
def test_sparse_gradient_scatters_back_to_the_dense_one():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (4, 16))
    up = rng.standard_normal((4, 16, 3)).astype(np.float32)
    emb = Embedding(50, 3, rng=0)
    (emb(ids) * Tensor(up)).sum().backward()
    indices, values = sparse_embedding_grad(ids, up)
    dense = np.zeros((50, 3), np.float32)
    dense[indices] = values
    np.testing.assert_allclose(dense, emb.weight.grad.data, rtol=1e-6, atol=1e-6)
    assert len(indices) == len(np.unique(ids)) < 50


def test_sparse_gradient_shape_error_is_named():
    with pytest.raises(ValueError) as info:
        sparse_embedding_grad(np.array([1, 2, 3, 4]), np.zeros((2, 3)))
    assert str(info.value) == "sparse_embedding_grad: grad of shape (2, 3) does not fit ids of shape (4,): expected (4, D)"


# ---------------------------------------------------------------------------------------------
# The numbers of the notebook's systems analysis, against the tools practitioners use
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("v, d", [(2_000, 128), (256, 768), (50_257, 16)])
def test_table_memory_and_parameters_match_torch(v, d):
    """Section 5.1: V x D x 4 bytes and V x D parameters, as torch.nn.Embedding holds them (the closed
    form without torch)."""
    torch = torch_or_none()
    ours = Embedding(v, d, rng=0)
    assert ours.weight.nbytes == v * d * 4 and ours.num_parameters() == v * d
    if torch is not None:
        theirs = torch.nn.Embedding(v, d)
        assert ours.weight.nbytes == theirs.weight.element_size() * theirs.weight.numel()
        assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


def test_lookup_flops_and_sparse_gradient_bytes_match_torch():
    """Section 5.2: a lookup is 0 FLOPs and the one-hot product 2 N V D (torch's FlopCounterMode); section
    5.3: the sparse gradient's bytes are R x (8 + 4 D), as torch's coalesced sparse gradient stores them."""
    V, D, N = 300, 16, 64
    ids = np.random.default_rng(0).integers(0, V, N)
    indices, values = sparse_embedding_grad(ids, np.ones((N, D), np.float32))
    ours = indices.nbytes + values.nbytes
    assert ours == len(np.unique(ids)) * (8 + 4 * D), f"sparse gradient bytes {ours}; expected R x (8 + 4 D)"
    torch = torch_or_none()
    if torch is None:
        return
    from torch.utils.flop_counter import FlopCounterMode

    w = torch.randn(V, D)
    with FlopCounterMode(display=False) as gather:
        torch.nn.functional.embedding(torch.tensor(ids), w)
    with FlopCounterMode(display=False) as one_hot:
        torch.nn.functional.one_hot(torch.tensor(ids), V).float() @ w
    assert gather.get_total_flops() == 0 and one_hot.get_total_flops() == 2 * N * V * D
    emb = torch.nn.Embedding(V, D, sparse=True)
    emb(torch.tensor(ids)).sum().backward()
    g = emb.weight.grad.coalesce()
    theirs = g.indices().element_size() * g.indices().numel() + g.values().element_size() * g.values().numel()
    assert ours == theirs == len(indices) * (8 + 4 * D), f"sparse gradient bytes: ours {ours}, torch {theirs}"


def test_sinusoidal_module_adds_a_constant():
    spe = SinusoidalPositionalEncoding(8, 6)
    x = Tensor(np.ones((2, 5, 6)), requires_grad=True)
    y = spe(x)
    np.testing.assert_allclose(y.data, np.broadcast_to(1 + sinusoidal_positions(8, 6)[:5], (2, 5, 6)), rtol=1e-6)
    assert spe.num_parameters() == 0, "the sinusoidal table is not a parameter"
    y.sum().backward()
    assert np.allclose(x.grad.data, 1)


# ---------------------------------------------------------------------------------------------
# The module's rows of the shared reference table (tests/support/families.py): value and every
# input's gradient against torch, or without torch against NumPy and central differences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", params(family_rows("11"), "grad"))
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_family_rows_match_the_reference(op, data, seed):
    check_row(op, data.draw(op.inputs(), label="case"), seed)
