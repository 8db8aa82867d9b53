"""Probes of module 14 (profiling): see tito/probes/__init__.py. Substitutes (one bug charged once): 14.3 runs
the reference `op_flops`; 14.5 the reference `op_flops`, `op_bytes` and `ModulePaths`. 14.5's timings are
checked here, in the trusted process, for their structure (positive, in order, not overlapping), never for
their values."""
import math

import numpy as np

from . import Probe, compare, probe

PATHS = ("ModulePaths.attach", "ModulePaths.push", "ModulePaths.pop")


@probe("14.1")
def flops(rng, rec):
    from tinytorch.perf.profiler import op_flops

    b, m, k, n = (int(v) for v in rng.integers(2, 9, size=4))
    cases = {
        "matmul": ("matmul", [(m, k), (k, n)], (m, n)),
        "batched": ("matmul", [(b, 3, m, k), (b, 3, k, n)], (b, 3, m, n)),
        "bcast": ("matmul", [(b, m, k), (k, n)], (b, m, n)),
        "vec_left": ("matmul", [(k,), (k, n)], (n,)),
        "vec_right": ("matmul", [(m, k), (k,)], (m,)),
        "conv": ("Conv2dFunction", [(2, 3, 8, 8), (16, 3, 3, 3), (16,)], (2, 16, 8, 8)),
        "conv_rect": ("Conv2dFunction", [(1, 4, 9, 9), (2, 4, 3, 5), None], (1, 2, 4, 3)),
        "add": ("add", [(8, 16), (16,)], (8, 16)),
        "sum": ("sum", [(4, 5)], ()),
        "mean": ("mean", [(b, m, n)], (b, 1, n)),
        "const": ("mul", [(3, 4), None], (3, 4)),
        "reshape": ("reshape", [(4, 5)], (20,)),
        "transpose": ("transpose", [(4, 5)], (5, 4)),
        "lookup": ("EmbeddingLookup", [(10, 4), None], (2, 3, 4)),
        "xent": ("cross_entropy", [(6, 10)], ()),
        "exp": ("exp", [(m, n)], (m, n)),
    }
    for key, args in cases.items():
        out = rec.call(key, op_flops, *args)
        if isinstance(out, tuple):
            rec[key + "_types"] = [type(v).__name__ for v in out]


@probe("14.2")
def nbytes(rng, rec):
    from tinytorch.perf.profiler import arithmetic_intensity, op_bytes

    n = int(rng.integers(100, 2000))
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    m = np.ones((50, 20), np.float32)
    table = np.ones((1000, 4), np.float32)
    ids = rng.integers(0, 1000, size=(2, 3))
    d = rng.standard_normal((7, 5))
    cases = {
        "add": ("add", [a, b], a + b),
        "const": ("mul", [a, None], a * 2),
        "transpose": ("transpose", [m], m.T),
        "reshape": ("reshape", [m], m.reshape(1000)),
        "lookup": ("EmbeddingLookup", [table, None], table[ids]),
        "matmul": ("matmul", [m, m.T.copy()], m @ m.T),
        "fancy": ("getitem", [m], m[[0, 2]]),
        "slice": ("getitem", [m], m[1:3]),
        "astype": ("astype", [m], m.astype(np.float64)),
        "f64": ("exp", [d], np.exp(d)),
        "sum": ("sum", [d], d.sum()),
        "noncontig": ("reshape", [m.T], m.T.reshape(1000)),
    }
    for key, args in cases.items():
        out = rec.call(key, op_bytes, *args)
        if isinstance(out, tuple):
            rec[key + "_types"] = [type(v).__name__ for v in out]
    rec.call("ai", arithmetic_intensity, 1000, 12000)
    rec.call("ai_zero", arithmetic_intensity, 10, 0)


def _gpt(rng, *args):
    from tinytorch.models.gpt import GPT

    return GPT(*args, rng=int(rng.integers(0, 2 ** 30)))


@probe("14.3", replay=("op_flops",))
def count(rng, rec):
    from tinytorch.core.layers import Linear
    from tinytorch.core.spatial import Conv2d
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.profiler import FlopCounter, count_flops

    def as_data(c):
        return None if c is None else [c.matmul, c.other, {k: list(v) for k, v in c.by_op.items()}]

    layer = Linear(32, 16, rng=int(rng.integers(0, 2 ** 30)))
    x = Tensor(rng.standard_normal((8, 32)).astype(np.float32))
    rec.call("linear", lambda: as_data(count_flops(layer, x)))
    gpt = _gpt(rng, 37, 8, 16, 4, 2)
    ids = rng.integers(0, 37, size=(2, 8))
    rec.call("gpt", lambda: as_data(count_flops(gpt, ids)))
    rec["no_grads"] = [p.grad is None for p in gpt.parameters()]
    rec.call("lambda", lambda: as_data(count_flops(lambda t: t @ t.T, x)))
    conv = Conv2d(3, 4, 3, padding=1, rng=0)
    rec.call("conv", lambda: as_data(count_flops(conv, Tensor(np.ones((2, 3, 5, 5), np.float32)))))
    from tinytorch.core.tensor import _OBSERVER_LIST

    n_before = len(_OBSERVER_LIST)

    def broken(_):
        raise RuntimeError("boom")
    rec.call("broken", count_flops, broken, x)
    rec["observers_left"] = len(_OBSERVER_LIST) - n_before
    counter = FlopCounter()
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.tensor import observe_ops

    def observed():
        with no_grad(), observe_ops(counter):
            out = layer(x) * 2.0
        return [out, {k: list(v) for k, v in counter.by_op.items()}]
    rec.call("counter", observed)


@probe("14.4")
def paths(rng, rec):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.tensor import Tensor, observe_ops
    from tinytorch.perf.profiler import ModulePaths

    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 2, rng=1))
    stack, seen = [], []
    tracker = rec.call("attach", lambda: ModulePaths(stack).attach(net))
    if tracker is None:
        return
    rec["attach"] = [tracker is not None and type(tracker).__name__, getattr(tracker, "stack", None) is stack,
                     len(getattr(tracker, "handles", []))]
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32))

    def run():
        with observe_ops(lambda node, out: seen.append((stack[-1] if stack else None, node.op))):
            y = net(x)
        return [y, list(stack), list(seen)]
    rec.call("forward", run)
    rec.call("remove", tracker.remove)
    seen.clear()
    rec.call("after_remove", run)
    gpt = _gpt(rng, 11, 6, 8, 2, 2)

    def on_gpt():
        t, per_op = ModulePaths().attach(gpt), []
        with no_grad(), observe_ops(lambda node, out: per_op.append((t.stack[-1] if t.stack else None, node.op,
                                                                        tuple(node.shape)))):
            gpt(np.zeros((1, 6), dtype=np.int64))
        left = list(t.stack)
        t.remove()
        hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for _, m in gpt.named_modules())
        return [per_op, left, hooks]
    rec.call("gpt", on_gpt)

    def raising():
        t = ModulePaths().attach(net)
        try:
            net(Tensor(np.ones((3, 5), np.float32)))
        except Exception as e:  # the wrong width: the stack must still be usable afterwards
            kind = type(e).__name__
        else:
            kind = ""
        t.remove()
        return kind
    rec.call("raising", raising)


def _events(prof):
    return [(e.name, e.module, tuple(e.input_shapes), tuple(e.output_shape), str(e.dtype), e.flops, e.other_flops,
             e.bytes_read, e.bytes_written, e.kind) for e in prof.events]


def _times(prof):
    return [[int(e.start_ns), int(e.dur_ns)] for e in prof.events] + [[int(getattr(prof, "_op_ns", -1)), 0]]


def _profiler_check(got, want):
    exact = Probe("14.5", "14", None)
    for key in want:
        if key.startswith("times"):
            continue
        why = compare(got[key], want[key], exact, key)
        if why:
            return why
    for key in want:
        if not key.startswith("times"):
            continue
        g = got[key]
        try:
            rows = [[int(v) for v in (r.items if hasattr(r, "items") else r)] for r in g.items]
        except (AttributeError, TypeError, ValueError):
            return f"{key}: could not read the events' times"
        *spans, (op_ns, _) = rows
        if len(spans) != len(want[key].items) - 1:
            return f"{key}: {len(spans)} events, expected {len(want[key].items) - 1}"
        if any(s < 0 or d <= 0 for s, d in spans):
            return f"{key}: every event starts at or after the profiler's start and takes some time; got {spans[:5]}"
        for (s0, d0), (s1, _) in zip(spans, spans[1:]) if key == "times_ops" else ():
            if s1 < s0 + d0:
                return f"{key}: events overlap or are out of order (start {s1} before {s0} + {d0})"
        if key == "times_ops" and op_ns != sum(d for _, d in spans):
            return f"{key}: the op time ({op_ns} ns) is not the sum of the events' durations ({sum(d for _, d in spans)})"
    return ""


@probe("14.5", replay=("op_flops", "op_bytes") + PATHS, check=_profiler_check)
def profiler(rng, rec):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.profiler import Profiler, record_function

    m, k, n = (int(v) for v in rng.integers(4, 40, size=3))
    a = Tensor(rng.standard_normal((m, k)).astype(np.float32))
    b = Tensor(rng.standard_normal((k, n)).astype(np.float32))

    def ops():
        with Profiler() as prof:
            c = (a @ b) * 2.0
            c.sum()
            Tensor(rng.standard_normal((3, 4))).exp()
        a @ b  # after the block: nothing recorded
        return prof
    prof = rec.call("ops", ops)
    if prof is not None:
        rec["ops"] = _events(prof)
        rec["times_ops"] = _times(prof)
        rec.call("total_flops", prof.total_flops)
        rec.call("total_all", prof.total_flops, include_other=True)
    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 2, rng=1))

    def model():
        with Profiler(net, backward=False) as p:
            out = net(Tensor(rng.standard_normal((3, 4)).astype(np.float32)))
            with record_function("after"):
                out.sum()
        return p
    prof = rec.call("model", model)
    if prof is not None:
        rec["model"] = _events(prof)
        rec["times_model"] = _times(prof)


@probe("14.6", messages=True)
def summary(rng, rec):
    from tinytorch.perf.profiler import Event, summarize

    def ev(name, module, dur, **kw):
        return Event(name, module, (), (), "float32", 0, int(dur), **kw)
    events = [ev("matmul", "fc1", 3_000_000, flops=100, bytes_read=40, bytes_written=8),
              ev("add", "fc1", 1_000_000, other_flops=10, bytes_read=80, bytes_written=40),
              ev("matmul", "fc2", 5_000_000, flops=50, bytes_read=20, bytes_written=4)]
    names, mods = ["matmul", "add", "relu", "sum"], ["a", "b", "a.c", ""]
    for _ in range(12):
        events.append(ev(names[int(rng.integers(0, 4))], mods[int(rng.integers(0, 4))], rng.integers(1, 10) * 1000,
                         flops=int(rng.integers(0, 5)) * 10, other_flops=int(rng.integers(0, 5)),
                         bytes_read=int(rng.integers(0, 100)), bytes_written=int(rng.integers(0, 100))))
    for group in ("op", "module"):
        for sort in ("time", "flops", "memory"):
            rec.call(f"{group}_{sort}", summarize, events, group_by=group, sort_by=sort)
            rec.call(f"{group}_{sort}_3", summarize, events[:3], group_by=group, sort_by=sort)
    rec.call("default", summarize, events)
    rec.call("tie", summarize, [ev("b", "", 5), ev("a", "", 5), ev("c", "", 7)])
    rec.call("empty", summarize, [])
    rec.call("bad_sort", summarize, events, sort_by="speed")
    rec.call("bad_group", summarize, events, group_by="layer")


@probe("14.7", messages=True)
def roofline(rng, rec):
    from tinytorch.perf.profiler import amdahl, roofline as roof

    peak, bw = float(rng.uniform(1e10, 1e12)), float(rng.uniform(1e9, 1e11))
    rec.call("low", roof, 2.0, 100e9, 10e9)
    rec.call("high", roof, 50.0, 100e9, 10e9)
    rec.call("ridge", roof, peak / bw, peak, bw)
    rec.call("array", roof, np.array([0.1, 10.0, 1000.0]), 100e9, 10e9)
    rec.call("random", roof, rng.uniform(0, 200, size=7), peak, bw)
    rec.call("zero", roof, 0.0, 1e9, 1e9)
    for key, args in {"half": (0.5, 2), "free": (0.5, math.inf), "none": (0.0, 10), "all": (1.0, 10),
                      "all_free": (1.0, math.inf), "p4": (0.4, math.inf), "p9": (0.9, 10),
                      "slower": (0.3, 0.5), "rand": (float(rng.uniform()), float(rng.uniform(1, 20))),
                      "bad_fraction": (1.5, 2), "bad_speedup": (0.5, 0), "neg_fraction": (-0.1, 2)}.items():
        rec.call(key, amdahl, *args)
