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
