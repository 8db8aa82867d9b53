"""`tito doctor`: is this machine ready for the course? Each check says how to fix itself."""
from __future__ import annotations

import importlib
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from .course import Settings

PACKAGES = ["numpy", "matplotlib", "nbdev", "nbformat", "nbclient", "ipykernel", "nbgrader", "jupyterlab", "typer", "rich"]
# `tito test` runs the package tests with these (the `test` extra of pyproject.toml)
TEST_PACKAGES = ["pytest", "hypothesis"]
INSTALL_COMMAND = 'pip install -e ".[test]"'


def _writable(path: Path) -> tuple[bool, str]:
    target = path
    while not target.exists():
        target = target.parent
    try:
        with tempfile.NamedTemporaryFile(dir=target):
            pass
        return True, str(target)
    except OSError as e:
        return False, f"cannot write to {target} ({e.strerror}): fix its permissions or move the course"


_WHERE = "import pathlib, tinytorch; print(pathlib.Path(tinytorch.__file__).resolve().parent)"


def tinytorch_check(root: Path, timeout: float = 120) -> tuple[str, bool, str]:
    """Which tinytorch this Python imports, asked of a child process (`python -P`: not the folder it runs in,
    as a script or a kernel sees it), so that `tito` never imports the student's package itself: a package
    that hangs or crashes on import is reported, not fatal."""
    import subprocess

    fix = f"run `{INSTALL_COMMAND}` in {root}"
    try:
        proc = subprocess.run([sys.executable, "-P", "-c", _WHERE], capture_output=True, text=True, timeout=timeout,
                              cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ("tinytorch", False, f"importing tinytorch did not finish within {timeout:g} s: code outside any function "
                                    "in your package runs forever; fix that cell and `tito export` again")
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return ("tinytorch", False, f"cannot import tinytorch ({lines[-1] if lines else f'exit code {proc.returncode}'})"
                                    f": {fix}")
    where = Path(proc.stdout.strip().splitlines()[-1])
    if where != (root / "tinytorch").resolve():
        return ("tinytorch", False, f"Python imports tinytorch from {where}, not this course's {root / 'tinytorch'}: {fix}")
    return ("tinytorch", True, str(where))


def run_checks(root: Path, settings: Settings) -> list[tuple[str, bool, str]]:
    out = []
    ok = sys.version_info >= (3, 11)
    out.append(("python", ok, f"{sys.version.split()[0]} at {sys.executable}" if ok else
                f"Python {sys.version.split()[0]} is too old: install Python 3.11 or newer"))
    for name in PACKAGES + TEST_PACKAGES:
        try:
            mod = importlib.import_module(name)
            out.append((f"package {name}", True, getattr(mod, "__version__", "installed")))
        except Exception as e:
            why = " (`tito test` needs it)" if name in TEST_PACKAGES else ""
            out.append((f"package {name}", False, f"{type(e).__name__}: {e}{why}: run `{INSTALL_COMMAND}` in {root}"))
    out.append(tinytorch_check(root))
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        spec = KernelSpecManager().get_kernel_spec("python3")
        exe = spec.argv[0]
        # jupyter_client runs a kernelspec's bare `python` with the Python that launches it
        resolved = sys.executable if exe in ("python", "python3", f"python3.{sys.version_info[1]}") else (shutil.which(exe) or exe)
        out.append(("jupyter kernel python3", True, f"{resolved} ({spec.display_name})"))
    except Exception as e:
        out.append(("jupyter kernel python3", False, f"no python3 kernel ({e}): run `python -m ipykernel install --user`"))
    bindir = str(Path(sys.executable).parent)
    alembic = shutil.which("alembic", path=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
    out.append(("nbgrader: alembic", bool(alembic), alembic or "nbgrader creates its gradebook with `alembic`: "
                "run `pip install nbgrader` in this environment"))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
        out.append(("loopback network", True, "kernels can bind 127.0.0.1"))
    except OSError as e:
        out.append(("loopback network", False, f"cannot bind 127.0.0.1 ({e}): notebooks run in kernels that need "
                    "loopback; bring it up with `ip link set lo up`"))
    for label, path in (("write: course folder", root), ("write: progress", settings.state_dir),
                        ("write: nbgrader", settings.nbgrader_root)):
        ok, detail = _writable(path)
        out.append((label, ok, detail))
    return out
