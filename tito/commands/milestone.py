"""`tito milestone`: list the milestone scripts and run one with the student's own `tinytorch`."""
from __future__ import annotations

import subprocess
import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tito import milestones as ms
from tito.course import edition_env, find_root
from tito.ui import handle_errors

app = typer.Typer(
    help="Milestones: historic models rebuilt with your own tinytorch (1957 perceptron onwards).",
    no_args_is_help=True,
)


@app.command("list")
@handle_errors
def list_() -> None:
    """Show every milestone, the modules it needs and whether yours are ready."""
    console = Console()
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
    table.add_column("status", overflow="fold")
    for m in found:
        missing = ms.readiness(root, m)
        cell = ("[yellow]needs " + escape(", ".join(x.short() for x in missing)) + "[/yellow]" if missing
                else "[green]ready[/green]")
        table.add_row(escape(m.name), str(m.year), f"{escape(m.title)}\n[dim]target: {escape(m.target)}[/dim]",
                      " ".join(m.needs), cell)
    console.print(table)
    console.print("run one with [bold]tito milestone run NAME[/bold]; options after NAME go to the script")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handle_errors
def run(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="milestone name (see `tito milestone list`), script name or year"),
) -> None:
    """Run milestone NAME with this edition's tinytorch; exit with the script's exit code
    (0: target met, 1: not met, 3: too noisy to tell: a speed interval straddles its target).

    Options after NAME go to the script, e.g. `tito milestone run perceptron --epochs 20`.
    Put `--` before script options that tito also knows: `tito milestone run perceptron -- --help`.
    The script runs in the edition root: relative paths in its options are relative to that folder.
    """
    root = find_root()
    milestone = ms.get(root, name)
    missing = ms.readiness(root, milestone)
    if missing:
        message = ms.explain(root, missing, f"milestone {milestone.name!r} ({milestone.year})")
        Console(stderr=True).print(message, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    env = edition_env(root)
    env.setdefault("TITO_ROOT", str(root))
    args = list(ctx.args)
    if args[:1] == ["--"]:
        args = args[1:]
    cmd = [sys.executable, str(milestone.script), *args]
    Console().print(f"[dim]$ {escape(' '.join(cmd))}[/dim]", highlight=False, soft_wrap=True)
    sys.stdout.flush()  # our line first, then the script's
    # Output is not captured: the script writes straight to this terminal (progress bars included).
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches the script too; let it finish its own way
        code = proc.wait()
    raise typer.Exit(code)
