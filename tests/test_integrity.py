"""Graded cells of a worked notebook compared with the release: missing, edited, re-tagged, restored."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tito import notebooks as nbs
from tito.integrity import CHANGED, METADATA, MISSING, compare_graded_cells, restore_graded_cells

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def release():
    return nbs.release(nbs.read(ROOT / "modules" / "03_layers" / "03_layers.ipynb"))


def test_graded_cells(release):
    ids = [nbs.nbgrader_meta(c)["grade_id"] for c in release.cells if nbs.is_test_cell(c)]
    assert len(ids) >= 3, f"expected several graded cells in module 03, found {ids}"


def _test_positions(nb):
    return [i for i, c in enumerate(nb.cells) if nbs.is_test_cell(c)]


def test_intact_notebook_has_no_problems(release):
    worked = copy.deepcopy(release)
    for c in worked.cells:  # the student's own edits do not matter
        if nbs.is_solution_cell(c):
            c.source += "\n# my work"
    assert compare_graded_cells(worked, release) == []
    assert restore_graded_cells(worked, release)[1] == []


def test_deleted_cell_is_named_and_restored_in_place(release):
    worked = copy.deepcopy(release)
    i = _test_positions(worked)[1]
    gone = worked.cells.pop(i)
    problems = compare_graded_cells(worked, release)
    assert [(p.kind, p.grade_id) for p in problems] == [(MISSING, nbs.nbgrader_meta(gone)["grade_id"])]
    assert problems[0].label.startswith("Exercise"), problems[0].label
    fixed, _ = restore_graded_cells(worked, release)
    assert [c.source for c in fixed.cells] == [c.source for c in release.cells]


def test_edited_cell_and_changed_points(release):
    worked = copy.deepcopy(release)
    i, j = _test_positions(worked)[:2]
    worked.cells[i].source = "# Exercise 3.1: nothing\nprint('all tests passed')"
    worked.cells[j].metadata.nbgrader.points = 100
    kinds = sorted(p.kind for p in compare_graded_cells(worked, release))
    assert kinds == sorted([CHANGED, METADATA])
    fixed, _ = restore_graded_cells(worked, release)
    assert compare_graded_cells(fixed, release) == []


def test_changed_grade_id_is_metadata_not_missing(release):
    worked = copy.deepcopy(release)
    i = _test_positions(worked)[0]
    worked.cells[i].metadata.nbgrader.grade_id = "renamed"
    problems = compare_graded_cells(worked, release)
    assert [p.kind for p in problems] == [METADATA], problems
    fixed, _ = restore_graded_cells(worked, release)
    assert compare_graded_cells(fixed, release) == []
    assert len(fixed.cells) == len(release.cells)
