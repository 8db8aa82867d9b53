"""`tito serve`: a servable checkpoint served by a real `tito serve MODEL --port N` process on 127.0.0.1, driven by
`tito serve bench`; Ctrl-C (SIGINT) drains a request in flight before the process exits. Bounded in time."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from tito.main import app

pytestmark = pytest.mark.module("20")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_and_bench_from_the_command_line(tmp_path, python_env):
    from tinytorch.models.gpt import GPT
    from tinytorch.serving.models import mlp_classifier, save_servable

    save_servable(tmp_path / "digits.npz", mlp_classifier([64, 16, 10], rng=0), sizes=[64, 16, 10], input_shape=(64,))
    save_servable(tmp_path / "gpt.npz", GPT(12, 48, 64, 4, 6, rng=0), vocab=list("abcdefghijkl"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # started with SIGINT ignored, as a background job is (and as a process whose parent ignores it): Ctrl-C still
    # drains, stops and exits with 130
    proc = subprocess.Popen([sys.executable, "-m", "tito.main", "serve", str(tmp_path / "digits.npz"),
                             str(tmp_path / "gpt.npz"), "--port", str(port), "--slots", "2"],
                            env=python_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("tito serve did not answer /health within 30 s")
        assert httpx.get(url + "/health", timeout=5).json()["models"] == ["classify", "generate"]
        runner = CliRunner()
        result = runner.invoke(app, ["serve", "bench", "--url", url, "--rate", "20", "--requests", "15", "--duration", "2"])
        assert result.exit_code == 0 and "open loop at 20/s" in result.output and "Little's law" in result.output, result.output
        assert "includes the HTTP hop" in result.output and "per request is HTTP overhead" in result.output, result.output
        result = runner.invoke(app, ["serve", "bench", "--url", url, "--endpoint", "generate", "--concurrency", "2",
                                     "--requests", "4", "--tokens", "5"])
        assert result.exit_code == 0 and "4 ok" in result.output, result.output
        result = runner.invoke(app, ["serve", "bench", "--url", "http://example.com"])
        assert result.exit_code == 2 and "127.0.0.1" in result.output
        slow = {}
        t = threading.Thread(target=lambda: slow.update(r=httpx.post(url + "/v1/generate", timeout=60,
                                                                     json={"prompt": "abc", "max_new_tokens": 40})))
        t.start()
        deadline = time.perf_counter() + 10
        while time.perf_counter() < deadline and t.is_alive():    # wait until the generation is inside the server
            if "tinytorch_requests_in_system 1" in httpx.get(url + "/metrics", timeout=5).text:
                break
            time.sleep(0.005)
        assert t.is_alive(), "the generation finished before the test could interrupt the server; make it longer"
        proc.send_signal(signal.SIGINT)
        t.join(60)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert slow["r"].status_code == 200 and len(slow["r"].json()["tokens"]) == 40, "the request in flight must be answered"
    assert proc.returncode == 130 and "server stopped" in out, out



def test_serve_hands_its_overload_and_cache_options_to_the_server(tmp_path, monkeypatch):
    "The flags reach the server's state: the queue delay and loop lag limits in seconds, the prefix cache's size."
    import uvicorn

    from tinytorch.models.gpt import GPT
    from tinytorch.serving.models import mlp_classifier, save_servable

    save_servable(tmp_path / "digits.npz", mlp_classifier([64, 16, 10], rng=0), sizes=[64, 16, 10], input_shape=(64,))
    save_servable(tmp_path / "gpt.npz", GPT(12, 16, 16, 2, 1, rng=0), vocab=list("abcdefghijkl"))
    seen = {}

    def run(server, sockets=None):   # instead of serving: what uvicorn was handed
        seen["state"] = server.config.app.state.serving
        for s in sockets or ():
            s.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    args = ["serve", str(tmp_path / "digits.npz"), str(tmp_path / "gpt.npz"), "--port", "0"]
    result = CliRunner().invoke(app, args + ["--max-queue-delay-ms", "25", "--max-loop-lag-ms", "10", "--prefix-cache", "4"])
    assert result.exit_code == 0, result.output
    st = seen["state"]
    assert (st.cls_batcher.max_queue_delay, st.max_loop_lag, st.engine.batcher.prefixes.capacity) == (0.025, 0.01, 4)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    st = seen["state"]
    assert (st.cls_batcher.max_queue_delay, st.max_loop_lag, st.engine.batcher.prefixes.capacity) == (None, None, 32), \
        "by default no overload limits and a prefix cache of 32 prompts"

def test_serve_refuses_a_file_that_is_not_servable(tmp_path):
    bad = tmp_path / "x.npz"
    bad.write_bytes(b"not a checkpoint")
    result = CliRunner().invoke(app, ["serve", str(bad), "--port", "0"])
    assert result.exit_code == 2 and "not a .npz archive" in result.output, result.output


def test_serve_refuses_a_port_in_use_and_says_what_to_do(tmp_path):
    from tinytorch.serving.models import mlp_classifier, save_servable

    save_servable(tmp_path / "digits.npz", mlp_classifier([4, 3], rng=0), sizes=[4, 3], input_shape=(4,))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", str(tmp_path / "digits.npz"), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "--port N" in result.output, result.output
