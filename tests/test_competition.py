"""`tito compete` (module 17's kernel competition): submissions checked, timed and ranked in child
processes; bad ones (wrong result, exception, import error, infinite loop, segfault) reported, never
fatal to the run; the leaderboard written atomically and merged by submission name.

Small inputs (`quick_cases`) and short timeouts keep it fast; no assertion depends on a speed.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tito import competition as comp
from tito import sandbox
from tito.main import app

MATMUL = comp.TASKS["matmul"]
SANDBOXES = [m for m, available in (("bwrap", sandbox.bwrap_available), ("namespace", sandbox.namespace_available))
             if not available()]
SANDBOX = SANDBOXES[0] if SANDBOXES else "none"  # the sandbox `--sandbox auto` picks here
CASES = MATMUL.quick_cases  # a (16, 8) @ b (8, 12); a (33, 17) @ b (17, 5)
FIRST = "a (16, 8) @ b (8, 12)"

SUBMISSIONS = {
    "fast": "from _helper import mm\ndef matmul(a, b):\n    return mm(a, b)\n",  # a helper of its folder
    "_helper": "import numpy as np\ndef mm(a, b):\n    return np.matmul(a, b)\n",  # not a submission itself
    "rows": "import numpy as np\ndef matmul(a, b):\n    return np.stack([r @ b for r in a]).astype(np.float32)\n",
    "shape": "def matmul(a, b):\n    return (a @ b)[:, :1]\n",
    "values": "def matmul(a, b):\n    k = a.shape[1]\n    return a[:, :k - 1] @ b[:k - 1]\n",
    "inplace": "def matmul(a, b):\n    a *= 1\n    a[0, 0] += 1\n    return a[:, :1] @ b[:1]\n",
    "boom": "def matmul(a, b):\n    x = 1\n    return x / 0\n",
    "todo": "def matmul(a, b):\n    raise NotImplementedError\n",
    "importerr": "import tinytorch_no_such_module\n",
    "nofunc": "def matmul_v2(a, b):\n    return a @ b\n",
    "othertask": "def gelu_bias(x, bias):\n    return x + bias\n",  # a kernel of --task elementwise
    "exits": "import os\ndef matmul(a, b):\n    os._exit(3)\n",
    "tamper": "import json\ndef matmul(a, b):\n    open('../result_0.json', 'w').write('{')\n    return a @ b\n",
    "segv": "import ctypes\ndef matmul(a, b):\n    return ctypes.string_at(0)\n",
    # caches: what they computed once, returned for later calls (the inputs are the same objects every call)
    "idcache": "C = {}\ndef matmul(a, b):\n    key = (id(a), id(b))\n    if key not in C:\n        C[key] = a @ b\n"
               "    return C[key]\n",
    "samplecache": "C = {}\ndef matmul(a, b):\n    key = a[:2].tobytes() + b[:2].tobytes()  # a cheap sample of the contents\n"
                   "    if key not in C:\n        C[key] = a @ b\n    return C[key].copy()\n",
    # keyed by all of the contents: a hit would return a wrong result, so its acceptance says no two calls
    # saw the same inputs
    "hashcache": "import hashlib\nC = {}\ndef matmul(a, b):\n    key = hashlib.sha1(a.tobytes() + b.tobytes()).digest()\n"
                 "    if key in C:\n        return C[key] + 1\n    C[key] = a @ b\n    return C[key]\n",
    # one output buffer per shape, overwritten by every call: not a cache
    "reuse": "import numpy as np\nC = {}\ndef matmul(a, b):\n    out = C.setdefault((a.shape, b.shape), "
             "np.empty((a.shape[0], b.shape[1]), np.float32))\n    return np.matmul(a, b, out=out)\n",
}
ACCEPTED = {"fast", "rows", "hashcache", "reuse"}


def write(folder: Path, files: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        (folder / f"{name}.py").write_text(src)
    return folder


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """One run over every submission above (no baselines), into a fresh leaderboard."""
    folder = write(tmp_path_factory.mktemp("subs"), SUBMISSIONS)
    runner = comp.Runner(MATMUL, CASES, timeout=20, repeats=3)
    out = folder / "board.json"
    board, note, this_run = comp.competition(folder, MATMUL, runner, out, baselines=False)
    return {"board": board, "note": note, "out": out, "by": {e["name"]: e for e in board["entries"]}}


def reason(board, name):
    e = board["by"][name]
    assert e["status"] == "rejected", f"{name} was {e['status']}, expected rejected"
    return e["reason"]


def test_correct_submissions_are_ordered_by_total_median_time_and_a_quick_run_ranks_none(board):
    accepted = [e for e in board["board"]["entries"] if e["status"] == "accepted"]
    assert [e["name"] for e in accepted] == sorted(ACCEPTED, key=lambda n: board["by"][n]["total_s"])
    assert board["board"]["quick"] and [e["rank"] for e in accepted] == [None] * 4, (
        "a quick run (small inputs, where a call's overhead is most of its time) is ordered, not ranked")
    assert board["board"]["entries"][:4] == accepted  # first, then the rejected
    for e in accepted:
        assert e["complete"] and e["reason"] == ""
        assert [c["input"] for c in e["cases"]] == [MATMUL.describe(c) for c in CASES]
        assert all(c["median_s"] > 0 and c["repeats"] == 3 and c["calls_per_repeat"] >= 1 for c in e["cases"])
        assert all(len(c["times_s"]) == len(c["reference_times_s"]) == 3 for c in e["cases"]), (
            "each repeat of the entry is paired with one of the NumPy kernel, timed in turns in its process")
        assert e["total_s"] == pytest.approx(sum(c["median_s"] for c in e["cases"]))
        flops = sum(MATMUL.flops(c) for c in CASES)
        assert e["gflops"] == pytest.approx(flops / e["total_s"] / 1e9)
        low, high = e["speedup_interval"]  # measured against NumPy even without the baselines' entries
        assert 0 < low <= high and e["verdict"] in ("faster", "slower", "too noisy to tell")


def test_speed_verdicts_have_three_outcomes_from_paired_repeats():
    def entry(own, numpy_):
        return {"cases": [{"case": [1, 1, 1], "times_s": own, "reference_times_s": numpy_}]}
    steady = [1.0, 1.01, 0.99, 1.0, 1.02]
    faster = comp.speedup_interval(entry([0.5 * t for t in steady], steady))
    slower = comp.speedup_interval(entry([2.0 * t for t in steady], steady))
    noisy = comp.speedup_interval(entry([0.6, 1.5, 0.9, 1.3, 0.7], steady))
    assert faster[0] > 1.9 and comp.speed_verdict(faster) == "faster"
    assert slower[1] < 0.51 and comp.speed_verdict(slower) == "slower"
    assert noisy[0] < 1 < noisy[1] and comp.speed_verdict(noisy) == "too noisy to tell"
    assert comp.speedup_interval(entry([0.5, 0.5], [1.0, 1.0])) is None, "two repeats measure no spread"
    assert comp.speed_verdict(None).startswith("too noisy to tell (fewer than 3 repeats")
    # load that hits both in the same repeat cancels in the pairs: a machine twice as busy in repeat 3
    drift = comp.speedup_interval(entry([0.5, 0.5, 1.0, 0.5, 0.5], [1.0, 1.0, 2.0, 1.0, 1.0]))
    assert drift == pytest.approx((2.0, 2.0)) and comp.speed_verdict(drift) == "faster"
    e = {"speedup": 0.98, "speedup_interval": [0.8, 1.2], "verdict": "too noisy to tell"}
    assert comp.speedup_text(e) == "0.98x (0.8-1.2): too noisy to tell"


def test_wrong_shape_is_rejected_naming_the_input(board):
    assert reason(board, "shape") == f"returned shape (16, 1) for input {FIRST}; expected (16, 12)"


def test_wrong_values_are_rejected_with_the_max_error(board):
    r = reason(board, "values")
    assert r.startswith(f"wrong values for input {FIRST}: max abs error ")
    assert "elements outside the tolerance |error| <= 8e-05 + 0.0001 * |expected|" in r
    assert "at index (" in r and "expected" in r


def test_wrong_dtype_nan_and_non_arrays_are_rejected(board):
    case = CASES[0]
    inputs = MATMUL.inputs(case, 17)
    right = inputs[0] @ inputs[1]
    assert comp.check_result(MATMUL, case, inputs, right) == ""
    assert comp.check_result(MATMUL, case, inputs, right.astype(np.float64)).startswith(
        f"returned dtype float64 for input {FIRST}; expected float32")
    right[0, 0] = np.nan
    assert "max abs error inf at index (0, 0) (got nan" in comp.check_result(MATMUL, case, inputs, right)
    # what the worker reports for a result that is not an array (it returned a list)
    assert comp.check_result(MATMUL, case, inputs, {"type": "list"}) == (
        f"returned a list for input {FIRST}; expected a NumPy array, float32, shape (16, 12)")
    assert reason(board, "inplace").startswith(f"wrote into its input `a` for input {FIRST}: inputs are read-only")


def test_exceptions_and_import_errors_are_reported(board):
    assert reason(board, "boom") == f"raised ZeroDivisionError: division by zero at boom.py:3 for input {FIRST}"
    assert reason(board, "todo") == f"not implemented yet: raised NotImplementedError at todo.py:2 for input {FIRST}"
    assert reason(board, "importerr") == ("import failed: ModuleNotFoundError: No module named "
                                          "'tinytorch_no_such_module' at importerr.py:1")
    assert reason(board, "othertask") == ("import failed: LookupError: defines no function `matmul` (it defines: "
                                          "gelu_bias); `gelu_bias` is the function of another task: run it with "
                                          "--task elementwise")
    assert reason(board, "nofunc") == "import failed: LookupError: defines no function `matmul` (it defines: matmul_v2)"
    assert reason(board, "exits").startswith(f"the process exited with code 3 running on input {FIRST}")


def test_a_submission_that_overwrites_the_workers_files_is_rejected(board):
    assert reason(board, "tamper").startswith("its results could not be read (JSONDecodeError")


def test_a_segfault_is_reported_and_the_run_goes_on(board):
    assert reason(board, "segv") == ("the process was killed by SIGSEGV (a crash in native code: a bad pointer or "
                                     f"out-of-bounds access, e.g. through ctypes) running on input {FIRST}")
    assert len(board["by"]) == len(SUBMISSIONS) - 1  # every submission has its entry (_helper.py is none)


def test_a_kernel_returning_cached_results_while_timed_is_rejected(board):
    """The results phase runs each input once: a cache passes it. The timing phase changes one element of
    `a` before every call and checks results kept from it: a cache keyed by the ids of the inputs or by a
    sample of their contents returns a result for other inputs."""
    for name in ("idcache", "samplecache"):
        r = reason(board, name)
        assert r.startswith("returned a result for different inputs while being timed (a cache?): call "), r
        assert f"(the timing phase changes one element of `a` before every call): wrong values for input {FIRST}" in r
    # a cache keyed by all of the contents never hits (a hit would be rejected), a reused output buffer is no cache
    assert board["by"]["hashcache"]["status"] == board["by"]["reuse"]["status"] == "accepted"


@pytest.mark.parametrize("task", ["matmul", "elementwise"])
def test_timing_inputs_never_repeat_and_their_reference(task):
    t = comp.TASKS[task]
    case = t.quick_cases[0]
    inputs = t.inputs(case, 17)
    x = inputs[0]
    scale = comp.perturb_scale(x)
    assert 2 * np.abs(x).max() <= scale < 4 * np.abs(x).max()
    calls = [comp.perturbation(k, x.size, scale) for k in range(20000)]
    values = [v for _, v in calls]
    assert len(set(values)) == len(values)  # no two calls see the same inputs
    assert all(scale <= v < 2 * scale and np.float32(v) == v for v in values)  # exact in float32, no input's value
    assert {p for p, _ in calls} == set(range(x.size))  # every element is changed, by turns
    assert all(p != q for (p, _), (q, _) in zip(calls, calls[1:]))  # never the same element twice in a row
    assert comp.perturbation(1 << 23, x.size, scale)[1] == 2 * scale  # the next binade: still unique
    expected = t.reference(inputs)
    for k in (0, 1, 12345):
        changed, want = t.timing_reference(inputs, expected, k)
        p, v = comp.perturbation(k, x.size, scale)
        assert changed[0].reshape(-1)[p] == v and (np.delete(changed[0].reshape(-1), p) == np.delete(x.reshape(-1), p)).all()
        assert np.allclose(want, t.reference(changed), rtol=1e-12, atol=1e-12)
        assert comp.check_result(t, case, changed, t.reference(changed).astype(np.float32), want) == ""
        assert comp.check_result(t, case, changed, expected.astype(np.float32), want).startswith("wrong values")


def test_an_infinite_loop_is_killed_at_the_timeout(tmp_path):
    pidfile = tmp_path / "pid"
    src = f"import os\ndef matmul(a, b):\n    open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n    while True:\n        pass\n"
    write(tmp_path, {"spin": src})
    t0 = time.monotonic()
    entry = comp.Runner(MATMUL, CASES, timeout=1.5, sandbox="none").run("spin", tmp_path / "spin.py")
    assert time.monotonic() - t0 < 10
    assert entry["status"] == "rejected"
    assert entry["reason"] == f"too slow: stopped after the 1.5 s limit (--timeout) running on input {FIRST}"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(pid, 0)


def test_a_sandboxed_kernel_and_its_children_are_killed_at_the_timeout(tmp_path):
    """In bubblewrap the worker has its own PID namespace: killing bwrap ends everything it started."""
    marker = f"{time.time() % 1000:.6f}"  # `sleep MARKER`: a process of the submission to look for afterwards
    src = (f"import subprocess\ndef matmul(a, b):\n    subprocess.Popen(['sleep', '{marker}'])\n"
           "    while True:\n        pass\n")
    write(tmp_path, {"spin": src})
    entry = comp.Runner(MATMUL, CASES, timeout=1.5, sandbox=SANDBOX).run("spin", tmp_path / "spin.py")
    assert entry["reason"] == f"too slow: stopped after the 1.5 s limit (--timeout) running on input {FIRST}"
    time.sleep(0.2)
    import psutil

    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def test_the_timeout_covers_checking_and_timing_together(tmp_path):
    """Each phase alone (a 2 s import, then fast calls) fits in 3.5 s; both together do not."""
    write(tmp_path, {"slowimport": "import time\ntime.sleep(2.0)\ndef matmul(a, b):\n    return a @ b\n"})
    entry = comp.Runner(MATMUL, CASES[:1], timeout=3.5, repeats=1).run("slowimport", tmp_path / "slowimport.py")
    assert entry["status"] == "rejected" and entry["reason"].startswith("too slow: stopped after the 3.5 s limit")


def test_a_course_baseline_not_yet_exported_says_how_to_export(tmp_path):
    """A student before `tito export 17`: the baseline's import fails with a way out, a submission's without."""
    write(tmp_path, {"base": "from tinytorch.perf.no_such_module import blocked_matmul\n"})
    runner = comp.Runner(MATMUL, CASES[:1], timeout=20, repeats=1)
    assert runner.run("course", tmp_path / "base.py", "baseline")["reason"].endswith(
        "; complete module 17 and run `tito export 17`")
    assert "tito export" not in runner.run("mine", tmp_path / "base.py")["reason"]


def test_a_kernel_limited_to_small_inputs_is_listed_unranked(tmp_path):
    write(tmp_path, {"fast": SUBMISSIONS["fast"], "_helper": SUBMISSIONS["_helper"]})
    runner = comp.Runner(MATMUL, CASES, timeout=20, repeats=1)
    entry = runner.run("small only", tmp_path / "fast.py", "baseline", max_flops=MATMUL.flops(CASES[0]))
    assert entry["status"] == "accepted" and not entry["complete"] and len(entry["cases"]) == 1
    board = comp.rank({**comp.new_board(runner), "entries": [entry]})
    assert board["entries"][0]["rank"] is None
    assert comp.rows(board)[0][2] == "accepted (1 of 2 inputs: unranked)"


def test_check_result_tolerances():
    case = (4, 100, 3)
    inputs = MATMUL.inputs(case, 1)
    exact = (inputs[0].astype(np.float64) @ inputs[1]).astype(np.float32)
    assert comp.check_result(MATMUL, case, inputs, exact) == ""
    assert comp.check_result(MATMUL, case, inputs, exact + np.float32(0.0009)) == ""  # atol 1e-5 * k = 0.001
    assert "max abs error 0.002" in comp.check_result(MATMUL, case, inputs, exact + np.float32(0.002))
    # large results: the relative part (1e-4 * |expected|) decides, not the absolute one
    big = [inputs[0] * np.float32(100), inputs[1]]
    exact = (big[0].astype(np.float64) @ big[1]).astype(np.float32)
    assert comp.check_result(MATMUL, case, big, exact * np.float32(1 + 5e-5)) == ""
    assert "outside the tolerance" in comp.check_result(MATMUL, case, big, exact * np.float32(1 + 2e-4))
    # gelu_bias: |error| <= 1e-5 + 1e-4 * |expected|
    gelu = comp.TASKS["elementwise"]
    x, bias = np.array([[-20.0, 100.0]], np.float32), np.zeros(2, np.float32)  # gelu: about 0 and 100
    exact = gelu.reference([x, bias]).astype(np.float32)
    assert comp.check_result(gelu, (1, 2), [x, bias], exact + np.float32([0.9e-5, 0.009])) == ""
    assert "index (0, 0)" in comp.check_result(gelu, (1, 2), [x, bias], exact + np.float32([2e-5, 0]))
    assert "index (0, 1)" in comp.check_result(gelu, (1, 2), [x, bias], exact + np.float32([0, 0.02]))
    # the same inputs every time (fixed seed per shape), different ones per shape
    assert all(np.array_equal(x, y) for x, y in zip(inputs, MATMUL.inputs(case, 1)))
    assert MATMUL.inputs((5, 5, 5), 1)[0].shape == (5, 5)


# ------------------------------------------------------------------------------------------ leaderboard

def test_leaderboard_json_round_trip_and_markdown(board):
    on_disk = json.loads(board["out"].read_text())
    assert on_disk == board["board"]
    assert comp.load_board(board["out"]) == board["board"]
    assert on_disk["format"] == comp.FORMAT and on_disk["task"] == "matmul"
    assert set(on_disk["machine"]) >= {"cpu", "cores", "threads", "numpy"} and on_disk["machine"]["threads"] == 1
    md = board["out"].with_suffix(".md").read_text()
    assert "| - | fast | accepted |" in md and "| - | segv | rejected: the process was killed by SIGSEGV" in md
    assert "A quick run (small inputs" in md and "is not ranked" in md
    assert f"| submission | {FIRST} | a (33, 17) @ b (17, 5) |" in md  # the median per input
    assert md.count("| fast | ") == 2 and md.count("| segv | ") == 1  # both tables; only the timed in the second
    assert not [p for p in board["out"].parent.iterdir() if p.name.endswith(".tmp")]  # no temporary files left


def test_leaderboard_write_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "board.json"
    out.write_text('{"format": "tinytorch-leaderboard/1", "task": "matmul", "entries": []}')
    before = out.read_text()

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    from tito.progress import atomic_write_text

    with pytest.raises(OSError):
        atomic_write_text(out, "{ half")
    assert out.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["board.json"]


def _entry(name, total, kind="submission"):
    return {"name": name, "kind": kind, "status": "accepted", "complete": True, "total_s": total, "gflops": 1.0,
            "reason": "", "cases": [{"case": [16, 8, 12], "median_s": total}], "measured": "then"}


def test_rerunning_merges_by_submission_name():
    runner = comp.Runner(MATMUL, CASES[:1], env={"X": "1"})
    old = comp.rank({**comp.new_board(runner), "entries": [_entry("alice", 3.0), _entry("bob", 2.0),
                                                           _entry("numpy (reference)", 1.0, "reference")]})
    new = {**comp.new_board(runner), "entries": [_entry("alice", 0.5)]}
    board, note = comp.merge(json.loads(json.dumps(old)), new)
    assert note == ""
    assert [(e["name"], e["rank"], e["total_s"]) for e in board["entries"]] == [
        ("alice", 1, 0.5), ("numpy (reference)", 2, 1.0), ("bob", 3, 2.0)]
    assert board["entries"][0]["speedup"] == pytest.approx(2.0)
    # measured elsewhere: the old entries are dropped, and the run says why
    other = json.loads(json.dumps(old))
    other["machine"]["cpu"] = "another CPU"
    board, note = comp.merge(other, {**comp.new_board(runner), "entries": [_entry("alice", 0.5)]})
    assert [e["name"] for e in board["entries"]] == ["alice"]
    assert note.startswith("earlier entries were dropped: cpu was 'another CPU'")
    # another thread count, NumPy version, core count or input list: dropped too
    for key, value in (("threads", 4), ("numpy", "0.0"), ("cores", 999)):
        other = json.loads(json.dumps(old))
        other["machine"][key] = value
        board, note = comp.merge(other, {**comp.new_board(runner), "entries": [_entry("alice", 0.5)]})
        assert [e["name"] for e in board["entries"]] == ["alice"] and note.startswith(f"earlier entries were dropped: {key} was")
    other = {**json.loads(json.dumps(old)), "cases": [MATMUL.describe(c) for c in MATMUL.cases]}
    board, note = comp.merge(other, {**comp.new_board(runner), "entries": [_entry("alice", 0.5)]})
    assert [e["name"] for e in board["entries"]] == ["alice"] and "measured on other inputs" in note
    with pytest.raises(comp.CourseError, match="holds task 'elementwise', not 'matmul'"):
        comp.merge({**old, "task": "elementwise"}, new)


# ------------------------------------------------------------------------------------------------- CLI

def test_cli_examples_run_with_baselines(tmp_path):
    cli = CliRunner()
    result = cli.invoke(app, ["compete", "example", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.py", "wrong.py"]
    out = tmp_path / "lb.json"
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--quick", "--out", str(out), "--repeats", "1",
                              "--timeout", "30"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output  # `wrong` was rejected
    assert "rejected wrong: wrong values for input a (16, 8) @ b (8, 12): max abs error" in result.output
    by = {e["name"]: e for e in json.loads(out.read_text())["entries"]}
    assert by["rows"]["status"] == "accepted" and by["rows"]["rank"] is None  # --quick: not ranked
    assert by["numpy (reference)"]["speedup"] == pytest.approx(1.0)
    assert "this quick run (small inputs" in result.output and "is not a ranking" in result.output
    assert by["course: blocked_matmul"]["status"] == "accepted" and by["course: naive_matmul"]["complete"]
    assert out.with_suffix(".md").exists()
    (tmp_path / "wrong.py").unlink()  # only correct submissions now: exit code 0, merged into the same board
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--quick", "--out", str(out), "--repeats", "1",
                              "--no-baselines"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    names = [e["name"] for e in json.loads(out.read_text())["entries"]]
    assert "numpy (reference)" in names and "wrong" in names  # kept from the first run


def test_cli_elementwise_task(tmp_path):
    cli = CliRunner()
    assert cli.invoke(app, ["compete", "example", str(tmp_path), "--task", "elementwise"]).exit_code == 0
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--task", "elementwise", "--quick", "--repeats", "1",
                              "--no-baselines"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    board = json.loads((tmp_path / "leaderboard-elementwise.json").read_text())
    by = {e["name"]: e for e in board["entries"]}
    assert board["entries"][0]["name"] == "inplace" and by["inplace"]["status"] == "accepted"
    assert by["wrong"]["reason"].startswith("wrong values for input x (8, 16), bias (16,): max abs error")


def test_cli_usage_errors(tmp_path):
    cli = CliRunner()
    result = cli.invoke(app, ["compete", "run", str(tmp_path)])
    assert result.exit_code == 2 and "holds no submissions (NAME.py files)" in result.output
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--task", "conv"])
    assert result.exit_code == 2 and "no competition task 'conv'; the tasks are: matmul, elementwise" in result.output
    (tmp_path / "leaderboard-matmul.json").write_text("not json")
    write(tmp_path, {"rows": SUBMISSIONS["rows"]})
    result = cli.invoke(app, ["compete", "run", str(tmp_path)])
    assert result.exit_code == 2 and "is not a leaderboard JSON file" in result.output
    result = cli.invoke(app, ["compete", "example", str(tmp_path)])  # rows.py exists
    assert result.exit_code == 2 and "rows.py exists; pass --force to overwrite it" in result.output
    assert cli.invoke(app, ["compete", "example", str(tmp_path), "--force"]).exit_code == 0
    assert cli.invoke(app, ["compete", "tasks"]).exit_code == 0


# ---------------------------------------------------------------------------------------------- sandbox

ESCAPES = {  # each does, at import, what a sandbox must prevent; a correct kernel if it could
    "write_outside": "from pathlib import Path\nPath({outside!r}).write_text('x')\n",
    "write_own_folder": "from pathlib import Path\nPath(__file__).with_name('x.txt').write_text('x')\n",
    "read_home": "from pathlib import Path\nPath({secret!r}).read_text()\n",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n",
}
KERNEL = "def matmul(a, b):\n    return a @ b\n"


@pytest.fixture
def escapes(tmp_path):
    """The ESCAPES submissions in a folder any user can read (the namespace sandbox's user must reach it),
    a secret file in the home folder, a listening socket on the host."""
    import socket
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="tito-escapes-"))
    outside = Path(tempfile.mkdtemp(prefix="tito-outside-"))
    for d in (folder, outside):
        d.chmod(0o777 if d == outside else 0o755)  # writable by the sandbox's user: only the sandbox may stop it
    secret = tempfile.NamedTemporaryFile("w", dir=Path.home(), prefix=".tito-compete-secret-", delete=False)
    secret.write("secret")
    secret.close()
    os.chmod(secret.name, 0o644)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    fmt = {"outside": str(outside / "escaped.txt"), "secret": secret.name, "port": listener.getsockname()[1]}
    write(folder, {name: src.format(**fmt) + KERNEL for name, src in ESCAPES.items()})
    try:
        yield {"folder": folder, "outside": outside, "listener": listener}
    finally:
        listener.close()
        os.unlink(secret.name)
        import shutil

        shutil.rmtree(folder)
        shutil.rmtree(outside)


def _connections(listener) -> int:
    n = 0
    while True:
        try:
            listener.accept()[0].close()
            n += 1
        except BlockingIOError:
            return n


@pytest.mark.parametrize("mode", ["bwrap", "namespace"])
def test_a_sandboxed_submission_cannot_write_outside_read_home_or_connect(mode, escapes):
    if mode not in SANDBOXES:
        pytest.skip(f"sandbox {mode} is not available here")
    runner = comp.Runner(MATMUL, CASES[:1], timeout=20, repeats=1, sandbox=mode)
    board, _, _ = comp.competition(escapes["folder"], MATMUL, runner, escapes["folder"] / "lb.json", baselines=False)
    by = {e["name"]: e["reason"] for e in board["entries"]}
    if mode == "namespace":  # the documented gap: it may write where any user may (a mode 777 folder here)
        assert by.pop("write_outside") == ""  # accepted: its write went through
    assert all(by.values()), by  # a reason: rejected
    if mode == "bwrap":  # it sees nothing of the host but what is bound: the rest does not exist for it
        assert by["write_outside"].startswith("import failed: FileNotFoundError: [Errno 2] No such file or directory")
        assert by["read_home"].startswith("import failed: FileNotFoundError: [Errno 2] No such file or directory")
        assert by["write_own_folder"].startswith(("import failed: OSError: [Errno 30] Read-only file system",
                                                  "import failed: PermissionError: [Errno 13] Permission denied"))
    else:  # the home folder is hidden (an empty mount); the rest of the file system is there, and the sandbox's
        # user may not write into folders it does not own
        assert by["read_home"].startswith(("import failed: FileNotFoundError", "import failed: PermissionError"))
        assert by["write_own_folder"].startswith("import failed: PermissionError: [Errno 13] Permission denied")
    assert by["network"].startswith(("import failed: ConnectionRefusedError",
                                     "import failed: OSError: [Errno 101] Network is unreachable"))
    assert not (escapes["folder"] / "x.txt").exists() and _connections(escapes["listener"]) == 0
    if mode == "bwrap":
        assert not (escapes["outside"] / "escaped.txt").exists()


def test_without_a_sandbox_the_same_submissions_succeed(escapes):
    """--sandbox none: the limits only, so each escape works (what the test above shows the sandboxes stop)."""
    runner = comp.Runner(MATMUL, CASES[:1], timeout=20, repeats=1, min_repeat_time=0.001, sandbox="none")
    board, _, _ = comp.competition(escapes["folder"], MATMUL, runner, escapes["folder"] / "lb.json", baselines=False)
    assert {e["name"]: e["status"] for e in board["entries"]} == {name: "accepted" for name in ESCAPES}, board["entries"]
    assert (escapes["outside"] / "escaped.txt").exists() and (escapes["folder"] / "x.txt").exists()
    assert _connections(escapes["listener"]) >= 1


@pytest.mark.skipif("bwrap" not in SANDBOXES, reason="bubblewrap is not available here")
def test_bwrap_runs_a_file_only_its_owner_can_read(tmp_path):
    """As root the worker runs as an unused user id: it is shown a readable copy of the folder at the same path."""
    write(tmp_path, {"private": SUBMISSIONS["fast"], "_helper": SUBMISSIONS["_helper"]})
    (tmp_path / "private.py").chmod(0o600)
    tmp_path.chmod(0o700)
    entry = comp.Runner(MATMUL, CASES[:1], repeats=1, sandbox="bwrap").run("private", tmp_path / "private.py")
    assert entry["status"] == "accepted", entry["reason"]


@pytest.mark.skipif("namespace" not in SANDBOXES, reason="the namespace sandbox is not available here")
def test_a_file_the_namespace_sandbox_user_cannot_read_is_rejected_with_the_fix(tmp_path):
    write(tmp_path, {"private": SUBMISSIONS["rows"]})
    (tmp_path / "private.py").chmod(0o600)
    entry = comp.Runner(MATMUL, CASES[:1], sandbox="namespace").run("private", tmp_path / "private.py")
    blocked = next(p for p in reversed(tmp_path.parents) if not p.stat().st_mode & 0o001)  # pytest's are mode 700
    # the uid is the run's lease: UID_BASE, or one above it while another run (a test beside this one) holds that
    uid = re.fullmatch(r"the sandbox's user \(uid (\d+)\) cannot read it: .*", entry["reason"] or "")
    assert uid and int(uid[1]) >= sandbox.UID_BASE, entry["reason"]
    assert entry["reason"] == (f"the sandbox's user (uid {uid[1]}) cannot read it: its folder {blocked} is not "
                               f"readable by other users; `chmod a+r {tmp_path / 'private.py'}` (and a+x on its folders), "
                               "or run with --sandbox none")


def test_sandbox_choice_fallback_and_errors(tmp_path, monkeypatch):
    cli = CliRunner()
    write(tmp_path, {"rows": SUBMISSIONS["rows"]})
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: "bubblewrap is not installed (`apt-get install bubblewrap`)")
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--sandbox", "bwrap"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and ("--sandbox bwrap cannot be used: bubblewrap is not installed "
                                      "(`apt-get install bubblewrap`)") in result.output
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--sandbox", "docker"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--sandbox 'docker' must be one of auto, bwrap, namespace, none" in result.output
    monkeypatch.setattr(sandbox, "namespace_available", lambda: "tito is not running as root")
    box = comp.make_box("auto", 1 << 30)
    assert box.mode == "none" and box.notes == ["no sandbox (bwrap not used: bubblewrap is not installed (`apt-get install "
                                                "bubblewrap`); namespace not used: tito is not running as root); student "
                                                "code runs with your permissions"]
    result = cli.invoke(app, ["compete", "run", str(tmp_path), "--quick", "--repeats", "1", "--no-baselines"],
                        env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "warning: sandbox none: submissions run as you, with the limits only" in result.output
    assert "bwrap not used: bubblewrap is not installed" in result.output


@pytest.mark.skipif("bwrap" not in SANDBOXES, reason="bubblewrap is not available here")
def test_a_sandbox_that_does_not_start_says_why_in_one_line(tmp_path, monkeypatch):
    write(tmp_path, {"rows": SUBMISSIONS["rows"]})
    real = sandbox.Sandbox.bwrap_args
    monkeypatch.setattr(sandbox.Sandbox, "bwrap_args", lambda self, *a, **k: [*real(self, *a, **k), "--no-such-option"])
    with pytest.raises(comp.CourseError) as e:
        comp.competition(tmp_path, MATMUL, comp.Runner(MATMUL, CASES, sandbox="bwrap"), tmp_path / "lb.json",
                         baselines=False)
    assert str(e.value) == ("sandbox bwrap: the competition worker does not start (bwrap: Unknown option "
                            "--no-such-option); run with --sandbox none to see whether the sandbox is the cause")
