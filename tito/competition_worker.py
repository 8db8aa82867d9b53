"""One submission of `tito compete`, in a child process of its own: `python -m tito.competition_worker`, a
`compete` job of the job protocol (tito.jobs) with the payload

    {"phase": "results" | "timing", "task": "matmul", "file": "/path/NAME.py", "cases": [[64, 64, 64], ...],
     "seed": 17, "out": "/tmp/...", "warmup": 1, "repeats": 5, "min_repeat_time": 0.02}

`results`: imports the file, calls its function once on each case's inputs and saves what it returned to
`out/result_I.npy` (anything but an ndarray is described in `out/result_I.json` instead: the arrays are files,
too large for messages). The parent
process checks them against its own reference: a submission cannot change how it is judged.
`preflight`: imports what the other phases need, nothing of a submission (`tito compete run` checks
that the worker starts in its sandbox before any submission runs).
`timing`: times the function on each case with `tinytorch.perf.measure.time_call`; with `reference_file` (the task's NumPy kernel) each timed repeat of the submission
follows one of the reference, in this process, so that their ratio is measured in turns. Before every call, one element of the first input is changed (restoring the one
changed before: tito.competition.perturbation), so that no two calls see the same inputs; the results
of some calls (the last warmup call, the last call of each calibration round and of each timed repeat)
are kept and saved as `out/check_I_K.npy` (K: the call's number) for the parent to check against the
inputs of that call, and the inputs are compared with what they should be after the last call, and the result
message holds the timings (`{"timings": [...]}`). Both report their progress (the step now running) so that a
parent that had to kill this process can say where it was, and an exception of the submission as the result
`{"error": {"stage", "case", "error", "where"}}`; the worker's own failure is the protocol's `fatal`.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import traceback
from pathlib import Path


def _error(exc: BaseException, file: str) -> dict:
    """The exception's last line, and the submission's deepest line in the traceback."""
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == Path(file).resolve():
            where = f"{Path(file).name}:{frame.lineno}"
    return {"error": last[:500], "where": where}


def load(file: str, func: str, others: dict | None = None):
    """The submission's function `func`; `others` ({function: task}) names the task a misplaced kernel is for."""
    # the submission's folder goes last on sys.path: its helper modules (_helpers.py) import, while a
    # file there named like a real package (numpy.py) cannot shadow that package
    sys.path.append(str(Path(file).resolve().parent))
    spec = importlib.util.spec_from_file_location(f"submission_{Path(file).stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, func, None)
    if not callable(fn):
        names = sorted(n for n in vars(module) if callable(vars(module)[n]) and not n.startswith("_"))
        hint = next((f"; `{n}` is the function of another task: run it with --task {t}"
                     for n, t in (others or {}).items() if n != func and callable(vars(module).get(n))), "")
        raise LookupError(f"defines no function `{func}`" + (f" (it defines: {', '.join(names)[:200]})" if names else "")
                          + hint)
    return fn


def save(out: Path, stem: str, result) -> None:
    "What a call returned: an ndarray as `stem.npy`, anything else described in `stem.json`."
    import numpy as np

    if isinstance(result, np.ndarray) and result.dtype != object:
        np.save(out / f"{stem}.npy", result, allow_pickle=False)
    else:
        (out / f"{stem}.json").write_text(json.dumps({"type": type(result).__name__ if not isinstance(result, np.ndarray)
                                                      else "ndarray of Python objects"}))


def calibrate(call, min_repeat_time: float, before=None) -> int:
    "time_call's number of calls per repeat: quadrupled from 1 until a repeat lasts `min_repeat_time` (`before(k)` first)."
    import time

    number = 1
    while True:
        if before:
            before(number)
        t0 = time.perf_counter()
        for _ in range(number):
            call()
        if time.perf_counter() - t0 >= min_repeat_time or number >= 1 << 20:
            return number
        number *= 4


def timed(fn, inputs: list, args: tuple, job: dict, reference=None) -> tuple[dict, dict]:
    """Time `fn` on `inputs` by time_call's rules (warmup calls, `number` calls per repeat found by
    quadrupling until a repeat lasts `min_repeat_time`, `repeats` repeats with the garbage collector
    paused), one element of inputs[0] changed before each call. With `reference` (the task's NumPy
    kernel), each repeat of `fn` follows one repeat of `reference` on a copy of the inputs, changed the
    same way (in turns: a change of the machine's load hits both, so their ratio is fair). Returns
    (the timing record, {call number: result kept})."""
    import time

    import numpy as np

    from tinytorch.perf.measure import Timing, time_call
    from tito.competition import perturb_scale, perturbation

    flat = inputs[0].reshape(-1)  # a view: the inputs are C-contiguous
    base = flat.copy()
    others = [x.copy() for x in inputs[1:]]
    size, scale = flat.size, perturb_scale(inputs[0])
    k, prev = -1, 0
    check: set[int] = set()
    kept: dict[int, object] = {}

    def call():
        nonlocal k, prev
        k += 1
        flat[prev] = base[prev]
        prev, v = perturbation(k, size, scale)
        flat[prev] = v
        result = fn(*inputs)
        if k in check:
            kept[k] = result

    check.add(job["warmup"] - 1)
    for _ in range(job["warmup"]):
        call()
    # the calibration of time_call, with the last call of each round kept
    number = calibrate(call, job["min_repeat_time"], before=lambda n: check.add(k + n))
    check.update(k + (r + 1) * number for r in range(job["repeats"]))
    ref_times, ref_call = [], None
    if reference is not None:
        ref_inputs = [x.copy() for x in inputs]
        ref_flat, ref_k, ref_prev = ref_inputs[0].reshape(-1), [-1], [0]
        ref_base = ref_flat.copy()

        def ref_call():
            ref_k[0] += 1
            ref_flat[ref_prev[0]] = ref_base[ref_prev[0]]
            ref_prev[0], v = perturbation(ref_k[0], size, scale)
            ref_flat[ref_prev[0]] = v
            reference(*ref_inputs)
        for _ in range(job["warmup"]):
            ref_call()
        ref_number = calibrate(ref_call, job["min_repeat_time"])
    times = []
    for r in range(job["repeats"]):  # in turns, the order swapped every repeat (ABBA: neither always goes first)
        if ref_call is not None and r % 2 == 0:
            ref_times.append(time_call(ref_call, warmup=0, repeats=1, number=ref_number).times[0])
        times.append(time_call(call, warmup=0, repeats=1, number=number).times[0])
        if ref_call is not None and r % 2 == 1:
            ref_times.append(time_call(ref_call, warmup=0, repeats=1, number=ref_number).times[0])
    t = Timing(tuple(times), number)
    flat[prev] = base[prev]
    changed = [a for a, x, y in zip(args, [flat, *inputs[1:]], [base, *others]) if not np.array_equal(x, y, equal_nan=True)]
    # a result that shares memory with a later one was overwritten by that call (a kernel reusing its
    # output buffer): only the later one says what its call returned
    arrays = [(c, r) for c, r in sorted(kept.items()) if isinstance(r, np.ndarray)]
    for n, (c, r) in enumerate(arrays):
        if any(np.may_share_memory(r, later) for _, later in arrays[n + 1:]):
            del kept[c]
    record = {"times": list(t.times), "number": t.number, "median": t.median, "best": t.best, "calls": k + 1,
              "checked": sorted(kept), "wrote_input": changed[0] if changed else None, "reference_times": ref_times}
    return record, kept


def handle(job: dict, chan) -> dict:
    """One phase of one submission: the result says what went wrong (`error`: the submission's own exception) or,
    for timing, the timings; the arrays it returned are files in `out`."""
    out = Path(job["out"])
    chan.progress("import")

    import numpy as np

    from tito.competition import TASKS

    task = TASKS[job["task"]]
    if job["phase"] == "preflight":  # tito compete's check that the worker starts in its sandbox (tito.sandbox.preflight)
        try:
            import tinytorch.perf.measure  # noqa: F401
        except BaseException as e:
            return {"error": {"stage": "import", "error": _error(e, __file__)["error"]}}
        chan.ready()
        return {}
    chan.ready()  # what this worker needs is imported: the submission's code runs from here on
    try:
        fn = load(job["file"], task.func, {t.func: t.name for t in TASKS.values()})
    except BaseException as e:  # the submission's module: anything may come out of it
        return {"error": {"stage": "import", **_error(e, job["file"])}}
    # the task's NumPy kernel (a copy of the course's, written by the parent into this job's folder): timed in turns
    reference = load(job["reference_file"], task.func) if job.get("reference_file") else None
    timings = []
    for i, case in enumerate(job["cases"]):
        inputs = task.inputs(tuple(case), job["seed"])
        chan.progress([job["phase"], i])
        try:
            if job["phase"] == "results":
                kept = [x.copy() for x in inputs]
                result = fn(*inputs)
                changed = [k for k, (x, y) in enumerate(zip(inputs, kept)) if not np.array_equal(x, y, equal_nan=True)]
                if changed:
                    (out / f"result_{i}.json").write_text(json.dumps({"wrote_input": task.args[changed[0]]}))
                else:
                    save(out, f"result_{i}", result)
            else:
                record, kept = timed(fn, inputs, task.args, job, reference)
                for k in record["checked"]:
                    save(out, f"check_{i}_{k}", kept[k])
                del kept
                timings.append(record)
        except BaseException as e:
            return {"error": {"stage": job["phase"], "case": i, **_error(e, job["file"])}}
    return {"timings": timings} if job["phase"] == "timing" else {}


def main() -> int:
    from tito.jobs import serve

    return serve("compete", handle)  # the job protocol (tito.jobs)


if __name__ == "__main__":
    sys.exit(main())
