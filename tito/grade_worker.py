"""One submission, executed in its own process: `python -m tito.grade_worker` (started by tito.grading).

The job arrives as JSON on stdin (so nothing of it needs to be readable on disk by the sandbox user):

    {"notebook": <the sanitized notebook, nbformat JSON>, "files": {"tinytorch/core/tensor.py": <base64>},
     "workdir": "/tmp/...", "deadline_s": 120, "cell_timeout_s": 60}

The worker writes the package files under WORKDIR/pkg (first on the kernel's PYTHONPATH), runs the
notebook cell by cell in a fresh kernel whose working directory and HOME are WORKDIR, and writes
one JSON object to stdout: {"notebook": <executed>, "status": "ok" | "timed out" | "kernel died" |
"error", "reason": "...", "probes": {...}}.

With a `probe` job (tito.trusted.Plan.job: the student's exported module, the seed, the exercise
groups), it then runs the trusted checks' probes over that module in fresh processes of the same
sandbox and returns their records (data only) under "probes"; tito checks them against the reference.

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


def _set_parent_death_signal() -> None:
    """Die with the process that started us (Linux), so no worker outlives an interrupted tito."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(4, 0)  # PR_SET_DUMPABLE 0: the student's kernel (same user) cannot ptrace this process
    except OSError:
        return


def _error_output(ename: str, evalue: str):
    import nbformat

    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _output_size(out) -> int:
    if out.get("output_type") == "stream":
        return len(out.get("text", ""))
    if out.get("output_type") == "error":
        return sum(len(t) for t in out.get("traceback", [])) + len(out.get("evalue", ""))
    return sum(len(v) if isinstance(v, str) else len(str(v)) for v in out.get("data", {}).values())


def cap_outputs(cell, cell_limit: int, budget: int) -> int:
    """Keep at most `cell_limit` characters of a cell's output (and at most `budget`, what the notebook has
    left); a note in the output says what was cut. Returns the characters kept."""
    import nbformat

    limit = min(cell_limit, max(budget, 0))
    kept, out, cut = 0, [], 0
    for o in cell.get("outputs", []):
        if o.get("output_type") == "error":  # the verdict: always kept, shortened when huge
            o["traceback"] = [t[:2000] for t in o.get("traceback", [])[-20:]]
            o["evalue"] = o.get("evalue", "")[:2000]
        size = _output_size(o)
        if kept + size <= limit or o.get("output_type") == "error":
            out.append(o)
            kept += size
        elif o.get("output_type") == "stream" and kept < limit:
            room = limit - kept
            cut += size - room
            o["text"] = o["text"][:room]
            out.append(o)
            kept = limit
        else:
            cut += size
    if cut:
        why = (f"{cell_limit:,} characters per cell" if limit == cell_limit
               else "the notebook's output limit; later cells' output is not kept either")
        out.append(nbformat.v4.new_output("stream", name="stdout", text=(
            f"\n[autograder: {cut:,} characters of output were cut here: output is capped at {why}]\n")))
        cell.outputs = out
    return kept


def run(job: dict) -> dict:
    import nbformat
    from nbclient.exceptions import DeadKernelError

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
    run_dir = work / "run"
    run_dir.mkdir(exist_ok=True)

    nb = nbformat.reads(job["notebook"], as_version=4)
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT", "TMPDIR")}
    env.update(HOME=str(home), PYTHONPATH=str(pkg), USER=os.environ.get("USER", "grader"),
               MPLBACKEND="module://matplotlib_inline.backend_inline",  # figures embedded as PNG outputs
               MPLCONFIGDIR=str(home / ".matplotlib"), PYDEVD_DISABLE_FILE_VALIDATION="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MALLOC_ARENA_MAX="2", NBGRADER_EXECUTION="autograde", JUPYTER_RUNTIME_DIR=str(home / "runtime"))

    status, reason = "ok", ""
    cell_limit = int(job.get("output_limit", 100_000))
    budget = [int(job.get("notebook_output_limit", 2_000_000))]
    executed: set[int] = set()
    stopped: set[int] = set()  # cells stopped at their time limit

    def on_executed(cell, cell_index, execute_reply):  # nbgrader's Execute does the same
        executed.add(cell_index)
        content = execute_reply.get("content", {}) if execute_reply else {}
        if content.get("ename") == "TimeoutError" or any(
                o.get("output_type") == "error" and o.get("ename") == "KeyboardInterrupt" for o in cell.outputs):
            stopped.add(cell_index)
        if content.get("status") == "error" and not any(o.get("output_type") == "error" for o in cell.outputs):
            cell.outputs.append(_error_output(content.get("ename", "Error"), content.get("evalue", "")))
        budget[0] -= cap_outputs(cell, cell_limit, budget[0])

    from tito.notebooks import TIMEOUT_POLICY, CellTimedOut, client_class, exercise_label, is_test_cell

    # the executor and timeout policy of `tito test` (tito.notebooks), so both score a slow cell alike
    client = client_class(TIMEOUT_POLICY)(
        nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True, raise_on_iopub_timeout=False,
        error_on_timeout={"ename": "TimeoutError", "evalue": "the cell ran past its time limit and was stopped",
                          "traceback": ["TimeoutError: the cell ran past its time limit"]},
        resources={"metadata": {"path": str(run_dir)}}, on_cell_executed=on_executed,
        extra_arguments=["--HistoryManager.hist_file=:memory:"],
        shutdown_kernel="immediate")  # the results are in hand: no graceful wait
    stopped_at = ""
    try:
        with client.setup_kernel(env=env, cwd=str(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
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
                    label = exercise_label(cell) if is_test_cell(cell) else f"cell {i + 1}"
                    limit = ("the notebook's limit" if client.timeout < cell_timeout
                             else f"{client.timeout} s, the per-cell limit")
                    cell.outputs.append(_error_output("TimeoutError", f"{label} did not finish within {limit}: "
                                                                      "stopped; the cells after it were not run"))
                    status, reason = "timed out", f"{label} (cell {i + 1}) did not finish within {limit}; " \
                                                  "the run stopped there"
                    stopped_at = label
                    break
                if i in stopped and not reason:
                    status, reason = "timed out", f"cell {i + 1} was stopped after {client.timeout} s"
    except DeadKernelError as e:
        status, reason = "kernel died", f"the kernel died ({e or 'it exited or ran out of memory'})"
    except Exception as e:  # the kernel could not start, or similar: reported, never hidden
        status, reason = "error", f"{type(e).__name__}: {e}"
    why = {"ok": "not run", "timed out": (f"not run: the run stopped at {stopped_at}, which did not finish; fix it first"
                                          if stopped_at else "not run: the notebook ran out of time"),
           "kernel died": "not run: the kernel died before this cell", "error": f"not run: {reason}"}[status]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip() and i not in executed:
            cell.outputs = [_error_output("NotRun", why)]
    result = {"notebook": nbformat.writes(nb), "status": status, "reason": reason}
    if job.get("probe"):
        result["probes"] = run_probes(job["probe"], work, job.get("files", {}))
    result["seconds"] = round(time.monotonic() - start, 2)
    return result


def run_probes(probe: dict, work: Path, files: dict) -> dict:
    """The trusted checks' probes (tito.probes) over the student's exported module, each group in a fresh process
    of this sandbox: only their records (data) go back; the expected values are never here."""
    from tito.probes import run_groups

    checked = work / "checked"  # a fresh prerequisite package copy plus the student's exported module
    for rel, data in [*files.items(), *probe.get("files", {}).items()]:
        dest = checked / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(base64.b64decode(data))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER")}
    env.update(HOME=str(work / "home"), MPLBACKEND="Agg", MPLCONFIGDIR=str(work / "home" / ".matplotlib"),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", MALLOC_ARENA_MAX="2",
               PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(checked), *filter(None, [os.environ.get("PYTHONPATH")])]))
    base = {k: probe[k] for k in ("module", "seed", "package_module")}
    return run_groups(base, probe["groups"], sys.executable, env, work / "probes", float(probe.get("timeout_s", 60)))


def main() -> int:
    _set_parent_death_signal()
    job = json.loads(sys.stdin.read())
    result = run(job)
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
