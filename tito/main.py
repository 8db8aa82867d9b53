"""`tito`: the TinyTorch course CLI.

    tito module list|status|start|complete|reset    the student loop
    tito export NN / tito test NN / tito checkpoint NN
    tito student init DIR                           write a student edition
    tito nbgrader generate|collect|autograde|feedback|export   the instructor loop
    tito milestone list|run                         historic milestones
    tito doctor                                     is this machine ready?
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import notebooks as nbs
from .course import (CourseError, Module, Settings, all_prerequisites, edition_env, find_root, get_module,
                     load_modules)
from .progress import Progress
from .ui import console, err, handle_errors


app = typer.Typer(help="TinyTorch course CLI: build, test and grade the modules.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
module_app = typer.Typer(help="The student loop: list, start, complete and reset modules.", no_args_is_help=True)
student_app = typer.Typer(help="Student editions of the course.", no_args_is_help=True)
nbgrader_app = typer.Typer(help="The instructor loop on nbgrader (offline, no server).", no_args_is_help=True)
app.add_typer(module_app, name="module")
app.add_typer(student_app, name="student")
app.add_typer(nbgrader_app, name="nbgrader")


class Ctx:
    """What every command needs: the edition root, its settings, its modules and the progress file."""

    def __init__(self):
        self.root = find_root()
        self.settings = Settings.load(self.root)
        self.modules = load_modules(self.root)
        self._progress: Progress | None = None

    @property
    def progress(self) -> Progress:
        if self._progress is None:
            self._progress = Progress.load(self.settings.state_dir)
            for w in self._progress.warnings:
                err.print(f"[bold yellow]warning:[/] {w}")
            if self._progress.warnings:
                self._progress.save()
        return self._progress

    @property
    def is_student(self) -> bool:
        return self.settings.edition == "student"

    def module(self, ref: str) -> Module:
        return get_module(self.root, ref)

    def state(self, m: Module) -> str:
        p = self.progress
        if p.is_completed(m.number):
            return "completed"
        missing = [n for n in all_prerequisites(self.root, m) if not p.is_completed(n)]
        if missing:
            return "locked"
        if p.is_started(m.number):
            return "in progress"
        return "ready"

    def missing_prerequisites(self, m: Module) -> list[Module]:
        by_number = {x.number: x for x in self.modules}
        return [by_number[n] for n in all_prerequisites(self.root, m)
                if n in by_number and not self.progress.is_completed(n)]

    def pythonpath_env(self) -> dict:
        return edition_env(self.root)


STATE_STYLE = {"completed": "green", "in progress": "yellow", "ready": "cyan", "locked": "dim"}


def modules_table(ctx: Ctx) -> Table:
    table = Table(title=f"TinyTorch modules ({ctx.settings.edition} edition)")
    for col in ("#", "module", "title", "needs", "state"):
        table.add_column(col)
    for m in ctx.modules:
        state = ctx.state(m)
        table.add_row(m.number, m.name, m.title, ", ".join(m.prerequisites) or "-",
                      f"[{STATE_STYLE[state]}]{state}[/]")
    return table


@module_app.command("list")
@handle_errors
def module_list():
    """Table of modules: number, title, prerequisites and your state in each."""
    ctx = Ctx()
    console.print(modules_table(ctx))


@module_app.command("status")
@handle_errors
def module_status():
    """Your progress: the module table, what you completed, and what to do next."""
    ctx = Ctx()
    console.print(modules_table(ctx))
    done = [m for m in ctx.modules if ctx.progress.is_completed(m.number)]
    console.print(f"completed {len(done)} of {len(ctx.modules)} modules "
                  f"(progress file: {ctx.progress.path})")
    nxt = next((m for m in ctx.modules if ctx.state(m) in ("in progress", "ready")), None)
    if nxt:
        console.print(f"next: [bold]tito module start {nxt.number}[/] ({nxt.title})")


@module_app.command("start")
@handle_errors
def module_start(ref: str = typer.Argument(..., help="module number or name, e.g. 01"),
                 lab: bool = typer.Option(True, "--lab/--no-lab", help="open JupyterLab on the notebook"),
                 force: bool = typer.Option(False, help="start even if prerequisites are not completed")):
    """Check prerequisites, show where the notebook is, and open it in JupyterLab."""
    ctx = Ctx()
    m = ctx.module(ref)
    missing = ctx.missing_prerequisites(m)
    if missing and not force:
        names = ", ".join(f"{x.number} ({x.title})" for x in missing)
        raise CourseError(f"module {m.slug} needs {names} completed first: run "
                          f"`tito module complete {missing[0].number}` (or pass --force to start anyway)")
    if not m.notebook.exists():
        pristine = m.folder / ".release.ipynb"
        if pristine.exists():
            shutil.copy2(pristine, m.notebook)
            console.print(f"restored the starting notebook {m.notebook}")
        else:
            raise CourseError(f"{m.notebook} is missing")
    nbs.read(m.notebook)
    ctx.progress.mark_started(m.number)
    ctx.progress.save()
    console.print(f"[bold]Module {m.number}: {m.title}[/]  {m.summary}")
    console.print(f"notebook: {m.notebook}")
    if not ctx.is_student:
        console.print("[yellow]note:[/] this is the instructor edition (the notebook holds the solutions); "
                      "work as a student in an edition made by `tito student init DIR`")
    console.print(f"when its tests pass: [bold]tito module complete {m.number}[/]")
    if lab:
        console.print("starting JupyterLab (Ctrl-C to stop)...")
        rel = m.notebook.relative_to(ctx.root).as_posix()
        cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={ctx.root}",
               f"--LabApp.default_url=/lab/tree/{rel}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # containers often run as root; JupyterLab refuses otherwise
        raise typer.Exit(subprocess.call(cmd, cwd=ctx.root, env=ctx.pythonpath_env()))


@module_app.command("reset")
@handle_errors
def module_reset(ref: str = typer.Argument(..., help="module number or name"),
                 yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation")):
    """Back up your notebook and restore the starting (release) version."""
    ctx = Ctx()
    m = ctx.module(ref)
    pristine = m.folder / ".release.ipynb"
    if not ctx.is_student or not pristine.exists():
        raise CourseError("this is the instructor edition: modules/ holds the source solutions, so there is no "
                          "starting version to restore. Work as a student in `tito student init DIR`; to undo "
                          f"edits to the source use `git checkout -- {m.notebook.relative_to(ctx.root)}`")
    if not yes and not typer.confirm(f"replace {m.notebook.name} with the starting version (yours is backed up)?"):
        raise typer.Exit(1)
    backup = None
    if m.notebook.exists():
        backups = ctx.settings.state_dir / "backups"
        backups.mkdir(parents=True, exist_ok=True)
        backup = backups / f"{m.slug}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        n = 1
        while backup.exists():
            backup = backup.with_name(f"{m.slug}-{time.strftime('%Y%m%d-%H%M%S')}-{n}.ipynb")
            n += 1
        shutil.copy2(m.notebook, backup)
    tmp = m.notebook.with_name(f".{m.notebook.name}.tmp")
    shutil.copy2(pristine, tmp)
    os.replace(tmp, m.notebook)
    ctx.progress.mark_incomplete(m.number)
    ctx.progress.save()
    if backup:
        console.print(f"your notebook was backed up to {backup}")
    console.print(f"restored the starting version of {m.notebook}; your exported package is unchanged until "
                  f"`tito export {m.number}`")


# ------------------------------------------------------------------ export / test / complete


def do_export(ctx: Ctx, m: Module) -> None:
    nbs.read(m.notebook)
    nbs.export(ctx.root, m.notebook)
    console.print(f"exported {m.notebook.relative_to(ctx.root)} -> {m.package_module}")


@app.command("export")
@handle_errors
def export(ref: Optional[str] = typer.Argument(None, help="module number or name; all modules when omitted")):
    """Export a module's notebook into the tinytorch package (nbdev)."""
    ctx = Ctx()
    if ref is None:
        nbs.export(ctx.root)
        console.print(f"exported all {len(ctx.modules)} notebooks into tinytorch/")
    else:
        do_export(ctx, ctx.module(ref))


def run_pytest(ctx: Ctx, files: list[Path], exercises: list[str] = (), verbose: bool = False) -> dict:
    """Run pytest on `files` against this edition's package; returns the plugin's JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", *map(str, files), "-q", "-p", "no:cacheprovider",
               f"--tito-report={report}", "--color=no"]
        for e in exercises:
            cmd.append(f"--exercise={e}")
        timeout = ctx.settings.number("execution", "pytest_timeout", 900)
        try:
            proc = subprocess.run(cmd, cwd=ctx.root, env=ctx.pythonpath_env(), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"exitstatus": -1, "tests": [], "output": f"pytest did not finish within {timeout:.0f} s"}
        data = json.loads(report.read_text()) if report.exists() else {"exitstatus": proc.returncode, "tests": []}
        data["output"] = proc.stdout + proc.stderr
        if verbose or (proc.returncode not in (0, 1, 5) and not data["tests"]):
            console.print(data["output"])
        return data


def print_notebook_report(report: nbs.Report) -> None:
    table = Table(title=f"notebook tests: {report.notebook.name}")
    for col in ("test", "points", "result"):
        table.add_column(col)
    for c in report.tests:
        mark = "[green]passed[/]" if c.ok else f"[red]{c.reason()}[/]"
        table.add_row(c.label, f"{c.points if c.ok else 0:g}/{c.points:g}", mark)
    console.print(table)
    for c in report.errors:
        where = f"cell {c.index + 1}" + (f" ({c.grade_id})" if c.grade_id else "")
        console.print(f"[red]{where} raised[/] {c.reason()}")
    if report.fatal:
        console.print(f"[red]{report.fatal}[/]")


def print_pytest_report(data: dict, title: str) -> bool:
    tests = data.get("tests", [])
    if not tests:
        console.print(f"[red]{title}: no tests ran[/]" + (f"\n{data.get('output', '')[-3000:]}" if data.get("exitstatus") else ""))
        return False
    by_ex: dict[tuple, list] = {}
    for t in tests:
        by_ex.setdefault((t["exercise"], t["function"]), []).append(t)
    table = Table(title=title)
    for col in ("exercise", "function", "passed", "what to fix"):
        table.add_column(col)
    ok = True
    def order(item):  # "1.10" after "1.9"; tests without an exercise marker last
        ex = item[0][0]
        return (not ex, [(0, int(x), "") if x.isdigit() else (1, 0, x) for x in ex.split(".")], item[0][1])

    for (ex, fn), ts in sorted(by_ex.items(), key=order):
        failed = [t for t in ts if t["outcome"] == "failed"]
        passed = sum(t["outcome"] == "passed" for t in ts)
        ok &= not failed
        reasons = sorted({t["reason"] for t in failed})
        fix = "; ".join(r[:160] for r in reasons[:2]) + (" ..." if len(reasons) > 2 else "")
        table.add_row(ex or "-", fn or "-", f"{passed}/{len(ts)}", f"[red]{fix}[/]" if failed else "[green]ok[/]")
    console.print(table)
    return ok and data.get("exitstatus") in (0, 5)


def test_module(ctx: Ctx, m: Module, exercises: list[str] = (), verbose: bool = False) -> tuple[bool, nbs.Report | None]:
    pkg = m.package_file(ctx.root)
    if pkg and pkg.exists() and m.notebook.exists() and m.notebook.stat().st_mtime > pkg.stat().st_mtime + 1:
        console.print(f"[yellow]note:[/] {m.notebook.name} changed after the last export; the package tests run "
                      f"on your last export (`tito export {m.number}` updates it)")
    console.print(f"[bold]Module {m.number} ({m.title})[/]: running the notebook's graded tests...")
    report = nbs.execute(m.notebook, cwd=m.folder, pythonpath=ctx.root,
                         timeout=ctx.settings.number("execution", "cell_timeout", 300))
    print_notebook_report(report)
    suite = ctx.root / "tests" / "modules" / f"test_{m.slug}.py"
    pytest_ok = True
    if suite.exists():
        console.print(f"running {suite.relative_to(ctx.root)} on your exported package...")
        data = run_pytest(ctx, [suite], exercises, verbose)
        pytest_ok = print_pytest_report(data, f"package tests: {m.package_module}")
    else:
        console.print(f"[yellow]no package tests at {suite.relative_to(ctx.root)}[/]")
    ok = report.passed and pytest_ok
    console.print(f"notebook score {report.score:g}/{report.max_score:g}; "
                  + ("[bold green]all tests passed[/]" if ok else "[bold red]some tests failed[/]"))
    return ok, report


@app.command("test")
@handle_errors
def test(ref: str = typer.Argument(..., help="module number or name"),
         exercise: list[str] = typer.Option([], "--exercise", "-e", help="only the package tests of this exercise (e.g. 1.4)"),
         verbose: bool = typer.Option(False, "--verbose", "-v", help="show pytest's full output")):
    """Run a module's graded notebook tests and its pytest suite on your exported package."""
    ctx = Ctx()
    ok, _ = test_module(ctx, ctx.module(ref), exercise, verbose)
    raise typer.Exit(0 if ok else 1)


@module_app.command("complete")
@handle_errors
def module_complete(ref: str = typer.Argument(..., help="module number or name")):
    """Export your notebook, test it, record your progress and show what is unlocked."""
    ctx = Ctx()
    m = ctx.module(ref)
    before = {x.number: ctx.state(x) for x in ctx.modules}
    do_export(ctx, m)
    ok, report = test_module(ctx, m)
    if not ok:
        console.print(f"module {m.number} is not complete yet: fix what the tables above name, then run "
                      f"`tito module complete {m.number}` again")
        raise typer.Exit(1)
    ctx.progress.mark_completed(m.number, report.score, report.max_score)
    ctx.progress.save()
    console.print(f"[bold green]module {m.number} ({m.title}) completed[/]")
    unlocked = [x for x in ctx.modules if before[x.number] == "locked" and ctx.state(x) != "locked"]
    for x in unlocked:
        console.print(f"unlocked: module {x.number} ({x.title}): `tito module start {x.number}`")
    try:
        from . import milestones

        for ms in milestones.discover(ctx.root):
            if m.number in ms.needs and not milestones.readiness(ctx.root, ms):
                console.print(f"milestone ready: {ms.year} {ms.title}: `tito milestone run {ms.name}`")
    except (ImportError, AttributeError, CourseError):
        pass
    if not unlocked:
        nxt = next((x for x in ctx.modules if ctx.state(x) == "ready"), None)
        if nxt:
            console.print(f"next: `tito module start {nxt.number}` ({nxt.title})")


@app.command("checkpoint")
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
        ctx.progress.entry(m.number)["checkpoint"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        ctx.progress.save()
        console.print(f"[bold green]checkpoint {m.number} passed[/]")
    else:
        console.print(f"[bold red]checkpoint {m.number} failed[/]")
    raise typer.Exit(0 if ok else 1)


# ------------------------------------------------------------------ student edition


@student_app.command("init")
@handle_errors
def student_init(dest: Path = typer.Argument(..., help="folder to create the student edition in"),
                 force: bool = typer.Option(False, help="replace DEST if it exists")):
    """Write a student edition (release notebooks, stub package, same tito/tests/milestones) to DEST."""
    from .student import init

    ctx = Ctx()
    out = init(ctx.root, dest, force=force, log=lambda s: console.print(f"  {s}"))
    console.print(f"[bold green]student edition written to {out}[/]")
    console.print("next:\n"
                  f"  cd {out}\n"
                  "  python3 -m venv .venv && .venv/bin/pip install -e .\n"
                  "  .venv/bin/tito module start 01")


# ------------------------------------------------------------------ instructor loop


def _instructor(ctx: Ctx):
    if ctx.is_student:
        raise CourseError("the nbgrader commands are for instructors and need the instructor edition (with solutions)")


@nbgrader_app.command("generate")
@handle_errors
def nb_generate(ref: str = typer.Argument(..., help="module number or name")):
    """Generate the student release of a module with nbgrader (and register it in the gradebook)."""
    from . import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.generate(ctx.settings, ctx.module(ref))
    console.print(f"release written: {out.relative_to(ctx.root)}")


@nbgrader_app.command("collect")
@handle_errors
def nb_collect(ref: str = typer.Argument(..., help="module number or name"),
               student: str = typer.Option(..., "--student", "-s", help="student id"),
               notebook: Path = typer.Argument(..., help="the student's notebook, or their edition folder")):
    """Add one student's notebook to nbgrader's submitted/ folder."""
    from . import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.collect(ctx.settings, ctx.module(ref), student, notebook)
    console.print(f"collected {out.relative_to(ctx.root)}")


@nbgrader_app.command("autograde")
@handle_errors
def nb_autograde(ref: str = typer.Argument(..., help="module number or name"),
                 student: Optional[str] = typer.Option(None, "--student", "-s", help="only this student")):
    """Execute and score submissions; prints each student's score."""
    from . import grading

    ctx = Ctx()
    _instructor(ctx)
    m = ctx.module(ref)
    grading.autograde(ctx.settings, m, student)
    table = Table(title=f"autograded {m.slug}")
    for col in ("student", "score", "max"):
        table.add_column(col)
    for s, (score, mx) in sorted(grading.scores(ctx.settings, m).items()):
        if student is None or s == student:
            table.add_row(s, f"{score:g}", f"{mx:g}")
    console.print(table)


@nbgrader_app.command("feedback")
@handle_errors
def nb_feedback(ref: str = typer.Argument(..., help="module number or name"),
                student: Optional[str] = typer.Option(None, "--student", "-s")):
    """Write HTML feedback for autograded submissions."""
    from . import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.feedback(ctx.settings, ctx.module(ref), student)
    files = sorted(out.rglob("*.html"))
    for f in files:
        console.print(f"feedback: {f.relative_to(ctx.root)}")
    if not files:
        raise CourseError("nbgrader wrote no feedback: autograde the submissions first")


@nbgrader_app.command("export")
@handle_errors
def nb_export():
    """Export the gradebook to a CSV file (settings.ini [nbgrader] grades_csv)."""
    from . import grading

    ctx = Ctx()
    _instructor(ctx)
    out, rows = grading.export_grades(ctx.settings)
    table = Table(title=f"grades ({out.relative_to(ctx.root)})")
    for col in ("assignment", "student_id", "raw_score", "max_score"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.get("assignment", ""), r.get("student_id", ""), r.get("raw_score", ""), r.get("max_score", ""))
    console.print(table)


# ------------------------------------------------------------------ doctor and milestones


@app.command("doctor")
@handle_errors
def doctor():
    """Check Python, packages, the Jupyter kernel, nbgrader and permissions; each line says its fix."""
    from .doctor import run_checks

    ctx = Ctx()
    results = run_checks(ctx.root, ctx.settings)
    table = Table(title="tito doctor")
    for col in ("check", "status", "detail / fix"):
        table.add_column(col)
    for name, ok, detail in results:
        table.add_row(name, "[green]ok[/]" if ok else "[red]FAIL[/]", detail)
    console.print(table)
    raise typer.Exit(0 if all(ok for _, ok, _ in results) else 1)


try:
    from .commands.milestone import app as milestone_app

    app.add_typer(milestone_app, name="milestone")
except ImportError:  # pragma: no cover - only while the milestone commands are absent
    pass


if __name__ == "__main__":
    app()
