"""Write the lab guide's Quarto sources: the module chapters, the diagrams, the glossary, the list of
listings, and the chapter list in `_quarto.yml` (between its marker comments).

Each module's chapter is the *student release* of its source notebook (solutions become stubs, hidden
tests and outputs go), titled from its `module.toml`. Everything is generated from `modules/` and
`quarto/glossary.yml` by `tito/guide.py`; nothing is kept by hand.

    python quarto/make_chapters.py && quarto render quarto      # the book with Quarto
    python quarto/make_chapters.py --src DIR                    # the sources elsewhere (the tests use this)
    tito guide build                                            # Quarto when installed, else Jupyter Book
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tito.course import CourseError  # noqa: E402
from tito.guide import prepare  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=None, help="folder for the book's sources (default: quarto/)")
    ap.add_argument("--engine", default="quarto", choices=["quarto", "jupyter-book"])
    args = ap.parse_args(argv)
    try:
        src = prepare(ROOT, args.engine, args.src)
    except CourseError as e:
        print(f"make_chapters: {e}", file=sys.stderr)
        return 1
    print(f"wrote the guide's sources to {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
