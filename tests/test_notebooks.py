"""Checks for authors: every source notebook is valid, runs green, and its release can fail.

Run one module's checks with `pytest tests/test_notebooks.py -k 02`.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tito import notebooks as nbs
from tito.course import Settings, edition_env, load_modules

ROOT = Path(__file__).resolve().parents[1]
MODULES = load_modules(ROOT)
IS_INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
instructor_only = pytest.mark.skipif(not IS_INSTRUCTOR, reason="needs the instructor edition (solutions)")
ids = [m.slug for m in MODULES]


def make_edition_copy(dest: Path, with_modules: bool = True) -> Path:
    """A minimal edition at `dest`: config, module folders and the current package."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("pyproject.toml", "settings.ini"):
        shutil.copy2(ROOT / f, dest / f)
    if with_modules:
        shutil.copytree(ROOT / "modules", dest / "modules", ignore=shutil.ignore_patterns(".*", "__pycache__"))
    shutil.copytree(ROOT / "tinytorch", dest / "tinytorch", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_there_are_modules():
    assert MODULES and MODULES[0].slug == "01_tensor"


@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_module_folder_is_complete(module):
    assert module.notebook.is_file(), f"{module.folder} must contain {module.notebook.name}"
    assert module.title, f"{module.folder}/module.toml needs a title"
    known = {m.number for m in MODULES}
    for p in module.prerequisites:
        assert p in known and p < module.number, f"{module.slug}: prerequisite {p} must be an earlier module"
    assert module.package_module and module.package_module.startswith("tinytorch."), \
        f"{module.notebook.name} needs a `#| default_exp` cell"


# Imports of a later module's code that modules/README.md documents as forward references: given code that
# reaches the later module lazily, only when a student calls it (Tensor.backward).
FORWARD_REFERENCES = {("01", "06")}


def exporting_module(package_module: str) -> str | None:
    """Number of the module whose notebook writes `tinytorch.x.y` (None for packages and modules/common)."""
    path = ROOT / Path(*package_module.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    m = re.search(r"^# %% [./]*modules/(\d\d)_", path.read_text(encoding="utf-8"), re.M)
    return m.group(1) if m else None


@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_prerequisites_cover_what_the_module_imports(module):
    """`tito test NN` in a student edition needs every module whose code the notebook or its package tests
    import to be complete: module.toml's prerequisites must name them all."""
    sources = ["".join(c.source) for c in nbs.read(module.notebook).cells if c.cell_type == "code"]
    tests = ROOT / "tests" / "modules" / f"test_{module.slug}.py"
    if tests.is_file():
        sources.append(tests.read_text(encoding="utf-8"))
    needed = {}
    for src in sources:
        for pkg in re.findall(r"^\s*(?:from|import) (tinytorch(?:\.\w+)+)", src, re.M):
            owner = exporting_module(pkg)
            if owner and owner != module.number and (module.number, owner) not in FORWARD_REFERENCES:
                needed.setdefault(owner, pkg)
    missing = {n: pkg for n, pkg in needed.items() if n not in module.prerequisites}
    assert not missing, (f"{module.slug}/module.toml: prerequisites {module.prerequisites} leave out "
                         + ", ".join(f"{n} (it imports {pkg})" for n, pkg in sorted(missing.items()))
                         + ": add them, or a student's `tito test` meets their stubs")


@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_source_metadata_is_valid(module):
    nb = nbs.read(module.notebook)
    problems = nbs.check_source(nb)
    assert not problems, "\n".join(problems)
    tests = [c for c in nb.cells if nbs.is_test_cell(c)]
    assert tests, f"{module.slug} has no graded test cells"
    if IS_INSTRUCTOR:
        assert any(nbs.BEGIN_HIDDEN in c.source for c in tests), f"{module.slug}: some graded tests should be hidden"
        assert any(nbs.is_solution_cell(c) for c in nb.cells), f"{module.slug} has no solution cells"


@instructor_only
@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_docstrings_leave_the_solution_to_the_student(module):
    """A solution's docstring gives the contract and the idea, not the code (modules/README.md)."""
    echoes = nbs.docstring_echoes(nbs.read(module.notebook))
    assert echoes, f"{module.slug}: no solution region sits inside a def or class: the docstring check has nothing to read"
    bad = [e.describe() for e in echoes if e.share > nbs.DOCSTRING_ECHO_LIMIT]
    assert not bad, (
        f"{module.slug}: these docstrings spell out more than {nbs.DOCSTRING_ECHO_LIMIT:.0%} of their solution's "
        "code; state the contract (shapes, dtype, an example, the error text) and the idea in words, name "
        "functions in hints without writing the calls, and move step-by-step help into a collapsed "
        "'Stuck?' markdown cell after the test:\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_source_stored_without_outputs(module):
    nb = nbs.read(module.notebook)
    dirty = [i + 1 for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{module.notebook} is stored with outputs in cells {dirty}: clear them before committing"


@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_module_has_a_test_suite(module):
    assert (ROOT / "tests" / "modules" / f"test_{module.slug}.py").is_file()
    assert (ROOT / "tests" / "checkpoints" / f"test_checkpoint_{module.number}.py").is_file()


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_source_executes_with_every_test_passing(module):
    report = nbs.execute(module.notebook, cwd=module.folder, pythonpath=ROOT)
    assert not report.fatal, report.fatal
    problems = [f"{c.label}: {c.reason()}" for c in report.cells if not c.ok]
    assert not problems, f"{module.slug} source notebook:\n" + "\n".join(problems)
    assert report.max_score > 0


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("module", MODULES, ids=ids)
def test_release_exports_imports_and_fails_its_tests(module, tmp_path):
    """The release holds no solution line, exports a package that imports, and both its graded cells and the
    module's package tests fail on it: the tests can fail."""
    source = nbs.read(module.notebook)
    rel = nbs.release(source)
    text = "\n".join(c.source for c in rel.cells)
    assert nbs.BEGIN_SOLUTION not in text and nbs.BEGIN_HIDDEN not in text
    for line in nbs.solution_only_lines(source):
        assert line not in text, f"solution line leaked into the release: {line}"

    edition = make_edition_copy(tmp_path / "edition", with_modules=False)
    dest = edition / "modules" / module.slug
    dest.mkdir(parents=True)
    shutil.copy2(module.folder / "module.toml", dest / "module.toml")
    nbs.write(rel, dest / module.notebook.name)
    nbs.export(edition, dest / module.notebook.name)

    pkg_file = module.package_file(edition)
    exported = pkg_file.read_text()
    assert "NotImplementedError" in exported, f"{pkg_file} should hold the stubs"
    proc = subprocess.run([sys.executable, "-c", f"import {module.package_module}"], cwd=edition,
                          capture_output=True, text=True, env=edition_env(edition))
    assert proc.returncode == 0, f"the released {module.package_module} does not import:\n{proc.stderr[-2000:]}"

    report = nbs.execute(dest / module.notebook.name, cwd=dest, pythonpath=edition, source=rel)
    assert not report.fatal, report.fatal
    passing = [c.label for c in report.tests if c.ok]
    assert not passing, f"these graded tests pass on the unfilled release, so they cannot fail: {passing}"
    assert any(c.status == "not_implemented" for c in report.tests)

    # the package tests can fail too: on the same release (earlier modules solved, torch hidden as in a student
    # edition), at a test of this module's own exercise that reports it unimplemented
    from tests.support.mutation import run_module_tests

    shutil.copytree(ROOT / "tests", edition / "tests", ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    run = run_module_tests(edition, module.number, hide_torch=True, extra_args=["-x"])
    assert run.failed and "not implemented yet" in run.output, (
        f"{module.slug}'s package tests do not fail on the unfilled release (or fail before reaching a stub): "
        f"{run.passed} passed, {run.failed} failed, {run.errors} errors:\n{run.output[-3000:]}")


@pytest.mark.slow
@instructor_only
def test_tinytorch_equals_a_fresh_export(tmp_path):
    edition = make_edition_copy(tmp_path / "edition")
    lib = edition / "tinytorch"
    for p in lib.rglob("*.py"):
        if p.read_text().startswith("# AUTOGENERATED") or p.name == "_modidx.py":
            p.unlink()
    nbs.export(edition)
    fresh, committed = nbs.generated_files(lib), nbs.generated_files(ROOT / "tinytorch")
    assert sorted(fresh) == sorted(committed), "files differ: run `nbdev-export` and commit tinytorch/"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"tinytorch/ differs from a fresh export in {stale}: run `nbdev-export` and commit"


def test_generated_files_carry_the_banner():
    for p in (ROOT / "tinytorch").rglob("*.py"):
        if p.name in ("__init__.py", "_modidx.py") or "__pycache__" in p.parts:
            continue
        first = p.read_text().splitlines()[0]
        assert re.match(r"# AUTOGENERATED! DO NOT EDIT! File to edit: .*modules/", first), \
            f"{p} is not generated from a notebook: library code lives in modules/"


# ---------------------------------------------------------------- the docstring check, on synthetic cells

_GELU_SOLUTION = '''
        ### BEGIN SOLUTION
        data = _float_data(x)
        c = math.sqrt(2 / math.pi)
        inner = c * (data + 0.044715 * data * data * data)
        return Tensor(0.5 * data * (1 + np.tanh(inner)))
        ### END SOLUTION
'''
# The APPROACH docstring module 02 had before the contract rewrite: its steps are the solution.
_GELU_APPROACH = '''"""Return a new Tensor with the (tanh-approximated) GELU of every element of `x`.

        TODO (Exercise 2.4): the formula above, vectorised, in float32.

        APPROACH:
        1. `data = _float_data(x)`; `c = math.sqrt(2 / math.pi)` (a Python float).
        2. `inner = c * (data + 0.044715 * data * data * data)`.
        3. Return `Tensor(0.5 * data * (1 + np.tanh(inner)))`.
        """'''
_GELU_CONTRACT = '''"""Return a new Tensor with the (tanh-approximated) GELU of every element of `x`.

        TODO (Exercise 2.4): the formula of the class docstring, vectorised.

        CONTRACT: float32 in, float32 out; GELU(1e4) = 1e4 and GELU(-1e4) = 0 with no warning.
        EXAMPLE: `GELU()(Tensor([0.0, 1.0]))` holds about `[0., 0.8412]`.
        HINTS: `math.sqrt` gives a Python float; `np.tanh` saturates without overflow.
        """'''


def _solution_cell(docstring: str, solution: str = _GELU_SOLUTION):
    import nbformat

    source = ("#| export\nclass GELU:\n    \"GELU: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.\"\n\n"
              f"    def forward(self, x):\n        {docstring}{solution}")
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "grade_id": "gelu", "locked": False, "schema_version": 3,
                                 "solution": True, "task": False}
    test = nbformat.v4.new_code_cell("# Exercise 2.4: GELU.forward\nassert True")
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_gelu", "locked": True, "points": 1,
                                 "schema_version": 3, "solution": False, "task": False}
    return nbformat.v4.new_notebook(cells=[cell, test])


def test_docstring_check_fails_a_docstring_that_spells_out_the_solution():
    (echo,) = nbs.docstring_echoes(_solution_cell(_GELU_APPROACH))
    assert echo.function == "GELU.forward" and echo.exercise == "Exercise 2.4"
    assert echo.share > 0.9 > nbs.DOCSTRING_ECHO_LIMIT, echo.describe()
    text = echo.describe()
    assert "Exercise 2.4 (GELU.forward)" in text and f"{echo.share:.0%}" in text and "0.044715" in text, text


def test_docstring_check_passes_a_contract_docstring():
    (echo,) = nbs.docstring_echoes(_solution_cell(_GELU_CONTRACT))
    assert echo.share < 0.2, echo.describe()  # the class docstring's formula is math, and not the method's


def test_docstring_check_reads_the_enclosing_function_and_pools_its_regions():
    two_regions = ('''"""`a = b + 1`, then `return a * 2`."""
        ### BEGIN SOLUTION
        a = b + 1
        ### END SOLUTION
        ### BEGIN SOLUTION
        return a * 2
        ### END SOLUTION
''')
    (echo,) = nbs.docstring_echoes(_solution_cell(two_regions, solution=""))
    assert (echo.reproduced, echo.total) == (9, 9), echo.describe()
    # A helper nested in the method is read with the method's docstring.
    nested = ('''"""Compute it: `a = b + 1` and `return a * 2`."""
        def helper(b):
            ### BEGIN SOLUTION
            a = b + 1
            return a * 2
            ### END SOLUTION
        return helper(x)
''')
    (echo,) = nbs.docstring_echoes(_solution_cell(nested, solution=""))
    assert echo.function == "GELU.forward.helper" and echo.share == 1.0, echo.describe()
    # A region outside every def has no docstring to compare: it is left out, not failed.
    nb = _solution_cell('"""Nothing."""\n        return x\n', solution="")
    nb.cells[0].source += "\n### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\n"
    assert [e.function for e in nbs.docstring_echoes(nb)] == []


def test_code_tokens_drop_comments_and_keep_strings_whole():
    assert nbs.code_tokens("y = f(x.data, 'a b')  # comment\n") == ["y", "=", "f", "(", "x.data", ",", "'a b'", ")"]
    assert nbs.code_tokens('raise ValueError(f"bad {x!r}: {y}")') == ["raise", "ValueError", "(", 'f"bad {x!r}: {y}"', ")"]
    assert nbs.code_tokens("it's prose (with an open bracket") == ["it", "'", "s", "prose", "(", "with", "an", "open", "bracket"]


def test_echo_share_counts_each_docstring_ngram_once():
    run = nbs.code_tokens("x = y + 1\nx = y + 1")
    assert nbs.echo_share([run], nbs.code_tokens("x = y + 1"))[:2] == (5, 10)
    assert nbs.echo_share([run], nbs.code_tokens("z = w - 2"))[:2] == (0, 10)


def test_student_init_warns_about_a_docstring_that_spells_out_the_solution():
    from tito.student import docstring_warnings

    (warning,) = docstring_warnings("02_activations", _solution_cell(_GELU_APPROACH))
    assert warning.startswith("warning: 02_activations: Exercise 2.4 (GELU.forward)"), warning
    assert docstring_warnings("02_activations", _solution_cell(_GELU_CONTRACT)) == []


def test_a_solution_line_that_another_module_gives_is_not_a_leak():
    import nbformat

    secret, shared = "secret_value = compute_the_answer(x, y)", "shared_value = the_same_line_in_two_notebooks(axis)"
    solution = _solution_cell('"""Contract."""', solution=f"\n        ### BEGIN SOLUTION\n        {secret}\n        {shared}\n"
                              "        ### END SOLUTION\n")
    given = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"def helper(axis):\n    {shared}\n    return shared_value")])
    assert {secret, shared} <= nbs.solution_only_lines(solution)
    lines = nbs.course_solution_lines([solution, given])
    assert secret in lines and shared not in lines, lines


def test_a_solution_line_of_python_keywords_and_builtins_only_is_not_a_leak():
    """`except (TypeError, ValueError):` inside a solution is in every code base: tito's own files may hold it
    (the student edition refused to build over tito/jobs.py); a line naming anything else, or a comment, is text
    of the solution."""
    generic, secret = "except (TypeError, ValueError):", "except (TypeError, ValueError):  # the ragged rows"
    named = "return isinstance(value, (TypeError, np.ndarray))"
    solution = _solution_cell('"""Contract."""', solution=f"\n        ### BEGIN SOLUTION\n        {generic}\n        {secret}\n"
                              f"        {named}\n        ### END SOLUTION\n")
    lines = nbs.solution_only_lines(solution)
    assert generic not in lines and {secret, named} <= lines, lines


# ------------------------------------------------------------------ issue 29: the student writes what the module is named for

TITLE_ALGORITHMS = {
    "14": {"perf/profiler.py": ["op_flops", "op_bytes", "roofline"]},
    "15": {"perf/quantization.py": ["to_bfloat16", "quantize"]},
    "16": {"perf/compression.py": ["prune_magnitude", "low_rank"]},
    "17": {"perf/compiler.py": ["fuse_elementwise", "loop_source"]},
    "18": {"perf/kv_cache.py": ["KVCache.update", "cached_decode", "PagedKVCache.allocate", "PagedKVCache.write",
                                "PagedKVCache.gather"], "perf/checkpoint.py": ["CheckpointFunction.backward"]},
    "19": {"perf/benchmark.py": ["bootstrap_median_ci", "pareto_front"]},
    "20": {"serving/server.py": ["batch_window", "ContinuousBatcher.schedule"]},
}


def _function_source(source: str, name: str) -> str:
    import ast

    cls, _, fn = name.rpartition(".")
    scope = ast.parse(source).body
    if cls:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fn)
    return "\n".join(source.splitlines()[node.lineno - 1:node.end_lineno])


@pytest.mark.parametrize("number", sorted(TITLE_ALGORITHMS))
def test_the_student_writes_the_title_algorithms_and_a_sixth_of_the_code(number):
    """Issue 29: at least 15% of each of 14-20's exported lines are in solution regions, and the algorithms the
    module is named for are among them (each function's body holds a solution region)."""
    module = next(m for m in MODULES if m.number == number)
    student, exported = nbs.solution_share(nbs.read(module.notebook))
    assert student >= 0.15 * exported, (f"{module.slug}: the student writes {student} of {exported} exported lines "
                                         f"({student / exported:.1%}); at least 15% expected")
    for rel, names in TITLE_ALGORITHMS[number].items():
        source = (ROOT / "tinytorch" / rel).read_text(encoding="utf-8")
        for name in names:
            assert "### BEGIN SOLUTION" in _function_source(source, name), \
                f"{module.slug}: {name} in tinytorch/{rel} has no solution region: it is given, not the student's"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.slug)
def test_exercises_are_numbered_in_the_order_a_student_meets_them(module):
    """Issue 29: the graded test cells name exercises N.1, N.2, ... in the notebook's order (17.6 and 17.7 once came
    before 17.1), none skipped."""
    met = []
    for c in nbs.read(module.notebook).cells:
        if c.cell_type == "code" and nbs.is_test_cell(c):
            for number, k in re.findall(r"Exercise (\d+)\.(\d+)", c.source.split("\n")[0]):
                assert int(number) == int(module.number), f"{module.slug}: a test cell names Exercise {number}.{k}"
                if int(k) not in met:
                    met.append(int(k))
    assert met == list(range(1, len(met) + 1)), f"{module.slug}: exercises met in the order {met}"
