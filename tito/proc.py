"""Child processes that never outlive an interrupted `tito`.

`run()` starts a command in its own process group (session) and, when anything interrupts the wait
(Ctrl-C, SIGTERM turned into `KeyboardInterrupt` by `tito.ui`, a timeout), kills the whole group,
so a pytest run, an nbdev export or an import check leaves nothing behind.
"""
from __future__ import annotations

import os
import signal
import subprocess


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid` (a child started with `start_new_session=True`)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
