"""Notebook mechanics shared by the CLI and the tests: read, check, release, execute, export.

- `release()` turns an instructor source notebook into the student version with nbgrader's own
  preprocessors (solutions become stubs, hidden tests go, outputs go, checksums are recorded).
- `execute()` runs a notebook top to bottom in a fresh kernel the way nbgrader's autograder does
  (every cell runs, errors included) and reports each graded test cell: points, passed or not, and
  why, naming the function to fix when a stub raised `NotImplementedError`.
- `export()` runs nbdev's exporter on one notebook or all of them.
"""
from __future__ import annotations

import ast
import builtins
import copy
import io
import keyword
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import failures
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


def solution_share(nb: nbformat.NotebookNode) -> tuple[int, int]:
    """(lines the student writes, lines exported) of a source notebook: the non-blank lines of its
    `#| export` cells, and how many of them lie inside solution regions (marker lines not counted;
    docstrings and comments count on both sides, as the student reads them with the code). The share
    says how much of what a module ships is the student's own (tests/test_notebooks.py holds the
    systems modules to at least 15%)."""
    written = exported = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.lstrip().startswith("#| export"):
            continue
        inside = False
        for line in cell.source.splitlines():
            if BEGIN_SOLUTION in line or END_SOLUTION in line:
                inside = BEGIN_SOLUTION in line
                continue
            if line.strip() and not line.lstrip().startswith("#|"):
                exported += 1
                written += inside
    return written, exported


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


def cell_labels(nb: nbformat.NotebookNode) -> list[str]:
    """What a person sees for each cell, since JupyterLab shows no cell numbers: a test cell's
    exercise (`Exercise 2.1: ReLU.forward`), else the heading above the cell, with what the cell is."""
    labels, heading, seen = [], "the notebook's first cells", {}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"#{1,6}\s+(.*\S)", line.strip())
                if m:
                    heading = m.group(1).replace("`", "").strip().strip("*_")
            labels.append(heading)
            continue
        if is_test_cell(cell):
            labels.append(exercise_label(cell))
            continue
        kind = "your solution" if is_solution_cell(cell) else "code cell"
        n = seen[(heading, kind)] = seen.get((heading, kind), 0) + 1
        labels.append(f"{heading} ({kind}{f' {n}' if n > 1 else ''})")
    return labels


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
    seconds: float = 0.0
    traceback: str = ""  # the error's traceback text (ANSI colours removed)

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
        if self.ename == "RecursionError":
            rec = failures.text_recursion(self.traceback)
            return f"RecursionError: {failures.recursion_note(*rec) if rec else failures.recursion_note(None)}"
        if self.ename == "AssertionError":
            lines = failures.message_lines(self.evalue)
            return "; ".join(lines) if lines else "an assertion failed (no message)"
        return failures.describe(self.ename, self.evalue) if self.evalue else self.ename


@dataclass
class Report:
    notebook: Path
    cells: list[CellResult] = field(default_factory=list)
    fatal: str = ""  # the kernel died or could not start
    timed_out: CellResult | None = None  # the cell that ran past the per-cell limit (the run stopped there)

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


def _result_for(i: int, cell, label: str) -> CellResult:
    md = nbgrader_meta(cell)
    test = is_test_cell(cell)
    res = CellResult(i, md.get("grade_id"), label, test, float(md.get("points", 0) or 0) if test else 0.0)
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            for line in out.get("text", "").splitlines():
                if line.startswith(NOT_IMPLEMENTED_MARK):
                    res.function = line[len(NOT_IMPLEMENTED_MARK):].strip()
        if out.get("output_type") == "error":
            res.ename, res.evalue = out.get("ename", ""), out.get("evalue", "")
            tb = ANSI_RE.sub("", "\n".join(out.get("traceback", [])))
            res.traceback = tb
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


class CellTimedOut(Exception):
    """A cell ran past the per-cell limit; the run stops there (later cells would only time out too)."""


# What happens to a cell that runs past its limit, the same in `tito test` and in the grading worker
# (tito.grade_worker), so that `tito test` scores as the autograder does: "stop" ends the run there (the
# cell fails, every later cell is not run: a loop that swallows the interrupt, or a function that loops
# for every later caller, would only make each later cell wait out its limit too); "interrupt" sends
# the kernel an interrupt and goes on with the next cell.
TIMEOUT_POLICY = "stop"


def client_class(on_timeout: str = TIMEOUT_POLICY, locate: float = 0):
    """The notebook executor of `tito test` and of autograding: nbclient without its own SIGINT/SIGTERM
    handling, applying `on_timeout` ("stop": raise CellTimedOut) to a cell past its limit. `locate`:
    seconds to wait, before stopping, for the traceback of an interrupt (where the cell was when its
    time ran out: the student's code or given code) to reach the cell's outputs."""
    import asyncio

    from nbclient import NotebookClient
    from nbclient.util import ensure_async

    if on_timeout not in ("stop", "interrupt"):
        raise ValueError(f"on_timeout={on_timeout!r} must be 'stop' or 'interrupt'")

    class Client(NotebookClient):
        async def _async_handle_timeout(self, timeout, cell=None):
            if on_timeout == "interrupt":  # nbclient's own: interrupt the kernel, record an error, go on
                self.interrupt_on_timeout = True
                return await super()._async_handle_timeout(timeout, cell)
            if locate > 0 and cell is not None and self.km is not None:
                try:
                    await ensure_async(self.km.interrupt_kernel())
                    for _ in range(int(locate * 10)):
                        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                            break
                        await asyncio.sleep(0.1)
                except Exception:  # a kernel that cannot be interrupted: stopped without its traceback
                    pass
            raise CellTimedOut(timeout)

    return Client


_client_class = client_class


def _kill_kernel(client) -> None:
    """Kill the kernel's whole process group (jupyter_client starts it in a session of its own, so
    this also ends whatever the student's code started) and drop its connection file."""
    from .proc import kill_group

    km = getattr(client, "km", None)
    if km is None:
        return
    kc = getattr(client, "kc", None)
    if kc is not None:
        try:
            kc.stop_channels()
        except Exception:  # a half-started client has nothing to stop
            pass
    process = getattr(getattr(km, "provisioner", None), "process", None)
    if process is not None:
        kill_group(process.pid)
        try:
            process.wait(timeout=10)
        except Exception:  # already reaped
            pass
    try:
        km.cleanup_connection_file()
    except Exception:  # already gone
        pass


def execute(nb_path: Path, cwd: Path, timeout: float = 300, pythonpath: Path | None = None,
            source: nbformat.NotebookNode | None = None, on_cell=None) -> Report:
    """Run every cell of the notebook in a fresh kernel (errors do not stop the run) and grade it.

    `pythonpath` is put first on the kernel's PYTHONPATH so that `import tinytorch` finds that
    edition's package (the student's own exported code). A cell running longer than `timeout`
    seconds stops the run: it and every later cell count as failed or not run. `on_cell(event,
    result_or_label, position, total)` is called with "start" (a label) before and "done" (a
    CellResult) after each code cell, for progress output. An interrupt (KeyboardInterrupt) kills
    the kernel and propagates.
    """
    import asyncio
    import time

    from nbclient.exceptions import DeadKernelError

    nb = copy.deepcopy(source) if source is not None else read(nb_path)
    nb = strip_outputs(nb)
    labels = cell_labels(nb)
    setup = nbformat.v4.new_code_cell(_SETUP_CELL)
    setup.id = "tito-setup"
    nb.cells.insert(0, setup)
    env = edition_env(pythonpath) if pythonpath is not None else dict(os.environ, MPLBACKEND="Agg")
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    client = _client_class(TIMEOUT_POLICY, locate=5)(nb, timeout=int(timeout), kernel_name="python3", allow_errors=True,
                             extra_arguments=["--IPKernelApp.log_level=ERROR"],
                             resources={"metadata": {"path": str(cwd)}})
    report = Report(Path(nb_path))
    code = [i for i, c in enumerate(nb.cells[1:]) if c.cell_type == "code" and c.source.strip()]
    results: dict[int, CellResult] = {}

    async def run() -> None:
        client.km = client.create_kernel_manager()
        await client.async_start_new_kernel(env=env, cwd=str(cwd))
        await client.async_start_new_kernel_client()
        await client.async_execute_cell(nb.cells[0], 0, execution_count=1)
        for pos, i in enumerate(code, 1):
            cell = nb.cells[i + 1]
            if on_cell:
                on_cell("start", labels[i], pos, len(code))
            t0 = time.monotonic()
            try:
                await client.async_execute_cell(cell, i + 1, execution_count=pos + 1)
            except CellTimedOut:
                res = _result_for(i, cell, labels[i])
                res.status = "failed" if res.is_test else "error"
                res.ename, res.evalue = "Timeout", timeout_message(nb.cells[1:], i, labels, code, res.traceback,
                                                                     timeout, pythonpath, results)
                res.seconds = time.monotonic() - t0
                results[i] = report.timed_out = res
                if on_cell:
                    on_cell("done", res, pos, len(code))
                return
            res = results[i] = _result_for(i, cell, labels[i])
            res.seconds = time.monotonic() - t0
            if on_cell:
                on_cell("done", res, pos, len(code))

    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda loop, context: None)  # tasks cut short by an interrupt or a dead kernel
    try:
        loop.run_until_complete(run())
    except DeadKernelError as e:
        report.fatal = f"the Python kernel died while running the notebook ({e}); look for code that exits or uses all memory"
    except KeyboardInterrupt:
        raise
    except Exception as e:  # the kernel could not start, or similar
        report.fatal = f"could not run the notebook: {type(e).__name__}: {e}"
    finally:
        _kill_kernel(client)
        loop.close()

    first_failure = None
    for i, cell in enumerate(nb.cells[1:]):
        if cell.cell_type != "code":
            continue
        res = results.get(i) or _result_for(i, cell, labels[i])
        if i not in results and cell.source.strip():
            res.status = "not_run"
            if report.timed_out is not None:
                res.evalue = f"not run: the run stopped at {report.timed_out.label}, which did not finish; fix it first"
            else:
                res.evalue = "not run (the kernel stopped before this cell)"
        elif res.ename == "NameError" and first_failure is not None and not res.function:
            res.evalue += f" (an earlier cell failed: fix {first_failure.label} first)"
        if res.status in ("error",) and first_failure is None:
            first_failure = res
        report.cells.append(res)
    return report


_CELL_FRAME = re.compile(r"^\s*(?:Cell In\[(\d+)\], line (\d+)|File (.+?\.py):(\d+))(?:, in ([\w.<>]+))?", re.M)


def running_code(cells, code: list[int], labels: list[str], traceback: str, root: Path | None = None,
                 stopped: int | None = None):
    """Who wrote the code a stopped cell was running, from the traceback of the interrupt that stopped it
    (`cells`: the notebook's cells; `code`: the positions of those that ran, in order):
    ("yours", what) when a frame of the student's code is on the stack (a function of a solution cell, or
    an earlier module's exercise in the package), ("given", what) when only given code is, (None, "")
    ("earlier", what) when the student's code on the stack is an earlier module's exercise (which passes
    its own tests), (None, "") without a traceback. `what` names the deepest such function and where it
    is; the third value is the position of its solution cell (None for package code)."""
    if not traceback:
        return None, ""
    index = None
    if root is not None:
        try:
            from .course import load_modules

            index = failures.ExerciseIndex(load_modules(Path(root)), Path(root))
        except Exception:  # no course at `root`: package frames stay unnamed
            index = None
    student, earlier, given = [], [], []
    for m in _CELL_FRAME.finditer(traceback):
        count, line, filename, _, function = m.groups()
        function = function if function and function != "<module>" else ""
        if count:
            pos = int(count) - 2  # In[1] is tito's setup cell; code cell k runs as In[k + 2]
            if not 0 <= pos < len(code):
                continue
            k = code[pos]
            where = "this cell" if k == stopped else labels[k]
            what = f"{function + ' in ' if function else ''}{where}, line {line}"
            (student if is_solution_cell(cells[k]) else given).append((what, k))
        elif filename and index is not None:
            place = index.place(filename, function)
            if place is not None:
                if place.exercise:
                    earlier.append((f"your {place.exercise} {place.function} (module {place.module}, {place.path})", None))
                else:
                    given.append((f"module {place.module}'s {place.function} ({place.path})", None))
    for who, found in (("yours", student), ("earlier", earlier), ("given", given)):
        if found:
            return who, *found[-1]
    return None, "", None


def tests_after(cells, k: int) -> list[int]:
    "Positions of the graded test cells that check solution cell `k` (those before the next solution cell)."
    out = []
    for j in range(k + 1, len(cells)):
        if is_solution_cell(cells[j]):
            break
        if is_test_cell(cells[j]):
            out.append(j)
    return out


def timeout_message(cells, i: int, labels: list[str], code: list[int], traceback: str, timeout: float,
                    root: Path | None = None, results: dict | None = None) -> str:
    """Why cell `i` was stopped, blaming the student only for their own code: the cell's section, whether
    the code running when its time ran out was the student's or given (`running_code`), and how to raise
    the limit. `results` ({position: CellResult} of the cells run before): a function of the student's
    whose tests passed, running inside a given cell, is not blamed either."""
    cell = cells[i]
    kind = ("your solution cell" if is_solution_cell(cell) else "a graded test" if is_test_cell(cell)
            else "a given cell")
    text = f"{labels[i]} ({kind}) did not finish within {timeout:g} s, the per-cell limit"
    who, what, k = running_code(cells, code, labels, traceback, root, stopped=i)
    raise_it = f"raise [execution] student_cell_timeout in settings.ini (now {timeout:g}) and run it again"
    checked = tests_after(cells, k) if k is not None and kind == "a given cell" else []
    if who == "yours" and checked and all(j in (results or {}) and results[j].ok for j in checked):
        return (f"{text}; when stopped it was running your code ({what}), whose tests passed: this given cell "
                f"does much work with it, and the machine is probably busy or slow: {raise_it}")
    if who == "yours":
        return (f"{text}; when stopped it was running your code: {what}. A loop that never ends, or far too much "
                f"work (a Python loop over every element?); if it is only slow on a busy machine, {raise_it}")
    if who == "earlier":
        return (f"{text}; when stopped it was running {what}, from an earlier module: if that module's tests ran at "
                f"their usual speed, the machine is probably busy or slow: {raise_it}")
    if who == "given":
        return (f"{text}; when stopped it was running given code, not yours: {what}. The machine is probably busy "
                f"or slow: {raise_it}")
    if kind == "a given cell":
        return (f"{text} (where it was could not be seen). This cell is given code; if the functions of yours it "
                f"calls are right, the machine is probably busy or slow: {raise_it}")
    return (f"{text} (where it was could not be seen): a loop that never ends, or far too much work? If it is only "
            f"slow on a busy machine, {raise_it}")


# ---------------------------------------------------------------- export


class ExportError(CourseError):
    """An export that was refused; the package was left as it was. `modules` names what failed."""

    def __init__(self, message: str, modules: list[str] = ()):
        super().__init__(message)
        self.modules = list(modules)


def _nbdev_paths(root: Path) -> tuple[str, str]:
    from .course import tomllib

    try:
        cfg = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["nbdev"]
    except (OSError, KeyError, ValueError) as e:
        raise CourseError(f"{root / 'pyproject.toml'} has no readable [tool.nbdev] section ({e})") from None
    return cfg.get("lib_path", "tinytorch"), cfg.get("nbs_path", "nbs")


def _package_of(nb_file: Path) -> str | None:
    try:
        nb = read(nb_file)
    except CourseError:
        return None
    for cell in nb.cells:
        m = re.search(r"^#\|\s*default_exp\s+(\S+)", cell.source, re.M)
        if m:
            return m.group(1)
    return None


def exported_cell_errors(nb_file: Path) -> list[str]:
    """A line for each `#| export` cell of the notebook that is not valid Python, naming the cell
    as JupyterLab shows it (its exercise or heading) and the line in the cell."""
    import ast

    nb = read(nb_file)
    problems = []
    for cell, label in zip(nb.cells, cell_labels(nb)):
        if cell.cell_type != "code" or not re.search(r"^#\|\s*export", cell.source, re.M):
            continue
        try:
            ast.parse(cell.source)
        except SyntaxError as e:
            text = (e.text or "").strip()
            problems.append(f"{label}: {type(e).__name__} on line {e.lineno} of the cell: {e.msg}"
                            + (f"\n    {text}" if text else ""))
    return problems


def export(root: Path, notebook: Path | None = None, import_timeout: float = 120) -> list[str]:
    """nbdev-export one notebook (or all) into `root`'s package, all or nothing.

    The export runs in a temporary copy of the package; every generated file must compile and every
    exported module must import there, and only then are the changed files moved into place (each
    with `os.replace`). Otherwise an `ExportError` says what is wrong and the package is untouched.
    Returns the package files (relative to the package folder) that changed.
    """
    import shutil
    import tempfile

    from .proc import run

    root = Path(root).resolve()
    lib_rel, nbs_rel = _nbdev_paths(root)
    lib = root / lib_rel
    notebooks = [Path(notebook).resolve()] if notebook else sorted(
        p for p in (root / nbs_rel).rglob("*.ipynb")
        if not any(part.startswith(".") for part in p.relative_to(root / nbs_rel).parts))
    for nb_file in notebooks:
        problems = exported_cell_errors(nb_file)
        if problems:
            raise ExportError(f"{nb_file.name} does not export: an exported cell is not valid Python:\n  "
                              + "\n  ".join(problems) + "\nFix it in the notebook and export again; your package "
                              "was not changed (it still holds your last good export).",
                              [f"{lib_rel}.{m}" for m in [_package_of(nb_file)] if m])
    with tempfile.TemporaryDirectory(prefix="tito-export-") as tmp:
        stage = Path(tmp)
        shutil.copy2(root / "pyproject.toml", stage / "pyproject.toml")
        if lib.exists():
            shutil.copytree(lib, stage / lib_rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # what this export starts from: only files nbdev changes here are moved into place, so an export
        # running at the same time in another terminal (another module) never gets its files overwritten
        before = generated_files_bytes(stage / lib_rel)
        for nb_file in notebooks:
            target = stage / nb_file.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(nb_file, target)
        code = ("import sys; from nbdev.doclinks import nbdev_export; "
                "nbdev_export(path=sys.argv[1] if len(sys.argv) > 1 else None)")
        args = [sys.executable, "-c", code] + ([str(stage / Path(notebook).resolve().relative_to(root))] if notebook else [])
        env = dict(os.environ)
        env.pop("IN_TEST", None)
        proc = run(args, cwd=stage, env=env)
        what = Path(notebook).name if notebook else "the notebooks"
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise ExportError(f"nbdev could not export {what}; your package was not changed:\n{tail}",
                              [f"{lib_rel}.{m}" for m in map(_package_of, notebooks) if m])

        new = generated_files_bytes(stage / lib_rel)
        changed = sorted(rel for rel, data in new.items() if before.get(rel) != data)
        for rel in changed:
            if not rel.endswith(".py"):
                continue
            try:
                compile(new[rel], f"{lib_rel}/{rel}", "exec")
            except SyntaxError as e:
                mod = f"{lib_rel}.{rel[:-3].replace(os.sep, '.')}"
                raise ExportError(
                    f"{what} exports code that does not compile: {type(e).__name__} in {lib_rel}/{rel} line "
                    f"{e.lineno}: {e.msg}\n  {(e.text or '').strip()}\nFix that cell in the notebook and export "
                    f"again; your package was not changed (it still holds your last good export).", [mod]) from None
        modules = [f"{lib_rel}.{m}" for m in map(_package_of, notebooks) if m]
        failed = _first_import_failure(stage, modules, import_timeout)
        if failed:
            mod, lines = failed
            if lines is None:
                raise ExportError(f"importing {mod} did not finish within {import_timeout:g} s: code outside any "
                                  "function runs forever. Fix the notebook and export again; your package was not "
                                  "changed.", [mod])
            where = next((ln.strip() for ln in reversed(lines) if ln.strip().startswith("File ")), "")
            raise ExportError(
                f"{what} exports code that does not import: {lines[-1] if lines else 'no message'}"
                + (f"\n  at {where}" if where else "")
                + "\nFix the notebook and export again; your package was not changed (it still holds your "
                "last good export).", [mod])
        for rel in changed:
            target = lib / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp_file = target.with_name(f".{target.name}.tito-tmp")
            shutil.copy2(stage / lib_rel / rel, tmp_file)
            os.replace(tmp_file, target)
    return changed


_IMPORT_CHECK = """\
import importlib, json, os, sys, traceback
channel = os.fdopen(os.dup(1), "w")  # the protocol; whatever the modules print goes to stderr
os.dup2(2, 1)
sys.path.insert(0, sys.argv[1])
for mod in sys.argv[2:]:
    channel.write(json.dumps({"start": mod}) + "\\n"); channel.flush()
    try:
        importlib.import_module(mod)
    except BaseException:
        lines = [ln for ln in traceback.format_exc().splitlines() if ln.strip()]
        channel.write(json.dumps({"failed": mod, "lines": lines}) + "\\n"); channel.flush()
        break
"""


def _first_import_failure(stage: Path, modules: list[str], timeout: float) -> tuple[str, list[str] | None] | None:
    """Import the staged package's `modules` in order, in one fresh process; None when all import, else
    (the first that does not, its traceback's lines, or None when its import ran past `timeout` seconds).

    One process for all of them (a process per module cost the export half a second each); each
    module's import still gets the whole `timeout`, counted from the moment it starts.
    """
    import json
    import selectors
    import time

    from .proc import kill_group

    proc = subprocess.Popen([sys.executable, "-c", _IMPORT_CHECK, str(stage), *modules], cwd=stage,
                            env=edition_env(stage), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    current, buffer, err = None, b"", []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return current or (modules[0] if modules else "the package"), None
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                elif key.data == "err":
                    err.append(data)
                else:
                    buffer += data
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        msg = json.loads(line)
                        if "start" in msg:
                            current, deadline = msg["start"], time.monotonic() + timeout
                        else:
                            return msg["failed"], msg["lines"]
        proc.wait()
        if proc.returncode != 0 and current:  # the process itself died (os._exit, a crash) while importing
            lines = [ln for ln in b"".join(err).decode(errors="replace").splitlines() if ln.strip()]
            return current, lines + [f"the importing process ended with exit code {proc.returncode} while "
                                     f"importing {current}"]
        return None
    finally:
        sel.close()
        if proc.poll() is None:
            kill_group(proc.pid)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def generated_files_bytes(lib: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under `lib` (caches excluded)."""
    if not lib.exists():
        return {}
    return {str(p.relative_to(lib)): p.read_bytes() for p in sorted(lib.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def generated_files(lib: Path) -> dict[str, str]:
    """Relative path -> text of every nbdev-generated Python file under `lib`."""
    out = {}
    for p in sorted(lib.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        text = p.read_text(encoding="utf-8")
        out[str(p.relative_to(lib))] = text
    return out


_GENERIC_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))


def _distinctive(line: str) -> bool:
    """Whether a solution line says something of its solution: it names something besides Python's keywords and
    builtins (`except (TypeError, ValueError):` is in every code base; a line that names the solution's own
    attributes or functions is that solution's)."""
    names = re.findall(r"[A-Za-z_]\w*", line)  # a comment's words count: they explain the solution
    return any(n not in _GENERIC_NAMES for n in names)


def _inside_and_given(nb: nbformat.NotebookNode, min_length: int) -> tuple[set[str], str]:
    "(distinctive lines inside solution regions, the text outside them) of one source notebook."
    inside, outside = set(), []
    for cell in nb.cells:
        regions = solution_regions(cell.source)
        region_lines = {ln for _, lines in regions for ln in lines}
        for _, lines in regions:
            inside.update(ln.strip() for ln in lines if len(ln.strip()) >= min_length and _distinctive(ln))
        outside.extend(ln for ln in cell.source.splitlines() if ln not in region_lines)
    return inside, "\n".join(outside)


def solution_only_lines(nb: nbformat.NotebookNode, min_length: int = 30) -> set[str]:
    """Distinctive lines that occur only inside the solution regions of `nb` (to detect leaks).

    A solution line that also stands outside its region (in a docstring, say) is not listed: it is
    in the release by design. `docstring_echoes` is the check that catches a docstring that
    repeats its solution.
    """
    inside, given = _inside_and_given(nb, min_length)
    return {ln for ln in inside if ln not in given}


def course_solution_lines(notebooks, min_length: int = 30) -> set[str]:
    """`solution_only_lines` of a whole course: a line that one module's solution holds but some
    module gives outside its solution regions (module 06's given `restore_reduced` repeats a line
    of module 01's `Tensor._reduce`) is public text, not a leak."""
    pairs = [_inside_and_given(nb, min_length) for nb in notebooks]
    given = "\n".join(text for _, text in pairs)
    return {ln for inside, _ in pairs for ln in inside if ln not in given}


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


# ---------------------------------------------------------------- docstrings that give the solution away

#: A docstring fails the author check when its code n-grams cover more than this share of its
#: solution's code tokens (`docstring_echoes`).
DOCSTRING_ECHO_LIMIT = 0.5
_SKIPPED_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                   tokenize.ENCODING, tokenize.ENDMARKER}
_OPERATORS = sorted(tokenize.EXACT_TOKEN_TYPES, key=len, reverse=True)
_LENIENT_TOKEN_RE = re.compile(
    r"#[^\n]*"  # a comment, dropped
    r"""|[rRbBuUfF]{0,2}(?:"[^"\n]*"|'[^'\n]*')"""  # a string on one line
    rf"|{tokenize.Number}"
    r"|\w+"
    r"|" + "|".join(re.escape(op) for op in _OPERATORS)
    + r"|\S"
)


def _lenient_tokens(text: str) -> list[str]:
    "Python-like tokens of text that `tokenize` rejects (prose with an apostrophe, an open bracket)."
    return [m.group(0) for m in _LENIENT_TOKEN_RE.finditer(text) if not m.group(0).startswith("#")]


def code_tokens(text: str) -> list[str]:
    """The code tokens of `text`: names, numbers, strings and operators; comments and layout dropped.

    Python's `tokenize` does the work (an f-string is one token on every Python version); text it
    cannot tokenize falls back to a regular expression that splits the same way.
    """
    lines = text.splitlines(keepends=True)
    out, depth, fstart = [], 0, None
    fstring_start = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+ splits f-strings up
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if fstring_start is not None and tok.type == fstring_start:
                depth += 1
                fstart = fstart or tok.start
                continue
            if fstring_end is not None and tok.type == fstring_end:
                depth -= 1
                if depth == 0:
                    (r0, c0), (r1, c1) = fstart, tok.end
                    span = "".join(lines[r0 - 1:r1])
                    out.append(span[c0:len(span) - len(lines[r1 - 1]) + c1])
                    fstart = None
                continue
            if depth or tok.type in _SKIPPED_TOKENS or not tok.string.strip():
                continue
            out.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        out = _lenient_tokens(text)
    return _join_dotted(out)


def _join_dotted(tokens: list[str]) -> list[str]:
    "`x . data` -> `x.data`: a dotted name is one token, so naming an attribute is not 3 tokens of code."
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if (tokens[i] == "." and out and out[-1].replace(".", "_").isidentifier()
                and i + 1 < len(tokens) and tokens[i + 1].isidentifier()):
            out[-1] += "." + tokens[i + 1]
            i += 2
            continue
        out.append(tokens[i])
        i += 1
    return out


def _docstring_tokens(doc: str) -> list[str]:
    "Code tokens of a docstring, line by line (backticks are markup; a `#` in prose starts no comment)."
    tokens = []
    for line in doc.replace("`", " ").replace("#", " ").splitlines():
        line = line.strip()
        if line.startswith((">>>", "...")):
            line = line[3:]
        tokens += code_tokens(line) if line else []
    return tokens


def echo_share(solution: list[list[str]], doc_tokens: list[str], n: int = 3) -> tuple[int, int, list[str]]:
    """(tokens reproduced, tokens in all, reproduced fragments) of the solution token runs `solution`
    (one list of tokens per solution region) in the docstring's tokens `doc_tokens`.

    A solution token counts as reproduced when it belongs to an n-gram of consecutive solution
    tokens that also occurs in the docstring; each docstring n-gram vouches for one solution
    n-gram only (multisets), so one `x = y` in the docstring does not cover ten in the code.
    """
    from collections import Counter

    grams: dict[int, Counter] = {}
    covered = total = 0
    fragments: list[str] = []
    for run in solution:
        size = min(n, len(run))
        if not size:
            continue
        if size not in grams:
            grams[size] = Counter(tuple(doc_tokens[i:i + size]) for i in range(len(doc_tokens) - size + 1))
        available, hit = grams[size], [False] * len(run)
        for i in range(len(run) - size + 1):
            gram = tuple(run[i:i + size])
            if available[gram] > 0:
                available[gram] -= 1
                hit[i:i + size] = [True] * size
        covered, total = covered + sum(hit), total + len(run)
        piece: list[str] = []
        for tok, h in zip(run + [""], hit + [False]):
            if h:
                piece.append(tok)
            elif piece:
                fragments.append(" ".join(piece))
                piece = []
    return covered, total, fragments


@dataclass
class DocstringEcho:
    "How much of one function's solution code its docstring reproduces."
    cell: int  # 1-based position of the solution cell
    grade_id: str
    function: str  # qualified name, e.g. "Module.train"
    exercise: str  # "Exercise 3.3" from the docstring or the next test cell, else ""
    reproduced: int
    total: int
    docstring: str = field(default="", repr=False)
    fragments: list = field(default_factory=list)  # the reproduced code, as token runs

    @property
    def share(self) -> float:
        return self.reproduced / self.total if self.total else 0.0

    def describe(self) -> str:
        where = f"{self.exercise} ({self.function})" if self.exercise else self.function
        shown = "; ".join(f"`{f}`" for f in self.fragments[:6]) + (" ..." if len(self.fragments) > 6 else "")
        return (f"{where}, cell {self.cell} ({self.grade_id}): the docstring reproduces {self.share:.0%} of the "
                f"solution's code tokens ({self.reproduced} of {self.total}): {shown}")


def _functions_with_docstrings(tree: ast.AST):
    "(qualified name, node) of every def and class in `tree`, outermost first."
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def docstring_echoes(nb: nbformat.NotebookNode, n: int = 3) -> list[DocstringEcho]:
    """For every function (or class) whose body holds a solution region: how much of the solution's
    code its docstring spells out, as token n-grams (`echo_share`).

    The docstring is that of the `def` holding the region, together with those of the functions
    around it (a method's, for a helper nested in it); a region directly in a class body is
    compared with the class docstring. The regions of one function are pooled. A region outside
    any def/class has no docstring to compare and is left out. Raises CourseError when a solution
    cell is not valid Python.
    """
    found: dict[tuple[int, str], DocstringEcho] = {}
    runs: dict[tuple[int, str], list[list[str]]] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not is_solution_cell(cell):
            continue
        regions = solution_regions(cell.source)
        if not regions:
            continue
        # nbdev directives and IPython magics are not Python; blank them, keeping line numbers.
        text = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in cell.source.splitlines())
        try:
            tree = ast.parse(text)
        except SyntaxError as e:
            raise CourseError(f"cell {i + 1} ({nbgrader_meta(cell).get('grade_id')}) is not valid Python "
                              f"(line {e.lineno}: {e.msg}); its docstrings cannot be checked") from None
        defs = list(_functions_with_docstrings(tree))
        label = ""
        for later in nb.cells[i + 1:]:
            if is_test_cell(later):
                label = exercise_label(later)
                label = label.split(":")[0] if label.startswith("Exercise") else ""
                break
        for start, lines in regions:
            body = [k for k, ln in enumerate(lines, start + 1) if ln.strip() and not ln.strip().startswith("#")]
            if not body:
                continue
            inside = [(name, node) for name, node in defs if node.lineno < body[0] <= (node.end_lineno or 0)]
            if not inside:
                continue
            name, node = inside[-1]  # the innermost
            # Every enclosing function's docstring counts (a helper nested in a method has none of
            # its own); a region directly in a class body is compared with the class docstring.
            funcs = [nd for _, nd in inside if not isinstance(nd, ast.ClassDef)] or [node]
            doc = "\n".join(ast.get_docstring(nd) or "" for nd in funcs).strip()
            key = (i, name)
            runs.setdefault(key, []).append(code_tokens(textwrap.dedent("\n".join(lines))))
            m = re.search(r"Exercise\s+(\d+\.\d+\w*)", doc)
            exercise = f"Exercise {m.group(1)}" if m else label
            found[key] = DocstringEcho(i + 1, nbgrader_meta(cell).get("grade_id", ""), name, exercise, 0, 0, doc)
    for key, echo in found.items():
        echo.reproduced, echo.total, echo.fragments = echo_share(runs[key], _docstring_tokens(echo.docstring), n)
    return list(found.values())
