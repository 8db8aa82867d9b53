"""`tito module`: the student loop (list, status, start, complete, reset)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import typer

from tito import milestones
from tito import notebooks as nbs
from tito.commands.check import test_module
from tito.context import Ctx, modules_table
from tito.course import CourseError
from tito.student import student_jupyter_env
from tito.ui import console, handle_errors

app = typer.Typer(help="The student loop: list, start, complete and reset modules.", no_args_is_help=True)


@app.command("list")
@handle_errors
def module_list():
    """Table of modules: number, title, prerequisites and your state in each."""
    ctx = Ctx()
    console.print(modules_table(ctx))


@app.command("status")
@handle_errors
def module_status():
    """Your progress: the module table, what you completed, and what to do next."""
    ctx = Ctx()
    console.print(modules_table(ctx))
    done = [m for m in ctx.modules if ctx.progress.is_completed(m.number)]
    console.print(f"completed {len(done)} of {len(ctx.modules)} modules "
                  f"(progress file: {ctx.progress.path})")
    nxt = next((m for m in ctx.modules if ctx.state(m) in ("in progress", "ready")), None)
    if nxt and ctx.state(nxt) == "in progress":
        console.print(f"now: module {nxt.number} ({nxt.title}) is in progress: work in "
                      f"{nxt.notebook.relative_to(ctx.root)} (`tito module start {nxt.number}` opens it), check it "
                      f"with [bold]tito test {nxt.number}[/], then record it with "
                      f"[bold]tito module complete {nxt.number}[/]")
    elif nxt:
        console.print(f"next: [bold]tito module start {nxt.number}[/] ({nxt.title})")


@app.command("start")
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
        env = ctx.pythonpath_env()
        if ctx.is_student:  # a student's JupyterLab without nbgrader's instructor tools (see student_jupyter_env)
            env = student_jupyter_env(ctx.root, env)
        # Ctrl-C belongs to JupyterLab here (it asks before shutting down); tito just waits for it.
        signal.signal(signal.SIGINT, lambda signum, frame: None)  # not SIG_IGN: JupyterLab would inherit that
        raise typer.Exit(subprocess.call(cmd, cwd=ctx.root, env=env))


@app.command("reset")
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



@app.command("complete")
@handle_errors
def module_complete(ref: str = typer.Argument(..., help="module number or name")):
    """Export your notebook, test it, record your progress and show what is unlocked."""
    ctx = Ctx()
    m = ctx.module(ref)
    before = {x.number: ctx.state(x) for x in ctx.modules}
    ok, report = test_module(ctx, m)
    if not ok:
        console.print(f"module {m.number} is not complete yet: fix what the tables above name, then run "
                      f"`tito module complete {m.number}` again")
        raise typer.Exit(1)
    ctx.progress.mark_completed(m.number, report.score, report.max_score)
    ctx.progress.save()
    console.print(f"[bold green]module {m.number} ({m.title}) completed[/]")
    unlocked = [x for x in ctx.modules
                if x.number != m.number and before[x.number] == "locked" and ctx.state(x) != "locked"]
    for x in unlocked:
        console.print(f"unlocked: module {x.number} ({x.title}): `tito module start {x.number}`")
    for ms in milestones.discover(ctx.root):
        if m.number in ms.needs and not milestones.readiness(ctx.root, ms):
            console.print(f"milestone ready: {ms.year} {ms.title}: `tito milestone run {ms.name}`")
    if not unlocked:
        nxt = next((x for x in ctx.modules if ctx.state(x) == "ready"), None)
        if nxt:
            console.print(f"next: `tito module start {nxt.number}` ({nxt.title})")
