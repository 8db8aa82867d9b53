"""The docs name only commands and paths that exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tito.main import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "modules" / "README.md"]


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


def test_documented_paths_exist():
    text = (ROOT / "README.md").read_text()
    for path in re.findall(r"`((?:modules|tinytorch|tito|tests|milestones|quarto)/[\w./-]*)`", text):
        if "NN" in path or "<" in path:
            continue
        generated = path.rstrip("/") + "/" in (ROOT / ".gitignore").read_text().splitlines()
        assert (ROOT / path).exists() or generated, f"README.md names {path}, which does not exist"


def test_readme_quick_start_has_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(commands) == 2, commands
    assert (ROOT / ".ci" / "run").read_text().count("python3 -m tito.bootstrap test") == 1


def test_readme_module_table_matches_the_module_folders():
    """The README's table is a convenience copy: it must say what modules/*/module.toml says."""
    from tito.course import load_modules

    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d\d) \| ([^|]+) \| `([^`]+)` \| ([^|]+) \|$", text, re.M)
    modules = load_modules(ROOT)
    assert [r[0] for r in rows] == [m.number for m in modules], "README's module table lists other modules"
    for (number, title, package, prereqs), m in zip(rows, modules):
        assert title.strip() == m.title and package == m.package_module, f"README row {number} is stale"
        assert [p.strip() for p in prereqs.split(",") if p.strip() != "-"] == m.prerequisites, f"README row {number}"
