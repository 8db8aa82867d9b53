"""`tito export`, `tito test`, `tito checkpoint`: export a module and test it on the student's package."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tito import notebooks as nbs
from tito.context import Ctx
from tito.course import CourseError, Module
from tito.ui import console, handle_errors


def do_export(ctx: Ctx, m: Module) -> None:
    nbs.read(m.notebook)
    nbs.export(ctx.root, m.notebook)
    console.print(f"exported {m.notebook.relative_to(ctx.root)} -> {m.package_module}")



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


@handle_errors
def test(ref: str = typer.Argument(..., help="module number or name"),
         exercise: list[str] = typer.Option([], "--exercise", "-e", help="only the package tests of this exercise (e.g. 1.4)"),
         verbose: bool = typer.Option(False, "--verbose", "-v", help="show pytest's full output")):
    """Run a module's graded notebook tests and its pytest suite on your exported package."""
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
        ctx.progress.entry(m.number)["checkpoint"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
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
