"""`tito milestone`: list the milestone scripts and run one with the student's own `tinytorch`."""
from __future__ import annotations

import os
import subprocess
import sys

import typer
from rich.console import Console
from rich.table import Table

from tito import milestones as ms
from tito.course import find_root

app = typer.Typer(
    help="Milestones: historic models rebuilt with your own tinytorch (1957 perceptron onwards).",
    no_args_is_help=True,
)
console = Console()
err_console = Console(stderr=True)


@app.command("list")
def list_() -> None:
    """Show every milestone, the modules it needs and whether yours are ready."""
    root = find_root()
    found = ms.discover(root)
    if not found:
        console.print(f"no milestone scripts in {root / ms.MILESTONES_DIR}")
        return
    table = Table(title="Milestones")
    table.add_column("name", style="bold")
    table.add_column("year", justify="right")
    table.add_column("title")
    table.add_column("needs")
    table.add_column("status")
    for m in found:
        status = ms.readiness(root, m)
        cell = ("[green]ready[/green]" if status.ready
                else "[yellow]needs " + ", ".join(x.short() for x in status.missing) + "[/yellow]")
        table.add_row(m.name, str(m.year), f"{m.title}\n[dim]target: {m.target}[/dim]", " ".join(m.needs), cell)
    console.print(table)
    console.print("run one with [bold]tito milestone run NAME[/bold]; options after NAME go to the script")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="milestone name (see `tito milestone list`), script name or year"),
) -> None:
    """Run milestone NAME with this edition's tinytorch; exit with the script's exit code.

    Options after NAME go to the script, e.g. `tito milestone run perceptron --epochs 20`.
    Put `--` before script options that tito also knows: `tito milestone run perceptron -- --help`.
    """
    root = find_root()
    milestone = ms.get(root, name)
    status = ms.readiness(root, milestone)
    if not status.ready:
        err_console.print(status.message(root), markup=False, highlight=False)
        raise typer.Exit(2)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TITO_ROOT", str(root))
    args = list(ctx.args)
    if args[:1] == ["--"]:
        args = args[1:]
    cmd = [sys.executable, str(milestone.script), *args]
    console.print(f"[dim]$ {' '.join(cmd)}[/dim]", highlight=False)
    # Output is not captured: the script writes straight to this terminal (progress bars included).
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches the script too; let it finish its own way
        code = proc.wait()
    raise typer.Exit(code)
