"""One submission of `tito compete`, in a child process of its own: `python -m tito.competition_worker`
(job as JSON on stdin).

    {"phase": "results" | "timing", "task": "matmul", "file": "/path/NAME.py", "cases": [[64, 64, 64], ...],
     "seed": 17, "out": "/tmp/...", "warmup": 1, "repeats": 5, "min_repeat_time": 0.02}

`results`: imports the file, calls its function once on each case's inputs and saves what it returned to
`out/result_I.npy` (anything but an ndarray is described in `out/result_I.json` instead). The parent
process checks them against its own reference: a submission cannot change how it is judged.
`timing`: times the function on each case with `tinytorch.perf.measure.time_call` and writes
`out/timing.json`. Both write `out/progress` (the step now running) so that a parent that had to kill
this process can say where it was, and `out/error.json` for an exception of the submission.
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


def main() -> int:
    job = json.loads(sys.stdin.read())
    out = Path(job["out"])
    progress = out / "progress"
    progress.write_text("import")

    import numpy as np

    from tito.competition import TASKS

    task = TASKS[job["task"]]
    try:
        fn = load(job["file"], task.func, {t.func: t.name for t in TASKS.values()})
    except BaseException as e:  # the submission's module: anything may come out of it
        (out / "error.json").write_text(json.dumps({"stage": "import", **_error(e, job["file"])}))
        return 0
    timings = []
    for i, case in enumerate(job["cases"]):
        inputs = task.inputs(tuple(case), job["seed"])
        progress.write_text(json.dumps([job["phase"], i]))
        try:
            if job["phase"] == "results":
                kept = [x.copy() for x in inputs]
                result = fn(*inputs)
                changed = [k for k, (x, y) in enumerate(zip(inputs, kept)) if not np.array_equal(x, y, equal_nan=True)]
                if changed:
                    (out / f"result_{i}.json").write_text(json.dumps({"wrote_input": task.args[changed[0]]}))
                elif isinstance(result, np.ndarray) and result.dtype != object:
                    np.save(out / f"result_{i}.npy", result, allow_pickle=False)
                else:
                    (out / f"result_{i}.json").write_text(json.dumps({"type": type(result).__name__ if not isinstance(result, np.ndarray)
                                                                   else "ndarray of Python objects"}))
            else:
                from tinytorch.perf.measure import time_call

                t = time_call(lambda: fn(*inputs), warmup=job["warmup"], repeats=job["repeats"],
                              min_repeat_time=job["min_repeat_time"])
                timings.append({"times": list(t.times), "number": t.number, "median": t.median, "best": t.best})
        except BaseException as e:
            (out / "error.json").write_text(json.dumps({"stage": job["phase"], "case": i, **_error(e, job["file"])}))
            return 0
    if job["phase"] == "timing":
        (out / "timing.json").write_text(json.dumps(timings))
    progress.write_text("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
