"""`tito student`: write a student edition."""
from __future__ import annotations

import shlex
from pathlib import Path

import typer

from tito.context import Ctx
from tito.ui import console, handle_errors

app = typer.Typer(help="Student editions of the course.", no_args_is_help=True)


@app.command("init")
@handle_errors
def student_init(dest: Path = typer.Argument(..., help="folder to create the student edition in"),
                 force: bool = typer.Option(False, help="replace DEST if it exists")):
    """Write a student edition (release notebooks, stub package, same tito/tests/milestones) to DEST."""
    from tito.student import INSTALL_COMMAND, init

    ctx = Ctx()
    out = init(ctx.root, dest, force=force, log=lambda s: console.print(f"  {s}"))
    console.print(f"[bold green]student edition written to {out}[/]")
    console.print("next:\n"
                  f"  cd {shlex.quote(str(out))}\n"
                  f"  python3 -m venv .venv && .venv/bin/{INSTALL_COMMAND}\n"
                  "  .venv/bin/tito doctor\n"
                  "  .venv/bin/tito module start 01", markup=False)


# ------------------------------------------------------------------ instructor loop
