"""Module 16 (compression): the exported `tinytorch.perf.compression` checked against PyTorch and SciPy.

- Masks: `magnitude_mask` equals `torch.nn.utils.prune.l1_unstructured`'s mask and
  `global_magnitude_masks` equals `torch.nn.utils.prune.global_unstructured`'s (L1), element for
  element, on shapes and sparsities drawn by hypothesis (distinct magnitudes, so no ties); without
  torch, the same tests check the count `round(s * n)` and the threshold property.
- `PruningMasks.apply` and `prune_magnitude`: a model pruned at sparsity 0 is unchanged (bit for bit);
  masks hold through fine-tuning with SGD (momentum, weight decay) and Adam.
- `CSRMatrix`: its three arrays and byte count equal `scipy.sparse.csr_matrix`'s, its product
  equals SciPy's and the dense one; `storage_bytes` equals the sum of SciPy's array sizes.
- `prune_neurons`: the kept units are the rows `torch.nn.utils.prune.ln_structured(n=2, dim=0)`
  keeps (also on layers drawn so that the L1, L2 and max norms rank the rows differently), and the pruned
  pair computes what the torch layers with those rows masked compute.
- `low_rank`: at full rank it reproduces the layer; at rank k its error is the Eckart-Young error
  computed from `torch.linalg.svdvals`; `model_cost`'s FLOPs equal `FlopCounterMode`'s for the
  dense and the factored model.
- `distillation_loss`: value and gradient equal to the same formula written with
  `torch.nn.functional` (`cross_entropy` + `kl_div(..., reduction="batchmean", log_target=True)`).
- Bad input: sparsity outside [0, 1), rank outside [1, min(m, n)], n_keep, temperature, alpha:
  each error names the value (exact text).

The references are those of `tests/support/systems.py` (torch where installed, NumPy otherwise), so a student
edition compares against something too; a test that needs an earlier exercise checks it first and names it.
Run one exercise with `pytest tests/modules/test_16_compression.py --exercise 16.4`.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support.models import mlp
from tinytorch.core.activations import ReLU
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD, Adam
from tinytorch.core.spatial import Conv2d
from tinytorch.core.tensor import Tensor
from tinytorch.perf.compression import (
    CSRMatrix, PruningMasks, distillation_loss, global_magnitude_masks, low_rank, low_rank_model, magnitude_mask,
    model_cost, prune_magnitude, prune_mlp_neurons, prune_neurons, prunable_parameters, rank_for_energy,
    storage_bytes,
)
from tests.support.refs import numeric_grads, torch_or_none
from tests.support.systems import ref_distillation, ref_ln_structured, ref_magnitude_mask

try:  # SciPy comes with the test extra (scikit-learn); a student edition may not have it
    import scipy.sparse as scipy_sparse
except ImportError:
    scipy_sparse = None

pytestmark = pytest.mark.module("16")

PROPERTY = settings(max_examples=25, deadline=None)


def require(*exercises):
    """Check the earlier exercises a test depends on; a wrong one fails the test with its own name (fix it first)."""
    checks = {
        "16.1": ("magnitude_mask", lambda: magnitude_mask(np.array([[0.5, -0.1], [2.0, 0.05]]), 0.5).tolist()
                 == [[True, False], [True, False]]),
        "16.2": ("global_magnitude_masks", lambda: [m.tolist() for m in global_magnitude_masks(
            [np.array([3.0, 0.1]), np.array([[0.2, 4.0], [5.0, 6.0]])], 0.5)] == [[False, False], [[False, True], [True, True]]]),
        "16.3": ("prune_magnitude", lambda: abs(prune_magnitude(mlp([4, 6, 2], seed=0), 0.5, "layer").sparsity() - 0.5) < 1e-9),
        "16.4": ("CSRMatrix", lambda: np.allclose(CSRMatrix.from_dense(np.array([[0, 2.0], [1.0, 0]], np.float32))
                                                  @ np.eye(2, dtype=np.float32), [[0, 2], [1, 0]])),
        "16.5": ("prune_neurons", lambda: list(prune_neurons(_rows([[1, 0, 0], [0, 5, 0], [0, 0, 0], [0, 3, 0]]),
                                                             Linear(4, 2, rng=1), 2)[2]) == [1, 3]),
        "16.6": ("low_rank", lambda: low_rank(Linear(4, 3, rng=0), 2).layers[0].weight.shape == (2, 4)),
    }
    for number in exercises:
        name, check = checks[number]
        try:
            ok, why = check(), "it is wrong on the example of its docstring"
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - a crash of the earlier exercise is its failure
            ok, why = False, f"it raised {type(err).__name__}: {err}"
        if not ok:
            pytest.fail(f"not checked on its own: it uses {name} (Exercise {number}), and {why}. Fix Exercise {number} first",
                        pytrace=False)


def _rows(rows):
    "A Linear whose weight has the given rows (and a zero bias)."
    w = np.array(rows, np.float32)
    layer = Linear(w.shape[1], w.shape[0], rng=0)
    layer.weight.data[:] = w
    layer.bias.data[:] = 0
    return layer


def distinct_weights(shape, seed, scale=1.0):
    "float32 weights whose magnitudes are all different (a random permutation of a spaced grid, random signs)."
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    mags = (rng.permutation(n) + 1).astype(np.float64) / n * scale
    return (mags * rng.choice([-1.0, 1.0], n)).reshape(shape).astype(np.float32)


def torch_mlp(torch, model):
    "The torch.nn.Sequential with the same Linear weights as `model` (nested Sequentials flattened)."
    mods = []

    def walk(m):
        for layer in m.layers:
            if isinstance(layer, Sequential):
                walk(layer)
            elif isinstance(layer, Linear):
                t = torch.nn.Linear(layer.weight.shape[1], layer.weight.shape[0], bias=layer.bias is not None)
                with torch.no_grad():
                    t.weight.copy_(torch.from_numpy(layer.weight.data.copy()))
                    if layer.bias is not None:
                        t.bias.copy_(torch.from_numpy(layer.bias.data.copy()))
                mods.append(t)
            else:
                mods.append(torch.nn.ReLU())

    walk(model)
    return torch.nn.Sequential(*mods)


# ---------------------------------------------------------------------------------------------
# Exercise 16.1: magnitude_mask
# ---------------------------------------------------------------------------------------------
shapes = st.one_of(st.tuples(st.integers(1, 12), st.integers(1, 12)),
                   st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)))
sparsities = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.99]), st.floats(0.0, 0.999, exclude_max=False))


@pytest.mark.exercise("16.1", "magnitude_mask")
@PROPERTY
@given(shape=shapes, sparsity=sparsities, seed=st.integers(0, 2**16))
def test_magnitude_mask_matches_torch_prune(shape, sparsity, seed):
    """Equal to torch.nn.utils.prune.l1_unstructured's mask (tests/support/systems.py: NumPy's stable sort without torch)."""
    w = distinct_weights(shape, seed)
    got = magnitude_mask(w, sparsity)
    assert isinstance(got, np.ndarray) and got.dtype == bool and got.shape == w.shape, \
        f"a boolean mask of shape {w.shape}; got {type(got).__name__} {getattr(got, 'dtype', '')} {getattr(got, 'shape', '')}"
    k = round(sparsity * w.size)
    assert int((~got).sum()) == k, f"sparsity {sparsity} of {w.size} weights prunes round(s * n) = {k}; got {int((~got).sum())}"
    if 0 < k < w.size:
        assert np.abs(w[~got]).max() < np.abs(w[got]).min(), (
            f"shape {w.shape}, sparsity {sparsity}: every pruned weight must be smaller than every kept one; the "
            f"largest pruned |w| is {np.abs(w[~got]).max():.4g}, the smallest kept {np.abs(w[got]).min():.4g}")
    expected = ref_magnitude_mask(w, sparsity)
    assert np.array_equal(got, expected), \
        f"shape {w.shape}, sparsity {sparsity}: {int((got != expected).sum())} positions differ from torch's l1_unstructured mask"


@pytest.mark.exercise("16.1", "magnitude_mask")
def test_magnitude_mask_leaves_the_weight_and_accepts_tensors():
    w = distinct_weights((6, 7), 0)
    before = w.copy()
    a, b = magnitude_mask(w, 0.5), magnitude_mask(Tensor(w), 0.5)
    assert np.array_equal(w, before), "magnitude_mask modified the weight"
    assert np.array_equal(a, b), "a Tensor and its array must give the same mask"
    assert magnitude_mask(w, 0.0).all(), "sparsity 0 keeps every weight"


@pytest.mark.exercise("16.1", "magnitude_mask")
@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), True, "0.5", None])
def test_sparsity_outside_the_range_is_refused_with_its_value(bad):
    with pytest.raises(ValueError) as e:
        magnitude_mask(np.ones((3, 3)), bad)
    expected = ("magnitude_mask: sparsity must be a number in [0, 1) (the fraction of weights set to zero, "
                f"e.g. 0.9 for 90%); got {bad!r}")
    assert str(e.value) == expected, f"error text {str(e.value)!r}; expected {expected!r}"


# ---------------------------------------------------------------------------------------------
# Exercise 16.2: global_magnitude_masks
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.2", "global_magnitude_masks")
@PROPERTY
@given(layer_shapes=st.lists(shapes, min_size=1, max_size=4), sparsity=sparsities, seed=st.integers(0, 2**16))
def test_global_masks_match_torch_global_unstructured(layer_shapes, sparsity, seed):
    # one distinct-magnitude pool cut into the layers, with layer scales that differ (as Kaiming's do)
    sizes = [int(np.prod(s)) for s in layer_shapes]
    pool = distinct_weights((sum(sizes),), seed)
    ws = [part.reshape(s) for part, s in zip(np.split(pool, np.cumsum(sizes)[:-1]), layer_shapes)]
    got = global_magnitude_masks(ws, sparsity)
    assert isinstance(got, list) and [np.shape(m) for m in got] == [w.shape for w in ws], \
        f"one mask per weight of its shape; got {[np.shape(m) for m in got] if isinstance(got, list) else type(got).__name__}"
    k = round(sparsity * pool.size)
    assert sum(int((~np.asarray(m)).sum()) for m in got) == k, f"sparsity {sparsity} of {pool.size} weights prunes {k} in all"
    if 0 < k < pool.size:
        kept = np.concatenate([np.abs(w[m]) for w, m in zip(ws, got)])
        gone = np.concatenate([np.abs(w[~m]) for w, m in zip(ws, got)])
        assert gone.max() < kept.min(), (f"one global threshold: every pruned weight is smaller than every kept one; the "
                                         f"largest pruned |w| is {gone.max():.4g}, the smallest kept {kept.min():.4g}")
    torch = torch_or_none()
    if torch is not None:
        prune = pytest.importorskip("torch.nn.utils.prune")
        layers = []
        for w in ws:
            layer = torch.nn.Linear(1, 1)
            layer.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
            layers.append(layer)
        prune.global_unstructured([(layer, "weight") for layer in layers], pruning_method=prune.L1Unstructured,
                                  amount=float(sparsity))
        for i, (m, layer) in enumerate(zip(got, layers)):
            expected = layer.weight_mask.numpy().astype(bool)
            assert np.array_equal(m, expected), f"weight {i} of {len(ws)}, sparsity {sparsity}: differs from torch's global_unstructured mask"


@pytest.mark.exercise("16.2", "global_magnitude_masks")
def test_global_masks_refuse_a_bad_sparsity():
    with pytest.raises(ValueError, match=r"^global_magnitude_masks: sparsity must be a number in \[0, 1\) .*got 1$"):
        global_magnitude_masks([np.ones(4)], 1)


# ---------------------------------------------------------------------------------------------
# Exercise 16.3: PruningMasks.apply and prune_magnitude (over 16.1 and 16.2)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.3", "prune_magnitude")
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_zero_sparsity_leaves_the_model_unchanged(scope):
    require("16.1", "16.2")
    model = mlp([12, 16, 8, 3], seed=1)
    x = np.random.default_rng(0).standard_normal((5, 12)).astype(np.float32)
    before_params = [p.data.copy() for p in model.parameters()]
    before_out = model(x).data.copy()
    masks = prune_magnitude(model, 0.0, scope=scope)
    assert all(np.array_equal(a, p.data) for a, p in zip(before_params, model.parameters())), "sparsity 0 changed a parameter"
    assert np.array_equal(model(x).data, before_out), "sparsity 0 changed the model's output"
    assert masks.sparsity() == 0.0 and all(m.all() for m in masks.masks)


@pytest.mark.exercise("16.3", "prune_magnitude")
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_prune_magnitude_reaches_the_sparsity(scope):
    require("16.1", "16.2")
    model = mlp([12, 16, 8, 3], seed=2)
    masks = prune_magnitude(model, 0.75, scope=scope)
    total = sum(p.size for _, p in prunable_parameters(model))
    zeros = sum(int((p.data == 0).sum()) for _, p in prunable_parameters(model))
    assert zeros == round(0.75 * total) if scope == "global" else abs(zeros / total - 0.75) < 0.02, \
        f"{scope}: {zeros} of {total} weights are zero"
    assert all(np.array_equal(layer.bias.data, np.zeros_like(layer.bias.data)) for layer in model.layers
               if isinstance(layer, Linear)), "biases are not pruned (they start at zero and must stay as they were)"
    if scope == "layer":
        for name, s in masks.layer_sparsity().items():
            assert abs(s - 0.75) < 0.05, f"{name}: sparsity {s:.3f} with scope='layer'"


@pytest.mark.exercise("16.3", "PruningMasks.apply")
@pytest.mark.parametrize("make_opt", [
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2),
    lambda ps: Adam(ps, lr=1e-2),
], ids=["sgd-momentum-wd", "adam"])
def test_masks_keep_pruned_weights_zero_through_fine_tuning(make_opt):
    require("16.1")
    model = mlp([10, 32, 4], seed=3)
    masks = prune_magnitude(model, 0.8, scope="layer")
    pruned = [~m for m in masks.masks]
    opt, loss_fn = make_opt(model.parameters()), CrossEntropyLoss()
    rng = np.random.default_rng(0)
    for _ in range(15):
        x, y = rng.standard_normal((16, 10)).astype(np.float32), rng.integers(0, 4, 16)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        masks.apply()
        for name, p, gone in zip(masks.names, masks.params, pruned):
            assert not p.data[gone].any(), f"{name}: a pruned weight is nonzero after a step and apply()"
            assert p.grad is None or not p.grad.data[gone].any(), f"{name}: apply() must zero the pruned gradients too"
    kept_moved = any(not np.allclose(p.data[~gone], 0) for p, gone in zip(masks.params, pruned))
    assert kept_moved and abs(masks.sparsity() - 0.8) < 0.01, f"sparsity after fine-tuning {masks.sparsity():.3f}"


@pytest.mark.exercise("16.3", "prune_magnitude")
def test_prune_magnitude_and_masks_refuse_bad_arguments():
    model = mlp([4, 4, 2])
    with pytest.raises(ValueError, match=r"prune_magnitude: scope must be 'global' .* got 'model'"):
        prune_magnitude(model, 0.5, scope="model")
    with pytest.raises(ValueError, match=r"^prune_magnitude: sparsity must be a number in \[0, 1\) .*got 1\.2$"):
        prune_magnitude(model, 1.2)
    with pytest.raises(ValueError, match=r"the mask of w has shape \(2,\); the weight has \(4, 4\)"):
        PruningMasks([("w", model.layers[0].weight)], [np.ones(2, bool)])


# ---------------------------------------------------------------------------------------------
# Exercise 16.4: CSRMatrix (and the given storage_bytes over it), against scipy.sparse
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.4", "CSRMatrix.matmul")
@PROPERTY
@given(m=st.integers(1, 20), k=st.integers(1, 20), n=st.integers(1, 6), density=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_csr_matrix_matches_scipy_and_dense(m, k, n, density, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * (rng.random((m, k)) < density)).astype(np.float32)
    x = rng.standard_normal((k, n)).astype(np.float32)
    csr = CSRMatrix.from_dense(a)
    assert np.array_equal(csr.to_dense(), a), "to_dense must give back the matrix"
    np.testing.assert_allclose(csr @ x, a @ x, rtol=1e-5, atol=1e-5, err_msg="CSRMatrix @ x against the dense product")
    assert csr.nnz == np.count_nonzero(a) and csr.nbytes == 8 * csr.nnz + 4 * (m + 1), \
        f"nbytes {csr.nbytes}: 4-byte values and column indices per nonzero, {m + 1} 4-byte row pointers"
    if scipy_sparse is not None:
        ref = scipy_sparse.csr_matrix(a)
        assert np.array_equal(csr.values, ref.data) and np.array_equal(csr.indices, ref.indices) \
            and np.array_equal(csr.indptr, ref.indptr), "the three CSR arrays must equal scipy.sparse.csr_matrix's"
        assert csr.nbytes == ref.data.nbytes + ref.indices.nbytes + ref.indptr.nbytes, \
            f"nbytes {csr.nbytes}; scipy's arrays take {ref.data.nbytes + ref.indices.nbytes + ref.indptr.nbytes}"
        np.testing.assert_allclose(csr @ x, ref @ x, rtol=1e-5, atol=1e-5, err_msg="CSRMatrix @ x against scipy")


@pytest.mark.exercise("16.4", "CSRMatrix.from_dense")
def test_storage_bytes_counts_csr_as_scipy_stores_it():
    model = mlp([20, 30, 5], seed=4)
    conv = Conv2d(3, 4, 3, rng=0)
    assert storage_bytes(model) == 4 * model.num_parameters()
    x = np.random.default_rng(0).standard_normal((2, 20)).astype(np.float32)
    model.layers[0].weight.data[np.abs(model.layers[0].weight.data) < 0.3] = 0

    def csr_bytes(a):
        if scipy_sparse is None:
            return 8 * np.count_nonzero(a) + 4 * (a.shape[0] + 1)
        r = scipy_sparse.csr_matrix(a)
        return r.data.nbytes + r.indices.nbytes + r.indptr.nbytes

    expected = sum(csr_bytes(p.data) if p.ndim >= 2 else p.data.nbytes for p in model.parameters())
    assert storage_bytes(model, sparse=True) == expected, f"{storage_bytes(model, sparse=True)} bytes; scipy's CSR arrays take {expected}"
    expected_conv = csr_bytes(conv.weight.data.reshape(4, -1)) + conv.bias.data.nbytes
    assert storage_bytes(conv, sparse=True) == expected_conv, f"Conv2d in CSR: {storage_bytes(conv, sparse=True)} bytes; expected {expected_conv}"
    assert model(x).shape == (2, 5)


# ---------------------------------------------------------------------------------------------
# Exercise 16.3: prune_neurons
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.5", "prune_neurons")
@PROPERTY
@given(n_in=st.integers(1, 8), n_hidden=st.integers(1, 12), n_out=st.integers(1, 5), data=st.data(), seed=st.integers(0, 2**16))
def test_prune_neurons_keeps_the_rows_torch_ln_structured_keeps(n_in, n_hidden, n_out, data, seed):
    n_keep = data.draw(st.integers(1, n_hidden))
    fc1, fc2 = Linear(n_in, n_hidden, rng=seed), Linear(n_hidden, n_out, rng=seed + 1)
    rng = np.random.default_rng(seed)
    fc1.weight.data[:] = distinct_weights((n_hidden, n_in), seed)
    # distinct magnitudes can still give rows of equal norm ((8, 9) and (1, 12) on a grid of 18ths): which of two
    # tied rows is kept is left open by the exercise, as by torch's topk, so such draws are not judged
    sorted_norms = np.sort(np.linalg.norm(fc1.weight.data.astype(np.float64), axis=1))
    assume(np.all(np.diff(sorted_norms) > 1e-4 * sorted_norms[-1]))
    fc1.bias.data[:] = rng.standard_normal(n_hidden)
    fc2.bias.data[:] = rng.standard_normal(n_out)
    new1, new2, keep = prune_neurons(fc1, fc2, n_keep)
    keep = np.asarray(keep)
    norms = np.linalg.norm(fc1.weight.data.astype(np.float64), axis=1)
    assert keep.shape == (n_keep,) and np.all(np.diff(keep) > 0), f"keep must be {n_keep} increasing indices; got {keep}"
    assert set(keep) == set(np.argsort(-norms)[:n_keep]), \
        f"kept {keep.tolist()}; the {n_keep} largest L2 row norms are at {sorted(np.argsort(-norms)[:n_keep].tolist())}"
    assert new1.weight.shape == (n_keep, n_in) and new2.weight.shape == (n_out, n_keep), \
        f"shapes {new1.weight.shape}, {new2.weight.shape}; expected ({n_keep}, {n_in}), ({n_out}, {n_keep})"
    x = rng.standard_normal((4, n_in)).astype(np.float32)
    got = new2(ReLU()(new1(x))).data
    torch = torch_or_none()
    if torch is not None:
        prune = pytest.importorskip("torch.nn.utils.prune")
        t1, t2 = torch.nn.Linear(n_in, n_hidden), torch.nn.Linear(n_hidden, n_out)
        with torch.no_grad():
            t1.weight.copy_(torch.from_numpy(fc1.weight.data.copy()))
            t1.bias.copy_(torch.from_numpy(fc1.bias.data.copy()))
            t2.weight.copy_(torch.from_numpy(fc2.weight.data.copy()))
            t2.bias.copy_(torch.from_numpy(fc2.bias.data.copy()))
        prune.ln_structured(t1, "weight", amount=n_hidden - n_keep, n=2, dim=0)
        rows = np.flatnonzero(t1.weight_mask.numpy()[:, 0])
        assert list(rows) == list(keep), f"kept units {list(keep)}; torch's ln_structured keeps rows {list(rows)}"
        # the torch pair with the pruned units' bias masked as well computes what the smaller pair computes
        prune.custom_from_mask(t1, "bias", torch.from_numpy(t1.weight_mask.numpy()[:, 0].copy()))
        expected = t2(torch.relu(t1(torch.from_numpy(x)))).detach().numpy()
    else:
        h = np.maximum(x @ fc1.weight.data[keep].T + fc1.bias.data[keep], 0)
        expected = h @ fc2.weight.data[:, keep].T + fc2.bias.data
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg="the pruned pair's output")


@st.composite
def norm_separating_rows(draw):
    """Rows whose L2 ranking differs from their L1 and max-norm rankings: spiky rows (one large entry) against
    flat rows (many middling entries), so that a score by the wrong norm keeps other units."""
    n_in, n_spiky, n_flat = draw(st.integers(3, 8)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    spiky = np.zeros((n_spiky, n_in))
    spiky[np.arange(n_spiky), rng.integers(0, n_in, n_spiky)] = rng.uniform(2.0, 3.0, n_spiky) * rng.choice([-1, 1], n_spiky)
    flat = rng.uniform(0.8, 1.0, (n_flat, n_in)) * rng.choice([-1, 1], (n_flat, n_in))   # L2 ~ 0.9 sqrt(n_in), L1 ~ 0.9 n_in
    rows = np.concatenate([spiky, flat])[rng.permutation(n_spiky + n_flat)]
    return rows.astype(np.float32) + rng.uniform(0, 1e-3, rows.shape).astype(np.float32)   # no ties


@pytest.mark.exercise("16.5", "prune_neurons")
@PROPERTY
@given(rows=norm_separating_rows(), data=st.data())
def test_prune_neurons_ranks_by_the_l2_norm_not_another(rows, data):
    n_keep = data.draw(st.integers(1, rows.shape[0]))
    _, _, keep = prune_neurons(_rows(rows), Linear(rows.shape[0], 2, rng=1), n_keep)
    expected = ref_ln_structured(rows, n_keep, n=2)
    l1 = ref_ln_structured(rows, n_keep, n=1)
    assert list(np.asarray(keep)) == list(expected), (
        f"rows with L2 norms {np.round(np.linalg.norm(rows, axis=1), 3).tolist()} (L1 {np.round(np.abs(rows).sum(axis=1), 3).tolist()}), "
        f"n_keep {n_keep}: kept {np.asarray(keep).tolist()}; the L2 norm keeps {np.asarray(expected).tolist()}"
        + (" (the L1 norm would keep what you kept)" if list(np.asarray(keep)) == list(l1) else ""))


@pytest.mark.exercise("16.5", "prune_neurons")
def test_prune_neurons_on_conv_channels_and_dead_units():
    c1, c2 = Conv2d(2, 6, 3, padding=1, rng=0), Conv2d(6, 3, 3, stride=2, rng=1)
    c1.weight.data[[1, 4]] = 0
    c1.bias.data[:] = 0
    x = np.random.default_rng(0).standard_normal((2, 2, 7, 7)).astype(np.float32)
    full = c2(ReLU()(c1(x))).data
    n1, n2, keep = prune_neurons(c1, c2, 4)
    assert list(np.asarray(keep)) == [0, 2, 3, 5], f"the two zero channels go; kept {list(np.asarray(keep))}"
    assert isinstance(n1, Conv2d) and n1.weight.shape == (4, 2, 3, 3) and n2.weight.shape == (3, 4, 3, 3)
    assert n1.padding == (1, 1) and n2.stride == (2, 2)
    np.testing.assert_allclose(n2(ReLU()(n1(x))).data, full, rtol=1e-5, atol=1e-5,
                               err_msg="removing dead channels must leave the output unchanged")


@pytest.mark.exercise("16.5", "prune_neurons")
@pytest.mark.parametrize("bad", [0, 9, -1, 2.5, True])
def test_prune_neurons_refuses_a_bad_n_keep(bad):
    with pytest.raises(ValueError) as e:
        prune_neurons(Linear(3, 8, rng=0), Linear(8, 2, rng=1), bad)
    expected = f"prune_neurons: n_keep must be an integer between 1 and 8 (the layer's output units); got {bad!r}"
    assert str(e.value) == expected, f"error text {str(e.value)!r}; expected {expected!r}"
    with pytest.raises(ValueError, match="next_layer takes 5 inputs but layer has 8 outputs"):
        prune_neurons(Linear(3, 8, rng=0), Linear(5, 2, rng=1), 2)


@pytest.mark.exercise("16.5", "prune_neurons")
def test_prune_mlp_neurons_shrinks_hidden_layers_only():
    require("16.5")
    model = mlp([10, 20, 12, 4], seed=5)
    x = np.random.default_rng(1).standard_normal((3, 10)).astype(np.float32)
    same = prune_mlp_neurons(model, 1.0)
    np.testing.assert_allclose(same(x).data, model(x).data, rtol=1e-6, atol=1e-6, err_msg="keep_fraction 1 keeps the function")
    small = prune_mlp_neurons(model, 0.5)
    shapes = [layer.weight.shape for layer in small.layers if isinstance(layer, Linear)]
    assert shapes == [(10, 10), (6, 10), (4, 6)], f"shapes {shapes}"
    assert model.layers[0].weight.shape == (20, 10), "the original model must not change"
    with pytest.raises(ValueError, match=r"keep_fraction must be in \(0, 1\] .*got 0"):
        prune_mlp_neurons(model, 0)


# ---------------------------------------------------------------------------------------------
# Exercise 16.4: rank_for_energy, low_rank
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.6", "rank_for_energy")
@PROPERTY
@given(s=st.lists(st.floats(0.01, 100), min_size=1, max_size=30), energy=st.floats(0.01, 1.0))
def test_rank_for_energy_is_the_smallest_rank_that_keeps_the_energy(s, energy):
    s = np.sort(np.array(s))[::-1]
    k = rank_for_energy(s, energy)
    share = np.cumsum(s ** 2) / np.sum(s ** 2)
    assert isinstance(k, int) and 1 <= k <= len(s), f"a Python int in [1, {len(s)}]; got {k!r}"
    assert share[k - 1] >= energy - 1e-9, f"rank {k} keeps {share[k - 1]:.6f} < {energy}"
    assert k == 1 or share[k - 2] < energy - 1e-12, f"rank {k - 1} already keeps {share[k - 2]:.6f} >= {energy}"


@pytest.mark.exercise("16.6", "low_rank")
@PROPERTY
@given(n_in=st.integers(1, 12), n_out=st.integers(1, 12), bias=st.booleans(), data=st.data(), seed=st.integers(0, 2**16))
def test_low_rank_is_the_best_approximation_torch_svd_predicts(n_in, n_out, bias, data, seed):
    rank = data.draw(st.integers(1, min(n_in, n_out)))
    layer = Linear(n_in, n_out, bias=bias, rng=seed)
    if bias:
        layer.bias.data[:] = np.random.default_rng(seed).standard_normal(n_out)
    f = low_rank(layer, rank)
    first, second = f.layers
    assert first.weight.shape == (rank, n_in) and first.bias is None and second.weight.shape == (n_out, rank)
    assert (second.bias is not None) == bias
    product = second.weight.data.astype(np.float64) @ first.weight.data.astype(np.float64)
    err = np.linalg.norm(product - layer.weight.data.astype(np.float64))
    torch = torch_or_none()
    s = (torch.linalg.svdvals(torch.from_numpy(layer.weight.data.astype(np.float64))).numpy() if torch is not None
         else np.linalg.svd(layer.weight.data.astype(np.float64), compute_uv=False))
    expected = np.sqrt(np.sum(s[rank:] ** 2))
    assert abs(err - expected) <= 1e-4 * max(1.0, s[0]), f"rank {rank}: ||AB - W|| = {err:.6g}; Eckart-Young (torch svdvals) gives {expected:.6g}"
    x = np.random.default_rng(seed).standard_normal((3, n_in)).astype(np.float32)
    if rank == min(n_in, n_out):
        np.testing.assert_allclose(f(x).data, layer(x).data, rtol=1e-4, atol=1e-5, err_msg="full rank reproduces the layer")


@pytest.mark.exercise("16.6", "low_rank")
@pytest.mark.parametrize("bad", [0, 7, -2, 3.0, True, None])
def test_low_rank_refuses_a_bad_rank_naming_it(bad):
    with pytest.raises(ValueError) as e:
        low_rank(Linear(6, 9, rng=0), bad)
    expected = f"low_rank: rank must be an integer between 1 and min(out_features, in_features) = 6 for a Linear(6, 9); got {bad!r}"
    assert str(e.value) == expected, f"error text {str(e.value)!r}; expected {expected!r}"


@pytest.mark.exercise("16.6", "rank_for_energy")
@pytest.mark.parametrize("bad", [0, 1.01, -0.5, True])
def test_rank_for_energy_refuses_a_bad_energy(bad):
    with pytest.raises(ValueError) as e:
        rank_for_energy(np.array([2.0, 1.0]), bad)
    assert str(e.value) == f"rank_for_energy: energy must be in (0, 1] (the share of the squared singular values kept); got {bad!r}"


@pytest.mark.exercise("16.6", "low_rank")
def test_model_cost_flops_equal_flop_counter_mode():
    torch = torch_or_none()
    dense = mlp([64, 256, 256, 10], seed=0)
    factored = low_rank_model(dense, rank=16)
    assert [type(layer).__name__ for layer in factored.layers] == ["Sequential", "ReLU", "Sequential", "ReLU", "Linear"], \
        "rank 16 saves parameters in the two big layers; the 256x10 one (break-even rank 9.6) stays"
    for model in (dense, factored):
        cost = model_cost(model)
        assert cost["params"] == model.num_parameters() and cost["bytes"] == 4 * cost["params"]
        closed = sum(2 * layer.weight.shape[0] * layer.weight.shape[1] for layer in model.modules() if isinstance(layer, Linear))
        assert cost["flops"] == closed
        if torch is not None:
            from torch.utils.flop_counter import FlopCounterMode
            ref = torch_mlp(torch, model)
            assert sum(p.numel() for p in ref.parameters()) == cost["params"], "parameter count vs the torch model"
            with FlopCounterMode(display=False) as counter:
                ref(torch.zeros(1, 64))
            assert counter.get_total_flops() == cost["flops"], f"model_cost {cost['flops']:,} FLOPs; FlopCounterMode {counter.get_total_flops():,}"
            x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
            np.testing.assert_allclose(model(x).data, ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.exercise("16.6", "low_rank")
def test_low_rank_model_at_full_rank_and_by_energy():
    require("16.6")
    model = mlp([8, 12, 3], seed=1)
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    full = low_rank_model(model, rank=100)   # factoring at full rank saves nothing: layers kept as they are
    assert all(a is b for a, b in zip(full.layers, model.layers))
    by_energy = low_rank_model(model, energy=1.0)
    np.testing.assert_allclose(by_energy(x).data, model(x).data, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="exactly one of rank or energy"):
        low_rank_model(model)


# ---------------------------------------------------------------------------------------------
# Exercise 16.5: distillation_loss
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("16.7", "distillation_loss")
@PROPERTY
@given(n=st.integers(1, 6), c=st.integers(2, 7), temperature=st.floats(0.5, 10), alpha=st.floats(0, 1),
       scale=st.sampled_from([0.1, 1.0, 5.0]), seed=st.integers(0, 2**16))
def test_distillation_loss_value_and_gradient_equal_torch(n, c, temperature, alpha, scale, seed):
    rng = np.random.default_rng(seed)
    zs, zt = rng.standard_normal((n, c)) * scale, rng.standard_normal((n, c)) * scale * 2
    y = rng.integers(0, c, n)
    student = Tensor(zs, dtype=np.float64, requires_grad=True)
    loss = distillation_loss(student, zt, y, temperature, alpha)
    assert isinstance(loss, Tensor) and loss.shape == () and loss.dtype == np.float64, \
        f"a 0-d float64 Tensor for float64 logits; got {type(loss).__name__} {getattr(loss, 'shape', '')} {getattr(loss, 'dtype', '')}"
    loss.backward()
    torch = torch_or_none()
    if torch is not None:
        F = torch.nn.functional
        s = torch.tensor(zs, requires_grad=True)
        t = torch.tensor(zt)
        ref = alpha * F.cross_entropy(s, torch.from_numpy(y)) + (1 - alpha) * temperature ** 2 * F.kl_div(
            F.log_softmax(s / temperature, dim=1), F.log_softmax(t / temperature, dim=1),
            reduction="batchmean", log_target=True)
        ref.backward()
        value, grad = ref.item(), s.grad.numpy()
    else:
        value = ref_distillation(zs, zt, y, temperature, alpha)
        grad = numeric_grads(lambda a: np.asarray(ref_distillation(a, zt, y, temperature, alpha)), [zs], np.ones(()))[0][0]
    assert abs(loss.item() - value) <= 1e-9 * max(1.0, abs(value)), f"loss {loss.item():.12g}; torch's formula gives {value:.12g}"
    tol = dict(rtol=1e-6, atol=1e-9) if torch is not None else dict(rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(student.grad.data, grad, **tol, err_msg="gradient of the student's logits")


@pytest.mark.exercise("16.7", "distillation_loss")
def test_distillation_loss_trains_a_student_and_leaves_the_teacher_alone():
    rng = np.random.default_rng(0)
    teacher = Tensor(rng.standard_normal((8, 4)).astype(np.float32), requires_grad=True)
    student = mlp([5, 4], seed=0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = rng.integers(0, 4, 8)
    loss = distillation_loss(student(x), teacher * 1.0, y, 2.0, 0.0)
    loss.backward()
    assert teacher.grad is None, "the teacher is a constant: no gradient may reach it"
    assert student.layers[0].weight.grad is not None and np.abs(student.layers[0].weight.grad.data).sum() > 0
    huge = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
    assert np.isfinite(distillation_loss(Tensor(huge[:, ::-1].copy()), huge, np.array([0]), 1.0, 0.5).item())


@pytest.mark.exercise("16.7", "distillation_loss")
@pytest.mark.parametrize("kwargs, text", [
    (dict(temperature=0), "distillation_loss: temperature must be > 0 (1 is the plain softmax; 2 to 10 are usual); got 0"),
    (dict(temperature=-1.5), "distillation_loss: temperature must be > 0 (1 is the plain softmax; 2 to 10 are usual); got -1.5"),
    (dict(alpha=1.5), "distillation_loss: alpha must be in [0, 1] (the weight of the hard-label loss); got 1.5"),
    (dict(alpha=-0.1), "distillation_loss: alpha must be in [0, 1] (the weight of the hard-label loss); got -0.1"),
])
def test_distillation_loss_refuses_bad_settings(kwargs, text):
    z = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ValueError) as e:
        distillation_loss(Tensor(z), z, np.array([0, 1]), **kwargs)
    assert str(e.value) == text, f"error text {str(e.value)!r}; expected {text!r}"
    with pytest.raises(ValueError, match=r"student logits of shape \(2, 3\) and teacher logits of shape \(2, 4\)"):
        distillation_loss(Tensor(z), np.zeros((2, 4)), np.array([0, 1]))


def test_compression_does_not_touch_the_original_model():
    model = mlp([6, 10, 3], seed=0)
    before = copy.deepcopy(model.state_dict())
    prune_mlp_neurons(model, 0.5)
    low_rank_model(model, rank=2)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items()), "structured pruning and low rank must copy"
