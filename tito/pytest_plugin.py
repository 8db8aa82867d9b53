"""pytest plugin: report failures as the exercise and the function a student must fix.

Tests are marked `@pytest.mark.exercise("1.4", "Tensor.matmul")` (and files with
`pytestmark = pytest.mark.module("01")`). With this plugin:

- a test that fails because a stub raised `NotImplementedError` is reported in one line,
  `Exercise 1.4 (Tensor.matmul): not implemented yet: Tensor.matmul`, not as a traceback wall;
- every other failure gets a first line naming the exercise and function;
- `--exercise 1.4` runs only that exercise's tests; `--tito-report FILE` writes a JSON summary
  that `tito test` reads.
"""
from __future__ import annotations

import builtins
import json
import os
import re
import tempfile
from pathlib import Path

import pytest

try:  # Python 3.11+; on 3.10 hypothesis brings the `exceptiongroup` backport
    _GROUPS: tuple[type, ...] = (builtins.BaseExceptionGroup,)
except AttributeError:
    try:
        from exceptiongroup import BaseExceptionGroup as _BackportGroup

        _GROUPS = (_BackportGroup,)
    except ImportError:
        _GROUPS = ()


def pytest_addoption(parser):
    group = parser.getgroup("tito")
    group.addoption("--exercise", action="append", default=[], help="run only the tests of this exercise (e.g. 1.4)")
    group.addoption("--tito-report", default=None, help="write a JSON summary of results to this file")


def pytest_collection_modifyitems(config, items):
    config._tito_exercises = sorted({_exercise(item)[0] for item in items} - {""})
    wanted = config.getoption("--exercise")
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        m = item.get_closest_marker("exercise")
        (keep if m and m.args and str(m.args[0]) in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _exercise(item) -> tuple[str, str]:
    m = item.get_closest_marker("exercise")
    if not m:
        return "", ""
    number = str(m.args[0]) if m.args else ""
    function = str(m.args[1]) if len(m.args) > 1 else m.kwargs.get("function", "")
    return number, function


def qualname(frame) -> str:
    """`Class.method` of a frame: `co_qualname` on Python 3.11+, rebuilt from `self`/`cls` on 3.10."""
    code = frame.f_code
    if hasattr(code, "co_qualname"):
        return code.co_qualname
    owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
    if owner is not None:
        cls = owner if isinstance(owner, type) else type(owner)
        for klass in cls.__mro__:  # the class that defines the method, not a subclass
            if getattr(klass.__dict__.get(code.co_name), "__code__", None) is code:
                return f"{klass.__qualname__}.{code.co_name}"
        return f"{cls.__qualname__}.{code.co_name}"
    return code.co_name


def _not_implemented_function(excinfo) -> str | None:
    """Qualified name of the function whose stub raised NotImplementedError, if that is the failure."""
    exc = excinfo.value
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            tb = exc.__traceback__
            if tb is None:
                return "(unknown function)"
            while tb.tb_next is not None:
                tb = tb.tb_next
            return qualname(tb.tb_frame)
        if _GROUPS and isinstance(exc, _GROUPS) and exc.exceptions:
            exc = exc.exceptions[0]
        else:
            exc = exc.__cause__ or exc.__context__
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if _GROUPS and isinstance(exc, _GROUPS):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _one_line(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize(exc: BaseException, limit: int = 500) -> str:
    """The failure in one line a student can act on.

    numpy.testing puts its message on the lines after an empty first one, so the first few
    non-empty lines are kept, not the first line. A hypothesis failure (one, or a group of
    "distinct failures") shows the first failure and the example that made it fail.
    """
    leaves = _leaves(exc)
    first = leaves[0]
    name = type(first).__name__
    lines = [ln.strip() for ln in str(first).splitlines() if ln.strip()]
    text = f"{name}: " + "; ".join(lines[:6]) if lines else f"{name} (no message)"
    if len(lines) > 6:
        text += "; ..."
    if len(leaves) > 1:
        text = f"{len(leaves)} different failures; the first: {text}"
    notes = [n for n in getattr(first, "__notes__", []) or [] if isinstance(n, str)]
    example = [n for n in notes if n.startswith(("Falsifying example", "Failing test case", "Draw "))]
    if example:
        return _one_line(text, limit * 3 // 5) + " | " + _one_line(" ".join(example), limit * 2 // 5)
    return _one_line(text, limit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    number, function = _exercise(item)
    rep.tito_exercise, rep.tito_function, rep.tito_reason = number, function, ""
    if not rep.failed or call.excinfo is None:
        return
    header = f"Exercise {number} ({function})" if number else item.nodeid
    missing = _not_implemented_function(call.excinfo)
    if missing:
        rep.tito_reason = f"not implemented yet: {missing}"
        rep.longrepr = f"{header}: {rep.tito_reason}"
    else:
        rep.tito_reason = summarize(call.excinfo.value)
        if number:
            rep.sections.insert(0, ("what to fix", f"{header}: {rep.tito_reason}"))


class _Collector:
    def __init__(self, path: Path):
        self.path, self.results = path, {}

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and not (report.failed or report.skipped):
            return
        prev = self.results.get(report.nodeid)
        if prev and prev["outcome"] == "failed":
            return
        reason = getattr(report, "tito_reason", "")
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            m = re.match(r"could not import '([\w.]+)'", reason)
            reason = f"needs {m.group(1)}, not installed" if m else reason
        self.results[report.nodeid] = {
            "nodeid": report.nodeid,
            "outcome": report.outcome,
            "when": report.when,
            "exercise": getattr(report, "tito_exercise", ""),
            "function": getattr(report, "tito_function", ""),
            "reason": reason,
        }

    def pytest_sessionfinish(self, session, exitstatus):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"exitstatus": int(exitstatus), "tests": list(self.results.values()),
                       "exercises": getattr(session.config, "_tito_exercises", [])}, f, indent=1)
        os.replace(tmp, self.path)


def pytest_configure(config):
    config.addinivalue_line("markers", "module(nn): tests of one course module")
    config.addinivalue_line("markers", "exercise(number, function): the notebook exercise a test checks")
    path = config.getoption("--tito-report")
    if path:
        config.pluginmanager.register(_Collector(Path(path)), "tito-report")
        _quiet_hypothesis()


def _quiet_hypothesis():
    """Under `tito test`, a failing property test reports its first failure instead of shrinking it."""
    try:
        from hypothesis import Phase, settings
    except ImportError:
        return
    settings.register_profile("tito", database=None, print_blob=False,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("tito")


def pytest_terminal_summary(terminalreporter):
    missing = {}
    for rep in terminalreporter.stats.get("failed", []):
        reason = getattr(rep, "tito_reason", "")
        if reason.startswith("not implemented yet"):
            missing.setdefault(reason.split(": ", 1)[1], 0)
            missing[reason.split(": ", 1)[1]] += 1
    if missing:
        terminalreporter.section("not implemented yet")
        for fn, n in sorted(missing.items()):
            terminalreporter.write_line(f"{fn}  ({n} test{'s' if n > 1 else ''})")
