"""One submission's notebook, executed in its own process: `python -I` running `tito.grade_worker` (tito.grading).

The job arrives as a `grade` job of the job protocol (tito.jobs) on stdin (so nothing of it needs to be readable on
disk by the sandbox user), with the payload

    {"notebook": <the sanitized notebook, hidden tests removed>, "files": {"tinytorch/core/tensor.py": <base64>},
     "workdir": "/tmp/...", "deadline_s": 120, "cell_timeout_s": 60, "output_limit": 100000,
     "notebook_output_limit": 2000000, "skip": {"50": "why"}}

`skip`: code cells not run (tito.grading.skipped_when_grading: measurements no graded test needs, chosen by the
trusted side, never a graded or solution cell); each gets one output line saying so.

The worker writes the package files under WORKDIR/pkg (first on the kernel's PYTHONPATH), runs the
notebook cell by cell in a fresh kernel whose working directory and HOME are under WORKDIR, and answers
with the protocol's result message: {"notebook": <executed>, "status": "ok" | "timed out" | "kernel died" |
"error", "reason": "...", "seconds": wall} and its `cpu_s` (this worker and its kernel). It holds no reference code, expected value or hidden test: the trusted checks
run elsewhere (tito.trusted), in a fresh process that never ran the notebook.

It runs in Python's isolated mode from a read-only copy of the tito code it needs, with a working
directory the student cannot write, and imports everything it uses before the kernel starts: a module
a notebook cell writes somewhere is never imported here.

Output is capped on what the kernel sends, message by message (`CappedClient`): every stream, display,
display update (also one arriving after its cell ran), error and their metadata count against the
cell's and the notebook's limits; what is over them is dropped and one note says how much.

Every graded cell ends up with an outcome nbgrader can score: a cell that was never run (the
notebook ran out of time, the kernel died) gets an error output saying so, because nbgrader gives
full points to a graded cell without an error output.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# nbformat's schema validation, left out. This worker never validates a notebook: it reads and writes the one the
# trusted side checked, and the trusted side checks what comes back (its cells get back their trusted source and
# metadata; nbgrader scores the outputs). nbformat still validates each output it builds from a kernel message
# (nbclient's output_from_msg, new_output), and importing it imports jsonschema (with referencing, attrs and the
# schema registry: about 0.15 s of CPU per submission, and with jsonschema's format modules installed, rfc3987_syntax
# among them, seconds) for that alone. So nbformat's `json_compat` (its only link to jsonschema and fastjsonschema) is
# a module of this worker's: it names the same things, and asking it for a validator raises; output building does
# not validate (`nbformat.v4.nbbase.validate` is a no-op below). Only in a process that has not imported nbformat yet
# (the worker's own): a process that imports this module to call `run` (a test) keeps its validation.
class SchemaValidationError(ValueError):
    """nbformat's ValidationError here (jsonschema's, where nbformat validates)."""


def _no_validator(*args, **kwargs):
    raise RuntimeError("the grading worker does not validate notebooks (tito.grade_worker): the trusted side does")


def _without_schema_validation() -> None:
    import types

    compat = types.ModuleType("nbformat.json_compat", "nbformat's validators, left out of the grading worker")
    compat.ValidationError = SchemaValidationError
    compat._validator_for_name = compat.get_current_validator = _no_validator
    compat.VALIDATORS = {}
    sys.modules["nbformat.json_compat"] = compat


_VALIDATES = "nbformat" in sys.modules
if not _VALIDATES:
    _without_schema_validation()

import nbformat.v4  # noqa: E402
from nbclient.exceptions import DeadKernelError  # noqa: E402
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager  # noqa: E402

if not _VALIDATES:
    nbformat.v4.nbbase.validate = lambda node, ref=None: None  # outputs built from kernel messages: not validated here

from tito.jobs import Channel, serve  # noqa: E402
from tito.notebooks import TIMEOUT_POLICY, CellTimedOut, client_class, exercise_label, is_test_cell  # noqa: E402

# Run by the kernel before the notebook (an IPython startup file in the kernel's HOME): `import matplotlib.pyplot`
# binds two modules that run their code on first use. A notebook imports pyplot with the rest of its imports, and in
# most notebooks only plots use it, which are skipped when grading: matplotlib's package (its rcParams, colours and
# font patterns, about 0.3 s of CPU) and pyplot with its font cache (about 1 s) cost that much per submission
# otherwise. `matplotlib` stays a bare package (its path and spec, the submodules imported under it) until any other
# of its attributes is read, `matplotlib.pyplot` until any of its attributes is read (importlib.util.LazyLoader): then
# it runs its code, exactly as the import would have. A cell that plots gets its figure.
LAZY_MATPLOTLIB = """\
def __tito_lazy_matplotlib():
    import importlib.abc, importlib.machinery, importlib.util, sys, types

    pending = {}  # module name -> its real loader, until the module's code has run

    class LazyPackage(types.ModuleType):
        def __getattr__(self, attr):  # an attribute that is not there yet: run the package's code, then look again
            name = object.__getattribute__(self, "__name__")
            loader = pending.pop(name, None)
            if loader is None:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            self.__class__ = types.ModuleType
            self.__spec__.loader = self.__loader__ = loader
            try:
                loader.exec_module(self)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return getattr(self, attr)

    class PackageLoader(importlib.abc.Loader):
        def __init__(self, loader):
            self.loader = loader

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            pending[module.__name__] = self.loader
            module.__class__ = LazyPackage

    class LazyMatplotlib(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in ("matplotlib", "matplotlib.pyplot"):
                return None
            if name == "matplotlib.pyplot":
                sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            if name == "matplotlib":
                spec.loader = PackageLoader(spec.loader)
            else:
                spec.loader = importlib.util.LazyLoader(spec.loader)
            return spec

    sys.meta_path.insert(0, LazyMatplotlib())


__tito_lazy_matplotlib()
del __tito_lazy_matplotlib
"""

# Run by the kernel after LAZY_MATPLOTLIB (a second startup file): ipykernel's execute handler transforms each cell
# (IPython's input transformers: they tokenize the whole cell in Python) and compiles it to see whether it needs an
# event loop, and then IPython's run_cell does both again on the same text. For module 06's long solution cells that is
# about a quarter of the kernel's CPU per cell. Each step's result is kept for the one call that repeats it (the same
# text object, the same arguments, with no code of the notebook run in between) and used once, so every result is
# exactly the one the step would have computed.
CELL_STEPS_ONCE = """\
def __tito_cell_steps_once():
    shell = get_ipython()
    transform, should_run_async = shell.transform_cell, shell.should_run_async
    kept = {}

    def transform_cell(raw_cell):
        last = kept.pop("transform", None)
        if last is not None and last[0] is raw_cell:
            return last[1]
        cell = transform(raw_cell)
        kept["transform"] = (raw_cell, cell)
        return cell

    def should_run_async_once(raw_cell, *, transformed_cell=None, preprocessing_exc_tuple=None):
        last = kept.pop("async", None)
        if last is not None and last[0] is raw_cell and last[1] is transformed_cell and preprocessing_exc_tuple is None:
            return last[2]
        answer = should_run_async(raw_cell, transformed_cell=transformed_cell,
                                  preprocessing_exc_tuple=preprocessing_exc_tuple)
        if preprocessing_exc_tuple is None:
            kept["async"] = (raw_cell, transformed_cell, answer)
        return answer

    shell.transform_cell, shell.should_run_async = transform_cell, should_run_async_once


__tito_cell_steps_once()
del __tito_cell_steps_once
"""

# The kernel's command: ipykernel_launcher's own two steps (the working directory off sys.path, then the kernel app),
# with the debugger's module unavailable: ipykernel imports debugpy (about 0.2 s of CPU) only to offer debugging, which
# nothing asks of a grading kernel, and runs without it when the import fails.
KERNEL_BOOT = (
    "import sys\n"
    "sys.modules['debugpy'] = None\n"
    "if sys.path and sys.path[0] in ('', '.'):\n"
    "    del sys.path[0]\n"
    "from ipykernel import kernelapp\n"
    "kernelapp.launch_new_instance()\n")


def kernel_spec() -> KernelSpec:
    """The grading kernel: this Python running ipykernel (as the `python3` kernel spec would, without searching
    the kernel spec folders, which imports IPython here, nor starting the debugger there)."""
    return KernelSpec(argv=[sys.executable, "-c", KERNEL_BOOT, "-f", "{connection_file}"],
                      display_name="Python 3 (grading)", language="python", interrupt_mode="signal")


class GradingKernelSpecs(KernelSpecManager):
    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return kernel_spec()


MAX_ERRORS_PER_CELL = 2  # error outputs kept per cell (the first one carries a visible test's message)
ERROR_CHARS = 4000  # characters of one kept error output


def _error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _size(content) -> int:
    """Characters a kernel message's content takes in the notebook (its data, text and metadata)."""
    try:
        return len(json.dumps(content, default=str))
    except (TypeError, ValueError, RecursionError):
        return 1 << 30


def _shorten_error(content: dict) -> dict:
    tb = [str(t)[:ERROR_CHARS] for t in list(content.get("traceback") or [])[-20:]]
    while tb and sum(len(t) for t in tb) > ERROR_CHARS:
        tb.pop(0)
    return {**content, "ename": str(content.get("ename", ""))[:200], "evalue": str(content.get("evalue", ""))[:ERROR_CHARS],
            "traceback": tb}


def capped_client(base):
    """`base` (an nbclient NotebookClient class) with output limits enforced on every message the kernel sends."""

    class CappedClient(base):
        def create_kernel_manager(self):
            self.km = self.kernel_manager_class(kernel_name=self.kernel_name, config=self.config,
                                                kernel_spec_manager=GradingKernelSpecs())
            return self.km

        def init_caps(self, cell_limit: int, notebook_limit: int) -> None:
            self.cell_limit, self.left = cell_limit, notebook_limit
            self.kept: dict[int, int] = {}  # cell index -> characters kept (never decreases: clearing does not refill)
            self.errors: dict[int, int] = {}
            self.cut: dict[int, int] = {}
            self.owner: dict[str, int] = {}  # display_id -> the cell that showed it

        def _room(self, cell_index: int, size: int) -> bool:
            if self.kept.get(cell_index, 0) + size > self.cell_limit or size > self.left:
                self.cut[cell_index] = self.cut.get(cell_index, 0) + size
                return False
            self.kept[cell_index] = self.kept.get(cell_index, 0) + size
            self.left -= size
            return True

        def process_message(self, msg, cell, cell_index):
            kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
            content = msg.get("content") or {}
            if kind in ("stream", "display_data", "execute_result", "update_display_data", "error"):
                transient = content.get("transient") or {}
                display_id = transient.get("display_id") if isinstance(transient, dict) else None
                owner = self.owner.get(display_id, cell_index) if display_id else cell_index
                if kind == "error":
                    n = self.errors.get(cell_index, 0)
                    self.errors[cell_index] = n + 1
                    if n >= MAX_ERRORS_PER_CELL:
                        self.cut[cell_index] = self.cut.get(cell_index, 0) + _size(content)
                        return None
                    msg = {**msg, "content": _shorten_error(content)}
                    size = _size(msg["content"])  # a verdict: kept even past the limit (it is short now)
                    self.kept[cell_index] = self.kept.get(cell_index, 0) + size
                    self.left -= size
                elif not self._room(owner, _size(content)):
                    return None
                if display_id and kind != "update_display_data":
                    self.owner.setdefault(display_id, cell_index)
            elif kind.startswith("comm"):
                return None  # widget state is not kept: nothing of it reaches the notebook
            return super().process_message(msg, cell, cell_index)

    return CappedClient


def note_cuts(nb, client, cell_limit: int) -> None:
    """One note per cell whose output was cut: how much, and which limit."""
    for i, cut in sorted(client.cut.items()):
        cell = nb.cells[i]
        why = (f"{cell_limit:,} characters per cell" if client.kept.get(i, 0) + cut > cell_limit
               else "the notebook's output limit; later cells' output is not kept either")
        cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
            f"\n[autograder: {cut:,} characters of output were cut here: output is capped at {why}]\n")))


def _where(nb, i: int) -> str:
    """A cell named for a person: the exercise and function of a test cell, else its number and the exercise
    it follows (with the functions a solution cell defines)."""
    cell = nb.cells[i]
    if is_test_cell(cell):
        return f"{exercise_label(cell)} (cell {i + 1})"
    import re

    defs = re.findall(r"^\s*(?:def|class)\s+(\w+)", cell.source, re.M)
    before = next((exercise_label(c) for c in reversed(nb.cells[:i]) if c.cell_type == "code" and is_test_cell(c)), "")
    after = next((exercise_label(c) for c in nb.cells[i + 1:] if c.cell_type == "code" and is_test_cell(c)), "")
    what = f"cell {i + 1}" + (f", which defines {', '.join(defs[:3])}" if defs else "")
    if after and defs:
        return f"{what} (for {after})"
    if before:
        return f"{what} (after {before})"
    return f"{what} (before {after})" if after else what


def run(job: dict) -> dict:
    start = time.monotonic()
    deadline = start + float(job["deadline_s"])
    cell_timeout = float(job["cell_timeout_s"])
    work = Path(job["workdir"])
    work.mkdir(parents=True, exist_ok=True)
    pkg = work / "pkg"
    for rel, data in job.get("files", {}).items():
        dest = pkg / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(base64.b64decode(data))
    home = work / "home"
    home.mkdir(exist_ok=True)
    startup = home / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-tito-lazy-matplotlib.py").write_text(LAZY_MATPLOTLIB)
    (startup / "01-tito-cell-steps-once.py").write_text(CELL_STEPS_ONCE)
    run_dir = work / "run"
    run_dir.mkdir(exist_ok=True)

    # nbformat.v4's reader and writer: the notebook as JSON, without validating it (the trusted side validated it)
    nb = nbformat.v4.reads(job["notebook"])
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT", "TMPDIR")}
    env.update(HOME=str(home), PYTHONPATH=str(pkg), USER=os.environ.get("USER", "grader"),
               MPLBACKEND="module://matplotlib_inline.backend_inline",  # figures embedded as PNG outputs
               MPLCONFIGDIR=str(home / ".matplotlib"), PYDEVD_DISABLE_FILE_VALIDATION="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MALLOC_ARENA_MAX="2", NBGRADER_EXECUTION="autograde", JUPYTER_RUNTIME_DIR=str(home / "runtime"))

    status, reason = "ok", ""
    skip = {str(k): str(v)[:200] for k, v in dict(job.get("skip") or {}).items()}
    cell_limit = int(job.get("output_limit", 100_000))
    executed: set[int] = set()
    stopped: set[int] = set()  # cells stopped at their time limit

    def on_executed(cell, cell_index, execute_reply):  # nbgrader's Execute does the same
        executed.add(cell_index)
        content = execute_reply.get("content", {}) if execute_reply else {}
        if content.get("ename") == "TimeoutError" or any(
                o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt" for o in cell.outputs):
            stopped.add(cell_index)
        if content.get("status") == "error" and not any(o.get("output_type") == "error" for o in cell.outputs):
            cell.outputs.append(_error_output(str(content.get("ename", "Error"))[:200], str(content.get("evalue", ""))[:2000]))

    # the executor and timeout policy of `tito test` (tito.notebooks), so both score a slow cell alike
    client = capped_client(client_class(TIMEOUT_POLICY))(
        nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True, raise_on_iopub_timeout=False,
        error_on_timeout={"ename": "TimeoutError", "evalue": "the cell ran past its time limit and was stopped",
                          "traceback": ["TimeoutError: the cell ran past its time limit"]},
        resources={"metadata": {"path": str(run_dir)}}, on_cell_executed=on_executed, store_widget_state=False,
        extra_arguments=["--HistoryManager.hist_file=:memory:"],
        shutdown_kernel="immediate")  # the results are in hand: no graceful wait
    client.init_caps(cell_limit, int(job.get("notebook_output_limit", 2_000_000)))
    stopped_at = ""
    try:
        with client.setup_kernel(env=env, cwd=str(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if str(i) in skip:  # a measurement no graded test needs (the trusted side chose it: never a graded cell)
                    executed.add(i)
                    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
                        f"[autograder: not run when grading: {skip[str(i)]}]\n"))]
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    first = f" ({reason})" if reason else ""
                    status, reason = "timed out", f"the notebook ran past its limit of {job['deadline_s']:g} s{first}"
                    break
                client.timeout = int(max(1, min(cell_timeout, remaining)))
                try:
                    client.execute_cell(cell, i)
                except CellTimedOut:
                    executed.add(i)
                    where = _where(nb, i)
                    limit = ("the notebook's limit" if client.timeout < cell_timeout
                             else f"{client.timeout} s, the per-cell limit")
                    cell.outputs.append(_error_output("TimeoutError", f"{where} did not finish within {limit}: "
                                                                      "stopped; the cells after it were not run"))
                    status, reason = "timed out", f"{where} did not finish within {limit}; the run stopped there"
                    stopped_at = where
                    break
                if i in stopped and not reason:
                    status, reason = "timed out", f"{_where(nb, i)} was stopped after {client.timeout} s"
    except DeadKernelError as e:
        status, reason = "kernel died", f"the kernel died ({e or 'it exited or ran out of memory'})"
    except Exception as e:  # the kernel could not start, or similar: reported, never hidden
        status, reason = "error", f"{type(e).__name__}: {e}"
    note_cuts(nb, client, cell_limit)
    why = {"ok": "not run", "timed out": (f"not run: the run stopped at {stopped_at}, which did not finish; fix it first"
                                          if stopped_at else "not run: the notebook ran out of time"),
           "kernel died": "not run: the kernel died before this cell", "error": f"not run: {reason}"}[status]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip() and i not in executed:
            cell.outputs = [_error_output("NotRun", why)]
    return {"notebook": nbformat.v4.writes(nb), "status": status, "reason": reason,
            "seconds": round(time.monotonic() - start, 2)}


def _serve(job: dict, chan: Channel) -> dict:
    chan.ready()  # every import is done (above): no notebook code has run
    return run(job)


def main() -> int:
    return serve("grade", _serve)  # the job protocol (tito.jobs): the result carries this worker's and its kernel's cpu_s


if __name__ == "__main__":
    sys.exit(main())
