"""The same cached generation written in PyTorch, for module 18's tests and benchmark.

`TorchCachedGPT(torch, model)` copies a tinytorch `GPT`'s weights (through the documented
parameter names) into torch tensors and runs the GPT functionally (`F.layer_norm`, `F.linear`,
`F.scaled_dot_product_attention`, tanh-GELU) with a preallocated cache per layer, `(B, H, T_max,
Dh)` written in place: what a PyTorch user writes for KV-cached decoding. `generate` samples
with the course's `sample_next` on the same generator, so tokens can be compared one for one.
"""
from __future__ import annotations

import numpy as np

from tinytorch.core.layers import as_generator
from tinytorch.models.gpt import sample_next


class TorchCachedGPT:
    def __init__(self, torch, model):
        self.torch, self.F = torch, torch.nn.functional
        p = {name: torch.tensor(t.data) for name, t in model.named_parameters()}
        self.p, self.L = p, len(model.blocks)
        self.H = model.blocks[0].attn.num_heads
        self.E = p["tok_emb.weight"].shape[1]
        self.Dh, self.C = self.E // self.H, model.context_length

    def new_cache(self, batch):
        z = lambda: self.torch.zeros(batch, self.H, self.C, self.Dh)  # noqa: E731
        return [[z(), z()] for _ in range(self.L)]

    def forward(self, ids, start_pos, cache):
        "Logits (B, T, V) of ids (B, T) at positions start_pos.., keys/values written into `cache`."
        torch, F, p = self.torch, self.F, self.p
        ids = torch.as_tensor(ids)
        b, t = ids.shape
        x = F.embedding(ids, p["tok_emb.weight"]) + p["pos_emb.weight"][start_pos:start_pos + t]
        end = start_pos + t
        for i in range(self.L):
            pre = f"blocks.{i}."
            h = F.layer_norm(x, (self.E,), p[pre + "ln1.weight"], p[pre + "ln1.bias"])
            q, k, v = (F.linear(h, p[pre + f"attn.{n}_proj.weight"], p[pre + f"attn.{n}_proj.bias"])
                       .view(b, t, self.H, self.Dh).transpose(1, 2) for n in "qkv")
            kc, vc = cache[i]
            kc[:, :, start_pos:end], vc[:, :, start_pos:end] = k, v
            mask = torch.ones(t, end, dtype=torch.bool).tril(diagonal=start_pos)   # bottom-right causal
            a = F.scaled_dot_product_attention(q, kc[:, :, :end], vc[:, :, :end], attn_mask=mask)
            a = a.transpose(1, 2).reshape(b, t, self.E)
            x = x + F.linear(a, p[pre + "attn.out_proj.weight"], p[pre + "attn.out_proj.bias"])
            h = F.layer_norm(x, (self.E,), p[pre + "ln2.weight"], p[pre + "ln2.bias"])
            h = F.gelu(F.linear(h, p[pre + "mlp.fc.weight"], p[pre + "mlp.fc.bias"]), approximate="tanh")
            x = x + F.linear(h, p[pre + "mlp.proj.weight"], p[pre + "mlp.proj.bias"])
        x = F.layer_norm(x, (self.E,), p["ln_f.weight"], p["ln_f.bias"])
        return F.linear(x, p["head.weight"])

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, seed=None):
        "Cached generation (prompt + new tokens within the context), sampling like `GPT.generate`."
        idx = np.array(idx, dtype=np.int64)
        if idx.shape[1] + max_new_tokens > self.C:
            raise ValueError("TorchCachedGPT.generate: prompt + new tokens must fit in the context")
        rng = as_generator(seed)
        with self.torch.inference_mode():
            cache = self.new_cache(idx.shape[0])
            logits = self.forward(idx, 0, cache)[:, -1]
            for i in range(max_new_tokens):
                nxt = sample_next(logits.numpy(), temperature, top_k, rng)
                idx = np.hstack((idx, nxt[:, None]))
                if i + 1 < max_new_tokens:
                    logits = self.forward(nxt[:, None], idx.shape[1] - 1, cache)[:, -1]
        return idx
