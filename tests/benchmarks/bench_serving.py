"""Serving benchmark (module 20): what batching buys a server, measured in one process.

1. Classification: the 1998 digits CNN behind module 20's server (Starlette app driven in process through
   httpx.ASGITransport), driven by 32 closed-loop clients: answers per second without batching
   (max_batch_size=1) and with dynamic batching (up to 32 requests, at most 5 ms of waiting).
2. Generation: a mix of chat-like requests (prompt of 4 tokens, answer lengths geometric with mean 16, at most
   60) for the 2017 milestone's GPT shape, decoded by `ContinuousBatcher` with 8 slots, statically and
   continuously batched, and one at a time: generated tokens per second, best of the interleaved repeats.

    .venv/bin/python tests/benchmarks/bench_serving.py [--repeats 3] [--requests 400]

Prints the ratios (batched / unbatched, continuous / static); the serving milestone measures the same against
a p99 budget under open-loop load.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from tinytorch.models.gpt import GPT  # noqa: E402
from tinytorch.serving.loadgen import run_load  # noqa: E402
from tinytorch.serving.server import ContinuousBatcher, Sequence, create_app, sequential_from_spec  # noqa: E402

CNN = [["Conv2d", [1, 16, 3], {"padding": 1, "rng": 2}], ["BatchNorm2d", [16], {}], ["ReLU", [], {}],
       ["MaxPool2d", [2], {}], ["Conv2d", [16, 16, 3], {"padding": 1, "rng": 3}], ["BatchNorm2d", [16], {}],
       ["ReLU", [], {}], ["MaxPool2d", [2], {}], ["Flatten", [], {}], ["Linear", [64, 10], {"rng": 4}]]


async def closed_loop(model, size, requests):
    app = create_app(classifier=model, input_shape=(1, 8, 8), max_batch_size=size, max_wait=0.005, max_queue=1000)
    body = {"input": np.random.default_rng(0).random(64).tolist()}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            await run_load(client, "/v1/classify", body, concurrency=8, n_requests=40, duration=5)   # warm-up
            res = await run_load(client, "/v1/classify", body, concurrency=32, n_requests=requests, duration=30)
    sizes = app.state.serving.cls_batcher.batch_sizes
    return res, sizes.sum / max(sizes.count, 1)


def generation(gpt, policy, slots, lengths):
    cb = ContinuousBatcher(gpt, num_blocks=40, block_size=16, max_batch_size=slots, policy=policy)
    for i, n in enumerate(lengths):
        cb.add(Sequence(i, [1, 2, 3, 4], int(n), temperature=0.8, top_k=10, seed=i))
    t0 = time.perf_counter()
    done = cb.run_until_done()
    return sum(len(s.tokens) for s in done) / (time.perf_counter() - t0), cb.steps, {s.id: s.tokens for s in done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    sys.setswitchinterval(0.0005)
    cnn = sequential_from_spec(CNN).eval()
    best = {}
    for _ in range(args.repeats):
        for label, size in (("unbatched", 1), ("dynamic batching", 32)):
            res, mean_batch = asyncio.run(closed_loop(cnn, size, args.requests))
            if label not in best or res.throughput > best[label][0].throughput:
                best[label] = (res, mean_batch)
    for label, (res, mean_batch) in best.items():
        p = res.percentiles()
        print(f"classification, {label:17s}: {res.throughput:7.1f} answers/s, p50 {p[50] * 1e3:6.1f} ms, "
              f"p99 {p[99] * 1e3:6.1f} ms, mean batch {mean_batch:.1f}")
    print(f"  dynamic batching / unbatched: {best['dynamic batching'][0].throughput / best['unbatched'][0].throughput:.2f}x")

    gpt = GPT(65, 64, 96, 4, 2, rng=0).eval()
    lengths = np.minimum(np.random.default_rng(0).geometric(1 / 16, 48), 60)
    gen = {}
    for _ in range(args.repeats):
        for label, policy, slots in (("one at a time", "continuous", 1), ("static, 8", "static", 8),
                                     ("continuous, 8", "continuous", 8)):
            r = generation(gpt, policy, slots, lengths)
            if label not in gen or r[0] > gen[label][0]:
                gen[label] = r
    for label, (tps, steps, _) in gen.items():
        print(f"generation, {label:14s}: {tps:7.0f} tokens/s, {steps} steps")
    same = all(g[2] == gen["one at a time"][2] for g in gen.values())
    print(f"  continuous / static: {gen['continuous, 8'][0] / gen['static, 8'][0]:.2f}x tokens/s, "
          f"{gen['static, 8'][1] / gen['continuous, 8'][1]:.2f}x fewer steps; same tokens under all three: {same}")


if __name__ == "__main__":
    main()
