"""Serving benchmark (module 20): what batching buys a server, measured in one process.

1. Classification, the model stage: 2,000 requests for the 1998 digits CNN submitted at once to module 20's
   `DynamicBatcher` (no HTTP): answers per second without batching (max_batch_size=1) and with dynamic
   batching (up to 32). Then the HTTP layer alone: 16 closed-loop httpx clients against the same server
   (in process, httpx.ASGITransport) with a one-layer classifier, whose cost is nearly all HTTP, JSON and
   event loop: the per-request price batching cannot divide.
   Then the server's CPU per request over real sockets (uvicorn on 127.0.0.1 in a thread, the load generator in
   a child process, 32 closed-loop clients), for an answer and for a refusal (a 503 costs what a 404 costs: the
   HTTP path and the routing), with uvicorn's pure-Python stack (h11, asyncio's loop) and its C stack
   (httptools, uvloop: what it picks when they are installed).
2. Generation: 128 chat-like requests, all waiting at the start as in vLLM's offline throughput benchmark (the
   same prompt of 4 tokens, answer lengths geometric with mean 16, at most 60) for the 2017 milestone's GPT
   shape, decoded with 16 slots by `StaticBatcher` (static batching as FasterTransformer runs it), by
   `ContinuousBatcher` with policy "static" (finished sequences leave at once) and "continuous" (with and
   without its prefix cache), and one at a time: generated tokens per second, best of the interleaved repeats.

    .venv/bin/python tests/benchmarks/bench_serving.py [--repeats 3] [--requests 400]
    .venv/bin/python tests/benchmarks/bench_serving.py --against REV [--repeats 5]

Prints the ratios (batched / unbatched, continuous / static); the serving milestone measures the same against
a p99 budget under open-loop load. `--against REV` compares this edition's server with the one-file server of git
revision REV (before module 20 became a package) in this process, in interleaved repeats: the generation schedules,
the dynamic batcher's model stage and the HTTP layer in process, each as "after / before" with module 19's
bootstrap interval of the ratio of medians.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

# One BLAS thread for NumPy, set before anything imports NumPy (see tests/support/bench.py): on this shared 2-core
# machine, busy-waiting BLAS threads made the generation runs 10x slower and their ratios meaningless
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, os.environ.get("TINYTORCH_BENCH_BLAS_THREADS", "1"))

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.tensor import Tensor  # noqa: E402
from tinytorch.models.gpt import GPT  # noqa: E402
from tinytorch.serving.loadgen import run_load  # noqa: E402
from tinytorch.serving.engine import Sequence  # noqa: E402
from tinytorch.serving.models import mlp_classifier, sequential_from_spec  # noqa: E402
from tinytorch.serving.server import ContinuousBatcher, DynamicBatcher, StaticBatcher, create_app  # noqa: E402

CNN = [["Conv2d", [1, 16, 3], {"padding": 1, "rng": 2}], ["BatchNorm2d", [16], {}], ["ReLU", [], {}],
       ["MaxPool2d", [2], {}], ["Conv2d", [16, 16, 3], {"padding": 1, "rng": 3}], ["BatchNorm2d", [16], {}],
       ["ReLU", [], {}], ["MaxPool2d", [2], {}], ["Flatten", [], {}], ["Linear", [64, 10], {"rng": 4}]]


async def model_stage(model, size, n, batcher_class=DynamicBatcher):
    def probs(xs):
        with no_grad():
            return model(Tensor(xs)).data

    batcher = batcher_class(probs, max_batch_size=size, max_wait=0.005)
    xs = np.random.default_rng(0).random((n, 1, 8, 8)).astype(np.float32)
    await batcher.start()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(batcher.submit(x) for x in xs))
        seconds = time.perf_counter() - t0
    finally:
        await batcher.stop()
    return n / seconds, batcher.batch_sizes.sum / batcher.batch_sizes.count


async def http_ceiling(requests, make_app=create_app):
    app = make_app(classifier=mlp_classifier([64, 10], rng=0), input_shape=(64,), max_batch_size=32,
                   max_wait=0.001, max_queue=1000)
    body = {"input": np.random.default_rng(0).random(64).tolist()}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            return await run_load(client, "/v1/classify", body, concurrency=16, n_requests=requests, duration=30)


def http_stack_cost(http: str, loop: str, seconds: float = 3.0) -> dict:
    """Server CPU per request (ms) and answers per second, for `/v1/classify` (200) and an unknown path (404)."""
    import resource

    from tinytorch.serving.loadgen import LoadProcess
    from tinytorch.serving.app import BackgroundServer

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)   # this process: the server (the client is a child)
        return r.ru_utime + r.ru_stime

    app = create_app(classifier=mlp_classifier([64, 10], rng=0), input_shape=(64,), max_queue=100_000)
    server = BackgroundServer(app)
    server.config.http, server.config.loop = http, loop
    body = {"input": np.zeros(64).tolist()}
    out = {}
    with server, LoadProcess(server.url) as load:
        load.run("/v1/classify", body, concurrency=16, n_requests=500, duration=1.0)   # warm-up
        for label, path in (("answer", "/v1/classify"), ("refusal", "/v1/no-such-path")):
            c0 = cpu()
            r = load.run(path, body, concurrency=32, n_requests=1_000_000, duration=seconds)
            out[label] = ((cpu() - c0) / len(r.status) * 1e3, len(r.status) / r.elapsed, sorted(set(r.status.tolist())))
    return out


def generation(gpt, batcher, kw, lengths, sequence=Sequence):
    cb = batcher(gpt, num_blocks=16 * 4 + 4, block_size=16, **kw)
    for i, n in enumerate(lengths):
        cb.add(sequence(i, [1, 2, 3, 4], int(n), temperature=0.8, top_k=10, seed=i))
    t0 = time.perf_counter()
    done = cb.run_until_done()
    return sum(len(s.tokens) for s in done) / (time.perf_counter() - t0), cb.steps, {s.id: s.tokens for s in done}


def server_at(rev: str) -> SimpleNamespace:
    """The one-file `tinytorch/serving/server.py` of git revision `rev` (or the file at path `rev`, for a machine
    without the repository's history), loaded as a module of its own."""
    root = Path(__file__).resolve().parents[2]
    if Path(rev).is_file():
        text = Path(rev).read_text(encoding="utf-8")
    else:
        text = subprocess.run(["git", "show", f"{rev}:tinytorch/serving/server.py"], cwd=root, capture_output=True,
                              text=True, check=True).stdout
    if "from .engine import" in text or "from .batching import" in text:
        raise SystemExit(f"--against {rev}: that server is already a package; compare with a revision before the split")
    module = types.ModuleType(f"serving_server_at_{rev}")
    exec(compile(text.replace("from ..", "from tinytorch."), f"{rev}:tinytorch/serving/server.py", "exec"),
         module.__dict__)
    return SimpleNamespace(ContinuousBatcher=module.ContinuousBatcher, StaticBatcher=module.StaticBatcher,
                           Sequence=module.Sequence, DynamicBatcher=module.DynamicBatcher, create_app=module.create_app)


def against(rev: str, repeats: int, requests: int) -> None:
    "This edition's server against revision `rev`'s, in process, interleaved: after / before with a bootstrap interval."
    from tinytorch.perf.benchmark import compare

    sides = {"before": server_at(rev), "after": SimpleNamespace(
        ContinuousBatcher=ContinuousBatcher, StaticBatcher=StaticBatcher, Sequence=Sequence,
        DynamicBatcher=DynamicBatcher, create_app=create_app)}
    gpt = GPT(65, 64, 96, 4, 2, rng=0).eval()
    cnn = sequential_from_spec(CNN).eval()
    lengths = np.minimum(np.random.default_rng(0).geometric(1 / 16, 128), 60)
    seconds, tokens = {}, {}
    for _ in range(repeats):
        for side, impl in sides.items():
            for label, kind, kw in (("generation, continuous", "ContinuousBatcher", dict(max_batch_size=16)),
                                    ("generation, continuous, no prefix", "ContinuousBatcher",
                                     dict(max_batch_size=16, prefix_cache=0)),
                                    ("generation, static", "StaticBatcher", dict(max_batch_size=16))):
                tps, _, out = generation(gpt, getattr(impl, kind), kw, lengths, impl.Sequence)
                seconds.setdefault(label, {}).setdefault(side, []).append(1 / tps)
                tokens.setdefault(label, {})[side] = out
            tput, _ = asyncio.run(model_stage(cnn, 32, 2000, impl.DynamicBatcher))
            seconds.setdefault("model stage, batches of 32", {}).setdefault(side, []).append(1 / tput)
            res = asyncio.run(http_ceiling(requests, impl.create_app))
            seconds.setdefault("HTTP in process", {}).setdefault(side, []).append(1 / res.throughput)
    print(f"this edition (after) against {rev} (before), {repeats} interleaved repeats, in one process:")
    for label, by_side in seconds.items():
        c = compare(by_side["after"], by_side["before"])
        print(f"  {label:34s}: after {1 / np.median(by_side['after']):8.0f}/s, before "
              f"{1 / np.median(by_side['before']):8.0f}/s: after / before {c.ratio:.2f}x "
              f"(95% interval {c.low:.2f}-{c.high:.2f}x)")
    same = all(t["after"] == t["before"] for t in tokens.values())
    print(f"  the same tokens before and after: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--against", metavar="REV", help="compare with the server of git revision REV (in process)")
    args = parser.parse_args()
    sys.setswitchinterval(0.0005)
    if args.against:
        return against(args.against, args.repeats, args.requests)
    cnn = sequential_from_spec(CNN).eval()
    best = {}
    for _ in range(args.repeats):
        for label, size in (("unbatched", 1), ("dynamic batching", 32)):
            tput, mean_batch = asyncio.run(model_stage(cnn, size, 2000))
            if label not in best or tput > best[label][0]:
                best[label] = (tput, mean_batch)
    for label, (tput, mean_batch) in best.items():
        print(f"classification model stage, {label:17s}: {tput:7.0f} answers/s, mean batch {mean_batch:.1f}")
    print(f"  dynamic batching / unbatched: {best['dynamic batching'][0] / best['unbatched'][0]:.2f}x")
    res = max((asyncio.run(http_ceiling(args.requests)) for _ in range(args.repeats)), key=lambda r: r.throughput)
    print(f"HTTP layer in process (one-layer model, 16 clients): {res.throughput:.0f} answers/s = "
          f"{1e3 / res.throughput:.2f} ms per request of HTTP, JSON and event loop")

    stacks = {}
    for _ in range(args.repeats):   # interleaved; the lowest CPU per request of each
        for stack in (("h11", "asyncio"), ("httptools", "uvloop")):
            for label, (ms, rate, codes) in http_stack_cost(*stack).items():
                if (stack, label) not in stacks or ms < stacks[stack, label][0]:
                    stacks[stack, label] = (ms, rate, codes)
    for (stack, label), (ms, rate, codes) in stacks.items():
        print(f"HTTP over sockets, {' + '.join(stack):17s} {label:7s}: {ms:.3f} ms of server CPU per request, "
              f"{rate:6.0f}/s, status {codes}")
    for label in ("answer", "refusal"):
        print(f"  {label}: h11 + asyncio costs {stacks[('h11', 'asyncio'), label][0] / stacks[('httptools', 'uvloop'), label][0]:.1f}x "
              f"the server CPU of httptools + uvloop")

    gpt = GPT(65, 64, 96, 4, 2, rng=0).eval()
    lengths = np.minimum(np.random.default_rng(0).geometric(1 / 16, 128), 60)
    slots = 16
    gen = {}
    for repeat in range(args.repeats):
        for label, batcher, kw in (("one at a time", ContinuousBatcher, dict(max_batch_size=1)),
                                   ("static", StaticBatcher, dict(max_batch_size=slots)),
                                   ("static, leave early", ContinuousBatcher, dict(max_batch_size=slots, policy="static")),
                                   ("continuous, no prefix", ContinuousBatcher, dict(max_batch_size=slots, prefix_cache=0)),
                                   ("continuous", ContinuousBatcher, dict(max_batch_size=slots)))[1 if repeat else 0:]:
            r = generation(gpt, batcher, kw, lengths)
            if label not in gen or r[0] > gen[label][0]:
                gen[label] = r
    print(f"generation: {len(lengths)} requests, {slots} slots, prompt of 4 tokens, answers of {lengths.mean():.1f} "
          f"tokens on average (one at a time runs once)")
    for label, (tps, steps, _) in gen.items():
        print(f"generation, {label:21s}: {tps:7.0f} tokens/s, {steps} steps")
    same = all(g[2] == gen["one at a time"][2] for g in gen.values())
    print(f"  continuous / static: {gen['continuous'][0] / gen['static'][0]:.2f}x tokens/s "
          f"({gen['continuous'][0] / gen['static, leave early'][0]:.2f}x against leaving early; "
          f"{gen['continuous, no prefix'][0] / gen['static'][0]:.2f}x without the prefix cache), "
          f"{gen['static'][1] / gen['continuous'][1]:.2f}x fewer steps; same tokens under all five: {same}")

if __name__ == "__main__":
    main()
