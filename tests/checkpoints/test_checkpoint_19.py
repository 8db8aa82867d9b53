"""Checkpoint 19: can you show, with error bars, that a smaller model is faster, and publish the numbers?

Modules 01-08 train the 1986 MLP on the bundled digits for a few epochs; module 16 distills it into
a one-hidden-layer student, module 15 quantizes it. Module 19 then benchmarks the three at batch
360 with pinned BLAS threads: the student must be significantly faster than the teacher (the
bootstrap interval of the ratio of medians above 1), accurate within a few points, and on the
Pareto front of (latency, error, bytes) with the teacher; the per-call latency percentiles must be
ordered; the results go into a result file that a leaderboard merges, and one of another workload
version is refused.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from tinytorch.core.activations import ReLU
from tinytorch.core.autograd import no_grad
from tinytorch.core.layers import Linear, Sequential
from tinytorch.core.losses import CrossEntropyLoss
from tinytorch.core.optimizers import SGD
from tinytorch.core.tensor import Tensor
from tinytorch.core.training import Trainer
from tinytorch.data.loader import DataLoader, TensorDataset, load_digits
from tinytorch.perf.benchmark import NOT_MET, benchmark, benchmark_interleaved, compare, pareto_front
from tinytorch.perf.results import WORKLOAD_VERSION, merge_leaderboard, result_row, write_results
from tinytorch.perf.compression import distillation_loss
from tinytorch.perf.quantization import model_nbytes, quantize_model

pytestmark = pytest.mark.module("19")


def test_benchmark_an_optimized_digits_model_and_publish_it(tmp_path):
    train, test = load_digits("train"), load_digits("test")
    mean, std = train.tensors[0].data.mean(axis=0), train.tensors[0].data.std(axis=0) + 1.0
    xtr = ((train.tensors[0].data - mean) / std).astype(np.float32)
    xte = ((test.tensors[0].data - mean) / std).astype(np.float32)
    ytr, yte = train.tensors[1].data, test.tensors[1].data
    g = np.random.default_rng(0)
    teacher = Sequential(Linear(64, 128, rng=g), ReLU(), Linear(128, 128, rng=g), ReLU(), Linear(128, 10, rng=g))
    opt = SGD(teacher.parameters(), lr=0.05, momentum=0.9)
    Trainer(teacher, CrossEntropyLoss(), opt, progress=False).fit(
        DataLoader(TensorDataset(xtr, ytr), batch_size=32, shuffle=True, seed=0), 6)
    teacher.eval()
    with no_grad():
        soft = teacher(xtr).data
    student = Sequential(Linear(64, 32, rng=g), ReLU(), Linear(32, 10, rng=g))
    opt = SGD(student.parameters(), lr=0.05, momentum=0.9)
    order = np.random.default_rng(1)
    for _ in range(10):
        for idx in np.array_split(order.permutation(len(xtr)), len(xtr) // 32):
            loss = distillation_loss(student(Tensor(xtr[idx])), Tensor(soft[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    student.eval()
    int8 = quantize_model(teacher, xtr[:256])

    models = {"teacher": teacher, "student": student, "int8": int8}
    accuracy, nbytes = {}, {}
    with no_grad():
        for name, m in models.items():
            accuracy[name] = float((m(xte).data.argmax(axis=1) == yte).mean())
            nbytes[name] = model_nbytes(m)
        # in turns, CPU time: the question is how much work a forward is; the verdict has three outcomes, and a
        # loaded machine may make it too noisy to tell, never a slowdown of a model with 8x fewer multiply-adds
        results = benchmark_interleaved(models, xte, budget_s=1.5, threads=1, clock=time.process_time,
                                        check_machine=False)
    assert accuracy["teacher"] > 0.93 and accuracy["student"] > accuracy["teacher"] - 0.05, accuracy

    c = compare(results["student"], results["teacher"])
    assert c.judge(1.2) != NOT_MET, f"the 32-unit student should be clearly faster at batch 360: {c.verdict}"
    assert c.verdict.startswith(("student is ", "no significant difference between student")), c.verdict

    names = list(models)
    costs = np.array([[results[n].median, 1 - accuracy[n], nbytes[n]] for n in names])
    front = dict(zip(names, pareto_front(costs)))
    assert front["student"], f"the fastest, smallest model cannot be dominated: {front}"

    with no_grad():
        per_call = benchmark(student, xte[:1], number=1, repeats=100, threads=1, check_machine=False)
    p = per_call.percentiles()
    assert p["p50"] <= p["p95"] <= p["p99"], p

    mine = write_results(tmp_path / "mine.json", [result_row(results[n], accuracy=accuracy[n], bytes=nbytes[n])
                                                  for n in names], "me")
    board = merge_leaderboard([mine])
    assert [r["model"] for r in board][0] == "student" and {r["model"] for r in board} == set(names)
    old = write_results(tmp_path / "old.json", [result_row(results["student"])], "old", workload_version=WORKLOAD_VERSION + 1)
    with pytest.raises(ValueError, match="old.json was measured on workload"):
        merge_leaderboard([mine, old])
