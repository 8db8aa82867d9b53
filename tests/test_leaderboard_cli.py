"""`tito leaderboard`: result files written by `tinytorch.perf.results.write_results` merged into one ranked table,
written as JSON and Markdown; a file of another workload version, an invalid file or no file refused with exit code
2. The package's `leaderboard` does the work in a child process of the edition's Python: tito imports no
tinytorch (checked here by running the command with tinytorch made unimportable in tito's own process)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinytorch.perf.results import WORKLOAD, WORKLOAD_VERSION, write_results
from tito.main import app

pytestmark = pytest.mark.module("19")
ROOT = Path(__file__).resolve().parents[1]
MACHINE = {"cpu_model": "Test CPU", "git": {"commit": "abc123", "dirty": False}}


def row(model, median, batch=None, **metrics):
    r = {"model": model, "median_s": median, "ci_low_s": median * 0.9, "ci_high_s": median * 1.1, "warnings": [],
         **metrics}
    if batch is not None:
        r["batch"] = batch
    return r


def run(*args):
    result = CliRunner().invoke(app, ["leaderboard", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(autouse=True)
def _course_root(monkeypatch):
    monkeypatch.setenv("TITO_ROOT", str(ROOT))   # the module-19 package of this edition, whatever the cwd


@pytest.fixture
def results(tmp_path) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    write_results(d / "ada.json", [row("fp32", 3e-5, 1, accuracy=0.975, bytes=104488),
                                   row("fp32", 4e-4, 64, accuracy=0.975, bytes=104488)], "ada", machine=MACHINE)
    write_results(d / "grace.json", [row("distilled", 1e-5, 1, accuracy=0.97, bytes=18984),
                                     row("distilled", 2e-4, 64, accuracy=0.97, bytes=18984)], "grace", machine=MACHINE)
    write_results(d / "linus.json", [row("int8", 2e-5, 1, accuracy=0.96, bytes=27984),
                                     row("int8", 9e-4, 64, accuracy=0.96, bytes=27984)], "linus", machine=MACHINE)
    return d


def test_a_folder_is_merged_ranked_within_each_batch_and_written(results, tmp_path):
    out = tmp_path / "board" / "class"
    result = run(results, "--out", out)
    assert result.exit_code == 0, result.output
    board = json.loads((tmp_path / "board" / "class.json").read_text())
    assert board["workload"] == WORKLOAD and board["workload_version"] == WORKLOAD_VERSION
    assert sorted(Path(f).name for f in board["files"]) == ["ada.json", "grace.json", "linus.json"]
    ranking = [(r["batch"], r["rank"], r["submitter"]) for r in board["rows"]]
    assert ranking == [(1, 1, "grace"), (1, 2, "linus"), (1, 3, "ada"),
                       (64, 1, "grace"), (64, 2, "ada"), (64, 3, "linus")], ranking
    assert board["rows"][0]["median_s"] == 1e-5 and board["rows"][0]["commit"] == "abc123"
    md = (tmp_path / "board" / "class.md").read_text()
    assert "| 1 | grace | distilled | 1 | 10 us |" in md and "| 3 | linus | int8 | 64 | 900 us |" in md, md
    lines = result.output.splitlines()
    grace = next(i for i, ln in enumerate(lines) if "grace" in ln and "distilled" in ln)
    assert "linus" in lines[grace + 1] and "ada" in lines[grace + 2], result.output
    assert not [p for p in (tmp_path / "board").iterdir() if p.name.startswith(".")], "a temporary file was left"


def test_files_sort_option_and_a_rerun_into_the_results_folder(results):
    result = run(results / "ada.json", results / "linus.json", "--sort", "accuracy", "--descending")
    assert result.exit_code == 0, result.output
    board = json.loads((results / "leaderboard.json").read_text())
    assert [r["submitter"] for r in board["rows"] if r["batch"] == 1] == ["ada", "linus"]
    again = run(results)    # the leaderboard written into the folder is not read as a result file
    assert again.exit_code == 0, again.output
    assert len(json.loads((results / "leaderboard.json").read_text())["rows"]) == 6
    elsewhere = results.parent / "boards"
    elsewhere.mkdir()
    assert run(results / "ada.json", "--out", elsewhere).exit_code == 0   # a folder: FOLDER/leaderboard.json
    assert (elsewhere / "leaderboard.json").is_file() and (elsewhere / "leaderboard.md").is_file()


def test_another_workload_version_is_refused_naming_the_file(results):
    write_results(results / "old.json", [row("fp32", 1e-6, 1)], "mallory", workload_version=WORKLOAD_VERSION + 1,
                  machine=MACHINE)
    result = run(results)
    assert result.exit_code == 2, result.output
    assert "old.json" in result.output and f"version {WORKLOAD_VERSION + 1}" in result.output, result.output
    assert "--skip-bad" in result.output and "Traceback" not in result.output
    assert not (results / "leaderboard.json").exists(), "a refused merge must write nothing"
    result = run(results / "old.json", "--workload-version", WORKLOAD_VERSION + 1)   # its own leaderboard
    assert result.exit_code == 0 and "mallory" in result.output, result.output


def test_skip_bad_leaves_out_and_lists_what_it_could_not_merge(results):
    (results / "broken.json").write_text("{not json")
    write_results(results / "old.json", [row("fp32", 1e-6, 1)], "mallory", workload_version=WORKLOAD_VERSION + 1,
                  machine=MACHINE)
    result = run(results, "--skip-bad")
    assert result.exit_code == 1, result.output
    board = json.loads((results / "leaderboard.json").read_text())
    assert sorted(Path(s["file"]).name for s in board["skipped"]) == ["broken.json", "old.json"]
    assert "mallory" not in {r["submitter"] for r in board["rows"]} and len(board["rows"]) == 6
    assert "broken.json" in result.output and "old.json" in result.output
    assert "Left out" in (results / "leaderboard.md").read_text()


@pytest.mark.parametrize("content, says", [("{not json", "is not valid JSON"),
                                           ('{"schema": 1}', "is not a benchmark result file"),
                                           ("[1, 2]", "not a result file"),
                                           (b"\xff\xfe", "is not a text file")])
def test_an_invalid_file_is_refused_in_one_line(tmp_path, content, says):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = run(bad)
    assert result.exit_code == 2 and says in result.output and str(bad) in result.output.replace("\n", ""), result.output
    assert "Traceback" not in result.output


def test_no_files_or_a_missing_path_exit_2(tmp_path):
    result = run(tmp_path)
    assert result.exit_code == 2 and "no result files" in result.output and "--results" in result.output, result.output
    result = run(tmp_path / "nope.json")
    assert result.exit_code == 2 and "nope.json: no such file or folder" in result.output.replace("\n", ""), result.output


def test_a_sort_field_the_rows_lack_is_refused(results):
    result = run(results, "--sort", "p99_s")
    assert result.exit_code == 2 and "cannot sort by 'p99_s'" in result.output, result.output


def test_out_never_overwrites_a_file_it_did_not_write(results):
    before = (results / "ada.json").read_text()
    result = run(results, "--out", results / "ada")
    assert result.exit_code == 2 and "is not a leaderboard this command wrote" in result.output, result.output
    assert (results / "ada.json").read_text() == before


def test_tito_imports_no_tinytorch_and_an_edition_without_the_format_says_how_to_get_it(results, tmp_path,
                                                                                           monkeypatch):
    import shutil
    import sys

    for name in [n for n in sys.modules if n == "tinytorch" or n.startswith("tinytorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tinytorch", None)   # any import of tinytorch in tito's process fails
    result = run(results)
    assert result.exit_code == 0 and "grace" in result.output, result.output
    edition = tmp_path / "old-edition"
    shutil.copytree(ROOT / "tinytorch", edition / "tinytorch", ignore=shutil.ignore_patterns("__pycache__"))
    (edition / "tinytorch" / "perf" / "results.py").unlink()
    shutil.copy2(ROOT / "settings.ini", edition / "settings.ini")
    monkeypatch.setenv("TITO_ROOT", str(edition))
    result = run(results)
    assert result.exit_code == 2 and "regenerate it with `tito export`" in result.output, result.output
    assert "Traceback" not in result.output
