"""Compare a worked notebook's graded cells with its release, and restore them.

A student may delete, edit or re-tag a graded test cell (by accident or not). Scoring such a
notebook as it stands would silently give a partial (or full) score; this module names every
difference so that the student loop and the autograder can restore the cell or flag the submission.

    problems = compare_graded_cells(worked_nb, release_nb)   # [] when every graded cell is intact
    fixed, problems = restore_graded_cells(worked_nb, release_nb)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import nbformat

from .notebooks import exercise_label, is_test_cell, nbgrader_meta

# kinds of problem, worst first
MISSING, CHANGED, METADATA = "missing", "changed", "metadata"


@dataclass(frozen=True)
class CellProblem:
    grade_id: str
    label: str  # what a person sees: "Exercise 3.2: Linear.forward" (the test cell's first comment)
    kind: str  # missing | changed | metadata
    detail: str

    def __str__(self) -> str:
        return f"{self.label} [{self.grade_id}]: {self.detail}"


def graded_cells(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """grade_id -> cell for every autograder test cell of `nb`."""
    return {nbgrader_meta(c)["grade_id"]: c for c in nb.cells
            if is_test_cell(c) and nbgrader_meta(c).get("grade_id")}


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


@dataclass(frozen=True)
class ReleaseCell:
    grade_id: str
    label: str
    points: object
    source: str  # as released
    norm: str  # `_norm(source)`


class Release:
    """The release's side of the comparison (its graded cells, labels, points and normalized sources), computed once
    from one release notebook and reused for every submission of a grading run (`released`): each submission's
    comparison computed it again (about a third of `compare_graded_cells`). It holds what it was computed from: a
    changed release is a new notebook, read again, and so a new `Release`."""

    def __init__(self, nb: nbformat.NotebookNode) -> None:
        self.notebook = nb
        self.cells = [ReleaseCell(gid, exercise_label(c), nbgrader_meta(c).get("points"), c.source, _norm(c.source))
                      for gid, c in graded_cells(nb).items()]
        self.grade_ids = {nbgrader_meta(c).get("grade_id") for c in nb.cells if nbgrader_meta(c)}  # every kind of cell


def released(release) -> Release:
    """`release` (a release notebook, or its `Release` already) as a `Release`."""
    return release if isinstance(release, Release) else Release(release)


def compare_graded_cells(worked: nbformat.NotebookNode, release) -> list[CellProblem]:
    """Every graded test cell of `release` (the release notebook, or its `Release`) that is missing, edited or
    re-tagged in `worked`.

    A cell is found by its grade_id first, then (when its metadata was damaged) by its source, so a
    cell whose grade_id or points changed is reported as `metadata`, not as `missing`.
    """
    problems: list[CellProblem] = []
    mine = graded_cells(worked)
    by_source = None  # the worked notebook's code cells by normalized source: only when a graded cell is not found
    for ref in released(release).cells:
        gid, label = ref.grade_id, ref.label
        cell = mine.get(gid)
        if cell is None:
            if by_source is None:
                by_source = {_norm(c.source): c for c in worked.cells if c.cell_type == "code"}
            twin = by_source.get(ref.norm)
            if twin is None:
                problems.append(CellProblem(gid, label, MISSING, "the graded test cell was deleted"))
            else:
                md = nbgrader_meta(twin)
                problems.append(CellProblem(gid, label, METADATA,
                                            f"the test cell's nbgrader metadata was changed (grade_id "
                                            f"{md.get('grade_id')!r}, grade {md.get('grade')!r}; release: {gid!r})"))
            continue
        md = nbgrader_meta(cell)
        if md.get("points") != ref.points:
            problems.append(CellProblem(gid, label, METADATA,
                                        f"points changed from {ref.points} to {md.get('points')}"))
        if cell.source != ref.source and _norm(cell.source) != ref.norm:
            problems.append(CellProblem(gid, label, CHANGED, "the test cell's code was edited"))
    return problems


def restore_graded_cells(worked: nbformat.NotebookNode, release) -> tuple[nbformat.NotebookNode, list[CellProblem]]:
    """A copy of `worked` whose graded test cells are the release's again, and what was restored (`release`: the
    release notebook, or its `Release`).

    Edited or re-tagged cells are replaced in place; a deleted cell is put back after the cell that
    precedes it in the release (or at the end when that one is gone too). The student's own cells
    are never touched.
    """
    release = released(release)
    problems = compare_graded_cells(worked, release)
    if not problems:
        return worked, []
    out = copy.deepcopy(worked)
    broken = {p.grade_id for p in problems}
    rel_cells = release.notebook.cells
    rel_index = {nbgrader_meta(c).get("grade_id"): i for i, c in enumerate(rel_cells) if is_test_cell(c)}
    for gid in sorted(broken, key=lambda g: rel_index[g]):
        ref = copy.deepcopy(rel_cells[rel_index[gid]])
        pos = _find(out, gid, ref)
        if pos is not None:
            out.cells[pos] = ref
            continue
        # deleted: insert after the nearest earlier release cell that is still here
        insert_at = len(out.cells)
        for j in range(rel_index[gid] - 1, -1, -1):
            k = _find(out, nbgrader_meta(rel_cells[j]).get("grade_id"), rel_cells[j])
            if k is not None:
                insert_at = k + 1
                break
        out.cells.insert(insert_at, ref)
    return out, problems


def _find(nb: nbformat.NotebookNode, gid: str | None, ref) -> int | None:
    """Index of the cell in `nb` that stands for release cell `ref` (same grade_id, else same source)."""
    if gid:
        for i, c in enumerate(nb.cells):
            if nbgrader_meta(c).get("grade_id") == gid:
                return i
    src = _norm(ref.source)
    for i, c in enumerate(nb.cells):
        if c.cell_type == ref.cell_type and _norm(c.source) == src:
            return i
    return None
