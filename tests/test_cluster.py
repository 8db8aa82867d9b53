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


def test_a_job_whose_input_a_dead_worker_took_is_sent_again_and_scored_once(monkeypatch):
    """Dask cancels a job whose scattered input was lost with a worker ("lost dependencies"), and its `wait` raises
    for it: the executor sends the job again (scattering the input again when no copy is left) and reports only the
    second run's result; a job lost more than MAX_RESENDS times is reported, not sent forever."""
    from concurrent.futures import CancelledError
    from types import SimpleNamespace

    import distributed

    from tito import executor as ex

    class Fut:
        def __init__(self, outcome):
            self.outcome = outcome
            self.status = "cancelled" if isinstance(outcome, BaseException) else "finished"

        def result(self):
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

    lost = CancelledError("tito-grade-x cancelled for reason: lost dependencies.")
    plan = {"ann": [lost, {"result": {"score": 1}}], "bob": [lost] * (ex.MAX_RESENDS + 2)}
    scattered = []

    class Client:
        def submit(self, fn, task, shared, key, retries, pure):
            return Fut(plan[task["student"]].pop(0))

        def scatter(self, spec, broadcast, hash):
            scattered.append(spec)
            return SimpleNamespace(status="finished")

    def dask_wait(futures, timeout, return_when):
        if any(f.status == "cancelled" for f in futures):
            raise lost
        return set(futures), set()

    monkeypatch.setattr(distributed, "wait", dask_wait)
    monkeypatch.setattr("nbformat.writes", lambda nb: "{}")
    e = ex.DaskExecutor.__new__(ex.DaskExecutor)
    e.client, e.futures, e.sent, e.address = Client(), {}, {}, "tcp://test"
    e.spec, e.shared = SimpleNamespace(run="r"), SimpleNamespace(status="lost")
    jobs = {s: SimpleNamespace(student=s, fingerprint="", notebook=None, probe=None, skip={}, log=[]) for s in plan}
    for job in jobs.values():
        e.submit(job)
    assert len(scattered) == 1, "the lost input is scattered again once, not per job"
    done = []
    for _ in range(ex.MAX_RESENDS + 3):
        e.wait(done.append)
    by = {d.job.student: d for d in done}
    assert sorted(d.job.student for d in done) == ["ann", "bob"], [d.job.student for d in done]
    assert by["ann"].result == {"score": 1} and e.sent["ann"] == 2
    assert by["bob"].result is None and "could not grade it" in by["bob"].why and e.sent["bob"] == ex.MAX_RESENDS + 1
    assert any("sent again" in line for line in jobs["ann"].log), jobs["ann"].log
