"""The trusted checks of a grading run run in helper processes (tito.trusted_helper), not in tito's own process.

Graded here in this process (`grading.autograde`) on the fallback sandbox (`none`: the student's code runs as this
user, so what it does at import is seen on this machine): a submission whose exported code, when imported, leaves a
marker file saying which process imported it.
"""
from __future__ import annotations

import configparser
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.simulated_class import make_class
from tito import grading, trusted
from tito.course import Settings, get_module
from tito.student import tracked_files

ROOT = Path(__file__).resolve().parents[1]
MARKER = '''
import os as _tito_test_os
_tito_test_marks = {marks!r}
if _tito_test_os.path.isdir(_tito_test_marks):
    with open(_tito_test_os.path.join(_tito_test_marks, str(_tito_test_os.getpid())), "w") as _f:
        _f.write(open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace"))
{extra}'''


def _course(tmp_path: Path) -> tuple[Settings, object]:
    dest = tmp_path / "course"
    for rel in tracked_files(ROOT):
        if rel.startswith((".git/", ".venv/", "nbgrader/")):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    ini = configparser.ConfigParser()
    ini.read(dest / "settings.ini")
    ini.set("grading", "sandbox", "none")
    ini.set("grading", "workers", "1")
    with open(dest / "settings.ini", "w") as f:
        ini.write(f)
    settings = Settings.load(dest)
    module = get_module(dest, "01")
    grading.generate(settings, module)
    return settings, module


def _collect(settings, module, tmp_path: Path, students: dict[str, str]) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for student, text in students.items():
        (inbox / f"{student}_{module.slug}.ipynb").write_text(text)
    grading.collect_folder(settings, module, inbox)


def _marked(module, marks: Path, extra: str = "") -> str:
    """The correct submission, with code at the end of an exported solution cell that leaves a marker in `marks`
    (the pid and command line of each process that imports the student's module) and then runs `extra`."""
    nb = nbformat.reads(next(iter(make_class(module, ["correct"]).values())), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and "#| export" in c.source)
    cell.source += "\n" + MARKER.format(marks=str(marks), extra=extra)
    return nbformat.writes(nb)


def _helper_pids(log: str) -> list[int]:
    import re

    return [int(p) for p in re.findall(r"trusted helper process (\d+)", log)]


def test_checks_run_in_a_helper_process_that_never_imports_student_code(tmp_path, monkeypatch):
    settings, module = _course(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    _collect(settings, module, tmp_path, {"marked": _marked(module, marks)})

    def in_this_process(*a, **k):
        raise AssertionError("the trusted checks ran in tito's own process")
    # a submission's checks, its oracle and its verdicts (not the run's reference records, made here before any
    # submission): the helper is another process, which never sees these
    for name in ("run", "verdicts"):
        monkeypatch.setattr(trusted.Plan, name, in_this_process)
    monkeypatch.setattr(trusted.Oracle, "answer", in_this_process)

    report = grading.autograde(settings, module)
    outcome = report.outcomes["marked"]
    log = grading.log_path(settings, module, "marked").read_text()
    assert outcome.status == "graded" and outcome.score == outcome.max_score > 0, (outcome, log)
    assert "Exercise 1.1: passed" in log, log
    helpers = _helper_pids(log)
    assert helpers and os.getpid() not in helpers, log

    seen = {int(p.name): p.read_text() for p in marks.iterdir()}
    # the student's module was imported (the kernel, the probe process): the marker works ...
    assert any("tito.probe_run" in cmd for cmd in seen.values()), seen
    # ... and never in a helper, nor in this process
    assert not [pid for pid, cmd in seen.items() if pid in helpers or pid == os.getpid() or "trusted_helper" in cmd], \
        (seen, helpers)
    assert not any(psutil.pid_exists(p) and "trusted_helper" in " ".join(psutil.Process(p).cmdline()) for p in helpers), \
        "a helper outlived its run"


def _kill_helpers(times: int, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL a helper of this process while it checks a submission (its probe process runs), `times` times."""
    me = psutil.Process()
    while not stop.is_set() and len(killed) < times:
        for p in me.children():
            try:
                if "tito.trusted_helper" in p.cmdline() and p.children() and p.pid not in killed:
                    p.send_signal(signal.SIGKILL)
                    killed.append(p.pid)
            except psutil.Error:
                pass
        time.sleep(0.05)


@pytest.mark.parametrize("kills", [1, 2])
def test_a_helper_killed_while_it_checks_is_started_again_once_then_the_submission_fails(tmp_path, kills):
    settings, module = _course(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    # its import takes a few seconds: the helper is killed while its probe process runs
    _collect(settings, module, tmp_path, {"slow": _marked(module, marks, "import time as _t\n_t.sleep(3)\n")})
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_helpers, args=(kills, stop, killed), daemon=True)
    watcher.start()
    try:
        report = grading.autograde(settings, module)
    finally:
        stop.set()
        watcher.join()
    outcome = report.outcomes["slow"]
    log = grading.log_path(settings, module, "slow").read_text()
    assert len(killed) == kills, (killed, log)
    assert f"the trusted helper process {killed[0]} was killed by signal SIGKILL while checking this submission" \
           in log, log
    if kills == 1:  # checked again in a fresh helper: scored as any other
        assert outcome.status == "graded" and outcome.score == outcome.max_score > 0, (outcome, log)
        assert "Exercise 1.1: passed" in log, log
    else:  # never scored without its checks
        assert outcome.status == "failed" and outcome.score == 0, (outcome, log)
        assert ("the trusted checks could not run: the trusted checker process was killed by signal SIGKILL; started "
                "again, it was killed by signal SIGKILL") in outcome.reason, outcome
        assert not (settings.nbgrader_root / "autograded" / "slow").exists()
    left = [p for p in psutil.Process().children(recursive=True) if "tito" in " ".join(p.cmdline())]
    assert not left, left
