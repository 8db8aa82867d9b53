"""`tito module`: the student loop (list, status, start, complete, reset, restore)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from tito import milestones
from tito import notebooks as nbs
from tito.commands.check import test_module
from tito.context import Ctx, modules_table
from tito.course import CourseError, all_prerequisites
from tito.student import student_jupyter_env
from tito.ui import console, handle_errors

app = typer.Typer(help="The student loop: list, start, complete, reset and restore modules.", no_args_is_help=True)


def require_prerequisites(ctx: Ctx, m, force: bool, action: str) -> None:
    """Refuse to `action` module `m` while a prerequisite is not completed (unless --force), naming them
    and the command that completes the first."""
    missing = ctx.missing_prerequisites(m)
    if missing and not force:
        names = ", ".join(f"{x.number} ({x.title})" for x in missing)
        raise CourseError(f"module {m.slug} needs {names} completed first: run "
                          f"`tito module complete {missing[0].number}` (or pass --force to {action} anyway)")


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
    require_prerequisites(ctx, m, force, "start")
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
    backup = back_up(ctx, m)
    replace_notebook(pristine, m.notebook)
    ctx.progress.mark_incomplete(m.number)
    ctx.progress.save()
    if backup:
        console.print(f"your notebook was backed up to {backup}; to bring it back: "
                      f"[bold]tito module restore {m.number}[/]")
    console.print(f"restored the starting version of {m.notebook}; your exported package is unchanged until "
                  f"`tito export {m.number}`")


def backups_dir(ctx: Ctx) -> Path:
    return ctx.settings.state_dir / "backups"


def back_up(ctx: Ctx, m) -> Path | None:
    """Copy `m`'s notebook to `.tito/backups/NN_name-DATE.ipynb` (a new name each time); None without a notebook."""
    if not m.notebook.exists():
        return None
    backups = backups_dir(ctx)
    backups.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    backup, n = backups / f"{m.slug}-{stamp}.ipynb", 1
    while backup.exists():
        backup, n = backups / f"{m.slug}-{stamp}-{n}.ipynb", n + 1
    shutil.copy2(m.notebook, backup)
    return backup


def module_backups(ctx: Ctx, m) -> list[Path]:
    """`m`'s backups, oldest first, by the time their names carry (`NN_name-DATE-TIME[-n].ipynb`; a
    backup keeps its notebook's modification time, so that is not when it was made)."""
    folder = backups_dir(ctx)
    found = []
    for p in folder.glob(f"{m.slug}-*.ipynb") if folder.is_dir() else []:
        made = re.fullmatch(rf"{re.escape(m.slug)}-(\d{{8}}-\d{{6}})(?:-(\d+))?\.ipynb", p.name)
        if made:
            found.append(((made.group(1), int(made.group(2) or 0)), p))
    return [p for _, p in sorted(found)]


def replace_notebook(source: Path, notebook: Path) -> None:
    """Put a copy of `source` in place of `notebook` atomically (a reader sees the old or the new one)."""
    tmp = notebook.with_name(f".{notebook.name}.tmp")
    shutil.copy2(source, tmp)
    os.replace(tmp, notebook)


@app.command("restore")
@handle_errors
def module_restore(ref: str = typer.Argument(..., help="module number or name"),
                   backup: Optional[Path] = typer.Argument(None, help="a backup file in .tito/backups/ (default: the latest)"),
                   yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation")):
    """Bring back a notebook that `tito module reset` backed up (your current notebook is backed up first)."""
    ctx = Ctx()
    m = ctx.module(ref)
    found = module_backups(ctx, m)
    if backup is None:
        if not found:
            raise CourseError(f"no backup of module {m.number} in {backups_dir(ctx)}: `tito module reset "
                              f"{m.number}` makes one before it restores the starting version")
        backup = found[-1]
    else:
        candidates = [backup, backups_dir(ctx) / backup]
        backup = next((c for c in candidates if c.is_file()), None)
        if backup is None:
            listing = ", ".join(p.name for p in found[-5:]) or "none"
            raise CourseError(f"backup {candidates[0]} not found; backups of module {m.number} in "
                              f"{backups_dir(ctx)}: {listing}")
    nbs.read(backup)  # a damaged backup is refused before anything is replaced
    if not yes and not typer.confirm(f"replace {m.notebook.name} with the backup {backup.name} (yours is backed up)?"):
        raise typer.Exit(1)
    mine = back_up(ctx, m)
    replace_notebook(backup, m.notebook)
    ctx.progress.mark_incomplete(m.number)
    ctx.progress.save()
    if mine:
        console.print(f"your current notebook was backed up to {mine}")
    console.print(f"restored {m.notebook} from {backup}; run [bold]tito test {m.number}[/] and "
                  f"[bold]tito module complete {m.number}[/] to record it again")



@app.command("complete")
@handle_errors
def module_complete(ref: str = typer.Argument(..., help="module number or name"),
                    force: bool = typer.Option(False, help="complete even if prerequisites are not completed")):
    """Check prerequisites, export your notebook, test it, record your progress and show what is unlocked."""
    ctx = Ctx()
    m = ctx.module(ref)
    require_prerequisites(ctx, m, force, "complete")
    before = {x.number: ctx.state(x) for x in ctx.modules}
    ok, report = test_module(ctx, m)
    if not ok:
        console.print(f"module {m.number} is not complete yet: fix what the tables above name, then run "
                      f"`tito module complete {m.number}` again")
        raise typer.Exit(1)
    ctx.progress.mark_completed(m.number, report.score, report.max_score)
    ctx.progress.save()
    console.print(f"[bold green]module {m.number} ({m.title}) completed[/]")
    unlocked = [x for x in ctx.modules  # by this completion (another command may have completed others meanwhile)
                if x.number != m.number and before[x.number] == "locked" and ctx.state(x) != "locked"
                and m.number in all_prerequisites(ctx.root, x)]
    for x in unlocked:
        console.print(f"unlocked: module {x.number} ({x.title}): `tito module start {x.number}`")
    for ms in milestones.discover(ctx.root):
        if m.number in ms.needs and not milestones.readiness(ctx.root, ms):
            console.print(f"milestone ready: {ms.year} {ms.title}: `tito milestone run {ms.name}`")
    if not unlocked:
        nxt = next((x for x in ctx.modules if ctx.state(x) == "ready"), None)
        if nxt:
            console.print(f"next: `tito module start {nxt.number}` ({nxt.title})")
