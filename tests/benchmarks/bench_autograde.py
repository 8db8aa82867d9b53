"""Autograding throughput: a class of correct notebooks graded serially, then in parallel, same process.

    .venv/bin/python tests/benchmarks/bench_autograde.py [--students 20] [--workers N] [--module 01] [--sandbox MODE]

Copies the course (tracked files) to a temporary folder, generates the release, collects a class of
correct submissions (made from the release and the source notebook), grades it with one worker and
then again (--force) with N workers (default: the machine's cores), and prints both times and the
ratio. The sandbox is whatever `tito nbgrader autograde` uses on this machine (`--sandbox` picks one:
auto, bwrap, namespace, none). The one-time preflight (starting the worker in the sandbox before the
first submission) is timed separately and is not part of either run.
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
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--module", default="01")
    ap.add_argument("--sandbox", default="", help="[grading] sandbox for this run (default: settings.ini's)")
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

        times, cpu = {}, {}
        for label, workers in (("serial (1 worker)", 1), (f"parallel ({args.workers} workers)", args.workers)):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            t0, p0, c0 = time.perf_counter(), time.process_time(), _children_cpu()
            report = grading.autograde(settings, module, force=True, workers=workers)
            times[label] = time.perf_counter() - t0
            cpu[label] = (time.process_time() - p0, _children_cpu() - c0, load)
            bad = [o for o in report.outcomes.values() if o.status != "graded" or o.score != o.max_score]
            if bad:
                print(f"unexpected results: {bad}")
                return 1
        print(f"autograde {args.students} correct {module.slug} notebooks on {os.cpu_count()} cores, "
              f"sandbox: {report.sandbox}")
        for label, t in times.items():
            parent, children, load = cpu[label]
            print(f"  {label:<24} {t:7.1f} s   {t / args.students:5.2f} s per notebook   CPU: tito {parent:5.1f} s, "
                  f"workers and kernels {children:6.1f} s   (load average before: {load:.1f})")
        serial, parallel = times.values()
        print(f"  speedup (serial / parallel): {serial / parallel:.2f}x")
        print("  (other processes on the machine take their share of the cores: compare with the load average)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
