"""The kernel competition of module 17: `tito compete run SUBMISSIONS_DIR --task matmul`.

A submission is a file `NAME.py` that defines the task's function with its fixed signature
(`matmul(a, b)` or `gelu_bias(x, bias)`, see TASKS). For each submission, one at a time:

1. results: a child process (`python -m tito.competition_worker`) imports the file and calls the
   function once on each of the task's fixed inputs; this process checks what came back (an ndarray,
   float32, the right shape, `np.allclose` to a float64 NumPy reference with the task's tolerances,
   inputs left unchanged). A wrong result rejects the submission with a reason naming the input shape
   and the largest error.
2. timing: a second child process times the function on each input with the course's measuring rules
   (`tinytorch.perf.measure.time_call`: warmup, repeats of enough calls to last `min_repeat_time`, the
   garbage collector paused; the median of the repeats is reported). The worker finds the number of
   calls per repeat as time_call does (quadrupling from 1) and passes it to time_call, so that it knows
   which call ends which repeat. A kernel must not be able to compute once and return a cached array
   for every later call (keyed by the ids of its inputs, which are the same objects every call, or by
   their contents): before every call, warmup and calibration included, one element of the first input
   is set to a value no call has seen (`perturbation`: never the same value twice, never a value of the
   input, the element restored after its call), so that no two calls see the same contents. The same
   few operations (about 1 us per call on the course's 2-core machine) run before every call of every
   entry, the NumPy reference's included, and are part of the times. The results of the last warmup
   call, of the last call of each calibration round and of each timed repeat are kept (one reference
   each, no copy: a kernel that reuses one output buffer is checked on its last call only) and checked
   by this process against the reference for the inputs of that call (the case's reference with the
   changed element's row patched in), and the inputs must be as they were: a mismatch rejects the entry
   with "returned a result for different inputs while being timed (a cache?)". A cache keyed by all of
   the contents is defeated rather than detected: it never hits, and pays for its hashing.

Both children run in a process group of their own, with no core files, an address-space limit and
BLAS/OpenMP limited to `threads` threads; the submission's `--timeout` covers both. An import error, an
exception (its last line and the submission's line), a timeout and a process killed by a signal (a
segfault in ctypes code) reject the submission with that reason; the run goes on with the next one.

Both children also run in grading's sandbox (tito.sandbox), chosen by `--sandbox` (`auto`: the first of
these that works here):
- `bwrap` (bubblewrap): a new root with read-only binds of the system's /usr, the Python environment,
  tito, the course's tinytorch and the submission's folder (only the file and its `_*` helpers when that
  folder is a course checkout or the home folder), nothing else of the course tree or the home folder;
  the worker's scratch folder (its results, its working directory) is the only writable host folder,
  /tmp is private, there is no network and the PID namespace is its own (killing bwrap at the timeout
  ends every process the submission started). As root the worker runs as an unused user id and sees a
  readable copy of the submission's folder at the same path (its own folder may be mode 700).
- `namespace` (root, util-linux): an unused user id with no network (`unshare --net`) in its own mount
  and PID namespaces, the course's modules/, its git data and the home folder hidden; weaker: the rest
  of the file system stays readable and it can write where any user may (a shared /tmp).
- `none`: the limits only, as the user who runs `tito compete` (the run prints a warning).
Before the first entry the worker is started once in the sandbox by grading's preflight
(`tito.sandbox.preflight`); when it cannot start, one line says why and what to do. The workers speak the job
protocol of grading and its probes (tito.jobs): the job in, progress, the result or the worker's own failure out,
the arrays they return as files. The sandbox's environment holds
only PATH, LANG, HOME (its private /tmp), PYTHONPATH and the thread settings.

Each timed repeat of an entry is paired with a repeat of the task's NumPy kernel (the reference file of the
course's competition/ folder), timed in turns in the same process (the order swapped every repeat), so
that the machine's load hits both alike. Accepted entries that ran every input are ranked by the sum of
their median times over the task's inputs ("total"), with GFLOP/s (the task's operation count over that
total) and "vs NumPy": the NumPy kernel's total over the entry's, with the 95% bootstrap interval of that
ratio over the paired repeats and a verdict with three outcomes (faster or slower when the whole interval
says so, else too noisy to tell; fewer than 3 repeats measure no spread). A `--quick` run (small inputs,
where a call's overhead is most of its time) is ordered but not ranked. The leaderboard is written atomically (a temporary file,
then `os.replace`) as JSON and as a Markdown table next to it. Running again with the same leaderboard
file merges by submission name: an entry measured now replaces the entry of that name, entries not run
now are kept with their date, and all are ranked together -- but only when the machine (CPU model,
cores, NumPy version), the thread count and the input list are the same; otherwise the earlier entries
are dropped (their times would not be comparable) and the run says so.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .course import CourseError
from .progress import atomic_write_text  # a temporary file, fsync, os.replace

FORMAT = "tinytorch-leaderboard/1"
# The baselines and example submissions: files of the course (competition/), beside the modules that
# write what they import (tinytorch), not in tito, which imports the package only through its probes.
KERNELS = Path(__file__).resolve().parent.parent / "competition"


def kernels_dir() -> Path:
    "The course's competition/ folder (this checkout's, else the one beside tito); CourseError when there is none."
    root = course_root()
    for d in ([root / "competition"] if root else []) + [KERNELS]:
        if d.is_dir():
            return d
    raise CourseError("the competition's baselines and examples live in the course's competition/ folder, and there is "
                      "none here: run `tito compete` inside a TinyTorch checkout or student edition")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class Baseline:
    name: str
    file: str  # in the course's competition/ folder
    kind: str = "baseline"  # or "reference"
    max_flops: float | None = None  # only the inputs of at most this many operations (naive loops)


@dataclass(frozen=True)
class Task:
    name: str
    func: str
    args: tuple
    signature: str
    cases: tuple  # the fixed inputs (shapes) of a full run
    quick_cases: tuple  # `--quick`: small ones only
    tolerance: str
    baselines: tuple
    examples: dict = field(default_factory=dict)  # file name written by `tito compete example` -> kernel file

    def inputs(self, case: tuple, seed: int) -> list:
        rng = np.random.default_rng([seed, *case])
        if self.name == "matmul":
            n, k, m = case
            return [rng.uniform(-1, 1, (n, k)).astype(np.float32), rng.uniform(-1, 1, (k, m)).astype(np.float32)]
        n, d = case
        return [(3 * rng.standard_normal((n, d))).astype(np.float32), rng.uniform(-1, 1, d).astype(np.float32)]

    def reference(self, inputs: list) -> np.ndarray:
        "The expected result, computed in float64."
        if self.name == "matmul":
            return inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
        y = inputs[0].astype(np.float64) + inputs[1]
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))

    def out_shape(self, case: tuple) -> tuple:
        return (case[0], case[2]) if self.name == "matmul" else tuple(case)

    def tol(self, case: tuple) -> tuple:
        "(rtol, atol): a result passes where |got - expected| <= atol + rtol * |expected|."
        if self.name == "matmul":
            return 1e-4, 1e-5 * case[1]  # float32 sums of k products: the error grows with k
        return 1e-4, 1e-5

    def flops(self, case: tuple) -> float:
        if self.name == "matmul":
            n, k, m = case
            return 2.0 * n * k * m
        return 10.0 * case[0] * case[1]  # add, 3 mul for 0.044715*y^3, add, mul, tanh, add, 2 mul

    def timing_reference(self, inputs: list, expected: np.ndarray, k: int) -> tuple[list, np.ndarray]:
        """The inputs of call `k` of the timing phase and their expected result, from the case's `inputs`
        and their `expected` result: one element of the first input changed (see `perturbation`); the
        result is patched where that element counts (a row of a@b, one element of gelu(x + bias))."""
        x = inputs[0]
        p, v = perturbation(k, x.size, perturb_scale(x))
        i, j = np.unravel_index(p, x.shape)
        changed = x.copy()
        changed[i, j] = v
        out = expected.copy()
        if self.name == "matmul":
            out[i] += (float(changed[i, j]) - float(x[i, j])) * inputs[1][j].astype(np.float64)
        else:
            out[i, j] = self.reference([changed[i:i + 1, j:j + 1], inputs[1][j:j + 1]])[0, 0]
        return [changed, *inputs[1:]], out

    def describe(self, case: tuple) -> str:
        if self.name == "matmul":
            n, k, m = case
            return f"a {(n, k)} @ b {(k, m)}"
        n, d = case
        return f"x {(n, d)}, bias {(d,)}"


TASKS = {
    "matmul": Task(
        "matmul", "matmul", ("a", "b"),
        "matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray  # float32 a (n, k), b (k, m) -> float32 (n, m) = a @ b",
        cases=((64, 64, 64), (96, 200, 33), (256, 256, 256), (1024, 1024, 1024)),
        quick_cases=((16, 8, 12), (33, 17, 5)),
        tolerance="|got - a@b| <= 1e-5 * k + 1e-4 * |a@b| elementwise (a@b in float64)",
        baselines=(Baseline("numpy (reference)", "matmul_numpy.py", "reference"),
                   Baseline("course: blocked_matmul", "matmul_blocked.py"),
                   Baseline("course: naive_matmul", "matmul_naive.py", max_flops=2 * 64 ** 3)),
        examples={"rows.py": "example_matmul_rows.py", "wrong.py": "example_matmul_wrong.py"},
    ),
    "elementwise": Task(
        "elementwise", "gelu_bias", ("x", "bias"),
        "gelu_bias(x: np.ndarray, bias: np.ndarray) -> np.ndarray  # float32 x (n, d), bias (d,) -> float32 (n, d) "
        "= gelu(x + bias), tanh approximation: 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3)))",
        cases=((64, 128), (1000, 333), (2048, 2048)),
        quick_cases=((8, 16), (37, 5)),
        tolerance="|got - expected| <= 1e-5 + 1e-4 * |expected| elementwise (expected in float64)",
        baselines=(Baseline("numpy (reference)", "gelu_bias_numpy.py", "reference"),
                   Baseline("course: compile (fused kernel)", "gelu_bias_compiled.py")),
        examples={"inplace.py": "example_gelu_bias_inplace.py", "wrong.py": "example_gelu_bias_wrong.py"},
    ),
}


def perturb_scale(x: np.ndarray) -> float:
    "The power of two D >= 2 max|x|: a value written by `perturbation` (D <= v) differs from every element by D/2 or more."
    top = float(np.max(np.abs(x))) if x.size else 0.0
    return 2.0 ** math.ceil(math.log2(2 * top)) if top > 0 else 1.0


def perturbation(k: int, size: int, scale: float) -> tuple[int, float]:
    """Call `k` (0, 1, ...) of the timing phase sees the task's input with element `p` (flat index) of its
    first array set to `v`. `v` is exact in float32 and never the same twice (k mod 2^23 -> its 23 mantissa
    bits is a bijection, k >> 23 picks the binade), so no two calls see the same contents, and never an
    element of the task's input (scale <= v, see perturb_scale): a result kept from an earlier call (a
    cache keyed by the arrays' ids or by a sample of their contents) differs from the right one by about
    scale / 2 where `p` changed. `p` jumps about the array (Fibonacci hashing of k)."""
    p = (((k * 0x9E3779B1) & 0xFFFFFFFF) * size) >> 32
    v = scale * (1.0 + ((k * 0x2545F491) & 0x7FFFFF) / 8388608.0) * 2.0 ** (k >> 23)
    return p, v


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise CourseError(f"no competition task {name!r}; the tasks are: {', '.join(TASKS)}")
    return TASKS[name]


# ---------------------------------------------------------------------------------------------- checking

def check_result(task: Task, case: tuple, inputs: list, got, expected: np.ndarray | None = None) -> str:
    """'' when `got` is the right answer for `inputs`, else the reason (naming the input and the error).
    `got` is an ndarray, or a dict the worker wrote for anything else ({'type': ...} / {'wrote_input': ...}).
    `expected`: the float64 reference when the caller has it (default: computed from `inputs`)."""
    where = f"for input {task.describe(case)}"
    want_shape = task.out_shape(case)
    if isinstance(got, dict):
        if "wrote_input" in got:
            return (f"wrote into its input `{got['wrote_input']}` {where}: inputs are read-only, "
                    "allocate the result (np.empty) instead")
        return f"returned a {got.get('type')} {where}; expected a NumPy array, float32, shape {want_shape}"
    if got.dtype != np.float32:
        return f"returned dtype {got.dtype} {where}; expected float32 (convert with .astype(np.float32))"
    if got.shape != want_shape:
        return f"returned shape {got.shape} {where}; expected {want_shape}"
    if expected is None:
        expected = task.reference(inputs)
    rtol, atol = task.tol(case)
    got64 = got.astype(np.float64)
    err = np.abs(got64 - expected)
    bad = ~(err <= atol + rtol * np.abs(expected))  # NaN counts as bad
    if bad.any():
        finite_err = np.where(np.isnan(err), np.inf, err)
        i = np.unravel_index(int(np.argmax(finite_err)), err.shape)
        return (f"wrong values {where}: max abs error {finite_err[i]:.3g} at index {tuple(int(v) for v in i)} "
                f"(got {got64[i]:.6g}, expected {expected[i]:.6g}); {int(bad.sum())} of {bad.size} elements outside "
                f"the tolerance |error| <= {atol:.3g} + {rtol:g} * |expected|")
    return ""


# ------------------------------------------------------------------------------------------- running

def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


@dataclass
class Runner:
    """How every entry of one run is run: the same limits and environment for all of them."""

    task: Task
    cases: tuple
    timeout: float = 60.0
    repeats: int = 5
    warmup: int = 1
    min_repeat_time: float = 0.02
    threads: int = 1
    memory_bytes: int = 4 << 30
    seed: int = 17
    env: dict = field(default_factory=dict)
    sandbox: str = "auto"  # --sandbox: auto | bwrap | namespace | none
    box: object = None  # the tito.sandbox.Sandbox made from `sandbox`

    def __post_init__(self):
        if self.box is None:
            self.box = make_box(self.sandbox, self.memory_bytes)
        if not self.env:
            self.env = child_env(self.threads, self.box)

    def _start(self, work: Path, log, file: Path | None = None):
        """Start the worker in the sandbox (its output, the submission's prints included, to the open file `log`).
        The sandbox (bwrap) sees `file`'s folder (see `visible`) and tinytorch read-only, and `work`'s folder
        writable."""
        from . import jobs

        box = self.box
        cwd = work / "cwd"  # the submission's working directory: files it writes cannot pose as the worker's
        cwd.mkdir()
        if box.drops_user:  # root: the worker runs as an unused user id, which must be able to write here
            work.parent.chmod(0o711)
            for d in (work, cwd):
                os.chown(d, box.uids[0], box.uids[0])
        shown = visible(file) if file else []
        if box.mode == "bwrap" and box.drops_user:
            # that user may not be allowed to read the submission's folder (mode 700, as mkdtemp makes them):
            # it sees a readable copy instead, at the same path (outside the writable folder)
            copy = work / "submission"
            copy.mkdir(mode=0o755)
            staged = []
            for p in shown:
                dest = copy / f"{len(staged)}"
                if p.is_dir():
                    shutil.copytree(p, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(p, dest)
                for q in [dest, *(dest.rglob("*") if dest.is_dir() else [])]:
                    if not q.is_symlink():
                        q.chmod(0o755 if q.is_dir() or q.stat().st_mode & stat.S_IXUSR else 0o644)
                staged.append((dest, p))
            shown = staged
        ro = [p for p in (tinytorch_dir(), *shown) if p is not None]
        if box.mode == "namespace" and file is not None:  # a submission under a hidden folder stays visible
            box = dataclasses.replace(box, hidden=[h for h in box.hidden if h != file and h not in file.parents])
        cmd = box.command("tito.competition_worker", ro=tuple(ro), rw=(work,), chdir=str(cwd))
        # no core files, the address-space limit, its own session, and it dies with tito
        return jobs.start(box, "tito.competition_worker", command=cmd, cwd=str(cwd), env=self.env, stderr=log)

    def _exchange(self, job: dict, work: Path, deadline: float, file: Path | None = None):
        """Run one phase in the worker (tito.jobs: the job in, its progress and result out; the process tree killed
        at `deadline`); returns (its Reply, the tail of its output)."""
        from . import jobs

        with open(work / "output.txt", "wb") as log:
            reply = jobs.run(self._start(work, log, file), "compete", job, deadline)
        tail = (work / "output.txt").read_bytes()[-4000:].decode("utf-8", "replace").strip()
        return reply, tail

    def _failure(self, cases: list, reply, tail: str, kind: str = "submission") -> str:
        """Why a phase did not finish ('' when it did), from the worker's Reply (tito.jobs)."""
        e = (reply.result or {}).get("error")
        if e:
            at = f" at {e['where']}" if e.get("where") else ""
            if e["stage"] == "import":
                return f"import failed: {e['error']}{at}" + (
                    "; complete module 17 and run `tito export 17`" if kind != "submission" else "")
            verb = "raised" if e["stage"] == "results" else "raised while being timed:"
            why = f"{verb} {e['error']}{at} for input {self.task.describe(tuple(cases[e['case']]))}"
            if e["error"].startswith("NotImplementedError"):
                why = "not implemented yet: " + why + (
                    "; complete module 17's exercises and run `tito export 17`" if kind != "submission" else "")
            return why
        code = reply.code
        if reply.result is not None and code == 0:
            return ""
        if reply.fatal:
            return f"the competition worker failed: {reply.fatal}"
        if reply.ended not in ("", "exit", "timeout"):  # its channel carried what the worker never sends
            return f"the worker's channel was tampered with: it {reply.ended}"
        progress = reply.progress or "start"
        if progress in ("start", "import"):
            doing = "while starting" if progress == "start" else "while importing the file"
        else:
            phase, i = progress
            doing = (f"{'running' if phase == 'results' else 'being timed'} on input "
                     f"{self.task.describe(tuple(cases[i]))}")
        if code is None:
            return f"too slow: stopped after the {self.timeout:g} s limit (--timeout) {doing}"
        if code > 128 and self.box.mode == "bwrap":  # bwrap exits with 128 + the signal that killed the worker
            code = 128 - code
        if code < 0:
            sig = _signal_name(-code)
            hint = {"SIGSEGV": " (a crash in native code: a bad pointer or out-of-bounds access, e.g. through ctypes)",
                    "SIGKILL": f" (out of memory? the limit is {self.memory_bytes / 2 ** 30:g} GiB)",
                    "SIGBUS": " (a crash in native code)", "SIGABRT": " (native code aborted)"}.get(sig, "")
            return f"the process was killed by {sig}{hint} {doing}"
        last = tail.splitlines()[-1][:300] if tail else "no output"
        return f"the process exited with code {code} {doing} (sys.exit or os._exit in the submission?); last output: {last}"

    def _unreadable(self, file: Path) -> str:
        """Why the namespace sandbox's user (an unused user id: tito runs as root) cannot read `file` ('' when it can)."""
        box = self.box
        if not (box.drops_user and box.mode == "namespace"):  # bwrap: a readable copy is bound (see _start)
            return ""
        from .sandbox import _unreachable

        file = file.resolve()
        blocked = _unreachable(file)
        if blocked is None and os.stat(file).st_mode & stat.S_IROTH:
            return ""
        what = f"its folder {blocked}" if blocked is not None else f"the file (mode {oct(os.stat(file).st_mode & 0o777)})"
        return (f"the sandbox's user (uid {box.uids[0]}) cannot read it: {what} is not readable by other users; "
                f"`chmod a+r {file}` (and a+x on its folders), or run with --sandbox none")

    def preflight(self) -> None:
        """Start the worker in the sandbox as a run will (tito.sandbox.preflight, grading's): CourseError with the
        cause and the fix, in one line, when it does not."""
        from .sandbox import Trial, preflight

        box = self.box
        tmp = Path(tempfile.mkdtemp(prefix="tito-compete-"))
        work = tmp / "preflight"
        work.mkdir()

        def check(result: dict) -> str:
            err = result.get("error")
            return "" if not err else (
                f"sandbox {box.mode}: the competition worker cannot import what it needs ({err['error']}); export the "
                "course's modules (`tito export`), or run with --sandbox none to see whether the sandbox is the cause")

        try:
            preflight(box, trials=[Trial("the competition worker", "compete",
                                         {"phase": "preflight", "task": self.task.name, "out": str(work)},
                                         lambda log: self._start(work, log), check, none="run with --sandbox none",
                                         bwrap="--sandbox bwrap")],
                      timeout=max(30.0, self.timeout))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _check_timed(self, cases: list, timings: list, work: Path) -> str:
        """'' when every result kept while timing (see tito.competition_worker) is right for the inputs of
        its call, else why not: a kernel that returns what it computed for earlier inputs (a cache) or
        writes into them is rejected."""
        task = self.task
        for i, (case, t) in enumerate(zip(cases, timings)):
            if t.get("wrote_input"):
                return (f"wrote into its input `{t['wrote_input']}` while being timed, for input {task.describe(case)}: "
                        "inputs are read-only")
            if not t["checked"]:
                raise ValueError(f"no result was kept while timing input {i}")
            inputs = task.inputs(case, self.seed)
            expected = task.reference(inputs)
            for k in t["checked"]:
                npy, js = work / f"check_{i}_{k}.npy", work / f"check_{i}_{k}.json"
                got = json.loads(js.read_text()) if js.exists() else np.load(npy, allow_pickle=False)
                changed, want = task.timing_reference(inputs, expected, int(k))
                why = check_result(task, case, changed, got, want)
                if why:
                    return (f"returned a result for different inputs while being timed (a cache?): call {k} "
                            f"(the timing phase changes one element of `{task.args[0]}` before every call): {why}")
        return ""

    def run(self, name: str, file: Path, kind: str = "submission", max_flops: float | None = None) -> dict:
        """Check, then time, one entry; a dict for the leaderboard (never raises for the entry's own faults)."""
        task = self.task
        cases = [c for c in self.cases if max_flops is None or task.flops(c) <= max_flops]
        entry = {"name": name, "kind": kind, "file": str(file), "measured": now(), "status": "rejected",
                 "reason": "", "cases": [], "complete": len(cases) == len(self.cases)}
        if not cases:
            entry["reason"] = "no input of this run is small enough for it"
            return entry
        unreadable = self._unreadable(Path(file))
        if unreadable:
            entry["reason"] = unreadable
            return entry
        deadline = time.monotonic() + self.timeout
        with tempfile.TemporaryDirectory(prefix="tito-compete-") as tmp:
            base = {"task": task.name, "file": str(Path(file).resolve()), "cases": [list(c) for c in cases],
                    "seed": self.seed, "warmup": self.warmup, "repeats": self.repeats,
                    "min_repeat_time": self.min_repeat_time}
            for phase in ("results", "timing"):
                work = Path(tmp) / phase
                work.mkdir()
                job = {**base, "phase": phase, "out": str(work)}
                if phase == "timing":  # the task's NumPy kernel, timed in turns with this entry (in its folder)
                    ref = next(b for b in task.baselines if b.kind == "reference")
                    shutil.copyfile(kernels_dir() / ref.file, work / "reference_kernel.py")
                    job["reference_file"] = str(work / "reference_kernel.py")
                reply, tail = self._exchange(job, work, deadline, Path(file).resolve())
                try:  # what the worker left: unreadable only if the submission tampered with it
                    why = self._failure(cases, reply, tail, kind)
                    if not why and phase == "results":
                        for i, case in enumerate(cases):
                            npy, js = work / f"result_{i}.npy", work / f"result_{i}.json"
                            got = json.loads(js.read_text()) if js.exists() else np.load(npy, allow_pickle=False)
                            why = check_result(task, case, task.inputs(case, self.seed), got)
                            if why:
                                break
                    if not why and phase == "timing":
                        timings = reply.result["timings"]
                        if not isinstance(timings, list) or len(timings) != len(cases):
                            raise ValueError(f"{len(timings)} timings for {len(cases)} inputs")
                        why = self._check_timed(cases, timings, work)
                except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
                    why = f"its {phase} could not be read ({type(e).__name__}: {str(e)[:200]})"
                if why:
                    entry["reason"] = why
                    return entry
        for case, t in zip(cases, timings):
            entry["cases"].append({"case": list(case), "input": task.describe(case), "median_s": t["median"],
                                   "times_s": list(t["times"]), "reference_times_s": list(t.get("reference_times") or []),
                                   "best_s": t["best"], "repeats": len(t["times"]), "calls_per_repeat": t["number"],
                                   "gflops": task.flops(case) / t["median"] / 1e9})
        entry["status"] = "accepted"
        entry["total_s"] = sum(c["median_s"] for c in entry["cases"])
        entry["gflops"] = sum(task.flops(c) for c in cases) / entry["total_s"] / 1e9
        return entry


def course_root() -> Path | None:
    from .course import find_root

    try:
        return find_root()
    except CourseError:
        return None  # outside a course checkout: the installed tinytorch


def tinytorch_dir() -> Path | None:
    """The tinytorch package the workers import: this course's (its root comes first on their PYTHONPATH),
    else the installed one."""
    root = course_root()
    if root is not None and (root / "tinytorch" / "__init__.py").is_file():
        return (root / "tinytorch").resolve()
    import importlib.util

    spec = importlib.util.find_spec("tinytorch")
    return Path(spec.origin).resolve().parent if spec is not None and spec.origin else None


def visible(file: Path) -> list[Path]:
    """What the sandbox shows of a submission (read-only): its folder (its helpers `_*.py`, a compiled
    library it loads), or, when that folder is a course checkout or the home folder (or above it), only
    the file and its `_*` helpers."""
    folder = file.parent
    home = Path.home().resolve()
    from .sandbox import _is_checkout

    if _is_checkout(folder) or folder == home or folder in home.parents:
        return [file, *sorted(folder.glob("_*"))]
    return [folder]


def make_box(mode: str, memory_bytes: int):
    """The sandbox of `tito compete run --sandbox MODE` (tito.sandbox, as grading uses it): no network in
    either sandbox; namespace mode also hides the course's modules/, its git data and the home folder
    where no needed path lies under them."""
    from .sandbox import make_sandbox

    root = course_root()
    tt = tinytorch_dir()
    needed = [p for p in (tt, Path(tempfile.gettempdir()) / "tito-compete-x") if p is not None]
    keep = [Path(sys.prefix).resolve(), Path(sys.executable).resolve(), Path(__file__).resolve().parent, *needed]
    hidden = [p for p in ([root / "modules"] if root else []) + [Path.home()]
              if not any(p.resolve() == q or p.resolve() in q.parents for q in keep)]
    box = make_sandbox(mode, hidden, root or Path(__file__).resolve().parent.parent, memory_bytes,
                       max_processes=0, setting="--sandbox", needed=tuple(needed))
    box.network = False
    return box


def describe_box(box) -> str:
    """One line: where the submissions run (printed by `tito compete run`)."""
    who = f"as an unused user id ({box.uids[0]})" if box.drops_user and box.uids else "as you"
    if box.mode == "bwrap":
        return (f"sandbox bwrap: each submission runs {who} in bubblewrap, with no network and its own PID "
                "namespace; it sees, read-only, the system's /usr, the Python environment, tito, tinytorch and "
                "its own folder, and writes only its scratch folder and a private /tmp")
    if box.mode == "namespace":
        return (f"sandbox namespace: each submission runs {who} with no network, in its own mount and PID "
                f"namespaces; hidden from it: {', '.join(str(p) for p in box.hidden) or 'nothing'}; the rest of "
                "the file system stays readable, and it can write where any user may")
    return ("sandbox none: submissions run as you, with the limits only (address space, no core files, "
            "a process group, the timeout)" + (f"; {'; '.join(box.notes)}" if box.notes else ""))


def child_env(threads: int, box=None) -> dict:
    """The workers' environment: this course's tinytorch and tito importable, BLAS/OpenMP on `threads` threads.
    In a sandbox: only the sandbox's few variables (PATH, LANG, ...) and these; without one, tito's own."""
    root = course_root()
    if box is not None and box.mode != "none":
        env = box.env()
        env["MPLBACKEND"] = "Agg"
    else:
        env = dict(os.environ)
        if root is not None:
            env["MPLBACKEND"] = "Agg"
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([*([str(root)] if root else []), here,
                                         *filter(None, [os.environ.get("PYTHONPATH") if box is None or box.mode == "none"
                                                        else None])])
    for var in THREAD_VARS:
        env[var] = str(threads)
    return env


def submissions(path: Path) -> list[Path]:
    """The submission files: `path` itself (a .py file) or the NAME.py files in the folder. Files named
    `_*.py` are not submissions: they are helpers that submissions may import (`import _common`)."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".py":
            raise CourseError(f"{path} is not a Python file; a submission is a NAME.py file defining the task's function")
        return [path]
    if not path.is_dir():
        raise CourseError(f"no such folder: {path}; pass the folder holding the submissions (NAME.py files)")
    files = sorted(p for p in path.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise CourseError(f"{path} holds no submissions (NAME.py files); write examples there with "
                          f"`tito compete example {path}`")
    return files


# ---------------------------------------------------------------------------------------- leaderboard

def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def cpu_model() -> str:
    """The CPU's model name. Not tinytorch.perf.benchmark.cpu_model: that module is exported by module 19,
    after this competition (module 17); this one also reads ARM's `Hardware`/`CPU model` lines."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info(threads: int) -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "numpy": np.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def _comparable(old: dict, new: dict) -> str:
    """'' when old entries can be ranked with new ones, else why not."""
    for key in ("cpu", "cores", "threads", "numpy"):
        if old.get("machine", {}).get(key) != new["machine"][key]:
            return f"{key} was {old.get('machine', {}).get(key)!r}, now {new['machine'][key]!r}"
    if old.get("cases") != new["cases"]:
        return "they were measured on other inputs (--quick or not)"
    return ""


CONFIDENCE = 0.95  # of the interval of a speedup
MIN_REPEATS = 3  # fewer timed repeats give no spread to judge a speedup by


def paired_times(entry: dict) -> list | None:
    """[(the entry's repeat times, the NumPy kernel's repeat times)] per input, timed in turns in the entry's own
    process (tito.competition_worker); None for an entry measured without them (an older leaderboard)."""
    pairs = [(np.asarray(c.get("times_s") or [], float), np.asarray(c.get("reference_times_s") or [], float))
             for c in entry["cases"]]
    return pairs if pairs and all(len(a) and len(a) == len(b) for a, b in pairs) else None


def speedup_of(entry: dict, ref_case: dict) -> float | None:
    """The NumPy kernel's total time over `entry`'s: from the repeats timed in turns with it where the entry has
    them, else from the reference entry's medians (`ref_case`: input -> median seconds)."""
    pairs = paired_times(entry)
    if pairs is not None:
        return sum(float(np.median(b)) for _, b in pairs) / sum(float(np.median(a)) for a, _ in pairs)
    if ref_case and all(tuple(c["case"]) in ref_case for c in entry["cases"]):
        return sum(ref_case[tuple(c["case"])] for c in entry["cases"]) / entry["total_s"]
    return None


def speedup_interval(entry: dict, n_boot: int = 2000, seed: int = 0) -> tuple | None:
    """(low, high): the CONFIDENCE bootstrap interval of the NumPy kernel's total time over `entry`'s, from the
    repeats the two were timed in turns (`paired_times`): each bootstrap sample draws repeats with replacement,
    the same ones for both (a moment of load hits both), and takes the ratio of the sums over the inputs of their
    medians. None with fewer than MIN_REPEATS repeats (no spread measured) or without paired times."""
    pairs = paired_times(entry)
    if pairs is None or any(len(a) < MIN_REPEATS for a, _ in pairs):
        return None
    rng = np.random.default_rng(seed)
    own, numpy_ = np.zeros(n_boot), np.zeros(n_boot)
    for a, b in pairs:
        idx = rng.integers(0, len(a), (n_boot, len(a)))
        own += np.median(a[idx], axis=1)
        numpy_ += np.median(b[idx], axis=1)
    tail = 50 * (1 - CONFIDENCE)
    bounds = np.percentile(numpy_ / own, [tail, 100 - tail])
    return tuple(float(b) for b in bounds)


def speed_verdict(interval: tuple | None, repeats: int | None = None) -> str:
    """Three outcomes, as the course judges a speed (module 19's intervals): 'faster' than the reference when the
    whole interval of the speedup is above 1, 'slower' when it is below 1, else 'too noisy to tell'."""
    if interval is None:
        return f"too noisy to tell (fewer than {MIN_REPEATS} repeats: no spread measured; use --repeats {MIN_REPEATS} or more)"
    low, high = interval
    return "faster" if low > 1 else "slower" if high < 1 else "too noisy to tell"


def rank(board: dict) -> dict:
    """Order the entries (ranked: accepted on every input, by total time; then partial; then rejected)
    and set each one's rank and speedup over the reference entry, with its interval and verdict
    (`speedup_interval`, `speed_verdict`). A quick run (`board['quick']`, small inputs) is ordered but
    not ranked: at those sizes a call's overhead is most of its time."""
    ref = next((e for e in board["entries"] if e["kind"] == "reference" and e["status"] == "accepted"), None)
    ref_case = {tuple(c["case"]): c["median_s"] for c in ref["cases"]} if ref else {}
    for e in board["entries"]:
        e["speedup"] = e["speedup_interval"] = e["verdict"] = None
        if e["status"] != "accepted":
            continue
        if e is ref:
            e["speedup"], e["verdict"] = 1.0, "the reference"
            continue
        e["speedup"] = speedup_of(e, ref_case)
        if e["speedup"] is not None:
            interval = speedup_interval(e)
            e["speedup_interval"] = list(interval) if interval else None
            e["verdict"] = speed_verdict(interval)
    ranked = sorted((e for e in board["entries"] if e["status"] == "accepted" and e["complete"]),
                    key=lambda e: e["total_s"])
    partial = [e for e in board["entries"] if e["status"] == "accepted" and not e["complete"]]
    rejected = sorted((e for e in board["entries"] if e["status"] != "accepted"), key=lambda e: e["name"])
    for i, e in enumerate(ranked):
        e["rank"] = None if board.get("quick") else i + 1
    for e in partial + rejected:
        e["rank"] = None
    board["entries"] = ranked + partial + rejected
    return board


def speedup_text(e: dict) -> str:
    "'2.1x (2.0-2.3): faster', '1.07x (0.91-1.25): too noisy to tell', '1x (the reference)', or '-'."
    if not e.get("speedup"):
        return "-"
    if e.get("verdict") == "the reference":
        return f"{e['speedup']:.3g}x (the reference)"
    interval = e.get("speedup_interval")
    span = f" ({interval[0]:.3g}-{interval[1]:.3g})" if interval else ""
    verdict = (e.get("verdict") or "").split(" (")[0]
    return f"{e['speedup']:.3g}x{span}" + (f": {verdict}" if verdict else "")


def merge(old: dict | None, new: dict) -> tuple[dict, str]:
    """`new` plus the entries of `old` not run now (same task, machine and inputs); a note when old ones were dropped."""
    if old is None:
        return rank(new), ""
    if old.get("task") != new["task"]:
        raise CourseError(f"the leaderboard file holds task {old.get('task')!r}, not {new['task']!r}; "
                          "pass another file with --out")
    why = _comparable(old, new)
    if why:
        return rank(new), f"earlier entries were dropped: {why}; their times would not compare"
    names = {e["name"] for e in new["entries"]}
    new["entries"] = new["entries"] + [e for e in old.get("entries", []) if e["name"] not in names]
    return rank(new), ""


def load_board(path: Path) -> dict | None:
    path = Path(path)
    if not path.exists():
        return None
    try:
        board = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CourseError(f"{path} is not a leaderboard JSON file ({e}); move it away or pass another --out") from None
    if not isinstance(board, dict) or board.get("format") != FORMAT:
        raise CourseError(f"{path} is not a tinytorch leaderboard (no \"format\": \"{FORMAT}\"); "
                          "move it away or pass another --out")
    return board


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def rows(board: dict) -> list[list[str]]:
    """The table's rows: rank, name, result, total time, GFLOP/s, speedup (strings)."""
    out = []
    for e in board["entries"]:
        if e["status"] == "accepted":
            result = "accepted" if e["complete"] else f"accepted ({len(e['cases'])} of {len(board['cases'])} inputs: unranked)"
            out.append([str(e["rank"] or "-"), e["name"], result, fmt_time(e["total_s"]), f"{e['gflops']:.3g}",
                        speedup_text(e)])
        else:
            out.append(["-", e["name"], f"rejected: {e['reason']}", "-", "-", "-"])
    return out


HEADER = ["#", "submission", "result", "total (median)", "GFLOP/s", "vs NumPy (95% interval)"]


def markdown(board: dict) -> str:
    m = board["machine"]
    lines = [f"# Leaderboard: {board['task']}", "",
             f"`{board['signature']}`", "",
             f"Inputs: {'; '.join(board['cases'])}. Tolerance: {board['tolerance']}.", "",
             f"Updated {board['updated']} on {m['cpu']} ({m['cores']} cores, {m['threads']} thread(s) per kernel), "
             f"NumPy {m['numpy']}. Total = the sum over the inputs of each kernel's median time "
             f"(tinytorch.perf.measure.time_call, {board['repeats']} repeats after warmup). vs NumPy: the NumPy "
             f"kernel's total time over the entry's, both timed in turns in the entry's process, with the "
             f"{CONFIDENCE:.0%} bootstrap interval of that ratio over the repeats, and its verdict: faster or slower "
             f"when the whole interval is above or below 1, else too noisy to tell." + (" A quick run (small inputs, where a call's overhead is most of its time) is not "
                                  "ranked." if board.get("quick") else ""), "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows(board):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    timed = [e for e in board["entries"] if e["status"] == "accepted"]
    if timed:
        lines += ["", "Median time per input:", "",
                  "| submission | " + " | ".join(board["cases"]) + " |", "|---|" + "---|" * len(board["cases"])]
        for e in timed:
            per = {c["input"]: fmt_time(c["median_s"]) for c in e["cases"]}
            lines.append(f"| {e['name']} | " + " | ".join(per.get(c, "-") for c in board["cases"]) + " |")
    return "\n".join(lines) + "\n"


def new_board(runner: Runner) -> dict:
    task = runner.task
    return {"format": FORMAT, "task": task.name, "signature": task.signature, "tolerance": task.tolerance,
            "cases": [task.describe(c) for c in runner.cases], "repeats": runner.repeats,
            "quick": tuple(runner.cases) == tuple(task.quick_cases),
            "machine": machine_info(runner.threads), "updated": now(), "entries": []}


def competition(path: Path, task: Task, runner: Runner, out: Path, baselines: bool = True, on_entry=None) -> tuple:
    """Run the baselines (unless not wanted) and every submission under `path`; merge into the leaderboard
    at `out` and write it (JSON, and the Markdown table beside it). Returns (board, note, this run's entries)."""
    files = submissions(path)
    if Path(out).suffix == ".md":
        raise CourseError(f"--out {out}: the leaderboard is a JSON file (its Markdown table is written beside it "
                          "with the suffix .md); pass a name ending in .json")
    old = load_board(out)
    runner.preflight()
    board = new_board(runner)
    todo = [(b.name, kernels_dir() / b.file, b.kind, b.max_flops) for b in task.baselines] if baselines else []
    todo += [(f.stem, f, "submission", None) for f in files]
    for name, file, kind, max_flops in todo:
        if on_entry:
            on_entry("start", name, None)
        entry = runner.run(name, file, kind, max_flops)
        board["entries"].append(entry)
        if on_entry:
            on_entry("done", name, entry)
    this_run = list(board["entries"])
    board, note = merge(old, board)
    try:
        atomic_write_text(Path(out), json.dumps(board, indent=1) + "\n")
        atomic_write_text(Path(out).with_suffix(".md"), markdown(board))
    except OSError as e:
        raise CourseError(f"cannot write the leaderboard {out}: {e}; pass another file with --out") from None
    return board, note, this_run


def write_examples(folder: Path, task: Task, force: bool = False) -> list[Path]:
    """Copy the task's example submissions (a correct one, a wrong one) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, src in task.examples.items():
        dest = folder / name
        if dest.exists() and not force:
            raise CourseError(f"{dest} exists; pass --force to overwrite it, or choose another folder")
        shutil.copyfile(kernels_dir() / src, dest)
        written.append(dest)
    return written
