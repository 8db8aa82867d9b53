"""An nbdev export processor: cells marked `#| export_to NAME` go to a package file of their own.

nbdev writes one package file per notebook (its `#| default_exp`); its `#| export NAME` appends to a
file that another notebook made, so that exporting twice appends twice. A module whose notebook
writes several files, each named for what it holds (module 17: `perf.compiler` as its default_exp,
`perf.kernels` and `perf.backends` beside it), marks those cells `#| export_to perf.kernels`. This
processor, listed in pyproject.toml's `[tool.nbdev] export_procs` (so `nbdev-export`, `tito export`
and `tito student init` all use it), collects them and writes each file afresh at the end of the
notebook, with nbdev's own banner, cell headers and `__all__`: exporting is idempotent, and
`tinytorch/` still equals a fresh export.

Only nbdev imports this module (while exporting); tito reads the same directive with
`tito.course.EXPORT_TO_RE`.
"""
from __future__ import annotations

from nbdev.process import Processor


class ExportTo(Processor):
    "Write the cells of each `#| export_to NAME` target of the notebook into NAME's file (created afresh)."

    def begin(self):
        self.targets: dict[str, list] = {}

    def _export_to_(self, cell, name=None, *rest):
        if not name or rest:
            raise ValueError(f"`#| export_to` takes one package module name (`#| export_to perf.kernels`); "
                             f"got {' '.join(filter(None, [name, *rest])) or 'none'}")
        self.targets.setdefault(name, []).append(cell)

    def end(self):
        if not self.targets:
            return
        from nbdev.config import get_config
        from nbdev.maker import ModuleMaker

        lib_path = get_config().lib_path
        for name, cells in self.targets.items():
            ModuleMaker(dest=lib_path, name=name, nb_path=self.nb.path_, is_new=True).make(cells, cells, lib_path=lib_path)
