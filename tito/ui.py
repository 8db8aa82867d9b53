"""Console output shared by every `tito` command."""
from __future__ import annotations

import functools

import typer
from rich.console import Console
from rich.markup import escape

from .course import CourseError

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def handle_errors(fn):
    """Print a CourseError as one clear message (no traceback) and exit with code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CourseError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}")
            raise typer.Exit(2)

    return wrapper
