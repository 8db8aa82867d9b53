"""Tiny GPT train step: tinytorch vs PyTorch CPU, in one process.

    python tests/benchmarks/bench_gpt.py [--threads N]

The model of the course's issue: 2 layers, 4 heads, 128 dims, context 32, batch 16, vocabulary 65.
One step is forward, cross-entropy, backward and a plain SGD update of every parameter. PyTorch
runs the same architecture (nn.Embedding, nn.LayerNorm, nn.MultiheadAttention with a causal mask,
tanh-GELU MLP, a bias-free head). Both run on the same number of threads (default 1): the BLAS
threads of NumPy are set through OPENBLAS_NUM_THREADS/OMP_NUM_THREADS before NumPy is imported,
PyTorch's with torch.set_num_threads. (Multi-threaded BLAS on small matrices loses badly on a busy
2-core machine: each matmul pays for waking the threads.) Prints the median time of each and the
ratio.
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

from tinytorch.core.autograd import no_grad  # noqa: E402
from tinytorch.core.losses import CrossEntropyLoss  # noqa: E402
from tinytorch.models.gpt import GPT  # noqa: E402
from tinytorch.perf.measure import time_call  # noqa: E402

V, T, E, H, L, B = 65, 32, 128, 4, 2, 16


def tinytorch_step(model, x, y, lr=1e-3):
    loss = CrossEntropyLoss()(model(x).reshape(-1, V), y.reshape(-1))
    for p in model.parameters():
        p.grad = None
    loss.backward()
    with no_grad():
        for p in model.parameters():
            p.data -= lr * p.grad.data
    return loss


def torch_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
            self.attn = nn.MultiheadAttention(E, H, batch_first=True)
            self.fc, self.proj = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
            return x + self.proj(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(V, E), nn.Parameter(torch.zeros(T, E))
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f, self.head = nn.LayerNorm(E), nn.Linear(E, V, bias=False)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))

        def forward(self, idx):
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            for b in self.blocks:
                x = b(x, self.mask)
            x = self.ln_f(x)
            return self.head(x)

    return Net()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="BLAS and torch threads for both (default 1)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))
    model = GPT(V, T, E, H, L, rng=0)
    ours = time_call(lambda: tinytorch_step(model, x, y), repeats=7)
    print(f"GPT {L} layers x {E} dims, {H} heads, context {T}, batch {B}, vocab {V}: {model.num_parameters():,} parameters")
    print(f"  tinytorch train step: {ours.median * 1e3:8.2f} ms (median of {len(ours.times)}; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    try:
        import torch
    except ImportError:
        print("  PyTorch not installed: install the reference extra (pip install -e '.[reference]') for the ratio")
        return
    torch.set_num_threads(args.threads)
    net = torch_model(torch)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    tx, ty = torch.tensor(x), torch.tensor(y)

    def step():
        loss = torch.nn.functional.cross_entropy(net(tx).reshape(-1, V), ty.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    theirs = time_call(step, repeats=7)
    print(f"  PyTorch {torch.__version__} ({torch.get_num_threads()} thread(s)): {theirs.median * 1e3:8.2f} ms")
    print(f"  ratio tinytorch / PyTorch: {ours.median / theirs.median:.2f}x (goal: at most 2.5x)")


if __name__ == "__main__":
    main()
