"""The one job protocol of every process that runs student code: grading's notebook worker (`tito.grade_worker`),
the probe runner (`tito.probe_run`) and the kernel competition's worker (`tito.competition_worker`).

Framing: one JSON object per line. The parent writes to the worker's stdin; the worker answers on a private copy
of its stdout taken before any student code runs (`Channel.private`: fd 0 then reads /dev/null and fd 1 writes
where fd 2 does, so what the student prints never reaches the channel).

    parent -> worker   {"t": "job", "kind": "grade" | "probe" | "compete", "v": 1, "payload": {...}}   (first line)
    worker -> parent   {"t": "ready"}                      its imports are done; no student code has run yet
                       {"t": "progress", "step": ...}      what it is doing now (a parent that kills it can say where)
                       ... the job's own messages (probe: run/start/call/hit/own/broken/record/exit), same framing
                       {"t": "result", "result": {...}, "cpu_s": 1.2}    the end: the job's result, and the CPU seconds
                                                           of the worker and the children it waited for (a measure)
                       {"t": "fatal", "type": "ValueError", "message": "..."}   the worker's own failure (never a
                                                           student's exception: that is part of a result)

A worker's `main()` is `serve(kind, handler)`: it sets the parent-death signal (and makes itself undumpable: the
student's processes, same user, cannot ptrace it), opens the private channel, reads and checks the job, runs
`handler(payload, channel)` and sends its result or its failure.

The parent's side: `start(box, module, ...)` starts a worker in a sandbox as grading does (`python -I` from the
sandbox's code tree, or `python -m` for the competition), `Session` talks to it with a deadline on every wait
(bounded lines), and `run(proc, kind, payload, deadline)` is the whole exchange of a one-shot job: send it, read
the reply, kill the process tree at the deadline. A worker whose output goes to a file (the grading pool starts
many and reads each when it exits) is read by `read_reply`.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

VERSION = 1
KINDS = ("grade", "probe", "compete")
MAX_LINE = 64 << 20  # one message (a probe's record with its arrays as base64; a notebook with its outputs)


# ------------------------------------------------------------------ the worker's side


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and the children it waited for (a kernel, shut down by now)."""
    return round(sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                        resource.getrusage(resource.RUSAGE_CHILDREN))), 3)


def set_parent_death_signal() -> None:
    """Die with the process that started us (Linux), so no worker outlives an interrupted tito; and be undumpable,
    so that the student's processes (the same user) cannot ptrace this one."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(4, 0)  # PR_SET_DUMPABLE 0
    except OSError:
        return


def _text(e: BaseException, limit: int = 500) -> str:
    try:
        return str(e)[:limit]
    except BaseException:  # noqa: BLE001 - an exception whose str() fails
        return f"<{type(e).__name__} that cannot be shown>"


def fatal(e: BaseException) -> dict:
    """The one shape of a worker's own failure."""
    return {"t": "fatal", "type": type(e).__name__[:100], "message": _text(e)}


class Channel:
    """The worker's end: line-delimited JSON on two private file objects."""

    def __init__(self, fin, fout):
        self.fin, self.fout = fin, fout

    @classmethod
    def private(cls) -> "Channel":
        """Copies of stdin and stdout become the channel; fd 0 then reads /dev/null and fd 1 writes where fd 2 does
        (the parent chose: a log, or /dev/null), so the student's prints and reads never touch the channel."""
        fin = os.fdopen(os.dup(0), "r", encoding="utf-8")
        fout = os.fdopen(os.dup(1), "w", encoding="utf-8")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        sys.stdin = open(os.devnull, encoding="utf-8")
        sys.stdout = sys.stderr
        return cls(fin, fout)

    def send(self, msg: dict) -> None:
        self.fout.write(json.dumps(msg, separators=(",", ":")) + "\n")
        self.fout.flush()

    def receive(self) -> dict:
        line = self.fin.readline()
        if not line:
            raise SystemExit(0)  # the parent closed the channel: nothing more to do
        return json.loads(line)

    def ready(self) -> None:
        self.send({"t": "ready"})

    def progress(self, step) -> None:
        self.send({"t": "progress", "step": step})


class ProtocolError(Exception):
    pass


def payload_of(job, kind: str) -> dict:
    """The payload of a job message for a worker of `kind`; ProtocolError when it is not one."""
    if not isinstance(job, dict) or job.get("t") != "job":
        raise ProtocolError("the first message is not a job")
    if job.get("v") != VERSION:
        raise ProtocolError(f"a job of protocol version {job.get('v')!r}; this worker speaks version {VERSION}: "
                            "the same tito must run both sides")
    if job.get("kind") != kind:
        raise ProtocolError(f"a {job.get('kind')!r} job sent to the {kind!r} worker")
    payload = job.get("payload")
    if not isinstance(payload, dict):
        raise ProtocolError("the job has no payload")
    return payload


def serve(kind: str, handler: Callable[[dict, Channel], dict]) -> int:
    """A worker's main(): the job in, `handler(payload, channel)`'s result (with `cpu_s`) or a `fatal` out."""
    set_parent_death_signal()
    chan = Channel.private()
    try:
        result = handler(payload_of(chan.receive(), kind), chan)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the worker's own failure: said on the channel, in one shape
        chan.send(fatal(e))
        return 1
    chan.send({"t": "result", "result": result, "cpu_s": cpu_seconds()})
    return 0


# ------------------------------------------------------------------ the parent's side


def job_message(kind: str, payload: dict) -> dict:
    assert kind in KINDS, kind
    return {"t": "job", "kind": kind, "v": VERSION, "payload": payload}


def job_frame(kind: str) -> tuple[bytes, bytes]:
    """What goes before and after a job's payload (JSON) on its line: a payload can then be written in parts (the
    grading pool writes the package, encoded once per run, and each submission's own part)."""
    return ('{"t":"job","kind":' + json.dumps(kind) + ',"v":' + str(VERSION) + ',"payload":').encode(), b"}\n"


def job_bytes(kind: str, payload_json: str) -> bytes:
    """The job message as one line, from a payload already encoded."""
    head, tail = job_frame(kind)
    return head + payload_json.encode() + tail


class Files(dict):
    """A job payload's `files` ({path: base64}) whose shared part (a run's prerequisite package, the same for every
    submission) was encoded once: `Files(shared, shared_json, own)` holds all of them as a dict, and `payload_bytes`
    writes the shared part's JSON as it was encoded instead of encoding it again (about 5 ms of the instructor's
    process per submission). On the wire it is the same JSON object."""

    def __init__(self, shared: dict[str, str], shared_json: bytes, own: dict[str, str]):
        super().__init__(shared)
        self.update(own)
        self.shared_json, self.own = shared_json, own

    def __reduce__(self):  # sent elsewhere (Dask) as the plain dict it is
        return dict, (dict(self),)


def encode_files(files: dict[str, str]) -> bytes:
    """`files` as the inner text of a JSON object (no braces), to be written once per run (`Files`)."""
    return json.dumps(files, separators=(",", ":")).encode()[1:-1]


def payload_parts(payload: dict) -> list[bytes]:
    """`payload` as compact JSON, in parts to be written one after the other; a `Files` value last in it is written
    from its shared part's encoding (a part of its own: never copied into a new string of megabytes)."""
    files = payload.get("files")
    keys = list(payload)
    if not isinstance(files, Files) or keys[-1] != "files":
        return [json.dumps(payload, separators=(",", ":")).encode()]
    # an own path that is also a shared one comes last, and a JSON reader keeps the last: the dict's own value
    head = json.dumps({k: payload[k] for k in keys[:-1]}, separators=(",", ":")).encode()
    own = encode_files(files.own)
    return [head[:-1] + (b"," if len(head) > 2 else b"") + b'"files":{', files.shared_json,
            (b"," + own if files.shared_json and own else own) + b"}}"]


def payload_bytes(payload: dict) -> bytes:
    """`payload` as compact JSON (`payload_parts`, joined)."""
    return b"".join(payload_parts(payload))


def worker_env(box) -> dict:
    """The environment of a worker started in isolated mode (`python -I` ignores PYTHON* variables anyway)."""
    env = {k: v for k, v in box.env().items() if not k.startswith("PYTHON")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", MALLOC_ARENA_MAX="2",
               MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    return env


def start(box, module: str, *, slot: int = 0, group=None, chdir: str | None = None, cwd: str | None = None,
          env: dict | None = None, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
          command: list[str] | None = None) -> subprocess.Popen:
    """Start worker `module` in `box` (tito.sandbox) as grading does: `python -I` from the sandbox's code tree, in
    the submission's cgroup `group`, with the sandbox's limits, its own session, and death with tito. `command`:
    another command line for the same sandbox (the competition's `box.command(...)`)."""
    cmd = command or _isolated(box, module, slot, chdir)
    if cwd is None:  # the code tree (the student cannot write it), else a folder of nobody's
        import tempfile

        cwd = str(box.code_root) if box.code_root is not None else tempfile.gettempdir()
    env = worker_env(box) if env is None else env
    prefix = box.launcher(group)  # the cgroup, the limits and death with tito, set after exec (Popen's fast path)
    if prefix is not None:
        return subprocess.Popen([*prefix, *cmd], stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                                start_new_session=True)
    return subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                            preexec_fn=box.preexec(group))


def _isolated(box, module: str, slot: int, chdir: str | None) -> list[str]:
    """`box.isolated(module, slot, chdir=chdir)`, built once per sandbox: it is the same command for every submission
    of a slot, and building it resolves every path the sandbox binds (milliseconds of tito's process per start)."""
    cache = box.__dict__.setdefault("_commands", {})
    key = (module, slot, chdir)
    if key not in cache:
        cache[key] = box.isolated(module, slot, chdir=chdir)
    return list(cache[key])


class Ended(Exception):
    """The worker stopped answering: `why` is "timeout", "exit" or the parent's own words."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def decode(line: bytes) -> dict:
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        raise Ended("sent something that is not a message of the checker") from None
    if not isinstance(msg, dict):
        raise Ended("sent something that is not a message of the checker")
    return msg


class Session:
    """The parent's end of a worker's channel (its stdin and stdout pipes), every wait bounded by a deadline on
    `clock`."""

    def __init__(self, proc: subprocess.Popen, clock: Callable[[], float] = time.monotonic, limit: int = MAX_LINE):
        self.proc, self.clock, self.limit, self.buf = proc, clock, limit, b""
        self.rfd, self.wfd = proc.stdout.fileno(), proc.stdin.fileno()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)

    def receive(self, deadline: float) -> dict:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 1:]
                return decode(line)
            if len(self.buf) > self.limit:
                raise Ended(f"sent a message over {self.limit >> 20} MB")
            left = deadline - self.clock()
            if left <= 0:
                raise Ended("timeout")
            ready, _, _ = select.select([self.rfd], [], [], min(left, 0.25))
            ended = not ready and self.proc.poll() is not None  # gone, though a child of its may hold the pipe open
            if ready or ended:
                try:
                    chunk = os.read(self.rfd, 1 << 20)
                except BlockingIOError:
                    chunk = None if not ended else b""
                if chunk is None:
                    continue
                if not chunk:
                    raise Ended("exit")
                self.buf += chunk

    def send(self, msg: dict, deadline: float) -> None:
        self.send_bytes((json.dumps(msg, separators=(",", ":")) + "\n").encode(), deadline)

    def send_bytes(self, data: bytes | list[bytes], deadline: float) -> None:
        """One message already encoded (a line), or its parts in order (written together: `os.writev`)."""
        views = [memoryview(d) for d in ([data] if isinstance(data, (bytes, bytearray)) else data) if len(d)]
        while views:
            left = deadline - self.clock()
            if left <= 0:
                raise Ended("timeout")
            try:  # a pipe with room takes it at once (the fd is non-blocking): a select only when it is full
                n = os.writev(self.wfd, views[:64])
                while n:
                    if n >= len(views[0]):
                        n -= len(views.pop(0))
                    else:
                        views[0], n = views[0][n:], 0
                continue
            except BlockingIOError:
                pass
            except OSError:  # BrokenPipeError: it is gone
                raise Ended("exit") from None
            select.select([], [self.wfd], [], min(left, 0.25))

    def send_job(self, kind: str, payload: dict, deadline: float) -> None:
        assert kind in KINDS, kind
        head, tail = job_frame(kind)
        self.send_bytes([head, *payload_parts(payload), tail], deadline)  # one line, its parts never joined

    def close(self, kill: Callable[[subprocess.Popen], None]) -> None:
        """Reap the process (killing its tree with `kill` if it does not end within 5 s) and close the pipes."""
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill(self.proc)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


@dataclass
class Reply:
    """How a job ended: its `result` (None without one), the worker's `cpu_s`, its own failure (`fatal`:
    "Type: message"), `ended` ('' when it answered, else "timeout", "exit" or what went wrong), the last
    `progress` step it reported, and its exit `code` (None: killed at the deadline)."""
    result: dict | None = None
    cpu_s: float = 0.0
    fatal: str = ""
    ended: str = ""
    progress: object = None
    code: int | None = None


def ends(msg: dict, reply: Reply) -> bool:
    """Fold one message into `reply`; True when it ends the job."""
    kind = msg.get("t")
    if kind == "progress":
        reply.progress = msg.get("step")
    elif kind == "result":
        result = msg.get("result")
        reply.result = result if isinstance(result, dict) else None
        try:
            reply.cpu_s = min(max(float(msg.get("cpu_s") or 0), 0.0), 1e6)  # a measure, never part of a verdict
        except (TypeError, ValueError):
            pass
        if reply.result is None:
            reply.ended = "sent a result that is not one"
        return True
    elif kind == "fatal":
        reply.fatal = f"{str(msg.get('type', 'Error'))[:100]}: {str(msg.get('message', ''))[:500]}"
        return True
    return False


def run(proc: subprocess.Popen, kind: str, payload: dict, deadline: float, *, then: tuple = (),
        clock: Callable[[], float] = time.monotonic, kill: Callable | None = None) -> Reply:
    """The whole exchange of a one-shot job with a started worker: send it (and `then`, the job's own messages),
    read until its result or failure, and kill the process tree at `deadline` (or on any interruption). The
    process is reaped when this returns."""
    if kill is None:
        from .proc import kill_tree as kill
    reply = Reply()
    session = Session(proc, clock)
    try:
        session.send_job(kind, payload, deadline)
        for msg in then:
            session.send(msg, deadline)
        while not ends(session.receive(deadline), reply):
            pass
    except Ended as e:
        reply.ended = e.why
        if e.why != "exit":
            kill(proc)
    except BaseException:
        kill(proc)
        raise
    finally:
        session.close(kill)
    reply.code = None if reply.ended == "timeout" else proc.returncode
    return reply


def read_reply(data: bytes) -> Reply:
    """The reply of a worker whose stdout went to a file (read when it exited): `ended` "exit" when it ended
    without a result or a failure."""
    reply = Reply(ended="exit")
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            msg = decode(line)
        except Ended as e:
            return Reply(ended=e.why)
        if ends(msg, reply):
            if reply.result is not None or reply.fatal:
                reply.ended = ""
            return reply
    return reply
