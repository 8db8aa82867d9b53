"""`tito nbgrader`: the instructor loop on nbgrader (offline, no server)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tito.context import Ctx
from tito.course import CourseError
from tito.ui import console, handle_errors

app = typer.Typer(help="The instructor loop on nbgrader (offline, no server).", no_args_is_help=True)


def _instructor(ctx: Ctx):
    if ctx.is_student:
        raise CourseError("the nbgrader commands are for instructors and need the instructor edition (with solutions)")


@app.command("generate")
@handle_errors
def nb_generate(ref: str = typer.Argument(..., help="module number or name")):
    """Generate the student release of a module with nbgrader (and register it in the gradebook)."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.generate(ctx.settings, ctx.module(ref))
    console.print(f"release written: {out.relative_to(ctx.root)}")


@app.command("collect")
@handle_errors
def nb_collect(ref: str = typer.Argument(..., help="module number or name"),
               student: str = typer.Option(..., "--student", "-s", help="student id"),
               notebook: Path = typer.Argument(..., help="the student's notebook, or their edition folder")):
    """Add one student's notebook to nbgrader's submitted/ folder."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.collect(ctx.settings, ctx.module(ref), student, notebook)
    console.print(f"collected {out.relative_to(ctx.root)}")


@app.command("autograde")
@handle_errors
def nb_autograde(ref: str = typer.Argument(..., help="module number or name"),
                 student: Optional[str] = typer.Option(None, "--student", "-s", help="only this student")):
    """Execute and score submissions; prints each student's score."""
    from tito import grading

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


@app.command("feedback")
@handle_errors
def nb_feedback(ref: str = typer.Argument(..., help="module number or name"),
                student: Optional[str] = typer.Option(None, "--student", "-s")):
    """Write HTML feedback for autograded submissions."""
    from tito import grading

    ctx = Ctx()
    _instructor(ctx)
    out = grading.feedback(ctx.settings, ctx.module(ref), student)
    files = sorted(out.rglob("*.html"))
    for f in files:
        console.print(f"feedback: {f.relative_to(ctx.root)}")
    if not files:
        raise CourseError("nbgrader wrote no feedback: autograde the submissions first")


@app.command("export")
@handle_errors
def nb_export():
    """Export the gradebook to a CSV file (settings.ini [nbgrader] grades_csv)."""
    from tito import grading

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
