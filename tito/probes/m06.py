"""Probes of module 06 (autograd): see tito/probes/__init__.py.

Each backward rule is called directly on a node recorded by the reference forward ops of modules
01-04, with a random upstream gradient; the probe records the gradients as the rule returns them and
the shapes of the node's inputs, and the trusted check (`_rules_check`, never in the sandbox) sums
both sides' gradients to those shapes before comparing them (a rule may leave broadcasting to the
traversal, as the contract allows). The traversal (6.4) replays the reference's recorded outcomes of
the rules and of `unbroadcast`, so a bug in a rule is charged to the rule's exercise only."""
import contextlib
import sys

import numpy as np

from . import Probe, Seq, compare, probe


def _to_shape(g, shape):
    g = np.asarray(g)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    if g.shape != tuple(shape):
        raise ValueError(f"a gradient of shape {g.shape} for an input of shape {tuple(shape)}")
    return g


def _summed(v):
    """A rule's recorded [grads..., shapes] with each gradient summed to its input's shape (trusted side)."""
    from . import Arr

    if not isinstance(v, Seq) or not v.items or not isinstance(v.items[-1], Seq):
        return v
    *grads, shapes = v.items
    out = []
    for gr, shape in zip(grads, shapes.items):
        if isinstance(gr, Arr) and isinstance(shape, Seq):
            try:
                out.append(Arr(_to_shape(gr.a, tuple(int(s) for s in shape.items)), "ndarray"))
            except (ValueError, TypeError) as e:
                out.append(f"not summable to the input's shape ({e})")
        else:
            out.append(gr)
    if len(grads) != len(shapes.items):
        out.append(f"{len(grads)} gradients for {len(shapes.items)} inputs")
    return Seq("list", out)


_REFERENCE_SUMMED: dict[int, tuple] = {}  # id(a reference record) -> (the record, `_summed` of it)


def _summed_reference(v):
    """`_summed` of a reference record, computed once per record: a run's reference is the same objects for every
    submission (the plan's, never changed once read). Kept by identity with the record itself, so an id is never
    another record's; a new run's plan is new records."""
    hit = _REFERENCE_SUMMED.get(id(v))
    if hit is not None and hit[0] is v:
        return hit[1]
    if len(_REFERENCE_SUMMED) > 10_000:
        _REFERENCE_SUMMED.clear()
    out = _summed(v)
    _REFERENCE_SUMMED[id(v)] = (v, out)
    return out


def _rules_check(got, want):
    p = Probe("6.x", "06", None)
    for key in want:
        mine = _summed(got.get(key))
        bad = [x for x in (mine.items if isinstance(mine, Seq) else []) if isinstance(x, str)]
        if bad and isinstance(want[key], Seq):
            return f"{key}: your rule's gradients: {bad[0]}"
        why = compare(mine, _summed_reference(want[key]), p, key)
        if why:
            return why
    return ""


def _array(g):
    return g.data if type(g).__name__ == "Tensor" else g


# The traversal's long chain. A walk that recurses once per node fails on it as a chain past Python's default
# recursion limit (1,000) would fail it, without 1,000 nodes (each node is one replayed rule call per submission, the
# largest part of this module's probe time): the chain is run with the recursion limit CHAIN_ROOM frames above the
# probe's own, far more than an iterative walk needs (its rule calls, the replay around them and NumPy under them take
# a few dozen) and far fewer than the chain's length.
CHAIN, CHAIN_ROOM = 300, 150


@contextlib.contextmanager
def recursion_room(frames: int):
    """Python's recursion limit set to `frames` above the caller's depth, and back to what it was after."""
    depth, f = 0, sys._getframe()
    while f is not None:
        depth, f = depth + 1, f.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def leaf(rng, *shape, positive=False):
    from tinytorch.core.tensor import Tensor

    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return Tensor(a.astype(np.float32), requires_grad=True)


def rule(rec, key, name, out, rng):
    """Record `name(grad, out.grad_fn)`: the gradients as returned (None stays None) and the inputs' shapes."""
    import tinytorch.core.autograd as A

    node = out.grad_fn
    g = rng.standard_normal(out.shape).astype(out.dtype)
    shapes = [None if inp is None else list(inp.shape) for inp in node.inputs]

    def run():
        grads = tuple(getattr(A, name)(g, node))
        return [None if gr is None else np.asarray(_array(gr)) for gr in grads] + [shapes]
    rec.call(key, run)


@probe("6.1")
def chain_rule(rng, rec):
    from tinytorch.core.autograd import two_layer_grads

    for i in range(4):
        x, y, w1, b1, w2 = (float(v) for v in rng.standard_normal(5))
        rec.call(f"g{i}", lambda: tuple(float(v) for v in two_layer_grads(x, y, w1, b1, w2)))


@probe("6.2")
def unbroadcast(rng, rec):
    from tinytorch.core.autograd import unbroadcast as ub

    for i, (gshape, shape) in enumerate((((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), (1, 4)), ((3, 4), (3, 1)),
                                         ((2, 3, 4), (3, 1)), ((2, 3, 4), ()), ((2, 1, 4), (1, 1, 4)), ((5,), (1,)))):
        g = rng.standard_normal(gshape).astype(np.float32)
        rec.call(f"u{i}", ub, g, shape)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    rec["same_is_grad"] = (lambda r: r is g)(ub(g, (3, 4)))


@probe("6.3", check=_rules_check)
def arithmetic(rng, rec):
    a, b, p = leaf(rng, 3, 4), leaf(rng, 4), leaf(rng, 3, 4, positive=True)
    rule(rec, "sub", "sub_backward", a - b, rng)
    rule(rec, "sub_const", "sub_backward", a - 2.0, rng)
    rule(rec, "rsub", "sub_backward", 2.0 - a, rng)
    rule(rec, "mul", "mul_backward", a * b, rng)
    rule(rec, "mul_const", "mul_backward", a * 3.0, rng)
    rule(rec, "div", "div_backward", a / (p + 1.0), rng)
    rule(rec, "div_b", "div_backward", b / p, rng)
    rule(rec, "rdiv", "div_backward", 2.0 / p, rng)
    rule(rec, "pow_const", "pow_backward", p ** 2.5, rng)
    rule(rec, "pow_tensor", "pow_backward", p ** (b * 0.5), rng)
    rule(rec, "rpow", "pow_backward", 2.0 ** a, rng)


RULES = ("unbroadcast", "sub_backward", "mul_backward", "div_backward", "pow_backward", "matmul_backward",
         "sum_backward", "mean_backward", "exp_backward", "tanh_backward", "getitem_backward", "reshape_backward")


@probe("6.4", replay=RULES)
def traversal(rng, rec):
    from tinytorch.core.autograd import backward
    from tinytorch.core.tensor import Tensor

    # a diamond with reuse, broadcasting of a bias and a row, a matmul and reductions
    x, w, bias, row = leaf(rng, 4, 3), leaf(rng, 3, 2), leaf(rng, 2), leaf(rng, 1, 2)
    h = (x @ w + bias).tanh()
    y = (h * h + h * row - h / 3.0).sum(axis=0).exp().mean()
    rec.call("run", backward, y)
    rec["grads"] = [t.grad for t in (x, w, bias, row)]
    rec["grad_types"] = [type(t.grad).__name__ for t in (x, w, bias, row)]
    rec["h_grad"] = h.grad
    # accumulation, a grad= argument, a leaf .grad that must not share the upstream buffer
    a = leaf(rng, 3)
    g = rng.standard_normal(3).astype(np.float32)
    rec.call("first", backward, a + 0.0, g)  # the add rule passes the upstream gradient through
    g[:] = 100.0
    rec["after_mutation"] = a.grad
    rec.call("second", backward, (a * a)[1:], np.ones(2, dtype=np.float32))
    rec["accumulated"] = a.grad
    # retain_grad, released graphs, errors
    v = leaf(rng, 3)
    m = v * 2.0
    m.retain_grad()
    s = (m * m).sum()
    rec.call("retain", backward, s, None, True)
    rec["m_grad"], rec["v_grad"] = m.grad, v.grad
    rec.call("again", backward, s)
    rec["v_grad2"] = v.grad
    rec.call("released", backward, s)
    rec.call("implicit", backward, v * 2.0)
    rec.call("no_grad_needed", backward, Tensor(np.ones(3, dtype=np.float32)).sum())
    # a long chain: iterative, not recursive
    c = leaf(rng, 4)
    z = c
    for _ in range(CHAIN):
        z = z * 1.0
    with recursion_room(CHAIN_ROOM):
        rec.call("chain", backward, z.sum())
    rec["chain_grad"] = c.grad
    # broadcasting that keeps the rank
    p, q = leaf(rng, 1, 3), leaf(rng, 4, 3)
    rec.call("same_rank", backward, (p * q).sum())
    rec["same_rank_grad"] = p.grad


@probe("6.5", check=_rules_check)
def matmul(rng, rec):
    for key, sa, sb in (("2d", (3, 4), (4, 5)), ("batch", (2, 3, 4), (2, 4, 5)), ("bcast", (2, 1, 3, 4), (5, 4, 2)),
                        ("bcast_b", (3, 4), (6, 4, 2)), ("mv", (3, 4), (4,)), ("vm", (4,), (4, 2)), ("dot", (4,), (4,)),
                        ("bmv", (2, 3, 4), (4,))):
        rule(rec, key, "matmul_backward", leaf(rng, *sa) @ leaf(rng, *sb), rng)


@probe("6.6", check=_rules_check)
def reductions(rng, rec):
    x = leaf(rng, 2, 3, 4)
    for name in ("sum", "mean", "max", "var"):
        for axis in (None, 0, -1, (0, 2)):
            for keep in (False, True):
                rule(rec, f"{name}_{axis}_{keep}", f"{name}_backward", getattr(x, name)(axis=axis, keepdims=keep), rng)


@probe("6.7", check=_rules_check)
def views(rng, rec):
    from tinytorch.core.tensor import concatenate

    x = leaf(rng, 2, 3, 4)
    rule(rec, "reshape", "reshape_backward", x.reshape(6, 4), rng)
    rule(rec, "reshape2", "reshape_backward", x.transpose(0, 2).reshape(4, -1), rng)
    rule(rec, "transpose", "transpose_backward", x.transpose(0, 2), rng)
    rule(rec, "transpose_last", "transpose_backward", x.transpose(), rng)
    for key, index in (("int", 1), ("slice", (slice(None), slice(1, 3))), ("fancy", np.array([0, 1, 0, 0])),
                       ("bool", x.data > 0), ("mixed", (0, np.array([2, 2, 1])))):
        rule(rec, f"get_{key}", "getitem_backward", x[index], rng)
    rule(rec, "cat0", "concatenate_backward", concatenate([x, leaf(rng, 1, 3, 4)], axis=0), rng)
    rule(rec, "cat2", "concatenate_backward", concatenate([x, leaf(rng, 2, 3, 2), x], axis=-1), rng)


@probe("6.8", check=_rules_check)
def elementwise(rng, rec):
    from tinytorch.core.tensor import where

    x, p = leaf(rng, 3, 4), leaf(rng, 3, 4, positive=True)
    for name, t in (("exp", x), ("log", p), ("sqrt", p), ("tanh", x)):
        rule(rec, name, f"{name}_backward", getattr(t, name)(), rng)
    cond = x.data > 0
    from tinytorch.core.tensor import Tensor

    rule(rec, "where", "where_backward", where(Tensor(cond), x, p), rng)
    rule(rec, "where_bcast", "where_backward", where(Tensor(cond), x, leaf(rng, 4)), rng)
    rule(rec, "where_const", "where_backward", where(Tensor(cond), x, 0.0), rng)


@probe("6.9", check=_rules_check)
def activations(rng, rec):
    import tinytorch.core.activations as A

    x = leaf(rng, 3, 5)
    x.data *= 3
    for name, act in (("relu", A.ReLU()), ("sigmoid", A.Sigmoid()), ("gelu", A.GELU()), ("softmax", A.Softmax(dim=-1)),
                      ("softmax0", A.Softmax(dim=0))):
        rule(rec, name, f"{name.rstrip('0')}_backward", act(x), rng)
    big = leaf(rng, 2, 4)
    big.data[:] = np.array([[-1000, -5, 0, 5], [1000, 3, -2, 40]], dtype=np.float32)
    rule(rec, "sigmoid_big", "sigmoid_backward", A.Sigmoid()(big), rng)
    rule(rec, "softmax_big", "softmax_backward", A.Softmax()(big), rng)


@probe("6.10", check=_rules_check)
def losses(rng, rec):
    from tinytorch.core.losses import CrossEntropyLoss, MSELoss
    from tinytorch.core.tensor import Tensor

    p, t = leaf(rng, 6, 3), leaf(rng, 6, 3)
    rule(rec, "mse", "mse_backward", MSELoss()(p, t), rng)
    rule(rec, "mse_const", "mse_backward", MSELoss()(p, Tensor(t.data)), rng)
    z = leaf(rng, 5, 4)
    z.data *= 4
    y = Tensor(rng.integers(0, 4, size=5))
    rule(rec, "ce", "cross_entropy_backward", CrossEntropyLoss()(z, y), rng)
    big = leaf(rng, 2, 3)
    big.data[:] = np.array([[1000, 0, -1000], [0, 2000, 0]], dtype=np.float32)
    rule(rec, "ce_big", "cross_entropy_backward", CrossEntropyLoss()(big, Tensor(np.array([2, 1]))), rng)
