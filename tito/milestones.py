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
    "GOAL": (dict, 'a dict, e.g. GOAL = {"reach": [("test accuracy", ">=", 0.95)], "max_epochs": 50}'),
}
OPTIONAL = {"GOAL"}  # a script without GOAL can be listed, not run


@dataclass(frozen=True)
class Milestone:
    name: str
    year: int
    title: str
    needs: tuple[str, ...]  # module numbers as the script states them, zero-padded: ("01", "02")
    target: str
    script: Path
    goal: dict = field(default_factory=dict)  # the target as fields: reach / beat / max_epochs / max_seconds


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
        if key not in consts and key in OPTIONAL:
            continue
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
    return Milestone(consts["NAME"], consts["YEAR"], consts["TITLE"], tuple(needs), consts["TARGET"], path,
                     consts.get("GOAL", {}))


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


# ------------------------------------------------------------------ every milestone, one summary


@dataclass
class Outcome:
    milestone: Milestone
    status: str  # PASS | FAIL | NOISY (too noisy to tell: no condition failed) | skipped | error
    results: list[str] = field(default_factory=list)  # the script's `target: ...` lines
    seconds: float = 0.0
    plots: list[str] = field(default_factory=list)
    why: str = ""


NOISY_EXIT = 3  # a milestone's exit code when no condition failed but some were too noisy to tell
STATUS_OF_EXIT = {0: "PASS", 1: "FAIL", NOISY_EXIT: "NOISY"}  # a milestone script's exit code


def run_all(root: Path, extra: list[str] | None = None, stream=None) -> list[Outcome]:
    """Run every milestone whose modules are complete in this edition, in year order, each with its own
    output streamed; the others are listed as skipped with the modules they wait for."""
    import subprocess
    import time

    from tito.course import edition_env

    stream = stream or sys.stdout
    out: list[Outcome] = []
    for m in discover(root):
        missing = readiness(root, m)
        if missing:
            out.append(Outcome(m, "skipped", why="needs " + ", ".join(x.short() for x in missing)))
            continue
        print(f"\n=== {m.year} {m.name} ===", file=stream, flush=True)  # the script prints its title and target
        env = edition_env(root)
        env.setdefault("TITO_ROOT", str(root))
        env.setdefault("MPLBACKEND", "Agg")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(m.script), *(extra or [])], cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = []
        for line in proc.stdout:
            stream.write(line)
            stream.flush()
            lines.append(line.rstrip("\n"))
        code = proc.wait()
        res = Outcome(m, STATUS_OF_EXIT.get(code, "error"), seconds=time.monotonic() - t0)
        res.results = [ln[len("target: "):] for ln in lines if ln.startswith("target: ") and ln != f"target: {m.target}"]
        res.plots = [ln.split("saved plot to ", 1)[1].strip() for ln in lines if "saved plot to " in ln]
        if code not in STATUS_OF_EXIT:
            res.why = next((ln for ln in reversed(lines) if ln.strip()), f"exit code {code}")[:200]
        out.append(res)
    return out


def summary(outcomes: list[Outcome], root: Path) -> str:
    """The one-table summary: each milestone's target, what it reached, PASS/FAIL, time; then the plots."""
    rows = [("year", "milestone", "result", "time", "target / reached")]
    for o in outcomes:
        reached = "; ".join(o.results) or o.why or "-"
        rows.append((str(o.milestone.year), o.milestone.name, o.status,
                     f"{o.seconds:.0f} s" if o.seconds else "-", f"{o.milestone.target}\n{reached}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        first, *rest = r[4].split("\n")
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + first)
        for extra in rest:
            lines.append(" " * (sum(widths) + 8) + "  -> " + extra)
        if i == 0:
            lines.append("-" * (sum(widths) + 8 + max(len(x[4].split("\n")[0]) for x in rows)))
    plots = [p for o in outcomes for p in o.plots]
    passed = sum(o.status == "PASS" for o in outcomes)
    noisy = sum(o.status == "NOISY" for o in outcomes)
    ran = sum(o.status != "skipped" for o in outcomes)
    lines.append(f"\n{passed} of {ran} milestones run reached their target"
                 + (f"; {noisy} too noisy to tell (a speed interval straddles its target: the machine was busy; "
                    f"re-run on a quieter machine)" if noisy else "")
                 + (f" ({len(outcomes) - ran} skipped: their modules are not complete in this edition)"
                    if ran < len(outcomes) else ""))
    if plots:
        lines.append("plots:")
        for p in plots:
            try:
                p = str(Path(p).relative_to(root))
            except ValueError:
                pass
            lines.append(f"  {p}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`python -m tito.milestones run-all [script options]`: every ready milestone, then one summary table."""
    if not argv or argv[0] != "run-all":
        print("usage: python -m tito.milestones run-all [options passed to every script, e.g. --quick]",
              file=sys.stderr)
        return 2
    root = find_root()
    outcomes = run_all(root, argv[1:])
    print("\n" + summary(outcomes, root), flush=True)
    ran = [o for o in outcomes if o.status != "skipped"]
    if not ran:
        return 2
    # too noisy to tell is reported, not failed: the load of the machine decides it, not the code
    return 0 if all(o.status in ("PASS", "NOISY") for o in ran) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
