"""The lab guide (quarto/, tito/guide.py): its sources, its glossary, its style, and the built book as a
reader sees it.

The fast tests check what the engines are given. The `slow` ones build the book once per test session
(Jupyter Book where it is installed, else Quarto; shared by pytest-xdist workers through a lock) and
read the HTML; the browser tests open it in headless Chromium, served over HTTP on 127.0.0.1, and read
what the page shows after MathJax ran: typeset maths and no raw TeX, listings that fit their column at a
desktop and at a phone width, every figure loaded with its alt text and legible labels, the front door
linked from the home page. The PDF test prints a two-module edition's guide and reads its text.
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
BEGIN_MARK, END_MARK = guide.BEGIN_MARK, guide.END_MARK
EM_DASH = "\u2014"

COURSE_TERMS = [  # what modules 01-05 teach
    "tensor", "dtype", "stride", "view", "contiguous-layout", "broadcasting", "cache-line", "flop",
    "arithmetic-intensity", "matmul", "activation-function", "numerical-stability", "log-sum-exp",
    "softmax", "loss", "cross-entropy-loss", "parameter", "xavier-kaiming-init", "dropout", "batch",
    "data-loader", "throughput",
]
COMPILATION_TERMS = ["bytecode", "machine-code", "assembly", "opcode", "ir", "llvm", "mlir-hlo",
                     "eager-vs-graph-execution", "jit-vs-aot", "kernel", "frozen-graph"]
NUMBER_FORMAT_TERMS = ["fp32", "bf16", "fp16", "underflow", "overflow", "mixed-precision"]
# the terms issue 30 found missing, each linked to the module where it is central
ISSUE_30_TERMS = {
    "activation-pinning": "06", "allreduce": "08", "cache-tiling": "17", "compression-ratio": "16",
    "compute-bound": "14", "contiguous-layout": "01", "convergence": "07", "cross-entropy-loss": "04",
    "hbm": "14", "kernel-fusion": "17", "memory-wall": "14", "mini-batch": "05", "pagedattention": "18",
    "post-training-quantization": "15", "qkv": "12", "retain-grad": "06", "train-eval-mode": "03",
    "training-loop": "08", "constant-folding": "17", "dead-code-elimination": "17",
    "common-subexpression-elimination": "17", "loop-unrolling": "17", "saturated-gradient": "02",
    "cuda-kernel": "17", "tensorflow-op-vs-kernel": "17", "concrete-function": "17", "protocol-buffers": "08",
}
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
    for needed in ("type: book", 'title: "TinyTorch lab guide"', "output-dir: _book", "- mathjax/", "css: guide.css",
                   "html-math-method: plain", "mathjax/tex-chtml.js"):
        assert needed in text, f"quarto/_quarto.yml lacks `{needed}`"
    assert "cdn" not in text.lower(), "the guide must not load anything from a CDN"
    assert chapter_entries(text), "quarto/_quarto.yml lists no chapters between its markers; run `python quarto/make_chapters.py`"
    yaml = pytest.importorskip("yaml")
    listed = yaml.safe_load(text)["book"]["chapters"]
    flat = [x for e in listed for x in ([e] if isinstance(e, str) else e["chapters"])]
    assert flat[0] == "index.qmd", flat[:3]
    slugs = {m.slug for m in MODULES}
    for entry in flat:
        m = re.fullmatch(r"chapters/(\d{2}_[a-z0-9_]+)\.ipynb", entry)
        if m:
            assert m.group(1) in slugs, (f"quarto/_quarto.yml lists {m.group(1)}, which is not a module folder; "
                                         "run `python quarto/make_chapters.py`")
        else:
            assert entry.removesuffix(".qmd") in {n for _, ns in guide.BOOK for n in ns}, f"{entry} is not a page of BOOK"
    assert flat == [f for _, fs in guide._pages(MODULES, "quarto") for f in fs], (
        "quarto/_quarto.yml's chapter list differs from tito/guide.py's BOOK: run `python quarto/make_chapters.py`")


def test_build_command_is_documented():
    for path in (GUIDE / "pages" / "making.qmd", SCRIPT):
        assert "python quarto/make_chapters.py" in path.read_text(encoding="utf-8"), (
            f"{path.relative_to(ROOT)} should tell how to build the guide: `{BUILD}`")
    for path in (GUIDE / "pages" / "making.qmd", ROOT / "README.md"):
        text = path.read_text(encoding="utf-8")
        assert "tito guide build" in text and "tito guide pdf" in text, (
            f"{path.relative_to(ROOT)} should name `tito guide build` and `tito guide pdf`")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Lab guide" in readme and 'pip install -e ".[guide]"' in readme, "README.md needs its Lab guide section"


def test_every_page_of_the_book_has_a_source():
    for _, names in guide.BOOK:
        for name in names:
            if name != "@chapters" and name not in guide.GENERATED_PAGES:
                assert (GUIDE / "pages" / f"{name}.qmd").is_file(), f"BOOK names {name}, but quarto/pages/{name}.qmd is missing"
    home = (GUIDE / "pages" / "index.qmd").read_text(encoding="utf-8")
    for name in guide.FRONT_DOOR:
        assert f"]({name}.qmd)" in home, f"the home page (quarto/pages/index.qmd) does not link the front-door page {name}"
    for needed in ("tito student init", "tito doctor", "tito module start 01"):
        assert needed in home, f"the home page's five-minute start lacks `{needed}`"


def test_grading_status_is_stated_in_one_place():
    """Where grading stands (the invariant, hidden tests, replay, limits, one machine or a cluster) is said once
    (quarto/pages/_grading-status.md), and both pages that describe grading include it; no other page says the
    hidden tests run in the student's kernel (the state before issue 28)."""
    status = (GUIDE / "pages" / "_grading-status.md").read_text(encoding="utf-8").lower()
    for needed in ("dask", "hidden test", "sandbox", "reference", "replay"):
        assert needed in status, f"_grading-status.md does not mention {needed!r}"
    for page in ("checking", "instructors"):
        assert "<!-- tito:include _grading-status.md -->" in (GUIDE / "pages" / f"{page}.qmd").read_text(encoding="utf-8")
    stale = re.compile(r"hidden tests? (?:still )?runs? in the (?:student's )?kernel", re.I)
    for path in [ROOT / "README.md", *sorted((GUIDE / "pages").glob("*.qmd"))]:
        assert not stale.search(path.read_text(encoding="utf-8")), f"{path.name} says hidden tests run in the kernel"


MEASURED_NUMBER = re.compile(r"\b\d[\d,.]*\s?(?:ms|us|µs|ns|GFLOP/s|GB/s|tokens/s|requests/s|answers/s)\b|\b\d+(?:\.\d+)?x\b")


def test_no_measured_number_is_typed_by_hand():
    """Speeds and ratios come from result files (quarto/measured/): none in the README or the pages' own text."""
    for path in [ROOT / "README.md", *sorted((GUIDE / "pages").glob("*.qmd")), *sorted((GUIDE / "pages").glob("*.md"))]:
        text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
        found = MEASURED_NUMBER.findall(text)
        assert not found, f"{path.relative_to(ROOT)} states measured numbers by hand: {found[:5]}; keep them in result files"


def test_measured_results_are_result_files():
    measured = GUIDE / "measured"
    for path in sorted(measured.rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        runs = data["runs"] if "runs" in data else [data]
        for run in runs:
            assert run.get("machine", {}).get("cpu") and run.get("date"), f"{path}: a run without its machine or date"
    for rec in sorted(measured.glob("notebooks/*/figures.json")):
        data = json.loads(rec.read_text(encoding="utf-8"))
        for f in data["figures"]:
            assert (rec.parent / f["file"]).is_file(), f"{rec} names {f['file']}, which is missing"


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
    yaml = pytest.importorskip("yaml")
    chapters = yaml.safe_load((quarto_sources / "_quarto.yml").read_text(encoding="utf-8"))["book"]["chapters"]
    flat = [x for e in chapters for x in ([e] if isinstance(e, str) else e["chapters"])]
    assert [f for f in flat if f.startswith("chapters/")] == [f"chapters/{m.slug}.ipynb" for m in MODULES]
    for name in flat:
        if not name.startswith("chapters/"):
            assert (quarto_sources / name).is_file(), f"make_chapters.py did not write {name}"
    assert (quarto_sources / "mathjax" / "tex-chtml.js").is_file(), "the Quarto sources lack MathJax"
    for page in quarto_sources.glob("*.qmd"):
        assert not re.search(r"^<!-- tito:", page.read_text(encoding="utf-8"), re.M), f"{page.name}: a placeholder left"


CAPTION_RE = re.compile(r"::: \{#listing-(\d+)-(\d+) \.listing-caption \.(exercise|given)\}\n"
                        r"\*\*Listing (\d+)\.(\d+)\*\* \*\(([^)]*)\)\*: (.+)\n:::")


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
    caps = CAPTION_RE.findall(text)
    assert caps, f"chapter {module.slug} has no listing caption"
    assert [int(k) for _, k, *_ in caps] == list(range(1, len(caps) + 1)), f"chapter {module.slug}: listings not numbered 1, 2, ..."
    listings = (quarto_sources / "listings.qmd").read_text(encoding="utf-8")
    for num, k, kind, num2, k2, role, what in caps:
        assert int(num) == int(num2) == n and k == k2, f"chapter {module.slug}: caption ids do not match: {num}.{k} {num2}.{k2}"
        assert (kind == "exercise") == role.startswith("Exercise ") and (role == "given") == (kind == "given"), role
        if kind == "exercise":
            assert re.fullmatch(rf"Exercise {n}\.\d+, yours to write", role), f"chapter {module.slug}: role {role!r}"
        assert EM_DASH not in what and not what.endswith("...") and not what.startswith("code of"), (
            f"chapter {module.slug}, Listing {n}.{k}: the caption must say what the code does, in whole sentences: {what!r}")
        assert what.count("`") % 2 == 0, f"Listing {n}.{k}: unbalanced code quotes in {what!r}"
        assert f"(chapters/{module.slug}.ipynb#listing-{n}-{k})" in listings, f"listings.qmd misses Listing {n}.{k}"
    tags = [set(c.metadata.get("tags", [])) for c in chapter.cells if c.cell_type == "code"]
    assert all(len(t & {"exercise", "given", "test"}) == 1 for t in tags), f"chapter {module.slug}: untagged code cells"
    if IS_INSTRUCTOR:
        assert any("exercise" in t for t in tags), f"chapter {module.slug}: no cell tagged as an exercise"
    rec = guide.measured.notebook_figures(ROOT, module)
    if rec:
        shown = re.findall(r"!\[Measured: [^\]]+\]\(\.\./measured/notebooks/[^)]+\)\{#fig-measured-", text)
        assert len(shown) == len(rec["figures"]), f"chapter {module.slug} shows {len(shown)} of {len(rec['figures'])} measured figures"


def test_bad_config_writes_nothing(tmp_path):
    (tmp_path / "_quarto.yml").write_text("book:\n  chapters:\n    - index.qmd\n", encoding="utf-8")
    shutil.copy2(CONFIG, tmp_path / "unused.yml")
    with pytest.raises(CourseError, match="marker comments"):
        guide.update_quarto_config(tmp_path / "_quarto.yml", MODULES)
    assert not (tmp_path / "chapters").exists()


def test_listing_captions_name_what_the_code_is():
    src = "\n".join(["class Linear:", '    """A fully connected layer. More text."""'] + ["    x = 1"] * 10)
    assert guide.listing_what(src, "") == "`Linear`. A fully connected layer."
    assert guide.listing_what("x = 1\n" * 5, "h") is None, "ten lines or fewer get no caption"
    loop = "\n".join(f"y{i} = {i}" for i in range(12))
    assert guide.listing_what(loop, "We time the loop, e.g. with time_call. Then plot it.") == (
        "We time the loop, e.g. with time_call."), "a cell without definitions is described by the text above it"
    imports = "\n".join(f"import m{i}" for i in range(12))
    assert guide.listing_what(imports, "Setup") is None, "an import cell is not a listing"
    doc = '    """TODO (Exercise 1.4): multiply two tensors. Then more."""'
    assert guide.listing_what("\n".join(["def matmul(a, b):", doc] + ["    pass"] * 10), "", True) == (
        "`matmul`. Multiply two tensors.")
    long = "def f():\n    " + '"""' + "word " * 80 + '."""\n' + "    pass\n" * 11
    assert guide.listing_what(long, "") == "`f`", "a sentence too long for a caption is left out, never cut"
    assert guide.first_sentence("Compute `a.b` over `x`. More.") == "Compute `a.b` over `x`."


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
    shutil.copytree(GUIDE, root / "quarto", ignore=shutil.ignore_patterns("_book", "_jb", "chapters", "diagrams", "__pycache__",
                                                                        "mathjax", "measured", "*.qmd"))
    shutil.copytree(GUIDE / "pages", root / "quarto" / "pages", dirs_exist_ok=True)
    shutil.copy2(ROOT / "settings.ini", root / "settings.ini")
    src = guide.prepare(root, "jupyter-book", tmp_path / "jb", log=lambda s: None)
    assert "chapters/14_profiling" in (src / "_toc.yml").read_text()
    assert (src / "chapters" / "14_profiling.ipynb").is_file() and (src / "diagrams" / "14_profiling.svg").is_file()
    glossary = (src / "glossary.md").read_text()
    assert "[Module 14 (profiling)](chapters/14_profiling.ipynb)" in glossary
    assert "*Central in:* Module 15\n" in glossary, "a module this edition lacks is named by its number, unlinked"
    assert "[01](chapters/01_tensor.ipynb)" in (src / "modules.md").read_text(), "the module table links the chapters"


# ---------------------------------------------------------------- glossary


def test_glossary_entries():
    terms = guide.load_glossary(ROOT)
    assert len(terms) >= 150, f"quarto/glossary.yml has {len(terms)} terms; the course's vocabulary needs at least 150"
    names = [t.term.lower() for t in terms]
    assert names == sorted(names), (
        "quarto/glossary.yml must be in alphabetical order; first out of place: "
        + next(f"{a!r} before {b!r}" for a, b in zip(names, names[1:]) if a > b))
    slugs = [t.slug for t in terms]
    assert len(slugs) == len(set(slugs)), f"slugs used twice: {sorted({s for s in slugs if slugs.count(s) > 1})}"
    existing = {m.number for m in MODULES}
    text = (GUIDE / "glossary.yml").read_text(encoding="utf-8")
    assert not re.search(r"^planned:", text, re.M) and "planned" not in " ".join(t.text for t in terms), (
        "no glossary term or module is 'planned': all twenty modules exist")
    for t in terms:
        assert re.fullmatch(r"[a-z0-9-]+", t.slug), f"glossary {t.term!r}: slug {t.slug!r} is not lowercase-with-dashes"
        assert t.module in existing, f"glossary {t.term!r}: module {t.module} has no folder"
        sentences = len(re.findall(r"[.!?](?=\s|$)", re.sub(r"\b(e\.g|i\.e|vs)\.", "", t.text)))
        assert 1 <= sentences <= 2, f"glossary {t.term!r}: {sentences} sentences, expected one or two: {t.text}"
        assert EM_DASH not in t.text, f"glossary {t.term!r}: an em-dash in prose"


@pytest.mark.parametrize("slug", COURSE_TERMS + COMPILATION_TERMS + NUMBER_FORMAT_TERMS)
def test_glossary_has_term(slug):
    assert slug in {t.slug for t in guide.load_glossary(ROOT)}, f"quarto/glossary.yml has no term with slug {slug!r}"


@pytest.mark.parametrize("slug", sorted(ISSUE_30_TERMS))
def test_glossary_has_the_terms_issue_30_lists(slug):
    terms = {t.slug: t for t in guide.load_glossary(ROOT)}
    assert slug in terms, f"quarto/glossary.yml has no term with slug {slug!r}"
    assert terms[slug].module == ISSUE_30_TERMS[slug], (
        f"glossary {terms[slug].term!r} is linked to module {terms[slug].module}; it is central in {ISSUE_30_TERMS[slug]}")


@pytest.mark.parametrize("engine", guide.ENGINES)
def test_glossary_links_only_modules_that_exist(engine):
    text = guide.render_glossary(ROOT, MODULES, engine)
    terms = guide.load_glossary(ROOT)
    by_number = {m.number: m for m in MODULES}
    for t in terms:
        anchor = f"## {t.term} {{#{t.slug}}}" if engine == "quarto" else f"({t.slug})=\n## {t.term}"
        assert anchor in text, f"the {engine} glossary lacks the entry {t.term!r}"
    links = re.findall(r"\*Central in:\* \[Module (\d{2}) \(([a-z0-9_]+)\)\]\(([^)]+)\)", text)
    assert len(links) == len(terms), "every glossary entry links the chapter of its module"
    for num, name, target in links:
        mod = by_number.get(num)
        assert mod and name == mod.name and target == f"chapters/{mod.slug}.ipynb", (num, name, target)


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


SVG_FONT = re.compile(r"font-size[:=]\s*\"?([0-9.]+)(?:px)?")


def svg_legibility(svg: str) -> tuple[float, float]:
    """(the smallest font size, the viewBox width) of an SVG, in its user units."""
    m = re.search(r'viewBox="[-0-9.]+ [-0-9.]+ ([0-9.]+) [0-9.]+"', svg)
    fonts = [float(f) for f in SVG_FONT.findall(svg)] + [float(f) for f in re.findall(r"font: (?:[a-z]+ )*([0-9.]+)px", svg)]
    return (min(fonts) if fonts else 0.0), (float(m.group(1)) if m else float("inf"))


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_one_diagram_per_module(diagrams, module):
    maker, out, result = diagrams
    d = result[module.slug]
    svg = (out / d["file"]).read_text(encoding="utf-8")
    assert "<svg" in svg and svg.endswith("\n"), f"{d['file']} must be an SVG ending with a newline"
    assert len(d["alt"]) >= 60 and EM_DASH not in d["alt"] + d["caption"], d
    if IS_INSTRUCTOR:
        assert module.name in maker.DIAGRAMS, f"{module.slug} has no diagram of its own in quarto/diagrams.py"
        assert d["kind"] == "own", f"{module.slug}: its own diagram failed and fell back to the prerequisite graph"
        font, width = svg_legibility(svg)
        # shown at a 560-pixel column (narrower than the book's at 1280 px), the smallest label is at least 9 px
        assert font * 560 / width >= 9, (f"{d['file']}: its smallest label ({font:g} units in a {width:g}-unit-wide "
                                         f"drawing) would be {font * 560 / width:.1f} px at page width")


def test_a_moved_api_fails_the_diagram_loudly(diagrams, monkeypatch, tmp_path):
    """A renamed public name must fail the build with the module and the function to update, not fall back."""
    maker, _, _ = diagrams
    import tinytorch.perf.kv_cache as kv

    monkeypatch.delattr(kv, "PagedKVCache")
    memo = [m for m in MODULES if m.name == "memoization"]
    with pytest.raises(maker.DiagramError, match=r"block_table.*18_memoization.*PagedKVCache"):
        maker.write_diagrams(ROOT, memo, tmp_path, strict=True)
    assert maker.write_diagrams(ROOT, memo, tmp_path, strict=False)["18_memoization"]["kind"] == "prerequisites", (
        "a student edition, whose code is half written, falls back to the prerequisite graph")


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
        assert f"Listing {n}.1 (" in _text(text), f"{m.slug}: no listing caption in the built chapter"
        imgs = re.findall(r'<img[^>]*alt="([^"]{40,})"[^>]*src="([^"]+\.svg)"', text)
        assert imgs, f"{m.slug}: the built chapter shows no diagram with alt text"
        svg = (page.parent / imgs[0][1]).resolve()
        assert svg.read_text(encoding="utf-8").endswith("\n"), f"{svg} must end with a newline"
    for name in ("index", "glossary", "listings", "measured", *guide.FRONT_DOOR):
        assert (book / f"{name}.html").is_file(), f"the book has no {name}.html"


@pytest.mark.slow
def test_book_loads_nothing_from_the_network(book):
    """Scripts, styles, fonts and images come from the book itself: it reads offline."""
    remote = []
    for page in _pages(book):
        text = page.read_text(encoding="utf-8")
        remote += [f"{page.relative_to(book)}: {m}" for m in re.findall(r'<(?:script|img)[^>]*\ssrc="(https?:[^"]+)"', text)]
        remote += [f"{page.relative_to(book)}: {m}" for m in re.findall(r'<link[^>]*\shref="(https?:[^"]+)"', text)]
    assert not remote, "the book loads from the network:\n  " + "\n  ".join(remote[:10])
    chapter = (book / "chapters" / "04_losses.html").read_text(encoding="utf-8")
    assert re.search(r'<script[^>]*src="\.\./_static/mathjax/tex-chtml\.js', chapter), "MathJax is not served by the book"
    assert (book / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").is_dir(), "MathJax's fonts are missing"


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
    assert len(re.findall(r"Central in:", glossary)) >= 150


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
        for para in re.findall(r"<(p|li|dd|h\d|figcaption)\b[^>]*>(.*?)</\1>", article, re.S):
            text = _text(para[1])
            if EM_DASH in text:
                bad.append(f"{page.relative_to(book)}: {text.strip()[:80]}")
    assert not bad, "em-dashes in prose (listing captions included):\n  " + "\n  ".join(bad[:10])


# ---------------------------------------------------------------- in the browser (slow)

PROBE = r"""<!doctype html><html><head><meta charset="utf-8"><title>probe</title></head><body>
<pre id="out">running</pre>
<script>
const PAGES = __PAGES__;
const RAW_TEX = /\\\(|\\\[|\$\$|\\frac|\\text\{|\\cdot|\\sum_|\\sqrt\{/;
function settle(img) { return img.complete ? null : new Promise(r => { img.onload = img.onerror = r; }); }
async function measure(p) {
  const f = document.createElement("iframe");
  f.style.width = p.width + "px"; f.style.height = "1000px"; f.style.border = "0";
  document.body.appendChild(f);
  await new Promise(r => { f.onload = r; f.src = p.url; });
  const w = f.contentWindow, d = f.contentDocument;
  if (w.MathJax && w.MathJax.startup && w.MathJax.startup.promise) {
    try { await w.MathJax.startup.promise; } catch (e) {}
  }
  await Promise.all([...d.images].map(settle));
  const root = d.querySelector("article") || d.querySelector("main") || d.body;
  const raw = [];
  const walker = d.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  let n;
  while ((n = walker.nextNode())) {
    if (n.parentElement.closest("mjx-container, pre, code, script, style, .highlight, .math-error")) continue;
    if (RAW_TEX.test(n.textContent)) raw.push(n.textContent.trim().slice(0, 100));
  }
  let wide = null;
  if (d.documentElement.scrollWidth > w.innerWidth + 1) {
    for (const e of d.body.querySelectorAll("*")) {
      const r = e.getBoundingClientRect();
      if (r.right > w.innerWidth + 1 && r.width > 0 && (!wide || r.right > wide.right))
        wide = {right: Math.round(r.right), tag: e.tagName, cls: String(e.className).slice(0, 60), text: (e.textContent || "").trim().slice(0, 60)};
    }
  }
  const res = {name: p.name, width: p.width, mathjax: !!(w.MathJax && w.MathJax.version), wide: wide,
               math: root.querySelectorAll(".math").length,
               typeset: root.querySelectorAll("mjx-container").length,
               errors: root.querySelectorAll("mjx-merror, .math-error").length, raw: raw,
               listings: root.querySelectorAll("div.highlight pre").length,
               overflow: [...root.querySelectorAll("div.highlight pre, div.cell pre")]
                 .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
                 .map(e => e.textContent.trim().split("\n")[0].slice(0, 60) + " (" + e.scrollWidth + " > " + e.clientWidth + ")"),
               page_overflow: d.documentElement.scrollWidth > w.innerWidth + 1 ? d.documentElement.scrollWidth : 0,
               images: [...root.querySelectorAll("img")].map(img => ({src: img.getAttribute("src"), alt: img.alt,
                 loaded: img.complete && img.naturalWidth > 0, shown: Math.round(img.getBoundingClientRect().width)})),
               links: [...root.querySelectorAll("a[href]")].map(a => a.getAttribute("href"))};
  f.remove();
  return res;
}
(async () => {
  const out = [];
  for (const p of PAGES) {
    try { out.push(await measure(p)); } catch (e) { out.push({name: p.name, width: p.width, error: String(e)}); }
  }
  document.getElementById("out").textContent = JSON.stringify(out);
  document.title = "done";
})();
</script></body></html>"""
DESKTOP, PHONE = 1280, 390
MATH_CHAPTERS = ["03_layers", "04_losses", "08_training", "16_compression"]


@pytest.fixture(scope="module")
def served(book):
    """The book over HTTP on 127.0.0.1 (a free port), with the probe page at /__probe.html."""
    import functools
    import http.server
    import threading

    probe = {"html": ""}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/__probe.html"):
                body = probe["html"].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(book)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", probe
    finally:
        server.shutdown()
        server.server_close()


def _browser(tmp_path) -> list[str]:
    try:
        return guide.chromium_flags(tmp_path / "profile")
    except CourseError as e:
        pytest.skip(f"{e}: the browser checks did not run")


def read_in_browser(served, tmp_path, pages: list[tuple[str, int]]) -> dict:
    """What Chromium shows for each (page, width) once MathJax and the images are done: {(page, width): record}."""
    base, probe = served
    probe["html"] = PROBE.replace("__PAGES__", json.dumps(
        [{"name": name, "url": f"{base}/{name}.html", "width": width} for name, width in pages]))
    proc = subprocess.run([*_browser(tmp_path), "--window-size=1400,1000", "--virtual-time-budget=600000",
                           "--dump-dom", f"{base}/__probe.html"], capture_output=True, text=True, timeout=600)
    m = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert m and m.group(1) != "running", f"the probe page did not finish in Chromium: {proc.stderr[-800:]}"
    records = json.loads(html_lib.unescape(m.group(1)))
    failed = [r for r in records if "error" in r]
    assert not failed, f"Chromium could not open: {failed}"
    return {(r["name"], r["width"]): r for r in records}


@pytest.fixture(scope="module")
def seen(served, tmp_path_factory):
    pages = [(name, DESKTOP) for name in ["index", *guide.FRONT_DOOR, "glossary", "listings", "measured"]]
    pages += [(f"chapters/{m.slug}", DESKTOP) for m in MODULES]
    pages += [(name, PHONE) for name in ["index", "chapters/06_autograd", "chapters/13_transformers",
                                         "chapters/17_acceleration", "chapters/20_serving"] if name == "index" or
              any(f"chapters/{m.slug}" == name for m in MODULES)]
    return read_in_browser(served, tmp_path_factory.mktemp("chromium"), pages)


@pytest.mark.slow
def test_maths_is_typeset_offline(seen):
    for (name, width), r in seen.items():
        if r["math"]:
            assert r["mathjax"], f"{name} holds {r['math']} formulas, but MathJax did not load"
            assert r["typeset"] >= r["math"], f"{name}: {r['typeset']} of its {r['math']} formulas were typeset"
        assert not r["raw"], f"{name} at {width} px shows raw TeX: {r['raw'][:3]}"
        assert not r["errors"], f"{name}: {r['errors']} formulas failed to typeset"
    for slug in MATH_CHAPTERS:
        if any(m.slug == slug for m in MODULES):
            assert seen[(f"chapters/{slug}", DESKTOP)]["typeset"] > 0, f"chapter {slug}: no formula was typeset"


@pytest.mark.slow
def test_listings_fit_their_column(seen):
    for (name, width), r in seen.items():
        if name.startswith("chapters/"):
            assert r["listings"] > 0, f"{name}: no listing found in the page"
        assert not r["overflow"], f"{name} at {width} px: listings scroll sideways: {r['overflow'][:3]}"
        assert not r["page_overflow"], f"{name} at {width} px: the page is {r['page_overflow']} px wide: {r['wide']}"


@pytest.mark.slow
def test_every_figure_loads_with_its_alt_text_and_legible_labels(seen, book):
    small = []
    for (name, width), r in seen.items():
        for img in r["images"]:
            assert img["loaded"], f"{name}: the figure {img['src']} did not load"
            assert len(img["alt"]) >= 20, f"{name}: the figure {img['src']} has no alt text worth the name: {img['alt']!r}"
            if width == DESKTOP and img["src"].endswith(".svg") and img["shown"] > 0:
                svg = ((book / name).parent / img["src"]).resolve().read_text(encoding="utf-8")
                font, view = svg_legibility(svg)
                if font * img["shown"] / view < 9:
                    small.append(f"{name}: {img['src']} labels {font * img['shown'] / view:.1f} px")
    assert not small, "figure labels too small to read at page width:\n  " + "\n  ".join(small)
    for m in MODULES:
        imgs = seen[(f"chapters/{m.slug}", DESKTOP)]["images"]
        assert any(i["src"].rsplit("/", 1)[-1] == f"{m.slug}.svg" for i in imgs), f"chapter {m.slug} shows no diagram"


@pytest.mark.slow
def test_front_door_pages_are_linked_from_the_home_page(seen):
    links = seen[("index", DESKTOP)]["links"]
    for name in guide.FRONT_DOOR:
        assert any(h.split("#")[0] == f"{name}.html" for h in links), f"the home page does not link {name}.html: {links}"
        assert seen[(name, DESKTOP)]["links"], f"{name}.html shows no links"
    modules = seen[("modules", DESKTOP)]["links"]
    assert all(any(h.startswith(f"chapters/{m.slug}.html") for h in modules) for m in MODULES), (
        "the module table does not link every chapter")


@pytest.mark.slow
def test_book_screenshots(book, tmp_path):
    """A chapter at a desktop and at a phone width, for a person to look at (saved under tmp_path)."""
    flags = _browser(tmp_path)
    from matplotlib.image import imread

    chapter = (book / "chapters" / "06_autograd.html").as_uri()
    for name, size in (("desktop", "1280,1600"), ("phone", "390,1600")):
        shot = tmp_path / f"{name}.png"
        proc = subprocess.run([*flags, f"--screenshot={shot}", f"--window-size={size}", "--virtual-time-budget=10000",
                               chapter], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and shot.is_file(), f"chromium could not screenshot {chapter}: {proc.stderr[-500:]}"
        assert imread(shot).std() > 0.01, f"the screenshot {shot} is blank"
    print(f"screenshots: {tmp_path / 'desktop.png'}, {tmp_path / 'phone.png'}")


@pytest.mark.slow
def test_pdf_of_the_guide(tmp_path):
    """`tito guide pdf` on an edition of two modules: one PDF with the chapters, the glossary and the list of
    listings, its maths typeset (no raw TeX in its text)."""
    pypdf = pytest.importorskip("pypdf")
    _browser(tmp_path)
    if guide._jupyter_book_cmd() is None:
        pytest.skip(f"Jupyter Book is not installed: `{guide.GUIDE_INSTALL}`")
    root = tmp_path / "edition"
    (root / "modules").mkdir(parents=True)
    for slug in ("01_tensor", "04_losses"):
        shutil.copytree(ROOT / "modules" / slug, root / "modules" / slug)
    shutil.copytree(GUIDE, root / "quarto", ignore=shutil.ignore_patterns("_book", "_jb", "chapters", "diagrams",
                                                                        "__pycache__", "mathjax", "*.qmd"))
    shutil.copytree(GUIDE / "pages", root / "quarto" / "pages", dirs_exist_ok=True)
    shutil.copytree(ROOT / "milestones", root / "milestones", ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    (root / "tests" / "benchmarks").mkdir(parents=True)
    shutil.copy2(ROOT / "settings.ini", root / "settings.ini")
    pdf = guide.build_pdf(root, tmp_path / "guide.pdf", src=tmp_path / "src", log=lambda s: None)
    reader = pypdf.PdfReader(str(pdf))
    text = "\n".join(page.extract_text() or "" for page in reader.pages)
    for needed in ("Module 01: Tensor", "Module 04: Losses", "Glossary", "List of listings", "Listing 1.1",
                   "Broadcasting", "How your work is checked"):
        assert needed in text, f"the PDF lacks {needed!r}"
    assert "\\frac" not in text and "\\(" not in text, "the PDF shows raw TeX: MathJax did not typeset before printing"
    assert len(reader.pages) > 20


# ---------------------------------------------------------------- result files (fast)


def test_milestone_report_writes_a_result_file(tmp_path, capsys):
    """`Run.report` writes what it checked, its verdict and the machine beside the plot: the guide's source."""
    import argparse

    import _harness as harness
    from tito import milestones as ms

    target = harness.Target.parse("at least 95% test accuracy, in under 2 minutes")
    run = harness.Run(ms.get(ROOT, "mlp"), argparse.Namespace(out=tmp_path / "mlp.png", quick=False), ROOT, target)
    assert run.report(("test accuracy", 0.97), seconds=12.5) == 0
    data = json.loads((tmp_path / "mlp.json").read_text())
    assert data["verdict"] == "PASS" and data["milestone"] == "mlp" and data["seconds"] == 12.5
    assert data["reached"] == [{"label": "test accuracy", "value": 0.97, "condition": ">= 95%"}]
    assert data["machine"]["cores"] and data["date"]
    # a speed judged on an interval, against a baseline that is a factor times a measured value
    beats = harness.Target.parse("faster than 3x the baseline")
    run = harness.Run(ms.get(ROOT, "mlp"), argparse.Namespace(out=tmp_path / "mlp.png", quick=False), ROOT, beats)
    code = run.report(beats=[("throughput", harness.Interval(650.0, 720.0, 690.0), "3x the baseline",
                              harness.Times(3, 228.3), "higher", "/s")])
    data = json.loads((tmp_path / "mlp.json").read_text())
    assert code == harness.NOISY_EXIT and data["verdict"] == "TOO NOISY TO TELL", data
    assert data["beats"][0]["value"] == {"low": 650.0, "high": 720.0, "estimate": 690.0}, data["beats"]
    assert data["beats"][0]["baseline_value"]["factor"] == 3.0, data["beats"]


def test_benchmark_result_is_written_where_asked(tmp_path, monkeypatch):
    from tests.support import bench

    out = tmp_path / "result.json"
    monkeypatch.setenv("TINYTORCH_RESULT_FILE", str(out))
    monkeypatch.setattr(bench, "RESULTS", [])
    bench.result("tinytorch / torch", 0.76, "x", goal="<= 1.3x", verdict="met")
    data = json.loads(out.read_text())
    assert data["results"] == [{"label": "tinytorch / torch", "value": 0.76, "unit": "x", "goal": "<= 1.3x",
                                "verdict": "met"}]


def test_measured_page_shows_every_kept_run(tmp_path):
    """Two kept runs of a benchmark: the page shows the newest output, a row per run, and the older output folded."""
    root = tmp_path / "course"
    (root / "tests" / "benchmarks").mkdir(parents=True)
    (root / "tests" / "benchmarks" / "bench_demo.py").write_text('"""Demo: how fast is it."""\n')
    (root / "milestones").mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "system": "Linux", "python": "3.11", "numpy": "2.0", "load_average": 1.5}
    for i, out in enumerate(("first run: 1.00x\n", "second run: 2.00x\n")):
        guide.measured.append_run(root / "quarto" / "measured" / "benchmarks" / "bench_demo.json",
                                  {"date": f"2026-01-0{i + 1} 10:00 UTC", "commit": f"abc{i}", "machine": machine,
                                   "command": "python tests/benchmarks/bench_demo.py", "exit": 0, "seconds": 3.0,
                                   "result": {"results": [{"label": "speedup", "value": 2.0, "unit": "x",
                                                           "goal": ">= 1.5x", "verdict": "met"}]},
                                   "output": out})
    text = guide.measured_sections(root, "jupyter-book")
    assert "second run: 2.00x" in text and "first run: 1.00x" in text and "<details>" in text
    assert "| speedup | 2 x | >= 1.5x | met |" in text and "Test CPU (2 cores" in text
    assert "All 2 kept runs, oldest first" in text and "| 2 | 2026-01-02 10:00 UTC | abc1 |" in text
