"""Probes of module 16 (compression): see tito/probes/__init__.py. No exercise calls another (each uses the given
helpers), so there are no substitutes. 16.4's factors are unique only up to the signs of the singular vectors:
they are compared here, in the trusted process, through their product and their row norms."""
import numpy as np

from . import Probe, compare, probe


def _weights(layer):
    return [layer.weight.data, None if layer.bias is None else layer.bias.data, type(layer).__name__]


@probe("16.1", messages=True)
def mask(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compression import magnitude_mask

    rec.call("example", magnitude_mask, np.array([[0.5, -0.1], [2.0, 0.05]]), 0.5)
    w = rng.standard_normal((30, 40)).astype(np.float32)
    for s in (0.0, 0.25, 0.5, 0.9, 0.999, float(rng.uniform(0, 1))):
        rec.call(f"s{s}", magnitude_mask, w, s)
    conv = rng.standard_normal((4, 3, 3, 3))
    before = conv.copy()
    rec.call("tensor", magnitude_mask, Tensor(conv), 0.5)
    rec.call("conv", magnitude_mask, conv, 0.7)
    rec["unchanged"] = conv - before
    rec.call("tiny", magnitude_mask, np.array([3.0, -1.0, 2.0]), 0.2)
    rec.call("vector", magnitude_mask, rng.standard_normal(7), 0.5)
    for bad in (1.0, -0.1, 1.5, True, "0.5"):
        rec.call(f"bad_{bad!r}", magnitude_mask, conv, bad)


@probe("16.2", messages=True)
def global_masks(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compression import global_magnitude_masks

    rec.call("example", global_magnitude_masks, [np.array([3.0, 0.1]), np.array([[0.2, 4.0], [5.0, 6.0]])], 0.5)
    ws = [rng.standard_normal((20, 8)) * 0.1, rng.standard_normal((16, 20)), rng.standard_normal(5) * 10]
    for s in (0.0, 0.3, 0.6, 0.99):
        rec.call(f"s{s}", global_magnitude_masks, ws, s)
    rec.call("tensors", global_magnitude_masks, [Tensor(w.astype(np.float32)) for w in ws], 0.6)
    rec.call("one", global_magnitude_masks, [rng.standard_normal((3, 4))], 0.5)
    rec.call("bad", global_magnitude_masks, ws, 1.0)


@probe("16.3", messages=True)
def neurons(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.core.spatial import Conv2d
    from tinytorch.perf.compression import prune_neurons

    def run(a, b, n):
        x, y, keep = prune_neurons(a, b, n)
        out = _weights(x) + _weights(y) + [np.asarray(keep)]
        if isinstance(x, Conv2d):
            out += [tuple(x.stride), tuple(x.padding), tuple(y.stride), tuple(y.padding)]
        return out
    fc1, fc2 = Linear(3, 4, rng=0), Linear(4, 2, rng=1)
    fc1.weight.data[:] = np.array([[1, 0, 0], [0, 5, 0], [0, 0, 0], [0, 3, 0]], dtype=np.float32)
    fc1.bias.data[:] = [0.1, 0.2, 0.3, 0.4]
    for n in (1, 2, 3, 4):
        rec.call(f"example{n}", run, fc1, fc2, n)
    rec["original"] = [fc1.weight.data.shape, fc2.weight.data.shape]
    a, b = Linear(6, 9, rng=int(rng.integers(0, 2 ** 30))), Linear(9, 5, rng=int(rng.integers(0, 2 ** 30)))
    a.weight.data *= rng.uniform(0.1, 3, (9, 1)).astype(np.float32)
    rec.call("random", run, a, b, int(rng.integers(1, 9)))
    c1, c2 = Conv2d(2, 5, 3, padding=1, rng=0), Conv2d(5, 4, 3, stride=2, rng=1)
    c1.weight.data *= np.array([3, 1, 4, 0.5, 2], dtype=np.float32)[:, None, None, None]
    rec.call("conv", run, c1, c2, 3)
    nb1, nb2 = Linear(4, 6, bias=False, rng=3), Linear(6, 2, bias=False, rng=4)
    rec.call("no_bias", run, nb1, nb2, 2)
    for bad in (0, 5, 2.0, True):
        rec.call(f"bad_{bad!r}", prune_neurons, fc1, fc2, bad)


def _low_rank_check(got, want):
    exact = Probe("16.4", "16", None, rtol=1e-4, atol=1e-5, messages=True)
    for key in want:
        if key.startswith("factors"):
            continue
        why = compare(got[key], want[key], exact, key)
        if why:
            return why
    for key in want:
        if not key.startswith("factors"):
            continue
        w, g = want[key], got[key]
        if not hasattr(w, "items"):  # the reference raised: compare as usual
            why = compare(g, w, exact, key)
            if why:
                return why
            continue
        if not hasattr(g, "items") or len(g.items) != len(w.items):
            return f"{key}: got {g!r:.80}, expected the two factors and the bias"
        (ga, gb, gbias, gkinds), (wa, wb, wbias, wkinds) = g.items, w.items
        why = compare(gkinds, wkinds, exact, f"{key} layer types") or compare(gbias, wbias, exact, f"{key} bias")
        if why:
            return why
        for name, gv, wv in (("first weight", ga, wa), ("second weight", gb, wb)):
            if not hasattr(gv, "a") or gv.a.shape != wv.a.shape or gv.a.dtype != wv.a.dtype:
                return f"{key}: the {name} is {getattr(getattr(gv, 'a', None), 'shape', gv)!r}, expected shape " \
                       f"{wv.a.shape} and dtype {wv.a.dtype}"
        prod_g = gb.a.astype(np.float64) @ ga.a.astype(np.float64)
        prod_w = wb.a.astype(np.float64) @ wa.a.astype(np.float64)
        if not np.allclose(prod_g, prod_w, rtol=1e-4, atol=1e-5):
            return f"{key}: second @ first differs from the best rank-r approximation by up to " \
                   f"{np.abs(prod_g - prod_w).max():.3g}"
        for name, gv, wv, axis in (("rows of the first", ga, wa, 1), ("columns of the second", gb, wb, 0)):
            ng, nw = np.linalg.norm(gv.a.astype(np.float64), axis=axis), np.linalg.norm(wv.a.astype(np.float64), axis=axis)
            if not np.allclose(ng, nw, rtol=1e-3, atol=1e-5):
                return f"{key}: the norms of the {name} factor are {np.round(ng, 4).tolist()}, expected " \
                       f"{np.round(nw, 4).tolist()} (sqrt(s) goes into each factor)"
    return ""


@probe("16.4", check=_low_rank_check)
def low_rank(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.perf.compression import low_rank as factor, rank_for_energy

    for key, (s, e) in {"ex90": ([3.0, 2.0, 1.0, 0.0], 0.9), "ex100": ([3.0, 2.0, 1.0, 0.0], 1.0),
                        "equal": ([1.0] * 5, 0.6), "tiny": ([2.0, 1.0], 1e-9), "half": ([1.0, 1.0], 0.5)}.items():
        rec.call(key, rank_for_energy, np.array(s), e)
    s = np.sort(rng.uniform(0, 3, 10))[::-1]
    for e in (0.5, 0.8, 0.95, 0.999):
        rec.call(f"rand{e}", rank_for_energy, s, e)
    for bad in (0, 1.5, -0.1):
        rec.call(f"bad_energy_{bad!r}", rank_for_energy, s, bad)

    def run(layer, rank):
        seq = factor(layer, rank)
        first, second = seq.layers
        return [first.weight.data, second.weight.data, None if second.bias is None else second.bias.data,
                [type(first).__name__, type(second).__name__, first.bias is None, len(seq.layers),
                 bool(first.weight.requires_grad), bool(second.weight.requires_grad)]]
    layer = Linear(20, 10, rng=int(rng.integers(0, 2 ** 30)))
    layer.bias.data[:] = rng.standard_normal(10)
    for r in (1, 3, 10):
        rec.call(f"factors{r}", run, layer, r)
    nb = Linear(5, 7, bias=False, rng=1)
    rec.call("factors_nobias", run, nb, 4)
    for bad in (0, 11, 3.0, True):
        rec.call(f"bad_rank_{bad!r}", factor, layer, bad)


@probe("16.5", messages=True, rtol=1e-5, atol=1e-6)
def distill(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compression import distillation_loss

    zs, zt = rng.standard_normal((6, 5)) * 2, rng.standard_normal((6, 5)) * 3
    y = rng.integers(0, 5, 6)
    for T, alpha in ((4.0, 0.5), (1.0, 1.0), (2.0, 0.0), (7.5, 0.3)):
        rec.call(f"T{T}_a{alpha}", distillation_loss, Tensor(zs.astype(np.float32)), zt, y, T, alpha)
    rec.call("default", distillation_loss, Tensor(zs.astype(np.float32)), zt, y)
    rec.call("same", distillation_loss, Tensor(zs.astype(np.float32)), zs, y, 4.0, 0.5)
    rec.call("f64", distillation_loss, Tensor(zs, dtype=np.float64), zt, y, 3.0, 0.25)
    student = Tensor(zs.astype(np.float32), requires_grad=True)
    teacher = Tensor(zt.astype(np.float32), requires_grad=True)

    def grads():
        distillation_loss(student, teacher * 1.0, y, 3.0, 0.4).backward()
        return [student.grad, teacher.grad is None]
    rec.call("grads", grads)
    big = np.array([[1000.0, 0.0, -1000.0]])
    rec.call("huge", distillation_loss, Tensor(big[:, ::-1].copy()), big, np.array([0]), 1.0, 0.5)
    rec.call("bad_T", distillation_loss, Tensor(zs), zt, y, temperature=0)
    rec.call("bad_alpha", distillation_loss, Tensor(zs), zt, y, alpha=1.5)
    rec.call("bad_shape", distillation_loss, Tensor(zs), zt[:, :4], y)
