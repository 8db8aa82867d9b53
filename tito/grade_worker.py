"""One submission, executed in its own process: `python -m tito.grade_worker` (started by tito.grading).

The job arrives as JSON on stdin (so nothing of it needs to be readable on disk by the sandbox user):

    {"notebook": <the sanitized notebook, nbformat JSON>, "files": {"tinytorch/core/tensor.py": <base64>},
     "workdir": "/tmp/...", "deadline_s": 120, "cell_timeout_s": 60}

The worker writes the package files under WORKDIR/pkg (first on the kernel's PYTHONPATH), runs the
notebook cell by cell in a fresh kernel whose working directory and HOME are WORKDIR, and writes
one JSON object to stdout: {"notebook": <executed>, "status": "ok" | "timed out" | "kernel died" |
"error", "reason": "..."}.

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


def run(job: dict) -> dict:
    import nbformat
    from nbclient import NotebookClient
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

    client = NotebookClient(nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, raise_on_iopub_timeout=False,
                            error_on_timeout={"ename": "TimeoutError",
                                              "evalue": "the cell ran past its time limit and was stopped",
                                              "traceback": ["TimeoutError: the cell ran past its time limit"]},
                            resources={"metadata": {"path": str(run_dir)}}, on_cell_executed=on_executed,
                            extra_arguments=["--HistoryManager.hist_file=:memory:"],
                            shutdown_kernel="immediate")  # the results are in hand: no graceful wait
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
                client.execute_cell(cell, i)
                if i in stopped and not reason:
                    status, reason = "timed out", f"cell {i + 1} was stopped after {client.timeout} s"
    except DeadKernelError as e:
        status, reason = "kernel died", f"the kernel died ({e or 'it exited or ran out of memory'})"
    except Exception as e:  # the kernel could not start, or similar: reported, never hidden
        status, reason = "error", f"{type(e).__name__}: {e}"
    why = {"ok": "not run", "timed out": "not run: the notebook ran out of time",
           "kernel died": "not run: the kernel died before this cell", "error": f"not run: {reason}"}[status]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip() and i not in executed:
            cell.outputs = [_error_output("NotRun", why)]
    return {"notebook": nbformat.writes(nb), "status": status, "reason": reason,
            "seconds": round(time.monotonic() - start, 2)}


def main() -> int:
    _set_parent_death_signal()
    job = json.loads(sys.stdin.read())
    result = run(job)
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
