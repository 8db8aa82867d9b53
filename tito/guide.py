"""The lab guide: one chapter per module (the student release of its notebook), a diagram per module,
captioned listings, the glossary, and the build (`tito guide build`).

Everything in the book is generated from `modules/` and `quarto/` at build time; nothing is copied by
hand. Two engines read the same generated chapters:

- Quarto (`quarto render`), the book's engine where it is installed, from `quarto/` itself
  (`_quarto.yml`, whose chapter list is rewritten here between its marker comments);
- Jupyter Book 1.x (Sphinx + MyST-NB, `pip install -e ".[guide]"`) everywhere else, from a generated
  source folder (`quarto/_jb/`, with `_config.yml` and `_toc.yml` written from the module list).

Both write the HTML book to `quarto/_book/`. Warnings fail the build.

    tito guide build                      # the engine found here: Quarto, else Jupyter Book
    tito guide build --engine jupyter-book --out /tmp/book
    python quarto/make_chapters.py && quarto render quarto     # the same with Quarto by hand
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tito import notebooks as nbs
from tito.course import CourseError, Module, load_modules

ENGINES = ("quarto", "jupyter-book")
BEGIN_MARK = "# BEGIN MODULE CHAPTERS"
END_MARK = "# END MODULE CHAPTERS"
CHAPTER_RE = re.compile(r"^\d{2}_[a-z0-9_]+\.ipynb$")
#: A code cell of a released chapter with more non-blank, non-comment lines than this gets a listing caption.
LISTING_MIN_LINES = 10
EM_DASH = "\u2014"
GUIDE_INSTALL = 'pip install -e ".[guide]"'


def guide_dir(root: Path) -> Path:
    return root / "quarto"


def chapter_title(module: Module) -> str:
    return f"Module {module.number}: {module.title}"


def listing_id(module: Module, k: int) -> str:
    return f"listing-{int(module.number)}-{k}"


# ---------------------------------------------------------------- glossary


@dataclass(frozen=True)
class Term:
    term: str
    slug: str
    module: str  # "06"
    text: str


def load_glossary(root: Path) -> tuple[dict[str, str], list[Term]]:
    """(planned module names by number, the terms) of `quarto/glossary.yml`, the glossary's one source."""
    import yaml

    path = guide_dir(root) / "glossary.yml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CourseError(f"cannot read the glossary {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise CourseError(f"{path} is not valid YAML: {e}") from None
    planned = {str(k).zfill(2): v for k, v in (data.get("planned") or {}).items()}
    terms = []
    for i, t in enumerate(data.get("terms") or []):
        missing = [k for k in ("term", "slug", "module", "text") if not t.get(k)]
        if missing:
            raise CourseError(f"{path}: term {i + 1} ({t.get('term', '?')}) lacks {', '.join(missing)}")
        terms.append(Term(str(t["term"]), str(t["slug"]), str(t["module"]).zfill(2), " ".join(str(t["text"]).split())))
    return planned, terms


def term_module(term: Term, modules: list[Module], planned: dict[str, str]) -> tuple[str, Module | None]:
    """("Module 06 (autograd)", the Module when its folder exists, else None)."""
    mod = next((m for m in modules if m.number == term.module), None)
    name = mod.name if mod else planned.get(term.module)
    # a module neither present nor planned (an edition with fewer modules) is named by its number only;
    # tests/test_guide.py requires every term's module to be one or the other in the course itself
    return (f"Module {term.module} ({name})" if name else f"Module {term.module}"), mod


def render_glossary(root: Path, modules: list[Module], engine: str) -> str:
    planned, terms = load_glossary(root)
    if engine == "quarto":
        out = ["---", "number-sections: false", "---", "", "# Glossary {.unnumbered}", ""]
    else:
        out = ["# Glossary", ""]
    out += ["The course's vocabulary, in alphabetical order. Each entry says what the word means *in this",
            "course* and names the module where the idea is central, which is where to read more. Modules",
            "that already have a chapter are linked; the others are planned (the course runs to module 20).",
            ""]
    for t in terms:
        label, mod = term_module(t, modules, planned)
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
    what: str  # "`Linear`: fully connected layer ..."

    @property
    def id(self) -> str:
        return listing_id(self.module, self.k)

    @property
    def caption(self) -> str:
        return f"Listing {int(self.module.number)}.{self.k} {EM_DASH} {self.what}"


def _code_lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    text = re.sub(r"TODO \(Exercise [0-9.a-z]+\):?\s*", "", text)
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    text = (m.group(1) if m else text).rstrip(".")
    if len(text) > 100:
        text = text[:97].rsplit(" ", 1)[0] + "..."
    if text.count("`") % 2:  # a cut inside inline code
        text = text.replace("`", "")
    return text.replace(EM_DASH, ",")


def listing_what(source: str, heading: str) -> str | None:
    """What a substantive code cell is, for its caption; None for a cell that gets no listing."""
    if len(_code_lines(source)) <= LISTING_MIN_LINES:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    defs = [d for d in (tree.body if tree else []) if isinstance(d, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    if defs:
        public = [d for d in defs if not d.name.startswith("_")] or defs
        names = ", ".join(f"`{d.name}`" for d in public[:4]) + (" and more" if len(public) > 4 else "")
        doc = next((ast.get_docstring(d) for d in public if ast.get_docstring(d)), None)
        return f"{names}: {_first_sentence(doc)}" if doc else names
    if tree is not None and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in tree.body):
        return None
    heading = heading or "this section"
    return f"code of {heading}"


# ---------------------------------------------------------------- chapters


def _hook_index(nb) -> int:
    "Index of the hook: the first markdown cell (the notebook's title cell, which opens with the systems question)."
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown")


def chapter(module: Module, engine: str, diagram: dict | None = None) -> tuple[nbformat.NotebookNode, list[Listing]]:
    """The chapter of `module` for `engine`: its student release (no solutions, no hidden tests, no
    outputs), titled from module.toml, its diagram after the hook, a caption before each substantive
    code cell. Refuses (CourseError) a release in which solution text survives."""
    source = nbs.read(module.notebook)
    nb = nbs.release(source)
    leaks = [ln for c in nb.cells for ln in c.source.splitlines()
             if nbs.BEGIN_SOLUTION in ln or nbs.BEGIN_HIDDEN in ln]
    text = "\n".join(c.source for c in nb.cells)
    leaks += [ln for ln in nbs.solution_only_lines(source) if ln in text]
    if leaks:
        raise CourseError(f"the release of {module.notebook} still shows solution text: {leaks[:3]}")
    n = int(module.number)
    # listings first, on the notebook's own cells
    cells, listings, heading = [], [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heads = re.findall(r"^#{1,4} +(.+?)\s*$", cell.source, re.M)
            if heads:
                heading = heads[-1].strip("*_ ")
        elif cell.cell_type == "code" and not nbs.is_test_cell(cell):
            what = listing_what(cell.source, heading)
            if what:
                lst = Listing(module, len(listings) + 1, what)
                listings.append(lst)
                if engine == "quarto":
                    cap = f"[**{lst.caption}**]{{#{lst.id} .listing-caption}}"
                else:
                    cap = f"({lst.id})=\n**{lst.caption}**"
                cells.append(nbformat.v4.new_markdown_cell(cap))
        cells.append(cell)
    nb.cells = cells
    hook = _hook_index(nb)
    lines = nb.cells[hook].source.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    body = "\n".join(lines).lstrip("\n")
    note = (f"This chapter is the student release of `modules/{module.slug}/{module.slug}.ipynb`: exercises "
            f"show stubs, not solutions. Work on the notebook itself (`tito module start {module.number}`).")
    if engine == "quarto":
        nb.cells[hook].source = body
        front = ["---", f"title: {json.dumps(chapter_title(module), ensure_ascii=False)}"]
        if module.summary:
            front.append(f"subtitle: {json.dumps(module.summary, ensure_ascii=False)}")
        front.append("---")
        head = [nbformat.v4.new_raw_cell("\n".join(front)),
                nbformat.v4.new_markdown_cell(f"::: {{.callout-note}}\n{note}\n:::")]
    else:
        nb.cells[hook].source = body
        title = f"# {chapter_title(module)}" + (f"\n\n*{module.summary}*" if module.summary else "")
        head = [nbformat.v4.new_markdown_cell(title), nbformat.v4.new_markdown_cell(f":::{{note}}\n{note}\n:::")]
    figure = []
    if diagram:
        src = f"../diagrams/{diagram['file']}"
        alt = diagram["alt"].replace('"', "'")
        if engine == "quarto":
            fig = f"![{diagram['caption']}]({src}){{#fig-module-{n} fig-alt=\"{alt}\"}}"
        else:
            fig = f":::{{figure}} {src}\n:alt: {alt}\n:name: fig-module-{n}\n\n{diagram['caption']}\n:::"
        figure = [nbformat.v4.new_markdown_cell(fig)]
    nb.cells = head + nb.cells[:hook + 1] + figure + nb.cells[hook + 1:]
    for i, c in enumerate(nb.cells):  # stable ids: the same module gives the same chapter file
        c["id"] = f"c{i:03d}"
    return nb, listings


def render_listings(listings: list[Listing], engine: str) -> str:
    if engine == "quarto":
        out = ["# List of listings {.unnumbered}", ""]
    else:
        out = ["# List of listings", ""]
    out += ["Every class, function or algorithm of more than ten lines in the chapters carries a caption",
            "`Listing N.M`, numbered per chapter (N is the module). They are stubs where the exercise is",
            "yours to write.", ""]
    current = None
    for lst in listings:
        if lst.module is not current:
            current = lst.module
            out += ["", f"**{chapter_title(current)}**", ""]
        text = lst.caption
        if engine == "quarto":
            out.append(f"- [{text}](chapters/{lst.module.slug}.ipynb#{lst.id})")
        else:  # a ref role's title cannot hold backticks
            out.append(f"- {{ref}}`{text.replace('`', '').replace('<', '&lt;')} <{lst.id}>`")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the book's sources


def _index_text(root: Path, engine: str) -> str:
    text = (guide_dir(root) / "index.qmd").read_text(encoding="utf-8")
    if engine == "jupyter-book":
        text = re.sub(r"\s*\{\.unnumbered\}", "", text)
        text = text.replace("(glossary.qmd)", "(glossary.md)").replace("(listings.qmd)", "(listings.md)")
    return text


def update_quarto_config(config: Path, modules: list[Module]) -> None:
    """Rewrite the lines between the marker comments of `_quarto.yml` with one chapter per module."""
    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise CourseError(f"cannot read the book configuration {config}: {e.strerror}") from None
    try:
        begin = next(i for i, ln in enumerate(lines) if ln.strip().startswith(BEGIN_MARK))
        end = next(i for i, ln in enumerate(lines) if i > begin and ln.strip().startswith(END_MARK))
    except StopIteration:
        raise CourseError(f"{config} lacks the marker comments `{BEGIN_MARK}` and `{END_MARK}` "
                          "around the module chapters") from None
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    entries = [f"{indent}- chapters/{m.slug}.ipynb  # {chapter_title(m)}" for m in modules]
    new = "\n".join(lines[: begin + 1] + entries + lines[end:]) + "\n"
    if new != config.read_text(encoding="utf-8"):
        config.write_text(new, encoding="utf-8")


def jupyter_book_config(modules: list[Module]) -> tuple[str, str]:
    """(_config.yml, _toc.yml) of the Jupyter Book build, written from the module list."""
    config = """# Generated by tito/guide.py from modules/ and quarto/: do not edit (edit those instead).
title: TinyTorch lab guide
author: TinyTorch developers
copyright: ""
only_build_toc_files: true
execute:
  execute_notebooks: "off"
parse:
  myst_enable_extensions: [colon_fence, dollarmath, deflist, attrs_inline]
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
"""
    toc = ["# Generated by tito/guide.py from modules/: do not edit.", "format: jb-book", "root: index",
           "parts:", "  - caption: Front matter", "    chapters:", "      - file: listings",
           "  - caption: Modules", "    numbered: false", "    chapters:"]
    toc += [f"      - file: chapters/{m.slug}" for m in modules]
    toc += ["  - caption: Back matter", "    chapters:", "      - file: glossary"]
    return config, "\n".join(toc) + "\n"


def prepare(root: Path, engine: str, src: Path | None = None, log=print) -> Path:
    """Write the book's sources for `engine` into `src` (default: `quarto/` for Quarto, `quarto/_jb/`
    for Jupyter Book): chapters, diagrams, glossary, list of listings, and the configuration."""
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
    if engine == "quarto":
        config = src / "_quarto.yml"
        if src != gdir.resolve():
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
    out = src / "chapters"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {f"{m.slug}.ipynb" for m in modules}
    for old in out.iterdir():  # chapters of modules that no longer exist
        if CHAPTER_RE.match(old.name) and old.name not in wanted:
            old.unlink()
    listings: list[Listing] = []
    for m in modules:
        nb, lst = chapter(m, engine, figs.get(m.slug))
        listings += lst
        nbs.write(nb, out / f"{m.slug}.ipynb")
        log(f"chapter {m.slug}: {len(lst)} listings")
    ext = "qmd" if engine == "quarto" else "md"
    (src / f"glossary.{ext}").write_text(render_glossary(root, modules, engine), encoding="utf-8")
    (src / f"listings.{ext}").write_text(render_listings(listings, engine), encoding="utf-8")
    if engine == "jupyter-book":
        (src / "index.md").write_text(_index_text(root, engine), encoding="utf-8")
        config, toc = jupyter_book_config(modules)
        (src / "_config.yml").write_text(config, encoding="utf-8")
        (src / "_toc.yml").write_text(toc, encoding="utf-8")
    elif src != gdir.resolve():
        shutil.copy2(gdir / "index.qmd", src / "index.qmd")
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
        cmd = [exe, "render", str(src), "--to", "html", "--output-dir", str(out)]
    else:
        jb = _jupyter_book_cmd()
        if not jb:
            raise CourseError(f"--engine jupyter-book: Jupyter Book is not installed; run `{GUIDE_INSTALL}`")
        cmd = [*jb, "build", str(src), "--builder", "html", "--warningiserror", "--keep-going", "--quiet",
               "--path-output", str(src)]
    log("+ " + " ".join(cmd))
    env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        warnings = [ln for ln in text.splitlines() if re.search(r"WARNING|ERROR|Error", ln)]
        raise CourseError(f"the guide's {engine} build failed (exit {proc.returncode}); warnings fail the build:\n"
                          + "\n".join((warnings or text.splitlines())[-40:]))
    if engine == "jupyter-book":
        html_dir = src / "_build" / "html"
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html_dir, out)
    log(f"the guide is in {out} (open {out / 'index.html'})")
    return out


# ---------------------------------------------------------------- tito guide


def _cli():
    import typer

    from tito.ui import console, handle_errors

    app = typer.Typer(help="The lab guide: a chapter per module, diagrams, listings, glossary.", no_args_is_help=True)

    @app.command("build")
    @handle_errors
    def build_cmd(engine: str = typer.Option("auto", help="quarto, jupyter-book, or auto (Quarto when installed)"),
                  out: Path = typer.Option(None, help="folder for the HTML book (default: quarto/_book)")):
        """Build the HTML lab guide offline from modules/ (warnings fail the build)."""
        from tito.context import Ctx

        if engine not in ("auto", *ENGINES):
            raise CourseError(f"--engine {engine!r}: use auto, quarto or jupyter-book")
        build(Ctx().root, engine, out, log=lambda s: console.print(s, markup=False))

    @app.command("prepare")
    @handle_errors
    def prepare_cmd(engine: str = typer.Option("quarto", help="quarto or jupyter-book")):
        """Write the book's sources only (chapters, diagrams, glossary, listings, configuration)."""
        from tito.context import Ctx

        src = prepare(Ctx().root, engine, log=lambda s: console.print(s, markup=False))
        console.print(f"sources written to {src}", markup=False)

    return app


app = _cli()
