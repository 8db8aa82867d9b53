"""pytest plugin: report failures as the exercise and the function a student must fix.

Tests are marked `@pytest.mark.exercise("1.4", "Tensor.matmul")` (and files with
`pytestmark = pytest.mark.module("01")`). With this plugin:

- a test that fails because a stub raised `NotImplementedError` is reported in one line,
  `Exercise 1.4 (Tensor.matmul): not implemented yet: Tensor.matmul`, not as a traceback wall;
- every other failure gets a first line naming the exercise and function, with the test's own
  message first (see `tito.failures`), a recursion named as one, and a failure inside another
  module's code attributed to that module ("the failure is inside module 12's ...");
- `--exercise 1.4` runs only that exercise's tests; `--tito-report FILE` writes a JSON summary
  that `tito test` reads.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest

from tito import failures


def pytest_addoption(parser):
    group = parser.getgroup("tito")
    group.addoption("--exercise", action="append", default=[], help="run only the tests of this exercise (e.g. 1.4)")
    group.addoption("--tito-report", default=None, help="write a JSON summary of results to this file")


def pytest_collection_modifyitems(config, items):
    config._tito_exercises = sorted({_exercise(item)[0] for item in items} - {""})
    for item in items:
        _short_stub_failures(item)
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


def _short_stub_failures(item) -> None:
    """A stub's failure is reported as one line ("not implemented yet: f") without building pytest's traceback.

    pytest's report of a failure parses the source of every file in the traceback (about 0.2 s for the
    package's larger modules), and hypothesis builds the same report once more for each failure it finds:
    on a fresh release, where every test fails on a stub, that was 50 s of a module's 55 s `tito test`."""
    if not hasattr(item, "repr_failure"):
        return
    full = item.repr_failure

    def repr_failure(excinfo, *args, **kwargs):
        missing = _not_implemented_function(excinfo)
        if missing is None:
            return full(excinfo, *args, **kwargs)
        number, function = _exercise(item)
        header = f"Exercise {number} ({function})" if number else item.nodeid
        return f"{header}: not implemented yet: {missing}"

    item.repr_failure = repr_failure


def _exercise(item) -> tuple[str, str]:
    m = item.get_closest_marker("exercise")
    if not m:
        return "", ""
    number = str(m.args[0]) if m.args else ""
    function = str(m.args[1]) if len(m.args) > 1 else m.kwargs.get("function", "")
    return number, function


def qualname(frame) -> str:
    """`Class.method` of a frame (its code's `co_qualname`)."""
    return frame.f_code.co_qualname


def _not_implemented(exc: BaseException):
    """The NotImplementedError behind a failure (through causes, contexts and groups), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return exc
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        else:
            exc = exc.__cause__ or exc.__context__
    return None


def _not_implemented_function(excinfo) -> str | None:
    """Qualified name of the function whose stub raised NotImplementedError, if that is the failure."""
    exc = _not_implemented(excinfo.value)
    if exc is None:
        return None
    tb = exc.__traceback__
    if tb is None:
        return "(unknown function)"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return qualname(tb.tb_frame)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def summarize(exc: BaseException, limit: int = 500) -> str:
    """The failure in one line a student can act on.

    The test's own message comes first (numpy.testing puts it after a boilerplate line), then the
    numbers; a RecursionError names the function that called itself. A hypothesis failure (one, or
    a group of "distinct failures") shows the first failure and the example that made it fail.
    """
    leaves = _leaves(exc)
    first = leaves[0]
    name = type(first).__name__
    if isinstance(first, RecursionError):
        rec = failures.repeated_frame(first.__traceback__)
        where = failures.package_path(rec[1]) if rec else None
        text = f"{name}: " + failures.recursion_note(rec[0] if rec else None, rec[2] if rec else None, where or "")
    else:
        message = str(first)
        if isinstance(first, AssertionError):  # drop pytest's "assert 24.7 <= 3" after the test's own words
            lines = message.splitlines()
            cut = next((i for i, ln in enumerate(lines) if i and ln.startswith("assert ")), None)
            message = "\n".join(lines[:cut]) if cut is not None and any(ln.strip() for ln in lines[:cut]) else message
        text = failures.describe(name, message)
    if len(leaves) > 1:
        text = f"{len(leaves)} different failures; the first: {text}"
    notes = [n for n in getattr(first, "__notes__", []) or [] if isinstance(n, str)]
    example = [n for n in notes if n.startswith(("Falsifying example", "Failing test case", "Draw "))]
    if example:
        return failures.one_line(text, limit * 3 // 5) + " | " + failures.one_line(" ".join(example), limit * 2 // 5)
    return failures.one_line(text, limit)


_MODULES: dict = {}


def _course_modules(item):
    """The course modules of the edition the test file belongs to ([] outside a course)."""
    from tito.course import CourseError, find_root, load_modules

    start = Path(str(item.path)).parent
    if start not in _MODULES:
        try:
            root = find_root(start)
            _MODULES[start] = (root, load_modules(root))
        except (CourseError, OSError):
            _MODULES[start] = (None, [])
    return _MODULES[start]


def _chain(item, exc: BaseException) -> list:
    """The other modules the failure went through, deepest first (see `tito.failures.module_chain`);
    the test's own module is its `module` mark."""
    marker = item.get_closest_marker("module")
    own = str(marker.args[0]).zfill(2) if marker and marker.args else None
    root, modules = _course_modules(item)
    if not modules:
        return []
    return failures.module_chain(failures.traceback_frames(exc.__traceback__), modules, own, root)


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
        chain = _chain(item, _not_implemented(call.excinfo.value))
        rep.tito_reason = f"not implemented yet: {missing}"
        if chain:
            rep.tito_reason += f" (module {chain[0][0]}, {chain[0][2]})"
            rep.longrepr = f"{header}: {rep.tito_reason}"  # repr_failure (see _short_stub_failures) has no chain
    else:
        rep.tito_reason = summarize(call.excinfo.value)
        chain = _chain(item, _leaves(call.excinfo.value)[0])
        if chain:
            where = "the failure is inside " + ", called from ".join(f"module {n}'s {fn} ({rel})" for n, fn, rel in chain[:3])
            rep.tito_reason = f"{where}: {rep.tito_reason}"
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
            if m and m.group(1) == "torch":  # the reference every op is compared with: an extra of the course
                reason = 'needs torch, not installed: pip install -e ".[reference]"'
            else:
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
            fn = reason.split(": ", 1)[1]
            missing[fn] = missing.get(fn, 0) + 1
    if missing:
        terminalreporter.section("not implemented yet")
        for fn, n in sorted(missing.items()):
            terminalreporter.write_line(f"{fn}  ({n} test{'s' if n > 1 else ''})")
