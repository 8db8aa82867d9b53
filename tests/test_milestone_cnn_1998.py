"""The 1998 CNN milestone run end to end with this edition's tinytorch: on the bundled digits it must
meet its target (the CNN beats the MLP with fewer parameters, in under 60 s); with `--cifar10 DIR`
it must train on a small folder in the CIFAR-10 python-batch format written by the test."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.support.milestone import MilestoneScript, assert_exit_code_follows_verdict, assert_target_met
from tito import milestones as ms

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "milestones" / "cnn_1998.py"
MILESTONE = MilestoneScript(ROOT, "cnn", SCRIPT, "the CNN milestone")
ready_or_skip, run = MILESTONE.ready_or_skip, MILESTONE.run


def test_header_is_discovered():
    m = ms.get(ROOT, "1998")
    assert (m.name, m.script) == ("cnn", SCRIPT) and "09" in m.needs and "60 s" in m.target


@pytest.mark.slow
def test_cnn_beats_the_mlp_on_the_digits(tmp_path):
    ready_or_skip()
    out = tmp_path / "plots" / "cnn.png"
    proc = run("--out", out)
    assert_target_met(proc)
    assert "cnn: A small CNN" in proc.stdout and "CNN epoch  12/12" in proc.stdout, proc.stdout
    mlp = float(proc.stdout.split("MLP: test accuracy ")[1].split("%")[0])
    cnn = float(proc.stdout.split("CNN: test accuracy ")[1].split("%")[0])
    assert cnn > mlp, f"the CNN reached {cnn}% and the MLP {mlp}%\n{proc.stdout}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    result = out.with_suffix(".json")  # the run's result record, which the guide's measured page reads
    assert json.loads(result.read_text())["verdict"] == "PASS", result.read_text()
    assert not [p for p in out.parent.iterdir() if p not in (out, result)], \
        "only the plot and the result record are left (no temporary files)"


def write_cifar_folder(root: Path, n_train=(12, 12, 12, 12, 12), n_test=20):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name, n in zip(names, list(n_train) + [n_test]):
        with open(folder / name, "wb") as f:
            pickle.dump({b"labels": rng.integers(0, 10, n).tolist(), b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"batch_label": name.encode(), b"filenames": [b"x.png"] * n}, f, protocol=2)
    return root


@pytest.mark.slow
def test_cifar10_option_trains_both_models_through_the_loader(tmp_path):
    ready_or_skip()
    data = write_cifar_folder(tmp_path / "cifar")
    out = tmp_path / "cifar.png"
    proc = run("--cifar10", data, "--limit", 40, "--epochs", 1, "--batch-size", 8, "--out", out)
    assert_exit_code_follows_verdict(proc)
    assert "40 training and 20 test images of 3x32x32" in proc.stdout, proc.stdout
    assert "MLP epoch   1/1" in proc.stdout and "CNN epoch   1/1" in proc.stdout, proc.stdout
    assert out.exists()


def test_bad_options_are_refused():
    proc = run("--limit", 10)
    assert proc.returncode == 2 and "--limit" in proc.stderr and "--cifar10" in proc.stderr, proc.stderr
    proc = run("--cifar10", ROOT / "no-such-folder", "--epochs", 1)
    assert proc.returncode == 2 and "Download" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
