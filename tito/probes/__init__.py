"""Trusted grading: each graded exercise has a PROBE (runs the student's code, reports only data) and a CHECK.

The probe of an exercise is a function `probe(rng, rec)` registered with `@probe("N.k", ...)` in
`tito/probes/mNN.py`. It imports the package (`from tinytorch.core.tensor import Tensor` inside its
body), draws its inputs from `rng` (a NumPy Generator seeded by the grading run) and puts what the
code returns into `rec`: `rec["out"] = value`, or `rec.call("out", fn, *args)`, which records the
result or the exception raised (its type and message). It computes no expected value and asserts
nothing: the same probe runs twice,

- in the grading sandbox (`python -m tito.probe_run`), over the student's exported code;
- in the trusted grading process's own subprocess, over the instructor's reference package,

with the same seed, and `check()` compares the two records here, in the trusted process, with the
exercise's tolerances (or the probe's own `check=` function for random results). Records cross the
process boundary as JSON plus an `.npz` of the arrays (never pickle), so nothing the student's code
does in its own process (patching numpy, builtins, sys.modules, unittest or the kernel, reading the
test cell's frame) can make a wrong result match: the expected values never exist there.

`uses=("merge_pair",)` names functions (or `Class.method`s) of the graded module that the probe
replaces with the reference's code while it runs (their source is extracted here and sent with the
job), so an exercise that calls an earlier exercise of the same module is checked on its own and one
bug is charged once. Probes with substitutes run in a process of their own, after the others.
"""
from __future__ import annotations

import ast
import base64
import importlib
import io
import json
import math
import re
import textwrap
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

MAX_ARRAY_BYTES = 8_000_000  # per exercise record: a record over this is refused (cheap to check, hard to abuse)
MAX_JSON_CHARS = 2_000_000
MAX_MESSAGE = 500


@dataclass
class Probe:
    exercise: str  # "2.5"
    module: str  # "02"
    fn: Callable  # fn(rng, rec)
    uses: tuple = ()  # graded-module names replaced by the reference's code while the probe runs
    rtol: float = 1e-4
    atol: float = 1e-6
    messages: bool = False  # exception messages must match the reference's exactly (the contract's text)
    dtypes: bool = True  # array dtypes must match
    check: Callable | None = None  # check(student_values, reference_values) -> "" or why it failed (trusted side)

    @property
    def group(self) -> tuple:
        return tuple(sorted(self.uses))


REGISTRY: dict[str, dict[str, Probe]] = {}


def probe(exercise: str, uses=(), rtol: float = 1e-4, atol: float = 1e-6, messages: bool = False,
          dtypes: bool = True, check: Callable | None = None):
    """Register the decorated `fn(rng, rec)` as the probe of `exercise` ("N.k")."""
    module = f"{int(exercise.split('.')[0]):02d}"

    def deco(fn):
        REGISTRY.setdefault(module, {})[exercise] = Probe(exercise, module, fn, tuple(uses), rtol, atol, messages,
                                                           dtypes, check)
        return fn
    return deco


def module_probes(number: str) -> dict[str, Probe]:
    """The probes of module `number` ("02"), {} when it has none (its file tito/probes/mNN.py is missing)."""
    number = f"{int(number):02d}"
    if number not in REGISTRY:
        try:
            importlib.import_module(f"tito.probes.m{number}")
        except ModuleNotFoundError as e:
            if e.name != f"tito.probes.m{number}":
                raise
            REGISTRY[number] = {}
    return REGISTRY.get(number, {})


def probe_file(number: str) -> Path:
    return Path(__file__).with_name(f"m{int(number):02d}.py")


def exercise_of(label: str) -> str:
    """'2.5' from 'Exercise 2.5: Softmax.forward'."""
    m = re.match(r"Exercise\s+(\d+\.\d+)", label)
    return m.group(1) if m else ""


def seed_for(seed: int, exercise: str) -> list[int]:
    a, b = exercise.split(".")
    return [int(seed), int(a), int(b)]


# ------------------------------------------------------------------ records: data only


class Raised:
    """What a call raised: its type's name and message (the record keeps nothing else of it)."""

    def __init__(self, kind: str, message: str):
        self.kind, self.message = kind, message[:MAX_MESSAGE]

    def __repr__(self):
        return f"{self.kind}({self.message!r})"

    def __eq__(self, other):
        return isinstance(other, Raised) and (self.kind, self.message) == (other.kind, other.message)


class Rec(dict):
    """A probe's record: key -> value (arrays, Tensors (kept as their arrays), numbers, strings, lists,
    dicts, None, or `Raised`)."""

    def call(self, key: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`: its result under `key` (and returned), or what it raised (and None)."""
        try:
            out = fn(*args, **kwargs)
        except BaseException as e:  # student code: SystemExit and KeyboardInterrupt are results too
            self[key] = Raised(type(e).__name__, _safe_str(e))
            return None
        self[key] = out
        return out


def _safe_str(e) -> str:
    try:
        return str(e)[:MAX_MESSAGE]
    except BaseException:
        return "<message could not be read>"


def encode(values: dict, error: str = "") -> tuple[str, bytes]:
    """(JSON text, npz bytes) of a record; arrays go to the npz, never pickled objects."""
    arrays: dict[str, np.ndarray] = {}

    def enc(v, depth=0):
        if depth > 20:
            return {"__object__": "nested too deep"}
        if isinstance(v, Raised):
            return {"__raised__": v.kind, "message": v.message}
        if v is None or type(v) in (bool, str):
            return v[:MAX_MESSAGE * 4] if type(v) is str else v
        if type(v) is int:
            return v if abs(v) < 2 ** 62 else {"__bigint__": str(v)}
        if type(v) is float:
            return {"__float__": repr(v)} if not math.isfinite(v) else v
        kind = ""
        if not isinstance(v, (np.ndarray, np.generic)):
            data = getattr(v, "data", None) if type(v).__name__ == "Tensor" else None
            if isinstance(data, np.ndarray):
                kind, v = "Tensor", data
        if isinstance(v, (np.ndarray, np.generic)):
            a = np.array(v)  # a copy, a plain ndarray
            if a.dtype.hasobject or a.dtype.kind not in "biufcUSM?":
                return {"__object__": f"array of {a.dtype}"}
            key = f"a{len(arrays)}"
            arrays[key] = a
            return {"__array__": key, "kind": kind or ("scalar" if isinstance(v, np.generic) else "ndarray")}
        if isinstance(v, (list, tuple)):
            return {"__seq__": type(v).__name__ if type(v) in (list, tuple) else "list",
                    "items": [enc(x, depth + 1) for x in list(v)[:10_000]]}
        if isinstance(v, dict):
            return {"__dict__": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in list(v.items())[:10_000]]}
        return {"__object__": type(v).__name__}

    doc = {"values": {str(k): enc(v) for k, v in values.items()}, "error": error[:MAX_MESSAGE * 4]}
    text = json.dumps(doc)
    if sum(a.nbytes for a in arrays.values()) > MAX_ARRAY_BYTES or len(text) > MAX_JSON_CHARS:
        doc = {"values": {}, "error": "the record is too large (a probe's results are small: is an array huge?)"}
        text, arrays = json.dumps(doc), {}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return text, buf.getvalue()


class BadRecord(Exception):
    pass


def decode(text: str, npz: bytes) -> tuple[dict, str]:
    """(values, error) of an encoded record; BadRecord when it is malformed or oversized (student-made data:
    read with allow_pickle=False, sizes checked before anything is decompressed)."""
    if len(text) > MAX_JSON_CHARS * 2 or len(npz) > MAX_ARRAY_BYTES * 2:
        raise BadRecord("record too large")
    try:
        doc = json.loads(text)
        with zipfile.ZipFile(io.BytesIO(npz)) as z:
            if sum(i.file_size for i in z.infolist()) > MAX_ARRAY_BYTES * 2 or len(z.infolist()) > 100_000:
                raise BadRecord("record arrays too large")
        arrays = dict(np.load(io.BytesIO(npz), allow_pickle=False))
    except BadRecord:
        raise
    except Exception as e:  # anything malformed
        raise BadRecord(f"unreadable record ({type(e).__name__})") from None

    def dec(v, depth=0):
        if depth > 25:
            raise BadRecord("nested too deep")
        if isinstance(v, dict):
            if "__raised__" in v:
                return Raised(str(v["__raised__"]), str(v.get("message", "")))
            if "__array__" in v:
                a = arrays.get(v["__array__"])
                if a is None:
                    raise BadRecord("missing array")
                return Arr(a, str(v.get("kind", "ndarray")))
            if "__float__" in v:
                return float(v["__float__"])
            if "__bigint__" in v:
                return int(v["__bigint__"])
            if "__seq__" in v:
                return Seq(str(v["__seq__"]), [dec(x, depth + 1) for x in v.get("items", [])])
            if "__dict__" in v:
                return {_key(dec(k, depth + 1)): dec(x, depth + 1) for k, x in v["__dict__"]}
            if "__object__" in v:
                return Obj(str(v["__object__"]))
            raise BadRecord("unknown entry")
        if isinstance(v, list):
            raise BadRecord("bare list")
        return v

    if not isinstance(doc, dict) or not isinstance(doc.get("values"), dict):
        raise BadRecord("not a record")
    return {str(k): dec(v) for k, v in doc["values"].items()}, str(doc.get("error", ""))[:MAX_MESSAGE * 4]


def _key(k):
    return tuple(k.items) if isinstance(k, Seq) else (k if isinstance(k, (str, int, float, bool, type(None))) else repr(k))


@dataclass
class Arr:
    a: np.ndarray
    kind: str  # Tensor | ndarray | scalar


@dataclass
class Seq:
    kind: str  # list | tuple
    items: list


@dataclass
class Obj:
    kind: str


# ------------------------------------------------------------------ the check (trusted side)


def _fmt(v) -> str:
    if isinstance(v, Arr):
        return f"{v.kind} of shape {v.a.shape} and dtype {v.a.dtype}"
    if isinstance(v, Raised):
        return f"{v.kind} raised ({v.message[:120]!r})"
    if isinstance(v, Seq):
        return f"a {v.kind} of {len(v.items)} items"
    if isinstance(v, Obj):
        return f"an object of type {v.kind}"
    return repr(v)[:120]


def _num(v) -> str:
    return f"{complex(v):.6g}" if isinstance(v, complex) or np.iscomplexobj(v) else f"{float(v):.6g}"


def compare(got, want, p: Probe, where: str) -> str:
    """'' when `got` (the student's) matches `want` (the reference's) within the probe's tolerances; else why not."""
    if isinstance(got, Raised) and got.kind == "NotImplementedError" and not (
            isinstance(want, Raised) and want.kind == got.kind):
        return f"{where}: not implemented yet (NotImplementedError raised)"
    if isinstance(want, Raised) or isinstance(got, Raised):
        if not (isinstance(want, Raised) and isinstance(got, Raised)):
            return f"{where}: got {_fmt(got)}, expected {_fmt(want)}"
        if got.kind != want.kind:
            return f"{where}: raised {got.kind}, expected {want.kind}"
        if p.messages and got.message != want.message:
            return f"{where}: the {got.kind} message is {got.message!r}, expected {want.message!r}"
        return ""
    if isinstance(want, Arr):
        if not isinstance(got, Arr):
            return f"{where}: got {_fmt(got)}, expected {_fmt(want)}"
        if want.kind != got.kind and "scalar" not in (want.kind, got.kind):
            return f"{where}: got a {got.kind}, expected a {want.kind}"
        a, b = got.a, want.a
        if a.shape != b.shape:
            return f"{where}: shape {a.shape}, expected {b.shape}"
        if p.dtypes and a.dtype != b.dtype and not (a.dtype.kind == b.dtype.kind == "i"):
            return f"{where}: dtype {a.dtype}, expected {b.dtype}"
        if b.dtype.kind in "fc" or a.dtype.kind in "fc":
            try:
                af, bf = a.astype(np.complex128 if "c" in (a.dtype.kind + b.dtype.kind) else np.float64), \
                    b.astype(np.complex128 if "c" in (a.dtype.kind + b.dtype.kind) else np.float64)
            except (ValueError, TypeError):  # (the order differs from a solution line: the leak check)
                return f"{where}: dtype {a.dtype}, expected {b.dtype}"
            close = np.isclose(af, bf, rtol=p.rtol, atol=p.atol, equal_nan=True)
            if not close.all():
                i = np.unravel_index(int(np.argmin(close.ravel())) if close.size else 0, close.shape) if close.ndim else ()
                bad = int((~close).sum())
                at = f" at index {tuple(int(k) for k in i)}" if close.ndim else ""
                return (f"{where}: {bad} of {close.size} values differ from the reference{at}: "
                        f"got {_num(af[i])}, expected {_num(bf[i])} (rtol {p.rtol:g}, atol {p.atol:g})")
            return ""
        if not np.array_equal(a, b):
            diff = np.argwhere(a != b) if a.shape == b.shape and a.ndim else []
            at = f" first at index {tuple(int(k) for k in diff[0])}" if len(diff) else ""
            return f"{where}: values differ from the reference{at}"
        return ""
    if isinstance(want, Seq):
        if not isinstance(got, Seq):
            return f"{where}: got {_fmt(got)}, expected {_fmt(want)}"
        if len(got.items) != len(want.items):
            return f"{where}: {len(got.items)} items, expected {len(want.items)}"
        for i, (g, w) in enumerate(zip(got.items, want.items)):
            why = compare(g, w, p, f"{where}[{i}]")
            if why:
                return why
        return ""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{where}: got {_fmt(got)}, expected a dict"
        if set(got) != set(want):
            missing, extra = sorted(map(str, set(want) - set(got))), sorted(map(str, set(got) - set(want)))
            return f"{where}: keys differ (missing {missing[:5]}, unexpected {extra[:5]})"
        for k in want:
            why = compare(got[k], want[k], p, f"{where}[{k!r}]")
            if why:
                return why
        return ""
    if isinstance(want, float) and not isinstance(want, bool):
        if isinstance(got, bool) or not isinstance(got, (int, float)) and not (isinstance(got, Arr) and got.a.ndim == 0):
            return f"{where}: got {_fmt(got)}, expected a number"
        g = float(got.a) if isinstance(got, Arr) else float(got)
        if not (math.isclose(g, want, rel_tol=p.rtol, abs_tol=p.atol) or (math.isnan(g) and math.isnan(want))):
            return f"{where}: got {g!r}, expected {want!r}"
        return ""
    if isinstance(want, int) and not isinstance(want, bool) and isinstance(got, Arr) and got.a.ndim == 0 \
            and got.a.dtype.kind in "iu":
        return "" if int(got.a) == want else f"{where}: got {int(got.a)}, expected {want}"
    if isinstance(want, Obj):
        return "" if isinstance(got, Obj) and got.kind == want.kind else f"{where}: got {_fmt(got)}, expected {_fmt(want)}"
    if type(got) is not type(want) or got != want:
        return f"{where}: got {_fmt(got)}, expected {_fmt(want)}"
    return ""


def check(p: Probe, student: tuple[dict, str] | None, reference: tuple[dict, str]) -> str:
    """The verdict on one exercise: '' (passed) or why it failed, in one line."""
    ref_values, ref_error = reference
    if ref_error:
        raise RuntimeError(f"the reference failed its own probe of Exercise {p.exercise}: {ref_error}")
    if student is None:
        return "no result (the check did not run)"
    values, error = student
    if error:
        return error
    if p.check is not None:
        missing = sorted(set(ref_values) - set(values))
        if missing:
            return f"no result for {missing[0]!r}"
        return p.check(values, ref_values) or ""
    for key, want in ref_values.items():
        if key not in values:
            return f"{key!r}: no result"
        why = compare(values[key], want, p, key)
        if why:
            return why
    return ""


# ------------------------------------------------------------------ reference code for earlier exercises


def _def_node(tree: ast.Module, name: str):
    cls, _, fname = name.rpartition(".")
    scope = tree.body
    if cls:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise LookupError(f"class {cls} not found")
        scope = found[0].body
    for n in scope:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == fname:
            return n
    raise LookupError(f"{name} not found")


def reference_sources(text: str, names) -> dict[str, str]:
    """{name: source} of functions or `Class.method`s of the reference module's text (decorators kept, dedented;
    `super()` made explicit so a method works when set on the student's class)."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    out = {}
    for name in names:
        node = _def_node(tree, name)
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        src = textwrap.dedent("".join(lines[first - 1: node.end_lineno]))
        cls = name.rpartition(".")[0]
        if cls:
            src = src.replace("super()", f"super({cls}, self)")
        out[name] = src
    return out


def install_sources(module, sources: dict[str, str]) -> None:
    """Define each reference source in `module`'s namespace and put it in place of the student's definition."""
    for name, src in sources.items():
        scratch: dict = {}
        exec(compile(src, f"<reference {name}>", "exec"), module.__dict__, scratch)
        cls, _, fname = name.rpartition(".")
        owner = getattr(module, cls) if cls else module
        old = getattr(owner, fname, None)
        setattr(owner, fname, scratch[fname])
        if not cls and old is not None:  # tables of the module that hold the old function (BACKWARD_RULES)
            for value in list(vars(module).values()):
                if isinstance(value, dict):
                    for k, v in list(value.items()):
                        if v is old:
                            value[k] = scratch[fname]


# ------------------------------------------------------------------ the student's exported code


def _definitions(src: str) -> str:
    """The top-level `def`s and `class`es of a cell (nothing else of it runs on import)."""
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append("".join(lines[first - 1: node.end_lineno]))
    return "\n".join(out)


def exported_source(nb) -> tuple[str, list[str]]:
    """The module nbdev would export from notebook `nb` (its `#| export` cells, in order), plus the definitions
    of graded solution cells that are not exported (Exercise 6.1's `two_layer_grads`), and a note for each
    such cell left out because it is not valid Python (the rest of the module is still checked).
    Pure text processing: nothing of the notebook is run here."""
    future, parts, skipped = [], [], []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        solution = bool((cell.get("metadata", {}).get("nbgrader") or {}).get("solution"))
        if not re.search(r"^#\|\s*export\s*$", src, re.M):
            if solution:
                try:
                    defs = _definitions(src)
                except SyntaxError as e:
                    skipped.append(f"cell {i + 1}: {type(e).__name__} on line {e.lineno}: {e.msg}")
                    continue
                if defs:
                    parts.append(f"# cell {i + 1} (not exported: its definitions)\n{defs}\n")
            continue
        body = "\n".join(ln for ln in src.splitlines() if not re.match(r"^#\|", ln))
        kept = []
        for ln in body.splitlines():
            (future if re.match(r"^from __future__ import", ln) else kept).append(ln)
        body = "\n".join(kept)
        try:
            ast.parse(body)
        except SyntaxError as e:
            skipped.append(f"cell {i + 1}: {type(e).__name__} on line {e.lineno}: {e.msg}")
            continue
        parts.append(f"# cell {i + 1}\n{body}\n")
    head = "\n".join(dict.fromkeys(future))
    return (head + "\n\n" if head else "") + "\n".join(parts), skipped


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ------------------------------------------------------------------ running probes (both sides)


def groups_for(number: str, exercises=None) -> list[dict]:
    """The probe processes of module `number`: those without substitutes first (one process), then one per
    set of substituted names. Each: {"exercises": [...], "uses": [...]}."""
    probes = module_probes(number)
    wanted = [e for e in probes if exercises is None or e in exercises]
    by_uses: dict[tuple, list[str]] = {}
    for e in wanted:
        by_uses.setdefault(probes[e].group, []).append(e)
    return [{"exercises": by_uses[k], "uses": list(k)} for k in sorted(by_uses, key=lambda k: (len(k), k))]


def run_groups(base: dict, groups: list[dict], python: str, env: dict, workdir: Path, budget_s: float,
               exercise_s: float = 30.0) -> dict[str, dict]:
    """Run `python -m tito.probe_run` for each group (job `base` + the group's exercises and reference sources),
    each exercise at most `exercise_s` seconds and all within `budget_s`. An exercise that hangs or kills its
    process fails alone: the rest of its group runs again in a fresh process.

    Returns {exercise: {"json": text, "npz": base64} or {"error": why}}."""
    import os
    import signal
    import subprocess
    import time

    deadline = time.monotonic() + budget_s
    results: dict[str, dict] = {}
    workdir = Path(workdir)
    for gi, group in enumerate(groups):
        remaining = list(group["exercises"])
        attempt = 0
        while remaining:
            out = workdir / f"probe-{gi}-{attempt}"
            out.mkdir(parents=True, exist_ok=True)
            job = dict(base, exercises=remaining, out=str(out), sources=group.get("sources", {}))
            proc = subprocess.Popen([python, "-m", "tito.probe_run"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env, cwd=str(out), start_new_session=True)
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except OSError:
                pass
            progress_file, current, since, why = out / "progress", None, time.monotonic(), ""
            while proc.poll() is None:
                time.sleep(0.02)
                now = time.monotonic()
                try:
                    p = progress_file.read_text()[:50]
                except OSError:
                    p = ""
                if p != current:
                    current, since = p, now
                if now > deadline or now - since > exercise_s + (15 if p in ("", "import") else 0):
                    why = "did not finish within its time limit"
                    break
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                proc.wait()
            elif not why and proc.returncode != 0:
                why = f"stopped the checking process (exit code {proc.returncode})"
            try:
                progress = progress_file.read_text()[:50]
            except OSError:
                progress = ""
            rest = []
            for ex in remaining:
                j, n = out / f"{ex}.json", out / f"{ex}.npz"
                if j.exists() and n.exists() and j.stat().st_size <= MAX_JSON_CHARS * 2 \
                        and n.stat().st_size <= MAX_ARRAY_BYTES * 2:
                    results[ex] = {"json": j.read_text(encoding="utf-8", errors="replace"), "npz": b64(n.read_bytes())}
                else:
                    rest.append(ex)
            if not rest:
                break
            why = why or "ended the checking process early"
            if time.monotonic() > deadline:
                for ex in rest:
                    results[ex] = {"error": "not checked: the checks ran out of time"}
                break
            if progress in rest:
                results[progress] = {"error": f"running your code for this exercise {why}"}
                rest.remove(progress)
            else:  # it never got to an exercise: importing the module itself failed
                for ex in rest:
                    results[ex] = {"error": f"importing your exported module {why}"}
                break
            remaining, attempt = rest, attempt + 1
    return results


def read_results(raw: dict[str, dict]) -> dict[str, tuple[dict, str] | None]:
    """{exercise: (values, error)} from run_groups' output (an unreadable record reads as an error)."""
    out = {}
    for ex, r in raw.items():
        if not isinstance(r, dict):
            continue
        if "error" in r:
            out[ex] = ({}, str(r["error"])[:MAX_MESSAGE])
            continue
        try:
            out[ex] = decode(str(r.get("json", "")), base64.b64decode(str(r.get("npz", "")), validate=False))
        except (BadRecord, ValueError) as e:
            out[ex] = ({}, f"the check's record could not be read: {e}")
    return out
