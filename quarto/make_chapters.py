"""Write the lab guide's module chapters and the chapter list in `_quarto.yml`.

Each module's chapter is the *student release* of its source notebook (`tito.notebooks.release`:
solutions become stubs, hidden tests and outputs go), with a title taken from the module's
`module.toml`. The chapter list in `_quarto.yml` between the marker comments is rewritten from the
modules found, so no list of modules is kept by hand.

    python quarto/make_chapters.py                 # writes quarto/chapters/, updates quarto/_quarto.yml
    python quarto/make_chapters.py --out DIR       # chapters elsewhere (the tests use this)
    quarto render quarto                           # then build the book (needs Quarto)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from tito import notebooks as nbs  # noqa: E402
from tito.course import CourseError, Module, load_modules  # noqa: E402

BEGIN_MARK = "# BEGIN MODULE CHAPTERS"
END_MARK = "# END MODULE CHAPTERS"
CHAPTER_RE = re.compile(r"^\d{2}_[a-z0-9_]+\.ipynb$")


def chapter_title(module: Module) -> str:
    return f"Module {module.number}: {module.title}"


def chapter(module: Module) -> nbformat.NotebookNode:
    """The student release of `module`'s notebook, titled for Quarto, with no solution text."""
    source = nbs.read(module.notebook)
    nb = nbs.release(source)
    leaks = [ln for c in nb.cells for ln in c.source.splitlines()
             if nbs.BEGIN_SOLUTION in ln or nbs.BEGIN_HIDDEN in ln]
    text = "\n".join(c.source for c in nb.cells)
    leaks += [ln for ln in nbs.solution_only_lines(source) if ln in text]
    if leaks:
        raise CourseError(f"the release of {module.notebook} still shows solution text: {leaks[:3]}")
    # Quarto takes the chapter title from the front matter; drop the notebook's own H1 so it is not shown twice.
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = cell.source.splitlines()
            if lines and lines[0].startswith("# "):
                cell.source = "\n".join(lines[1:]).lstrip("\n")
            break
    front = ["---", f"title: {json.dumps(chapter_title(module), ensure_ascii=False)}"]
    if module.summary:
        front.append(f"subtitle: {json.dumps(module.summary, ensure_ascii=False)}")
    front.append("---")
    note = (f"::: {{.callout-note}}\nThis chapter is the student release of "
            f"`modules/{module.slug}/{module.slug}.ipynb`: exercises show stubs, not solutions. "
            f"Work on the notebook itself (`tito module start {module.number}`).\n:::")
    nb.cells[:0] = [nbformat.v4.new_raw_cell("\n".join(front)), nbformat.v4.new_markdown_cell(note)]
    return nb


def write_chapters(modules: list[Module], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    wanted = {f"{m.slug}.ipynb" for m in modules}
    for old in out.iterdir():  # chapters of modules that no longer exist
        if CHAPTER_RE.match(old.name) and old.name not in wanted:
            old.unlink()
    paths = []
    for m in modules:
        path = out / f"{m.slug}.ipynb"
        nbs.write(chapter(m), path)
        paths.append(path)
    return paths


def update_config(config: Path, modules: list[Module], out: Path) -> None:
    """Rewrite the lines between the marker comments of `config` with one chapter per module."""
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
    rel = Path(os.path.relpath(out.resolve(), config.resolve().parent)).as_posix()
    entries = [f"{indent}- {rel}/{m.slug}.ipynb  # {chapter_title(m)}" for m in modules]
    config.write_text("\n".join(lines[: begin + 1] + entries + lines[end:]) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "chapters", help="folder for the chapter notebooks")
    ap.add_argument("--config", type=Path, default=HERE / "_quarto.yml",
                    help="the _quarto.yml whose chapter list is rewritten")
    ap.add_argument("--root", type=Path, default=ROOT, help="the course edition (folder with modules/)")
    args = ap.parse_args(argv)
    try:
        modules = load_modules(args.root.resolve())
        if not modules:
            raise CourseError(f"no modules found under {args.root / 'modules'}")
        update_config(args.config, modules, args.out)  # first: a bad config stops before anything is written
        paths = write_chapters(modules, args.out)
    except CourseError as e:
        print(f"make_chapters: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    print(f"updated the chapter list in {args.config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
