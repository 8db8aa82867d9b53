"""Trusted grading: each graded exercise has a PROBE (runs the student's code, reports only data) and a CHECK.

The probe of an exercise is a function `probe(rng, rec)` registered with `@probe("N.k", ...)` in
`tito/probes/mNN.py`. It imports the package (`from tinytorch.core.tensor import Tensor` inside its
body), draws its inputs from `rng` (a NumPy Generator seeded by the grading run) and puts what the
code returns into `rec`: `rec["out"] = value`, or `rec.call("out", fn, *args)`, which records the
result or the exception raised (its type and message). It computes no expected value and asserts
nothing: the same probe runs twice,

- in a grading sandbox of its own (`python -I -m tito.probe_run`, a fresh process that never ran the
  notebook), over the student's exported code;
- in a subprocess of the trusted grading process, over the instructor's reference package,

with the same seed, and `check()` compares the two records in the trusted process, with the
exercise's tolerances or the probe's own `check=` function (statistical checks of random results).
Records cross the process boundary as JSON with the arrays inline (base64 of their bytes, never
pickle), so nothing the student's code does in its process can make a wrong result match: the
expected values never exist there. What the student's process reports is data (values, an
exception's type and message), bounded here and quoted in every verdict as the student's own output;
every verdict sentence is written by the trusted side (tito.trusted).

**One bug, charged once, without the reference's code in the sandbox.** `replay=("merge_pair",)`
names functions (or `Class.method`s) of the graded module, written in earlier exercises, that the
exercise's code calls. When the probe runs over the reference, every call of them is recorded: its
arguments (as data) and what it returned, raised and changed in its arguments (as data). When the
probe runs over the student's code, each call of them asks the trusted process, over the probe
process's pipe, for the recorded outcome of a call with the same arguments (floats within a
tolerance): a hit replays it (the reference's *outputs* for those inputs, computed in the trusted
process, never its code). The first call of a name that matches no recorded one closes that name's
table for the exercise, and the student's own code runs for it from then on (the verdict then names
the dependency: "13.3 not checked on its own: it uses 13.1, which failed"). The recorded table never
enters the sandbox: it answers one call at a time, only the calls of the running exercise, and a
name closes at its first miss, so a submission cannot read expected values out of it nor learn them
by guessing. A call whose outcome cannot be given back as data (a result that joined an autograd
graph, a new function) runs the student's own code.

A probe file holds no reference logic: a helper that computes what an answer should be is a `check=`
function, which runs in the trusted process only; the sandbox gets a copy of the probe file without
its check functions (`sandbox_source`).
"""
from __future__ import annotations

import ast
import functools
import base64
import binascii
import contextlib
import importlib
import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

MAX_RECORD_BYTES = 16_000_000  # per exercise record (arrays and text, as sent): a bigger one is refused
MAX_MESSAGE = 300  # characters of a student's exception message kept
MAX_STRING = 4000  # characters of any other string value kept
ARRAY_KINDS = "biufcUS"  # dtypes an array may have on the wire (never object)


@dataclass
class Probe:
    exercise: str  # "2.5"
    module: str  # "02"
    fn: Callable  # fn(rng, rec)
    replay: tuple = ()  # graded-module names whose calls replay the reference's recorded outcomes (see above)
    rtol: float = 1e-4
    atol: float = 1e-6
    messages: bool = False  # exception messages must match the reference's exactly (the contract's text)
    dtypes: bool = True  # array dtypes must match
    check: Callable | None = None  # check(student_values, reference_values) -> "" or why it failed (trusted side)


REGISTRY: dict[str, dict[str, Probe]] = {}


def probe(exercise: str, replay=(), rtol: float = 1e-4, atol: float = 1e-6, messages: bool = False,
          dtypes: bool = True, check: Callable | None = None, **unknown):
    """Register the decorated `fn(rng, rec)` as the probe of `exercise` ("N.k")."""
    if "uses" in unknown:
        raise TypeError(f"@probe({exercise!r}, uses=...): source substitution was removed (issue 28): the reference's "
                        "code never enters the sandbox. Write replay=(...) with the same names: the probe then replays "
                        "the reference's recorded outcomes of those calls (see tito/probes/__init__.py)")
    if unknown:
        raise TypeError(f"@probe({exercise!r}): unknown arguments {sorted(unknown)}")
    module = f"{int(exercise.split('.')[0]):02d}"

    def deco(fn):
        REGISTRY.setdefault(module, {})[exercise] = Probe(exercise, module, fn, tuple(replay), rtol, atol, messages,
                                                           dtypes, check)
        return fn
    return deco


@contextlib.contextmanager
def replaced(obj, **stand_ins):
    "Replace attributes of `obj` (a package module, a class) by stand-ins while a probe runs; put them back after."
    saved = {name: getattr(obj, name) for name in stand_ins}
    for name, value in stand_ins.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)


def module_probes(number: str) -> dict[str, Probe]:
    """The probes of module `number` ("02"), {} when it has none (its file tito/probes/mNN.py is missing)."""
    number = f"{int(number):02d}"
    if number not in REGISTRY:
        try:
            importlib.import_module(f"{__name__}.m{number}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.m{number}":
                raise
            REGISTRY[number] = {}
    return REGISTRY.get(number, {})


def probe_file(number: str) -> Path:
    return Path(__file__).with_name(f"m{int(number):02d}.py")


def exercise_of(label: str) -> str:
    """'2.5' from 'Exercise 2.5: Softmax.forward'."""
    m = re.match(r"Exercise\s+(\d+\.\d+)", label)
    return m.group(1) if m else ""


def exercise_key(ex: str) -> tuple:
    return tuple(int(x) for x in ex.split("."))


def seed_for(seed: int, exercise: str) -> list[int]:
    a, b = exercise.split(".")
    return [int(seed), int(a), int(b)]


# ------------------------------------------------------------------ the probe file the sandbox gets


def _strip_checks(text: str) -> tuple[str, bool]:
    """`text` with the `check=` argument of every `@probe(...)` decorator removed, whatever its expression (a
    function's name, or a call of a factory that makes one), and whether any was removed."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if (isinstance(dec, ast.Call) and getattr(dec.func, "id", getattr(dec.func, "attr", "")) == "probe"
                    and any(k.arg == "check" for k in dec.keywords)):
                dec.keywords = [k for k in dec.keywords if k.arg != "check"]
                edits.append((dec.lineno, dec.col_offset, dec.end_lineno, dec.end_col_offset, ast.unparse(dec)))
    for l0, c0, l1, c1, code in sorted(edits, reverse=True):
        head, tail = lines[l0 - 1][:c0], lines[l1 - 1][c1:]
        lines[l0 - 1:l1] = [head + code + tail]
    return "".join(lines), bool(edits)


def sandbox_source(number: str) -> str:
    """The text of tito/probes/mNN.py without its check functions (and the private helpers only they used): what
    the sandbox's copy holds. The probes and their inputs stay; the trusted side's checks, which may compute what
    an answer should be, do not."""
    probes = module_probes(number)
    text, stripped = _strip_checks(probe_file(number).read_text(encoding="utf-8"))
    checks = {p.check.__name__ for p in probes.values() if p.check is not None}
    removed: set[str] = {"<check arguments>"} if stripped else set()
    while True:
        tree = ast.parse(text)
        used = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {node.name}
            else:
                used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        gone = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                and (n.name in checks and n.name not in used or n.name.startswith("_") and n.name not in used and removed)]
        if not gone:
            return text
        lines = text.splitlines(keepends=True)
        cut = [(min([n.lineno] + [d.lineno for d in n.decorator_list]) - 1, n.end_lineno) for n in gone]
        text = "".join(ln for i, ln in enumerate(lines) if not any(a <= i < b for a, b in cut))
        removed |= {n.name for n in gone}
        checks = set()


# ------------------------------------------------------------------ records: data only


class Raised:
    """What a call raised: its type's name and message (the record keeps nothing else of it)."""

    def __init__(self, kind: str, message: str):
        self.kind, self.message = str(kind)[:100], str(message)[:MAX_MESSAGE]

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
            self[key] = Raised(_type_name(e), safe_str(e))
            return None
        self[key] = out
        return out


def _type_name(e) -> str:
    try:
        return str(type(e).__name__)
    except BaseException:
        return "BaseException"


def safe_str(e) -> str:
    try:
        return str(e)[:MAX_MESSAGE]
    except BaseException:
        return "<message could not be read>"


def is_tensor(v) -> bool:
    return type(v).__name__ == "Tensor" and isinstance(getattr(v, "data", None), np.ndarray)


def array_json(a: np.ndarray) -> dict | None:
    """{"__array__": [dtype, shape, base64 bytes]}; None for an array that cannot travel (objects)."""
    a = np.asarray(a)
    if a.dtype.hasobject or a.dtype.kind not in ARRAY_KINDS:
        return None
    a = np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes a 0-d array 1-d: keep the shape
    return {"__array__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode()]}


@functools.lru_cache(maxsize=64)
def _wire_dtype(name: str) -> np.dtype:
    """The dtype a record names, when it may travel (cached: a record names a few dtypes hundreds of times)."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise BadRecord("a malformed array (dtype)") from None
    if dtype.hasobject or dtype.kind not in ARRAY_KINDS:
        raise BadRecord("an array of a type that may not be sent")
    return dtype


def array_from_json(v, budget: list[int] | None = None) -> np.ndarray:
    """The array of `array_json` (checked: a whitelisted dtype, bytes that match the shape, within `budget`)."""
    try:
        dtype_s, shape, data = v
        shape = tuple(map(int, shape))
    except (TypeError, ValueError) as e:
        raise BadRecord(f"a malformed array ({type(e).__name__})") from None
    dtype = _wire_dtype(str(dtype_s)[:64])
    if len(shape) > 32 or (shape and min(shape) < 0):
        raise BadRecord("an array of a type that may not be sent")
    if not isinstance(data, str):
        raise BadRecord("a malformed array")
    if budget is not None:
        budget[0] -= len(data)
        if budget[0] < 0:
            raise BadRecord("the record is too large")
    try:
        raw = binascii.a2b_base64(data)  # what base64.b64decode(data, validate=False) does, without its checks
    except ValueError:  # not ASCII, or bad padding
        raise BadRecord("a malformed array (its bytes)") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise BadRecord("an array whose bytes do not match its shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def encode_value(v, budget: list[int], depth: int = 0):
    """A record value as JSON: arrays and Tensors (as their arrays) inline, containers, numbers, strings
    (bounded), Raised; any other object by its type's name. `budget` (characters) bounds the whole record."""
    if budget[0] < 0:
        return {"__object__": "the record is too large"}
    if depth > 20:
        return {"__object__": "nested too deep"}
    if isinstance(v, Raised):
        return {"__raised__": v.kind, "message": v.message}
    if v is None or type(v) is bool:
        return v
    if type(v) is str:
        budget[0] -= min(len(v), MAX_STRING)
        return v[:MAX_STRING]
    if type(v) is int:
        return v if abs(v) < 2 ** 53 else {"__bigint__": str(v)}
    if type(v) is float:
        return v if math.isfinite(v) else {"__float__": repr(v)}
    kind = ""
    if is_tensor(v):
        kind, v = "Tensor", v.data
    if isinstance(v, (np.ndarray, np.generic)):
        j = array_json(np.array(v))
        if j is None:
            return {"__object__": f"array of {np.asarray(v).dtype}"}
        budget[0] -= len(j["__array__"][2]) + 50
        j["kind"] = kind or ("scalar" if isinstance(v, np.generic) else "ndarray")
        return j
    if isinstance(v, (list, tuple)):
        return {"__seq__": "tuple" if isinstance(v, tuple) else "list",
                "items": [encode_value(x, budget, depth + 1) for x in list(v)[:100_000]]}
    if isinstance(v, dict):
        return {"__dict__": [[encode_value(k, budget, depth + 1), encode_value(x, budget, depth + 1)]
                             for k, x in list(v.items())[:100_000]]}
    return {"__object__": type(v).__name__[:100]}


class BadRecord(Exception):
    pass


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


def decode_value(v, budget: list[int], depth: int = 0):
    """The trusted side's reading of a record value (student-made data: checked, never executed). A record holds
    hundreds of values (module 06: about 700 per notebook): the JSON types are told apart by `type(...) is`."""
    if depth > 25:
        raise BadRecord("nested too deep")
    t = type(v)
    if t is dict or isinstance(v, dict):
        if "__raised__" in v:
            return Raised(str(v["__raised__"]), str(v.get("message", "")))
        a = v.get("__array__")
        if a is not None or "__array__" in v:
            return Arr(array_from_json(a, budget), str(v.get("kind", "ndarray"))[:20])
        if "__float__" in v:
            try:
                return float(str(v["__float__"]))
            except ValueError:
                raise BadRecord("a malformed number") from None
        if "__bigint__" in v:
            try:
                return int(str(v["__bigint__"])[:400])
            except ValueError:
                raise BadRecord("a malformed number") from None
        if "__seq__" in v:
            items = v.get("items")
            if type(items) is not list and not isinstance(items, list):
                raise BadRecord("a malformed list")
            depth += 1
            return Seq("tuple" if v["__seq__"] == "tuple" else "list", [decode_value(x, budget, depth) for x in items])
        if "__dict__" in v:
            pairs = v["__dict__"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise BadRecord("a malformed dict")
            return {_key(decode_value(k, budget, depth + 1)): decode_value(x, budget, depth + 1) for k, x in pairs}
        if "__object__" in v:
            return Obj(str(v["__object__"])[:100])
        raise BadRecord("an unknown entry")
    if t is str:
        return v[:MAX_STRING]
    if v is None or t is bool or t is int or t is float:
        return v
    if isinstance(v, list):
        raise BadRecord("a bare list")
    if isinstance(v, str):
        return v[:MAX_STRING]
    if isinstance(v, (bool, int, float)):
        return v
    raise BadRecord("an unknown value")


def _key(k):
    return tuple(k.items) if isinstance(k, Seq) else (k if isinstance(k, (str, int, float, bool, type(None))) else repr(k))


def read_record(doc) -> tuple[dict, dict]:
    """(values, outcome) of a record message of the probe runner; BadRecord when it is malformed or too large."""
    if not isinstance(doc, dict) or not isinstance(doc.get("values"), dict) or not isinstance(doc.get("outcome"), dict):
        raise BadRecord("not a record")
    budget = [MAX_RECORD_BYTES]
    values = {str(k)[:200]: decode_value(v, budget) for k, v in doc["values"].items()}
    o = doc["outcome"]
    outcome = {"kind": str(o.get("kind", ""))[:40], "type": str(o.get("type", ""))[:100],
               "message": str(o.get("message", ""))[:MAX_MESSAGE]}
    return values, outcome


# ------------------------------------------------------------------ the check (trusted side)


def quote(s, limit: int = 160) -> str:
    """A string the student's process produced, bounded and quoted: shown as the student's output, never as
    the grader's words."""
    s = str(s)
    cut = len(s) > limit
    return repr(s[:limit]) + ("..." if cut else "")


def _fmt(v) -> str:
    """A value for a verdict (the trusted side's words; any text of the student's is quoted)."""
    if isinstance(v, Arr):
        return f"a {v.kind} of shape {v.a.shape} and dtype {v.a.dtype}"
    if isinstance(v, Raised):
        return f"{quote(v.kind, 60)} raised (message {quote(v.message, 120)})"
    if isinstance(v, Seq):
        return f"a {v.kind} of {len(v.items)} items"
    if isinstance(v, Obj):
        return f"an object of type {quote(v.kind, 60)}"
    if isinstance(v, dict):
        return f"a dict of {len(v)} items"
    if isinstance(v, str):
        return quote(v, 80)
    return repr(v)[:80]


def _num(v) -> str:
    return f"{complex(v):.6g}" if isinstance(v, complex) or np.iscomplexobj(v) else f"{float(v):.6g}"


def _all_close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    """True only where `np.isclose(a, b, rtol, atol, equal_nan=True).all()` is (arrays of one float or complex dtype
    and shape): every reference value finite and every difference within `atol + rtol * |b|`, isclose's own formula.
    False says nothing (a NaN or an infinity, or a real difference): the caller asks isclose then. On the small arrays
    probes record it costs a tenth of isclose's Python, which ran over a thousand times per submission (module 06)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.isfinite(b).all() and (np.abs(a - b) <= atol + rtol * np.abs(b)).all())


def compare(got, want, p: Probe, where: str) -> str:
    """'' when `got` (the student's) matches `want` (the reference's) within the probe's tolerances; else why not.
    `where` names the probe's case (the checker's own names, never the student's)."""
    if isinstance(got, Raised) and got.kind == "NotImplementedError" and not (
            isinstance(want, Raised) and want.kind == got.kind):
        return f"{where}: not implemented yet (NotImplementedError raised)"
    if isinstance(want, Raised) or isinstance(got, Raised):
        if not (isinstance(want, Raised) and isinstance(got, Raised)):
            return f"{where}: your code gave {_fmt(got)}, the reference gives {_fmt(want)}"
        if got.kind != want.kind:
            return f"{where}: your code raised {quote(got.kind, 60)}, the reference raises {want.kind}"
        if p.messages and got.message != want.message:
            return f"{where}: your {want.kind} says {quote(got.message)}, the contract's message is {want.message!r}"
        return ""
    if (isinstance(want, Arr) and want.a.ndim == 0 and want.a.dtype.kind in "iuf"
            and isinstance(got, (int, float)) and not isinstance(got, bool)):
        # a Python number where the reference returned a NumPy scalar: numbers are numbers, whatever their type
        if want.a.dtype.kind in "iu" and isinstance(got, int):
            return "" if got == int(want.a) else f"{where}: your code gave {got}, the reference gives {int(want.a)}"
        g, w = float(got), float(want.a)
        if not (math.isclose(g, w, rel_tol=p.rtol, abs_tol=p.atol) or (math.isnan(g) and math.isnan(w))):
            return f"{where}: your code gave {g!r}, the reference gives {w!r}"
        return ""
    if isinstance(want, Arr):
        if not isinstance(got, Arr):
            return f"{where}: your code gave {_fmt(got)}, the reference gives {_fmt(want)}"
        if want.kind != got.kind and "scalar" not in (want.kind, got.kind):
            return f"{where}: your code gave a {got.kind}, the reference gives a {want.kind}"
        a, b = got.a, want.a
        if a.shape != b.shape:
            return f"{where}: shape {a.shape}, expected {b.shape}"
        if p.dtypes and a.dtype != b.dtype and not (a.dtype.kind == b.dtype.kind == "i"):
            return f"{where}: dtype {a.dtype}, expected {b.dtype}"
        if b.dtype.kind in "fc" or a.dtype.kind in "fc":
            try:
                ct = np.complex128 if "c" in (a.dtype.kind + b.dtype.kind) else np.float64
                af, bf = a.astype(ct), b.astype(ct)
            except (ValueError, TypeError):
                return f"{where}: dtype {a.dtype}, expected {b.dtype}"
            if _all_close(af, bf, p.rtol, p.atol):
                return ""
            close = np.isclose(af, bf, rtol=p.rtol, atol=p.atol, equal_nan=True)
            if not close.all():
                i = np.unravel_index(int(np.argmin(close.ravel())) if close.size else 0, close.shape) if close.ndim else ()
                bad = int((~close).sum())
                at = f" at index {tuple(int(k) for k in i)}" if close.ndim else ""
                return (f"{where}: {bad} of {close.size} values differ from the reference{at}: "
                        f"your code gave {_num(af[i])}, the reference gives {_num(bf[i])} (rtol {p.rtol:g}, atol {p.atol:g})")
            return ""
        if not np.array_equal(a, b):
            diff = np.argwhere(a != b) if a.shape == b.shape and a.ndim else []
            at = f" first at index {tuple(int(k) for k in diff[0])}" if len(diff) else ""
            return f"{where}: values differ from the reference{at}"
        return ""
    if isinstance(want, Seq):
        if not isinstance(got, Seq):
            return f"{where}: your code gave {_fmt(got)}, the reference gives {_fmt(want)}"
        if len(got.items) != len(want.items):
            return f"{where}: {len(got.items)} items, expected {len(want.items)}"
        for i, (g, w) in enumerate(zip(got.items, want.items)):
            why = compare(g, w, p, f"{where}[{i}]")
            if why:
                return why
        return ""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{where}: your code gave {_fmt(got)}, the reference gives a dict"
        if set(got) != set(want):
            missing = sorted(map(str, set(want) - set(got)))
            extra = sorted(quote(k, 40) for k in set(got) - set(want))
            return f"{where}: keys differ (missing {missing[:5]}, unexpected {', '.join(extra[:5]) or 'none'})"
        for k in want:
            why = compare(got[k], want[k], p, f"{where}[{k!r}]")
            if why:
                return why
        return ""
    if isinstance(want, float) and not isinstance(want, bool):
        if isinstance(got, bool) or not isinstance(got, (int, float)) and not (isinstance(got, Arr) and got.a.ndim == 0):
            return f"{where}: your code gave {_fmt(got)}, the reference gives a number"
        g = float(got.a) if isinstance(got, Arr) else float(got)
        if not (math.isclose(g, want, rel_tol=p.rtol, abs_tol=p.atol) or (math.isnan(g) and math.isnan(want))):
            return f"{where}: your code gave {g!r}, the reference gives {want!r}"
        return ""
    if isinstance(want, int) and not isinstance(want, bool) and isinstance(got, Arr) and got.a.ndim == 0 \
            and got.a.dtype.kind in "iuf":
        return "" if got.a == want else f"{where}: your code gave {got.a.item()!r}, the reference gives {want}"
    if isinstance(want, int) and not isinstance(want, bool) and isinstance(got, float):
        return "" if got == want else f"{where}: your code gave {got!r}, the reference gives {want}"
    if isinstance(want, Obj):
        return "" if isinstance(got, Obj) and got.kind == want.kind else \
            f"{where}: your code gave {_fmt(got)}, the reference gives {_fmt(want)}"
    if type(got) is not type(want) or got != want:
        return f"{where}: your code gave {_fmt(got)}, the reference gives {_fmt(want)}"
    return ""


def outcome_text(outcome: dict) -> str:
    """The trusted side's sentence for how a probe run ended without a result (the student's words quoted)."""
    kind = outcome.get("kind")
    said = f"{quote(outcome.get('type', ''), 60)}: {quote(outcome.get('message', ''))}"
    if kind == "not_implemented":
        return "not implemented yet (NotImplementedError raised)"
    if kind == "raised":
        return f"the check could not use your code: it raised {said}"
    if kind == "import":
        return f"importing your exported module failed: {said}"
    return "the check did not finish"


def check(p: Probe, student: tuple[dict, dict] | None, reference: tuple[dict, dict]) -> str:
    """The verdict on one exercise: '' (passed) or why it failed, in one line."""
    ref_values, ref_outcome = reference
    if ref_outcome.get("kind") != "ok":
        raise RuntimeError(f"the reference failed its own probe of Exercise {p.exercise}: {outcome_text(ref_outcome)}")
    if student is None:
        return "no result (the check did not run)"
    values, outcome = student
    if outcome.get("kind") != "ok":
        return outcome_text(outcome)
    if p.check is not None:
        missing = sorted(set(ref_values) - set(values))
        if missing:
            return f"case {missing[0]!r}: no result"
        return p.check(values, ref_values) or ""
    for key, want in ref_values.items():
        if key not in values:
            return f"case {key!r}: no result"
        why = compare(values[key], want, p, "\x00")
        if why:
            where, _, msg = why.partition(": ")
            path = where.replace("\x00", "")
            return f"case {key!r}{' at ' + path if path else ''} (your code called on the checker's own inputs): {msg}"
    return ""


# ------------------------------------------------------------------ the student's exported code


@functools.lru_cache(maxsize=4096)
def _syntax_error(body: str) -> tuple[str, int | None, str] | None:
    """(type, line, message) of the SyntaxError parsing `body` raises, or None. Cached: most exported cells are the
    course's given code, the same text in every submission of a grading run."""
    try:
        ast.parse(body)
    except SyntaxError as e:
        return type(e).__name__, e.lineno, e.msg
    return None


@functools.lru_cache(maxsize=4096)
def _definitions(src: str) -> str:
    """The top-level `def`s and `class`es of a cell (nothing else of it runs on import). Cached like `_syntax_error`."""
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
        kind, text, cell_future = _exported_cell(src, solution)
        future += cell_future
        if kind == "skipped":
            skipped.append(f"cell {i + 1}: {text}")
        elif kind == "definitions":
            parts.append(f"# cell {i + 1} (not exported: its definitions)\n{text}\n")
        elif kind == "exported":
            parts.append(f"# cell {i + 1}\n{text}\n")
    head = "\n".join(dict.fromkeys(future))
    return (head + "\n\n" if head else "") + "\n".join(parts), skipped


@functools.lru_cache(maxsize=4096)
def _exported_cell(src: str, solution: bool) -> tuple[str, str, tuple[str, ...]]:
    """What `exported_source` takes from one code cell: ("exported", its code without `#|` lines and `from __future__`
    imports, those imports), ("definitions", a solution cell's definitions, ()), ("skipped", why, ...) or ("", "", ()).
    Cached by the cell's text: most cells are the course's given code, the same in every submission of a run."""
    if not re.search(r"^#\|\s*export\s*$", src, re.M):
        if solution:
            try:
                defs = _definitions(src)
            except SyntaxError as e:
                return "skipped", f"{type(e).__name__} on line {e.lineno}: {e.msg}", ()
            if defs:
                return "definitions", defs, ()
        return "", "", ()
    body = "\n".join(ln for ln in src.splitlines() if not ln.startswith("#|"))
    future, kept = [], []
    for ln in body.splitlines():
        (future if ln.startswith("from __future__ import") else kept).append(ln)
    body = "\n".join(kept)
    error = _syntax_error(body)
    if error is not None:
        return "skipped", f"{error[0]} on line {error[1]}: {error[2]}", tuple(future)
    return "exported", body, tuple(future)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def function_names(label: str) -> set[str]:
    """The functions an exercise's label names: 'Exercise 12.6: MultiHeadAttention.split_heads and merge_heads'
    -> {'MultiHeadAttention.split_heads', 'MultiHeadAttention.merge_heads', 'split_heads', 'merge_heads'}."""
    text = label.split(":", 1)[1] if ":" in label else label
    text = re.sub(r"\([^)]*\)", "", text)
    out, cls = set(), ""
    for tok in re.findall(r"[A-Za-z_][\w.]*", text):
        if tok == "and":
            continue
        if "." in tok:
            cls = tok.rsplit(".", 1)[0]
            out |= {tok, tok.rsplit(".", 1)[1]}
        else:
            out.add(tok)
            if cls:
                out.add(f"{cls}.{tok}")
    return out


def replayed_exercises(number: str, labels: dict[str, str]) -> dict[str, str]:
    """{replayed name: the exercise that writes it} for module `number`, from its graded cells' labels
    ({exercise: label}); a name no label names maps to ''."""
    out = {}
    for p in module_probes(number).values():
        for name in p.replay:
            owner = ""
            for ex, label in sorted(labels.items(), key=lambda kv: exercise_key(kv[0])):
                names = function_names(label)
                if name in names or name.split(".")[0] in names and name.split(".")[-1] in ("__init__", "__len__",
                                                                                               "__getitem__"):
                    owner = ex
                    break
            out[name] = owner
    return out


def is_generator_function(fn) -> bool:
    return inspect.isgeneratorfunction(fn)
