"""Set up a fresh clone and run the main job or the test suite (standard library only).

    python3 -m tito.bootstrap run    # create .venv, install, check the machine, run the 1957 perceptron
    python3 -m tito.bootstrap test   # create .venv, install with test extras, run the whole test suite

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


def setup() -> Path:
    if sys.version_info < (3, 10):
        sys.exit(f"TinyTorch needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    env_dir = Path(os.environ.get("TINYTORCH_VENV", ROOT / ".venv"))
    py = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    if not py.exists():
        print(f"creating virtual environment {env_dir}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    stamp = env_dir / ".tinytorch-install"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest() + str(ROOT)
    if not stamp.exists() or stamp.read_text() != want:
        sh(py, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        sh(py, "-m", "pip", "install", "--quiet", "-e", ".[test]")
        stamp.write_text(want)
    return py


def main(argv: list[str]) -> None:
    job = argv[0] if argv else "run"
    py = setup()
    bindir = py.parent
    env = dict(os.environ, PATH=os.pathsep.join([str(bindir), os.environ.get("PATH", "")]), MPLBACKEND="Agg")
    if job == "run":
        sh(py, "-m", "tito.main", "doctor", env=env)
        sh(py, "-m", "tito.main", "milestone", "run", "perceptron", *argv[1:], env=env)
    elif job == "test":
        sh(py, "-m", "pytest", "-q", *argv[1:], env=env)
    else:
        sys.exit(f"unknown job {job!r}: use `run` or `test`")


if __name__ == "__main__":
    main(sys.argv[1:])
