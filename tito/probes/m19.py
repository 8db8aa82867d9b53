"""Probes of module 19 (benchmarking): see tito/probes/__init__.py. Timing is driven by a fake clock
(a counter the probed function advances), so both runs see the same readings; the bootstrap and the
comparison take a seed drawn from the grading run's generator, so their intervals are reproducible."""
import numpy as np

from . import probe


class _FakeClock:
    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        return self.now

    def work(self, durations):
        seq = list(durations)

        def fn():
            self.now += seq[fn.calls % len(seq)]
            fn.calls += 1
        fn.calls = 0
        return fn


@probe("19.1", messages=True)
def calibrate(rng, rec):
    from tinytorch.perf.benchmark import calibrate as calibrate_

    for i in range(4):
        per_call = float(rng.uniform(1e-4, 5e-3))
        min_time = float(rng.uniform(1e-3, 0.05))
        clk = _FakeClock()
        fn = clk.work([per_call])
        rec.call(f"steady{i}", calibrate_, fn, clock=clk, min_time=min_time)
        rec[f"steady{i}_reads"] = clk.reads
        rec[f"steady{i}_calls"] = fn.calls
    clk = _FakeClock()
    fn = clk.work(list(rng.uniform(1e-4, 3e-3, 7)))  # calls of different lengths
    rec.call("varied", calibrate_, fn, clock=clk, min_time=0.02)
    rec["varied_reads"], rec["varied_calls"] = clk.reads, fn.calls
    clk = _FakeClock()
    rec.call("slow", calibrate_, clk.work([0.3]), clock=clk, min_time=0.2)
    clk = _FakeClock()
    fn = clk.work([0.0])
    rec.call("free", calibrate_, fn, clock=clk, min_time=0.1, max_number=int(rng.integers(50, 300)))
    rec["free_calls"] = fn.calls
    rec.call("bad_min_time", calibrate_, lambda: None, min_time=0)
    rec.call("bad_max_number", calibrate_, lambda: None, max_number=0)


@probe("19.2", messages=True)
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


def _fields(c):
    return [c.name_a, c.name_b, c.ratio, c.low, c.high, c.confidence, list(c.notes), c.verdict]


@probe("19.3", messages=True)
def compare(rng, rec):
    from tinytorch.perf.benchmark import BenchmarkResult, compare as compare_

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


@probe("19.4", messages=True)
def pareto(rng, rec):
    from tinytorch.perf.benchmark import pareto_front

    rec.call("random", pareto_front, rng.random((12, 3)))
    rec.call("ties", pareto_front, rng.integers(0, 3, (15, 2)))
    rec.call("duplicates", pareto_front, [[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [2.0, 2.0]])
    rec.call("one_objective", pareto_front, rng.integers(0, 5, (6, 1)).astype(np.float32))
    rec.call("single", pareto_front, [[3.0, 4.0]])
    rec.call("flat", pareto_front, [1.0, 2.0])
    rec.call("nan", pareto_front, [[1.0, np.nan], [0.0, 1.0]])
