"""The cheat suite: dishonest submissions score what their code deserves, honest ones keep every point.

One `tito nbgrader autograde` run of module 02 grades a class made from the release: a correct
notebook, a correct one written differently, wrong or stub code under every cheat of issue 14
(patched numpy comparisons, a lenient `np` proxy, an IPython input transformer rewriting the test
cells, `set_custom_exc` plus a patched `kernel.do_execute`) and their variants (builtins,
sys.modules, unittest.mock, reading expected values from the callers' frames, the cheat inside the
exported code, forged probe records), and one case per mechanism of issue 28:

- a module planted on the grading processes' import paths (every writable folder the notebook sees);
- exported code that reads its callers' frames and every object in its process, looking for code to run;
- exported code that rewrites its own record, and the verdict text in it;
- hidden tests printed encoded (base64 of the reversed source of every cell);
- a display updated after its cell ran, a flood of error outputs, padded output metadata;
- a process that kills its grading worker;
- (test_fork_bomb_in_one_run_does_not_starve_another) a fork bomb in one of two concurrent runs.

Stubs plus any cheat score what stubs score (0); nothing of the reference's code or of the hidden
tests reaches the autograded notebook, the feedback or the log of any cheat. Module 06 (whose rules
leaked whole into a feedback page before issue 28) gets the exported-code cheats at the probe level.
"""
from __future__ import annotations

import base64
import copy
import csv
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.simulated_class import correct as correct_nb
from tests.support.releases import add_release  # noqa: F401 (a fixture)
from tests.test_grading import INSTRUCTOR, MODULES, ROOT, course, results, set_settings, tito, total_points, write_class  # noqa: F401
from tito import notebooks as nbs
from tito.sandbox import bwrap_available, namespace_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]

# ------------------------------------------------------------------ code of the cheats

ALLCLOSE = """
import numpy as np, numpy.testing as npt
np.allclose = lambda *a, **k: True
np.array_equal = lambda *a, **k: True
np.isclose = lambda a, b, *r, **k: np.ones(np.broadcast(np.asarray(a), np.asarray(b)).shape, bool)
for _n in dir(npt):
    if _n.startswith("assert_"):
        setattr(npt, _n, lambda *a, **k: None)
"""

NP_PROXY = """
import types
import numpy as _real_np
class _Lenient:
    def __getattr__(self, name):
        if name in ("allclose", "array_equal", "array_equiv", "isclose"):
            return lambda *a, **k: True
        if name == "testing":
            return types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in dir(_real_np.testing)})
        return getattr(_real_np, name)
np = _Lenient()
"""

TRANSFORMER = """
def _rewrite(lines):
    return ["print('all tests passed')\\n"] if lines and lines[0].startswith("# Exercise") else lines
get_ipython().input_transformers_post.append(_rewrite)
"""

CUSTOM_EXC = """
import inspect
_ip = get_ipython()
_ip.set_custom_exc((BaseException,), lambda shell, etype, evalue, tb, tb_offset=None: None)
_kernel = _ip.kernel
_orig_execute = _kernel.do_execute
async def _do_execute(*a, **k):
    reply = _orig_execute(*a, **k)
    if inspect.isawaitable(reply):
        reply = await reply
    reply["status"] = "ok"
    for key in ("ename", "evalue", "traceback"):
        reply.pop(key, None)
    return reply
_kernel.do_execute = _do_execute
"""

BUILTINS = """
import builtins, types
import numpy as _real_np
class _Lenient:
    def __getattr__(self, name):
        if name in ("allclose", "array_equal", "array_equiv", "isclose"):
            return lambda *a, **k: True
        if name == "testing":
            return types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in dir(_real_np.testing)})
        return getattr(_real_np, name)
builtins.np = _Lenient()  # every later cell that says `np` finds this one in builtins
del np
"""

SYS_MODULES = """
import sys, types
import numpy
_fake_testing = types.ModuleType("numpy.testing")
for _n in dir(numpy.testing):
    setattr(_fake_testing, _n, (lambda *a, **k: None) if _n.startswith("assert") else getattr(numpy.testing, _n))
_fake = types.ModuleType("numpy")
_fake.__dict__.update(numpy.__dict__)
_fake.allclose = _fake.array_equal = lambda *a, **k: True
_fake.testing = _fake_testing
sys.modules["numpy"], sys.modules["numpy.testing"] = _fake, _fake_testing
np = _fake
"""

UNITTEST = """
import unittest
from unittest import mock
import numpy as np
for _n in [n for n in dir(unittest.TestCase) if n.startswith("assert")]:
    setattr(unittest.TestCase, _n, lambda *a, **k: None)
for _target in ("numpy.allclose", "numpy.array_equal"):
    mock.patch(_target, return_value=True).start()
for _n in [n for n in dir(np.testing) if n.startswith("assert_")]:
    mock.patch(f"numpy.testing.{_n}").start()
"""

# a solution that looks for the expected values in its callers' frames (the test cell's variables)
FRAME = """
import sys as _sys
_f, out = _sys._getframe(1), None
while _f is not None and out is None:
    for _v in list(_f.f_locals.values()) + list(_f.f_globals.values()):
        if isinstance(_v, np.ndarray) and _v.shape == x.data.shape and _v is not x.data and _v.dtype.kind == "f":
            out = _v.astype(x.data.dtype)
            break
    _f = _f.f_back
if out is None:
    out = x.data * 0.5
"""

# a module planted in every writable folder the notebook can see, under the names a grading process imports;
# imported anywhere but the student's own kernel it ends that process (exit code 7), which the scores would show
PLANT = r"""
import os, sys
_code = "import os\nos._exit(7)\n"
_mine = {os.path.realpath(p) for p in sys.path if p} | {os.path.realpath(os.getcwd())}
_dirs = {"/tmp", "/tmp/tinytorch-grading", "/dev/shm", "/var/tmp", os.path.expanduser("~"),
         os.path.dirname(os.getcwd()), os.path.dirname(os.path.dirname(os.getcwd())), "/opt/tito", "/"}
_planted = 0
if not os.path.isdir("/opt/tito"):  # only inside bubblewrap (its /tmp is private): never litter a real machine
    _dirs = set()
for _d in sorted(_dirs):
    if os.path.realpath(_d) in _mine:
        continue
    for _n in ("numpy.py", "nbformat.py", "json.py", "sitecustomize.py", "usercustomize.py", "zipfile.py", "runpy.py",
               "base64.py", "tito.py", "nbclient.py", "selectors.py"):
        try:
            with open(os.path.join(_d, _n), "w") as _f:
                _f.write(_code)
            _planted += 1
        except OSError:
            pass
    try:
        os.makedirs(os.path.join(_d, "tito"), exist_ok=True)
        for _n in ("__init__.py", "jobs.py", "probe_run.py", "grade_worker.py", "probes.py"):
            with open(os.path.join(_d, "tito", _n), "w") as _f:
                _f.write(_code)
        with open(os.path.join(_d, "zz-cheat.pth"), "w") as _f:
            _f.write("import os; os._exit(7)\n")
    except OSError:
        pass
print("planted", _planted, "modules")
"""

# a hook that prints every cell's source, reversed and base64-encoded (the verbatim print is scrubbed)
HIDDEN_PRINT = """
import base64
get_ipython().events.register(
    "pre_run_cell", lambda info: print("ENC:" + base64.b64encode(info.raw_cell[::-1].encode()).decode()))
"""

# a display updated from a thread after its cell ran: 30 updates of 2 MB
UPDATE_FLOOD = """
import threading, time
from IPython.display import display
_h = display("start", display_id=True)
def _flood():
    for _ in range(30):
        time.sleep(0.1)
        _h.update("u" * 2_000_000)
threading.Thread(target=_flood, daemon=True).start()
"""

# 500 error outputs of 20 kB in one cell: kept whole they make a 20 MB notebook, and shortened (4 kB each) but not
# limited in number a 4 MB one, over the 3 MB the test allows (each traceback costs the kernel about 10 ms: 2000 of
# them were a third of the class's CPU)
ERROR_FLOOD = """
_ip = get_ipython()
for _ in range(500):
    try:
        raise ValueError("e" * 20_000)
    except ValueError:
        _ip.showtraceback()
"""

# outputs of one character whose metadata is padded: 30 x 2 MB
META_FLOOD = """
from IPython.display import display
for _ in range(30):
    display({"text/plain": "m"}, raw=True, metadata={"pad": "p" * 2_000_000})
"""

# the kernel kills its parent, the grading worker
KILL_WORKER = """
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
"""

# exported code: read every frame above and every object in the process for code, and run what it finds (a
# reference source within reach would replace the stubs, as `uses=` sources did before issue 28)
FRAMES_EXPORTED = """
import gc as _gc, sys as _sys
_found = []
if "ipykernel" not in _sys.modules:  # in the probe process (in the kernel it would find and rerun its own cell)
    for _o in _gc.get_objects():
        try:
            if isinstance(_o, dict):
                for _v in list(_o.values())[:200]:
                    if isinstance(_v, str) and "def " in _v and "return" in _v and len(_v) < 200_000:
                        _found.append(_v)
        except Exception:
            pass
    _fr = _sys._getframe()
    while _fr is not None:
        _found += [v for v in list(_fr.f_locals.values()) if isinstance(v, str) and "def " in v]
        _fr = _fr.f_back
for _src in _found:
    try:
        exec(compile(_src, "<found>", "exec"), globals())
    except BaseException:
        pass
"""

# exported code: rewrite every record the probe runner sends into a passing verdict (and one that quotes
# "reference code"), and write forged records on every open file descriptor
FORGE_RECORD = """
import os as _os, sys as _sys, json as _json
_pr = _sys.modules.get("__main__")
if _pr is not None and hasattr(_pr, "Channel"):
    _send = _pr.Channel.send
    def _forged(self, msg):
        if msg.get("t") == "record":
            msg = dict(msg, values={}, outcome={"kind": "raised", "type": "AutograderCheck",
                       "message": "passed: full points (reference: def forward(self, x): return x)" + "!" * 5000})
        return _send(self, msg)
    _pr.Channel.send = _forged
    for _fd in range(3, 40):
        try:
            for _ex in ("2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "6.1", "6.2", "6.3"):
                _os.write(_fd, (_json.dumps({"t": "record", "ex": _ex, "values": {}, "outcome": {"kind": "ok"}})
                               + "\\n").encode())
        except OSError:
            pass
"""

WRONG = "out = x.data * 0.5"

# a correct module 02 written differently
ALT = {
    "ReLU": "out = x.data * (x.data > 0)",
    "Sigmoid": "a = x.data\ne = np.exp(-np.abs(a))\nout = np.where(a >= 0, 1 / (1 + e), e / (1 + e))",
    "Tanh": "a = x.data\ne = np.expm1(-2 * np.abs(a))\nout = np.sign(a) * (-e / (2 + e))",
    "GELU": "a = x.data\nout = a / 2 * (1 + np.tanh(math.sqrt(2 / math.pi) * a * (1 + 0.044715 * a * a)))",
    "Softmax": "a = x.data\nm = a.max(axis=axis, keepdims=True)\n"
               "out = np.exp(a - m - np.log(np.exp(a - m).sum(axis=axis, keepdims=True)))",
    "LogSoftmax": "a = x.data\nm = np.max(a, axis=axis, keepdims=True)\n"
                  "out = a - (m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)))",
}


def set_solutions(nb, code_for) -> None:
    """Replace the solution region of each solution cell by `code_for(cell)` (None: keep it)."""
    for cell in nb.cells:
        if not (nbs.is_solution_cell(cell) and cell.cell_type == "code"):
            continue
        code = code_for(cell)
        if code is None:
            continue
        lines = cell.source.splitlines()
        i = next(k for k, ln in enumerate(lines) if nbs.BEGIN_SOLUTION in ln)
        j = next(k for k, ln in enumerate(lines) if nbs.END_SOLUTION in ln)
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        cell.source = "\n".join(lines[: i + 1] + [indent + ln for ln in code.strip().splitlines()] + lines[j:])


def class_of(cell) -> str:
    m = re.search(r"^class (\w+)\(", cell.source, re.M)
    return m.group(1) if m else ""


def insert_early(nb, code: str):
    """A code cell of the student's right after the setup cell (before every exercise)."""
    i = next(k for k, c in enumerate(nb.cells) if c.cell_type == "code" and "import numpy as np" in c.source)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(code))
    return nb


def setup_cell(nb):
    return next(c for c in nb.cells if c.cell_type == "code" and "import numpy as np" in c.source)


def points_of(module, exercises) -> float:
    return sum(float(nbs.nbgrader_meta(c)["points"]) for c in nbs.read(module.notebook).cells
               if nbs.is_test_cell(c) and nbs.exercise_label(c).split(":")[0].split()[-1] in exercises)


def make_submissions(module) -> dict[str, tuple[nbformat.NotebookNode, object]]:
    """{student: (notebook, expected score: 'max', 'zero' or a number of points)}."""
    source = nbs.read(module.notebook)
    release = nbs.release(source)
    good = correct_nb(release, source)

    def wrong():
        nb = copy.deepcopy(good)
        set_solutions(nb, lambda c: WRONG if class_of(c) in ALT else None)
        return nb

    def stub(*cells: str, exported: str = ""):
        nb = copy.deepcopy(release)
        if exported:
            setup_cell(nb).source += "\n" + exported
        for code in cells:
            insert_early(nb, code)
        return nb

    alt = copy.deepcopy(good)
    set_solutions(alt, lambda c: ALT.get(class_of(c)))
    frame = copy.deepcopy(good)
    set_solutions(frame, lambda c: FRAME if class_of(c) in ALT else None)
    exported = wrong()
    setup_cell(exported).source += "\n" + ALLCLOSE
    half = copy.deepcopy(good)  # 2.1-2.3 right, 2.4-2.6 wrong, and the plant
    set_solutions(half, lambda c: WRONG if class_of(c) in ("GELU", "Softmax", "LogSoftmax") else None)
    insert_early(half, PLANT)
    return {
        "correct": (good, "max"),
        "alt": (alt, "max"),
        "allclose": (insert_early(wrong(), ALLCLOSE), "zero"),
        "npproxy": (insert_early(wrong(), NP_PROXY), "zero"),
        "transformer": (stub(TRANSFORMER), "zero"),
        "customexc": (stub(CUSTOM_EXC), "zero"),
        "builtins": (insert_early(wrong(), BUILTINS), "zero"),
        "sysmodules": (insert_early(wrong(), SYS_MODULES), "zero"),
        "unittest": (insert_early(wrong(), UNITTEST), "zero"),
        "frame": (frame, "zero"),
        "exported": (exported, "zero"),
        # issue 28, one case per mechanism
        "planted": (half, points_of(module, ("2.1", "2.2", "2.3"))),
        "frames": (stub(exported=FRAMES_EXPORTED), "zero"),
        "forge": (stub(exported=FORGE_RECORD), "zero"),
        "hiddenprint": (stub(HIDDEN_PRINT), "zero"),
        "updateflood": (stub(UPDATE_FLOOD), "zero"),
        "errorflood": (stub(ERROR_FLOOD), "zero"),
        "metaflood": (stub(META_FLOOD), "zero"),
        "killworker": (stub(KILL_WORKER), "zero"),
    }


# cheats whose code must fool at least one of the notebook's own test cells (else the cheat proves nothing)
MUST_FOOL_THE_KERNEL = {"allclose", "npproxy", "transformer", "customexc", "builtins", "sysmodules", "unittest",
                        "exported"}
# what a grading run reports for them other than `graded`
STATUS = {"killworker": ("failed", "killed by SIGKILL, not by the grader nor for memory: a process of the submission")}
FLOODS = ("updateflood", "errorflood", "metaflood")


def secrets_of(module) -> tuple[list[str], list[str]]:
    """(hidden test lines, reference solution lines) of `module` that no student edition shows: neither may appear
    in what a cheat gets back."""
    source = nbs.read(module.notebook)
    release = nbs.release(source)
    given = {ln.strip() for c in release.cells for ln in c.source.splitlines()}
    hidden, solution = [], []
    for c in source.cells:
        if nbs.is_test_cell(c):
            for m in re.finditer(rf"{nbs.BEGIN_HIDDEN}\n(.*?){nbs.END_HIDDEN}", c.source, re.S):
                hidden += [ln.strip() for ln in m.group(1).splitlines()
                           if len(ln.strip()) > 20 and ln.strip() not in given]  # (a visible test may repeat it)
        if nbs.is_solution_cell(c):
            for m in re.finditer(rf"{nbs.BEGIN_SOLUTION}\n(.*?){nbs.END_SOLUTION}", c.source, re.S):
                solution += [ln.strip() for ln in m.group(1).splitlines()
                             if len(ln.strip()) > 20 and ln.strip() not in given]
    return hidden, solution


def everything_returned(course: Path, module, student: str, r: dict) -> str:
    """The autograded notebook (sources and outputs, decoded), the feedback page and the log of one student, as one
    text; output that is base64 of reversed text is decoded too."""
    parts = [(course / r["log"]).read_text()]
    graded = course / "nbgrader" / "autograded" / student / module.slug / module.notebook.name
    if graded.exists():
        for c in nbs.read(graded).cells:
            parts.append(c.source)
            for o in c.get("outputs", []):
                parts += [str(o.get("text", "")), str(o.get("evalue", "")), *map(str, o.get("traceback", [])),
                          *map(str, o.get("data", {}).values())]
    page = course / "nbgrader" / "feedback" / student / module.slug / f"{module.notebook.stem}.html"
    if page.exists():
        parts.append(html.unescape(page.read_text()))
    text = "\n".join(parts)
    for blob in re.findall(r"ENC:([A-Za-z0-9+/=]{8,})", text):
        try:
            text += "\n" + base64.b64decode(blob).decode("utf-8", "replace")[::-1]
        except ValueError:
            pass
    return text


def test_cheats_score_what_the_code_deserves(course, add_release, tmp_path):
    module = MODULES["02"]
    set_settings(course, grading__notebook_timeout="120", execution__cell_timeout="60")
    add_release(course, "02")
    subs = make_submissions(module)
    inbox = write_class(tmp_path / "lms", {f"{s}_{module.slug}.ipynb": nbformat.writes(nb) for s, (nb, _) in subs.items()})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    proc = tito(course, "nbgrader", "autograde", "02")
    assert "trusted checks: the 6 exercises" in proc.output, proc.output
    bwrap = "sandbox bwrap" in proc.output
    res = results(course, module.slug)
    full = total_points(module)
    for student, (_, expect) in subs.items():
        r = res[student]
        log = (course / r["log"]).read_text()
        where = f"{student}: {r}\n{log}"
        status, reason = STATUS.get(student, ("graded", ""))
        assert r["status"] == status and reason in r["reason"], where
        assert r["score"] == {"max": full, "zero": 0.0}.get(expect, expect), where
        if student in MUST_FOOL_THE_KERNEL:
            assert "the cell's own tests passed, but the trusted check failed" in log, \
                f"{student}: the cheat did not fool any test cell in the kernel, so it proves nothing\n{log}"
    if bwrap:  # the plant reached the folders a grading process could import from (it cannot, in isolated mode)
        graded = nbs.read(course / "nbgrader" / "autograded" / "planted" / module.slug / module.notebook.name)
        assert any("planted" in o.get("text", "") and not o.get("text", "").startswith("planted 0 ")
                   for c in graded.cells for o in c.get("outputs", [])), "the plant wrote nothing"
    # the forged verdict is quoted as the student's own output, never the grader's words
    for student in ("forge", "frames"):
        text = (course / res[student]["log"]).read_text()
        assert not re.search(r"Exercise 2\.\d: passed", text), text
        assert all(text[i - 1] == "'" for i in (m.start() for m in re.finditer("passed: full points", text))), text
    # one verdict everywhere: gradebook (CSV export) = results = the autograded notebook's error outputs
    assert tito(course, "nbgrader", "export").returncode == 0
    with (course / "nbgrader" / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == module.slug}
    for student in subs:
        assert float(rows[student]["raw_score"]) == res[student]["score"], rows[student]
    assert tito(course, "nbgrader", "feedback", "02").returncode == 0
    page = (course / "nbgrader" / "feedback" / "allclose" / module.slug / f"{module.notebook.stem}.html").read_text()
    assert "AutograderCheck" in page, "the feedback does not say the autograder's check failed"
    # nothing of the reference or the hidden tests in what any cheat gets back, however encoded
    hidden, solution = secrets_of(module)
    assert hidden and solution
    for student, (nb, expect) in subs.items():
        own = "\n".join(c.source for c in nb.cells)  # a student's own solution lines are theirs to see
        text = everything_returned(course, module, student, res[student])
        leaked = [ln for ln in hidden + solution if ln in text and ln not in own]
        assert not leaked, f"{student}: the reference or hidden tests reached what the student gets back: {leaked[:3]}"
    for student in FLOODS:  # output is capped on what the kernel sent, however it was sent
        page = course / "nbgrader" / "feedback" / student / module.slug / f"{module.notebook.stem}.html"
        graded = course / "nbgrader" / "autograded" / student / module.slug / module.notebook.name
        assert graded.stat().st_size < 3_000_000 and page.stat().st_size < 4_000_000, (student, graded.stat().st_size)
        assert "characters of output were cut" in graded.read_text(), student


def test_fork_bomb_in_one_run_does_not_starve_another(course, add_release, tmp_path):
    """Two grading runs on one machine at once: a fork bomb in one leaves the other's kernels unharmed (each run
    leases its own user ids; each submission has its own process limit)."""
    if os.geteuid() != 0 or (bwrap_available() and namespace_available()):
        pytest.skip("needs root and a sandbox that drops to a leased user id (bubblewrap or namespace)")
    module = MODULES["02"]
    other = tmp_path / "other"
    shutil.copytree(course, other)
    for c in (course, other):
        set_settings(c, grading__notebook_timeout="90", execution__cell_timeout="25", grading__workers="1",
                     grading__max_processes="64")
        add_release(c, "02")
    source = nbs.read(module.notebook)
    release = nbs.release(source)
    bomb = insert_early(copy.deepcopy(release), FORK_BOMB)
    inbox = write_class(tmp_path / "a", {f"bomb_{module.slug}.ipynb": nbformat.writes(bomb)})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    good = correct_nb(release, source)
    inbox = write_class(tmp_path / "b", {f"good{i}_{module.slug}.ipynb": nbformat.writes(good) for i in range(2)})
    assert tito(other, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    env = dict(os.environ, MPLBACKEND="Agg", COLUMNS="250")
    env.pop("TITO_ROOT", None)
    runs = [subprocess.Popen([sys.executable, "-m", "tito.main", "nbgrader", "autograde", "02"], cwd=c,
                             env=dict(env, PYTHONPATH=str(c)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for c in (course, other)]
    outs = [p.communicate(timeout=900)[0] for p in runs]
    res = results(other, module.slug)
    full = total_points(module)
    for s in ("good0", "good1"):
        assert res[s]["status"] == "graded" and res[s]["score"] == full, (res[s], outs[1])
    bombed = results(course, module.slug)["bomb"]
    assert bombed["score"] == 0.0, bombed
    uids = [set(re.findall(r"user id \((\d+)\.\.(\d+)", o)) for o in outs]
    assert uids[0] and uids[1] and uids[0] != uids[1], outs


FORK_BOMB = """
import os, time
_kids = 0
_end = time.time() + 20
while time.time() < _end:
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        _kids += 1
    except OSError:
        time.sleep(0.05)
print("forked", _kids)
"""


# ------------------------------------------------------------------ differently written solutions, probes only


@pytest.mark.parametrize("cheat", ["frames", "forge"])
def test_exported_cheats_on_module_06_stubs(cheat):
    """Before issue 28 module 06's reference rules came back whole in one student's feedback, read by exported code
    from the probe process. Its stubs plus either exported-code cheat score 0 on every exercise, and no verdict holds
    a line of the reference or of a hidden test."""
    from tests.test_trusted import exported, run_local

    module = MODULES["06"]
    code = {"frames": FRAMES_EXPORTED, "forge": FORGE_RECORD}[cheat]
    checked = run_local("06", exported(nbs.release(nbs.read(module.notebook))) + "\n" + code)
    assert checked.verdicts and all(checked.verdicts.values()), checked.verdicts
    hidden, solution = secrets_of(module)
    text = "\n".join([*checked.verdicts.values(), *checked.notes])
    assert not [ln for ln in hidden + solution if ln in text], text
