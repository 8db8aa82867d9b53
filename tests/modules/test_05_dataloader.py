"""Module 05 (dataloader): the exported `tinytorch.data.loader` checked against plain NumPy.

Batching is checked as a property: hypothesis draws dataset sizes, batch sizes, `shuffle`,
`drop_last` and seeds, and every epoch must visit each sample exactly once (or, with `drop_last`,
at most once and only in full batches). The bundled digits are compared with scikit-learn's copy
when it is installed (provenance), and the MNIST / CIFAR-10 loaders are run on small files that
the tests write in the real formats (IDX with its magic numbers, gzipped or not; pickled CIFAR
batches), including corrupt, truncated and missing ones.

Each test is marked with the exercise it checks, e.g. `@pytest.mark.exercise("5.4",
"DataLoader.__iter__")`: run one exercise with
`pytest tests/modules/test_05_dataloader.py --exercise 5.4`.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytorch.core.tensor import Tensor
from tinytorch.data import loader as L
from tinytorch.data.loader import (
    Compose,
    DataLoader,
    Dataset,
    Flatten,
    Normalize,
    TensorDataset,
    ToFloat,
    load_cifar10,
    load_digits,
    load_mnist,
    load_text_corpus,
)

pytestmark = pytest.mark.module("05")

PROPERTY = settings(max_examples=60, deadline=None)


def labelled(n: int, features: int = 3):
    "x[i] = [i, i + 0.5, ...] and y[i] = i: any batch can be checked for pairing and coverage."
    y = np.arange(n, dtype=np.int64)
    x = (y[:, None] + 0.5 * np.arange(features)[None, :]).astype(np.float32)
    return x, y


class Rows(Dataset):
    """Rows of NumPy arrays, written here so that the DataLoader tests (5.3, 5.4) do not depend on
    your TensorDataset (5.1, 5.2). Its get_batch returns plain arrays: the loader makes Tensors."""

    def __init__(self, *arrays):
        self.arrays = tuple(np.asarray(a) for a in arrays)

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)

    def get_batch(self, indices):
        return tuple(a[np.asarray(indices, dtype=np.intp)] for a in self.arrays)


def epoch(loader):
    "All batches of one epoch as a list of tuples of arrays (and checks they are Tensors)."
    out = []
    for batch in loader:
        assert isinstance(batch, tuple), f"a batch must be a tuple of Tensors; got {type(batch).__name__}"
        assert all(isinstance(b, Tensor) for b in batch), f"every field of a batch must be a Tensor; got {[type(b).__name__ for b in batch]}"
        out.append(tuple(b.data for b in batch))
    return out


# ---------------------------------------------------------------------------------------------
# 5.1 TensorDataset: __init__, __len__, __getitem__
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("5.1", "TensorDataset.__getitem__")
@PROPERTY
@given(n=st.integers(1, 40), features=st.integers(1, 5), data=st.data())
def test_tensor_dataset_samples_are_rows(n, features, data):
    x, y = labelled(n, features)
    ds = TensorDataset(x, y)
    assert len(ds) == n, f"len(TensorDataset(x, y)) with {n} rows gave {len(ds)}"
    i = data.draw(st.integers(-n, n - 1))
    sample = ds[i]
    assert isinstance(sample, tuple) and len(sample) == 2, f"ds[{i}] must be a tuple (x[i], y[i]); got {sample!r}"
    assert isinstance(sample[0], Tensor) and isinstance(sample[1], Tensor), "the fields of a sample must be Tensors"
    np.testing.assert_array_equal(sample[0].data, x[i], err_msg=f"TensorDataset.__getitem__({i}): x row")
    assert sample[1].item() == y[i], f"ds[{i}][1] gave {sample[1].item()}; expected {y[i]}"


@pytest.mark.exercise("5.1", "TensorDataset.__init__")
def test_tensor_dataset_converts_inputs_to_tensors():
    ds = TensorDataset(np.zeros((4, 2)), [0, 1, 2, 3], Tensor(np.ones(4)))
    assert len(ds.tensors) == 3 and all(isinstance(t, Tensor) for t in ds.tensors), "self.tensors must hold Tensors"
    assert ds.tensors[0].dtype == np.float32, f"float64 arrays become float32 Tensors; got {ds.tensors[0].dtype}"
    assert ds.tensors[1].dtype.kind == "i", f"integer labels must stay integers; got {ds.tensors[1].dtype}"
    assert len(TensorDataset(np.ones((3, 2)))[0]) == 1, "a one-tensor dataset returns 1-tuples"


@pytest.mark.exercise("5.1", "TensorDataset.__init__")
@pytest.mark.parametrize("shapes", [[(6, 2), (5,)], [(3,), (3, 4), (2, 1)]])
def test_tensor_dataset_rejects_different_lengths_naming_the_shapes(shapes):
    with pytest.raises(ValueError) as info:
        TensorDataset(*[np.zeros(s) for s in shapes])
    for s in shapes:
        assert str(s) in str(info.value), f"the error must list every shape ({shapes}); got: {info.value}"


@pytest.mark.exercise("5.1", "TensorDataset.__init__")
def test_tensor_dataset_rejects_no_tensors_and_scalars():
    with pytest.raises(ValueError):
        TensorDataset()
    with pytest.raises(ValueError):
        TensorDataset(np.float32(3.0))


@pytest.mark.exercise("5.1", "TensorDataset.__getitem__")
def test_tensor_dataset_index_out_of_range():
    ds = TensorDataset(*labelled(5))
    for bad in (5, -6, 100):
        with pytest.raises(IndexError) as info:
            ds[bad]
        assert str(bad) in str(info.value), f"the IndexError should name the index {bad}; got: {info.value}"


# ---------------------------------------------------------------------------------------------
# 5.2 TensorDataset.get_batch
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("5.2", "TensorDataset.get_batch")
@PROPERTY
@given(n=st.integers(1, 50), data=st.data())
def test_get_batch_equals_numpy_fancy_indexing(n, data):
    x, y = labelled(n, 4)
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=2 * n)), dtype=np.int64)
    bx, by = TensorDataset(x, y).get_batch(idx)
    assert isinstance(bx, Tensor) and isinstance(by, Tensor), "get_batch must return a tuple of Tensors"
    np.testing.assert_array_equal(bx.data, x[idx], err_msg=f"get_batch({idx.tolist()}): x")
    np.testing.assert_array_equal(by.data, y[idx], err_msg=f"get_batch({idx.tolist()}): y")


@pytest.mark.exercise("5.2", "TensorDataset.get_batch")
def test_get_batch_gathers_whole_arrays_not_samples():
    class NoPerSample(TensorDataset):
        def __getitem__(self, index):
            raise AssertionError("TensorDataset.get_batch called __getitem__: gather whole arrays with one x[indices]")

    bx, by = NoPerSample(*labelled(8)).get_batch(np.array([7, 0, 3]))
    np.testing.assert_array_equal(by.data, [7, 0, 3])


@pytest.mark.exercise("5.2", "TensorDataset.get_batch")
def test_get_batch_is_a_copy():
    x, y = labelled(6)
    ds = TensorDataset(x, y)
    bx, _ = ds.get_batch([1, 2])
    assert not np.shares_memory(bx.data, ds.tensors[0].data), "a gathered batch is a new array, not a view"
    bx.data[:] = -1
    assert ds.tensors[0].data.min() >= 0, "writing into a batch must not change the dataset"


# ---------------------------------------------------------------------------------------------
# 5.3 DataLoader.__len__ and DataLoader.batch_indices
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("5.3", "DataLoader.batch_indices")
@PROPERTY
@given(n=st.integers(0, 200), batch_size=st.integers(1, 64), shuffle=st.booleans(), drop_last=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_batch_indices_cover_the_epoch(n, batch_size, shuffle, drop_last, seed):
    loader = DataLoader(Rows(np.arange(n)), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    batches = loader.batch_indices()
    expected_batches = n // batch_size if drop_last else -(-n // batch_size)
    assert len(batches) == expected_batches, (
        f"n={n}, batch_size={batch_size}, drop_last={drop_last}: {len(batches)} batches; expected {expected_batches}")
    assert len(loader) == expected_batches, f"len(loader) gave {len(loader)}; expected {expected_batches}"
    sizes = [len(b) for b in batches]
    assert all(s == batch_size for s in sizes[:-1]), f"every batch but the last must be full; sizes {sizes}"
    if drop_last and sizes:
        assert sizes[-1] == batch_size, f"drop_last=True must drop the ragged batch; sizes {sizes}"
    seen = np.concatenate(batches) if batches else np.array([], dtype=int)
    assert len(np.unique(seen)) == len(seen), "a sample must not appear twice in one epoch"
    assert set(seen.tolist()) <= set(range(n)), "indices must lie in range(len(dataset))"
    if drop_last:
        assert len(seen) == n - n % batch_size
    else:
        np.testing.assert_array_equal(np.sort(seen), np.arange(n), err_msg="every sample exactly once per epoch")
    if not shuffle:
        np.testing.assert_array_equal(seen, np.arange(len(seen)), err_msg="shuffle=False keeps the order 0..N-1")


@pytest.mark.exercise("5.3", "DataLoader.batch_indices")
def test_same_seed_same_epochs_and_each_epoch_new():
    ds = Rows(np.arange(100))
    a = DataLoader(ds, batch_size=16, shuffle=True, seed=123)
    b = DataLoader(ds, batch_size=16, shuffle=True, seed=123)
    ea = [np.concatenate(a.batch_indices()) for _ in range(3)]
    eb = [np.concatenate(b.batch_indices()) for _ in range(3)]
    for k in range(3):
        np.testing.assert_array_equal(ea[k], eb[k], err_msg=f"epoch {k}: loaders with the same seed must agree")
    assert not np.array_equal(ea[0], ea[1]), "each epoch must draw a new permutation from the loader's generator"
    assert not np.array_equal(ea[0], np.arange(100)), "shuffle=True must change the order"
    c = DataLoader(ds, batch_size=16, shuffle=True, seed=124)
    assert not np.array_equal(np.concatenate(c.batch_indices()), ea[0]), "a different seed should give a different order"


@pytest.mark.exercise("5.3", "DataLoader.__len__")
@pytest.mark.parametrize("n,bs,drop,expected", [(10, 4, False, 3), (10, 4, True, 2), (8, 4, False, 2), (3, 4, True, 0),
                                                 (0, 4, False, 0), (1437, 64, False, 23), (1437, 64, True, 22)])
def test_len_is_the_number_of_batches(n, bs, drop, expected):
    got = len(DataLoader(Rows(np.arange(n)), batch_size=bs, drop_last=drop))
    assert got == expected, f"len(DataLoader) for {n} samples, batch_size={bs}, drop_last={drop} gave {got}; expected {expected}"


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError):
        DataLoader(Rows(np.arange(4)), batch_size=bad)


# ---------------------------------------------------------------------------------------------
# 5.4 DataLoader.__iter__
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("5.4", "DataLoader.__iter__")
@PROPERTY
@given(n=st.integers(0, 150), batch_size=st.integers(1, 40), shuffle=st.booleans(), drop_last=st.booleans(),
       seed=st.integers(0, 1000))
def test_iteration_yields_paired_batches_covering_every_sample(n, batch_size, shuffle, drop_last, seed):
    x, y = labelled(n)
    loader = DataLoader(Rows(x, y), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    batches = epoch(loader)
    assert len(batches) == len(loader), f"iteration gave {len(batches)} batches but len(loader) is {len(loader)}"
    for bx, by in batches:
        assert bx.shape == (len(by), 3), f"batch shapes {bx.shape} and {by.shape} do not match"
        np.testing.assert_array_equal(bx, x[by], err_msg="inputs and labels of a batch must stay paired")
        if drop_last:
            assert len(by) == batch_size
    seen = np.concatenate([b[1] for b in batches]) if batches else np.array([], dtype=np.int64)
    if drop_last:
        assert len(np.unique(seen)) == len(seen) == n - n % batch_size
    else:
        np.testing.assert_array_equal(np.sort(seen), y, err_msg="an epoch must visit every sample exactly once")


@pytest.mark.exercise("5.4", "DataLoader.__iter__")
def test_iteration_is_reproducible_with_a_seed_and_new_each_epoch():
    ds = Rows(*labelled(50))
    a, b = DataLoader(ds, batch_size=8, shuffle=True, seed=7), DataLoader(ds, batch_size=8, shuffle=True, seed=7)
    a1, a2 = epoch(a), epoch(a)
    b1, b2 = epoch(b), epoch(b)
    order = lambda batches: np.concatenate([bt[1] for bt in batches])
    np.testing.assert_array_equal(order(a1), order(b1), err_msg="same seed, first epoch")
    np.testing.assert_array_equal(order(a2), order(b2), err_msg="same seed, second epoch")
    assert not np.array_equal(order(a1), order(a2)), "the second epoch must be shuffled differently from the first"


@pytest.mark.exercise("5.4", "DataLoader.__iter__")
def test_iteration_fetches_each_batch_with_one_get_batch_call():
    calls = []

    class Counting(Rows):
        def get_batch(self, indices):
            calls.append(len(indices))
            return super().get_batch(indices)

    epoch(DataLoader(Counting(*labelled(10)), batch_size=4))
    assert calls == [4, 4, 2], f"__iter__ must call dataset.get_batch once per batch; calls with sizes {calls}"


@pytest.mark.exercise("5.4", "DataLoader.__iter__")
def test_transform_applies_to_the_inputs_only():
    x, y = labelled(6)
    seen = []

    def double(t):
        seen.append(t.shape)
        assert isinstance(t, Tensor), "transforms receive Tensors"
        return t * 2

    batches = epoch(DataLoader(Rows(x, y), batch_size=4, transform=double))
    assert seen == [(4, 3), (2, 3)], f"the transform must see each input batch once; it saw shapes {seen}"
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), 2 * x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y, err_msg="labels are not transformed")


@pytest.mark.exercise("5.4", "DataLoader.__iter__")
def test_generic_datasets_are_stacked_sample_by_sample():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i, -i], dtype=np.float32), i * i

    class DuckTyped:  # not a Dataset subclass: only __len__ and __getitem__
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return Tensor([float(i)])

    batches = epoch(DataLoader(Squares(), batch_size=2))
    assert [b[1].tolist() for b in batches] == [[0, 1], [4, 9], [16]], f"got label batches {[b[1].tolist() for b in batches]}"
    assert batches[0][0].shape == (2, 2)
    single = epoch(DataLoader(DuckTyped(), batch_size=2))
    assert [len(b) for b in single] == [1, 1] and single[0][0].shape == (2, 1), "single-value samples give 1-tuples"


@pytest.mark.exercise("5.4", "DataLoader.__iter__")
def test_a_loader_can_be_iterated_many_times():
    loader = DataLoader(Rows(*labelled(9)), batch_size=4)
    assert [len(epoch(loader)) for _ in range(3)] == [3, 3, 3]


def test_dataset_base_class_is_abstract():
    with pytest.raises(TypeError):
        Dataset()


# ---------------------------------------------------------------------------------------------
# 5.5 Normalize (and the given transforms)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("5.5", "Normalize.__call__")
@PROPERTY
@given(n=st.integers(1, 4), c=st.integers(1, 4), h=st.integers(1, 3), w=st.integers(1, 3), seed=st.integers(0, 100))
def test_normalize_per_channel_matches_numpy(n, c, h, w, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    mean = rng.standard_normal(c).astype(np.float32)
    std = rng.uniform(0.5, 2.0, c).astype(np.float32)
    got = Normalize(mean, std)(Tensor(x))
    expected = (x - mean[None, :, None, None]) / std[None, :, None, None]
    assert isinstance(got, Tensor) and got.dtype == np.float32, f"Normalize must return a float32 Tensor; got {got!r}"
    np.testing.assert_allclose(got.data, expected, rtol=1e-6, atol=1e-6, err_msg="per-channel Normalize on (N, C, H, W)")


@pytest.mark.exercise("5.5", "Normalize.__call__")
def test_normalize_scalar_per_feature_and_last_axis():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(Normalize(2.0, 4.0)(Tensor(x)).data, (x - 2) / 4)
    m, s = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(Normalize(m, s)(Tensor(x)).data, (x - m) / s, rtol=1e-6)
    x3 = np.ones((2, 5, 2), dtype=np.float32)
    np.testing.assert_allclose(Normalize([0.0, 1.0], [1.0, 2.0], axis=-1)(x3).data[..., 1], 0.0)
    assert isinstance(Normalize(0.0, 1.0)(x), Tensor), "NumPy input must be accepted and give a Tensor"


@pytest.mark.exercise("5.5", "Normalize.__call__")
def test_normalize_errors_and_no_side_effects():
    with pytest.raises(ValueError) as info:
        Normalize([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])(Tensor(np.zeros((4, 2))))
    assert "(4, 2)" in str(info.value), f"the error must name the batch shape; got: {info.value}"
    with pytest.raises(ValueError):
        Normalize(0.0, 0.0)
    with pytest.raises(ValueError):
        Normalize([0.0, 1.0], [1.0])
    raw = np.full((2, 2), 3.0, dtype=np.float32)
    Normalize(1.0, 2.0)(Tensor(raw))
    assert np.all(raw == 3.0), "Normalize must not modify its input"


def test_given_transforms_compose():
    x = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    out = Compose([ToFloat(255), Flatten()])(Tensor(x))
    assert out.shape == (2, 12) and out.dtype == np.float32
    np.testing.assert_allclose(out.data, x.reshape(2, 12) / 255.0, rtol=1e-6)
    assert Compose(ToFloat(2.0))(np.array([4])).data.tolist() == [2.0], "Compose accepts transforms as arguments too"
    with pytest.raises(ValueError):
        ToFloat(0)


# ---------------------------------------------------------------------------------------------
# Bundled data: digits and text
# ---------------------------------------------------------------------------------------------
def _digits_npz():
    with np.load(io.BytesIO(L.bundled_file("digits.npz").read_bytes())) as f:
        return {k: f[k] for k in f.files}


def test_digits_file_layout():
    d = _digits_npz()
    assert {"x_train", "y_train", "x_test", "y_test"} <= set(d), f"digits.npz keys: {sorted(d)}"
    assert d["x_train"].dtype == np.uint8 and d["x_train"].shape == (1437, 8, 8)
    assert d["x_test"].dtype == np.uint8 and d["x_test"].shape == (360, 8, 8)
    assert d["y_train"].dtype == np.int64 and d["y_test"].dtype == np.int64
    assert d["x_train"].max() == 16 and d["x_test"].max() <= 16, "pixel counts run 0..16"
    assert np.intersect1d(d["idx_train"], d["idx_test"]).size == 0, "train and test must not share samples"
    np.testing.assert_array_equal(np.sort(np.concatenate([d["idx_train"], d["idx_test"]])), np.arange(1797))


@pytest.mark.parametrize("split,n", [("train", 1437), ("test", 360)])
def test_load_digits_shapes_dtypes_and_ranges(split, n):
    ds = load_digits(split)
    x, y = ds.tensors
    assert isinstance(ds, TensorDataset) and len(ds) == n, f"load_digits({split!r}) has {len(ds)} samples; expected {n}"
    assert x.shape == (n, 64) and x.dtype == np.float32, f"images: {x.shape} {x.dtype}; expected ({n}, 64) float32"
    assert y.shape == (n,) and y.dtype == np.int64, f"labels: {y.shape} {y.dtype}; expected ({n},) int64"
    assert x.data.min() == 0.0 and x.data.max() == 1.0, "pixels scaled to [0, 1]"
    np.testing.assert_array_equal(x.data * 16, np.round(x.data * 16), err_msg="pixels are counts / 16")
    counts = np.bincount(y.data, minlength=10)
    assert len(counts) == 10 and counts.min() > 0, f"all ten classes in the {split} split; counts {counts}"
    assert counts.max() - counts.min() <= 0.1 * counts.mean(), f"the split is stratified; class counts {counts}"
    images = load_digits(split, flatten=False).tensors[0]
    assert images.shape == (n, 1, 8, 8), f"flatten=False gives (N, 1, 8, 8); got {images.shape}"
    np.testing.assert_array_equal(images.data.reshape(n, 64), x.data)


def test_load_digits_rejects_unknown_split():
    with pytest.raises(ValueError, match="validation"):
        load_digits("validation")


def test_digits_equal_scikit_learn_copy():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    ref = sklearn_datasets.load_digits()
    d = _digits_npz()
    for split in ("train", "test"):
        idx = d[f"idx_{split}"]
        np.testing.assert_array_equal(d[f"x_{split}"], ref.images[idx], err_msg=f"{split} images differ from sklearn")
        np.testing.assert_array_equal(d[f"y_{split}"], ref.target[idx], err_msg=f"{split} labels differ from sklearn")
    np.testing.assert_allclose(load_digits("test").tensors[0].data, ref.data[d["idx_test"]] / 16.0, rtol=1e-7)


def test_text_corpus_is_plain_text():
    text = load_text_corpus()
    assert isinstance(text, str), f"load_text_corpus() returned {type(text).__name__}; expected str"
    assert 30_000 <= len(text) <= 100_000, f"corpus has {len(text)} characters; expected 30-100 KB"
    assert text.isascii() and all(ch.isprintable() or ch == "\n" for ch in set(text)), "plain printable text"
    assert text.count("\n\n") >= 20, "stories are separated by blank lines"
    assert text == L.bundled_file("tiny_stories.txt").read_bytes().decode("utf-8")


# ---------------------------------------------------------------------------------------------
# MNIST: IDX files written by the test
# ---------------------------------------------------------------------------------------------
def write_idx(path, array, magic=None, gz=None, truncate=0):
    "Write `array` as IDX (uint8 -> magic 0x0800 | ndim) to `path`; gzip when the name ends in .gz."
    array = np.ascontiguousarray(array)
    code = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}[array.dtype]
    magic = magic if magic is not None else (code << 8) | array.ndim
    payload = magic.to_bytes(4, "big") + np.asarray(array.shape, dtype=">u4").tobytes() + array.tobytes()
    payload = payload[: len(payload) - truncate]
    gz = str(path).endswith(".gz") if gz is None else gz
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def mnist_folder(root, split="train", n=7, rows=5, cols=4, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    prefix = "train" if split == "train" else "t10k"
    ext = ".gz" if gz else ""
    write_idx(root / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(root / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("split", ["train", "test"])
def test_load_mnist_reads_idx_files(tmp_path, gz, split):
    images, labels = mnist_folder(tmp_path, split, gz=gz)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small files under official names: checksum warning (tested below)
        ds = load_mnist(tmp_path, split)
        ds_img = load_mnist(tmp_path, split, flatten=False)
    x, y = ds.tensors
    assert x.shape == (7, 20) and x.dtype == np.float32, f"flattened images {x.shape} {x.dtype}; expected (7, 20) float32"
    np.testing.assert_allclose(x.data, images.reshape(7, 20) / 255.0, rtol=1e-6)
    assert y.dtype == np.int64 and y.data.tolist() == labels.tolist()
    assert ds_img.tensors[0].shape == (7, 1, 5, 4)


def test_load_mnist_missing_split_names_file_folder_and_source(tmp_path):
    mnist_folder(tmp_path, "train")
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(tmp_path, "test", verify=False)
    msg = str(info.value)
    assert "t10k-images-idx3-ubyte" in msg and str(tmp_path) in msg, f"the error must name the file and folder: {msg}"
    assert "https://" in msg, f"the error must say where to get the files: {msg}"


def test_load_mnist_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "nowhere")


def test_load_mnist_missing_labels_file(tmp_path):
    mnist_folder(tmp_path, "train")
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="train-labels-idx1-ubyte"):
        load_mnist(tmp_path, verify=False)


def test_load_mnist_wrong_magic_number(tmp_path):
    mnist_folder(tmp_path, "train", gz=False)
    # a labels file where the images file should be
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros(7, dtype=np.uint8))
    with pytest.raises(ValueError) as info:
        load_mnist(tmp_path, verify=False)
    msg = str(info.value)
    assert "0x00000801" in msg and "0x00000803" in msg, f"the error must show the magic number found and expected: {msg}"


def test_load_mnist_not_an_idx_file(tmp_path):
    mnist_folder(tmp_path, "train", gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"<html>404 Not Found</html>")
    with pytest.raises(ValueError, match="magic"):
        load_mnist(tmp_path, verify=False)


def test_load_mnist_truncated_payload(tmp_path):
    images, _ = mnist_folder(tmp_path, "train", gz=False)
    write_idx(tmp_path / "train-images-idx3-ubyte", images, truncate=10)
    with pytest.raises(ValueError, match="truncated"):
        load_mnist(tmp_path, verify=False)


def test_load_mnist_truncated_gzip(tmp_path):
    mnist_folder(tmp_path, "train", gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(ValueError, match="gzip"):
        load_mnist(tmp_path, verify=False)


def test_load_mnist_count_mismatch(tmp_path):
    mnist_folder(tmp_path, "train", gz=False)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(6, dtype=np.uint8))
    with pytest.raises(ValueError, match="7 images but 6 labels"):
        load_mnist(tmp_path, verify=False)


def test_read_idx_other_dtypes(tmp_path):
    a = np.arange(-6, 6, dtype=">i4").reshape(3, 4)
    got = L.read_idx(write_idx(tmp_path / "ints.idx", a))
    np.testing.assert_array_equal(got, a)
    assert got.dtype == np.int32 and got.dtype.isnative


# ---------------------------------------------------------------------------------------------
# Checksums (same policy for MNIST and CIFAR-10)
# ---------------------------------------------------------------------------------------------
def test_official_checksums_are_listed():
    for name in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "data_batch_1", "test_batch"):
        algo, _, digest = L.KNOWN_CHECKSUMS[name].partition(":")
        assert algo in hashlib.algorithms_available and len(digest) == hashlib.new(algo).digest_size * 2


def test_small_file_under_an_official_name_warns_by_default(tmp_path):
    mnist_folder(tmp_path, "train", gz=True)
    with pytest.warns(UserWarning, match="not the official file"):
        ds = load_mnist(tmp_path)
    assert len(ds) == 7, "after the warning, the file still loads"


def test_verify_true_rejects_a_checksum_mismatch(tmp_path):
    mnist_folder(tmp_path, "train", gz=True)
    with pytest.raises(ValueError, match="expected f68b3c2dcbeaaa9fbdd348bbdeb94873"):
        load_mnist(tmp_path, verify=True)


def test_verify_false_skips_checksums(tmp_path):
    mnist_folder(tmp_path, "train", gz=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_mnist(tmp_path, verify=False)) == 7


def test_checksums_you_pass_are_enforced(tmp_path):
    mnist_folder(tmp_path, "train", gz=False)
    img, lab = tmp_path / "train-images-idx3-ubyte", tmp_path / "train-labels-idx1-ubyte"
    with pytest.raises(ValueError, match="no checksum is known"):
        load_mnist(tmp_path, verify=True)  # nothing to verify the unpacked files against
    good = {img.name: "sha256:" + L.file_digest(img), lab.name: L.file_digest(lab)}  # bare hex means sha256
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_mnist(tmp_path, verify=True, checksums=good)) == 7
    bad = {**good, lab.name: "sha256:" + "0" * 64}
    with pytest.raises(ValueError, match="the checksum you passed"):
        load_mnist(tmp_path, checksums=bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_mnist(tmp_path)) == 7, "unpacked files have no official checksum: no warning by default"


def test_file_digest_matches_hashlib(tmp_path):
    p = tmp_path / "blob"
    p.write_bytes(b"tinytorch" * 100_000)
    assert L.file_digest(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    assert L.file_digest(p, "md5") == hashlib.md5(p.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# CIFAR-10: pickled batches written by the test
# ---------------------------------------------------------------------------------------------
def write_cifar_batch(path, n, seed, protocol=2):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).tolist()
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"test batch", b"labels": labels, b"data": data,
                     b"filenames": [b"img.png"] * n}, f, protocol=protocol)
    return data, np.array(labels)


def cifar_folder(root, sizes=(3, 2, 4, 1, 2), test_size=3):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    train = [write_cifar_batch(folder / f"data_batch_{i + 1}", n, seed=i, protocol=2 + i % 4) for i, n in enumerate(sizes)]
    test = write_cifar_batch(folder / "test_batch", test_size, seed=99)
    return folder, train, test


def test_load_cifar10_reads_pickled_batches(tmp_path):
    folder, train, test = cifar_folder(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = load_cifar10(tmp_path, "train")
        ds_inner = load_cifar10(folder, "train")  # the batches folder itself works too
        flat = load_cifar10(tmp_path, "test", flatten=True)
    x, y = ds.tensors
    data = np.concatenate([d for d, _ in train])
    assert x.shape == (12, 3, 32, 32) and x.dtype == np.float32, f"train images {x.shape} {x.dtype}; expected (12, 3, 32, 32)"
    assert y.dtype == np.int64 and y.data.tolist() == np.concatenate([lab for _, lab in train]).tolist(), "batches 1..5 in order"
    np.testing.assert_allclose(x.data[:, 0].reshape(12, 1024), data[:, :1024] / 255.0, rtol=1e-6, err_msg="red plane first")
    np.testing.assert_allclose(x.data[4, 2, 1, 3], data[4, 2048 + 32 + 3] / 255.0, rtol=1e-6, err_msg="row-major 32x32 planes")
    np.testing.assert_array_equal(ds_inner.tensors[1].data, y.data)
    assert flat.tensors[0].shape == (3, 3072)
    np.testing.assert_allclose(flat.tensors[0].data, test[0] / 255.0, rtol=1e-6)


def test_load_cifar10_missing_batch(tmp_path):
    folder, _, _ = cifar_folder(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_cifar10(tmp_path, verify=False)
    msg = str(info.value)
    assert "data_batch_3" in msg and "cifar-10-python.tar.gz" in msg, f"name the missing file and where to get it: {msg}"


def test_load_cifar10_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="test_batch"):
        load_cifar10(tmp_path, "test")


@pytest.mark.parametrize("damage", ["truncated", "not_a_dict", "wrong_shape", "wrong_dtype", "label_count", "no_data"])
def test_load_cifar10_rejects_corrupt_batches(tmp_path, damage):
    folder, _, _ = cifar_folder(tmp_path)
    path = folder / "test_batch"
    good = {b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 1, 2]}
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        entry = {
            "not_a_dict": [1, 2, 3],
            "wrong_shape": {**good, b"data": np.zeros((3, 1024), np.uint8)},
            "wrong_dtype": {**good, b"data": np.zeros((3, 3072), np.float32)},
            "label_count": {**good, b"labels": [0, 1]},
            "no_data": {b"labels": [0, 1, 2]},
        }[damage]
        path.write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(ValueError, match="test_batch"):
        load_cifar10(tmp_path, "test", verify=False)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_load_cifar10_refuses_pickles_that_run_code(tmp_path, capsys):
    folder, _, _ = cifar_folder(tmp_path)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": _Evil(), b"labels": []}))
    with pytest.raises(ValueError, match="refusing"):
        load_cifar10(tmp_path, "test", verify=False)
    assert "must never run" not in capsys.readouterr().out


def test_load_cifar10_checksum_policy(tmp_path):
    cifar_folder(tmp_path)
    with pytest.warns(UserWarning, match="not the official file"):
        load_cifar10(tmp_path, "test")
    with pytest.raises(ValueError, match="40351d587109b95175f43aff81a1287e"):
        load_cifar10(tmp_path, "test", verify=True)
    digest = L.file_digest(tmp_path / "cifar-10-batches-py" / "test_batch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_cifar10(tmp_path, "test", verify=True, checksums={"test_batch": digest})) == 3


@pytest.mark.parametrize("loader", [load_mnist, load_cifar10])
def test_loaders_reject_unknown_split(tmp_path, loader):
    with pytest.raises(ValueError, match="split"):
        loader(tmp_path, "val")
