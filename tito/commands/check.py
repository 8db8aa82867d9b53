"""`tito export`, `tito test`, `tito checkpoint`: export a module and test it on the student's package."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from tito import failures, integrity
from tito import notebooks as nbs
from tito.context import Ctx
from tito.course import CourseError, Module
from tito.proc import run as run_child
from tito.student import RELEASE_COPY
from tito.ui import console, handle_errors


def do_export(ctx: Ctx, m: Module) -> None:
    """Export module `m` all or nothing. A module whose notebook no longer exports is not shown as
    completed any more (its package file keeps the last good export)."""
    nbs.read(m.notebook)
    try:
        nbs.export(ctx.root, m.notebook)
    except nbs.ExportError as e:
        if ctx.progress.is_completed(m.number):
            ctx.progress.mark_incomplete(m.number)
            ctx.progress.save()
            raise nbs.ExportError(f"{e}\nModule {m.number} is no longer marked completed: run "
                                  f"`tito module complete {m.number}` once it exports again.", e.modules) from None
        raise
    console.print(f"exported {m.notebook.relative_to(ctx.root)} -> {m.package_module}")


@handle_errors
def export(ref: Optional[str] = typer.Argument(None, help="module number or name; all modules when omitted")):
    """Export a module's notebook into the tinytorch package (nbdev), all or nothing."""
    ctx = Ctx()
    if ref is None:
        try:
            nbs.export(ctx.root)
        except nbs.ExportError as e:
            broken = [m for m in ctx.modules if m.package_module in e.modules and ctx.progress.is_completed(m.number)]
            for m in broken:
                ctx.progress.mark_incomplete(m.number)
            if broken:
                ctx.progress.save()
                raise nbs.ExportError(f"{e}\nNo longer marked completed: "
                                      + ", ".join(f"module {m.number}" for m in broken), e.modules) from None
            raise
        console.print(f"exported all {len(ctx.modules)} notebooks into tinytorch/")
    else:
        do_export(ctx, ctx.module(ref))


TEST_TOOLS = ("pytest", "hypothesis")
INSTALL_HINT = 'pip install -e ".[test]"'


def require_test_tools(ctx: Ctx) -> None:
    """The package tests need pytest and hypothesis in this Python; say how to install them."""
    missing = [name for name in TEST_TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        raise CourseError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this "
                          f"environment ({sys.executable}); `tito test` needs them. Install the course with its "
                          f"test tools: cd {ctx.root} && {INSTALL_HINT}")


def run_pytest(ctx: Ctx, files: list[Path], exercises: list[str] = (), verbose: bool = False) -> dict:
    """Run pytest on `files` against this edition's package; returns the plugin's JSON summary."""
    require_test_tools(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", *map(str, files), "-q", "-p", "no:cacheprovider",
               f"--tito-report={report}", "--color=no"]
        if not verbose:  # the output is not shown: Python's own traceback is enough, and cheap to build
            cmd.append("--tb=native")
        for e in exercises:
            cmd.append(f"--exercise={e}")
        cmd.append(f"--tito-timeout={test_timeout(ctx):g}")
        timeout = ctx.settings.number("execution", "pytest_timeout", 900)
        try:
            proc = run_child(cmd, cwd=ctx.root, env=ctx.pythonpath_env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"exitstatus": -1, "tests": [], "output": killed_run_message(report, timeout)}
        data = json.loads(report.read_text()) if report.exists() else {"exitstatus": proc.returncode, "tests": []}
        data["output"] = proc.stdout + proc.stderr
        if verbose:
            console.print(data["output"], markup=False)
            data["shown"] = True
        return data


def test_timeout(ctx: Ctx) -> float:
    "Seconds one package test may run (`[execution] test_timeout`; 0: no limit)."
    return ctx.settings.number("execution", "test_timeout", 120)


def killed_run_message(report: Path, timeout: float) -> str:
    """Why a pytest run that `tito test` had to kill ended: the test it was running (the plugin names it
    in `REPORT.running`), which ignored its own time limit (stuck outside Python's reach)."""
    text = f"pytest did not finish within {timeout:.0f} s ([execution] pytest_timeout in settings.ini)"
    try:
        running = json.loads(report.with_name(report.name + ".running").read_text())
    except (OSError, ValueError):
        return text + ": look for a loop that never ends"
    what = " ".join(x for x in (running.get("exercise"), running.get("function")) if x)
    return (f"{text}: it was still running {running.get('nodeid')}{f' ({what})' if what else ''}, past its own "
            "time limit, so it is stuck where Python cannot stop it (inside a C call, or with signals blocked)")


class NotebookExercises:
    """The exercises of one notebook run, read from its source: which exercises each cell's code runs
    (`failures.notebook_reach`), so that a cell failing through another exercise's bug says to fix that
    one first ("not checked on its own: fix Exercise 17.1 (dead_code_elimination) first")."""

    def __init__(self, nb, release=None):
        self.functions = failures.exercise_functions(release if release is not None else nb)
        self.reach = failures.notebook_reach(nb, self.functions)
        self.done: list[nbs.CellResult] = []

    def upstream(self, cells) -> dict[int, list[str]]:
        "{cell position: exercises to fix first} of the cells that ran (one not run failed nothing)."
        return failures.notebook_upstream([(c.index, c.label, c.is_test, c.ok) for c in cells
                                           if c.status != "not_run"], self.reach)

    def first_text(self, exercises: list[str]) -> str:
        names = []
        for ex in exercises:
            fns = [fn for fn, e in self.functions.items() if e == ex]
            names.append(f"Exercise {ex}" + (f" ({', '.join(fns)})" if fns else ""))
        return (f"not checked on its own: fix {' and '.join(names)} first "
                f"({'its test fails' if len(names) == 1 else 'their tests fail'})")


def cell_reason(c: nbs.CellResult, modules=(), own: str | None = None, first: str = "") -> str:
    """Why a cell failed: the exercise to fix first (`first`), the earlier module whose exported code
    raised if another one did, then the failure."""
    frames = failures.text_frames(c.traceback)
    chain = failures.module_chain(frames, modules, own) if modules and c.ename != "Timeout" else []
    prefix = f"{first}: " if first else ""  # (a cell stopped at its time limit says where it was itself)
    if not chain:
        return prefix + c.reason()
    if c.status == "not_implemented":
        if frames and frames[-1][0] == "<notebook cell>":   # the stub is this notebook's own, called back by
            return prefix + c.reason()                        # an earlier module (an op observer, a hook)
        return f"{prefix}{c.reason()} (module {chain[0][0]}, {chain[0][2]})"
    return f"{prefix}{failures.where_it_failed(frames, modules, own)}: {c.reason()}"


def print_notebook_report(report: nbs.Report, modules=(), own: str | None = None,
                          exercises: NotebookExercises | None = None) -> None:
    upstream = exercises.upstream(report.cells) if exercises else {}

    def why(c):
        return cell_reason(c, modules, own, exercises.first_text(upstream[c.index]) if c.index in upstream else "")

    table = Table(title=f"notebook tests: {report.notebook.name}")
    for col in ("test", "points", "result"):
        table.add_column(col)
    for c in report.tests:
        mark = "[green]passed[/]" if c.ok else f"[red]{escape(why(c))}[/]"
        table.add_row(escape(c.label), f"{c.points if c.ok else 0:g}/{c.points:g}", mark)
    console.print(table)
    for c in report.errors:
        console.print(f"[red]{escape(c.label)} raised[/] {escape(why(c))}")
    if report.fatal:
        console.print(f"[red]{escape(report.fatal)}[/]")
    roots = sorted({e for es in upstream.values() for e in es}, key=failures._number_key)
    if roots:
        console.print(f"[bold]fix first:[/] {escape(', '.join('Exercise ' + e for e in roots))}: the cells after it "
                      "that run its code are not checked on their own")


def _exercise_order(ex: str):
    """'1.10' after '1.9'; tests without an exercise marker last."""
    return (not ex, [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in ex.split(".")])


def print_pytest_report(data: dict, title: str, rerun: str = "") -> bool:
    """The package tests as a table: one row per exercise, what to fix, and how to see all of it."""
    tests = data.get("tests", [])
    if not tests:
        tail = data.get("output", "")[-3000:] if data.get("exitstatus") not in (0, 5) and not data.get("shown") else ""
        console.print(f"[red]{title}: no tests ran[/]" + (f"\n{escape(tail)}" if tail else ""))
        return False
    by_ex: dict[tuple, list] = {}
    for t in tests:
        by_ex.setdefault((t["exercise"], t["function"]), []).append(t)
    table = Table(title=title)
    for col in ("exercise", "function", "passed", "what to fix"):
        table.add_column(col)
    ok = True
    failed_exercises = []
    depends: dict[str, set[str]] = {}  # exercise -> the upstream exercises its failures name
    for t in tests:
        if t["outcome"] == "failed" and t.get("upstream"):
            depends.setdefault(t["exercise"], set()).update(t["upstream"])
    order = {e: i for i, e in enumerate(failures.upstream_order([e for e, _ in by_ex if e], depends))}
    for (ex, fn), ts in sorted(by_ex.items(), key=lambda item: (not item[0][0], order.get(item[0][0], 0), item[0][1])):
        failed = [t for t in ts if t["outcome"] == "failed"]
        skipped = [t for t in ts if t["outcome"] == "skipped"]
        passed = sum(t["outcome"] == "passed" for t in ts)
        ok &= not failed
        if failed and ex:
            failed_exercises.append(ex)
        if not ex:  # tests not tied to one exercise: name them instead of a bare "-"
            names = sorted({t["nodeid"].split("::")[-1].split("[")[0] for t in ts})
            fn = ", ".join(names[:2]) + (f" (+{len(names) - 2})" if len(names) > 2 else "")
        reasons = [r for _, r in sorted({(not t.get("upstream"), t["reason"]) for t in failed})]  # fix-first ones first
        reasons = list(dict.fromkeys(reasons))
        fix = reasons[0][:500] + (f" (and {len(reasons) - 1} other failure{'s' if len(reasons) > 2 else ''})"
                                   if len(reasons) > 1 else "") if reasons else ""
        if failed:
            cell = f"[red]{escape(fix)}[/]"
        else:
            cell = "[green]ok[/]"
        if skipped:
            why = sorted({t["reason"] for t in skipped if t["reason"]})
            cell += f" [dim]({len(skipped)} skipped{': ' + escape(why[0][:80]) if why else ''})[/]"
        ran = len(ts) - len(skipped)
        table.add_row(ex or "other", escape(fn or "-"), f"{passed}/{ran}" if ran else "-", cell)
    console.print(table)
    blocked = {}
    for t in tests:
        for up in t.get("upstream", []) if t["outcome"] == "failed" else []:
            blocked.setdefault(up, set()).add(t["nodeid"])
    if blocked:
        names = {}
        for (ex, fn) in by_ex:
            names.setdefault(ex, []).append(fn)
        first = failures.upstream_order(list(blocked), {})
        console.print("[bold]fix first:[/] " + "; ".join(
            f"{escape(e)} {escape(', '.join(names.get(e, [])))} ({len(blocked[e])} other failing "
            f"test{'s' if len(blocked[e]) > 1 else ''} ran it)" for e in first)
            + ": a test that runs an exercise whose own tests fail is not checked on its own")
    if not ok and rerun and not data.get("shown"):
        example = failed_exercises[0] if failed_exercises else None
        console.print(f"the whole failure with its traceback: [bold]{rerun}{f' -e {example}' if example else ''} -v[/]")
    return ok and data.get("exitstatus") in (0, 5)


def notebook_exercises(nb) -> list[str]:
    """Exercise numbers of a notebook, from its test cells' first lines (`# Exercise 2.1: ReLU.forward`)."""
    found = []
    for cell in nb.cells:
        if nbs.is_test_cell(cell):
            m = re.match(r"Exercise\s+([0-9][\w.]*?)\s*:", nbs.exercise_label(cell))
            if m and m.group(1) not in found:
                found.append(m.group(1))
    return sorted(found, key=_exercise_order)


def check_integrity(ctx: Ctx, m: Module, nb):
    """The notebook to grade: the student's, with any deleted, edited or re-tagged graded test cell
    put back from the release (named in a warning). The notebook file itself is not touched."""
    pristine = m.folder / RELEASE_COPY
    if not pristine.exists():
        return nb
    restored, problems = integrity.restore_graded_cells(nb, nbs.read(pristine))
    for p in problems:
        console.print(f"[bold yellow]warning:[/] graded test cell {escape(p.label)} \\[{p.grade_id}]: {escape(p.detail)}. "
                      f"It is graded as released; to put it back in your notebook copy it from "
                      f"{pristine.relative_to(ctx.root)} (open it in JupyterLab)")
    return restored


def student_cell_timeout(ctx: Ctx) -> float:
    return ctx.settings.number("execution", "student_cell_timeout", 60)


class CellProgress:
    """One line per graded cell, failure and slow cell while the notebook runs; in a terminal, a
    spinner names the cell that is running and its time limit."""

    def __init__(self, timeout: float, modules=(), own: str | None = None, exercises: NotebookExercises | None = None):
        self.timeout, self.status, self.modules, self.own = timeout, None, modules, own
        self.exercises, self.done = exercises, []

    def __call__(self, event, item, pos, total):
        if event == "start":
            if console.is_terminal:
                text = f"\\[{pos}/{total}] running {escape(item)} (at most {self.timeout:g} s per cell)"
                if self.status is None:
                    self.status = console.status(text)
                    self.status.start()
                else:
                    self.status.update(text)
            return
        res = item
        self.done.append(res)
        if not (res.is_test or not res.ok or res.seconds >= 2 or "(your solution" in res.label):
            return
        mark = "[green]ok  [/]" if res.ok else "[red]FAIL[/]"
        line = f"  \\[{pos:>2}/{total}] {mark} {res.seconds:5.1f} s  {escape(res.label)}"
        if not res.ok:
            first = self.exercises.upstream(self.done).get(res.index) if self.exercises else None
            first = self.exercises.first_text(first) if first else ""
            line += f": {escape(cell_reason(res, self.modules, self.own, first)[:240])}"
        console.print(line)

    def close(self):
        if self.status is not None:
            self.status.stop()
            self.status = None


def test_module(ctx: Ctx, m: Module, exercises: list[str] = (), verbose: bool = False) -> tuple[bool, nbs.Report | None]:
    """Export (all or nothing), run the notebook's graded tests, then the package tests on the export."""
    nb = nbs.read(m.notebook)
    known = notebook_exercises(nbs.read(m.folder / RELEASE_COPY) if (m.folder / RELEASE_COPY).exists() else nb)
    unknown = [e for e in exercises if known and e not in known]
    if unknown:
        raise CourseError(f"unknown exercise {', '.join(unknown)}; exercises of module {m.number} are "
                          f"{', '.join(known)}")
    suite = ctx.root / "tests" / "modules" / f"test_{m.slug}.py"
    if suite.exists():
        require_test_tools(ctx)
    export_ok = True
    try:
        do_export(ctx, m)
    except nbs.ExportError as e:
        export_ok = False
        console.print(f"[bold red]export refused:[/] {escape(str(e))}")
    nb = check_integrity(ctx, m, nb)
    timeout = student_cell_timeout(ctx)
    console.print(f"[bold]Module {m.number} ({m.title})[/]: running the notebook's graded tests "
                  f"(at most {timeout:g} s per cell)...")
    release = m.folder / RELEASE_COPY
    in_notebook = NotebookExercises(nb, nbs.read(release) if release.exists() else None)
    progress = CellProgress(timeout, ctx.modules, m.number, in_notebook)
    try:
        report = nbs.execute(m.notebook, cwd=m.folder, pythonpath=ctx.root, timeout=timeout, source=nb,
                             on_cell=progress)
    finally:
        progress.close()
    if report.timed_out is not None:
        console.print(f"[bold red]stopped:[/] {escape(report.timed_out.evalue)}; the cells after it were not run")
    print_notebook_report(report, ctx.modules, m.number, in_notebook)
    pytest_ok = True
    if not suite.exists():
        console.print(f"[yellow]no package tests at {suite.relative_to(ctx.root)}[/]")
    elif not export_ok:
        pytest_ok = False
        console.print(f"[red]package tests not run: your notebook does not export (see above), so "
                      f"{m.package_module} still holds your last good export[/]")
    elif report.timed_out is not None:
        pytest_ok = False
        console.print(f"[red]package tests not run: the notebook stopped at {escape(report.timed_out.label)} (see above)[/]")
    else:
        console.print(f"running {suite.relative_to(ctx.root)} on your exported package...")
        data = run_pytest(ctx, [suite], exercises, verbose)
        if exercises and not data.get("tests") and data.get("exercises"):
            raise CourseError(f"unknown exercise {', '.join(exercises)}; the package tests of module {m.number} "
                              f"cover exercises {', '.join(data['exercises'])}")
        pytest_ok = print_pytest_report(data, f"package tests: {m.package_module}", rerun=f"tito test {m.number}")
    ok = report.passed and pytest_ok and export_ok
    console.print(f"notebook score {report.score:g}/{report.max_score:g}; "
                  + ("[bold green]all tests passed[/]" if ok else "[bold red]some tests failed[/]"))
    if ok:
        console.print("[dim]the autograder also checks each exercise on inputs of its own (trusted checks): "
                      "passing here is needed for full marks, not a guarantee of them[/]")
    return ok, report


@handle_errors
def test(ref: str = typer.Argument(..., help="module number or name"),
         exercise: list[str] = typer.Option([], "--exercise", "-e", help="only the package tests of this exercise (e.g. 1.4)"),
         verbose: bool = typer.Option(False, "--verbose", "-v", help="show pytest's full output")):
    """Export your notebook, run its graded tests, then the module's pytest suite on your exported package."""
    ctx = Ctx()
    ok, _ = test_module(ctx, ctx.module(ref), exercise, verbose)
    raise typer.Exit(0 if ok else 1)


@handle_errors
def checkpoint(ref: str = typer.Argument(..., help="module number: checks every module up to it, together"),
               verbose: bool = typer.Option(False, "--verbose", "-v")):
    """Capability check for everything up to a module (cumulative)."""
    ctx = Ctx()
    m = ctx.module(ref)
    files = [ctx.root / "tests" / "checkpoints" / f"test_checkpoint_{x.number}.py"
             for x in ctx.modules if x.number <= m.number]
    missing = [f for f in files if not f.exists()]
    if missing:
        raise CourseError(f"checkpoint files missing: {', '.join(str(f.relative_to(ctx.root)) for f in missing)}")
    console.print(f"[bold]checkpoint {m.number}[/]: modules {ctx.modules[0].number}-{m.number} together")
    data = run_pytest(ctx, files, verbose=verbose)
    tests = data.get("tests", [])
    failed = [t for t in tests if t["outcome"] == "failed"]
    by_file: dict[str, list] = {}
    for t in tests:
        by_file.setdefault(t["nodeid"].split("::")[0], []).append(t)
    table = Table(title=f"checkpoint {m.number}")
    for col in ("checkpoint", "passed", "what to fix"):
        table.add_column(col)
    for f, ts in sorted(by_file.items()):
        bad = [t for t in ts if t["outcome"] == "failed"]
        table.add_row(Path(f).stem.replace("test_", ""), f"{len(ts) - len(bad)}/{len(ts)}",
                      "[red]" + "; ".join(sorted({t["reason"][:120] for t in bad})[:2]) + "[/]" if bad else "[green]ok[/]")
    console.print(table)
    ok = tests and not failed and data.get("exitstatus") == 0
    if ok:
        ctx.progress.mark_checkpoint(m.number)
        ctx.progress.save()
        console.print(f"[bold green]checkpoint {m.number} passed[/]")
    else:
        console.print(f"[bold red]checkpoint {m.number} failed[/]")
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    "Add `export`, `test` and `checkpoint` as top-level commands of `app`."
    app.command("export")(export)
    app.command("test")(test)
    app.command("checkpoint")(checkpoint)
