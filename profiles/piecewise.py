"""Piecewise CUDA graphs for mixed steps (prefill chunks + decodes), as vLLM v1 runs them.

Why: an eager step launches ~15 kernels a layer from Python, and for small and medium mixed
steps that launch time (10-15 ms for 32 layers, more under CPU contention) exceeds the GPU time,
so the step's time is set by the host CPU, not the GPU. Production engines avoid this: vLLM v1
captures everything *except attention* as CUDA graphs for a fixed set of token counts (its
``cudagraph_capture_sizes``) and runs attention eagerly between the pieces, because attention's
launch shape depends on the batch's sequence lengths. This module does the same for
`profiles.torch_model.StepRunner`.

For each capture size T (tokens, padded up from the step's real count) there are L + 1 graphs:

    piece 0      embed, rotary tables, layer 0 up to attention (norm, QKV, rotary, KV write)
    piece l      layer l-1 after attention (O, residual, norm, MLP) + layer l up to attention
    piece L      layer L-1 after attention

and between pieces the eager FlashAttention calls of that layer (the same calls, with the same
metadata, as the eager forward and the op tables), writing into a static buffer the next piece
reads. The LM head and sampling run eagerly on the real rows only (their size is the number of
sequences, not tokens). Steps with more tokens than the largest size (`LARGEST_CAPTURE`) run
eagerly, as in vLLM: they are GPU-bound anyway, and padding them would cost more than the
launches it saves.

Invariants: all inputs and outputs of a graph are static buffers allocated outside the graphs'
memory pool (per capture size), so every tensor in the pool is an intermediate that is dead when
its graph ends, and the graphs can share one pool and replay in any order on one stream. Padded
token rows use position 0, token 0 and one reserved KV slot (``pad_slot``); they never touch a
real sequence's cache rows as long as that slot is not allocated to one (the runner keeps it out
of its own layouts; see ``StepRunner.pad_slot``). The piecewise and eager forwards produce the
same hidden states up to GEMM-algorithm rounding (tests/test_gpu_profile.py checks this).
"""

from __future__ import annotations

import time

#: the largest token count captured: above it a step runs eagerly. vLLM's default is also 512.
#: Measured on H200 Llama-3-8B (profiles/README.md): eager steps of >= ~512 tokens are already
#: within 3-5% of a whole-step graph, while padding a 1586-token step to 1664 cost 12%.
LARGEST_CAPTURE = 512


def capture_sizes(max_tokens: int, largest: int = LARGEST_CAPTURE) -> tuple[int, ...]:
    """Token counts graphs are captured for: 1, 2, 4, 8, then steps of 16 to 256, 32 to 512,
    64 to 1024 and 128 beyond, up to ``largest`` (padding adds at most 1/8 above 16 tokens, as
    vLLM's default sizes do), capped at ``max_tokens``."""
    sizes = [1, 2, 4, 8]
    for lo, hi, step in ((16, 256, 16), (288, 512, 32), (576, 1024, 64), (1152, 8192, 128)):
        sizes += range(lo, hi + 1, step)
    return tuple(s for s in sizes if s <= min(largest, max_tokens))


class PiecewiseGraphs:
    """The piecewise graphs of one StepRunner, one set per capture size (see module doc)."""

    def __init__(self, runner, sizes: tuple[int, ...], pool):
        self.r = runner
        self.sizes = tuple(sorted(sizes))
        self.pool = pool
        self.buckets: dict[int, dict] = {}
        t0 = time.perf_counter()
        for size in reversed(self.sizes):  # largest first: later captures reuse its pool blocks
            self.buckets[size] = self._capture(size)
        self.capture_s = time.perf_counter() - t0

    @property
    def largest(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def size_for(self, tokens: int) -> int | None:
        """The capture size a step of ``tokens`` tokens is padded to, or None (runs eagerly)."""
        for s in self.sizes:
            if s >= tokens:
                return s
        return None

    def num_graphs(self) -> int:
        return sum(len(b["graphs"]) for b in self.buckets.values())

    # ---- capture ------------------------------------------------------------------------------

    def _buffers(self, size: int) -> dict:
        r, torch = self.r, self.r.torch
        dev = r.dev
        return {
            "ids": torch.zeros(size, dtype=torch.long, device=dev),
            "pos": torch.zeros(size, dtype=torch.long, device=dev),
            "slots": torch.full((size,), r.pad_slot, dtype=torch.long, device=dev),
            "cos": torch.zeros(size, 1, r.D // 2, dtype=r.dtype, device=dev),
            "sin": torch.zeros(size, 1, r.D // 2, dtype=r.dtype, device=dev),
            "residual": torch.zeros(size, r.hidden, dtype=r.dtype, device=dev),
            "q": torch.zeros(size, r.H, r.D, dtype=r.dtype, device=dev),
            "attn": torch.zeros(size, r.H * r.D, dtype=r.dtype, device=dev),
        }

    def _pieces(self, b: dict) -> list:
        """The L + 1 piece functions of one capture size, reading and writing its buffers."""
        r = self.r

        def first():
            x, cos, sin = r._embed(b["ids"], b["pos"])
            b["cos"].copy_(cos)
            b["sin"].copy_(sin)
            b["residual"].copy_(x)
            b["q"].copy_(r._attn_in(0, x, b["cos"], b["sin"], b["slots"]))

        def middle(layer):
            def piece():
                res = r._attn_out(layer - 1, b["residual"], b["attn"])
                b["q"].copy_(r._attn_in(layer, res, b["cos"], b["sin"], b["slots"]))
                b["residual"].copy_(res)

            return piece

        def last():
            b["residual"].copy_(r._attn_out(r.L - 1, b["residual"], b["attn"]))

        return [first] + [middle(layer) for layer in range(1, r.L)] + [last]

    def _capture(self, size: int) -> dict:
        torch = self.r.torch
        b = self._buffers(size)
        pieces = self._pieces(b)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture (cuBLAS handles, workspaces)
            for piece in pieces:
                piece()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graphs = []
        for piece in pieces:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                piece()
            graphs.append(g)
        b["graphs"] = graphs
        b["n"] = 0  # real rows written by the last step (the rest hold padding)
        return b

    # ---- replay -------------------------------------------------------------------------------

    def run(self, args, hidden: bool = False):
        """One step from ``StepRunner.prepare``'s device inputs: copy them into the padded
        buffers, replay the pieces with eager attention between them, then sample."""
        ids, pos, slots, logit_rows, dec, pre = args
        n = ids.shape[0]
        size = self.size_for(n)
        if size is None:
            raise ValueError(f"step of {n} tokens exceeds the largest capture size {self.largest}")
        b = self.buckets[size]
        b["ids"][:n].copy_(ids)
        b["pos"][:n].copy_(pos)
        b["slots"][:n].copy_(slots)
        if b["n"] > n:  # rows a larger earlier step left behind: back to padding
            b["ids"][n : b["n"]].zero_()
            b["pos"][n : b["n"]].zero_()
            b["slots"][n : b["n"]].fill_(self.r.pad_slot)
        b["n"] = n
        q, attn = b["q"][:n], b["attn"]
        graphs = b["graphs"]
        for layer in range(self.r.L):
            graphs[layer].replay()
            self.r._attention(layer, q, dec, pre, out=attn)
        graphs[-1].replay()
        return self.r._sample(b["residual"][:n], logit_rows, hidden)
