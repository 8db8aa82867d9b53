"""Notebook mechanics shared by the CLI and the tests: read, check, release, execute, export.

- `release()` turns an instructor source notebook into the student version with nbgrader's own
  preprocessors (solutions become stubs, hidden tests go, outputs go, checksums are recorded).
- `execute()` runs a notebook top to bottom in a fresh kernel the way nbgrader's autograder does
  (every cell runs, errors included) and reports each graded test cell: points, passed or not, and
  why, naming the function to fix when a stub raised `NotImplementedError`.
- `export()` runs nbdev's exporter on one notebook or all of them.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .course import CODE_STUB, CourseError, edition_env

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
NOT_IMPLEMENTED_MARK = "__tito_not_implemented__:"
GRADE_ID_RE = re.compile(r"^[a-zA-Z0-9_\-]+$")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Runs first, in the kernel, before the notebook's own cells: when a stub raises
# NotImplementedError, print the qualified name of the function that raised it.
_SETUP_CELL = f"""
def __tito_not_implemented(shell, etype, evalue, tb, tb_offset=None):
    frame_tb = tb
    while frame_tb.tb_next is not None:
        frame_tb = frame_tb.tb_next
    print({NOT_IMPLEMENTED_MARK!r} + frame_tb.tb_frame.f_code.co_qualname, flush=True)
    shell.showtraceback((etype, evalue, tb), tb_offset=tb_offset)
get_ipython().set_custom_exc((NotImplementedError,), __tito_not_implemented)
import matplotlib
matplotlib.use("Agg")
del __tito_not_implemented
"""


def read(path: Path) -> nbformat.NotebookNode:
    """Read a notebook, turning a damaged file into a CourseError that says what to do."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CourseError(f"notebook {path} does not exist") from None
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as e:  # nbformat raises several types for broken JSON
        raise CourseError(
            f"notebook {path} cannot be read: {e}. If you cannot repair it in an editor, "
            f"`tito module reset` backs it up and restores the starting version"
        ) from None
    return nb


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    from .progress import atomic_write_text

    atomic_write_text(Path(path), nbformat.writes(nb) + "\n")


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_test_cell(cell) -> bool:
    md = nbgrader_meta(cell)
    return bool(md.get("grade")) and not md.get("solution") and cell.cell_type == "code"


def is_solution_cell(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def exercise_label(cell) -> str:
    """'Exercise 1.4: Tensor.matmul' from a test cell's first comment line, else its grade_id."""
    for line in cell.source.splitlines():
        m = re.match(r"#\s*(Exercise\s+\S+.*)$", line.strip())
        if m:
            return m.group(1).strip()
        if line.strip():
            break
    return nbgrader_meta(cell).get("grade_id", "test")


def solution_regions(source: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each BEGIN/END SOLUTION region in `source`."""
    regions, current, start = [], None, 0
    for i, line in enumerate(source.splitlines(), 1):
        if BEGIN_SOLUTION in line:
            current, start = [], i
        elif END_SOLUTION in line and current is not None:
            regions.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return regions


def check_source(nb: nbformat.NotebookNode) -> list[str]:
    """Problems with a source notebook's nbgrader metadata and solution regions (empty when fine)."""
    problems, seen = [], {}
    for i, cell in enumerate(nb.cells):
        md = nbgrader_meta(cell)
        where = f"cell {i + 1}"
        src = cell.source
        if not md:
            if BEGIN_SOLUTION in src or BEGIN_HIDDEN in src:
                problems.append(f"{where}: has solution/hidden-test markers but no nbgrader metadata")
            continue
        gid = md.get("grade_id")
        where = f"cell {i + 1} ({gid})"
        if md.get("schema_version") != 3:
            problems.append(f"{where}: nbgrader schema_version must be 3, got {md.get('schema_version')!r}")
        if not gid or not GRADE_ID_RE.match(str(gid)):
            problems.append(f"{where}: grade_id {gid!r} must be non-empty letters, digits, _ or -")
        elif gid in seen:
            problems.append(f"{where}: grade_id {gid!r} is also used by cell {seen[gid]}")
        else:
            seen[gid] = i + 1
        if md.get("grade") and not isinstance(md.get("points"), (int, float)):
            problems.append(f"{where}: a graded cell needs numeric points")
        if md.get("grade") and md.get("solution") is False and not md.get("locked"):
            problems.append(f"{where}: test cells must be locked")
        if md.get("solution") and cell.cell_type == "code":
            if src.count(BEGIN_SOLUTION) != src.count(END_SOLUTION) or BEGIN_SOLUTION not in src:
                problems.append(f"{where}: a solution cell needs matching {BEGIN_SOLUTION} / {END_SOLUTION} markers "
                                f"(without them nbgrader blanks the whole cell, #| export line included)")
            for start, lines in solution_regions(src):
                for k, line in enumerate(lines, 1):
                    if re.match(r"\s*(async\s+def|def|class)\s", line):
                        problems.append(f"{where} line {start + k}: `{line.strip()}` is inside a solution region; "
                                        "keep def/class lines outside so the release still imports")
        if not md.get("solution") and (BEGIN_SOLUTION in src):
            problems.append(f"{where}: solution markers in a cell that is not a solution cell")
        if BEGIN_HIDDEN in src and not is_test_cell(cell):
            problems.append(f"{where}: hidden tests in a cell that is not an autograder test cell")
    return problems


def release(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version of a source notebook, made by nbgrader's preprocessors (no gradebook needed)."""
    from nbgrader.preprocessors import (
        CheckCellMetadata, ClearHiddenTests, ClearMarkScheme, ClearOutput, ClearSolutions,
        ComputeChecksums, LockCells,
    )

    out = copy.deepcopy(nb)
    resources: dict = {}
    for pp in (LockCells(), ClearSolutions(code_stub={"python": CODE_STUB}), ClearOutput(), CheckCellMetadata(), ComputeChecksums(),
               ClearHiddenTests(), ClearMarkScheme(), ComputeChecksums(), CheckCellMetadata()):
        out, resources = pp.preprocess(out, resources)
    return out


def strip_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return out


# ---------------------------------------------------------------- execution and grading


@dataclass
class CellResult:
    index: int  # 0-based position in the notebook
    grade_id: str | None
    label: str
    is_test: bool
    points: float
    status: str = "passed"  # passed | failed | not_implemented | error | not_run
    ename: str = ""
    evalue: str = ""
    function: str = ""  # qualified name when a stub raised NotImplementedError
    line: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def reason(self) -> str:
        if self.status == "not_implemented":
            return f"not implemented yet: {self.function}"
        if self.status == "not_run":
            return self.evalue or "not run"
        if self.ename == "SyntaxError" or self.ename == "IndentationError":
            return f"{self.ename} on line {self.line}: {self.evalue}" if self.line else f"{self.ename}: {self.evalue}"
        if self.ename == "AssertionError":
            return self.evalue or "an assertion failed (no message)"
        text = f"{self.ename}: {self.evalue}" if self.evalue else self.ename
        return text


@dataclass
class Report:
    notebook: Path
    cells: list[CellResult] = field(default_factory=list)
    fatal: str = ""  # the kernel died or could not start

    @property
    def tests(self) -> list[CellResult]:
        return [c for c in self.cells if c.is_test]

    @property
    def errors(self) -> list[CellResult]:
        """Non-test cells that raised (a syntax error in a solution cell, say)."""
        return [c for c in self.cells if not c.is_test and c.status not in ("passed", "not_run")]

    @property
    def score(self) -> float:
        return sum(c.points for c in self.tests if c.ok)

    @property
    def max_score(self) -> float:
        return sum(c.points for c in self.tests)

    @property
    def passed(self) -> bool:
        return not self.fatal and all(c.ok for c in self.tests) and not self.errors


def _result_for(i: int, cell) -> CellResult:
    md = nbgrader_meta(cell)
    test = is_test_cell(cell)
    label = exercise_label(cell) if test else (md.get("grade_id") or f"cell {i + 1}")
    res = CellResult(i, md.get("grade_id"), label, test, float(md.get("points", 0) or 0) if test else 0.0)
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            for line in out.get("text", "").splitlines():
                if line.startswith(NOT_IMPLEMENTED_MARK):
                    res.function = line[len(NOT_IMPLEMENTED_MARK):].strip()
        if out.get("output_type") == "error":
            res.ename, res.evalue = out.get("ename", ""), out.get("evalue", "")
            tb = ANSI_RE.sub("", "\n".join(out.get("traceback", [])))
            lines = re.findall(r"line (\d+)", tb)
            res.line = int(lines[-1]) if lines else None
            if res.ename in ("SyntaxError", "IndentationError"):
                m = re.search(r"line (\d+)\)?\s*$", res.evalue)
                res.line = int(m.group(1)) if m else res.line
    if res.ename == "NotImplementedError":
        res.status = "not_implemented"
        res.function = res.function or "(unknown function)"
    elif res.ename:
        res.status = "failed" if test else "error"
    return res


def execute(nb_path: Path, cwd: Path, timeout: float = 300, pythonpath: Path | None = None,
            source: nbformat.NotebookNode | None = None) -> Report:
    """Run every cell of the notebook in a fresh kernel (errors do not stop the run) and grade it.

    `pythonpath` is put first on the kernel's PYTHONPATH so that `import tinytorch` finds that
    edition's package (the student's own exported code).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = copy.deepcopy(source) if source is not None else read(nb_path)
    nb = strip_outputs(nb)
    setup = nbformat.v4.new_code_cell(_SETUP_CELL)
    setup.id = "tito-setup"
    nb.cells.insert(0, setup)
    env = edition_env(pythonpath) if pythonpath is not None else dict(os.environ, MPLBACKEND="Agg")
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    client = NotebookClient(nb, timeout=int(timeout), kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(cwd)}})
    report = Report(Path(nb_path))
    try:
        client.execute(env=env, cwd=str(cwd))
    except DeadKernelError as e:
        report.fatal = f"the Python kernel died while running the notebook ({e}); look for code that exits or uses all memory"
    except Exception as e:  # kernel could not start, or similar
        report.fatal = f"could not run the notebook: {type(e).__name__}: {e}"
    cells = nb.cells[1:]
    first_failure = None
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        res = _result_for(i, cell)
        if report.fatal and cell.get("execution_count") is None and not cell.get("outputs"):
            res.status, res.evalue = "not_run", "not run (the kernel stopped before this cell)"
        elif res.ename == "KeyboardInterrupt":
            res.status = "failed" if res.is_test else "error"
            res.evalue = f"stopped after {int(timeout)} s: the cell took too long (an infinite loop?)"
        elif res.ename == "NameError" and first_failure is not None and not res.function:
            res.evalue += f" (an earlier cell failed: fix {first_failure.label} first)"
        if res.status in ("error",) and first_failure is None:
            first_failure = res
        report.cells.append(res)
    return report


# ---------------------------------------------------------------- export


def export(root: Path, notebook: Path | None = None) -> subprocess.CompletedProcess:
    """nbdev-export one notebook (or all) into `root`/tinytorch; raises CourseError on failure."""
    code = ("import sys; from nbdev.doclinks import nbdev_export; "
            "nbdev_export(path=sys.argv[1] if len(sys.argv) > 1 else None)")
    args = [sys.executable, "-c", code] + ([str(notebook)] if notebook else [])
    env = dict(os.environ)
    env.pop("IN_TEST", None)
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise CourseError(f"nbdev could not export {notebook or 'the notebooks'}:\n{tail}")
    return proc


def generated_files(lib: Path) -> dict[str, str]:
    """Relative path -> text of every nbdev-generated Python file under `lib`."""
    out = {}
    for p in sorted(lib.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        text = p.read_text(encoding="utf-8")
        out[str(p.relative_to(lib))] = text
    return out


def solution_only_lines(nb: nbformat.NotebookNode, min_length: int = 30) -> set[str]:
    """Distinctive lines that occur only inside the solution regions of `nb` (to detect leaks)."""
    inside, outside = set(), []
    for cell in nb.cells:
        regions = solution_regions(cell.source)
        region_lines = {ln for _, lines in regions for ln in lines}
        for _, lines in regions:
            inside.update(ln.strip() for ln in lines if len(ln.strip()) >= min_length)
        outside.extend(ln for ln in cell.source.splitlines() if ln not in region_lines)
    rest = "\n".join(outside)
    return {ln for ln in inside if ln not in rest}


def all_text(path: Path) -> str:
    """The text a person would read in a file: cell sources for a notebook, the file otherwise."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".ipynb":
        try:
            nb = nbformat.reads(text, as_version=4)
            return "\n".join(c.source for c in nb.cells)
        except Exception:
            return text
    return text
