"""The trusted checks (tito.probes, tito.trusted) without a notebook run: probes over exported code.

- every graded exercise of every module has a probe (a new module's graded cell without one fails here);
- per module, the instructor's solution passes every check and the release's stubs fail every check;
- differently written correct solutions keep full marks (another traversal order, attention written
  another way, sigmoid and softmax by other formulas);
- one bug is charged once: a `merge_pair` or im2col bug fails its own exercise only;
- the mutation proof: the trusted verdicts catch at least 90% of the catalogue of realistic one-line bugs
  (tests/support/mutation.py's for 06-09, the bugs issue 14 found ungraded in 06-13, and LATER's for 12 and 14-20).
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.mutation import MUTATIONS, Mutation, apply_mutation
from tito import notebooks as nbs
from tito import probes as P
from tito.course import Settings, load_modules
from tito.trusted import Plan

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR = Settings.load(ROOT).edition == "instructor"
MODULES = {m.number: m for m in load_modules(ROOT)}
pytestmark = pytest.mark.skipif(not INSTRUCTOR, reason="needs the instructor notebooks (the reference)")

_PLANS: dict[str, Plan] = {}


def plan(number: str) -> Plan:
    if number not in _PLANS:
        _PLANS[number] = Plan.make(ROOT, MODULES[number], seed=20240601)
    return _PLANS[number]


def graded_exercises(module) -> list[str]:
    return [P.exercise_of(nbs.exercise_label(c)) for c in nbs.read(module.notebook).cells if nbs.is_test_cell(c)]


def verdicts(number: str, text: str, exercises=None) -> dict[str, str]:
    """The trusted verdicts on `text` as module `number`'s exported code (all exercises, or `exercises`)."""
    p = plan(number)
    groups = [{"exercises": [e for e in g["exercises"] if exercises is None or e in exercises], "sources": g["sources"]}
              for g in p.groups]
    groups = [g for g in groups if g["exercises"]]
    with tempfile.TemporaryDirectory(prefix="tito-trusted-test-") as tmp:
        pkg = Path(tmp) / "pkg"
        shutil.copytree(ROOT / "tinytorch", pkg / "tinytorch", ignore=shutil.ignore_patterns("__pycache__"))
        (pkg / p.package_rel).write_text(text, encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg), str(ROOT)]), OPENBLAS_NUM_THREADS="1",
                   PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
        raw = P.run_groups(p.base(), groups, sys.executable, env, Path(tmp) / "work", 600)
    out = p.verdicts(raw)
    return {e: w for e, w in out.items() if exercises is None or e in exercises}


def exported(nb) -> str:
    text, skipped = P.exported_source(nb)
    assert not skipped, skipped
    return text


def with_solution(number: str, marker: str, code: str) -> str:
    """Module `number`'s solution with the solution region of the cell containing `marker` replaced by `code`."""
    nb = nbs.read(MODULES[number].notebook)
    cell = next(c for c in nb.cells if nbs.is_solution_cell(c) and marker in c.source)
    lines = cell.source.splitlines()
    i = next(k for k, ln in enumerate(lines) if nbs.BEGIN_SOLUTION in ln and k > next(
        j for j, l2 in enumerate(lines) if marker in l2))
    j = next(k for k in range(i, len(lines)) if nbs.END_SOLUTION in lines[k])
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    cell.source = "\n".join(lines[: i + 1] + [indent + ln if ln else ln for ln in code.strip("\n").splitlines()]
                            + lines[j:])
    return exported(nb)


# ------------------------------------------------------------------ coverage


def test_every_graded_exercise_has_a_probe():
    missing, unknown = [], []
    for number, module in MODULES.items():
        graded = graded_exercises(module)
        probes = P.module_probes(number)
        missing += [f"{module.slug}: Exercise {e}" for e in graded if e not in probes]
        unknown += [f"{module.slug}: probe {e}" for e in probes if e not in graded]
    assert not missing, ("graded exercises without a trusted probe (add them to tito/probes/mNN.py; see "
                         "modules/README.md, 'Trusted checks'): " + ", ".join(missing))
    assert not unknown, "probes of exercises that are not graded cells: " + ", ".join(unknown)


def test_probe_substitutes_name_existing_definitions():
    for number, module in MODULES.items():
        p = P.module_probes(number)
        if not p:
            continue
        text = exported(nbs.read(module.notebook))
        for probe in p.values():
            P.reference_sources(text, probe.uses)  # LookupError names a missing one


# ------------------------------------------------------------------ every module: solution passes, stubs fail


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(n for n in MODULES if P.module_probes(n)))
def test_solution_passes_and_stubs_fail(number):
    source = nbs.read(MODULES[number].notebook)
    good = verdicts(number, exported(source))
    assert all(not w for w in good.values()), {e: w for e, w in good.items() if w}
    stub = verdicts(number, exported(nbs.release(source)))
    assert all(stub.values()), f"checks that a stub passes: {[e for e, w in stub.items() if not w]}"


# ------------------------------------------------------------------ differently written, still correct

KAHN_BACKWARD = """
found, consumers, stack = {id(tensor): tensor}, {}, [tensor]
while stack:  # count the consumers of every tensor first (Kahn's algorithm), no DFS order
    t = stack.pop()
    node = t.grad_fn
    if node is None:
        continue
    if node.inputs is None:
        raise RuntimeError("backward: the graph was already released; pass retain_graph=True")
    for inp in node.inputs:
        if inp is not None and inp.requires_grad:
            consumers[id(inp)] = consumers.get(id(inp), 0) + 1
            if id(inp) not in found:
                found[id(inp)] = inp
                stack.append(inp)
grads, ready = {id(tensor): grad}, [tensor]
while ready:
    t = ready.pop(0)
    g = grads.pop(id(t), None)
    node = t.grad_fn
    if g is not None and (node is None or t._retains_grad):
        if t.grad is None:
            t.grad = Tensor(g.astype(t.data.dtype, copy=True), dtype=t.data.dtype)
        else:
            t.grad.data = t.grad.data + g
    if node is None:
        continue
    rule = node.rule if node.rule is not None else BACKWARD_RULES.get(node.op)
    if rule is None:
        raise RuntimeError(f"backward: no backward rule for op {node.op!r}")
    results = rule(g, node) if g is not None else [None] * len(node.inputs)
    for inp, ig in zip(node.inputs, results):
        if inp is None or not inp.requires_grad:
            continue
        if ig is not None:
            ig = ig if ig.shape == inp.data.shape else unbroadcast(ig, inp.data.shape)
            grads[id(inp)] = grads[id(inp)] + ig if id(inp) in grads else ig
        consumers[id(inp)] -= 1
        if consumers[id(inp)] == 0:
            ready.append(inp)
    if not retain_graph:
        node.inputs = None
        node.saved = None
"""

OTHER_ATTENTION = """
scale = 1.0 / math.sqrt(q.shape[-1])
scores = (q * scale) @ k.transpose(-1, -2)  # no attention_scores; every mask folded into an additive -inf bias
causal = causal_mask(q.shape[-2], k.shape[-2]) if is_causal else np.zeros((1, 1), dtype=bool)
boolean = m is not None and m.dtype == np.bool_
forbid = np.logical_or(causal, m) if boolean else causal
if m is not None and not boolean:
    scores = scores + Tensor(m, dtype=scores.dtype)
scores = scores + Tensor(np.where(forbid, -np.inf, 0.0).astype(scores.dtype))
return MaskedSoftmax.apply(scores, None) @ v
"""

CHOICE_SAMPLING = """
if temperature == 0:
    return np.argmax(logits, axis=1).astype(np.int64)
z = logits / temperature
if top_k is not None and top_k < z.shape[1]:
    kth = -np.sort(-z, axis=1)[:, top_k - 1:top_k]
    z = np.where(z >= kth, z, -np.inf)
p = np.exp(z - z.max(axis=1, keepdims=True))
p = p / p.sum(axis=1, keepdims=True)
return np.array([rng.choice(p.shape[1], p=row) for row in p], dtype=np.int64)
"""

FLIPPED_SVD = """
ut, sv, vtt = np.linalg.svd(linear.weight.data.astype(np.float64).T, full_matrices=False)
left, right = -vtt.T[:, :rank], -ut[:, :rank].T  # W = left diag(s) right, from the SVD of W^T, signs flipped
half = np.sqrt(sv[:rank])
a = Linear(n_in, rank, bias=False, rng=1)
a.weight = Tensor((right * half[:, None]).astype(np.float32), requires_grad=True)
b = Linear(rank, n_out, bias=linear.bias is not None, rng=1)
b.weight = Tensor((left * half[None, :]).astype(np.float32), requires_grad=True)
if b.bias is not None:
    b.bias = Tensor(np.array(linear.bias.data), requires_grad=True)
return Sequential(*[a, b])
"""


@pytest.mark.slow
@pytest.mark.parametrize("number, marker, code, exercises", [
    ("06", "def backward(", KAHN_BACKWARD, ["6.4"]),
    ("12", "def scaled_dot_product_attention(", OTHER_ATTENTION, ["12.5"]),
    ("02", "class Sigmoid(", "a = x.data\ne = np.exp(-np.abs(a))\nout = np.where(a >= 0, 1 / (1 + e), e / (1 + e))",
     ["2.2"]),
    ("09", "def conv2d_loop(", "out, _ = conv2d_forward(x, weight, bias, stride, padding)\nreturn out", ["9.1"]),
    ("13", "def sample_next(", CHOICE_SAMPLING, ["13.4"]),
    ("16", "def low_rank(", FLIPPED_SVD, ["16.4"]),
], ids=["06-kahn-traversal", "12-attention-other-masking-and-softmax", "02-sigmoid-where", "09-loop-via-im2col",
        "13-sampling-with-choice", "16-svd-other-signs"])
def test_differently_written_solutions_keep_full_marks(number, marker, code, exercises):
    got = verdicts(number, with_solution(number, marker, code), exercises)
    assert all(not w for w in got.values()), got


# ------------------------------------------------------------------ one bug, charged once


@pytest.mark.slow
@pytest.mark.parametrize("mutation, others", [
    (Mutation("10", "text/tokenizers.py", "merge_pair", "i += 2", "i += 1", "merged pairs overlap", "10.3"),
     ["10.4", "10.5", "10.6"]),
    (Mutation("09", "core/spatial.py", "im2col", "transpose(1, 4, 5, 0, 2, 3)", "transpose(4, 5, 1, 0, 2, 3)",
              "im2col rows in (kh, kw, C) order", "9.2"), ["9.3", "9.4"]),
    (Mutation("12", "core/attention.py", "MaskedSoftmax.forward", "where=z > 0)", "where=z >= 0)",
              "a fully masked row divides 0 by 0", "12.3"), ["12.4", "12.5", "12.7"]),
    (Mutation("13", "models/gpt.py", "LayerNormFunction.forward", "(centred * centred).mean(axis=-1, keepdims=True) + eps",
              "(centred * centred).mean(axis=-1, keepdims=True) + 1e-2", "eps ignored", "13.1"),
     ["13.2", "13.3", "13.5", "13.6"]),
    (Mutation("14", "perf/profiler.py", "op_flops", "2 * math.prod(output_shape) * input_shapes[0][-1]",
              "math.prod(output_shape) * input_shapes[0][-1]", "matmul FLOPs without the factor 2", "14.1"),
     ["14.3", "14.5"]),
    (Mutation("15", "perf/quantization.py", "quantize", "np.rint(a * inv_scale",
              "np.floor(a * inv_scale", "quantize floors", "15.3"), ["15.5"]),
], ids=["merge_pair", "im2col-row-order", "masked-softmax", "layernorm-eps", "op-flops", "quantize-floor"])
def test_a_bug_is_charged_to_its_own_exercise_only(mutation, others):
    got = verdicts(mutation.module, mutated(mutation), [mutation.exercise, *others])
    assert got[mutation.exercise], f"{mutation.why}: not caught by Exercise {mutation.exercise}"
    assert all(not got[e] for e in others), {e: got[e] for e in others}


# ------------------------------------------------------------------ the mutation proof

GPT, ATT = "models/gpt.py", "core/attention.py"
ISSUE_14 = [  # the bugs issue 14 found scoring full marks in the graded cells (13's temperature bug: MUTATIONS)
    Mutation("06", "core/autograd.py", "backward", "ig.shape != inp.data.shape", "ig.ndim != inp.data.ndim",
             "unbroadcast only when the rank differs", "6.4"),
    Mutation("06", "core/autograd.py", "backward", "Tensor(np.array(g, dtype=t.data.dtype), dtype",
             "Tensor(g, dtype", "a leaf's .grad shares the rule's buffer", "6.4"),
    Mutation("08", "core/training.py", "clip_grad_norm_", "max_norm / (total + 1e-6)", "max_norm / total",
             "division by zero on all-zero gradients", "8.2"),
    Mutation("09", "core/spatial.py", "MaxPool2dFunction.forward", "(value > best) | np.isnan(value)", "(value > best)",
             "a NaN's gradient routed elsewhere", "9.5"),
    Mutation("13", GPT, "sample_next", "np.where(logits < kth,", "np.where(logits <= kth,", "top-k keeps k-1", "13.4"),
    Mutation("13", GPT, "GPT.generate", "sample_next(logits, temperature, top_k, rng)",
             "sample_next(logits, temperature, top_k, seed)", "a fresh generator from the seed at every step", "13.6"),
    Mutation("13", GPT, "LayerNormFunction.forward", "np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)",
             "(np.sqrt((centred * centred).mean(axis=-1, keepdims=True)) + eps)", "eps outside the square root",
             "13.1"),
    Mutation("13", GPT, "TransformerBlock.forward", "self.drop(self.attn(", "(self.attn(",
             "no dropout on the attention branch", "13.3"),
    Mutation("13", GPT, "GPT.forward", "start_pos=start_pos, positions=positions", "positions=positions",
             "positions always start at 0 (start_pos ignored with a cache)", "13.5"),
    Mutation("12", ATT, "attention_scores", "(1.0 / math.sqrt(q.shape[-1]))",
             "(1.0 / q.shape[-1])", "scaled by 1/d instead of 1/sqrt(d)", "12.1"),
    Mutation("10", "text/tokenizers.py", "merge_pair", "i += 2", "i += 1", "merged pairs overlap", "10.3"),
]
PROF, QUANT, COMP = "perf/profiler.py", "perf/quantization.py", "perf/compression.py"
LATER = [  # realistic one-line bugs of modules 12, 14-16 and 19 (their probes came after issue 14)
    Mutation("12", ATT, "causal_mask", 'k_len - q_len if align', "0 if align",
             "causal mask aligned top-left by default (wrong with a KV cache)", "12.2"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "np.exp(s - np.where(np.isfinite(m), m, 0.0))", "np.exp(s)",
             "softmax without max subtraction (NaN on large scores)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "where=z > 0)", "where=z >= 0)",
             "a fully masked row divides 0 by 0 (NaN)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.forward", "np.divide(e, z, out=np.zeros_like(e), where=z > 0)",
             "np.nan_to_num(e / z)", "0 / 0 on fully masked rows, hidden by nan_to_num (warns)", "12.3"),
    Mutation("12", ATT, "MaskedSoftmax.backward", "w * (grad - np.sum(grad * w, axis=-1, keepdims=True))",
             "w * grad", "softmax backward without the row-sum term", "12.4"),
    Mutation("12", ATT, "scaled_dot_product_attention", "else (masked | m)",
             "else masked", "a boolean mask ignored when is_causal", "12.5"),
    Mutation("12", ATT, "MultiHeadAttention.merge_heads", "x.transpose(1, 2).reshape(b, t, h * d)",
             "x.reshape(b, t, h * d)", "heads merged in the wrong order (no transpose back)", "12.6"),
    Mutation("12", ATT, "MultiHeadAttention.forward", "self.k_proj(key)",
             "self.k_proj(query)", "keys projected from the queries (cross-attention broken)",
             "12.7"),
    Mutation("14", PROF, "op_flops", "2 * math.prod(output_shape) * input_shapes[0][-1]",
             "math.prod(output_shape) * input_shapes[0][-1]", "matmul FLOPs without the factor 2", "14.1"),
    Mutation("14", PROF, "op_bytes", "any(np.may_share_memory(out, a) for a in arrays)", "False",
             "views counted as reads and writes", "14.2"),
    Mutation("14", PROF, "FlopCounter.__call__", "entry[1] += other", "entry[1] = other",
             "other FLOPs overwritten instead of added", "14.3"),
    Mutation("14", PROF, "ModulePaths.attach", "module.register_forward_hook(self.pop)",
             "module.register_forward_pre_hook(lambda *args: None)", "no forward hook pops the path", "14.4"),
    Mutation("14", PROF, "Profiler._on_op", 'self._stack[-1] if self._stack',
             'self._stack[0] if self._stack', "op charged to the outermost module", "14.5"),
    Mutation("14", PROF, "summarize", "e.bytes_read + e.bytes_written", "e.bytes_read",
             "bytes without the writes", "14.6"),
    Mutation("14", PROF, "amdahl", "(1.0 - fraction) + fraction / speedup",
             "fraction + (1.0 - fraction) / speedup", "Amdahl with the fractions swapped", "14.7"),
    Mutation("15", QUANT, "to_bfloat16", "(u + np.uint32(0x7FFF) + last_kept_bit)",
             "u", "bf16 rounding by truncation", "15.1"),
    Mutation("15", QUANT, "GradScaler.update", "good_steps == self.growth_interval",
             "good_steps > self.growth_interval", "the scale grows one good step late", "15.2"),
    Mutation("15", QUANT, "quantize", "np.rint(a * inv_scale + z.astype(np.float32))",
             "np.trunc(a * inv_scale + z + np.copysign(0.5, a * inv_scale + z))",
             "rounding half away from zero", "15.3"),
    Mutation("15", QUANT, "compute_qparams", "qmin - np.rint(lo / scale)",
             "qmin + np.rint(lo / scale)",
             "zero point with the wrong sign", "15.4"),
    Mutation("15", QUANT, "QuantizedLinear.forward", "qx.astype(np.int32) - np.int32(self.input_zero_point)",
             "qx.astype(np.int32)", "the input zero point not subtracted", "15.5"),
    Mutation("15", QUANT, "ternarize", "np.clip(np.rint(a / scale), -1, 1)",
             "np.sign(a)", "binarized instead of ternarized (no zeros)", "15.6"),
    Mutation("16", COMP, "magnitude_mask", "np.argpartition(np.abs(w).ravel(), k - 1)",
             "np.argpartition(-np.abs(w).ravel(), k - 1)", "pruning the largest weights", "16.1"),
    Mutation("16", COMP, "global_magnitude_masks", "np.abs(w).ravel() for w in ws",
             "(np.abs(w) / np.abs(w).max()).ravel() for w in ws",
             "scores normalised per array (not one global threshold)", "16.2"),
    Mutation("16", COMP, "prune_neurons", "next_layer.weight.data[:, keep]",
             "next_layer.weight.data[:, :n_keep]",
             "the next layer keeps the first columns, not the kept units'", "16.3"),
    Mutation("16", COMP, "low_rank", "(root[:, None] * vt[:rank])",
             "(root[:, None] ** 2 * vt[:rank])",
             "all of s in the first factor (and s^1.5 in the product)", "16.4"),
    Mutation("16", COMP, "distillation_loss", "kl * ((1.0 - alpha) * T * T)",
             "kl * (1.0 - alpha)", "distillation without T^2", "16.5"),
    Mutation("19", "perf/benchmark.py", "calibrate", "(1, 2, 5)", "(1, 2, 4)",
             "loop sizes 1, 2, 4 instead of timeit's 1, 2, 5", "19.1"),
    Mutation("19", "perf/benchmark.py", "calibrate", "float(duration)", "float(duration / number)",
             "seconds per call returned instead of the loop's duration", "19.1"),
    Mutation("19", "perf/benchmark.py", "bootstrap_median_ci", "size=(n_resamples, x.size)",
             "size=(x.size, n_resamples)", "resamples laid out transposed (medians over the wrong axis)", "19.2"),
    Mutation("19", "perf/benchmark.py", "bootstrap_median_ci", "[50 * (1 - confidence)", "[100 * (1 - confidence)",
             "the whole tail probability cut from the low end", "19.2"),
    Mutation("19", "perf/benchmark.py", "compare", "np.median(xb) / np.median(xa)", "np.median(xa) / np.median(xb)",
             "the ratio inverted (slower reported as faster)", "19.3"),
    Mutation("19", "perf/benchmark.py", "compare", "np.median(xa[ia], axis=1)", "np.median(xa[ib % xa.size], axis=1)",
             "both runs resampled with the same indices", "19.3"),
    Mutation("19", "perf/benchmark.py", "pareto_front", "np.any(no_worse & better, axis=0)",
             "np.any(no_worse & better, axis=1)", "dominates and dominated swapped (wrong axis)", "19.4"),
    Mutation("19", "perf/benchmark.py", "pareto_front", "np.any(c[:, None, :] < c[None, :, :], axis=2)",
             "np.all(c[:, None, :] < c[None, :, :], axis=2)", "strictly better required in every objective", "19.4"),
]
ACC, KV, SRV = "perf/acceleration.py", "perf/kv_cache.py", "serving/server.py"
LATER += [  # modules 17, 18 and 20
    Mutation("17", ACC, "dead_code_elimination", "for n in reversed(graph.nodes):", "for n in graph.nodes:",
             "DCE walks forwards: the producers of an output's arguments are dropped", "17.1"),
    Mutation("17", ACC, "dead_code_elimination", "live.update(n.args)", "live.update(n.args[:1])",
             "DCE keeps only the first argument's producer alive", "17.1"),
    Mutation("17", ACC, "constant_fold", "args = tuple(rename.get(a, a) for a in n.args)", "args = n.args",
             "uses of a folded node not renamed (chained folds break)", "17.2"),
    Mutation("17", ACC, "constant_fold", "out.outputs = [rename.get(o, o) for o in graph.outputs]",
             "out.outputs = list(graph.outputs)", "a folded output keeps its old name", "17.2"),
    Mutation("17", ACC, "common_subexpression_elimination", "key = (n.op, args, _attr_key(n.attrs))",
             "key = (n.op, args)", "CSE key without the attrs (sum over axis 0 merged with axis 1)", "17.3"),
    Mutation("17", ACC, "common_subexpression_elimination", "args = tuple(rename.get(a, a) for a in n.args)",
             "args = n.args", "CSE does not cascade (arguments not renamed)", "17.3"),
    Mutation("17", ACC, "fusion_groups", "uses[a] == 1 and a not in outputs", "uses[a] == 1",
             "a graph output fused inside a group", "17.4"),
    Mutation("17", ACC, "fusion_groups", "uses[a] == 1 and", "uses[a] >= 1 and",
             "a producer with several consumers fused into one of them", "17.4"),
    Mutation("17", ACC, "fusion_groups", "for a in set(n.args):", "for a in n.args:",
             "uses counted per argument slot (x * x counts x twice)", "17.4"),
    Mutation("17", ACC, "c_expression", '"(1.0f / (1.0f + expf(-{a})))"', '"(1.0f / (1.0f + expf({a})))"',
             "sigmoid with e^a instead of e^-a", "17.5"),
    Mutation("17", ACC, "c_expression", '"abs": "fabsf({a})"', '"abs": "abs({a})"',
             "C's integer abs on a float (truncates)", "17.5"),
    Mutation("17", ACC, "naive_matmul", "float(a[i, p]) * float(b[p, j])", "float(a[i, p]) * float(b[j, p])",
             "B indexed transposed", "17.6"),
    Mutation("17", ACC, "naive_matmul", "for p in range(k):", "for p in range(k - 1):",
             "inner loop one short", "17.6"),
    Mutation("17", ACC, "block_size_for", "cache_bytes // (3 * itemsize)", "cache_bytes // (2 * itemsize)",
             "tiles of A and B only (C's tile forgotten)", "17.7"),
    Mutation("17", ACC, "block_size_for", "1 << (t.bit_length() - 1)", "1 << t.bit_length()",
             "power of two rounded up (the tiles no longer fit)", "17.7"),
    Mutation("18", KV, "KVCache.update", "self.k[:, :, start:end] = k", "self.k[:, :, :k.shape[2]] = k",
             "new keys written at position 0 instead of seq_len", "18.1"),
    Mutation("18", KV, "KVCache.update", "Tensor(self.k[:, :, :end])", "Tensor(self.k[:, :, start:end])",
             "only the new keys returned, not every cached one", "18.1"),
    Mutation("18", KV, "KVCache.update", "self.seq_len = end", "self.seq_len = k.shape[2]",
             "seq_len set to the new count instead of advanced", "18.1"),
    Mutation("18", KV, "cached_decode", "model(nxt[:, None], start_pos=pos, cache=caches)",
             "model(nxt[:, None], cache=caches)", "decode steps without start_pos", "18.2"),
    Mutation("18", KV, "cached_decode", "if step == max_new_tokens - 1:", "if step == max_new_tokens:",
             "one model call after the last token", "18.2"),
    Mutation("18", KV, "cached_decode", "idx[:, -model.context_length:]", "idx[:, -model.context_length + 1:]",
             "the refill after the context limit drops one token too many", "18.2"),
    Mutation("18", KV, "PagedKVCache.allocate", "-(-num_tokens // self.block_size)", "num_tokens // self.block_size",
             "blocks counted with floor division (a partial block is not allocated)", "18.3"),
    Mutation("18", KV, "PagedKVCache.allocate", "if missing > len(self.free_blocks):",
             "if missing >= len(self.free_blocks):", "refused when exactly enough blocks are free", "18.3"),
    Mutation("18", KV, "PagedKVCache.allocate", "self.free_blocks.pop()", "self.free_blocks.pop(0)",
             "blocks taken from the bottom of the free list (freed blocks not reused first)", "18.3"),
    Mutation("18", KV, "PagedKVCache.write", "np.arange(start, start + k.shape[1])", "np.arange(k.shape[1])",
             "paged write at position 0 instead of the sequence's length", "18.4"),
    Mutation("18", KV, "PagedKVCache.gather", "table[: -(-t // self.block_size)]", "table[: t // self.block_size]",
             "the last, partly filled block not gathered", "18.4"),
    Mutation("18", KV, "PagedKVCache.gather", "self.k_pool[layer, used].transpose(1, 0, 2, 3)",
             "self.k_pool[layer, used]", "blocks and heads not swapped before the reshape (wrong axis)", "18.4"),
    Mutation("18", KV, "CheckpointFunction.backward", "set_grad_enabled(True)", "set_grad_enabled(previous)",
             "recomputation under the caller's grad mode (nothing recorded under no_grad)", "18.5"),
    Mutation("18", KV, "CheckpointFunction.backward", "ctx.needs_input_grad[1:]", "ctx.needs_input_grad",
             "needs_input_grad read from fn's slot (off by one)", "18.5"),
    Mutation("18", KV, "CheckpointFunction.backward", "backward(out, grad)", "backward(out.sum())",
             "the upstream gradient ignored (ones instead)", "18.5"),
    Mutation("20", SRV, "batch_window", "now - pending[0][0] >= max_wait", "now - pending[0][0] > max_wait",
             "waits while the oldest has waited exactly max_wait (and forever with max_wait 0)", "20.1"),
    Mutation("20", SRV, "batch_window", "len(pending) >= max_batch_size", "len(pending) > max_batch_size",
             "a full batch waits for one more request", "20.1"),
    Mutation("20", SRV, "batch_window", "range(min(len(pending), max_batch_size))", "range(len(pending))",
             "everything pending dispatched, past max_batch_size", "20.1"),
    Mutation("20", SRV, "batch_window", "now - pending[0][0] > max_queue_delay", "now - pending[0][0] >= max_queue_delay",
             "a request that waited exactly max_queue_delay refused", "20.1"),
    Mutation("20", SRV, "batch_window", "pending[0][0] + max_wait if pending", "pending[-1][0] + max_wait if pending",
             "the next wake-up timed from the newest request", "20.1"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.in_system >= self.max_in_system",
             "self.in_system > self.max_in_system", "admits one more than the bound", "20.2"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.predicted_wait(seconds_per_request) > self.max_wait",
             "self.predicted_wait(seconds_per_request) >= self.max_wait", "a predicted wait of exactly max_wait refused",
             "20.2"),
    Mutation("20", SRV, "AdmissionController.try_admit", "self.late += 1", "self.rejected += 1",
             "a late refusal counted as a full system", "20.2"),
    Mutation("20", SRV, "AdmissionController.predicted_wait", "self.in_system * float(seconds_per_request)",
             "(self.in_system + 1) * float(seconds_per_request)", "the new request counted as ahead of itself", "20.2"),
    Mutation("20", SRV, "AdmissionController.retry_after", "math.ceil(", "round(",
             "Retry-After rounded to nearest instead of up", "20.2"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "self.preempt(self.running[-1])", "self.preempt(self.running[0])",
             "the oldest running sequence preempted instead of the latest to join", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "len(self.running) < self.max_batch_size",
             "len(self.running) <= self.max_batch_size", "one sequence more than max_batch_size runs", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", 'self.policy == "continuous" or not self.running',
             'self.policy == "continuous"', "static batching never admits anybody", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "self.blocks_needed(self.waiting[0]) <= self.pool.num_free_blocks",
             "self.blocks_needed(self.waiting[0]) < self.pool.num_free_blocks",
             "a joiner refused when exactly enough blocks are free", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.schedule", "if need <= self.pool.num_free_blocks:",
             "if True:", "a running sequence's blocks taken without checking the pool (never preempts)", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.preempt", "self.waiting.appendleft(seq)", "self.waiting.append(seq)",
             "a preempted sequence sent to the back of the queue", "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.leave", "self.pool.free(seq.id)", "self.pool.block_tables[seq.id].clear()",
             "a finished sequence's blocks dropped from its table, never returned to the pool (a forgotten free)",
             "20.3"),
    Mutation("20", SRV, "ContinuousBatcher.abort", "self.pool.free(seq.id)", "pass",
             "an aborted running sequence keeps its blocks", "20.3"),
    Mutation("20", SRV, "pack_rows", "longest + wide <= context_length", "longest + wide <= context_length + 1",
             "a call one position longer than the context allowed", "20.4"),
    Mutation("20", SRV, "pack_rows", "longest + wide <= context_length and ", "",
             "rows packed without checking the context (issue 31's prefix-cache crash)", "20.4"),
    Mutation("20", SRV, "pack_rows", "- tokens <= pack_padding", "- tokens < pack_padding",
             "padding of exactly pack_padding refused", "20.4"),
    Mutation("20", SRV, "pack_rows", "(len(call) + 1) * wide", "len(call) * wide",
             "the padding counted without the joining row", "20.4"),
    Mutation("20", SRV, "call_layout", "ids[i, width - len(new):] = new", "ids[i, -len(new):] = new",
             "new tokens placed with a negative slice (-0 is the whole row)", "20.4"),
    Mutation("20", SRV, "call_layout", "mask[i, start + width - len(new):] = 1", "mask[i, start:] = 1",
             "the padding before a row's new tokens left visible", "20.4"),
    Mutation("20", SRV, "slot_mapping", "first = np.cumsum(counts) - counts", "first = np.cumsum(counts)",
             "each row's first token indexed one row late", "20.5"),
    Mutation("20", SRV, "slot_mapping", "past[rows] + np.arange(len(rows)) - first[rows]",
             "np.arange(len(rows)) - first[rows]", "positions counted from 0, not after the cached ones", "20.5"),
    Mutation("20", SRV, "slot_mapping", "positions // block_size], positions % block_size",
             "positions % block_size], positions // block_size", "block and slot swapped", "20.5"),
    Mutation("20", SRV, "time_average_in_system", "np.maximum(a, start)", "a",
             "stays not cut at the window's start", "20.6"),
    Mutation("20", SRV, "time_average_in_system", "overlap.sum() / (end - start)", "overlap.mean()",
             "the mean stay overlap per request instead of per unit time", "20.6"),
    Mutation("20", SRV, "time_average_in_system", "(d < a).any()", "(d <= a).any()",
             "a zero-length stay refused as a departure before its arrival", "20.6"),
]
CATALOGUE = MUTATIONS + ISSUE_14 + LATER


def mutated(m: Mutation) -> str:
    """Module m.module's exported solution with `m` applied (the harness of tests/support/mutation.py)."""
    module = MODULES[m.module]
    text = exported(nbs.read(module.notebook))
    with tempfile.TemporaryDirectory(prefix="tito-mutant-") as tmp:
        pkg = Path(tmp) / "tinytorch"
        target = pkg / m.file
        target.parent.mkdir(parents=True)
        rel = plan(m.module).package_rel
        assert rel == f"tinytorch/{m.file}", (rel, m.file)
        target.write_text(text, encoding="utf-8")
        apply_mutation(pkg, m)
        return target.read_text(encoding="utf-8")


@pytest.mark.slow
def test_trusted_grade_catches_the_mutation_catalogue():
    caught, missed = [], []
    for m in CATALOGUE:
        why = verdicts(m.module, mutated(m), [m.exercise])[m.exercise]
        (caught if why else missed).append(f"{m.module} {m.function}: {m.why}" + (f" -> {why[:100]}" if why else ""))
    share = len(caught) / len(CATALOGUE)
    print("\n".join(["caught:", *caught, "missed:", *missed, f"{len(caught)}/{len(CATALOGUE)} = {share:.0%}"]))
    assert share >= 0.9, f"the trusted grade catches only {share:.0%} of the catalogue; missed: {missed}"
