"""The serving milestone (needs 01-20) run end to end with `--quick`: it trains the digits CNN and a GPT for a few
steps, serves both in process, drives them with the load generator and prints every measurement the target names,
a report line per condition and the plot; it must finish well within its 5 minutes. (Whether the goals are met
depends on the machine: the full run is what the README's milestone table reports.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tito import harness
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
    assert proc.returncode in (0, 1), text[-3000:]
    for words in ("throughput within p99 <= 100 ms", "Little's law", "refused with 503",
                  "every request got the same tokens under all three schedules and alone: True",
                  "target: in under 300 s", "saved plot"):
        assert words in text, f"the milestone's output lacks {words!r}:\n{text[-3000:]}"
    assert out.is_file() and (tmp_path / "serving_digits.npz").is_file()
