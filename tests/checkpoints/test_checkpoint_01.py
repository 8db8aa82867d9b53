"""Checkpoint 01: can your Tensor carry a small preprocessing and projection pipeline?

A batch of data is standardised with broadcasting statistics, projected with a matrix product,
turned into class probabilities with reflected `**` (e ** x), reduced to a scalar loss, and split
into a batch of views whose Gram matrices come from a batched matmul. Every step is recomputed in
NumPy (float64) and compared.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tinytorch.core.tensor import Tensor

pytestmark = pytest.mark.module("01")

RTOL, ATOL = 1e-4, 1e-4


def close(got, expected, step: str, rtol=RTOL, atol=ATOL):
    assert isinstance(got, Tensor), f"{step}: got a {type(got).__name__}; expected a Tensor"
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{step}: shape {got.shape}; expected {expected.shape}"
    assert got.dtype == np.float32, f"{step}: dtype {got.dtype}; expected float32"
    np.testing.assert_allclose(got.data, expected, rtol=rtol, atol=atol, err_msg=f"{step}: values differ from NumPy")


def test_standardise_project_reduce_pipeline():
    rng = np.random.default_rng(0)
    n, d, k = 64, 8, 3
    raw = (rng.standard_normal((n, d)) * rng.uniform(0.5, 5.0, d) + rng.uniform(-3, 3, d)).astype(np.float32)
    w = rng.standard_normal((d, k)).astype(np.float32) / math.sqrt(d)
    b = rng.standard_normal(k).astype(np.float32)
    ref = raw.astype(np.float64)

    # 1. Data as a float32 tensor: float64 input is converted, metadata read from the buffer.
    x = Tensor(raw.astype(np.float64))
    assert x.dtype == np.float32 and x.shape == (n, d) and x.nbytes == n * d * 4, (
        f"Tensor of a (64, 8) float64 array: dtype {x.dtype}, shape {x.shape}, nbytes {x.nbytes}; "
        f"expected float32, (64, 8), {n * d * 4}")

    # 2. Standardise per feature: (1, d) statistics broadcast against (n, d).
    mu = x.mean(axis=0, keepdims=True)
    close(mu, ref.mean(axis=0, keepdims=True), "x.mean(axis=0, keepdims=True)")
    var = ((x - mu) ** 2).mean(axis=0, keepdims=True)
    sigma = (var + 1e-5) ** 0.5
    z = (x - mu) / sigma
    ref_z = (ref - ref.mean(0, keepdims=True)) / np.sqrt(ref.var(0, keepdims=True) + 1e-5)
    close(z, ref_z, "standardised batch (x - mu) / sigma")
    close(z.mean(axis=0), np.zeros(d), "per-feature mean after standardising", atol=1e-5)
    close((z ** 2).mean(axis=0), np.ones(d), "per-feature variance after standardising", atol=1e-3)

    # 3. Project: (n, d) @ (d, k) + (k,).
    y = z @ Tensor(w) + Tensor(b)
    ref_y = ref_z @ w.astype(np.float64) + b
    close(y, ref_y, "z @ W + b")

    # 4. Stable softmax with broadcasting, max and reflected ** (e ** x), then a scalar loss.
    shifted = y - y.max(axis=1, keepdims=True)
    e = math.e ** shifted
    p = e / e.sum(axis=-1, keepdims=True)
    ref_e = np.exp(ref_y - ref_y.max(axis=1, keepdims=True))
    ref_p = ref_e / ref_e.sum(axis=-1, keepdims=True)
    close(p, ref_p, "softmax probabilities")
    close(p.sum(axis=1), np.ones(n), "probabilities sum to 1 per row", atol=1e-5)
    loss = (-(p * y)).sum(axis=1).mean()
    assert loss.shape == (), f"the loss has shape {loss.shape}; expected () (a scalar)"
    assert isinstance(loss.item(), float), f"loss.item() gave {type(loss.item()).__name__}; expected a Python float"
    np.testing.assert_allclose(loss.item(), (-(ref_p * ref_y)).sum(axis=1).mean(), rtol=RTOL, atol=ATOL,
                               err_msg="scalar loss")

    # 5. Views: split the batch into 4 groups (a view), swap the last two axes (a view), and
    #    compute each group's (d, d) Gram matrix with one batched matmul.
    groups = z.reshape(4, -1, d)
    assert groups.shape == (4, 16, d) and np.shares_memory(groups.data, z.data), (
        f"z.reshape(4, -1, 8) gave shape {groups.shape}; expected (4, 16, 8) sharing z's memory")
    gt = groups.transpose(-2, -1)
    assert gt.shape == (4, d, 16) and np.shares_memory(gt.data, z.data) and not gt.is_contiguous(), (
        "groups.transpose(-2, -1) must be a non-contiguous (4, 8, 16) view of the same memory")
    gram = gt @ groups / 16.0
    ref_groups = ref_z.reshape(4, -1, d)
    close(gram, np.swapaxes(ref_groups, -2, -1) @ ref_groups / 16.0, "batched Gram matrices")
    close(gram.sum(axis=(-2, -1)), (np.swapaxes(ref_groups, -2, -1) @ ref_groups / 16.0).sum(axis=(-2, -1)),
          "Gram matrix totals", atol=1e-3)

    # 6. Nothing above changed the input data.
    np.testing.assert_array_equal(x.data, raw, err_msg="the pipeline modified its input tensor")


def test_integer_labels_stay_integers_and_pick_rows():
    labels = Tensor(np.array([2, 0, 1, 2]))
    assert labels.dtype.kind == "i", f"class labels have dtype {labels.dtype}; expected an integer dtype"
    table = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    picked = table[np.arange(4), labels]
    np.testing.assert_array_equal(picked.data, [2.0, 3.0, 7.0, 11.0], err_msg="table[rows, labels] picks one score per row")
    counts = (labels * 0 + 1).sum()
    assert counts.item() == 4 and counts.dtype.kind == "i", f"(labels * 0 + 1).sum() gave {counts!r}; expected integer 4"
