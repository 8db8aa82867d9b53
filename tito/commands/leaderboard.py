"""`tito leaderboard`: merge module-19 result files of a class into one leaderboard.

    tito leaderboard RESULT_FILES_OR_FOLDERS... [--out PATH] [--sort median_s] [--descending]
                     [--workload NAME] [--workload-version N] [--skip-bad]

Each argument is a result file written by `tinytorch.perf.results.write_results` (the systems
milestone's `--results FILE`, or a student's own suite in module 19) or a folder, whose `*.json` files
are all taken. The files are read, checked, merged and ranked by the edition's own
`tinytorch.perf.results.leaderboard` (the format has one implementation, exported from
modules/common/results.ipynb), run in a child process of this edition's Python: tito itself never
imports the package. tito then writes the result atomically (a temporary file, then `os.replace`) as
`PATH.json` (every row, with the files it came from) and `PATH.md` (a Markdown table).

Every file must be for the same workload and workload version: by default the ones module 19's suite
measures now (`WORKLOAD`, `WORKLOAD_VERSION`), else `--workload`/`--workload-version`.
A file for another version, a file that is not valid JSON or not a result file, or no file at all
stops the command with exit code 2 and one line naming the file and the fix, and nothing is
written: a leaderboard that silently leaves out a submission is wrong for that student. With
`--skip-bad` such files are left out instead, listed under the table and in the JSON's `skipped`,
and the exit code is 1. Rows that carry a `batch` (the systems milestone writes batch 1 and 64)
are ranked within their batch size: a call on 64 inputs is not comparable with a call on one.
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import typer
from rich.markup import escape

from tito.course import CourseError, edition_env, find_root
from tito.proc import run as run_child
from tito.progress import atomic_write_text  # a temporary file, fsync, os.replace
from tito.ui import console, err, handle_errors

KIND = "tinytorch-leaderboard"
CHILD = "import sys; from tinytorch.perf.results import main; sys.exit(main(sys.argv[1:]))"


def _board(files: list[Path], workload, version, sort: str, descending: bool) -> dict:
    """The edition's `tinytorch.perf.results.leaderboard` of `files`, computed in a child process of this
    edition's Python (tito imports no tinytorch); a CourseError when the package cannot do it."""
    root = find_root()
    cmd = [sys.executable, "-c", CHILD, "leaderboard", *map(str, files), "--sort", sort]
    if workload is not None:
        cmd += ["--workload", workload]
    if version is not None:
        cmd += ["--workload-version", str(version)]
    if descending:
        cmd.append("--descending")
    try:
        proc = run_child(cmd, cwd=root, env=edition_env(root), timeout=300)
    except subprocess.TimeoutExpired:
        raise CourseError("reading the result files took more than 300 s; are they on a slow network drive?") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        if "tinytorch.perf.results" in proc.stderr or "No module named 'tinytorch" in proc.stderr:
            raise CourseError(f"this edition's package cannot read result files ({last}); regenerate it with "
                              "`tito export` (tinytorch.perf.results comes from modules/common/results.ipynb)")
        raise CourseError(f"reading the result files failed: {last}")
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise CourseError(f"the package's leaderboard printed something that is not JSON: {proc.stdout[:200]!r}") from None


def collect(paths: list[Path], exclude: set[Path]) -> list[Path]:
    "The result files: each file argument, and every *.json of each folder argument (sorted), minus `exclude`."
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.glob("*.json") if f.is_file() and not f.name.startswith("."))
        elif p.exists():
            files.append(p)
        else:
            raise CourseError(f"{p}: no such file or folder; pass result files (JSON written by write_results) "
                              "or folders holding them")
    seen, out = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen and key not in exclude and not _is_leaderboard(f):
            seen.add(key)
            out.append(f)
    return out


def _is_leaderboard(path: Path) -> bool:
    "Whether `path` is a leaderboard this command wrote (left in a results folder by an earlier --out)."
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == KIND


def _is_leaderboard_md(path: Path) -> bool:
    try:
        return path.is_file() and path.read_text(encoding="utf-8").startswith("# Leaderboard: ")
    except (OSError, ValueError):
        return False


def markdown(board: dict) -> str:
    "The leaderboard as a Markdown document: a heading, what it measured, the table, the files left out."
    cols = board["columns"]
    lines = [f"# Leaderboard: {board['workload']} version {board['workload_version']}", "",
             f"{len(board['rows'])} rows from {len(board['files'])} result files, ranked by {board['sort']} "
             f"({'highest' if board['descending'] else 'lowest'} first{', within each batch size' if 'batch' in cols else ''}); "
             f"written {board['generated']}.", "",
             "| " + " | ".join("#" if c == "rank" else c for c in cols) + " |",
             "|" + "|".join("---:" if c in ("rank", "batch", "median_s", "ci_low_s", "ci_high_s", "accuracy", "bytes")
                            else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in board["cells"]]
    if board["skipped"]:
        lines += ["", "Left out:", ""] + [f"- {s['reason']}" for s in board["skipped"]]
    return "\n".join(lines) + "\n"


@handle_errors
def leaderboard(
    paths: list[Path] = typer.Argument(..., help="result files (JSON from write_results) or folders of them"),
    out: Path = typer.Option(None, "--out", help="where to write PATH.json and PATH.md (a folder: "
                             "FOLDER/leaderboard.*); default: leaderboard in the first folder given (or the first "
                             "file's folder)"),
    sort: str = typer.Option("median_s", "--sort", help="the row field to rank by (median_s, ci_high_s, p99_s, "
                             "accuracy, bytes, ...)"),
    descending: bool = typer.Option(False, "--descending", help="highest first (for accuracy)"),
    workload: str = typer.Option(None, "--workload", help="the workload every file must be for; default: the one "
                                 "module 19's suite measures now"),
    workload_version: int = typer.Option(None, "--workload-version", help="the workload version every file must be "
                                         "for; default: module 19's WORKLOAD_VERSION"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="leave out (and list) files of another workload version "
                                  "or that cannot be read, instead of refusing the whole merge"),
) -> None:
    """Merge module-19 result files into one leaderboard: print it, write PATH.json and PATH.md atomically.

    Exit code 0 when every file was merged, 1 when --skip-bad left files out, 2 when a file was refused
    (another workload version, invalid JSON, not a result file) or there was nothing to merge.
    """
    if out is None:
        first = paths[0]
        out = (first if first.is_dir() else first.parent) / "leaderboard"
    if out.is_dir():
        out = out / "leaderboard"
    elif out.suffix in (".json", ".md"):
        out = out.with_suffix("")
    out_json, out_md = out.with_name(out.name + ".json"), out.with_name(out.name + ".md")
    for existing, ours in ((out_json, _is_leaderboard), (out_md, _is_leaderboard_md)):
        if existing.exists() and not ours(existing):
            raise CourseError(f"--out {out}: {existing} exists and is not a leaderboard this command wrote; "
                              "choose another --out (nothing was overwritten)")
    files = collect(paths, exclude={out_json.resolve()})
    if not files:
        raise CourseError(f"no result files (*.json) in {', '.join(map(str, paths))}; pass the files written by "
                          "write_results (e.g. `python milestones/systems_2018.py --results NAME.json`)")
    result = _board(files, workload, workload_version, sort, descending)
    problems = [(Path(f), why) for f, why in result["problems"]]
    if problems and not skip_bad:
        f, why = problems[0]
        more = f" ({len(problems) - 1} more file(s) refused too)" if len(problems) > 1 else ""
        raise CourseError(f"{why}{more}; fix or remove {f}, or pass --skip-bad to leave it out and rank the others")
    if result["error"]:
        first = f" (first: {problems[0][1]})" if problems else ""
        raise CourseError(f"{result['error']}{first}")
    workload, version, rows = result["workload"], result["workload_version"], result["rows"]
    good = result["files"]
    board = {"kind": KIND, "workload": workload, "workload_version": version, "sort": sort, "descending": descending,
             "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "files": good, "skipped": [{"file": str(f), "reason": why} for f, why in problems],
             "columns": result["columns"], "rows": rows}
    try:
        atomic_write_text(out_json, json.dumps(board, indent=1, default=str) + "\n")
        atomic_write_text(out_md, markdown({**board, "cells": result["cells"]}))
    except OSError as e:
        raise CourseError(f"cannot write the leaderboard {out_json}: {e.strerror or e}; pass another --out") from None
    table = result["table"]
    console.print(f"[bold]leaderboard[/]: workload {escape(workload)} version {version}, {len(rows)} rows from "
                  f"{len(good)} file(s), ranked by {escape(sort)}{' (highest first)' if descending else ''}"
                  f"{', within each batch size' if 'batch' in board['columns'] else ''}", soft_wrap=True)
    console.print(escape(table), soft_wrap=True)
    noisy = sum(1 for r in rows if r.get("warnings"))
    if noisy:
        console.print(f"[yellow]note:[/] {noisy} row(s) carry noise warnings from their run (see 'warnings' in "
                      f"{escape(str(out_json))}): compare those with care")
    for f, why in problems:
        err.print(f"[yellow]left out[/] {escape(why)}", soft_wrap=True)
    console.print(f"leaderboard: {escape(str(out_json))} and {escape(str(out_md))}")
    raise typer.Exit(1 if problems else 0)


def register(app: typer.Typer) -> None:
    "Add `leaderboard` as a top-level command of `app`."
    app.command("leaderboard")(leaderboard)
