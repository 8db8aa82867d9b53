"""KV-cached generation: tinytorch cached vs uncached vs the same cached generation in PyTorch, one process.

    python tests/benchmarks/bench_kv_cache.py [--threads N]

The 2017 milestone's model (2 blocks, width 96, 4 heads, vocabulary 65) with the context raised from
64 to 128, so that a 16-token prompt plus 64 new tokens (80) and a 128-token sequence fit without the
window sliding. Three ways to generate, seeded sampling (temperature 0.8, top-k 10), all checked
token-identical before they are timed:

- `GPT.generate` (module 13): the whole window again at every step;
- `generate_cached` (module 18): one prefill, then one token per step through preallocated `KVCache`s;
- PyTorch: `tests/support/torch_kv.py`, the same GPT written functionally in torch
  (`F.scaled_dot_product_attention` over a preallocated cache, `inference_mode`), sampling with
  the same `sample_next` on the same generator.

Then gradient checkpointing (`checkpoint`, module 18) on a training step of the milestone's model
(context 64, batch 32): peak memory (`peak_memory`, tracemalloc: every NumPy buffer) and time of
forward + cross-entropy + backward, plain vs one checkpoint per block, gradients checked equal
(goals: peak <= 0.5x, time <= 1.4x).

Both libraries run on the same number of threads (default 1). Prints the best of the repeats (the
least disturbed on a shared machine) and the ratios of the bests: goals cached >= 3x faster than uncached at 128 tokens, cached <= 0.6x PyTorch's time.
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
from tinytorch.perf.kv_cache import checkpoint, generate_cached  # noqa: E402
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
        plain_ids = model.generate(prompt, new, **SAMPLING)
        cached_ids = generate_cached(model, prompt, new, **SAMPLING)
        assert np.array_equal(plain_ids, cached_ids), f"cached tokens differ from generate's for {new} new tokens"
        plain = time_call(lambda: model.generate(prompt, new, **SAMPLING), repeats=args.repeats)
        cached = time_call(lambda: generate_cached(model, prompt, new, **SAMPLING), repeats=args.repeats)
        print(f"16-token prompt + {new} new tokens ({16 + new} in all), token-identical:")
        print(f"  uncached GPT.generate : {plain.best * 1e3:8.1f} ms ({plain.best / new * 1e3:.2f} ms/token)")
        print(f"  cached generate_cached: {cached.best * 1e3:8.1f} ms ({cached.best / new * 1e3:.2f} ms/token): "
              f"{plain.best / cached.best:.2f}x faster than uncached"
              + (" (goal >= 3x at 128 tokens)" if new == 112 else ""))
        if ref is None:
            print("  PyTorch not installed: install the reference extra for the comparison")
            continue
        torch_ids = ref.generate(prompt, new, **SAMPLING)
        assert np.array_equal(torch_ids, cached_ids), f"PyTorch's cached tokens differ for {new} new tokens"
        theirs = time_call(lambda: ref.generate(prompt, new, **SAMPLING), repeats=args.repeats)
        print(f"  PyTorch {torch.__version__} cached ({torch.get_num_threads()} thread(s)): {theirs.best * 1e3:8.1f} ms "
              f"({theirs.best / new * 1e3:.2f} ms/token), token-identical; tinytorch cached / PyTorch cached = "
              f"{cached.best / theirs.best:.2f}x (goal <= 0.6x)")

    bench_checkpoint(args.repeats)


def bench_checkpoint(repeats: int) -> None:
    gpt = GPT(V, 64, E, H, L, rng=0)
    rng = np.random.default_rng(0)
    xb, yb = rng.integers(0, V, (32, 64)), rng.integers(0, V, (32, 64))

    def step(use_checkpoint):
        for p in gpt.parameters():
            p.grad = None
        if use_checkpoint:
            x = gpt.drop(gpt.pos_emb(gpt.tok_emb(xb)))
            for block in gpt.blocks:
                x = checkpoint(block, x)
            logits = gpt.head(gpt.ln_f(x))
        else:
            logits = gpt(xb)
        CrossEntropyLoss()(logits.reshape(-1, V), yb.reshape(-1)).backward()
        return [p.grad.data.copy() for p in gpt.parameters()]

    assert all(np.array_equal(a, b) for a, b in zip(step(False), step(True))), "checkpointed gradients differ"
    mem = {c: peak_memory(lambda: step(c)) for c in (False, True)}
    t = {c: time_call(lambda: step(c), repeats=repeats).best for c in (False, True)}
    print(f"GPT train step, {L} blocks x {E}, batch 32 x 64 tokens, one checkpoint per block, gradients identical:")
    print(f"  peak memory: plain {mem[False] / 1e6:.1f} MB, checkpointed {mem[True] / 1e6:.1f} MB: "
          f"{mem[True] / mem[False]:.2f}x (goal <= 0.5x)")
    print(f"  time: plain {t[False] * 1e3:.0f} ms, checkpointed {t[True] * 1e3:.0f} ms: {t[True] / t[False]:.2f}x (goal <= 1.4x)")


if __name__ == "__main__":
    main()
