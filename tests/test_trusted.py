"""The trusted checks (tito.probes, tito.trusted) without a notebook run: probes over exported code.

- every graded exercise of every module has a probe (a new module's graded cell without one fails here);
- per module, the instructor's solution passes every check and the release's stubs fail every check;
- differently written correct solutions keep full marks (another traversal order, attention written
  another way, sigmoid and softmax by other formulas);
- one bug is charged once: a `merge_pair` or im2col bug fails its own exercise only;
- the mutation proof: the trusted verdicts catch at least 90% of the catalogue of realistic one-line bugs
  (tests/support/mutation.py's for 06-09, the bugs issue 14 found ungraded in 06-13, and LATER's for 12 and 14-20).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.support.mutation import MUTATIONS, Mutation, apply_mutation
from tito import notebooks as nbs
from tito import probes as P
from tito.course import Settings, load_modules
from tito.grading import package_files
from tito.trusted import BOOT, Checked, Plan, code_tree, exported_sources, pyc_beside

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
MODULES = {m.number: m for m in load_modules(ROOT)}
pytestmark = pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor notebooks (the reference)")

_PLANS: dict[str, Plan] = {}


def plan(number: str) -> Plan:
    if number not in _PLANS:
        _PLANS[number] = Plan.make(ROOT, MODULES[number], seed=20240601)
    return _PLANS[number]


def graded_exercises(module) -> list[str]:
    return [P.exercise_of(nbs.exercise_label(c)) for c in nbs.read(module.notebook).cells if nbs.is_test_cell(c)]


class Exported(str):
    """A module's exported code: the text of its `#| default_exp` file, and in `files` every file it writes by
    package path (a module with `#| export_to` cells writes several: tito.trusted.exported_sources)."""
    files: dict = {}


def run_local(number: str, text: str, exercises=None) -> Checked:
    """The trusted checks of `text` as module `number`'s exported code, the probe process started as grading starts
    it (isolated mode, from the code tree with the stripped probe file, the job as data) but without a sandbox:
    this checks the probes and the replay, not the isolation."""
    p = plan(number)
    files, code = _prerequisites(number)
    mine = getattr(text, "files", None) or {p.package_rel: text}
    job = {**p.base(), "mode": "replay", "files": {**files, **{rel: P.b64(body.encode()) for rel, body in mine.items()}}}
    with tempfile.TemporaryDirectory(prefix="tito-trusted-test-") as tmp:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME")}
        env.update(OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")

        def spawn():
            work = tempfile.mkdtemp(dir=tmp)
            return subprocess.Popen([sys.executable, "-I", "-c", BOOT, str(code), "tito.probe_run"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env=env, cwd=work, start_new_session=True)
        return p.run(job, spawn, kill_group, exercises)


def _prerequisites(number: str) -> tuple[dict, Path]:
    """Module `number`'s prerequisite package (as `package_files` sends it) and its sandbox code tree, built once per
    module for this test process, as grading builds them once per run: rebuilding both for each of the catalogue's
    220 mutations (parsing and compiling the package and the probe files) cost the suite about a CPU-second each."""
    if number not in _PREREQUISITES:
        _PREREQUISITES[number] = (package_files(ROOT, MODULES[number]), _code_tree(number))
    return _PREREQUISITES[number]


def _code_tree(number: str) -> Path:
    "Module `number`'s sandbox code tree (`code_tree`), built once per test process."
    if number not in _CODE_TREES:
        _CODE_TREES[number] = code_tree(Path(tempfile.mkdtemp(prefix="tito-trusted-code-", dir=_SCRATCH.name)) / "code",
                                        number)
    return _CODE_TREES[number]


_PREREQUISITES: dict = {}
_CODE_TREES: dict = {}
_SCRATCH = tempfile.TemporaryDirectory(prefix="tito-trusted-tests-")  # removed when this test process ends


def verdicts(number: str, text: str, exercises=None) -> dict[str, str]:
    """The trusted verdicts on `text` as module `number`'s exported code (all exercises, or `exercises`)."""
    return run_local(number, text, exercises).verdicts


def kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def exported(nb) -> str:
    key = nbformat_key(nb)
    if key not in _EXPORTED:
        _EXPORTED[key] = _exported(nb)
    return _EXPORTED[key]


_EXPORTED: dict = {}


def nbformat_key(nb) -> str:
    import json

    return json.dumps([c.source for c in nb.cells])


def _exported(nb) -> str:
    text, skipped = P.exported_source(nb)
    assert not skipped, skipped
    module = next((m for m in MODULES.values() if m.package_modules and any(
        "#| default_exp " + m.package_module.removeprefix("tinytorch.") == c.source.strip() for c in nb.cells)), None)
    if module is None or len(module.package_modules) == 1:
        return text
    files, skipped = exported_sources(nb, module)
    assert not skipped, skipped
    out = Exported(files[module.package_file(ROOT).relative_to(ROOT).as_posix()])
    out.files = files
    return out


def with_solution(number: str, marker: str, code: str) -> str:
    """Module `number`'s solution with the solution region of the cell containing `marker` replaced by `code`."""
    nb = nbs.read(MODULES[number].notebook)
    cell = next(c for c in nb.cells if nbs.is_solution_cell(c) and marker in c.source)
    lines = cell.source.splitlines()
    i = next(k for k, ln in enumerate(lines) if nbs.BEGIN_SOLUTION in ln and k > next(
        j for j, l2 in enumerate(lines) if marker in l2))
    j = next(k for k in range(i, len(lines)) if nbs.END_SOLUTION in lines[k])
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    cell.source = "\n".join(lines[: i + 1] + [indent + ln if ln else ln for ln in code.strip("\n").splitlines()]
                            + lines[j:])
    return exported(nb)


# ------------------------------------------------------------------ coverage


def test_every_graded_exercise_has_a_probe():
    missing, unknown = [], []
    for number, module in MODULES.items():
        graded = graded_exercises(module)
        probes = P.module_probes(number)
        missing += [f"{module.slug}: Exercise {e}" for e in graded if e not in probes]
        unknown += [f"{module.slug}: probe {e}" for e in probes if e not in graded]
    assert not missing, ("graded exercises without a trusted probe (add them to tito/probes/mNN.py; see "
                         "modules/README.md, 'Trusted checks'): " + ", ".join(missing))
    assert not unknown, "probes of exercises that are not graded cells: " + ", ".join(unknown)


def test_replayed_names_exist_and_belong_to_an_earlier_exercise():
    import ast

    for number, module in MODULES.items():
        p = P.module_probes(number)
        if not p:
            continue
        tree = ast.parse(exported(nbs.read(module.notebook)))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {f"{c.name}.{n.name}" for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        labels = {P.exercise_of(nbs.exercise_label(c)): nbs.exercise_label(c) for c in nbs.read(module.notebook).cells
                  if nbs.is_test_cell(c)}
        owners = P.replayed_exercises(number, labels)
        for probe in p.values():
            for name in probe.replay:
                assert name in defined, f"{module.slug}: Exercise {probe.exercise} replays {name}, which is not defined"
                assert owners[name], f"{module.slug}: no exercise's label names {name} (replayed by {probe.exercise})"
                assert P.exercise_key(owners[name]) < P.exercise_key(probe.exercise) or \
                    owners[name] != probe.exercise, (probe.exercise, name, owners[name])


def test_no_probe_substitutes_source_and_sandbox_copies_hold_no_checks():
    """Issue 28: `uses=` (the reference's source put into the student's module) is gone; the copy of a probe file the
    sandbox gets has none of its check functions, and registers the same probes."""
    for number in MODULES:
        if not P.module_probes(number):
            continue
        text = P.probe_file(number).read_text()
        assert not re.search(r"\buses\s*=", text), f"m{number}.py still uses source substitution (uses=)"
        copy = P.sandbox_source(number)
        for p in P.module_probes(number).values():
            if p.check is not None:
                assert f"def {p.check.__name__}(" not in copy, (number, p.check.__name__)
        code = _code_tree(number)  # the tree the probe runs of this process use (built by code_tree)
        probe = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                "from tito import probes as P; print(sorted(P.module_probes(sys.argv[2])))",
                                str(code), number], capture_output=True, text=True)
        assert probe.stdout.strip() == repr(sorted(P.module_probes(number))), probe.stderr
        assert not (code / "tito" / "trusted.py").exists() and not (code / "tito" / "grading.py").exists()
    with pytest.raises(TypeError, match="replay="):
        P.probe("99.1", uses=("x",))


# ------------------------------------------------------------------ every module: solution passes, stubs fail


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(n for n in MODULES if P.module_probes(n)))
def test_solution_passes_and_stubs_fail(number):
    source = nbs.read(MODULES[number].notebook)
    good = verdicts(number, exported(source))
    assert all(not w for w in good.values()), {e: w for e, w in good.items() if w}
    stub = verdicts(number, exported(nbs.release(source)))
    assert all(stub.values()), f"checks that a stub passes: {[e for e, w in stub.items() if not w]}"


# ------------------------------------------------------------------ differently written, still correct

KAHN_BACKWARD = """
found, consumers, stack = {id(tensor): tensor}, {}, [tensor]
while stack:  # count the consumers of every tensor first (Kahn's algorithm), no DFS order
    t = stack.pop()
    node = t.grad_fn
    if node is None:
        continue
    if node.inputs is None:
        raise RuntimeError("backward: the graph was already released; pass retain_graph=True")
    for inp in node.inputs:
        if inp is not None and inp.requires_grad:
            consumers[id(inp)] = consumers.get(id(inp), 0) + 1
            if id(inp) not in found:
                found[id(inp)] = inp
                stack.append(inp)
grads, ready = {id(tensor): grad}, [tensor]
while ready:
    t = ready.pop(0)
    g = grads.pop(id(t), None)
    node = t.grad_fn
    if g is not None and (node is None or t._retains_grad):
        if t.grad is None:
            t.grad = Tensor(g.astype(t.data.dtype, copy=True), dtype=t.data.dtype)
        else:
            t.grad.data = t.grad.data + g
    if node is None:
        continue
    rule = node.rule if node.rule is not None else BACKWARD_RULES.get(node.op)
    if rule is None:
        raise RuntimeError(f"backward: no backward rule for op {node.op!r}")
    results = rule(g, node) if g is not None else [None] * len(node.inputs)
    for inp, ig in zip(node.inputs, results):
        if inp is None or not inp.requires_grad:
            continue
        if ig is not None:
            ig = ig if ig.shape == inp.data.shape else unbroadcast(ig, inp.data.shape)
            grads[id(inp)] = grads[id(inp)] + ig if id(inp) in grads else ig
        consumers[id(inp)] -= 1
        if consumers[id(inp)] == 0:
            ready.append(inp)
    if not retain_graph:
        node.inputs = None
        node.saved = None
"""

OTHER_ATTENTION = """
scale = 1.0 / math.sqrt(q.shape[-1])
scores = (q * scale) @ k.transpose(-1, -2)  # no attention_scores; every mask folded into an additive -inf bias
causal = causal_mask(q.shape[-2], k.shape[-2]) if is_causal else np.zeros((1, 1), dtype=bool)
boolean = m is not None and m.dtype == np.bool_
forbid = np.logical_or(causal, m) if boolean else causal
if m is not None and not boolean:
    scores = scores + Tensor(m, dtype=scores.dtype)
scores = scores + Tensor(np.where(forbid, -np.inf, 0.0).astype(scores.dtype))
return MaskedSoftmax.apply(scores, None) @ v
"""

CHOICE_SAMPLING = """
if temperature == 0:
    return np.argmax(logits, axis=1).astype(np.int64)
z = logits / temperature
if top_k is not None and top_k < z.shape[1]:
    kth = -np.sort(-z, axis=1)[:, top_k - 1:top_k]
    z = np.where(z >= kth, z, -np.inf)
p = np.exp(z - z.max(axis=1, keepdims=True))
p = p / p.sum(axis=1, keepdims=True)
return np.array([rng.choice(p.shape[1], p=row) for row in p], dtype=np.int64)
"""

FLIPPED_SVD = """
ut, sv, vtt = np.linalg.svd(linear.weight.data.astype(np.float64).T, full_matrices=False)
left, right = -vtt.T[:, :rank], -ut[:, :rank].T  # W = left diag(s) right, from the SVD of W^T, signs flipped
half = np.sqrt(sv[:rank])
a = Linear(n_in, rank, bias=False, rng=1)
a.weight = Tensor((right * half[:, None]).astype(np.float32), requires_grad=True)
b = Linear(rank, n_out, bias=linear.bias is not None, rng=1)
b.weight = Tensor((left * half[None, :]).astype(np.float32), requires_grad=True)
if b.bias is not None:
    b.bias = Tensor(np.array(linear.bias.data), requires_grad=True)
return Sequential(*[a, b])
"""


# Module 17: C written otherwise (spacing, parentheses everywhere, a relu with ||, no helper table), and the
# kernel's loop as one flat loop with `%` for the inner arguments: the probes compile and run it.
OTHER_C_EXPRESSION = """
a = operands[0]
other = operands[1] if len(operands) > 1 else c_literal(attrs["other"]) if "other" in attrs else ""
if op in ("add", "sub", "mul", "div"):
    return "((" + a + ")" + {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op] + "(" + other + "))"
if op == "pow":
    if len(operands) == 1 and attrs.get("other") in (2, 3):
        return "(" + "*".join(["(" + a + ")"] * int(attrs["other"])) + ")"
    return "powf(" + a + "," + other + ")"
simple = {"neg": "(-({a}))", "exp": "(expf({a}))", "log": "(logf({a}))", "sqrt": "(sqrtf({a}))",
          "tanh": "(tanhf({a}))", "abs": "(fabsf({a}))", "relu": "((({a})>=0.0f||({a})!=({a}))?({a}):0.0f)",
          "sigmoid": "(1.0f/(1.0f+expf(-({a}))))"}
if op in simple:
    return simple[op].format(a=a)
if op == "gelu":
    k, c = c_literal(math.sqrt(2.0 / math.pi)), c_literal(0.044715)
    return f"(0.5f*({a})*(1.0f+tanhf({k}*(({a})+{c}*({a})*({a})*({a})))))"
raise NotImplementedError(f"c_expression: no C code for op {op!r}")
"""
FLAT_LOOP = """
read = {"full": "p{k}[i]", "copy": "p{k}[i]", "scalar": "p{k}[0]", "inner": "p{k}[i % {inner}]"}
lines = ["#include <stdint.h>", "#include <math.h>"] + (["/* " + comment + " */"] if comment else [])
args = [f"const float *p{k}" for k in range(len(kinds))] + ["float *out", "int64_t n_outer"]
lines += [f"void {name}({', '.join(args)})", "{", f"  int64_t n = n_outer * {inner};",
          "  for (int64_t i = 0; i < n; ++i) {"]
for k, kind in enumerate(kinds):
    lines.append("    float v%d = %s;" % (k, read[kind].format(k=k, inner=inner)))
for t, e in steps:
    lines.append(f"    float {t} = {e};")
lines += [f"    out[i] = {steps[-1][0]};", "  }", "}"]
"""


@pytest.mark.slow
@pytest.mark.parametrize("number, marker, code, exercises", [
    ("06", "def backward(", KAHN_BACKWARD, ["6.4"]),
    ("12", "def scaled_dot_product_attention(", OTHER_ATTENTION, ["12.5"]),
    ("02", "class Sigmoid(", "a = x.data\ne = np.exp(-np.abs(a))\nout = np.where(a >= 0, 1 / (1 + e), e / (1 + e))",
     ["2.2"]),
    ("09", "def conv2d_loop(", "out, _ = conv2d_forward(x, weight, bias, stride, padding)\nreturn out", ["9.1"]),
    ("13", "def sample_next(", CHOICE_SAMPLING, ["13.4"]),
    ("16", "def low_rank(", FLIPPED_SVD, ["16.6"]),
    ("17", "def c_expression(", OTHER_C_EXPRESSION, ["17.9"]),
    ("17", "def loop_source(", FLAT_LOOP, ["17.10"]),
    ("14", "def roofline(", "if np.ndim(intensity) == 0:\n    return min(float(peak_flops), float(bandwidth) * float(intensity))\n"
     "return np.minimum(peak_flops, bandwidth * np.asarray(intensity, dtype=np.float64))", ["14.8"]),
    ("14", "def amdahl(", "if not 0 <= fraction <= 1:\n    raise ValueError(f\"amdahl: fraction must be in [0, 1]; got {fraction}\")\n"
     "if not speedup > 0:\n    raise ValueError(f\"amdahl: speedup must be > 0; got {speedup}\")\n"
     "with np.errstate(divide='ignore'):\n    return np.float64(1.0) / (np.float64(1.0) - fraction + np.float64(fraction) / speedup)",
     ["14.9"]),
    ("14", "class FlopCounter:", "shapes = [None if s is None else list(s) for s in input_shapes(node)]\n"
     "counts = op_flops(node.op, shapes, list(node.shape))\nold = self.by_op.get(node.op, [0, 0])\n"
     "self.by_op[node.op] = [old[0] + int(counts[0]), old[1] + int(counts[1])]", ["14.3"]),
], ids=["06-kahn-traversal", "12-attention-other-masking-and-softmax", "02-sigmoid-where", "09-loop-via-im2col",
        "13-sampling-with-choice", "16-svd-other-signs", "17-c-spaced-and-parenthesised", "17-one-flat-loop",
        "14-roofline-python-floats", "14-amdahl-numpy-scalars",
        "14-counter-shapes-as-lists"])
def test_differently_written_solutions_keep_full_marks(number, marker, code, exercises):
    got = verdicts(number, with_solution(number, marker, code), exercises)
    assert all(not w for w in got.values()), got


RECURSIVE_WALK = """
order, visited = [], set()


def visit(t):  # a post-order by recursion: one Python frame per node of the longest path
    if id(t) in visited:
        return
    visited.add(id(t))
    node = t.grad_fn
    if node is not None:
        if node.inputs is None:
            raise RuntimeError("backward: the graph was already released; pass retain_graph=True")
        for inp in node.inputs:
            if inp is not None and inp.requires_grad:
                visit(inp)
    order.append(t)


visit(tensor)
"""


def recursive_backward() -> str:
    """Module 06's own solution of `backward` with its walk (everything before `grads = {...}`) made recursive."""
    import textwrap

    cell = next(c for c in nbs.read(MODULES["06"].notebook).cells
                if nbs.is_solution_cell(c) and "def backward(" in c.source)
    region = cell.source.split(nbs.BEGIN_SOLUTION, 1)[1].split(nbs.END_SOLUTION, 1)[0].splitlines()
    k = next(i for i, line in enumerate(region) if line.strip().startswith("grads = {id(tensor): grad}"))
    return RECURSIVE_WALK + textwrap.dedent("\n".join(region[k:]))


@pytest.mark.slow
def test_a_recursive_traversal_fails_its_exercise_only():
    """The contract says iterative (a chain past Python's recursion limit must work): the probe's long chain, run
    with the recursion limit a fixed number of frames above the probe, fails a walk that recurses once per node, and
    nothing else fails with it (every other check of 6.4 passes: the walk is right on short graphs)."""
    got = verdicts("06", with_solution("06", "def backward(", recursive_backward()), ["6.3", "6.4", "6.5"])
    assert "RecursionError" in got["6.4"] and "chain" in got["6.4"], got
    assert not got["6.3"] and not got["6.5"], got


# ------------------------------------------------------------------ one bug, charged once


@pytest.mark.slow
@pytest.mark.parametrize("mutation, others", [
    (Mutation("10", "text/tokenizers.py", "merge_pair", "i += 2", "i += 1", "merged pairs overlap", "10.3"),
     ["10.4", "10.5", "10.6"]),
    (Mutation("09", "core/spatial.py", "im2col", "transpose(1, 4, 5, 0, 2, 3)", "transpose(4, 5, 1, 0, 2, 3)",
              "im2col rows in (kh, kw, C) order", "9.2"), ["9.3", "9.4"]),
    (Mutation("12", "core/attention.py", "MaskedSoftmax.forward", "where=z > 0)", "where=z >= 0)",
              "a fully masked row divides 0 by 0", "12.3"), ["12.4", "12.5", "12.7"]),
    (Mutation("13", "models/gpt.py", "LayerNormFunction.forward", "(centred * centred).mean(axis=-1, keepdims=True) + eps",
              "(centred * centred).mean(axis=-1, keepdims=True) + 1e-2", "eps ignored", "13.1"),
     ["13.2", "13.3", "13.5", "13.6"]),
    (Mutation("14", "perf/profiler.py", "op_flops", "2 * math.prod(output_shape) * input_shapes[0][-1]",
              "math.prod(output_shape) * input_shapes[0][-1]", "matmul FLOPs without the factor 2", "14.1"),
     ["14.3", "14.5"]),
    (Mutation("14", "perf/profiler.py", "ModulePaths.pop", "self.stack.pop(", "return self.stack.pop(",
              "pop returns the path, which replaces the module's output", "14.4"), ["14.5"]),
    (Mutation("14", "perf/profiler.py", "roofline", "bandwidth * np.asarray(intensity",
              "peak_flops * np.asarray(intensity", "the memory roof from the compute roof", "14.8"), ["14.9"]),
    (Mutation("15", "perf/quantization.py", "quantize", "np.clip(np.rint(t)",
              "np.clip(np.floor(t)", "quantize floors", "15.5"), ["15.8"]),
    (Mutation("15", "perf/quantization.py", "to_bfloat16", "(u + np.uint32(0x7FFF) + last_kept_bit)",
              "u", "bf16 rounding by truncation", "15.1"), ["15.3"]),
    (Mutation("15", "perf/quantization.py", "Observer.__call__", "np.minimum(self.min_val, lo)", "lo",
              "the minimum of the last batch only", "15.7"), ["15.9"]),
    (Mutation("17", "perf/compiler.py", "dead_code_elimination", "for n in reversed(graph.nodes):",
              "for n in graph.nodes:", "DCE walks forwards", "17.4"), ["17.5", "17.6", "17.7", "17.8", "17.11"]),
    (Mutation("17", "perf/compiler.py", "c_expression", 'c_literal(attrs["other"])', 'repr(attrs["other"])',
              "constants written with repr", "17.9"), ["17.10", "17.11"]),
    (Mutation("17", "perf/compiler.py", "loop_source", '"inner": "p{k}[j]"', '"inner": "p{k}[i]"',
              "an inner argument read at the output's index", "17.10"), ["17.9", "17.11"]),
], ids=["merge_pair", "im2col-row-order", "masked-softmax", "layernorm-eps", "op-flops", "paths-pop",
        "roofline", "quantize-floor", "bf16-truncation", "observer-last-batch", "dead-code-elimination",
        "c-constant-repr", "loop-inner-index"])
def test_a_bug_is_charged_to_its_own_exercise_only(mutation, others):
    got = verdicts(mutation.module, mutated(mutation), [mutation.exercise, *others])
    assert got[mutation.exercise], f"{mutation.why}: not caught by Exercise {mutation.exercise}"
    assert all(not got[e] for e in others), {e: got[e] for e in others}


# ------------------------------------------------------------------ the mutation proof

GPT, ATT = "models/gpt.py", "core/attention.py"
ISSUE_14 = [  # the bugs issue 14 found scoring full marks in the graded cells (13's temperature bug: MUTATIONS)
    Mutation("06", "core/autograd.py", "backward", "ig.shape != inp.data.shape", "ig.ndim != inp.data.ndim",
             "unbroadcast only when the rank differs", "6.4"),
    Mutation("06", "core/autograd.py", "backward", "Tensor(np.array(g, dtype=t.data.dtype), dtype",
             "Tensor(g, dtype", "a leaf's .grad shares the rule's buffer", "6.4"),
    Mutation("08", "core/training.py", "clip_grad_norm_", "max_norm / (total + 1e-6)", "max_norm / total",
             "division by zero on all-zero gradients", "8.2"),
    Mutation("09", "core/spatial.py", "MaxPool2dFunction.forward", "(value > best) | np.isnan(value)", "(value > best)",
             "a NaN's gradient routed elsewhere", "9.5"),
    Mutation("13", GPT, "sample_next", "np.where(logits < kth,", "np.where(logits <= kth,", "top-k keeps k-1", "13.4"),
    Mutation("13", GPT, "GPT.generate", "sample_next(logits, temperature, top_k, rng)",
             "sample_next(logits, temperature, top_k, seed)", "a fresh generator from the seed at every step", "13.6"),
    Mutation("13", GPT, "GPT.generate", "self.eval()", "pass", "dropout left on while generate samples", "13.6"),
    Mutation("13", GPT, "LayerNormFunction.forward", "np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)",
             "(np.sqrt((centred * centred).mean(axis=-1, keepdims=True)) + eps)", "eps outside the square root",
             "13.1"),
    Mutation("13", GPT, "TransformerBlock.forward", "self.drop(self.attn(", "(self.attn(",
             "no dropout on the attention branch", "13.3"),
    Mutation("13", GPT, "GPT.forward", "start_pos=start_pos, positions=positions", "positions=positions",
             "positions always start at 0 (start_pos ignored with a cache)", "13.5"),
    Mutation("12", ATT, "attention_scores", "(1.0 / math.sqrt(q.shape[-1]))",
             "(1.0 / q.shape[-1])", "scaled by 1/d instead of 1/sqrt(d)", "12.1"),
    Mutation("10", "text/tokenizers.py", "merge_pair", "i += 2", "i += 1", "merged pairs overlap", "10.3"),
]
PROF, QUANT, COMP = "perf/profiler.py", "perf/quantization.py", "perf/compression.py"
BENCH = "perf/benchmark.py"
LATER = [  # realistic one-line bugs of modules 12, 14-16 and 19 (their probes came after issue 14)
    Mutation("12", ATT, "causal_mask", 'k_len - q_len if align', "0 if align",
             "causal mask aligned top-left by default (wrong with a KV cache)", "12.2"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "np.exp(s - np.where(np.isfinite(m), m, 0.0))", "np.exp(s)",
             "softmax without max subtraction (NaN on large scores)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "where=z > 0)", "where=z >= 0)",
             "a fully masked row divides 0 by 0 (NaN)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "np.divide(e, z, out=np.zeros_like(e), where=z > 0)",
             "np.nan_to_num(e / z)", "0 / 0 on fully masked rows, hidden by nan_to_num (warns)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.backward", "w * (grad - np.sum(grad * w, axis=-1, keepdims=True))",
             "w * grad", "softmax backward without the row-sum term", "12.4"),
    Mutation("12", ATT, "scaled_dot_product_attention", "else (masked | m)",
             "else masked", "a boolean mask ignored when is_causal", "12.5"),
    Mutation("12", ATT, "MultiHeadAttention.merge_heads", "x.transpose(1, 2).reshape(b, t, h * d)",
             "x.reshape(b, t, h * d)", "heads merged in the wrong order (no transpose back)", "12.6"),
    Mutation("12", ATT, "MultiHeadAttention.forward", "self.k_proj(key)",
             "self.k_proj(query)", "keys projected from the queries (cross-attention broken)",
             "12.7"),
    Mutation("14", PROF, "op_flops", "2 * math.prod(output_shape) * input_shapes[0][-1]",
             "math.prod(output_shape) * input_shapes[0][-1]", "matmul FLOPs without the factor 2", "14.1"),
    Mutation("14", PROF, "backward_flops", "mm * factors", "mm * 2",
             "backward counts two products even when an operand needs no gradient", "14.1"),
    Mutation("14", PROF, "backward_flops", "list(needs_grad)[:2]", "list(needs_grad)",
             "a convolution's bias counted as a factor of the product", "14.1"),
    Mutation("14", PROF, "op_bytes", "any(np.may_share_memory(out, a) for a in arrays)", "False",
             "views counted as reads and writes", "14.2"),
    Mutation("14", PROF, "op_bytes", "if op in INPLACE_OPS:", "if False:",
             "in-place ops taken for views (0 bytes)", "14.2"),
    Mutation("14", PROF, "op_bytes", "arrays[1:] if op in OVERWRITING_OPS", "arrays[1:] if op in ()",
             "fill_, zero_ and copy_ read the values they overwrite", "14.2"),
    Mutation("14", PROF, "FlopCounter.__call__", "entry[1] += other", "entry[1] = other",
             "other FLOPs overwritten instead of added", "14.3"),
    Mutation("14", PROF, "ModulePaths.attach", "module.register_forward_hook(self.pop, always_call=True)",
             "module.register_forward_pre_hook(lambda *args: None)", "no forward hook pops the path", "14.4"),
    Mutation("14", PROF, "ModulePaths.attach", ", always_call=True", "",
             "pop skipped when a forward raises: the path stays on the stack", "14.4"),
    Mutation("14", PROF, "ModulePaths.pop", "self.stack.pop(", "return self.stack.pop(",
             "pop returns the path, which replaces the module's output", "14.4"),
    Mutation("14", PROF, "Profiler._on_op", 'self._stack[-1] if self._stack',
             'self._stack[0] if self._stack', "op charged to the outermost module", "14.5"),
    Mutation("14", PROF, "summarize", "e.bytes_read + e.bytes_written", "e.bytes_read",
             "bytes without the writes", "14.6"),
    Mutation("14", PROF, "graph_memory", "owner = _owner(inp.data)", "owner = inp.data",
             "a view's bytes counted as its own buffer", "14.7"),
    Mutation("14", PROF, "graph_memory", "acts.pop(key, None)", "acts.get(key, None)",
             "a parameter that is also saved for backward counted as an activation too", "14.7"),
    Mutation("14", PROF, "place_on_roofline", '"memory" if memory_roof < peak_flops', '"memory" if memory_roof > peak_flops',
             "memory and compute bound swapped", "14.8"),
    Mutation("14", PROF, "place_on_roofline", "attained / bound)", "bound / attained)",
             "the fraction of the roof inverted", "14.8"),
    Mutation("14", PROF, "amdahl", "(1.0 - fraction) + fraction / speedup",
             "fraction + (1.0 - fraction) / speedup", "Amdahl with the fractions swapped", "14.9"),
    Mutation("15", QUANT, "to_bfloat16", "(u + np.uint32(0x7FFF) + last_kept_bit)",
             "u", "bf16 rounding by truncation", "15.1"),
    Mutation("15", QUANT, "to_bfloat16", "np.uint32(0x7FFF) + last_kept_bit", "np.uint32(0x8000)",
             "bf16 ties rounded up, not to even", "15.1"),
    Mutation("15", QUANT, "to_float16", "np.maximum(exponent - 11, -24)", "np.maximum(exponent - 11, -25)",
             "FP16 subnormals on a grid twice too fine", "15.2"),
    Mutation("15", QUANT, "to_float16", "np.maximum(exponent - 11, -24)", "np.maximum(exponent - 10, -24)",
             "FP16 spacing off by one power of two (frexp's convention)", "15.2"),
    Mutation("15", QUANT, "_autocast_observer", "out.data = round_to(np.matmul(a, b), dtype)",
             "out.data = np.matmul(a, b)", "autocast product left in float32 (not rounded to the output format)", "15.3"),
    Mutation("15", QUANT, "_autocast_observer", "node.saved = (a, b)", "node.saved = node.saved",
             "backward multiplies by the unrounded operands", "15.3"),
    Mutation("15", QUANT, "GradScaler.update", "good_steps == self.growth_interval",
             "good_steps > self.growth_interval", "the scale grows one good step late", "15.4"),
    Mutation("15", QUANT, "GradScaler.unscale_", "found_inf = found_inf or not", "found_inf = not",
             "an inf found in an earlier parameter forgotten", "15.4"),
    Mutation("15", QUANT, "GradScaler.step", "if self.found_inf_per_optimizer[id(optimizer)]:",
             "if self.found_inf_per_optimizer.get(id(optimizer)) is None:", "steps even after an overflow", "15.4"),
    Mutation("15", QUANT, "quantize", "np.clip(np.rint(t), qmin, qmax)",
             "np.clip(np.trunc(t + np.copysign(0.5, t)), qmin, qmax)", "rounding half away from zero", "15.5"),
    Mutation("15", QUANT, "quantize", "t = fma_float32(a, inv_scale, z)", "t = a * inv_scale + z.astype(np.float32)",
             "per tensor without the fused multiply-add (near-ties off by one)", "15.5"),
    Mutation("15", QUANT, "quantize", "t = fma_float32(a, inv_scale, z)", "t = np.rint(a * inv_scale) + z",
             "the zero point added after rounding (torchao's order)", "15.5"),
    Mutation("15", QUANT, "compute_qparams", "qmin - np.rint(lo / scale)",
             "qmin + np.rint(lo / scale)",
             "zero point with the wrong sign", "15.6"),
    Mutation("15", QUANT, "Observer.__call__", "np.minimum(self.min_val, lo)", "lo",
             "the minimum of the last batch only", "15.7"),
    Mutation("15", QUANT, "Observer.range", "np.percentile(rows, self.percentile, axis=1)",
             "np.percentile(rows, self.percentile)", "percentile over every channel together", "15.7"),
    Mutation("15", QUANT, "QuantizedLinear.forward", "qx.astype(np.int32) - np.int32(self.input_zero_point)",
             "qx.astype(np.int32)", "the input zero point not subtracted", "15.8"),
    Mutation("15", QUANT, "int_matmul", "bound <= 2 ** 24", "bound <= 2 ** 31",
             "float32 used for sums it cannot hold exactly", "15.8"),
    Mutation("15", QUANT, "quantize_model", "model.eval()", "model.train()",
             "calibrated in training mode", "15.9"),
    Mutation("15", QUANT, "quantize_model", "obs_out.qparams(act_dtype)", "obs_in.qparams(act_dtype)",
             "output parameters taken from the input observer", "15.9"),
    Mutation("15", QUANT, "model_nbytes", "counted.update(id(p) for p in m.parameters())", "counted.update(())",
             "a packed layer's float latent weights counted too", "15.9"),
    Mutation("15", QUANT, "ternarize", "np.clip(np.rint(a / scale), -1, 1)",
             "np.sign(a)", "binarized instead of ternarized (no zeros)", "15.10"),
    Mutation("16", COMP, "magnitude_mask", "np.argpartition(np.abs(w).ravel(), k - 1)",
             "np.argpartition(-np.abs(w).ravel(), k - 1)", "pruning the largest weights", "16.1"),
    Mutation("16", COMP, "global_magnitude_masks", "np.abs(w).ravel() for w in ws",
             "(np.abs(w) / np.abs(w).max()).ravel() for w in ws",
             "scores normalised per array (not one global threshold)", "16.2"),
    Mutation("16", COMP, "PruningMasks.apply", "if p.grad is not None:", "if False:",
             "the pruned weights' gradients left as they are", "16.3"),
    Mutation("16", COMP, "prune_magnitude", 'if scope == "global":', 'if scope != "global":',
             "the two scopes swapped", "16.3"),
    Mutation("16", COMP, "CSRMatrix.from_dense", "np.bincount(rows, minlength=a.shape[0])", "np.bincount(rows)",
             "empty rows at the end missing from indptr", "16.4"),
    Mutation("16", COMP, "CSRMatrix.matmul", "vals = np.zeros((m, width)", "vals = np.ones((m, width)",
             "the padding of short rows is not zero (it adds x[0] to them)", "16.4"),
    Mutation("16", COMP, "prune_neurons", "next_layer.weight.data[:, keep]",
             "next_layer.weight.data[:, :n_keep]",
             "the next layer keeps the first columns, not the kept units'", "16.5"),
    Mutation("16", COMP, "prune_neurons", "np.linalg.norm(w.reshape(n_out, -1).astype(np.float64), axis=1)",
             "np.abs(w.reshape(n_out, -1)).sum(axis=1)", "neurons ranked by the L1 norm, not the L2", "16.5"),
    Mutation("16", COMP, "low_rank", "(root[:, None] * vt[:rank])",
             "(root[:, None] ** 2 * vt[:rank])",
             "all of s in the first factor (and s^1.5 in the product)", "16.6"),
    Mutation("16", COMP, "distillation_loss", "kl * ((1.0 - alpha) * T * T)",
             "kl * (1.0 - alpha)", "distillation without T^2", "16.7"),
    Mutation("19", BENCH, "bootstrap_median_ci", "size=(n_resamples, x.size)",
             "size=(x.size, n_resamples)", "resamples laid out transposed (medians over the wrong axis)", "19.1"),
    Mutation("19", BENCH, "bootstrap_median_ci", "[50 * (1 - confidence)", "[100 * (1 - confidence)",
             "the whole tail probability cut from the low end", "19.1"),
    Mutation("19", BENCH, "benchmark", "bootstrap_median_ci(samples, confidence, n_resamples, rng)",
             "bootstrap_median_ci(samples)", "the interval ignores confidence, n_resamples and rng", "19.2"),
    Mutation("19", BENCH, "benchmark", "if number is None:", "if True:",
             "a given number is recalibrated (number=1 per-call latencies lost)", "19.2"),
    Mutation("19", BENCH, "benchmark", "noise_warnings(samples, before, after, max_cv)",
             "noise_warnings(samples, before, after)", "max_cv ignored by the noise check", "19.2"),
    Mutation("19", BENCH, "benchmark", 'name or getattr(fn, "__name__", "fn")', 'name or "fn"',
             "results of unnamed runs not named after their function", "19.2"),
    Mutation("19", BENCH, "benchmark", "for _ in range(warmup):", "for _ in range(warmup + 1):",
             "one warm-up call too many (a fake clock's readings shift)", "19.2"),
    Mutation("19", BENCH, "Comparison.verdict", "({ci} {1 / self.high:.2f}-{1 / self.low:.2f})",
             "({ci} {1 / self.low:.2f}-{1 / self.high:.2f})", "a slower A's interval printed with its ends swapped",
             "19.3"),
    Mutation("19", BENCH, "Comparison.verdict", "if self.low > 1:", "if self.ratio > 1:",
             "'faster' claimed from the point estimate, not the interval", "19.3"),
    Mutation("19", BENCH, "Comparison.significant", "return self.low > 1 or self.high < 1",
             "return self.low >= 1 or self.high <= 1", "an interval touching 1 called significant", "19.3"),
    Mutation("19", BENCH, "compare", "np.median(xb) / np.median(xa)", "np.median(xa) / np.median(xb)",
             "the ratio inverted (slower reported as faster)", "19.3"),
    Mutation("19", BENCH, "compare", "np.median(xa[ia], axis=1)", "np.median(xa[ib % xa.size], axis=1)",
             "both runs resampled with the same indices", "19.3"),
    Mutation("19", BENCH, "speed_verdict", "good, bad = low >= target, high < target",
             "good, bad = high >= target, low < target", "a speed-up target judged by the optimistic end", "19.4"),
    Mutation("19", BENCH, "speed_verdict", "good, bad = high <= target, low > target",
             "good, bad = high < target, low > target", "an interval ending exactly at an at-most target not met",
             "19.4"),
    Mutation("19", BENCH, "speed_verdict", "return MET if good else NOT_MET if bad else NOISY",
             "return MET if good else NOT_MET", "two outcomes: a straddling interval reported as not met", "19.4"),
    Mutation("19", BENCH, "pareto_front", "np.any(no_worse & better, axis=0)",
             "np.any(no_worse & better, axis=1)", "dominates and dominated swapped (wrong axis)", "19.5"),
    Mutation("19", BENCH, "pareto_front", "np.any(c[:, None, :] < c[None, :, :], axis=2)",
             "np.all(c[:, None, :] < c[None, :, :], axis=2)", "strictly better required in every objective", "19.5"),
]
COMPILER, KERNELS, BACKENDS = "perf/compiler.py", "perf/kernels.py", "perf/backends.py"  # module 17's three files
KV, CKPT, SRV = "perf/kv_cache.py", "perf/checkpoint.py", "serving/server.py"
LATER += [  # modules 17, 18 and 20
    # module 17: kernels
    Mutation("17", KERNELS, "naive_matmul", "float(a[i, p]) * float(b[p, j])", "float(a[i, p]) * float(b[j, p])",
             "B indexed transposed", "17.1"),
    Mutation("17", KERNELS, "naive_matmul", "for p in range(k):", "for p in range(k - 1):",
             "inner loop one short", "17.1"),
    Mutation("17", KERNELS, "block_size_for", "cache_bytes // (3 * itemsize)", "cache_bytes // (2 * itemsize)",
             "tiles of A and B only (C's tile forgotten)", "17.2"),
    Mutation("17", KERNELS, "block_size_for", "1 << (t.bit_length() - 1)", "1 << t.bit_length()",
             "power of two rounded up (the tiles no longer fit)", "17.2"),
    Mutation("17", KERNELS, "blocked_matmul", "out[i:i + t, j:j + t] += a_tile @", "out[i:i + t, j:j + t] = a_tile @",
             "each tile step overwrites C's tile instead of adding to it", "17.3"),
    Mutation("17", KERNELS, "blocked_matmul", "a_tile @ b[p:p + t, j:j + t]", "a_tile @ b[j:j + t, p:p + t]",
             "the tile of B taken at (j, p) instead of (p, j)", "17.3"),
    Mutation("17", KERNELS, "blocked_matmul", "for p in range(0, k, t):", "for p in range(0, k - t + 1, t):",
             "the last, partial tile of the shared axis dropped", "17.3"),
    # module 17: passes
    Mutation("17", COMPILER, "dead_code_elimination", "for n in reversed(graph.nodes):", "for n in graph.nodes:",
             "DCE walks forwards: the producers of an output's arguments are dropped", "17.4"),
    Mutation("17", COMPILER, "dead_code_elimination", "live.update(n.args)", "live.update(n.args[:1])",
             "DCE keeps only the first argument's producer alive", "17.4"),
    Mutation("17", COMPILER, "dead_code_elimination", "if c in live}", "if c in live or c.startswith('c')}",
             "unused constants kept", "17.4"),
    Mutation("17", COMPILER, "constant_fold", "args = tuple(rename.get(a, a) for a in n.args)", "args = n.args",
             "uses of a folded node not renamed (chained folds break)", "17.5"),
    Mutation("17", COMPILER, "constant_fold", "out.outputs = [rename.get(o, o) for o in graph.outputs]",
             "out.outputs = list(graph.outputs)", "a folded output keeps its old name", "17.5"),
    Mutation("17", COMPILER, "constant_fold", "math.prod(n.shape) <= FOLD_LIMIT", "math.prod(n.shape) < FOLD_LIMIT",
             "off by one at the folding limit (a result of exactly FOLD_LIMIT elements kept)", "17.5"),
    Mutation("17", COMPILER, "constant_fold", "all(a in constants for a in args)", "any(a in constants for a in args)",
             "a node with one constant argument folded", "17.5"),
    Mutation("17", COMPILER, "common_subexpression_elimination", "key = (n.op, args, attr_key(n.attrs))",
             "key = (n.op, args)", "CSE key without the attrs (sum over axis 0 merged with axis 1)", "17.6"),
    Mutation("17", COMPILER, "common_subexpression_elimination", "args = tuple(rename.get(a, a) for a in n.args)",
             "args = n.args", "CSE does not cascade (arguments not renamed)", "17.6"),
    Mutation("17", COMPILER, "attr_key", "return (type(v).__name__, v)", "return v",
             "numbers keyed by value: True and 1 (and x * 2 on int8 with x * True) merge", "17.6"),
    Mutation("17", COMPILER, "attr_key", 'return ("float", v.hex())', "return v",
             "floats keyed by value: 0.0 and -0.0, 2.0 and 2 merge (x * 2 and x * 2.0 on int8: the CSE bug)", "17.6"),
    Mutation("17", COMPILER, "attr_key", "return (type(v).__name__,) + tuple(", "return tuple(",
             "a list and a tuple with equal items share a key", "17.6"),
    # module 17: fusion
    Mutation("17", COMPILER, "fusion_groups", "uses[a] == 1 and a not in outputs", "uses[a] == 1",
             "a graph output fused inside a group", "17.7"),
    Mutation("17", COMPILER, "fusion_groups", "uses[a] == 1 and", "uses[a] >= 1 and",
             "a producer with several consumers fused into one of them", "17.7"),
    Mutation("17", COMPILER, "fusion_groups", "for a in set(n.args):", "for a in n.args:",
             "uses counted per argument slot (x * x counts x twice)", "17.7"),
    Mutation("17", COMPILER, "fuse_elementwise", "elif n.name == group[-1]:", "elif n.name == group[0]:",
             "the fused node put where the group's first node was (before values it reads)", "17.8"),
    Mutation("17", COMPILER, "fuse_elementwise", "tuple(local.get(a, a) for a in m.args)", "m.args",
             "the body still reads the outside names, not its params", "17.8"),
    Mutation("17", COMPILER, "fuse_elementwise", "for a in m.args if a not in inside", "for a in m.args",
             "values made inside the group taken as arguments too", "17.8"),
    Mutation("17", COMPILER, "fuse_elementwise", "n.shape, n.dtype, body))", "members[0].shape, members[0].dtype, body))",
             "the fused node typed like the group's first node, not its root", "17.8"),
    # module 17: code generation
    Mutation("17", COMPILER, "c_expression", '"(1.0f / (1.0f + expf(-{a})))"', '"(1.0f / (1.0f + expf({a})))"',
             "sigmoid with e^a instead of e^-a", "17.9"),
    Mutation("17", COMPILER, "c_expression", '"abs": "fabsf({a})"', '"abs": "abs({a})"',
             "C's integer abs on a float (truncates)", "17.9"),
    Mutation("17", COMPILER, "c_expression", 'c_literal(attrs["other"])', 'repr(attrs["other"])',
             "a constant written with repr: a C double (0.1 is not 0.1f)", "17.9"),
    Mutation("17", COMPILER, "c_expression", '"relu": "({a} < 0.0f ? 0.0f : {a})"', '"relu": "fmaxf({a}, 0.0f)"',
             "relu with fmaxf: a NaN becomes 0 (np.maximum keeps it)", "17.9"),
    Mutation("17", COMPILER, "c_expression", '''return f"({a} {dict(add='+', sub='-', mul='*', div='/')[op]} {b})"''',
             '''return f"{a} {dict(add='+', sub='-', mul='*', div='/')[op]} {b}"''',
             "a binary op not parenthesised (v0 - (v1 + v1) becomes v0 - v1 + v1)", "17.9"),
    Mutation("17", COMPILER, "c_literal", 'return "INFINITY" if v > 0 else "(-INFINITY)"', 'return "INFINITY"',
             "minus infinity written as infinity", "17.9"),
    Mutation("17", COMPILER, "loop_source", '"inner": "p{k}[j]"', '"inner": "p{k}[i]"',
             "an inner (bias) argument read at the output's index: past its end", "17.10"),
    Mutation("17", COMPILER, "loop_source", 'f"            out[i] = {steps[-1][0]};"', 'f"            out[i] = {steps[0][0]};"',
             "the first step stored instead of the last", "17.10"),
    Mutation("17", COMPILER, "loop_source", 'f"            const int64_t i = o * {inner} + j;"',
             'f"            const int64_t i = o + j;"', "blocks overlap: the block offset not scaled by inner", "17.10"),
    Mutation("17", COMPILER, "index_kinds", "and inner in (None, math.prod(trimmed))", "",
             "two inner arguments of different sizes both read as inner", "17.10"),
    Mutation("17", COMPILER, "index_kinds", "while trimmed and trimmed[0] == 1:", "while False:",
             "a (1, 5) bias not seen as the output's last axis (copied)", "17.10"),
    # module 17: guards and dispatch
    Mutation("17", COMPILER, "CompiledFunction.__call__", "key = tuple((t.shape, t.dtype.str) for t in tensors)",
             "key = tuple(t.shape for t in tensors)", "guards without the dtype (an int64 plan serves float32)", "17.11"),
    Mutation("17", COMPILER, "CompiledFunction.__call__", "results = tuple(Tensor(o, dtype=o.dtype) for o",
             "results = tuple(Tensor(o) for o", "outputs rewrapped with the default dtype (float64 comes back float32)",
             "17.11"),
    Mutation("17", COMPILER, "CompiledFunction.__call__", "            self.retraces_on_path += 1\n", "",
             "a retrace for a changed branch not counted", "17.11"),
    Mutation("17", COMPILER, "CompiledFunction.__call__", "if any(python_value(", "if all(python_value(",
             "a path change noticed only when every guard changed", "17.11"),
    Mutation("17", BACKENDS, "SizeDispatch.matmul", "return self._pick(n * a.shape[-1] * m)", "return self._pick(n * m)",
             "a product's work without its shared axis k", "17.12"),
    Mutation("17", BACKENDS, "SizeDispatch.binary", "max(np.size(a), np.size(b))", "np.size(a)",
             "an elementwise op's work from its first operand only", "17.12"),
    Mutation("17", BACKENDS, "measure_threshold", "<= time(lambda: large.matmul(a, b))",
             "< time(lambda: large.matmul(a, b))", "a tie counted as a loss of small", "17.12"),
    Mutation("17", BACKENDS, "measure_threshold", "best = n ** 3", "best = n ** 3\n        else:\n            break",
             "the search stops at small's first loss (a larger size that wins is never tried)", "17.12"),
    # module 17: in-place ReLU
    Mutation("17", KERNELS, "relu_", "return t.mul_(t.data > 0)", "return Tensor(np.maximum(t.data, 0))",
             "a new tensor returned (not in place)", "17.13"),
    Mutation("17", KERNELS, "relu_", "return t.mul_(t.data > 0)", "t.data[t.data < 0] = 0\n    return t",
             "written through .data: the version counter misses the change", "17.13"),
    Mutation("18", KV, "KVCache.update", "self.k[:, :, start:end] = k", "self.k[:, :, :k.shape[2]] = k",
             "new keys written at position 0 instead of seq_len", "18.1"),
    Mutation("18", KV, "KVCache.update", "Tensor(self.k[:, :, :end])", "Tensor(self.k[:, :, start:end])",
             "only the new keys returned, not every cached one", "18.1"),
    Mutation("18", KV, "KVCache.update", "self.seq_len = end", "self.seq_len = k.shape[2]",
             "seq_len set to the new count instead of advanced", "18.1"),
    Mutation("18", KV, "cached_decode", "model(nxt[:, None], start_pos=pos, cache=caches)",
             "model(nxt[:, None], cache=caches)", "decode steps without start_pos", "18.2"),
    Mutation("18", KV, "cached_decode", "if step == max_new_tokens - 1:", "if step == max_new_tokens:",
             "one model call after the last token", "18.2"),
    Mutation("18", KV, "cached_decode", "idx[:, -model.context_length:]", "idx[:, -model.context_length + 1:]",
             "the refill after the context limit drops one token too many", "18.2"),
    Mutation("18", KV, "PagedKVCache.allocate", "-(-num_tokens // self.block_size)", "num_tokens // self.block_size",
             "blocks counted with floor division (a partial block is not allocated)", "18.3"),
    Mutation("18", KV, "PagedKVCache.allocate", "if missing > len(self.free_blocks):",
             "if missing >= len(self.free_blocks):", "refused when exactly enough blocks are free", "18.3"),
    Mutation("18", KV, "PagedKVCache.allocate", "self.free_blocks.pop()", "self.free_blocks.pop(0)",
             "blocks taken from the bottom of the free list (freed blocks not reused first)", "18.3"),
    Mutation("18", KV, "PagedKVCache.write", "np.arange(start, start + k.shape[1])", "np.arange(k.shape[1])",
             "paged write at position 0 instead of the sequence's length", "18.4"),
    Mutation("18", KV, "PagedKVCache.gather", "table[: -(-t // self.block_size)]", "table[: t // self.block_size]",
             "the last, partly filled block not gathered", "18.4"),
    Mutation("18", KV, "PagedKVCache.gather", "self.k_pool[layer, used].transpose(1, 0, 2, 3)",
             "self.k_pool[layer, used]", "blocks and heads not swapped before the reshape (wrong axis)", "18.4"),
    Mutation("18", CKPT, "CheckpointFunction.backward", "set_grad_enabled(True)", "set_grad_enabled(previous)",
             "recomputation under the caller's grad mode (nothing recorded under no_grad)", "18.5"),
    Mutation("18", CKPT, "CheckpointFunction.backward", "ctx.needs_input_grad[1:]", "ctx.needs_input_grad",
             "needs_input_grad read from fn's slot (off by one)", "18.5"),
    Mutation("18", CKPT, "CheckpointFunction.backward", "backward(out, grad)", "backward(out.sum())",
             "the upstream gradient ignored (ones instead)", "18.5"),
    Mutation("18", KV, "make_caches", "max_len, b.attn.head_dim", "model.context_length, b.attn.head_dim",
             "max_len ignored: every cache sized for the whole context", "18.1"),
    Mutation("18", KV, "make_caches", "b.attn.num_heads, max_len", "1, max_len",
             "one head per cache (the heads' keys squeezed into one)", "18.1"),
    Mutation("18", KV, "cache_bytes_per_token", "2 * len(model.blocks)", "len(model.blocks)",
             "bytes per token without the value (keys only)", "18.1"),
    Mutation("18", KV, "PagedKVCache.free", "extend(reversed(table))", "extend(table)",
             "freed blocks pushed in table order (the last block is reused first)", "18.3"),
    Mutation("18", KV, "PagedKVCache.free", "del self.block_tables[seq_id], self.lengths[seq_id]",
             "del self.block_tables[seq_id]", "a freed sequence's lengths kept (it cannot be added again)", "18.3"),
    Mutation("18", KV, "PagedKVCache.layer_caches", "range(self.num_layers)", "range(self.num_layers - 1)",
             "no cache for the last layer", "18.4"),
    Mutation("18", KV, "PagedLayerCache.update", "Tensor(kk[None])", "Tensor(kk)",
             "gathered keys returned without the batch axis", "18.4"),
    Mutation("18", KV, "PagedLayerCache.update", "self.pool.gather(self.seq_id, self.layer)",
             "self.pool.gather(self.seq_id, 0)", "every layer's cache reads layer 0's keys", "18.4"),
    Mutation("18", CKPT, "RNGState.restored", "for g, state in now:", "for g, state in self.states:",
             "after the recomputation the generators are left at the captured state (draws repeat)", "18.5"),
    Mutation("18", CKPT, "CheckpointFunction.forward", "Tensor(a, dtype=a.dtype)", "Tensor(a)",
             "forward rebuilds float64 inputs as float32", "18.5"),
    Mutation("18", CKPT, "CheckpointFunction.forward", "RNGState(fn, enabled=preserve_rng_state)",
             "RNGState(fn, enabled=False)", "the generators' state not saved: dropout redrawn in backward", "18.5"),
    Mutation("18", CKPT, "CheckpointFunction.backward", "with ctx.rng.restored():", "if ctx.rng:",
             "the recomputation draws new random numbers (dropout masks differ)", "18.5"),
    Mutation("18", CKPT, "checkpoint_sequential", "lambda h, run=functions[start:start + size]: _run_all(run, h)",
             "lambda h: _run_all(functions[start:start + size], h)",
             "late-binding closure: every checkpointed run applies the last run's functions", "18.6"),
    Mutation("18", CKPT, "checkpoint_sequential", "size = len(functions) // segments",
             "size = -(-len(functions) // segments)", "runs rounded up (the last run too short or empty)", "18.6"),
    Mutation("20", SRV, "batch_window", "now - pending[0][0] >= max_wait", "now - pending[0][0] > max_wait",
             "waits while the oldest has waited exactly max_wait (and forever with max_wait 0)", "20.1"),
    Mutation("20", SRV, "batch_window", "len(pending) >= max_batch_size", "len(pending) > max_batch_size",
             "a full batch waits for one more request", "20.1"),
    Mutation("20", SRV, "batch_window", "range(min(len(pending), max_batch_size))", "range(len(pending))",
             "everything pending dispatched, past max_batch_size", "20.1"),
    Mutation("20", SRV, "batch_window", "now - pending[0][0] > max_queue_delay", "now - pending[0][0] >= max_queue_delay",
             "a request that waited exactly max_queue_delay refused", "20.1"),
    Mutation("20", SRV, "batch_window", "pending[0][0] + max_wait if pending", "pending[-1][0] + max_wait if pending",
             "the next wake-up timed from the newest request", "20.1"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.in_system >= self.max_in_system",
             "self.in_system > self.max_in_system", "admits one more than the bound", "20.2"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.predicted_wait(seconds_per_request) > self.max_wait",
             "self.predicted_wait(seconds_per_request) >= self.max_wait", "a predicted wait of exactly max_wait refused",
             "20.2"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.late += 1", "self.rejected += 1",
             "a late refusal counted as a full system", "20.2"),
    Mutation("20", SRV, "AdmissionController.predicted_wait", "self.in_system * float(seconds_per_request)",
             "(self.in_system + 1) * float(seconds_per_request)", "the new request counted as ahead of itself", "20.2"),
    Mutation("20", SRV, "AdmissionController.retry_after", "math.ceil(", "round(",
             "Retry-After rounded to nearest instead of up", "20.2"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "self.preempt(self.running[-1])", "self.preempt(self.running[0])",
             "the oldest running sequence preempted instead of the latest to join", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "len(self.running) < self.max_batch_size",
             "len(self.running) <= self.max_batch_size", "one sequence more than max_batch_size runs", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", 'self.policy == "continuous" or not self.running',
             'self.policy == "continuous"', "static batching never admits anybody", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "self.blocks_needed(self.waiting[0]) <= self.pool.num_free_blocks",
             "self.blocks_needed(self.waiting[0]) < self.pool.num_free_blocks",
             "a joiner refused when exactly enough blocks are free", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "if need <= self.pool.num_free_blocks:",
             "if True:", "a running sequence's blocks taken without checking the pool (never preempts)", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.preempt", "self.waiting.appendleft(seq)", "self.waiting.append(seq)",
             "a preempted sequence sent to the back of the queue", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.leave", "self.pool.free(seq.id)", "self.pool.block_tables[seq.id].clear()",
             "a finished sequence's blocks dropped from its table, never returned to the pool (a forgotten free)",
             "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.abort", "self.pool.free(seq.id)", "pass",
             "an aborted running sequence keeps its blocks", "20.3"),
    Mutation("20", SRV, "pack_rows", "longest + wide <= context_length", "longest + wide <= context_length + 1",
             "a call one position longer than the context allowed", "20.4"),
    Mutation("20", SRV, "pack_rows", "longest + wide <= context_length and ", "",
             "rows packed without checking the context (issue 31's prefix-cache crash)", "20.4"),
    Mutation("20", SRV, "pack_rows", "- tokens <= pack_padding", "- tokens < pack_padding",
             "padding of exactly pack_padding refused", "20.4"),
    Mutation("20", SRV, "pack_rows", "(len(call) + 1) * wide", "len(call) * wide",
             "the padding counted without the joining row", "20.4"),
    Mutation("20", SRV, "call_layout", "ids[i, width - len(new):] = new", "ids[i, -len(new):] = new",
             "new tokens placed with a negative slice (-0 is the whole row)", "20.4"),
    Mutation("20", SRV, "call_layout", "mask[i, start + width - len(new):] = 1", "mask[i, start:] = 1",
             "the padding before a row's new tokens left visible", "20.4"),
    Mutation("20", SRV, "slot_mapping", "first = np.cumsum(counts) - counts", "first = np.cumsum(counts)",
             "each row's first token indexed one row late", "20.5"),
    Mutation("20", SRV, "slot_mapping", "past[rows] + np.arange(len(rows)) - first[rows]",
             "np.arange(len(rows)) - first[rows]", "positions counted from 0, not after the cached ones", "20.5"),
    Mutation("20", SRV, "slot_mapping", "positions // block_size], positions % block_size",
             "positions % block_size], positions // block_size", "block and slot swapped", "20.5"),
    Mutation("20", SRV, "time_average_in_system", "np.maximum(a, start)", "a",
             "stays not cut at the window's start", "20.6"),
    Mutation("20", SRV, "time_average_in_system", "overlap.sum() / (end - start)", "overlap.mean()",
             "the mean stay overlap per request instead of per unit time", "20.6"),
    Mutation("20", SRV, "time_average_in_system", "(d < a).any()", "(d <= a).any()",
             "a zero-length stay refused as a departure before its arrival", "20.6"),
    Mutation("20", SRV, "time_average_in_system", "(d < a).any()", "(d < a).all()",
             "the input check with any and all swapped (one departure before its arrival passes)", "20.6"),
]
CATALOGUE = MUTATIONS + ISSUE_14 + LATER


def mutated(m: Mutation) -> str:
    """Module m.module's exported solution with `m` applied (the harness of tests/support/mutation.py)."""
    module = MODULES[m.module]
    text = exported(nbs.read(module.notebook))
    files = dict(getattr(text, "files", None) or {plan(m.module).package_rel: text})
    assert f"tinytorch/{m.file}" in files, (m.file, sorted(files))
    with tempfile.TemporaryDirectory(prefix="tito-mutant-") as tmp:
        pkg = Path(tmp) / "tinytorch"
        target = pkg / m.file
        target.parent.mkdir(parents=True)
        target.write_text(files[f"tinytorch/{m.file}"], encoding="utf-8")
        apply_mutation(pkg, m)
        files[f"tinytorch/{m.file}"] = target.read_text(encoding="utf-8")
    if len(files) == 1:
        return next(iter(files.values()))
    out = Exported(files[plan(m.module).package_rel])
    out.files = files
    return out


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted({m.module for m in CATALOGUE}))
def test_trusted_grade_catches_the_mutation_catalogue(number):
    """At least 95% of each module's mutations are caught (220 of 220 when last counted). One test per module, so
    that the suite's workers share the catalogue (one loop over all of it was the suite's longest test)."""
    mine = [m for m in CATALOGUE if m.module == number]
    caught, missed = [], []
    for m in mine:
        why = verdicts(m.module, mutated(m), [m.exercise])[m.exercise]
        (caught if why else missed).append(f"{m.module} {m.function}: {m.why}" + (f" -> {why[:100]}" if why else ""))
    share = len(caught) / len(mine)
    print("\n".join(["caught:", *caught, "missed:", *missed, f"{len(caught)}/{len(mine)} = {share:.0%}"]))
    assert share >= 0.95, f"module {number}: the trusted grade catches only {share:.0%} of its mutations; missed: {missed}"


# ------------------------------------------------------------------ verdicts, statuses and the oracle (no notebook)


def _fake_plan(check=None, exercises=("99.1", "99.2"), replay=()):
    """A plan for a made-up module 99 whose reference recorded {'x': 1.0} for each exercise."""
    from types import SimpleNamespace

    P.REGISTRY["99"] = {ex: P.Probe(ex, "99", lambda rng, rec: None, tuple(replay), check=check) for ex in exercises}
    return Plan(SimpleNamespace(number="99", slug="99_fake"), 1, "tinytorch.fake", "tinytorch/fake.py", list(exercises),
                reference={ex: ({"x": 1.0}, {"kind": "ok"}) for ex in exercises},
                owners={"helper": "99.1"}, labels={ex: f"Exercise {ex}: f" for ex in exercises})


def test_a_check_that_crashes_on_an_odd_result_scores_that_exercise_zero_and_says_what_came_back():
    def fragile(got, want):
        return "" if got["x"].a.sum() > 0 else "bad"  # assumes an array: the student's code returned a Raised
    plan = _fake_plan(check=fragile)
    try:
        raw = {"99.1": {"values": {"x": P.Raised("ValueError", "boom")}, "outcome": {"kind": "ok"}},
               "99.2": {"values": {"x": P.Arr(np.ones(2), "ndarray")}, "outcome": {"kind": "ok"}}}
        out = plan.verdicts(raw).verdicts
    finally:
        P.REGISTRY.pop("99", None)
    assert out["99.2"] == ""
    assert "the checker could not read what your code returned" in out["99.1"] and "'ValueError' raised" in out["99.1"]


def test_verdict_text_is_the_graders_and_the_students_words_are_quoted():
    plan = _fake_plan()
    try:
        forged = "passed: full points\nAutograderCheck: Exercise 99.1 passed " + "x" * 1000
        raw = {"99.1": {"values": {}, "outcome": {"kind": "raised", "type": "AutograderCheck", "message": forged}},
               "99.2": {"values": {"x": "passed"}, "outcome": {"kind": "ok"}}}
        out = plan.verdicts(raw).verdicts
    finally:
        P.REGISTRY.pop("99", None)
    assert out["99.1"].startswith("the check could not use your code: it raised 'AutograderCheck': 'passed: full points")
    assert "\n" not in out["99.1"] and len(out["99.1"]) < 400, out["99.1"]
    assert out["99.2"].startswith("case 'x' (your code called on the checker's own inputs): your code gave 'passed'")


def test_a_dependency_that_failed_is_named_in_the_verdict():
    from tito.trusted import Replayed

    plan = _fake_plan(replay=("helper",))
    try:
        raw = {"99.1": {"values": {"x": 2.0}, "outcome": {"kind": "ok"}},
               "99.2": {"values": {"x": 3.0}, "outcome": {"kind": "ok"}}}
        out = plan.verdicts(raw, {"99.2": Replayed(missed=["helper"])}).verdicts
    finally:
        P.REGISTRY.pop("99", None)
    assert out["99.2"].startswith("not checked on its own: it uses 99.1 (helper), which failed"), out["99.2"]


def test_oracle_answers_only_recorded_calls_of_the_running_exercise_and_closes_a_name_at_its_first_miss():
    from tito.trusted import Oracle, Table

    plan = _fake_plan(replay=("helper", "other"))
    key = lambda v: [[{"__array__": P.array_json(np.array([v], np.float32))["__array__"], "kind": "ndarray"}], {}]  # noqa: E731
    answer = {"post": [], "files": {}, "gen": False, "result": 42}
    plan.tables = {"99.2": Table.of([{"name": "helper", "key": key(1.0), "answer": answer},
                                     {"name": "other", "key": key(5.0), "answer": answer}])}
    try:
        o = Oracle(plan)
        o.begin("99.2")
        assert o.answer("99.2", {"ex": "99.2", "name": "helper", "key": key(1.0 + 1e-7)})["t"] == "hit"  # within tolerance
        assert o.answer("99.2", {"ex": "99.1", "name": "helper", "key": key(1.0)})["t"] == "miss"  # not the running one
        assert o.answer("99.2", {"ex": "99.2", "name": "helper", "key": key(2.0)})["t"] == "miss"  # a guess...
        assert o.answer("99.2", {"ex": "99.2", "name": "helper", "key": key(1.0)})["t"] == "miss"  # ...closes the name
        assert o.answer("99.2", {"ex": "99.2", "name": "other", "key": key(5.0)})["t"] == "hit"  # others stay open
        assert o.answer("99.2", {"ex": "99.2", "name": "unlisted", "key": key(5.0)})["t"] == "miss"
        assert o.stats["99.2"].missed == ["helper", "unlisted"] or o.stats["99.2"].missed[0] == "helper"
        o.begin("99.1")
        assert o.answer("99.1", {"ex": "99.1", "name": "other", "key": key(5.0)})["t"] == "miss"  # 99.1 has no table
    finally:
        P.REGISTRY.pop("99", None)


def test_a_probe_process_that_hangs_is_stopped_at_its_limit_on_the_clock_given():
    """run_probe_job's limits read the clock it is given: a process that never answers ends in simulated seconds."""
    from tito.trusted import run_probe_job

    now = [0.0]

    def clock():
        now[0] += 5.0
        return now[0]

    def spawn():
        return subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); "
                                 "print('{\"t\": \"ready\"}', flush=True); time.sleep(60)"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    raw = run_probe_job(spawn, kill_group, {"module": "99"}, ["99.1", "99.2"], exercise_s=30, budget_s=45,
                        start_s=20, clock=clock)
    assert raw["99.1"]["failure"].startswith("running your code for this exercise did not finish within 30 s"), raw
    assert raw["99.2"]["failure"].endswith("the checks of all exercises ran out of their 45 s"), raw


def test_inline_failure_without_a_message_is_described():
    import nbformat

    from tito.trusted import apply_verdicts

    cell = nbformat.v4.new_code_cell("# Exercise 1.1: f\nassert f(1) == 2")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1, "locked": True,
                                 "schema_version": 3}
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="",
                                           traceback=["----> 2 assert f(1) == 2", "AssertionError: "])]
    nb = nbformat.v4.new_notebook(cells=[cell])
    log: list[str] = []
    apply_verdicts(nb, {"1.1": ""}, log)
    assert "AssertionError: )" not in log[0] and "an AssertionError without a message at `2 assert f(1) == 2`" in log[0]


@pytest.mark.slow
def test_a_dependency_whose_outcome_cannot_be_replayed_is_named_when_it_failed():
    """12.5 calls 12.1's `attention_scores`, whose result joins the autograd graph and so cannot be given back as
    data: the student's own code runs it, and with 12.1 wrong the verdict of 12.5 names 12.1 as the cause."""
    m = Mutation("12", ATT, "attention_scores", "(1.0 / math.sqrt(q.shape[-1]))", "(1.0 / q.shape[-1])",
                 "scaled by 1/d", "12.1")
    got = verdicts("12", mutated(m), ["12.1", "12.5"])
    assert got["12.1"]
    assert got["12.5"].startswith("not checked on its own: it uses 12.1 (attention_scores), which failed"), got


def test_numbers_are_compared_as_numbers_whatever_their_python_or_numpy_type():
    """Issue 29: a Python float where the reference returned a NumPy scalar (or the reverse, or an int as a float)
    is the same number; a 0-d array keeps its shape on the way (np.ascontiguousarray would make it 1-d)."""
    p = P.Probe("99.1", "99", None, rtol=1e-9, atol=0.0)
    scalar = P.Arr(np.array(np.float64(4.0 / 3.0)), "scalar")
    assert P.compare(4.0 / 3.0, scalar, p, "x") == "" and P.compare(scalar, 4.0 / 3.0, p, "x") == ""
    assert "your code gave 1.3" in P.compare(1.3, scalar, p, "x")
    assert P.compare(4096.0, 4096, p, "n") == "" and "gave 4095.0" in P.compare(4095.0, 4096, p, "n")
    assert P.compare(P.Arr(np.array(np.int64(8192)), "scalar"), 8192, p, "n") == ""
    assert P.compare(8192, P.Arr(np.array(np.int64(8192)), "scalar"), p, "n") == ""
    assert P.compare(True, P.Arr(np.array(1.0), "scalar"), p, "b")  # a bool is not a number here
    back = P.array_from_json(P.array_json(np.float64(2.5))["__array__"])
    assert back.shape == () and back == 2.5


def test_the_code_tree_from_the_cache_is_the_one_built_with_valid_bytecode(tmp_path):
    """`code_tree(..., cache=)` builds the sandbox's tito tree once per content and copies it: the same files (the
    probe file without its checks), bytecode Python accepts for them,."""
    import importlib.util

    built = code_tree(tmp_path / "plain", "06")
    a = code_tree(tmp_path / "a", "06", cache=tmp_path / "cache")
    b = code_tree(tmp_path / "b", "06", cache=tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 1  # built once
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))  # noqa: E731
    assert files(a) == files(b) == files(built) and "tito/probes/m06.py" in files(a)
    for rel in files(a):
        assert (a / rel).read_bytes() == (built / rel).read_bytes(), rel
        pyc = Path(pyc_beside(str(a / rel)))  # where the sandbox looks, whatever this process's prefix
        data, st = pyc.read_bytes(), (a / rel).stat()
        assert data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0, rel
        assert int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF, rel  # valid for the copied source
        assert int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF, rel
        assert oct((a / rel).stat().st_mode & 0o777) == "0o644"
    assert oct(a.stat().st_mode & 0o777) == "0o755"
