"""Where grading jobs run: one interface, this machine's process pool or a Dask cluster behind it.

A grading job is data in, data out. In: one submission's sanitized notebook (hidden tests removed) and its
probe job (the student's exported code, as data); shared by every job of a run, sent to each node once: the
prerequisite package files, the limits, the sandbox setting and the run's `Plan` (the reference's recorded
outcomes: trusted data, which never enters a sandbox). Out: the executed notebook with its status, the
trusted checks' verdicts, the log lines and the node that graded it. Only the instructor's process scores
it into the gradebook, writes the autograded notebook and the results (`tito.grading.autograde`).

- `LocalExecutor`: worker processes of this machine (`tito.grading.WorkerPool`), the default.
- `DaskExecutor`: a `dask.distributed` cluster: `local` starts a `LocalCluster` of worker processes here,
  `tcp://host:port` uses a running scheduler (started by hand, over SSH, by dask-jobqueue on Slurm/PBS or by
  dask-kubernetes). Each Dask worker is a trusted process on its node: it grades every job inside the same
  sandbox as a local worker (`tito.sandbox`, bubblewrap on the node), and refuses, with one line saying why,
  where that sandbox cannot run (the same preflight) or where its tito differs from the instructor's. A job
  whose worker dies is run again on another worker by the scheduler; each submission's result comes back to
  the instructor's process once, and is scored once.

Both have the same four calls: `room()` (may another job start now), `submit(job)`, `wait(on_done, timeout)`
(calls `on_done(Done)` for each finished job) and `close()` (stop; the students whose jobs were cut short).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .course import CourseError


@dataclass
class Done:
    """A finished job: `result` None when the notebook worker died or was killed (`why` says how)."""
    job: object  # tito.grading.Job
    result: dict | None
    why: str
    killed: bool
    checked: object = None  # tito.trusted.Checked, or None
    node: str = ""  # which machine (and Dask worker) graded it
    sandbox: str = ""  # that node's sandbox, in words


class LocalExecutor:
    """Submissions graded by worker processes of this machine, `size` at a time."""

    def __init__(self, box, size: int, files: dict[str, str], g, plan=None):
        from .grading import WorkerPool

        self.box = box
        self.pool = WorkerPool(box, size, files, g, plan, helpers=True)
        self.node = socket.gethostname()
        self.notes: list[str] = []
        self.sandbox: str | None = None

    def room(self) -> bool:
        return len(self.pool.running) < self.pool.size

    def busy(self) -> bool:
        return bool(self.pool.running)

    def submit(self, job) -> None:
        self.pool.launch(job)

    def wait(self, on_done: Callable[[Done], None], timeout: float = 1.0) -> None:
        """Block until a job ends (or `timeout` passes, or `wake()`), then call `on_done` for each that ended."""
        if self.sandbox is None:
            self.sandbox = self.box.describe()  # the same for every job of the run
        self.pool.poll(lambda job, result, why, killed, checked=None: on_done(
            Done(job, result, why, killed, checked, self.node, self.sandbox)), timeout)

    def wake(self) -> None:
        """Make a waiting `wait` return now (a signal handler calls it: the run stops)."""
        self.pool.wake()

    def close(self) -> list[str]:
        return self.pool.close()


# ------------------------------------------------------------------ the node side of a Dask cluster


@dataclass
class NodeSpec:
    """What every node of one grading run needs, sent to each once (scattered)."""
    run: str
    module_number: str
    sandbox: str  # settings.ini [grading] sandbox
    hidden: list[Path]  # namespace sandbox: folders covered (those that exist on the node)
    root: Path
    files: dict[str, str]  # the prerequisite package, base64 by path
    imports: list[str]  # what the preflight imports
    g: object  # tito.grading.GradingSettings
    plan: object = None  # tito.trusted.Plan (trusted: the reference's records), or None
    digest: str = ""  # tito.trusted.probe_digest on the instructor's machine
    threads: int = 1


@dataclass
class Node:
    """One Dask worker process's sandbox for one run: made and checked (preflight) at its first job."""
    name: str
    box: object = None
    code_dir: Path | None = None
    refused: str = ""
    slots: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
        if self.code_dir is not None:
            shutil.rmtree(self.code_dir, ignore_errors=True)


_NODES: dict[str, Node] = {}  # run id -> this worker process's node (one process serves one course's runs)
_NODES_LOCK = threading.Lock()


def _worker_name(worker=None) -> tuple[str, int]:
    """('host (tcp://address)', threads) of the Dask worker this runs in (`worker`: given by `Client.run`)."""
    try:
        if worker is None:
            from distributed import get_worker

            worker = get_worker()
        return f"{socket.gethostname()} ({worker.address})", max(1, int(worker.state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return socket.gethostname(), 1


def node_for(spec: NodeSpec, worker=None) -> Node:
    """This process's node for `spec.run`, made on first use: the sandbox, tito's code tree, the cgroups and the
    preflight. A node that cannot grade keeps its one-line reason (`refused`)."""
    with _NODES_LOCK:
        node = _NODES.get(spec.run)
        if node is not None:
            return node
        name, threads = _worker_name(worker)
        node = _NODES[spec.run] = Node(name, slots=list(range(threads)))
        try:
            _setup(node, spec, threads)
        except CourseError as e:
            node.refused = f"node {name} refuses to grade: {e}"
        except Exception as e:  # noqa: BLE001 - whatever stops a node, said in one line
            node.refused = f"node {name} refuses to grade: {type(e).__name__}: {e}"
        return node


def _setup(node: Node, spec: NodeSpec, threads: int) -> None:
    from .sandbox import Cgroups, make_sandbox, preflight
    from .trusted import code_tree, probe_digest

    if spec.plan is not None and spec.digest and probe_digest(spec.plan.module) != spec.digest:
        raise CourseError("its tito (probes or probe runner) differs from the instructor's: install the same "
                          "tito version on every node")
    g = spec.g
    mem = int(g.memory_gb * (1 << 30))
    box = make_sandbox(g.sandbox, [p for p in spec.hidden if Path(p).exists()], Path(spec.root), mem,
                       workers=threads, max_processes=g.max_processes)
    node.box = box
    base = Path("/var/tmp") if box.mode == "namespace" and Path("/var/tmp").is_dir() else None
    node.code_dir = Path(tempfile.mkdtemp(prefix="tito-code-", dir=base))
    box.code_root = code_tree(node.code_dir, spec.module_number)
    box.cgroups = Cgroups.detect(mem, g.max_processes)
    preflight(box, spec.files, spec.imports)


def node_ready(spec: NodeSpec, dask_worker=None) -> tuple[str, str]:
    """Run on every worker when a run starts (`Client.run` passes `dask_worker`): ('' or why this node refuses,
    its sandbox in words)."""
    node = node_for(spec, dask_worker)
    return node.refused, (node.box.describe() if node.box is not None and not node.refused else "")


def close_node(run: str) -> None:
    with _NODES_LOCK:
        node = _NODES.pop(run, None)
    if node is not None:
        node.close()


def grade_on_node(task: dict, spec: NodeSpec) -> dict:
    """One submission graded on this node, in its sandbox (the Dask task). Raises CourseError when this node
    refuses to grade (the scheduler then tries another worker)."""
    from .grading import Job, WorkerPool

    import nbformat

    node = node_for(spec)
    if node.refused:
        raise CourseError(node.refused)
    with node.lock:
        slot = node.slots.pop(0)
    job = Job(task["student"], task["fingerprint"], notebook=nbformat.reads(task["notebook"], as_version=4),
              probe=task.get("probe"), skip=task.get("skip") or {})
    pool = WorkerPool(node.box, 1, spec.files, spec.g, spec.plan, first_slot=slot)
    out: dict = {}
    try:
        pool.launch(job)
        while pool.running:
            pool.poll(lambda j, result, why, killed, checked=None: out.update(
                result=result, why=why, killed=killed, checked=checked), timeout=1.0)
    finally:
        pool.close()
        with node.lock:
            node.slots.append(slot)
    return {**out, "log": job.log, "node": node.name, "sandbox": node.box.describe()}


# ------------------------------------------------------------------ the instructor's side of a Dask cluster


MAX_RESENDS = 3  # times a job whose input a dead worker took with it is sent again


def _lost_dependency(e: BaseException) -> bool:
    """Dask cancelled the job because its input (the scattered spec) was lost with a worker: a
    `FutureCancelledError` saying "lost dependencies", or the key already forgotten."""
    import concurrent.futures

    text = str(e)
    return isinstance(e, (concurrent.futures.CancelledError, asyncio.CancelledError)) or \
        "lost dependencies" in text or "forgotten" in text


class DaskExecutor:
    """Jobs on a Dask cluster: `address` is `local` (a LocalCluster of `workers` processes here) or a scheduler's
    `tcp://host:port`."""

    def __init__(self, address: str, spec: NodeSpec, workers: int = 2, connect_s: float = 60.0):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise CourseError("grading on a cluster needs dask.distributed: `pip install 'tinytorch[cluster]'` "
                              "(or `pip install distributed`)") from None
        self.cluster = None
        self.notes: list[str] = []
        self.futures: dict = {}  # future -> job
        self.spec = spec
        self.client = None
        logging.getLogger("distributed").setLevel(logging.ERROR)
        if address == "local":
            self.cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                        dashboard_address=None, memory_limit=0, silence_logs=logging.ERROR)
            address = self.cluster.scheduler_address
        elif not address.startswith(("tcp://", "tls://", "ucx://", "inproc://")):
            raise CourseError(f"--cluster {address!r}: give `local` or a Dask scheduler's address (tcp://host:8786)")
        try:
            self.client = Client(address, timeout=connect_s)
        except (OSError, TimeoutError) as e:
            if self.cluster is not None:
                self.cluster.close()
            raise CourseError(f"cannot reach the Dask scheduler at {address} ({type(e).__name__}: {e}): is it "
                              "running (`dask scheduler`), and is the address the one it printed?") from None
        self.address = address
        try:
            self.client.wait_for_workers(1, timeout=connect_s)
        except (TimeoutError, OSError):
            self.close()
            raise CourseError(f"the Dask scheduler at {address} has no workers after {connect_s:g} s: start some "
                              f"(`dask worker {address}`, or cluster.scale(N) with dask-jobqueue)") from None
        answers = self.client.run(node_ready, spec)
        refused = {a: why for a, (why, _) in answers.items() if why}
        if len(refused) == len(answers):
            self.close()
            raise CourseError(next(iter(refused.values())))
        if refused:
            self.client.retire_workers(workers=list(refused), close_workers=True)
            self.notes += list(refused.values())
        described = sorted({d for why, d in answers.values() if not why})
        self.notes.append(f"cluster {address if self.cluster is None else 'local'}: {len(answers) - len(refused)} "
                          f"Dask worker(s) grading; " + " | ".join(described))
        self.shared = self.client.scatter(spec, broadcast=True, hash=False)
        self.sent: dict[str, int] = {}  # student -> times sent (a job whose input was lost is sent again)
        self.threads = sum(self.client.nthreads().values()) or 1

    def room(self) -> bool:
        """Jobs are handed to the scheduler a little ahead of the workers (twice their threads), no more: an
        interrupted run leaves the rest for the next one, and the notebooks wait on this side."""
        return len(self.futures) < 2 * max(self.threads, sum(self.client.nthreads().values()) or 1)

    def busy(self) -> bool:
        return bool(self.futures)

    def submit(self, job) -> None:
        import nbformat

        task = {"student": job.student, "fingerprint": job.fingerprint, "notebook": nbformat.writes(job.notebook),
                "probe": job.probe, "skip": job.skip}
        sent = self.sent[job.student] = self.sent.get(job.student, 0) + 1
        if self.shared.status != "finished":  # every copy of the shared spec was lost (its workers died): again
            self.shared = self.client.scatter(self.spec, broadcast=True, hash=False)
        fut = self.client.submit(grade_on_node, task, self.shared, key=f"tito-grade-{self.spec.run}-{job.student}-{sent}",
                                 retries=2, pure=False)
        self.futures[fut] = job
        job.log.append(f"sent to the Dask cluster at {self.address}")

    def wait(self, on_done: Callable[[Done], None], timeout: float = 0.05) -> None:
        from distributed import wait as dask_wait

        if not self.futures:
            time.sleep(timeout)
            return
        try:
            done, _ = dask_wait(list(self.futures), timeout=max(timeout, 0.2), return_when="FIRST_COMPLETED")
        except TimeoutError:
            return
        except Exception as e:  # noqa: BLE001 - Dask's wait raises when one it returns was cancelled
            if not _lost_dependency(e):
                raise
            done = [f for f in self.futures if f.status != "pending"]
        for fut in done:
            job = self.futures.pop(fut)
            try:
                out = fut.result()
            except Exception as e:  # noqa: BLE001 - the cluster's words, kept for the instructor
                if _lost_dependency(e) and self.sent.get(job.student, 0) <= MAX_RESENDS:
                    # a worker that died held the job's input (the shared spec), not the job: it never ran to the end,
                    # so sending it again scores it once
                    job.log.append(f"the cluster lost this job's input when a worker died ({type(e).__name__}): "
                                   "sent again")
                    self.submit(job)
                    continue
                on_done(Done(job, None, f"the cluster could not grade it: {type(e).__name__}: {e}", False))
                continue
            job.log += out.get("log", [])
            on_done(Done(job, out.get("result"), out.get("why", ""), bool(out.get("killed")), out.get("checked"),
                         out.get("node", ""), out.get("sandbox", "")))

    def close(self) -> list[str]:
        left = [job.student for job in self.futures.values()]
        try:
            if self.futures and self.client is not None:
                self.client.cancel(list(self.futures), force=True)
            self.futures.clear()
            try:
                if self.client is not None:
                    self.client.run(close_node, self.spec.run)
            except Exception:  # noqa: BLE001 - a node already gone has nothing to clean up
                pass
        finally:
            if self.client is not None:
                self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        return left


def new_run_id() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
