"""Probes of module 03 (layers): see tito/probes/__init__.py.

Replayed (one bug charged once): 3.2 and 3.3 walk the tree with the reference's recorded outcomes of
`named_children`; 3.5 draws with the initializers'; 3.6 and 3.8 build their layers with `Linear.__init__`'s
(and 3.8 calls `Linear.forward`, whose results join the autograd graph: the student's own code runs it)."""
import numpy as np

from . import probe

INITS = ("xavier_uniform", "kaiming_normal")


def _ids(items, known):
    """Each yielded (name, object) as (name, position of the object in `known` or -1): identity, not equality."""
    out = []
    for pair in items:
        name, obj = pair
        out.append([str(name), next((i for i, k in enumerate(known) if k is obj), -1)])
    return out


def _tree():
    from tinytorch.core.layers import Module
    from tinytorch.core.tensor import Tensor

    class Leaf(Module):
        def __init__(self, n):
            super().__init__()
            self.w = Tensor(np.full((n,), float(n), dtype=np.float32), requires_grad=True)
            self.const = Tensor(np.ones(2, dtype=np.float32))

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.first = Leaf(1)
            self.scale = 2.0
            self.blocks = [Leaf(2), (lambda t: t), Leaf(3)]
            self.p = Tensor(np.zeros(3, dtype=np.float32), requires_grad=True)
            self.act = self.p * 2.0  # an op result: not a leaf, not a member
            self.pair = (self.p, Leaf(4))  # p again: listed once by named_parameters
            self.name = "net"
    return Net()


@probe("3.1")
def named_children(rng, rec):
    net = _tree()
    known = [net.first, *net.blocks, net.p, net.act, *net.pair, net.scale, net.name]
    rec.call("children", lambda: _ids(list(net.named_children()), known))
    rec["is_generator"] = hasattr(net.named_children(), "__next__")


@probe("3.2", replay=("Module.named_children",))
def named_parameters(rng, rec):
    net = _tree()
    known = [net.p, net.first.w, net.blocks[0].w, net.blocks[2].w, net.pair[1].w]
    rec.call("params", lambda: _ids(list(net.named_parameters()), known))
    rec.call("prefixed", lambda: _ids(list(net.blocks[0].named_parameters(prefix="b")), known))
    rec.call("list", lambda: [next((i for i, k in enumerate(known) if k is p), -1) for p in net.parameters()])


@probe("3.3", replay=("Module.named_children",))
def train(rng, rec):
    net = _tree()
    mods = [net, net.first, net.blocks[0], net.blocks[2], net.pair[1]]
    r = rec.call("eval_returns", lambda: net.eval())
    rec["eval_self"] = r is net
    rec["after_eval"] = [bool(m.training) for m in mods]
    net.first.train()
    rec["one_child"] = [bool(m.training) for m in mods]
    r = rec.call("train_returns", lambda: net.train(True))
    rec["train_self"] = r is net
    rec["after_train"] = [bool(m.training) for m in mods]
    net.train(False)
    rec["train_false"] = [bool(m.training) for m in mods]


def _init_stats(values, ref):
    """Statistical check of 3.4 (any correct way of drawing is accepted): shape, dtype, the bound of the uniform,
    mean and variance, reproducible from a seed, a Generator advanced."""
    for name, fan in (("xavier", "x"), ("kaiming", "k")):
        for key in ("a", "b", "c", "d"):
            v, r = values.get(f"{name}_{key}"), ref[f"{name}_{key}"]
            if not hasattr(v, "a"):
                return f"{name}_{key}: got {v!r}, expected an array of shape {r.a.shape}"
            if v.a.shape != r.a.shape or v.a.dtype != np.float32 or v.kind != "ndarray":
                return f"{name}_{key}: got {v.kind} {v.a.shape} {v.a.dtype}, expected ndarray {r.a.shape} float32"
        a = values[f"{name}_a"].a.astype(np.float64)
        fan_in, fan_out = a.shape[1], a.shape[0]
        var = 2 / (fan_in + fan_out) if name == "xavier" else 2 / fan_in
        if abs(a.var() / var - 1) > 0.06 or abs(a.mean()) > 4 * np.sqrt(var / a.size):
            return f"{name}: variance {a.var():.4g} and mean {a.mean():.3g}, expected variance {var:.4g} and mean 0"
        if name == "xavier" and np.abs(a).max() > np.sqrt(6 / (fan_in + fan_out)) * (1 + 1e-6):
            return f"xavier: a weight {np.abs(a).max():.4g} outside the bound {np.sqrt(6 / (fan_in + fan_out)):.4g}"
        if not np.array_equal(values[f"{name}_a"].a, values[f"{name}_b"].a):
            return f"{name}: the same seed gave different weights"
        if np.array_equal(values[f"{name}_c"].a, values[f"{name}_d"].a):
            return f"{name}: two draws from one Generator gave the same weights (the Generator was not advanced)"
    conv = values.get("conv")
    if not hasattr(conv, "a") or conv.a.shape != ref["conv"].a.shape:
        return "kaiming of a convolution weight: wrong shape"
    want = 2 / (3 * 5 * 5)
    if abs(conv.a.astype(np.float64).var() / want - 1) > 0.06:
        return f"kaiming of a (64, 3, 5, 5) weight: variance {conv.a.var():.4g}, expected {want:.4g} (fan_in = 3 * 5 * 5)"
    return ""


@probe("3.4", check=_init_stats)
def inits(rng, rec):
    from tinytorch.core.layers import kaiming_normal, xavier_uniform

    for name, fn in (("xavier", xavier_uniform), ("kaiming", kaiming_normal)):
        seed = int(rng.integers(0, 2 ** 31))
        shape = (int(rng.integers(150, 250)), int(rng.integers(250, 350)))
        rec.call(f"{name}_a", fn, shape, rng=seed)
        rec.call(f"{name}_b", fn, shape, rng=seed)
        g = np.random.default_rng(seed)
        rec.call(f"{name}_c", fn, shape, rng=g)
        rec.call(f"{name}_d", fn, shape, rng=g)
    rec.call("conv", kaiming_normal, (64, 3, 5, 5), rng=int(rng.integers(0, 2 ** 31)))


@probe("3.5", replay=INITS)
def linear_init(rng, rec):
    from tinytorch.core.layers import Linear

    for key, args, kw in (("k", (5, 3), {}), ("x", (4, 6), {"init": "xavier"}), ("nb", (3, 2), {"bias": False})):
        lin = rec.call(key, Linear, *args, rng=int(rng.integers(0, 2 ** 31)), **kw)
        if lin is not None:
            rec[key + "_w"] = lin.weight
            rec[key + "_b"] = lin.bias
            rec[key + "_flags"] = [bool(lin.weight.requires_grad), None if lin.bias is None else bool(lin.bias.requires_grad)]
            rec[key + "_attrs"] = [lin.in_features, lin.out_features, lin.init]
            rec[key + "_order"] = [k for k in vars(lin) if k in ("weight", "bias")]
            rec[key + "_training"] = bool(lin.training)
    for key, args in (("zero", (0, 3)), ("bool", (True, 3)), ("float", (2.5, 3)), ("neg", (3, -1))):
        rec.call(key, Linear, *args)
    rec.call("badinit", Linear, 3, 2, init="orthogonal")


@probe("3.6", replay=INITS + ("Linear.__init__",))
def linear_forward(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.core.tensor import Tensor

    lin = Linear(4, 3, rng=int(rng.integers(0, 2 ** 31)))
    lin.bias = Tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    rec.call("y", lin, Tensor(x))
    rec.call("batched", lin, Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32)))
    rec.call("array", lin, x)
    nb = Linear(4, 2, bias=False, rng=1)
    rec.call("nobias", nb, Tensor(x))
    rec.call("bad", lin, Tensor(np.ones((8, 5), dtype=np.float32)))
    rec.call("scalar", lin, Tensor(np.float32(1.0)))
    y = lin(Tensor(x, requires_grad=True))
    rec["graph"] = y is not None and getattr(y, "grad_fn", None) is not None


def _dropout_check(values, ref):
    for key in ("eval_same", "p0_same", "init_p", "bad"):
        if key in ref and str(values.get(key)) != str(ref[key]):
            return f"{key}: got {values.get(key)!r}, expected {ref[key]!r}"
    for key in ("bad_p", "bool_p"):
        v, r = values.get(key), ref[key]
        if type(v).__name__ != type(r).__name__ or getattr(v, "kind", None) != getattr(r, "kind", None):
            return f"Dropout({key}): got {v!r}, expected {r!r}"
    x, p = ref["x"].a.astype(np.float64), 0.3
    outs = [values.get(k) for k in ("out1", "out2")]
    if not all(hasattr(o, "a") and o.a.shape == x.shape and o.a.dtype == np.float32 and o.kind == "Tensor" for o in outs):
        return "training-mode output: expected a float32 Tensor of the input's shape"
    masks = []
    for o in outs:
        y = o.a.astype(np.float64)
        kept = ~np.isclose(y, 0.0)
        if not np.allclose(y[kept], x[kept] / (1 - p), rtol=1e-5):
            return "training mode: kept elements must be scaled by 1 / (1 - p)"
        frac = 1 - kept.mean()
        if abs(frac - p) > 0.02:
            return f"training mode: {frac:.3f} of the elements were zeroed, expected about p = {p}"
        masks.append(kept)
    if np.array_equal(*masks):
        return "two calls drew the same mask (draw a new one each call from self.rng)"
    return ""


@probe("3.7", check=_dropout_check)
def dropout(rng, rec):
    from tinytorch.core.layers import Dropout
    from tinytorch.core.tensor import Tensor

    x = (np.abs(rng.standard_normal((200, 300))) + 0.5).astype(np.float32)
    rec["x"] = x
    d = Dropout(0.3, seed=int(rng.integers(0, 2 ** 31)))
    rec["init_p"] = getattr(d, "p", None)
    rec.call("out1", d, Tensor(x))
    rec.call("out2", d, Tensor(x))
    t = Tensor(x)
    d.eval()
    rec["eval_same"] = d(t) is t
    rec["p0_same"] = (lambda t=t: Dropout(0.0)(t) is t)()
    rec.call("bad_p", Dropout, 1.0)
    rec.call("bool_p", Dropout, True)


@probe("3.8", replay=INITS + ("Linear.__init__", "Linear.forward"))
def sequential(rng, rec):
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.tensor import Tensor

    l1, l2 = Linear(4, 5, rng=int(rng.integers(0, 2 ** 31))), Linear(5, 2, rng=int(rng.integers(0, 2 ** 31)))
    seq = rec.call("seq", Sequential, l1, lambda t: t * 2.0, l2)
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    if seq is not None:
        rec.call("y", seq, x)
        rec["layers"] = [type(getattr(seq, "layers", None)).__name__, len(getattr(seq, "layers", []))]
        rec.call("names", lambda: [n for n, _ in seq.named_parameters()])
    rec.call("empty", lambda: Sequential()(x))
    rec.call("bad", Sequential, l1, 3)
