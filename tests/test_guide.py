"""Checks for the lab guide in quarto/: the book config, the chapter script and the glossary.

Quarto itself is not needed: these tests check what Quarto would be given.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tito import notebooks as nbs
from tito.course import load_modules

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "quarto"
CONFIG = GUIDE / "_quarto.yml"
SCRIPT = GUIDE / "make_chapters.py"
GLOSSARY = GUIDE / "glossary.qmd"
MODULES = load_modules(ROOT)
BUILD = "python quarto/make_chapters.py && quarto render quarto"
BEGIN_MARK, END_MARK = "# BEGIN MODULE CHAPTERS", "# END MODULE CHAPTERS"

COURSE_TERMS = [  # what modules 01-05 teach
    "tensor", "dtype", "stride", "view", "contiguous", "broadcasting", "cache-line", "flop",
    "arithmetic-intensity", "matmul", "activation-function", "numerical-stability", "log-sum-exp",
    "softmax", "loss", "cross-entropy", "parameter", "xavier-kaiming-init", "dropout", "batch",
    "data-loader", "throughput",
]
COMPILATION_TERMS = ["bytecode", "machine-code", "ir", "eager-vs-graph-execution", "jit-vs-aot", "kernel"]

TERM_RE = re.compile(r"^## (?P<term>.+?) \{#(?P<slug>[a-z0-9-]+)\}\s*$")
CENTRAL_RE = re.compile(r"^\*Central in:\* (?P<link>\[)?Module (?P<num>\d{2}) \((?P<name>[a-z0-9_]+)\)"
                        r"(?:\]\((?P<target>[^)]+)\))?\s*$")


# ---------------------------------------------------------------- _quarto.yml


def chapter_entries(text: str) -> list[str]:
    """The lines between the marker comments of a _quarto.yml text."""
    lines = text.splitlines()
    begin = [i for i, ln in enumerate(lines) if ln.strip().startswith(BEGIN_MARK)]
    end = [i for i, ln in enumerate(lines) if ln.strip().startswith(END_MARK)]
    assert len(begin) == 1 and len(end) == 1 and begin[0] < end[0], (
        f"_quarto.yml must hold `{BEGIN_MARK}` once, followed by `{END_MARK}` once; "
        f"found them at lines {[i + 1 for i in begin]} and {[i + 1 for i in end]}")
    return [ln.strip() for ln in lines[begin[0] + 1:end[0]]]


def test_config_structure():
    text = CONFIG.read_text(encoding="utf-8")
    for needed in ("type: book", 'title: "TinyTorch lab guide"', "output-dir: _book", "- index.qmd",
                   "- glossary.qmd"):
        assert needed in text, f"quarto/_quarto.yml lacks `{needed}`"
    assert text.index("- index.qmd") < text.index(BEGIN_MARK) < text.index("- glossary.qmd"), (
        "quarto/_quarto.yml: expected the chapters in the order index.qmd, the module chapters, glossary.qmd")
    slugs = {m.slug for m in MODULES}
    for entry in chapter_entries(text):
        m = re.fullmatch(r"- chapters/(\d{2}_[a-z0-9_]+)\.ipynb(\s+#.*)?", entry)
        assert m, f"quarto/_quarto.yml: chapter entry {entry!r} is not `- chapters/NN_name.ipynb`"
        assert m.group(1) in slugs, (f"quarto/_quarto.yml lists {m.group(1)}, which is not a module folder; "
                                     "run `python quarto/make_chapters.py`")


def test_config_parses():
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert cfg["project"]["type"] == "book", f"project.type is {cfg['project'].get('type')!r}, expected 'book'"
    assert cfg["project"]["output-dir"] == "_book"
    chapters = cfg["book"]["chapters"]
    assert chapters[0] == "index.qmd" and chapters[-1] == "glossary.qmd", f"book.chapters is {chapters}"
    for ch in chapters[1:-1]:
        assert re.fullmatch(r"chapters/\d{2}_[a-z0-9_]+\.ipynb", ch), f"unexpected chapter {ch!r}"


def test_build_command_is_documented():
    for path in (GUIDE / "index.qmd", SCRIPT):
        assert "python quarto/make_chapters.py" in path.read_text(encoding="utf-8"), (
            f"{path.relative_to(ROOT)} should tell how to build the guide: `{BUILD}`")
    assert BUILD in (GUIDE / "index.qmd").read_text(encoding="utf-8")


# ---------------------------------------------------------------- make_chapters.py


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """make_chapters.py run into a temporary book: (book folder, chapters folder, completed process)."""
    book = tmp_path_factory.mktemp("book")
    shutil.copy2(CONFIG, book / "_quarto.yml")
    out = book / "chapters"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--config", str(book / "_quarto.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"make_chapters.py failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return book, out, proc


def test_one_chapter_per_module(built):
    book, out, _ = built
    written = sorted(p.name for p in out.iterdir())
    expected = sorted(f"{m.slug}.ipynb" for m in MODULES)
    assert written == expected, f"make_chapters.py wrote {written}, expected one chapter per module: {expected}"
    entries = chapter_entries((book / "_quarto.yml").read_text(encoding="utf-8"))
    listed = [e.split()[1] for e in entries]
    assert listed == [f"chapters/{m.slug}.ipynb" for m in MODULES], (
        f"the rewritten chapter list is {listed}, expected the modules in number order")


def test_written_config_parses(built):
    yaml = pytest.importorskip("yaml")
    book, _, _ = built
    chapters = yaml.safe_load((book / "_quarto.yml").read_text(encoding="utf-8"))["book"]["chapters"]
    assert chapters == ["index.qmd", *[f"chapters/{m.slug}.ipynb" for m in MODULES], "glossary.qmd"]


@pytest.mark.parametrize("module", MODULES, ids=[m.slug for m in MODULES])
def test_chapter_has_no_solutions(built, module):
    _, out, _ = built
    chapter = nbs.read(out / f"{module.slug}.ipynb")
    text = "\n".join(c.source for c in chapter.cells)
    for marker in (nbs.BEGIN_SOLUTION, nbs.END_SOLUTION, nbs.BEGIN_HIDDEN):
        assert marker not in text, f"chapter {module.slug}: `{marker}` found; make_chapters.py must write the release"
    leaked = sorted(ln for ln in nbs.solution_only_lines(nbs.read(module.notebook)) if ln in text)
    assert not leaked, f"chapter {module.slug} shows solution lines: {leaked[:3]}"
    assert all(not c.get("outputs") for c in chapter.cells if c.cell_type == "code"), (
        f"chapter {module.slug} has outputs; the release clears them")
    front = chapter.cells[0]
    assert front.cell_type == "raw" and f'title: "Module {module.number}: {module.title}"' in front.source, (
        f"chapter {module.slug}: first cell should be front matter titled from module.toml, got {front.source[:120]!r}")


def test_bad_config_writes_nothing(tmp_path):
    (tmp_path / "_quarto.yml").write_text("book:\n  chapters:\n    - index.qmd\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "chapters"),
                           "--config", str(tmp_path / "_quarto.yml")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1 and "marker comments" in proc.stderr, (proc.returncode, proc.stderr)
    assert not (tmp_path / "chapters").exists()


# ---------------------------------------------------------------- glossary.qmd


def glossary() -> dict[str, dict]:
    """slug -> {term, body, central}, from the `## Term {#slug}` sections of glossary.qmd."""
    entries: dict[str, dict] = {}
    current = None
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            m = TERM_RE.match(line)
            assert m, f"glossary.qmd: heading {line!r} is not `## Term {{#term-slug}}`"
            assert m["slug"] not in entries, f"glossary.qmd: slug #{m['slug']} is used twice"
            current = entries[m["slug"]] = {"term": m["term"], "body": [], "central": []}
        elif current is not None:
            (current["central"] if line.startswith("*Central in:*") else current["body"]).append(line)
    return entries


def test_glossary_entries_point_at_modules():
    existing = {m.number: m for m in MODULES}
    entries = glossary()
    assert entries, "glossary.qmd has no `## Term {#slug}` entries"
    for slug, e in entries.items():
        assert len(e["central"]) == 1, f"glossary #{slug}: expected one `*Central in:* Module NN (name)` line, got {e['central']}"
        m = CENTRAL_RE.match(e["central"][0])
        assert m, f"glossary #{slug}: {e['central'][0]!r} is not `*Central in:* Module NN (name)` (optionally a link)"
        assert 1 <= int(m["num"]) <= 20, f"glossary #{slug}: module {m['num']} is outside 01-20"
        body = " ".join(ln.strip() for ln in e["body"] if ln.strip())
        sentences = len(re.findall(r"[.!?](?=\s|$)", body))
        assert 1 <= sentences <= 3, f"glossary #{slug}: {sentences} sentences, expected 1 to 3"
        mod = existing.get(m["num"])
        if mod is not None:
            assert m["name"] == mod.name, f"glossary #{slug}: names Module {m['num']} ({m['name']}), the folder is {mod.slug}"
            assert (ROOT / "modules" / mod.slug).is_dir()
            assert m["target"] == f"chapters/{mod.slug}.ipynb", (
                f"glossary #{slug}: Module {m['num']} exists, so link its chapter: "
                f"[Module {m['num']} ({mod.name})](chapters/{mod.slug}.ipynb)")
        else:
            assert not m["link"], f"glossary #{slug}: Module {m['num']} has no folder yet, so its chapter link would be broken"


@pytest.mark.parametrize("slug", COURSE_TERMS + COMPILATION_TERMS)
def test_glossary_has_term(slug):
    assert slug in glossary(), f"glossary.qmd has no entry `## ... {{#{slug}}}`"


def test_course_terms_point_at_existing_modules():
    """The 01-05 vocabulary is taught by modules that exist (arithmetic intensity is measured later)."""
    entries = glossary()
    for slug in COURSE_TERMS:
        m = CENTRAL_RE.match(entries[slug]["central"][0])
        if slug != "arithmetic-intensity":
            assert m["num"] in {mod.number for mod in MODULES}, (
                f"glossary #{slug} points at Module {m['num']}, which has no folder in modules/")
