"""Module 19 (benchmarking): `tinytorch.perf.benchmark` against known distributions and the reference tools.

Timing statistics are checked with a fake clock (every reading known in advance), so no test here
depends on how busy the machine is: the timing stack's `calibrate` (`tinytorch.perf.measure`) reads
the same clock values as `timeit.Timer.autorange`, `benchmark`'s samples equal `timeit.Timer.repeat`'s
on the same fake clock, the median and CV of samples drawn from a lognormal distribution match the
distribution's, and the bootstrap interval of the median equals the percentile bootstrap written from
its definition (`tests/support/refs.py`), covers the true median about 95% of the time and agrees with
`scipy.stats.bootstrap(method="percentile")`. `compare` finds a 2x difference with an interval around 2
and no significant difference between two samples of one distribution (on real workloads too, where
the difference is 100x); `speed_verdict` equals the three-outcome definition of refs.py and the
milestone harness's `judge`. Noise warnings, errors, percentiles, throughput, interleaved rounds, the
Pareto front against the definition, BLAS thread pinning, and the result file's round trip and the
leaderboard's refusal of other workload versions (`tinytorch.perf.results`) are tested as well.
"""
from __future__ import annotations

import itertools
import json
import timeit

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinytorch.perf.benchmark import (MET, NOISY, NOT_MET, BenchmarkResult, Comparison, benchmark,
                                      benchmark_interleaved, bootstrap_median_ci, compare, pareto_front, speed_verdict,
                                      throughput)
from tinytorch.perf.measure import calibrate, machine_load, noise_warnings
from tinytorch.perf.results import (WORKLOAD, WORKLOAD_VERSION, format_leaderboard, machine_info, merge_leaderboard,
                                    read_results, result_row, write_results)
from tests.support import property_settings, refs

pytestmark = pytest.mark.module("19")


class FakeClock:
    """A clock that moves only when the benchmarked function says so."""

    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        return self.now

    def work(self, durations):
        """A function that takes the next of `durations` (a number: always that) each call."""
        it = itertools.cycle([durations]) if np.isscalar(durations) else iter(durations)

        def fn(*args):
            self.now += next(it)
        return fn


# ---------------------------------------------------------------- calibrate (the timing stack, given)

@property_settings(40)
@given(per_call=st.floats(1e-5, 0.5), min_time=st.floats(1e-4, 0.2))
def test_calibrate_reads_the_clock_as_timeit_autorange_does(per_call, min_time):
    sizes = [p * f for p in (10 ** e for e in range(9)) for f in (1, 2, 5)]
    assume(all(abs(n * per_call - min_time) > 1e-6 * min_time for n in sizes))  # no loop ends on the threshold
    clk, ref = FakeClock(), FakeClock()
    number, seconds = calibrate(clk.work(per_call), clock=clk, min_time=min_time)
    # timeit's autorange stops at 0.2 s; scale the reference by running it with calls scaled alike
    want_number, want_seconds = timeit.Timer(ref.work(per_call * 0.2 / min_time), timer=ref).autorange()
    assert number == want_number, f"{per_call:.3g} s per call, min_time {min_time:.3g}: timeit's sequence stops at {want_number}; got {number}"
    assert seconds == pytest.approx(number * per_call, rel=1e-9)
    assert seconds >= min_time * (1 - 1e-9) or number == 1
    assert clk.reads == ref.reads, f"the clock must be read twice per loop, as timeit does: {ref.reads} reads expected; got {clk.reads}"


def test_calibrate_sequence_max_number_and_errors():
    clk = FakeClock()
    assert calibrate(clk.work(0.003), clock=clk, min_time=0.01) == (5, pytest.approx(0.015))
    clk = FakeClock()
    got = calibrate(clk.work(0.125), clock=clk, min_time=0.25)  # exact in binary: 2 calls last exactly min_time
    assert got == (2, 0.25), f"a loop lasting exactly min_time is long enough (at least min_time, as timeit's >= 0.2); expected (2, 0.25), got {got}"
    clk = FakeClock()
    assert calibrate(clk.work(0.0), clock=clk, min_time=1.0, max_number=500)[0] == 500
    for bad in (0, -1.0, "1"):
        with pytest.raises(ValueError, match=r"calibrate: min_time must be a positive number of seconds; got"):
            calibrate(lambda: None, min_time=bad)
    with pytest.raises(ValueError, match="calibrate: max_number must be a positive int; got 0"):
        calibrate(lambda: None, max_number=0)


# ---------------------------------------------------------------- 19.2 benchmark, on a fake clock

@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_samples_equal_timeit_repeat_on_the_same_clock():
    durations = np.random.default_rng(0).lognormal(np.log(1e-3), 0.2, 10_000)
    clk, ref = FakeClock(), FakeClock()
    r = benchmark(clk.work(durations), warmup=3, number=7, repeats=12, clock=clk, check_machine=False, rng=0)
    ref_fn = ref.work(durations)
    for _ in range(3):
        ref_fn()
    want = np.array(timeit.Timer(ref_fn, timer=ref).repeat(repeat=12, number=7)) / 7
    np.testing.assert_allclose(r.samples, want, rtol=1e-9, err_msg="samples must be seconds per call of each loop")
    assert r.number == 7 and len(r.samples) == 12


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_statistics_match_a_known_distribution():
    mu, sigma = np.log(2e-3), 0.25
    durations = np.random.default_rng(1).lognormal(mu, sigma, 5000)
    clk = FakeClock()
    r = benchmark(clk.work(durations), warmup=0, number=1, repeats=2000, clock=clk, check_machine=False, rng=0)
    assert r.median == pytest.approx(np.exp(mu), rel=0.03), f"lognormal median is {np.exp(mu):.4g}; got {r.median:.4g}"
    assert r.mean == pytest.approx(np.exp(mu + sigma ** 2 / 2), rel=0.03)
    assert r.cv == pytest.approx(np.sqrt(np.exp(sigma ** 2) - 1), rel=0.08)
    assert r.ci[0] < np.exp(mu) < r.ci[1] and r.ci[1] - r.ci[0] < 0.05 * r.median
    p = r.percentiles()
    assert p["p50"] == pytest.approx(r.median)
    assert p["p95"] == pytest.approx(np.exp(mu + 1.6449 * sigma), rel=0.04)
    assert p["p99"] == pytest.approx(np.exp(mu + 2.3263 * sigma), rel=0.06)
    np.testing.assert_allclose([p["p95"], p["p99"]], np.percentile(r.samples, [95, 99]))


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_calibrates_when_number_is_not_given():
    clk = FakeClock()
    r = benchmark(clk.work(2e-4), min_time=0.01, repeats=5, clock=clk, check_machine=False)
    assert r.number == 50 and r.samples == pytest.approx((2e-4,) * 5)
    assert r.reliable and r.cv == pytest.approx(0.0, abs=1e-9) and r.ci == pytest.approx((2e-4, 2e-4))


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_passes_args_and_names_the_result():
    seen = []
    clk = FakeClock()
    work = clk.work(1e-3)
    r = benchmark(lambda a, b: (seen.append((a, b)), work()), 1, "x", number=2, repeats=3, warmup=1, clock=clk,
                  check_machine=False, name="pair")
    assert seen == [(1, "x")] * 7 and r.name == "pair"


def test_benchmark_errors_say_what_to_pass():
    with pytest.raises(ValueError, match=r"benchmark: repeats must be an int >= 2 .*; got 1"):
        benchmark(lambda: None, repeats=1)
    with pytest.raises(ValueError, match="benchmark: warmup must be an int >= 0; got -1"):
        benchmark(lambda: None, warmup=-1)
    with pytest.raises(ValueError, match=r"benchmark: number must be None \(calibrate\) or a positive int; got 0"):
        benchmark(lambda: None, number=0)
    with pytest.raises(ValueError, match="benchmark: threads must be None"):
        benchmark(lambda: None, threads=0)
    with pytest.raises(TypeError, match="benchmark: fn must be callable; got int"):
        benchmark(3)


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_pins_blas_threads_and_restores_them():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [p["num_threads"] for p in threadpoolctl.threadpool_info()]
    during = []
    benchmark(lambda: during.append([p["num_threads"] for p in threadpoolctl.threadpool_info()]), number=1, repeats=2,
              warmup=0, threads=1, check_machine=False)
    assert during and all(n == 1 for calls in during for n in calls), f"pinned to 1 thread, the pools had {during[0]}"
    assert [p["num_threads"] for p in threadpoolctl.threadpool_info()] == before, "the pools must be restored"


@pytest.mark.exercise("19.2", "benchmark")
def test_noise_is_reported_in_the_result():
    clk = FakeClock()
    r = benchmark(clk.work([1e-3, 3e-3] * 20), warmup=0, number=1, repeats=20, clock=clk, check_machine=False)
    assert not r.reliable and any(w.startswith("high variation: CV") for w in r.warnings), r.warnings
    assert "UNRELIABLE" in str(r) and "high variation" in str(r)
    quiet = {"load_average": 0.5, "cores": 4, "cpu_mhz": 2000.0}
    assert noise_warnings([1.0, 1.01, 0.99], quiet, quiet) == []
    busy = dict(quiet, load_average=6.5)
    assert noise_warnings([1.0, 1.01], quiet, busy) == ["machine busy: load average 6.50 above its 4 core(s)"]
    turbo = dict(quiet, cpu_mhz=2600.0)
    assert noise_warnings([1.0, 1.01], quiet, turbo) == ["CPU frequency changed during the run: 2000 -> 2600 MHz"]
    unknown = {"load_average": None, "cores": 4, "cpu_mhz": None}
    assert noise_warnings([1.0, 1.01], unknown, unknown) == [], "unreadable values are skipped, not guessed"
    reading = machine_load()
    assert set(reading) == {"load_average", "cores", "cpu_mhz"} and reading["cores"] >= 1


@pytest.mark.exercise("19.2", "benchmark")
def test_result_to_dict_round_trip_is_json():
    clk = FakeClock()
    r = benchmark(clk.work([1e-3, 2e-3, 1.5e-3] * 3), warmup=0, number=1, repeats=9, clock=clk, check_machine=False,
                  name="m")
    d = json.loads(json.dumps(r.to_dict()))
    back = BenchmarkResult.from_dict(d)
    assert back == r and d["median"] == r.median and d["cv"] == pytest.approx(r.cv)


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_reads_the_machine_around_the_run_and_uses_its_interval():
    clk = FakeClock()
    readings = []
    durations = np.random.default_rng(3).lognormal(np.log(1e-3), 0.4, 40)

    def load():
        readings.append(clk.now)
        return {"load_average": 0.5, "cores": 4, "cpu_mhz": None}
    import tinytorch.perf.benchmark as bm
    old = bm.machine_load
    bm.machine_load = load
    try:
        r = benchmark(clk.work(durations), warmup=2, number=1, repeats=16, clock=clk, rng=5, confidence=0.9,
                      n_resamples=300)   # 16 samples: resampled medians average two values, so intervals rarely tie
    finally:
        bm.machine_load = old
    assert readings == [0.0, pytest.approx(durations[:18].sum())], \
        f"one reading before the warm-up, one after the last sample; got {readings}"
    assert r.environment == {"before": load(), "after": load()} and r.confidence == 0.9
    assert r.ci == bootstrap_median_ci(r.samples, 0.9, 300, 5), "the interval is bootstrap_median_ci(samples, confidence, n_resamples, rng)"


@pytest.mark.exercise("19.2", "benchmark")
def test_benchmark_passes_max_cv_and_names_unnamed_runs_after_their_function():
    clk = FakeClock()
    varied = clk.work([1e-3, 1.5e-3, 2e-3, 2.5e-3] * 5)   # CV about 0.34
    assert benchmark(varied, number=1, repeats=8, warmup=0, clock=clk, check_machine=False, max_cv=0.5).warnings == (), \
        "max_cv=0.5: a CV of 0.34 is no warning"
    assert benchmark(varied, number=1, repeats=8, warmup=0, clock=clk, check_machine=False).warnings, \
        "the default max_cv (0.1): a CV of 0.34 is a warning"
    assert benchmark(np.sum, np.ones(3), number=1, repeats=2, warmup=0, check_machine=False).name == "sum", \
        "an unnamed run is named after its function"


def test_benchmark_interleaved_takes_turns_round_by_round():
    clk = FakeClock()
    order = []

    def fn(name, seconds):
        def f():
            order.append(name)
            clk.now += seconds
        return f
    runs = benchmark_interleaved({"a": fn("a", 1e-3), "b": fn("b", 3e-3), "c": fn("c", 2e-3)}, budget_s=1e-9,
                                 min_rounds=4, min_repeat_time=0.0, clock=clk, check_machine=False, rng=0)
    timed = order[3:]   # after one warm-up call each (min_repeat_time 0: one call per sample, no calibration)
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"], timed
    assert [len(r.samples) for r in runs.values()] == [4, 4, 4] and runs["b"].median == pytest.approx(3e-3)
    assert compare(runs["a"], runs["b"]).ratio == pytest.approx(3.0)


# ---------------------------------------------------------------- 19.1 bootstrap_median_ci

@pytest.mark.exercise("19.1", "bootstrap_median_ci")
@property_settings(30)
@given(n=st.integers(2, 60), seed=st.integers(0, 2 ** 16), conf=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_bootstrap_equals_its_definition(n, seed, conf):
    x = np.random.default_rng(seed).exponential(1.0, n)
    gen = np.random.default_rng(seed + 1)
    idx = gen.integers(0, n, size=(300, n))
    want = refs.bootstrap_percentile_interval(np.median, x[idx], conf)
    got = bootstrap_median_ci(x, confidence=conf, n_resamples=300, rng=seed + 1)
    assert isinstance(got, tuple) and all(type(v) is float for v in got)
    np.testing.assert_allclose(got, want, err_msg=f"n={n}, confidence {conf}")
    assert got[0] <= np.median(x) <= got[1]


@pytest.mark.exercise("19.1", "bootstrap_median_ci")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bootstrap_agrees_with_scipy(seed):
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(seed).lognormal(0.0, 0.5, 50)
    lo, hi = bootstrap_median_ci(x, n_resamples=9999, rng=seed)
    ref = stats.bootstrap((x,), np.median, n_resamples=9999, confidence_level=0.95, method="percentile",
                          random_state=np.random.default_rng(seed + 100)).confidence_interval
    gap = np.sort(x)[26] - np.sort(x)[23]  # the order statistics the endpoints move between
    assert abs(lo - ref.low) <= 2 * gap and abs(hi - ref.high) <= 2 * gap, \
        f"scipy.stats.bootstrap gives ({ref.low:.4f}, {ref.high:.4f}); got ({lo:.4f}, {hi:.4f})"


@pytest.mark.exercise("19.1", "bootstrap_median_ci")
def test_bootstrap_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    true_median = np.exp(0.0)  # lognormal(0, 0.5)
    hits = sum(lo <= true_median <= hi for lo, hi in
               (bootstrap_median_ci(rng.lognormal(0.0, 0.5, 40), n_resamples=1000, rng=k) for k in range(300)))
    assert 0.88 <= hits / 300 <= 0.995, f"a 95% interval covered the true median in {hits}/300 experiments"


@pytest.mark.exercise("19.1", "bootstrap_median_ci")
def test_bootstrap_errors():
    with pytest.raises(ValueError, match=r"bootstrap_median_ci: need at least 2 finite samples; got 1$"):
        bootstrap_median_ci([1.0])
    with pytest.raises(ValueError, match="need at least 2 finite samples; got an array of shape"):
        bootstrap_median_ci([1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match=r"confidence must be between 0 and 1 .*; got 95"):
        bootstrap_median_ci([1.0, 2.0], confidence=95)
    with pytest.raises(ValueError, match="n_resamples must be a positive int; got 0"):
        bootstrap_median_ci([1.0, 2.0], n_resamples=0)


# ---------------------------------------------------------------- 19.3 Comparison.verdict and compare

@pytest.mark.exercise("19.3", "compare")
@property_settings(25)
@given(speedup=st.floats(1.3, 20.0), seed=st.integers(0, 2 ** 16), na=st.integers(10, 40), nb=st.integers(10, 40))
def test_compare_finds_a_clear_difference_with_an_interval_around_it(speedup, seed, na, nb):
    g = np.random.default_rng(seed)
    a = 1e-3 * g.lognormal(0, 0.03, na)
    b = speedup * 1e-3 * g.lognormal(0, 0.03, nb)
    c = compare(a, b, rng=seed)
    assert isinstance(c, Comparison) and c.significant
    assert c.ratio == pytest.approx(np.median(b) / np.median(a))
    assert c.low < c.ratio < c.high and c.low > 1
    assert c.low < speedup * 1.06 and c.high > speedup / 1.06, f"true ratio {speedup:.3f}; interval ({c.low:.3f}, {c.high:.3f})"
    assert c.verdict.startswith(f"A is {c.ratio:.2f}x faster than B (95% CI {c.low:.2f}-{c.high:.2f})")
    back = compare(b, a, rng=seed)
    assert back.high < 1 and back.verdict.startswith(f"A is {1 / back.ratio:.2f}x slower than B")


@pytest.mark.exercise("19.3", "compare")
@property_settings(25)
@given(na=st.integers(2, 40), nb=st.integers(2, 40), seed=st.integers(0, 2 ** 16),
       conf=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_compare_interval_equals_its_definition(na, nb, seed, conf):
    g = np.random.default_rng(seed)
    a, b = g.exponential(1.0, na) + 0.1, g.exponential(2.0, nb) + 0.1
    gen = np.random.default_rng(seed + 1)
    ia = gen.integers(0, na, size=(300, na))  # a's indices first, then b's
    ib = gen.integers(0, nb, size=(300, nb))
    pairs = np.concatenate([b[ib], a[ia]], axis=1)   # each row: b's resample then a's
    want = refs.bootstrap_percentile_interval(lambda row: np.median(row[:nb]) / np.median(row[nb:]), pairs, conf)
    c = compare(a, b, confidence=conf, n_resamples=300, rng=seed + 1)
    assert all(type(v) is float for v in (c.ratio, c.low, c.high, c.confidence))
    assert np.allclose([c.low, c.high], want, rtol=1e-9, atol=0), (
        f"confidence {conf}, {na} and {nb} samples: expected (low, high) = ({want[0]:.6g}, {want[1]:.6g}), the "
        f"percentiles {50 * (1 - conf):g} and {50 * (1 + conf):g} of the resampled ratios (a's indices drawn first, "
        f"then b's); got ({c.low:.6g}, {c.high:.6g})")
    assert c.confidence == conf


@pytest.mark.exercise("19.3", "compare")
def test_compare_finds_no_difference_between_samples_of_one_distribution():
    g = np.random.default_rng(1)
    verdicts = [compare(g.lognormal(0, 0.2, 30), g.lognormal(0, 0.2, 30), rng=k) for k in range(60)]
    false_alarms = sum(c.significant for c in verdicts)
    assert false_alarms <= 9, f"{false_alarms}/60 comparisons of identical workloads claimed a difference"
    quiet = next(c for c in verdicts if not c.significant)
    assert quiet.verdict.startswith("no significant difference between A and B (ratio ")


def _timed(fn, name, number, repeats):
    """A BenchmarkResult from timeit's own loops (so that compare is tested on its own, whatever the
    state of calibrate and bootstrap_median_ci)."""
    samples = np.array(timeit.Timer(fn).repeat(repeat=repeats, number=number)) / number
    return BenchmarkResult(name, tuple(samples), number, (float(samples.min()), float(samples.max())))


@pytest.mark.exercise("19.3", "compare")
def test_compare_on_identical_and_different_fake_workloads():
    durations = np.random.default_rng(2).lognormal(np.log(1e-3), 0.1, 40)
    same1 = BenchmarkResult("same-1", tuple(durations), 1, (0.0, 0.0))
    same2 = BenchmarkResult("same-2", tuple(np.random.default_rng(3).permutation(durations)), 1, (0.0, 0.0))
    triple = BenchmarkResult("triple", tuple(3 * durations), 1, (0.0, 0.0))
    same = compare(same1, same2)
    assert not same.significant and same.ratio == pytest.approx(1.0), same.verdict
    clear = compare(same1, triple)
    assert clear.verdict.startswith("same-1 is 3.00x faster than triple (95% CI ") and clear.low < 3 < clear.high, \
        clear.verdict


@pytest.mark.exercise("19.3", "compare")
def test_compare_on_real_workloads():
    small, large = np.random.default_rng(0).random(200), np.random.default_rng(0).random(200_000)
    a = _timed(lambda: np.sort(small), "sort 200", 200, 10)
    b = _timed(lambda: np.sort(large), "sort 200k", 2, 10)
    c = compare(a, b)
    assert c.significant and c.ratio > 20 and c.verdict.startswith("sort 200 is "), c.verdict


@pytest.mark.exercise("19.3", "compare")
def test_compare_carries_noise_warnings_and_checks_input():
    a = BenchmarkResult("a", (1.0, 1.1, 0.9), 1, (0.9, 1.1), warnings=("machine busy: load average 9.00 above its 2 core(s)",))
    b = BenchmarkResult("b", (2.0, 2.1, 1.9), 1, (1.9, 2.1))
    c = compare(a, b)
    assert c.notes == ("machine busy: load average 9.00 above its 2 core(s)",) and "[unreliable: machine busy" in c.verdict
    noisy = BenchmarkResult("b", (2.0, 2.1, 1.9), 1, (1.9, 2.1), warnings=("high variation: CV 20.0% > 10% over 3 samples",
                                                                          "machine busy: load average 9.00 above its 2 core(s)"))
    assert compare(a, noisy).notes == ("machine busy: load average 9.00 above its 2 core(s)",
                                       "b: high variation: CV 20.0% > 10% over 3 samples"), "the machine's warning once"
    with pytest.raises(ValueError, match=r"compare: A needs at least 2 positive finite timings \(seconds\); got 1 value"):
        compare([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="compare: B needs at least 2 positive finite timings .*smallest -1"):
        compare([1.0, 2.0], [1.0, -1.0])


@pytest.mark.exercise("19.3", "Comparison.verdict")
@pytest.mark.parametrize("ratio, low, high, confidence, notes, says", [
    (2.0, 1.97, 2.03, 0.95, (), "A is 2.00x faster than B (95% CI 1.97-2.03)"),
    (0.8, 0.75, 0.85, 0.95, (), "A is 1.25x slower than B (95% CI 1.18-1.33)"),
    (0.98, 0.95, 1.02, 0.9, (), "no significant difference between A and B (ratio 0.98, 90% CI 0.95-1.02)"),
    (1.0, 0.99, 1.0, 0.95, (), "no significant difference between A and B (ratio 1.00, 95% CI 0.99-1.00)"),
    (1.01, 0.96, 1.04, 0.95, (), "no significant difference between A and B (ratio 1.01, 95% CI 0.96-1.04)"),
    (0.99, 0.97, 1.03, 0.95, (), "no significant difference between A and B (ratio 0.99, 95% CI 0.97-1.03)"),
    (3.0, 2.5, 3.5, 0.99, ("a: busy", "b: hot"), "A is 3.00x faster than B (99% CI 2.50-3.50) [unreliable: a: busy; b: hot]"),
])
def test_verdict_words_each_case(ratio, low, high, confidence, notes, says):
    c = Comparison("A", "B", ratio, low, high, confidence, notes)
    assert c.verdict == says and str(c) == says, f"expected {says!r}; got {c.verdict!r}"
    assert c.significant == (low > 1 or high < 1)


# ---------------------------------------------------------------- 19.4 speed_verdict

@pytest.mark.exercise("19.4", "speed_verdict")
@property_settings(60)
@given(a=st.floats(0.01, 10), b=st.floats(0.01, 10), target=st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]),
       at_least=st.booleans())
def test_speed_verdict_equals_the_three_outcome_definition_and_the_milestone_judge(a, b, target, at_least):
    import _harness as harness
    low, high = min(a, b), max(a, b)
    got, want = speed_verdict(low, high, target, at_least), refs.three_outcomes(low, high, target, at_least)
    assert got == want, (f"speed_verdict({low!r}, {high!r}, target={target}, at_least={at_least}) returned {got!r}; "
                         f"an interval {'at or above' if at_least else 'at or below'} the target throughout is met, one "
                         f"wholly on the other side is not met, one across it is too noisy to tell: {want!r}")
    assert {MET: harness.PASS, NOT_MET: harness.FAIL, NOISY: harness.NOISY}[got] == \
        harness.judge(harness.Interval(low, high), ">=" if at_least else "<=", target), "the milestone judges alike"
    assert speed_verdict(low, low, target, at_least) != NOISY, "a point value is never too noisy to tell"


@pytest.mark.exercise("19.4", "speed_verdict")
def test_speed_verdict_on_comparisons_and_errors():
    g = np.random.default_rng(0)
    c = compare(1e-3 * g.lognormal(0, 0.01, 30), 2.5e-3 * g.lognormal(0, 0.01, 30), rng=0)
    assert (c.judge(2.0), c.judge(3.0), c.judge(2.5)) == (MET, NOT_MET, NOISY), (c.low, c.high)
    assert c.judge(0.5, at_least=False) == NOT_MET and c.judge(3.0, at_least=False) == MET
    for low, high, target, at_least, want in ((0.4, 0.5, 0.5, False, MET), (0.5, 0.6, 0.5, False, NOISY),
                                              (2.0, 2.2, 2.0, True, MET), (1.8, 2.0, 2.0, True, NOISY)):
        assert speed_verdict(low, high, target, at_least) == want, \
            f"an interval ending exactly at the target ({low}, {high}, target {target}, at_least={at_least}): {want}"
    with pytest.raises(ValueError, match="speed_verdict: low must be <= high; got low=2.0, high=1.0"):
        speed_verdict(2.0, 1.0, 1.5)


# ---------------------------------------------------------------- throughput (given)

def test_throughput_rows_follow_a_known_cost_model():
    clk = FakeClock()
    fixed, per_item = 50e-6, 2e-6

    def model(x):
        clk.now += fixed + per_item * len(x)

    rows = throughput(model, np.zeros((300, 4)), (1, 10, 100, 300), number=3, repeats=4, warmup=0, clock=clk,
                      check_machine=False)
    for row in rows:
        b = row["batch"]
        assert row["median_s"] == pytest.approx(fixed + per_item * b)
        assert row["items_per_s"] == pytest.approx(b / (fixed + per_item * b))
    with pytest.raises(ValueError, match="throughput: batch size 301 must be an int between 1 and the 300 rows"):
        throughput(model, np.zeros((300, 4)), (301,), clock=clk)


# ---------------------------------------------------------------- 19.5 pareto_front

@pytest.mark.exercise("19.5", "pareto_front")
@property_settings(40)
@given(n=st.integers(1, 25), k=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_pareto_front_equals_brute_force(n, k, seed):
    pts = np.random.default_rng(seed).integers(0, 4, (n, k)).astype(float)  # small integers: many ties
    got = pareto_front(pts)
    want = [not d for d in refs.dominated(pts)]
    assert got.dtype == bool and got.shape == (n,)
    assert got.tolist() == want, f"costs\n{pts}\nexpected {want}; got {got.tolist()}"


@pytest.mark.exercise("19.5", "pareto_front")
def test_pareto_front_errors():
    with pytest.raises(ValueError, match=r"pareto_front: costs must be a 2-D \(models, objectives\) array of finite numbers; got shape \(3,\)"):
        pareto_front([1, 2, 3])
    with pytest.raises(ValueError, match="got non-finite values"):
        pareto_front([[1.0, np.nan]])


# ---------------------------------------------------------------- result files and the leaderboard

def _row(name, median, **extra):
    r = BenchmarkResult(name, (median, median * 1.01, median * 0.99), 10, (median * 0.99, median * 1.01))
    return result_row(r, **extra)


def test_result_file_round_trip_and_machine_record(tmp_path):
    machine = machine_info()
    for key in ("cpu_model", "cores_logical", "python", "blas", "packages", "git", "date"):
        assert key in machine, f"machine_info lacks {key}"
    assert machine["packages"]["numpy"] == np.__version__
    rows = [_row("fp32", 3e-5, accuracy=0.975, bytes=104488), _row("int8", 3e-4, accuracy=0.972, bytes=27984)]
    path = write_results(tmp_path / "me.json", rows, "me", machine=machine)
    doc = read_results(path)
    assert doc["workload"] == WORKLOAD and doc["workload_version"] == WORKLOAD_VERSION and doc["submitter"] == "me"
    assert doc["results"] == json.loads(json.dumps(rows)) and doc["machine"] == json.loads(json.dumps(machine))


def test_write_results_is_atomic(tmp_path, monkeypatch):
    import tinytorch.perf.results as bm

    m = {"cpu_model": "test cpu", "git": None}
    path = write_results(tmp_path / "me.json", [_row("fp32", 3e-5)], "me", machine=m)
    before = path.read_text()

    def crash(fd):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(bm.os, "fsync", crash)   # a crash half-way: the file must stay the old one
    with pytest.raises(OSError, match="simulated"):
        write_results(path, [_row("int8", 1e-5)], "me", machine=m)
    assert path.read_text() == before, "write_results changed the result file in place; write a temporary file and os.replace it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.json"], "write_results left a temporary file behind"
    monkeypatch.undo()
    write_results(path, [_row("int8", 1e-5)], "me", machine=m)
    assert read_results(path)["results"][0]["model"] == "int8"


def test_leaderboard_merges_sorts_and_refuses_another_workload_version(tmp_path):
    m = {"cpu_model": "test cpu", "git": {"commit": "abc", "dirty": False}}
    a = write_results(tmp_path / "a.json", [_row("fp32", 3e-5), _row("int8", 3e-4)], "ada", machine=m)
    b = write_results(tmp_path / "b.json", [_row("distilled", 1e-5)], "grace", machine=m)
    rows = merge_leaderboard([a, b])
    assert [(r["submitter"], r["model"]) for r in rows] == [("grace", "distilled"), ("ada", "fp32"), ("ada", "int8")]
    assert rows[0]["cpu"] == "test cpu" and rows[0]["commit"] == "abc"
    table = format_leaderboard(rows)
    assert "grace" in table and "10 us" in table and table.count("\n") == 4
    old = write_results(tmp_path / "old.json", [_row("fp32", 1e-6)], "linus", workload_version=WORKLOAD_VERSION + 1, machine=m)
    with pytest.raises(ValueError, match=rf"merge_leaderboard: .*old.json was measured on workload '{WORKLOAD}' version "
                                         rf"{WORKLOAD_VERSION + 1}, but this leaderboard is for '{WORKLOAD}' version {WORKLOAD_VERSION}"):
        merge_leaderboard([a, b, old])
    other = write_results(tmp_path / "other.json", [_row("gpt", 1e-3)], "x", workload="text-gpt", machine=m)
    with pytest.raises(ValueError, match="other.json was measured on workload 'text-gpt'"):
        merge_leaderboard([a, other])
    assert len(merge_leaderboard([old], workload_version=WORKLOAD_VERSION + 1)) == 1
    with pytest.raises(ValueError, match="old.json was measured"):
        merge_leaderboard([old], workload_version=WORKLOAD_VERSION)


def test_read_results_names_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        read_results(bad)
    bad.write_text(json.dumps({"schema": 1, "workload": "w"}))
    with pytest.raises(ValueError, match="is not a benchmark result file: missing 'workload_version', 'submitter'"):
        read_results(bad)
    bad.write_text(json.dumps({"schema": 99, "workload": "w", "workload_version": 1, "submitter": "s", "machine": {},
                               "results": []}))
    with pytest.raises(ValueError, match="has schema 99; this tinytorch reads schema 1"):
        read_results(bad)
    with pytest.raises(ValueError, match="merge_leaderboard: no result files given"):
        merge_leaderboard([])
