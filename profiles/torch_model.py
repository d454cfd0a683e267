"""A random-weight Llama-architecture forward that runs real engine steps on a GPU.

`StepRunner` executes one engine step (prefill chunks + decodes in one batch) the way a serving
engine does it, and returns its GPU time. It is used to measure whole steps for calibrating and
checking the profiled latency model, and is meant to be reused by a real-GPU executor.

What one step does (per layer): RMSNorm -> fused QKV GEMM (+bias for Qwen) -> rotary -> write the
new K/V into the KV cache at their slots -> FlashAttention (``torch.nn.attention.varlen``): one
causal call over all prefill chunks (queries attend to cached context + themselves) and one
NON-causal call over all decodes (query length 1; the causal flag would pick a slower kernel path
for the same result) -> O GEMM -> residual add -> RMSNorm -> fused gate/up GEMM -> SiLU-mul -> down
GEMM -> residual add. Then final RMSNorm and the LM head on the last token of each sequence, and
greedy sampling (softmax + argmax over the vocabulary shard).

KV cache: paged (``[num_blocks, block_size, kv_heads, head_dim]`` per layer, block tables) when
the installed torch's ``varlen_attn`` takes ``block_table``; otherwise contiguous (sequences
packed back to back in a per-layer pool each step). ``kv_layout`` says which.

Weights are random (timing does not depend on their values) and distinct per layer when they fit
in GPU memory, so every layer reads its own weights from HBM; else layers share one weight set
(``shared_weights`` is True, and the caller must say so).

Tensor parallelism: with ``tp > 1`` on one GPU, the runner computes ONE GPU's shard (heads,
kv heads, intermediate size and vocabulary divided by tp) and performs no all-reduce; the latency
model adds all-reduce time from its own table.

Timing (``run_step``): CUDA events recorded around the forward and sampling. Included: GPU time
and any GPU idle time caused by Python / kernel-launch overhead of the forward (eager mode: for
small batches this CPU time exceeds the GPU time, ~10-15 ms a step for 32 layers). Not included:
the scheduler's host work, building the step's metadata and copying it to the GPU (done before
the start event; `profiles.measure.profile_steps` times that too, as wall-clock around
``run_step``), detokenization, and overlap with the next step. Decode-only steps run as CUDA
graphs captured per (padded batch size, max_k bucket), as vLLM pads to capture sizes; mixed
steps run eagerly. Production engines also graph-capture mixed steps (piecewise graphs), so
their small mixed steps are faster than this runner's.
"""

from __future__ import annotations

import inspect

from profiles.torch_gemm import TORCH_WEIGHT_DTYPES, linear, make_weight
from simulator.latency.table import CAPTURE_SIZES
from simulator.precision import ACT_DTYPE
from simulator.served import ShardedModel

#: torch dtypes of activations and the KV cache this runner (and the op profiler) can run: bf16
#: only (no torch attention kernel reads an fp8 KV cache); GEMM weights may also be fp8
#: (`profiles.torch_gemm`). Other precisions are measured through vLLM.
TORCH_DTYPES = {"bf16": "bfloat16"}


def torch_dtype_name(sh: ShardedModel) -> str:
    """The torch dtype of ``sh``'s activations and KV cache; ValueError naming the precision
    when torch has no kernels for it (int4 weights, an fp8 KV cache)."""
    ok = (
        sh.weight_format.name in TORCH_WEIGHT_DTYPES
        and sh.kv_cache_dtype in TORCH_DTYPES
        and ACT_DTYPE in TORCH_DTYPES
    )
    if not ok:
        raise ValueError(
            f"the torch profiler runs {' or '.join(TORCH_WEIGHT_DTYPES)} weights with a "
            f"{', '.join(TORCH_DTYPES)} KV cache; {sh.spec.name} is served with "
            f"{sh.spec.precision.describe()} (profile it through vLLM: --engine vllm)"
        )
    return TORCH_DTYPES[ACT_DTYPE]


#: how mixed steps (any prefill) run: "eager" (every kernel launched from Python), "piecewise"
#: (vLLM v1's default: everything but attention replayed as CUDA graphs per padded token count,
#: attention eager; `profiles.piecewise`) or "full" (one whole-step graph per composition,
#: captured on first sight and replayed while it repeats: profiling only)
MIXED_MODES = ("eager", "piecewise", "full")


def max_k_bucket(max_ctx: int) -> int:
    """Decode ``max_k`` passed to FlashAttention: the longest context rounded up to a power of 2.

    FlashAttention picks its split-KV factor from ``max_k``; a graph captured with one huge
    static ``max_k`` would split the wrong range and run much slower (seen: 2-3x at small batch).
    Graphs are therefore captured per (batch size, max_k bucket), and eager decode calls and the
    op benchmarks use the same bucketing, so the tables and the steps agree.
    """
    b = 256
    while b < max_ctx:
        b *= 2
    return b


def varlen_features() -> dict:
    """What this torch's varlen_attn accepts (paged KV, GQA flag, causal spelling)."""
    from torch.nn.attention import varlen

    params = inspect.signature(varlen.varlen_attn).parameters
    return {
        "signature": str(inspect.signature(varlen.varlen_attn)),
        "paged": "block_table" in params and "seqused_k" in params,
        "gqa_flag": "enable_gqa" in params,
        "window": "window_size" in params,
        "is_causal": "is_causal" in params,
    }


def make_attn(feat: dict):
    """Return ``attn(q, k, v, cu_q, cu_k, max_q, max_k, causal, seqused_k, block_table)``."""
    from torch.nn.attention.varlen import varlen_attn

    def attn(q, k, v, cu_q, cu_k, max_q, max_k, causal, seqused_k=None, block_table=None):
        kw = {}
        if feat["window"]:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        elif feat["is_causal"]:
            kw["is_causal"] = causal
        if feat["gqa_flag"]:
            kw["enable_gqa"] = True
        if block_table is not None:
            kw["block_table"] = block_table
            kw["seqused_k"] = seqused_k
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    return attn


class StepRunner:
    """Runs engine steps of a random-weight model on one GPU; see the module docstring.

    ``run_step(prefills, decodes, block_tables=None) -> seconds`` where ``prefills`` is a list of
    ``(seq_slot, chunk_len, context_before)`` and ``decodes`` a list of ``(seq_slot,
    context_len)`` (context_len counts the cached tokens the new token attends to, itself
    included). ``block_tables`` maps seq_slot -> list of block ids (paged layout only); when
    absent, blocks are assigned from a shuffled free list, different each step.
    """

    def __init__(
        self,
        model_spec,
        tp: int = 1,
        dtype: str | None = None,
        num_blocks: int | None = None,
        block_size: int = 16,
        max_seqs: int = 256,
        use_cuda_graphs: bool = True,
        max_tokens: int = 16384,
        max_model_len: int | None = None,
        kv_cache_gib: float | None = None,
        headroom_gib: float = 10.0,
        seed: int = 0,
        layout: str = "auto",
        mixed_mode: str = "eager",
    ):
        import torch

        self.torch = torch
        self.spec = model_spec
        self.tp = tp
        self.served = sh = ShardedModel(model_spec, tp)
        self.dtype = getattr(torch, torch_dtype_name(sh) if dtype is None else dtype)
        self.dev = torch.device("cuda")
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.use_cuda_graphs = use_cuda_graphs
        if mixed_mode not in MIXED_MODES:
            raise ValueError(f"mixed_mode must be one of {MIXED_MODES}, got {mixed_mode!r}")
        self.mixed_mode = mixed_mode
        self._mixed = None  # (composition key, graph, static inputs) of the last mixed step
        self.max_model_len = max_model_len or getattr(model_spec, "max_model_len", 131072)
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(seed)
        # per-GPU widths: the served model's (one description for every consumer)
        self.L, self.hidden, self.D = sh.layers, sh.hidden, sh.head_dim
        self.H, self.KVH = sh.heads, sh.kv_heads
        self.inter, self.vocab = sh.inter, sh.vocab
        self.qkv_out = sh.op("qkv").shape[0]
        feat = varlen_features()
        self.varlen = feat
        self.paged = feat["paged"] if layout == "auto" else layout == "paged"
        self.attn = make_attn(feat)
        self.kv_layout = "paged" if self.paged else "contiguous"
        torch.manual_seed(seed)
        self._alloc_weights(headroom_gib)
        self._alloc_kv(num_blocks, kv_cache_gib, headroom_gib)
        half = self.D // 2
        inv = 1.0 / (500000.0 ** (torch.arange(0, half, device=self.dev).float() / half))
        pos = torch.arange(self.max_model_len + 1, device=self.dev).float()
        freqs = torch.outer(pos, inv)
        self.cos = freqs.cos().to(self.dtype)
        self.sin = freqs.sin().to(self.dtype)
        self.graphs: dict[int, tuple] = {}
        self._pool = None
        self.step_calls = 0
        if self.paged and not self._paged_selfcheck():
            self.paged = False
            self.kv_layout = "contiguous (paged self-check failed)"
            del self.kv
            torch.cuda.empty_cache()
            self._alloc_kv(None, kv_cache_gib, headroom_gib)
        # the cache's last slot is reserved for the padded rows of piecewise graphs; random
        # block tables and the contiguous layout never hand it out
        self.pad_slot = self.capacity_tokens - 1
        self._rng_blocks = torch.randperm(self.num_blocks - 1, generator=None).tolist()
        self._block_cursor = 0
        self.piecewise = None
        if mixed_mode == "piecewise":
            from profiles.piecewise import PiecewiseGraphs, capture_sizes

            self._pool = torch.cuda.graph_pool_handle()
            self.piecewise = PiecewiseGraphs(self, capture_sizes(max_tokens), self._pool)

    # ---- memory -------------------------------------------------------------------------------

    def _rand(self, *shape, scale=0.02):
        t = self.torch.randn(*shape, device=self.dev, dtype=self.dtype, generator=self.gen)
        return t.mul_(scale)

    def _alloc_weights(self, headroom_gib: float) -> None:
        torch = self.torch
        sh = self.served
        per_layer = sum(o.count * o.weight_bytes for o in sh.layer_gemms())
        free, _ = torch.cuda.mem_get_info()
        # embedding and LM head: vocab x hidden each, in the LM head's format
        need = per_layer * self.L + 2 * sh.op("lm_head").weight_bytes
        self.shared_weights = need > free - (headroom_gib + 4) * 2**30
        n_sets = 1 if self.shared_weights else self.L
        self.layers = []
        bias = getattr(self.spec, "qkv_bias", False)
        for _ in range(n_sets):
            self.layers.append(
                {
                    "ln1": 1.0 + self._rand(self.hidden),
                    "ln2": 1.0 + self._rand(self.hidden),
                    "qkv": self._gemm_weight("qkv", self.qkv_out, self.hidden),
                    "qkv_b": self._rand(self.qkv_out) if bias else None,
                    "o": self._gemm_weight("o", self.hidden, self.H * self.D),
                    "gate_up": self._gemm_weight("gate_up", 2 * self.inter, self.hidden),
                    "down": self._gemm_weight("down", self.hidden, self.inter),
                }
            )
        self.embed = self._rand(self.vocab, self.hidden, scale=1.0)
        self.final_ln = 1.0 + self._rand(self.hidden)
        self.lm_head = self._gemm_weight("lm_head", self.vocab, self.hidden)
        self.weight_bytes = need

    def _gemm_weight(self, op: str, n: int, k: int):
        """A random ``[n, k]`` weight stored in the served model's dtype for ``op``."""
        return make_weight(self._rand(n, k), self.served.op(op).weight_dtype)

    def _alloc_kv(self, num_blocks, kv_cache_gib, headroom_gib) -> None:
        torch = self.torch
        per_token = self.served.kv_bytes_per_token_per_gpu
        if num_blocks is None:
            if kv_cache_gib is None:
                free, _ = torch.cuda.mem_get_info()
                kv_cache_gib = max(1.0, free / 2**30 - headroom_gib)
            num_blocks = int(kv_cache_gib * 2**30 // (per_token * self.block_size))
        self.num_blocks = num_blocks
        self.capacity_tokens = num_blocks * self.block_size
        if self.paged:
            shape = (self.L, 2, num_blocks, self.block_size, self.KVH, self.D)
        else:
            shape = (self.L, 2, self.capacity_tokens, self.KVH, self.D)
        self.kv = torch.empty(shape, device=self.dev, dtype=self.dtype)
        # random contents (never zeros); one layer at a time to bound the temporary
        for layer in range(self.L):
            self.kv[layer].normal_(generator=self.gen)

    # ---- metadata -----------------------------------------------------------------------------

    def _take_blocks(self, n: int) -> list[int]:
        usable = len(self._rng_blocks)
        if n > usable:
            raise ValueError(f"step needs {n} KV blocks, cache has {usable}")
        out = []
        while len(out) < n:
            take = min(n - len(out), usable - self._block_cursor)
            out.extend(self._rng_blocks[self._block_cursor : self._block_cursor + take])
            self._block_cursor = (self._block_cursor + take) % usable
        return out

    def _metadata(self, prefills, decodes, block_tables):
        """Host-side lists for one step: token layout is [decodes..., prefill chunks...]."""
        bs = self.block_size
        seqs = [(slot, 1, ctx - 1) for slot, ctx in decodes] + [
            (slot, c, b) for slot, c, b in prefills
        ]
        positions, slots, kv_lens, tables = [], [], [], []
        cursor = 0
        total_blocks = sum(-(-(c + b) // bs) for _, c, b in seqs)
        fresh = self._take_blocks(total_blocks) if self.paged and not block_tables else None
        fpos = 0
        for slot, c, b in seqs:
            n = c + b
            if n > self.max_model_len:
                raise ValueError(f"sequence of {n} tokens > max_model_len {self.max_model_len}")
            kv_lens.append(n)
            positions.extend(range(b, n))
            if self.paged:
                nb = -(-n // bs)
                if block_tables:
                    blocks = list(block_tables[slot])[:nb]
                    if len(blocks) < nb:
                        raise ValueError(f"block table of slot {slot} has {len(blocks)} < {nb}")
                else:
                    blocks = fresh[fpos : fpos + nb]
                    fpos += nb
                tables.append(blocks)
                slots.extend(blocks[p // bs] * bs + p % bs for p in range(b, n))
            else:
                slots.extend(range(cursor + b, cursor + n))
                cursor += n
        if not self.paged and cursor > self.pad_slot:
            raise ValueError(f"step needs {cursor} KV tokens, pool has {self.pad_slot}")
        return seqs, positions, slots, kv_lens, tables

    # ---- the forward --------------------------------------------------------------------------

    def _rotary(self, x, cos, sin):
        half = self.D // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _forward(self, ids, pos, slots, logit_rows, dec, pre, hidden=False):
        """One eager step on device tensors. ``dec``/``pre`` hold attention metadata or None.

        Built from the same four pieces the piecewise CUDA graphs capture
        (`profiles.piecewise`), so both modes run identical math."""
        residual, cos, sin = self._embed(ids, pos)
        for layer in range(self.L):
            q = self._attn_in(layer, residual, cos, sin, slots)
            a = self._attention(layer, q, dec, pre)
            residual = self._attn_out(layer, residual, a)
        return self._sample(residual, logit_rows, hidden)

    def _embed(self, ids, pos):
        """Token embeddings and the rotary cos/sin rows of their positions."""
        return self.embed[ids], self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)

    def _attn_in(self, layer, residual, cos, sin, slots):
        """RMSNorm, QKV GEMM, rotary, and the new K/V written to the cache; returns q."""
        F = self.torch.nn.functional
        w = self.layers[0 if self.shared_weights else layer]
        qs, ks = self.H * self.D, self.KVH * self.D
        h = F.rms_norm(residual, (self.hidden,), w["ln1"], 1e-5)
        qkv = linear(h, w["qkv"], w["qkv_b"])
        q = qkv[:, :qs].view(-1, self.H, self.D)
        k = qkv[:, qs : qs + ks].view(-1, self.KVH, self.D)
        v = qkv[:, qs + ks :].view(-1, self.KVH, self.D)
        q = self._rotary(q, cos, sin)
        k = self._rotary(k, cos, sin)
        self.kv[layer, 0].view(-1, self.KVH, self.D).index_copy_(0, slots, k)
        self.kv[layer, 1].view(-1, self.KVH, self.D).index_copy_(0, slots, v)
        return q

    def _attention(self, layer, q, dec, pre, out=None):
        """FlashAttention of one layer: decodes (rows [0, n_dec)) then prefill chunks.

        With ``out`` (a ``[>= rows, H * D]`` buffer) the results are written into it instead of
        concatenated (the piecewise graphs read their input from a static buffer)."""
        kc, vc = self.kv[layer, 0], self.kv[layer, 1]
        n_dec = dec["n"] if dec else 0
        parts = []
        if dec:
            parts.append((0, self._attn(q[:n_dec], kc, vc, dec, causal=False)))
        if pre:
            parts.append((n_dec, self._attn(q[n_dec:], kc, vc, pre, causal=True)))
        if out is not None:
            for start, a in parts:
                out[start : start + a.shape[0]].copy_(a.reshape(a.shape[0], -1))
            return out
        if len(parts) == 1:
            return parts[0][1].reshape(-1, self.H * self.D)
        return self.torch.cat([a for _, a in parts], 0).reshape(-1, self.H * self.D)

    def _attn_out(self, layer, residual, a):
        """O GEMM, residual add, RMSNorm, gate/up GEMM, SiLU-mul, down GEMM, residual add."""
        F = self.torch.nn.functional
        w = self.layers[0 if self.shared_weights else layer]
        residual = residual + linear(a, w["o"])
        h = F.rms_norm(residual, (self.hidden,), w["ln2"], 1e-5)
        gu = linear(h, w["gate_up"])
        act = F.silu(gu[:, : self.inter]) * gu[:, self.inter :]
        return residual + linear(act, w["down"])

    def _sample(self, residual, logit_rows, hidden=False):
        """Final RMSNorm on each sequence's last token, LM head, greedy sampling (or, with
        ``hidden``, the normed hidden states: what tests compare across execution modes)."""
        torch, F = self.torch, self.torch.nn.functional
        last = F.rms_norm(residual[logit_rows], (self.hidden,), self.final_ln, 1e-5)
        if hidden:
            return last
        logits = linear(last, self.lm_head)
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.argmax(probs, dim=-1)

    def _attn(self, q, kc, vc, m, causal):
        if self.paged:
            return self.attn(
                q,
                kc,
                vc,
                m["cu_q"],
                m["cu_k"],
                m["max_q"],
                m["max_k"],
                causal,
                seqused_k=m["used"],
                block_table=m["table"],
            )
        return self.attn(q, kc, vc, m["cu_q"], m["cu_k"], m["max_q"], m["max_k"], causal)

    def _attn_meta(self, seqs, kv_lens, tables, lo, hi, max_k=None):
        """Attention metadata of seqs[lo:hi] (device tensors), or None when empty."""
        torch = self.torch
        if hi <= lo:
            return None
        qlens = [seqs[i][1] for i in range(lo, hi)]
        if max_k is None and all(n == 1 for n in qlens):
            max_k = max_k_bucket(max(kv_lens[lo:hi]))
        klens = kv_lens[lo:hi]
        cu_q = [0]
        for n in qlens:
            cu_q.append(cu_q[-1] + n)
        if self.paged:
            cu_k = [0]
            for n in klens:
                cu_k.append(cu_k[-1] + n)
        else:  # contiguous: offsets of each sequence in the packed pool
            start = sum(kv_lens[:lo])
            cu_k = [start]
            for n in klens:
                cu_k.append(cu_k[-1] + n)
        m = {
            "n": hi - lo,
            "cu_q": torch.tensor(cu_q, dtype=torch.int32, device=self.dev),
            "cu_k": torch.tensor(cu_k, dtype=torch.int32, device=self.dev),
            "max_q": max(qlens),
            "max_k": max_k or max(klens),
        }
        if self.paged:
            width = max(len(t) for t in tables[lo:hi])
            rows = [t + [0] * (width - len(t)) for t in tables[lo:hi]]
            m["table"] = torch.tensor(rows, dtype=torch.int32, device=self.dev)
            m["used"] = torch.tensor(klens, dtype=torch.int32, device=self.dev)
        return m

    def _paged_selfcheck(self) -> bool:
        """Paged varlen_attn must match the contiguous call on the same keys (else unsupported)."""
        torch = self.torch
        try:
            bs, kvh, d, h = self.block_size, self.KVH, self.D, self.H
            lens = [37, 5]
            blocks = [[3, 1, 4], [2]]
            kc = torch.randn(8, bs, kvh, d, device=self.dev, dtype=self.dtype)
            vc = torch.randn_like(kc)
            q = torch.randn(2, h, d, device=self.dev, dtype=self.dtype)
            cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=self.dev)
            cu_k = torch.tensor([0, 37, 42], dtype=torch.int32, device=self.dev)
            table = torch.tensor([[3, 1, 4], [2, 0, 0]], dtype=torch.int32, device=self.dev)
            used = torch.tensor(lens, dtype=torch.int32, device=self.dev)
            out = self.attn(q, kc, vc, cu_q, cu_k, 1, 37, False, seqused_k=used, block_table=table)
            kk = torch.cat([kc[blocks[0]].reshape(-1, kvh, d)[:37], kc[2][:5]])
            vv = torch.cat([vc[blocks[0]].reshape(-1, kvh, d)[:37], vc[2][:5]])
            ref = self.attn(q, kk, vv, cu_q, cu_k, 1, 37, False)
            err = (out.float() - ref.float()).norm() / ref.float().norm()
            return bool(err < 1e-2)
        except Exception:
            return False

    # ---- public -------------------------------------------------------------------------------

    def prepare(self, prefills, decodes, block_tables=None):
        """Device inputs of one step (host work outside the timed region)."""
        torch = self.torch
        seqs, positions, slots, kv_lens, tables = self._metadata(prefills, decodes, block_tables)
        n_dec = len(decodes)
        t = len(positions)
        if t > self.max_tokens + self.max_seqs:
            raise ValueError(f"step has {t} tokens, runner allows {self.max_tokens}")
        ids = torch.randint(0, self.vocab, (t,), device=self.dev, generator=self.gen)
        pos = torch.tensor(positions, dtype=torch.long, device=self.dev)
        sl = torch.tensor(slots, dtype=torch.long, device=self.dev)
        rows, acc = [], 0
        for _, c, _ in seqs:
            acc += c
            rows.append(acc - 1)
        logit_rows = torch.tensor(rows, dtype=torch.long, device=self.dev)
        dec = self._attn_meta(seqs, kv_lens, tables, 0, n_dec)
        pre = self._attn_meta(seqs, kv_lens, tables, n_dec, len(seqs))
        return ids, pos, sl, logit_rows, dec, pre

    def _timed(self, fn) -> float:
        """Seconds of GPU time fn() takes, by CUDA events recorded around it."""
        torch = self.torch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) * 1e-3

    def uses_graph(self, prefills, decodes) -> bool:
        """Whether ``run_step`` runs this step with CUDA graphs (whole or piecewise)."""
        if prefills:
            if self.mixed_mode == "piecewise":
                tokens = sum(c for _, c, _ in prefills) + len(decodes)
                return tokens <= self.piecewise.largest
            return self.mixed_mode == "full"
        return self.use_cuda_graphs and 0 < len(decodes) <= CAPTURE_SIZES[-1]

    def run_step(self, prefills, decodes, block_tables=None) -> float:
        """Run one step; returns its GPU time in seconds (CUDA events, sampling included)."""
        torch = self.torch
        if not prefills and not decodes:
            return 0.0
        with torch.inference_mode():
            if self.uses_graph(prefills, decodes):
                if not prefills:
                    return self._run_graph(decodes, block_tables)
                if self.mixed_mode == "full":
                    return self._run_mixed_graph(prefills, decodes, block_tables)
                args = self.prepare(prefills, decodes, block_tables)
                return self._timed(lambda: self.piecewise.run(args))
            args = self.prepare(prefills, decodes, block_tables)
            return self._timed(lambda: self._forward(*args))

    # ---- CUDA graphs for decode-only steps ---------------------------------------------------

    def _graph_for(self, bsz: int, max_k: int):
        """Capture (once) the decode forward for a padded batch size and max_k bucket."""
        torch = self.torch
        if (bsz, max_k) in self.graphs:
            return self.graphs[(bsz, max_k)]
        max_pages = -(-self.max_model_len // self.block_size)
        st = {
            "ids": torch.zeros(bsz, dtype=torch.long, device=self.dev),
            "pos": torch.zeros(bsz, dtype=torch.long, device=self.dev),
            "slots": torch.zeros(bsz, dtype=torch.long, device=self.dev),
            "rows": torch.arange(bsz, dtype=torch.long, device=self.dev),
            "cu_q": torch.arange(bsz + 1, dtype=torch.int32, device=self.dev),
            "cu_k": torch.arange(bsz + 1, dtype=torch.int32, device=self.dev),
            "used": torch.ones(bsz, dtype=torch.int32, device=self.dev),
        }
        if self.paged:
            st["table"] = torch.zeros(bsz, max_pages, dtype=torch.int32, device=self.dev)
        dec = {"n": bsz, "cu_q": st["cu_q"], "cu_k": st["cu_k"], "max_q": 1, "max_k": max_k}
        if self.paged:
            dec["table"] = st["table"]
            dec["used"] = st["used"]
        args = (st["ids"], st["pos"], st["slots"], st["rows"], dec, None)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(*args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            out = self._forward(*args)
        self.graphs[(bsz, max_k)] = (g, st, out)
        return self.graphs[(bsz, max_k)]

    def _run_graph(self, decodes, block_tables) -> float:
        torch = self.torch
        b = len(decodes)
        bsz = next(c for c in CAPTURE_SIZES if c >= b)
        g, st, _ = self._graph_for(bsz, max_k_bucket(max(n for _, n in decodes)))
        # pad with 1-token dummy sequences (each in its own block), as engines pad graphs
        pads = [(-1 - i, 1) for i in range(bsz - b)]
        seqs, positions, slots, kv_lens, tables = self._metadata(
            [],
            list(decodes) + pads,
            block_tables
            and {
                **block_tables,
                **{p[0]: [0] for p in pads},
            },
        )
        cu = [0]
        for n in kv_lens:
            cu.append(cu[-1] + n)
        st["ids"].copy_(torch.randint(0, self.vocab, (bsz,), device=self.dev, generator=self.gen))
        st["pos"].copy_(torch.tensor(positions, dtype=torch.long))
        st["slots"].copy_(torch.tensor(slots, dtype=torch.long))
        st["cu_k"].copy_(torch.tensor(cu, dtype=torch.int32))
        st["used"].copy_(torch.tensor(kv_lens, dtype=torch.int32))
        if self.paged:
            width = max(len(t) for t in tables)
            st["table"].zero_()
            st["table"][:, :width].copy_(
                torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
            )
        torch.cuda.synchronize()
        return self._timed(g.replay)

    # ---- whole-step CUDA graphs for mixed steps (opt-in, profiling) ---------------------------

    def _run_mixed_graph(self, prefills, decodes, block_tables) -> float:
        """Time one mixed step as a replayed whole-step CUDA graph (``mixed_mode="full"``).

        The graph is captured the first time a composition is seen and replayed while the same
        composition repeats; one is cached at a time (its private memory pool is freed with
        it). This is a profiling mode: it times what an engine that graph-captures mixed steps
        (vLLM v1's full CUDA graphs) pays, without the eager launch floor. A serving run, where
        every step differs, uses ``mixed_mode="piecewise"`` instead.
        """
        torch = self.torch
        key = (tuple(prefills), tuple(decodes)) if block_tables is None else None
        if key is None or self._mixed is None or self._mixed[0] != key:
            self._mixed = None
            args = self.prepare(prefills, decodes, block_tables)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(*args)  # warm-up outside capture (allocator, cuBLAS workspaces)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._forward(*args)
            self._mixed = (key, graph, args)
        return self._timed(self._mixed[1].replay)

    def close(self) -> None:
        """Free GPU memory (graphs, KV cache, weights)."""
        self._mixed = None
        self.piecewise = None
        self.graphs.clear()
        self.layers = []
        self.kv = None
        self.embed = self.lm_head = None
        self.torch.cuda.empty_cache()
