"""Child processes that never outlive an interrupted `tito`.

`run()` starts a command in its own process group (session) and, when anything interrupts the wait
(Ctrl-C, SIGTERM turned into `KeyboardInterrupt` by `tito.ui`, a timeout), kills the whole group,
so a pytest run, an nbdev export or an import check leaves nothing behind.
"""
from __future__ import annotations

import os
import signal
import subprocess


def kill_tree(target, wait: bool = True) -> None:
    """SIGKILL a process, everything it started however deep (psutil), and its process group: the one
    process-tree killer of tito (grading workers and their kernels, probe processes, the competition's
    worker, `run()`'s children). `target` is a `subprocess.Popen` (reaped when `wait`) or a pid."""
    pid = target if isinstance(target, int) else target.pid
    try:
        import psutil

        try:
            tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
    except ImportError:  # psutil is a dependency of tito; a bare interpreter still kills the group
        psutil, tree = None, []
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait and not isinstance(target, int):
        target.wait()
    if psutil is not None and tree[1:]:
        psutil.wait_procs(tree[1:], timeout=5)


def kill_group(pid: int) -> None:
    """SIGKILL the process started as `pid` with everything it started (`kill_tree`; the name stays for callers)."""
    kill_tree(pid)


def run(cmd: list[str], *, cwd=None, env=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Like `subprocess.run(cmd, capture_output=True, text=True)`, in a process group of its own.

    Raises `subprocess.TimeoutExpired` after `timeout` seconds; on a timeout or an interrupt the
    child and everything it started are killed before the exception propagates.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc.pid)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
