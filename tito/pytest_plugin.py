"""pytest plugin: report failures as the exercise and the function a student must fix.

Tests are marked `@pytest.mark.exercise("1.4", "Tensor.matmul")` (and files with
`pytestmark = pytest.mark.module("01")`). With this plugin:

- a test that fails because a stub raised `NotImplementedError` is reported in one line,
  `Exercise 1.4 (Tensor.matmul): not implemented yet: Tensor.matmul`, not as a traceback wall;
- every other failure gets a first line naming the exercise and function, with the test's own
  message first (see `tito.failures`), a recursion named as one, and a failure raised in an earlier
  module's code reported as where it *surfaced* ("the failure surfaced in module 01's Tensor.__init__");
- a failed test is run once more with the exercises of its module watched (`sys.settrace`, only then:
  a test that passes costs nothing): an exercise whose return value contradicts its annotation is named
  as the culprit ("14.4 ModulePaths.pop returned a list where its annotation says None"); an exercise the
  test can run (its source and the package's, `failures.CallGraph`) or ran, whose own tests fail, is
  named as the one to fix first ("not checked on its own: fix 17.1 dead_code_elimination first");
- every test has a time limit (package tests: `--tito-timeout`, else the `tito_test_timeout` ini option;
  other tests: `tito_other_test_timeout`; `@pytest.mark.time_limit(s)` sets one test's): a test past it
  fails with "18.4 PagedKVCache.free: test did not finish in 30 s", naming where each thread was, and
  the run goes on to the other tests;
- `--exercise 1.4` runs only that exercise's tests; `--tito-report FILE` writes a JSON summary
  that `tito test` reads (and `FILE.running` names the test in progress, for a run killed from outside).
"""
from __future__ import annotations

import dis
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from tito import failures

DEFAULT_TIMEOUT = 120.0  # seconds per package test (marked `module`) when neither the command line nor the ini says
DEFAULT_SLOW_TIMEOUT = 1800.0  # seconds per other test (end to end: notebooks, the CLI, milestones): only a hang
RERUN_UNDER = 10.0  # a failed test that took longer is not run again to find the culprit
SETTING = "[execution] test_timeout in settings.ini"


def pytest_addoption(parser):
    group = parser.getgroup("tito")
    group.addoption("--exercise", action="append", default=[], help="run only the tests of this exercise (e.g. 1.4)")
    group.addoption("--tito-report", default=None, help="write a JSON summary of results to this file")
    group.addoption("--tito-timeout", type=float, default=None,
                    help="seconds one test may run (0: no limit; default: the tito_test_timeout ini option)")
    parser.addini("tito_test_timeout", f"seconds one package test (marked module) may run (0: no limit; default "
                  f"{DEFAULT_TIMEOUT:g})", default=str(DEFAULT_TIMEOUT))
    parser.addini("tito_other_test_timeout", f"seconds any other test may run (0: no limit; default "
                  f"{DEFAULT_SLOW_TIMEOUT:g})", default=str(DEFAULT_SLOW_TIMEOUT))


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


def _own_module(item) -> str | None:
    marker = item.get_closest_marker("module")
    return str(marker.args[0]).zfill(2) if marker and marker.args else None


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


_INDEXES: dict = {}


def _index(item) -> failures.ExerciseIndex | None:
    "The exercise index of the test's edition (None outside a course)."
    root, modules = _course_modules(item)
    if not modules:
        return None
    if root not in _INDEXES:
        _INDEXES[root] = failures.ExerciseIndex(modules, root)
    index = _INDEXES[root]
    number, function = _exercise(item)
    own = _own_module(item)
    if own and number and function:
        index.add(own, function, number)
    return index


def _chain(item, exc: BaseException) -> list:
    """The other modules the failure went through, deepest first (see `tito.failures.module_chain`);
    the test's own module is its `module` mark."""
    root, modules = _course_modules(item)
    if not modules:
        return []
    return failures.module_chain(failures.traceback_frames(exc.__traceback__), modules, _own_module(item), root)


# ---------------------------------------------------------------- the time limit of one test


class TimeLimitExceeded(BaseException):
    """A test ran past its time limit. A BaseException, so that student code catching `Exception`
    (a server's loop, a retry) does not swallow it; pytest records it as the test's failure."""

    def __init__(self, seconds: float, stacks: dict):
        super().__init__(f"did not finish in {seconds:g} s")
        self.seconds, self.stacks = seconds, stacks


def _stacks(main_frame=None) -> dict[str, list[tuple[str, str]]]:
    """{thread name: (filename, qualname) frames, outermost first} of every thread now."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = dict(sys._current_frames())
    if main_frame is not None:
        frames[threading.main_thread().ident] = main_frame
    out = {}
    for ident, frame in frames.items():
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, getattr(code, "co_qualname", code.co_name)))
            frame = frame.f_back
        out[names.get(ident, f"thread {ident}")] = stack[::-1]
    try:  # coroutines waiting in this thread's event loop (a request waiting for a reply) have no thread
        import asyncio

        loop = asyncio._get_running_loop()
        tasks = asyncio.all_tasks(loop) if loop is not None else ()
    except Exception:  # no loop, or one that is closing
        tasks = ()
    for task in tasks:
        frames = [(f.f_code.co_filename, getattr(f.f_code, "co_qualname", f.f_code.co_name)) for f in task.get_stack()]
        if frames:
            out[f"asyncio task {task.get_name()}"] = frames
    return out


class _Limit:
    """Raise `TimeLimitExceeded` in the main thread after `seconds` (0: never): SIGALRM where there
    is one, else a timer thread that raises it asynchronously in the main thread."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._timer = None
        self._old = None

    def _fire(self, signum=None, frame=None):
        raise TimeLimitExceeded(self.seconds, _stacks(frame))

    def __enter__(self):
        if self.seconds <= 0:
            return self
        if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        else:
            import ctypes

            target = threading.current_thread().ident

            def fire():
                exc = TimeLimitExceeded(self.seconds, _stacks())
                _PENDING[target] = exc
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(_AsyncLimit))

            self._timer = threading.Timer(self.seconds, fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)
            self._old = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return False


_PENDING: dict = {}


class _AsyncLimit(TimeLimitExceeded):
    "Raised asynchronously (no arguments possible): takes its details from `_PENDING`."

    def __init__(self):
        pending = _PENDING.pop(threading.current_thread().ident, None)
        super().__init__(pending.seconds if pending else 0, pending.stacks if pending else {})


def _limit_of(item) -> float:
    """Seconds `item` may run: its `time_limit` mark; for a package test (marked `module`) `--tito-timeout`
    (what `tito test` passes from settings.ini), else the `tito_test_timeout` ini option; for any other
    test `tito_other_test_timeout`. 0: no limit."""
    config = item.config
    marker = item.get_closest_marker("time_limit")
    if marker and marker.args:
        return float(marker.args[0])
    option = config.getoption("--tito-timeout")
    if not item.get_closest_marker("module"):
        other = float(config.getini("tito_other_test_timeout") or DEFAULT_SLOW_TIMEOUT)
        return 0.0 if option == 0 else max(other, option or 0)
    if option is not None:
        return option
    return float(config.getini("tito_test_timeout") or DEFAULT_TIMEOUT)


def _limited(item):
    seconds = _limit_of(item)
    item._tito_limit = seconds
    return _Limit(seconds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _limited(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    t0 = time.monotonic()
    with _limited(item):
        yield
    item._tito_call_seconds = time.monotonic() - t0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _limited(item):
        yield


def where_it_was(stacks: dict, index, own_module: str | None) -> list[str]:
    """For each thread that was in the package's code when the time ran out: 'your 20.4
    ContinuousBatcher.step (thread engine)', the exercise of the module under test first."""
    found = []
    for name, frames in stacks.items():
        places = index.places(frames) if index else []
        if not places:
            continue
        own = [p for p in places if p.module == own_module and p.exercise]
        p = own[-1] if own else places[-1]
        thread = "" if name == "MainThread" else f" ({name})" if name.startswith("asyncio") else f" (thread {name})"
        found.append((not own, p.where(own_module), thread))
    out, seen = [], set()
    for _, where, thread in sorted(found, key=lambda f: f[0]):  # the module's exercises first, each place once
        if where not in seen:
            seen.add(where)
            out.append(where + thread)
    return out


def timeout_reason(item, exc: TimeLimitExceeded, when: str = "call") -> str:
    number, function = _exercise(item)
    head = f"{number} {function}: test" if number else "test"
    phase = "" if when == "call" else f" ({when})"
    text = f"{head}{phase} did not finish in {exc.seconds:g} s (stopped there; the other tests ran on)"
    places = where_it_was(exc.stacks, _index(item), _own_module(item))
    if places:
        text += "; when stopped it was in " + "; ".join(places[:3])
    return (text + ": a loop that never ends, or a wait for something that never comes (a block never freed, a "
            f"request never answered)? If your machine is only busy or slow, raise {SETTING}")


# ---------------------------------------------------------------- a failed test, once more, watched

_RETURN_OPS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _resolve(module, qualname: str):
    obj = module
    for part in qualname.split("."):
        if part == "<locals>":
            return None
        obj = (obj.__dict__.get(part) if isinstance(obj, type) else None) or getattr(obj, part, None)
        if obj is None:
            return None
    return getattr(obj, "__func__", obj)


class Watcher:
    """Watches the exercises of one module while a test runs (`sys.settrace`, in every thread the test
    starts; other functions cost one call of the global trace function): which ones ran, what they
    returned, and the first return that contradicts its function's annotation."""

    def __init__(self, index, number: str | None, package_module: str | None):
        self.codes: dict = {}
        self.called: dict = {}
        self.returns: deque = deque(maxlen=1024)
        self.mismatch = None
        self.active = False
        module = sys.modules.get(package_module or "")
        if module is None or index is None or number is None:
            return
        rel = "/".join(package_module.split(".")) + ".py"
        for name, exercise in index.functions(number).items():
            fn = _resolve(module, name)
            code = getattr(fn, "__code__", None)
            if code is not None:
                self.codes[code] = (failures.Place(number, name, rel, exercise), failures.return_hint(fn))

    def _global(self, frame, event, arg):
        if not self.active:
            sys.settrace(None)
            return None
        hit = self.codes.get(frame.f_code)
        if hit is None:
            return None
        self.called.setdefault(hit[0], None)
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame, event, arg):
        if event == "return" and self.active:
            hit = self.codes.get(frame.f_code)
            if hit is not None and frame.f_code.co_code[frame.f_lasti] in _RETURN_OPS:  # not an exception, a yield
                self.returns.append((hit[0], arg))
                if self.mismatch is None:
                    how = failures.mismatch(hit[1], arg)
                    if how:
                        self.mismatch = (hit[0], how)
        return self._local

    def __enter__(self):
        if self.codes:
            self.active = True
            self._before = sys.gettrace()
            threading.settrace(self._global)
            sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        if self.active:
            self.active = False
            sys.settrace(getattr(self, "_before", None))
            threading.settrace(None)
        return False

    def reached(self, exc: BaseException):
        """(exercise, value, frame, local name) when a non-trivial value an exercise returned is a
        local of a frame the failure went through (the deepest such frame)."""
        ids = {id(v): p for p, v in self.returns if not isinstance(v, _PLAIN)}
        if not ids:
            return None
        tb, frames = exc.__traceback__, []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for frame in reversed(frames):
            for name, value in list(frame.f_locals.items()):
                if id(value) in ids:
                    return ids[id(value)], value, frame, name
        return None


def _watcher(item, index=None) -> Watcher:
    own = _own_module(item)
    index = index or _index(item)
    root, modules = _course_modules(item)
    module = next((m for m in modules if m.number == own), None)
    return Watcher(index, own, module.package_module if module else None)


def _rerun_watched(item, index):
    """Run a failed test again under a `Watcher` of its module's exercises; (exception or None, watcher)."""
    watcher = _watcher(item, index)
    if not watcher.codes:
        return None, watcher
    exc = None
    try:
        with _Limit(getattr(item, "_tito_limit", DEFAULT_TIMEOUT)), watcher:
            item.runtest()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the failure is what we came for
        exc = e
    return exc, watcher


_GRAPHS: dict = {}


def static_reach(item, index) -> list[failures.Place]:
    """The exercises of the test's module that its code can run, read from the source of the test file and
    of the module's package file (`failures.CallGraph`): what a cache or a second run cannot hide."""
    own = _own_module(item)
    root, modules = _course_modules(item)
    module = next((m for m in modules if m.number == own), None)
    package = module.package_file(root) if module and root else None
    test_file = Path(str(item.path))
    key = (test_file, package)
    if key not in _GRAPHS:
        import ast

        graph, tests = failures.CallGraph(), {}
        try:
            if package is not None and package.exists():
                graph.add(ast.parse(package.read_text(encoding="utf-8")))
            tree = ast.parse(test_file.read_text(encoding="utf-8"))
            graph.add(tree)
            tests = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                tests.update({f"{cls.name}.{m.name}": m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
        except (OSError, SyntaxError, ValueError):
            pass
        _GRAPHS[key] = (graph, tests)
    graph, tests = _GRAPHS[key]
    name = getattr(item, "originalname", item.name)
    cls = getattr(item, "cls", None)
    node = tests.get(f"{cls.__name__}.{name}" if cls else name)
    if node is None or index is None or own is None:
        return []
    start = failures.CallGraph.names_in(node) | set(getattr(item, "fixturenames", ()))
    rel = "/".join(module.package_module.split(".")) + ".py"
    table = index.functions(own)
    return [failures.Place(own, fn, rel, table[fn]) for fn in sorted(graph.reach(start)) if fn in table]


def blame_failure(item, exc: BaseException) -> failures.Blame:
    """Where `exc` (a test's failure) surfaced; which exercises the test can run (its source) and ran (a
    second run, watched); and which one's output was wrong (what it returned, on that second run)."""
    index = _index(item)
    own = _own_module(item)
    number, _ = _exercise(item)
    blame = failures.Blame(own)
    if index is None:
        return blame
    leaf = _leaves(exc)[0]
    blame.chain = failures.surfaced_chain(index.places(failures.traceback_frames(leaf.__traceback__)), own, number)
    blame.called = static_reach(item, index)
    seconds = getattr(item, "_tito_call_seconds", 0.0)
    if own is None or seconds > RERUN_UNDER or isinstance(leaf, TimeLimitExceeded):
        return blame
    again, watcher = _rerun_watched(item, index)  # a test that passes watches nothing: no cost
    if again is None or type(_leaves(again)[0]) is not type(leaf):
        return blame  # passed, or failed differently: what it saw may not be what went wrong
    blame.called = list(dict.fromkeys([*blame.called, *watcher.called]))
    if watcher.mismatch is not None:
        blame.culprit, blame.how = watcher.mismatch
    else:
        hit = watcher.reached(_leaves(again)[0])
        if hit is not None:
            place, value, frame, name = hit
            at = index.place(frame.f_code.co_filename, frame.f_code.co_qualname)
            if at is not None and at != place and (place.exercise == number or not number):
                blame.culprit, blame.how = place, f"returned {failures.kind_of(value)}, which reached {at.where(own)} as `{name}`"
    return blame


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    number, function = _exercise(item)
    rep.tito_exercise, rep.tito_function, rep.tito_reason, rep.tito_blame = number, function, "", None
    if not rep.failed or call.excinfo is None:
        return
    header = f"Exercise {number} ({function})" if number else item.nodeid
    missing = _not_implemented_function(call.excinfo)
    if isinstance(call.excinfo.value, TimeLimitExceeded):
        rep.tito_reason = timeout_reason(item, call.excinfo.value, call.when)
        rep.longrepr = f"{item.nodeid}: {rep.tito_reason}"
        _session(item.config).timed_out = True
    elif missing:
        chain = _chain(item, _not_implemented(call.excinfo.value))
        rep.tito_reason = f"not implemented yet: {missing}"
        if chain:
            rep.tito_reason += f" (module {chain[0][0]}, {chain[0][2]})"
            rep.longrepr = f"{header}: {rep.tito_reason}"  # repr_failure (see _short_stub_failures) has no chain
    else:
        summary = summarize(call.excinfo.value)
        blame = blame_failure(item, call.excinfo.value) if call.when == "call" else failures.Blame(_own_module(item))
        rep.tito_summary = summary
        rep.tito_blame = blame.as_dict()
        rep.tito_reason = blame.text(summary, number)
    if number:
        rep.sections.insert(0, ("what to fix", f"{header}: {rep.tito_reason}"))
    _session(item.config).failed.append(rep)


# ---------------------------------------------------------------- the whole run


class _Session:
    """What the run learned: failed reports (their final reasons need every exercise's outcome: an
    upstream exercise may be tested after the one it breaks) and whether a test ran out of time."""

    def __init__(self):
        self.failed: list = []
        self.timed_out = False

    def failing_exercises(self) -> set[str]:
        """The exercises with a failure of their own: a failed test that ran no other exercise whose tests
        fail too (an exercise that fails only through another one's bug is not one to fix first)."""
        failing = {r.tito_exercise for r in self.failed if getattr(r, "tito_exercise", "")}
        own = set()
        for r in self.failed:
            if not getattr(r, "tito_exercise", ""):
                continue
            called = failures.Blame.from_dict(r.tito_blame).called if getattr(r, "tito_blame", None) else []
            if not any(p.exercise in failing and p.exercise != r.tito_exercise for p in called):
                own.add(r.tito_exercise)
        return own

    def finish(self) -> None:
        failing = self.failing_exercises()
        for rep in self.failed:
            blame = getattr(rep, "tito_blame", None)
            if not blame:
                continue
            b = failures.Blame.from_dict(blame)
            rep.tito_upstream = [p.exercise for p in b.upstream(failing, rep.tito_exercise)]
            rep.tito_reason = b.text(rep.tito_summary, rep.tito_exercise, failing)
            rep.sections = [(t, f"{c.split(': ', 1)[0]}: {rep.tito_reason}" if t == "what to fix" else c)
                            for t, c in rep.sections]


def _session(config) -> _Session:
    if not hasattr(config, "_tito_session"):
        config._tito_session = _Session()
    return config._tito_session


def pytest_sessionfinish(session, exitstatus):
    _session(session.config).finish()
    session.config._tito_exitstatus = int(exitstatus)


def pytest_unconfigure(config):
    """A test stopped by its time limit may leave threads running that never end (a server's loop
    waiting for a block): the interpreter would wait for them at exit, so the process ends here."""
    state = getattr(config, "_tito_session", None)
    if state is None or not state.timed_out:
        return
    alive = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if alive:
        code = getattr(config, "_tito_exitstatus", 1)
        timer = threading.Timer(5.0, lambda: (sys.stdout.flush(), sys.stderr.flush(), os._exit(code)))
        timer.daemon = True
        timer.start()


class _Collector:
    def __init__(self, path: Path):
        self.path, self.results, self.reports = path, {}, {}
        self.running = path.with_name(path.name + ".running")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        number, function = _exercise(item)
        try:
            self.running.write_text(json.dumps({"nodeid": item.nodeid, "exercise": number, "function": function,
                                                "started": time.time()}))
        except OSError:
            pass

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
        self.reports[report.nodeid] = report
        self.results[report.nodeid] = {
            "nodeid": report.nodeid,
            "outcome": report.outcome,
            "when": report.when,
            "exercise": getattr(report, "tito_exercise", ""),
            "function": getattr(report, "tito_function", ""),
            "reason": reason,
        }

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        for nodeid, entry in self.results.items():  # the final reasons (see _Session.finish)
            rep = self.reports.get(nodeid)
            if entry["outcome"] == "failed" and rep is not None:
                entry["reason"] = getattr(rep, "tito_reason", entry["reason"])
                entry["upstream"] = getattr(rep, "tito_upstream", [])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"exitstatus": int(exitstatus), "tests": list(self.results.values()),
                       "exercises": getattr(session.config, "_tito_exercises", [])}, f, indent=1)
        os.replace(tmp, self.path)
        try:
            self.running.unlink()
        except OSError:
            pass


def pytest_configure(config):
    config.addinivalue_line("markers", "module(nn): tests of one course module")
    config.addinivalue_line("markers", "exercise(number, function): the notebook exercise a test checks")
    config.addinivalue_line("markers", "time_limit(seconds): this test's time limit (0: none)")
    _session(config)
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
