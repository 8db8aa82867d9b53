"""The cheat suite: dishonest submissions score what their code deserves, honest ones keep every point.

One `tito nbgrader autograde` run of module 02 grades a class made from the release: a correct
notebook, a correct one written differently, and wrong or stub code under every cheat of issue 14
(patched numpy comparisons, a lenient `np` proxy, an IPython input transformer rewriting the test
cells, `set_custom_exc` plus a patched `kernel.do_execute`) and their variants (builtins,
sys.modules, unittest.mock, reading expected values from the callers' frames, the cheat inside the
exported code, forged probe records). Each cheat does fool the notebook's own test cells (the log
says which cells passed in the kernel), and the trusted checks still give it 0.

Differently written correct solutions of modules 06 and 12 (another traversal order, einsum
attention) are checked with the probes directly (no notebook run).
"""
from __future__ import annotations

import copy
import csv
import re
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest

from tests.simulated_class import correct as correct_nb
from tests.test_grading import INSTRUCTOR, MODULES, ROOT, course, results, set_settings, tito, total_points, write_class  # noqa: F401
from tito import notebooks as nbs

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

# exported code that writes a record for every exercise into the checker's folder, then ends the process
FORGE = """
import glob as _glob, json as _json, os as _os, sys as _sys
if "tito.probe_run" in " ".join(_sys.argv) or "tito.probe_run" in _sys.modules:
    for _ex in ("2.1", "2.2", "2.3", "2.4", "2.5", "2.6"):
        open(f"{_ex}.json", "w").write(_json.dumps({"values": {}, "error": ""}))
        import numpy as _n, io as _io
        _b = _io.BytesIO(); _n.savez(_b); open(f"{_ex}.npz", "wb").write(_b.getvalue())
    _os._exit(0)
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


def make_submissions(module) -> dict[str, tuple[nbformat.NotebookNode, str]]:
    """{student: (notebook, expected score: 'max' or 'zero')}."""
    source = nbs.read(module.notebook)
    release = nbs.release(source)
    good = correct_nb(release, source)

    def wrong():
        nb = copy.deepcopy(good)
        set_solutions(nb, lambda c: WRONG if class_of(c) in ALT else None)
        return nb

    stub = copy.deepcopy(release)
    alt = copy.deepcopy(good)
    set_solutions(alt, lambda c: ALT.get(class_of(c)))
    frame = copy.deepcopy(good)
    set_solutions(frame, lambda c: FRAME if class_of(c) in ALT else None)
    exported = wrong()
    setup = next(c for c in exported.cells if c.cell_type == "code" and "import numpy as np" in c.source)
    setup.source += "\n" + ALLCLOSE
    forge = copy.deepcopy(stub)
    setup = next(c for c in forge.cells if c.cell_type == "code" and "import numpy as np" in c.source)
    setup.source += "\n" + FORGE
    return {
        "correct": (good, "max"),
        "alt": (alt, "max"),
        "allclose": (insert_early(wrong(), ALLCLOSE), "zero"),
        "npproxy": (insert_early(wrong(), NP_PROXY), "zero"),
        "transformer": (insert_early(copy.deepcopy(stub), TRANSFORMER), "zero"),
        "customexc": (insert_early(copy.deepcopy(stub), CUSTOM_EXC), "zero"),
        "builtins": (insert_early(wrong(), BUILTINS), "zero"),
        "sysmodules": (insert_early(wrong(), SYS_MODULES), "zero"),
        "unittest": (insert_early(wrong(), UNITTEST), "zero"),
        "frame": (frame, "zero"),
        "exported": (exported, "zero"),
        "forge": (forge, "zero"),
    }


# cheats whose code must fool at least one of the notebook's own test cells (else the cheat proves nothing)
MUST_FOOL_THE_KERNEL = {"allclose", "npproxy", "transformer", "customexc", "builtins", "sysmodules", "unittest",
                        "exported"}


def test_cheats_score_what_the_code_deserves(course, tmp_path):
    module = MODULES["02"]
    set_settings(course, grading__notebook_timeout="120", execution__cell_timeout="60")
    assert tito(course, "nbgrader", "generate", "02").returncode == 0
    subs = make_submissions(module)
    inbox = write_class(tmp_path / "lms", {f"{s}_{module.slug}.ipynb": nbformat.writes(nb) for s, (nb, _) in subs.items()})
    assert tito(course, "nbgrader", "collect", "02", str(inbox)).returncode == 0
    proc = tito(course, "nbgrader", "autograde", "02")
    assert "trusted checks: the 6 exercises" in proc.output, proc.output
    res = results(course, module.slug)
    full = total_points(module)
    for student, (_, expect) in subs.items():
        r = res[student]
        log = (course / r["log"]).read_text()
        where = f"{student}: {r}\n{log}"
        assert r["status"] == "graded", where
        assert r["score"] == (full if expect == "max" else 0.0), where
        if student in MUST_FOOL_THE_KERNEL:
            assert "the cell's own tests passed, but the trusted check failed" in log, \
                f"{student}: the cheat did not fool any test cell in the kernel, so it proves nothing\n{log}"
    # one verdict everywhere: gradebook (CSV export) = results = the autograded notebook's error outputs
    assert tito(course, "nbgrader", "export").returncode == 0
    with (course / "nbgrader" / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == module.slug}
    for student in subs:
        assert float(rows[student]["raw_score"]) == res[student]["score"], rows[student]
    assert tito(course, "nbgrader", "feedback", "02").returncode == 0
    page = (course / "nbgrader" / "feedback" / "allclose" / module.slug / f"{module.notebook.stem}.html").read_text()
    assert "AutograderCheck" in page, "the feedback does not say the autograder's check failed"


# ------------------------------------------------------------------ differently written solutions, probes only


def probe_verdicts(module, edit) -> dict[str, str]:
    """The trusted verdicts of the module's source notebook with `edit(nb)` applied, probes run over its export
    (outside any sandbox: this checks the probes, not the isolation)."""
    import base64
    import os
    import sys

    from tito import probes as P
    from tito.trusted import Plan

    nb = nbs.read(module.notebook)
    edit(nb)
    plan = Plan.make(ROOT, module, seed=1234)
    job, notes = plan.job(nb)
    assert not notes, notes
    with tempfile.TemporaryDirectory(prefix="tito-probe-test-") as tmp:
        pkg = Path(tmp) / "pkg"
        shutil.copytree(ROOT / "tinytorch", pkg / "tinytorch", ignore=shutil.ignore_patterns("__pycache__"))
        for rel, data in job["files"].items():
            (pkg / rel).write_bytes(base64.b64decode(data))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg), str(ROOT)]), OPENBLAS_NUM_THREADS="1")
        raw = P.run_groups(plan.base(), job["groups"], sys.executable, env, Path(tmp) / "work", 300)
    return plan.verdicts(raw)


def replace_in_solution(nb, marker: str, old: str, new: str) -> None:
    cell = next(c for c in nb.cells if nbs.is_solution_cell(c) and marker in c.source)
    assert cell.source.count(old) == 1, (marker, old)
    cell.source = cell.source.replace(old, new)
