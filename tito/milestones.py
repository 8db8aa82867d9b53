"""Milestones: runnable scripts in `milestones/` that retrace a moment of deep learning history
with nothing but the student's own `tinytorch`.

Each script states what it is in literal module-level constants at its top, which `tito` reads
with `ast` (a script is never imported just to be listed)::

    NAME = "perceptron"
    YEAR = 1957
    TITLE = "Rosenblatt's perceptron"
    NEEDS = ["01", "02", "03"]
    TARGET = "100% training accuracy within 50 epochs on a linearly separable set"

A needed module is *ready* when its exported package file exists and no function in it still holds
the nbgrader stub; `readiness(root, milestone)` lists the modules that are not (empty: it can run).
Scripts call `require("01", "02", "03")` before importing `tinytorch` pieces, so a student who has
not finished a module gets a message naming what to finish and the command that records it,
instead of a `NotImplementedError` from the middle of a training loop.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tito.course import CourseError, Module, all_prerequisites, find_root, load_modules, module_stubs

MILESTONES_DIR = "milestones"
NOT_EXPORTED = "<not exported yet>"
# constant name -> (type it must have, what to write)
FIELDS = {
    "NAME": (str, 'a string, e.g. NAME = "perceptron"'),
    "YEAR": (int, "an integer, e.g. YEAR = 1957"),
    "TITLE": (str, "a string"),
    "NEEDS": (list, 'a list of module numbers, e.g. NEEDS = ["01", "02", "03"]'),
    "TARGET": (str, "a string stating the result the script must reach"),
}


@dataclass(frozen=True)
class Milestone:
    name: str
    year: int
    title: str
    needs: tuple[str, ...]  # module numbers as the script states them, zero-padded: ("01", "02")
    target: str
    script: Path


@dataclass
class Missing:
    """A module a milestone needs that is not ready: absent, not exported, or with stubs left."""

    number: str
    module: Module | None  # None: no such module in this course
    stubs: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.module.title if self.module else "(not part of this course)"

    @property
    def exported(self) -> bool:
        return self.module is not None and self.stubs != [NOT_EXPORTED]

    def short(self, limit: int = 3) -> str:
        """`03 (Linear.forward, Linear.__init__)` for a table cell."""
        if self.module is None:
            return f"{self.number} (no such module)"
        if not self.exported:
            return f"{self.number} (not exported)"
        names = self.stubs[:limit] + ([f"+{len(self.stubs) - limit} more"] if len(self.stubs) > limit else [])
        return f"{self.number} ({', '.join(names)})"

    def explain(self, root: Path) -> str:
        """Several lines: what is missing and the command that fixes it."""
        if self.module is None:
            return (f"  - module {self.number}: this course has no modules/{self.number}_*/ folder, "
                    "so this milestone cannot run in this edition")
        m = self.module
        head = f"  - {m.number} {m.title}"
        if not self.exported:
            pkg = m.package_file(root)
            where = pkg.relative_to(root) if pkg else f"(no `#| default_exp` in {m.notebook.relative_to(root)})"
            return (f"{head}: not exported yet ({where} does not exist)\n"
                    f"      fix: work through {m.notebook.relative_to(root)}, then run `tito module complete {m.number}`")
        return (f"{head}: not implemented yet: {', '.join(self.stubs)}\n"
                f"      fix: implement {'it' if len(self.stubs) == 1 else 'them'} in {m.notebook.relative_to(root)}, "
                f"then run `tito module complete {m.number}`")


def explain(root: Path, missing: list[Missing], subject: str = "this script") -> str:
    """The message for a refused run: each unfinished module, what is left in it, and the fix."""
    return "\n".join([f"{subject} needs modules that are not finished yet:", *(m.explain(root) for m in missing)])


def _literal_constants(path: Path) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of the script at `path`, without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise CourseError(f"milestone script {path} has a syntax error on line {e.lineno}: {e.msg}") from None
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value = node.target.id, node.value
        else:
            continue
        if name not in FIELDS:
            continue
        try:
            found[name] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError):
            raise CourseError(
                f"milestone script {path}: {name} on line {node.lineno} must be a literal "
                f"({FIELDS[name][1]}), because tito reads it without running the script"
            ) from None
    return found


def parse(path: Path) -> Milestone:
    """Read a milestone script's header constants; a CourseError says which one is missing or wrong."""
    consts = _literal_constants(path)
    for key, (typ, what) in FIELDS.items():
        if key not in consts:
            raise CourseError(f"milestone script {path} does not define {key} at module level; it must be {what}")
        value = consts[key]
        if not isinstance(value, typ) or isinstance(value, bool):
            raise CourseError(f"milestone script {path}: {key} = {value!r} is not valid; it must be {what}")
    needs = []
    for n in consts["NEEDS"]:
        if not (isinstance(n, int) and not isinstance(n, bool) or isinstance(n, str) and n.isdigit()):
            raise CourseError(f"milestone script {path}: NEEDS entry {n!r} is not a module number like \"03\"")
        needs.append(str(n).zfill(2))
    return Milestone(consts["NAME"], consts["YEAR"], consts["TITLE"], tuple(needs), consts["TARGET"], path)


def discover(root: Path) -> list[Milestone]:
    """Every milestone script in `<root>/milestones/*.py` (files starting with `_` are helpers), by year."""
    folder = root / MILESTONES_DIR
    found = [parse(p) for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")] if folder.is_dir() else []
    seen: dict[str, Path] = {}
    for m in found:
        if m.name in seen:
            raise CourseError(f"two milestone scripts are both named {m.name!r}: {seen[m.name]} and {m.script}")
        seen[m.name] = m.script
    return sorted(found, key=lambda m: (m.year, m.name))


def get(root: Path, ref: str) -> Milestone:
    """A milestone by name (`perceptron`), script name (`perceptron_1957`) or year (`1957`, when unique)."""
    milestones = discover(root)
    ref = str(ref).strip()
    hits = [m for m in milestones if ref in (m.name, m.script.stem)]
    if not hits and ref.isdigit():
        hits = [m for m in milestones if m.year == int(ref)]
    if len(hits) == 1:
        return hits[0]
    known = ", ".join(f"{m.name} ({m.year})" for m in milestones) or f"none (no scripts in {root / MILESTONES_DIR})"
    if hits:
        raise CourseError(f"{ref!r} matches several milestones: {', '.join(m.name for m in hits)}; use a name")
    raise CourseError(f"unknown milestone {ref!r}; milestones in this course: {known}")


def check_modules(root: Path, numbers) -> list[Missing]:
    """Which of modules `numbers`, and the modules they depend on (module.toml prerequisites), are
    not exported or still hold stubs; in number order, empty when all are ready."""
    by_number = {m.number: m for m in load_modules(root)}
    wanted = {str(n).zfill(2) for n in numbers}
    for n in list(wanted):
        if n in by_number:
            wanted.update(all_prerequisites(root, by_number[n]))
    missing = []
    for n in sorted(wanted):
        module = by_number.get(n)
        if module is None:
            missing.append(Missing(n, None))
            continue
        stubs = module_stubs(root, module)
        if stubs:
            missing.append(Missing(n, module, stubs))
    return missing


def readiness(root: Path, milestone: Milestone) -> list[Missing]:
    """The modules `milestone` needs that are not exported or still hold stubs: empty when it can run."""
    return check_modules(root, milestone.needs)


def require(*numbers: str, root: Path | None = None) -> None:
    """Exit with code 2 and a clear message unless modules `numbers` are exported and implemented.

    Milestone scripts call this before importing `tinytorch` pieces. The edition root is
    `root`, else `$TITO_ROOT`, else the folder above the calling script (or the working directory).
    """
    caller = sys._getframe(1).f_globals.get("__file__")
    try:
        if root is None:
            root = find_root(Path(caller).resolve().parent if caller else None)
        missing = check_modules(root, numbers)
    except CourseError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if missing:
        print(explain(root, missing, Path(caller).name if caller else "this script"), file=sys.stderr)
        raise SystemExit(2)
