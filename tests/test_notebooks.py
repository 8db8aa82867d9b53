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
