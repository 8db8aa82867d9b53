"""`tito compete`: the kernel competition of module 17 (see tito.competition)."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tito import competition as comp
from tito.ui import console, handle_errors

app = typer.Typer(
    help="Kernel competition (module 17): check, time and rank submitted kernels against NumPy.",
    no_args_is_help=True,
)


@app.command()
@handle_errors
def run(
    submissions: Path = typer.Argument(..., help="folder of submissions (NAME.py files), or one NAME.py"),
    task: str = typer.Option("matmul", "--task", help=f"the task: {' | '.join(comp.TASKS)}"),
    out: Path = typer.Option(None, "--out", help="leaderboard JSON file (a .md table is written beside it); "
                             "default: SUBMISSIONS/leaderboard-TASK.json"),
    timeout: float = typer.Option(60.0, "--timeout", min=0.1, help="seconds per submission (checking and timing)"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="timed repeats per input (the median is reported)"),
    threads: int = typer.Option(1, "--threads", min=1, help="BLAS/OpenMP threads of every kernel, references included"),
    memory_gb: float = typer.Option(4.0, "--memory-gb", min=0.25, help="address-space limit of each submission"),
    quick: bool = typer.Option(False, "--quick", help="small inputs only (try a submission out; not for ranking)"),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines",
                                   help="also time the NumPy reference and the course's kernels"),
    sandbox: str = typer.Option("auto", "--sandbox", help="where submissions run: auto (bwrap if it works here, "
                                "else namespace, else none) | bwrap | namespace | none (tito.sandbox)"),
) -> None:
    """Check each submission against the reference, time the correct ones, write the leaderboard.

    Exit code 0 when every submission was accepted, 1 when one was rejected (the leaderboard is
    written either way), 2 for a usage error.
    """
    t = comp.get_task(task)
    cases = t.quick_cases if quick else t.cases
    if out is None:
        out = (submissions if submissions.is_dir() else submissions.parent) / f"leaderboard-{t.name}.json"
    runner = comp.Runner(t, cases, timeout=timeout, repeats=repeats, threads=threads,
                         memory_bytes=int(memory_gb * 2 ** 30), sandbox=sandbox)
    console.print(f"[bold]task {t.name}[/]: {escape(t.signature)}")
    console.print(f"inputs: {escape('; '.join(t.describe(c) for c in cases))}")
    console.print(f"tolerance: {escape(t.tolerance)}")
    if runner.box.mode == "none":
        console.print(f"[yellow]warning:[/] {escape(comp.describe_box(runner.box))}; run files you did not write "
                      "in a container or a throwaway account", soft_wrap=True)
    else:
        console.print(escape(comp.describe_box(runner.box)), soft_wrap=True)

    def progress(event, name, entry):
        if event == "start":
            console.print(f"  {escape(name)} ...", end="")
        elif entry["status"] == "accepted":
            console.print(f" [green]accepted[/] {comp.fmt_time(entry['total_s'])}")
        else:
            console.print(f" [red]rejected[/]: {escape(entry['reason'])}", soft_wrap=True)

    board, note, this_run = comp.competition(submissions, t, runner, out, baselines=baselines, on_entry=progress)
    if note:
        console.print(f"[yellow]note:[/] {escape(note)}")
    table = Table(title=f"Leaderboard: {t.name} ({board['machine']['cpu']}, {threads} thread(s))")
    for col in comp.HEADER:
        table.add_column(col, overflow="fold", justify="right" if col in ("#", "GFLOP/s") else "left")
    reasons = []
    for r in comp.rows(board):
        if r[2].startswith("rejected: "):
            reasons.append((r[1], r[2][len("rejected: "):]))
            r[2] = "[red]rejected[/] (see below)"
        else:
            r[2] = escape(r[2])
        table.add_row(escape(r[0]), escape(r[1]), r[2], *[escape(c) for c in r[3:]])
    console.print(table)
    console.print("vs NumPy: the NumPy kernel's total time over the entry's, both timed in turns in the entry's process, with the 95% bootstrap interval of "
                  "that ratio over the repeats: faster or slower only when the whole interval says so"
                  + ("; this quick run (small inputs, where a call's overhead is most of the time) is not a ranking: "
                     "run without --quick to rank" if board.get("quick") else ""), soft_wrap=True)
    for name, why in reasons:
        console.print(f"[red]rejected[/] {escape(name)}: {escape(why)}", soft_wrap=True)
    console.print(f"leaderboard: {out} and {out.with_suffix('.md')}")
    rejected = [e for e in this_run if e["kind"] == "submission" and e["status"] != "accepted"]
    raise typer.Exit(1 if rejected else 0)


@app.command()
@handle_errors
def example(
    folder: Path = typer.Argument(..., help="where to write the example submissions"),
    task: str = typer.Option("matmul", "--task", help=f"the task: {' | '.join(comp.TASKS)}"),
    force: bool = typer.Option(False, "--force", help="overwrite files of the same name"),
) -> None:
    """Write two example submissions: a correct (vectorised, not fast) one and a deliberately wrong one."""
    t = comp.get_task(task)
    for p in comp.write_examples(folder, t, force):
        console.print(f"wrote {p}")
    console.print(f"try them: [bold]tito compete run {escape(str(folder))} --task {t.name} --quick[/]")


@app.command()
@handle_errors
def tasks() -> None:
    """List the tasks: each function's signature, inputs and tolerance."""
    for t in comp.TASKS.values():
        console.print(f"[bold]{t.name}[/]: {escape(t.signature)}")
        console.print(f"  inputs: {escape('; '.join(t.describe(c) for c in t.cases))}")
        console.print(f"  tolerance: {escape(t.tolerance)}")
        console.print(f"  baselines: {escape(', '.join(b.name for b in t.baselines))}")
