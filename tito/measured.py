"""What the lab guide shows as measured: result files, the reference run that writes them, and the
machine they were measured on (`tito guide measure`).

Nothing measured is typed into the guide by hand. The milestones write a result file beside their plot
(`milestones/_harness.py`, `Run.report`), the benchmark scripts one where `TINYTORCH_RESULT_FILE` says
(`tests/support/bench.py`, `result`), and `tito guide measure` runs them, and the instructor notebooks,
and keeps what they wrote under `quarto/measured/` (committed; the book is built from it and never
re-runs anything):

    quarto/measured/milestones/<name>.json      {"runs": [...]}: every kept run, newest last
    quarto/measured/milestones/<name>.png       the newest run's plot
    quarto/measured/benchmarks/<script>.json    {"runs": [...]}
    quarto/measured/notebooks/<NN_name>/        figures.json and fig-<k>.png: the figures one run of the
                                                instructor notebook drew, by cell id

A run records when and where it ran (`machine()`, the git commit), the command, its exit code and wall
time, what the script printed, and the result file it wrote.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tito.course import CourseError

MEASURED_DIR = Path("quarto") / "measured"
KEEP_RUNS = 20  # runs kept per result file (the oldest go first)
OUTPUT_LINES = 400  # lines of a script's output kept per run (its end)
RESULT_FILE_ENV = "TINYTORCH_RESULT_FILE"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# ---------------------------------------------------------------- where and when


def machine() -> dict:
    """The machine a measurement ran on: CPU model, cores, OS, Python, NumPy, load average at the time."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = " ".join(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    try:
        import numpy

        np_version = numpy.__version__
    except ImportError:  # pragma: no cover - numpy is a dependency
        np_version = None
    try:
        load = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    return {"cpu": cpu, "cores": os.cpu_count(), "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "numpy": np_version, "load_average": load}


def machine_text(m: dict) -> str:
    """`Intel Xeon ... (2 cores, Linux 6.1, Python 3.11.7, NumPy 2.1.0, load average 2.3)`."""
    bits = [f"{m.get('cores')} cores" if m.get("cores") else None, m.get("system"),
            f"Python {m['python']}" if m.get("python") else None, f"NumPy {m['numpy']}" if m.get("numpy") else None,
            f"load average {m['load_average']:g}" if m.get("load_average") is not None else None]
    return f"{m.get('cpu') or 'an unknown CPU'} ({', '.join(b for b in bits if b)})"


def git_commit(root: Path) -> str | None:
    """The short commit of the checkout at `root`, with `+` when files differ from it; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if dirty else "")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# ---------------------------------------------------------------- result files


def write_json(path: Path, data) -> Path:
    """Write `data` as JSON to `path` atomically (a temporary file in the same folder, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     suffix=".part", delete=False) as part:
        part.write(text)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(part.name, 0o666 & ~umask)  # a new file's usual mode (NamedTemporaryFile makes 0600)
        os.replace(part.name, path)
    except BaseException:
        Path(part.name).unlink(missing_ok=True)
        raise
    return path


def read_json(path: Path, default=None):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as e:
        raise CourseError(f"cannot read the result file {path}: {e}") from None


def runs(path: Path) -> list[dict]:
    """The runs kept in a history file (empty when it does not exist)."""
    data = read_json(path, {"runs": []})
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise CourseError(f"{path} is not a result history (expected {{\"runs\": [...]}})")
    return data["runs"]


def append_run(path: Path, run: dict, keep: int = KEEP_RUNS) -> Path:
    return write_json(path, {"runs": (runs(path) + [run])[-keep:]})


def _tail(text: str, lines: int = OUTPUT_LINES) -> str:
    text = _ANSI.sub("", text).replace("\r\n", "\n")
    # a progress display rewrites its line with carriage returns: keep what the line said last
    kept = [ln.rsplit("\r", 1)[-1] for ln in text.splitlines()]
    if len(kept) > lines:
        kept = [f"... ({len(kept) - lines} lines before these are not kept)"] + kept[-lines:]
    return "\n".join(kept).rstrip() + "\n"


def _run_script(root: Path, cmd: list[str], env: dict, log, timeout: float | None) -> tuple[int, float, str]:
    log("+ " + " ".join(str(c) for c in cmd))
    t0 = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            log(line.rstrip("\n"))
            if timeout and time.monotonic() - t0 > timeout:
                proc.kill()
                lines.append(f"[stopped after {timeout:g} s by tito guide measure]\n")
                break
        code = proc.wait()
    except BaseException:
        proc.kill()
        raise
    return code, time.monotonic() - t0, "".join(lines)


def _env(root: Path) -> dict:
    from tito.course import edition_env

    env = edition_env(root)
    env.update(MPLBACKEND="Agg", TERM="dumb", PYTHONUNBUFFERED="1", COLUMNS="120")
    return env


# ---------------------------------------------------------------- milestones and benchmarks


def measured_dir(root: Path) -> Path:
    return Path(root) / MEASURED_DIR


def run_milestone(root: Path, name: str, extra: list[str] = (), log=print, timeout: float | None = None) -> dict:
    """Run one milestone as `tito milestone run` does and keep its run in `quarto/measured/milestones/`."""
    from tito import milestones as ms

    m = ms.get(root, name)
    out = measured_dir(root) / "milestones"
    with tempfile.TemporaryDirectory(prefix="tito-measure-") as tmp:
        plot = Path(tmp) / f"{m.name}.png"
        cmd = [sys.executable, m.script, "--out", plot, *extra]
        code, seconds, output = _run_script(root, cmd, _env(root), log, timeout)
        result = read_json(plot.with_suffix(".json"))
        run = {"date": now(), "commit": git_commit(root), "machine": machine(),
               "command": f"tito milestone run {m.name}" + "".join(f" {a}" for a in extra),
               "exit": code, "seconds": round(seconds, 1), "result": result, "output": _tail(output)}
        if plot.is_file():
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(plot, out / f"{m.name}.png")
            run["plot"] = f"{m.name}.png"
    append_run(out / f"{m.name}.json", run)
    return run


def benchmark_scripts(root: Path) -> list[Path]:
    return sorted((Path(root) / "tests" / "benchmarks").glob("bench_*.py"))


def run_benchmark(root: Path, name: str, args: list[str] = (), log=print, timeout: float | None = None) -> dict:
    """Run `tests/benchmarks/<name>.py ARGS` and keep its run in `quarto/measured/benchmarks/`."""
    name = name if name.startswith("bench_") else f"bench_{name}"
    script = Path(root) / "tests" / "benchmarks" / f"{name.removesuffix('.py')}.py"
    if not script.is_file():
        known = ", ".join(p.stem for p in benchmark_scripts(root))
        raise CourseError(f"no benchmark script {script.relative_to(root)}; the benchmarks are: {known}")
    with tempfile.TemporaryDirectory(prefix="tito-measure-") as tmp:
        env = _env(root)
        env[RESULT_FILE_ENV] = str(Path(tmp) / "result.json")
        code, seconds, output = _run_script(root, [sys.executable, script, *args], env, log, timeout)
        result = read_json(Path(tmp) / "result.json")
    run = {"date": now(), "commit": git_commit(root), "machine": machine(),
           "command": " ".join([f"python {script.relative_to(root)}", *args]), "exit": code,
           "seconds": round(seconds, 1), "result": result, "output": _tail(output)}
    append_run(measured_dir(root) / "benchmarks" / f"{script.stem}.json", run)
    return run


# ---------------------------------------------------------------- the instructor notebooks' figures

FIG_ALT = re.compile(r'^#\| fig-alt: "(.+)"\s*$', re.M)
_NOTEBOOK_SETUP = """\
%matplotlib inline
%config InlineBackend.figure_formats = ['png']
import matplotlib as _mpl
_mpl.rcParams.update({"figure.dpi": 96, "savefig.dpi": 96})
"""


def figure_cells(nb) -> list[int]:
    """Indices of the code cells that draw a figure (they start with `#| fig-alt:`)."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and FIG_ALT.search(c.source)]


def run_notebook(root: Path, module, cell_timeout: float = 300, log=print) -> dict:
    """Run the instructor notebook of `module` top to bottom and keep the figures its `#| fig-alt` cells drew,
    with the machine and commit, in `quarto/measured/notebooks/<NN_name>/` (the previous run's files go)."""
    import base64

    import nbformat
    from nbclient import NotebookClient

    from tito import notebooks as nbs

    nb = nbs.read(module.notebook)
    cells = figure_cells(nb)
    if not cells:
        raise CourseError(f"{module.notebook.name} has no figure cell (a code cell starting with `#| fig-alt:`)")
    ids = {i: nb.cells[i].get("id") for i in cells}
    setup = nbformat.v4.new_code_cell(_NOTEBOOK_SETUP)
    run_nb = nbs.strip_outputs(nb)
    run_nb.cells.insert(0, setup)
    env = _env(root)
    log(f"running {module.notebook.relative_to(root)} ({len(nb.cells)} cells, {len(cells)} figures; "
        f"at most {cell_timeout:g} s a cell)")
    client = NotebookClient(run_nb, timeout=int(cell_timeout), kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(module.folder)}})
    t0 = time.monotonic()
    try:
        client.execute(env=env, cwd=str(module.folder))
    except Exception as e:  # a cell past its time limit, a dead kernel: keep what ran
        log(f"the run stopped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    seconds = time.monotonic() - t0
    out = measured_dir(root) / "notebooks" / module.slug
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    figures, errors = [], []
    for i in cells:
        cell = run_nb.cells[i + 1]
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if o.get("data", {}).get("image/png")]
        errs = [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errs:
            errors.append({"cell_id": ids[i], "error": errs[0][:500]})
        for k, png in enumerate(pngs):
            name = f"fig-{len(figures) + 1}.png"
            (out / name).write_bytes(base64.b64decode(png))
            figures.append({"cell_id": ids[i], "file": name, "alt": FIG_ALT.search(cell.source).group(1),
                            "index_in_cell": k})
    record = {"module": module.slug, "date": now(), "commit": git_commit(root), "machine": machine(),
              "seconds": round(seconds, 1), "figures": figures, "errors": errors}
    write_json(out / "figures.json", record)
    log(f"{module.slug}: {len(figures)} figures in {seconds:.0f} s" + (f"; {len(errors)} figure cells failed" if errors else ""))
    return record


def notebook_figures(root: Path, module) -> dict | None:
    """The kept figures of `module`'s reference run, or None when it was never measured."""
    return read_json(measured_dir(root) / "notebooks" / module.slug / "figures.json")


# ---------------------------------------------------------------- reading the kept runs


def milestone_runs(root: Path, name: str) -> list[dict]:
    return runs(measured_dir(root) / "milestones" / f"{name}.json")


def benchmark_runs(root: Path, script: str) -> list[dict]:
    return runs(measured_dir(root) / "benchmarks" / f"{script}.json")
