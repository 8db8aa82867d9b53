"""Probes of module 11 (embeddings): see tito/probes/__init__.py. 11.2 (the scatter-add backward) replays the
reference's recorded outcomes of `EmbeddingLookup.forward`; 11.5 (the sparse gradient) needs nothing else."""
import numpy as np

from . import probe


def _grads(rng, out, *inputs):
    from tinytorch.core.tensor import Tensor

    (out * Tensor(rng.standard_normal(out.shape).astype(np.float32))).sum().backward()
    return [None if t.grad is None else t.grad.data for t in inputs]


@probe("11.1")
def lookup_forward(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.text.embeddings import Embedding

    emb = Embedding(10, 4, rng=int(rng.integers(0, 2 ** 30)))
    ids = rng.integers(0, 10, size=(3, 5))
    rec.call("ids", emb, Tensor(ids))
    rec.call("array", emb, ids)
    rec.call("list", emb, [1, 1, 9])
    rec.call("scalar", emb, 3)
    rec.call("bad", emb, [1, 10])
    rec.call("neg", emb, [-1])
    rec.call("float", emb, np.array([1.0, 2.0]))
    from tinytorch.text.embeddings import EmbeddingLookup

    w = Tensor(rng.standard_normal((5, 3)).astype(np.float32))
    rec.call("apply", EmbeddingLookup.apply, w, rng.integers(0, 5, size=(2, 4)))
    rec.call("apply_one", EmbeddingLookup.apply, w, np.array(4))
    rec.call("apply_f64", EmbeddingLookup.apply, Tensor(rng.standard_normal((4, 2)), dtype=np.float64), np.array([3, 0, 3]))


@probe("11.2", replay=("EmbeddingLookup.forward",))
def lookup_backward(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.text.embeddings import Embedding

    emb = Embedding(8, 3, rng=int(rng.integers(0, 2 ** 30)))
    ids = np.array([[1, 1, 7], [1, 0, 7]])  # repeats: their gradients add up
    rec.call("grad", lambda: _grads(rng, emb(Tensor(ids)), emb.weight))
    emb.weight.grad = None
    rec.call("random", lambda: _grads(rng, emb(Tensor(rng.integers(0, 8, size=(4, 6)))), emb.weight))


@probe("11.3")
def sinusoidal(rng, rec):
    from tinytorch.text.embeddings import sinusoidal_positions

    for key, (n, d) in (("even", (int(rng.integers(5, 40)), 16)), ("odd", (7, 5)), ("one", (1, 1)), ("long", (300, 8))):
        rec.call(key, sinusoidal_positions, n, d)
    rec.call("bad", sinusoidal_positions, 0, 4)
    rec.call("bad_type", sinusoidal_positions, 4, 2.5)


@probe("11.4")
def learned(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.text.embeddings import LearnedPositionalEmbedding

    pos = LearnedPositionalEmbedding(6, 4, rng=int(rng.integers(0, 2 ** 30)))
    x = Tensor(rng.standard_normal((2, 5, 4)).astype(np.float32), requires_grad=True)
    rec.call("out", pos, x)
    rec.call("grads", lambda: _grads(rng, pos(x), x, pos.weight))
    rec.call("full", pos, Tensor(rng.standard_normal((1, 6, 4)).astype(np.float32)))
    rec.call("too_long", pos, Tensor(np.zeros((1, 7, 4), dtype=np.float32)))
    tail = Tensor(rng.standard_normal((2, 2, 4)).astype(np.float32), requires_grad=True)
    pos.weight.grad = None
    rec.call("start_pos", pos, tail, start_pos=3)
    rec.call("start_grads", lambda: _grads(rng, pos(tail, start_pos=3), tail, pos.weight))
    rec.call("unbatched", pos, Tensor(rng.standard_normal((3, 4)).astype(np.float32)), start_pos=2)
    rec.call("past_end", pos, Tensor(np.zeros((1, 3, 4), dtype=np.float32)), start_pos=4)


@probe("11.5")
def sparse_grad(rng, rec):
    from tinytorch.text.embeddings import sparse_embedding_grad

    rec.call("example", sparse_embedding_grad, np.array([1, 3, 1]), np.array([[1.0], [2.0], [4.0]]))
    ids = rng.integers(0, 9, size=(3, 4))
    rec.call("random", sparse_embedding_grad, ids, rng.standard_normal((3, 4, 2)).astype(np.float32))
    rec.call("one_id", sparse_embedding_grad, np.full((2, 2), 7), np.ones((2, 2, 3)))
    rec.call("unsorted", sparse_embedding_grad, np.array([5, 0, 2]), np.eye(3))
    rec.call("scalar_id", sparse_embedding_grad, np.array(2), rng.standard_normal(4))
    rec.call("bad", sparse_embedding_grad, np.array([1, 2]), np.ones((3, 2)))
