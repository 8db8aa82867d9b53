"""The trusted checks of a grading run's submissions, in a long-lived helper process per pool slot.

Each submission's trusted checks (`tito.trusted.Plan.run`: starting its probe process in the sandbox, answering the
replayed calls from the `Oracle`, decoding the records and running the check functions) ran on a thread of tito's
own process, about 30 ms of it per notebook: the serial part of a large class. Here they run in a helper: a trusted
process of this machine, one per slot of the grading pool, started with `subprocess` (never `os.fork`: tito's process
has threads, and a lock one of them held at the fork would stay held in the child) from the pool's thread, and kept
for the run.

THE INVARIANT holds as before: the helper is on the trusted side, like tito's process. It imports tito (the plan's
probe file with its check functions, NumPy) and never the graded module's code, the student's or the reference's;
it starts each submission's probe process in the sandbox as the pool did (`tito.jobs.start`: `python -I` from the
sandbox's code tree, the submission's cgroup, death with its parent), and talks to it over its pipes as data.

The run's state goes to the helper once, as a file in the pool's root-only scratch folder that only tito writes
(`write_state`: the `Plan` with the reference's records, the sandbox, the prerequisite package): a pickle, which is
fine between two trusted processes of the same tito and never read from a process that runs student code. The file is
tito's user's alone (mode 600, in a folder of mode 700, removed with the pool) and no sandbox sees it: bubblewrap's /tmp
is private, the namespace sandbox runs the student's code as another user (only `sandbox = none`, which runs it as
you with the course's own notebooks readable, offers no such guarantee, as before). Then,
one JSON line each way per submission, on the protocol's framing (`tito.jobs`):

    tito -> helper   {"t": "check", "id": 7, "own": {"tinytorch/core/autograd.py": <base64>}, "slot": 0,
                      "group": ["/sys/fs/cgroup/.../student"] | null, "exercises": null | ["6.1", ...]}
    helper -> tito   {"t": "ready", "pid": 123}                                       (once, after its imports)
                     {"t": "checked", "id": 7, "verdicts": {"6.1": ""}, "notes": [...], "cpu_s": 0.4}
                     {"t": "error", "id": 7, "message": "ValueError: ..."}           (the helper's own failure)

The parent's end (`Helper`) is used from one thread, the pool's: it starts the helper, writes requests and reads
replies without blocking (`poll`), and says how a helper that died ended (`died`): the pool then starts a fresh one
and runs that submission's checks again, once; a second death fails the submission with the reason (never a silent
score). `close()` kills the helper with everything it started.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

STATE_VERSION = 1


# ------------------------------------------------------------------ the helper's side


def _spawner(box, slot: int, group, scratch: str):
    """How the helper starts a submission's probe process: as `tito.grading.ProbeRun.spawn` does in tito's process."""
    from . import jobs

    procs: list = []

    def spawn():
        if box.mode == "none":
            proc = jobs.start(box, "tito.probe_run", slot=slot, group=group,
                              cwd=tempfile.mkdtemp(prefix="probe-", dir=scratch))
        else:
            proc = jobs.start(box, "tito.probe_run", slot=slot, group=group, chdir=box.private_base())
        procs.append(proc)
        return proc
    return spawn, procs


def _group(box, dirs):
    """The submission's cgroup (`tito.sandbox.Group`) from its folders, made in tito's process (not made again)."""
    if not dirs or box.cgroups is None:
        return None
    from .sandbox import Group

    group = Group.__new__(Group)
    group.owner, group.dirs = box.cgroups, [Path(d) for d in dirs]
    return group


def serve_checks(state_file: str) -> int:
    """The helper's main loop: the run's state from `state_file`, then one check per request until tito closes the
    channel."""
    from . import jobs
    from .jobs import Files, encode_files
    from .proc import kill_tree

    jobs.set_parent_death_signal()  # dies with the pool's thread that started it; undumpable
    chan = jobs.Channel.private()
    with open(state_file, "rb") as f:
        state = pickle.load(f)
    if state.get("v") != STATE_VERSION:
        chan.send(jobs.fatal(RuntimeError(f"a run state of version {state.get('v')!r}; this helper reads "
                                          f"{STATE_VERSION}: the same tito must run both sides")))
        return 1
    plan, box, shared, scratch = state["plan"], state["box"], state["files"], state["scratch"]
    shared_json = encode_files(shared)
    from . import probes as P

    P.module_probes(plan.module.number)  # the probe file and its checks, imported before the first request
    chan.send({"t": "ready", "pid": os.getpid()})
    while True:
        msg = chan.receive()  # tito closed the channel: SystemExit(0)
        if msg.get("t") == "exit":
            return 0
        if msg.get("t") != "check":
            continue
        rid = msg.get("id")
        try:
            spawn, procs = _spawner(box, int(msg["slot"]), _group(box, msg.get("group")), scratch)
            job = {**plan.base(), "mode": "replay", "files": Files(shared, shared_json, dict(msg.get("own") or {}))}
            try:
                checked = plan.run(job, spawn, kill_tree, msg.get("exercises") or None)
            finally:
                for p in procs:  # every probe process is gone before the answer (plan.run reaps them; this is sure)
                    if p.poll() is None:
                        kill_tree(p)
            chan.send({"t": "checked", "id": rid, "verdicts": checked.verdicts, "notes": checked.notes,
                       "cpu_s": checked.cpu_s})
        except Exception as e:  # noqa: BLE001 - said to tito with the submission, never hidden
            chan.send({"t": "error", "id": rid, "message": f"{type(e).__name__}: {jobs._text(e)}"})


def main() -> int:
    return serve_checks(sys.argv[-1])  # python -I -c BOOT ROOT tito.trusted_helper STATE


# ------------------------------------------------------------------ tito's side


def write_state(path: Path, plan, box, files: dict[str, str], scratch: Path) -> Path:
    """The run's state for its helpers, written once (root-only: `path` is in the pool's scratch folder)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as state:
        pickle.dump({"v": STATE_VERSION, "plan": plan, "box": box, "files": files, "scratch": str(scratch)}, state,
                    protocol=pickle.HIGHEST_PROTOCOL)
    return path


def helper_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    return env


class Helper:
    """tito's end of one slot's helper: `start()`, `send(request)` (never blocks), `close()`. A thread per started
    helper reads its replies and hands each to `deliver(generation, msg)`, then `deliver(generation, None)` when the
    helper's output ends (it died, or was closed); `generation` tells a started helper from the one before it.
    `start` is called from the pool's own thread, which lives as long as the helper (its parent-death signal)."""

    def __init__(self, state_file: Path, err_file: Path, deliver):
        self.state_file, self.err_file, self.deliver = state_file, err_file, deliver
        self.proc: subprocess.Popen | None = None
        self.out = b""  # what the pipe did not take yet
        self.generation = 0

    def start(self) -> None:
        import threading

        from .sandbox import BOOT
        from .trusted import TITO_DIR

        self.close()
        self.out = b""
        with open(self.err_file, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-I", "-c", BOOT, str(TITO_DIR.parent), "tito.trusted_helper",
                                          str(self.state_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=helper_env(), cwd=str(self.state_file.parent),
                                         start_new_session=True)
        fd = self.proc.stdin.fileno()
        try:  # room for a request (the student's exported module, as base64) while the helper still imports
            import fcntl

            fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ (Linux)
        except (ImportError, OSError):
            pass
        os.set_blocking(fd, False)
        self.generation += 1
        threading.Thread(target=self._read, args=(self.proc, self.generation), daemon=True).start()

    def _read(self, proc: subprocess.Popen, generation: int) -> None:
        try:
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    self.deliver(generation, msg)
        except (OSError, ValueError):  # closed under it
            pass
        self.deliver(generation, None)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def send(self, request: dict) -> None:
        if not self.alive:
            self.start()
        self.out += (json.dumps(request, separators=(",", ":")) + "\n").encode()
        self.flush()

    def flush(self) -> None:
        """Write what the pipe takes now (never blocks: the rest at the next call)."""
        while self.out and self.proc is not None:
            try:
                n = os.write(self.proc.stdin.fileno(), self.out[:1 << 20])
            except BlockingIOError:
                return
            except (OSError, ValueError):  # gone: its reader says so
                self.out = b""
                return
            self.out = self.out[n:]

    def died(self) -> str:
        """How it ended (its exit or signal, and its last line of stderr); '' while it runs."""
        if self.proc is None:
            return "was not started"
        try:
            code = self.proc.wait(timeout=5)  # its output ended: it is exiting
        except subprocess.TimeoutExpired:
            return ""
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        try:
            last = [ln for ln in self.err_file.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        except OSError:
            last = []
        return how + (f" ({last[0][:200]})" if last and code > 0 else "")

    def close(self) -> None:
        """Kill the helper and everything it started (its probe processes)."""
        from .proc import kill_tree

        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            kill_tree(proc)
        else:
            proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


if __name__ == "__main__":
    sys.exit(main())
