"""Autograding cost: sandbox CPU and main-process CPU per notebook, and wall time, process pool vs Dask.

    .venv/bin/python tests/benchmarks/bench_autograde.py [--students 20] [--workers 2] [--module 06]
                                                         [--sandbox MODE] [--no-cluster]

Copies the course (tracked files) to a temporary folder, generates the release, collects a class of
correct submissions (made from the release and the source notebook), grades one (the preflight and a
warm-up, timed apart), then grades the same N notebooks (--force) on this machine's process pool of
--workers and on a Dask LocalCluster of --workers worker processes (`--cluster local`), in this one
process, one after the other. For each it prints the wall time, the CPU of tito's own process per
notebook (scoring, gradebook, results; with Dask also the scheduler, which runs in this process) and the
CPU of everything it started per notebook (workers, kernels, probe processes in their sandboxes; with
Dask also the Dask workers themselves). `--students 2` is a smoke test. The machine's other load shows
in the load average printed with each run: compare runs of one invocation, not across invocations.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.simulated_class import make_class  # noqa: E402
from tito import grading  # noqa: E402
from tito.course import Settings, get_module  # noqa: E402
from tito.student import tracked_files  # noqa: E402


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--module", default="06")
    ap.add_argument("--sandbox", default="", help="[grading] sandbox for this run (default: settings.ini's)")
    ap.add_argument("--no-cluster", action="store_true", help="only the process pool")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tito-bench-") as tmp:
        course = Path(tmp) / "course"
        for rel in tracked_files(ROOT):
            if rel.startswith((".git/", ".venv/", "nbgrader/")):
                continue
            (course / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, course / rel)
        if args.sandbox:
            ini = (course / "settings.ini").read_text()
            (course / "settings.ini").write_text(re.sub(r"(?m)^sandbox = .*$", f"sandbox = {args.sandbox}", ini))
        settings = Settings.load(course)
        module = get_module(course, args.module)
        grading.generate(settings, module)
        text = next(iter(make_class(module, ["correct"]).values()))
        inbox = Path(tmp) / "inbox"
        inbox.mkdir()
        for i in range(args.students):
            (inbox / f"student{i:03d}_{module.slug}.ipynb").write_text(text)
        grading.collect_folder(settings, module, inbox)
        t0 = time.perf_counter()
        grading.autograde(settings, module, students=["student000"], workers=1)  # preflight + a warm-up
        print(f"preflight and one warm-up notebook: {time.perf_counter() - t0:.1f} s")

        runs = [(f"process pool ({args.workers} workers)", None)]
        if not args.no_cluster:
            runs.append((f"Dask LocalCluster ({args.workers} workers)", "local"))
        rows = []
        for label, cluster in runs:
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            t0, p0, c0 = time.perf_counter(), time.process_time(), _children_cpu()
            report = grading.autograde(settings, module, force=True, workers=args.workers, cluster=cluster)
            wall = time.perf_counter() - t0
            rows.append((label, wall, time.process_time() - p0, _children_cpu() - c0, load))
            bad = [o for o in report.outcomes.values() if o.status != "graded" or o.score != o.max_score]
            if bad:
                print(f"unexpected results: {bad}")
                return 1
            seconds = [o.seconds for o in report.outcomes.values()]
            print(f"  ({label}: the notebooks ran {min(seconds):.1f}-{max(seconds):.1f} s each in their sandboxes)")
        n = args.students
        print(f"autograde {n} correct {module.slug} notebooks on {os.cpu_count()} cores, sandbox: {report.sandbox}")
        for label, wall, parent, children, load in rows:
            print(f"  {label:<32} wall {wall:7.1f} s ({wall / n:5.2f} s per notebook)   CPU per notebook: "
                  f"sandboxes and workers {children / n:5.2f} s, tito's process {parent / n:5.3f} s   "
                  f"(load average before: {load:.1f})")
        pool = rows[0]
        print(f"  a class of 500: {500 * pool[3] / n / 3600:.2f} CPU-hours in sandboxes, "
              f"{500 * pool[2] / n / 60:.1f} min in tito's own process (the serial part)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
