"""Probes of module 17 (acceleration): see tito/probes/__init__.py.

Every exercise is run on its own inputs, so one bug is charged once: the passes get graphs made by
`trace` (given code) from small functions, fusion's rewrite gets its groups as data, the guards get a
planner built from `trace` alone (no pass, no kernel), the dispatch gets spy backends and a table of
times for a clock. Graphs are recorded as data (nodes as name, op, args and attrs; constants;
outputs) with what `run_graph` (given) computes from them. Generated C is judged by behaviour: the
C expressions (17.9) and loops (17.10) are compiled with `build_c_kernel` (given) and run on numbers,
NaN and infinities included, never compared as text; any spacing or parenthesisation that computes
the same numbers keeps full marks. Checking 17.9 and 17.10 needs a C compiler (`cc`) where the
submission runs, as building the kernels does.
"""
import numpy as np

from . import probe


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _attrs(attrs):
    return {str(k): v for k, v in dict(attrs).items() if k not in ("params", "kernel")}


def _graph(g):
    """A Graph as data (the record cannot hold the object); a fused node's params and body too."""
    def node(n):
        out = [n.name, n.op, list(n.args), _attrs(n.attrs), list(n.shape), np.dtype(n.dtype).name]
        if n.op == "fused":
            out += [list(n.attrs.get("params", [])), [[b.name, b.op, list(b.args), _attrs(b.attrs)] for b in n.body]]
        return out
    return {"inputs": list(g.inputs),
            "nodes": [node(n) for n in g.nodes],
            "constants": {str(k): np.asarray(v) for k, v in g.constants.items()},
            "outputs": list(g.outputs)}


def _record_pass(rec, key, fn, graph, *inputs):
    from tinytorch.perf.compiler import run_graph

    before = [str(n) for n in graph.nodes]
    out = rec.call(key, lambda: _graph(fn(graph)))
    if out is not None:
        rec.call(key + "_run", lambda: run_graph(fn(graph), *inputs))
    rec[key + "_input_kept"] = [str(n) for n in graph.nodes] == before


def example(p, q):
    a = p * 2.0
    unused = p + 100.0  # noqa: F841 (dead code)
    b = (a + q).tanh()
    c = (a + q).tanh()
    return b * c + 1.0


def example_optimized(p, q):  # `example` as dead-code elimination and CSE leave it
    t = (p * 2.0 + q).tanh()
    return t * t + 1.0


def two_outputs(p):
    q = p.exp()
    r = p * 3.0
    s = q + r  # noqa: F841
    return r, p.abs()


# ------------------------------------------------------------------ part 1: matmul kernels


@probe("17.1", messages=True)
def naive(rng, rec):
    from tinytorch.perf.kernels import naive_matmul

    rec.call("rect", naive_matmul, f32(rng, 5, 7), f32(rng, 7, 3))
    rec.call("f64", naive_matmul, rng.standard_normal((3, 4)), rng.standard_normal((4, 2)))
    rec.call("list", naive_matmul, np.eye(3).tolist(), [[1, 2], [3, 4], [5, 6]])
    rec.call("one", naive_matmul, np.ones((1, 1)), np.full((1, 4), 2.0))
    rec.call("transposed", naive_matmul, f32(rng, 4, 3).T, f32(rng, 4, 2))
    rec.call("bad", naive_matmul, np.ones((2, 3)), np.ones((4, 5)))


@probe("17.2", messages=True)
def block_size(rng, rec):
    from tinytorch.perf.kernels import block_size_for

    sizes = [512 * 1024, 32 * 1024, 100, 48 * 1024, 1024 ** 2, 2 * 1024 ** 2, 32 * 1024 ** 2, 3 * 64 * 64 * 4,
             3 * 64 * 64 * 4 - 1] + [int(v) for v in rng.integers(1, 1 << 26, 6)]
    rec["sizes"] = sizes
    rec.call("float32", lambda: [block_size_for(s) for s in sizes])
    rec.call("float64", lambda: [block_size_for(s, itemsize=8) for s in sizes])
    rec.call("float16", lambda: [block_size_for(s, itemsize=2) for s in sizes])
    rec.call("bad", block_size_for, 0)


@probe("17.3", messages=True)
def blocked(rng, rec):
    from tinytorch.perf.kernels import blocked_matmul

    for n, k, m, block in ((5, 7, 3, 2), (70, 33, 65, 16), (1, 1, 1, 8), (8, 8, 8, 8), (9, 17, 2, 4), (40, 3, 40, 32),
                           (3, 3, 3, 2), (16, 9, 5, 3)):
        rec.call(f"{n}x{k}x{m}_tile{block}", blocked_matmul, f32(rng, n, k), f32(rng, k, m), block)
    rec.call("f64_default_tile", blocked_matmul, rng.standard_normal((20, 30)), rng.standard_normal((30, 10)))
    rec.call("bad", blocked_matmul, np.ones((2, 3)), np.ones((4, 5)))


# ------------------------------------------------------------------ part 3: passes, on traced graphs


@probe("17.4")
def dce(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import dead_code_elimination as dce_, trace

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

    def chain_of_dead(p):
        a = p.exp()
        b = a * 2.0  # noqa: F841 (dead, and makes a dead)
        c = p.abs()
        return c + 1.0, c * 3.0
    _record_pass(rec, "dead_chain", dce_, trace(chain_of_dead, x), x)


@probe("17.5")
def fold(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import FOLD_LIMIT, constant_fold, trace

    w = Tensor(f32(rng, 2, 3))
    xp = Tensor(f32(rng, 4, 3))
    _record_pass(rec, "weight", constant_fold, trace(lambda p: p @ (w.T * 2.0) + 1.0, xp), xp)
    _record_pass(rec, "all_constant", constant_fold, trace(lambda p: w.sum() * 3.0, xp), xp)
    _record_pass(rec, "reflected", constant_fold, trace(lambda p: 2.0 - p, xp), xp)
    _record_pass(rec, "mixed", constant_fold, trace(lambda p: (p + w.sum(axis=0).exp()) * (w.sum(axis=0) - 1.0).tanh(), xp), xp)
    # the limit: a result of exactly FOLD_LIMIT elements folds, one row more does not
    rows = FOLD_LIMIT // 1024
    for name, r in (("at_limit", rows), ("over_limit", rows + 1)):
        big, xb = Tensor(np.ones((r, 1024), np.float32)), Tensor(np.ones((r, 1024), np.float32))
        rec.call(name, lambda: [n.op for n in constant_fold(trace(lambda p: p + big * 2.0, xb)).nodes])


@probe("17.6")
def cse(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import attr_key, common_subexpression_elimination as cse_, trace

    x, y = Tensor(f32(rng, 4, 5)), Tensor(f32(rng, 5))
    _record_pass(rec, "example", cse_, trace(example, x, y), x, y)
    _record_pass(rec, "axes", cse_, trace(lambda p: (p.sum(axis=0), p.sum(axis=1), p.sum(axis=0)), x), x)
    _record_pass(rec, "other", cse_, trace(lambda p: p * 2.0 + p * 3.0, x), x)
    _record_pass(rec, "chain", cse_, trace(lambda p, q: (p + q).exp() * (p + q).exp() - (q + p), x, y), x, y)
    small = Tensor(np.array([100, 7, -3], np.int8))
    _record_pass(rec, "int_vs_float", cse_, trace(lambda p: (p * 2, p * 2.0, p * 2), small), small)
    mask = np.array([True, False, True, False, True])
    _record_pass(rec, "array_attrs", cse_, trace(
        lambda p: (p.masked_fill(mask, 0.0), p.masked_fill(mask.copy(), 0.0), p.masked_fill(~mask, 0.0)), x), x)
    values = [2, 2.0, True, 1, np.float64(2.0), 0.0, -0.0, float("nan"), None, "2", (0, 1), [0, 1], {"a": 1},
              np.arange(3), np.arange(3.0), np.arange(3), slice(0, 2), np.dtype("float32")]
    rec.call("keys_equal", lambda: [[bool(attr_key(a) == attr_key(b)) for b in values] for a in values])
    rec.call("keys_hash", lambda: [bool(hash(attr_key(a)) == hash(attr_key(a))) for a in values])


# ------------------------------------------------------------------ part 4: fusion


@probe("17.7")
def fusion(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import fusion_groups, trace

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

    def square(p):
        a = p.exp()
        return a * a

    rec.call("chain", lambda: fusion_groups(trace(chain, x, y)))
    rec.call("optimized", lambda: fusion_groups(trace(example_optimized, x, y)))
    rec.call("shared", lambda: fusion_groups(trace(shared, x)))
    rec.call("two_trees", lambda: fusion_groups(trace(two_trees, x, w2)))
    rec.call("out_inside", lambda: fusion_groups(trace(out_inside, x)))
    rec.call("tree", lambda: fusion_groups(trace(tree, x, y)))
    rec.call("deep", lambda: fusion_groups(trace(deep, x, y)))
    rec.call("square", lambda: fusion_groups(trace(square, x)))


@probe("17.8")
def fuse(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import fuse_elementwise, trace

    x, y = Tensor(f32(rng, 4, 5)), Tensor(f32(rng, 5))
    w3, bias = Tensor(f32(rng, 5, 3)), Tensor(f32(rng, 3))

    def tree(p, q):
        return (p.exp() + q.tanh()) * 0.5

    def around_matmul(p, q):
        a = (p * p * 2.0).tanh()
        m = a @ q
        return (m + bias).abs() * m

    def with_output(p, q):
        a = p * q
        return (a - 1.0).exp(), a.sum()

    def reads_late(p, q):  # the group reads its second outside value only in its last node
        return (p.abs() * 3.0) + q

    cases = {"tree": (tree, (x, y), [["%0", "%1", "%2", "%3"]]),
             "part": (tree, (x, y), [["%0", "%2", "%3"]]),
             "two_groups": (around_matmul, (x, w3), [["%0", "%1", "%2"], ["%4", "%5", "%6"]]),
             "no_groups": (around_matmul, (x, w3), []),
             "after_a_node": (with_output, (x, y), [["%1", "%2"]]),
             "reads_late": (reads_late, (x, y), [["%0", "%1", "%2"]]),
             "small_first": (lambda p, q: (q.tanh() + p) * 2.0, (x, y), [["%0", "%1", "%2"]]),
             "int_first": (lambda p, q: (q * 2) * 1.5 + p, (x, Tensor(np.arange(5))), [["%0", "%1", "%2"]])}
    for name, (fn, args, groups) in cases.items():
        _record_pass(rec, name, lambda g, groups=groups: fuse_elementwise(g, [list(grp) for grp in groups]),
                     trace(fn, *args), *args)


# ------------------------------------------------------------------ part 5: code generation, compiled and run


def _c_function(build_c_kernel, source, name, n_args):
    """The ctypes function `name(p0, ..., out, n)` of C `source` (float pointers, then an int64), built with the
    student's given `build_c_kernel`. A source that does not compile raises a short RuntimeError naming the
    function and the compiler's first error line (the full message is too long for a record)."""
    import ctypes

    try:
        fn = build_c_kernel(source, name)
    except Exception as e:
        if type(e).__name__ != "KernelCompileError":
            raise
        said = str(e).split(" says:\n", 1)[-1]
        first = next((ln for ln in said.splitlines() if "error" in ln), said.splitlines()[0] if said else "")
        raise RuntimeError(f"the generated C does not compile ({first.strip()[:200]})") from None
    fn.restype, fn.argtypes = None, [ctypes.c_void_p] * (n_args + 1) + [ctypes.c_int64]
    return fn


def _call(fn, arrays, n_out, count):
    "Call a C function on float32 copies of `arrays`; returns its output and 4 guard elements after it (-7: untouched)."
    arrays = [np.ascontiguousarray(a, np.float32) for a in arrays]
    out = np.full(n_out + 4, -7.0, np.float32)
    fn(*[a.ctypes.data for a in arrays], out.ctypes.data, count)
    return out


def _expression_source(cases):
    "One C file, a function per case (expression, inputs) writing out[i] = expression of v0 = a0[i], v1 = a1[i]."
    lines = ["#include <math.h>", "#include <stdint.h>"]
    for k, (expr, n_in) in enumerate(cases):
        params = "".join(f"const float *a{j}, " for j in range(n_in))
        loads = " ".join(f"const float v{j} = a{j}[i];" for j in range(n_in))
        lines.append(f"void probe_{k}({params}float *out, int64_t n) {{\n"
                     f"    for (int64_t i = 0; i < n; i++) {{ {loads} out[i] = {expr}; }}\n}}")
    return "\n".join(lines) + "\n"


def _bits(v):
    a = getattr(v, "a", None)
    return a if isinstance(a, np.ndarray) else None


def _codegen_check(values, ref):
    """17.9 and 17.10: arithmetic cases (+ - * / and literals) and loops bit for bit (NaN where NaN),
    transcendental ones within float32 rounding (the student's formula may round otherwise), the rest exactly."""
    for key, want in ref.items():
        got = values.get(key)
        g, w = _bits(got), _bits(want)
        kind, message = type(got).__name__, str(getattr(got, "message", ""))
        if kind == "Raised" and getattr(got, "kind", "") == "NotImplementedError" and type(want).__name__ != "Raised":
            return f"{key}: not implemented yet (NotImplementedError raised)"
        if kind == "Raised" and "no C compiler" in message:
            return (f"{key}: there is no C compiler where your code was checked ({message}); module 17's code "
                    f"generation needs one (ask your instructor)")
        if w is None:
            if repr(got) != repr(want):
                return f"{key}: got {got!r}, expected {want!r}"
            continue
        if g is None:
            return f"{key}: got {got!r}, expected an array of {w.size} values"
        if g.shape != w.shape:
            return f"{key}: {g.size} values, expected {w.size}"
        exact = key.split(":")[0] in ("add", "sub", "mul", "div") or key.startswith(("lit", "loop"))
        with np.errstate(invalid="ignore"):
            close = np.where(np.isnan(w), np.isnan(g), (g == w) if exact else np.isclose(g, w, rtol=2e-5, atol=1e-6))
        if not close.all():
            i = int(np.argmin(close))
            return (f"{key}: {int((~close).sum())} of {close.size} values differ from the reference's (first at {i}: "
                    f"got {g[i]!r}, expected {w[i]!r})"
                    + (" (NaN and infinity must come out as in NumPy)" if not (np.isfinite(w[i]) and np.isfinite(g[i]))
                       else "")
                    + (" (arithmetic with a constant is bit for bit NumPy's float32: write the constant with c_literal)"
                       if exact and "const" in key else "")
                    + (" (-7.0 after the output: the kernel wrote past its end)" if key.startswith("loop") and i >= w.size - 4
                       else ""))
    return ""


@probe("17.9", check=_codegen_check)
def c_expr(rng, rec):
    from tinytorch.perf.compiler import ELEMENTWISE, build_c_kernel, c_expression, c_literal

    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3.0e38, -88.0, 88.0, 100.0], np.float32)
    xs = np.concatenate([special, rng.uniform(-6, 6, 120).astype(np.float32)])
    ys = np.concatenate([rng.uniform(0.25, 3, 10).astype(np.float32), rng.uniform(-3, 3, 120).astype(np.float32)])
    const = float(rng.uniform(0.1, 3.0))  # a float64 that float32 cannot hold: a C double would round otherwise
    cases = []
    for op in sorted(ELEMENTWISE):
        if op in ("add", "sub", "mul", "div", "pow"):
            cases += [(f"{op}:arrays", op, ["v0", "v1"], {}), (f"{op}:const", op, ["v0"], {"other": const}),
                      (f"{op}:int_const", op, ["v0"], {"other": 3})]
        else:
            cases.append((f"{op}:", op, ["v0"], {}))
    cases += [("pow:square", "pow", ["v0"], {"other": 2}), ("pow:half", "pow", ["v0"], {"other": 0.5}),
              ("mul:const_tenth", "mul", ["v0"], {"other": 0.1}), ("add:const_third", "add", ["v0"], {"other": 1 / 3}),
              ("div:const_tenth", "div", ["v0"], {"other": 0.1}), ("sub:const_third", "sub", ["v0"], {"other": 1 / 3})]
    nested = [  # operands that are the student's own expressions: every result must nest as written
        ("mul:of_add", lambda: c_expression("mul", [c_expression("add", ["v0", "v1"], {}), "v1"], {})),
        ("sub:of_sub", lambda: c_expression("sub", ["v0", c_expression("sub", ["v1", "v0"], {})], {})),
        ("div:of_mul", lambda: c_expression("div", ["v0", c_expression("mul", ["v1", "v1"], {})], {})),
        ("neg:of_sub", lambda: c_expression("neg", [c_expression("sub", ["v0", "v1"], {})], {})),
        ("exp:of_neg", lambda: c_expression("exp", [c_expression("neg", ["v0"], {})], {})),
        ("mul:of_relu", lambda: c_expression("mul", [c_expression("relu", ["v0"], {}), "v1"], {})),
        ("pow:cube_of_sum", lambda: c_expression("pow", [c_expression("add", ["v0", "v1"], {})], {"other": 3}))]
    literals = [0.1, 1 / 3, -2.5, 7, True, 1e-40, 3e38, 1e39, -1e39, float("nan"), float("inf"), np.float64(0.2), -0.0]
    funcs = []  # (key, C expression, number of inputs)
    for key, op, operands, attrs in cases:
        expr = rec.call(key + "_text", c_expression, op, operands, attrs)
        funcs.append((key, expr if isinstance(expr, str) else "0.0f", 2 if any("v1" in o for o in operands) else 1))
        rec[key + "_text"] = isinstance(expr, str) or rec[key + "_text"]  # the text itself is not judged
    for key, make in nested:
        expr = rec.call(key + "_text", make)
        funcs.append((key, expr if isinstance(expr, str) else "0.0f", 2))
        rec[key + "_text"] = isinstance(expr, str) or rec[key + "_text"]
    for i, v in enumerate(literals):
        lit = rec.call(f"lit{i}_text", c_literal, v)
        funcs.append((f"lit{i}", lit if isinstance(lit, str) else "0.0f", 1))
        rec[f"lit{i}_text"] = isinstance(lit, str) or rec[f"lit{i}_text"]
    source = _expression_source([(expr, n) for _, expr, n in funcs])
    for k, (key, _, n_in) in enumerate(funcs):
        op = key.split(":")[0]
        a = np.abs(xs) if op in ("pow", "log", "sqrt") and key not in ("pow:arrays", "pow:cube_of_sum") else xs
        b = np.abs(ys) if op == "pow" else ys
        size = 1 if key.startswith("lit") else a.size
        rec.call(key, lambda k=k, n_in=n_in, a=a, b=b, size=size: _call(
            _c_function(build_c_kernel, source, f"probe_{k}", n_in), [a, b][:n_in], size, size)[:size])
    rec.call("unknown_op", c_expression, "softmax", ["v0"], {"axis": -1})
    rec.call("matmul", c_expression, "matmul", ["v0", "v1"], {})


@probe("17.10", check=_codegen_check)
def loops(rng, rec):
    from tinytorch.perf.compiler import build_c_kernel, index_kinds, loop_source

    shapes = [((3, 5), [(3, 5), (5,), (1,), (3, 1)]), ((2, 3, 4), [(1, 1, 4), (3, 4), (2, 3, 4), ()]),
              ((2, 3, 4), [(3, 4), (4,)]), ((4,), [(4,), (1,)]), ((), [(), ()]), ((6, 1), [(6, 1), (1, 1)]),
              ((2, 5), [(2, 1), (1, 5)]), ((1, 5), [(5,), (1, 5)]), ((2, 2, 3), [(2, 1, 3), (1, 2, 3)])]
    for i, (out_shape, args) in enumerate(shapes):
        rec.call(f"kinds{i}", lambda o=out_shape, a=args: [list(r) if isinstance(r, (list, tuple)) else r
                                                           for r in index_kinds(o, a)])
    cases = {  # kinds, inner, steps (C written here, as data), inputs, output size
        "loop_full_scalar": (["full", "scalar"], 4, [("t0", "(v0 + v1)")], [np.arange(1, 9), [10.0]], 8),
        "loop_bias": (["full", "inner"], 5, [("t0", "(v0 * v1)"), ("t1", "expf(t0)"), ("t2", "(t1 - v0)")],
                      [f32(rng, 3, 5), f32(rng, 5)], 15),
        "loop_four": (["inner", "copy", "scalar", "full"], 6, [("t0", "(v0 + v1)"), ("t1", "(t0 * v2)"), ("t2", "(t1 - v3)")],
                      [f32(rng, 6), f32(rng, 4, 6), [2.5], f32(rng, 4, 6)], 24),
        "loop_one_block": (["full"], 24, [("t0", "(-v0)")], [f32(rng, 24)], 24),
        "loop_single": (["scalar"], 1, [("t0", "(v0 * 3.0f)")], [[1.5]], 1),
        "loop_names": (["full", "full"], 3, [("t0", "(v0 + v1)"), ("last", "sqrtf(fabsf(t0))")],
                       [f32(rng, 6), f32(rng, 6)], 6),
        "loop_three_inner": (["inner", "inner", "full"], 2, [("a", "(v0 * v1)"), ("b", "(a + v2)")],
                             [f32(rng, 2), f32(rng, 2), f32(rng, 5, 2)], 10),
    }
    sources = []  # one C file for all of them: one compiler run
    for key, (kinds, inner, steps, _, _) in cases.items():
        text = rec.call(key + "_text", loop_source, f"k_{key}", kinds, inner, steps, f"probe {key}")
        sources.append(text if isinstance(text, str) else "")
        rec[key + "_text"] = isinstance(text, str) or rec[key + "_text"]  # the text itself is not judged
    source = "\n".join(sources)
    for key, (kinds, inner, steps, arrays, n_out) in cases.items():
        rec.call(key, lambda kinds=kinds, inner=inner, arrays=arrays, n_out=n_out, key=key: _call(
            _c_function(build_c_kernel, source, f"k_{key}", len(kinds)), arrays, n_out, n_out // inner))


# ------------------------------------------------------------------ part 6: guards and backends


@probe("17.11")
def guards(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.compiler import EAGER_OPS, CompiledFunction, trace

    class Traced(CompiledFunction):
        "A plan is the trace itself (no pass, no kernel: only the guards are the student's code here)."

        def _plan(self, tensors, key):
            self.traces += 1
            graph = trace(self.fn, *tensors)
            if any(n.op not in EAGER_OPS for n in graph.nodes):
                return None
            graph = graph.copy()
            graph.outputs = graph.outputs + [c["value"] for c in graph.conversions]
            return graph

    def branchy(p):
        if p.sum() > 0:
            return p * 2.0
        return p - 1.0

    def two_guards(p):
        scale = float(p.max())
        return p * 2.0 if p.sum() > 0 else p / scale

    x = f32(rng, 3)
    fb = Traced(branchy)
    calls = [np.abs(x), np.abs(x) + 1.0, -np.abs(x), np.abs(x), f32(rng, 2, 3) ** 2, -np.abs(x) - 1.0]
    for i, a in enumerate(calls):
        rec.call(f"branchy{i}", fb, Tensor(a))
        rec[f"branchy{i}_counts"] = [fb.traces, fb.retraces_on_path, len(fb.plans)]
    f2 = Traced(two_guards)
    for i, a in enumerate([np.float32([1.0, 2.0]), np.float32([1.0, 2.0]), np.float32([1.0, 3.0]), np.float32([-4.0, 2.0])]):
        rec.call(f"two_guards{i}", f2, Tensor(a))
        rec[f"two_guards{i}_counts"] = [f2.traces, f2.retraces_on_path, len(f2.plans)]
    rec.call("tuple", Traced(lambda p: (p * 2.0, p.sum(), p)), Tensor(x))
    rec.call("float64", Traced(lambda p: p * 2.0 + 1.0), Tensor(rng.standard_normal(4), dtype=np.float64))
    fi = Traced(lambda p: p * 2)
    rec.call("int64", fi, Tensor(np.arange(4, dtype=np.int64)))
    rec.call("int64_then_float32", fi, Tensor(np.arange(4, dtype=np.float32)))
    rec["dtype_signatures"] = [fi.traces, len(fi.plans)]
    fallback = Traced(lambda p: p.var(axis=0))
    rec.call("fallback", fallback, Tensor(f32(rng, 3, 2)))
    rec.call("fallback_again", fallback, Tensor(f32(rng, 3, 2)))
    rec["fallback_traces"] = fallback.traces


@probe("17.12")
def dispatch(rng, rec):
    from tinytorch.perf.backends import NumpyBackend, SizeDispatch, measure_threshold

    log = []

    class Spy(NumpyBackend):
        def __init__(self, tag):
            self.tag = tag

        def matmul(self, a, b):
            log.append([self.tag, "matmul", list(np.shape(a)), list(np.shape(b))])
            return super().matmul(a, b)

        def binary(self, op, ufunc, a, b):
            log.append([self.tag, op, list(np.shape(a)), list(np.shape(b))])
            return super().binary(op, ufunc, a, b)

        def unary(self, op, ufunc, a):
            log.append([self.tag, op, list(np.shape(a))])
            return super().unary(op, ufunc, a)

    threshold = int(rng.integers(200, 700))
    d = SizeDispatch(Spy("small"), Spy("large"), threshold)
    products = [((8, 8), (8, 8)), ((9, 8), (8, 8)), ((4, 8, 8), (8, 8)), ((8,), (8, 64)), ((8, 65), (65,)),
                ((1, 1), (1, threshold)), ((1, 1), (1, threshold + 1)), ((2, 3, 7), (2, 7, 5))]
    for i, (sa, sb) in enumerate(products):
        rec.call(f"matmul{i}", d.matmul, f32(rng, *sa), f32(rng, *sb))
    rec.call("add_small", d.binary, "add", np.add, f32(rng, threshold), 2.0)
    rec.call("mul_large", d.binary, "mul", np.multiply, 3.0, f32(rng, threshold + 1))
    rec.call("sub_both", d.binary, "sub", np.subtract, f32(rng, threshold), f32(rng, 1, threshold))
    rec.call("exp", d.unary, "exp", np.exp, f32(rng, threshold + 5))
    rec.call("neg", d.unary, "neg", np.negative, f32(rng, threshold))
    rec["calls"] = [c[:2] for c in log]

    def table_time(times):
        def time(fn):
            before = len(log)
            fn()
            tag, _, shape = log[before][0], log[before][1], log[before][2]
            return times[tag][shape[0]]
        return time
    tables = {"tie_then_loss": ((16, 32, 64), {"small": {16: 1.0, 32: 2.0, 64: 9.0}, "large": {16: 2.0, 32: 2.0, 64: 3.0}}),
              "win_after_loss": ((8, 16, 32, 64), {"small": {8: 5.0, 16: 1.0, 32: 4.0, 64: 1.0},
                                                   "large": {8: 1.0, 16: 2.0, 32: 2.0, 64: 2.0}}),
              "never": ((8, 16), {"small": {8: 3.0, 16: 3.0}, "large": {8: 1.0, 16: 1.0}}),
              "always": ((4, 12, 20), {"small": {4: 1.0, 12: 1.0, 20: 1.0}, "large": {4: 1.0, 12: 2.0, 20: 3.0}})}
    for name, (sizes, times) in tables.items():
        log.clear()
        rec.call(f"threshold_{name}", measure_threshold, Spy("small"), Spy("large"), sizes, table_time(times))
        rec[f"timed_{name}"] = sorted([c[2][0], c[2][1], c[0]] for c in log)


# ------------------------------------------------------------------ part 8: in-place ops


@probe("17.13")
def relu_inplace(rng, rec):
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.kernels import relu_

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
