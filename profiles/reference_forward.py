"""A tiny Llama-shaped forward in plain torch (CPU, float32) for checking step translation.

Why: `profiles.step_batch` turns simulator plans into positions, slot mappings and block tables.
If any of those is off (a wrong offset, a block table read past its end, a chunk boundary
mis-split) a GPU run still takes plausible time, so timing cannot catch it. This forward consumes
the same `StepMetadata` through a *paged* KV cache and must reproduce, token for token, what a
full recomputation without any cache gives. It uses plain matmul attention (no FlashAttention),
so it runs anywhere torch does.

`TinyLlama(...)`: random weights from a seeded generator. ``step(ids, meta)`` writes the step's
K/V at ``meta.slot_mapping`` in its paged cache ``[L, 2, num_blocks * block_size, kvh, d]`` and
returns the logits of each sequence's last token; ``full(ids)`` recomputes one sequence from
scratch and returns the logits of every position.
"""

from __future__ import annotations


class TinyLlama:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        layers: int = 2,
        hidden: int = 64,
        heads: int = 4,
        kv_heads: int = 2,
        vocab: int = 97,
        seed: int = 0,
    ):
        import torch

        self.torch = torch
        g = torch.Generator().manual_seed(seed)
        self.L, self.H, self.KVH, self.D = layers, heads, kv_heads, hidden // heads
        self.hidden, self.vocab, self.bs = hidden, vocab, block_size

        def w(*shape):
            return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

        qkv = (heads + 2 * kv_heads) * self.D
        self.layers = [
            {"qkv": w(qkv, hidden), "o": w(hidden, hidden), "up": w(2 * hidden, hidden),
             "down": w(hidden, hidden)}
            for _ in range(layers)
        ]  # fmt: skip
        self.embed = torch.randn(vocab, hidden, generator=g)
        self.head = w(vocab, hidden)
        self.cache = torch.full(
            (layers, 2, num_blocks * block_size, kv_heads, self.D), float("nan")
        )

    def _rope(self, x, pos):
        torch = self.torch
        half = self.D // 2
        inv = 1.0 / (10000.0 ** (torch.arange(half).float() / half))
        f = pos.float()[:, None] * inv[None, :]
        cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _layers(self, x, pos, attend):
        F = self.torch.nn.functional
        qs, ks = self.H * self.D, self.KVH * self.D
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (self.hidden,), eps=1e-5)
            qkv = h @ w["qkv"].T
            q = self._rope(qkv[:, :qs].view(-1, self.H, self.D), pos)
            k = self._rope(qkv[:, qs : qs + ks].view(-1, self.KVH, self.D), pos)
            v = qkv[:, qs + ks :].view(-1, self.KVH, self.D)
            a = attend(i, q, k, v)
            x = x + a.reshape(-1, qs) @ w["o"].T
            h = F.rms_norm(x, (self.hidden,), eps=1e-5)
            gu = h @ w["up"].T
            x = x + (F.silu(gu[:, : self.hidden]) * gu[:, self.hidden :]) @ w["down"].T
        return F.rms_norm(x, (self.hidden,), eps=1e-5) @ self.head.T

    def _attn(self, q, k, v, q_pos, k_pos):
        """Causal GQA attention of queries at q_pos over keys at k_pos (plain matmul)."""
        torch = self.torch
        rep = self.H // self.KVH
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * self.D**-0.5
        mask = k_pos[None, :] > q_pos[:, None]
        s = s.masked_fill(mask[None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)

    def step(self, ids: list[int], meta) -> object:
        """One engine step over the paged cache; returns ``[num_seqs, vocab]`` logits."""
        torch = self.torch
        pos = torch.tensor(meta.positions)
        slots = torch.tensor(meta.slot_mapping)
        bs = self.bs

        def attend(layer, q, k, v):
            kc, vc = self.cache[layer, 0], self.cache[layer, 1]
            kc[slots] = k
            vc[slots] = v
            outs = []
            for j, table in enumerate(meta.tables):
                n = meta.kv_lens[j]
                kv_pos = torch.arange(n)
                flat = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
                lo, hi = meta.cu_q[j], meta.cu_q[j + 1]
                outs.append(self._attn(q[lo:hi], kc[flat], vc[flat], pos[lo:hi], kv_pos))
            return torch.cat(outs, 0)

        with torch.no_grad():
            logits = self._layers(self.embed[torch.tensor(ids)], pos, attend)
        return logits[torch.tensor(meta.logit_rows)]

    def full(self, ids: list[int]) -> object:
        """Recompute one sequence without any cache; returns ``[len(ids), vocab]`` logits."""
        torch = self.torch
        pos = torch.arange(len(ids))

        def attend(layer, q, k, v):
            return self._attn(q, k, v, pos, pos)

        with torch.no_grad():
            return self._layers(self.embed[torch.tensor(ids)], pos, attend)
