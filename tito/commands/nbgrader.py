"""`tito nbgrader`: the instructor loop on nbgrader (offline, no server)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from tito.context import Ctx
from tito.course import CourseError
from tito.ui import console, err, handle_errors

app = typer.Typer(help="The instructor loop on nbgrader (offline, no server).", no_args_is_help=True)

STATUS_STYLE = {"graded": "green", "needs review": "yellow", "failed": "red", "timed out": "red",
                "kernel died": "red", "not graded": "magenta"}


def _instructor(ctx: Ctx):
    if ctx.is_student:
        raise CourseError("the nbgrader commands are for instructors and need the instructor edition (with solutions)")


def _rel(ctx: Ctx, p: Path) -> str:
    try:
        return str(Path(p).relative_to(ctx.root))
    except ValueError:
        return str(p)


@app.command("generate")
@handle_errors
def nb_generate(ref: str = typer.Argument(..., help="module number or name")):
    """Generate the student release of a module with nbgrader (and register it in the gradebook)."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.generate(ctx.settings, ctx.module(ref))
    console.print(f"release written: {_rel(ctx, out)}")


@app.command("config")
@handle_errors
def nb_config():
    """Write nbgrader/nbgrader_config.py (from settings.ini) for plain nbgrader, formgrader and JupyterHub."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.write_config(ctx.settings)
    folder = _rel(ctx, out.parent)
    console.print(f"written: {_rel(ctx, out)}")
    console.print(f"plain nbgrader: cd {folder} && PATH={Path(sys.executable).parent}:$PATH "
                  "nbgrader autograde 01_tensor   (any nbgrader command)")
    console.print(f"formgrader: cd {folder} && jupyter lab   (the Formgrader menu uses this config and gradebook)")


@app.command("collect")
@handle_errors
def nb_collect(ref: str = typer.Argument(..., help="module number or name"),
               path: Path = typer.Argument(..., help="a folder (or .zip) with one notebook or folder per student; "
                                                     "with --student: that student's notebook or edition folder"),
               student: Optional[str] = typer.Option(None, "--student", "-s", help="collect one student's PATH"),
               mapping: Optional[Path] = typer.Option(None, "--map", help="CSV `name,student_id`: LMS file or "
                                                                          "folder names to student ids")):
    """Add submissions to nbgrader's submitted/ folder; the submission time is the file's own time."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    m = ctx.module(ref)
    if student:
        out = grading.collect(ctx.settings, m, student, path)
        console.print(f"collected {_rel(ctx, out)}")
        return
    if path.is_file() and path.suffix == ".ipynb":
        raise CourseError(f"{path} is one notebook: say whose it is with --student ID, or give a folder of submissions")
    results = grading.collect_folder(ctx.settings, m, path, grading.read_mapping(mapping) if mapping else None)
    table = Table(title=f"collected {m.slug} from {path}")
    for col in ("entry", "student", "result"):
        table.add_column(col)
    for r in results:
        table.add_row(escape(r.source), r.student or "-",
                      "[green]collected[/]" if not r.error else f"[red]not collected:[/] {escape(r.error)}")
    console.print(table)
    ok = [r for r in results if not r.error]
    bad = [r for r in results if r.error]
    console.print(f"{len(ok)} collected into {_rel(ctx, ctx.settings.nbgrader_root / 'submitted')}, {len(bad)} not")
    if not ok and not bad:
        raise CourseError(f"{path} holds no submissions")
    if bad:
        raise typer.Exit(1)


@app.command("autograde")
@handle_errors
def nb_autograde(ref: str = typer.Argument(..., help="module number or name"),
                 student: Optional[List[str]] = typer.Option(None, "--student", "-s", help="only these students"),
                 force: bool = typer.Option(False, "--force", help="grade again even unchanged submissions"),
                 workers: Optional[int] = typer.Option(None, "--workers", "-j",
                                                       help="parallel submissions (default: settings.ini, else cores)"),
                 cluster: Optional[str] = typer.Option(None, "--cluster",
                                                       help="grade on a Dask cluster: `local` (worker processes here) or "
                                                            "a scheduler's tcp://host:port (default: settings.ini "
                                                            "\\[grading] cluster; none: this machine's process pool)")):
    """Execute and score submissions in parallel; every submission gets a status. Exit 1 when any needs you."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    m = ctx.module(ref)
    if workers is not None and workers < 1:
        raise CourseError("--workers must be at least 1")

    progress = None
    if err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), console=err, transient=True)
        task = progress.add_task("", total=None)
    attention = [0]

    def on_event(kind, outcome, done, total):
        if kind == "start":
            if progress is not None:
                progress.update(task, total=total)
            return
        if outcome is None:
            err.print(f"[yellow]note:[/] {escape(kind)}")
            return
        attention[0] += outcome.needs_attention
        line = (f"[{done}/{total}] {outcome.student}: {outcome.score:g}/{outcome.max_score:g} "
                f"{outcome.status} ({outcome.seconds:.1f} s)")
        if progress is not None:
            progress.update(task, total=total, completed=done,
                            description=f"{attention[0]} need attention, last: {escape(outcome.student)}")
        else:
            err.print(escape(line))

    if progress is not None:
        progress.start()
    try:
        report = grading.autograde(ctx.settings, m, student or None, force=force, workers=workers, on_event=on_event,
                                   cluster=cluster)
    finally:
        if progress is not None:
            progress.stop()
    table = Table(title=f"autograded {m.slug}")
    nodes = len({o.node for o in report.outcomes.values() if o.node}) > 1 or report.sandbox not in (
        "bwrap", "namespace", "none")  # on a cluster: which node graded each submission
    for col in ("student", "score", "max", "status") + (("node",) if nodes else ()):
        table.add_column(col)
    for s, o in sorted(report.outcomes.items()):
        style = STATUS_STYLE.get(o.status, "white")
        table.add_row(s, f"{o.score:g}", f"{o.max_score:g}", f"[{style}]{escape(o.label)}[/]",
                      *((escape(o.node),) if nodes else ()))
    console.print(table)
    counts: dict[str, int] = {}
    for o in report.outcomes.values():
        counts[o.status] = counts.get(o.status, 0) + 1
    n = len(report.outcomes)
    console.print(f"{n} submission{'s' if n != 1 else ''}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                  + f" ({len(report.graded_now)} graded now, {len(report.unchanged)} unchanged since the last run"
                  + (", --force re-grades them" if report.unchanged else "") + ")")
    console.print(f"results: {_rel(ctx, report.results_file)}; each submission's full story: "
                  f"{_rel(ctx, report.results_file.with_suffix(''))}/<student>.log")
    for note in report.notes:
        console.print(f"isolation: {escape(note)}" if note.startswith(("student code", "no sandbox")) else escape(note))
    if report.interrupted:
        err.print(f"[bold red]interrupted:[/] not graded: {', '.join(report.interrupted)}; "
                  f"run `tito nbgrader autograde {m.number}` again to grade them (the others are kept)")
        raise typer.Exit(130)
    if report.attention:
        err.print(f"[bold yellow]{len(report.attention)} submission(s) need a person:[/] "
                  + ", ".join(f"{o.student} ({o.status})" for o in report.attention))
        raise typer.Exit(1)


@app.command("feedback")
@handle_errors
def nb_feedback(ref: str = typer.Argument(..., help="module number or name"),
                student: Optional[str] = typer.Option(None, "--student", "-s")):
    """Write HTML feedback for every autograded submission (hidden tests not shown; a page saying why for failures)."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    m = ctx.module(ref)
    missing = []
    for s, page, label in grading.feedback(ctx.settings, m, student):
        if page is None:
            missing.append(s)
            err.print(f"[yellow]{s}:[/] {escape(label)}")
        else:
            console.print(f"{s}: {_rel(ctx, page)}  ({escape(label)})")
    if missing:
        raise typer.Exit(1)


@app.command("export")
@handle_errors
def nb_export():
    """Export the gradebook to a CSV file (settings.ini [nbgrader] grades_csv) with each submission's status."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out, rows = grading.export_grades(ctx.settings)
    table = Table(title=f"grades ({_rel(ctx, out)})")
    for col in ("assignment", "student_id", "raw_score", "max_score", "status"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.get("assignment", ""), r.get("student_id", ""), r.get("raw_score", ""), r.get("max_score", ""),
                      escape(r.get("status", "")))
    console.print(table)
