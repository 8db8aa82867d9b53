"""Run the probes of one module over one package: `python -I -m tito.probe_run` (tito.trusted starts it).

One job, one fresh process, on the job protocol (tito.jobs): a `probe` job arrives as the first line of stdin,
with the payload

    {"module": "13", "seed": 123, "package_module": "tinytorch.models.gpt", "mode": "replay" | "record",
     "files": {"tinytorch/models/gpt.py": <base64>, ...} | "pkg_dir": "/path/holding/tinytorch"}

`files` (the prerequisite package and the student's exported module) are written into a fresh folder
under the working directory, made read-only, and put first on sys.path. Every import the runner needs
(NumPy, the probe file, the standard library modules probes use) is done before any student code
runs; it says `ready`, then the graded module is imported, and the runner answers the job's own messages:

    {"t": "run", "ex": "13.3"}      -> {"t": "start", "ex": "13.3"}, ... {"t": "record", "ex": "13.3", ...}
    {"t": "exit"}                  -> {"t": "result", "result": {}, "cpu_s": 1.2}  (the protocol's end; CPU seconds
                                      this process used, for benchmarks)

Messages go out on the protocol's private copy of stdout taken before the student's code runs (the student's own
prints go where the parent sent stderr: nowhere). In `replay` mode (the student's code, in the sandbox) a call of a name in the
probe's `replay=` asks the trusted process for the reference's recorded outcome of that call:

    {"t": "call", "ex": "13.3", "name": "LayerNormFunction.forward", "key": <the arguments, as data>}
    <- {"t": "hit", "answer": ...} | {"t": "own"} | {"t": "miss"}

In `record` mode (the reference, in the trusted process) every such call runs the reference and its
outcome is sent with the record (`calls`). See tito/probes/__init__.py for why.
"""
from __future__ import annotations

import base64
import builtins
import collections
import copy  # noqa: F401  (imported before student code runs: probes use it)
import functools
import importlib
import inspect
import io  # noqa: F401
import json
import math
import os
import re  # noqa: F401
import sys
import types

import numpy as np

from tito import probes as P
from tito.jobs import Channel, serve  # noqa: F401  (Channel: the messages' one framing)

MAX_DEPTH = 8  # how deep arguments are read as data
MAX_OBJECTS = 20_000  # objects reachable from one call's arguments that are tracked
MAX_CALLS = 100_000  # recorded calls per exercise
FILE_BYTES = 8_000_000  # files a call writes into the working directory, replayed up to this size


class Unreplayable(Exception):
    """This call's outcome cannot be given back as data (a result that is part of an autograd graph, a new
    function or an object of a class defined inside a function): the student's own code runs for it."""


class NoKey(Exception):
    """The arguments cannot be read as data (an iterator, a file): the student's own code runs."""


# ------------------------------------------------------------------ reading values as data


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _class_path(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolvable(path: str) -> bool:
    return "<locals>" not in path and "<lambda>" not in path


def _import_path(path: str):
    mod, _, qual = path.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _slots(cls) -> list[str]:
    out = []
    for c in cls.__mro__:
        s = c.__dict__.get("__slots__", ())
        out += [s] if isinstance(s, str) else list(s)
    return [s for s in dict.fromkeys(out) if s not in ("__dict__", "__weakref__")]


def _fields(o, by_name: bool = True) -> list[tuple[str, object]]:
    """An object's attributes (its set __slots__, then its __dict__): by name (to compare two calls' arguments),
    or in their own order (a recorded state: `vars()` order is what a loop over attributes sees)."""
    out = []
    for s in _slots(type(o)):
        try:
            out.append((s, object.__getattribute__(o, s)))
        except AttributeError:
            pass
    d = getattr(o, "__dict__", None)
    if isinstance(d, dict):
        out += [(k, v) for k, v in d.items() if isinstance(k, str)]
    return sorted(out, key=lambda kv: kv[0]) if by_name else out


def _is_stateful(o) -> bool:
    """An object whose attributes are read as data (not a module, class, function or builtin)."""
    if isinstance(o, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                      functools.partial, types.GeneratorType)):
        return False
    return hasattr(o, "__dict__") or bool(_slots(type(o)))


def _rng_state(g) -> dict:
    return json.loads(json.dumps(g.bit_generator.state, default=str))


def _tensor_fields(t, full: bool) -> list[tuple[str, object]]:
    out = [("data", t.data), ("requires_grad", bool(getattr(t, "requires_grad", False)))]
    if full:
        out += [("grad", getattr(t, "grad", None)), ("_retains_grad", getattr(t, "_retains_grad", False))]
    return out


def _prim(v):
    if type(v) is float:
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if type(v) is int:
        return v if abs(v) < 2 ** 53 else {"__int__": str(v)}
    if type(v) is complex:
        return {"__complex__": [repr(v.real), repr(v.imag)]}
    if type(v) is bytes:
        return {"__bytes__": base64.b64encode(v).decode()}
    return v


def key_json(v, depth: int = 0, stack: tuple = ()):
    """The arguments of a call as data, by value: what two runs compare to know they made the same call."""
    if type(v) in _IMMUTABLE:
        return _prim(v)
    if isinstance(v, np.dtype):
        return {"__dtype__": str(v)}
    if isinstance(v, (np.ndarray, np.generic)):
        j = P.array_json(np.array(v))
        if j is None:
            raise NoKey(f"an array of {np.asarray(v).dtype}")
        j["kind"] = "scalar" if isinstance(v, np.generic) else "ndarray"
        return j
    if P.is_tensor(v):
        return {"__tensor__": [key_json(f, depth + 1, stack) for _, f in _tensor_fields(v, False)]}
    if isinstance(v, np.random.Generator):
        return {"__rng__": _rng_state(v)}
    if isinstance(v, (list, tuple)):
        if id(v) in stack or depth > MAX_DEPTH:
            return {"__deep__": type(v).__name__}
        return {"__seq__": _class_path(type(v)) if type(v) not in (list, tuple) else type(v).__name__,
                "items": [key_json(x, depth + 1, stack + (id(v),)) for x in v]}
    if isinstance(v, collections.abc.Mapping):
        if id(v) in stack or depth > MAX_DEPTH:
            return {"__deep__": type(v).__name__}
        return {"__dict__": [[key_json(k, depth + 1, stack), key_json(x, depth + 1, stack + (id(v),))]
                             for k, x in v.items()], "cls": type(v).__name__}
    if isinstance(v, (set, frozenset)):
        items = [key_json(x, depth + 1, stack) for x in v]
        return {"__set__": sorted(items, key=lambda j: json.dumps(j, sort_keys=True))}
    if isinstance(v, type):
        return {"__type__": _class_path(v)}
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)) \
            or (callable(v) and not _is_stateful(v)):
        return {"__callable__": getattr(v, "__qualname__", type(v).__name__)}
    if isinstance(v, (types.GeneratorType, io.IOBase)) or type(v).__name__.endswith("iterator"):
        raise NoKey(f"a {type(v).__name__}")
    if _is_stateful(v):
        if id(v) in stack or depth > MAX_DEPTH:
            return {"__deep__": type(v).__qualname__}
        return {"__obj__": type(v).__qualname__,
                "state": [[k, key_json(x, depth + 1, stack + (id(v),))] for k, x in _fields(v)]}
    return {"__opaque__": type(v).__qualname__}


class Snapshot:
    """The mutable objects reachable from a call's arguments, each with the path it was reached by: what a call
    may change, and what its outcome may refer to by identity (`Tensor(a).data is a`)."""

    def __init__(self, args: tuple, kwargs: dict):
        self.path: dict[int, list] = {}
        self.objs: dict[int, object] = {}
        queue = [(a, [["a", i]], 0) for i, a in enumerate(args)] + \
                [(v, [["k", k]], 0) for k, v in kwargs.items()]
        while queue and len(self.objs) < MAX_OBJECTS:
            o, path, depth = queue.pop(0)
            if type(o) in _IMMUTABLE or id(o) in self.path or isinstance(o, (type, types.ModuleType, np.dtype)):
                continue
            tracked = isinstance(o, (np.ndarray, np.random.Generator, list, dict)) or P.is_tensor(o) \
                or _is_stateful(o)
            if tracked:
                self.path[id(o)] = path
                self.objs[id(o)] = o
            if depth >= MAX_DEPTH:
                continue
            if isinstance(o, (list, tuple)):
                queue += [(x, path + [["[", i]], depth + 1) for i, x in enumerate(o)]
            elif isinstance(o, dict):
                queue += [(x, path + [["{", k]], depth + 1) for k, x in o.items() if type(k) in (str, int)]
            elif P.is_tensor(o):
                queue += [(x, path + [[".", k]], depth + 1) for k, x in _tensor_fields(o, True)]
            elif _is_stateful(o) and not isinstance(o, np.random.Generator):
                queue += [(x, path + [[".", k]], depth + 1) for k, x in _fields(o)]


class StateEncoder:
    """Values as data that refer to the objects of a Snapshot by their paths (strict: a value that cannot be
    given back raises Unreplayable; lenient: it becomes a marker, for comparing before and after a call)."""

    def __init__(self, snap: Snapshot, strict: bool):
        self.snap, self.strict = snap, strict

    def fail(self, why: str):
        if self.strict:
            raise Unreplayable(why)
        return {"__opaque__": why}

    def enc(self, v, depth: int = 0):
        if type(v) in _IMMUTABLE:
            return _prim(v)
        if id(v) in self.snap.path and not isinstance(v, tuple):
            return {"__ref__": self.snap.path[id(v)]}
        if depth > MAX_DEPTH:
            return self.fail("nested too deep")
        if isinstance(v, np.dtype):
            return {"__dtype__": str(v)}
        if isinstance(v, (np.ndarray, np.generic)):
            j = P.array_json(np.array(v))
            if j is None:
                return self.fail(f"an array of {np.asarray(v).dtype}")
            j["kind"] = "scalar" if isinstance(v, np.generic) else "ndarray"
            return j
        if P.is_tensor(v):
            if getattr(v, "grad_fn", None) is not None:
                return self.fail("a Tensor that is part of an autograd graph")
            return self.tensor(v, depth)
        if isinstance(v, np.random.Generator):
            return {"__rng__": _rng_state(v), "bitgen": type(v.bit_generator).__name__}
        if isinstance(v, (list, tuple)):
            cls = type(v).__name__ if type(v) in (list, tuple) else _class_path(type(v))
            if not _resolvable(cls):
                return self.fail(f"a {cls}")
            return {"__seq__": cls, "items": [self.enc(x, depth + 1) for x in v]}
        if isinstance(v, dict):
            cls = "dict" if type(v) is dict else _class_path(type(v))
            if not _resolvable(cls):
                return self.fail(f"a {cls}")
            return {"__dict__": [[self.enc(k, depth + 1), self.enc(x, depth + 1)] for k, x in v.items()], "cls": cls}
        if isinstance(v, (set, frozenset)):
            return {"__set__": [self.enc(x, depth + 1) for x in v], "frozen": isinstance(v, frozenset)}
        if isinstance(v, type):
            path = _class_path(v)
            return {"__type__": path} if _resolvable(path) else self.fail(f"the class {path}")
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
            path = f"{getattr(v, '__module__', '')}:{v.__qualname__}"
            return {"__callable__": path} if _resolvable(path) and getattr(v, "__module__", None) else \
                self.fail(f"the function {v.__qualname__}")
        if _is_stateful(v):
            path = _class_path(type(v))
            if not _resolvable(path):
                return self.fail(f"an object of {path}")
            return {"__obj__": path, "state": [[k, self.enc(x, depth + 1)] for k, x in _fields(v, False)]}
        return self.fail(f"a {type(v).__qualname__}")

    def tensor(self, t, depth: int):
        return {"__tensor__": _class_path(type(t)),
                "state": [[k, self.enc(x, depth + 1)] for k, x in _tensor_fields(t, True)]}

    def shallow(self, o):
        """The state of one tracked object: what patching it back means."""
        if isinstance(o, np.ndarray):
            return P.array_json(o) or self.fail("an array of objects")
        if isinstance(o, np.random.Generator):
            return {"__rng__": _rng_state(o)}
        if isinstance(o, list):
            return {"__list__": [self.enc(x, 1) for x in o]}
        if isinstance(o, dict):
            return {"__dict__": [[self.enc(k, 1), self.enc(x, 1)] for k, x in o.items()]}
        if P.is_tensor(o):
            state = self.tensor(o, 0)
            state["graph"] = getattr(o, "grad_fn", None) is not None
            return state
        return {"state": [[k, self.enc(x, 1)] for k, x in _fields(o, False)]}


def _files_now(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            p = os.path.join(folder, n)
            try:
                st = os.stat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = (st.st_mtime_ns, st.st_size)
    return out


def record_call(fn, args: tuple, kwargs: dict, is_gen: bool, cwd: str) -> tuple[dict, object, BaseException | None]:
    """Run the reference `fn`; (its outcome as data, its result, what it raised). Unreplayable outcomes are
    recorded as {"own": why}."""
    snap = Snapshot(args, kwargs)
    lenient = StateEncoder(snap, strict=False)
    before = {i: json.dumps(lenient.shallow(o)) for i, o in snap.objs.items()}
    files = _files_now(cwd)
    result, raised = None, None
    try:
        result = fn(*args, **kwargs)
        if is_gen:
            result = list(result)
    except BaseException as e:  # the reference's own outcome, recorded as it is
        raised = e
    strict = StateEncoder(snap, strict=True)
    try:
        post = []
        for i, o in snap.objs.items():
            if json.dumps(lenient.shallow(o)) != before[i]:
                state = strict.shallow(o)
                if state.get("graph"):
                    raise Unreplayable("a Tensor argument joined an autograd graph")
                post.append([snap.path[i], state])
        written = {}
        for rel, stamp in _files_now(cwd).items():
            if files.get(rel) != stamp:
                if stamp[1] > FILE_BYTES:
                    raise Unreplayable("a large file written")
                with open(os.path.join(cwd, rel), "rb") as f:
                    written[rel] = base64.b64encode(f.read()).decode()
        if set(files) - set(_files_now(cwd)):
            raise Unreplayable("a file removed")
        answer = {"post": post, "files": written, "gen": is_gen}
        if raised is not None:
            answer["raised"] = [type(raised).__name__, P.safe_str(raised)]
        else:
            answer["result"] = strict.enc(result)
    except Unreplayable as e:
        answer = {"own": str(e)}
    return answer, (iter(result) if is_gen and raised is None else result), raised


# ------------------------------------------------------------------ giving a recorded outcome back


def _refs(v, out: list):
    if isinstance(v, dict):
        if "__ref__" in v:
            out.append(v["__ref__"])
        for x in v.values():
            _refs(x, out)
    elif isinstance(v, list):
        for x in v:
            _refs(x, out)


def _walk(path, args, kwargs):
    kind, first = path[0]
    o = args[first] if kind == "a" else kwargs[first]
    for kind, step in path[1:]:
        if kind == ".":
            o = object.__getattribute__(o, step)
        elif kind == "[":
            o = o[step]
        else:
            o = o[step]
    return o


class Decoder:
    def __init__(self, resolved: dict[str, object]):
        self.resolved = resolved

    def dec(self, v):
        if not isinstance(v, (dict, list)):
            return v
        if isinstance(v, list):
            return [self.dec(x) for x in v]
        if "__ref__" in v:
            return self.resolved[json.dumps(v["__ref__"])]
        if "__float__" in v:
            return float(v["__float__"])
        if "__int__" in v:
            return int(v["__int__"])
        if "__complex__" in v:
            return complex(float(v["__complex__"][0]), float(v["__complex__"][1]))
        if "__bytes__" in v:
            return base64.b64decode(v["__bytes__"])
        if "__dtype__" in v:
            return np.dtype(v["__dtype__"])
        if "__array__" in v:
            a = P.array_from_json(v["__array__"])
            return a.reshape(()).dtype.type(a.reshape(())) if v.get("kind") == "scalar" else a
        if "__tensor__" in v:
            cls = _import_path(v["__tensor__"])
            t = object.__new__(cls)
            for k, x in v["state"]:
                object.__setattr__(t, k, self.dec(x))
            object.__setattr__(t, "grad_fn", None)
            return t
        if "__rng__" in v:
            g = np.random.Generator(getattr(np.random, v.get("bitgen", "PCG64"))())
            g.bit_generator.state = v["__rng__"]
            return g
        if "__seq__" in v:
            items = [self.dec(x) for x in v["items"]]
            kind = v["__seq__"]
            if kind in ("list", "tuple"):
                return list(items) if kind == "list" else tuple(items)
            cls = _import_path(kind)
            return cls(items) if not issubclass(cls, tuple) or not hasattr(cls, "_fields") else cls(*items)
        if "__dict__" in v:
            d = {self._hashable(self.dec(k)): self.dec(x) for k, x in v["__dict__"]}
            cls = v.get("cls", "dict")
            return d if cls == "dict" else _import_path(cls)(d)
        if "__set__" in v:
            items = [self._hashable(self.dec(x)) for x in v["__set__"]]
            return frozenset(items) if v.get("frozen") else set(items)
        if "__type__" in v or "__callable__" in v:
            return _import_path(v.get("__type__") or v["__callable__"])
        if "__obj__" in v:
            o = object.__new__(_import_path(v["__obj__"]))
            self._set_fields(o, v["state"])
            return o
        raise Unreplayable("an unknown value in a recorded outcome")

    @staticmethod
    def _hashable(k):
        return tuple(k) if isinstance(k, list) else k

    def patch(self, o, state):
        """Give the tracked object `o` the recorded state it had after the reference's call."""
        if isinstance(o, np.ndarray):
            np.copyto(o, P.array_from_json(state["__array__"]), casting="unsafe")
        elif isinstance(o, np.random.Generator):
            o.bit_generator.state = state["__rng__"]
        elif isinstance(o, list):
            o[:] = [self.dec(x) for x in state["__list__"]]
        elif isinstance(o, dict):
            new = {self._hashable(self.dec(k)): self.dec(x) for k, x in state["__dict__"]}
            o.clear()
            o.update(new)
        else:
            self._set_fields(o, state["state"])
            if P.is_tensor(o):
                object.__setattr__(o, "grad_fn", None)

    def _set_fields(self, o, state: list) -> None:
        """Slots set one by one; the __dict__ rebuilt in the recorded order (a loop over vars() sees that order)."""
        slots = set(_slots(type(o)))
        values = [(k, self.dec(x)) for k, x in state]
        for k, _ in _fields(o):
            if k in slots and k not in dict(values) and not P.is_tensor(o):
                try:
                    object.__delattr__(o, k)
                except AttributeError:
                    pass
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict):
            d.clear()
        for k, x in values:
            if k in slots or not isinstance(d, dict):
                object.__setattr__(o, k, x)
            else:
                d[k] = x


def _exception(kind: str, message: str, module) -> BaseException:
    cls = getattr(builtins, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = getattr(module, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = type(kind, (Exception,), {})
    try:
        return cls(message)
    except Exception:
        return type(kind, (Exception,), {})(message)


def apply_answer(answer: dict, args: tuple, kwargs: dict, module, cwd: str) -> "Replayed":
    """Give back a recorded outcome: the arguments' recorded changes, the files written, then the result (or
    the exception to raise). Every object the outcome refers to is found before anything is changed."""
    paths: list = []
    _refs(answer, paths)
    resolved = {}
    for p in paths + [p for p, _ in answer.get("post", [])]:
        resolved[json.dumps(p)] = _walk(p, args, kwargs)
    d = Decoder(resolved)
    targets = [(resolved[json.dumps(p)], state) for p, state in answer.get("post", [])]
    for rel, data in answer.get("files", {}).items():
        dest = os.path.realpath(os.path.join(cwd, rel))
        if not dest.startswith(os.path.realpath(cwd) + os.sep):
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(base64.b64decode(data))
    for o, state in targets:
        d.patch(o, state)
    if "raised" in answer:
        return Replayed(raised=_exception(*answer["raised"], module))
    result = d.dec(answer["result"])
    return Replayed((x for x in result) if answer.get("gen") else result)


class Replayed:
    """A recorded outcome given back: the value to return, or the exception to raise."""

    def __init__(self, value=None, raised: BaseException | None = None):
        self.value, self.raised = value, raised


# ------------------------------------------------------------------ putting wrappers in place


def _owner_and_attr(module, name: str):
    cls, _, attr = name.rpartition(".")
    owner = module
    for part in cls.split(".") if cls else ():
        owner = getattr(owner, part)
    return owner, attr


class Wrapped:
    """The replayed names of one exercise, wrapped while its probe runs (`with Wrapped(...)`)."""

    def __init__(self, module, names, call):
        self.module, self.names, self.call = module, names, call
        self.undo: list = []

    def __enter__(self):
        for name in self.names:
            owner, attr = _owner_and_attr(self.module, name)
            raw = inspect.getattr_static(owner, attr)
            own = attr in vars(owner)
            if isinstance(raw, staticmethod):
                fn, rewrap = raw.__func__, staticmethod
            elif isinstance(raw, classmethod):
                fn, rewrap = raw.__func__, classmethod
            else:
                fn, rewrap = raw, (lambda f: f)
            wrapper = self.call(name, fn, P.is_generator_function(fn))
            functools.update_wrapper(wrapper, fn)
            setattr(owner, attr, rewrap(wrapper))
            self.undo.append((owner, attr, raw if own else None))
            if owner is self.module:  # tables of the module that hold the function (module 06's BACKWARD_RULES)
                for value in list(vars(self.module).values()):
                    if isinstance(value, dict):
                        for k, v in list(value.items()):
                            if v is fn:
                                value[k] = wrapper
                                self.undo.append((value, k, fn))
        return self

    def __exit__(self, *exc):
        for owner, attr, raw in reversed(self.undo):
            if isinstance(owner, dict):
                owner[attr] = raw
            elif raw is None:
                try:
                    delattr(owner, attr)
                except AttributeError:
                    pass
            else:
                setattr(owner, attr, raw)
        self.undo.clear()
        return False


# ------------------------------------------------------------------ the runner


def _write_files(files: dict, root: str) -> None:
    for rel, data in files.items():
        rel = os.path.normpath(rel)
        if rel.startswith("..") or os.path.isabs(rel):
            continue
        dest = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(base64.b64decode(data))
    for folder, dirs, names in os.walk(root):
        for n in names:
            os.chmod(os.path.join(folder, n), 0o444)
    for folder, dirs, names in os.walk(root, topdown=False):
        os.chmod(folder, 0o555)


def main() -> int:
    return serve("probe", run)  # the job protocol (tito.jobs): its result message carries this process's cpu_s


def run(job: dict, chan: Channel) -> dict:
    mode = job.get("mode", "replay")
    work = os.getcwd()
    if "files" in job:
        pkg = os.path.join(work, ".pkg")
        _write_files(job["files"], pkg)
    else:
        pkg = job["pkg_dir"]
    probes = P.module_probes(job["module"])  # the probe file: imported before any student code runs
    for name in ("tinytorch",):
        sys.modules.pop(name, None)
    sys.path.insert(0, pkg)
    cwd = os.path.join(work, "run")
    os.makedirs(cwd, exist_ok=True)
    os.chdir(cwd)
    chan.send({"t": "ready"})
    import_error = None
    module = None
    try:
        module = importlib.import_module(job["package_module"])
    except BaseException as e:  # the student's module: anything may come out of it
        import_error = {"kind": "import", "type": type(e).__name__, "message": P.safe_str(e)}
    while True:
        cmd = chan.receive()
        if cmd.get("t") != "run":  # "exit": the result message (with the CPU seconds used) ends the job
            break
        ex = str(cmd.get("ex"))
        chan.send({"t": "start", "ex": ex})
        p = probes.get(ex)
        rec, outcome, calls = P.Rec(), import_error or {"kind": "ok"}, []
        if p is None:
            outcome = {"kind": "raised", "type": "LookupError", "message": f"no probe for {ex}"}
        elif import_error is None:
            # names whose table closed (a miss): the student's own code runs for them; answers already given, by call
            state = {"closed": set(), "given": {}}

            def call(name, fn, is_gen, _ex=ex, _state=state, _calls=calls):
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    if mode == "record":
                        if len(_calls) >= MAX_CALLS:
                            return fn(*args, **kwargs)
                        try:
                            key = key_json([list(args), kwargs])
                        except (NoKey, RecursionError):
                            return fn(*args, **kwargs)
                        answer, result, raised = record_call(fn, args, kwargs, is_gen, cwd)
                        _calls.append({"name": name, "key": key, "answer": answer})
                        if raised is not None:
                            raise raised
                        return result
                    if name in _state["closed"]:
                        return fn(*args, **kwargs)
                    try:
                        key = key_json([list(args), kwargs])
                    except (NoKey, RecursionError):
                        return fn(*args, **kwargs)
                    text = json.dumps([name, key])
                    reply = _state["given"].get(text)
                    if reply is None:
                        chan.send({"t": "call", "ex": _ex, "name": name, "key": key})
                        reply = chan.receive()
                        if reply.get("t") in ("hit", "own") and len(text) < 100_000:
                            _state["given"][text] = reply
                    if reply.get("t") == "hit":
                        try:
                            given = apply_answer(reply["answer"], args, kwargs, module, cwd)
                        except (Unreplayable, LookupError, AttributeError, TypeError, ValueError, ImportError) as e:
                            _state["closed"].add(name)
                            chan.send({"t": "broken", "ex": _ex, "name": name, "why": f"{type(e).__name__}: {e}"[:200]})
                            return fn(*args, **kwargs)
                        if given.raised is not None:
                            raise given.raised
                        return given.value
                    if reply.get("t") != "own":
                        _state["closed"].add(name)
                    return fn(*args, **kwargs)
                return wrapper

            try:
                with Wrapped(module, p.replay, call):
                    p.fn(np.random.default_rng(P.seed_for(job["seed"], ex)), rec)
            except NotImplementedError:
                outcome = {"kind": "not_implemented"}
            except BaseException as e:  # noqa: BLE001 (student code)
                outcome = {"kind": "raised", "type": type(e).__name__, "message": P.safe_str(e)}
        budget = [P.MAX_RECORD_BYTES]
        try:
            values = {str(k): P.encode_value(v, budget) for k, v in rec.items()}
        except BaseException as e:  # a value whose reading raised (a property of a student's object)
            values, outcome = {}, {"kind": "raised", "type": type(e).__name__, "message": P.safe_str(e)}
        if budget[0] < 0:
            values, outcome = {}, {"kind": "raised", "type": "ValueError",
                                   "message": "the record is too large (a probe's results are small: is an array huge?)"}
        msg = {"t": "record", "ex": ex, "values": values, "outcome": outcome}
        if mode == "record":
            msg["calls"] = calls
        chan.send(msg)
    return {}


if __name__ == "__main__":
    sys.exit(main())
