"""`tito doctor`: is this machine ready for the course?"""
from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from tito.context import Ctx
from tito.ui import console, handle_errors


@handle_errors
def doctor():
    """Check Python, packages, the Jupyter kernel, nbgrader and permissions; each line says its fix."""
    from tito.doctor import run_checks

    ctx = Ctx()
    results = run_checks(ctx.root, ctx.settings)
    table = Table(title="tito doctor")
    for col in ("check", "status", "detail / fix"):
        table.add_column(col)
    for name, ok, detail in results:
        table.add_row(name, "[green]ok[/]" if ok else "[red]FAIL[/]", escape(detail))
    console.print(table)
    raise typer.Exit(0 if all(ok for _, ok, _ in results) else 1)



def register(app: typer.Typer) -> None:
    "Add `doctor` as a top-level command of `app`."
    app.command("doctor")(doctor)
