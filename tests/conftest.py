"""Shared test setup: the edition root, and the plugin that names exercises in failures."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# the milestone harness lives beside the scripts that import it (`import _harness as harness`); appended, so that
# no script's name shadows a module
if str(ROOT / "milestones") not in sys.path:
    sys.path.append(str(ROOT / "milestones"))

pytest_plugins = ["tito.pytest_plugin"]


def pytest_collection_modifyitems(config, items):
    """The end-to-end tests (marked `slow`) first, each group in its own order: the suite's workers take tests from
    the front and steal from each other at the end (`--dist worksteal`), so the many short tests even out the end
    instead of one worker finishing a long grading test while the other has nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_report_header(config):
    import tinytorch

    return f"tinytorch under test: {Path(tinytorch.__file__).parent}"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def python_env():
    """Environment for subprocesses: this edition's packages first on the path."""
    from tito.course import edition_env

    return edition_env(ROOT)
