"""A warm pytest: one process that has imported pytest, hypothesis and NumPy forks a child for each run.

`run_module_tests` (tests/support/mutation.py) runs a module's package tests against a temporary copy of the
edition for each mutation of the catalogues and each module's release: about 50 runs in the suite. A fresh
interpreter spent about 2 s of its 2.7 s of CPU importing pytest, its plugins, hypothesis and NumPy before the
first test ran. Here the child of a fork starts with them imported and nothing of the course: `tests` and
`tinytorch` are imported in the child, from the copy (it checks that the copy's package is the one it imports).
Everything else is as in a fresh `python -m pytest ARGS` run in the copy: the working folder, the environment,
`sys.path` (the folder, then PYTHONPATH), a new session (its process group is killed at the time limit), no
standard input, standard output and error to files.

    runner = WarmPytest()
    rc, out, err = runner.run(args, cwd, env, timeout)   # args as for `python -m pytest`
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# imported once in the warm process: what every run imports and nothing that reads the course or an environment
# variable a run may set differently (BLAS threads are fixed when the warm process starts: see WarmPytest.run)
PRELOAD = ("numpy", "pytest", "_pytest.config", "_pytest.python", "_pytest.terminal", "_pytest.fixtures",
           "_pytest.assertion.rewrite", "_pytest.junitxml", "_pytest.pastebin", "_pytest.doctest",
           "hypothesis", "hypothesis.strategies", "hypothesis.extra.numpy", "_hypothesis_pytestplugin",
           "tito.failures", "tito.pytest_plugin")
NOT_PRELOADED = ("tests", "tinytorch", "torch", "matplotlib")

SERVER = r'''
import importlib, json, os, sys
preload, forbidden = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in preload:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
early = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
if early:
    raise SystemExit(f"warm pytest: preloading imported {early}")
import pytest
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        rc = 70
        try:
            os.setsid()
            fd_in = os.open(os.devnull, os.O_RDONLY)
            os.dup2(fd_in, 0)
            for fd, path in ((1, job["out"]), (2, job["err"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            sys.path[:0] = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.dont_write_bytecode = bool(job["env"].get("PYTHONDONTWRITEBYTECODE"))
            sys.argv = ["pytest", *job["args"]]
            import tinytorch
            want = os.path.realpath(os.path.join(job["cwd"], "tinytorch"))
            got = os.path.realpath(os.path.dirname(tinytorch.__file__))
            if got != want:
                print(f"warm pytest: the copy under {job['cwd']} would test {got}, not its own package", file=sys.stderr)
                rc = 97
            else:
                rc = int(pytest.main(job["args"]))
        except BaseException as e:
            import traceback
            traceback.print_exc()
            rc = rc if isinstance(e, SystemExit) and e.code is None else 70
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(rc)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
'''

WRONG_PACKAGE = 97


class WarmPytest:
    """The warm process of this test process (started at the first run, with the BLAS settings of that run's
    environment; a run asking for others gets a fresh interpreter instead), one run at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.blas: dict = {}
        self.scratch = tempfile.TemporaryDirectory(prefix="tinytorch-warm-pytest-")

    @staticmethod
    def _blas(env: dict) -> dict:
        return {k: env.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}

    def _start(self, env: dict) -> subprocess.Popen:
        start_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        start_env.update({k: v for k, v in self._blas(env).items() if v is not None})
        for k, v in self._blas(env).items():
            if v is None:
                start_env.pop(k, None)
        self.blas = self._blas(env)
        return subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(PRELOAD), json.dumps(NOT_PRELOADED)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.scratch.name, env=start_env,
                                text=True, bufsize=1, start_new_session=True)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def run(self, args: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int, str, str]:
        """`python -m pytest *args` in `cwd` with `env`: (exit code, standard output, standard error)."""
        if not hasattr(os, "fork"):
            proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            return proc.returncode, proc.stdout, proc.stderr
        with self.lock:
            if self.proc is not None and (self.proc.poll() is not None or self.blas != self._blas(env)):
                self.close()
            if self.proc is None:
                self.proc, self.pending = self._start(env), b""
            fd, out = tempfile.mkstemp(dir=self.scratch.name, suffix=".out")
            os.close(fd)
            err = out[:-4] + ".err"
            try:
                # pytest would rewrite the asserts of plugins it loads; these were imported before it ran (harmless)
                quiet = ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
                self.proc.stdin.write(json.dumps({"args": [*quiet, *args], "cwd": str(cwd), "env": dict(env),
                                                  "out": out, "err": err}) + "\n")
                self.proc.stdin.flush()
                pid = json.loads(self._line(timeout))["pid"]
                try:
                    rc = json.loads(self._line(timeout))["rc"]
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self._line(60)  # the warm process reaps it
                    raise subprocess.TimeoutExpired(["pytest", *args], timeout) from None
                return rc, Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")
            except (BrokenPipeError, EOFError):
                self.close()
                raise RuntimeError("the warm pytest process ended; see its standard error above") from None
            finally:
                for p in (out, err):
                    Path(p).unlink(missing_ok=True)

    def _line(self, timeout: float) -> str:
        """The warm process's next reply line (read unbuffered, so that a line already read is never waited for)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                if not sel.select(timeout):
                    raise subprocess.TimeoutExpired("warm pytest", timeout)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()
