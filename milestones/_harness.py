"""The milestone harness: everything milestone scripts share, so that each script holds only its story
and its model. It lives beside the scripts (`milestones/_harness.py`; `tito` lists and runs milestones
without importing it, so `tito` itself imports `tinytorch` only through its probes), and a script
imports it as `import _harness as harness` (Python puts the script's folder first on `sys.path`).

A milestone script states its header once, as literal constants that `tito milestone list` reads
without running it (`tito.milestones.parse`), and hands the rest to `start`::

    NAME = "mlp"
    YEAR = 1986
    TITLE = "..."
    NEEDS = ["01", "02", "03", "04", "05", "06", "07", "08"]
    TARGET = "at least 95% test accuracy on the 360 test digits"
    GOAL = {"reach": [("test accuracy", ">=", 0.95)]}

    import _harness as harness  # milestones/_harness.py, beside the scripts

    def main(argv=None) -> int:
        run = harness.start(__file__, epochs=15, quick_epochs=3, argv=argv)   # flags, readiness, header
        ...                                                                 # the story and the model
        run.save_plot(fig)                                                  # milestones/outputs/<script>.png
        return run.report(("test accuracy", accuracy))                      # PASS/FAIL line, exit code

`start` parses the common flags (`--epochs`, `--seed`, `--quick`, `--out`, `--threads`, plus the
script's own through `options=`), checks that the modules in NEEDS (and their prerequisites) are exported and
implemented, exiting with code 2 and a message naming each unfinished function and the command
that records it, puts the edition root first on `sys.path`, and prints the title and target.

The target is stated twice on purpose: TARGET in words for people, GOAL as fields for the harness
(`Target.from_goal`; the words are never parsed to grade): `"reach"` lists `(label, ">=" or "<=",
fraction)` thresholds in the order `report` receives the values, `"beat"` lists `(label, "higher" or
"lower", baseline)` comparisons with a baseline the script measures itself (passed as
`report(beats=...)`), `"max_epochs"` caps the epochs and `"max_seconds"` the `seconds` the script
reports. A test checks that TARGET's words and GOAL agree (`Target.parse` reads the words).
`Run.report` prints one line per condition, `target: >= 95% test accuracy; reached 97.2%: PASS`,
and returns the exit code: 0 when every condition holds, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tito import milestones as ms
from tito.course import CourseError, find_root

OUTPUTS = Path(ms.MILESTONES_DIR) / "outputs"
_PERCENT = re.compile(r"(at least|at or above|at most|at or below|>=|<=)?\s*(\d+(?:\.\d+)?)\s*%", re.IGNORECASE)
_WITHIN = re.compile(r"within\s+(\d+)\s+epochs?", re.IGNORECASE)
_SECONDS = re.compile(r"(?:in under|under|within|in less than)\s+(\d+(?:\.\d+)?)\s*(s|sec|seconds|min|minutes)\b",
                      re.IGNORECASE)
_COMPARES = re.compile(r"\bthan\b|\b(?:below|above)\s+(?:a|an|the)\b", re.IGNORECASE)
_AT_MOST = {"at most", "at or below", "<="}


PASS, FAIL, NOISY = "PASS", "FAIL", "TOO NOISY TO TELL"
NOISY_EXIT = ms.NOISY_EXIT  # a milestone's exit code when no condition failed but some were too noisy to tell
NOISY_ADVICE = "the interval straddles the target: re-run on a quieter machine"


@dataclass(frozen=True)
class Interval:
    """A measured quantity known only to lie in `[low, high]` (a bootstrap interval, module 19's
    `compare` or `bootstrap_median_ci`), with its point `estimate`.

    A target on it has three outcomes, as an engineer judges a speed-up: met (the whole interval is
    on the right side of the threshold), not met (the whole interval is on the wrong side), and too
    noisy to tell (the interval straddles it: the machine was too busy to decide, so re-run).
    """

    low: float
    high: float
    estimate: float | None = None

    def __post_init__(self):
        if not self.low <= self.high:
            raise ValueError(f"Interval: low must be <= high; got low={self.low!r}, high={self.high!r}")

    @property
    def point(self) -> float:
        return (self.low + self.high) / 2 if self.estimate is None else self.estimate


def judge(value, op: str, threshold: float, eps: float = 1e-9) -> str:
    """PASS, FAIL or NOISY for `value op threshold` (op one of ">=", "<=", ">", "<"); `value` a number
    (PASS or FAIL) or an `Interval` (NOISY when it straddles the threshold)."""
    lo, hi = (value.low, value.high) if isinstance(value, Interval) else (value, value)
    if op == ">=":
        good, bad = lo >= threshold - eps, hi < threshold - eps
    elif op == "<=":
        good, bad = hi <= threshold + eps, lo > threshold + eps
    elif op == ">":
        good, bad = lo > threshold, hi <= threshold
    elif op == "<":
        good, bad = hi < threshold, lo >= threshold
    else:
        raise ValueError(f"judge: op must be one of >=, <=, >, <; got {op!r}")
    return PASS if good else FAIL if bad else NOISY


@dataclass(frozen=True)
class Times:
    """A baseline that is `factor` times a measured `value`, for `Run.report(beats=...)`: the line then
    shows both, "802.7/s vs 3 x 228.3/s", instead of a product the reader cannot trace (684.8)."""

    factor: float
    value: float

    @property
    def total(self) -> float:
        return self.factor * self.value


def _shown(value, fmt) -> str:
    if isinstance(value, Interval):
        return f"{fmt(value.point)} (interval {fmt(value.low)}-{fmt(value.high)})"
    if isinstance(value, Times):
        return f"{value.factor:g} x {fmt(value.value)}"
    return fmt(value)


@dataclass(frozen=True)
class Condition:
    """One threshold of a target: `reached >= threshold` (op ">=") or `reached <= threshold` (op "<=")."""

    op: str
    threshold: float  # a fraction: 95% is 0.95
    text: str  # as written in TARGET: "95%"

    def holds(self, value: float) -> bool:
        return judge(value, self.op, self.threshold) == PASS

    def judge(self, value) -> str:
        "PASS, FAIL or NOISY (`value` an `Interval` that straddles the threshold)."
        return judge(value, self.op, self.threshold)


@dataclass(frozen=True)
class Target:
    """What TARGET promises, parsed from its text: the percentage conditions in order, and an epoch cap."""

    text: str
    conditions: tuple[Condition, ...]
    max_epochs: int | None = None
    max_seconds: float | None = None  # "in under 60 s", "within 5 minutes"
    compares: bool = False  # the TARGET compares with a baseline the script measures ("than", "below")

    @classmethod
    def from_goal(cls, text: str, goal: dict, where: str = "GOAL") -> "Target":
        """The target from the milestone's structured GOAL (what `report` checks); `text` is only shown.

        GOAL = {"reach": [(label, ">=" | "<=", fraction), ...], "beat": [(label, "higher" | "lower", baseline)],
                "max_epochs": int, "max_seconds": number}: every key optional, at least one of reach and beat."""
        unknown = set(goal) - {"reach", "beat", "max_epochs", "max_seconds"}
        if unknown:
            raise CourseError(f"{where}: unknown key(s) {sorted(unknown)}; use reach, beat, max_epochs, max_seconds")
        conditions = []
        for item in goal.get("reach", []):
            if (not isinstance(item, (tuple, list)) or len(item) != 3 or item[1] not in (">=", "<=")
                    or not isinstance(item[2], (int, float)) or not 0 <= item[2] <= 1):
                raise CourseError(f"{where}: reach entry {item!r} must be (label, '>=' or '<=', a fraction 0..1)")
            conditions.append(Condition(item[1], float(item[2]), f"{item[2] * 100:g}%"))
        for item in goal.get("beat", []):
            if not isinstance(item, (tuple, list)) or len(item) != 3 or item[1] not in ("higher", "lower"):
                raise CourseError(f"{where}: beat entry {item!r} must be (label, 'higher' or 'lower', baseline)")
        if not conditions and not goal.get("beat"):
            raise CourseError(f"{where} states no threshold (reach) and no baseline (beat): write what the script "
                              'must reach, e.g. GOAL = {"reach": [("test accuracy", ">=", 0.95)]}')
        epochs, seconds = goal.get("max_epochs"), goal.get("max_seconds")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise CourseError(f"{where}: max_epochs = {epochs!r} must be a positive integer")
        if seconds is not None and (not isinstance(seconds, (int, float)) or seconds <= 0):
            raise CourseError(f"{where}: max_seconds = {seconds!r} must be a positive number")
        return cls(text, tuple(conditions), epochs, None if seconds is None else float(seconds), bool(goal.get("beat")))

    @classmethod
    def parse(cls, text: str) -> "Target":
        """The thresholds a TARGET sentence states (a check that the words agree with GOAL; not what is graded)."""
        conditions = []
        for m in _PERCENT.finditer(text):
            op = "<=" if (m.group(1) or "").lower() in _AT_MOST else ">="
            conditions.append(Condition(op, float(m.group(2)) / 100.0, f"{m.group(2)}%"))
        compares = bool(_COMPARES.search(text))
        if not conditions and not compares:
            raise CourseError(f"TARGET {text!r} states no percentage and no comparison; write the threshold the "
                              'script checks, e.g. TARGET = "at least 95% test accuracy", or the baseline it must '
                              'beat, e.g. "higher test accuracy than the MLP"')
        within = _WITHIN.search(text)
        secs = _SECONDS.search(text)
        seconds = None
        if secs:
            seconds = float(secs.group(1)) * (60.0 if secs.group(2).lower().startswith("min") else 1.0)
        return cls(text, tuple(conditions), int(within.group(1)) if within else None, seconds, compares)


class Progress:
    """Training progress: a rich bar on a terminal; plain lines elsewhere (logs, CI, pytest), at most
    about 20 of them (the first step, every `total // 20`-th, and the last)."""

    def __init__(self, total: int, label: str = "epoch", stream=None):
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stdout
        self.every = max(1, total // 20)
        self.bar = None
        if hasattr(self.stream, "isatty") and self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self.bar = RichProgress(TextColumn(label), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                                    TextColumn("{task.fields[info]}"))
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, info="")

    def update(self, step: int, info: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif step == 1 or step % self.every == 0 or step == self.total:
            self._line(step, info)
            self.pending = None
        else:
            self.pending = (step, info)  # printed by close() if it was the last one

    def _line(self, step: int, info: str) -> None:
        filled = round(20 * step / self.total)
        print(f"{self.label} {step:3d}/{self.total} [{'#' * filled}{'.' * (20 - filled)}] {info}",
              file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        elif getattr(self, "pending", None):  # a run that stopped early: show where it stopped
            self._line(*self.pending)
            self.pending = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def runqueue_wait() -> float | None:
    """Seconds this process's main thread has spent ready to run but waiting for a core (Linux's
    /proc/PID/task/PID/schedstat, second field); None where the kernel does not say."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Elapsed(float):
    "Seconds a `Stopwatch` measured (a float), with `waited`: how many of them the main thread waited for a core."
    waited: float = 0.0


class Stopwatch:
    """Wall time from its start, and the main thread's wait for a core over the same span (`runqueue_wait`):
    `watch = harness.Stopwatch()` where the timed work begins, `seconds = watch.stop()` where it ends, and
    `run.report(..., seconds=seconds)` judges a time limit on a busy machine with three outcomes."""

    def __init__(self, clock=time.perf_counter, wait=None):
        self.clock, self.wait = clock, wait or (lambda: runqueue_wait())
        self.t0, self.w0 = clock(), self.wait()

    def stop(self) -> Elapsed:
        out = Elapsed(self.clock() - self.t0)
        now = self.wait()
        out.waited = 0.0 if now is None or self.w0 is None else min(float(out), max(0.0, now - self.w0))
        return out


@dataclass
class Run:
    """A started milestone: its header, parsed flags, edition root and target."""

    milestone: ms.Milestone
    args: argparse.Namespace
    root: Path
    target: Target
    lines: list[str] = field(default_factory=list)

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    @property
    def title(self) -> str:
        return f"{self.milestone.year} {self.milestone.name}: {self.milestone.title}"

    def progress(self, total: int | None = None, label: str = "epoch") -> Progress:
        "A progress display over `total` steps (default: `--epochs`)."
        return Progress(self.args.epochs if total is None else total, label)

    def pyplot(self):
        "matplotlib.pyplot with the file-only Agg backend (milestones save plots, they never open windows)."
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt

    def save_plot(self, fig, out: Path | None = None) -> Path:
        """Save `fig` to `--out` (default `milestones/outputs/<script>.png`) atomically, close it, say where."""
        out = Path(out or self.args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=out.suffix or ".png")
        os.close(fd)
        try:
            fig.savefig(tmp, dpi=110, format=(out.suffix[1:] or "png"))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600: the plot gets a new file's usual mode
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        finally:
            import matplotlib.pyplot as plt

            plt.close(fig)
        print(f"saved plot to {out}", flush=True)
        return out

    def time_taken(self, seconds: float) -> tuple:
        """(an `Interval` of the run's time, seconds spent waiting for a core) for a time limit on a busy machine.

        The wall time is the most it took; the least is the wall time less what the main thread spent ready to
        run while other work held every core (the run queue's wait over the same span: `seconds` from a
        `Stopwatch`; a plain number has no wait taken out). On a quiet machine the
        two agree and the limit is met or not; on a busy one a run over the limit whose work fits within it once
        the wait is taken out is too noisy to tell, and one over it even then is not met."""
        waited = float(getattr(seconds, "waited", 0.0))
        return Interval(max(0.0, seconds - waited), float(seconds), float(seconds)), waited

    def report(self, *reached: tuple, epochs: int | None = None, seconds: float | None = None,
               beats: tuple = (), profile=None) -> int:
        """Check the target; print one line per condition; return the exit code (0: all met, 1: some not
        met, `NOISY_EXIT` (3): none failed but some were too noisy to tell).

        `reached`: one `(label, value)` per percentage of TARGET, in order. `beats`: for a TARGET that
        compares with a baseline, `(label, value, baseline_label, baseline_value, better[, unit[, shown]])`
        tuples, `better` being "higher" or "lower" (e.g. `("test accuracy", 0.989, "the MLP", 0.969, "higher")`);
        a baseline that is a multiple of a measurement is `Times(3, 228.3)` (shown "3 x 228.3"), `unit`
        ("/s", " ms") follows every number of the line: "reached 802.7/s vs 3 x 228.3/s", and `shown`, when
        given, is the whole text of what was reached against what, in place of the two numbers.
        A measured speed is noisy: pass it as an `Interval` (the bootstrap interval of a ratio, say)
        wherever a value goes, and the condition is met, not met, or too noisy to tell (the interval
        straddles the threshold; the run is then reported as such, not failed). `epochs` is checked
        against "within N epochs", `seconds` against a time limit. `profile`: a function running one
        training step; when the time limit is missed, one step is profiled and its slowest ops are
        printed (`slowest_ops`), so the message points at the function to speed up.
        """
        conditions = self.target.conditions
        if len(reached) != len(conditions):
            raise ValueError(f"{self.milestone.script.name}: report() got {len(reached)} value(s) but TARGET "
                             f"{self.target.text!r} states {len(conditions)} threshold(s)")
        if self.target.compares and not beats:
            raise ValueError(f"{self.milestone.script.name}: TARGET {self.target.text!r} compares with a baseline: "
                             f"pass the measured values as report(beats=...)")
        verdicts = []

        def say(line: str, verdict: str) -> None:
            verdicts.append(verdict)
            print(f"target: {line}: {verdict}" + (f" ({NOISY_ADVICE})" if verdict == NOISY else ""))

        for cond, (label, value) in zip(conditions, reached):
            say(f"{cond.op} {cond.text} {label}; reached {_shown(value, lambda v: f'{v:.1%}')}", cond.judge(value))
        for beat in beats:
            if len(beat) not in (5, 6, 7):
                raise ValueError("report(beats=...): each entry is (label, value, baseline label, baseline value, "
                                 f"'higher' or 'lower'[, unit[, shown]]); got {beat!r}")
            label, value, base_label, base_value, better, unit, shown = (*beat, "", "")[:7]
            if better not in ("higher", "lower"):
                raise ValueError(f"report(beats=...): better must be 'higher' or 'lower'; got {better!r}")
            threshold = base_value.total if isinstance(base_value, Times) else base_value
            verdict = judge(value, ">" if better == "higher" else "<", threshold)
            fmt = lambda v: f"{v:.4g}{unit}"  # noqa: E731
            text = shown or f"{_shown(value, fmt)} vs {_shown(base_value, fmt)}"
            say(f"{label} {better} than {base_label}'s; reached {text}", verdict)
        if self.target.max_epochs is not None and epochs is not None:
            say(f"within {self.target.max_epochs} epochs; took {epochs}", PASS if epochs <= self.target.max_epochs else FAIL)
        if self.target.max_seconds is not None and seconds is not None:
            took, waited = self.time_taken(seconds)
            verdict = judge(took, "<", self.target.max_seconds)
            shown = f"took {seconds:.1f} s" + (f", {waited:.1f} s of it waiting for a core while ready to run (a busy "
                                              f"machine): {took.low:.1f} s on a quiet one" if waited >= 0.5 else "")
            say(f"in under {self.target.max_seconds:g} s; {shown}", verdict)
            if verdict == FAIL and profile is not None:
                print(slowest_ops_report(slowest_ops(profile)), flush=True)
        overall = FAIL if FAIL in verdicts else NOISY if NOISY in verdicts else PASS
        print(f"{self.title}: {overall} ({self.target.text})", flush=True)
        self.write_result(overall, reached, beats, epochs, seconds)
        return {PASS: 0, FAIL: 1, NOISY: NOISY_EXIT}[overall]

    def write_result(self, verdict: str, reached=(), beats=(), epochs=None, seconds=None) -> Path | None:
        """The run's result file, beside its plot (`milestones/outputs/<script>.json`): what `report` was given
        and its verdict, with the machine and commit (`tito guide measure` keeps these for the lab guide).
        None for a Run made without parsed flags (no `--out` to write beside)."""
        from tito import measured

        if getattr(self.args, "out", None) is None:
            return None

        def num(v):  # NumPy scalars are not JSON; an Interval keeps its ends, a Times its factor and value
            if isinstance(v, Interval):
                return {"low": float(v.low), "high": float(v.high), "estimate": None if v.estimate is None else float(v.estimate)}
            if isinstance(v, Times):
                return {"factor": float(v.factor), "value": float(v.value), "total": float(v.total)}
            return v if isinstance(v, str) else float(v)

        data = {"milestone": self.milestone.name, "year": self.milestone.year, "target": self.target.text,
                "verdict": verdict, "epochs_run": epochs,
                "seconds": None if seconds is None else round(float(seconds), 2),
                "quick": bool(getattr(self.args, "quick", False)),
                "reached": [{"label": label, "value": num(value), "condition": f"{c.op} {c.text}"}
                            for c, (label, value) in zip(self.target.conditions, reached)],
                "beats": [{"label": b[0], "value": num(b[1]), "baseline": b[2], "baseline_value": num(b[3]),
                           "better": b[4]} for b in beats],
                "argv": sys.argv[1:], "date": measured.now(), "commit": measured.git_commit(self.root),
                "machine": measured.machine()}
        return measured.write_json(Path(self.args.out).with_suffix(".json"), data)


def slowest_ops(step, repeats: int = 3, clock=None) -> list[tuple[str, float, int]]:
    """Profile `step()` (one training step) and return `(op, seconds per step, calls)`, slowest first.

    Forward ops are timed through the op observer of module 01 (`tinytorch.core.tensor.observe_ops`),
    backward rules through module 06's backward observer (`tinytorch.core.autograd.observe_backward`),
    which hears every rule the traversal runs on this thread: each op or rule is charged the time since
    the previous one ended, so an op's share includes the Python that prepared it. What neither sees
    (the optimizer update, data loading) is reported as one line of its own. `clock` (seconds, default
    `time.perf_counter`) is the one clock all of it reads: a test passes its own to decide every time.
    """
    import time

    from tinytorch.core import autograd, tensor

    clock = clock or time.perf_counter
    totals: dict[str, list] = {}
    last = [0.0]

    def charge(name: str) -> None:
        now = clock()
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += now - last[0]
        entry[1] += 1
        last[0] = clock()

    def observer(node, out) -> None:
        charge(f"{node.op} (forward)")

    def on_rule(node, grad, grads, start_ns, end_ns) -> None:
        charge(f"{node.op} (backward)")

    step()  # warm-up
    start = clock()
    with tensor.observe_ops(observer), autograd.observe_backward(on_rule):
        for _ in range(repeats):
            last[0] = clock()
            step()
    total = clock() - start
    ranked = sorted(((name, t / repeats, n // repeats) for name, (t, n) in totals.items()), key=lambda r: -r[1])
    ranked.append(("(not in an op: optimizer update, data, glue)", max(0.0, total / repeats - sum(r[1] for r in ranked)), 0))
    return ranked


def slowest_ops_report(ranked: list[tuple[str, float, int]], top: int = 6) -> str:
    "The few slowest ops of a profiled step as lines of text, with their share of the step."
    total = sum(r[1] for r in ranked) or 1.0
    lines = [f"where one training step's {total * 1e3:.1f} ms go (the slowest ops first; speed up the top ones):"]
    for name, seconds, calls in ranked[:top]:
        count = f", {calls} call(s)" if calls else ""
        lines.append(f"  {name:<40} {seconds * 1e3:8.2f} ms  {seconds / total:6.1%}{count}")
    return "\n".join(lines)


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _limit_blas_threads(n: int) -> None:
    """Use `n` BLAS threads. Set before NumPy is imported (milestone scripts import it after `start`);
    when it already is, threadpoolctl (if installed) changes the running thread pools instead."""
    if "numpy" not in sys.modules:
        for var in BLAS_THREAD_VARIABLES:
            os.environ[var] = str(n)
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n)


def _fail(message: str, code: int = 2):
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(code)


def start(script: str, *, epochs: int | None = None, quick_epochs: int | None = None, options=None,
          argv=None, root: Path | None = None) -> Run:
    """Start the milestone whose file is `script` (pass `__file__`).

    `epochs`: the default of `--epochs` (else TARGET's "within N epochs"); `quick_epochs`: the
    default under `--quick`. `options(parser)` adds the script's own flags. Exits with code 2 and a
    clear message when the header is invalid or a needed module is not ready.
    """
    path = Path(script).resolve()
    try:
        milestone = ms.parse(path)
        if not milestone.goal:
            raise CourseError(f"milestone script {path} does not define GOAL, the target as fields the harness "
                              f"checks; it must be {ms.FIELDS['GOAL'][1]}")
        target = Target.from_goal(milestone.target, milestone.goal, f"{path.name}: GOAL")
        root = root or find_root(path.parent)
    except CourseError as e:
        _fail(f"error: {e}")
    default_epochs = epochs or target.max_epochs
    if default_epochs is None:
        raise ValueError(f"{path.name}: pass epochs= to harness.start (TARGET states no epoch limit)")
    parser = argparse.ArgumentParser(
        prog=path.name, description=f"{milestone.year} {milestone.name}: {milestone.title}. Target: {milestone.target}.")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"passes over the training data (default {default_epochs}; {quick_epochs or default_epochs} with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, initial weights and order (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a short run, for a smoke test (may miss the target)")
    parser.add_argument("--out", type=Path, default=root / OUTPUTS / f"{path.stem}.png",
                        help="where to save the plot (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads for NumPy's matmuls (default %(default)s: these models' matrices are too "
                             "small to gain from more, and on a busy machine extra threads wait for each other)")
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = (quick_epochs or default_epochs) if args.quick else default_epochs
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1; got {args.epochs}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1; got {args.threads}")
    _limit_blas_threads(args.threads)

    try:
        missing = ms.check_modules(root, milestone.needs)
    except CourseError as e:
        _fail(f"error: {e}")
    if missing:
        _fail(ms.explain(root, missing, f"{path.name} ({milestone.year} {milestone.name})"))
    if sys.path[:1] != [str(root)]:  # run directly (python milestones/...): this edition's tinytorch comes first
        sys.path.insert(0, str(root))
    run = Run(milestone, args, root, target)
    print(run.title)
    print(f"target: {milestone.target}", flush=True)
    return run
