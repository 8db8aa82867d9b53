"""The lab guide (quarto/, tito/guide.py): its sources, its glossary, its style, and the built book as a
reader sees it.

The fast tests check what the engines are given. The `slow` ones build the book once per test session
(Jupyter Book where it is installed, else Quarto; shared by pytest-xdist workers through a lock) and
read the HTML; the browser test opens it in headless Chromium.
"""
from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tito import guide
from tito import notebooks as nbs
from tito.course import CourseError, Settings, load_modules

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "quarto"
CONFIG = GUIDE / "_quarto.yml"
SCRIPT = GUIDE / "make_chapters.py"
MODULES = load_modules(ROOT)
IDS = [m.slug for m in MODULES]
IS_INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
BUILD = "python quarto/make_chapters.py && quarto render quarto"
BEGIN_MARK, END_MARK = "# BEGIN MODULE CHAPTERS", "# END MODULE CHAPTERS"
EM_DASH = "\u2014"

COURSE_TERMS = [  # what modules 01-05 teach
    "tensor", "dtype", "stride", "view", "contiguous", "broadcasting", "cache-line", "flop",
    "arithmetic-intensity", "matmul", "activation-function", "numerical-stability", "log-sum-exp",
    "softmax", "loss", "cross-entropy", "parameter", "xavier-kaiming-init", "dropout", "batch",
    "data-loader", "throughput",
]
COMPILATION_TERMS = ["bytecode", "machine-code", "assembly", "opcode", "ir", "llvm", "mlir-hlo",
                     "eager-vs-graph-execution", "jit-vs-aot", "kernel", "frozen-graph"]
NUMBER_FORMAT_TERMS = ["fp32", "bf16", "fp16", "underflow", "overflow", "mixed-precision"]
SYSTEMS_WORDS = re.compile(r"memory|bandwidth|FLOP|cache|latency|throughput|roofline|arithmetic intensity|"
                           r"KV cache|utilization|bytes|\b[KMGT]i?B\b|float32", re.I)
EXERCISE_RE = re.compile(r"^#{2,4} +Exercise \d", re.M)
FIGURE_RE = re.compile(r"\bplt\.show\(|\.savefig\(")


# ---------------------------------------------------------------- _quarto.yml and make_chapters.py


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
                   "- listings.qmd", "- glossary.qmd"):
        assert needed in text, f"quarto/_quarto.yml lacks `{needed}`"
    assert text.index("- index.qmd") < text.index("- listings.qmd") < text.index(BEGIN_MARK) < text.index("- glossary.qmd"), (
        "quarto/_quarto.yml: expected index.qmd, listings.qmd, the module chapters, glossary.qmd in that order")
    slugs = {m.slug for m in MODULES}
    for entry in chapter_entries(text):
        m = re.fullmatch(r"- chapters/(\d{2}_[a-z0-9_]+)\.ipynb(\s+#.*)?", entry)
        assert m, f"quarto/_quarto.yml: chapter entry {entry!r} is not `- chapters/NN_name.ipynb`"
        assert m.group(1) in slugs, (f"quarto/_quarto.yml lists {m.group(1)}, which is not a module folder; "
                                     "run `python quarto/make_chapters.py`")


def test_build_command_is_documented():
    for path in (GUIDE / "index.qmd", SCRIPT):
        assert "python quarto/make_chapters.py" in path.read_text(encoding="utf-8"), (
            f"{path.relative_to(ROOT)} should tell how to build the guide: `{BUILD}`")
    for path in (GUIDE / "index.qmd", ROOT / "README.md"):
        assert "tito guide build" in path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} should name `tito guide build`"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Lab guide" in readme and 'pip install -e ".[guide]"' in readme, "README.md needs its Lab guide section"


@pytest.fixture(scope="module")
def quarto_sources(tmp_path_factory):
    """make_chapters.py run into a temporary folder: the Quarto sources, as `quarto render` would get them."""
    src = tmp_path_factory.mktemp("quarto-src")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--src", str(src)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"make_chapters.py failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return src


def test_one_chapter_per_module(quarto_sources):
    written = sorted(p.name for p in (quarto_sources / "chapters").iterdir())
    assert written == sorted(f"{m.slug}.ipynb" for m in MODULES), f"make_chapters.py wrote {written}"
    entries = chapter_entries((quarto_sources / "_quarto.yml").read_text(encoding="utf-8"))
    assert [e.split()[1] for e in entries] == [f"chapters/{m.slug}.ipynb" for m in MODULES]
    yaml = pytest.importorskip("yaml")
    chapters = yaml.safe_load((quarto_sources / "_quarto.yml").read_text(encoding="utf-8"))["book"]["chapters"]
    assert chapters == ["index.qmd", "listings.qmd", *[f"chapters/{m.slug}.ipynb" for m in MODULES], "glossary.qmd"]
    for name in ("glossary.qmd", "listings.qmd", "index.qmd"):
        assert (quarto_sources / name).is_file(), f"make_chapters.py did not write {name}"


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_chapter_is_the_release_with_diagram_and_listings(quarto_sources, module):
    chapter = nbs.read(quarto_sources / "chapters" / f"{module.slug}.ipynb")
    text = "\n".join(c.source for c in chapter.cells)
    for marker in (nbs.BEGIN_SOLUTION, nbs.END_SOLUTION, nbs.BEGIN_HIDDEN):
        assert marker not in text, f"chapter {module.slug}: `{marker}` found; the chapter must be the release"
    leaked = sorted(ln for ln in nbs.solution_only_lines(nbs.read(module.notebook)) if ln in text)
    assert not leaked, f"chapter {module.slug} shows solution lines: {leaked[:3]}"
    assert all(not c.get("outputs") for c in chapter.cells if c.cell_type == "code"), f"chapter {module.slug} has outputs"
    front = chapter.cells[0]
    assert front.cell_type == "raw" and f'title: "Module {module.number}: {module.title}"' in front.source, front.source[:120]
    figs = [c for c in chapter.cells if c.cell_type == "markdown" and f"../diagrams/{module.slug}.svg" in c.source]
    assert len(figs) == 1 and re.search(r'fig-alt="[^"]{40,}"', figs[0].source), (
        f"chapter {module.slug}: expected one diagram with alt text, got {[c.source for c in figs]}")
    n = int(module.number)
    caps = re.findall(rf"\[\*\*Listing {n}\.(\d+) {EM_DASH} (.+?)\*\*\]\{{#listing-{n}-(\d+) \.listing-caption\}}", text)
    assert caps, f"chapter {module.slug} has no listing caption"
    assert [int(k) for k, _, _ in caps] == list(range(1, len(caps) + 1)) and all(a == b for a, _, b in caps), (
        f"chapter {module.slug}: listings must be numbered {n}.1, {n}.2, ... with matching ids: {caps}")
    listings = (quarto_sources / "listings.qmd").read_text(encoding="utf-8")
    for k, _, _ in caps:
        assert f"(chapters/{module.slug}.ipynb#listing-{n}-{k})" in listings, f"listings.qmd misses Listing {n}.{k}"


def test_bad_config_writes_nothing(tmp_path):
    (tmp_path / "_quarto.yml").write_text("book:\n  chapters:\n    - index.qmd\n", encoding="utf-8")
    shutil.copy2(CONFIG, tmp_path / "unused.yml")
    with pytest.raises(CourseError, match="marker comments"):
        guide.update_quarto_config(tmp_path / "_quarto.yml", MODULES)
    assert not (tmp_path / "chapters").exists()


def test_listing_captions_name_what_the_code_is():
    src = "\n".join(["class Linear:", '    """A fully connected layer. More text."""'] + ["    x = 1"] * 10)
    assert guide.listing_what(src, "3. Layers") == "`Linear`: A fully connected layer"
    assert guide.listing_what("x = 1\n" * 5, "h") is None, "ten lines or fewer get no caption"
    loop = "\n".join(f"y{i} = {i}" for i in range(12))
    assert guide.listing_what(loop, "4.2 Timing the loop") == "code of 4.2 Timing the loop"
    imports = "\n".join(f"import m{i}" for i in range(12))
    assert guide.listing_what(imports, "Setup") is None, "an import cell is not a listing"
    doc = '    """TODO (Exercise 1.4): multiply two tensors. Then more."""'
    assert guide.listing_what("\n".join(["def matmul(a, b):", doc] + ["    pass"] * 10), "") == "`matmul`: multiply two tensors"


def test_chapters_follow_the_module_folders(tmp_path):
    """A module folder that lands (here a copy of 01 as 14_profiling) gets its chapter, its entry in the
    table of contents, its diagram, and the glossary links its terms to it."""
    root = tmp_path / "edition"
    (root / "modules").mkdir(parents=True)
    shutil.copytree(ROOT / "modules" / "01_tensor", root / "modules" / "01_tensor")
    new = root / "modules" / "14_profiling"
    new.mkdir()
    shutil.copy2(ROOT / "modules" / "01_tensor" / "01_tensor.ipynb", new / "14_profiling.ipynb")
    (new / "module.toml").write_text('title = "Profiling"\nsummary = "Measure first."\nprerequisites = ["01"]\n')
    shutil.copytree(GUIDE, root / "quarto", ignore=shutil.ignore_patterns("_book", "_jb", "chapters", "diagrams", "__pycache__"))
    shutil.copy2(ROOT / "settings.ini", root / "settings.ini")
    src = guide.prepare(root, "jupyter-book", tmp_path / "jb", log=lambda s: None)
    assert "chapters/14_profiling" in (src / "_toc.yml").read_text()
    assert (src / "chapters" / "14_profiling.ipynb").is_file() and (src / "diagrams" / "14_profiling.svg").is_file()
    glossary = (src / "glossary.md").read_text()
    assert "[Module 14 (profiling)](chapters/14_profiling.ipynb)" in glossary
    assert "*Central in:* Module 15 (quantization)" in glossary, "a planned module is named without a link"


# ---------------------------------------------------------------- glossary


def test_glossary_entries():
    planned, terms = guide.load_glossary(ROOT)
    assert len(terms) >= 90, f"quarto/glossary.yml has {len(terms)} terms; the course's vocabulary needs at least 90"
    names = [t.term.lower() for t in terms]
    assert names == sorted(names), (
        "quarto/glossary.yml must be in alphabetical order; first out of place: "
        + next(f"{a!r} before {b!r}" for a, b in zip(names, names[1:]) if a > b))
    slugs = [t.slug for t in terms]
    assert len(slugs) == len(set(slugs)), f"slugs used twice: {sorted({s for s in slugs if slugs.count(s) > 1})}"
    existing = {m.number for m in MODULES}
    for t in terms:
        assert re.fullmatch(r"[a-z0-9-]+", t.slug), f"glossary {t.term!r}: slug {t.slug!r} is not lowercase-with-dashes"
        assert 1 <= int(t.module) <= 20, f"glossary {t.term!r}: module {t.module} is outside 01-20"
        assert t.module in existing or t.module in planned, f"glossary {t.term!r}: module {t.module} is neither a folder nor planned"
        sentences = len(re.findall(r"[.!?](?=\s|$)", t.text))
        assert 1 <= sentences <= 2, f"glossary {t.term!r}: {sentences} sentences, expected one or two: {t.text}"
        assert EM_DASH not in t.text, f"glossary {t.term!r}: an em-dash in prose"


@pytest.mark.parametrize("slug", COURSE_TERMS + COMPILATION_TERMS + NUMBER_FORMAT_TERMS)
def test_glossary_has_term(slug):
    assert slug in {t.slug for t in guide.load_glossary(ROOT)[1]}, f"quarto/glossary.yml has no term with slug {slug!r}"


@pytest.mark.parametrize("engine", guide.ENGINES)
def test_glossary_links_only_modules_that_exist(engine):
    text = guide.render_glossary(ROOT, MODULES, engine)
    planned, terms = guide.load_glossary(ROOT)
    by_number = {m.number: m for m in MODULES}
    for t in terms:
        anchor = f"## {t.term} {{#{t.slug}}}" if engine == "quarto" else f"({t.slug})=\n## {t.term}"
        assert anchor in text, f"the {engine} glossary lacks the entry {t.term!r}"
    for num, name, target in re.findall(r"\*Central in:\* \[Module (\d{2}) \(([a-z0-9_]+)\)\]\(([^)]+)\)", text):
        mod = by_number.get(num)
        assert mod and name == mod.name and target == f"chapters/{mod.slug}.ipynb", (num, name, target)
    for num in re.findall(r"\*Central in:\* Module (\d{2}) ", text):
        assert num not in by_number, f"Module {num} exists, so the glossary must link its chapter"


# ---------------------------------------------------------------- style of the module notebooks


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_hook_before_the_first_exercise(module):
    cells = nbs.read(module.notebook).cells
    first = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and EXERCISE_RE.search(c.source)), None)
    assert first is not None, f"{module.slug}: no `### Exercise N.k` heading"
    hook = next((c for c in cells[:first] if c.cell_type == "markdown"), None)
    assert hook is not None and SYSTEMS_WORDS.search(hook.source), (
        f"{module.slug}: the first markdown cell before Exercise must be the hook, leading with the systems angle "
        "(memory, bandwidth, FLOPs, cache, latency, ...)")


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_figures_have_alt_text(module):
    for i, cell in enumerate(nbs.read(module.notebook).cells):
        if cell.cell_type == "code" and FIGURE_RE.search(cell.source):
            first = cell.source.splitlines()[0]
            m = re.fullmatch(r'#\| fig-alt: "(.+)"', first)
            assert m and len(m.group(1)) >= 40, (
                f"{module.slug}, cell {i + 1}: a figure cell must start with `#| fig-alt: \"...\"` saying what the "
                f"figure shows (axes, what rises, what falls); it starts with {first!r}")


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_prose_has_no_em_dashes_and_no_stray_list_items(module):
    for i, cell in enumerate(nbs.read(module.notebook).cells):
        if cell.cell_type != "markdown":
            continue
        assert EM_DASH not in cell.source, f"{module.slug}, cell {i + 1}: an em-dash in prose; use a colon or a comma"
        for line in cell.source.splitlines():
            # "(Module\n01) calls" renders "01)" as a list item: zero-padded numbers are module numbers
            assert not re.match(r"\s*0\d[.)]\s", line), (
                f"{module.slug}, cell {i + 1}: the line {line[:40]!r} renders as a numbered list item; reflow it")


# ---------------------------------------------------------------- draw_graph and the diagrams


def test_draw_graph_plain_svg(tmp_path):
    import numpy as np

    from tinytorch.core.tensor import Tensor
    from tinytorch.viz.graph import draw_graph

    x = Tensor(np.ones((4, 3), dtype=np.float32))
    w = Tensor(np.full((3, 2), 0.5, dtype=np.float32), requires_grad=True)
    y = (x @ w).sum()
    g = draw_graph(y, names={"x": x, "w": w}, engine="svg", path=tmp_path / "g.svg")
    assert [n["label"].split("(")[0] for n in g.nodes if n["kind"] == "op"] == ["matmul", "sum"]
    assert g.engine == "svg" and (tmp_path / "g.svg").read_text().endswith("</svg>\n")
    assert "w | 3x2 float32 | leaf" in g.svg and g._repr_svg_() == g.svg
    assert draw_graph(y, names={"x": x, "w": w}, engine="svg").svg == g.svg, "the same graph must give the same file"
    z = w
    for _ in range(3000):
        z = z * 0.5
    assert len(draw_graph(z, engine="svg").nodes) == 6001, "a long chain draws without recursion"
    with pytest.raises(ValueError, match=r"engine must be 'auto', 'dot' or 'svg', got 'png'"):
        draw_graph(y, engine="png")
    with pytest.raises(TypeError, match="expected a Tensor, got int"):
        draw_graph(3)


def test_draw_graph_with_graphviz():
    import numpy as np

    from tinytorch.core.tensor import Tensor
    from tinytorch.viz.graph import draw_graph

    y = (Tensor(np.ones(3, dtype=np.float32), requires_grad=True) * 2.0).sum()
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="needs Graphviz's `dot` program"):
            draw_graph(y, engine="dot")
        pytest.skip("Graphviz's dot is not installed (apt-get install graphviz): the dot engine is not drawn here")
    g = draw_graph(y, engine="dot")
    assert g.engine == "dot" and "<svg" in g.svg and g.svg.endswith("\n")


@pytest.fixture(scope="module")
def diagrams(tmp_path_factory):
    sys.path.insert(0, str(GUIDE))
    try:
        import diagrams as maker
    finally:
        sys.path.remove(str(GUIDE))
    out = tmp_path_factory.mktemp("diagrams")
    return maker, out, maker.write_diagrams(ROOT, MODULES, out)


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_one_diagram_per_module(diagrams, module):
    maker, out, result = diagrams
    d = result[module.slug]
    svg = (out / d["file"]).read_text(encoding="utf-8")
    assert "<svg" in svg and svg.endswith("\n"), f"{d['file']} must be an SVG ending with a newline"
    assert len(d["alt"]) >= 60 and EM_DASH not in d["alt"] + d["caption"], d
    if IS_INSTRUCTOR and module.name in maker.DIAGRAMS:
        assert d["kind"] == "own", f"{module.slug}: its own diagram failed and fell back to the prerequisite graph"


# ---------------------------------------------------------------- the built book (slow)


def _engine_for_tests() -> str | None:
    return "jupyter-book" if guide._jupyter_book_cmd() else ("quarto" if shutil.which("quarto") else None)


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> Path:
    """The HTML book, built once per session (pytest-xdist workers share it through a lock)."""
    engine = _engine_for_tests()
    if engine is None:
        pytest.skip(f'neither Jupyter Book nor Quarto is installed: `{guide.GUIDE_INSTALL}` to build the guide')
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, status = shared / "guide-book" / "html", shared / "guide-book.status"
    with FileLock(str(shared / "guide-book.lock")):
        if not status.exists():
            try:
                guide.build(ROOT, engine, out, src=shared / "guide-book" / "src", log=lambda s: None)
                status.write_text("ok")
            except CourseError as e:
                status.write_text(str(e))
    if status.read_text() != "ok":
        pytest.fail(status.read_text())
    return out


def _pages(book: Path) -> list[Path]:
    return sorted(p for p in book.rglob("*.html") if "_static" not in p.parts)


def _article(text: str) -> str:
    "The page's own content (Sphinx's article, Quarto's main), without head, navigation or scripts."
    m = re.search(r"<article[^>]*>(.*)</article>", text, re.S) or re.search(r"<main[^>]*>(.*)</main>", text, re.S)
    body = m.group(1) if m else text
    return re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.S)


def _text(fragment: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", "", fragment))


@pytest.mark.slow
def test_book_has_every_chapter(book):
    for m in MODULES:
        page = book / "chapters" / f"{m.slug}.html"
        assert page.is_file(), f"the book has no chapter page for {m.slug}"
        text = page.read_text(encoding="utf-8")
        assert f"Module {m.number}: {m.title}" in _text(text)
        n = int(m.number)
        assert f"Listing {n}.1 {EM_DASH}" in _text(text), f"{m.slug}: no listing caption in the built chapter"
        imgs = re.findall(r'<img[^>]*alt="([^"]{40,})"[^>]*src="([^"]+\.svg)"', text)
        assert imgs, f"{m.slug}: the built chapter shows no diagram with alt text"
        svg = (page.parent / imgs[0][1]).resolve()
        assert svg.read_text(encoding="utf-8").endswith("\n"), f"{svg} must end with a newline"
    for name in ("index.html", "glossary.html", "listings.html"):
        assert (book / name).is_file(), f"the book has no {name}"


@pytest.mark.slow
def test_book_links_resolve(book):
    """Every internal link and cross-reference (glossary, listings, chapters) points at a page and an id that exist."""
    ids: dict[Path, set[str]] = {}
    broken = []
    for page in _pages(book):
        text = page.read_text(encoding="utf-8")
        for href in re.findall(r'href="([^"]+)"', text):
            if re.match(r"[a-z]+:", href) or href.startswith("//"):
                continue
            url, _, frag = html_lib.unescape(href).partition("#")
            path = url.split("?")[0]  # `theme.css?digest=...`
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(book)} -> {href}")
                continue
            if frag and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text(encoding="utf-8")))
                if frag not in ids[target]:
                    broken.append(f"{page.relative_to(book)} -> {href} (no id {frag!r})")
    assert not broken, f"{len(broken)} broken links, e.g.:\n  " + "\n  ".join(broken[:15])
    listings = (book / "listings.html").read_text(encoding="utf-8")
    assert listings.count("#listing-") >= len(MODULES), "the list of listings links fewer listings than there are chapters"
    glossary = (book / "glossary.html").read_text(encoding="utf-8")
    assert len(re.findall(r"Central in:", glossary)) >= 90


@pytest.mark.slow
@pytest.mark.skipif(not IS_INSTRUCTOR, reason="needs the instructor edition (solutions)")
def test_book_shows_no_solution(book):
    lines = nbs.course_solution_lines([nbs.read(m.notebook) for m in MODULES])
    found = []
    for page in _pages(book) + sorted(book.rglob("*.ipynb")) + sorted(book.rglob("*.txt")):
        text = page.read_text(encoding="utf-8", errors="replace")
        if page.suffix == ".html":
            text = _text(text)
        found += [f"{page.relative_to(book)}: {ln}" for ln in lines if ln in text]
        assert nbs.BEGIN_SOLUTION not in text and nbs.BEGIN_HIDDEN not in text, f"{page}: a solution marker"
    assert not found, f"solution text in the built site:\n  " + "\n  ".join(found[:10])


@pytest.mark.slow
def test_book_prose_has_no_em_dashes(book):
    bad = []
    for page in _pages(book):
        article = _article(page.read_text(encoding="utf-8"))
        article = re.sub(r"<pre\b.*?</pre>", "", article, flags=re.S)
        for para in re.findall(r"<(p|li|dd|h\d)\b[^>]*>(.*?)</\1>", article, re.S):
            text = _text(para[1])
            text = re.sub(rf"Listing \d+\.\d+ {EM_DASH}", "", text)  # listing captions are the exception
            if EM_DASH in text:
                bad.append(f"{page.relative_to(book)}: {text.strip()[:80]}")
    assert not bad, "em-dashes in prose:\n  " + "\n  ".join(bad[:10])


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow
def test_book_renders_in_a_browser(book, tmp_path):
    """Headless Chromium opens a chapter, the glossary and a figure; screenshots go to tmp_path."""
    exe = _chromium()
    if exe is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium; "
                    "`python3 -m tito.bootstrap test` installs it as root): the browser check did not run")
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    chapter = book / "chapters" / "06_autograd.html"
    figure = re.search(r'<img[^>]*src="([^"]+\.svg)"', chapter.read_text(encoding="utf-8")).group(1)
    figure_path = (chapter.parent / figure).resolve()
    pages = {"chapter": chapter.as_uri(), "glossary": (book / "glossary.html").as_uri(), "figure": figure_path.as_uri(),
             "figure-in-chapter": chapter.as_uri() + "#fig-module-6"}
    from matplotlib.image import imread

    for name, page in pages.items():
        shot = tmp_path / f"{name}.png"
        proc = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,1600", page],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and shot.is_file(), f"chromium could not screenshot {page}: {proc.stderr[-500:]}"
        pixels = imread(shot)
        assert pixels.std() > 0.01, f"the screenshot of the {name} ({shot}) is blank"
    # what the reader's browser built: the chapter's title, the glossary's entries, the figure loaded with a size
    dom = subprocess.run([*flags, "--dump-dom", chapter.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "Module 06: Autograd" in dom and "Listing 6.1" in dom
    dom = subprocess.run([*flags, "--dump-dom", (book / "glossary.html").as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    assert dom.count("Central in:") >= 90, "the glossary page did not render its entries"
    probe = tmp_path / "probe.html"
    probe.write_text(f'<html><body><img id="f" src="{figure_path.as_uri()}" '
                     'onload="document.title = \'loaded \' + this.naturalWidth" '
                     'onerror="document.title = \'failed\'"></body></html>', encoding="utf-8")
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"<title>loaded (\d+)</title>", dom)
    assert m and int(m.group(1)) > 100, f"the figure {figure_path} did not load in the browser: {dom[:300]}"
    print(f"screenshots: {', '.join(str(tmp_path / f'{n}.png') for n in pages)}")
