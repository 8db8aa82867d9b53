"""The references hold without PyTorch, and the package tests can fail.

- With torch hidden (as in a student edition), module 06's package tests pass on the package and
  skip nothing, and fail on a copy with one wrong gradient rule (`gelu_backward` missing its factor
  3, `var_backward` dividing by N - 1): before the torch-free references, both passed there.
- A catalogue of realistic one-line bugs of modules 06-09 (`tests/support/mutation.py`), each run
  against its module's package tests with torch hidden: every one must be caught.
- That every module's package tests fail on its released stubs is proven beside its graded cells, on
  the same release, in `tests/test_notebooks.py` (`test_release_exports_imports_and_fails_its_tests`).
"""
from __future__ import annotations

from pathlib import Path
import sys

import pytest

from tests.support.mutation import MUTATIONS, mutated_edition, run_module_tests
from tito.course import Settings

ROOT = Path(__file__).resolve().parents[1]

IS_INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
instructor_only = pytest.mark.skipif(not IS_INSTRUCTOR, reason="needs the instructor edition (solutions)")

GELU = next(m for m in MUTATIONS if m.function == "gelu_backward")
VAR = next(m for m in MUTATIONS if m.function == "var_backward")


def describe(run) -> str:
    return f"{run.passed} passed, {run.failed} failed, {run.skipped} skipped, {run.errors} errors:\n{run.output[-3000:]}"


def test_hiding_torch_works():
    import subprocess

    code = "import tests.support.no_torch\ntry:\n    import torch.nn\nexcept ImportError:\n    print('hidden')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "hidden", f"tests.support.no_torch did not hide torch: {out.stdout} {out.stderr[-500:]}"


@pytest.mark.slow
@instructor_only
def test_module_06_without_torch_passes_and_skips_nothing():
    with mutated_edition(ROOT) as copy:
        run = run_module_tests(copy, "06", hide_torch=True)
    assert run.returncode == 0 and run.failed == 0, f"module 06 without torch: {describe(run)}"
    assert run.skipped == 0, f"module 06 without torch skipped {run.skipped} tests: {run.skip_reasons}"
    assert run.passed >= 90, f"module 06 without torch ran only {run.passed} tests"


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("bug", [GELU, VAR], ids=["gelu_backward", "var_backward"])
def test_module_06_without_torch_catches_a_wrong_rule(bug):
    with mutated_edition(ROOT, bug) as copy:
        run = run_module_tests(copy, "06", hide_torch=True, extra_args=["-x"])
    assert run.caught, f"module 06's tests (torch hidden) pass with {bug.function} changed ({bug.why}): {describe(run)}"


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("module", sorted({m.module for m in MUTATIONS}))
def test_mutation_catalogue_is_caught_without_torch(module, capsys):
    """Each realistic bug of the module's catalogue fails the package tests of its exercise (`--exercise`), torch
    hidden; prints the catch rate. One test per module, so that the suite's workers share the catalogue."""
    results = []
    for bug in (m for m in MUTATIONS if m.module == module):
        with mutated_edition(ROOT, bug) as copy:
            results.append((bug, run_module_tests(copy, bug.module, hide_torch=True, extra_args=["-x"],
                                                  exercise=bug.exercise)))
    missed = [bug.name for bug, run in results if not run.caught]
    with capsys.disabled():
        print(f"\nmodule {module}'s mutation catalogue (torch hidden, each bug against its exercise's tests): "
              f"{len(results) - len(missed)} of {len(results)} caught")
    assert not missed, f"these bugs pass their exercise's package tests without torch: {missed}"


NOTEBOOK_BUGS = [m for m in MUTATIONS if m.module in ("11", "13")]


@pytest.mark.slow
@instructor_only
@pytest.mark.parametrize("bug", NOTEBOOK_BUGS, ids=[f"{m.module}-{m.exercise}-{m.why}" for m in NOTEBOOK_BUGS])
def test_graded_cells_of_11_and_13_catch_each_bug(bug):
    """The bugs of modules 11 and 13's catalogue, applied to the source notebook, fail the graded cell of
    their exercise (as the package tests fail on them above)."""
    from tests.support.mutation import graded_cells_failing

    failing = graded_cells_failing(ROOT, bug.module, bug)
    assert any(label.startswith(f"Exercise {bug.exercise}:") for label in failing), (
        f"{bug.name}: no graded cell of Exercise {bug.exercise} fails; failing graded cells: {failing}")


# ---------------------------------------------------------------------------------------------
# The torch-free references themselves: central differences, and agreement with PyTorch
# ---------------------------------------------------------------------------------------------
def test_numeric_grads_are_exact_on_smooth_functions_and_flag_kinks():
    import numpy as np

    from tests.support.refs import numeric_grads

    x = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, 3.0]], np.float32)
    up = np.array([0.5, -0.75], np.float32)
    [(g, ok)] = numeric_grads(lambda a: np.sum(np.tanh(a) * a, axis=1), [x], up)
    xd, ud = x.astype(np.float64), up.astype(np.float64)  # the closed form in float64, as numeric_grads works
    exact = (np.tanh(xd) + xd / np.cosh(xd) ** 2) * ud[:, None]
    assert ok.all() and np.allclose(g, exact, rtol=1e-7, atol=1e-9), f"smooth: {g} vs {exact}"
    [(g, ok)] = numeric_grads(lambda a: np.maximum(a, 0.0).max(axis=1), [x], up)
    assert ok.tolist() == [[True, True, True], [True, False, False]], f"the tie of row 1 must be flagged: {ok}"
    assert np.allclose(g[0], [0, 0, 0.5]), f"the max of row 0 gets the upstream gradient: {g[0]}"


TORCH_CHECKS = ["conv2d", "pools", "batch_norm", "layer_norm", "attention", "optimizers", "schedules_and_clip"]


@pytest.mark.parametrize("family", TORCH_CHECKS)
def test_numpy_references_agree_with_torch(family):
    """Every torch-free reference of tests/support/refs.py equals PyTorch where PyTorch is installed."""
    import numpy as np

    from tests.support import refs

    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)

    def close(a, b, what, tol=1e-5):
        b = b.detach().double().numpy() if hasattr(b, "detach") else np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"refs {what} vs torch")

    def t(a):  # a copy: torch updates running statistics and clips gradients in place
        return torch.from_numpy(np.array(a, dtype=np.float64, order="C", copy=True))

    x = rng.standard_normal((2, 3, 7, 6))
    if family == "conv2d":
        w, b = rng.standard_normal((4, 3, 3, 2)), rng.standard_normal(4)
        close(refs.conv2d(x, w, b, (2, 1), (1, 2)), F.conv2d(t(x), t(w), t(b), stride=(2, 1), padding=(1, 2)), "conv2d")
    elif family == "pools":
        close(refs.max_pool2d(x, (3, 2), (2, 1)), F.max_pool2d(t(x), (3, 2), (2, 1)), "max_pool2d")
        close(refs.avg_pool2d(x, 2), F.avg_pool2d(t(x), 2), "avg_pool2d")
        xi = rng.integers(0, 3, (2, 3, 7, 6)).astype(np.float64)  # ties
        g = rng.standard_normal((2, 3, 5, 4))
        tx = t(xi).requires_grad_(True)
        F.max_pool2d(tx, 3, 1).backward(t(g))
        close(refs.max_pool2d_grad(xi, 3, 1, g), tx.grad, "max_pool2d_grad (first maximum)")
    elif family == "batch_norm":
        w, b, rm, rv = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3), rng.standard_normal(3), rng.uniform(0.5, 2, 3)
        trm, trv = t(rm), t(rv)
        y = F.batch_norm(t(x), trm, trv, t(w), t(b), training=True, momentum=0.1, eps=1e-5)
        ry, nm, nv = refs.batch_norm_train(x, w, b, rm, rv)
        close(ry, y, "batch_norm_train output")
        close(nm, trm, "batch_norm_train running_mean")
        close(nv, trv, "batch_norm_train running_var")
        close(refs.batch_norm_eval(x, w, b, rm, rv, eps=1e-3),
              F.batch_norm(t(x), t(rm), t(rv), t(w), t(b), training=False, eps=1e-3), "batch_norm_eval")
    elif family == "layer_norm":
        w, b = rng.standard_normal(6), rng.standard_normal(6)
        close(refs.layer_norm(x, w, b), F.layer_norm(t(x), (6,), t(w), t(b)), "layer_norm")
        ids = rng.integers(0, 5, (2, 4))
        table = rng.standard_normal((5, 3))
        close(refs.embedding(table, ids), F.embedding(torch.from_numpy(ids), t(table)), "embedding")
        close(refs.gelu_tanh(x), F.gelu(t(x), approximate="tanh"), "gelu_tanh")
    elif family == "attention":
        q, k, v = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))
        mask = rng.random((4, 5)) < 0.6
        mask[:, 0] = True
        bias = rng.standard_normal((4, 5))
        sd = F.scaled_dot_product_attention
        close(refs.sdpa(q, k, v), sd(t(q), t(k), t(v)), "sdpa")
        close(refs.sdpa(q, k, v, mask=mask), sd(t(q), t(k), t(v), attn_mask=torch.from_numpy(mask)), "sdpa bool mask")
        close(refs.sdpa(q, k, v, mask=bias), sd(t(q), t(k), t(v), attn_mask=t(bias)), "sdpa float mask")
        close(refs.sdpa(q, k, v, is_causal=True), sd(t(q), t(k), t(v), is_causal=True), "sdpa is_causal")
        from torch.nn.attention.bias import causal_lower_right
        close(refs.sdpa(q, k, v, is_causal=True, causal_align="bottom_right"),
              sd(t(q), t(k), t(v), attn_mask=causal_lower_right(4, 5)), "sdpa is_causal bottom-right")
        E, H = 6, 3
        mha = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
        xs = rng.standard_normal((2, 4, E))
        wi, bi = mha.in_proj_weight.detach().numpy(), mha.in_proj_bias.detach().numpy()
        ws = [a for i in range(3) for a in (wi[i * E:(i + 1) * E], bi[i * E:(i + 1) * E])]
        ws += [mha.out_proj.weight.detach().numpy(), mha.out_proj.bias.detach().numpy()]
        causal = np.tril(np.ones((4, 4), bool))
        ours = refs.multi_head_attention(xs, xs, xs, *ws, num_heads=H, mask=causal)
        theirs = mha(t(xs), t(xs), t(xs), attn_mask=torch.from_numpy(~causal), need_weights=False)[0]
        close(ours, theirs, "multi_head_attention")
        pad = np.array([[False, False, True, True], [False, False, False, False]])
        ours = refs.multi_head_attention(xs, xs, xs, *ws, num_heads=H, key_padding_mask=pad)
        theirs = mha(t(xs), t(xs), t(xs), key_padding_mask=torch.from_numpy(pad), need_weights=False)[0]
        close(ours, theirs, "multi_head_attention key_padding_mask")
    elif family == "optimizers":
        for name, kw in [("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
                         ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
                         ("Adam", dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.05)),
                         ("AdamW", dict(lr=0.01, weight_decay=0.1))]:
            ours = [rng.standard_normal((3, 2))]
            theirs = [t(ours[0]).requires_grad_(True)]
            ref, opt = refs.ReferenceOptimizer(name, **kw), getattr(torch.optim, name)(theirs, **kw)
            for _ in range(6):
                g = ours[0] - 2.0  # the gradient of |p - 2|^2 / 2, the same on both sides
                theirs[0].grad = t(theirs[0].detach().numpy() - 2.0)
                ref.step(ours, [g])
                opt.step()
            close(ours[0], theirs[0], f"{name}({kw}) after 6 steps", tol=1e-10)
    elif family == "schedules_and_clip":
        p = torch.nn.Parameter(torch.zeros(1))
        for make, ref in [(lambda o: torch.optim.lr_scheduler.StepLR(o, 3, gamma=0.5), lambda e: refs.step_lr(0.2, e, 3, 0.5)),
                          (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 5, eta_min=0.01),
                           lambda e: refs.cosine_lr(0.2, e, 5, 0.01)),
                          (lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, total_iters=4),
                           lambda e: refs.linear_warmup_lr(0.2, e, 4, 0.1))]:
            opt = torch.optim.SGD([p], lr=0.2)
            sched = make(opt)
            for epoch in range(12):
                close(ref(epoch), opt.param_groups[0]["lr"], f"schedule at epoch {epoch}", tol=1e-9)
                opt.step()
                sched.step()
        grads = [rng.standard_normal((3, 2)), None, rng.standard_normal(4)]
        ps = [torch.nn.Parameter(torch.zeros(g.shape if g is not None else 1, dtype=torch.float64)) for g in grads]
        for q, g in zip(ps, grads):
            q.grad = None if g is None else t(g)
        norm = torch.nn.utils.clip_grad_norm_(ps, 0.5)
        clipped, total = refs.clip_by_total_norm(grads, 0.5)
        close(total, norm, "clip_by_total_norm norm")
        for c, q in zip(clipped, ps):
            if c is not None:
                close(c, q.grad, "clip_by_total_norm gradients")
