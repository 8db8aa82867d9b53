"""Probes of module 19 (benchmarking): see tito/probes/__init__.py. Timing is driven by a fake clock
(a counter the probed function advances), so both runs see the same readings; the bootstrap and the
comparison take a seed drawn from the grading run's generator, so their intervals are reproducible.

One bug is charged once without substituting anyone's source: `benchmark` (19.2) calls the student's
`bootstrap_median_ci` (19.1), so its check compares every field with the reference's except the interval,
and the interval with the student's own `bootstrap_median_ci` of the same samples (recorded beside it).
`compare` (19.3) and `speed_verdict` (19.4) are given their inputs as data. Numbers are recorded as
Python floats, so a NumPy scalar and a float of the same value compare equal.
"""
import numbers

import numpy as np

from . import compare as _compare_records
from . import probe


def num(v):
    "A real number as a float (Python or NumPy, int or float); anything else unchanged."
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v


class _FakeClock:
    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        return self.now

    def work(self, durations):
        seq = list(durations)

        def fn(*args):
            self.now += seq[fn.calls % len(seq)]
            fn.calls += 1
        fn.calls = 0
        return fn


@probe("19.1", messages=True)
def bootstrap(rng, rec):
    from tinytorch.perf.benchmark import bootstrap_median_ci

    x = rng.lognormal(0.0, 0.4, 31)
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("seeded", bootstrap_median_ci, x, n_resamples=400, rng=seed)
    rec.call("generator", bootstrap_median_ci, x, confidence=0.8, n_resamples=300, rng=np.random.default_rng(seed))
    rec.call("even", bootstrap_median_ci, rng.exponential(1.0, 20), confidence=0.99, n_resamples=250, rng=seed + 1)
    rec.call("ties", bootstrap_median_ci, rng.integers(0, 4, 15).astype(float).tolist(), n_resamples=200, rng=seed + 2)
    rec.call("two", bootstrap_median_ci, [1.0, 3.0], n_resamples=100, rng=seed + 3)
    rec.call("constant", bootstrap_median_ci, [2.5] * 9, rng=seed)
    rec.call("one", bootstrap_median_ci, [1.0])
    rec.call("bad_confidence", bootstrap_median_ci, x, confidence=1.5)


def _result(r):
    "A BenchmarkResult as data: every field but the interval, which `_harness_check` judges apart."
    if not hasattr(r, "samples"):
        return r
    return {"type": type(r).__name__, "name": r.name, "samples": [num(s) for s in r.samples], "number": num(r.number),
            "confidence": num(r.confidence), "warnings": list(r.warnings), "threads": r.threads,
            "environment": {k: (None if v is None else "reading") for k, v in dict(r.environment).items()}}


def _harness_check(values, ref):
    """Every record as the reference's, except the intervals (`*_ci`), which must be the student's own
    `bootstrap_median_ci` of the result's samples (`*_own_ci`): a 19.1 bug is not charged to 19.2."""
    from . import module_probes

    p = module_probes("19")["19.2"]
    for key, want in ref.items():
        if key.endswith("_ci"):
            continue
        if key not in values:
            return f"{key!r}: no result"
        why = _compare_records(values[key], want, p, key)
        if why:
            return why
    for key in ref:
        if key.endswith("_ci") and not key.endswith("_own_ci"):
            own = key[:-3] + "_own_ci"
            why = _compare_records(values.get(key), values.get(own), p,
                                   f"{key} (the result's interval, against your bootstrap_median_ci of its samples)")
            if why:
                return why
    return ""


@probe("19.2", messages=True, check=_harness_check)
def harness(rng, rec):
    from tinytorch.perf.benchmark import benchmark, bootstrap_median_ci

    def own_ci(r, *args):
        "The student's own bootstrap_median_ci of a result's samples (None when it cannot be had)."
        try:
            return [num(v) for v in bootstrap_median_ci(r.samples, *args)]
        except Exception:
            return None

    for i in range(3):
        per_call = list(rng.uniform(1e-4, 3e-3, int(rng.integers(1, 5))))
        clk = _FakeClock()
        fn = clk.work(per_call)
        kw = dict(clock=clk, min_time=float(rng.uniform(2e-3, 2e-2)), repeats=int(rng.integers(2, 9)),
                  warmup=int(rng.integers(0, 4)), check_machine=False, rng=int(rng.integers(0, 2 ** 20)),
                  n_resamples=200, confidence=float(rng.choice([0.8, 0.9, 0.95])))
        box = {}

        def keep(fn=fn, kw=kw, box=box):
            box["r"] = benchmark(fn, **kw)
            return _result(box["r"])
        rec.call(f"calibrated{i}", keep)
        rec[f"calibrated{i}_reads"], rec[f"calibrated{i}_calls"] = clk.reads, fn.calls
        r = box.get("r")
        rec[f"calibrated{i}_ci"] = [num(v) for v in r.ci] if r is not None else None
        rec[f"calibrated{i}_own_ci"] = own_ci(r, kw["confidence"], kw["n_resamples"], kw["rng"]) if r is not None else None
    clk = _FakeClock()
    seen = []
    fn = clk.work([1e-3, 2e-3])
    box = {}

    def with_args():
        box["r"] = benchmark(lambda a, b: (seen.append((a, b)), fn()), 3, "x", number=2, repeats=5, warmup=1,
                             clock=clk, check_machine=False, name="pair", n_resamples=100)
        return _result(box["r"])
    rec.call("args", with_args)
    rec["args_seen"], rec["args_reads"] = [list(t) for t in seen], clk.reads
    r = box.get("r")
    rec["args_ci"] = [num(v) for v in r.ci] if r is not None else None
    rec["args_own_ci"] = own_ci(r, 0.95, 100, 0) if r is not None else None
    clk = _FakeClock()   # samples that differ: the interval depends on confidence, n_resamples and rng
    spread = clk.work(list(rng.lognormal(np.log(1e-3), 0.3, 40)))
    conf, draws, seed = float(rng.choice([0.8, 0.9])), int(rng.integers(100, 300)), int(rng.integers(0, 2 ** 20))
    box = {}

    def spread_run():
        box["r"] = benchmark(spread, number=1, repeats=11, warmup=0, clock=clk, check_machine=False, confidence=conf,
                             n_resamples=draws, rng=seed)
        return _result(box["r"])
    rec.call("spread", spread_run)
    r = box.get("r")
    rec["spread_ci"] = [num(v) for v in r.ci] if r is not None else None
    rec["spread_own_ci"] = own_ci(r, conf, draws, seed) if r is not None else None
    clk = _FakeClock()   # a CV of about 0.35: a warning at the default max_cv, none at max_cv=0.5
    varied = clk.work([1e-3, 1.5e-3, 2e-3, 2.5e-3])
    rec.call("max_cv", lambda: _result(benchmark(varied, number=1, repeats=8, warmup=0, clock=clk,
                                                 check_machine=False, n_resamples=20, max_cv=0.5)))
    clk = _FakeClock()
    noisy = clk.work([1e-3, 4e-3])
    rec.call("noisy", lambda: _result(benchmark(noisy, number=1, repeats=6, warmup=0, clock=clk, check_machine=False,
                                                n_resamples=50)))
    # with check_machine the readings go in `environment` (their values, and warnings about the load, depend on the
    # machine at the moment of each run: only which readings were taken is compared)
    rec.call("machine", lambda: sorted(benchmark(np.sum, np.ones(4), number=1, repeats=2, warmup=0,
                                                 n_resamples=10).environment))
    rec.call("named_fn", lambda: _result(benchmark(np.sum, np.ones(3), number=1, repeats=2, warmup=0,
                                                   check_machine=False, n_resamples=10))["name"])
    rec.call("bad_repeats", benchmark, lambda: None, repeats=1)


def _fields(c):
    return [c.name_a, c.name_b, num(c.ratio), num(c.low), num(c.high), num(c.confidence), list(c.notes), c.verdict,
            bool(c.significant)]


@probe("19.3", messages=True)
def compare(rng, rec):
    from tinytorch.perf.benchmark import BenchmarkResult, Comparison, compare as compare_

    a = 1e-3 * rng.lognormal(0, 0.05, 23)
    b = 1.7e-3 * rng.lognormal(0, 0.05, 17)
    same = 1e-3 * rng.lognormal(0, 0.05, 23)
    seed = int(rng.integers(0, 2 ** 30))
    rec.call("faster", lambda: _fields(compare_(a, b, n_resamples=400, rng=seed)))
    rec.call("slower", lambda: _fields(compare_(b, a, n_resamples=400, rng=seed)))
    rec.call("same", lambda: _fields(compare_(a, same, n_resamples=400, rng=seed)))
    rec.call("ci90", lambda: _fields(compare_(a, b, confidence=0.9, n_resamples=300, rng=np.random.default_rng(seed))))
    ra = BenchmarkResult("fast", tuple(a), 10, (0.0, 0.0), warnings=("machine busy: load average 5.00 above its 2 core(s)",))
    rb = BenchmarkResult("slow", tuple(b), 10, (0.0, 0.0))
    rec.call("results", lambda: _fields(compare_(ra, rb, n_resamples=300, rng=seed)))
    rec.call("lists", lambda: _fields(compare_(list(a[:5]), list(b[:6]), n_resamples=200, rng=seed + 1)))
    # the verdict's words on comparisons given as data (whatever compare computes)
    for i in range(6):
        lo = float(rng.uniform(0.3, 2.0))
        hi = lo + float(rng.uniform(0.0, 0.8))
        ratio = float(rng.uniform(lo, hi))
        notes = tuple(f"n{k}: busy" for k in range(int(rng.integers(0, 3))))
        c = Comparison(f"A{i}", f"B{i}", ratio, lo, hi, float(rng.choice([0.9, 0.95, 0.99])), notes)
        rec.call(f"words{i}", lambda c=c: [c.verdict, bool(c.significant)])
    edges = [Comparison("x", "y", 1.0, 1.0, 1.2), Comparison("x", "y", 1.0, 0.9, 1.0), Comparison("x", "y", 1.1, 1.05, 1.2)]
    rec.call("edge_one", lambda: [[c.verdict, bool(c.significant)] for c in edges])


@probe("19.4", messages=True)
def verdict(rng, rec):
    from tinytorch.perf.benchmark import MET, NOISY, NOT_MET, speed_verdict

    rec["names"] = [MET, NOT_MET, NOISY]
    for i in range(12):
        target = float(rng.choice([0.5, 1.0, 1.5, 2.0]))
        lo = target + float(rng.uniform(-0.6, 0.6))
        hi = lo + float(rng.choice([0.0, rng.uniform(0.0, 0.8)]))
        for at_least in (True, False):
            rec.call(f"case{i}_{at_least}", speed_verdict, lo, hi, target, at_least)
    for target in (0.5, 2.0):   # the interval touching the target from either side
        for lo, hi in ((target, target + 0.1), (target - 0.1, target), (target, target)):
            rec.call(f"touch{target}_{lo}_{hi}", lambda lo=lo, hi=hi, t=target: [speed_verdict(lo, hi, t, True),
                                                                               speed_verdict(lo, hi, t, False)])
    rec.call("bad", speed_verdict, 2.0, 1.0, 1.5)


@probe("19.5", messages=True)
def pareto(rng, rec):
    from tinytorch.perf.benchmark import pareto_front

    rec.call("random", pareto_front, rng.random((12, 3)))
    rec.call("ties", pareto_front, rng.integers(0, 3, (15, 2)))
    rec.call("duplicates", pareto_front, [[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [2.0, 2.0]])
    rec.call("one_objective", pareto_front, rng.integers(0, 5, (6, 1)).astype(np.float32))
    rec.call("single", pareto_front, [[3.0, 4.0]])
    rec.call("flat", pareto_front, [1.0, 2.0])
    rec.call("nan", pareto_front, [[1.0, np.nan], [0.0, 1.0]])
