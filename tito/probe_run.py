"""Run the probes of some exercises of one module: `python -m tito.probe_run` (job as JSON on stdin).

    {"module": "02", "seed": 123, "exercises": ["2.1", "2.5"], "out": "/tmp/...",
     "package_module": "tinytorch.core.activations", "sources": {"merge_pair": "def merge_pair(...): ..."}}

The graded module is imported from whatever `tinytorch` is first on sys.path: the student's exported
code inside the grading sandbox, the instructor's reference package in the trusted process. `sources`
(reference code of earlier exercises, see tito.probes) are put in place first. For each exercise it
writes `out/progress` (the exercise now running), then `out/N.k.json` and `out/N.k.npz` (tito.probes.encode).
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main() -> int:
    job = json.loads(sys.stdin.read())
    out = Path(job["out"])
    progress = out / "progress"
    progress.write_text("import")

    import numpy as np

    from tito.probes import Rec, encode, install_sources, module_probes, seed_for

    probes = module_probes(job["module"])
    import_error = ""
    try:
        module = importlib.import_module(job["package_module"])
        if job.get("sources"):
            install_sources(module, job["sources"])
    except BaseException as e:  # the student's module: anything may come out of it
        import_error = f"importing your exported {job['package_module']} failed: {type(e).__name__}: {str(e)[:300]}"
    for ex in job["exercises"]:
        progress.write_text(ex)
        rec, error = Rec(), import_error
        if not error:
            try:
                probes[ex].fn(np.random.default_rng(seed_for(job["seed"], ex)), rec)
            except NotImplementedError:
                error = "not implemented yet (NotImplementedError raised)"
            except BaseException as e:
                error = f"the check could not use your code: {type(e).__name__}: {str(e)[:300]}"
        text, npz = encode(rec, error)
        (out / f"{ex}.npz").write_bytes(npz)
        (out / f"{ex}.json").write_text(text)
    progress.write_text("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
