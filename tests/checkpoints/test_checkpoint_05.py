"""Checkpoint 05: can your Tensor and DataLoader feed a training loop?

Only modules 01 (Tensor) and 05 (dataloader) are used. The bundled digits are streamed through a
shuffled, seeded DataLoader, and per-batch statistics computed with Tensor operations (sums and
sums of squares over the batch axis, label counts through a one-hot matmul) are combined into
dataset statistics, which must equal the same statistics computed in float64 NumPy on the whole
array at once. Those statistics then drive a `Normalize` transform, and one more epoch must come
out standardised. Every number is recomputed without the loader and compared.
"""
from __future__ import annotations

import numpy as np
import pytest

from tinytorch.core.tensor import Tensor
from tinytorch.data.loader import DataLoader, Normalize, load_digits

pytestmark = pytest.mark.module("05")


def stream_statistics(loader, n_classes=10):
    "Per-feature mean and std, label counts and sample count of one epoch, from per-batch Tensor sums."
    eye = Tensor(np.eye(n_classes, dtype=np.float32))
    total, total_sq, counts, n, batches = None, None, None, 0, 0
    for x, y in loader:
        assert isinstance(x, Tensor) and isinstance(y, Tensor), "the loader must yield Tensors"
        s = x.sum(axis=0)                         # (64,) per-batch sum, a Tensor reduction
        sq = (x * x).sum(axis=0)                  # (64,) per-batch sum of squares
        c = eye[y].sum(axis=0)                    # one-hot rows gathered by label, summed: class counts
        total = s if total is None else total + s
        total_sq = sq if total_sq is None else total_sq + sq
        counts = c if counts is None else counts + c
        n += len(y)
        batches += 1
    mean = total / n
    var = total_sq / n - mean * mean
    return mean.data.astype(np.float64), np.sqrt(np.maximum(var.data, 0.0)), counts.data, n, batches


@pytest.mark.parametrize("split,n", [("train", 1437), ("test", 360)])
def test_streamed_statistics_equal_whole_array_statistics(split, n):
    ds = load_digits(split)
    loader = DataLoader(ds, batch_size=64, shuffle=True, seed=5)
    mean, std, counts, seen, batches = stream_statistics(loader)
    x = ds.tensors[0].data.astype(np.float64)
    labels = ds.tensors[1].data
    assert seen == n and batches == len(loader) == -(-n // 64), f"{seen} samples in {batches} batches from {n} and len {len(loader)}"
    np.testing.assert_allclose(mean, x.mean(axis=0), atol=1e-5, err_msg="streamed per-pixel mean")
    np.testing.assert_allclose(std, x.std(axis=0), atol=1e-3, err_msg="streamed per-pixel std")
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=10), err_msg="label counts via one-hot")


def test_shuffling_changes_the_order_not_the_content():
    ds = load_digits("train")
    plain = [b for b in DataLoader(ds, batch_size=100)]
    shuffled = [b for b in DataLoader(ds, batch_size=100, shuffle=True, seed=0)]
    first_plain = np.concatenate([y.data for _, y in plain])
    first_shuffled = np.concatenate([y.data for _, y in shuffled])
    assert not np.array_equal(first_plain, first_shuffled), "shuffle=True must change the order of the samples"
    np.testing.assert_array_equal(np.sort(first_plain), np.sort(first_shuffled))
    total_plain = sum(x.sum().item() for x, _ in plain)
    total_shuffled = sum(x.sum().item() for x, _ in shuffled)
    assert total_plain == pytest.approx(total_shuffled, rel=1e-6), "the same pixels are visited either way"


def test_normalized_epoch_is_standardised():
    train = load_digits("train")
    mean, std, _, _, _ = stream_statistics(DataLoader(train, batch_size=128))
    std = np.where(std > 1e-6, std, 1.0)      # constant border pixels: leave them centred, not divided by 0
    loader = DataLoader(train, batch_size=128, shuffle=True, seed=1, drop_last=True, transform=Normalize(mean, std))
    new_mean, new_std, _, seen, _ = stream_statistics(loader)
    assert seen == len(train) // 128 * 128 and seen < len(train), "drop_last drops the ragged batch"
    assert np.abs(new_mean).max() < 0.1, f"normalised data should have mean near 0; largest |mean| {np.abs(new_mean).max():.3f}"
    varying = train.tensors[0].data.std(axis=0) > 1e-6
    assert np.all(np.abs(new_std[varying] - 1.0) < 0.1), "normalised pixels should have std near 1"


def test_a_linear_score_per_batch_matches_numpy():
    train = load_digits("train")
    w = Tensor(np.random.default_rng(0).standard_normal((64, 10)) * 0.1)
    loader = DataLoader(train, batch_size=50, shuffle=True, seed=3)
    scores, labels = [], []
    for x, y in loader:
        scores.append((x @ w).data)
        labels.append(y.data)
    scores, labels = np.concatenate(scores), np.concatenate(labels)
    order = np.concatenate(DataLoader(train, batch_size=50, shuffle=True, seed=3).batch_indices())
    ref = train.tensors[0].data[order].astype(np.float64) @ w.data.astype(np.float64)
    np.testing.assert_allclose(scores, ref, rtol=1e-4, atol=1e-5, err_msg="x @ W over shuffled batches")
    np.testing.assert_array_equal(labels, train.tensors[1].data[order])
