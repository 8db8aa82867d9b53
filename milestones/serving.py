"""2023: your framework serves the digits CNN and the GPT to many clients at once, batched like vLLM.

In 2022 Gyeong-In Yu and colleagues (Orca, OSDI) showed that a language model server should schedule
one decoding iteration at a time, letting finished sequences leave and new ones join between steps,
instead of running fixed batches to the end. In 2023 Woosuk Kwon and colleagues at Berkeley (vLLM,
"Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP) put that
continuous batching on a paged KV cache, and it became how open models are served. Classifiers had
been served with dynamic batching for years (NVIDIA Triton, TensorFlow Serving), and every one of
those systems is measured the same way: throughput at a tail-latency budget, under open-loop load.

This script trains (in seconds) the 1998 milestone's digits CNN and a small 2017 GPT on the bundled
stories (or loads the GPT saved by an earlier run), saves both as servable checkpoints (for
`tito serve`), and serves the classifier with module 20's server on 127.0.0.1: uvicorn on a free port in a
thread of this process, driven over real HTTP by the open-loop load generator in a child process of its own
(`LoadProcess`, with a lean HTTP/1.1 client), as load tests are run. In one process the client and the
server take turns on one interpreter: at twice the capacity the client fell 1.3 s behind its schedule and
the server's event loop with it, and the latencies measured both (`--client in-process` still runs every
load that way, through httpx's ASGI transport, for comparison). It drives the classifier at rising rates
(then bisects the knee), without batching and with dynamic batching, and reports the throughput each sustains
within a p99 budget, then runs both again at their capacities in turns and judges the ratio by module 19's
bootstrap interval (met, not met, or too noisy to tell on a busy machine); it decodes a mix of chat-like generation
requests one at a time, in static batches (as FasterTransformer ran them, every row computed until the batch's
longest answer is done; and, for comparison, with finished sequences leaving at once) and with continuous batching,
in interleaved repeats whose ratio is judged the same way, and checks that every request gets the same tokens under
all four; it offers twice the batched capacity with admission control on (several tries, each on a fresh server)
and checks that every request is answered (200 or 503) and that the admitted ones stay within the budget *inside
the app*, from arrival to last byte, the boundary of the server's own meter: the client shares this machine's cores,
and when the machine stalls it, its latency (printed beside, with how late it sent) measures the machine, not the
server; and it checks Little's law between the server's /metrics and the client. That check runs with the client in
this process: L, lambda and W must be measured at one boundary, the server's meter wraps the app, and over a socket
the client's W also holds the HTTP hop and uvicorn's parsing, which the meter cannot see (the agreement over HTTP is
printed too). Modules used: all of 01-13 (the models), 18 (the paged KV cache), 19 (the bootstrap intervals) and 20
(the server and the load generator).

    tito milestone run serving [--quick] [--seed 0] [--out PATH] [--p99-budget-ms 100] [--retrain]
        [--gpt-steps 200] [--run-seconds 1.5] [--client process|in-process]
"""
NAME = "serving"
YEAR = 2023
TITLE = "Serve the digits CNN and the GPT with dynamic and continuous batching under open-loop load"
NEEDS = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13", "14", "15", "16", "17", "18",
         "19", "20"]
TARGET = ("within the same p99 budget, dynamic batching answers more than 3x the unbatched classification "
          "throughput, and continuous batching generates more than 2x the tokens/s of static batching; under 2x "
          "overload 100% of requests are answered (200 or 503) with the p99 of admitted ones below the budget; "
          "Little's law agrees to at least 90%; within 5 minutes")
# what the harness checks (TARGET says it in words for people)
GOAL = {"reach": [("requests answered (200 or 503) under 2x overload", ">=", 1.0),
                  ("Little's law agreement (server L vs client lambda x W)", ">=", 0.9)],
        "beat": [("classification throughput within the p99 budget", "higher", "3x the unbatched server"),
                 ("generation tokens/s", "higher", "2x static batching"),
                 ("p99 of admitted requests under 2x overload", "lower", "the p99 budget")],
        "max_seconds": 300}

import contextlib
import time

import _harness as harness  # milestones/_harness.py


def options(parser):
    parser.add_argument("--p99-budget-ms", type=float, default=100.0, help="the tail-latency budget (default %(default)s)")
    parser.add_argument("--retrain", action="store_true", help="train the GPT even if an earlier run saved one")
    parser.add_argument("--gpt-steps", type=int, default=200, help="Adam steps of the GPT (default %(default)s)")
    parser.add_argument("--run-seconds", type=float, default=1.5, help="length of each load run (default %(default)s)")
    parser.add_argument("--client", choices=("process", "in-process"), default="process",
                        help="where the load generator runs: a child process over real HTTP to 127.0.0.1 (default), "
                             "or this process's event loop with the app (httpx's ASGI transport, no sockets)")


def train_cnn(seed, epochs, log):
    "The 1998 milestone's CNN on the bundled digits, SGD with momentum; returns (model, layer spec, test accuracy)."
    import numpy as np

    from tinytorch.core.autograd import no_grad
    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.data.loader import DataLoader, load_digits
    from tinytorch.serving.models import sequential_from_spec

    spec = [["Conv2d", [1, 16, 3], {"padding": 1, "rng": seed + 2}], ["BatchNorm2d", [16], {}], ["ReLU", [], {}],
            ["MaxPool2d", [2], {}], ["Conv2d", [16, 16, 3], {"padding": 1, "rng": seed + 3}], ["BatchNorm2d", [16], {}],
            ["ReLU", [], {}], ["MaxPool2d", [2], {}], ["Flatten", [], {}], ["Linear", [64, 10], {"rng": seed + 4}]]
    model = sequential_from_spec(spec)
    train_set, test_set = load_digits("train", flatten=False), load_digits("test", flatten=False)
    params = model.parameters()
    velocity = [np.zeros_like(p.data) for p in params]
    for epoch in range(1, epochs + 1):
        model.train()
        for x, y in DataLoader(train_set, batch_size=32, shuffle=True, seed=seed * 1000 + epoch):
            loss = CrossEntropyLoss()(model(x), y)
            model.zero_grad()
            loss.backward()
            with no_grad():
                for v, p in zip(velocity, params):
                    v *= 0.9
                    v += p.grad.data
                    p.data -= 0.02 * v
    model.eval()
    xt, yt = test_set.tensors
    with no_grad():
        accuracy = float((model(xt).data.argmax(1) == yt.data).mean())
    log(f"digits CNN: {model.num_parameters():,} parameters, {epochs} epochs, test accuracy {accuracy:.1%}")
    return model, spec, accuracy, xt.data


def train_gpt(seed, steps, log):
    "The 2017 milestone's GPT (width 96, 2 blocks, 4 heads, context 64), trained for `steps` Adam steps."
    import numpy as np

    from tinytorch.core.losses import CrossEntropyLoss
    from tinytorch.core.optimizers import Adam
    from tinytorch.data.loader import load_text_corpus
    from tinytorch.models.gpt import GPT

    text = load_text_corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.int64)
    model = GPT(len(chars), 64, 96, 4, 2, rng=seed)
    opt, rng = Adam(model.parameters(), lr=3e-3), np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        s = rng.integers(0, len(ids) - 65, 32)
        x = np.stack([ids[j:j + 64] for j in s])
        y = np.stack([ids[j + 1:j + 65] for j in s])
        loss = CrossEntropyLoss()(model(x).reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    log(f"GPT: {model.num_parameters():,} parameters, {steps} steps in {time.perf_counter() - t0:.0f} s, "
        f"training loss {loss.item():.3f} (uniform guessing: {np.log(len(chars)):.3f})")
    return model.eval(), chars


def kept_up(point, budget) -> bool:
    "A run within the p99 budget that refused nobody and kept up with its offered rate."
    rate, tput, p50, p99, r = point
    return p99 <= budget and r.rejected == 0 and tput >= 0.85 * rate


def refine_rate(points, budget, closer: float = 1.15):
    """The next rate to try between the highest rate that kept up and the lowest higher one that did not
    (their geometric mean), or None when they are within `closer` of each other (or either is missing): a
    capacity read off a coarse grid of rates is off by up to the grid's step (200/s and 400/s were neighbours)."""
    good = [p[0] for p in points if kept_up(p, budget)]
    if not good:
        return None
    bad = [p[0] for p in points if p[0] > max(good) and not kept_up(p, budget)]
    if not bad or min(bad) / max(good) <= closer:
        return None
    return (max(good) * min(bad)) ** 0.5


class InProcessLoad:
    """`app` and the load generator in one event loop of this process, through httpx's ASGI transport (no
    sockets): `run` takes `run_load`'s arguments. The client's work and the server's then take turns on one
    interpreter, so when the client falls behind its schedule the server waits with it (`--client in-process`)."""

    def __init__(self, app):
        self.app = app

    def __enter__(self) -> "InProcessLoad":
        import asyncio

        import httpx

        self.runner = asyncio.Runner()
        self.life = self.app.router.lifespan_context(self.app)
        self.runner.run(self.life.__aenter__())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://testserver")
        return self

    def run(self, path, body, **kw):
        from tinytorch.serving.loadgen import run_load

        return self.runner.run(run_load(self.client, path, body, **kw))

    def __exit__(self, *exc) -> None:
        try:
            self.runner.run(self.client.aclose())
            self.runner.run(self.life.__aexit__(None, None, None))
        finally:
            self.runner.close()


@contextlib.contextmanager
def served(app, client):
    """Serve `app` and yield its load generator (`.run(path, body, **kw)`, `run_load`'s arguments): with
    `client="process"` uvicorn serves it on 127.0.0.1 (a free port) in a thread of this process and the load
    generator runs in a child process over real HTTP (`LoadProcess`); with "in-process" both share one event loop
    here (`InProcessLoad`)."""
    from tinytorch.serving.loadgen import LoadProcess
    from tinytorch.serving.app import BackgroundServer

    if client == "in-process":
        with InProcessLoad(app) as load:
            yield load
    else:
        with BackgroundServer(app) as server, LoadProcess(server.url) as load:
            yield load


def sweep(load, body, rates, seconds, budget, seed, refinements=3):
    """Open-loop runs at rising `rates` with `load` (a `served` server's load generator) until one misses the
    budget or saturates, plus one more past the knee for the plot, then up to `refinements` runs bisecting the
    knee (`refine_rate`). Returns [(rate, throughput, p50, p99, result)] in order of rate."""
    points = []
    load.run("/v1/classify", body, rate=50, n_requests=25, duration=0.5, seed=seed)   # warm-up

    def measure(rate):
        r = load.run("/v1/classify", body, rate=rate, n_requests=int(rate * seconds) + 1, duration=seconds,
                     seed=seed + int(rate), timeout=30)
        p = r.percentiles()
        points.append((rate, r.throughput, p[50], p[99], r))
        return points[-1]

    past = 0
    for rate in rates:
        if not kept_up(measure(rate), budget):
            past += 1
            if past == 2:
                break
    for _ in range(refinements):
        rate = refine_rate(points, budget)
        if rate is None:
            break
        measure(rate)
    return sorted(points, key=lambda p: p[0])


def capacity(points, budget) -> float:
    "The highest throughput of a run that kept its p99 within the budget, refused nobody and kept up with its rate."
    return max((p[1] for p in points if kept_up(p, budget)), default=0.0)


def main(argv=None) -> int:
    run = harness.start(__file__, epochs=4, quick_epochs=1, options=options, argv=argv)
    args = run.args
    watch = harness.Stopwatch()

    import sys

    import numpy as np

    from tinytorch.perf.kv_cache import generate_cached
    from tinytorch.serving.engine import Sequence
    from tinytorch.serving.models import load_servable, save_servable
    from tinytorch.serving.server import ContinuousBatcher, StaticBatcher, create_app

    sys.setswitchinterval(0.0005)   # the server's event loop and the model's thread share this process: take turns
    budget = args.p99_budget_ms / 1000
    seconds = min(args.run_seconds, 0.8) if run.quick else args.run_seconds
    out_dir = args.out.parent
    log = lambda s: print(s, flush=True)

    cnn, spec, accuracy, test_x = train_cnn(args.seed, args.epochs, log)
    save_servable(out_dir / "serving_digits.npz", cnn, layers=spec, input_shape=(1, 8, 8))
    gpt_path = out_dir / "serving_gpt.npz"
    if gpt_path.is_file() and not args.retrain and not run.quick:
        gpt, arch = load_servable(gpt_path)
        chars = arch["vocab"]
        log(f"GPT: loaded from {gpt_path} (an earlier run; --retrain trains it again)")
    else:
        gpt, chars = train_gpt(args.seed, 20 if run.quick else args.gpt_steps, log)
        if not run.quick:
            save_servable(gpt_path, gpt, vocab=chars)
    log(f"saved servable checkpoints in {out_dir} (serve them with `tito serve {out_dir / 'serving_digits.npz'}`)")

    # ---- classification: the knee, without and with dynamic batching
    body = {"input": test_x[0].tolist()}
    rates = [25, 50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600, 2400, 3200]   # until two runs miss, then bisected
    curves, goodputs = {}, {}
    configs = (("unbatched", 1), ("dynamic batching", 32))
    with contextlib.ExitStack() as stack:
        loads_ = {label: stack.enter_context(served(create_app(classifier=cnn, input_shape=(1, 8, 8), max_batch_size=size,
                                                               max_wait=0.005, max_queue=100_000), args.client))
                  for label, size in configs}
        for label, _ in configs:
            curves[label] = sweep(loads_[label], body, rates, seconds, budget, args.seed)
            log(f"{label}:")
            for rate, tput, p50, p99, r in curves[label]:
                log(f"  offered {rate:5.0f}/s: throughput {tput:6.1f}/s, p50 {p50 * 1e3:7.1f} ms, p99 {p99 * 1e3:7.1f} ms")
        # the ratio judged as module 19 judges a speed-up: each server again at the rate of its capacity, in turns
        # (a busy spell of the machine then hits both), and a bootstrap interval of the ratio of the median answers
        # per second within the budget (a run that fell behind counts with what it answered in time)
        knees = {label: capacity_point(curves[label], budget) for label, _ in configs}
        for label, _ in configs:
            goodputs[label] = [within_budget(knees[label][4], budget)] if knees[label] else []
        shares = []   # the share of one core the server (this process) got during each run at its capacity rate
        for repeat in range(1 if run.quick else 3):
            for label, _ in configs:
                if knees[label]:
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    r = loads_[label].run("/v1/classify", body, rate=knees[label][0], duration=seconds, timeout=30,
                                          n_requests=int(knees[label][0] * seconds) + 1, seed=args.seed + 100 + repeat)
                    shares.append(min(1.0, (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)))
                    goodputs[label].append(within_budget(r, budget))
    cap_single, cap_batched = capacity(curves["unbatched"], budget), capacity(curves["dynamic batching"], budget)
    log(f"throughput within p99 <= {args.p99_budget_ms:g} ms: unbatched {cap_single:.0f}/s, dynamic batching "
        f"{cap_batched:.0f}/s ({cap_batched / max(cap_single, 1e-9):.1f} x)")
    cls_ratio, cls_shown = speedup(goodputs["dynamic batching"], goodputs["unbatched"], 3, "/s")
    cls_ratio, cls_shown = starved_verdict(cls_ratio, cls_shown, shares, 3.0)
    log(f"  again at those rates, in turns: unbatched {fmt_list(goodputs['unbatched'])}, dynamic batching "
        f"{fmt_list(goodputs['dynamic batching'])} answers/s within the budget; ratio {cls_shown}")

    # ---- Little's law and overload, on the batched server. Little's law sizes the queue bound: at the capacity
    # lambda, keeping the time in the system W within half the budget means at most L = lambda x W in the system.
    # Little's law is checked at the app's boundary, with the client in this process: the server's meter wraps the
    # app, and over a socket the client's W also holds the HTTP hop, which that meter cannot see (printed too)
    bound_ = max(1, int(cap_batched * budget / 2))
    loads, inside, client_p99, lags, timed_out = {}, {}, {}, {}, {}
    # in this process the client and the server share one interpreter, whose ceiling (about 1,400 answers/s,
    # bench_serving) is below half the batched capacity over HTTP: requests queue in the app, and W is mostly that
    # wait. Little's law holds all the same over a run that starts and ends empty. At a quarter of the capacity, a
    # stable load, the agreement was 92-94%: the client's W then also holds its own share of the loop (httpx, its
    # turns between the server's), which the server's meter does not see
    # The overload run with admission control is tried several times, each on a fresh server. What is judged is the
    # server's own p99: each admitted request's time inside the app (arrival to last byte, the meter's boundary),
    # whose median over the tries gets a bootstrap interval: a stall of this 2-core machine can delay the client,
    # which shares the cores, by 0.1-0.5 s, and the client's latency (printed beside) then measures the machine
    tries = 2 if run.quick else 3
    runs = [("little", 100_000, 0.5 * cap_batched, "in-process"),
            *[("admission control", bound_, 2 * cap_batched, args.client)] * tries,
            ("unbounded queue", 100_000, 2 * cap_batched, args.client)]
    if args.client == "process":
        runs.insert(1, ("little over HTTP", 100_000, 0.5 * cap_batched, "process"))
    admitted_p99 = lambda r: float(np.percentile((r.done - r.sent)[r.ok], 99)) if r.ok.any() else float("inf")
    overload = []   # per try: (server p99 inside the app, client p99 sent to answer, share answered, client lag p99)
    for label, bound, rate, client in runs:
        # admission control bounds the number in the system and the time in the queue: under overload the refusals
        # take CPU from the model too, so the same number waits longer than Little's law at full capacity says
        # and a late event loop makes every request late before any queue sees it: shed load when it lags. An admitted
        # request waits at most a quarter of the budget for its batch, then the batch in service and its own (a
        # batch of 32 took up to 30-40 ms under overload, the model's thread sharing the interpreter with the HTTP)
        control = dict(max_queue_delay=budget / 4, max_loop_lag=budget / 10) if label == "admission control" else {}
        app = create_app(classifier=cnn, input_shape=(1, 8, 8), max_batch_size=32, max_wait=0.005, max_queue=bound,
                         **control)
        with served(app, client) as load:
            load.run("/v1/classify", body, rate=50, n_requests=25, duration=0.5, seed=args.seed)   # warm-up
            rate = max(rate, 10.0)
            window = app.state.serving.in_app["classify"]   # the server's clock: arrival to last byte, answered
            before, cpu0, wall0 = window.count, time.process_time(), time.perf_counter()
            result = load.run("/v1/classify", body, rate=rate, n_requests=int(rate * seconds) + 1,
                              duration=seconds, seed=args.seed + 7, timeout=60)
            # the share of one core this process (the server) got while overloaded: on an idle machine it keeps one
            # core busy; when other work takes the cores, its requests wait for the CPU, not for the server
            share = min(1.0, (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9))
            n = min(window.count - before, len(window.values))
            server_p99 = float(np.percentile(list(window.values)[-n:], 99)) if n else float("inf")
            st_ = app.state.serving
            if label == "admission control":
                overload.append((server_p99, admitted_p99(result), float(np.isin(result.status, (200, 503)).mean()),
                                 float(np.percentile(result.sent - result.scheduled, 99)), share))
                if server_p99 > min(o[0] for o in overload):
                    continue        # the tries are all judged; the plot and the details show the best one
            loads[label] = result
            inside[label] = server_p99
            timed_out[label] = (st_.cls_batcher.timed_out, st_.lag_refusals, st_.cls_admission.late)
    little = loads["little"].littles_law()
    agreement = 1 - abs(little["ratio"] - 1)
    log(f"Little's law at {loads['little'].rate:.0f}/s, client in this process: "
        f"{loads['little'].report().splitlines()[-1]}")
    if "little over HTTP" in loads:
        http = loads["little over HTTP"].littles_law()
        log(f"  the same over HTTP from the client's process: server L = {http['L']:.3f}, client lambda x W = "
            f"{http['lambda_W']:.3f} (ratio {http['ratio']:.3f}; its W also holds the socket hop and uvicorn's "
            f"HTTP parsing)")
    over = loads["admission control"]
    answered = min(o[2] for o in overload)   # every try must answer every request
    # the verdict's interval: from what each try's p99 would have been with the whole core the server had on an
    # idle machine (the p99 times the share it got, if latency scales with the CPU it got) to the largest p99 measured.
    # Met: every try within the budget; not met: even with a whole core, every try over it; else too noisy to tell
    server_p99s = [o[0] for o in overload]
    p99_interval = harness.Interval(min(o[0] * o[4] for o in overload), max(server_p99s), float(np.median(server_p99s)))
    queue_t, lag_t, wait_t = (n / len(over.status) for n in timed_out["admission control"])
    log(f"2x overload ({over.rate:.0f}/s) with admission control (at most {bound_} in the system = capacity x budget / "
        f"2, and at most {budget / 4 * 1e3:.0f} ms of predicted or actual wait in the queue; refusing while the event "
        f"loop runs over {budget / 10 * 1e3:.0f} ms late), best of {len(overload)} tries: {over.rejected:.0%} refused "
        f"with 503 ({wait_t:.0%} of all for the predicted wait, {lag_t:.0%} for the loop's lag, {queue_t:.0%} after "
        f"waiting in the queue); {over.ok.sum() / over.elapsed:.0f} answers/s "
        f"({over.ok.sum() / over.elapsed / cap_batched:.0%} of the capacity), {answered:.0%} answered in every try")
    for i, (sp, cp, _, lag, share) in enumerate(overload, 1):
        stalled = cp > budget >= sp
        log(f"  try {i}: p99 inside the app {sp * 1e3:.1f} ms (judged), with {share:.0%} of a core for the server "
            f"({sp * share * 1e3:.1f} ms at a whole core); the client's p99, sent to answer, {cp * 1e3:.1f} ms, and it "
            f"sent its requests up to {lag * 1e3:.0f} ms late (p99)"
            + ("; the client, not the server, was stalled by the machine" if stalled else ""))
    log(f"2x overload without it: p99 {loads['unbounded queue'].percentiles()[99] * 1e3:.1f} ms, "
        f"{loads['unbounded queue'].rejected:.0%} refused")

    # ---- generation: one at a time, static and continuous batching on the paged KV cache
    stoi = {c: i for i, c in enumerate(chars)}
    corpus_prompt = [stoi[c] for c in "Once"]          # chat-like answer lengths: most short, a few long
    # vLLM's offline throughput benchmark: every request waiting at the start, tokens over the whole run. With 128
    # requests the final drain (the last few sequences decoding in a nearly empty batch) is a small part of the run
    slots = 16
    lengths = np.minimum(np.random.default_rng(args.seed).geometric(1 / 16, 32 if run.quick else 128), 60)
    gen, samples = {}, {}
    # static batching as FasterTransformer runs it (the Orca paper's baseline: a batch is one rectangle until its
    # longest sequence is done), and the same schedule with finished sequences leaving at once, a stronger baseline
    schedules = (("one at a time", ContinuousBatcher, dict(max_batch_size=1)),
                 (f"static batches of {slots}", StaticBatcher, dict(max_batch_size=slots)),
                 ("static, early leave", ContinuousBatcher, dict(max_batch_size=slots, policy="static")),
                 (f"continuous, {slots} slots", ContinuousBatcher, dict(max_batch_size=slots)))
    for repeat in range(2 if run.quick else 9):   # interleaved repeats: a busy spell slows every schedule alike
        for label, batcher, kw in schedules[1 if repeat else 0:]:   # one at a time (about 2 s) runs once
            cb = batcher(gpt, num_blocks=slots * 4 + 4, block_size=16, **kw)
            for i, n in enumerate(lengths):
                cb.add(Sequence(i, corpus_prompt, int(n), temperature=0.8, top_k=10, seed=args.seed + i))
            # generation is work, not waiting: tokens per second of this process's CPU time, which other work on the
            # machine does not inflate the way it inflates the wall-clock time (there is nothing to wait for here)
            c0 = time.process_time()
            done = cb.run_until_done()
            tps = sum(len(s.tokens) for s in done) / max(time.process_time() - c0, 1e-9)
            samples.setdefault(label, []).append(tps)
            if label not in gen or tps > gen[label][0]:
                gen[label] = (tps, {s.id: s.tokens for s in done}, cb.steps)
    log(f"generation: {len(lengths)} requests waiting at the start, prompt {len(corpus_prompt)} tokens, answers of "
        f"{int(lengths.min())}-{int(lengths.max())} tokens (mean {lengths.mean():.1f}, geometric, at most 60)")
    for label, (tps, _, steps) in gen.items():
        runs = "one run" if label == "one at a time" else "best of the repeats"
        log(f"{label:>21}: {tps:6.0f} tokens per CPU second ({runs}), {steps} decoding steps")
    same = all(g[1] == gen["one at a time"][1] for g in gen.values())
    solo = generate_cached(gpt, np.array([corpus_prompt]), int(lengths[0]), temperature=0.8, top_k=10, seed=args.seed)
    same &= gen[f"continuous, {slots} slots"][1][0] == solo[0, len(corpus_prompt):].tolist()
    log(f"every request got the same tokens under all four schedules and alone: {same}")
    static, cont = samples[f"static batches of {slots}"], samples[f"continuous, {slots} slots"]
    gen_ratio, gen_shown = speedup(cont, static, 2, " tokens/CPU-s")
    log(f"continuous / static batching: {gen_shown}; against static batches "
        f"whose finished sequences leave at once: {gen[f'continuous, {slots} slots'][0] / gen['static, early leave'][0]:.2f}x")
    story = "".join(chars[i] for i in corpus_prompt + gen[f"continuous, {slots} slots"][1][int(np.argmax(lengths))])
    log(f"the longest answer, served with continuous batching:\n---\n{story}\n---")
    if not same:
        log("FAIL: batching changed some request's tokens")
        gen_ratio = 0.0

    seconds_total = watch.stop()
    run.save_plot(plot(run.pyplot(), curves, budget, gen, loads, run.title))
    return run.report(("requests answered (200 or 503) under 2x overload", answered),
                      ("Little's law agreement (server L vs client lambda x W)", agreement),
                      beats=[("classification throughput within the p99 budget", cls_ratio, "3x the unbatched server",
                              3.0, "higher", "", cls_shown),
                             ("generation tokens/s", gen_ratio, "2x static batching", 2.0, "higher", "", gen_shown),
                             ("p99 of admitted requests under 2x overload", p99_interval, "the p99 budget", budget,
                              "lower", "", f"{_ms(p99_interval)} inside the app over {len(server_p99s)} tries vs "
                                       f"{budget * 1e3:.0f} ms (the interval runs from the p99 at a whole core)")],
                      seconds=seconds_total)


def within_budget(result, budget) -> float:
    "Answers per second of a load run whose latency (from when each was due) stayed within the budget."
    return float((result.ok & (result.latency <= budget)).sum() / result.elapsed) if result.elapsed > 0 else 0.0


def capacity_point(points, budget):
    "The run that gave the capacity (see `capacity`), or None."
    good = [p for p in points if kept_up(p, budget)]
    return max(good, key=lambda p: p[1]) if good else None


STARVED_SHARE = 0.5   # a server that got less than half a core at its capacity rate measured the machine's load


def starved_verdict(interval, shown: str, shares: list, target: float):
    """The classification ratio judged only where the server had the CPU the claim is about.

    Both servers' capacities within a p99 budget are set by the CPU the server gets: on a machine busy with
    other work the server waits for a core, its p99 is mostly that wait, and the rates within the budget measure
    the machine, not the batching (on 2 cores with 4 busy processes beside it, the server got 9-13% of a core under
    overload, and both servers answered 17-40 requests/s within the budget). When the median share of a core the server got during the runs in turns is
    below STARVED_SHARE, the measurement cannot decide either way: too noisy to tell (the interval is widened to
    hold a 5% band around the target), with the share printed. Otherwise the interval is judged as measured."""
    import numpy as np

    if not shares:
        return interval, shown
    share = float(np.median(shares))
    if share >= STARVED_SHARE:
        return interval, f"{shown}; the server got a median {share:.0%} of a core"
    widened = harness.Interval(min(interval.low, target / 1.05), max(interval.high, target * 1.05), interval.estimate)
    return widened, (f"{shown}; but the server got a median {share:.0%} of a core at these rates (below "
                     f"{STARVED_SHARE:.0%}: the machine's other work, not the batching, set both rates), so too noisy "
                     f"to tell")


def speedup(fast, slow, factor: float, unit: str) -> tuple:
    """(an `Interval` of how many times `fast` beats `slow`, the line that says it) from rates measured in interleaved
    repeats: run i of each took turns, so a busy spell of the machine slows both, and the ratio of the pair cancels
    it. The interval is module 19's bootstrap interval of the median of the pairs' ratios (`bootstrap_median_ci`),
    which gives the three outcomes (met, not met, too noisy to tell)."""
    import numpy as np

    from tinytorch.perf.benchmark import bootstrap_median_ci

    n = min(len(fast), len(slow))
    fast, slow = np.maximum(np.asarray(fast[:n], float), 1e-9), np.maximum(np.asarray(slow[:n], float), 1e-9)
    ratios = fast / slow
    if not n:
        return harness.Interval(0.0, 0.0, 0.0), f"no rate measured (0 vs {factor:g} x 0{unit})"
    if len(ratios) >= 2:
        low, high = bootstrap_median_ci(ratios, rng=0)
    else:
        low = high = float(ratios[0]) if len(ratios) else 0.0
    interval = harness.Interval(float(low), float(high), float(np.median(ratios)) if len(ratios) else 0.0)
    shown = (f"{np.median(fast):.1f}{unit} vs {factor:g} x {np.median(slow):.1f}{unit} ({interval.point:.2f}x, "
             f"95% interval {interval.low:.2f}-{interval.high:.2f}x over {len(ratios)} pairs of runs in turns)")
    return interval, shown


def fmt_list(values) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


def _ms(interval) -> str:
    return f"{interval.point * 1e3:.1f} ms (interval {interval.low * 1e3:.1f}-{interval.high * 1e3:.1f} ms)"


def plot(plt, curves, budget, gen, loads, title):
    "Throughput and p99 against the offered rate; generation tokens/s; overload with and without admission control."
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    (a, b), (c, d) = axes
    for label, pts in curves.items():
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        b.plot([p[0] for p in pts], [p[3] * 1e3 for p in pts], marker="o", label=label)
    top = max(p[0] for pts in curves.values() for p in pts)
    a.plot([1, top], [1, top], color="grey", linestyle=":", label="throughput = offered rate")
    a.set(xscale="log", yscale="log", xlabel="offered rate (requests/s)", ylabel="throughput (answers/s)",
          title="classification: throughput")
    b.axhline(budget * 1e3, color="grey", linestyle="--", label="p99 budget")
    b.set(xscale="log", yscale="log", xlabel="offered rate (requests/s)", ylabel="p99 latency (ms)",
          title="classification: the knee")
    c.bar(list(gen), [g[0] for g in gen.values()], color=["grey", "tab:orange", "tab:olive", "tab:blue"])
    c.set(ylabel="generated tokens per CPU second", title="generation (paged KV cache)")
    c.tick_params(axis="x", labelsize=7)
    labels = ["unbounded queue", "admission control"]
    d.bar(labels, [loads[k].percentiles()[99] * 1e3 for k in labels], color=["tab:red", "tab:green"])
    d.axhline(budget * 1e3, color="grey", linestyle="--")
    d.set(yscale="log", ylabel="p99 of answered requests (ms)", title="2x overload")
    for ax in (a, b):
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
