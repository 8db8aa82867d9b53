"""Grading on a Dask cluster (tito.executor): the same scores as the process pool, a node's death loses nothing.

A small class of module 02 is graded on the local process pool, then again on a LocalCluster of two worker
processes (through its scheduler's address, as a Slurm or Kubernetes cluster is used) while one worker is
killed in the middle of a job: the scheduler runs that job again on a worker that lives, and every submission
is scored exactly once, with the pool's scores, and says which node graded it.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.simulated_class import make_class
from tests.test_grading import INSTRUCTOR, course, set_settings  # noqa: F401  (the course fixture)
from tito import grading
from tito.course import CourseError, Settings, get_module

distributed = pytest.importorskip("distributed")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor edition")]
KINDS = ["correct", "stub", "partial", "visible", "syntax"]


def _class(course_dir):
    settings = Settings.load(course_dir)
    module = get_module(course_dir, "02")
    inbox = course_dir.parent / "inbox"
    inbox.mkdir()
    for name, text in make_class(module, KINDS).items():
        (inbox / name).write_text(text)
    grading.collect_folder(settings, module, inbox)
    return settings, module


def _kill_a_busy_worker(client, killed: list, stop: threading.Event) -> None:
    """SIGKILL the process of the first Dask worker seen running a grading job (its nanny starts a new one)."""
    pids = client.run(os.getpid)
    while not stop.is_set():
        for addr, keys in client.processing().items():
            if any(str(k).startswith("tito-grade-") for k in keys) and addr in pids:
                time.sleep(1.0)  # well inside the job: its notebook worker and kernel are running
                os.kill(pids[addr], signal.SIGKILL)
                killed.append((addr, [str(k) for k in keys]))
                return
        time.sleep(0.1)


def test_cluster_grades_like_the_pool_and_survives_a_dead_worker(course):  # noqa: F811
    settings, module = _class(course)
    pool = grading.autograde(settings, module, workers=2)
    expected = {s: (o.score, o.status) for s, o in pool.outcomes.items()}
    assert set(expected) == set(KINDS)
    assert expected["correct"][0] == pool.outcomes["correct"].max_score > 0
    assert expected["stub"][0] == 0

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=0) as cluster, Client(cluster.scheduler_address) as client:
        done: dict[str, int] = {}
        killed: list = []
        stop = threading.Event()
        killer = threading.Thread(target=_kill_a_busy_worker, args=(client, killed, stop), daemon=True)
        killer.start()

        def on_event(kind, outcome, n, total):
            if kind == "done":
                done[outcome.student] = done.get(outcome.student, 0) + 1

        try:
            report = grading.autograde(settings, module, force=True, on_event=on_event,
                                       cluster=cluster.scheduler_address)
        finally:
            stop.set()
            killer.join(timeout=30)
    assert killed, "no worker was seen running a job: the test killed nothing"
    assert done == {s: 1 for s in KINDS}, f"each submission scored exactly once: {done}"
    assert not report.interrupted
    got = {s: (o.score, o.status) for s, o in report.outcomes.items()}
    assert got == expected, f"cluster {got} != process pool {expected}"
    on_disk = grading.load_results(settings, module)
    assert all(o.node and "tcp://" in o.node for o in on_disk.values()), {s: o.node for s, o in on_disk.items()}
    assert any("cluster" in n and "Dask worker" in n for n in report.notes), report.notes
    log = (course / on_disk["correct"].log).read_text()
    assert "on " + on_disk["correct"].node in log and "sandbox: sandbox " in log


def test_cluster_refuses_bad_addresses(course):  # noqa: F811
    settings, module = _class(course)
    with pytest.raises(CourseError, match="give `local` or a Dask scheduler's address"):
        grading.autograde(settings, module, students=["correct"], cluster="host:8786")
    with pytest.raises(CourseError, match="cannot reach the Dask scheduler"):
        from tito.executor import DaskExecutor

        DaskExecutor("tcp://127.0.0.1:9", None, connect_s=2)


def test_a_node_without_its_sandbox_refuses_in_one_line(course):  # noqa: F811
    """`[grading] sandbox = bwrap` where bubblewrap cannot run: every worker refuses, the run says why."""
    set_settings(course, grading__sandbox="no-such-sandbox")
    settings, module = _class(course)
    with pytest.raises(CourseError) as e:
        grading.autograde(settings, module, students=["correct"], cluster="local", workers=1)
    assert "refuses to grade" in str(e.value) and "must be one of" in str(e.value)
    assert "\n" not in str(e.value)
