"""A simulated class for the instructor loop: submissions made from a module's release and its source.

`make_class(module, kinds)` returns {file name: notebook text} in the shape an LMS download has
(`<student>_<NN_name>.ipynb`), and `EXPECTED[kind]` says what the autograder must report for it.
Everything is derived from `tito.notebooks.release(source)` and the source notebook, so the class
follows the notebooks as they change.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import nbformat

from tito import notebooks as nbs
from tito.course import Module


@dataclass
class Expect:
    status: str  # the status word the autograder must give (graded, needs review, failed, timed out, kernel died)
    score: str  # "max", "zero", "partial" (strictly between), "first" (points of the first test cell), "max-first-sol"
    reason: str = ""  # a fragment the status or log must contain


def _solutions(source) -> dict[str, str]:
    return {nbs.nbgrader_meta(c)["grade_id"]: c.source for c in source.cells if nbs.is_solution_cell(c)}


def correct(release, source):
    nb = copy.deepcopy(release)
    sols = _solutions(source)
    for c in nb.cells:
        if nbs.is_solution_cell(c):
            c.source = sols[nbs.nbgrader_meta(c)["grade_id"]]
    return nb


def _tests(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if nbs.is_test_cell(c)]


def _sol_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if nbs.is_solution_cell(c) and c.cell_type == "code"]


def _insert_after_first_test(nb, code: str):
    nb.cells.insert(_tests(nb)[0] + 1, nbformat.v4.new_code_cell(code))
    return nb


def stub(release, source):
    return copy.deepcopy(release)


def partial(release, source):
    nb = correct(release, source)
    i = _sol_cells(nb)[0]
    nb.cells[i] = copy.deepcopy(release.cells[i])
    return nb


def syntax_error(release, source):
    nb = correct(release, source)
    i = _sol_cells(nb)[0]
    nb.cells[i].source += "\n    return (1, 2\n"
    return nb


def import_error(release, source):
    nb = correct(release, source)
    first = next(c for c in nb.cells if c.cell_type == "code" and "import" in c.source)
    first.source = "import tinytorch_no_such_module\n" + first.source
    return nb


def tampered(release, source):
    nb = stub(release, source)
    i = _tests(nb)[0]
    nb.cells[i].source = "# Exercise: all good\nprint('all tests passed')"
    return nb


def deleted_test(release, source):
    nb = correct(release, source)
    del nb.cells[_tests(nb)[-1]]
    return nb


def changed_grade_id(release, source):
    nb = correct(release, source)
    nb.cells[_tests(nb)[0]].metadata.nbgrader.grade_id = "my_renamed_cell"
    return nb


def changed_points(release, source):
    nb = correct(release, source)
    nb.cells[_tests(nb)[0]].metadata.nbgrader.points = 100
    return nb


def solution_metadata(release, source):
    nb = correct(release, source)
    del nb.cells[_sol_cells(nb)[0]].metadata.nbgrader["grade_id"]
    return nb


def infinite_loop(release, source):
    return _insert_after_first_test(correct(release, source), "while True:\n    pass")


def stubborn_loop(release, source):
    """An infinite loop that swallows the interrupt: only the notebook's own limit stops it."""
    return _insert_after_first_test(correct(release, source),
                                    "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n"
                                    "    except KeyboardInterrupt:\n        pass")


def big_allocation(release, source):
    return _insert_after_first_test(correct(release, source),
                                    "import numpy as np\nhuge = np.ones(20 * 2**30 // 8)  # 20 GiB")


def exits(release, source):
    return _insert_after_first_test(correct(release, source), "import os\nos._exit(3)")


def warns(release, source):
    """Correct, and every later cell writes a warning to stderr (nbgrader alone would fail those cells)."""
    return _insert_after_first_test(correct(release, source), (
        "import warnings\nwarnings.simplefilter('always')\n"
        "get_ipython().events.register('pre_run_cell', lambda info: warnings.warn('this may be slow'))"))


def source_hook(release, source):
    """Correct, and a hook prints the source of every later cell (the hidden tests included) as it runs."""
    return _insert_after_first_test(correct(release, source), (
        "get_ipython().events.register('pre_run_cell', lambda info: print('SOURCE:', info.raw_cell))"))


def hidden_marker(release, source):
    """Correct; a solution cell merely contains the hidden-test marker's text in a comment."""
    nb = correct(release, source)
    nb.cells[_sol_cells(nb)[0]].source += "\n# note to self: " + nbs.BEGIN_HIDDEN + " is how the tests hide"
    return nb


def big_print(release, source):
    return _insert_after_first_test(correct(release, source), "print('x' * 5_000_000)")


def visible_failure(release, source):
    """The first solution returns None right away: a visible assert of the first test fails."""
    nb = correct(release, source)
    cell = nb.cells[_sol_cells(nb)[0]]
    lines = cell.source.splitlines()
    i = next(k for k, ln in enumerate(lines) if nbs.BEGIN_SOLUTION in ln)
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines.insert(i + 1, indent + "return None")
    cell.source = "\n".join(lines)
    return nb


def fork_bomb(release, source):
    """Starts processes until the operating system refuses (bounded: it stops at the first refusal)."""
    return _insert_after_first_test(correct(release, source), (
        "import subprocess\nprocs = []\ntry:\n    for _ in range(5000):\n"
        "        procs.append(subprocess.Popen(['sleep', '30']))\n"
        "except OSError as e:\n    print(f'refused after {len(procs)} processes: {type(e).__name__}')\n"
        "for p in procs:\n    p.kill()\n    p.wait()"))


KINDS: dict[str, tuple[Callable, Expect]] = {
    "correct": (correct, Expect("graded", "max")),
    "stub": (stub, Expect("graded", "zero")),
    "partial": (partial, Expect("graded", "partial")),
    "syntax": (syntax_error, Expect("graded", "partial-or-zero")),
    "importerr": (import_error, Expect("graded", "zero")),
    "tampered": (tampered, Expect("needs review", "zero", "graded test cell edited")),
    "deleted": (deleted_test, Expect("needs review", "max", "graded test cell deleted")),
    "gradeid": (changed_grade_id, Expect("needs review", "max", "metadata changed")),
    "points": (changed_points, Expect("needs review", "max", "metadata changed")),
    "solmeta": (solution_metadata, Expect("needs review", "max", "graded from its code")),
    # a cell past its limit stops the run, as in `tito test`: the later cells are not run
    "loop": (infinite_loop, Expect("timed out", "first", "(after Exercise")),  # the cell named by the exercise it follows
    "stubborn": (stubborn_loop, Expect("timed out", "first", "the run stopped there")),
    "bigalloc": (big_allocation, Expect("graded", "max", "MemoryError")),
    "exits": (exits, Expect("kernel died", "first", "kernel died")),
    "truncated": (None, Expect("failed", "zero", "cannot be read")),
    "warns": (warns, Expect("graded", "max", "this may be slow")),
    "hook": (source_hook, Expect("graded", "max", "SOURCE:")),
    "marker": (hidden_marker, Expect("graded", "max")),
    "bigprint": (big_print, Expect("graded", "max", "characters of output were cut")),
    "visible": (visible_failure, Expect("graded", "partial-or-zero", "AssertionError")),
    "forkbomb": (fork_bomb, Expect("graded", "max", "refused after")),
}


def make_class(module: Module, kinds: list[str], release=None) -> dict[str, str]:
    """{`<kind>_<NN_name>.ipynb`: text} for each kind (the student id is the kind)."""
    source = nbs.read(module.notebook)
    release = release if release is not None else nbs.release(source)
    out = {}
    for kind in kinds:
        make, _ = KINDS[kind]
        if make is None:  # truncated JSON: a correct notebook cut in the middle
            text = nbformat.writes(correct(release, source))
            out[f"{kind}_{module.slug}.ipynb"] = text[: len(text) // 2]
            continue
        out[f"{kind}_{module.slug}.ipynb"] = nbformat.writes(make(release, source))
    return out


def first_test_points(module: Module) -> float:
    source = nbs.read(module.notebook)
    return float(nbs.nbgrader_meta(source.cells[_tests(source)[0]])["points"])
