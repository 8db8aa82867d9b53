"""Running one milestone script from its test file (tests/test_milestone_*.py), as a student would.

    SCRIPT = MilestoneScript(ROOT, "cnn", ROOT / "milestones" / "cnn_1998.py", "the CNN milestone")
    SCRIPT.ready_or_skip(); proc = SCRIPT.run("--out", path)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tito import milestones as ms
from tito.course import Settings


class MilestoneScript:
    def __init__(self, root: Path, name: str, script: Path, label: str):
        self.root, self.name, self.script, self.label = Path(root), name, Path(script), label

    def ready_or_skip(self):
        """Skip in a student edition whose modules the milestone needs are not complete yet (saying
        which); in the instructor's edition every module is complete, so a missing one fails."""
        missing = ms.readiness(self.root, ms.get(self.root, self.name))
        if missing and Settings.load(self.root).edition == "student":
            pytest.skip(ms.explain(self.root, missing, self.label))
        assert not missing, ms.explain(self.root, missing)

    def run(self, *args, timeout=300) -> subprocess.CompletedProcess:
        "The script in a subprocess with this edition's tinytorch first on the path and plots to a file (Agg)."
        env = dict(os.environ, MPLBACKEND="Agg")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        env.pop("TITO_ROOT", None)
        return subprocess.run([sys.executable, str(self.script), *map(str, args)], cwd=self.root, env=env,
                              capture_output=True, text=True, timeout=timeout)
