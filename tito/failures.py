"""A failure in the few words a student can act on, for `tito test`'s tables (notebook cells and
package tests alike).

- numpy.testing writes a boilerplate line first ("Not equal to tolerance rtol=1e-07, atol=0") and
  the test's own message (`err_msg`) after it: the test's message is put first, then the numbers.
- A `RecursionError` names the function that called itself and says why that fails on a long graph
  (a recursive traversal goes one Python frame deeper per node).
- A failure deep inside another module's code (module 13's test failing in module 12's attention)
  names that module, its function and its file: where it *surfaced*, not the culprit.
- Whose code it is (issue 29): `exercise_functions` reads which functions of a notebook are the
  student's (solution regions, or a release's stubs) and their exercise numbers; `ExerciseIndex` maps a
  traceback frame of the exported package to a `Place` (an exercise, or given code of a module);
  `CallGraph` reads from source which exercises a test or a cell can run (`notebook_reach`); `Blame`
  turns that into the line a student reads: the upstream exercise to fix first ("not checked on its
  own: fix 17.1 dead_code_elimination first"), an exercise whose return contradicts its annotation
  ("returned a list where its annotation says None"), and where the failure surfaced.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_NUMPY_HEADER = re.compile(r"^(Not equal to tolerance|Arrays are not (almost )?(equal|less-ordered)|Items are not equal"
                           r"|Not almost equal|Not equal)")
_NUMPY_DETAIL = re.compile(r"^(Mismatched elements|Max (absolute|relative) difference|\(shapes|\(mismatch|x and y"
                           r"|ACTUAL|DESIRED|x:|y:)")

RECURSION_HINT = ("a recursive traversal goes one Python frame deeper per node, so a long graph (a chain of "
                  "100,000 ops) passes Python's limit of about 1000 frames; walk the graph with a loop and an "
                  "explicit stack (a list you push nodes on and pop them from) instead")


def message_lines(text: str) -> list[str]:
    """The non-empty lines of an exception message, the informative ones first.

    numpy.testing puts `err_msg` (the test's words: what was checked, received, expected) after its
    own header line; that message moves to the front, the header and the numbers follow it.
    """
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    header = next((i for i, ln in enumerate(lines) if _NUMPY_HEADER.match(ln)), None)
    if header is None:
        return lines
    own = []
    for ln in lines[header + 1:]:
        if _NUMPY_DETAIL.match(ln):
            break
        own.append(ln)
    return own + lines[:header + 1] + lines[header + 1 + len(own):]


def one_line(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(name: str, message: str, max_lines: int = 12) -> str:
    """`Name: line; line; ...` with the informative lines first (see `message_lines`)."""
    lines = message_lines(message)
    if not lines:
        return f"{name} (no message)"
    text = f"{name}: " + "; ".join(lines[:max_lines])
    return text + ("; ..." if len(lines) > max_lines else "")


def recursion_note(function: str | None, times: int | None = None, where: str = "") -> str:
    """What a RecursionError means, naming the function that called itself when it is known."""
    who = f"{function}{f' ({where})' if where else ''}" if function else "a function"
    count = f" {times} times" if times else ""
    return f"{who} called itself{count} until Python's recursion limit: {RECURSION_HINT}"


def repeated_frame(tb) -> tuple[str, str, int] | None:
    """(qualified name, file, count) of the frame that repeats most in a traceback object: the recursion."""
    counts: Counter = Counter()
    while tb is not None:
        code = tb.tb_frame.f_code
        counts[(getattr(code, "co_qualname", code.co_name), code.co_filename)] += 1
        tb = tb.tb_next
    if not counts:
        return None
    (name, filename), n = counts.most_common(1)[0]
    return (name, filename, n) if n > 1 else None


def package_path(filename: str, root: Path | None = None) -> str | None:
    """`tinytorch/core/attention.py` for a file of the exported package (None for any other file)."""
    parts = Path(filename).parts
    if root is not None:
        try:
            rel = Path(filename).resolve().relative_to(root.resolve())
        except (ValueError, OSError):
            return None
        return rel.as_posix() if rel.parts and rel.parts[0] == "tinytorch" else None
    if "tinytorch" in parts:
        i = len(parts) - 1 - parts[::-1].index("tinytorch")
        return "/".join(parts[i:])
    return None


def module_of(rel_path: str, modules) -> object | None:
    """The course module whose notebook exports `tinytorch/...py` (None when no notebook does)."""
    for m in modules:
        for mod in getattr(m, "package_modules", None) or [m.package_module]:
            if mod and "/".join(mod.split(".")) + ".py" == rel_path:
                return m
    return None


def module_chain(frames: list[tuple[str, str]], modules, own_module: str | None,
                 root: Path | None = None) -> list[tuple[str, str, str]]:
    """The other modules a failure went through, deepest first: (module number, function,
    `tinytorch/...py`) for the deepest frame of each module on the way down, when the deepest frame in
    the exported package belongs to another module than `own_module`; [] otherwise (the failure is in
    the module's own code, or in no package code). `frames` are (filename, qualified function name),
    outermost first."""
    chain: list[tuple[str, str, str]] = []
    for filename, function in frames:
        rel = package_path(filename, root)
        m = module_of(rel, modules) if rel else None
        if m is None or function.endswith(".__call__"):  # `Module.__call__` only dispatches to forward
            continue
        if chain and chain[-1][0] == m.number:
            chain[-1] = (m.number, function, rel)
        else:
            chain.append((m.number, function, rel))
    if not chain or chain[-1][0] == own_module:
        return []
    return [c for c in reversed(chain) if c[0] != own_module]


def where_it_failed(frames: list[tuple[str, str]], modules, own_module: str | None, root: Path | None = None) -> str:
    """'the failure surfaced in module 03's Linear.forward (tinytorch/core/layers.py), called from module
    12's MultiHeadAttention.forward (tinytorch/core/attention.py)' when the failure was raised in
    another module's exported code (its callers on the way name where a bad input came from); ''
    otherwise."""
    chain = module_chain(frames, modules, own_module, root)
    if not chain:
        return ""
    text = "the failure surfaced in " + ", called from ".join(f"module {n}'s {fn} ({rel})" for n, fn, rel in chain[:3])
    return text + (" ..." if len(chain) > 3 else "")


def traceback_frames(tb) -> list[tuple[str, str]]:
    """(filename, qualified function name) of each frame of a traceback object, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, getattr(code, "co_qualname", code.co_name)))
        tb = tb.tb_next
    return frames


_IPY_FRAME = re.compile(r"^\s*(?:File (.+?\.py):\d+|Cell In\[\d+\], line \d+), in ([\w.<>]+)", re.M)
_IPY_SKIPPED = re.compile(r"skipping similar frames: ([\w.<>]+) at line \d+ \((\d+) times\)")


def text_frames(traceback_text: str) -> list[tuple[str, str]]:
    """(filename, function) of each frame of an IPython traceback's text, outermost first."""
    return [(m.group(1) or "<notebook cell>", m.group(2)) for m in _IPY_FRAME.finditer(traceback_text)]


def text_recursion(traceback_text: str) -> tuple[str, int] | None:
    """(function, times) from an IPython traceback that collapsed a recursion ('skipping similar frames')."""
    found = _IPY_SKIPPED.findall(traceback_text)
    if found:
        name, n = max(found, key=lambda f: int(f[1]))
        return name, int(n)
    names = Counter(fn for _, fn in text_frames(traceback_text))
    if names:
        name, n = names.most_common(1)[0]
        if n > 1:
            return name, n
    return None


# ---------------------------------------------------------------- whose code a failure went through
#
# Issue 29: a failure names the student's function that is wrong. The frames of a traceback are mapped
# to *places*: a student's exercise (a function holding a solution region, numbered like its test), given
# code of a module, or code outside the package. A failure raised in an earlier module's code is reported
# as where it *surfaced*; the culprit is the exercise whose output was wrong (found by what it returned,
# see tito.pytest_plugin) or the test's own; an exercise that calls another one whose own tests fail is
# "not checked on its own": fix the other one first.

_EXERCISE_NUMBER = re.compile(r"Exercise\s+(\d+\.\d+)")
_STUB_LINES = ("# YOUR CODE HERE", "raise NotImplementedError()")  # nbgrader's stub (tito.course.CODE_STUB)


def _cell_source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _nbgrader(cell) -> dict:
    return (cell.get("metadata", {}) or {}).get("nbgrader", {}) or {}


def _is_test_cell(cell) -> bool:
    md = _nbgrader(cell)
    return bool(md.get("grade")) and not md.get("solution") and cell.get("cell_type") == "code"


def _parse_cell(source: str):
    "The cell as Python (IPython magics and shell lines blanked, line numbers kept); None if it is not Python."
    import ast

    text = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _definitions(tree):
    """(co_qualname-style name, node) of every def and class in `tree`, outermost first: `Class.method`,
    `outer.<locals>.inner`, as Python names the code objects."""
    import ast

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                inner = f"{name}.<locals>." if not isinstance(child, ast.ClassDef) else f"{name}."
                yield from walk(child, inner)
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _student_lines(source: str) -> set[int]:
    """Line numbers (1-based) of a solution cell's student code: inside BEGIN/END SOLUTION regions (the
    instructor's notebook), or the stub lines a release puts there."""
    lines, inside, out = source.splitlines(), False, set()
    for i, line in enumerate(lines, 1):
        text = line.strip()
        if "### BEGIN SOLUTION" in text:
            inside = True
        elif "### END SOLUTION" in text:
            inside = False
        elif inside or text in _STUB_LINES:
            out.add(i)
    return out


def exercise_functions(nb) -> dict[str, str]:
    """{qualified name: exercise number} of the functions a student writes in notebook `nb` (a source
    notebook with solution regions, or a release with stubs): each function whose body holds student
    lines, numbered by its docstring ("TODO (Exercise 14.4c)") or else by the next graded test cell
    ("# Exercise 14.4: ...")."""
    import ast

    cells = nb.get("cells", []) if isinstance(nb, dict) else nb.cells
    found: dict[str, str] = {}
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code" or not _nbgrader(cell).get("solution"):
            continue
        source = _cell_source(cell)
        student = _student_lines(source)
        tree = _parse_cell(source) if student else None
        if tree is None:
            continue
        after = next((_EXERCISE_NUMBER.search(_cell_source(c).strip().splitlines()[0])
                      for c in cells[i + 1:] if _is_test_cell(c) and _cell_source(c).strip()), None)
        defs = [(name, node) for name, node in _definitions(tree) if not isinstance(node, ast.ClassDef)]
        for name, node in defs:
            body = set(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
            inner = [n for n2, n in defs if n2.startswith(name + ".<locals>.")]
            for n in inner:  # a helper nested in the function counts as its own exercise code
                body -= set(range(n.lineno, (n.end_lineno or n.lineno) + 1))
            if not body & student:
                continue
            doc = ast.get_docstring(node) or ""
            m = _EXERCISE_NUMBER.search(doc) or after
            if m:
                found[name] = m.group(1)
    return found


@dataclass(frozen=True)
class Place:
    """Where a frame's code comes from: module `module`'s function `function` in `path`; `exercise` is
    the student's exercise number when the function holds their code, "" for given code."""

    module: str
    function: str
    path: str
    exercise: str = ""

    def short(self) -> str:
        "`14.4 ModulePaths.pop` for an exercise, `module 14's Profiler.__exit__` otherwise."
        return f"{self.exercise} {self.function}" if self.exercise else f"module {self.module}'s {self.function}"

    def where(self, own_module: str | None = None) -> str:
        """`your 17.4 fusion_groups` for an exercise of the module being tested; `module 01's
        Tensor.__init__ (tinytorch/core/tensor.py)` for an earlier module's code (which passes its own
        tests: the failure surfaced there) and for given code."""
        if self.exercise and self.module == own_module:
            return f"your {self.exercise} {self.function}"
        given = "given " if self.module == own_module else ""
        return f"module {self.module}'s {given}{self.function}" + (f" ({self.path})" if self.path else "")


class ExerciseIndex:
    """The course's exercises by package file: which function of which module is the student's.

    Read lazily from each module's pristine release (`.release.ipynb`, student editions) or its
    notebook (the instructor's source); `add` records what the package tests' markers say
    (`@pytest.mark.exercise("14.4", "ModulePaths.pop")`), which wins."""

    def __init__(self, modules, root: Path | None = None):
        self.modules, self.root = list(modules), root
        self._functions: dict[str, dict[str, str]] = {}
        self._by_path = {"/".join(m.package_module.split(".")) + ".py": m
                         for m in self.modules if m.package_module}

    def functions(self, number: str) -> dict[str, str]:
        "{qualified name: exercise} of module `number`."
        if number not in self._functions:
            found: dict[str, str] = {}
            m = next((x for x in self.modules if x.number == number), None)
            if m is not None:
                for nb_path in (m.folder / ".release.ipynb", m.notebook):
                    try:
                        import json

                        found = exercise_functions(json.loads(nb_path.read_text(encoding="utf-8")))
                    except (OSError, ValueError):
                        continue
                    break
            self._functions[number] = found
        return self._functions[number]

    def add(self, number: str, function: str, exercise: str) -> None:
        if number and function and exercise:
            self.functions(number)[function] = exercise

    def exercise_of(self, number: str, qualname: str) -> str:
        "The exercise whose function (or a function nested in it) `qualname` is; '' for given code."
        table = self.functions(number)
        name = qualname
        while name:
            if name in table:
                return table[name]
            name = name.rsplit(".<locals>.", 1)[0] if ".<locals>." in name else ""
        return ""

    def place(self, filename: str, qualname: str) -> Place | None:
        "The place of a frame of the exported package; None for any other code (tests, NumPy, the notebook)."
        rel = package_path(filename, self.root)
        m = self._by_path.get(rel) if rel else None
        if m is None:
            return None
        return Place(m.number, qualname, rel, self.exercise_of(m.number, qualname))

    def places(self, frames: list[tuple[str, str]]) -> list[Place]:
        "The package places of (filename, qualname) frames, outermost first (dispatching `__call__`s left out)."
        out = []
        for filename, function in frames:
            p = self.place(filename, function)
            if p is not None and not function.endswith(".__call__"):
                out.append(p)
        return out


def surfaced_chain(places: list[Place], own_module: str | None, own_exercise: str = "", limit: int = 2) -> list[Place]:
    """Where a failure surfaced, deepest first, when that is not the failing test's own exercise: the
    deepest place of each group of frames (one module's given code, or one exercise) on the way down,
    up to the own exercise's frame. [] when the failure was raised in the own exercise's code, in the
    own module's given code called straight from the test, or in no package code."""
    groups: list[Place] = []
    for p in places:
        if groups and (groups[-1].module, groups[-1].exercise) == (p.module, p.exercise):
            groups[-1] = p
        else:
            groups.append(p)
    if not groups:
        return []
    deepest = groups[-1]
    if (deepest.module == own_module and (deepest.exercise == own_exercise or not deepest.exercise)
            and not any(g.module != own_module for g in groups)):
        return []
    chain = []
    for g in reversed(groups):
        chain.append(g)
        if g.module == own_module and g.exercise and g.exercise == own_exercise:
            break
    if chain[-1].module == own_module and not chain[-1].exercise and len(chain) > 1:
        chain.pop()  # "called from module 14's given code" says nothing the test does not
    return chain[:limit]


def surfaced_text(chain: list[Place], own_module: str | None = None) -> str:
    """'the failure surfaced in module 01's Tensor.__init__ (tinytorch/core/tensor.py), called from
    module 03's Sequential.forward (tinytorch/core/layers.py)'; '' for no chain."""
    if not chain:
        return ""
    return "the failure surfaced in " + ", called from ".join(p.where(own_module) for p in chain)


def kind_of(value) -> str:
    "'a list', 'None', 'a Tensor', 'an int' for a message."
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _hint_matches(value, hint) -> bool | None:
    "Whether `value` fits the annotation `hint` (None: the annotation says too little to tell)."
    import numbers
    import types
    import typing

    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(types, "UnionType", typing.Union)):
        results = [_hint_matches(value, h) for h in typing.get_args(hint)]
        return True if any(results) else None if None in results else False
    if origin is not None:
        hint = origin
    if not isinstance(hint, type) or hint is typing.Any:
        return None
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is bool:
        import numpy as np

        return isinstance(value, (bool, np.bool_))
    return isinstance(value, hint)


_NO_HINT = object()


def return_hint(function):
    """The return annotation of `function`, resolved (`_NO_HINT` when it has none or it does not resolve)."""
    import typing

    raw = getattr(function, "__annotations__", {}).get("return", _NO_HINT)
    if raw is _NO_HINT:
        return _NO_HINT
    try:
        return typing.get_type_hints(function).get("return", raw)
    except Exception:  # a forward reference that does not resolve: read the plain name ourselves
        if not isinstance(raw, str):
            return raw
        if raw.strip() == "None":
            return None
        return getattr(function, "__globals__", {}).get(raw.strip("'\" "), _NO_HINT)


def mismatch(hint, value) -> str:
    """'returned a list where its annotation says None' when `value` contradicts the return annotation
    `hint` (see `return_hint`); '' when it fits or the annotation says too little."""
    if hint is _NO_HINT:
        return ""
    try:
        fits = _hint_matches(value, hint)
    except Exception:
        return ""
    if fits is not False:
        return ""
    said = "None" if hint is None or hint is type(None) else typing_name(hint)
    return f"returned {kind_of(value)} where its annotation says {said}"


def contract_mismatch(function, value) -> str:
    "`mismatch` of `function`'s return annotation and `value`."
    return mismatch(return_hint(function), value)


def typing_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


@dataclass
class Blame:
    """What a failure says about whose code to fix (serializable: `as_dict`, `from_dict`).

    `culprit`: an exercise whose output was wrong (`how`: "returned a list where its annotation says
    None"); `chain`: where the failure surfaced (`surfaced_chain`); `called`: the exercises the test ran,
    to name upstream ones that fail their own tests; `own_module`: the test's module."""

    own_module: str | None = None
    culprit: Place | None = None
    how: str = ""
    chain: list = field(default_factory=list)
    called: list = field(default_factory=list)

    def upstream(self, failing, own_exercise: str) -> list[Place]:
        "The exercises this test ran, other than its own, whose own tests fail: fix them first."
        seen, out = set(), []
        for p in self.called:
            if p.exercise and p.exercise != own_exercise and p.exercise in failing and p.exercise not in seen:
                seen.add(p.exercise)
                out.append(p)
        return sorted(out, key=lambda p: _number_key(p.exercise))

    def text(self, reason: str, own_exercise: str = "", failing=frozenset()) -> str:
        """The line a student reads: what to fix first, whose output was wrong, where the failure
        surfaced, then the failure itself, e.g. "not checked on its own: fix 14.4 ModulePaths.pop first
        (its own tests fail): it returned a list where its annotation says None; the failure surfaced in
        module 01's Tensor.__init__ (tinytorch/core/tensor.py): TypeError: ..."."""
        parts = []
        first = self.upstream(set(failing), own_exercise)
        culprit = self.culprit if self.how else None
        if first:
            names = []
            for p in first:
                if culprit is not None and culprit.exercise == p.exercise:
                    names.append(culprit.short())
                    continue
                functions = list(dict.fromkeys(c.function for c in self.called if c.exercise == p.exercise))
                names.append(f"{p.exercise} {functions[0]}" if len(functions) == 1
                             else f"{p.exercise} ({', '.join(functions)})")
            head = (f"not checked on its own: fix {' and '.join(names)} first "
                    f"({'its' if len(first) == 1 else 'their'} own tests fail)")
            if culprit is not None and culprit.exercise in {p.exercise for p in first}:
                head += f": {'it' if len(first) == 1 else culprit.short()} {self.how}"
                culprit = None
            parts.append(head)
        if culprit is not None:
            who = culprit.function if culprit.exercise == own_exercise else culprit.short()
            parts.append(f"{who} {self.how}")
        head = "; ".join(parts)
        where = surfaced_text(self.chain, self.own_module)
        if where:
            head = f"{head}; {where}" if head else where
        return f"{head}: {reason}" if head else reason

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {"own_module": self.own_module, "culprit": asdict(self.culprit) if self.culprit else None,
                "how": self.how, "chain": [asdict(p) for p in self.chain], "called": [asdict(p) for p in self.called]}

    @classmethod
    def from_dict(cls, d: dict) -> "Blame":
        return cls(d.get("own_module"), Place(**d["culprit"]) if d.get("culprit") else None, d.get("how", ""),
                   [Place(**p) for p in d.get("chain", [])], [Place(**p) for p in d.get("called", [])])


def _number_key(exercise: str):
    return [int(x) if x.isdigit() else 0 for x in re.split(r"[.]", re.sub(r"[a-z]$", "", exercise))]


def upstream_order(exercises: list[str], depends: dict[str, set[str]]) -> list[str]:
    """`exercises` in number order, except that an exercise another one depends on (it must be fixed
    first) comes before it."""
    pending = sorted(exercises, key=_number_key)
    done: list[str] = []
    placed: set[str] = set()

    def place(e, path=()):
        if e in placed or e in path:
            return
        for d in sorted(depends.get(e, ()), key=_number_key):
            if d in pending:
                place(d, path + (e,))
        placed.add(e)
        done.append(e)

    for e in pending:
        place(e)
    return done


class CallGraph:
    """Which functions a piece of code runs, read from source (no interpreter): names a function uses,
    followed through the module-level functions and classes added (a class brings all its methods and
    its bases; `self.x` in a method, the method `x` of its class; a module-level `PASSES = [f, g]` of a
    package module, f and g). An over-approximation by name: what a test or cell *can* run."""

    def __init__(self):
        self.edges: dict[str, set[str]] = {}

    @staticmethod
    def names_in(node, cls: str | None = None) -> set[str]:
        import ast

        found = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                found.add(sub.id)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                if cls and sub.value.id in ("self", "cls", cls):
                    found.add(f"{cls}.{sub.attr}")
                else:
                    found.add(sub.attr)  # `profiler.count_flops(...)`: a module's function by its attribute
        return found

    def add(self, tree, assignments: bool = True) -> set[str]:
        """Add the module-level definitions of `tree`; returns the names its other statements use.
        `assignments`: whether module-level `NAME = ...` lines link NAME to what they use."""
        import ast

        top = set()
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.edges.setdefault(stmt.name, set()).update(self.names_in(stmt))
                top |= {n.id for d in stmt.decorator_list for n in ast.walk(d) if isinstance(n, ast.Name)}
            elif isinstance(stmt, ast.ClassDef):
                methods = {f"{stmt.name}.{m.name}" for m in stmt.body
                           if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                edges = self.edges.setdefault(stmt.name, set())
                edges |= methods | {n.id for b in stmt.bases for n in ast.walk(b) if isinstance(n, ast.Name)}
                for m in stmt.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.edges.setdefault(f"{stmt.name}.{m.name}", set()).update(self.names_in(m, stmt.name))
                    else:
                        edges |= self.names_in(m, stmt.name)
            else:
                used = self.names_in(stmt)
                top |= used
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
                    stmt, (ast.AnnAssign, ast.AugAssign)) else []
                for t in targets if assignments else []:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.edges.setdefault(n.id, set()).update(used)
        return top

    def reach(self, names) -> set[str]:
        "Every function, class and method that `names` lead to."
        seen, todo = set(), [n for n in names if n in self.edges]
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(r for r in self.edges.get(n, ()) if r in self.edges and r not in seen)
        return seen


def notebook_reach(nb, exercises: dict[str, str]) -> dict[int, set[str]]:
    """{cell position: the exercises its code runs} for each code cell of notebook `nb` (see `CallGraph`;
    only exported cells' module-level assignments link names, as in the package). `exercises` maps
    qualified names to exercise numbers (`exercise_functions` of the release)."""
    cells = nb.get("cells", []) if isinstance(nb, dict) else nb.cells
    graph = CallGraph()
    cell_refs: dict[int, set[str]] = {}
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = _cell_source(cell)
        tree = _parse_cell(source)
        if tree is not None:
            cell_refs[i] = graph.add(tree, assignments=bool(re.search(r"^#\|\s*export", source, re.M)))
    return {i: {exercises[n] for n in graph.reach(refs) if n in exercises} for i, refs in cell_refs.items()}


def exercise_of_label(label: str) -> str:
    "'14.3' from a test cell's label 'Exercise 14.3: FlopCounter, count_flops' ('' otherwise)."
    m = re.match(r"Exercise\s+(\d+\.\d+)", label or "")
    return m.group(1) if m else ""


def notebook_upstream(cells, reach: dict[int, set[str]]) -> dict[int, list[str]]:
    """{cell position: the exercises to fix first} for each failed cell of a notebook run.

    `cells`: (position, label, is_test, ok) of every code cell run. An exercise is to be fixed first
    when one of its test cells failed on its own (its code reaches no other exercise whose test failed)
    and the failed cell's code reaches it; a test cell's own exercise is never its own upstream."""
    failing = {exercise_of_label(label) for _, label, test, ok in cells if test and not ok} - {""}
    own_failure = set()
    for pos, label, test, ok in cells:
        ex = exercise_of_label(label)
        if test and not ok and ex and not (reach.get(pos, set()) & failing) - {ex}:
            own_failure.add(ex)
    out = {}
    for pos, label, test, ok in cells:
        if ok:
            continue
        ex = exercise_of_label(label) if test else ""
        first = sorted((reach.get(pos, set()) & own_failure) - {ex}, key=_number_key)
        if first:
            out[pos] = first
    return out
