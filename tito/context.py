"""The shared context of every `tito` command: the edition root, its settings, modules and progress."""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .course import (
    Module,
    Settings,
    all_prerequisites,
    edition_env,
    find_root,
    get_module,
    load_modules,
)
from .progress import Progress
from .ui import err


class Ctx:
    """What every command needs: the edition root, its settings, its modules and the progress file."""

    def __init__(self):
        self.root = find_root()
        self.settings = Settings.load(self.root)
        self.modules = load_modules(self.root)
        self._progress: Progress | None = None

    @property
    def progress(self) -> Progress:
        if self._progress is None:
            self._progress = Progress.load(self.settings.state_dir)
            for w in self._progress.warnings:  # the repair is already written (under the file's lock)
                err.print(f"[bold yellow]warning:[/] {escape(w)}")
        return self._progress

    @property
    def is_student(self) -> bool:
        return self.settings.edition == "student"

    def module(self, ref: str) -> Module:
        return get_module(self.root, ref)

    def state(self, m: Module) -> str:
        p = self.progress
        if p.is_completed(m.number):
            return "completed"
        missing = [n for n in all_prerequisites(self.root, m) if not p.is_completed(n)]
        if missing:
            return "locked"
        if p.is_started(m.number):
            return "in progress"
        return "ready"

    def missing_prerequisites(self, m: Module) -> list[Module]:
        by_number = {x.number: x for x in self.modules}
        return [by_number[n] for n in all_prerequisites(self.root, m)
                if n in by_number and not self.progress.is_completed(n)]

    def pythonpath_env(self) -> dict:
        return edition_env(self.root)


STATE_STYLE = {"completed": "green", "in progress": "yellow", "ready": "cyan", "locked": "dim"}


def modules_table(ctx: Ctx) -> Table:
    table = Table(title=f"TinyTorch modules ({ctx.settings.edition} edition)")
    for col in ("#", "module", "title", "needs", "state"):
        table.add_column(col)
    for m in ctx.modules:
        state = ctx.state(m)
        table.add_row(m.number, m.name, m.title, ", ".join(m.prerequisites) or "-",
                      f"[{STATE_STYLE[state]}]{state}[/]")
    return table
