"""Probes of module 17 (acceleration): see tito/probes/__init__.py. Graphs are recorded as plain data
(nodes as name, op, args and attrs; constants; outputs) plus what `run_graph` (given) computes from them.
17.5 only builds C expression strings (no compiler runs); 17.7 takes cache sizes as arguments (nothing
measured). Substitutes (one bug charged once): 17.4 runs the reference dead-code elimination and CSE
where it checks an optimized graph."""
import numpy as np

from . import probe


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _attrs(attrs):
    return {str(k): v for k, v in dict(attrs).items() if k not in ("params", "kernel")}


def _graph(g):
    """A Graph as data (the record cannot hold the object)."""
    return {"inputs": list(g.inputs),
            "nodes": [[n.name, n.op, list(n.args), _attrs(n.attrs)] for n in g.nodes],
            "constants": {str(k): np.asarray(v) for k, v in g.constants.items()},
            "outputs": list(g.outputs)}


def _record_pass(rec, key, fn, graph, *inputs):
    from tinytorch.perf.acceleration import run_graph

    before = len(graph.nodes)
    out = rec.call(key, lambda: _graph(fn(graph)))
    if out is not None:
        rec.call(key + "_run", lambda: run_graph(fn(graph), *inputs))
    rec[key + "_input_kept"] = len(graph.nodes) - before


def example(p, q):
    a = p * 2.0
    unused = p + 100.0  # noqa: F841 (dead code)
    b = (a + q).tanh()
    c = (a + q).tanh()
    return b * c + 1.0


def two_outputs(p):
    q = p.exp()
    r = p * 3.0
    s = q + r  # noqa: F841
    return r, p.abs()


@probe("17.1")
def dce(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.acceleration import dead_code_elimination as dce_, trace

    x, y = Tensor(f32(rng, 4, 5)), Tensor(f32(rng, 5))
    _record_pass(rec, "example", dce_, trace(example, x, y), x, y)
    _record_pass(rec, "two_outputs", dce_, trace(two_outputs, x), x)
    w_used, w_dead = Tensor(f32(rng, 5, 2)), Tensor(f32(rng, 5, 3))

    def only_used(p, q):
        unused = p @ w_dead  # noqa: F841
        d = q.exp() * 0.0  # noqa: F841 (an input whose only use is dead stays an input)
        return p @ w_used
    _record_pass(rec, "constants", dce_, trace(only_used, x, y), x, y)
    _record_pass(rec, "nothing_dead", dce_, trace(lambda p: (p * 2.0).sum(axis=0), x), x)


@probe("17.2")
def fold(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.acceleration import constant_fold, trace

    w = Tensor(f32(rng, 2, 3))
    xp = Tensor(f32(rng, 4, 3))
    _record_pass(rec, "weight", constant_fold, trace(lambda p: p @ (w.T * 2.0) + 1.0, xp), xp)
    _record_pass(rec, "all_constant", constant_fold, trace(lambda p: w.sum() * 3.0, xp), xp)
    _record_pass(rec, "reflected", constant_fold, trace(lambda p: 2.0 - p, xp), xp)
    _record_pass(rec, "mixed", constant_fold, trace(lambda p: (p + w.sum(axis=0).exp()) * (w.sum(axis=0) - 1.0).tanh(), xp), xp)
    big = Tensor(np.ones((2048, 1024), np.float32))
    xb = Tensor(np.ones((2048, 1024), np.float32))
    rec.call("big_ops", lambda: [n.op for n in constant_fold(trace(lambda p: p + big * 2.0, xb)).nodes])


@probe("17.3")
def cse(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.acceleration import common_subexpression_elimination as cse_, trace

    x, y = Tensor(f32(rng, 4, 5)), Tensor(f32(rng, 5))
    _record_pass(rec, "example", cse_, trace(example, x, y), x, y)
    _record_pass(rec, "axes", cse_, trace(lambda p: (p.sum(axis=0), p.sum(axis=1), p.sum(axis=0)), x), x)
    _record_pass(rec, "other", cse_, trace(lambda p: p * 2.0 + p * 3.0, x), x)
    _record_pass(rec, "chain", cse_, trace(lambda p, q: (p + q).exp() * (p + q).exp() - (q + p), x, y), x, y)


@probe("17.4", replay=("dead_code_elimination", "common_subexpression_elimination"))
def fusion(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.acceleration import (common_subexpression_elimination as cse_,
                                             dead_code_elimination as dce_, fusion_groups, trace)

    x, y = Tensor(f32(rng, 4, 5)), Tensor(f32(rng, 5))
    w2 = Tensor(f32(rng, 5, 3))

    def chain(p, q):
        return (p * q + 1.0).exp().sum(axis=1)

    def shared(p):
        a = p.exp()
        return a * 2.0, a + 1.0

    def two_trees(p, q):
        a = (p * 2.0).tanh()
        return ((a @ q) + 1.0).abs()

    def out_inside(p):
        a = p * 2.0
        return a, a.exp()

    def tree(p, q):
        return (p.exp() + q.tanh()) * 0.5

    def deep(p, q):
        a = (p - q).abs()
        b = -(q * p).exp()
        return ((a + b) / 2.0).sqrt().log(), (p * p).sum()

    rec.call("chain", lambda: fusion_groups(trace(chain, x, y)))
    rec.call("optimized", lambda: fusion_groups(cse_(dce_(trace(example, x, y)))))
    rec.call("shared", lambda: fusion_groups(trace(shared, x)))
    rec.call("two_trees", lambda: fusion_groups(trace(two_trees, x, w2)))
    rec.call("out_inside", lambda: fusion_groups(trace(out_inside, x)))
    rec.call("tree", lambda: fusion_groups(trace(tree, x, y)))
    rec.call("deep", lambda: fusion_groups(trace(deep, x, y)))


@probe("17.5", messages=True)
def c_expr(rng, rec):
    from tinytorch.perf.acceleration import ELEMENTWISE, c_expression

    c = float(np.float32(rng.standard_normal()))
    for op in sorted(ELEMENTWISE):
        binary = op in ("add", "sub", "mul", "div", "pow")
        rec.call(op, c_expression, op, ["v0", "v1"][: 2 if binary else 1], {})
        if binary:
            rec.call(op + "_const", c_expression, op, ["t1"], {"other": c})
    rec.call("pow2", c_expression, "pow", ["v0"], {"other": 2})
    rec.call("pow3", c_expression, "pow", ["(v0 + v1)"], {"other": 3})
    rec.call("pow_half", c_expression, "pow", ["v0"], {"other": 0.5})
    rec.call("mul_half", c_expression, "mul", ["v0"], {"other": 0.5})
    rec.call("nested", c_expression, "exp", [c_expression("neg", ["v3"], {})], {})
    rec.call("softmax", c_expression, "softmax", ["v0"], {"axis": -1})
    rec.call("matmul", c_expression, "matmul", ["v0", "v1"], {})


@probe("17.6", messages=True)
def naive(rng, rec):
    from tinytorch.perf.acceleration import naive_matmul

    rec.call("rect", naive_matmul, f32(rng, 5, 7), f32(rng, 7, 3))
    rec.call("f64", naive_matmul, rng.standard_normal((3, 4)), rng.standard_normal((4, 2)))
    rec.call("list", naive_matmul, np.eye(3).tolist(), [[1, 2], [3, 4], [5, 6]])
    rec.call("one", naive_matmul, np.ones((1, 1)), np.full((1, 4), 2.0))
    rec.call("transposed", naive_matmul, f32(rng, 4, 3).T, f32(rng, 4, 2))
    rec.call("bad", naive_matmul, np.ones((2, 3)), np.ones((4, 5)))


@probe("17.7", messages=True)
def block_size(rng, rec):
    from tinytorch.perf.acceleration import block_size_for

    sizes = [512 * 1024, 32 * 1024, 100, 48 * 1024, 1024 ** 2, 2 * 1024 ** 2, 32 * 1024 ** 2, 3 * 64 * 64 * 4,
             3 * 64 * 64 * 4 - 1] + [int(v) for v in rng.integers(1, 1 << 26, 6)]
    rec["sizes"] = sizes
    rec.call("float32", lambda: [block_size_for(s) for s in sizes])
    rec.call("float64", lambda: [block_size_for(s, itemsize=8) for s in sizes])
    rec.call("float16", lambda: [block_size_for(s, itemsize=2) for s in sizes])
    rec.call("bad", block_size_for, 0)


@probe("17.8")
def relu_inplace(rng, rec):
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.acceleration import relu_

    t = Tensor(f32(rng, 3, 4))
    buf, before = t.data, t._version
    out = rec.call("out", relu_, t)
    rec["same_tensor"] = out is t
    rec["same_buffer"] = t.data is buf
    rec["values"] = t.data
    rec["versions"] = [before, t._version]
    base = Tensor(rng.standard_normal((3, 2)), dtype=np.float64)    # a transposed view of float64 data
    rec.call("view", relu_, base.T)
    rec["base"] = base.data
    rec["base_version"] = base._version
    special = Tensor(np.array([np.nan, -0.5, 0.0, 2.0], dtype=np.float32))
    rec.call("special", lambda: relu_(special).data)
    w = Tensor(f32(rng, 5), requires_grad=True)
    rec.call("grad_mode", relu_, w)                                 # refused: the exception's type
    rec["after_refusal"] = [w.data.copy(), w._version]
    with no_grad():
        rec.call("no_grad", lambda: relu_(w).data)
    rec["no_grad_version"] = w._version
