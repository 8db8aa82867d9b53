"""Probes of module 16 (compression): see tito/probes/__init__.py. No substitutes: 16.3's `prune_magnitude` calls
16.1 and 16.2, so its probe replaces them by stand-ins that return masks drawn in the probe (data), and checks
what `prune_magnitude` does with them; every other exercise stands alone. 16.5 draws layers whose rows rank
differently by the L1, L2 and max norms, so a score by the wrong norm keeps other units. 16.6's factors are unique
only up to the signs of the singular vectors: they are compared here, in the trusted process, through their product
and their row norms."""
import numpy as np


from . import Probe, compare, probe, replaced


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
def masks(rng, rec):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf import compression
    from tinytorch.perf.compression import PruningMasks

    w = Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    w.grad = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    v = Tensor(rng.standard_normal(5).astype(np.float32), requires_grad=True)   # no gradient
    keep_w, keep_v = rng.random((3, 4)) < 0.5, rng.random(5) < 0.5
    buffers = (w.data, w.grad.data, v.data)

    def apply():
        PruningMasks([("w", w), ("v", v)], [keep_w, keep_v]).apply()
        return [w.data, w.grad.data, v.data, [a is b for a, b in zip(buffers, (w.data, w.grad.data, v.data))]]
    rec.call("apply", apply)
    drawn = {}   # masks handed out by the stand-ins: data drawn here, not a ranking

    def stand_in_layer(weight, sparsity):
        a = np.asarray(getattr(weight, "data", weight))
        m = np.random.default_rng(a.size + int(sparsity * 100)).random(a.shape) >= sparsity
        drawn.setdefault("layer", []).append(m)
        return m

    def stand_in_global(weights, sparsity):
        ms = [np.random.default_rng(np.asarray(getattr(x, "data", x)).size).random(np.shape(getattr(x, "data", x))) >= sparsity
              for x in weights]
        drawn.setdefault("global", []).append(len(ms))
        return ms
    with replaced(compression, magnitude_mask=stand_in_layer, global_magnitude_masks=stand_in_global):
        for scope in ("layer", "global"):
            net = Sequential(Linear(5, 7, rng=int(rng.integers(0, 2 ** 30))), ReLU(), Linear(7, 3, rng=1))

            def run():
                pm = compression.prune_magnitude(net, 0.6, scope=scope)
                return [type(pm).__name__, list(pm.names), [np.asarray(m) for m in pm.masks],
                        [p.data for p in net.parameters()]]
            rec.call(f"prune_{scope}", run)
        rec["calls"] = [drawn.get("layer", []) and len(drawn["layer"]), drawn.get("global", [])]
        rec.call("bad_scope", compression.prune_magnitude, net, 0.5, "model")


@probe("16.4", messages=True, rtol=1e-5, atol=1e-6)
def csr(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compression import CSRMatrix

    def arrays(c):
        return [c.values, c.indices, c.indptr, list(c.shape)]
    rec.call("example", lambda: arrays(CSRMatrix.from_dense(np.array([[0, 2.0, 0], [0, 0, 0], [1.0, 0, 3.0]], np.float32))))
    a = (rng.standard_normal((9, 7)) * (rng.random((9, 7)) < 0.3)).astype(np.float32)
    a[4] = 0
    rec.call("random", lambda: arrays(CSRMatrix.from_dense(a)))
    rec.call("tensor", lambda: arrays(CSRMatrix.from_dense(Tensor(a))))
    rec.call("f64", lambda: arrays(CSRMatrix.from_dense(a.astype(np.float64))))
    rec.call("zeros", lambda: arrays(CSRMatrix.from_dense(np.zeros((3, 2), np.float32))))
    rec.call("dense", lambda: arrays(CSRMatrix.from_dense(np.ones((2, 3), np.float32))))
    x = rng.standard_normal((7, 4)).astype(np.float32)
    given = CSRMatrix(a[a != 0].astype(np.float32), np.nonzero(a)[1].astype(np.int32),
                      np.concatenate([[0], np.cumsum((a != 0).sum(axis=1))]).astype(np.int32), a.shape)
    rec.call("matmul", lambda: given @ x)
    rec.call("matmul_f64", lambda: given @ x.astype(np.float64))
    rec.call("matmul_empty", lambda: CSRMatrix(np.zeros(0, np.float32), np.zeros(0, np.int32), np.zeros(4, np.int32),
                                                (3, 7)) @ x)
    one = CSRMatrix(np.array([5.0], np.float32), np.array([2], np.int32), np.array([0, 0, 1], np.int32), (2, 3))
    rec.call("matmul_one", lambda: one @ np.eye(3, dtype=np.float32))
    rec.call("bad_shape", lambda: given @ np.ones((6, 2), np.float32))
    rec.call("bad_dims", CSRMatrix.from_dense, np.ones((2, 2, 2)))


@probe("16.5", messages=True)
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
    # spiky rows (one large entry) against flat rows (many middling ones): L1, L2 and max norms rank them differently
    for i in range(4):
        n_in = int(rng.integers(4, 9))
        spiky = np.zeros((3, n_in), np.float32)
        spiky[np.arange(3), rng.integers(0, n_in, 3)] = rng.uniform(2.0, 3.0, 3)
        flat = rng.uniform(0.8, 1.0, (3, n_in)).astype(np.float32) * rng.choice([-1, 1], (3, n_in))
        rows = np.concatenate([spiky, flat])[rng.permutation(6)] + rng.uniform(0, 1e-3, (6, n_in)).astype(np.float32)
        layer, after = Linear(n_in, 6, rng=0), Linear(6, 2, rng=1)
        layer.weight.data[:] = rows
        rec.call(f"norms{i}", run, layer, after, int(rng.integers(1, 6)))
    bias_big = Linear(3, 4, rng=2)
    bias_big.weight.data[:] = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3], [0.5, 0, 0]], np.float32)
    bias_big.bias.data[:] = np.array([10.0, 0, 0, 20.0], np.float32)   # the bias does not count in the score
    rec.call("bias_ignored", run, bias_big, Linear(4, 2, rng=3), 2)
    for bad in (0, 5, 2.0, True):
        rec.call(f"bad_{bad!r}", prune_neurons, fc1, fc2, bad)


def _low_rank_check(got, want):
    exact = Probe("16.6", "16", None, rtol=1e-4, atol=1e-5, messages=True)
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


@probe("16.6", check=_low_rank_check)
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


@probe("16.7", messages=True, rtol=1e-5, atol=1e-6)
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
