"""The trusted half of grading: reference records, the student's records checked, verdicts into the notebook.

`Plan.make(root, module, seed)` runs the module's probes (tito.probes) over the instructor's reference
package in a subprocess of this trusted process (the course's own `tinytorch`, solved) with the run's
seed, and extracts the reference code that probes substitute for earlier exercises. `Plan.job(nb)`
is what a grading worker needs to run the same probes over one submission's exported code in its
sandbox. `Plan.verdicts(raw)` checks what the worker sent back; `apply_verdicts(nb, ...)` makes
every graded cell of the executed notebook say the trusted verdict (an error output when it
failed, none when it passed), so nbgrader's score, the feedback, the grading log and the CSV all
read one verdict.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import probes as P
from .course import CourseError, Module, edition_env
from .notebooks import ANSI_RE, exercise_label, is_test_cell
from .notebooks import read as read_notebook

CHECK_ERROR = "AutograderCheck"  # ename of the error output a failed trusted check adds to its cell
NOTE_PREFIX = "[autograder] "


def new_seed() -> int:
    return secrets.randbelow(2 ** 31)


def probe_digest(module: Module) -> str:
    """Changes when the module's probes change (part of the grading fingerprint: re-grade then)."""
    h = hashlib.sha256()
    for f in (Path(P.__file__), P.probe_file(module.number)):
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
    for target in targets:
        copy = nbformat.from_dict(json.loads(json.dumps(nb)))
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
    groups: list[dict]  # {"exercises", "uses", "sources"}
    reference: dict[str, tuple[dict, str]] = field(default_factory=dict)
    timeout_s: float = 60.0

    @classmethod
    def make(cls, root: Path, module: Module, seed: int | None = None, timeout_s: float = 60.0) -> "Plan | None":
        """The plan for `module`, None when it has no probes (its graded cells keep the notebook's verdict)."""
        if not P.module_probes(module.number):
            return None
        seed = new_seed() if seed is None else seed
        name, rel = package_module_name(root, module)
        # the reference: the instructor's notebook exported the way a submission is, over the course's package
        texts, skipped = exported_sources(read_notebook(module.notebook), module)
        text = texts[rel]
        if skipped:
            raise CourseError(f"{module.notebook}: exported cells that do not parse: {'; '.join(skipped)}")
        groups = P.groups_for(module.number)
        for g in groups:
            g["sources"] = P.reference_sources(text, g["uses"]) if g["uses"] else {}
        plan = cls(module, seed, name, rel, groups, timeout_s=timeout_s)
        plan.reference = plan._run_reference(root, texts)
        return plan

    def base(self) -> dict:
        return {"module": self.module.number, "seed": self.seed, "package_module": self.package_module}

    def _run_reference(self, root: Path, texts: dict[str, str]) -> dict[str, tuple[dict, str]]:
        # the reference needs no substitutes: it is the reference
        groups = [{"exercises": [e for g in self.groups for e in g["exercises"]], "sources": {}}]
        with tempfile.TemporaryDirectory(prefix="tito-reference-") as tmp:
            pkg = Path(tmp) / "pkg"
            shutil.copytree(root / "tinytorch", pkg / "tinytorch", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            for rel, text in texts.items():  # every file the module writes (tito.course.Module.package_files)
                (pkg / rel).write_text(text, encoding="utf-8")
            env = edition_env(pkg)
            env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
            env["PYTHONPATH"] = os.pathsep.join([str(pkg), str(Path(__file__).resolve().parent.parent)])
            raw = P.run_groups(self.base(), groups, sys.executable, env, Path(tmp) / "work", budget_s=600,
                               exercise_s=120)
        out = P.read_results(raw)
        broken = {e: r[1] for e, r in out.items() if r[1]}
        if broken or set(out) != {e for g in self.groups for e in g["exercises"]}:
            raise CourseError(f"the reference package fails its own probes for {self.module.slug} "
                              f"({'; '.join(f'{e}: {w}' for e, w in broken.items()) or 'records missing'}): "
                              "is tinytorch/ exported from the instructor notebooks? (`tito export`)")
        return out

    def job(self, nb) -> tuple[dict, list[str]]:
        """The worker's `probe` job for one submission's notebook, and notes (exported cells left out)."""
        texts, skipped = exported_sources(nb, self.module)
        return ({**self.base(), "groups": [{k: g[k] for k in ("exercises", "sources")} for g in self.groups],
                 "files": {rel: P.b64(text.encode()) for rel, text in texts.items()}, "timeout_s": self.timeout_s},
                [f"exported code: {s} (left out of the checked module)" for s in skipped])

    def verdicts(self, raw: dict | None) -> dict[str, str]:
        """{exercise: '' (passed) or why it failed} from what the worker sent back (None: nothing came back)."""
        student = P.read_results(raw or {})
        probes = P.module_probes(self.module.number)
        out = {}
        for ex, p in probes.items():
            if raw is None:
                out[ex] = "not checked: the grading worker returned no results for the checks"
            else:
                out[ex] = P.check(p, student.get(ex), self.reference[ex])
        return out


def cell_exercise(cell) -> str:
    return P.exercise_of(exercise_label(cell))


def _not_run(cell) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") in ("NotRun", "TimeoutError")
               for o in cell.get("outputs", []))


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
            first = errors[0]
            text = f"{first.get('ename')}: {ANSI_RE.sub('', str(first.get('evalue', '')))}"[:500]
            log.append(f"  {label}: the cell's own tests failed ({text}), but the trusted check passed")
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                f"\n{NOTE_PREFIX}this cell's tests failed when your notebook ran ({text}), but the autograder's "
                f"check of {label} on your exported code passed: full points.\n")))


def trusted_summary(verdicts: dict[str, str]) -> list[str]:
    return [f"  Exercise {ex}: {'passed' if not why else 'FAILED: ' + why}" for ex, why in sorted(
        verdicts.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(".")))]
