"""The docs (the README, modules/README.md and the lab guide's pages) name only commands and paths that exist,
and the README stays the short front door it should be."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tito.main import app

ROOT = Path(__file__).resolve().parents[1]
GUIDE_PAGES = sorted((ROOT / "quarto" / "pages").glob("*.qmd")) + sorted((ROOT / "quarto" / "pages").glob("*.md"))
DOCS = [ROOT / "README.md", ROOT / "modules" / "README.md", *GUIDE_PAGES]
README_MAX_LINES = 200


def code_text(markdown: str) -> str:
    """The code of a markdown document: its fenced blocks and inline code spans (prose may say "tito starts the
    worker"; a command is what a reader would type)."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.S | re.M)
    return "\n".join(fenced + re.findall(r"`([^`\n]+)`", rest))


def tito_commands() -> set[tuple[str, ...]]:
    """Command paths (`module complete`, `nbgrader generate`...) of every `tito ...` command in the docs' code."""
    found = set()
    for doc in DOCS:
        for m in re.finditer(r"\btito ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", code_text(doc.read_text())):
            words = tuple(m.group(1).split())
            found.add(words)
    return found


@pytest.mark.parametrize("words", sorted(tito_commands()), ids=" ".join)
def test_documented_tito_command_exists(words):
    runner = CliRunner()
    result = runner.invoke(app, [*words, "--help"])
    if result.exit_code != 0 and len(words) == 2:  # "tito test 01"-style: second word is an argument
        result = runner.invoke(app, [words[0], "--help"])
    assert result.exit_code == 0, f"the docs mention `tito {' '.join(words)}`, which does not exist:\n{result.output}"


@pytest.mark.parametrize("doc", [ROOT / "README.md", *GUIDE_PAGES], ids=lambda p: p.name)
def test_documented_paths_exist(doc):
    text = doc.read_text()
    ignored = [ln.strip().rstrip("/") for ln in (ROOT / ".gitignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#") and "*" not in ln]
    for path in re.findall(r"`((?:modules|tinytorch|tito|tests|milestones|quarto)/[\w./-]*)`", text):
        if "NN" in path or "<" in path:
            continue
        generated = any(path.rstrip("/") == ig or path.startswith(ig + "/") for ig in ignored)
        assert (ROOT / path).exists() or generated, f"{doc.relative_to(ROOT)} names {path}, which does not exist"


def test_readme_is_a_short_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move the rest into the guide"
    links = re.findall(r"\]\((quarto/pages/[\w-]+\.qmd)\)", text)
    for page in ("setup", "modules", "milestones", "checking", "instructors", "measured"):
        assert f"quarto/pages/{page}.qmd" in links, f"README.md does not link the guide's {page} page"
    for link in links:
        assert (ROOT / link).is_file(), f"README.md links {link}, which does not exist"


def test_readme_quick_start_has_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(commands) == 2, commands
    assert (ROOT / ".ci" / "run").read_text().count("python3 -m tito.bootstrap test") == 1


def test_the_jobs_keep_bytecode_in_a_private_folder_outside_the_checkout(monkeypatch):
    """Both quick-start commands let their processes keep bytecode even where the machine sets
    PYTHONDONTWRITEBYTECODE (each `tito` command compiled tito again), in a folder only this user reads, outside
    the checkout (no copy of the course carries it, no sandbox sees the solutions' bytecode), removed at the end."""
    import stat
    import subprocess

    from tito import bootstrap

    seen = {}

    def run_job(job, argv, py, env):
        seen.update(env)
        folder = Path(env["PYTHONPYCACHEPREFIX"])
        out = subprocess.run([sys.executable, "-c", "import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)"],
                             env=env, capture_output=True, text=True, check=True).stdout.split()
        seen["child"] = out
        seen["mode"] = stat.S_IMODE(folder.stat().st_mode)

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(bootstrap, "setup", lambda job: Path(sys.executable))
    monkeypatch.setattr(bootstrap, "run_job", run_job)
    bootstrap.main(["test"])
    folder = Path(seen["PYTHONPYCACHEPREFIX"])
    assert "PYTHONDONTWRITEBYTECODE" not in seen, "the job's processes still may not write bytecode"
    assert seen["child"] == [str(folder), "False"], f"a child process of the job sees {seen['child']}"
    assert seen["mode"] == 0o700, f"the bytecode folder has mode {oct(seen['mode'])}, not 0o700"
    assert ROOT.resolve() not in folder.resolve().parents, f"the bytecode folder {folder} is inside the checkout"
    assert not folder.exists(), f"the bytecode folder {folder} is left behind after the job"
