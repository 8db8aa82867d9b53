"""Probes of module 05 (dataloader): see tito/probes/__init__.py. Probes after 5.1 replay the reference's
recorded outcomes of `TensorDataset.__init__` (and 5.4 of `get_batch` and the batch order), so a bug is charged
to its own exercise."""
import numpy as np

from . import probe

DS = ("TensorDataset.__init__", "TensorDataset.__len__", "TensorDataset.__getitem__")


@probe("5.1")
def tensor_dataset(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.data.loader import TensorDataset

    x, y = rng.standard_normal((6, 2)), rng.integers(0, 3, size=6)
    ds = rec.call("ds", TensorDataset, x, Tensor(y))
    if ds is not None:
        rec.call("len", len, ds)
        for i in (0, 3, -1, -6):
            rec.call(f"item{i}", lambda i=i: ds[i])
        for i in (6, -7):
            rec.call(f"bad{i}", lambda i=i: ds[i])
        rec.call("np_index", lambda: ds[np.int64(2)])
    rec.call("none", TensorDataset)
    rec.call("scalar", TensorDataset, Tensor(np.float32(3.0)))
    rec.call("mismatch", TensorDataset, x, y[:4])
    one = rec.call("one", TensorDataset, [[1.0, 2.0], [3.0, 4.0]])
    if one is not None:
        rec.call("one_item", lambda: one[1])


@probe("5.2", replay=DS)
def get_batch(rng, rec):
    from tinytorch.data.loader import TensorDataset

    x, y = rng.standard_normal((7, 3)).astype(np.float32), rng.integers(0, 3, size=7)
    ds = TensorDataset(x, y)
    idx = rng.integers(0, 7, size=5)
    rec.call("batch", ds.get_batch, idx)
    rec.call("list", ds.get_batch, [int(i) for i in idx])
    rec.call("neg", ds.get_batch, [-1, 0])
    rec.call("empty", ds.get_batch, [])
    rec.call("bad", ds.get_batch, [0, 9])


def _epochs(loader, n=3):
    return [[np.asarray(b).copy() for b in loader.batch_indices()] for _ in range(n)]


def _batch_check(values, ref):
    from . import Probe, compare

    exact = Probe("5.3", "05", None, rtol=0, atol=0)
    for key in ref:
        if key.startswith("shuffle"):
            continue
        why = compare(values[key], ref[key], exact, key)
        if why:
            return why
    n = 23
    for key in ("shuffle_a", "shuffle_b"):
        epochs = values.get(key)
        if not hasattr(epochs, "items") or len(epochs.items) != 3:
            return f"{key}: expected the batches of 3 epochs"
        for e in epochs.items:
            sizes = [len(b.a) for b in getattr(e, "items", []) if hasattr(b, "a")]
            if sizes != [5, 5, 5, 5] or any(b.a.dtype.kind not in "iu" for b in e.items):
                return f"{key}: shuffled batches of sizes {sizes}, expected [5, 5, 5, 5] (drop_last) of integers"
            seen = np.concatenate([b.a for b in e.items])
            if len(set(seen.tolist())) != 20 or seen.min() < 0 or seen.max() >= n:
                return f"{key}: a shuffled epoch repeats or invents indices"
    a = [np.concatenate([b.a for b in e.items]) for e in values["shuffle_a"].items]
    b = [np.concatenate([b.a for b in e.items]) for e in values["shuffle_b"].items]
    if not all(np.array_equal(u, v) for u, v in zip(a, b)):
        return "the same seed must give the same sequence of epochs"
    if np.array_equal(a[0], a[1]) and np.array_equal(a[1], a[2]):
        return "every epoch has the same order: draw a new permutation per epoch from self.rng"
    if all(np.array_equal(u, np.sort(u)) for u in a):
        return "shuffle=True did not shuffle"
    return ""


@probe("5.3", replay=DS, check=_batch_check)
def batch_indices(rng, rec):
    from tinytorch.data.loader import DataLoader, TensorDataset

    ds = TensorDataset(np.arange(23, dtype=np.float32).reshape(23, 1))
    for bs in (4, 5, 23, 30):
        for drop in (False, True):
            dl = DataLoader(ds, batch_size=bs, drop_last=drop)
            rec.call(f"len{bs}{drop}", len, dl)
            rec.call(f"idx{bs}{drop}", lambda dl=dl: [np.asarray(b) for b in dl.batch_indices()])
    seed = int(rng.integers(0, 2 ** 31))
    for key in ("shuffle_a", "shuffle_b"):
        rec.call(key, _epochs, DataLoader(ds, batch_size=5, shuffle=True, drop_last=True, seed=seed))


@probe("5.4", replay=DS + ("TensorDataset.get_batch", "DataLoader.__len__", "DataLoader.batch_indices"))
def iterate(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.data.loader import DataLoader, TensorDataset

    x, y = rng.standard_normal((10, 3)).astype(np.float32), rng.integers(0, 4, size=10)
    ds = TensorDataset(x, y)
    rec.call("plain", lambda: list(DataLoader(ds, batch_size=4)))
    rec.call("transform", lambda: list(DataLoader(ds, batch_size=3, drop_last=True, transform=lambda t: t * 2.0)))
    seed = int(rng.integers(0, 2 ** 31))
    rec.call("shuffled", lambda: [list(DataLoader(ds, batch_size=4, shuffle=True, seed=seed)) for _ in range(1)])
    dl = DataLoader(ds, batch_size=4, shuffle=True, seed=seed)
    rec.call("two_epochs", lambda: [list(dl), list(dl)])

    class Plain:  # not a Dataset: only __len__ and __getitem__
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return x[i], int(y[i])
    rec.call("plain_ds", lambda: list(DataLoader(Plain(), batch_size=2)))
    rec.call("fields", lambda: [type(f).__name__ for b in DataLoader(ds, batch_size=5) for f in b])


@probe("5.5")
def normalize(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.data.loader import Normalize

    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    rec.call("scalar", Normalize(0.5, 0.25), Tensor(x))
    m, s = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    rec.call("channel", Normalize(m, s), Tensor(x))
    rec.call("array_in", Normalize(m, s), x)
    rec.call("last", Normalize(m[:2], s[:2], axis=-1), Tensor(x[..., 0, :]))
    rec.call("feature", Normalize(rng.standard_normal(5), np.ones(5)), Tensor(rng.standard_normal((4, 5)).astype(np.float32)))
    rec.call("bad", Normalize(m, s), Tensor(x[:, :2]))
    t = Tensor(x.copy())
    Normalize(m, s)(t)
    rec["input_kept"] = t.data
