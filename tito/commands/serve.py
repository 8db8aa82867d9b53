"""`tito serve`: serve servable checkpoints over HTTP on 127.0.0.1, and drive a server with the load generator.

    tito serve MODEL [MODEL] [--port 8000] [--max-batch-size 32] [--max-wait-ms 5] [--max-queue 64] [--slots 8]
    tito serve bench [--url http://127.0.0.1:8000] [--endpoint classify|generate] [--rate 50 --rate 100 ...]
                     [--concurrency N] [--requests 200] [--duration 5] [--tokens 16] [--seed 0]

MODEL is a checkpoint written by `tinytorch.serving.models.save_servable` (the serving milestone saves
`milestones/outputs/serving_digits.npz` and `serving_gpt.npz`); one classifier and one GPT can be served together.
The server is module 20's (`tinytorch.serving.server.app_from_checkpoints`) from this edition; Ctrl-C stops it after draining the
requests in flight.
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.core import TyperGroup

from tito.course import CourseError, find_root


class _DefaultStart(TyperGroup):
    "`tito serve MODEL ...` means `tito serve start MODEL ...`; `tito serve bench` stays a command of its own."

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["start", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=_DefaultStart, no_args_is_help=True,
                  help="Serve a model over HTTP on 127.0.0.1 (module 20) and measure it under load.")


def _serving(name: str):
    "Module 20's package module `name` from this edition; without it, exit with an error that says how to get it."
    try:
        root = find_root()
        if sys.path[:1] != [str(root)]:
            sys.path.insert(0, str(root))
        return __import__(f"tinytorch.serving.{name}", fromlist=["_"])
    except CourseError as e:
        _fail(str(e))
    except ImportError as e:
        _fail(f"tito serve needs module 20 (serving) exported ({e}); run `tito export 20`")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(2)


@app.command("start")
def start(models: list[Path] = typer.Argument(..., help="servable checkpoint(s) (save_servable): a classifier, a GPT or both"),
          port: int = typer.Option(8000, help="TCP port on 127.0.0.1 (0: any free port)"),
          max_batch_size: int = typer.Option(32, help="classification: the largest dynamic batch"),
          max_wait_ms: float = typer.Option(5.0, help="classification: the longest a request waits for a batch"),
          max_queue: int = typer.Option(64, help="requests in the system before 503 (per endpoint)"),
          max_queue_delay_ms: float = typer.Option(0.0, min=0.0, help="classification: an admitted request that waits longer "
                                                               "than this for its batch gets 503 (0: no limit)"),
          max_loop_lag_ms: float = typer.Option(0.0, min=0.0, help="refuse (503) while the event loop runs later than "
                                                            "this (0: never)"),
          slots: int = typer.Option(8, help="generation: sequences decoded together (continuous batching)"),
          prefix_cache: int = typer.Option(32, min=0, help="generation: prompts whose keys and values are kept for "
                                                          "requests that start the same way (0: off)"),
          max_new_tokens: int = typer.Option(64, help="generation: the most tokens one request may ask for"),
          drain_seconds: float = typer.Option(30.0, help="how long shutdown waits for requests in flight")) -> None:
    """Serve MODEL(s) on 127.0.0.1:PORT until Ctrl-C (POST /v1/classify, /v1/generate; GET /health, /metrics)."""
    server = _serving("server")
    try:
        app_ = server.app_from_checkpoints(models, max_batch_size=max_batch_size, max_wait=max_wait_ms / 1000,
                                           max_queue=max_queue, gen_max_batch_size=slots, gen_max_queue=max_queue,
                                           max_new_tokens_limit=max_new_tokens, drain_timeout=drain_seconds,
                                           max_queue_delay=max_queue_delay_ms / 1000 if max_queue_delay_ms > 0 else None,
                                           max_loop_lag=max_loop_lag_ms / 1000 if max_loop_lag_ms > 0 else None,
                                           prefix_cache=prefix_cache)
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        _fail(str(e))
    import signal
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)   # bound here, so that --port 0 can say which port it got
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        _fail(f"cannot listen on 127.0.0.1:{port} ({e.strerror}); choose another port with --port N (0: any free port)")
    port = sock.getsockname()[1]
    st = app_.state.serving
    served = [f"classifier {st.input_shape}" if st.classifier is not None else "",
              f"GPT (vocab {st.gpt.vocab_size}, context {st.gpt.context_length})" if st.gpt is not None else ""]
    typer.echo(f"serving {' and '.join(s for s in served if s)} on http://127.0.0.1:{port} (Ctrl-C drains and stops)")
    config = uvicorn.Config(app_, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=drain_seconds)
    # uvicorn catches Ctrl-C itself, drains, puts back the handler it found and raises the signal again: Python's
    # KeyboardInterrupt here, even where this process was started with SIGINT ignored (a background job, a parent that
    # ignores it), which would otherwise end a Ctrl-C'd server with exit code 0
    import threading

    main = threading.current_thread() is threading.main_thread()   # only the main thread may set a handler
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:   # uvicorn re-raises the Ctrl-C it caught, after draining and shutting down
        typer.echo("server stopped (requests in flight were answered)")
        raise typer.Exit(130)
    finally:
        if old_handler is not None:   # None: a handler not set from Python, which cannot be put back from here
            signal.signal(signal.SIGINT, old_handler)
    typer.echo("server stopped")


@app.command("bench")
def bench(url: str = typer.Option("http://127.0.0.1:8000", help="the server (127.0.0.1 only)"),
          endpoint: str = typer.Option("", help="classify or generate (default: what the server serves, classify first)"),
          rate: list[float] = typer.Option([], help="open loop: Poisson arrivals per second (repeat for a curve)"),
          concurrency: int = typer.Option(0, help="closed loop: this many clients instead of --rate"),
          requests: int = typer.Option(200, help="at most this many requests per run"),
          duration: float = typer.Option(5.0, help="at most this many seconds per run"),
          tokens: int = typer.Option(16, help="generate: new tokens per request"),
          seed: int = typer.Option(0, help="seed of the arrivals and the request bodies")) -> None:
    """Drive a running server with the load generator: throughput, p50/p95/p99, 503s, Little's law."""
    import httpx
    import numpy as np

    loadgen = _serving("loadgen")
    if not rate and not concurrency:
        rate = [20.0]
    try:
        info = httpx.get(url.rstrip("/") + "/health", timeout=10).json() if _local(url) else None
    except httpx.HTTPError as e:
        _fail(f"no server answers at {url} ({type(e).__name__}); start one with `tito serve MODEL --port N`")
    if info is None:
        _fail(f"{url} is not on this machine; tito serve bench only drives 127.0.0.1")
    models = info.get("models", [])
    endpoint = endpoint or (models[0] if models else "classify")
    if endpoint not in models:
        _fail(f"the server at {url} serves {models}, not {endpoint!r}")
    rng = np.random.default_rng(seed)
    if endpoint == "classify":
        x = rng.random(int(np.prod(info["input_shape"]))).tolist()
        body = {"input": x}
    else:
        body = lambda i, r: {"prompt": r.integers(0, info["vocab_size"], 4).tolist(), "max_new_tokens": tokens,
                             "temperature": 1.0, "seed": i}
    runs = [dict(rate=r) for r in rate] if not concurrency else [dict(concurrency=concurrency)]
    for kw in runs:
        res = loadgen.load_test(url.rstrip("/"), f"/v1/{endpoint}", body, n_requests=requests, duration=duration,
                                seed=seed, **kw)
        typer.echo(res.report())
        little = res.littles_law()
        if little and little["lambda"] > 0:
            inside = little["L"] / little["lambda"]   # the server's own W: its meter's L over the arrival rate
            typer.echo(f"  note: the client's W ({little['W'] * 1e3:.1f} ms) includes the HTTP hop (the connection, "
                       f"uvicorn's parsing, the client's own work), which the server's meter at the app's boundary "
                       f"does not see: the server's W = L / lambda = {inside * 1e3:.1f} ms, so about "
                       f"{(little['W'] - inside) * 1e3:.1f} ms per request is HTTP overhead, and a ratio below 1 "
                       f"says that much, not that the server lost requests")


def _local(url: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(url).hostname in ("127.0.0.1", "localhost")
