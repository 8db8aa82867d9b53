"""The instructor loop end to end, on a simulated class generated from the release and source notebooks.

Each test works on its own copy of the course (tracked files only) in tmp_path, with short limits
in its settings.ini: a few seconds per cell and per notebook, 2 GiB of memory, 2 workers.
"""
from __future__ import annotations

import configparser
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from tests.simulated_class import KINDS, first_test_points, make_class
from tests.support.releases import add_release, copy_course  # noqa: F401 (a fixture)
from tito import notebooks as nbs
from tito.course import CODE_STUB, Settings, load_modules
from tito.grading import descendants
from tito.sandbox import bwrap_available, namespace_available

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]
MODULES = {m.number: m for m in load_modules(ROOT)}
CELL_LIMIT, NOTEBOOK_LIMIT = 12, 40  # generous: the test machine may be busy
MAX_PROCESSES = 64
# a process limit applies unless student code runs as root without any sandbox
LIMITED = os.geteuid() != 0 or not bwrap_available() or not namespace_available()


def tito(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd), MPLBACKEND="Agg", COLUMNS="250")
    env.pop("TITO_ROOT", None)
    proc = subprocess.run([sys.executable, "-m", "tito.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    proc.output = proc.stdout + proc.stderr
    return proc


def set_settings(course: Path, **values: str) -> None:
    """set_settings(course, grading__workers="2") edits the copy's settings.ini."""
    p = configparser.ConfigParser()
    p.read(course / "settings.ini")
    for key, value in values.items():
        section, name = key.split("__")
        if not p.has_section(section):
            p.add_section(section)
        p.set(section, name, value)
    with (course / "settings.ini").open("w") as f:
        p.write(f)


@pytest.fixture
def course(tmp_path) -> Path:
    dest = copy_course(tmp_path / "course")
    set_settings(dest, grading__workers="2", grading__notebook_timeout=str(NOTEBOOK_LIMIT),
                 execution__cell_timeout=str(CELL_LIMIT), grading__memory_gb="2",
                 grading__max_processes=str(MAX_PROCESSES))
    return dest


def results(course: Path, slug: str) -> dict:
    return json.loads((course / "nbgrader" / "grading" / f"{slug}.json").read_text())["students"]


def total_points(module) -> float:
    return sum(float(nbs.nbgrader_meta(c)["points"]) for c in nbs.read(module.notebook).cells if nbs.is_test_cell(c))


def graded_score(nb_path: Path) -> float:
    """What nbgrader's rule gives an executed notebook: points of graded cells without an error output."""
    nb = nbs.read(nb_path)
    return sum(float(nbs.nbgrader_meta(c)["points"]) for c in nb.cells
               if nbs.is_test_cell(c) and not any(o.get("output_type") == "error" for o in c.get("outputs", [])))


def write_class(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


# ------------------------------------------------------------------ the release


@pytest.mark.parametrize("number", ["01", "02"])
def test_release_stubs_compile_and_raise_not_implemented(course, add_release, number):
    module = MODULES[number]
    add_release(course, number)  # what `tito nbgrader generate` wrote (it exited with 0)
    release = course / "nbgrader" / "release" / module.slug / module.notebook.name
    nb = nbs.read(release)
    stubs = [c for c in nb.cells if nbs.is_solution_cell(c) and c.cell_type == "code"]
    assert stubs
    for c in stubs:
        compile(c.source, f"{module.slug}:{nbs.nbgrader_meta(c)['grade_id']}", "exec")  # SyntaxError fails the test
        assert all(line in c.source for line in CODE_STUB.splitlines()) and "python=" not in c.source, c.source
    report = nbs.execute(release, cwd=course, timeout=60, pythonpath=course)
    assert not [c for c in report.cells if c.ename in ("SyntaxError", "IndentationError")], report.cells
    assert report.tests and all(c.status == "not_implemented" for c in report.tests), \
        [(c.label, c.status, c.evalue) for c in report.tests]


@pytest.mark.parametrize("number", ["01", "13", "20"])
def test_the_grading_package_copy_imports_whole(tmp_path, number):
    """A kernel grading module NN gets the package without NN and later modules; given code (modules/common, e.g.
    the serving engine, which needs module 13's GPT) goes with it only when everything it imports does: every
    file of the copy imports in a fresh interpreter that sees nothing else (module 01's preflight failed on
    `tinytorch.serving.app` needing module 02's activations)."""
    import base64

    from tito.grading import package_files, prerequisite_imports

    root = Path(__file__).resolve().parents[1]
    files = package_files(root, MODULES[number])
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(base64.b64decode(data))
    names = prerequisite_imports(files)
    if number == "01":
        assert "tinytorch.core.tensor" not in names and "tinytorch.serving.engine" not in names, names
    if number == "20":
        assert "tinytorch.serving.engine" in names and "tinytorch.serving.server" not in names, names
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); " + code,
                           *names], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


# ------------------------------------------------------------------ a simulated class

# Every kind of submission, on a module with a prerequisite (01's solution in the grading package). Module 01
# alone is graded by the tests below (exchange, interruption, isolation, preflight); one class of 02 costs
# less than a class of each, and 02's notebook runs faster than 01's.
CLASSES = {"02": [k for k in KINDS if LIMITED or k != "forkbomb"]}


@pytest.mark.parametrize("number", sorted(CLASSES))
def test_simulated_class_every_submission_accounted_for(course, add_release, tmp_path, number):
    module = MODULES[number]
    add_release(course, number)
    files = make_class(module, CLASSES[number])
    truncated = {k: v for k, v in files.items() if k.startswith("truncated")}
    inbox = write_class(tmp_path / "lms", files)

    # bulk collect: LMS-style file names become student ids; a damaged file is refused by name
    proc = tito(course, "nbgrader", "collect", number, str(inbox))
    assert proc.returncode == 1, proc.output
    for name in truncated:
        assert re.search(rf"{re.escape(name)}.*not collected.*not a readable notebook", proc.output), proc.output
    submitted = course / "nbgrader" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == sorted(k for k in CLASSES[number] if k != "truncated")
    # ... which nbgrader's own exchange would have collected anyway
    for name, text in truncated.items():
        dest = submitted / "truncated" / module.slug
        dest.mkdir(parents=True)
        (dest / module.notebook.name).write_text(text)

    start = time.monotonic()
    proc = tito(course, "nbgrader", "autograde", number)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.output  # some submissions need a person
    # the looping notebooks are bounded by the notebook limit, not by cells x cell limit
    assert elapsed < 60 + NOTEBOOK_LIMIT + 10 * len(files), f"autograde took {elapsed:.0f} s"

    res = results(course, module.slug)
    assert sorted(res) == sorted(CLASSES[number]), "every submission must be in the results"
    full, first = total_points(module), first_test_points(module)
    for kind in CLASSES[number]:
        r, expect = res[kind], KINDS[kind][1]
        log = (course / r["log"]).read_text()
        where = f"{kind}: {r}\n{log}"
        assert r["status"] == expect.status, where
        assert r["max_score"] == full or kind == "truncated" and r["max_score"] in (0, full), where
        wanted = {"max": full, "zero": 0.0, "first": first}.get(expect.score)
        if wanted is not None:
            assert r["score"] == wanted, where
        elif expect.score == "partial":
            assert 0 < r["score"] < full, where
        else:
            assert 0 <= r["score"] < full, where
        if expect.reason:
            graded_nb = course / "nbgrader" / "autograded" / kind / module.slug / module.notebook.name
            text = r["reason"] + log + (graded_nb.read_text() if graded_nb.exists() else "")
            assert expect.reason in text, where
        # the table shows every student with score and status
        assert re.search(rf"{kind}\s*│\s*{r['score']:g}\s*│\s*{r['max_score']:g}\s*│\s*{re.escape(r['status'])}",
                         proc.output), (kind, proc.output)
        # the gradebook agrees with the executed notebook; failed submissions have none
        graded_nb = course / "nbgrader" / "autograded" / kind / module.slug / module.notebook.name
        if r["status"] == "failed":
            assert not graded_nb.exists()
        else:
            assert graded_score(graded_nb) == r["score"], where
    # integrity problems name the exercise
    assert "Exercise" in res["tampered"]["reason"] and "Exercise" in res["deleted"]["reason"]

    # incremental: nothing changed, nothing re-graded
    again = tito(course, "nbgrader", "autograde", number, "--student", "correct", "--student", "stub")
    assert again.returncode == 0, again.output
    assert "0 graded now, 2 unchanged" in again.output, again.output

    # feedback for every submission; hidden tests are not shown; a failed one gets a page saying why
    proc = tito(course, "nbgrader", "feedback", number)
    assert proc.returncode == 0, proc.output
    hidden = hidden_lines(module)
    for kind in CLASSES[number]:
        page = course / "nbgrader" / "feedback" / kind / module.slug / f"{module.notebook.stem}.html"
        assert page.exists() and f"{kind}: nbgrader/feedback/{kind}" in proc.output, proc.output
        text = page.read_text()
        assert not [ln for ln in hidden if ln in text], f"{kind}'s feedback shows hidden tests"
    assert "cannot be read" in (course / "nbgrader" / "feedback" / "truncated" / module.slug /
                                f"{module.notebook.stem}.html").read_text()
    page = lambda kind: (course / "nbgrader" / "feedback" / kind / module.slug  # noqa: E731
                         / f"{module.notebook.stem}.html").read_text()
    # a stub names its exercise and function; a failed visible assert keeps its traceback
    assert re.search(r"Exercise \d+\.\d+.*is not implemented yet", page("stub")), "stub feedback names nothing"
    if "visible" in CLASSES[number]:
        assert "AssertionError" in page("visible") and "Cell In" in page("visible"), "no traceback for a visible assert"
        assert "output is capped" in page("bigprint") and len(page("bigprint")) < 1_000_000
        assert "SOURCE:" in page("hook")  # the hook ran, and printed no hidden test: none ran in the kernel
    if number == "01":  # the module's figures are embedded in the feedback
        assert "data:image/png" in (course / "nbgrader" / "feedback" / "correct" / module.slug /
                                    f"{module.notebook.stem}.html").read_text()

    # grades.csv has every submission and its status
    proc = tito(course, "nbgrader", "export")
    assert proc.returncode == 0, proc.output
    with (course / "nbgrader" / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == sorted(CLASSES[number])
    for kind in CLASSES[number]:
        assert rows[kind]["status"].startswith(res[kind]["status"]), rows[kind]
        flagged = res[kind]["status"] == "needs review"
        assert (rows[kind]["integrity"] != "ok") == flagged, rows[kind]
        assert float(rows[kind]["raw_score"]) == res[kind]["score"], rows[kind]


def hidden_lines(module) -> list[str]:
    out = []
    for c in nbs.read(module.notebook).cells:
        for m in re.finditer(rf"{nbs.BEGIN_HIDDEN}\n(.*?){nbs.END_HIDDEN}", c.source, re.S):
            out += [ln.strip() for ln in m.group(1).splitlines() if len(ln.strip()) > 25]
    return out


# ------------------------------------------------------------------ interrupt


def test_interrupted_run_leaves_no_processes_and_recovers(course, add_release, tmp_path):
    module = MODULES["01"]
    set_settings(course, grading__workers="1", grading__sandbox="none")  # the fallback path: kernels are plain children
    add_release(course, "01")
    kinds = ["correct", "stub", "stubborn", "partial"]
    inbox = write_class(tmp_path / "lms", make_class(module, kinds))
    assert tito(course, "nbgrader", "collect", "01", str(inbox)).returncode == 0

    # the run's own temporary folder: another test grading a "stubborn" submission at the same time (the suite runs
    # on two workers) must not be taken for this run's cue
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=str(course), COLUMNS="250", TMPDIR=str(scratch))
    proc = subprocess.Popen([sys.executable, "-m", "tito.main", "nbgrader", "autograde", "01"], cwd=course, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # one worker, sorted order: correct, partial and stub are graded, then the stubborn loop runs; stop during it
    # (its working folder exists and a worker runs; the results file is written in batches, so it is not the cue)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if list(scratch.glob("tito-stubborn-*")) and descendants(proc.pid):
            break
    time.sleep(1)
    tree = descendants(proc.pid)
    assert tree, "a worker should be running"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "stubborn" in out, out
    time.sleep(1.5)
    alive = [p for p in tree if Path(f"/proc/{p}").exists()]
    assert not alive, f"processes left running after the interrupt: {alive}"
    assert not list(scratch.glob("tito-stubborn-*")), "the killed worker's folder is left"

    res = results(course, module.slug)
    assert "correct" in res and "stubborn" not in res
    graded = course / "nbgrader" / "autograded"
    assert sorted(p.name for p in graded.iterdir()) == sorted(res), "an autograded notebook without a result"
    for s in res:
        assert graded_score(graded / s / module.slug / module.notebook.name) == res[s]["score"]

    before = len(res)   # correct, and partial when it finished before the signal (results are written in batches)
    proc = tito(course, "nbgrader", "autograde", "01")
    assert proc.returncode == 1, proc.output  # the stubborn loop times out
    assert f"{before} unchanged" in proc.output, proc.output
    res = results(course, module.slug)
    assert sorted(res) == sorted(kinds) and res["stubborn"]["status"] == "timed out"

    # a re-submission after grading: feedback refuses to report on the old grading
    resubmit = write_class(tmp_path / "again", {"correct_01_tensor.ipynb": make_class(module, ["stub"])["stub_01_tensor.ipynb"]})
    assert tito(course, "nbgrader", "collect", "01", str(resubmit)).returncode == 0
    proc = tito(course, "nbgrader", "feedback", "01")
    assert proc.returncode == 1 and re.search(r"correct:.*changed after it was graded", proc.output), proc.output
    assert not list((course / "nbgrader" / "feedback" / "correct").glob("*/*.html"))
    assert "stub: nbgrader/feedback/stub/01_tensor/01_tensor.html" in proc.output, proc.output


# ------------------------------------------------------------------ isolation

PROBE = r'''
import os, json
from pathlib import Path
root = Path({root!r})
report = {{"uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME")}}
try:
    report["modules"] = len((root / "modules/01_tensor/01_tensor.ipynb").read_text())
except OSError as e:
    report["modules"] = type(e).__name__
try:
    with open(root / "nbgrader/gradebook.db", "ab") as f:
        f.write(b"x")
    report["gradebook"] = "written"
except OSError as e:
    report["gradebook"] = type(e).__name__
try:
    import tinytorch.core.activations
    report["solution_import"] = "imported"
except ImportError as e:
    report["solution_import"] = type(e).__name__
import tinytorch.core.tensor
report["prerequisite"] = "ok"
# walk the whole file system for a course: another checkout's package, its notebooks, a gradebook
mine = Path(tinytorch.core.tensor.__file__).resolve().parents[2]
found = []
for folder, dirs, names in os.walk("/"):
    if folder.startswith(("/proc", "/sys", "/dev")) or Path(folder).resolve().is_relative_to(mine):
        dirs[:] = []
        continue
    found += [os.path.join(folder, n) for n in names
              if n in ("autograd.py", "tensor.py", "gradebook.db") and "tinytorch" in folder or n.endswith("_autograd.ipynb")]
report["found"] = found[:5]
print("PROBE" + json.dumps(report))
'''


@pytest.mark.skipif(bool(bwrap_available()), reason=f"no bubblewrap here: {bwrap_available()}")
def test_student_code_cannot_read_solutions_nor_write_the_gradebook(course, add_release, tmp_path):
    module = MODULES["02"]
    set_settings(course, grading__sandbox="bwrap", execution__cell_timeout="90", grading__notebook_timeout="180")
    add_release(course, "02")
    files = make_class(module, ["correct"])
    nb = nbformat.reads(next(iter(files.values())), as_version=4)
    nb.cells.insert(3, nbformat.v4.new_code_cell(PROBE.format(root=str(course))))
    inbox = write_class(tmp_path / "lms", {"probe_02_activations.ipynb": nbformat.writes(nb)})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    before = (course / "nbgrader" / "gradebook.db").read_bytes()
    proc = tito(course, "nbgrader", "autograde", "02")
    assert proc.returncode == 0, proc.output
    assert "sandbox bwrap" in proc.output, proc.output
    graded = nbs.read(course / "nbgrader" / "autograded" / "probe" / module.slug / module.notebook.name)
    text = "".join(o.get("text", "") for c in graded.cells if c.cell_type == "code" for o in c.get("outputs", []))
    report = json.loads(text.split("PROBE", 1)[1].splitlines()[0])
    assert report["uid"] != 0
    assert not report["cwd"].startswith(str(course)) and not report["home"].startswith(str(course))
    assert report["modules"] in ("PermissionError", "FileNotFoundError"), report
    assert report["gradebook"] in ("PermissionError", "FileNotFoundError", "OSError"), report
    assert report["solution_import"] in ("ImportError", "ModuleNotFoundError"), report
    assert report["prerequisite"] == "ok"
    assert report["found"] == [], f"student code found another course's files: {report['found']}"
    assert results(course, module.slug)["probe"]["score"] == total_points(module)
    assert "sandbox bwrap" in (course / results(course, module.slug)["probe"]["log"]).read_text()
    assert (course / "nbgrader" / "gradebook.db").read_bytes() != b"" and before  # still a gradebook


def _unreadable_python() -> str:
    from tito.sandbox import _unreachable

    blocked = _unreachable(Path(sys.base_prefix))
    return "" if blocked is not None else f"this Python ({sys.base_prefix}) is readable by every user"


@pytest.mark.skipif(os.geteuid() != 0 or bool(_unreadable_python()) or bool(namespace_available()),
                    reason="needs root, the namespace sandbox and a Python under a private folder")
def test_preflight_explains_an_unreadable_python_before_grading(course, add_release, tmp_path):
    """A course venv made with plain `python -m venv` (symlinks into a mode-700 home): the namespace sandbox
    is refused up front, in one line with the fix, and bubblewrap grades with it."""
    import site

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--symlinks", str(venv)], check=True)
    site_dir = next((venv / "lib").glob("python3*/site-packages"))
    (site_dir / "course.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    assert (venv / "bin" / "python").is_symlink()
    module = MODULES["01"]
    add_release(course, "01")
    inbox = write_class(tmp_path / "lms", make_class(module, ["correct"]))
    assert tito(course, "nbgrader", "collect", "01", str(inbox)).returncode == 0
    env = dict(os.environ, PYTHONPATH=str(course), COLUMNS="250")
    env.pop("TITO_ROOT", None)
    set_settings(course, grading__sandbox="namespace")
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "tito.main", "nbgrader", "autograde", "01"], cwd=course,
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 or proc.returncode == 1, out
    assert "cannot read" in out and "sandbox = bwrap" in out and "-m venv" in out, out
    assert not (course / "nbgrader" / "grading" / f"{module.slug}.json").exists(), "graded despite the preflight"
    if not bwrap_available():
        set_settings(course, grading__sandbox="bwrap")
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "tito.main", "nbgrader", "autograde", "01"],
                              cwd=course, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert results(course, module.slug)["correct"]["score"] == total_points(module)


# ------------------------------------------------------------------ plain nbgrader, formgrader, exchange


def test_generated_config_drives_plain_nbgrader(course, tmp_path):
    proc = tito(course, "nbgrader", "config")
    assert proc.returncode == 0, proc.output
    folder = course / "nbgrader"
    config = folder / "nbgrader_config.py"
    assert config.exists() and "cd nbgrader" in proc.output
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=str(course))
    run = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "01_tensor"], cwd=folder, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    release = folder / "release" / "01_tensor" / "01_tensor.ipynb"
    for c in nbs.read(release).cells:
        if nbs.is_solution_cell(c) and c.cell_type == "code":
            compile(c.source, "stub", "exec")
    assert (folder / "gradebook.db").exists()
    assert not (course / "gradebook.db").exists(), "no stray gradebook in the course folder"
    # plain nbgrader scores with tito's verdict: a correct notebook that warns on stderr keeps every point
    module = MODULES["01"]
    dest = folder / "submitted" / "warner" / module.slug
    dest.mkdir(parents=True)
    (dest / module.notebook.name).write_text(make_class(module, ["warns"])[f"warns_{module.slug}.ipynb"])
    run = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", module.slug], cwd=folder, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    graded = nbs.read(folder / "autograded" / "warner" / module.slug / module.notebook.name)
    assert any(o.get("name") == "stderr" for c in graded.cells if nbs.is_test_cell(c) for o in c.get("outputs", []))
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}") as gb:
        assert gb.find_submission(module.slug, "warner").score == total_points(module)


def test_exchange_round_trip_then_tito_grades_it(course, add_release, tmp_path):
    """JupyterHub's path without a hub: nbgrader release/fetch/submit/collect through the exchange folder."""
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)
    set_settings(course, grading__exchange=str(exchange))
    add_release(course, "01")
    assert tito(course, "nbgrader", "config").returncode == 0
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=str(course))
    nbg = [sys.executable, "-m", "nbgrader"]

    def run(args, cwd):
        p = subprocess.run(nbg + args, cwd=cwd, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        return p

    run(["release_assignment", "01_tensor"], course / "nbgrader")
    student_home = tmp_path / "student"
    student_home.mkdir()
    student_args = [f"--Exchange.root={exchange}", "--CourseDirectory.course_id=tinytorch"]
    run(["fetch_assignment", "01_tensor", *student_args], student_home)
    fetched = student_home / "01_tensor" / "01_tensor.ipynb"
    assert fetched.exists()
    run(["submit", "01_tensor", *student_args], student_home)
    run(["collect", "01_tensor"], course / "nbgrader")
    submitted = list((course / "nbgrader" / "submitted").glob("*/01_tensor/01_tensor.ipynb"))
    assert len(submitted) == 1
    proc = tito(course, "nbgrader", "autograde", "01")
    assert proc.returncode == 0, proc.output
    student = submitted[0].parent.parent.name
    r = results(course, "01_tensor")[student]
    assert r["status"] == "graded" and r["score"] == 0 and r["submitted_at"], r


def test_autograde_without_submissions_says_what_to_do(course):
    proc = tito(course, "nbgrader", "autograde", "01")
    assert proc.returncode == 2 and "tito nbgrader collect" in proc.output


def test_collect_one_student_and_bad_ids(course, tmp_path):
    module = MODULES["01"]
    files = make_class(module, ["correct"])
    nb = write_class(tmp_path / "in", files) / "correct_01_tensor.ipynb"
    os.utime(nb, (1_700_000_000, 1_700_000_000))
    proc = tito(course, "nbgrader", "collect", "01", str(nb), "--student", "alice")
    assert proc.returncode == 0, proc.output
    stamp = (course / "nbgrader" / "submitted" / "alice" / "01_tensor" / "timestamp.txt").read_text()
    assert stamp.startswith("2023-11-14 22:13:20"), "the submission time is the file's, not the collection's"
    bad = tito(course, "nbgrader", "collect", "01", str(nb), "--student", "../eve")
    assert bad.returncode == 2 and "student id" in bad.output
    one = tito(course, "nbgrader", "collect", "01", str(nb))
    assert one.returncode == 2 and "--student" in one.output


def test_collect_folder_of_editions_and_a_map(course, tmp_path):
    module = MODULES["01"]
    text = next(iter(make_class(module, ["stub"]).values()))
    inbox = tmp_path / "inbox"
    (inbox / "bob" / "modules" / module.slug).mkdir(parents=True)
    (inbox / "bob" / "modules" / module.slug / module.notebook.name).write_text(text)
    (inbox / "carol").mkdir()  # nbgrader's own layout: the notebook and its timestamp.txt
    (inbox / "carol" / module.notebook.name).write_text(text)
    (inbox / "carol" / "timestamp.txt").write_text("2024-01-02 03:04:05.000000 UTC")
    (inbox / "Jane Doe_123_assignsubmission_file_01_tensor.ipynb").write_text(text)
    (inbox / "notes.txt").write_text("not a submission")
    mapping = tmp_path / "map.csv"
    mapping.write_text("name,student_id\nJane Doe_123_assignsubmission_file_01_tensor,jdoe\n")
    proc = tito(course, "nbgrader", "collect", "01", str(inbox), "--map", str(mapping))
    assert proc.returncode == 1, proc.output  # notes.txt is reported
    assert "notes.txt" in proc.output and "not a notebook" in proc.output
    submitted = course / "nbgrader" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == ["bob", "carol", "jdoe"]
    assert (submitted / "carol" / module.slug / "timestamp.txt").read_text().startswith("2024-01-02 03:04:05")


def test_collect_lms_names_and_a_zip_with_a_wrapping_folder(course, tmp_path):
    """nbgrader's zip_collect plugins read LMS names: two Johns stay two students; a zip whose members sit in
    one wrapping folder collects everyone in it, each with the member's own date."""
    import zipfile

    module = MODULES["01"]
    text = make_class(module, ["correct"])["correct_01_tensor.ipynb"]
    names = {"John Smith_123456_assignsubmission_file_01_tensor.ipynb": "John_Smith",
             "John Doe_654321_assignsubmission_file_01_tensor.ipynb": "John_Doe",
             "smithjane_12345_67890_01_tensor.ipynb": "smithjane",
             "alice-01_tensor (1).ipynb": "alice"}
    archive = tmp_path / "download.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i, name in enumerate(names):
            info = zipfile.ZipInfo(f"Assignment 1 submissions/{name}", date_time=(2024, 3, 1 + i, 12, 0, 0))
            z.writestr(info, text)
    proc = tito(course, "nbgrader", "collect", "01", str(archive))
    assert proc.returncode == 0, proc.output
    submitted = course / "nbgrader" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == sorted(names.values()), proc.output
    for i, student in enumerate(names.values()):
        stamp = (submitted / student / module.slug / "timestamp.txt").read_text()
        assert stamp.startswith(f"2024-03-0{1 + i}"), (student, stamp)


# ------------------------------------------------------------------ limits per run and per submission


def test_uid_leases_are_per_run_and_dead_runs_give_theirs_back():
    """Two grading runs on one machine never share a user id (the lease registry is read and written under a lock);
    the ids of a run that died are handed out again."""
    from tito.sandbox import UidLease

    mine = UidLease.acquire(3)
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                              "from tito.sandbox import UidLease; print(UidLease.acquire(2).uids, flush=True); "
                              "time.sleep(60)", str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        theirs = json.loads(child.stdout.readline())
        assert not set(theirs) & set(mine.uids), (theirs, mine.uids)
        more = UidLease.acquire(2)
        assert not set(more.uids) & (set(theirs) | set(mine.uids))
    finally:
        child.kill()
        child.wait()
    again = UidLease.acquire(2)
    assert set(again.uids) <= set(theirs) | set(range(min(theirs), max(more.uids) + 10)), again.uids
    for lease in (mine, more, again):
        lease.release()


def _cgroups() -> str:
    from tito.sandbox import Cgroups

    c = Cgroups.detect(1 << 30, 64)
    c.close()
    return "" if c.kind else c.why


@pytest.mark.skipif(bool(_cgroups()), reason=f"no cgroups here: {_cgroups()}")
def test_memory_limit_holds_for_all_processes_of_a_submission(course, add_release, tmp_path):
    """Three processes of one submission, each under the per-process limit, together over the submission's: the
    cgroup's limit stops them (before issue 28 one submission held 8 GB with a 4 GB limit)."""
    module = MODULES["02"]
    set_settings(course, grading__memory_gb="2", execution__cell_timeout="90", grading__notebook_timeout="180")
    add_release(course, "02")
    nb = nbformat.reads(make_class(module, ["correct"])["correct_02_activations.ipynb"], as_version=4)
    nb.cells.insert(3, nbformat.v4.new_code_cell(
        "import subprocess, sys\n"
        "procs = [subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(900 * 2**20); "
        "b[::4096] = b\"x\" * len(b[::4096]); time.sleep(3)']) for _ in range(3)]\n"
        "print('exit codes', sorted(p.wait() for p in procs))"))
    inbox = write_class(tmp_path / "lms", {"hog_02_activations.ipynb": nbformat.writes(nb)})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    proc = tito(course, "nbgrader", "autograde", "02")
    assert "limits per submission (cgroup" in proc.output, proc.output
    graded = nbs.read(course / "nbgrader" / "autograded" / "hog" / module.slug / module.notebook.name)
    text = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
    found = re.search(r"exit codes (\[.*?\])", text)
    assert found, (results(course, module.slug)["hog"], text[-2000:])
    codes = json.loads(found.group(1))
    assert -9 in codes, f"3 x 900 MB ran under a 2 GiB limit for the submission: {codes}"
    assert results(course, module.slug)["hog"]["score"] == total_points(module)


# ------------------------------------------------------------------ statuses that say what happened


def test_copied_cells_and_an_older_nbformat_are_graded(course, add_release, tmp_path):
    """A cell copy-pasted in JupyterLab (its id and nbgrader metadata twice) and a notebook saved as nbformat 4.4 (no
    cell ids) are graded from the student's code, not `failed: SchemaTooOldError`."""
    import copy as _copy

    module = MODULES["02"]
    add_release(course, "02")
    nb = nbformat.reads(make_class(module, ["correct"])["correct_02_activations.ipynb"], as_version=4)
    sol = next(i for i, c in enumerate(nb.cells) if nbs.is_solution_cell(c))
    test = next(i for i, c in enumerate(nb.cells) if nbs.is_test_cell(c))
    nb.cells.insert(test + 1, _copy.deepcopy(nb.cells[test]))
    nb.cells.insert(sol + 1, _copy.deepcopy(nb.cells[sol]))
    old = _copy.deepcopy(nbformat.reads(make_class(module, ["correct"])["correct_02_activations.ipynb"], as_version=4))
    old.nbformat_minor = 4
    for c in old.cells:
        c.pop("id", None)
    text = json.dumps(old)
    assert '"id"' not in text
    inbox = write_class(tmp_path / "lms", {"copied_02_activations.ipynb": nbformat.writes(nb),
                                           "old_02_activations.ipynb": text})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    proc = tito(course, "nbgrader", "autograde", "02")
    res = results(course, module.slug)
    for s in ("copied", "old"):
        assert res[s]["status"] == "graded" and res[s]["score"] == total_points(module), (res[s], proc.output)
    assert "copied graded or solution cells" in (course / res["copied"]["log"]).read_text()
    assert "nbformat 4.4: upgraded" in (course / res["old"]["log"]).read_text()


def test_removed_submissions_leave_the_results(course, add_release, tmp_path):
    module = MODULES["02"]
    add_release(course, "02")
    files = make_class(module, ["correct", "stub"])
    assert tito(course, "nbgrader", "collect", "02", str(write_class(tmp_path / "a", files))).returncode == 0
    assert tito(course, "nbgrader", "autograde", "02").returncode == 0
    shutil.rmtree(course / "nbgrader" / "submitted" / "stub")
    late = {"late_02_activations.ipynb": files["stub_02_activations.ipynb"]}
    assert tito(course, "nbgrader", "collect", "02", str(write_class(tmp_path / "b", late))).returncode == 0
    proc = tito(course, "nbgrader", "autograde", "02")
    assert sorted(results(course, module.slug)) == ["correct", "late"], proc.output
    assert "removed from the results (no submission any more): stub" in proc.output
    assert not (course / "nbgrader" / "autograded" / "stub").exists() or \
        not list((course / "nbgrader" / "autograded" / "stub").iterdir())


# ------------------------------------------------------------------ collect: LMS downloads, names, safe ids


def test_collect_keeps_lms_numbers_scripts_and_refuses_unsafe_ids(course, tmp_path):
    module = MODULES["01"]
    text = make_class(module, ["stub"])["stub_01_tensor.ipynb"]
    inbox = tmp_path / "moodle"
    inbox.mkdir()
    for name in ("John Smith_1001_assignsubmission_file_01_tensor.ipynb",
                 "John Smith_1009_assignsubmission_file_01_tensor.ipynb",
                 "José Núñez_1011_assignsubmission_file_01_tensor.ipynb",
                 "?.._1012_assignsubmission_file_01_tensor.ipynb", "..!_1013_assignsubmission_file_01_tensor.ipynb"):
        (inbox / name).write_text(text)
    folder = inbox / "Jane Roe_1010_assignsubmission_file_"  # Moodle's "download submissions in folders"
    folder.mkdir()
    (folder / "01_tensor.ipynb").write_text(text)
    proc = tito(course, "nbgrader", "collect", "01", str(inbox))
    assert proc.returncode == 1, proc.output  # the `..` entry is refused, the rest collected
    submitted = course / "nbgrader" / "submitted"
    assert sorted(p.name for p in submitted.iterdir()) == sorted(
        ["John_Smith_1001", "John_Smith_1009", "José_Núñez", "Jane_Roe"]), proc.output
    assert len(re.findall(r"starts with '\.'", proc.output)) == 2, proc.output  # '?..' and '..!' both become '..'
    assert not (course / "nbgrader" / module.slug).exists() and not (course / "nbgrader" / "01_tensor").exists()
    nb = write_class(tmp_path / "one", {"x.ipynb": text}) / "x.ipynb"
    for bad in ("..", "../eve", ".hidden", "-rf", "a/b"):
        out = tito(course, "nbgrader", "collect", "01", str(nb), "--student", bad)
        assert out.returncode == 2 and "not a safe id" in out.output, (bad, out.output)
    assert sorted(p.name for p in submitted.iterdir()) == sorted(
        ["John_Smith_1001", "John_Smith_1009", "José_Núñez", "Jane_Roe"])
    assert not (course / "nbgrader" / "eve").exists() and not (course / "eve").exists()


def test_the_kernels_package_comes_with_bytecode_checked_against_its_source(tmp_path):
    """The package copy carries each file's bytecode (compiled once per run): a kernel imports it without compiling,
    and a source that does not match its bytecode is compiled again (the bytecode is checked by the source's hash)."""
    import base64

    from tito.grading import package_files
    from tito.trusted import pyc_beside  # where the kernel (`python -I`) looks, whatever this process's pycache prefix

    files = package_files(ROOT, MODULES["06"])
    pyc = pyc_beside("tinytorch/core/tensor.py")
    assert pyc in files and all(pyc_beside(rel) in files for rel in files if rel.endswith(".py"))
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(base64.b64decode(data))
    code = "import sys; sys.path.insert(0, sys.argv[1]); import tinytorch.core.tensor as t; print(getattr(t, 'EDITED', 0))"
    run = subprocess.run([sys.executable, "-I", "-v", "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert run.stdout.strip() == "0" and f"code object from '{tmp_path / pyc}'" in run.stderr, run.stderr[-2000:]
    (tmp_path / "tinytorch/core/tensor.py").write_text((tmp_path / "tinytorch/core/tensor.py").read_text() + "\nEDITED = 1\n")
    run = subprocess.run([sys.executable, "-I", "-B", "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert run.stdout.strip() == "1", run.stderr[-2000:]


def test_a_lazy_import_inside_a_function_does_not_drop_a_file_from_the_kernels_package():
    """tensor.py imports autograd inside `backward` only: module 02's kernel still gets the tensor (module 06's
    autograd is not there, and need not be), while given code that imports a later module at import time goes."""
    from tito.grading import package_files

    files = package_files(ROOT, MODULES["02"])
    assert "tinytorch/core/tensor.py" in files and "tinytorch/core/autograd.py" not in files
    assert "tinytorch/core/activations.py" not in files


def test_the_kernels_package_from_the_imports_cache_is_the_one_parsed_and_a_changed_file_is_parsed_again(tmp_path):
    """`package_files(..., cache=)` keeps what each file imports by its content and the package's layout: the same
    package for every module, and a file whose content changed (here: the cache says otherwise) is parsed again."""
    import json

    from tito.grading import package_files

    cache = tmp_path / "cache"
    for number in sorted(MODULES):
        want = package_files(ROOT, MODULES[number])
        assert package_files(ROOT, MODULES[number], cache=cache) == want, number
        assert package_files(ROOT, MODULES[number], cache=cache) == want, number  # read back from the cache
    store = json.loads((cache / "imports.json").read_text())
    sha, deps = store["files"]["tinytorch/core/activations.py"]
    lie = ["tinytorch/core/autograd.py"]  # activations imports module 06's autograd: module 03's kernel cannot have it
    store["files"]["tinytorch/core/activations.py"] = [sha, lie]  # believed: the content is the one it was kept for
    (cache / "imports.json").write_text(json.dumps(store))
    assert "tinytorch/core/activations.py" not in package_files(ROOT, MODULES["03"], cache=cache)  # the cache was used
    store["files"]["tinytorch/core/activations.py"] = ["0" * 64, lie]  # the same lie for another content: not believed
    (cache / "imports.json").write_text(json.dumps(store))
    assert package_files(ROOT, MODULES["03"], cache=cache) == package_files(ROOT, MODULES["03"])


def test_the_packages_bytecode_from_its_cache_is_the_one_compiled_and_a_changed_source_is_compiled_again(tmp_path):
    """`package_bytecode(..., cache=)` keeps each file's bytecode by this Python's version, the file's path and its
    content: the same bytecode as compiling it, read back from the cache, and a source whose content changed is
    compiled again (the cache's entry for the old content is not believed for the new)."""
    import base64

    from tito.grading import package_bytecode
    from tito.trusted import pyc_beside

    pkg = tmp_path / "root" / "tinytorch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("X = 1\n")
    sources, cache = [pkg / "__init__.py", pkg / "a.py"], tmp_path / "cache"
    want = package_bytecode(tmp_path / "root", sources)
    assert package_bytecode(tmp_path / "root", sources, cache) == want  # compiled, and kept
    kept = sorted((cache / "bytecode").iterdir())
    assert len(kept) == 2
    for f in kept:  # the cache is what a second run reads: plant a lie in it
        f.write_bytes(f.read_bytes() + b"lie")
    rel = pyc_beside("tinytorch/a.py")
    assert base64.b64decode(package_bytecode(tmp_path / "root", sources, cache)[rel]).endswith(b"lie")
    (pkg / "a.py").write_text("X = 2\n")  # a new content: compiled again, whatever the cache holds
    again = package_bytecode(tmp_path / "root", sources, cache)
    assert again[rel] == package_bytecode(tmp_path / "root", sources)[rel] != want[rel]


def test_the_release_side_of_the_integrity_check_is_computed_once_and_a_changed_release_is_compared_anew():
    """`integrity.Release` (what a run computes once from its release notebook) finds what comparing with the release
    notebook itself finds, for every module, and the run reads its release again: an edited release is a new one."""
    import copy

    from tito.integrity import Release, compare_graded_cells

    for m in MODULES.values():
        release = nbs.read(m.notebook)
        tests = [c for c in release.cells if nbs.is_test_cell(c)]
        if len(tests) < 2:
            continue
        once = Release(release)
        worked = copy.deepcopy(release)
        assert compare_graded_cells(worked, once) == compare_graded_cells(worked, release) == [], m.slug
        mine = [c for c in worked.cells if nbs.is_test_cell(c)]
        mine[0].source += "\nassert True  # edited"
        mine[1].metadata.nbgrader["points"] = 99
        del worked.cells[worked.cells.index(mine[-1])]
        assert compare_graded_cells(worked, once) == compare_graded_cells(worked, release), m.slug
        assert {p.kind for p in compare_graded_cells(worked, once)} == {"changed", "metadata", "missing"}, m.slug
    edited = copy.deepcopy(release)  # the instructor changes a test cell and releases again
    first = next(c for c in edited.cells if nbs.is_test_cell(c))
    first.source += "\nassert 1 == 1"
    student = copy.deepcopy(release)  # handed in from the first release
    assert compare_graded_cells(student, Release(release)) == []
    assert [p.kind for p in compare_graded_cells(student, Release(edited))] == ["changed"]


def test_the_cached_exports_and_hidden_test_removal_follow_the_cells_text():
    """A run exports each distinct cell once (`probes.exported_source`) and clears each test cell's hidden tests once
    (`grading.clear_hidden_tests`), both by the cell's text: a changed cell is exported and cleared anew, and a cell
    whose hidden region never ends is an error every time (errors are not kept)."""
    from tito import probes as P
    from tito.grading import clear_hidden_tests

    nb = nbs.read(MODULES["06"].notebook)
    text, skipped = P.exported_source(nb)
    assert P.exported_source(nb) == (text, skipped) and not skipped
    cell = next(c for c in nb.cells if c.cell_type == "code" and "#| export" in c.source and "def " in c.source)
    cell.source += "\nEDITED_FOR_THE_TEST = 1\n"
    assert "EDITED_FOR_THE_TEST = 1" in P.exported_source(nb)[0]
    cell.source += "\ndef broken(:\n"
    again, skipped = P.exported_source(nb)
    assert "EDITED_FOR_THE_TEST" not in again and len(skipped) == 1, skipped

    test = nbformat.v4.new_code_cell("x = 1\n### BEGIN HIDDEN TESTS\nassert x == 1\n### END HIDDEN TESTS\ny = 2",
                                     metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 1,
                                                            "solution": False, "locked": True, "schema_version": 3}})
    book = nbformat.v4.new_notebook(cells=[test])
    assert clear_hidden_tests(copy_of(book)).cells[0].source == "x = 1\ny = 2"
    assert clear_hidden_tests(copy_of(book)).cells[0].source == "x = 1\ny = 2"
    other = copy_of(book)
    other.cells[0].source = other.cells[0].source.replace("y = 2", "z = 3")
    assert clear_hidden_tests(other).cells[0].source == "x = 1\nz = 3"
    broken = copy_of(book)
    broken.cells[0].source = "### BEGIN HIDDEN TESTS\nassert False"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="No end hidden tests"):
            clear_hidden_tests(copy_of(broken))


def test_module_06s_reference_gradients_are_summed_once_per_record_and_a_new_reference_is_summed_anew():
    """The rules' check sums the reference's gradients once per reference record (`_summed_reference`, kept with the
    record itself): the same verdicts as summing them each time, and another run's reference (new records, other
    values) is summed anew even where an old record's id could be reused."""
    import numpy as np

    from tito.probes import Arr, Seq
    from tito.probes import m06

    def record(grad):
        return {"add": Seq("list", [Arr(np.asarray(grad, dtype=np.float64), "ndarray"),
                                    Seq("list", [Seq("list", [3])])])}

    mine = record(np.ones((2, 3)))  # a rule that left broadcasting to the traversal: summed to (3,) before comparing
    assert m06._rules_check(mine, record([2.0, 2.0, 2.0])) == ""
    old = record([2.0, 2.0, 2.0])
    assert m06._rules_check(mine, old) == ""  # its sums kept
    other = record([1.0, 2.0, 2.0])  # a new run's reference, at an id the cache holds another record's sums for
    m06._REFERENCE_SUMMED[id(other["add"])] = m06._REFERENCE_SUMMED[id(old["add"])]
    why = m06._rules_check(mine, other)
    assert "1 of 3 values differ" in why, why  # summed anew: an entry for another record is not believed
    assert m06._rules_check(mine, old) == ""


def copy_of(nb):
    import copy

    return copy.deepcopy(nb)


def test_measurement_cells_are_skipped_when_grading_never_graded_ones():
    """Cells after the last graded test and cells tagged `tito:skip-when-grading` (or showing `# tito: skip when
    grading`) are not run by the grading worker; a graded or solution cell is run whatever it says."""
    from tito.grading import SKIP_TAG, skipped_when_grading

    nb = nbs.release(nbs.read(MODULES["06"].notebook))
    tests = [i for i, c in enumerate(nb.cells) if nbs.is_test_cell(c)]
    skip = skipped_when_grading(nb)
    after = [i for i, c in enumerate(nb.cells) if i > tests[-1] and c.cell_type == "code" and c.source.strip()
             and not nbs.nbgrader_meta(c)]
    assert after and sorted(map(int, skip)) == after
    plain = next(i for i, c in enumerate(nb.cells) if i < tests[0] and c.cell_type == "code" and not nbs.nbgrader_meta(c))
    nb.cells[plain].metadata["tags"] = [SKIP_TAG]
    sol = next(i for i, c in enumerate(nb.cells) if nbs.is_solution_cell(c) and c.cell_type == "code")
    nb.cells[sol].source = "# tito: skip when grading\n" + nb.cells[sol].source
    nb.cells[tests[0]].metadata["tags"] = [SKIP_TAG]
    skip = skipped_when_grading(nb)
    assert str(plain) in skip and str(sol) not in skip and str(tests[0]) not in skip


# ------------------------------------------------------------------ tito's own cost per notebook, the kernel's startup


def test_results_file_is_written_in_batches_and_at_flush(tmp_path):
    from types import SimpleNamespace

    from tito.grading import Outcome, ResultsSaver, results_path

    settings = SimpleNamespace(nbgrader_root=tmp_path / "nbgrader")
    module = SimpleNamespace(slug="02_activations")
    now = [0.0]
    results: dict = {}
    saver = ResultsSaver(settings, module, results, every_s=2.0, clock=lambda: now[0])
    path = results_path(settings, module)

    def on_disk() -> list[str]:
        return sorted(json.loads(path.read_text())["students"]) if path.exists() else []

    results["a"] = Outcome("a", 1, 1)
    saver.changed()  # the first result goes to disk at once
    assert on_disk() == ["a"]
    now[0] = 1.0
    results["b"] = Outcome("b", 1, 1)
    saver.changed()  # within 2 s of the last write: held
    assert on_disk() == ["a"]
    now[0] = 2.5
    results["c"] = Outcome("c", 1, 1)
    saver.changed()
    assert on_disk() == ["a", "b", "c"]
    now[0] = 3.0
    results["d"] = Outcome("d", 1, 1)
    saver.changed()
    assert on_disk() == ["a", "b", "c"]
    saver.flush()  # the end of a run (also an interrupted one)
    assert on_disk() == ["a", "b", "c", "d"]


def test_the_grading_worker_imports_no_schema_validator():
    """The worker never validates a notebook (the trusted side checks what comes back): importing it imports neither
    jsonschema nor fastjsonschema (nor their registries), which cost more than the rest of its imports."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tito.grade_worker; print(sorted({m.split('.')[0] for m "
            "in sys.modules if m.split('.')[0] in ('jsonschema', 'fastjsonschema', 'referencing', "
            "'jsonschema_specifications')}))")
    run = subprocess.run([sys.executable, "-I", "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[]", (run.stdout, run.stderr[-2000:])


def test_the_grading_kernel_transforms_each_cell_once_with_the_same_results(tmp_path):
    """ipykernel and IPython both transform a cell and check it for top-level await: the grading kernel does each
    once per cell (an input transformer counts its calls), and magics, shell escapes, top-level await and errors in
    the transforms still come out as IPython makes them."""
    from tito import grade_worker

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "calls = []\nget_ipython().input_transformers_post.append(lambda lines: calls.append(1) or lines)",
        "x = 1", "x = 1", "import asyncio\nawait asyncio.sleep(0)\nprint('awaited')", "%time y = 2",
        "a = !echo hi\nprint(a)", "%%nosuchmagic\nx", "def f(:\n    pass", "print(len(calls))")]
    job = {"notebook": nbformat.writes(nb), "files": {}, "workdir": str(tmp_path / "w"), "deadline_s": 120,
           "cell_timeout_s": 60}
    out = nbformat.reads(grade_worker.run(job)["notebook"], as_version=4)
    texts = ["".join(o.get("text", "") for o in c.outputs) for c in out.cells]
    errors = [[o.ename for o in c.outputs if o.output_type == "error"] for c in out.cells]
    assert texts[3] == "awaited\n" and "Wall time" in texts[4] and texts[5] == "['hi']\n", texts
    assert errors[6] == ["UsageError"] and errors[7] == ["SyntaxError"], errors
    assert texts[8] == "9\n", texts  # cells 2-9 once each (twice each before), and `%time` transforms its statement


def test_pyplot_loads_in_the_grading_kernel_only_when_a_cell_uses_it(tmp_path):
    """The worker's kernel binds `import matplotlib.pyplot` lazily: a notebook whose plots are skipped when grading
    never pays for matplotlib's package nor for pyplot (and its font cache); a cell that plots still gets its figure,
    and matplotlib's own attributes are there when read. The kernel runs without the debugger's module."""
    from tito import grade_worker

    loaded = "print('loaded', [m in sys.modules for m in ('matplotlib.rcsetup', 'matplotlib.figure')])"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        f"import sys\nimport matplotlib.pyplot as plt\nfrom matplotlib import pyplot\n{loaded}",
        f"import matplotlib\nprint(matplotlib.__file__.endswith('__init__.py'), pyplot is plt)\n{loaded}",
        "print(matplotlib.rcParams['axes.grid'] in (True, False), type(matplotlib).__name__)\n" + loaded,
        f"plt.plot([1, 2]); plt.show()\n{loaded}",
        "print('debugpy', [m for m, v in sys.modules.items() if m.startswith(('debugpy', '_pydevd')) and v is not None])")]
    job = {"notebook": nbformat.writes(nb), "files": {}, "workdir": str(tmp_path / "w"), "deadline_s": 120,
           "cell_timeout_s": 60}
    out = nbformat.reads(grade_worker.run(job)["notebook"], as_version=4)
    texts = ["".join(o.get("text", "") for o in c.outputs) for c in out.cells]
    assert texts[0] == "loaded [False, False]\n", texts
    assert texts[1] == "True True\nloaded [False, False]\n", texts
    assert texts[2] == "True module\nloaded [True, False]\n", texts
    assert "loaded [True, True]" in texts[3], texts
    assert any("image/png" in o.get("data", {}) for o in out.cells[3].outputs), out.cells[3].outputs
    assert texts[4] == "debugpy []\n", texts
    assert not [n for c in out.cells for o in c.outputs if o.output_type == "stream" for n in [o.text] if "tito" in n]


def test_the_pool_waits_for_a_worker_to_end_without_polling_and_a_signal_wakes_it(tmp_path):
    """`WorkerPool.poll(on_result, timeout)` blocks until a worker ends (a thread waits for its exit) and then scores
    it; `wake()` (what SIGINT/SIGTERM call) makes it return at once; a hard deadline still kills."""
    from tito.grading import GradingSettings, Job, Running, WorkerPool
    from tito.sandbox import Sandbox

    g = GradingSettings(workers=1, notebook_timeout=60, cell_timeout=60, memory_gb=0, sandbox="none", max_processes=256,
                        feedback_hidden_tests=False, exchange="", output_limit=1000, notebook_output_limit=1000)
    pool = WorkerPool(Sandbox("none"), 2, {}, g)
    done = []

    def run(seconds: float, hard: float = 60) -> Running:
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)
        now = time.monotonic()
        r = Running(Job(f"s{len(pool.running)}", ""), proc, tmp_path / f"{proc.pid}.out", tmp_path / f"{proc.pid}.err",
                    now, now + hard, str(tmp_path / f"w{proc.pid}"), len(pool.running))
        pool.running.append(r)
        import threading

        threading.Thread(target=pool._reap, args=(proc,), daemon=True).start()
        return r

    try:
        run(0.5)
        t0 = time.monotonic()
        pool.poll(lambda *a: done.append(a), timeout=60)
        assert len(done) == 1 and time.monotonic() - t0 < 30, done  # it returned when the worker ended
        assert done[0][1] is None and "exited with code 0 without a result" in done[0][2]

        slow = run(60)
        t0 = time.monotonic()
        pool.wake()
        pool.poll(lambda *a: done.append(a), timeout=60)
        assert len(done) == 1 and time.monotonic() - t0 < 30  # woken: nothing ended, nothing scored
        slow.hard_deadline = time.monotonic() + 0.2
        pool.poll(lambda *a: done.append(a), timeout=60)  # waits for the nearest hard deadline, not 60 s
        pool.poll(lambda *a: done.append(a), timeout=60)
        assert len(done) == 2 and done[1][3] is True and time.monotonic() - t0 < 30, done  # killed at the deadline
        assert slow.proc.poll() is not None
    finally:
        pool.close()


def test_the_autograded_notebooks_text_is_nbformats_byte_for_byte():
    """`notebook_text` writes what nbformat writes (split lines, sorted keys, indent 1, transient fields dropped,
    bytes as text, NaN and infinities as Python's json writes them) without changing the notebook."""
    import json

    from tito.grading import notebook_text

    for m in MODULES.values():
        nb = nbs.read(m.notebook)
        assert notebook_text(nb) == nbformat.versions[4].writes_json(nb), m.slug
    nb = nbs.read(MODULES["06"].notebook)
    nb.metadata["orig_nbformat"] = 3
    nb.cells[0].metadata["x"] = [1.5, float("nan"), float("inf"), -float("inf"), True, None, 10 ** 30, (1, 2),
                                 "é\u2028\x00\"\\", {}, [], b"QUJD"]
    nb.cells[0].attachments = {"a.png": {"image/png": "QUJD", "text/plain": "a\nb\n"}}
    nb.cells[1].metadata["trusted"] = True
    nb.cells.append(nbformat.v4.new_code_cell("x = 1\ny = 2", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="1\n2"),
        nbformat.v4.new_output("display_data", data={"text/html": "<b>\n</b>", "application/json": {"a": [1]},
                                                     "image/svg+xml": "<svg>\n</svg>", "image/png": "QUJD\n"}),
        nbformat.v4.new_output("error", ename="E", evalue="v", traceback=["a\nb", "c"])]))
    before = json.dumps(nb, default=repr, sort_keys=True)
    assert notebook_text(nb) == nbformat.versions[4].writes_json(nb)
    assert json.dumps(nb, default=repr, sort_keys=True) == before  # the notebook itself is left as it was
    nb.cells[0].metadata["odd"] = object()
    with pytest.raises(TypeError):  # what nbformat's writer raises
        notebook_text(nb)


# ------------------------------------------------------------------ probe records: arrays on the wire


def _odd_arrays():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    return [
        np.array(2.5),  # 0-d
        np.float32(-0.0),  # a NumPy scalar (sent as a 0-d array)
        np.zeros((0, 3), np.float32),  # empty
        np.zeros((2, 0, 4), np.int8),
        a[::2, ::3],  # non-contiguous
        a.T,  # Fortran order
        np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324], np.float64),  # NaN, infinities, a subnormal
        np.array([1 + 2j, np.nan - 1j], np.complex64),
        np.array([1.5, 65504.0], np.float16),
        np.arange(5, dtype=">i4"),  # big-endian
        np.array([2 ** 64 - 1, 0], np.uint64),
        np.array([True, False, True]),
        np.array(["ab", "ünï", ""]),  # unicode
        np.array([b"x\x00y", b""]),  # bytes
    ]


@pytest.mark.parametrize("i", range(len(_odd_arrays())))
def test_probe_record_arrays_round_trip_exactly(i):
    """An array the probe process records comes back in the trusted process with its dtype (byte order included),
    shape and every bit (NaN payloads, -0.0), writable and C-contiguous, through the JSON line the pipe carries."""
    from tito import probes as P

    v = _odd_arrays()[i]
    budget = [P.MAX_RECORD_BYTES]
    doc = {"values": {"x": P.encode_value(v, budget)}, "outcome": {"kind": "ok"}}
    values, outcome = P.read_record(json.loads(json.dumps(doc)))
    got = values["x"]
    want = np.asarray(v)
    assert isinstance(got, P.Arr) and got.kind == ("scalar" if isinstance(v, np.generic) else "ndarray")
    assert got.a.dtype == want.dtype and got.a.dtype.str == want.dtype.str, (got.a.dtype.str, want.dtype.str)
    assert got.a.shape == want.shape
    assert np.ascontiguousarray(got.a).tobytes() == np.ascontiguousarray(want).tobytes()
    assert got.a.flags.writeable and got.a.flags.c_contiguous
    assert outcome["kind"] == "ok"


@pytest.mark.parametrize("wire, why", [
    (["<f8", [2], "AAAAAAAA8D8="], "do not match its shape"),  # 8 bytes for 2 float64
    (["<f8", [1], "AAAAAAAA8D8"], "bytes"),  # bad padding
    (["<f8", [1], "ÄÄÄÄ"], "bytes"),  # not ASCII
    (["|O", [1], "AAAAAAAAAAA="], "may not be sent"),  # objects
    (["no such dtype", [1], ""], "malformed"),
    (["<f8", [-1], ""], "may not be sent"),
    (["<f8", ["x"], ""], "malformed"),
    (["<f8", [1]], "malformed"),
    (["<f8", [0], 5], "malformed"),
])
def test_probe_record_bad_arrays_are_refused(wire, why):
    """A malformed array in a record (the student's process made it) is refused with BadRecord, never another error
    that would end the trusted side's thread."""
    from tito import probes as P

    with pytest.raises(P.BadRecord, match=why):
        P.read_record({"values": {"x": {"__array__": wire}}, "outcome": {"kind": "ok"}})
