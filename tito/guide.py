"""The lab guide: the course's site. A front door for students and instructors, one chapter per module
(the student release of its notebook) with a diagram of its central idea and the figures a reference
run of the notebook drew, captioned listings, the glossary, the measured results, and the build
(`tito guide build`, `tito guide pdf`).

Everything in the book is generated at build time from `modules/`, `milestones/`, `quarto/pages/`,
`quarto/glossary.yml` and the result files in `quarto/measured/`; nothing is copied by hand and nothing
is executed. Two engines read the same generated sources:

- Quarto (`quarto render`), the book's engine where it is installed, from `quarto/` itself
  (`_quarto.yml`, whose chapter list is rewritten here between its marker comments);
- Jupyter Book 1.x (Sphinx + MyST-NB, `pip install -e ".[guide]"`) everywhere else, from a generated
  source folder (`quarto/_jb/`, with `_config.yml` and `_toc.yml` written from `BOOK`).

Both write the HTML book to `quarto/_book/`. Warnings fail the build. Maths is typeset by MathJax served
from the book itself (the `django-static-mathjax` package of the guide extra), so the book reads offline.

    tito guide build                      # the engine found here: Quarto, else Jupyter Book
    tito guide build --engine jupyter-book --out /tmp/book
    tito guide pdf                        # quarto/_book/tinytorch-guide.pdf (headless Chromium prints the book)
    tito guide measure notebooks 08 14    # the reference run: figures of the instructor notebooks
    python quarto/make_chapters.py && quarto render quarto     # the same with Quarto by hand
"""
from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tito import measured
from tito import notebooks as nbs
from tito.course import STUB_MARKER, CourseError, Module, load_modules

ENGINES = ("quarto", "jupyter-book")
BEGIN_MARK = "# BEGIN BOOK CHAPTERS"
END_MARK = "# END BOOK CHAPTERS"
CHAPTER_RE = re.compile(r"^\d{2}_[a-z0-9_]+\.ipynb$")
#: A code cell of a released chapter with more non-blank, non-comment lines than this gets a listing caption.
LISTING_MIN_LINES = 10
#: A caption's sentence longer than this is left out (never cut): the caption keeps the names.
CAPTION_MAX_SENTENCE = 240
EM_DASH = "\u2014"
GUIDE_INSTALL = 'pip install -e ".[guide]"'
PDF_NAME = "tinytorch-guide.pdf"

#: The book in reading order: (part caption, pages). A page NAME is `quarto/pages/NAME.qmd` (with its
#: `<!-- tito:... -->` lines filled in), except the generated ones; `@chapters` stands for the module chapters.
BOOK = [
    ("", ["index"]),
    ("Start here", ["setup", "modules", "milestones", "checking", "instructors"]),
    ("Modules", ["@chapters"]),
    ("Reference", ["glossary", "listings", "measured", "tools"]),
    ("Appendix", ["making", "authoring"]),
]
#: The pages a student reaches from the home page (tests/test_guide.py checks the links).
FRONT_DOOR = ["setup", "modules", "milestones", "checking", "instructors"]
GENERATED_PAGES = {"glossary", "listings"}
#: The MathJax files the book serves (relative to the package's es5/ folder): the TeX-to-HTML component,
#: its fonts, the TeX extensions it loads on demand, and the menu with its accessibility parts.
MATHJAX_FILES = ["tex-chtml.js", "output/chtml", "input/tex/extensions", "ui", "a11y", "adaptors"]
MATHJAX_ENTRY = "tex-chtml.js"


def guide_dir(root: Path) -> Path:
    return root / "quarto"


def chapter_title(module: Module) -> str:
    return f"Module {module.number}: {module.title}"


def listing_id(module: Module, k: int) -> str:
    return f"listing-{int(module.number)}-{k}"


def page_file(name: str, engine: str) -> str:
    return f"{name}.{'qmd' if engine == 'quarto' else 'md'}"


# ---------------------------------------------------------------- glossary


@dataclass(frozen=True)
class Term:
    term: str
    slug: str
    module: str  # "06"
    text: str


def load_glossary(root: Path) -> list[Term]:
    """The terms of `quarto/glossary.yml`, the glossary's one source."""
    import yaml

    path = guide_dir(root) / "glossary.yml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CourseError(f"cannot read the glossary {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise CourseError(f"{path} is not valid YAML: {e}") from None
    terms = []
    for i, t in enumerate(data.get("terms") or []):
        missing = [k for k in ("term", "slug", "module", "text") if not t.get(k)]
        if missing:
            raise CourseError(f"{path}: term {i + 1} ({t.get('term', '?')}) lacks {', '.join(missing)}")
        terms.append(Term(str(t["term"]), str(t["slug"]), str(t["module"]).zfill(2), " ".join(str(t["text"]).split())))
    return terms


def term_module(term: Term, modules: list[Module]) -> tuple[str, Module | None]:
    """("Module 06 (autograd)", the Module) when its folder exists, else ("Module 06", None): an edition
    with fewer modules names the module by its number only."""
    mod = next((m for m in modules if m.number == term.module), None)
    return (f"Module {term.module} ({mod.name})" if mod else f"Module {term.module}"), mod


def render_glossary(root: Path, modules: list[Module], engine: str) -> str:
    terms = load_glossary(root)
    if engine == "quarto":
        out = ["---", "number-sections: false", "---", "", "# Glossary {.unnumbered}", ""]
    else:
        out = ["# Glossary", ""]
    out += ["The course's vocabulary, in alphabetical order. Each entry says what the word means *in this",
            "course* and links the module where the idea is central, which is where to read more.", ""]
    for t in terms:
        label, mod = term_module(t, modules)
        if engine == "quarto":
            out.append(f"## {t.term} {{#{t.slug}}}")
        else:
            out += [f"({t.slug})=", f"## {t.term}"]
        where = f"[{label}](chapters/{mod.slug}.ipynb)" if mod else label
        out += ["", t.text, "", f"*Central in:* {where}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- listings


@dataclass
class Listing:
    module: Module
    k: int
    kind: str  # "exercise" (yours to write) or "given"
    what: str  # "`unbroadcast`: reduce `grad` to `shape` by ..."
    exercise: str = ""  # "6.2" for an exercise

    @property
    def id(self) -> str:
        return listing_id(self.module, self.k)

    @property
    def label(self) -> str:
        return f"Listing {int(self.module.number)}.{self.k}"

    @property
    def role(self) -> str:
        return f"Exercise {self.exercise}, yours to write" if self.kind == "exercise" else "given"

    @property
    def caption(self) -> str:
        return f"{self.label} ({self.role}): {self.what}"


def _code_lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def first_sentence(text: str) -> str | None:
    """The first whole sentence of `text` (a docstring or a paragraph), or None when there is none short
    enough to be a caption. Never cut: a sentence is kept whole or not at all."""
    text = " ".join(text.split())
    text = re.sub(r"^TODO \(Exercise [0-9.a-z]+\):?\s*", "", text)
    end = None
    for m in re.finditer(r"[.!?](?=\s|$)", text):
        before = text[: m.start() + 1]
        if re.search(r"\b(e\.g|i\.e|etc|vs|cf|approx)\.$", before) or before.count("`") % 2:
            continue  # an abbreviation, or a full stop inside inline code
        end = m.end()
        break
    m = re.match(r"(.*)", text[:end] if end else text)
    sentence = (m.group(1) if m else text).strip()
    if not sentence or len(sentence) > CAPTION_MAX_SENTENCE or sentence.count("`") % 2:
        return None
    if not sentence.endswith((".", "!", "?")):
        sentence += "."
    sentence = sentence.replace(EM_DASH, ",")
    return sentence[0].upper() + sentence[1:] if sentence[0].islower() else sentence


def _exercise_of(source: str, heading_exercise: str) -> str:
    m = re.search(r"TODO \(Exercise (\d+\.\d+)", source)
    return m.group(1) if m else heading_exercise


def listing_what(source: str, context: str, solution: bool = False) -> str | None:
    """What a substantive code cell does, for its caption (the names it defines and the first sentence of
    their contract, else the first sentence of the text above it); None for a cell that gets no listing."""
    if len(_code_lines(source)) <= LISTING_MIN_LINES:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    body = tree.body if tree else []
    if tree is not None and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body):
        return None
    defs = [d for d in body if isinstance(d, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    if defs:
        public = [d for d in defs if not d.name.startswith("_")] or defs
        names = ", ".join(f"`{d.name}`" for d in public[:4]) + (" and more" if len(public) > 4 else "")
        docs = [(ast.get_docstring(d) or "") for d in public]
        if solution:  # the contract of the stub to write comes first
            docs = [d for d in docs if "TODO" in d] + [d for d in docs if "TODO" not in d]
        sentence = next((s for s in map(first_sentence, filter(None, docs)) if s and len(s.split()) >= 3), None)
        return f"{names}. {sentence}" if sentence else names
    sentence = first_sentence(context) if context else None
    return sentence or "Code that runs the section above."


def _plain_paragraph(markdown: str) -> str:
    """The last prose paragraph of a markdown cell (no headings, lists, code or tables)."""
    paras = [p for p in re.split(r"\n\s*\n", markdown) if p.strip()]
    for p in reversed(paras):
        first = p.lstrip()
        if not first.startswith(("#", "-", "*", "|", "```", "    ", ">", ":::", "$$", "1.")):
            return " ".join(p.split())
    return ""


# ---------------------------------------------------------------- chapters


def _hook_index(nb) -> int:
    "Index of the hook: the first markdown cell (the notebook's title cell, which opens with the systems question)."
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown")


def figure_block(src: str, alt: str, caption: str, label: str, engine: str) -> str:
    alt = " ".join(alt.split()).replace('"', "'")
    if engine == "quarto":
        return f"![{caption}]({src}){{#{label} fig-alt=\"{alt}\"}}"
    return f":::{{figure}} {src}\n:alt: {alt}\n:name: {label}\n\n{caption}\n:::"


def measured_caption(record: dict) -> str:
    return (f"Measured: drawn by this cell in a reference run of the instructor notebook on "
            f"{measured.machine_text(record['machine'])}, {record['date']}"
            + (f", commit {record['commit']}" if record.get("commit") else "")
            + ". Your machine draws its own when you run the notebook.")


def chapter(module: Module, engine: str, diagram: dict | None = None, figures: dict | None = None,
            ) -> tuple[nbformat.NotebookNode, list[Listing]]:
    """The chapter of `module` for `engine`: its student release (no solutions, no hidden tests, no
    outputs), titled from module.toml, its diagram after the hook, a caption before each substantive
    code cell (tagged `exercise`, `test` or `given` so the page shows which is which), and after each
    figure cell the figure the reference run measured (`figures`, from `measured.notebook_figures`).
    Refuses (CourseError) a release in which solution text survives."""
    source = nbs.read(module.notebook)
    nb = nbs.release(source)
    leaks = [ln for c in nb.cells for ln in c.source.splitlines()
             if nbs.BEGIN_SOLUTION in ln or nbs.BEGIN_HIDDEN in ln]
    text = "\n".join(c.source for c in nb.cells)
    leaks += [ln for ln in nbs.solution_only_lines(source) if ln in text]
    if leaks:
        raise CourseError(f"the release of {module.notebook} still shows solution text: {leaks[:3]}")
    n = int(module.number)
    by_cell: dict[str, list[dict]] = {}
    for f in (figures or {}).get("figures", []):
        by_cell.setdefault(f["cell_id"], []).append(f)
    cells, listings, heading_ex, context = [], [], "", ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            exes = re.findall(r"^#{1,4} +Exercise (\d+\.\d+)", cell.source, re.M)
            if exes:
                heading_ex = exes[-1]
            context = _plain_paragraph(cell.source) or context
        elif cell.cell_type == "code":
            tests = nbs.is_test_cell(cell)
            solution = nbs.is_solution_cell(cell)
            kind = "test" if tests else ("exercise" if solution and STUB_MARKER in cell.source else "given")
            cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | {kind})
            what = None if tests else listing_what(cell.source, context, solution)
            if what:
                lst = Listing(module, len(listings) + 1, "exercise" if kind == "exercise" else "given", what,
                              _exercise_of(cell.source, heading_ex) if kind == "exercise" else "")
                listings.append(lst)
                bold = f"**{lst.label}** *({lst.role})*: {lst.what}"
                if engine == "quarto":
                    cap = f"::: {{#{lst.id} .listing-caption .{lst.kind}}}\n{bold}\n:::"
                else:
                    cap = f"({lst.id})=\n{{.listing-caption .{lst.kind}}}\n{bold}"
                cells.append(nbformat.v4.new_markdown_cell(cap))
        cells.append(cell)
        for f in by_cell.get(cell.get("id"), []):
            k = len([c for c in cells if c.get("metadata", {}).get("tito") == "measured"]) + 1
            fig = figure_block(f"../measured/notebooks/{module.slug}/{f['file']}", f["alt"],
                               measured_caption(figures), f"fig-measured-{n}-{k}", engine)
            mcell = nbformat.v4.new_markdown_cell(fig)
            mcell.metadata["tito"] = "measured"
            cells.append(mcell)
    nb.cells = cells
    hook = _hook_index(nb)
    lines = nb.cells[hook].source.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    body = "\n".join(lines).lstrip("\n")
    note = (f"This chapter is the student release of `modules/{module.slug}/{module.slug}.ipynb`: exercises "
            f"show stubs, not solutions, marked *yours to write*; code marked *given* is part of the course. "
            f"Work in the notebook itself (`tito module start {module.number}`).")
    nb.cells[hook].source = body
    if engine == "quarto":
        front = ["---", f"title: {json.dumps(chapter_title(module), ensure_ascii=False)}"]
        if module.summary:
            front.append(f"subtitle: {json.dumps(module.summary, ensure_ascii=False)}")
        front.append("---")
        head = [nbformat.v4.new_raw_cell("\n".join(front)),
                nbformat.v4.new_markdown_cell(f"::: {{.callout-note}}\n{note}\n:::")]
    else:
        title = f"# {chapter_title(module)}" + (f"\n\n*{module.summary}*" if module.summary else "")
        head = [nbformat.v4.new_markdown_cell(title), nbformat.v4.new_markdown_cell(f":::{{note}}\n{note}\n:::")]
    figure = []
    if diagram:
        figure = [nbformat.v4.new_markdown_cell(figure_block(
            f"../diagrams/{diagram['file']}", diagram["alt"], diagram["caption"], f"fig-module-{n}", engine))]
    nb.cells = head + nb.cells[:hook + 1] + figure + nb.cells[hook + 1:]
    for i, c in enumerate(nb.cells):  # stable ids: the same module gives the same chapter file
        c["id"] = f"c{i:03d}"
        c.metadata.pop("tito", None)
    return nb, listings


def render_listings(listings: list[Listing], engine: str) -> str:
    if engine == "quarto":
        out = ["# List of listings {.unnumbered}", ""]
    else:
        out = ["# List of listings", ""]
    out += ["Every class, function or algorithm of more than ten lines in the chapters carries a caption",
            "`Listing N.M`, numbered per chapter (N is the module). *Yours to write* marks an exercise: the",
            "chapter shows its stub and contract; *given* marks code the course gives you.", ""]
    current = None
    for lst in listings:
        if lst.module is not current:
            current = lst.module
            out += ["", f"**{chapter_title(current)}**", ""]
        if engine == "quarto":
            out.append(f"- [{lst.caption}](chapters/{lst.module.slug}.ipynb#{lst.id})")
        else:  # a ref role's title cannot hold backticks
            out.append(f"- {{ref}}`{lst.caption.replace('`', '').replace('<', '&lt;')} <{lst.id}>`")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- generated parts of the pages


def _md_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def module_table(root: Path, modules: list[Module]) -> str:
    """The modules with what each builds and what it needs, from module.toml, and the milestones they unlock."""
    from tito import milestones as ms

    try:
        stones = ms.discover(root)
    except CourseError:
        stones = []
    by_number = {m.number: m for m in modules}

    def direct(m: Module) -> list[str]:  # prerequisites not already reached through another one
        def below(number: str, seen=None) -> set[str]:
            seen = set() if seen is None else seen
            for p in by_number[number].prerequisites if number in by_number else []:
                if p not in seen:
                    seen.add(p)
                    below(p, seen)
            return seen
        ps = [p for p in m.prerequisites if p in by_number]
        return [p for p in ps if not any(p in below(q) for q in ps if q != p)]

    rows = ["| # | module | what you build | builds on | package | unlocks |", "|---|---|---|---|---|---|"]
    for m in modules:
        needs = ", ".join(f"[{p}](chapters/{by_number[p].slug}.ipynb)" for p in direct(m)) or "nothing"
        unlocks = [s for s in stones if s.needs and max(s.needs) == m.number]
        rows.append(f"| {m.number} | [{m.title}](chapters/{m.slug}.ipynb) | {_md_cell(m.summary)} | {needs} | "
                    f"`{m.package_module or '-'}` | {', '.join(f'[{s.name}](milestones.qmd#{_anchor(s)})' for s in unlocks) or '-'} |")
    return "\n".join(rows)


def _anchor(stone) -> str:
    return f"milestone-{stone.name}"


def _run_line(run: dict) -> str:
    bits = [run.get("date"), f"commit {run['commit']}" if run.get("commit") else None,
            measured.machine_text(run["machine"]) if run.get("machine") else None]
    return ", ".join(b for b in bits if b)


def _verdict(run: dict) -> str:
    res = run.get("result") or {}
    return res.get("verdict") or ("exit 0" if run.get("exit") == 0 else f"exit {run.get('exit')}")


def milestone_sections(root: Path, modules: list[Module], engine: str) -> str:
    """One section per milestone: what it rebuilds, its target, the modules it needs, how to run it, and
    the plot and verdict of its newest measured run."""
    from tito import milestones as ms

    by_number = {m.number: m for m in modules}
    out = []
    for s in ms.discover(root):
        doc = ast.get_docstring(ast.parse(s.script.read_text(encoding="utf-8"))) or ""
        intro = doc.split("\n\n")[0].strip()
        needs = ", ".join(f"[{n} {by_number[n].title}](chapters/{by_number[n].slug}.ipynb)" if n in by_number else n
                          for n in s.needs)
        heading = f"## {s.year}: {s.name} {{#{_anchor(s)}}}" if engine == "quarto" else f"({_anchor(s)})=\n## {s.year}: {s.name}"
        out += [heading, "", f"**{_md_cell(s.title)}.** {' '.join(intro.split())}", "",
                f"- **Target:** {s.target}.", f"- **Needs:** {needs}.",
                f"- **Run it:** `tito milestone run {s.name}` (add `--quick` for a short run that may miss the "
                f"target). It saves its plot to `milestones/outputs/{s.script.stem}.png` and its result to "
                f"`milestones/outputs/{s.script.stem}.json`.", ""]
        runs = measured.milestone_runs(root, s.name)
        if runs:
            last = runs[-1]
            out += [f"Measured ({'the only kept run' if len(runs) == 1 else f'the newest of {len(runs)} kept runs'}, {_run_line(last)}): **{_verdict(last)}** in "
                    f"{last.get('seconds')} s. Every kept run is on the [measured page](measured.qmd#{_anchor(s)}-runs).", ""]
            if last.get("plot") and (measured.measured_dir(root) / "milestones" / last["plot"]).is_file():
                out += [figure_block(f"measured/milestones/{last['plot']}",
                                     f"The plot the {s.name} milestone saved in its newest measured run: {s.title}.",
                                     f"The plot `tito milestone run {s.name}` saved, measured {_run_line(last)}.",
                                     f"fig-milestone-{s.name}", engine), ""]
        else:
            out += ["Not measured yet: `tito guide measure milestone " + s.name + "` runs it and keeps the result here.", ""]
    return "\n".join(out)


def _code_block(text: str, fence: str = "```") -> list[str]:
    while fence in text:
        fence += "`"
    return [f"{fence}text", text.rstrip("\n"), fence]


def _results_table(result: dict | None) -> list[str]:
    rows = (result or {}).get("results") or []
    if not rows:
        return []
    out = ["| result | value | goal | verdict |", "|---|---|---|---|"]
    for r in rows:
        v = r.get("value")
        value = v if isinstance(v, str) else ("-" if v is None else f"{v:.4g}{(' ' + r['unit']) if r.get('unit') else ''}")
        out.append(f"| {_md_cell(r.get('label'))} | {_md_cell(value)} | {_md_cell(r.get('goal') or '-')} | "
                   f"{_md_cell(r.get('verdict') or '-')} |")
    return out + [""]


def _history(runs: list[dict], key: str) -> list[str]:
    out = ["| run | date | commit | verdict | seconds | load average |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        m = r.get("machine") or {}
        out.append(f"| {i} | {r.get('date', '-')} | {r.get('commit') or '-'} | {_verdict(r)} | {r.get('seconds', '-')} | "
                   f"{m.get('load_average', '-')} |")
    return out + [""]


def _details(summary: str, text: str) -> list[str]:
    return ["<details>", f"<summary>{html.escape(summary)}</summary>", "",
            "<pre>" + html.escape(text.rstrip("\n")) + "</pre>", "", "</details>", ""]


def measured_sections(root: Path, engine: str) -> str:
    """The milestones' and benchmarks' kept runs: for each, the newest run's output in full, the runs before
    it as a table and, folded, their outputs. Every number here is in a result file."""
    from tito import milestones as ms

    out = ["## Milestones", ""]
    for s in ms.discover(root):
        runs = measured.milestone_runs(root, s.name)
        anchor = f"{_anchor(s)}-runs"
        out += [f"### {s.year}: {s.name} {{#{anchor}}}" if engine == "quarto" else f"({anchor})=\n### {s.year}: {s.name}", ""]
        if not runs:
            out += [f"No kept run yet (`tito guide measure milestone {s.name}`).", ""]
            continue
        last = runs[-1]
        out += [f"Target: {s.target}.", "",
                f"The newest run: `{last.get('command')}`, {_run_line(last)}; **{_verdict(last)}** in "
                f"{last.get('seconds')} s. What it printed:", "", *_code_block(last.get("output", "")), ""]
        if len(runs) > 1:
            out += [f"All {len(runs)} kept runs, oldest first:", "", *_history(runs, "milestone")]
            for i, r in enumerate(runs[:-1], 1):
                out += _details(f"run {i}: {r.get('date')}, {_verdict(r)}", r.get("output", ""))
    out += ["## Benchmarks", ""]
    for script in measured.benchmark_scripts(root):
        runs = measured.benchmark_runs(root, script.stem)
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
        anchor = f"benchmark-{script.stem.replace('_', '-')}"
        out += [f"### {script.stem} {{#{anchor}}}" if engine == "quarto" else f"({anchor})=\n### {script.stem}", "",
                " ".join(doc.split("\n\n")[0].split()) or f"`tests/benchmarks/{script.name}`.", ""]
        if not runs:
            out += [f"No kept run yet: `tito guide measure bench {script.stem}` runs "
                    f"`python tests/benchmarks/{script.name}` and keeps what it printed here.", ""]
            continue
        last = runs[-1]
        out += [f"The newest run: `{last.get('command')}`, {_run_line(last)}, {last.get('seconds')} s:", "",
                *_results_table(last.get("result")), *_code_block(last.get("output", "")), ""]
        if len(runs) > 1:
            out += [f"All {len(runs)} kept runs, oldest first:", "", *_history(runs, "benchmark")]
            for i, r in enumerate(runs[:-1], 1):
                out += _details(f"run {i}: {r.get('date')}, commit {r.get('commit')}", r.get("output", ""))
    return "\n".join(out)


def measured_figures_list(root: Path, modules: list[Module]) -> str:
    """Which chapters show figures of the reference run, when and where they were measured."""
    rows = ["| module | figures | date | commit | load average | run time |", "|---|---|---|---|---|---|"]
    machines = []
    for m in modules:
        rec = measured.notebook_figures(root, m)
        if rec:
            where = measured.machine_text({k: v for k, v in rec["machine"].items() if k != "load_average"})
            if where not in machines:
                machines.append(where)
            rows.append(f"| [{m.number} {m.title}](chapters/{m.slug}.ipynb) | {len(rec['figures'])} | {rec['date']} | "
                        f"{rec.get('commit') or '-'} | {rec['machine'].get('load_average', '-')} | {rec['seconds']:.0f} s |")
        elif measured_figure_cells(m):
            rows.append(f"| [{m.number} {m.title}](chapters/{m.slug}.ipynb) | not measured yet | - | - | - | - |")
    head = [f"Measured on {_md_cell(w)}." for w in machines]
    return "\n".join(head + [""] + rows)


def measured_figure_cells(module: Module) -> list[int]:
    try:
        return measured.figure_cells(nbs.read(module.notebook))
    except Exception:
        return []


# ---------------------------------------------------------------- pages


_PLACEHOLDER = re.compile(r"^<!-- tito:([a-z-]+)(?: ([\w./-]+))? -->\s*$", re.M)


def render_page(root: Path, name: str, modules: list[Module], engine: str) -> str:
    """`quarto/pages/NAME.qmd` with its `<!-- tito:... -->` lines replaced by what they stand for, in the
    engine's dialect (Quarto markdown, or MyST for Jupyter Book)."""
    pages = guide_dir(root) / "pages"
    path = pages / f"{name}.qmd"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CourseError(f"cannot read the guide page {path}: {e.strerror}") from None

    def fill(m: re.Match) -> str:
        what, arg = m.group(1), m.group(2)
        if what == "include":
            inc = pages / arg
            if not inc.is_file():
                raise CourseError(f"{path}: `<!-- tito:include {arg} -->` names no file in {pages}")
            return inc.read_text(encoding="utf-8").rstrip("\n")
        makers = {"module-table": lambda: module_table(root, modules),
                  "milestones": lambda: milestone_sections(root, modules, engine),
                  "measured": lambda: measured_sections(root, engine),
                  "measured-figures": lambda: measured_figures_list(root, modules)}
        if what not in makers:
            raise CourseError(f"{path}: unknown placeholder `<!-- tito:{what} -->`; known: include, {', '.join(makers)}")
        return makers[what]()

    text = _PLACEHOLDER.sub(fill, _PLACEHOLDER.sub(lambda m: fill(m) if m.group(1) == "include" else m.group(0), text))
    return to_engine(text, engine)


def to_engine(text: str, engine: str) -> str:
    """Quarto markdown as written in quarto/pages, or its MyST equivalent for Jupyter Book: links to `.qmd`
    pages, `{.unnumbered}`, `{#id}` headings and callouts."""
    if engine == "quarto":
        return text
    text = re.sub(r"\s*\{\.unnumbered\}", "", text)
    # a link to a target on another page is a reference to its label (Sphinx labels are global)
    text = re.sub(r"\[([^\]]+)\]\([\w/-]+\.qmd#([\w-]+)\)",
                  lambda m: f"{{ref}}`{m.group(1).replace('`', '')} <{m.group(2)}>`", text)
    text = re.sub(r"\]\(([\w/-]+)\.qmd\)", r"](\1.md)", text)
    text = re.sub(r"^(#+ .+?) \{#([\w-]+)\}$", r"(\2)=\n\1", text, flags=re.M)
    text = re.sub(r"^::: *\{\.callout-(note|tip|warning|important)\}", r":::{\1}", text, flags=re.M)
    return text


# ---------------------------------------------------------------- the book's structure


def _pages(modules: list[Module], engine: str) -> list[tuple[str, list[str]]]:
    """BOOK with the module chapters spelled out: (part caption, [file names]) for `engine`."""
    parts = []
    for caption, names in BOOK:
        files = []
        for name in names:
            if name == "@chapters":
                files += [f"chapters/{m.slug}.ipynb" for m in modules]
            else:
                files.append(page_file(name, engine))
        parts.append((caption, files))
    return parts


def update_quarto_config(config: Path, modules: list[Module]) -> None:
    """Rewrite the lines between the marker comments of `_quarto.yml` with the book's pages and chapters."""
    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise CourseError(f"cannot read the book configuration {config}: {e.strerror}") from None
    try:
        begin = next(i for i, ln in enumerate(lines) if ln.strip().startswith(BEGIN_MARK))
        end = next(i for i, ln in enumerate(lines) if i > begin and ln.strip().startswith(END_MARK))
    except StopIteration:
        raise CourseError(f"{config} lacks the marker comments `{BEGIN_MARK}` and `{END_MARK}` "
                          "around the book's chapters") from None
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    titles = {f"chapters/{m.slug}.ipynb": chapter_title(m) for m in modules}
    entries = []
    for caption, files in _pages(modules, "quarto"):
        pad = indent
        if caption:
            entries += [f"{indent}- part: {json.dumps(caption)}", f"{indent}  chapters:"]
            pad = indent + "    "
        entries += [f"{pad}- {f}" + (f"  # {titles[f]}" if f in titles else "") for f in files]
    new = "\n".join(lines[: begin + 1] + entries + lines[end:]) + "\n"
    if new != config.read_text(encoding="utf-8"):
        config.write_text(new, encoding="utf-8")


def jupyter_book_config(modules: list[Module]) -> tuple[str, str]:
    """(_config.yml, _toc.yml) of the Jupyter Book build, written from BOOK and the module list."""
    config = f"""# Generated by tito/guide.py from modules/ and quarto/: do not edit (edit those instead).
title: TinyTorch lab guide
author: TinyTorch developers
copyright: ""
only_build_toc_files: true
execute:
  execute_notebooks: "off"
parse:
  myst_enable_extensions: [colon_fence, dollarmath, deflist, attrs_inline, attrs_block]
html:
  use_repository_button: false
  use_issues_button: false
  use_edit_page_button: false
launch_buttons:
  notebook_interface: classic
  binderhub_url: ""
  thebe: false
sphinx:
  config:
    html_show_copyright: false
    html_show_sphinx: false
    numfig: true
    numfig_secnum_depth: 1
    language: en
    html_static_path: [_guide_static]
    html_css_files: [guide.css]
    mathjax_path: mathjax/{MATHJAX_ENTRY}
"""
    toc = ["# Generated by tito/guide.py from modules/ and quarto/: do not edit.", "format: jb-book"]
    parts = _pages(modules, "jupyter-book")
    root_page = parts[0][1][0]
    toc += [f"root: {root_page.rsplit('.', 1)[0]}", "parts:"]
    for caption, files in parts:
        files = [f for f in files if f != root_page]
        if not files:
            continue
        toc += [f"  - caption: {caption}", "    numbered: false", "    chapters:"]
        toc += [f"      - file: {f.rsplit('.', 1)[0]}" for f in files]
    return config, "\n".join(toc) + "\n"


# ---------------------------------------------------------------- MathJax, served by the book itself


def mathjax_dir() -> Path:
    """The es5/ folder of the MathJax 3 that the guide extra installs (the `django-static-mathjax` package,
    whose Python package is `mathjax`)."""
    try:
        import mathjax
    except ImportError:
        raise CourseError(f"MathJax is not installed, so the guide's maths would not render offline: run "
                          f"`{GUIDE_INSTALL}` (it installs the django-static-mathjax package)") from None
    es5 = Path(mathjax.__file__).resolve().parent / "static" / "mathjax" / "es5"
    if not (es5 / MATHJAX_ENTRY).is_file():
        raise CourseError(f"the installed MathJax package has no {MATHJAX_ENTRY} under {es5}: reinstall it with "
                          f"`{GUIDE_INSTALL}`")
    return es5


def copy_mathjax(dest: Path) -> Path:
    """Copy the MathJax files the book needs into `dest` (its TeX-to-HTML component and fonts)."""
    es5 = mathjax_dir()
    if dest.exists():
        shutil.rmtree(dest)
    for rel in MATHJAX_FILES:
        src = es5 / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel)
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


# ---------------------------------------------------------------- the book's sources


def prepare(root: Path, engine: str, src: Path | None = None, log=print) -> Path:
    """Write the book's sources for `engine` into `src` (default: `quarto/` for Quarto, `quarto/_jb/`
    for Jupyter Book): pages, chapters, diagrams, glossary, list of listings, MathJax, the stylesheet,
    the measured figures and the configuration."""
    if engine not in ENGINES:
        raise CourseError(f"unknown guide engine {engine!r}: use one of {', '.join(ENGINES)}")
    root = root.resolve()
    modules = load_modules(root)
    if not modules:
        raise CourseError(f"no modules found under {root / 'modules'}")
    gdir = guide_dir(root)
    if src is None:
        src = gdir if engine == "quarto" else gdir / "_jb"
    src = Path(src).resolve()
    in_place = src == gdir.resolve()
    if engine == "quarto":
        config = src / "_quarto.yml"
        if not in_place:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(gdir / "_quarto.yml", config)
        update_quarto_config(config, modules)  # first: a bad config stops before anything is written
    else:
        if src.exists():
            shutil.rmtree(src)
        src.mkdir(parents=True)
    sys.path.insert(0, str(gdir))
    try:
        import diagrams as diagram_maker  # quarto/diagrams.py
    finally:
        sys.path.remove(str(gdir))
    figs = diagram_maker.write_diagrams(root, modules, src / "diagrams")
    # not _static/: Jupyter Book would link every .js file there (all of MathJax) into each page; Sphinx
    # loads MathJax once, by mathjax_path
    if engine == "jupyter-book":
        copy_mathjax(src / "_guide_static" / "mathjax")
        shutil.copy2(gdir / "guide.css", src / "_guide_static" / "guide.css")
    else:
        copy_mathjax(src / "mathjax")
        if not in_place:
            shutil.copy2(gdir / "guide.css", src / "guide.css")
    if not in_place and (measured.measured_dir(root)).is_dir():
        if (src / "measured").exists():
            shutil.rmtree(src / "measured")
        shutil.copytree(measured.measured_dir(root), src / "measured",
                        ignore=shutil.ignore_patterns("*.json"))
    out = src / "chapters"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {f"{m.slug}.ipynb" for m in modules}
    for old in out.iterdir():  # chapters of modules that no longer exist
        if CHAPTER_RE.match(old.name) and old.name not in wanted:
            old.unlink()
    listings: list[Listing] = []
    for m in modules:
        nb, lst = chapter(m, engine, figs.get(m.slug), measured.notebook_figures(root, m))
        listings += lst
        nbs.write(nb, out / f"{m.slug}.ipynb")
        log(f"chapter {m.slug}: {len(lst)} listings")
    (src / page_file("glossary", engine)).write_text(render_glossary(root, modules, engine), encoding="utf-8")
    (src / page_file("listings", engine)).write_text(render_listings(listings, engine), encoding="utf-8")
    for _, names in BOOK:
        for name in names:
            if name != "@chapters" and name not in GENERATED_PAGES:
                (src / page_file(name, engine)).write_text(render_page(root, name, modules, engine), encoding="utf-8")
    if engine == "jupyter-book":
        config, toc = jupyter_book_config(modules)
        (src / "_config.yml").write_text(config, encoding="utf-8")
        (src / "_toc.yml").write_text(toc, encoding="utf-8")
    return src


# ---------------------------------------------------------------- build


def available_engine() -> str | None:
    if shutil.which("quarto"):
        return "quarto"
    if _jupyter_book_cmd():
        return "jupyter-book"
    return None


def _jupyter_book_cmd() -> list[str] | None:
    exe = Path(sys.executable).with_name("jupyter-book")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("jupyter-book")
    return [found] if found else None


def _run_engine(cmd: list[str], root: Path, engine: str, log) -> None:
    log("+ " + " ".join(cmd))
    env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        warnings = [ln for ln in text.splitlines() if re.search(r"WARNING|ERROR|Error", ln)]
        raise CourseError(f"the guide's {engine} build failed (exit {proc.returncode}); warnings fail the build:\n"
                          + "\n".join((warnings or text.splitlines())[-40:]))


def build(root: Path, engine: str = "auto", out: Path | None = None, src: Path | None = None,
          log=print) -> Path:
    """Build the HTML book into `out` (default `quarto/_book/`); returns `out`. Warnings fail the build."""
    root = root.resolve()
    if engine == "auto":
        engine = available_engine() or ""
        if not engine:
            raise CourseError("no engine to build the guide: install Quarto (https://quarto.org) or Jupyter Book "
                              f"with `{GUIDE_INSTALL}`")
    out = Path(out).resolve() if out else guide_dir(root) / "_book"
    src = prepare(root, engine, src, log=log)
    if engine == "quarto":
        exe = shutil.which("quarto")
        if not exe:
            raise CourseError("--engine quarto: the `quarto` program is not installed (https://quarto.org)")
        _run_engine([exe, "render", str(src), "--to", "html", "--output-dir", str(out)], root, engine, log)
    else:
        jb = _jupyter_book_cmd()
        if not jb:
            raise CourseError(f"--engine jupyter-book: Jupyter Book is not installed; run `{GUIDE_INSTALL}`")
        _run_engine([*jb, "build", str(src), "--builder", "html", "--warningiserror", "--keep-going", "--quiet",
                     "--path-output", str(src)], root, engine, log)
        html_dir = src / "_build" / "html"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html_dir, out)
    log(f"the guide is in {out} (open {out / 'index.html'})")
    return out


# ---------------------------------------------------------------- PDF


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_flags(profile: Path) -> list[str]:
    """Headless Chromium that reaches nothing outside the machine and leaves nothing behind."""
    exe = chromium()
    if exe is None:
        raise CourseError("headless Chromium is not installed: `apt-get install -y chromium` (Debian, Ubuntu); "
                          "`python3 -m tito.bootstrap test` installs it when it runs as root")
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--allow-file-access-from-files",
            "--hide-scrollbars", f"--user-data-dir={profile}"]


def build_pdf(root: Path, out: Path | None = None, src: Path | None = None, log=print) -> Path:
    """The whole book as one PDF (glossary and list of listings included): Jupyter Book writes it as one
    HTML page (its `singlehtml` builder, on the same sources), which headless Chromium prints once MathJax
    has typeset the maths. Returns the PDF's path (default `quarto/_book/tinytorch-guide.pdf`)."""
    import tempfile

    root = root.resolve()
    jb = _jupyter_book_cmd()
    if not jb:
        raise CourseError(f"the PDF is printed from Jupyter Book's one-page build: run `{GUIDE_INSTALL}`")
    flags = chromium_flags(Path(tempfile.mkdtemp(prefix="tito-chromium-")))
    out = Path(out).resolve() if out else guide_dir(root) / "_book" / PDF_NAME
    src = prepare(root, "jupyter-book", src, log=log)
    _run_engine([*jb, "build", str(src), "--builder", "singlehtml", "--warningiserror", "--keep-going", "--quiet",
                 "--path-output", str(src)], root, "jupyter-book", log)
    page = src / "_build" / "singlehtml" / "index.html"
    if not page.is_file():
        raise CourseError(f"Jupyter Book's one-page build wrote no {page}")
    # the print stylesheet: no navigation, listings wrapped, a page break before each chapter
    (page.parent / "_static" / "print.css").write_text((guide_dir(root) / "print.css").read_text(encoding="utf-8"),
                                                       encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    page.write_text(text.replace("</head>", '<link rel="stylesheet" href="_static/print.css" />\n</head>', 1),
                    encoding="utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    cmd = [*flags, "--no-pdf-header-footer", "--generate-pdf-document-outline", "--run-all-compositor-stages-before-draw",
           "--virtual-time-budget=60000", f"--print-to-pdf={tmp}", page.as_uri()]
    log("+ " + " ".join(cmd[:1] + ["...", f"--print-to-pdf={out}", page.as_uri()]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size < 10_000:
        raise CourseError(f"Chromium did not print the guide (exit {proc.returncode}): {proc.stderr[-800:]}")
    os.replace(tmp, out)
    log(f"the guide's PDF is {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return out


# ---------------------------------------------------------------- tito guide


def _cli():
    import typer

    from tito.ui import console, handle_errors

    app = typer.Typer(help="The lab guide: the course's site and its PDF.", no_args_is_help=True)

    def say(s: str) -> None:
        console.print(s, markup=False, highlight=False)

    @app.command("build")
    @handle_errors
    def build_cmd(engine: str = typer.Option("auto", help="quarto, jupyter-book, or auto (Quarto when installed)"),
                  out: Path = typer.Option(None, help="folder for the HTML book (default: quarto/_book)")):
        """Build the HTML lab guide offline from modules/ (warnings fail the build)."""
        from tito.context import Ctx

        if engine not in ("auto", *ENGINES):
            raise CourseError(f"--engine {engine!r}: use auto, quarto or jupyter-book")
        build(Ctx().root, engine, out, log=say)

    @app.command("pdf")
    @handle_errors
    def pdf_cmd(out: Path = typer.Option(None, help=f"the PDF file (default: quarto/_book/{PDF_NAME})")):
        """Print the whole guide to one PDF with headless Chromium (Jupyter Book's one-page build)."""
        from tito.context import Ctx

        build_pdf(Ctx().root, out, log=say)

    @app.command("prepare")
    @handle_errors
    def prepare_cmd(engine: str = typer.Option("quarto", help="quarto or jupyter-book")):
        """Write the book's sources only (pages, chapters, diagrams, glossary, listings, configuration)."""
        from tito.context import Ctx

        src = prepare(Ctx().root, engine, log=say)
        say(f"sources written to {src}")

    @app.command("measure")
    @handle_errors
    def measure_cmd(
        what: str = typer.Argument(..., help="notebooks, milestone or bench"),
        names: list[str] = typer.Argument(None, help="module numbers (notebooks), milestone names, or benchmark "
                                                     "scripts (bench serving); none: all of them"),
        runs: int = typer.Option(1, help="how many times to run each milestone or benchmark"),
        cell_timeout: float = typer.Option(300, help="notebooks: the most seconds one cell may run"),
        timeout: float = typer.Option(1800, help="milestone, bench: the most seconds one run may take"),
        args: str = typer.Option("", help="extra arguments for the script, e.g. --args '--repeats 3'"),
    ):
        """The reference run: run the instructor notebooks (their figures), milestones or benchmark scripts and
        keep what they measured in quarto/measured/ (commit it: the guide is built from it)."""
        import shlex

        from tito.context import Ctx
        from tito.course import get_module
        from tito import milestones as ms

        root = Ctx().root
        extra = shlex.split(args)
        if what == "notebooks":
            mods = [get_module(root, n) for n in names] if names else [
                m for m in load_modules(root) if measured_figure_cells(m)]
            for m in mods:
                measured.run_notebook(root, m, cell_timeout, log=say)
        elif what == "milestone":
            for name in names or [m.name for m in ms.discover(root)]:
                for _ in range(runs):
                    run = measured.run_milestone(root, name, extra, log=say, timeout=timeout)
                    say(f"kept: {name} {_verdict(run)} in {run['seconds']} s")
        elif what == "bench":
            for name in names or [p.stem for p in measured.benchmark_scripts(root)]:
                for _ in range(runs):
                    run = measured.run_benchmark(root, name, extra, log=say, timeout=timeout)
                    say(f"kept: {name} exit {run['exit']} in {run['seconds']} s")
        else:
            raise CourseError(f"tito guide measure {what!r}: use notebooks, milestone or bench")
        say(f"results kept in {measured.measured_dir(root)}: rebuild the guide (`tito guide build`) to show them")

    return app


app = _cli()
