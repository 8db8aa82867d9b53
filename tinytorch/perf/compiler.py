from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tinytorch.core.tensor import Tensor, is_grad_enabled, observe_ops, set_grad_enabled

def _gelu(a):
    return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a * a * a)))


def _binary(fn):
    "A binary op's replay: the second operand is an input, or the constant `other` of the attrs."
    def run(a, b=None, other=None):
        return fn(a, other if b is None else b)
    return run


# How to run each op again from its record: op name -> fn(*input arrays, **attrs). The elementwise ones
# are the ones fusion may merge (ELEMENTWISE); the others run as NumPy calls between fused kernels.
EAGER_OPS = {
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul": _binary(np.multiply),
    "div": _binary(np.true_divide), "pow": _binary(np.power),
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "relu": lambda a: np.maximum(a, 0), "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "gelu": _gelu,
    "matmul": np.matmul,
    "permute": lambda a, dims: np.transpose(a, dims),
    "transpose": lambda a, dim0, dim1: np.swapaxes(a, dim0, dim1),
    "reshape": lambda a, shape: np.reshape(a, shape),
    "contiguous": np.ascontiguousarray,
    "astype": lambda a, dtype: a.astype(dtype),
    "sum": lambda a, axis, keepdims: np.sum(a, axis=axis, keepdims=keepdims),
    "mean": lambda a, axis, keepdims: np.mean(a, axis=axis, keepdims=keepdims),
    "max": lambda a, axis, keepdims: np.max(a, axis=axis, keepdims=keepdims),
    "constant": lambda value: np.asarray(value),
    "gt": _binary(np.greater), "ge": _binary(np.greater_equal), "lt": _binary(np.less),
    "le": _binary(np.less_equal), "eq": _binary(np.equal), "ne": _binary(np.not_equal),
}
ELEMENTWISE = {"add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "tanh", "abs", "relu", "sigmoid", "gelu"}


@dataclass
class GNode:
    """One SSA instruction: `name = op(args..., **attrs) : dtype[shape]`.

    `args` are value names (graph inputs `x0`, constants `c0`, node results `%3`); `attrs` the op's own
    arguments from its record. A fused node (op 'fused') holds the instructions it replaced in `body`.
    """
    name: str
    op: str
    args: tuple
    attrs: dict
    shape: tuple
    dtype: np.dtype
    body: list = field(default_factory=list)

    def __str__(self) -> str:
        parts = list(self.args) + [f"{k}={_short(v)}" for k, v in self.attrs.items() if k not in ("params", "kernel")]
        if "kernel" in self.attrs:
            parts.append(f"backend={self.attrs['kernel'].backend}")
        op = self.op if not self.body else "fused[" + ", ".join(n.op for n in self.body) + "]"
        return f"{self.name} = {op}({', '.join(parts)}) : {_type(self.shape, self.dtype)}"


def _short(v) -> str:
    if isinstance(v, np.ndarray) and v.size > 4:
        return f"<array {_type(v.shape, v.dtype)}>"
    return repr(v.tolist() if isinstance(v, np.ndarray) else v)


def _type(shape, dtype) -> str:
    return f"{np.dtype(dtype).name}[{', '.join(map(str, shape))}]"


@dataclass
class Graph:
    """A traced program in SSA form: inputs, constants, instructions in execution order, outputs.

    `inputs`: names of the graph inputs with their (shape, dtype) in `input_types`; `constants`: name ->
    array (parameters and constant tensors the program read); `nodes`: `GNode`s, each defined once,
    before its use; `outputs`: value names returned. `conversions` lists where tracing turned a traced
    value into a Python value (data-dependent control flow): the trace holds for that path only.
    """
    inputs: list
    input_types: list
    constants: dict
    nodes: list
    outputs: list
    conversions: list = field(default_factory=list)
    returns_tuple: bool = False

    def __str__(self) -> str:
        sig = ", ".join(f"{n}: {_type(*t)}" for n, t in zip(self.inputs, self.input_types))
        lines = [f"graph({sig}):"]
        lines += [f"    {c} = constant {_type(v.shape, v.dtype)}" for c, v in self.constants.items()]
        lines += [f"    {n}" for n in self.nodes]
        lines.append(f"    return {', '.join(self.outputs)}")
        return "\n".join(lines)

    __repr__ = __str__

    def copy(self, nodes=None, constants=None) -> "Graph":
        return Graph(list(self.inputs), list(self.input_types), dict(self.constants if constants is None else constants),
                     list(self.nodes if nodes is None else nodes), list(self.outputs), list(self.conversions),
                     self.returns_tuple)

    def op_counts(self) -> dict:
        counts = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

class DataDependentControlFlow(RuntimeError):
    "A traced function turned a traced value into a Python value, so its trace holds for one path only."


class _Conversions:
    """While tracing, note every traced Tensor turned into a Python value (`bool`, `float`, `int`, `item`).

    The Tensor class is not changed for good: the four methods are wrapped for the duration of one
    `trace` and restored after it (even on error).
    """
    METHODS = ("__bool__", "__float__", "__int__", "item")

    def __init__(self, watched: dict):
        self.watched, self.seen, self.saved = watched, [], {}

    def __enter__(self):
        for m in self.METHODS:
            original = getattr(Tensor, m, None)
            if original is None:
                continue
            self.saved[m] = original
            setattr(Tensor, m, self._wrap(m, original))
        return self

    def _wrap(self, method, original):
        def wrapped(t, *a, **k):
            value = original(t, *a, **k)
            name = self.watched.get(id(t))
            if name is not None:
                frame = traceback.extract_stack(limit=3)[0]
                self.seen.append({"value": name, "method": method, "result": value,
                                  "where": f"{Path(frame.filename).name}:{frame.lineno}"})
            return value
        return wrapped

    def __exit__(self, *exc):
        for m, original in self.saved.items():
            setattr(Tensor, m, original)
        return False


def trace(fn, *example_inputs) -> Graph:
    """Run `fn(*example_inputs)` once, recording every op through the op observers, into a `Graph`.

    Inputs are Tensors (arrays are wrapped); `fn` returns a Tensor or a tuple of them. Tensors that `fn`
    reads without computing them (parameters, constants) become graph constants. Ops run under
    no-grad: a graph is for inference. Turning a traced value into a Python value (`if t > 0:`,
    `float(t)`) is recorded in `graph.conversions` (the trace then holds for that path only).
    """
    tensors = [x if isinstance(x, Tensor) else Tensor(x) for x in example_inputs]
    names = {id(t): f"x{i}" for i, t in enumerate(tensors)}
    keep = list(tensors)  # keep every recorded tensor alive so that ids stay unique during the trace
    graph = Graph([f"x{i}" for i in range(len(tensors))], [(t.shape, t.dtype) for t in tensors], {}, [], [])

    def value_of(t: Tensor) -> str:
        name = names.get(id(t))
        if name is None:  # read, not computed: a parameter or a constant of the program
            name = names[id(t)] = f"c{len(graph.constants)}"
            graph.constants[name] = t.data
            keep.append(t)
        return name

    def record(node, out):
        args = tuple(value_of(t) for t in node.inputs if t is not None)
        name = names[id(out)] = f"%{len(graph.nodes)}"
        keep.append(out)
        graph.nodes.append(GNode(name, node.op, args, dict(node.attrs), tuple(node.shape), np.dtype(node.dtype)))

    previous = set_grad_enabled(False)
    try:
        with observe_ops(record), _Conversions(names) as conv:
            result = fn(*tensors)
    finally:
        set_grad_enabled(previous)
    outs = result if isinstance(result, (tuple, list)) else (result,)
    for o in outs:
        if not isinstance(o, Tensor):
            raise TypeError(f"trace: fn must return a Tensor or a tuple of Tensors; got {type(o).__name__}")
    graph.outputs = [value_of(o) for o in outs]
    graph.conversions = conv.seen
    graph.returns_tuple = isinstance(result, (tuple, list))
    return graph


def run_graph(graph: Graph, *inputs) -> list:
    "Interpret `graph` on new input arrays with NumPy, instruction by instruction; returns the output arrays."
    env = dict(graph.constants)
    env.update(zip(graph.inputs, (x.data if isinstance(x, Tensor) else np.asarray(x) for x in inputs)))
    for n in graph.nodes:
        env[n.name] = run_node(n, [env[a] for a in n.args])
    return [env[o] for o in graph.outputs]


def run_node(n: GNode, args: list):
    "One instruction on NumPy arrays: a fused node through its kernel, any other op through `EAGER_OPS`."
    if n.op == "fused":
        return n.attrs["kernel"](*args) if "kernel" in n.attrs else _run_body(n, args)
    if n.op not in EAGER_OPS:
        raise NotImplementedError(f"run_graph: no NumPy replay for op {n.op!r}")
    return EAGER_OPS[n.op](*args, **n.attrs)


def _run_body(n: GNode, args: list):
    "A fused node's instructions one by one (its meaning; kernels must agree with it)."
    env = dict(zip(n.attrs["params"], args))
    for b in n.body:
        env[b.name] = EAGER_OPS[b.op](*[env[a] for a in b.args], **b.attrs)
    return env[n.body[-1].name]

def dead_code_elimination(graph: Graph) -> Graph:
    """A copy of `graph` without the instructions (and constants) that no output depends on.

    TODO (Exercise 17.1): keep exactly the nodes whose result reaches an output.

    CONTRACT: returns a new Graph (the input is not changed); kept nodes stay in their order;
    constants that no kept node or output uses are dropped too; inputs are never dropped.
    EXAMPLE: in `a = x0 * 2; b = x0 + 1; return a`, the node of `b` goes.
    HINTS: walk `graph.nodes` backwards (`reversed`) with a `set` of the names still needed.
    """
    live = set(graph.outputs)
    kept = []
    for n in reversed(graph.nodes):
        if n.name in live:
            kept.append(n)
            live.update(n.args)
    kept.reverse()
    constants = {c: v for c, v in graph.constants.items() if c in live}
    return graph.copy(nodes=kept, constants=constants)

FOLD_LIMIT = 1 << 20  # largest folded result, in elements: folding must not blow up the graph's memory


def constant_fold(graph: Graph) -> Graph:
    """A copy of `graph` where every node whose arguments are all constants is computed now.

    TODO (Exercise 17.2): evaluate such a node once with `run_node` and make its result a constant.

    CONTRACT: a folded node's result becomes a new constant named like the node (`%3` -> `c%3`)
    and every later use of the node reads that constant; nodes with no arguments (op 'constant')
    fold too; a node whose result would have more than `FOLD_LIMIT` elements is kept; outputs
    that were folded are renamed too. Constants no longer used stay (DCE removes them).
    EXAMPLE: `%0 = mul(c0, other=2.0); %1 = add(x0, %0)` becomes `%1 = add(x0, c%0)` with
    `c%0 = 2 * c0`.
    HINTS: a `dict` from old names to new names; `math.prod` of a node's shape; `run_node`.
    """
    constants, rename, kept = dict(graph.constants), {}, []
    for n in graph.nodes:
        args = tuple(rename.get(a, a) for a in n.args)
        if n.op in EAGER_OPS and all(a in constants for a in args) and math.prod(n.shape) <= FOLD_LIMIT:
            value = np.asarray(run_node(n, [constants[a] for a in args]))
            rename[n.name] = "c" + n.name
            constants["c" + n.name] = value
        else:
            kept.append(GNode(n.name, n.op, args, n.attrs, n.shape, n.dtype, n.body))
    out = graph.copy(nodes=kept, constants=constants)
    out.outputs = [rename.get(o, o) for o in graph.outputs]
    return out

def _attr_key(v):
    "A hashable stand-in for an attribute value (arrays by content)."
    if isinstance(v, np.ndarray):
        return ("array", v.shape, v.dtype.str, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    return v if isinstance(v, (int, float, str, bool, type(None), np.dtype)) else ("id", id(v))


def common_subexpression_elimination(graph: Graph) -> Graph:
    """A copy of `graph` where an instruction computed twice (same op, same arguments, same attrs) is kept once.

    TODO (Exercise 17.3): give each node a key; a node whose key was seen before is replaced by the
    earlier node everywhere after it.

    CONTRACT: the key is (op, argument names after renaming, attrs made hashable with `_attr_key`);
    outputs that pointed to a removed node point to the kept one; order of kept nodes unchanged.
    EXAMPLE: `%0 = exp(x0); %1 = exp(x0); %2 = add(%0, %1)` becomes `%0 = exp(x0); %2 = add(%0, %0)`.
    HINTS: a `dict` from key to name and one from old to new name; `_attr_key` of `n.attrs`.
    """
    seen, rename, kept = {}, {}, []
    for n in graph.nodes:
        args = tuple(rename.get(a, a) for a in n.args)
        key = (n.op, args, _attr_key(n.attrs))
        if key in seen:
            rename[n.name] = seen[key]
            continue
        seen[key] = n.name
        kept.append(GNode(n.name, n.op, args, n.attrs, n.shape, n.dtype, n.body))
    out = graph.copy(nodes=kept)
    out.outputs = [rename.get(o, o) for o in graph.outputs]
    return out

def fusion_groups(graph: Graph) -> list:
    """The groups of elementwise nodes that fusion merges, as lists of node names in program order.

    TODO (Exercise 17.4): a node joins the group of an argument when both are elementwise (`ELEMENTWISE`),
    the argument's result is used by this node only and is not a graph output; groups of one
    node are not returned.

    CONTRACT: each group is a tree of elementwise nodes whose last node (its root) is the only one
    used outside the group; every node is in at most one group; groups listed in the order of their
    last node; a node whose argument groups are two different groups merges them all (a tree).
    EXAMPLE: `%0 = mul(x0, x1); %1 = add(%0, other=1.0); %2 = exp(%1); %3 = sum(%2)` has one group
    `['%0', '%1', '%2']` (sum is not elementwise).
    HINTS: count uses first (a `dict`, or `collections.Counter`); a `dict` from node name to its group (a list).
    """
    uses = {}
    for n in graph.nodes:
        for a in set(n.args):
            uses[a] = uses.get(a, 0) + 1
    outputs = set(graph.outputs)
    by_name = {n.name: n for n in graph.nodes}
    group_of = {}
    for n in graph.nodes:
        if n.op not in ELEMENTWISE:
            continue
        group = [n.name]
        for a in dict.fromkeys(n.args):
            producer = by_name.get(a)
            if producer is not None and producer.op in ELEMENTWISE and uses[a] == 1 and a not in outputs:
                group = group_of[a] + group
        for name in group:
            group_of[name] = group
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    roots = {id(g): g for g in group_of.values()}
    groups = [sorted(g, key=order.get) for g in roots.values() if len(g) > 1]
    return sorted(groups, key=lambda g: order[g[-1]])

def fuse_elementwise(graph: Graph, groups=None) -> Graph:
    """A copy of `graph` where each group of `fusion_groups` becomes one 'fused' node.

    The fused node takes the group's outside arguments (`attrs['params']` names them inside the body),
    keeps the instructions in `body`, and has the root's name, shape and dtype, so nothing after it
    changes. How it runs is decided later (`attach_kernels`): a generated C kernel or chunked NumPy.
    """
    groups = fusion_groups(graph) if groups is None else groups
    by_name = {n.name: n for n in graph.nodes}
    member = {name: i for i, g in enumerate(groups) for name in g}
    nodes, done = [], set()
    for n in graph.nodes:
        i = member.get(n.name)
        if i is None:
            nodes.append(n)
            continue
        if n.name != groups[i][-1]:
            continue  # emitted with its root, which comes last
        inside = set(groups[i])
        body = [by_name[m] for m in groups[i]]
        params = list(dict.fromkeys(a for b in body for a in b.args if a not in inside))
        local = {p: f"p{k}" for k, p in enumerate(params)}
        body = [GNode(b.name, b.op, tuple(local.get(a, a) for a in b.args), b.attrs, b.shape, b.dtype) for b in body]
        nodes.append(GNode(n.name, "fused", tuple(params), {"params": [local[p] for p in params]},
                           n.shape, n.dtype, body))
        done.add(i)
    return graph.copy(nodes=nodes)

def c_literal(value) -> str:
    "A Python number as a C float literal, exactly as NumPy rounds it to float32 (hexadecimal, so no digit is lost)."
    v = float(np.float32(value))
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{v.hex()}f"


def c_expression(op: str, operands: list, attrs: dict) -> str:
    """The C expression (float32) of one elementwise instruction, from its operands' C expressions.

    TODO (Exercise 17.5): one case per op of `ELEMENTWISE`, in C with `<math.h>`'s float functions.

    CONTRACT:
    - `operands`: C expressions (strings) of the tensor arguments, in order; a constant second
      operand is `attrs['other']` (a Python number: write it with `c_literal`).
    - Every result is parenthesised, so it can be nested in any other expression.
    - add/sub/mul/div are `+ - * /`; pow is `powf`, but an integer power of 2 or 3 is written as
      products (`(a * a)`: faster and exact); neg, exp, log, sqrt, tanh, abs map to `-`,
      `expf`, `logf`, `sqrtf`, `tanhf`, `fabsf`; relu is `fmaxf(a, 0.0f)`; sigmoid is
      `1 / (1 + e^-a)`; gelu is the tanh form of module 02 with float constants.
    - Any other op raises `NotImplementedError("c_expression: no C code for op 'softmax'")`.
    EXAMPLE: `c_expression("mul", ["v0"], {"other": 0.5})` -> `"(v0 * 0x1.0000000000000p-1f)"`.
    HINTS: a `dict` of format strings for the simple ops; `c_literal`; `math.sqrt`, `math.pi`.
    """
    a = operands[0]
    if op in ("add", "sub", "mul", "div", "pow"):
        b = operands[1] if len(operands) > 1 else c_literal(attrs["other"])
        if op == "pow":
            other = attrs.get("other")
            if len(operands) == 1 and other in (2, 3):
                return "(" + " * ".join([a] * int(other)) + ")"
            return f"powf({a}, {b})"
        return f"({a} {dict(add='+', sub='-', mul='*', div='/')[op]} {b})"
    unary = {"neg": "(-{a})", "exp": "expf({a})", "log": "logf({a})", "sqrt": "sqrtf({a})", "tanh": "tanhf({a})",
             "abs": "fabsf({a})", "relu": "fmaxf({a}, 0.0f)", "sigmoid": "(1.0f / (1.0f + expf(-{a})))"}
    if op in unary:
        return unary[op].format(a=a)
    if op == "gelu":
        c = c_literal(math.sqrt(2 / math.pi))
        return f"(0.5f * {a} * (1.0f + tanhf({c} * ({a} + {c_literal(0.044715)} * {a} * {a} * {a}))))"
    raise NotImplementedError(f"c_expression: no C code for op {op!r}")

class KernelCompileError(RuntimeError):
    "The system C compiler rejected a generated kernel; the message shows the source and the compiler's output."


def c_compiler():
    "Path of the system C compiler (`cc`, `gcc` or `clang`, first found on PATH), or None."
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _cpu_flags() -> list:
    "Vector-unit flags for x86 CPUs that have AVX2 and FMA (read from /proc/cpuinfo), else none (the compiler's default)."
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return ["-mavx2", "-mfma"] if "avx2" in flags and "fma" in flags else []


# -ffast-math lets the compiler call glibc's vector exp/tanh (libmvec) and reassociate sums; it also lets it assume
# that no value is NaN or infinite: fused kernels are for finite data (results agree with NumPy within float32 tolerance).
C_FLAGS = ["-O3", *_cpu_flags(), "-ffast-math", "-shared", "-fPIC"]


def kernel_cache_dir() -> Path:
    """Where compiled kernels are kept between runs: `$TINYTORCH_KERNEL_CACHE`, else ~/.cache/tinytorch/kernels.

    When that directory cannot be created or written, a warning says so and a temporary directory
    (kept for this process) is used instead.
    """
    path = Path(os.environ.get("TINYTORCH_KERNEL_CACHE") or Path.home() / ".cache" / "tinytorch" / "kernels")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        return path
    except OSError as err:
        global _TMP_CACHE
        if _TMP_CACHE is None:
            _TMP_CACHE = Path(tempfile.mkdtemp(prefix="tinytorch-kernels-"))
        warnings.warn(f"compile: the kernel cache {path} is not writable ({err.strerror or err}); kernels go to "
                      f"{_TMP_CACHE} for this process (set TINYTORCH_KERNEL_CACHE to a writable directory)",
                      RuntimeWarning, stacklevel=2)
        return _TMP_CACHE


_TMP_CACHE = None
_LOADED = {}  # source hash -> ctypes library (a library is loaded once per process)


def build_c_kernel(source: str, name: str):
    """Compile C `source` into a shared library (cached on disk by the hash of source, compiler and flags),
    load it with ctypes and return its function `name`. Raises `KernelCompileError` with the numbered
    source and the compiler's message when compilation fails, RuntimeError when no C compiler exists."""
    cc = c_compiler()
    if cc is None:
        raise RuntimeError("compile: no C compiler (cc, gcc or clang) on PATH")
    digest = hashlib.sha256("\n".join([source, cc, *C_FLAGS]).encode()).hexdigest()[:20]
    lib = _LOADED.get(digest)
    if lib is None:
        cache = kernel_cache_dir()
        so = cache / f"k_{digest}.so"
        if not so.exists():
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src = Path(tmp) / "kernel.c"
                src.write_text(source)
                built = Path(tmp) / "kernel.so"
                proc = subprocess.run([cc, *C_FLAGS, "-o", str(built), str(src), "-lm"], capture_output=True, text=True)
                if proc.returncode != 0:
                    numbered = "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(source.splitlines()))
                    raise KernelCompileError(f"compile: the C compiler {cc} rejected the generated kernel {name}:\n"
                                             f"{numbered}\n--- {Path(cc).name} says:\n{proc.stderr.strip()}")
                os.replace(built, so)  # atomic: another process never sees half a library
        lib = _LOADED[digest] = ctypes.CDLL(str(so))
    return getattr(lib, name)


def _index_kinds(out_shape, arg_shapes):
    """How a kernel reads each argument: 'full' (x[i]), 'scalar' (x[0]) or 'inner' (x[j]: the argument
    repeats along the leading axes); anything else is 'copy' (broadcast into a full array first)."""
    size = math.prod(out_shape)
    kinds, inner = [], None
    for s in arg_shapes:
        trimmed = tuple(s)
        while trimmed and trimmed[0] == 1:
            trimmed = trimmed[1:]
        if tuple(s) == tuple(out_shape):
            kinds.append("full")
        elif math.prod(s) == 1:
            kinds.append("scalar")
        elif trimmed and tuple(out_shape[len(out_shape) - len(trimmed):]) == trimmed and inner in (None, math.prod(trimmed)):
            inner = math.prod(trimmed)
            kinds.append("inner")
        else:
            kinds.append("copy")
    return kinds, (inner or size or 1)


def kernel_source(node: GNode, arg_shapes: list, name: str = "kernel") -> str:
    "The C source of a fused node for arguments of these shapes (float32, contiguous output)."
    kinds, inner = _index_kinds(node.shape, arg_shapes)
    params = node.attrs["params"]
    load = {"full": "{p}[i]", "copy": "{p}[i]", "scalar": "{p}[0]", "inner": "{p}[j]"}
    lines = ["#include <math.h>", "#include <stdint.h>", "",
             f"/* {' -> '.join(b.op for b in node.body)}: {_type(node.shape, node.dtype)} */",
             f"void {name}(" + ", ".join(f"const float *restrict {p}" for p in params)
             + ", float *restrict out, int64_t n_outer) {",
             "    for (int64_t o = 0; o < n_outer; o++) {",
             f"        for (int64_t j = 0; j < {inner}; j++) {{",
             f"            const int64_t i = o * {inner} + j;"]
    expr = {p: f"v{k}" for k, p in enumerate(params)}
    for k, (p, kind) in enumerate(zip(params, kinds)):
        lines.append(f"            const float v{k} = {load[kind].format(p=p)};")
    for t, b in enumerate(node.body):
        lines.append(f"            const float t{t} = {c_expression(b.op, [expr[a] for a in b.args], b.attrs)};")
        expr[b.name] = f"t{t}"
    lines += [f"            out[i] = t{len(node.body) - 1};", "        }", "    }", "}", ""]
    return "\n".join(lines)

def chunk_elements() -> int:
    "Elements per block of the chunked NumPy evaluation: a block and its temporaries fit in the L2 cache."
    from tinytorch.perf.acceleration import cache_sizes
    return max(1024, cache_sizes().get("L2", 256 * 1024) // 4 // 8)


class FusedKernel:
    """A fused node made runnable for fixed argument shapes: a generated C kernel (`backend == 'c'`) or,
    without a C compiler or for a non-float32 node, a chunked NumPy evaluation (`backend == 'numpy'`).
    Calling it with the argument arrays returns the result array."""

    def __init__(self, node: GNode, arg_shapes: list, backend: str = "auto"):
        self.node, self.arg_shapes = node, [tuple(s) for s in arg_shapes]
        self.kinds, self.inner = _index_kinds(node.shape, self.arg_shapes)
        self.source, self.reason = None, ""
        floats = node.dtype == np.float32
        if backend in ("auto", "c") and floats and c_compiler() is not None:
            self.name = "fused_" + hashlib.sha256(kernel_source(node, arg_shapes).encode()).hexdigest()[:12]
            self.source = kernel_source(node, arg_shapes, self.name)
            fn = build_c_kernel(self.source, self.name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * (len(arg_shapes) + 1) + [ctypes.c_int64]
            self.fn, self.backend = fn, "c"
        elif backend == "c":
            raise RuntimeError(f"compile: backend 'c' needs a C compiler and float32 data; "
                               f"{'no C compiler on PATH' if floats else f'the node is {node.dtype}'}")
        else:
            self.backend = "numpy"
            self.reason = "no C compiler on PATH" if floats and c_compiler() is None else (
                "backend='numpy' asked" if backend == "numpy" else f"dtype {node.dtype} (C kernels are float32)")
            self.block = chunk_elements()

    def __call__(self, *args):
        out = np.empty(self.node.shape, self.node.dtype)
        if self.backend == "c":
            ptrs = []
            keep = []
            for a, kind in zip(args, self.kinds):
                a = np.asarray(a, np.float32)
                a = np.ascontiguousarray(np.broadcast_to(a, self.node.shape) if kind == "copy" else a)
                keep.append(a)
                ptrs.append(a.ctypes.data)
            size = out.size
            self.fn(*ptrs, out.ctypes.data, size // self.inner if self.inner else 0)
            return out
        if out.ndim == 0:
            out[...] = _run_body(self.node, list(args))
            return out
        row = math.prod(out.shape[1:]) or 1
        step = max(1, self.block // row)
        views = [np.broadcast_to(a, out.shape) for a in args]
        for r in range(0, out.shape[0], step):
            out[r:r + step] = _run_body(self.node, [v[r:r + step] for v in views])
        return out

PASSES = (dead_code_elimination, constant_fold, common_subexpression_elimination, dead_code_elimination)


def optimize(graph: Graph, fuse: bool = True) -> Graph:
    "The passes in order (DCE, constant folding, CSE, DCE), then elementwise fusion when `fuse`."
    for p in PASSES:
        graph = p(graph)
    return fuse_elementwise(graph) if fuse else graph


def attach_kernels(graph: Graph, backend: str = "auto") -> Graph:
    "Give every fused node of `graph` a `FusedKernel` for its argument shapes (`attrs['kernel']`)."
    shapes = {name: t[0] for name, t in zip(graph.inputs, graph.input_types)}
    shapes.update({c: np.shape(v) for c, v in graph.constants.items()})
    nodes = []
    for n in graph.nodes:
        shapes[n.name] = n.shape
        if n.op == "fused":
            kernel = FusedKernel(n, [shapes[a] for a in n.args], backend)
            n = GNode(n.name, n.op, n.args, {**n.attrs, "kernel": kernel}, n.shape, n.dtype, n.body)
        nodes.append(n)
    return graph.copy(nodes=nodes)


class CompiledFunction:
    """`fn` compiled for inference: traced once per input signature, optimized, fused, run as kernels.

    - Guards: the shapes and dtypes of the inputs. A call with a new signature traces `fn` again
      (`traces` counts them); a known one reuses its compiled graph.
    - Data-dependent control flow: when tracing turned a traced value into a Python value, the
      graph keeps that value and its recorded result as a guard; a call whose value differs runs
      `fn` eagerly and re-traces for the new path (`retraces_on_path`), or raises
      `DataDependentControlFlow` when `on_branch='error'`.
    - An op with no NumPy replay (listed in `fallbacks`) makes that signature run eagerly, with a
      warning naming the op.
    - Inference only: results carry no graph; an input that requires grad while grad mode is on is
      an error.
    """

    def __init__(self, fn, backend: str = "auto", on_branch: str = "retrace"):
        if backend not in ("auto", "c", "numpy"):
            raise ValueError(f"compile: backend must be 'auto', 'c' or 'numpy'; got {backend!r}")
        if on_branch not in ("retrace", "error"):
            raise ValueError(f"compile: on_branch must be 'retrace' or 'error'; got {on_branch!r}")
        self.fn, self.backend, self.on_branch = fn, backend, on_branch
        self.plans, self.traces, self.fallbacks, self.retraces_on_path = {}, 0, {}, 0

    def _plan(self, tensors, key):
        graph = trace(self.fn, *tensors)
        self.traces += 1
        if graph.conversions and self.on_branch == "error":
            c = graph.conversions[0]
            raise DataDependentControlFlow(
                f"compile: {getattr(self.fn, '__name__', 'fn')} turned traced value {c['value']} into a Python value "
                f"({c['method']} -> {c['result']!r} at {c['where']}) while tracing: the graph holds only for the path "
                f"taken with these inputs. Compute with tensor ops (e.g. `where`) instead of branching, or use "
                f"on_branch='retrace'")
        missing = sorted({n.op for n in graph.nodes if n.op not in EAGER_OPS})
        if missing:
            self.fallbacks[key] = missing
            warnings.warn(f"compile: op {missing[0]!r} has no compiled form" +
                          (f" (nor {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else "") +
                          f"; {getattr(self.fn, '__name__', 'fn')} runs eagerly for inputs {key}", RuntimeWarning,
                          stacklevel=3)
            return None
        if graph.conversions:  # keep the converted values alive through the passes: they are guards
            graph = graph.copy()
            graph.outputs = graph.outputs + [c["value"] for c in graph.conversions]
        return attach_kernels(optimize(graph), self.backend)

    def __call__(self, *args):
        tensors = [x if isinstance(x, Tensor) else Tensor(x) for x in args]
        if is_grad_enabled():
            for i, t in enumerate(tensors):
                if t.requires_grad:
                    raise RuntimeError(f"compile: compiled functions are for inference only: input {i} requires "
                                       f"grad; call under no_grad() or pass .detach()")
        key = tuple((t.shape, t.dtype.str) for t in tensors)
        if key not in self.plans:
            self.plans[key] = self._plan(tensors, key)
        plan = self.plans[key]
        if plan is None:
            return self.fn(*tensors)
        outs = run_graph(plan, *tensors)
        n_conv = len(plan.conversions)
        if n_conv:
            for c, value in zip(plan.conversions, outs[len(outs) - n_conv:]):
                if getattr(Tensor(value), c["method"])() != c["result"]:
                    self.retraces_on_path += 1
                    self.plans[key] = self._plan(tensors, key)
                    return self(*args)
            outs = outs[:len(outs) - n_conv]
        results = tuple(Tensor(o) for o in outs)
        return results if plan.returns_tuple else results[0]

    def graph(self, *args) -> Graph:
        "The compiled graph for inputs like `args` (compiling it if needed)."
        tensors = [x if isinstance(x, Tensor) else Tensor(x) for x in args]
        key = tuple((t.shape, t.dtype.str) for t in tensors)
        if key not in self.plans:
            self.plans[key] = self._plan(tensors, key)
        return self.plans[key]

    def explain(self) -> str:
        "One line per compiled signature: traces, fused nodes and the backend each one runs on."
        lines = [f"{getattr(self.fn, '__name__', 'fn')}: {self.traces} trace(s)"]
        for key, plan in self.plans.items():
            if plan is None:
                lines.append(f"  {key}: eager (no compiled form for {', '.join(self.fallbacks[key])})")
                continue
            for n in plan.nodes:
                if n.op == "fused":
                    k = n.attrs["kernel"]
                    how = "C kernel " + k.name if k.backend == "c" else f"chunked NumPy ({k.reason})"
                    lines.append(f"  {key}: {n.name} fuses {len(n.body)} ops -> {how}")
            lines.append(f"  {key}: {len(plan.nodes)} instructions, "
                         f"{sum(n.op == 'fused' for n in plan.nodes)} fused")
        return "\n".join(lines)


def compile(fn=None, *, backend: str = "auto", on_branch: str = "retrace"):
    """Compile `fn` for inference like `torch.compile`: `compile(fn)` or `@compile` or `@compile(backend='numpy')`.

    `backend`: 'auto' (C kernels where a C compiler exists, chunked NumPy elsewhere), 'c' or 'numpy'.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, backend, on_branch)
    return CompiledFunction(fn, backend, on_branch)
