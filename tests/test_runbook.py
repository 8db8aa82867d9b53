"""A grading run's gradebook work (tito.grading.RunBook) writes what nbgrader's own preprocessors write.

The run reads the release's records once, opens every submission in one transaction and commits the scores
with the results file; nbgrader's OverwriteCells, OverwriteKernelspec, SaveAutoGrades and AssignLatePenalties
query and commit per cell and per submission. Here the same submissions go through both (no sandbox: the
"executed" notebooks are made here), one student each way, and the notebooks, grades, comments, late
penalties and scores must be the same; what a run has not committed is not in the gradebook yet.
"""
from __future__ import annotations

import copy
import datetime as dt

import nbformat
import pytest

from tests.test_grading import INSTRUCTOR, course  # noqa: F401  (the course fixture)
from tito import grading
from tito import notebooks as nbs
from tito.course import Settings, get_module

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]


def _submission(release, tamper: bool):
    """The release as a student hands it in: a kernelspec of their own and, with `tamper`, a locked test cell
    edited and a graded cell's points raised (nbgrader's OverwriteCells puts both back)."""
    nb = copy.deepcopy(release)
    nb.metadata["kernelspec"] = {"name": "someone-elses", "display_name": "Other", "language": "python"}
    if tamper:
        tests = [c for c in nb.cells if nbs.is_test_cell(c)]
        tests[0].source += "\nassert True  # edited"
        tests[1].metadata.nbgrader["points"] = 99
    return nb


def _executed(nb):
    """Outputs as a worker would return them: the first graded cell fails, the second warns on stderr (tito's
    verdict: it keeps its points), the rest pass."""
    nb = copy.deepcopy(nb)
    tests = [c for c in nb.cells if nbs.is_test_cell(c)]
    tests[0].outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="no", traceback=["no"])]
    tests[1].outputs = [nbformat.v4.new_output("stream", name="stderr", text="a warning\n")]
    return nb


def _nbgraders_way(settings, module, student, nb, ts):
    from nbgrader.preprocessors import AssignLatePenalties, OverwriteCells, OverwriteKernelspec

    with grading._new_gradebook(settings) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(module.slug, student, timestamp=ts)
    resources = grading._resources(settings, module, student)
    for pp in (OverwriteKernelspec(), OverwriteCells()):
        nb, resources = pp.preprocess(nb, resources)
    prepared = copy.deepcopy(nb)
    nb = _executed(nb)
    nb, resources = grading.TitoSaveAutoGrades().preprocess(nb, resources)
    nb, resources = AssignLatePenalties().preprocess(nb, resources)
    return prepared


def _runs_way(settings, module, student, nb, ts, gb):
    book = grading.RunBook(gb, module)
    assert book.open_submissions({student: ts}) == {}
    resources = grading._resources(settings, module, student)
    book.overwrite_kernelspec(nb)
    nb, resources = book.overwrite_cells(nb, resources)
    prepared = copy.deepcopy(nb)
    book.save_grades(_executed(nb), resources)
    return book, prepared


def _record(settings, module, student):
    """What the gradebook holds for one submission (read afresh, with nbgrader's own API)."""
    with grading._new_gradebook(settings) as gb:
        sub = gb.find_submission(module.slug, student)
        nb = gb.find_submission_notebook(module.notebook.stem, module.slug, student)
        return {"timestamp": sub.timestamp, "score": sub.score, "max_score": sub.max_score,
                "late": nb.late_submission_penalty, "needs_manual_grade": nb.needs_manual_grade, "flagged": nb.flagged,
                "extension": sub.extension,
                "grades": sorted((g.name, g.auto_score, g.manual_score, g.needs_manual_grade) for g in nb.grades),
                "comments": sorted((c.name, c.auto_comment) for c in nb.comments)}


@pytest.mark.parametrize("tamper", [False, True])
def test_a_runs_gradebook_writes_what_nbgraders_preprocessors_write(course, tamper):  # noqa: F811
    settings = Settings.load(course)
    module = get_module(course, "01")
    release = nbs.read(grading.generate(settings, module))
    with grading._new_gradebook(settings) as gb:  # a due date, so that a late submission is one
        gb.update_or_create_assignment(module.slug, duedate=dt.datetime(2026, 1, 1))
    late = dt.datetime(2026, 1, 2, 12, 0)

    ours = _nbgraders_way(settings, module, "plain", _submission(release, tamper), late)
    with grading._new_gradebook(settings) as gb:
        book, theirs = _runs_way(settings, module, "run", _submission(release, tamper), late, gb)
        before = _record(settings, module, "run")["grades"]
        assert before and all(g[1] is None for g in before), "scores are committed with the results, not before"
        score = book.score("run")
        book.commit()
    assert theirs == ours, "OverwriteCells and OverwriteKernelspec answered from the run's records differ"
    if tamper:
        assert theirs.cells != _submission(release, tamper).cells  # the tampered cell and points were put back
    a, b = _record(settings, module, "plain"), _record(settings, module, "run")
    assert a == b
    assert score == (a["score"], a["max_score"])
    assert 0 < a["score"] < a["max_score"], a
    assert a["timestamp"] == late


def test_a_failed_submission_is_flagged_as_before(course):  # noqa: F811
    settings = Settings.load(course)
    module = get_module(course, "01")
    grading.generate(settings, module)
    with grading._new_gradebook(settings) as gb:
        book = grading.RunBook(gb, module)
        assert book.open_submissions({"a": None, "b": None}) == {}
        book.flag("a", None, zero=True)
        names = sorted(book.grades["a"])
        book.flag("b", names[:1], zero=False)
        book.commit()
    a, b = _record(settings, module, "a"), _record(settings, module, "b")
    assert all(g[1] == 0 and g[3] for g in a["grades"]), a
    assert dict((g[0], g[3]) for g in b["grades"])[names[0]] and all(g[1] is None for g in b["grades"]), b
    assert a["score"] == 0 and a["max_score"] > 0


def _score_into(book, settings, module, student, release):
    resources = grading._resources(settings, module, student)
    nb = _submission(release, False)
    book.overwrite_kernelspec(nb)
    nb, resources = book.overwrite_cells(nb, resources)
    book.save_grades(_executed(nb), resources)
    return book.score(student)


def test_scores_are_committed_with_the_results_file_and_a_killed_runs_others_are_graded_again(course):  # noqa: F811
    """A run's gradebook writes are batched: the results saver commits them before each write of the results file
    (every few seconds, and at the end). Killed between two writes (SIGKILL: no flush), the gradebook holds the scores
    of the results on disk and nothing of the others, which the next run grades again; a submission's score is what
    the gradebook says it is, a person's manual score and extra credit included."""
    import json

    settings = Settings.load(course)
    module = get_module(course, "01")
    release = nbs.read(grading.generate(settings, module))
    now = [0.0]
    results: dict = {}
    with grading._new_gradebook(settings) as gb:
        book = grading.RunBook(gb, module)
        assert book.open_submissions({"a": None, "b": None}) == {}
        saver = grading.ResultsSaver(settings, module, results, every_s=10.0, clock=lambda: now[0], commit=book.commit)
        for student in ("a", "b"):
            score, top = _score_into(book, settings, module, student, release)
            results[student] = grading.Outcome(student, score, top)
            saver.changed()  # a: written (the first result) and committed; b: held, 1 s later
            now[0] += 1.0
        # killed here: neither saver.flush nor a commit (closing the gradebook drops what was not committed)
    on_disk = json.loads(grading.results_path(settings, module).read_text())["students"]
    assert sorted(on_disk) == ["a"]
    a, b = _record(settings, module, "a"), _record(settings, module, "b")
    assert a["score"] == on_disk["a"]["score"] > 0 and all(g[1] is not None for g in a["grades"]), a
    assert b["score"] == 0 and all(g[1] is None for g in b["grades"]), b

    with grading._new_gradebook(settings) as gb:  # the next run grades b again
        book = grading.RunBook(gb, module)
        assert book.open_submissions({"b": None}) == {}
        score = _score_into(book, settings, module, "b", release)
        book.commit()
    assert score == (_record(settings, module, "b")["score"], _record(settings, module, "b")["max_score"]) == \
        (a["score"], a["max_score"])

    with grading._new_gradebook(settings) as gb:  # a person grades one cell by hand, with extra credit
        grade = gb.find_submission_notebook(module.notebook.stem, module.slug, "a").grades[0]
        grade.manual_score, grade.extra_credit = 0.5, 1.25
        gb.db.commit()
    with grading._new_gradebook(settings) as gb:
        book = grading.RunBook(gb, module)
        assert book.open_submissions({"a": None}) == {}
        assert book.score("a") == (_record(settings, module, "a")["score"], a["max_score"])
        assert book.score("a")[0] != a["score"]
