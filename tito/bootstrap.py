"""Set up a fresh clone and run the main job or the test suite (standard library only).

    python3 -m tito.bootstrap run    # create .venv, install, check the machine, run every ready milestone
    python3 -m tito.bootstrap test   # create .venv, install with test + reference (PyTorch) extras, run the whole suite

The virtual environment lives in `.venv/` (override with TINYTORCH_VENV). Installation is skipped
when pyproject.toml has not changed since the last successful install.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd, **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, **kw)
    if rc != 0:
        sys.exit(rc)


def setup(job: str) -> Path:
    if sys.version_info < (3, 11):
        sys.exit(f"TinyTorch needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    env_dir = Path(os.environ.get("TINYTORCH_VENV", ROOT / ".venv"))
    py = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    if not py.exists():
        print(f"creating virtual environment {env_dir}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    stamp = env_dir / ".tinytorch-install"
    # the test suite compares with PyTorch and builds the lab guide (Jupyter Book)
    extras = ["test", "reference", "guide"] if job == "test" else ["test"]
    base = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest() + str(ROOT)
    have = stamp.read_text().split("|") if stamp.exists() else []
    if not have or have[0] != base or not set(extras) <= set(have[1:]):
        sh(py, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        sh(py, "-m", "pip", "install", "--quiet", "-e", f".[{','.join(extras)}]")
        stamp.write_text("|".join([base, *extras]))
    return py


def ensure_apt_tool(binaries: tuple[str, ...], package: str, needed_by: str) -> None:
    """Install the Debian package `package` (which provides one of `binaries`) with apt-get when this runs
    as root on a Debian/Ubuntu machine (CI); elsewhere say which tests skip for want of it."""
    import shutil

    if any(shutil.which(b) for b in binaries) or not sys.platform.startswith("linux"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"note: {package} is not installed and cannot be installed here (needs root and apt-get): "
              f"{needed_by} are skipped", flush=True)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "-qq", package], ["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", package]):
        print("+", " ".join(cmd), flush=True)
        if subprocess.call(cmd, env=env, stdout=subprocess.DEVNULL) == 0 and any(shutil.which(b) for b in binaries):
            return
    print(f"note: installing {package} failed: {needed_by} are skipped", flush=True)


def ensure_bubblewrap() -> None:
    """The grading sandbox's bubblewrap (`bwrap`), so the sandbox tests run."""
    ensure_apt_tool(("bwrap",), "bubblewrap", "the grading sandbox tests that need it")


def ensure_chromium() -> None:
    """Headless Chromium for the lab guide's browser test (tests/test_guide.py)."""
    ensure_apt_tool(("chromium", "chromium-browser"), "chromium", "the lab guide's browser tests")


def bytecode_cache(env: dict) -> str:
    """Let this job's Python processes keep their bytecode, in a private folder outside the checkout (removed at the
    end), even where the machine sets PYTHONDONTWRITEBYTECODE: the suite starts hundreds of `tito`, pytest and kernel
    processes, and each compiled tito and the package from source again (about 0.7 s of CPU per `tito` command).
    Outside the checkout, no copy of it (a student edition, a grading release) carries a `__pycache__`, and no
    sandbox sees the solutions' bytecode (grading workers start isolated, `python -I`, without PYTHON* variables)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="tinytorch-pycache-")  # mode 700: this user's only
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = folder
    return folder


def main(argv: list[str]) -> None:
    import shutil

    job = argv[0] if argv else "run"
    py = setup(job)
    bindir = py.parent
    env = dict(os.environ, PATH=os.pathsep.join([str(bindir), os.environ.get("PATH", "")]), MPLBACKEND="Agg")
    pycache = bytecode_cache(env)
    try:
        run_job(job, argv, py, env)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)


def test_workers() -> int:
    "The suite's pytest-xdist workers: one per core this process may use, and one more (at most 16)."
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores + 1, 16)


def run_job(job: str, argv: list[str], py: Path, env: dict) -> None:
    if job == "run":
        sh(py, "-m", "tito.main", "doctor", env=env)
        # every milestone whose modules are complete in this edition, then one summary table and the plots
        sh(py, "-m", "tito.milestones", "run-all", *argv[1:], env=env)
    elif job == "test":
        ensure_bubblewrap()
        ensure_chromium()
        # One test worker per core and one more (pytest-xdist; TINYTORCH_TEST_WORKERS=1 runs serially), each with
        # single-threaded BLAS: more threads than cores make every small matmul wait for a core. The extra worker
        # keeps the cores busy while tests wait on kernels, sandboxes, servers and time limits: a suite run on two
        # cores counted 1,739 s of CPU in its tests' processes for 3,797 s of its workers' time. A worker with nothing
        # left takes tests queued for another (worksteal): with plain `load` scheduling one worker sat idle for 90 s
        # at the end while the other ran its queue of grading tests.
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
        sh(py, "-m", "pytest", "-q", "-n", os.environ.get("TINYTORCH_TEST_WORKERS") or str(test_workers()),
           "--dist", "worksteal", *argv[1:], env=env)
    else:
        sys.exit(f"unknown job {job!r}: use `run` or `test`")


if __name__ == "__main__":
    main(sys.argv[1:])
