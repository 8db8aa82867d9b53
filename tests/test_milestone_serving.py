"""The serving milestone (needs 01-20) run end to end with `--quick`: it trains the digits CNN and a GPT for a few
steps, serves the classifier on 127.0.0.1 and drives it with the load generator in a child process, and prints every
measurement the target names, a report line per condition and the plot; it must finish well within its 5 minutes.
(Whether the goals are met depends on the machine: the full run is what the lab guide's measured page reports, `tito guide measure milestone`.)
Both ways of running a load (`served(app, "process")` and `"in-process"`) are checked on a small model in seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _harness as harness
from tito import milestones as ms
from tito.course import CourseError, get_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "milestones" / "serving.py"


def test_header_and_goal():
    m = ms.get(ROOT, "serving")
    assert m.script == SCRIPT and m.needs == tuple(f"{i:02d}" for i in range(1, 21)), m.needs
    target = harness.Target.from_goal(m.target, m.goal)
    assert target.max_seconds == 300 and [(c.op, c.threshold) for c in target.conditions] == [(">=", 1.0), (">=", 0.9)]


@pytest.mark.slow
def test_quick_run_reports_every_measurement(tmp_path):
    for n in ms.get(ROOT, "serving").needs:
        try:
            get_module(ROOT, n)
        except CourseError:
            pytest.skip(f"module {n} is not in this course yet")
    missing = ms.readiness(ROOT, ms.get(ROOT, "serving"))
    if missing:
        pytest.skip(ms.explain(ROOT, missing, "the serving milestone"))
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("TITO_ROOT", None)
    out = tmp_path / "serving.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, harness.NOISY_EXIT), text[-3000:]
    for words in ("throughput within p99 <= 100 ms", "Little's law", "the same over HTTP", "refused with 503",
                  "again at those rates, in turns", "p99 inside the app", "95% interval", " vs 3 x ", " vs 2 x ",
                  "every request got the same tokens under all four schedules and alone: True", "continuous / static batching:",
                  "target: in under 300 s", "saved plot"):
        assert words in text, f"the milestone's output lacks {words!r}:\n{text[-3000:]}"
    assert out.is_file() and (tmp_path / "serving_digits.npz").is_file()
    # the verdict reached the result record, and the exit code is the verdict's (a traceback also exits 1)
    assert "Traceback" not in text, text[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert proc.returncode == {harness.PASS: 0, harness.FAIL: 1, harness.NOISY: harness.NOISY_EXIT}[result["verdict"]], \
        (proc.returncode, result["verdict"])
    assert len(result["reached"]) == 2 and len(result["beats"]) == 3, result


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_milestone", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_capacity_is_bisected_between_grid_rates():
    from types import SimpleNamespace

    m = _script()
    ok, refused = SimpleNamespace(rejected=0.0), SimpleNamespace(rejected=0.1)
    # (rate, throughput, p50, p99, result): 200/s kept up, 400/s missed the 100 ms budget, 600/s fell behind
    grid = [(100, 99.0, 0.01, 0.02, ok), (200, 197.0, 0.01, 0.05, ok), (400, 330.0, 0.2, 0.9, ok),
            (600, 310.0, 0.5, 2.0, ok)]
    assert abs(m.refine_rate(grid, 0.1) - (200 * 400) ** 0.5) < 1e-9, "the geometric mean of 200 and 400 is next"
    assert m.capacity(grid, 0.1) == 197.0
    more = grid + [(283, 280.0, 0.01, 0.08, ok), (336, 300.0, 0.05, 0.3, ok)]
    assert abs(m.refine_rate(more, 0.1) - (283 * 336) ** 0.5) < 1e-9, "bisects between the new neighbours"
    assert m.capacity(more, 0.1) == 280.0
    assert m.refine_rate(more + [(308, 300.0, 0.01, 0.09, ok)], 0.1) is None, "stops within 15% (308 vs 336)"
    # a run that refused requests or fell behind its rate does not count as kept up, even within the budget
    assert m.refine_rate([(100, 99.0, 0.01, 0.02, refused), (200, 150.0, 0.01, 0.02, ok)], 0.1) is None
    assert m.capacity([(100, 99.0, 0.01, 0.02, refused), (200, 150.0, 0.01, 0.02, ok)], 0.1) == 0.0
    assert m.refine_rate([(100, 99.0, 0.01, 0.02, ok)], 0.1) is None, "nothing above the last good rate: no bisection"



@pytest.mark.parametrize("client", ["process", "in-process"])
def test_served_runs_a_bounded_load_either_way(client):
    "A small classifier served and driven both ways: every request answered, /metrics scraped for Little's law."
    import numpy as np

    pytest.importorskip("uvicorn")
    from tinytorch.serving.models import mlp_classifier
    from tinytorch.serving.server import create_app

    m = _script()
    app = create_app(classifier=mlp_classifier([64, 16, 10], rng=0), input_shape=(64,), max_batch_size=8,
                     max_queue=1000)
    with m.served(app, client) as load:
        r = load.run("/v1/classify", {"input": np.zeros(64).tolist()}, rate=200, n_requests=60, duration=0.3, seed=1)
    assert len(r.status) > 20 and (r.status == 200).all(), r.status
    assert (r.sent >= r.scheduled).all() and (r.done > r.sent).all()
    assert r.littles_law()["L"] > 0, "the server's /metrics was scraped before and after"


def test_load_process_refuses_other_hosts_and_function_bodies():
    from tinytorch.serving.loadgen import LoadProcess, RawHTTPClient

    with pytest.raises(ValueError, match="127.0.0.1"):
        LoadProcess("http://example.com:80")
    with pytest.raises(ValueError, match="127.0.0.1"):
        RawHTTPClient("http://10.0.0.1:8000")
    with LoadProcess("http://127.0.0.1:9") as load:     # nothing listens on port 9: every request fails (status 0)
        with pytest.raises(TypeError, match="JSON"):
            load.run("/v1/classify", lambda i, rng: {}, rate=10)
        r = load.run("/v1/classify", {"input": [0.0]}, rate=50, n_requests=5, duration=0.2, timeout=2)
        assert (r.status == 0).all() and r.area is None


def test_speed_targets_are_intervals_with_three_outcomes():
    """The milestone judges a speed-up as module 19 does: a bootstrap interval of the ratio of medians over interleaved
    repeats (`speedup`), met only when the whole interval beats the factor, too noisy when it straddles it; the line
    says both rates and the factor ("802.7/s vs 3 x 228.3/s")."""
    m = _script()
    clear, shown = m.speedup([800.0, 810.0, 790.0, 805.0], [228.0, 230.0, 226.0, 229.0], 3, "/s")
    assert harness.judge(clear, ">", 3.0) == harness.PASS and clear.low > 3.0, clear
    assert shown.startswith("802.5/s vs 3 x 228.5/s (3.51x, 95% interval"), shown
    # a busy spell that slows both runs of a pair cancels in their ratio
    paired, _ = m.speedup([800.0, 400.0, 790.0, 380.0], [228.0, 114.0, 226.0, 110.0], 3, "/s")
    assert harness.judge(paired, ">", 3.0) == harness.PASS, paired
    noisy, _ = m.speedup([700.0, 400.0, 800.0], [228.0, 230.0, 100.0], 3, "/s")
    assert harness.judge(noisy, ">", 3.0) == harness.NOISY, noisy
    slow, _ = m.speedup([300.0, 310.0, 305.0], [228.0, 230.0, 229.0], 3, "/s")
    assert harness.judge(slow, ">", 3.0) == harness.FAIL, slow
    # a server starved of CPU (the machine busy with other work) measured the machine: too noisy, whatever the ratio
    starved, says = m.starved_verdict(slow, "x", [0.09, 0.11, 0.13, 0.1], 3.0)
    assert harness.judge(starved, ">", 3.0) == harness.NOISY and "of a core" in says and "too noisy" in says, (starved, says)
    fed, says = m.starved_verdict(slow, "x", [0.8, 0.9, 0.7, 0.95], 3.0)
    assert fed == slow and harness.judge(fed, ">", 3.0) == harness.FAIL and "median 85% of a core" in says, says
    from types import SimpleNamespace

    import numpy as np

    r = SimpleNamespace(ok=np.array([True, True, True, False]), latency=np.array([0.05, 0.2, 0.09, 0.01]), elapsed=2.0)
    assert m.within_budget(r, 0.1) == 1.0, "two answers within 100 ms in 2 s (the refused one does not count)"
