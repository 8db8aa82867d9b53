"""The references hold without PyTorch, and the package tests can fail.

- With torch hidden (as in a student edition), module 06's package tests pass on the package and
  skip nothing, and fail on a copy with one wrong gradient rule (`gelu_backward` missing its factor
  3, `var_backward` dividing by N - 1): before the torch-free references, both passed there.
- A catalogue of realistic one-line bugs of modules 06-09 (`tests/support/mutation.py`), each run
  against its module's package tests with torch hidden: every one must be caught.
- Every module's package tests fail on the released stubs (the package exported from the release
  notebooks), as `tests/test_notebooks.py` proves for the graded cells.
"""
from __future__ import annotations

import shutil
from pathlib import Path
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.mutation import MUTATIONS, Mutation, copy_edition, mutated_edition, run_module_tests
from tito import notebooks as nbs
from tito.course import Settings, load_modules

ROOT = Path(__file__).resolve().parents[1]

IS_INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
instructor_only = pytest.mark.skipif(not IS_INSTRUCTOR, reason="needs the instructor edition (solutions)")
MODULES = load_modules(ROOT)

GELU = next(m for m in MUTATIONS if m.function == "gelu_backward")
VAR = next(m for m in MUTATIONS if m.function == "var_backward")


def describe(run) -> str:
    return f"{run.passed} passed, {run.failed} failed, {run.skipped} skipped, {run.errors} errors:\n{run.output[-3000:]}"


def test_hiding_torch_works():
    import subprocess

    code = "import tests.support.no_torch\ntry:\n    import torch.nn\nexcept ImportError:\n    print('hidden')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "hidden", f"tests.support.no_torch did not hide torch: {out.stdout} {out.stderr[-500:]}"


@pytest.mark.slow
def test_module_06_without_torch_passes_and_skips_nothing():
    with mutated_edition(ROOT) as copy:
        run = run_module_tests(copy, "06", hide_torch=True)
    assert run.returncode == 0 and run.failed == 0, f"module 06 without torch: {describe(run)}"
    assert run.skipped == 0, f"module 06 without torch skipped {run.skipped} tests: {run.skip_reasons}"
    assert run.passed >= 90, f"module 06 without torch ran only {run.passed} tests"


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("bug", [GELU, VAR], ids=["gelu_backward", "var_backward"])
def test_module_06_without_torch_catches_a_wrong_rule(bug):
    with mutated_edition(ROOT, bug) as copy:
        run = run_module_tests(copy, "06", hide_torch=True, extra_args=["-x"])
    assert run.caught, f"module 06's tests (torch hidden) pass with {bug.function} changed ({bug.why}): {describe(run)}"


@pytest.mark.slow
@instructor_only
def test_mutation_catalogue_is_caught_without_torch(capsys):
    """Each realistic bug of 06-09 fails its module's package tests, torch hidden; prints the catch rate."""
    def run_one(bug: Mutation):
        with mutated_edition(ROOT, bug) as copy:
            return bug, run_module_tests(copy, bug.module, hide_torch=True, extra_args=["-x"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run_one, MUTATIONS))
    missed = [bug.name for bug, run in results if not run.caught]
    with capsys.disabled():
        print(f"\nmutation catalogue (torch hidden): {len(results) - len(missed)} of {len(results)} caught")
    assert not missed, f"these bugs pass their module's package tests without torch: {missed}"


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """An edition whose package is exported from every module's release notebook (solutions stubbed)."""
    dest = tmp_path_factory.mktemp("released") / "edition"
    copy_edition(ROOT, dest)
    for m in MODULES:
        folder = dest / "modules" / m.slug
        folder.mkdir(parents=True)
        shutil.copy2(m.folder / "module.toml", folder / "module.toml")
        nbs.write(nbs.release(nbs.read(m.notebook)), folder / m.notebook.name)
    nbs.export(dest)
    return dest


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("chunk", [MODULES[i::3] for i in range(3)], ids=["chunk0", "chunk1", "chunk2"])
def test_package_tests_fail_on_the_released_stubs(released, chunk):
    for m in chunk:
        assert "NotImplementedError" in m.package_file(released).read_text(), f"{m.slug}: the release holds no stubs"
    passing = []
    for m in chunk:
        run = run_module_tests(released, m.number, hide_torch=True, extra_args=["-x"])
        if not run.caught:
            passing.append(f"{m.slug}: {describe(run)}")
    assert not passing, "these modules' package tests pass on the unfilled release, so they cannot fail:\n" + \
        "\n".join(passing)
