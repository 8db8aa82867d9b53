"""The one job protocol (tito.jobs) that grading's notebook worker, the probe runner and the competition's worker
speak: the job in, readiness, progress, the result with its CPU seconds or the worker's own failure out, on a
private channel; the parent's deadline kills the whole process tree."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tito import jobs

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import os, sys, time
sys.path.insert(0, {root!r})
from tito import jobs

def handle(job, chan):
    print('{{"t": "result", "result": {{"forged": 1}}, "cpu_s": 0}}', flush=True)  # the student's print: not the channel
    os.write(1, b'{{"t": "fatal", "type": "X", "message": "forged"}}\\n')
    chan.ready()
    chan.progress(["step", 1])
    if job.get("raise"):
        raise ValueError("the worker's own bug " + "x" * 1000)
    if job.get("sleep"):
        import subprocess
        subprocess.Popen(["sleep", job["sleep"]])
        time.sleep(60)
    sum(i * i for i in range(200_000))
    return {{"echo": job["n"]}}

sys.exit(jobs.serve("compete", handle))
"""


def start(tmp_path, stderr=None):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(ROOT)))
    return subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr or subprocess.DEVNULL, start_new_session=True)


def test_a_job_gets_its_result_progress_and_cpu_seconds_and_prints_never_reach_the_channel(tmp_path):
    with open(tmp_path / "log", "wb") as log:
        reply = jobs.run(start(tmp_path, log), "compete", {"n": 7}, time.monotonic() + 60)
    assert reply.result == {"echo": 7} and not reply.fatal and reply.ended == "" and reply.code == 0, reply
    assert reply.progress == ["step", 1]
    assert 0 < reply.cpu_s < 60
    assert b"forged" in (tmp_path / "log").read_bytes()  # the student's output went to stderr's file


def test_the_workers_own_failure_has_one_shape(tmp_path):
    reply = jobs.run(start(tmp_path), "compete", {"n": 1, "raise": True}, time.monotonic() + 60)
    assert reply.result is None and reply.fatal.startswith("ValueError: the worker's own bug xxx"), reply
    assert len(reply.fatal) < 700  # bounded
    reply = jobs.run(start(tmp_path), "grade", {"n": 1}, time.monotonic() + 60)
    assert reply.fatal == "ProtocolError: a 'grade' job sent to the 'compete' worker", reply


def test_a_job_of_another_protocol_version_is_refused(tmp_path):
    proc = start(tmp_path)
    session = jobs.Session(proc)
    session.send({"t": "job", "kind": "compete", "v": jobs.VERSION + 1, "payload": {}}, time.monotonic() + 30)
    reply = jobs.Reply()
    assert jobs.ends(session.receive(time.monotonic() + 30), reply)
    assert reply.fatal.startswith(f"ProtocolError: a job of protocol version {jobs.VERSION + 1}; this worker speaks"), reply
    session.close(lambda p: p.kill())


def test_the_deadline_kills_the_worker_and_everything_it_started(tmp_path):
    import psutil

    marker = f"{time.time() % 1000:.6f}"
    t0 = time.monotonic()
    reply = jobs.run(start(tmp_path), "compete", {"n": 1, "sleep": marker}, time.monotonic() + 3)
    assert time.monotonic() - t0 < 20
    assert reply.ended == "timeout" and reply.code is None and reply.result is None, reply
    time.sleep(0.2)
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


@pytest.mark.parametrize("data, want", [
    (b'{"t":"ready"}\n{"t":"result","result":{"a":1},"cpu_s":2.5}\n', ({"a": 1}, 2.5, "", "")),
    (b'{"t":"ready"}\n{"t":"fatal","type":"OSError","message":"disk"}\n', (None, 0.0, "OSError: disk", "")),
    (b'{"t":"ready"}\n', (None, 0.0, "", "exit")),
    (b'{"t":"ready"}\nnot json\n', (None, 0.0, "", "sent something that is not a message of the checker")),
    (b'{"t":"result","result":[1],"cpu_s":"x"}\n', (None, 0.0, "", "sent a result that is not one")),
])
def test_a_reply_read_from_a_file(data, want):
    r = jobs.read_reply(data)
    assert (r.result, r.cpu_s, r.fatal, r.ended) == want


def test_the_job_line_built_from_an_encoded_payload_is_the_job_message():
    import json

    assert json.loads(jobs.job_bytes("grade", json.dumps({"x": [1, 2]}))) == jobs.job_message("grade", {"x": [1, 2]})
    assert jobs.job_bytes("grade", "{}").count(b"\n") == 1 and jobs.job_bytes("grade", "{}").endswith(b"\n")


LIMITS = """
import ctypes, json, os, resource
libc = ctypes.CDLL(None)
sig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
print(json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "pdeathsig": sig.value,
                  **{k: list(resource.getrlimit(getattr(resource, "RLIMIT_" + k.upper())))
                     for k in ("as", "fsize", "core", "nproc")}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups, prctl: Linux")
@pytest.mark.parametrize("how", ["launcher", "preexec"])
def test_a_started_worker_is_in_its_cgroup_with_the_limits_its_own_session_and_dies_with_tito(tmp_path, how):
    """`jobs.start` without a preexec function (so Popen need not copy tito's process) sets what the preexec
    function set: the cgroup (here two folders standing for the v1 hierarchies), the limits, a new session and the
    parent-death signal."""
    import json

    from tito.sandbox import Group, Sandbox

    box = Sandbox("none", memory_bytes=3 << 30, max_processes=300)
    if how == "preexec":
        box.launcher = lambda group=None: None
    else:
        assert box.launcher(None) is not None, "setpriv and prlimit (util-linux) are installed here"
    group = Group.__new__(Group)
    group.dirs = [tmp_path / "memory", tmp_path / "pids"]
    for d in group.dirs:
        d.mkdir()
        (d / "cgroup.procs").write_text("")
    proc = jobs.start(box, "", group=group, command=[sys.executable, "-c", LIMITS], stdin=subprocess.DEVNULL,
                      cwd=str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    got = json.loads(out)
    assert got["pid"] == proc.pid == got["sid"], got  # the process Popen started (exec'd into), its own session
    assert got["as"] == [3 << 30, 3 << 30] and got["fsize"] == [1 << 30, 1 << 30] and got["core"] == [0, 0], got
    assert got["nproc"][0] == got["nproc"][1] >= 300, got
    assert got["pdeathsig"] == 9, got  # SIGKILL
    for d in group.dirs:
        assert (d / "cgroup.procs").read_text().strip() == str(proc.pid)


def test_a_worker_that_cannot_join_its_cgroup_does_not_run(tmp_path):
    from tito.sandbox import Group, Sandbox

    box = Sandbox("none", memory_bytes=0, max_processes=300)
    if box.launcher(None) is None:
        pytest.skip("setpriv and prlimit are not installed: the preexec function applies")
    group = Group.__new__(Group)
    group.dirs = [tmp_path / "gone"]
    proc = jobs.start(box, "", group=group, command=[sys.executable, "-c", "print('ran')"], stdin=subprocess.DEVNULL,
                      stderr=subprocess.PIPE, cwd=str(tmp_path))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 125 and b"ran" not in out and b"cannot join the submission's cgroup" in err, (out, err)


def test_a_payload_with_shared_files_is_the_same_json_and_pickles_as_a_dict():
    import json
    import pickle

    shared = {"tinytorch/core/tensor.py": "QUJD", "tinytorch/__init__.py": ""}
    files = jobs.Files(shared, jobs.encode_files(shared), {"tinytorch/core/autograd.py": "eHl6", "tinytorch/__init__.py": "Wg=="})
    payload = {"module": "06", "seed": 7, "mode": "replay", "files": files}
    assert json.loads(jobs.payload_bytes(payload)) == json.loads(json.dumps(payload)) == payload
    assert json.loads(jobs.payload_bytes(payload))["files"]["tinytorch/__init__.py"] == "Wg=="  # its own file wins
    assert jobs.payload_bytes({"files": jobs.Files({}, b"", {"a.py": "eA=="})}) == b'{"files":{"a.py":"eA=="}}'
    back = pickle.loads(pickle.dumps(files))
    assert type(back) is dict and back == dict(files)
    line = jobs.job_frame("probe")[0] + jobs.payload_bytes(payload) + jobs.job_frame("probe")[1]
    assert json.loads(line) == jobs.job_message("probe", payload)
