"""Per-user progress: which modules a student has started and completed.

Stored as JSON in the edition's state folder (`.tito/progress.json`, ignored by git). The file has
a schema version, is written atomically (temporary file + `os.replace`), and a corrupt or unknown
file is reported and moved aside, never silently reset.

Two `tito` commands may run at once (two terminals: `tito module complete 03` while
`tito module complete 04` runs). Each change (started, completed, incomplete, checkpoint) is kept
as an operation; `save()` takes a file lock (`filelock`: Linux, macOS and Windows), reads the file
as it is now, applies this command's operations to it and writes it atomically, so a completion
recorded by another command in the meantime is kept, never overwritten.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from .course import CourseError

SCHEMA_VERSION = 1
FILE_NAME = "progress.json"
LOCK_NAME = ".progress.json.lock"
LOCK_TIMEOUT = 60  # seconds; a save takes milliseconds, so only a hung process holds the lock this long


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


ENTRY_FIELDS = {"started": str, "completed": str, "checkpoint": str, "score": (int, float),
                "max_score": (int, float)}


def entry_problem(key, value) -> str:
    """Why a `modules` entry of progress.json has the wrong shape ('' when it is fine)."""
    if not (isinstance(key, str) and len(key) == 2 and key.isdigit()):
        return "a module number has two digits, like \"01\""
    if not isinstance(value, dict):
        return f"expected an object of dates and scores, got {type(value).__name__} {value!r}"[:160]
    for name, v in value.items():
        kind = ENTRY_FIELDS.get(name)
        if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            return f"field {name!r} is {v!r}, expected {'a date string' if kind is str else 'a number'}"[:160]
    return ""


def _backup_name(path: Path) -> Path:
    backup = path.with_name(f"{FILE_NAME}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while backup.exists():
        backup = backup.with_name(f"{backup.name}-{n}")
        n += 1
    return backup


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class Progress:
    path: Path
    modules: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _ops: list = field(default_factory=list, repr=False)

    @classmethod
    def load(cls, state_dir: Path) -> "Progress":
        """The progress file as it is now (read under the lock, so never while another command writes)."""
        path = state_dir / FILE_NAME
        with _lock(path):
            return cls._read(path)

    @classmethod
    def _read(cls, path: Path) -> "Progress":
        if not path.exists():
            return cls(path)
        problem = None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("modules"), dict):
                problem = "it is not a progress file (no 'modules' table)"
            elif data.get("schema_version") != SCHEMA_VERSION:
                problem = f"its schema_version is {data.get('schema_version')!r}; this tito reads version {SCHEMA_VERSION}"
        except (ValueError, UnicodeDecodeError) as e:
            problem = f"it is not valid JSON ({e})"
        if problem is None:
            modules, bad = {}, []
            for key, value in data["modules"].items():
                why = entry_problem(key, value)
                if why:
                    bad.append(f"{key!r}: {why}")
                else:
                    modules[key] = value
            if not bad:
                return cls(path, modules)
            backup = _backup_name(path)
            shutil.copy2(path, backup)
            atomic_write_text(path, json.dumps({"schema_version": SCHEMA_VERSION,
                                                "modules": dict(sorted(modules.items()))}, indent=2) + "\n")
            return cls(path, modules, [
                f"progress file {path}: ignored {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} of the wrong shape "
                f"({'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}). The original is kept as {backup}; a module "
                f"entry looks like \"01\": {{\"started\": \"2024-01-01T10:00:00+0000\", \"completed\": ..., "
                f"\"score\": 12, \"max_score\": 12}}. Run `tito module complete NN` to record a module again."
            ])
        backup = _backup_name(path)
        os.replace(path, backup)
        atomic_write_text(path, json.dumps({"schema_version": SCHEMA_VERSION, "modules": {}}, indent=2) + "\n")
        return cls(path, {}, [
            f"progress file {path} could not be read: {problem}. It was moved to {backup} and a new one "
            f"started. Your notebooks and exported code are untouched; run `tito module complete NN` "
            f"again for the modules you had finished to record them."
        ])

    def save(self) -> None:
        """Record this command's changes: under the lock, re-read the file, apply them, write atomically."""
        with _lock(self.path):
            current = self._read(self.path)
            self.warnings.extend(w for w in current.warnings if w not in self.warnings)
            for op in self._ops:
                op(current.modules)
            self._ops.clear()
            self.modules = current.modules
            data = {"schema_version": SCHEMA_VERSION, "modules": dict(sorted(self.modules.items()))}
            atomic_write_text(self.path, json.dumps(data, indent=2) + "\n")

    def _change(self, op: Callable[[dict], None]) -> None:
        """Apply `op` to the modules table now and again, on the file's current table, at `save()`."""
        op(self.modules)
        self._ops.append(op)

    def entry(self, number: str) -> dict:
        """A read-only view of one module's entry (change it with the `mark_*` methods)."""
        return dict(self.modules.get(number, {}))

    def is_completed(self, number: str) -> bool:
        return bool(self.modules.get(number, {}).get("completed"))

    def is_started(self, number: str) -> bool:
        return bool(self.modules.get(number, {}).get("started"))

    def mark_started(self, number: str) -> None:
        now = _now()
        self._change(lambda modules: modules.setdefault(number, {}).setdefault("started", now))

    def mark_completed(self, number: str, score: float | None = None, max_score: float | None = None) -> None:
        now = _now()

        def op(modules):
            e = modules.setdefault(number, {})
            e.setdefault("started", now)
            e["completed"] = now
            if score is not None:
                e["score"], e["max_score"] = score, max_score
        self._change(op)

    def mark_incomplete(self, number: str) -> None:
        self._change(lambda modules: modules.get(number, {}).pop("completed", None))

    def mark_checkpoint(self, number: str) -> None:
        now = _now()
        self._change(lambda modules: modules.setdefault(number, {}).__setitem__("checkpoint", now))


@contextmanager
def _lock(path: Path):
    """Hold the lock every reader and writer of `path` takes (a file of its own beside it: `os.replace`
    swaps `path` itself). Waits for another `tito` command's save; one that holds it for a minute is hung."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path.with_name(LOCK_NAME), timeout=LOCK_TIMEOUT)
    try:
        lock.acquire()
    except Timeout:
        raise CourseError(f"the progress file {path} has been locked by another tito command for {LOCK_TIMEOUT} s; "
                          f"wait for it to finish (or stop it) and run this command again") from None
    try:
        yield
    finally:
        lock.release()
