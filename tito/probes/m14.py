"""Probes of module 14 (profiling): see tito/probes/__init__.py.

No substitutes: an exercise that builds on an earlier one is checked on its own inputs. In 14.3 and 14.5 the
calls of `op_flops` (and in 14.5 of `op_bytes`) are answered with the reference's recorded answers for the same
arguments (replay), so a wrong 14.1 or 14.2 is charged to itself only, and a counter that computes its numbers
some other way is judged by the numbers alone; 14.5 pushes module paths by hand instead of calling 14.4's hooks.
14.5's timings are checked here, in the trusted process, for their structure (positive, in order, not
overlapping), never for their values. 14.8 and 14.9 compare numbers as numbers: a Python float where the
reference returned a NumPy scalar is the same answer.
"""
import math

import numpy as np

from . import Arr, Probe, Seq, compare, probe


def _as_number(v):
    "A number of either kind (Python int or float, a 0-d NumPy array or scalar) as a Python float; else unchanged."
    if isinstance(v, Arr) and v.a.ndim == 0 and v.a.dtype.kind in "iuf":
        return float(v.a)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, Seq):
        return Seq(v.kind, [_as_number(x) for x in v.items])
    return v


def _numbers(exercise: str, messages: bool = True):
    "A check= that compares every record as `compare` does, numbers as numbers whatever their type."
    p = Probe(exercise, exercise.split(".")[0], None, rtol=1e-9, atol=0.0, messages=messages)

    def check(got, want):
        for key in want:
            why = compare(_as_number(got[key]), _as_number(want[key]), p, key)
            if why:
                return why
        return ""
    return check


@probe("14.1")
def flops(rng, rec):
    from tinytorch.perf.profiler import backward_flops, op_flops

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
        "zero_": ("zero_", [(m, n), None], (m, n)),
        "add_": ("add_", [(m, n), (n,)], (m, n)),
    }
    for key, args in cases.items():
        out = rec.call(key, op_flops, *args)
        if isinstance(out, tuple):
            rec[key + "_types"] = [type(v).__name__ for v in out]
    for key in ("matmul", "batched", "bcast", "conv", "conv_rect", "add", "exp"):
        op, shapes, out_shape = cases[key]
        for needs in ((True, True, True), (False, True, False), (True, False, True), (False, False, False)):
            tag = "".join("1" if x else "0" for x in needs)
            got = rec.call(f"bwd_{key}_{tag}", backward_flops, op, shapes, out_shape, needs[:len(shapes)])
            if isinstance(got, tuple):
                rec[f"bwd_{key}_{tag}_types"] = [type(v).__name__ for v in got]


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
        "add_": ("add_", [a, b], a),
        "sub_bcast": ("sub_", [m, m[0]], m),
        "mul_const": ("mul_", [d, None], d),
        "zero_": ("zero_", [d, None], d),
        "fill_view": ("fill_", [m[:7], None], m[:7]),
        "copy_": ("copy_", [a, b], a),
        "copy_const": ("copy_", [a, None], a),
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
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.layers import Linear
    from tinytorch.core.spatial import Conv2d
    from tinytorch.core.tensor import Tensor, active_op_observers, observe_ops
    from tinytorch.perf.profiler import FlopCounter, count_flops

    def as_data(c):
        return None if c is None else [c.matmul, c.other, {k: list(v) for k, v in c.by_op.items()}]

    layer = Linear(32, 16, rng=int(rng.integers(0, 2 ** 30)))
    x = Tensor(rng.standard_normal((8, 32)).astype(np.float32))
    gpt = _gpt(rng, 37, 8, 16, 4, 2)
    ids = rng.integers(0, 37, size=(2, 8))
    conv = Conv2d(3, 4, 3, padding=1, rng=0)
    # op_flops's calls are answered with the reference's (replay): a wrong 14.1 is not charged here
    rec.call("linear", lambda: as_data(count_flops(layer, x)))
    rec.call("gpt", lambda: as_data(count_flops(gpt, ids)))
    rec["no_grads"] = [p.grad is None for p in gpt.parameters()]
    rec.call("lambda", lambda: as_data(count_flops(lambda t: t @ t.T, x)))
    rec.call("conv", lambda: as_data(count_flops(conv, Tensor(np.ones((2, 3, 5, 5), np.float32)))))
    n_before = len(active_op_observers())

    def broken(_):
        raise RuntimeError("boom")
    rec.call("broken", count_flops, broken, x)
    rec["observers_left"] = len(active_op_observers()) - n_before
    counter = FlopCounter()

    def observed():
        with no_grad(), observe_ops(counter):
            out = layer(x) * 2.0
            out.sum()
            layer(x)
        return [out, {k: list(v) for k, v in counter.by_op.items()},
                [type(v).__name__ for entry in counter.by_op.values() for v in entry]]
    rec.call("counter", observed)


@probe("14.4")
def paths(rng, rec):
    from tinytorch.core.activations import ReLU
    from tinytorch.core.autograd import no_grad
    from tinytorch.core.layers import Linear, Sequential
    from tinytorch.core.tensor import Tensor, observe_ops
    from tinytorch.perf.profiler import ModulePaths

    net = Sequential(Linear(4, 8, rng=0), ReLU(), Linear(8, 2, rng=1))
    alone, stack = ModulePaths(["outer"]), None
    alone.names[id(net)] = "fc"
    rec.call("push_returns", alone.push, net, ())
    rec["push_stack"] = list(alone.stack)
    rec.call("pop_returns", lambda: repr(alone.pop(net, (), Tensor(np.ones(2)))))
    rec["pop_stack"] = list(alone.stack)
    stack, seen = [], []
    tracker = rec.call("attach", lambda: ModulePaths(stack).attach(net))
    if tracker is None:
        return
    rec["attach"] = [type(tracker).__name__, getattr(tracker, "stack", None) is stack,
                     len(getattr(tracker, "handles", []))]
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32))

    def run():
        with observe_ops(lambda node, out: seen.append((stack[-1] if stack else None, node.op))):
            y = net(x)
        return [y, list(stack), list(seen)]
    rec.call("forward", run)

    def raising():
        try:
            net(Tensor(np.ones((3, 5), np.float32)))   # the wrong width: Linear(4, 8) raises
        except Exception as e:  # noqa: BLE001
            kind = type(e).__name__
        else:
            kind = ""
        left = list(stack)
        seen.clear()
        after = run()
        return [kind, left, after[2]]
    rec.call("raising", raising)
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


def _events(prof):
    return [(e.name, e.module, tuple(e.input_shapes), tuple(e.output_shape), str(e.dtype), e.flops, e.other_flops,
             e.bytes_read, e.bytes_written, e.kind) for e in prof.events]


def _times(prof):
    "The ops' [start, duration] in order, then the profiler's total op time: their structure is checked, not their values."
    return [[int(e.start_ns), int(e.dur_ns)] for e in prof.events if e.kind == "op"] + [[int(getattr(prof, "_op_ns", -1)), 0]]


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


@probe("14.5", check=_profiler_check, replay=("op_flops", "op_bytes"))
def profiler(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.profiler import Profiler, record_function

    m, k, n = (int(v) for v in rng.integers(4, 40, size=3))
    a = Tensor(rng.standard_normal((m, k)).astype(np.float32))
    b = Tensor(rng.standard_normal((k, n)).astype(np.float32))
    w = Tensor(np.ones(int(rng.integers(5, 50)), np.float32))

    def ops():
        with Profiler() as prof:
            c = (a @ b) * 2.0
            prof._stack.append("encoder.fc")   # a module path, pushed as 14.4's hooks would
            c.sum()
            Tensor(rng.standard_normal((3, 4))).exp()
            prof._stack.append("encoder.fc.inner")
            w.mul_(0.5)
            prof._stack.pop()
            prof._stack.pop()
            with record_function("after"):
                c.exp()
        a @ b  # after the block: nothing recorded
        return prof
    # op_flops's and op_bytes's calls are answered with the reference's (replay)
    prof = rec.call("ops", ops)
    if prof is not None:
        rec["ops"] = _events(prof)
        rec["times_ops"] = _times(prof)
        rec.call("total_flops", prof.total_flops)
        rec.call("total_all", prof.total_flops, include_other=True)


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


@probe("14.7")
def memory(rng, rec):
    from tinytorch.core.tensor import Tensor
    from tinytorch.perf.profiler import graph_memory

    r, c, o = (int(v) for v in rng.integers(2, 9, size=3))
    x = Tensor(rng.standard_normal((r, c)).astype(np.float32))
    w = Tensor(rng.standard_normal((c, o)).astype(np.float32), requires_grad=True)
    bias = Tensor(np.zeros(o, np.float64), requires_grad=True)
    rec.call("matmul_sum", graph_memory, (x @ w).sum())
    h = x @ w
    rec.call("views", graph_memory, (h.reshape(r * o) * h.reshape(r * o)).sum() + h.T.sum() + h[1:].sum())
    rec.call("reused", graph_memory, ((x @ w) * (x @ w) + x.sum()).sum())
    rec.call("f64_bias", graph_memory, (x @ w + bias).sum())
    y = (x @ w).sum()
    y.backward()
    rec.call("released", graph_memory, y)
    rec.call("leaf", graph_memory, Tensor(np.ones(3, np.float32)))
    deep = Tensor(np.ones(4, np.float32), requires_grad=True)
    out = deep
    for _ in range(3000):
        out = out * 1.0
    rec.call("deep", graph_memory, out)
    from tinytorch.core.layers import Linear

    lin = Linear(c, o, rng=int(rng.integers(0, 2 ** 30)))
    rec.call("linear", graph_memory, (lin(x) * 2.0).sum())


@probe("14.8", check=_numbers("14.8"))
def roofline(rng, rec):
    from tinytorch.perf.profiler import place_on_roofline, roofline as roof

    peak, bw = float(rng.uniform(1e10, 1e12)), float(rng.uniform(1e9, 1e11))
    rec.call("low", roof, 2.0, 100e9, 10e9)
    rec.call("high", roof, 50.0, 100e9, 10e9)
    rec.call("ridge", roof, peak / bw, peak, bw)
    rec.call("array", roof, np.array([0.1, 10.0, 1000.0]), 100e9, 10e9)
    rec.call("random", roof, rng.uniform(0, 200, size=7), peak, bw)
    rec.call("zero", roof, 0.0, 1e9, 1e9)

    def place(*args):
        p = place_on_roofline(*args)
        return [p.intensity, p.attained, p.bound, p.limit, p.fraction,
                [type(v).__name__ for v in (p.intensity, p.attained, p.bound, p.fraction)]]
    rec.call("example", place, 2e9, 1e9, 0.5, 100e9, 10e9)
    rec.call("compute", place, 2 * 512 ** 3, 3 * 512 * 512 * 4, 0.01, 100e9, 10e9)
    rec.call("no_bytes", place, 10, 0, 1e-6, 1e9, 1e9)
    rec.call("at_ridge", place, np.int64(1000), np.int64(100), np.float64(1e-6), 1e10, 1e9)
    rec.call("above", place, 1e6, 1e6, 1e-6, peak, bw)
    for i in range(6):
        rec.call(f"random{i}", place, float(rng.uniform(1, 1e9)), float(rng.uniform(1, 1e8)), float(rng.uniform(1e-6, 1)),
                 peak, bw)
    for key, args in {"bad_flops": (0, 10, 1.0, 1e9, 1e9), "bad_bytes": (5, -1, 1.0, 1e9, 1e9),
                      "bad_seconds": (5, 10, 0, 1e9, 1e9), "bad_peak": (5, 10, 1.0, -1.0, 1e9),
                      "bad_bandwidth": (5, 10, 1.0, 1e9, 0), "nan_seconds": (5, 10, math.nan, 1e9, 1e9)}.items():
        rec.call(key, place_on_roofline, *args)


@probe("14.9", check=_numbers("14.9"))
def amdahl(rng, rec):
    from tinytorch.perf.profiler import amdahl as law

    for key, args in {"half": (0.5, 2), "free": (0.5, math.inf), "none": (0.0, 10), "all": (1.0, 10),
                      "all_free": (1.0, math.inf), "p4": (0.4, math.inf), "p9": (0.9, 10),
                      "slower": (0.3, 0.5), "rand": (float(rng.uniform()), float(rng.uniform(1, 20))),
                      "bad_fraction": (1.5, 2), "bad_speedup": (0.5, 0), "neg_fraction": (-0.1, 2)}.items():
        rec.call(key, law, *args)
