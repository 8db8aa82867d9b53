"""Module 17 (acceleration): the exported `tinytorch.perf.acceleration` against NumPy and PyTorch.

- Kernels: `naive_matmul` and `blocked_matmul` equal `np.matmul` (and `torch.matmul`) on drawn shapes;
  `block_size_for` is the largest power-of-two tile with three tiles in the cache; `cache_sizes`
  agrees with `os.sysconf` where the OS reports it.
- Passes on graphs with known answers: dead-code elimination, constant folding, CSE, fusion groups.
- Code generation: `c_expression` of every elementwise op, compiled alone, equals the op on NumPy.
- `compile`: compiled == eager (and == PyTorch eager) within float32 tolerance on hypothesis-drawn
  inputs with broadcasting, on the C backend and the chunked NumPy backend, and on a
  Linear-GELU-Linear block; guards re-trace on a new shape; data-dependent branches are re-checked
  or refused; an op without a compiled form runs eagerly with a warning naming it; inference only.
- Bad input: a C compile error shows the kernel source and the compiler's message; an unwritable
  cache directory warns and falls back.

Run one exercise with `pytest tests/modules/test_17_acceleration.py --exercise 17.4`.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tinytorch.core.activations import GELU
from tinytorch.core.layers import Linear
from tinytorch.core.tensor import Tensor, set_grad_enabled
from tinytorch.perf import acceleration as acc

try:  # PyTorch is the second reference where installed (not in a student edition)
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.module("17")

HAS_CC = acc.c_compiler() is not None
BACKENDS = ["numpy"] + (["c"] if HAS_CC else [])


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    "Kernels of the tests go to one temporary cache (shared by the tests of this file: compiled once)."
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))


def f32(rng, shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape).astype(np.float32)


# ----------------------------------------------------------------------------- kernels


@pytest.mark.exercise("17.6", "naive_matmul")
@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**16))
def test_naive_matmul_equals_numpy_and_torch(n, k, m, seed):
    rng = np.random.default_rng(seed)
    a, b = f32(rng, (n, k)), f32(rng, (k, m))
    got = acc.naive_matmul(a, b)
    assert got.dtype == np.float32 and got.shape == (n, m), f"naive_matmul: {got.dtype} {got.shape}; expected float32 {(n, m)}"
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    if torch is not None:
        np.testing.assert_allclose(got, torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.exercise("17.6", "naive_matmul")
def test_naive_matmul_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"^naive_matmul: inner sizes differ: a is \(2, 3\), b is \(4, 5\)$"):
        acc.naive_matmul(np.ones((2, 3)), np.ones((4, 5)))


@pytest.mark.exercise("17.7", "block_size_for")
@pytest.mark.parametrize("cache,itemsize,expected", [(32 * 1024, 4, 32), (512 * 1024, 4, 128), (1024 ** 2, 4, 256),
                                                      (2 * 1024 ** 2, 4, 256), (32 * 1024 ** 2, 4, 1024),
                                                      (100, 4, 8), (3 * 64 * 64 * 8, 8, 64)])
def test_block_size_for(cache, itemsize, expected):
    got = acc.block_size_for(cache, itemsize)
    assert got == expected, f"block_size_for({cache}, itemsize={itemsize}) = {got}; expected {expected}"


def test_block_size_for_rejects_bad_cache():
    with pytest.raises(ValueError, match=r"block_size_for: cache_bytes must be a positive int; got 0"):
        acc.block_size_for(0)


@pytest.mark.exercise("17.7", "block_size_for")
@settings(max_examples=10, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 70), st.sampled_from([8, 16, 32]))
def test_blocked_matmul_equals_numpy(n, k, m, block):
    rng = np.random.default_rng(n * 10000 + k * 100 + m)
    a, b = f32(rng, (n, k)), f32(rng, (k, m))
    np.testing.assert_allclose(acc.blocked_matmul(a, b, block), a @ b, rtol=1e-4, atol=1e-4)


def test_cache_sizes_agree_with_sysconf():
    sizes = acc.cache_sizes()
    assert {"L1", "source"} <= set(sizes), f"cache_sizes() = {sizes}"
    try:
        l2 = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        l2 = 0
    if l2 and l2 > 0 and sizes["source"] == "sysfs":
        assert sizes["L2"] == l2, f"L2 from sysfs {sizes['L2']} differs from os.sysconf's {l2}"


# ----------------------------------------------------------------------------- passes


def example(x, y):
    a = x * 2.0
    unused = x + 100.0  # noqa: F841
    b = (a + y).tanh()
    c = (a + y).tanh()
    return b * c + 1.0


X = Tensor(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
Y = Tensor(np.random.default_rng(2).standard_normal(5).astype(np.float32))


def test_trace_records_ssa_with_types_and_prints():
    g = acc.trace(example, X, Y)
    assert [n.op for n in g.nodes] == ["mul", "add", "add", "tanh", "add", "tanh", "mul", "add"]
    assert g.inputs == ["x0", "x1"] and g.outputs == ["%7"]
    assert all(n.shape == (4, 5) and n.dtype == np.float32 for n in g.nodes)
    text = str(g)
    assert text.splitlines()[0] == "graph(x0: float32[4, 5], x1: float32[5]):", text
    assert "%0 = mul(x0, other=2.0) : float32[4, 5]" in text and text.splitlines()[-1] == "    return %7", text
    np.testing.assert_allclose(acc.run_graph(g, X, Y)[0], example(X, Y).data, rtol=1e-6)


@pytest.mark.exercise("17.1", "dead_code_elimination")
def test_dce_removes_exactly_the_dead_nodes_and_constants():
    g = acc.trace(example, X, Y)
    d = acc.dead_code_elimination(g)
    assert [n.name for n in d.nodes] == ["%0", "%2", "%3", "%4", "%5", "%6", "%7"], (
        f"dead_code_elimination kept {[n.name for n in d.nodes]}; expected every node but %1 (x + 100 is never used)")
    assert len(g.nodes) == 8, "the input graph must not change"
    w_used, w_dead = Tensor(np.ones((5, 2), np.float32)), Tensor(np.ones((5, 3), np.float32))

    def fn(p):
        (p @ w_dead).exp()
        return p @ w_used
    d2 = acc.dead_code_elimination(acc.trace(fn, X))
    assert [n.op for n in d2.nodes] == ["matmul"] and list(d2.constants) == ["c1"], (
        f"only the used weight c1 and its matmul stay; got\n{d2}")


@pytest.mark.exercise("17.2", "constant_fold")
def test_constant_fold_on_known_graphs():
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    xp = Tensor(np.ones((4, 3), np.float32))

    def fn(p):
        return p @ (w.T * 2.0) + (w.sum() - 15.0)
    f = acc.constant_fold(acc.trace(fn, xp))
    assert [n.op for n in f.nodes] == ["matmul", "add"], f"after constant_fold only matmul and add read the input; got\n{f}"
    np.testing.assert_allclose(f.constants[f.nodes[0].args[1]], w.data.T * 2)
    np.testing.assert_allclose(f.constants[f.nodes[1].args[1]], 0.0)
    np.testing.assert_allclose(acc.run_graph(f, xp)[0], fn(xp).data)
    f2 = acc.constant_fold(acc.trace(lambda p: 2.0 - p, xp))
    assert [n.op for n in f2.nodes] == ["sub"], "the 'constant' node of a reflected operand folds"
    f3 = acc.constant_fold(acc.trace(lambda p: (p.sum(), w.sum() * 3.0), xp))
    assert len(f3.nodes) == 1, f"only p.sum() reads the input; got\n{f3}"
    np.testing.assert_allclose(acc.run_graph(f3, xp)[1], w.data.sum() * 3.0, err_msg=(
        f"an output that was folded must name its new constant; outputs {f3.outputs}, constants {list(f3.constants)}"))


@pytest.mark.exercise("17.3", "common_subexpression_elimination")
def test_cse_merges_duplicates_and_cascades():
    def fn(p):
        a, b = p.exp(), p.exp()
        return (a + 1.0) * (b + 1.0), p.sum(axis=0), p.sum(axis=1)
    c = acc.common_subexpression_elimination(acc.trace(fn, X))
    assert [n.op for n in c.nodes] == ["exp", "add", "mul", "sum", "sum"], (
        f"common_subexpression_elimination must keep exp, add, mul and both sums (different axes); got\n{c}")
    assert c.nodes[2].args == (c.nodes[1].name, c.nodes[1].name), "the cascade: a + 1 and b + 1 merge once a and b do"


@pytest.mark.exercise("17.4", "fusion_groups")
def test_fusion_groups_on_known_graphs():
    def fn(p, q):
        r = (p * q + 1.0).exp()
        return r.sum(axis=1)
    got = acc.fusion_groups(acc.trace(fn, X, Y))
    assert got == [["%0", "%1", "%2"]], f"fusion_groups of mul -> add -> exp -> sum: {got}; expected [['%0', '%1', '%2']]"

    def shared(p):
        a = p.exp()
        return a * 2.0, a + 1.0
    got = acc.fusion_groups(acc.trace(shared, X))
    assert got == [], f"exp is used by two nodes, so no group forms; got {got}"

    def tree(p, q):
        return (p.exp() + q.tanh()) * 0.5
    got = acc.fusion_groups(acc.trace(tree, X, Y))
    assert got == [["%0", "%1", "%2", "%3"]], f"two branches joined by an add form one tree; got {got}"
    fused = acc.fuse_elementwise(acc.trace(tree, X, Y))
    assert [n.op for n in fused.nodes] == ["fused"] and len(fused.nodes[0].body) == 4

    def out_inside(p):
        a = p * 2.0
        return a, a.exp()
    got = acc.fusion_groups(acc.trace(out_inside, X))
    assert got == [], f"a graph output is needed outside any group: it cannot be fused inside one; got {got}"

    def square(p):
        a = p.exp()
        return a * a
    got = acc.fusion_groups(acc.trace(square, X))
    assert got == [["%0", "%1"]], f"a * a is one use of a (one consumer node): exp and mul fuse; got {got}"


# ----------------------------------------------------------------------------- code generation

UNARY = ["neg", "exp", "log", "sqrt", "tanh", "abs", "relu", "sigmoid", "gelu"]
BINARY = ["add", "sub", "mul", "div", "pow"]


@pytest.mark.exercise("17.5", "c_expression")
@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("op", UNARY + BINARY)
def test_each_c_expression_compiles_and_equals_numpy(op):
    rng = np.random.default_rng(0)
    a = f32(rng, (3, 7), 0.1, 2.0)
    b = f32(rng, (7,), 0.5, 2.0)
    params = ["p0"] if op in UNARY else ["p0", "p1"]
    body = [acc.GNode("%0", op, tuple(params), {}, (3, 7), np.dtype(np.float32)),
            acc.GNode("%1", "mul", ("%0",), {"other": 1.0}, (3, 7), np.dtype(np.float32))]
    node = acc.GNode("%1", "fused", tuple(params), {"params": params}, (3, 7), np.dtype(np.float32), body)
    shapes = [a.shape, b.shape][:len(params)]
    kernel = acc.FusedKernel(node, shapes, "c")
    args = [a, b][:len(params)]
    np.testing.assert_allclose(kernel(*args), acc.EAGER_OPS[op](*args), rtol=2e-5, atol=1e-6,
                               err_msg=f"C kernel of {op}:\n{kernel.source}")
    np.testing.assert_allclose(acc.FusedKernel(node, shapes, "numpy")(*args), acc.EAGER_OPS[op](*args), rtol=1e-6)


@pytest.mark.exercise("17.5", "c_expression")
def test_c_expression_rejects_unknown_ops():
    with pytest.raises(NotImplementedError, match=r"^c_expression: no C code for op 'softmax'$"):
        acc.c_expression("softmax", ["v0"], {})


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
@settings(max_examples=25, deadline=None)
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


COMPILED = {b: acc.compile(chain, backend=b) for b in ("numpy", "c")}


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_compile_uses_one_c_kernel_for_the_chain_and_says_so():
    f = acc.compile(chain)
    f(X, Y)
    plan = f.graph(X, Y)
    assert [n.op for n in plan.nodes] == ["fused", "fused"], (
        f"the chain is two fused kernels (t is used twice by different ops, so it is written out once): {plan}")
    assert "-> C kernel fused_" in f.explain(), f.explain()
    assert "#include <math.h>" in plan.nodes[0].attrs["kernel"].source


def test_numpy_backend_says_why():
    f = acc.compile(chain, backend="numpy")
    f(X, Y)
    assert "chunked NumPy (backend='numpy' asked)" in f.explain(), f.explain()


def test_mlp_block_compiled_equals_eager_and_torch():
    up, act, down = Linear(16, 64, rng=0), GELU(), Linear(64, 16, rng=1)

    def mlp(h):
        return down(act(up(h)))
    h = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    cm = acc.compile(mlp)
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
    f = acc.compile(chain, backend="numpy")
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
    f = acc.compile(branchy, backend="numpy")
    pos, neg = Tensor(np.ones(3, np.float32)), Tensor(-np.ones(3, np.float32))
    np.testing.assert_allclose(f(pos).data, 2.0)
    np.testing.assert_allclose(f(neg).data, -2.0)
    assert f.retraces_on_path == 1 and f.traces == 2
    assert acc.trace(branchy, pos).conversions[0]["method"] == "__bool__"


def test_data_dependent_branch_refused_with_explanation():
    f = acc.compile(branchy, on_branch="error")
    with pytest.raises(acc.DataDependentControlFlow,
                       match=r"^compile: branchy turned traced value %1 into a Python value \(__bool__ -> True at "
                             r"test_17_acceleration.py:\d+\) while tracing: the graph holds only for the path taken"):
        f(Tensor(np.ones(3, np.float32)))


def test_an_op_without_compiled_form_runs_eagerly_and_is_named():
    from tinytorch.core.activations import Softmax

    def fn(p):
        return Softmax()(p * 2.0)
    f = acc.compile(fn)
    with pytest.warns(RuntimeWarning, match=r"compile: op 'softmax' has no compiled form; fn runs eagerly"):
        got = f(X)
    np.testing.assert_allclose(got.data, fn(X).data)
    assert "eager (no compiled form for softmax)" in f.explain()


def test_inference_only():
    f = acc.compile(chain)
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
        acc.compile(chain, backend="gpu")


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_c_compile_error_shows_source_and_compiler_message():
    source = "void broken(float *out) {\n    out[0] = undefined_thing;\n}\n"
    with pytest.raises(acc.KernelCompileError) as info:
        acc.build_c_kernel(source, "broken")
    text = str(info.value)
    assert "rejected the generated kernel broken" in text and "   2 |     out[0] = undefined_thing;" in text, text
    assert "undefined_thing" in text.split("says:")[1], "the compiler's own message must follow the source"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_an_unwritable_cache_warns_and_falls_back(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(blocked / "kernels"))
    with pytest.warns(RuntimeWarning, match=r"compile: the kernel cache .*kernels is not writable"):
        fn = acc.build_c_kernel("float seven_unwritable(void) { return 7.0f; }\n", "seven_unwritable")
    import ctypes
    fn.restype = ctypes.c_float
    assert fn() == 7.0


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_kernels_are_cached_on_disk_by_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTORCH_KERNEL_CACHE", str(tmp_path))
    acc.build_c_kernel("float eight(void) { return 8.0f; }\n", "eight")
    files = sorted(p.name for p in tmp_path.glob("k_*.so"))
    assert len(files) == 1, files
    acc.build_c_kernel("float eight(void) { return 8.0f; }\n", "eight")
    assert sorted(p.name for p in tmp_path.glob("k_*.so")) == files, "the same source must reuse the cached library"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_loading_a_kernel_keeps_subnormal_numbers(tmp_path):
    # A library linked with -ffast-math (gcc 12 adds crtfastmath.o) switches the whole process to
    # flush-to-zero when it loads: every later NumPy result would lose its subnormals. In a fresh process.
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from tinytorch.perf import acceleration as acc\n"
        "acc.build_c_kernel('float half(float x) { return x * 0.5f; }\\n', 'half')\n"
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
    got, want = acc.compile(fn, backend=backend)(p, q), fn(p, q)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, f"compiled dtype {g.dtype}, eager {w.dtype}"
        np.testing.assert_allclose(g.data, w.data, rtol=1e-6)


def test_backends_change_how_not_what():
    up, act, down = Linear(16, 64, rng=0), GELU(), Linear(64, 16, rng=1)

    def mlp(h):
        return down(act(up(h)))
    h = Tensor(np.random.default_rng(3).standard_normal((40, 16)).astype(np.float32))
    cm = acc.compile(mlp)
    want = mlp(h).data
    assert isinstance(acc.current_backend(), acc.NumpyBackend)
    for backend in (acc.NumpyBackend(), acc.BlockedBackend(), acc.SizeDispatch(acc.BlockedBackend(), acc.NumpyBackend(), 10_000)):
        with acc.use_backend(backend) as b:
            assert acc.current_backend() is b
            np.testing.assert_allclose(cm(h).data, want, rtol=1e-4, atol=1e-5, err_msg=f"backend {backend.name}")
    assert isinstance(acc.current_backend(), acc.NumpyBackend), "use_backend must restore the previous backend"
    with pytest.raises(TypeError, match=r"use_backend: expected a ComputeBackend; got str"):
        acc.use_backend("blocked")


def test_size_dispatch_uses_the_threshold():
    calls = []

    class Spy(acc.NumpyBackend):
        def __init__(self, tag):
            self.tag = tag

        def matmul(self, a, b):
            calls.append(self.tag)
            return super().matmul(a, b)
    d = acc.SizeDispatch(Spy("small"), Spy("large"), threshold=8 * 8 * 8)
    d.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
    d.matmul(np.ones((9, 8), np.float32), np.ones((8, 8), np.float32))
    assert calls == ["small", "large"], f"8x8x8 = 512 multiply-adds is small, 9x8x8 large; got {calls}"
    t = acc.measure_threshold(acc.NumpyBackend(), acc.NumpyBackend(), sizes=(8, 16))
    assert t in (0, 8 ** 3, 16 ** 3), f"measure_threshold returns n^3 of a measured size or 0; got {t}"


# ---------------------------------------------------------------------------------------------
# Compute backends: what eager ops (module 01's seam) and compiled graphs run their arithmetic on
# ---------------------------------------------------------------------------------------------
class CountingBackend(acc.NumpyBackend):
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
    with acc.use_backend(counting):
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
    lambda: acc.BlockedBackend(),
    lambda: acc.SizeDispatch(acc.BlockedBackend(), acc.NumpyBackend(), 16 * 40 * 24),  # both sides are used
    lambda: acc.SizeDispatch(acc.BlockedBackend(), acc.NumpyBackend(),
                             acc.measure_threshold(acc.BlockedBackend(), acc.NumpyBackend(), sizes=(16, 32, 64))),
], ids=["blocked", "dispatch-fixed", "dispatch-measured"])
def test_backends_change_how_not_what_in_eager_forward_and_backward(make):
    want = mlp_and_conv_results()
    backend = make()
    with acc.use_backend(backend):
        got = mlp_and_conv_results()
    for name in want:
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            what = "output" if i == 0 else "input gradient" if i == 1 else f"gradient of parameter {i - 2}"
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name} {what} under {backend.name} differs from NumPy")


def test_blocked_backend_runs_the_blocked_matmul_on_2d_float32(monkeypatch):
    seen = []
    real = acc.blocked_matmul
    monkeypatch.setattr(acc, "blocked_matmul", lambda a, b, block=None: seen.append((a.shape, b.shape)) or real(a, b, block))
    x = Tensor(np.ones((4, 6), np.float32))
    with acc.use_backend(acc.BlockedBackend()):
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
    with acc.use_backend(outer):
        with pytest.raises(ZeroDivisionError):
            with acc.use_backend(inner):
                assert acc.current_backend() is inner
                a @ a
                1 / 0
        assert acc.current_backend() is outer, "leaving the inner block by an exception must restore the outer backend"
        a @ a
    assert [len(outer.calls), len(inner.calls)] == [1, 1], f"calls outer {outer.calls}, inner {inner.calls}"
    assert get_compute_backend() is None and isinstance(acc.current_backend(), acc.NumpyBackend), (
        "leaving the outermost block must restore NumPy (no backend)")
    same = acc.use_backend(outer)  # one use_backend object entered twice, nested
    with same:
        with same:
            pass
        assert acc.current_backend() is outer
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
        acc.trace(scaled, np.ones(3, np.float32))

    def clamped(x):
        y = x - 1.0
        return y.mul_(y > 0)   # what relu_ does
    with pytest.raises(RuntimeError, match=r"in place \(mul_\).*out-of-place"):
        acc.compile(clamped, backend="numpy")(np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------
# 17.8: relu_, an in-place ReLU for inference (and the version check it feeds)
# ---------------------------------------------------------------------------------------------
@pytest.mark.exercise("17.8", "relu_")
@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), dtype=st.sampled_from([np.float32, np.float64]),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_relu_inplace_matches_torch_relu_(shape, dtype, transposed, seed):
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    base = Tensor(data.copy(), dtype=dtype)
    t = base.T if transposed else base
    buf, before = t.data, t._version
    got = acc.relu_(t)
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


@pytest.mark.exercise("17.8", "relu_")
def test_relu_inplace_refusals_and_the_backward_error_like_torch():
    from tinytorch.core.autograd import no_grad

    w = Tensor([-1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be changed in place"):
        acc.relu_(w)
    assert np.array_equal(w.data, [-1.0, 2.0]) and w._version == 0, "a refused relu_ must change nothing"
    h = w * 2.0
    with pytest.raises(RuntimeError, match="MulBackward"):
        acc.relu_(h)
    nan = Tensor([np.nan, -3.0])
    acc.relu_(nan)
    assert np.isnan(nan.data[0]) and nan.data[1] == 0, f"relu_([nan, -3]) gave {nan.data.tolist()}; torch keeps nan"
    # relu_ of an array a matmul saved, under no_grad: backward raises, naming the node and both versions
    x = Tensor([[-1.0, 2.0]])
    loss = (x @ Tensor([[1.0], [1.0]], requires_grad=True)).sum()
    with no_grad():
        acc.relu_(x)
    with pytest.raises(RuntimeError, match=r"MatmulBackward.*\(1, 2\).*version 1; expected version 0"):
        loss.backward()
    if torch is not None:
        tx, tw = torch.tensor([[-1.0, 2.0]]), torch.ones(2, 1, requires_grad=True)
        tloss = (tx @ tw).sum()
        torch.relu_(tx)
        with pytest.raises(RuntimeError, match="is at version 1; expected version 0"):
            tloss.backward()


def test_the_compiler_has_its_own_package_path():
    """`tinytorch.perf.compiler` (exported from modules/common/compiler.ipynb) names module 17's compiler objects."""
    from tinytorch.perf import acceleration, compiler
    assert {"trace", "Graph", "optimize", "fuse_elementwise", "build_c_kernel", "compile"} <= set(compiler.__all__)
    for name in compiler.__all__:
        assert getattr(compiler, name) is getattr(acceleration, name), f"tinytorch.perf.compiler.{name} is not module 17's"
