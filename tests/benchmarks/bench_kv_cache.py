"""KV-cached generation: tinytorch cached vs uncached vs the same cached generation in PyTorch, one process.

    python tests/benchmarks/bench_kv_cache.py [--threads N]

The 2017 milestone's model (2 blocks, width 96, 4 heads, vocabulary 65) with the context raised from
64 to 128, so that a 16-token prompt plus 64 new tokens (80) and a 128-token sequence fit without the
window sliding. Three ways to generate, seeded sampling (temperature 0.8, top-k 10), all checked
token-identical before they are timed:

- `GPT.generate` (module 13): the whole window again at every step;
- `generate_cached` (module 18): one prefill, then one token per step through preallocated `KVCache`s,
  with each forward run by the model itself (engine "eager": every op through the framework) and by
  `FusedGPT` (engine "fused": the same arithmetic on arrays, weights prepared once);
- PyTorch: `tests/support/torch_kv.py`, the same GPT written functionally in torch
  (`F.scaled_dot_product_attention` over a preallocated cache, `inference_mode`), sampling with
  the same `sample_next` on the same generator.

Then gradient checkpointing (`checkpoint`, module 18) on a training step (context 64, batch 32): peak
memory (`peak_memory`, tracemalloc: every NumPy buffer) and time of forward + cross-entropy +
backward, plain vs checkpointed, gradients checked equal (goals: peak <= 0.5x, time <= 1.4x), for the
milestone's 2-block model and the notebook's 4-block model. Placements: `checkpoint` around every
block; `checkpoint_sequential` per block (every block but the last, as PyTorch's: backward needs
the last block's activations first, so recomputing them costs a forward and saves no peak); and
`checkpoint_sequential` per residual branch (attention, MLP). With one checkpoint per block,
backward still holds one block's recomputed activations next to everything outside the blocks,
so a 2-block model can at best halve its block activations.

Both libraries run on the same number of threads (default 1). The variants are timed in interleaved
rounds (each round times each once), and the best round of each is kept (the least disturbed on a
shared machine); prints the ratios of the bests. Goals: cached >= 3x faster than uncached at 128
tokens, cached <= 0.6x PyTorch's time.
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    _threads = "1"
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            _threads = sys.argv[i + 1]
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, _threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tinytorch.models.gpt import GPT  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.perf.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402
from tinytorch.perf.kv_cache import generate_cached  # noqa: E402
from tinytorch.perf.measure import peak_memory, time_call  # noqa: E402

V, C, E, H, L = 65, 128, 96, 4, 2
SAMPLING = dict(temperature=0.8, top_k=10, seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="BLAS and torch threads for both (default 1)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = GPT(V, C, E, H, L, rng=0).eval()
    prompt = np.random.default_rng(0).integers(0, V, (1, 16))
    print(f"GPT {L} blocks x {E} dims, {H} heads, context {C}, vocab {V}: {model.num_parameters():,} parameters; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    try:
        import torch
        torch.set_num_threads(args.threads)
        from tests.support.torch_kv import TorchCachedGPT
        ref = TorchCachedGPT(torch, model)
    except ImportError:
        torch = ref = None
    for new in (64, 112):
        runs = {"uncached GPT.generate": lambda: model.generate(prompt, new, **SAMPLING),
                "cached, eager": lambda: generate_cached(model, prompt, new, **SAMPLING),
                "cached, fused": lambda: generate_cached(model, prompt, new, engine="fused", **SAMPLING)}
        if ref is not None:
            runs[f"PyTorch {torch.__version__} cached"] = lambda: ref.generate(prompt, new, **SAMPLING)
        tokens = {name: fn() for name, fn in runs.items()}
        for name, ids in tokens.items():
            assert np.array_equal(ids, tokens["uncached GPT.generate"]), f"{name}: tokens differ for {new} new tokens"
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.repeats):   # interleaved rounds: every variant sees the same machine load
            for name, fn in runs.items():
                best[name] = min(best[name], time_call(fn, repeats=1, min_repeat_time=0.05).best)
        print(f"16-token prompt + {new} new tokens ({16 + new} in all), all token-identical, best of {args.repeats} rounds:")
        for name, t in best.items():
            print(f"  {name:<26}: {t * 1e3:8.1f} ms ({t / new * 1e3:.3f} ms/token)")
        plain, eager, fused = best["uncached GPT.generate"], best["cached, eager"], best["cached, fused"]
        print(f"  cached / uncached speed-up: eager {plain / eager:.2f}x, fused {plain / fused:.2f}x"
              + (" (goal >= 3x at 128 tokens)" if new == 112 else ""))
        if ref is None:
            print("  PyTorch not installed: install the reference extra for the comparison")
            continue
        theirs = best[f"PyTorch {torch.__version__} cached"]
        print(f"  tinytorch cached / PyTorch cached ({torch.get_num_threads()} thread(s)): fused {fused / theirs:.2f}x "
              f"(goal <= 0.6x), eager {eager / theirs:.2f}x")

    bench_checkpoint(args.repeats)


def bench_checkpoint(repeats: int) -> None:
    """Peak memory and time of a training step (forward, cross-entropy, backward), plain vs checkpointed,
    for the milestone's 2-block model and the notebook's 4-block model, with the placements of the
    module docstring."""
    rng = np.random.default_rng(0)
    xb, yb = rng.integers(0, V, (32, 64)), rng.integers(0, V, (32, 64))

    def every_block(gpt, x):
        for block in gpt.blocks:
            x = checkpoint(block, x)
        return x

    def sequential_blocks(gpt, x):
        return checkpoint_sequential(gpt.blocks, len(gpt.blocks), x)

    def sequential_branches(gpt, x):   # TransformerBlock.forward's ops, one function per residual branch
        branches = []
        for b in gpt.blocks:
            branches.append(lambda h, b=b: h + b.drop(b.attn(b.ln1(h), is_causal=True)))
            branches.append(lambda h, b=b: h + b.mlp(b.ln2(h)))
        return checkpoint_sequential(branches, len(branches), x)

    print("GPT train step, width 96, 4 heads, batch 32 x 64 tokens; gradients identical to the plain step's; "
          "peak memory = tracemalloc's peak over the step (every NumPy buffer it allocates):")
    for layers, how, segments in ((L, "checkpoint around every block", every_block),
                                  (L, "checkpoint_sequential per block", sequential_blocks),
                                  (L, "checkpoint_sequential per residual branch", sequential_branches),
                                  (4, "checkpoint around every block", every_block),
                                  (4, "checkpoint_sequential per block", sequential_blocks)):
        gpt = GPT(V, 64, E, H, layers, rng=0)

        def step(use_checkpoint):
            for p in gpt.parameters():
                p.grad = None
            if use_checkpoint:
                logits = gpt.head(gpt.ln_f(segments(gpt, gpt.drop(gpt.pos_emb(gpt.tok_emb(xb))))))
            else:
                logits = gpt(xb)
            CrossEntropyLoss()(logits.reshape(-1, V), yb.reshape(-1)).backward()
            return [p.grad.data.copy() for p in gpt.parameters()]

        assert all(np.array_equal(a, b) for a, b in zip(step(False), step(True))), "checkpointed gradients differ"
        mem = {c: peak_memory(lambda: step(c)) for c in (False, True)}
        rounds = []
        for _ in range(repeats):   # interleaved rounds: plain, then checkpointed, on the same machine load
            rounds.append([time_call(lambda: step(c), repeats=1).best for c in (False, True)])
        plain, ckpt = (min(r[i] for r in rounds) for i in (0, 1))
        print(f"  {layers} blocks, {how}: peak {mem[False] / 1e6:.1f} -> {mem[True] / 1e6:.1f} MB = "
              f"{mem[True] / mem[False]:.2f}x (goal <= 0.5x); time {plain * 1e3:.0f} -> {ckpt * 1e3:.0f} ms = "
              f"{ckpt / plain:.2f}x, median of the rounds' ratios {np.median([c / p for p, c in rounds]):.2f}x "
              f"(goal <= 1.4x)")


if __name__ == "__main__":
    main()
