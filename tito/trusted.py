"""The trusted half of grading: reference records, the student's records checked, verdicts into the notebook.

THE INVARIANT. No reference code of the graded module, no expected value and no hidden test text ever
enters a process that runs or imports student code. Concretely:

- the reference package runs only here, in a subprocess of the trusted process that imports no student
  code (`Plan.make`); the sandboxes get the prerequisite package (the earlier modules, which the kernel
  needs to run at all), the student's exported module, and a copy of the probe runner and of this
  module's probe file without its check functions (`code_tree`): never this file, the checks, the
  course's notebooks or its package;
- the student's code is probed in a fresh sandboxed process that never ran the notebook
  (`python -I`: no writable folder on sys.path; every import it needs done before student code runs);
  it reports data only (JSON, arrays inline, never pickle), which `tito.probes.check` compares here;
- an exercise that calls an earlier one of the same module gets the reference's *outcomes* of those
  calls, one call at a time, from the table recorded here (`Oracle`): never the table, never the code;
  the first call of a name that matches no recorded one closes that name for the exercise (the student's own
  code runs for it), and the verdict then names the dependency ("13.3 not checked on its own: it uses 13.1,
  which failed");
- every verdict sentence is written here; what the student's process reported (an exception's type and
  message, a value) is bounded and quoted as the student's own output;
- hidden tests never run in the student's kernel: the trusted checks score, the notebook's visible tests
  run for the student's feedback (tito.grading strips the hidden regions before execution).

`Plan.make(root, module, seed)` runs the module's probes over the instructor's reference package with
the run's seed, recording the calls that probes replay. `Plan.job(nb)` is the probe job of one
submission (the prerequisite package and the student's exported module, as data); `run_probe_job`
runs it in a sandbox, answering replayed calls; `Plan.verdicts(results)` checks what came back;
`apply_verdicts(nb, ...)` makes every graded cell of the executed notebook say the trusted verdict (an
error output when it failed, none when it passed), so nbgrader's score, the feedback, the grading log
and the CSV all read one verdict.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat
import numpy as np

from . import probes as P
from .course import CourseError, Module
from .notebooks import ANSI_RE, exercise_label, is_test_cell
from .notebooks import read as read_notebook
from .jobs import MAX_LINE, Ended, Files, Reply, Session, encode_files, ends  # MAX_LINE: one message (a record with its arrays, as base64)
from .proc import kill_tree
from .sandbox import BOOT  # python -I -c BOOT CODE_ROOT MODULE: nothing else of tito on sys.path, never the course

CHECK_ERROR = "AutograderCheck"  # ename of the error output a failed trusted check adds to its cell
NOTE_PREFIX = "[autograder] "
TITO_DIR = Path(__file__).resolve().parent
REPLAY_RTOL, REPLAY_ATOL = 1e-5, 1e-6  # a replayed call matches a recorded one within these
MAX_ORACLE_CALLS = 200_000  # per exercise
WORKER_FILES = ("__init__.py", "jobs.py", "grade_worker.py", "notebooks.py", "failures.py", "course.py", "progress.py",
                "proc.py")
PROBE_FILES = ("__init__.py", "jobs.py", "probe_run.py")


def new_seed() -> int:
    return secrets.randbelow(2 ** 31)


def probe_digest(module: Module) -> str:
    """Changes when the module's probes or the probe machinery change (part of the grading fingerprint)."""
    h = hashlib.sha256()
    for f in (Path(P.__file__), P.probe_file(module.number), TITO_DIR / "probe_run.py", TITO_DIR / "jobs.py",
              Path(__file__)):
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def package_module_name(root: Path, module: Module) -> tuple[str, str]:
    """('tinytorch.core.tensor', 'tinytorch/core/tensor.py') of the module's package file."""
    f = module.package_file(root)
    if f is None:
        raise CourseError(f"{module.slug} exports no package module (no `#| default_exp`)")
    rel = f.relative_to(root)
    return ".".join(rel.with_suffix("").parts), str(rel)


def pyc_beside(source: str) -> str:
    """Where a sandbox's interpreter (`python -I`: no PYTHONPYCACHEPREFIX) looks for the bytecode of `source`:
    `__pycache__/NAME.TAG.pyc` beside it. importlib's `cache_from_source` and `compileall` follow this process's own
    `sys.pycache_prefix` instead, and wrote the sandbox's bytecode outside its tree where the instructor sets one."""
    folder, name = os.path.split(source)
    return os.path.join(folder, "__pycache__", f"{os.path.splitext(name)[0]}.{sys.implementation.cache_tag}.pyc")


def code_tree(dest: Path, number: str | None, cache: Path | None = None) -> Path:
    """The only tito code a grading sandbox gets, copied under `dest` (readable by every user): the notebook
    worker and what it imports, the probe runner, and module `number`'s probe file without its checks.

    `cache`: a folder of this course that only tito writes (the sandboxes never see it): the tree is built there once
    per content of those files (and this Python's bytecode version), and copied from it, compiled, for each run:
    building it (stripping the checks, compiling) cost about 0.15 s of the instructor's process per run."""
    if cache is not None:
        import importlib.util

        h = hashlib.sha256(importlib.util.MAGIC_NUMBER + sys.version.encode())
        sources = [TITO_DIR / n for n in dict.fromkeys(WORKER_FILES + PROBE_FILES)] + [TITO_DIR / "probes" / "__init__.py"]
        if number is not None and P.module_probes(number):
            sources.append(P.probe_file(number))
        for f in sources + [Path(__file__)]:
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        built = cache / f"{number or 'none'}-{h.hexdigest()[:20]}"
        if not (built / "tito").is_dir():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
            try:
                code_tree(tmp, number)
                os.chmod(tmp, 0o755)
                os.rename(tmp, built)  # whole or not at all; another run that built it first wins
            except OSError:
                if not (built / "tito").is_dir():
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(built / "tito", dest / "tito", dirs_exist_ok=True)  # copy2: the bytecode stays valid
        os.chmod(dest, 0o755)
        return dest
    tito = dest / "tito"
    (tito / "probes").mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(WORKER_FILES + PROBE_FILES):
        shutil.copy2(TITO_DIR / name, tito / name)
    shutil.copy2(TITO_DIR / "probes" / "__init__.py", tito / "probes" / "__init__.py")
    if number is not None and P.module_probes(number):
        (tito / "probes" / f"m{int(number):02d}.py").write_text(P.sandbox_source(number), encoding="utf-8")
    # compiled once here: the sandboxes cannot write this tree (and run with PYTHONDONTWRITEBYTECODE), so each
    # submission's worker and probe process compiled the same files again (about 0.07 s of CPU per submission)
    import py_compile

    for src in sorted(tito.rglob("*.py")):
        try:
            py_compile.compile(str(src), cfile=pyc_beside(str(src)), doraise=True)
        except py_compile.PyCompileError:  # the import says what is wrong, as without bytecode
            pass
    for folder, dirs, names in os.walk(dest):
        os.chmod(folder, 0o755)
        for n in names:
            os.chmod(os.path.join(folder, n), 0o644)
    return dest


# ------------------------------------------------------------------ talking to a probe process


def _how_it_ended(proc: subprocess.Popen, killed: bool) -> str:
    code = proc.returncode
    if killed:
        return "was stopped by the grader"
    if code is None:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    if code > 128:  # bubblewrap: 128 + the signal that killed the sandbox's process
        try:
            return f"was killed by signal {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exited with code {code}"


def run_probe_job(spawn: Callable[[], subprocess.Popen], kill: Callable[[subprocess.Popen], None], job: dict,
                  exercises: list[str], oracle: "Oracle | None" = None, exercise_s: float = 30.0,
                  budget_s: float = 120.0, start_s: float = 60.0,
                  clock: Callable[[], float] = time.monotonic, usage: dict | None = None) -> dict[str, dict]:
    """Run the probes of `exercises` in processes started by `spawn()` (a fresh one after any that hangs or
    dies), answering replayed calls from `oracle`. Each exercise has `exercise_s` seconds, all of them
    `budget_s` (plus `start_s` for each start). Returns {exercise: {"values", "outcome", "calls"?} or
    {"failure": why}} (why: the trusted side's words). `usage["cpu_s"]` adds up the CPU seconds the processes that
    ended normally said they used."""
    results: dict[str, dict] = {}
    remaining = list(exercises)
    budget_end = clock() + budget_s
    while remaining:
        proc = spawn()
        conn = Session(proc, clock)
        current, killed, by_budget = None, False, False
        try:
            started = clock()
            conn.send_job("probe", job, started + start_s)
            msg = conn.receive(started + start_s)
            if msg.get("t") != "ready":
                raise Ended("did not start" if msg.get("t") != "fatal" else "failed to start")
            budget_end += clock() - started  # starting a process is not the exercises' time
            while remaining:
                current = remaining[0]
                own_end = clock() + exercise_s
                deadline, by_budget = min(own_end, budget_end), budget_end < own_end
                conn.send({"t": "run", "ex": current}, deadline)
                if oracle is not None:
                    oracle.begin(current)
                while True:
                    msg = conn.receive(deadline)
                    kind = msg.get("t")
                    if kind == "call" and oracle is not None:
                        conn.send(oracle.answer(current, msg), deadline)
                    elif kind == "call":
                        conn.send({"t": "miss"}, deadline)
                    elif kind == "broken" and oracle is not None:
                        oracle.broken(current, str(msg.get("name", ""))[:100])
                    elif kind == "record" and msg.get("ex") == current:
                        break
                try:
                    values, outcome = P.read_record(msg)
                    results[current] = {"values": values, "outcome": outcome}
                    if "calls" in msg:
                        results[current]["calls"] = msg["calls"]
                except P.BadRecord as e:
                    results[current] = {"failure": f"its record could not be read ({e})"}
                remaining.pop(0)
            conn.send({"t": "exit"}, clock() + 5)
            try:  # its CPU time (the sandbox's cost, for benchmarks): a number, never part of a verdict
                end = Reply()
                if ends(conn.receive(clock() + 5), end) and usage is not None and end.result is not None:
                    usage["cpu_s"] = usage.get("cpu_s", 0.0) + end.cpu_s
            except Ended:
                pass
        except Ended as e:
            killed = e.why == "timeout"
            kill(proc)
            if current is None:  # it never got to an exercise: the start itself failed
                why = ("did not start within its time limit" if killed else f"did not start: the process "
                       f"{_how_it_ended(proc, False)}")
                for ex in remaining:
                    results[ex] = {"failure": f"the checking process {why}"}
                return results
            if killed:
                why = (f"was stopped: the checks of all exercises ran out of their {budget_s:g} s" if by_budget
                       else f"did not finish within {exercise_s:g} s")
            elif e.why == "exit":
                proc.wait()
                why = f"ended the checking process (it {_how_it_ended(proc, False)})"
            else:
                why = f"made the checking process fail: it {e.why}"
            results[current] = {"failure": f"running your code for this exercise {why}"}
            remaining.pop(0)
            if clock() > budget_end:
                for ex in remaining:
                    results[ex] = {"failure": "not checked: the checks ran out of time"}
                return results
            continue
        finally:
            conn.close(kill)
    return results


# ------------------------------------------------------------------ the oracle: recorded outcomes, one call at a time


def _sig(v, rng: bool = True):
    """A recorded key with its numbers left out (and, with rng=False, its random generators' states): calls that may
    match within a tolerance share it."""
    if isinstance(v, dict):
        if "__array__" in v:
            d, shape, _ = v["__array__"]
            return ["A", d, shape]
        if "__rng__" in v and not rng:
            return "R"
        return {k: _sig(x, rng) for k, x in v.items()}
    if isinstance(v, list):
        return [_sig(x, rng) for x in v]
    if isinstance(v, float):
        return "f"
    return v


def _touches_rng(answer: dict) -> bool:
    return "__rng__" in json.dumps(answer.get("post", []))


def _close(a, b, cache: dict, rng: bool = True) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        if not rng and "__rng__" in a and "__rng__" in b:
            return True
        if "__array__" in a and "__array__" in b:
            try:
                x = cache.get(id(a))
                if x is None:
                    x = cache[id(a)] = P.array_from_json(a["__array__"], [MAX_LINE])
                y = cache.get(id(b))
                if y is None:
                    y = cache[id(b)] = P.array_from_json(b["__array__"], [MAX_LINE])
            except P.BadRecord:
                return False
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.dtype.kind in "fc":
                return bool(np.allclose(x, y, rtol=REPLAY_RTOL, atol=REPLAY_ATOL, equal_nan=True))
            return bool(np.array_equal(x, y))
        if a.keys() != b.keys():
            return False
        return all(_close(a[k], b[k], cache, rng) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, cache, rng) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=REPLAY_RTOL, abs_tol=REPLAY_ATOL) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


@dataclass
class Table:
    """The reference's recorded calls of one exercise's replayed names."""
    exact: dict = field(default_factory=dict)  # (name, key text) -> answer
    similar: dict = field(default_factory=dict)  # (name, signature text) -> [(key, answer)]
    # (name, signature without generator states) -> [(key, answer)] of the calls whose outcome left every random
    # generator as it was: their outcome does not depend on one (`sample_next(..., temperature=0, rng=fresh)`)
    no_rng: dict = field(default_factory=dict)

    @classmethod
    def of(cls, calls: list[dict]) -> "Table":
        t = cls()
        for c in calls:
            name, key, answer = c["name"], c["key"], c["answer"]
            text = json.dumps(key, sort_keys=True)
            if (name, text) in t.exact:
                continue
            t.exact[(name, text)] = answer
            t.similar.setdefault((name, json.dumps(_sig(key), sort_keys=True)), []).append((key, answer))
            if "own" not in answer and not _touches_rng(answer) and "__rng__" in text:
                t.no_rng.setdefault((name, json.dumps(_sig(key, False), sort_keys=True)), []).append((key, answer))
        return t

    def __len__(self):
        return len(self.exact)

    def lookup(self, name: str, key) -> dict | None:
        answer = self.exact.get((name, json.dumps(key, sort_keys=True)))
        if answer is not None:
            return answer
        cache: dict = {}
        for k, a in self.similar.get((name, json.dumps(_sig(key), sort_keys=True)), ())[:256]:
            if _close(key, k, cache):
                return a
        for k, a in self.no_rng.get((name, json.dumps(_sig(key, False), sort_keys=True)), ())[:256]:
            if _close(key, k, cache, rng=False):
                return a
        return None


@dataclass
class Replayed:
    """What happened to one exercise's replayed calls in one submission's probe run."""
    hits: dict = field(default_factory=dict)  # name -> count
    own: dict = field(default_factory=dict)  # name -> count of calls the student's own code ran (not replayable)
    missed: list = field(default_factory=list)  # names whose call matched no recorded one (closed from then on)
    broken: str = ""  # a recorded outcome could not be given back
    calls: int = 0

    def names_on_own_code(self) -> list[str]:
        return list(dict.fromkeys([*self.own, *self.missed, *([self.broken] if self.broken else [])]))


class Oracle:
    """Answers a probe process's replayed calls from the reference's tables, one exercise at a time."""

    def __init__(self, plan: "Plan"):
        self.plan = plan
        self.current = ""
        self.closed: set[str] = set()  # names whose table closed for the current exercise
        self.stats: dict[str, Replayed] = {}

    def begin(self, ex: str) -> None:
        self.current, self.closed = ex, set()
        self.stats.setdefault(ex, Replayed())

    def broken(self, ex: str, name: str) -> None:
        if ex == self.current:
            self.stats[ex].broken = self.stats[ex].broken or name
            self.closed.add(name)

    def answer(self, ex: str, msg: dict) -> dict:
        """A hit (the recorded outcome), `own` (the reference's outcome cannot be given back: the student's own code
        runs) or a miss: no recorded call matches, and this name's table is closed for the rest of the exercise
        (one wrong guess, then nothing more to learn from it)."""
        st = self.stats.setdefault(ex, Replayed())
        st.calls += 1
        name = str(msg.get("name", ""))[:200]
        probe = P.module_probes(self.plan.module.number).get(ex)
        answer = None
        if msg.get("ex") == ex and name not in self.closed and probe is not None and name in probe.replay \
                and st.calls <= MAX_ORACLE_CALLS:
            try:
                answer = self.plan.tables.get(ex, Table()).lookup(name, msg.get("key"))
            except (RecursionError, TypeError, ValueError, KeyError):
                answer = None
        if answer is None:
            if name not in st.missed:
                st.missed.append(name)
            self.closed.add(name)
            return {"t": "miss"}
        if "own" in answer:
            st.own[name] = st.own.get(name, 0) + 1
            return {"t": "own"}
        st.hits[name] = st.hits.get(name, 0) + 1
        return {"t": "hit", "answer": answer}


# ------------------------------------------------------------------ the plan of one grading run


def reference_spawn(tmp: Path) -> Callable[[], subprocess.Popen]:
    """How the reference's probe process starts: this Python, isolated mode, in a trusted subprocess."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp))

    def spawn():
        work = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
        return subprocess.Popen([sys.executable, "-I", "-c", BOOT, str(TITO_DIR.parent), "tito.probe_run"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                cwd=str(work), start_new_session=True)
    return spawn


def exported_sources(nb, module: Module) -> tuple[dict[str, str], list[str]]:
    """{`tinytorch/...py`: text} of every package file notebook `nb` exports (`Module.package_modules`:
    its `#| default_exp` and the targets of `#| export_to NAME` cells), each as `P.exported_source` makes
    the default one, and the notes of cells left out. A cell of another target is blanked (not removed:
    the notes keep naming cells as the notebook numbers them)."""
    from .course import EXPORT_TO_RE

    targets = module.package_modules
    if not targets:
        raise CourseError(f"{module.slug} exports no package module (no `#| default_exp`)")
    texts, notes = {}, []
    for target in targets:  # a copy of each cell's type, source and metadata (what is read), never of its outputs
        copy = nbformat.NotebookNode(cells=[nbformat.NotebookNode(
            cell_type=c.get("cell_type"), source=c.get("source", ""), metadata=c.get("metadata", {})) for c in nb.cells])
        for cell in copy.cells:
            if cell.get("cell_type") != "code":
                continue
            m = EXPORT_TO_RE.search(cell.source)
            owner = f"tinytorch.{m.group(1)}" if m else targets[0]
            if owner != target:
                cell.source, cell.metadata = "", {}
            elif m:
                cell.source = EXPORT_TO_RE.sub("#| export", cell.source)
        text, skipped = P.exported_source(copy)
        texts["/".join(target.split(".")) + ".py"] = text
        notes += [s for s in skipped if s not in notes]
    return texts, notes


@dataclass
class Plan:
    module: Module
    seed: int
    package_module: str
    package_rel: str
    exercises: list[str]
    reference: dict[str, tuple[dict, dict]] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # replayed name -> the exercise that writes it
    labels: dict[str, str] = field(default_factory=dict)  # exercise -> its test cell's label
    timeout_s: float = 60.0

    @classmethod
    def make(cls, root: Path, module: Module, seed: int | None = None, timeout_s: float = 60.0) -> "Plan | None":
        """The plan for `module`, None when it has no probes (its graded cells keep the notebook's verdict)."""
        probes = P.module_probes(module.number)
        if not probes:
            return None
        seed = new_seed() if seed is None else seed
        name, rel = package_module_name(root, module)
        source = read_notebook(module.notebook)
        texts, skipped = exported_sources(source, module)
        if skipped:
            raise CourseError(f"{module.notebook}: exported cells that do not parse: {'; '.join(skipped)}")
        labels = {P.exercise_of(exercise_label(c)): exercise_label(c) for c in source.cells if is_test_cell(c)}
        plan = cls(module, seed, name, rel, sorted(probes, key=P.exercise_key), timeout_s=timeout_s, labels=labels)
        plan.owners = P.replayed_exercises(module.number, labels)
        plan._run_reference(root, texts)
        return plan

    def base(self) -> dict:
        return {"module": self.module.number, "seed": self.seed, "package_module": self.package_module}

    def __getstate__(self) -> dict:  # sent to cluster nodes without this process's encoding cache (`job`)
        state = dict(self.__dict__)
        state.pop("_shared", None)
        return state

    def _run_reference(self, root: Path, texts: dict[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="tito-reference-") as tmp:
            pkg = Path(tmp) / "pkg"
            shutil.copytree(root / "tinytorch", pkg / "tinytorch", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            for rel, text in texts.items():  # every file the module writes (tito.course.Module.package_files)
                (pkg / rel).write_text(text, encoding="utf-8")
            raw = run_probe_job(reference_spawn(Path(tmp)), kill_tree, {**self.base(), "mode": "record",
                                                                            "pkg_dir": str(pkg)},
                                self.exercises, None, exercise_s=300, budget_s=1200)
        broken = {e: (r.get("failure") or P.outcome_text(r["outcome"])) for e, r in raw.items()
                  if "failure" in r or r["outcome"].get("kind") != "ok"}
        if broken or set(raw) != set(self.exercises):
            raise CourseError(f"the reference package fails its own probes for {self.module.slug} "
                              f"({'; '.join(f'{e}: {w}' for e, w in broken.items()) or 'records missing'}): "
                              "is tinytorch/ exported from the instructor notebooks? (`tito export`)")
        self.reference = {e: (r["values"], r["outcome"]) for e, r in raw.items()}
        self.tables = {e: Table.of(r.get("calls", [])) for e, r in raw.items()}

    def job(self, nb, prerequisites: dict[str, str]) -> tuple[dict, list[str]]:
        """The probe job of one submission's notebook (the prerequisite package and the student's exported module,
        as data), and notes (exported cells left out). The prerequisites, the same for every submission of a run,
        are encoded once (`jobs.Files`)."""
        texts, skipped = exported_sources(nb, self.module)
        shared = self.__dict__.get("_shared")
        if shared is None or shared[0] is not prerequisites:
            shared = self.__dict__["_shared"] = (prerequisites, encode_files(prerequisites))
        files = Files(prerequisites, shared[1], {rel: P.b64(text.encode()) for rel, text in texts.items()})
        return ({**self.base(), "mode": "replay", "files": files},
                [f"exported code: {s} (left out of the checked module)" for s in skipped])

    def run(self, job: dict, spawn: Callable[[], subprocess.Popen], kill: Callable[[subprocess.Popen], None],
            exercises: list[str] | None = None, clock: Callable[[], float] = time.monotonic) -> "Checked":
        """Run one submission's probe job (in the sandbox `spawn` starts) and check what came back."""
        oracle = Oracle(self)
        wanted = list(exercises or self.exercises)
        usage: dict = {}
        raw = run_probe_job(spawn, kill, job, wanted, oracle, exercise_s=min(30.0, self.timeout_s),
                            budget_s=self.timeout_s, clock=clock, usage=usage)
        checked = self.verdicts(raw, oracle.stats, wanted)
        checked.cpu_s = round(usage.get("cpu_s", 0.0), 3)
        return checked

    def verdicts(self, raw: dict | None, stats: dict[str, Replayed] | None = None,
                 exercises: list[str] | None = None) -> "Checked":
        """The verdict on each exercise ('' passed, else why) from what the probe job sent back (None: nothing)."""
        probes = P.module_probes(self.module.number)
        stats = stats or {}
        out: dict[str, str] = {}
        notes: list[str] = []
        for ex in exercises or self.exercises:
            r = None if raw is None else raw.get(ex)
            if raw is None:
                why = "not checked: the checks returned no results"
            elif r is None:
                why = "no result (the check did not run)"
            elif "failure" in r:
                why = r["failure"]
            else:
                try:
                    why = P.check(probes[ex], (r["values"], r["outcome"]), self.reference[ex])
                except RuntimeError:
                    raise
                except Exception as e:  # the check itself met a result it cannot read: this exercise scores 0
                    why = (f"the checker could not read what your code returned ({type(e).__name__} in the "
                           f"check): {_describe(r['values'])}")
            st = stats.get(ex)
            if st is not None:
                used = st.names_on_own_code()
                failed = [(self.owners.get(n, ""), n) for n in used
                          if self.owners.get(n) and self.owners[n] != ex and out.get(self.owners[n])]
                if why and failed:
                    deps = ", ".join(f"{d} ({n})" for d, n in dict.fromkeys(failed))
                    why = f"not checked on its own: it uses {deps}, which failed: fix that first (here: {why})"
                if st.hits or used:
                    notes.append(f"  Exercise {ex}: {sum(st.hits.values())} calls of earlier exercises answered with "
                                 f"the reference's recorded outcomes"
                                 + (f"; your own code ran for {', '.join(used)}" if used else ""))
            out[ex] = why
        return Checked(out, notes)


@dataclass
class Checked:
    verdicts: dict[str, str]
    notes: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU seconds the probe processes used (a measurement for benchmarks, never a verdict)


def _describe(values: dict) -> str:
    parts = [f"{k!r}: {P._fmt(v)}" for k, v in list(values.items())[:4]]
    return "your results were " + "; ".join(parts) + ("; ..." if len(values) > 4 else "") if parts else "no results"


# ------------------------------------------------------------------ verdicts into the notebook


def cell_exercise(cell) -> str:
    return P.exercise_of(exercise_label(cell))


def _not_run(cell) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") in ("NotRun", "TimeoutError")
               for o in cell.get("outputs", []))


def _inline_failure(error) -> str:
    ename = str(error.get("ename") or "Error")
    evalue = ANSI_RE.sub("", str(error.get("evalue", ""))).strip()
    if evalue:
        return f"{ename}: {evalue}"[:300]
    tb = ANSI_RE.sub("", "\n".join(error.get("traceback", [])))
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip().startswith("---->") or ln.strip().startswith("->")]
    where = f" at `{lines[-1].lstrip('->').strip()[:120]}`" if lines else ""
    return f"an {ename} without a message{where}"


def apply_verdicts(nb, verdicts: dict[str, str], log: list[str]) -> None:
    """Make each graded cell of the executed notebook `nb` carry the trusted verdict of its exercise:
    failed -> an error output (added when the inline test passed: a cheat, or a bug the inline test misses);
    passed -> no error output (an inline failure is kept as a note). A cell the notebook never reached
    (timed out, kernel died) scores 0 whatever the check says; a cell whose exercise has no probe keeps
    the notebook's own verdict."""
    for cell in nb.cells:
        if cell.cell_type != "code" or not is_test_cell(cell):
            continue
        ex = cell_exercise(cell)
        label = exercise_label(cell)
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if ex not in verdicts:
            log.append(f"  {label}: no trusted check for this exercise: the notebook's verdict counts")
            continue
        why = verdicts[ex]
        if _not_run(cell):
            log.append(f"  {label}: not reached when the notebook ran: 0 points (trusted check: "
                       f"{'passed' if not why else why})")
            continue
        if why:
            if not errors:
                log.append(f"  {label}: the cell's own tests passed, but the trusted check failed: {why}")
            cell.outputs.append(nbformat.v4.new_output(
                "error", ename=CHECK_ERROR, evalue=f"{label}: {why}",
                traceback=[f"{CHECK_ERROR}: {label}: the autograder's check of your exported code failed: {why}"]))
        elif errors:
            text = _inline_failure(errors[0])
            log.append(f"  {label}: the cell's own tests failed ({text}), but the trusted check passed")
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                f"\n{NOTE_PREFIX}this cell's tests failed when your notebook ran ({text}), but the autograder's "
                f"check of {label} on your exported code passed: full points.\n")))


def trusted_summary(verdicts: dict[str, str]) -> list[str]:
    return [f"  Exercise {ex}: {'passed' if not why else 'FAILED: ' + why}" for ex, why in sorted(
        verdicts.items(), key=lambda kv: P.exercise_key(kv[0]))]

