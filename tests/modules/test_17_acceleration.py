"""Module 17 (acceleration): the exported `tinytorch.perf.kernels`, `compiler` and `backends`, against NumPy
and PyTorch (torch.compile too, in a slow test), on the reference table of `tests/support` (module 17's
part: `tests/support/ckernels.py`).

- Kernels: `naive_matmul` and `blocked_matmul` equal `np.matmul` (and `torch.matmul`) on drawn shapes and
  memory layouts; `block_size_for` is the largest power-of-two tile with three tiles in the cache.
- Passes on graphs with known answers, each on graphs made by `trace` alone: dead-code elimination, constant
  folding (at its limit), CSE (`attr_key` tells 2 from 2.0), fusion groups, the fusion rewrite.
- Code generation, run, never read: `c_expression` and `c_literal` compiled alone equal the ops of the
  reference table on drawn inputs and on NaN, infinities and signed zeros (+ - * / with a constant bit for bit);
  `index_kinds` and `loop_source` compiled into kernels.
- `compile`: compiled == eager == PyTorch on drawn inputs, NaN and infinity included, on the C and the chunked
  NumPy backend; float64 stays float64; int8 `x * 2` and `x * 2.0` stay apart; the guards (`__call__`) on a
  planner without passes; a broken pass or kernel is named by its exercise; torch.compile gives the same numbers.
- Backends: `SizeDispatch` and `measure_threshold` (driven by a clock made of a table); every backend changes
  how, never what; `use_backend` belongs to the thread that enters it, and `trace` to the thread that traces.

Run one exercise with `pytest tests/modules/test_17_acceleration.py --exercise 17.8`.
"""
from __future__ import annotations

import os
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.support import (
    MODERATE, assert_close, laid_out, matmul_shapes, property_settings, reference_backend, torch_or_none, tt_args,
)
from tests.support.ckernels import (
    BINARY, ELEMENTWISE_ROWS, EXACT, SPECIAL, expression_functions, run_loop, same_floats,
)
from tinytorch.core.activations import GELU
from tinytorch.core.layers import Linear
from tinytorch.core.tensor import Tensor, set_grad_enabled
from tinytorch.perf import backends as be
from tinytorch.perf import compiler as cc
from tinytorch.perf import kernels as kn

torch = torch_or_none()  # the second reference where installed (not in a student edition)

pytestmark = pytest.mark.module("17")

HAS_CC = cc.c_compiler() is not None
BACKENDS = ["numpy"] + (["c"] if HAS_CC else [])
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc) on PATH: code generation is not run")


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    "Kernels of the tests go to one temporary cache (shared by the tests of this file: compiled once)."
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))


def f32(rng, shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape).astype(np.float32)


# ----------------------------------------------------------------------------- kernels (17.1-17.3)


@pytest.mark.exercise("17.1", "naive_matmul")
@property_settings(15)
@given(data=st.data())
def test_naive_matmul_equals_numpy_and_torch(data):
    sa, sb = data.draw(matmul_shapes().filter(lambda s: len(s[0]) == 2 and len(s[1]) == 2 and max(s[0] + s[1]) <= 6))
    a, b = data.draw(laid_out(sa), label="a"), data.draw(laid_out(sb), label="b")
    got = kn.naive_matmul(a, b)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32, f"naive_matmul returned {type(got).__name__} {getattr(got, 'dtype', '')}"
    assert_close(got, a @ b, op="naive_matmul", inputs={"a": a, "b": b}, rtol=1e-5, atol=1e-5)
    if torch is not None:
        assert_close(got, torch.matmul(torch.from_numpy(a.copy()), torch.from_numpy(b.copy())), op="naive_matmul",
                     inputs={"a": a, "b": b}, rtol=1e-5, atol=1e-5, reference="torch.matmul")


@pytest.mark.exercise("17.1", "naive_matmul")
def test_naive_matmul_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"^naive_matmul: inner sizes differ: a is \(2, 3\), b is \(4, 5\)$"):
        kn.naive_matmul(np.ones((2, 3)), np.ones((4, 5)))


@pytest.mark.exercise("17.2", "block_size_for")
@pytest.mark.parametrize("cache,itemsize,expected", [(32 * 1024, 4, 32), (512 * 1024, 4, 128), (1024 ** 2, 4, 256),
                                                      (2 * 1024 ** 2, 4, 256), (32 * 1024 ** 2, 4, 1024),
                                                      (100, 4, 8), (3 * 64 * 64 * 8, 8, 64), (3 * 64 * 64 * 8 - 1, 8, 32)])
def test_block_size_for(cache, itemsize, expected):
    got = kn.block_size_for(cache, itemsize)
    assert got == expected, f"block_size_for({cache}, itemsize={itemsize}) = {got}; expected {expected}"


def test_block_size_for_rejects_bad_cache():
    with pytest.raises(ValueError, match=r"block_size_for: cache_bytes must be a positive int; got 0"):
        kn.block_size_for(0)


@pytest.mark.exercise("17.3", "blocked_matmul")
@property_settings(15)
@given(n=st.integers(1, 70), k=st.integers(1, 70), m=st.integers(1, 70), block=st.sampled_from([2, 3, 8, 16, 32]),
       seed=st.integers(0, 2**16))
def test_blocked_matmul_equals_numpy_and_torch(n, k, m, block, seed):
    rng = np.random.default_rng(seed)
    a, b = f32(rng, (n, k)), f32(rng, (k, m))
    got = kn.blocked_matmul(a, b, block)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32, f"blocked_matmul returned {type(got).__name__}"
    assert_close(got, a @ b, op=f"blocked_matmul (tiles of {block})", inputs={"a": a, "b": b}, rtol=1e-4, atol=1e-4)
    if torch is not None:
        assert_close(got, torch.from_numpy(a) @ torch.from_numpy(b), op=f"blocked_matmul (tiles of {block})",
                     inputs={"a": a, "b": b}, rtol=1e-4, atol=1e-4, reference="torch.matmul")


def test_blocked_matmul_default_tile_comes_from_the_l2_size():
    "blocked_matmul (17.3) with block_size_for's (17.2) tile of this machine's L2: not an exercise's own test."
    a, b = np.arange(12.0).reshape(3, 4), np.ones((4, 2))
    assert_close(kn.blocked_matmul(a, b), (a @ b).astype(np.float32), op="blocked_matmul (the L2 tile, float64 input)")


@pytest.mark.exercise("17.3", "blocked_matmul")
def test_blocked_matmul_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"^blocked_matmul: inner sizes differ: a is \(2, 3\), b is \(4, 5\)$"):
        kn.blocked_matmul(np.ones((2, 3)), np.ones((4, 5)))


def test_cache_sizes_agree_with_sysconf():
    sizes = kn.cache_sizes()
    assert {"L1", "source"} <= set(sizes), f"cache_sizes() = {sizes}"
    try:
        l2 = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        l2 = 0
    if l2 and l2 > 0 and sizes["source"] == "sysfs":
        assert sizes["L2"] == l2, f"L2 from sysfs {sizes['L2']} differs from os.sysconf's {l2}"


# ----------------------------------------------------------------------------- passes (17.4-17.6), on traced graphs


def example(x, y):
    a = x * 2.0
    unused = x + 100.0  # noqa: F841
    b = (a + y).tanh()
    c = (a + y).tanh()
    return b * c + 1.0


X = Tensor(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
Y = Tensor(np.random.default_rng(2).standard_normal(5).astype(np.float32))


def test_trace_records_ssa_with_types_and_prints():
    g = cc.trace(example, X, Y)
    assert [n.op for n in g.nodes] == ["mul", "add", "add", "tanh", "add", "tanh", "mul", "add"]
    assert g.inputs == ["x0", "x1"] and g.outputs == ["%7"]
    assert all(n.shape == (4, 5) and n.dtype == np.float32 for n in g.nodes)
    text = str(g)
    assert text.splitlines()[0] == "graph(x0: float32[4, 5], x1: float32[5]):", text
    assert "%0 = mul(x0, other=2.0) : float32[4, 5]" in text and text.splitlines()[-1] == "    return %7", text
    assert g.problems() == [], g.problems()
    np.testing.assert_allclose(cc.run_graph(g, X, Y)[0], example(X, Y).data, rtol=1e-6)


@pytest.mark.exercise("17.4", "dead_code_elimination")
def test_dce_removes_exactly_the_dead_nodes_and_constants():
    g = cc.trace(example, X, Y)
    d = cc.dead_code_elimination(g)
    assert [n.name for n in d.nodes] == ["%0", "%2", "%3", "%4", "%5", "%6", "%7"], (
        f"dead_code_elimination kept {[n.name for n in d.nodes]}; expected every node but %1 (x + 100 is never used)")
    assert len(g.nodes) == 8, "the input graph must not change"
    w_used, w_dead = Tensor(np.ones((5, 2), np.float32)), Tensor(np.ones((5, 3), np.float32))

    def fn(p):
        (p @ w_dead).exp()
        return p @ w_used
    d2 = cc.dead_code_elimination(cc.trace(fn, X))
    assert [n.op for n in d2.nodes] == ["matmul"] and list(d2.constants) == ["c1"], (
        f"only the used weight c1 and its matmul stay; got\n{d2}")


@pytest.mark.exercise("17.5", "constant_fold")
def test_constant_fold_on_known_graphs():
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    xp = Tensor(np.ones((4, 3), np.float32))

    def fn(p):
        return p @ (w.T * 2.0) + (w.sum() - 15.0)
    f = cc.constant_fold(cc.trace(fn, xp))
    assert [n.op for n in f.nodes] == ["matmul", "add"], f"after constant_fold only matmul and add read the input; got\n{f}"
    np.testing.assert_allclose(f.constants[f.nodes[0].args[1]], w.data.T * 2)
    np.testing.assert_allclose(f.constants[f.nodes[1].args[1]], 0.0)
    np.testing.assert_allclose(cc.run_graph(f, xp)[0], fn(xp).data)
    f2 = cc.constant_fold(cc.trace(lambda p: 2.0 - p, xp))
    assert [n.op for n in f2.nodes] == ["sub"], "the 'constant' node of a reflected operand folds"
    f3 = cc.constant_fold(cc.trace(lambda p: (p.sum(), w.sum() * 3.0), xp))
    assert len(f3.nodes) == 1, f"only p.sum() reads the input; got\n{f3}"
    np.testing.assert_allclose(cc.run_graph(f3, xp)[1], w.data.sum() * 3.0, err_msg=(
        f"an output that was folded must name its new constant; outputs {f3.outputs}, constants {list(f3.constants)}"))


@pytest.mark.exercise("17.5", "constant_fold")
@pytest.mark.parametrize("extra_rows, folded", [(0, True), (1, False)], ids=["exactly-FOLD_LIMIT-folds", "one-row-more-stays"])
def test_constant_fold_limit_is_inclusive(extra_rows, folded):
    rows = cc.FOLD_LIMIT // 1024 + extra_rows
    big, xb = Tensor(np.ones((rows, 1024), np.float32)), Tensor(np.ones((rows, 1024), np.float32))
    ops = [n.op for n in cc.constant_fold(cc.trace(lambda p: p + big * 2.0, xb)).nodes]
    assert ops == (["add"] if folded else ["mul", "add"]), (
        f"a constant result of {rows * 1024} elements (FOLD_LIMIT = {cc.FOLD_LIMIT}) must {'' if folded else 'not '}"
        f"be folded; ops left {ops}")


@pytest.mark.exercise("17.6", "common_subexpression_elimination")
def test_cse_merges_duplicates_and_cascades():
    def fn(p):
        a, b = p.exp(), p.exp()
        return (a + 1.0) * (b + 1.0), p.sum(axis=0), p.sum(axis=1)
    c = cc.common_subexpression_elimination(cc.trace(fn, X))
    assert [n.op for n in c.nodes] == ["exp", "add", "mul", "sum", "sum"], (
        f"common_subexpression_elimination must keep exp, add, mul and both sums (different axes); got\n{c}")
    assert c.nodes[2].args == (c.nodes[1].name, c.nodes[1].name), "the cascade: a + 1 and b + 1 merge once a and b do"


@pytest.mark.exercise("17.6", "attr_key")
def test_attr_key_tells_types_bits_and_contents_apart():
    distinct = [2, 2.0, True, 1, np.float64(2.0), np.float32(2.0), 0.0, -0.0, None, "2", (0, 1), [0, 1],
                np.arange(3), np.arange(3.0), slice(0, 2), np.dtype("float32"), {"a": 1}, {"a": 1.0}]
    keys = [cc.attr_key(v) for v in distinct]
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            assert keys[i] != keys[j], f"attr_key({distinct[i]!r}) == attr_key({distinct[j]!r}) = {keys[i]!r}: they differ"
    equal = [(np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3)), (float("nan"), float("nan")),
             ({"b": 1, "a": slice(0, 3)}, {"a": slice(0, 3), "b": 1}), ([1, (2.5, "x")], [1, (2.5, "x")]),
             (float(np.float32(0.1)), float(np.float32(0.1)))]
    for a, b in equal:
        ka, kb = cc.attr_key(a), cc.attr_key(b)
        assert ka == kb and hash(ka) == hash(kb), f"attr_key({a!r}) and attr_key({b!r}) must be equal and hashable"


@pytest.mark.exercise("17.6", "common_subexpression_elimination")
def test_cse_keeps_int_and_float_constants_apart():
    t = Tensor(np.array([100, 7], np.int8))
    c = cc.common_subexpression_elimination(cc.trace(lambda p: (p * 2, p * 2.0, p * 2), t))
    assert [(n.op, n.attrs["other"], str(n.dtype)) for n in c.nodes] == [("mul", 2, "int8"), ("mul", 2.0, "float32")], (
        f"int8 * 2 (int8) and int8 * 2.0 (float32) are different computations; the second int8 * 2 merges:\n{c}")
    assert c.outputs == ["%0", "%1", "%0"], c.outputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_times_2_and_times_2_0_stay_apart(backend):
    "Issue 31: CSE took other=2 and other=2.0 as one key: int8 [100, 7] * 2.0 came back int8 [-56, 14]."
    t = Tensor(np.array([100, 7], np.int8))

    def fn(p):
        return p * 2, p * 2.0
    got, want = cc.compile(fn, backend=backend)(t), fn(t)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g.data, w.data), (
            f"compiled {g.dtype} {g.data.tolist()}, eager {w.dtype} {w.data.tolist()}")
    assert [w.data.tolist() for w in want] == [[-56, 14], [200.0, 14.0]]


# ----------------------------------------------------------------------------- fusion (17.7, 17.8)


@pytest.mark.exercise("17.7", "fusion_groups")
def test_fusion_groups_on_known_graphs():
    def fn(p, q):
        r = (p * q + 1.0).exp()
        return r.sum(axis=1)
    got = cc.fusion_groups(cc.trace(fn, X, Y))
    assert got == [["%0", "%1", "%2"]], f"fusion_groups of mul -> add -> exp -> sum: {got}; expected [['%0', '%1', '%2']]"

    def shared(p):
        a = p.exp()
        return a * 2.0, a + 1.0
    got = cc.fusion_groups(cc.trace(shared, X))
    assert got == [], f"exp is used by two nodes, so no group forms; got {got}"

    def tree(p, q):
        return (p.exp() + q.tanh()) * 0.5
    got = cc.fusion_groups(cc.trace(tree, X, Y))
    assert got == [["%0", "%1", "%2", "%3"]], f"two branches joined by an add form one tree; got {got}"

    def out_inside(p):
        a = p * 2.0
        return a, a.exp()
    got = cc.fusion_groups(cc.trace(out_inside, X))
    assert got == [], f"a graph output is needed outside any group: it cannot be fused inside one; got {got}"

    def square(p):
        a = p.exp()
        return a * a
    got = cc.fusion_groups(cc.trace(square, X))
    assert got == [["%0", "%1"]], f"a * a is one use of a (one consumer node): exp and mul fuse; got {got}"


def fused_as_data(graph):
    return [(n.name, n.op, tuple(n.args), list(n.attrs.get("params", [])), n.shape, str(n.dtype),
             [(b.name, b.op, tuple(b.args)) for b in n.body]) for n in graph.nodes]


@pytest.mark.exercise("17.8", "fuse_elementwise")
def test_fuse_elementwise_rewrites_given_groups():
    bias = Tensor(np.arange(3, dtype=np.float32))
    w = Tensor(np.random.default_rng(7).standard_normal((5, 3)).astype(np.float32))

    def around_matmul(p, q):
        a = (p * p * 2.0).tanh()
        m = a @ q
        return (m + bias).abs() * m
    g = cc.trace(around_matmul, X, w)
    before = [str(n) for n in g.nodes]
    got = cc.fuse_elementwise(g, [["%0", "%1", "%2"], ["%4", "%5", "%6"]])   # the groups as data: no 17.7 needed
    assert fused_as_data(got) == [
        ("%2", "fused", ("x0",), ["p0"], (4, 5), "float32", [("%0", "mul", ("p0", "p0")), ("%1", "mul", ("%0",)),
                                                              ("%2", "tanh", ("%1",))]),
        ("%3", "matmul", ("%2", "x1"), [], (4, 3), "float32", []),
        ("%6", "fused", ("%3", "c0"), ["p0", "p1"], (4, 3), "float32", [("%4", "add", ("p0", "p1")), ("%5", "abs", ("%4",)),
                                                                         ("%6", "mul", ("%5", "p0"))])], (
        f"fuse_elementwise of the groups [%0, %1, %2] and [%4, %5, %6]:\n{got}")
    assert [str(n) for n in g.nodes] == before, "fuse_elementwise must not change its input graph"
    assert got.problems() == [], got.problems()
    np.testing.assert_allclose(cc.run_graph(got, X, w)[0], around_matmul(X, w).data, rtol=1e-6, atol=1e-6)

    def widening(p, q):  # the root is wider than the group's first node, and of another dtype
        return (q.tanh() + p) * 2.0
    g2 = cc.trace(widening, X, Tensor(np.arange(5)))
    f2 = cc.fuse_elementwise(g2, [["%0", "%1", "%2"]])
    assert (f2.nodes[0].shape, f2.nodes[0].dtype) == (g2.nodes[2].shape, g2.nodes[2].dtype), (
        f"the fused node takes its root's shape and dtype; got {f2.nodes[0]}")
    np.testing.assert_allclose(cc.run_graph(f2, X, Tensor(np.arange(5)))[0], widening(X, Tensor(np.arange(5))).data, rtol=1e-6)


# ----------------------------------------------------------------------------- code generation (17.9, 17.10), run


def _ref(op, *arrays, **attrs):
    "What NumPy computes for op on float32 arrays (the compiler's replay of it), in float32."
    with np.errstate(all="ignore"):
        return np.asarray(cc.EAGER_OPS[op](*arrays, **attrs)).astype(np.float32)


@needs_cc
@pytest.mark.exercise("17.9", "c_expression")
@pytest.mark.parametrize("op", sorted(ELEMENTWISE_ROWS))
@property_settings(8)
@given(data=st.data())
def test_each_c_expression_computes_its_op_on_drawn_and_special_values(op, data):
    row = ELEMENTWISE_ROWS[op]
    case = data.draw(row.inputs())
    arrays = [np.asarray(a, np.float32) for a, t in zip(case.args, case.tensor) if t]
    out_shape = np.broadcast_shapes(*[a.shape for a in arrays])
    arrays = [np.broadcast_to(a, out_shape).ravel() for a in arrays]
    if op in BINARY:  # and each special value against each other one
        sx, sy = np.meshgrid(SPECIAL, SPECIAL)
        arrays = [np.concatenate([arrays[0], sx.ravel()]), np.concatenate([arrays[1], sy.ravel()])]
    else:
        arrays = [np.concatenate([arrays[0], SPECIAL])]
    operands = ["v0", "v1"][:len(arrays)]
    expr = cc.c_expression(op, operands, {})
    got = expression_functions([("e", expr, len(arrays))])["e"](*arrays)
    want = _ref(op, *arrays)
    ok = same_floats(got, want, exact=op in EXACT)
    i = int(np.argmin(ok))
    assert ok.all(), (f"c_expression({op!r}, {operands}, {{}}) = {expr!r}: at {arrays[0][i]!r}"
                      + (f", {arrays[1][i]!r}" if len(arrays) > 1 else "") + f" it gives {got[i]!r}, NumPy {want[i]!r} "
                      f"({int((~ok).sum())} of {ok.size} values differ; NaN and infinity must come out as in NumPy)")


@needs_cc
@pytest.mark.exercise("17.9", "c_expression")
@property_settings(10)
@given(const=st.one_of(st.floats(-1e3, 1e3, allow_nan=False).filter(lambda v: float(np.float32(v)) != v),
                       st.integers(-9, 9)), seed=st.integers(0, 2**16))
def test_arithmetic_with_a_constant_is_numpys_float32_bit_for_bit(const, seed):
    "A constant written with repr (a C double) rounds otherwise than NumPy: this test fails it."
    x = np.concatenate([np.random.default_rng(seed).uniform(-50, 50, 400).astype(np.float32), SPECIAL])
    cases = [(op, cc.c_expression(op, ["v0"], {"other": const}), 1) for op in EXACT]
    funcs = expression_functions(cases)
    for op, expr, _ in cases:
        got, want = funcs[op](x), _ref(op, x, other=const)
        ok = same_floats(got, want, exact=True)
        assert ok.all(), (f"c_expression({op!r}, ['v0'], {{'other': {const!r}}}) = {expr!r} differs from NumPy's float32 "
                          f"in {int((~ok).sum())} of {ok.size} values (first: x = {x[np.argmin(ok)]!r}: got "
                          f"{got[np.argmin(ok)]!r}, NumPy {want[np.argmin(ok)]!r}): write constants with c_literal")


@needs_cc
@pytest.mark.exercise("17.9", "c_expression")
def test_c_expressions_nest_as_written():
    "Each result is one expression: v0 - (v1 + v1) must not become v0 - v1 + v1."
    e = cc.c_expression
    nested = {"mul(add)": (e("mul", [e("add", ["v0", "v1"], {}), "v1"], {}), lambda a, b: (a + b) * b),
              "sub(sub)": (e("sub", ["v0", e("sub", ["v1", "v0"], {})], {}), lambda a, b: a - (b - a)),
              "div(mul)": (e("div", ["v0", e("mul", ["v1", "v1"], {})], {}), lambda a, b: a / (b * b)),
              "neg(sub)": (e("neg", [e("sub", ["v0", "v1"], {})], {}), lambda a, b: -(a - b)),
              "cube(add)": (e("pow", [e("add", ["v0", "v1"], {})], {"other": 3}), lambda a, b: (a + b) ** 3),
              "mul(relu)": (e("mul", [e("relu", ["v0"], {}), "v1"], {}), lambda a, b: np.maximum(a, 0) * b)}
    rng = np.random.default_rng(5)
    a, b = rng.uniform(-3, 3, 200).astype(np.float32), rng.uniform(0.5, 3, 200).astype(np.float32)
    funcs = expression_functions([(k, expr, 2) for k, (expr, _) in nested.items()])
    for k, (expr, ref) in nested.items():
        np.testing.assert_allclose(funcs[k](a, b), ref(a, b), rtol=1e-5, atol=1e-5, err_msg=f"{k}: {expr!r}")


@needs_cc
@pytest.mark.exercise("17.9", "c_expression")
def test_c_literal_is_the_float32_numpy_rounds_to():
    values = [0.1, 1 / 3, -2.5, 7, True, 1e-40, 3e38, 1e39, -1e39, float("nan"), float("inf"), np.float64(0.2), -0.0, 2 ** 100]
    funcs = expression_functions([(f"l{i}", cc.c_literal(v), 1) for i, v in enumerate(values)])
    with np.errstate(over="ignore"):
        want = np.array([np.float32(v) for v in values], np.float32)
    got = np.array([funcs[f"l{i}"](np.zeros(1, np.float32))[0] for i in range(len(values))], np.float32)
    ok = same_floats(got, want, exact=True) & (np.signbit(got) == np.signbit(want))
    assert ok.all(), f"c_literal of {[values[i] for i in np.flatnonzero(~ok)]} reads as {got[~ok].tolist()} in C; NumPy: {want[~ok].tolist()}"


@pytest.mark.exercise("17.9", "c_expression")
def test_c_expression_rejects_unknown_ops():
    with pytest.raises(NotImplementedError, match=r"^c_expression: no C code for op 'softmax'$"):
        cc.c_expression("softmax", ["v0"], {})


@pytest.mark.exercise("17.10", "index_kinds")
@pytest.mark.parametrize("out_shape, shapes, want", [
    ((3, 5), [(3, 5), (5,), (1,), (3, 1)], (["full", "inner", "scalar", "copy"], 5)),
    ((2, 3, 4), [(1, 1, 4), (3, 4), (2, 3, 4), ()], (["inner", "copy", "full", "scalar"], 4)),
    ((2, 3, 4), [(3, 4), (4,)], (["inner", "copy"], 12)),
    ((4,), [(4,), (1,)], (["full", "scalar"], 4)),
    ((), [(), ()], (["full", "full"], 1)),
    ((2, 5), [(2, 1), (1, 5)], (["copy", "inner"], 5)),
])
def test_index_kinds(out_shape, shapes, want):
    got = cc.index_kinds(out_shape, shapes)
    assert (list(got[0]), got[1]) == want, f"index_kinds({out_shape}, {shapes}) = {got}; expected {want}"


@needs_cc
@pytest.mark.exercise("17.10", "loop_source")
@pytest.mark.parametrize("kinds, inner, steps, shapes, ref", [
    (["full", "scalar"], 4, [("t0", "(v0 + v1)")], [(8,), (1,)], lambda a, b: a + b),
    (["full", "inner"], 5, [("t0", "(v0 * v1)"), ("t1", "expf(t0)"), ("t2", "(t1 - v0)")], [(3, 5), (5,)],
     lambda a, b: np.exp(a * b) - a),
    (["inner", "copy", "scalar", "full"], 6, [("t0", "(v0 + v1)"), ("t1", "(t0 * v2)"), ("t2", "(t1 - v3)")],
     [(6,), (4, 6), (1,), (4, 6)], lambda a, b, c, d: (a + b) * c - d),
    (["full"], 24, [("t0", "(-v0)")], [(24,)], lambda a: -a),
    (["full", "full"], 3, [("t0", "(v0 + v1)"), ("last", "sqrtf(fabsf(t0))")], [(6,), (6,)], lambda a, b: np.sqrt(np.abs(a + b))),
], ids=["full-scalar", "bias", "four-kinds", "one-block", "own-names"])
def test_loop_source_compiles_into_the_kernel_it_describes(kinds, inner, steps, shapes, ref):
    rng = np.random.default_rng(len(kinds) * 7 + inner)
    arrays = [f32(rng, s) for s in shapes]
    n_out = int(np.prod(np.broadcast_shapes(*shapes)))
    source = cc.loop_source("k_test", kinds, inner, steps, comment="a test kernel")
    got = run_loop(source, "k_test", len(kinds), arrays, n_out, n_out // inner)
    np.testing.assert_allclose(got, np.broadcast_to(ref(*arrays), np.broadcast_shapes(*shapes)).ravel(), rtol=1e-6,
                               atol=1e-6, err_msg=f"loop_source kinds {kinds}, inner {inner}:\n{source}")


UNARY = ["neg", "exp", "log", "sqrt", "tanh", "abs", "relu", "sigmoid", "gelu"]


@needs_cc
@pytest.mark.exercise("17.10", "loop_source")
@pytest.mark.parametrize("op", UNARY + list(BINARY))
def test_a_fused_kernel_of_each_op_equals_its_numpy_evaluation(op):
    rng = np.random.default_rng(0)
    a = f32(rng, (3, 7), 0.1, 2.0)
    b = f32(rng, (7,), 0.5, 2.0)
    params = ["p0"] if op in UNARY else ["p0", "p1"]
    body = [cc.GNode("%0", op, tuple(params), {}, (3, 7), np.dtype(np.float32)),
            cc.GNode("%1", "mul", ("%0",), {"other": 1.0}, (3, 7), np.dtype(np.float32))]
    node = cc.GNode("%1", "fused", tuple(params), {"params": params}, (3, 7), np.dtype(np.float32), body)
    shapes = [a.shape, b.shape][:len(params)]
    kernel = cc.FusedKernel(node, shapes, "c")
    args = [a, b][:len(params)]
    np.testing.assert_allclose(kernel(*args), cc.EAGER_OPS[op](*args), rtol=2e-5, atol=1e-6,
                               err_msg=f"C kernel of {op}:\n{kernel.source}")
    np.testing.assert_allclose(cc.FusedKernel(node, shapes, "numpy")(*args), cc.EAGER_OPS[op](*args), rtol=1e-6)


# ----------------------------------------------------------------------------- compile


def chain(p, q):
    t = p * 1.5 + q
    t = (t - 0.25) * t / 3.0
    t = (t + p).tanh() * q
    return (t - 1.0).exp() * 0.5 + 2.0


def torch_chain(p, q):
    t = p * 1.5 + q
    t = (t - 0.25) * t / 3.0
    t = torch.tanh(t + p) * q
    return torch.exp(t - 1.0) * 0.5 + 2.0


@pytest.mark.parametrize("backend", BACKENDS)
@property_settings(25)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=5), seed=st.integers(0, 2**16))
def test_compiled_equals_eager_with_broadcasting(backend, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = f32(rng, shapes.input_shapes[0]), f32(rng, shapes.input_shapes[1])
    compiled = COMPILED[backend]
    got = compiled(Tensor(a), Tensor(b))
    want = chain(Tensor(a), Tensor(b)).data
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got.data, want, rtol=1e-5, atol=1e-5, err_msg=compiled.explain())
    if torch is not None:
        np.testing.assert_allclose(got.data, torch_chain(torch.from_numpy(a), torch.from_numpy(b)).numpy(), rtol=1e-5, atol=1e-5)


COMPILED = {b: cc.compile(chain, backend=b) for b in ("numpy", "c")}


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_compile_uses_one_c_kernel_for_the_chain_and_says_so():
    f = cc.compile(chain)
    f(X, Y)
    plan = f.graph(X, Y)
    assert [n.op for n in plan.nodes] == ["fused", "fused"], (
        f"the chain is two fused kernels (t is used twice by different ops, so it is written out once): {plan}")
    assert "-> C kernel fused_" in f.explain(), f.explain()
    assert "#include <math.h>" in plan.nodes[0].attrs["kernel"].source


def test_numpy_backend_says_why():
    f = cc.compile(chain, backend="numpy")
    f(X, Y)
    assert "chunked NumPy (backend='numpy' asked)" in f.explain(), f.explain()


def test_mlp_block_compiled_equals_eager_and_torch():
    up, act, down = Linear(16, 64, rng=0), GELU(), Linear(64, 16, rng=1)

    def mlp(h):
        return down(act(up(h)))
    h = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    cm = cc.compile(mlp)
    got = cm(Tensor(h)).data
    np.testing.assert_allclose(got, mlp(Tensor(h)).data, rtol=1e-5, atol=1e-5)
    assert [n.op for n in cm.graph(Tensor(h)).nodes] == ["matmul", "fused", "matmul", "add"]
    if torch is None:
        return
    tt = torch.nn.functional
    ref = tt.linear(tt.gelu(tt.linear(torch.from_numpy(h), torch.from_numpy(up.weight.data), torch.from_numpy(up.bias.data)),
                            approximate="tanh"), torch.from_numpy(down.weight.data), torch.from_numpy(down.bias.data))
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_guards_retrace_on_a_new_shape_only():
    f = cc.compile(chain, backend="numpy")
    f(X, Y)
    f(X, Y)
    assert f.traces == 1
    f(Tensor(np.ones((2, 5), np.float32)), Y)
    assert f.traces == 2, "a new input shape must trace again"
    f(Tensor(np.ones((2, 5), np.int64)), Y)
    assert f.traces == 3, "a new dtype must trace again"


def branchy(p):
    if p.sum() > 0:
        return p * 2.0
    return p - 1.0


def test_data_dependent_branch_is_rechecked():
    f = cc.compile(branchy, backend="numpy")
    pos, neg = Tensor(np.ones(3, np.float32)), Tensor(-np.ones(3, np.float32))
    np.testing.assert_allclose(f(pos).data, 2.0)
    np.testing.assert_allclose(f(neg).data, -2.0)
    assert f.retraces_on_path == 1 and f.traces == 2
    assert cc.trace(branchy, pos).conversions[0]["how"] == "bool"


def test_data_dependent_branch_refused_with_explanation():
    f = cc.compile(branchy, on_branch="error")
    with pytest.raises(cc.DataDependentControlFlow,
                       match=r"^compile: branchy turned traced value %1 into a Python value \(bool\(\) -> True at "
                             r"test_17_acceleration.py:\d+\) while tracing: the graph holds only for the path taken"):
        f(Tensor(np.ones(3, np.float32)))


def test_an_op_without_compiled_form_runs_eagerly_and_is_named():
    from tinytorch.core.activations import Softmax

    def fn(p):
        return Softmax()(p * 2.0)
    f = cc.compile(fn)
    with pytest.warns(RuntimeWarning, match=r"compile: op 'softmax' has no compiled form; fn runs eagerly"):
        got = f(X)
    np.testing.assert_allclose(got.data, fn(X).data)
    assert "eager (no compiled form for softmax)" in f.explain()


def test_inference_only():
    f = cc.compile(chain)
    with pytest.raises(RuntimeError, match=r"^compile: compiled functions are for inference only: input 0 requires grad; "
                                           r"call under no_grad\(\) or pass .detach\(\)$"):
        f(Tensor(np.ones(3, np.float32), requires_grad=True), Y.data[:3])
    previous = set_grad_enabled(False)
    try:
        out = f(Tensor(np.ones(3, np.float32), requires_grad=True), Y.data[:3])
    finally:
        set_grad_enabled(previous)
    assert out.grad_fn is None and not out.requires_grad


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"compile: backend must be 'auto', 'c' or 'numpy'; got 'gpu'"):
        cc.compile(chain, backend="gpu")


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_c_compile_error_shows_source_and_compiler_message():
    source = "void broken(float *out) {\n    out[0] = undefined_thing;\n}\n"
    with pytest.raises(cc.KernelCompileError) as info:
        cc.build_c_kernel(source, "broken")
    text = str(info.value)
    assert "rejected the generated kernel broken" in text and "   2 |     out[0] = undefined_thing;" in text, text
    assert "undefined_thing" in text.split("says:")[1], "the compiler's own message must follow the source"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_an_unwritable_cache_warns_and_falls_back(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(blocked / "kernels"))
    with pytest.warns(RuntimeWarning, match=r"compile: the kernel cache .*kernels is not writable"):
        fn = cc.build_c_kernel("float seven_unwritable(void) { return 7.0f; }\n", "seven_unwritable")
    import ctypes
    fn.restype = ctypes.c_float
    assert fn() == 7.0


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_kernels_are_cached_on_disk_by_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(tmp_path))
    cc.build_c_kernel("float eight(void) { return 8.0f; }\n", "eight")
    files = sorted(p.name for p in tmp_path.glob("k_*.so"))
    assert len(files) == 1, files
    cc.build_c_kernel("float eight(void) { return 8.0f; }\n", "eight")
    assert sorted(p.name for p in tmp_path.glob("k_*.so")) == files, "the same source must reuse the cached library"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_loading_a_kernel_keeps_subnormal_numbers(tmp_path):
    # A library linked with -ffast-math (gcc 12 adds crtfastmath.o) switches the whole process to
    # flush-to-zero when it loads: every later NumPy result would lose its subnormals. In a fresh process.
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from tinytorch.perf import compiler as cc\n"
        "cc.build_c_kernel('float half(float x) { return x * 0.5f; }\\n', 'half')\n"
        "tiny = np.finfo(np.float32).smallest_subnormal\n"
        "print(float(np.float32(tiny) * np.float32(1.0)), float(np.finfo(np.float64).smallest_subnormal * 1.0))\n"
    )
    env = dict(os.environ, TINYTORCH_KERNEL_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    f32, f64 = map(float, out.stdout.split())
    assert f32 > 0 and f64 > 0, (f"after loading a compiled kernel, subnormal float32/float64 became {f32}/{f64}: "
                                 f"the library switched the process to flush-to-zero (link it without -ffast-math)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtypes_follow_tinytorch_for_integer_inputs(backend):
    def fn(p, q):
        return p * 1.5 + q, (p * 2.0).sum(axis=0)
    p = Tensor(np.arange(6, dtype=np.int64).reshape(2, 3))
    q = Tensor(np.ones(3, np.float32))
    got, want = cc.compile(fn, backend=backend)(p, q), fn(p, q)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, f"compiled dtype {g.dtype}, eager {w.dtype}"
        np.testing.assert_allclose(g.data, w.data, rtol=1e-6)


def test_backends_change_how_not_what():
    up, act, down = Linear(16, 64, rng=0), GELU(), Linear(64, 16, rng=1)

    def mlp(h):
        return down(act(up(h)))
    h = Tensor(np.random.default_rng(3).standard_normal((40, 16)).astype(np.float32))
    cm = cc.compile(mlp)
    want = mlp(h).data
    assert isinstance(be.current_backend(), be.NumpyBackend)
    for backend in (be.NumpyBackend(), be.BlockedBackend(), be.SizeDispatch(be.BlockedBackend(), be.NumpyBackend(), 10_000)):
        with be.use_backend(backend) as b:
            assert be.current_backend() is b
            np.testing.assert_allclose(cm(h).data, want, rtol=1e-4, atol=1e-5, err_msg=f"backend {backend.name}")
    assert isinstance(be.current_backend(), be.NumpyBackend), "use_backend must restore the previous backend"
    with pytest.raises(TypeError, match=r"use_backend: expected a ComputeBackend; got str"):
        be.use_backend("blocked")


class Spy(be.NumpyBackend):
    "NumPy, logging each call as (tag, method or op, operand shapes)."

    def __init__(self, tag, log):
        self.tag, self.log = tag, log

    def matmul(self, a, b):
        self.log.append((self.tag, "matmul", np.shape(a), np.shape(b)))
        return super().matmul(a, b)

    def binary(self, op, ufunc, a, b):
        self.log.append((self.tag, op, np.shape(a), np.shape(b)))
        return super().binary(op, ufunc, a, b)

    def unary(self, op, ufunc, a):
        self.log.append((self.tag, op, np.shape(a)))
        return super().unary(op, ufunc, a)


@pytest.mark.exercise("17.12", "SizeDispatch")
@pytest.mark.parametrize("a, b, side", [((8, 8), (8, 8), "small"), ((9, 8), (8, 8), "large"), ((4, 8, 8), (8, 8), "small"),
                                        ((8,), (8, 64), "small"), ((8, 65), (65,), "large"), ((1, 1), (1, 513), "large")],
                         ids=["512", "576", "batch-not-counted", "1d-a-is-a-row", "1d-b-is-a-column", "513"])
def test_size_dispatch_sends_a_product_by_its_multiply_adds(a, b, side):
    log = []
    d = be.SizeDispatch(Spy("small", log), Spy("large", log), threshold=512)
    got = d.matmul(np.ones(a, np.float32), np.ones(b, np.float32))
    np.testing.assert_array_equal(got, np.ones(a, np.float32) @ np.ones(b, np.float32))
    assert [c[0] for c in log] == [side], f"{a} @ {b} at threshold 512 must go to {side}; calls {log}"


@pytest.mark.exercise("17.12", "SizeDispatch")
def test_size_dispatch_sends_elementwise_ops_by_their_largest_operand():
    log = []
    d = be.SizeDispatch(Spy("small", log), Spy("large", log), threshold=512)
    d.binary("add", np.add, np.ones(512), 2.0), d.binary("mul", np.multiply, 3.0, np.ones(513))
    d.binary("sub", np.subtract, np.ones((1, 600)), np.ones(600)), d.unary("exp", np.exp, np.ones(600))
    d.unary("neg", np.negative, np.ones(512))
    assert [c[0] for c in log] == ["small", "large", "large", "large", "small"], f"calls {log}"


def table_clock(times, log):
    "A clock for measure_threshold: runs fn and returns the time the table holds for the backend and size it used."
    def time(fn):
        before = len(log)
        fn()
        tag, _, shape = log[before][0], log[before][1], log[before][2]
        return times[tag][shape[0]]
    return time


@pytest.mark.exercise("17.12", "measure_threshold")
@pytest.mark.parametrize("sizes, small, large, want", [
    ((16, 32, 64), (1.0, 2.0, 9.0), (2.0, 2.0, 3.0), 32 ** 3),
    ((8, 16, 32, 64), (5.0, 1.0, 4.0, 1.0), (1.0, 2.0, 2.0, 2.0), 64 ** 3),
    ((8, 16), (3.0, 3.0), (1.0, 1.0), 0),
], ids=["tie-counts-as-a-win", "a-loss-does-not-stop-the-search", "never"])
def test_measure_threshold_on_a_table_of_times(sizes, small, large, want):
    log = []
    times = {"small": dict(zip(sizes, small)), "large": dict(zip(sizes, large))}
    got = be.measure_threshold(Spy("small", log), Spy("large", log), sizes, time=table_clock(times, log))
    assert got == want, f"times small {small}, large {large} at sizes {sizes}: threshold {want}; got {got}"
    assert sorted((c[2], c[0]) for c in log) == sorted(((n, n), t) for n in sizes for t in ("small", "large")), (
        f"each size once on each backend, on square (n, n) products; calls {log}")


def test_measure_threshold_times_this_machine_by_default():
    t = be.measure_threshold(be.NumpyBackend(), be.NumpyBackend(), sizes=(8, 16))
    assert t in (0, 8 ** 3, 16 ** 3), f"measure_threshold returns n^3 of a measured size or 0; got {t}"


# ---------------------------------------------------------------------------------------------
# Compute backends: what eager ops (module 01's seam) and compiled graphs run their arithmetic on
# ---------------------------------------------------------------------------------------------
class CountingBackend(be.NumpyBackend):
    "NumPy, recording each call as (method, op name or 'matmul', operand shapes)."

    def __init__(self):
        self.calls = []

    def matmul(self, a, b):
        self.calls.append(("matmul", a.shape, b.shape))
        return super().matmul(a, b)

    def binary(self, op, ufunc, a, b):
        self.calls.append((op, np.shape(a), np.shape(b)))
        return super().binary(op, ufunc, a, b)

    def unary(self, op, ufunc, a):
        self.calls.append((op, np.shape(a)))
        return super().unary(op, ufunc, a)


def test_eager_matmul_conv_and_arithmetic_go_through_the_backend():
    from tinytorch.core.spatial import Conv2d

    rng = np.random.default_rng(0)
    a, b = Tensor(f32(rng, (3, 4))), Tensor(f32(rng, (4, 5)))
    conv = Conv2d(2, 3, 3, padding=1, rng=0)
    x = Tensor(f32(rng, (2, 2, 5, 5)))
    want = {"matmul": (a @ b).data, "conv": conv(x).data, "add": (a + 1.0).data, "rsub": (2.0 - a).data,
            "mul": (a * a).data, "exp": a.exp().data, "neg": (-a).data}
    counting = CountingBackend()
    with be.use_backend(counting):
        got = {"matmul": (a @ b).data}
        assert counting.calls == [("matmul", (3, 4), (4, 5))], f"a @ b must call the backend's matmul once; calls {counting.calls}"
        counting.calls.clear()
        got["conv"] = conv(x).data
        assert [c[0] for c in counting.calls] == ["matmul"] and counting.calls[0][1:] == ((3, 18), (18, 50)), (
            f"Conv2d's forward must make its one im2col product (3, 18) @ (18, 50) on the backend; calls {counting.calls}")
        counting.calls.clear()
        got["add"], got["rsub"], got["mul"] = (a + 1.0).data, (2.0 - a).data, (a * a).data
        got["exp"], got["neg"] = a.exp().data, (-a).data
        assert [c[0] for c in counting.calls] == ["add", "sub", "mul", "exp", "neg"], (
            f"+, reflected -, *, exp and unary - must go through the backend's binary/unary; calls {counting.calls}")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k}: a NumPy backend must give NumPy's result")
    counting.calls.clear()
    (a @ b) + b.sum() * a.exp().sum()
    assert counting.calls == [], "after the block the ops must not call the backend any more"


def mlp_and_conv_results(rng_seed=0):
    "Forward outputs and every parameter's gradient of a Linear, a Conv2d and a 3-layer MLP."
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Sequential
    from tinytorch.core.spatial import Conv2d

    rng = np.random.default_rng(rng_seed)
    models = {"linear": Linear(24, 40, rng=1), "conv": Conv2d(3, 8, 3, stride=1, padding=1, rng=2),
              "mlp": Sequential(Linear(24, 96, rng=3), ReLU(), Linear(96, 64, rng=4), GELU(), Linear(64, 10, rng=5))}
    inputs = {"linear": f32(rng, (16, 24)), "conv": f32(rng, (2, 3, 9, 9)), "mlp": f32(rng, (33, 24))}
    results = {}
    for name, model in models.items():
        for p in model.parameters():
            p.grad = None
        x = Tensor(inputs[name], requires_grad=True)
        out = model(x)
        (out * out).sum().backward()
        results[name] = [out.data, x.grad.data] + [p.grad.data for p in model.parameters()]
    return results


@pytest.mark.parametrize("make", [
    lambda: be.BlockedBackend(),
    lambda: be.SizeDispatch(be.BlockedBackend(), be.NumpyBackend(), 16 * 40 * 24),  # both sides are used
    lambda: be.SizeDispatch(be.BlockedBackend(), be.NumpyBackend(),
                             be.measure_threshold(be.BlockedBackend(), be.NumpyBackend(), sizes=(16, 32, 64))),
], ids=["blocked", "dispatch-fixed", "dispatch-measured"])
def test_backends_change_how_not_what_in_eager_forward_and_backward(make):
    want = mlp_and_conv_results()
    backend = make()
    with be.use_backend(backend):
        got = mlp_and_conv_results()
    for name in want:
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            what = "output" if i == 0 else "input gradient" if i == 1 else f"gradient of parameter {i - 2}"
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} {what} under {backend.name} differs from NumPy")


def test_blocked_backend_runs_the_blocked_matmul_on_2d_float32(monkeypatch):
    seen = []
    real = be.blocked_matmul
    monkeypatch.setattr(be, "blocked_matmul", lambda a, b, block=None: seen.append((a.shape, b.shape)) or real(a, b, block))
    x = Tensor(np.ones((4, 6), np.float32))
    with be.use_backend(be.BlockedBackend()):
        Linear(6, 3, rng=0)(x)
        Tensor(np.ones((2, 4, 6), np.float32)) @ Tensor(np.ones((6, 3), np.float32))  # a batch times a matrix: one 2-D product
        Tensor(np.ones((2, 4, 6), np.float32)) @ Tensor(np.ones((2, 6, 3), np.float32))  # batched 3-D: np.matmul
    assert seen == [((4, 6), (6, 3)), ((8, 6), (6, 3))], (
        f"the 2-D float32 products (the Linear's, and a (2, 4, 6) batch times a (6, 3) matrix folded into one "
        f"(8, 6) @ (6, 3) product) must run blocked_matmul, the batched 3-D product must not; got {seen}")


def test_use_backend_nests_and_restores_on_exceptions():
    from tinytorch.core.tensor import get_compute_backend

    outer, inner = CountingBackend(), CountingBackend()
    a = Tensor(np.ones((2, 2), np.float32))
    assert get_compute_backend() is None, "no backend is set by default: ops call NumPy directly"
    with be.use_backend(outer):
        with pytest.raises(ZeroDivisionError):
            with be.use_backend(inner):
                assert be.current_backend() is inner
                a @ a
                1 / 0
        assert be.current_backend() is outer, "leaving the inner block by an exception must restore the outer backend"
        a @ a
    assert [len(outer.calls), len(inner.calls)] == [1, 1], f"calls outer {outer.calls}, inner {inner.calls}"
    assert get_compute_backend() is None and isinstance(be.current_backend(), be.NumpyBackend), (
        "leaving the outermost block must restore NumPy (no backend)")
    same = be.use_backend(outer)  # one use_backend object entered twice, nested
    with same:
        with same:
            pass
        assert be.current_backend() is outer
    assert get_compute_backend() is None


def test_set_compute_backend_checks_the_methods():
    from tinytorch.core.tensor import set_compute_backend

    class OnlyMatmul:
        def matmul(self, a, b):
            return a @ b
    with pytest.raises(TypeError, match=r"needs the methods matmul, binary and unary; OnlyMatmul has no binary, unary"):
        set_compute_backend(OnlyMatmul())


def test_trace_and_compile_refuse_in_place_ops_naming_them():
    def scaled(x):
        y = x * 2.0
        y.add_(1.0)
        return y
    with pytest.raises(RuntimeError, match=r"trace: scaled changes a tensor of shape \(3,\) in place \(add_\)"):
        cc.trace(scaled, np.ones(3, np.float32))

    def clamped(x):
        y = x - 1.0
        return y.mul_(y > 0)   # what relu_ does
    with pytest.raises(RuntimeError, match=r"in place \(mul_\).*out-of-place"):
        cc.compile(clamped, backend="numpy")(np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------
# 17.13: relu_, an in-place ReLU for inference (and the version check it feeds)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("17.13", "relu_")
@property_settings(20)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), dtype=st.sampled_from([np.float32, np.float64]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_relu_inplace_matches_torch_relu_(shape, dtype, transposed, seed):
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    base = Tensor(data.copy(), dtype=dtype)
    t = base.T if transposed else base
    buf, before = t.data, t._version
    got = kn.relu_(t)
    expected = np.maximum(data, 0)
    assert got is t and t.data is buf, "relu_ must return the tensor itself and write into its own buffer"
    assert t.dtype == dtype, f"relu_ changed the dtype from {np.dtype(dtype)} to {t.dtype}"
    np.testing.assert_array_equal(base.data, expected, err_msg=f"relu_ on shape {tuple(shape)} "
                                  f"({'a transposed view' if transposed else 'contiguous'}): wrong values in the base")
    assert t._version == before + 1 and base._version == before + 1, (
        f"relu_ must count one in-place change (the view shares its base's count); versions {t._version}, {base._version}")
    if torch is not None:
        ref = torch.tensor(data)
        torch.relu_(ref.permute(*reversed(range(ref.ndim))) if transposed else ref)
        np.testing.assert_array_equal(base.data, ref.numpy(), err_msg="relu_ differs from torch.relu_")
        assert ref._version == base._version, f"torch counts version {ref._version}, relu_ gave {base._version}"


@pytest.mark.exercise("17.13", "relu_")
def test_relu_inplace_refusals_and_the_backward_error_like_torch():
    from tinytorch.core.autograd import no_grad

    w = Tensor([-1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be changed in place"):
        kn.relu_(w)
    assert np.array_equal(w.data, [-1.0, 2.0]) and w._version == 0, "a refused relu_ must change nothing"
    h = w * 2.0
    with pytest.raises(RuntimeError, match="MulBackward"):
        kn.relu_(h)
    nan = Tensor([np.nan, -3.0])
    kn.relu_(nan)
    assert np.isnan(nan.data[0]) and nan.data[1] == 0, f"relu_([nan, -3]) gave {nan.data.tolist()}; torch keeps nan"
    # relu_ of an array a matmul saved, under no_grad: backward raises, naming the node and both versions
    x = Tensor([[-1.0, 2.0]])
    loss = (x @ Tensor([[1.0], [1.0]], requires_grad=True)).sum()
    with no_grad():
        kn.relu_(x)
    with pytest.raises(RuntimeError, match=r"MatmulBackward.*\(1, 2\).*version 1; expected version 0"):
        loss.backward()
    if torch is not None:
        tx, tw = torch.tensor([[-1.0, 2.0]]), torch.ones(2, 1, requires_grad=True)
        tloss = (tx @ tw).sum()
        torch.relu_(tx)
        with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
            tloss.backward()


def test_module_17_writes_three_files_named_for_what_they_hold():
    "The compiler, the kernels and the backends each have a file; no re-export shim names them twice."
    import importlib.util

    assert importlib.util.find_spec("tinytorch.perf.acceleration") is None, "perf/acceleration.py is gone"
    assert {"trace", "Graph", "optimize", "fuse_elementwise", "loop_source", "build_c_kernel", "compile"} <= set(cc.__all__)
    assert set(kn.__all__) == {"cache_sizes", "naive_matmul", "block_size_for", "blocked_matmul", "matmul_gflops", "relu_"}
    assert {"ComputeBackend", "SizeDispatch", "use_backend"} <= set(be.__all__)
    assert not set(cc.__all__) & (set(kn.__all__) | set(be.__all__)), "each name in one file"
    assert cc.cache_sizes is kn.cache_sizes and be.blocked_matmul is kn.blocked_matmul, "imported from the file beside"


# ---------------------------------------------------------------------------------------------
# 17.11: the guards of a compiled function, on a planner without passes or kernels
# ---------------------------------------------------------------------------------------------
class Traced(cc.CompiledFunction):
    "A plan is the trace itself: these tests exercise __call__ (the guards) and no other exercise."

    def _plan(self, tensors, key):
        self.traces += 1
        graph = cc.trace(self.fn, *tensors)
        if any(n.op not in cc.EAGER_OPS for n in graph.nodes):
            return None
        graph = graph.copy()
        graph.outputs = graph.outputs + [c["value"] for c in graph.conversions]
        return graph


@pytest.mark.exercise("17.11", "CompiledFunction.__call__")
def test_guards_pick_the_plan_by_signature_and_branch():
    f = Traced(branchy)
    plus, minus = Tensor(np.ones(3, np.float32)), Tensor(-np.ones(3, np.float32))
    assert f(plus).data.tolist() == [2.0] * 3 and (f.traces, len(f.plans)) == (1, 1)
    f(plus * 3.0)
    assert f.traces == 1, "the same signature and path reuse the plan"
    assert f(minus).data.tolist() == [-2.0] * 3, "the other branch for a negative sum"
    assert (f.traces, f.retraces_on_path, len(f.plans)) == (2, 1, 1), (
        f"a changed branch is traced again for the same signature: traces {f.traces}, retraces {f.retraces_on_path}")
    f(Tensor(np.ones((2, 3), np.float32)))
    f(Tensor(np.ones((2, 3)), dtype=np.float64))
    assert (f.traces, len(f.plans)) == (4, 3), f"shape and dtype are the signature: traces {f.traces}, plans {len(f.plans)}"


@pytest.mark.exercise("17.11", "CompiledFunction.__call__")
def test_guards_keep_dtypes_tuples_and_the_eager_fallback():
    x64 = Tensor(np.array([1.0, 2.5]), dtype=np.float64)
    got = Traced(lambda p: p * 2.0 + 1.0)(x64)
    assert got.dtype == np.float64 and got.data.tolist() == [3.0, 6.0], f"float64 in, float64 out: {got.dtype} {got.data}"
    pair = Traced(lambda p: (p * 2.0, p.sum()))(x64)
    assert isinstance(pair, tuple) and [t.data.tolist() for t in pair] == [[2.0, 5.0], 3.5]
    fallback = Traced(lambda p: p.var(axis=0))
    got = fallback(Tensor(np.arange(6, dtype=np.float32).reshape(3, 2)))
    fallback(Tensor(np.zeros((3, 2), np.float32)))
    assert fallback.traces == 1 and np.allclose(got.data, [8 / 3, 8 / 3]), "a None plan runs fn eagerly, and stays"

    def two_guards(p):
        scale = float(p.max())
        return p * 2.0 if p.sum() > 0 else p / scale
    f = Traced(two_guards)
    f(Tensor(np.array([1.0, 2.0], np.float32)))
    got = f(Tensor(np.array([1.0, 3.0], np.float32)))
    assert f.retraces_on_path == 1 and got.data.tolist() == [2.0, 6.0], "any guard that changed means another path"


# ---------------------------------------------------------------------------------------------
# Issue 31's compiler bugs: float64, NaN and infinity through kernels, no -ffast-math
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_through_compile_stays_float64(backend):
    x = Tensor(np.random.default_rng(0).standard_normal((3, 4)), dtype=np.float64)

    def fn(p):
        return (p * 1.5 + 0.1).tanh() * p, p.sum(axis=0)
    got, want = cc.compile(fn, backend=backend)(x), fn(x)
    for g, w in zip(got, want):
        assert g.dtype == np.float64 == w.dtype, f"compiled {g.dtype}, eager {w.dtype}: float64 must stay float64"
        np.testing.assert_allclose(g.data, w.data, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_intermediates_in_a_fused_group_wrap_as_eager(backend):
    t = Tensor(np.array([100, 7, -120], np.int8))

    def fn(p):
        return (p * 2) * 1.5 + 1.0   # int8 * 2 wraps around before the float ops
    got, want = cc.compile(fn, backend=backend)(t), fn(t)
    assert got.dtype == want.dtype and np.array_equal(got.data, want.data), f"compiled {got.data}, eager {want.data}"


def test_kernels_are_built_without_fast_math():
    flags = " ".join(cc.C_FLAGS)
    assert "-ffast-math" not in flags and "-Ofast" not in flags and "-ffinite-math-only" not in flags, flags
    assert "-ffp-contract=off" in cc.C_FLAGS, "a * b + c must round twice, as NumPy does"


@needs_cc
@pytest.mark.parametrize("op", sorted(ELEMENTWISE_ROWS))
def test_nan_and_infinity_through_a_compiled_kernel_equal_eager(op):
    """Issue 31: with -ffast-math a NaN through a compiled ReLU came out as 1.0, sigmoid(-inf) as NaN. (GELU's
    finite values past 1e12 are left out: x^3 overflows there, and module 02's formula and the compiler's
    overflow at different places; NaN and the infinities are kept.)"""
    row = ELEMENTWISE_ROWS[op]
    special = SPECIAL if op != "gelu" else SPECIAL[~(np.isfinite(SPECIAL) & (np.abs(SPECIAL) > 1e12))]  # see below
    sx, sy = np.meshgrid(special, special)
    args = [Tensor(sx.ravel().copy())] + ([Tensor(sy.ravel().copy())] if op in BINARY else [])

    def fn(*ts):
        return row.tt(*ts) * 1.0 + 0.0   # three ops: a fused group, so a C kernel
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        compiled = cc.compile(fn, backend="c")
        got, want = compiled(*args), fn(*args)
    assert any(n.op == "fused" and n.attrs["kernel"].backend == "c" for n in compiled.graph(*args).nodes)
    ok = same_floats(got.data, want.data, exact=op in EXACT, rtol=1e-5)
    i = int(np.argmin(ok))
    assert ok.all(), (f"compiled {op} of {sx.ravel()[i]!r}" + (f", {sy.ravel()[i]!r}" if op in BINARY else "")
                      + f" gave {got.data[i]!r}; eager gives {want.data[i]!r}")


# ---------------------------------------------------------------------------------------------
# A broken pass or kernel is named by its exercise (issue 29), not a KeyError three cells later
# ---------------------------------------------------------------------------------------------
def test_a_pass_that_drops_a_needed_node_is_named(monkeypatch):
    def dead_code_elimination(graph):   # drops the last node's producers: %6 reads %5, which is gone
        return graph.copy(nodes=graph.nodes[:1] + graph.nodes[-1:])
    monkeypatch.setattr(cc, "PASSES", (dead_code_elimination,) + cc.PASSES[1:])
    with pytest.raises(cc.GraphError, match=r"^dead_code_elimination \(Exercise 17\.4\) returned a wrong graph: "
                                            r"%7 = add\(%6\) reads %6, which no input, constant or earlier"):
        cc.compile(example)(X, Y)


def test_a_pass_that_changes_values_is_named(monkeypatch):
    real = cc.constant_fold

    def constant_fold(graph):   # folds, then replaces every folded constant by zeros
        out = real(graph)
        out.constants = {k: (np.zeros_like(v) if k.startswith("c%") else v) for k, v in out.constants.items()}
        return out
    monkeypatch.setattr(cc, "PASSES", tuple(constant_fold if p is real else p for p in cc.PASSES))
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(cc.GraphError, match=r"^constant_fold \(Exercise 17\.5\) returned a wrong graph: it computes other "
                                            r"values on the traced inputs: output 0 differs"):
        cc.compile(lambda p: p @ (w.T * 2.0))(Tensor(np.ones((4, 3), np.float32)))


def test_groups_that_cannot_be_fused_are_named(monkeypatch):
    monkeypatch.setattr(cc, "fusion_groups", lambda graph: [[n.name for n in graph.nodes]])
    with pytest.raises(cc.GraphError, match=r"^fusion_groups \(Exercise 17\.7\) returned groups that cannot be fused"):
        cc.optimize(cc.trace(lambda p: (p.exp() * 2.0, p.exp().sum()), X))


@needs_cc
def test_a_kernel_that_computes_something_else_is_named(monkeypatch):
    real = cc.c_expression
    monkeypatch.setattr(cc, "c_expression", lambda op, operands, attrs: real("add" if op == "sub" else op, operands, attrs))
    with pytest.raises(cc.GraphError, match=r"the C kernel of %\d+ \(sub -> exp\) computes other values .* c_expression "
                                            r"\(Exercise 17\.9\) .* loop_source \(Exercise 17\.10\)"):
        cc.compile(lambda p, q: (p - q).exp())(X, Y)


# ---------------------------------------------------------------------------------------------
# Per thread: a backend and a trace belong to the thread that set them (module 01's _STATE)
# ---------------------------------------------------------------------------------------------
def in_threads(*bodies):
    "Run each body on its own thread (interleaved by the barrier they share); re-raise the first failure."
    errors, barrier = [], threading.Barrier(len(bodies))

    def run(body):
        try:
            body(barrier)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            barrier.abort()
    threads = [threading.Thread(target=run, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]


def test_use_backend_belongs_to_the_thread_that_enters_it():
    from tinytorch.core.tensor import get_compute_backend, set_compute_backend

    shared = be.use_backend(be.BlockedBackend())   # one object, entered on two threads at once
    mine = {"A": be.NumpyBackend(), "B": CountingBackend()}
    seen = {}

    def thread(name, first):
        def body(barrier):
            set_compute_backend(mine[name])
            if not first:
                barrier.wait()            # A is inside the block
            with shared:
                seen[name + " inside"] = be.current_backend()
                barrier.wait() if first else None
                barrier.wait()            # both inside
                if first:
                    pass                  # A leaves first
                else:
                    barrier.wait()        # B leaves after A
            if first:
                barrier.wait()
            seen[name + " after"] = get_compute_backend()
            Tensor(np.ones((2, 2), np.float32)) @ Tensor(np.ones((2, 2), np.float32))
        return body
    in_threads(thread("A", True), thread("B", False))
    assert seen["A inside"] is shared.backend and seen["B inside"] is shared.backend
    assert seen["A after"] is mine["A"] and seen["B after"] is mine["B"], (
        f"leaving the block restores the backend of the thread that entered it: A got {seen['A after']}, "
        f"B got {seen['B after']} (expected each its own)")
    assert [c[0] for c in mine["B"].calls] == ["matmul"], "B's product after the block ran on B's own backend"
    assert get_compute_backend() is None, "the main thread never had a backend"


def test_a_backend_on_one_thread_leaves_the_others_on_numpy():
    counting = CountingBackend()
    on_main = []

    def worker(barrier):
        with be.use_backend(counting):
            barrier.wait()
            Tensor(np.ones((2, 2), np.float32)) @ Tensor(np.ones((2, 2), np.float32))
            barrier.wait()

    def main_like(barrier):
        barrier.wait()
        on_main.append(be.current_backend())
        Tensor(np.ones((3, 3), np.float32)) @ Tensor(np.ones((3, 3), np.float32))
        barrier.wait()
    in_threads(worker, main_like)
    assert isinstance(on_main[0], be.NumpyBackend) and on_main[0] is not counting
    assert counting.calls == [("matmul", (2, 2), (2, 2))], f"only the worker's product ran on its backend: {counting.calls}"


def test_trace_records_its_own_thread_and_never_patches_tensor():
    originals = {m: getattr(Tensor, m) for m in ("__bool__", "__float__", "__int__", "item")}
    graphs, patched = {}, []

    def traced(name, fn, x):
        def body(barrier):
            def watched(p):
                patched.append(any(getattr(Tensor, m) is not f for m, f in originals.items()))
                barrier.wait()            # the other thread traces at the same time
                out = fn(p)
                barrier.wait()
                return out
            graphs[name] = cc.trace(watched, x)
        return body

    def branch(p):
        return p * 2.0 if float(p.sum()) > 0 else p - 1.0
    in_threads(traced("exp", lambda p: (p.exp() + 1.0).tanh(), X), traced("branch", branch, Tensor(np.abs(Y.data))))
    assert not any(patched), "trace must not change the Tensor class (module 01's conversion observers report instead)"
    assert [n.op for n in graphs["exp"].nodes] == ["exp", "add", "tanh"], f"thread 1's graph:\n{graphs['exp']}"
    assert [n.op for n in graphs["branch"].nodes] == ["sum", "mul"], f"thread 2's graph:\n{graphs['branch']}"
    assert graphs["exp"].conversions == [] and [c["how"] for c in graphs["branch"].conversions] == ["float"]


# ---------------------------------------------------------------------------------------------
# torch.compile: the practitioners' tool gives the same numbers (slow: inductor compiles for ~20 s)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_cc
def test_compiled_chain_equals_torch_compile():
    if torch is None:
        pytest.skip("PyTorch is not installed (the reference extra)")
    rng = np.random.default_rng(11)
    a, b = f32(rng, (64, 33)), f32(rng, (33,))
    a[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    torch.set_num_threads(1)
    with torch.no_grad():
        th = torch.compile(torch_chain, backend="inductor")(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    ours = cc.compile(chain, backend="c")(Tensor(a), Tensor(b)).data
    assert_close(ours, th, op="compile(chain) against torch.compile(chain)", rtol=1e-5, atol=1e-5,
                 reference="torch.compile (inductor)")
