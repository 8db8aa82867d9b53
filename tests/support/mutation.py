"""A small mutation harness: does a module's package test file catch a realistic one-line bug?

    from tests.support.mutation import Mutation, mutated_edition, run_module_tests

    bug = Mutation("06", "core/autograd.py", "gelu_backward", "3 * 0.044715", "0.044715", "GELU's factor 3 dropped")
    with mutated_edition(ROOT, bug) as copy:
        result = run_module_tests(copy, "06", hide_torch=True)
    assert result.failed

A `Mutation` names a function of a package file and one exact fragment of one line inside it (it must
occur exactly once in that function, so a mutation that no longer applies fails loudly instead of
testing the unchanged code). `mutated_edition` copies the package and the tests to a temporary
folder (the repository's `tinytorch/`, `tests/` and the pytest configuration) and applies the
mutation there; `run_module_tests` runs `tests/modules/test_NN_*.py` against that copy in a fresh
interpreter (the copy's `tests/conftest.py` puts the copy first on `sys.path`, and the harness checks
that the copy's package is the one imported), optionally with PyTorch hidden as in a student edition.
`MUTATIONS` holds a catalogue of realistic bugs for modules 06-09, 11 and 13; the grading mutation
suite (tests/test_trusted.py, whose catalogue adds bugs of 06-20) reuses the whole machinery.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.warm_pytest import WRONG_PACKAGE, WarmPytest
from pathlib import Path


@dataclass(frozen=True)
class Mutation:
    module: str  # the module whose package tests should catch it ("06")
    file: str  # the package file, relative to tinytorch/ ("core/autograd.py")
    function: str  # the function (or "Class.method") whose body holds the fragment
    old: str  # an exact fragment of one line of that function
    new: str  # its replacement
    why: str  # the bug, in words
    exercise: str = ""  # the exercise whose tests should catch it ("6.9"): `run_module_tests(..., exercise=)`

    @property
    def name(self) -> str:
        return f"{self.module}:{self.function}:{self.why}"


# CPython 3.11's AST constructor is not safe to run from several threads at once ("AST constructor
# recursion depth mismatch"); the catalogue is applied from a thread pool.
_AST_LOCK = threading.Lock()


def _function_span(source: str, function: str) -> tuple[int, int]:
    """(first, end) 0-based line indices of the body of `function` ('name' or 'Class.method') in
    `source`, its docstring left out (a fragment in the docstring is not code)."""
    import ast

    cls, _, name = function.rpartition(".")
    with _AST_LOCK:
        scope = ast.parse(source).body
    if cls:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise LookupError(f"class {cls} not found")
        scope = found[0].body
    defs = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not defs:
        raise LookupError(f"def {name} not found" + (f" in class {cls}" if cls else ""))
    body = defs[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        body = body[1:]
    return body[0].lineno - 1, defs[0].end_lineno


def apply_mutation(package: Path, m: Mutation) -> str:
    """Apply `m` to the package at `package` (a `tinytorch/` folder) in place; returns the mutated line.

    Raises LookupError when the fragment is not in the function exactly once (the code changed:
    update the mutation)."""
    path = package / m.file
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    first, end = _function_span(source, m.function)
    hits = [i for i in range(first, end) if m.old in lines[i]]
    if len(hits) != 1 or lines[hits[0]].count(m.old) != 1:
        raise LookupError(f"mutation {m.name}: {m.old!r} occurs {len(hits)} times in {m.function} of {m.file}; "
                          "expected exactly once (the code changed: update the mutation)")
    i = hits[0]
    lines[i] = lines[i].replace(m.old, m.new)
    path.write_text("".join(lines), encoding="utf-8")
    return lines[i].strip()


def copy_edition(root: Path, dest: Path) -> Path:
    "The package, the tests and the pytest configuration of the edition at `root`, copied to `dest`."
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tinytorch", "tests"):
        shutil.copytree(root / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "settings.ini"):
        if (root / name).exists():
            shutil.copy2(root / name, dest / name)
    return dest


@contextmanager
def mutated_edition(root: Path, *mutations: Mutation):
    "A temporary copy of the edition at `root` with `mutations` applied (none: the package as it is)."
    with tempfile.TemporaryDirectory(prefix="tinytorch-mutant-") as tmp:
        copy = copy_edition(Path(root), Path(tmp) / "edition")
        for m in mutations:
            apply_mutation(copy / "tinytorch", m)
        yield copy


@dataclass
class TestRun:
    returncode: int
    passed: int
    failed: int
    skipped: int
    errors: int
    skip_reasons: list[str]
    output: str

    @property
    def caught(self) -> bool:
        "The tests failed (a collection error counts: the package did not even import)."
        return self.returncode != 0 and (self.failed > 0 or self.errors > 0)


def module_test_file(root: Path, module: str) -> Path:
    found = sorted((Path(root) / "tests" / "modules").glob(f"test_{module}_*.py"))
    if len(found) != 1:
        raise LookupError(f"expected one tests/modules/test_{module}_*.py in {root}; found {found}")
    return found[0]


def _count(text: str, word: str) -> int:
    m = re.search(rf"(\d+) {word}", text)
    return int(m.group(1)) if m else 0


def run_module_tests(edition: Path, module: str, hide_torch: bool = True, extra_args=(), timeout: float = 600,
                     env: dict | None = None, exercise: str = "", shrink: bool = False) -> TestRun:
    """Run module `module`'s package tests against the edition at `edition`, as in a fresh interpreter.

    `hide_torch`: as in a student edition (`-p tests.support.no_torch`). `extra_args`: more pytest
    arguments (`-x` to stop at the first failure); `exercise`: only that exercise's tests
    (`--exercise 6.9`, the tests a grader would run for it). As `tito test` runs them (its report and its
    hypothesis profile), a failing property test stops at its first failing example unless `shrink`: whether
    a bug is caught does not depend on it, and shrinking a 50-step optimizer run took 6 s per bug. Checks
    that `edition`'s own package was tested."""
    edition = Path(edition).resolve()
    test_file = module_test_file(edition, module)
    args = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:xdist", "-p", "no:randomly",
            "--hypothesis-seed=0", str(test_file.relative_to(edition)), *extra_args]
    if exercise:
        args += ["--exercise", exercise]
    if not shrink:
        args.append(f"--tito-report={edition / '.tito-report.json'}")
    if hide_torch:
        args[3:3] = ["-p", "tests.support.no_torch"]
    run_env = dict(os.environ if env is None else env)
    run_env["PYTHONPATH"] = os.pathsep.join([str(edition)] + [p for p in run_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    run_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    run_env["PYTHONDONTWRITEBYTECODE"] = "1"
    # in a child of the warm pytest process (tests/support/warm_pytest.py), which checks that the copy's package is
    # the one imported: as `python -m pytest` in a fresh interpreter, without importing pytest and hypothesis again
    returncode, stdout, stderr = _warm().run(args[3:], edition, run_env, timeout)
    if returncode == WRONG_PACKAGE:
        raise RuntimeError(stderr[-500:])
    out = stdout + stderr
    tail = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    reasons = re.findall(r"^SKIPPED \[\d+\] (.+)$", out, flags=re.M)
    return TestRun(returncode, _count(tail, "passed"), _count(tail, "failed"), _count(tail, "skipped"),
                   _count(tail, "error"), reasons, out)


def _warm():
    global _WARM
    if _WARM is None:
        import atexit

        _WARM = WarmPytest()
        atexit.register(_WARM.close)
    return _WARM


_WARM = None


def graded_cells_failing(root: Path, module: str, m: Mutation, timeout: float = 120) -> list[str]:
    """The graded cells (their labels, "Exercise 13.6: GPT.generate") that fail when `m` is applied to
    module `module`'s source notebook under `root`: the notebook-side twin of `run_module_tests`.

    The fragment is replaced in the solution cell that holds it (its last occurrence there: code comes
    after the docstrings); hidden tests stay (the autograder restores them); the cells after the last
    graded one (the systems analysis) are left out to keep it short."""
    from tito import notebooks as nbs

    [path] = sorted((Path(root) / "modules").glob(f"{module}_*/{module}_*.ipynb"))
    nb = nbs.read(path)
    hits = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and nbs.is_solution_cell(cell) and m.old in cell.source:
            head, _, tail = cell.source.rpartition(m.old)
            cell.source, hits = head + m.new + tail, hits + 1
    if hits != 1:
        raise LookupError(f"mutation {m.name}: found in {hits} solution cells of {path.name}; expected exactly one")
    last = max(i for i, cell in enumerate(nb.cells) if nbs.is_test_cell(cell))
    nb.cells = nb.cells[:last + 1]
    report = nbs.execute(path, Path(root), timeout=timeout, source=nb)
    if report.fatal:
        raise RuntimeError(f"{path.name} with {m.name}: {report.fatal}")
    return [c.label for c in report.tests if not c.ok]


# ---------------------------------------------------------------------------------------------
# Realistic one-line bugs of modules 06-09 (each a fragment of one line of the instructor solution)
# ---------------------------------------------------------------------------------------------
AUTOGRAD, OPTIM, TRAIN, SPATIAL = "core/autograd.py", "core/optimizers.py", "core/training.py", "core/spatial.py"
EMB, GPT = "text/embeddings.py", "models/gpt.py"

MUTATIONS: list[Mutation] = [
    Mutation("06", AUTOGRAD, "gelu_backward", "3 * 0.044715", "0.044715", "the derivative of x^3 missing its factor 3",
             "6.9"),
    Mutation("06", AUTOGRAD, "var_backward", "(2.0 / count)", "(2.0 / (count - 1))", "dividing by N - 1", "6.6"),
    Mutation("06", AUTOGRAD, "sigmoid_backward", "s * (1 - s)", "(1 - s)", "sigma' written as 1 - sigma", "6.9"),
    Mutation("06", AUTOGRAD, "mean_backward", "/ count", "/ x.size", "mean over an axis divided by the whole size", "6.6"),
    Mutation("06", AUTOGRAD, "softmax_backward", ".sum(axis=axis, keepdims=True)", ".sum()",
             "the softmax correction summed over every axis", "6.9"),
    Mutation("07", OPTIM, "SGD.step", "(1.0 - self.dampening) * d", "d", "dampening ignored", "7.3"),
    Mutation("07", OPTIM, "Adam.step", "(1.0 - beta1 ** t)", "(1.0 - beta1 ** (t + 1))", "bias correction one step ahead",
             "7.4"),
    Mutation("07", OPTIM, "Adam.step", "(1.0 - beta2) * (g * g)", "(1.0 - beta2) * g", "second moment of g, not g^2", "7.4"),
    Mutation("08", TRAIN, "StepLR.lr_at", "(t // self.step_size)", "((t + 1) // self.step_size)", "decays one epoch early",
             "8.1"),
    Mutation("08", TRAIN, "CosineAnnealingLR.lr_at", "math.pi * t", "math.pi * (t + 1)", "cosine shifted by one epoch", "8.1"),
    Mutation("08", TRAIN, "clip_grad_norm_", "max_norm / (total + 1e-6)", "max_norm / (total * total + 1e-6)",
             "scaled by the squared norm", "8.2"),
    Mutation("09", SPATIAL, "col2im", "grad[:, :, rows, cols] +=", "grad[:, :, rows, cols] =",
             "overlapping windows overwrite instead of adding", "9.3"),
    Mutation("09", SPATIAL, "AvgPool2dFunction.backward", "] += share", "] = share",
             "overlapping windows overwrite instead of adding", "9.6"),
    Mutation("09", SPATIAL, "BatchNorm2d.forward", "var * (m / (m - 1))", "var", "running variance biased", "9.7"),
    Mutation("09", SPATIAL, "BatchNorm2d.forward", "batch_stats=self.training", "batch_stats=True",
             "batch statistics in eval mode", "9.7"),
    # modules 11 and 13 (the graded cells of their notebooks catch the same bugs: tests/test_notebooks.py)
    Mutation("11", EMB, "EmbeddingLookup.backward", "np.add.at(grad_weight, ids.reshape(-1), ",
             "grad_weight.__setitem__(ids.reshape(-1), grad_weight[ids.reshape(-1)] + ",
             "buffered += loses repeated ids", "11.2"),
    Mutation("11", EMB, "LearnedPositionalEmbedding.forward", "self.weight[start_pos:start_pos + seq]", "self.weight[:seq]",
             "start_pos ignored", "11.4"),
    Mutation("11", EMB, "sparse_embedding_grad", "np.add.at(values, inverse.reshape(-1), ",
             "values.__setitem__(inverse.reshape(-1), ", "repeated ids overwrite instead of adding", "11.5"),
    Mutation("13", GPT, "LayerNormFunction.forward", "(centred * centred).mean(axis=-1, keepdims=True)",
             "(centred * centred).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)", "variance divided by N - 1", "13.1"),
    Mutation("13", GPT, "LayerNormFunction.backward", " - xhat * (g * xhat).mean(axis=-1, keepdims=True)", "",
             "the variance path of the gradient dropped", "13.2"),
    Mutation("13", GPT, "TransformerBlock.forward", "x = x + self.drop(", "x = self.drop(", "attention residual missing",
             "13.3"),
    Mutation("13", GPT, "TransformerBlock.forward", "return x + self.mlp(", "return self.mlp(", "MLP residual missing",
             "13.3"),
    Mutation("13", GPT, "sample_next", "logits = logits / temperature", "logits = logits", "temperature ignored", "13.4"),
    Mutation("13", GPT, "sample_next", "logits < kth", "logits <= kth", "top-k keeps k - 1 tokens", "13.4"),
    Mutation("13", GPT, "GPT.forward", "positions=positions", "positions=None", "padding positions not passed on", "13.5"),
    Mutation("13", GPT, "GPT.forward", "cache=layer_cache", "cache=None", "layer caches not passed on", "13.5"),
    Mutation("13", GPT, "GPT.generate", "sample_next(logits, temperature, top_k, rng)",
             "sample_next(logits, 1.0, top_k, rng)", "generate ignores the temperature", "13.6"),
    Mutation("13", GPT, "GPT.generate", "sample_next(logits, temperature, top_k, rng)",
             "sample_next(logits, temperature, top_k, as_generator(seed))", "a fresh generator from the seed each step",
             "13.6"),
]
