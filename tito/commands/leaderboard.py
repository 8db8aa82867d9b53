"""`tito leaderboard`: merge module-19 result files of a class into one leaderboard.

    tito leaderboard RESULT_FILES_OR_FOLDERS... [--out PATH] [--sort median_s] [--descending]
                     [--workload NAME] [--workload-version N] [--skip-bad]

Each argument is a result file written by `tinytorch.perf.benchmark.write_results` (the systems
milestone's `--results FILE`, or a student's own suite) or a folder, whose `*.json` files are all
taken. The files are read and merged by module 19's own `read_results`/`merge_leaderboard` from this
edition's package, printed with `format_leaderboard`, and written atomically (a temporary file, then
`os.replace`) as `PATH.json` (every row, with the files it came from) and `PATH.md` (a Markdown table).

Every file must be for the same workload and workload version: by default the ones the package's
module 19 measures now (`WORKLOAD`, `WORKLOAD_VERSION`), else `--workload`/`--workload-version`.
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
import sys
from pathlib import Path

import typer
from rich.markup import escape

from tito.course import CourseError, find_root
from tito.progress import atomic_write_text  # a temporary file, fsync, os.replace
from tito.ui import console, err, handle_errors

NEEDED = ("WORKLOAD", "WORKLOAD_VERSION", "read_results", "merge_leaderboard", "format_leaderboard", "format_seconds")
KIND = "tinytorch-leaderboard"


def _benchmark():
    "Module 19's `tinytorch.perf.benchmark` from this edition; without it, a CourseError that says how to get it."
    root = find_root()
    if sys.path[:1] != [str(root)]:
        sys.path.insert(0, str(root))
    try:
        import tinytorch.perf.benchmark as bm
    except ImportError as e:
        raise CourseError(f"tito leaderboard needs module 19 (benchmarking) exported ({e}); complete module 19 "
                          "and run `tito export 19`") from None
    missing = [n for n in NEEDED if not hasattr(bm, n)]
    if missing:
        raise CourseError(f"this edition's tinytorch.perf.benchmark lacks {', '.join(missing)}: complete module 19 "
                          "and run `tito export 19`")
    return bm


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


def _problem(bm, path: Path, workload: str, version: int, sort: str) -> str | None:
    "Why `path` cannot join the leaderboard (one line naming it), or None."
    try:
        bm.merge_leaderboard([path], workload=workload, workload_version=version, sort_by=sort)
    except (ValueError, OSError, TypeError) as e:
        if isinstance(e, OSError):
            msg = f"cannot read {path}: {e.strerror or e}"
        elif isinstance(e, UnicodeDecodeError):
            msg = f"{path} is not a text file ({e.reason} at byte {e.start}); was it written by write_results?"
        elif isinstance(e, TypeError):
            msg = f"{path}: cannot sort its rows by {sort!r} ({e})"
        else:
            msg = str(e)
            for prefix in ("read_results: ", "merge_leaderboard: "):   # the function's name: noise for an instructor
                msg = msg.removeprefix(prefix)
            if str(path) not in msg and path.name not in msg:
                msg = f"{path}: {msg}"
        return " ".join(msg.split())
    return None


def rank(rows: list[dict]) -> list[dict]:
    "Add `rank` (1, 2, ... in the order given); rows with a `batch` are grouped by it and ranked within it."
    if any("batch" in r for r in rows):
        rows = sorted(rows, key=lambda r: (r.get("batch") is None, r.get("batch") or 0))  # stable: keeps the order
    out, n, group = [], 0, object()
    for r in rows:
        if r.get("batch") != group:
            group, n = r.get("batch"), 0
        n += 1
        out.append({"rank": n, **r})
    return out


def columns(rows: list[dict]) -> tuple:
    cols = ["rank", "submitter", "model"]
    if any("batch" in r for r in rows):
        cols.append("batch")
    cols += ["median_s", "ci_low_s", "ci_high_s"]
    cols += [c for c in ("accuracy", "bytes") if any(r.get(c) is not None for r in rows)]
    return tuple(cols + ["cpu", "file"])


def markdown(bm, board: dict) -> str:
    "The leaderboard as a Markdown document: a heading, what it measured, the table, the files left out."
    def cell(key, v):
        if v is None:
            return "-"
        if key.endswith("_s") and isinstance(v, (int, float)):
            return bm.format_seconds(v)
        if key == "accuracy" and isinstance(v, (int, float)):
            return f"{v:.1%}"
        if isinstance(v, int) and not isinstance(v, bool):
            return f"{v:,d}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    cols = board["columns"]
    lines = [f"# Leaderboard: {board['workload']} version {board['workload_version']}", "",
             f"{len(board['rows'])} rows from {len(board['files'])} result files, ranked by {board['sort']} "
             f"({'highest' if board['descending'] else 'lowest'} first{', within each batch size' if 'batch' in cols else ''}); "
             f"written {board['generated']}.", "",
             "| " + " | ".join("#" if c == "rank" else c for c in cols) + " |",
             "|" + "|".join("---:" if c in ("rank", "batch", "median_s", "ci_low_s", "ci_high_s", "accuracy", "bytes")
                            else "---" for c in cols) + "|"]
    lines += ["| " + " | ".join(cell(c, r.get(c)) for c in cols) + " |" for r in board["rows"]]
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
                                 "module 19 measures now"),
    workload_version: int = typer.Option(None, "--workload-version", help="the workload version every file must be "
                                         "for; default: module 19's WORKLOAD_VERSION"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="leave out (and list) files of another workload version "
                                  "or that cannot be read, instead of refusing the whole merge"),
) -> None:
    """Merge module-19 result files into one leaderboard: print it, write PATH.json and PATH.md atomically.

    Exit code 0 when every file was merged, 1 when --skip-bad left files out, 2 when a file was refused
    (another workload version, invalid JSON, not a result file) or there was nothing to merge.
    """
    bm = _benchmark()
    workload = workload if workload is not None else bm.WORKLOAD
    version = workload_version if workload_version is not None else bm.WORKLOAD_VERSION
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
    problems = [(f, why) for f in files if (why := _problem(bm, f, workload, version, sort))]
    if problems and not skip_bad:
        f, why = problems[0]
        more = f" ({len(problems) - 1} more file(s) refused too)" if len(problems) > 1 else ""
        raise CourseError(f"{why}{more}; fix or remove {f}, or pass --skip-bad to leave it out and rank the others")
    good = [f for f in files if f not in {p for p, _ in problems}]
    if not good:
        raise CourseError(f"none of the {len(files)} result file(s) could be merged (first: {problems[0][1]})")
    try:
        rows = bm.merge_leaderboard(good, workload=workload, workload_version=version, sort_by=sort)
    except (ValueError, TypeError) as e:   # e.g. --sort on a field that is a number in one file, text in another
        raise CourseError(f"cannot merge the result files by {sort!r}: {' '.join(str(e).split())}; choose another "
                          "--sort") from None
    except NotImplementedError as e:
        raise CourseError(f"module 19 is not complete yet ({e}); complete module 19 and run `tito export 19`") from None
    if descending:
        rows = rows[::-1]
    rows = rank(rows)
    board = {"kind": KIND, "workload": workload, "workload_version": version, "sort": sort, "descending": descending,
             "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "files": [str(f) for f in good], "skipped": [{"file": str(f), "reason": why} for f, why in problems],
             "columns": list(columns(rows)), "rows": rows}
    try:
        table = bm.format_leaderboard(rows, columns=columns(rows))
    except NotImplementedError as e:
        raise CourseError(f"module 19 is not complete yet ({e}); complete module 19 and run `tito export 19`") from None
    try:
        atomic_write_text(out_json, json.dumps(board, indent=1, default=str) + "\n")
        atomic_write_text(out_md, markdown(bm, board))
    except OSError as e:
        raise CourseError(f"cannot write the leaderboard {out_json}: {e.strerror or e}; pass another --out") from None
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
