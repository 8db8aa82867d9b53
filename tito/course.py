"""The course as `tito` sees it: the edition root, its settings, and its modules.

Everything here is read from files, never restated: module numbers and names come from the folder
names under `modules/`, titles and prerequisites from each folder's `module.toml`, the package path
from the notebook's `#| default_exp` directive (and `#| export_to NAME` cells), course settings from `settings.ini`.
"""
from __future__ import annotations

import ast
import configparser
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

MODULE_DIR_RE = re.compile(r"^(\d{2})_([a-z0-9_]+)$")
# What a solution region becomes in the student release (nbgrader's stub, set explicitly everywhere).
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
STUB_MARKER = "YOUR CODE HERE"
# `#| export_to perf.kernels`: a cell exported to another package file than the notebook's default_exp (tito/nbexport.py)
EXPORT_TO_RE = re.compile(r"^#\|\s*export_to\s+([\w.]+)\s*$", re.M)


class CourseError(Exception):
    """A problem the user can fix; the CLI prints the message without a traceback."""


def find_root(start: Path | None = None) -> Path:
    """The edition root: `$TITO_ROOT`, else the nearest folder above `start` with settings.ini and modules/."""
    env = os.environ.get("TITO_ROOT")
    if env:
        root = Path(env).resolve()
        if not (root / "settings.ini").is_file():
            raise CourseError(f"TITO_ROOT={env} has no settings.ini; point it at a TinyTorch checkout")
        return root
    here = (start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        if (d / "settings.ini").is_file() and (d / "modules").is_dir():
            return d
    raise CourseError(
        f"no TinyTorch course found at or above {here}: run tito inside a TinyTorch checkout "
        "(the folder with settings.ini and modules/), or set TITO_ROOT"
    )


@dataclass
class Settings:
    root: Path
    parser: configparser.ConfigParser

    @classmethod
    def load(cls, root: Path) -> "Settings":
        p = configparser.ConfigParser(inline_comment_prefixes=("#",))
        try:
            p.read(root / "settings.ini", encoding="utf-8")
        except configparser.Error as e:
            raise CourseError(f"{root / 'settings.ini'} is not valid: {e}") from e
        return cls(root, p)

    def get(self, section: str, key: str, default: str | None = None) -> str:
        value = self.parser.get(section, key, fallback=default)
        if value is None:
            raise CourseError(f"settings.ini: [{section}] {key} is missing")
        return value

    def path(self, section: str, key: str, default: str | None = None) -> Path:
        return (self.root / self.get(section, key, default)).resolve()

    def number(self, section: str, key: str, default: float) -> float:
        raw = self.get(section, key, str(default))
        try:
            return float(raw)
        except ValueError:
            raise CourseError(f"settings.ini: [{section}] {key} = {raw!r} is not a number") from None

    @property
    def course_id(self) -> str:
        return self.get("course", "course_id", "tinytorch")

    @property
    def edition(self) -> str:
        return self.get("course", "edition", "instructor")

    @property
    def nbgrader_root(self) -> Path:
        return self.path("nbgrader", "root", "nbgrader")

    @property
    def state_dir(self) -> Path:
        env = os.environ.get("TITO_STATE_DIR")
        return Path(env).resolve() if env else self.path("progress", "state_dir", ".tito")


@dataclass
class Module:
    """One course module: folder `modules/NN_name/` with `NN_name.ipynb` and `module.toml`."""

    number: str  # "01"
    name: str  # "tensor"
    folder: Path
    title: str
    summary: str = ""
    prerequisites: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return f"{self.number}_{self.name}"

    @property
    def notebook(self) -> Path:
        return self.folder / f"{self.slug}.ipynb"

    @cached_property
    def package_modules(self) -> list[str]:
        """Every dotted module the notebook exports to, its `#| default_exp` first, then the targets of
        `#| export_to NAME` cells in the order the notebook meets them (module 17 writes its compiler,
        kernels and backends into three files, each named for what it holds: tito/nbexport.py)."""
        try:
            nb = json.loads(self.notebook.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        default, others = None, []
        for cell in nb.get("cells", []):
            if cell.get("cell_type") != "code":
                continue
            src = "".join(cell.get("source", ""))
            m = re.search(r"^#\|\s*default_exp\s+(\S+)", src, re.M)
            if m and default is None:
                default = f"tinytorch.{m.group(1)}"
            m = EXPORT_TO_RE.search(src)
            if m and f"tinytorch.{m.group(1)}" not in others:
                others.append(f"tinytorch.{m.group(1)}")
        if default is None:
            return []
        return [default] + [o for o in others if o != default]

    @property
    def package_module(self) -> str | None:
        """Dotted module the notebook exports to (`tinytorch.core.tensor`), from `#| default_exp`."""
        return self.package_modules[0] if self.package_modules else None

    def package_file(self, root: Path) -> Path | None:
        mod = self.package_module
        return root / Path(*mod.split(".")).with_suffix(".py") if mod else None

    def package_files(self, root: Path) -> list[Path]:
        """Every package file the notebook writes: `package_file` first, then those of `#| export_to NAME` cells."""
        return [root / Path(*mod.split(".")).with_suffix(".py") for mod in self.package_modules]


def load_modules(root: Path) -> list[Module]:
    """All modules of the edition at `root`, in number order."""
    mods_dir = root / "modules"
    modules = []
    for d in sorted(mods_dir.iterdir()) if mods_dir.is_dir() else []:
        m = MODULE_DIR_RE.match(d.name)
        if not d.is_dir() or not m:
            continue
        meta_file = d / "module.toml"
        try:
            meta = tomllib.loads(meta_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CourseError(f"{meta_file} is missing: every module folder needs a module.toml with title and prerequisites") from None
        except tomllib.TOMLDecodeError as e:
            raise CourseError(f"{meta_file} is not valid TOML: {e}") from None
        prereqs = [str(p).zfill(2) for p in meta.get("prerequisites", [])]
        modules.append(Module(m.group(1), m.group(2), d, meta.get("title", m.group(2).title()),
                              meta.get("summary", ""), prereqs))
    return modules


def get_module(root: Path, ref: str) -> Module:
    """Find a module by number (`1`, `01`), name (`tensor`) or slug (`01_tensor`)."""
    modules = load_modules(root)
    ref = str(ref).strip()
    for m in modules:
        if ref in (m.slug, m.name) or (ref.isdigit() and int(ref) == int(m.number)):
            return m
    known = ", ".join(m.slug for m in modules) or "none"
    raise CourseError(f"unknown module {ref!r}; modules in this course: {known}")


def all_prerequisites(root: Path, module: Module) -> list[str]:
    """Prerequisites of `module`, transitively, in number order."""
    by_number = {m.number: m for m in load_modules(root)}
    seen: set[str] = set()
    todo = list(module.prerequisites)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in by_number:
            todo.extend(by_number[n].prerequisites)
    return sorted(seen)


def find_stubs(path: Path) -> list[str]:
    """Qualified names of functions in the Python file `path` that still hold an nbgrader stub.

    A stub is the `# YOUR CODE HERE` / `raise NotImplementedError()` that the student release puts
    where a solution was; a function still containing one is not implemented yet.
    """
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    if STUB_MARKER not in source:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise CourseError(f"{path} has a syntax error on line {e.lineno}: {e.msg}") from None
    lines = source.splitlines()
    stubs: list[str] = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, prefix + [child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = "\n".join(lines[child.lineno - 1 : child.end_lineno])
                if STUB_MARKER in body and "NotImplementedError" in body:
                    stubs.append(".".join(prefix + [child.name]))
                visit(child, prefix + [child.name])

    visit(tree, [])
    return stubs


def module_stubs(root: Path, module: Module) -> list[str]:
    """Functions of `module`'s exported package file that are still stubs (empty when finished)."""
    files = module.package_files(root)
    if not files or not files[0].exists():
        return ["<not exported yet>"]
    return [stub for f in files for stub in find_stubs(f)]


def edition_env(root: Path, base: dict | None = None) -> dict:
    """Environment for a subprocess or kernel that must import *this* edition's tinytorch and tito:
    `root` first on PYTHONPATH, and a non-interactive matplotlib backend."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["MPLBACKEND"] = "Agg"
    return env
