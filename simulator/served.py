"""One description of a served model: what each GPU of a TP group runs, stores and reads.

`ShardedModel(spec, tp)` turns a `ModelSpec` (shapes and precision names) into, per GPU:

* ``ops``: the list of operations a forward step runs (`Op`: kind, per-token shape, how many
  times per layer / step / sampling sequence, dtypes, weight bytes, FLOPs and activation bytes
  per token). Every consumer that needs shapes reads them here: the roofline model, the op
  profiler and its GPU step runner, the profiled latency model, the metrics (MFU / MBU), the KV
  capacity and speculative decoding's draft cost. Nothing else re-derives a per-GPU width.
* ``kv_specs(block_size)``: the KV-cache layout as a list of per-layer-group specs, modelled on
  vLLM v1's ``kv_cache_interface.py``: `FullAttentionSpec`, `SlidingWindowSpec`,
  `MLAAttentionSpec`; consumers ask the spec (capacity, bytes held, blocks freed, keys read,
  prefix-cache hits) rather than test its type.
* a step's FLOPs and HBM bytes from its batch features (`step_flops`, `step_bytes`).

Sharding follows vLLM: query heads, the MLP intermediate dimension and the vocabulary are split
over ``tp`` (the vocabulary rounded up); KV heads are split, or replicated one per GPU when tp
exceeds them; the hidden size is not split. Two all-reduces per layer join the shards. With
``expert_parallel`` (`EP_MODES`) the routed experts are instead placed whole, ``E / tp`` per GPU
(see `ShardedModel._routed_ops` and `_all_to_all_ops`).

Invariants: ``spec.check_tp(tp)`` holds; every count, width and byte figure is positive (or 0
for a term that does not exist, e.g. no collective at tp 1); `op_fingerprint` depends only on the
op list, so two tables measured for equal op lists have equal fingerprints.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, replace

from simulator.errors import ConfigError
from simulator.models import ModelSpec
from simulator.precision import ACT_DTYPE, DTYPE_BYTES, WEIGHT_FORMATS

#: FLOPs of one multiply-add (a GEMM of ``n x k`` weights costs this x n x k per token).
FLOPS_PER_MAC = 2
#: K and V: the KV cache stores two vectors per token, layer and KV head.
KV_TENSORS = 2
#: Bytes per logit in the sampler (fp32), written once and read once.
LOGIT_BYTES = 4

#: Op kinds. ``sampling`` and ``collective`` ops are timed apart from the layers' ops.
OP_KINDS = ("gemm", "moe", "attention", "elementwise", "sampling", "collective")
#: How often an op runs: ``count`` times per layer, per step, or per sampling sequence.
OP_SCOPES = ("layer", "step", "sample")


@dataclass(frozen=True)
class Op:
    """One operation of a forward step on one GPU.

    ``shape``: gemm ``(n, k)`` of ``y[T, n] = x[T, k] @ W[n, k]^T``; attention ``(heads,
    kv_heads, head_dim)``; elementwise, sampling and collective ops ``(width,)`` (the elements per
    token they touch most). ``flops_per_token``: per token (attention: per (query, key) pair).
    ``act_bytes_per_token``: activation bytes read and written per token; ``kv_bytes_per_key``
    (attention only): K and V bytes read per key attended to; ``weight_bytes``: read once per
    step when the op runs. All figures are per instance (multiply by ``count``).
    """

    name: str
    kind: str
    scope: str
    count: int
    shape: tuple[int, ...]
    in_dtype: str = ACT_DTYPE
    out_dtype: str = ACT_DTYPE
    weight_dtype: str | None = None
    weight_params: int = 0
    weight_bytes: float = 0.0
    flops_per_token: float = 0.0
    act_bytes_per_token: float = 0.0
    kv_bytes_per_key: float = 0.0
    #: layers the op runs in (0: every layer); MoE models mix dense and expert layers
    layers: int = 0
    #: kind ``moe`` (a grouped GEMM over routed experts): experts on this GPU and experts per
    #: token; ``weight_bytes`` then counts every expert, ``flops_per_token`` the ``top_k`` used
    experts: int = 0
    top_k: int = 0
    #: expert-parallel group size (0: experts split over TP). With ``ep``, ``experts`` are the
    #: whole experts this GPU holds and the per-token figures are this GPU's expected share of a
    #: step token's work (``top_k / ep`` of its expert copies land here under uniform routing)
    ep: int = 0

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS or self.scope not in OP_SCOPES:
            raise ValueError(f"op {self.name}: kind {self.kind!r} / scope {self.scope!r}")


@dataclass(frozen=True)
class KVSpec:
    """KV layout of a group of layers that share one page (block) format (vLLM's KVCacheSpec).

    ``page_size_bytes`` is one block of one layer; the group holds ``num_layers`` such pages per
    block. Subclasses (sliding window, MLA) change how a page is laid out and which blocks a
    request must hold and read, never this contract. Consumers ask the spec, they do not test
    its type:

    * ``max_blocks_needed(num_tokens)``: the most blocks (per layer) a request of ``num_tokens``
      tokens holds at once in the worst case (its whole sequence computed in one chunk);
    * ``blocks_freeable(num_computed)``: leading blocks no query at or after position
      ``num_computed`` reads, so they can be returned (0 for full attention);
    * ``tokens_read(context_len)``: keys one query with ``context_len`` tokens of context reads;
    * ``longest_cache_hit(cached, max_blocks)``: the longest prefix-cache hit the group allows
      (`simulator.kv.hybrid_prefix`).

    Invariants: ``blocks_freeable(n) <= n // block_size``; ``tokens_read(c) <= c``; both are
    non-decreasing.
    """

    block_size: int
    num_layers: int
    dtype: str

    @property
    def page_size_bytes(self) -> float:
        raise NotImplementedError

    def max_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_freeable(self, num_computed: int) -> int:
        return 0

    def tokens_read(self, context_len: int) -> int:
        return context_len

    def longest_cache_hit(self, cached, max_blocks: int) -> int:
        """Blocks of the longest prefix-cache hit this group allows among the first
        ``max_blocks`` blocks of a prompt, where ``cached(j)`` says whether block ``j``'s
        content is in the cache. Every query after the hit reads every earlier key, so the
        hit is the leading run of cached blocks (vLLM v1's ``FullAttentionManager.
        find_longest_cache_hit``). The blocks a hit of ``n`` blocks must hold are
        ``blocks_freeable(n x block_size) .. n - 1``; the rest are never read."""
        n = 0
        while n < max_blocks and cached(n):
            n += 1
        return n

    def tokens_held(self, num_computed: int) -> int:
        """Tokens of a request's KV the group holds once ``num_computed`` tokens are computed:
        all of them less the leading blocks `blocks_freeable` returns (the rule
        `simulator.kv.layered.LayeredPagedAllocator` frees by), so a sliding group holds the
        window's tokens plus the partial blocks at its ends. ``num_computed`` for full
        attention and MLA; never more than ``num_computed``."""
        return num_computed - self.block_size * self.blocks_freeable(num_computed)

    def bytes_held(self, num_computed: int) -> float:
        """KV bytes the group's layers hold for a request with ``num_computed`` tokens (what a
        swap or a P/D transfer copies): `tokens_held` x `bytes_per_token`."""
        return self.tokens_held(num_computed) * self.bytes_per_token

    @property
    def bytes_per_block(self) -> float:
        """Bytes one KV block takes over all layers of the group."""
        return self.page_size_bytes * self.num_layers

    @property
    def bytes_per_token(self) -> float:
        """KV bytes one token occupies over all layers of the group (an int when whole, as
        resolved configs and run fingerprints have always written it)."""
        whole, rest = divmod(self.bytes_per_block, self.block_size)
        return (
            whole
            if rest == 0 and isinstance(whole, int)
            else self.bytes_per_block / self.block_size
        )


@dataclass(frozen=True)
class FullAttentionSpec(KVSpec):
    """Full attention: K and V for every token, ``num_kv_heads x head_size`` each, per layer."""

    num_kv_heads: int
    head_size: int

    @property
    def page_size_bytes(self) -> float:
        return (
            KV_TENSORS
            * self.block_size
            * self.num_kv_heads
            * self.head_size
            * DTYPE_BYTES[self.dtype]
        )


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention: a query at position ``p`` reads keys ``p - window + 1 .. p``.

    As vLLM's ``SlidingWindowManager``: before computing from position ``num_computed``, the
    blocks wholly before ``num_computed - window + 1`` are freed and never read again. A chunk
    still holds every block it computes (its first query reads back ``window - 1`` tokens).
    """

    sliding_window: int = 0

    def blocks_freeable(self, num_computed: int) -> int:
        skipped = num_computed - self.sliding_window + 1
        return skipped // self.block_size if skipped > 0 else 0

    def tokens_read(self, context_len: int) -> int:
        return min(context_len, self.sliding_window)

    def longest_cache_hit(self, cached, max_blocks: int) -> int:
        """A hit of ``n`` blocks needs only the blocks the query at position ``n x
        block_size`` reads: the last ``ceil((window - 1) / block_size)`` before it (the
        query's own token is in the window, hence the -1), so blocks before them may be
        evicted or never cached. As vLLM v1's ``SlidingWindowManager.find_longest_cache_hit``
        (vllm/v1/core/single_type_kv_cache_manager.py): search right to left for the first
        run of that many cached blocks and end the hit with it; with none, the hit is the
        leading run of cached blocks (shorter than the window needs, but nothing before it
        is missing)."""
        need = -(-(self.sliding_window - 1) // self.block_size)
        run = 0
        for j in range(max_blocks - 1, -1, -1):
            if cached(j):
                run += 1
                if run >= need:
                    return j + run
            else:
                run = 0
        return run


@dataclass(frozen=True)
class MLAAttentionSpec(KVSpec):
    """Multi-head latent attention (DeepSeek): one cached vector of ``cache_width`` elements
    (``kv_lora_rank + qk_rope_head_dim``) per token and layer, shared by every head, so one
    "head" and no K/V pair. vLLM does not split it over TP: every rank of a TP group holds the
    whole latent cache (it is replicated), so KV bytes per GPU do not shrink with tp."""

    cache_width: int

    @property
    def page_size_bytes(self) -> float:
        return self.block_size * self.cache_width * DTYPE_BYTES[self.dtype]


def pool_unit_layers(group_layers: list[int]) -> int:
    """Layers one pool page covers, as vLLM 0.24's hybrid KV cache manager groups them
    (``kv_cache_utils._get_kv_cache_groups_uniform_page_size``): the smallest attention type's
    layer count (the "1" of an n:1 pattern), or the largest when it is under 1.5x the smallest
    (12 sliding + 13 full: 13, not 12 x 2); a type whose layers do not fill whole pages is padded
    (Gemma-3-27B's 52 sliding layers take 6 pages of 10, the 8 padding layers' KV held and
    unused)."""
    lo, hi = min(group_layers), max(group_layers)
    return hi if hi < 1.5 * lo else lo


@dataclass(frozen=True)
class KVPool:
    """How the layer groups share one block pool (after vLLM's hybrid KV cache manager).

    A pool block is one page for ``unit_layers`` layers (`pool_unit_layers`); a group of ``n``
    layers takes ``ceil(n / unit_layers)`` pool blocks per ``block_size`` tokens (``groups``:
    (spec, that multiple)), padding included. With one group (every dense or MLA model) a pool
    block is the whole model's block, as before groups existed.
    """

    groups: tuple[tuple[KVSpec, int], ...]
    unit_bytes: float

    @property
    def blocks_per_row(self) -> int:
        """Pool blocks ``block_size`` tokens take when no block has been freed."""
        return sum(m for _, m in self.groups)

    @property
    def frees_blocks(self) -> bool:
        """Whether any group returns blocks as a request advances (sliding windows)."""
        return any(s.blocks_freeable(1 << 62) for s, _ in self.groups)

    def max_blocks_needed(self, num_tokens: int) -> int:
        return sum(m * s.max_blocks_needed(num_tokens) for s, m in self.groups)


class WindowedReads:
    """The attention features of a model with sliding layers: keys actually read.

    A step's ``decode_ctx`` and ``prefill_attn`` count (query, key) pairs per layer averaged
    over the layers (``full_fraction`` of them read every key; the rest at most ``window``), so
    the latency models' KV-read and attention terms, which multiply them by the layer count,
    charge exactly the keys read. Pure full attention needs none of this (no object).
    """

    __slots__ = ("window", "full_fraction", "slide_fraction")

    def __init__(self, window: int, full_fraction: float):
        self.window = window
        self.full_fraction = full_fraction
        self.slide_fraction = 1.0 - full_fraction

    def one(self, context_len: int) -> float:
        """Keys per layer one query with ``context_len`` tokens of context reads."""
        w = self.window
        return self.full_fraction * context_len + self.slide_fraction * min(context_len, w)

    def decode(self, ctx_sum: int, excess: int) -> float:
        """A decode batch whose contexts sum to ``ctx_sum`` and exceed the window by ``excess``
        in total (sum of ``max(0, c - window)``)."""
        return ctx_sum - self.slide_fraction * excess

    def prefill_pairs(self, computed: int, n: int) -> float:
        """Pairs per layer of a chunk of ``n`` queries after ``computed`` tokens: query ``q``
        (0-based position) reads ``q + 1`` keys, or at most ``window`` on sliding layers."""
        full = n * (computed + (n + 1) / 2)
        w = self.window
        lo, hi = computed + 1, computed + n  # contexts of the chunk's queries
        below = max(0, min(hi, w) - lo + 1)  # queries whose context fits the window
        capped = below * (lo + lo + below - 1) / 2 + (n - below) * w
        return self.full_fraction * full + self.slide_fraction * capped


class ShardedModel:
    """What one GPU of a TP group of ``tp`` runs for ``spec`` (see the module docstring).

    Attributes: ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``head_dim``, ``inter``,
    ``vocab`` (per-GPU widths), ``weight_format`` (`WeightFormat`), ``kv_cache_dtype``, ``ops``.
    """

    def __init__(self, spec: ModelSpec, tp: int = 1, expert_parallel: str | None = None):
        spec.check_tp(tp)
        check_expert_parallel(spec, tp, expert_parallel)
        self.spec, self.tp = spec, tp
        #: None (experts split over TP), or an `EP_MODES` layout with ``ep = tp`` GPUs
        self.expert_parallel = expert_parallel
        self.ep = tp if expert_parallel else 1
        self.layers = spec.num_layers
        self.hidden = spec.hidden_size
        self.heads = spec.num_heads // tp
        self.kv_heads = spec.kv_heads_per_gpu(tp)
        self.head_dim = spec.head_dim
        self.inter = spec.intermediate_size // tp
        self.vocab = math.ceil(spec.vocab_size / tp)
        self.weight_format = WEIGHT_FORMATS[spec.weights]
        self.kv_cache_dtype = spec.kv_cache_dtype
        self.ops: tuple[Op, ...] = (*self._layer_ops(), *self._step_ops(), *self._sample_ops())

    # ---- the op list ---------------------------------------------------------------------------

    def _gemm(self, name: str, n: int, k: int, scope: str = "layer", quantized=True) -> Op:
        """A GEMM ``[T, k] x [k, n]``; ``quantized`` ones use the model's weight format (the
        embedding-sized LM head stays bf16, as vLLM serves it)."""
        fmt = self.weight_format if quantized else WEIGHT_FORMATS[ACT_DTYPE]
        return Op(
            name, "gemm", scope, 1, (n, k), in_dtype=fmt.gemm_dtype, weight_dtype=fmt.name,
            weight_params=n * k, weight_bytes=n * k * fmt.bytes_per_param,
            flops_per_token=FLOPS_PER_MAC * n * k,
            act_bytes_per_token=k * DTYPE_BYTES[fmt.gemm_dtype] + n * DTYPE_BYTES[ACT_DTYPE],
        )  # fmt: skip

    def _layer_ops(self) -> list[Op]:
        h, act = self.hidden, DTYPE_BYTES[ACT_DTYPE]
        attn = self._attention_ops() if self.spec.mla is None else self._mla_ops()
        ops = attn + self._mlp_ops()
        if self.tp > 1 and self.expert_parallel != "all_to_all":
            ops.append(Op("allreduce", "collective", "layer", 2, (h,), act_bytes_per_token=h * act))
        elif self.tp > 1:
            ops += self._all_to_all_ops()
        return ops

    def _all_to_all_ops(self) -> list[Op]:
        """Collectives of the ``all_to_all`` EP layout: the attention all-reduce in every layer,
        the MLP all-reduce where a TP-split MLP runs (dense layers; every layer when shared
        experts exist), and per MoE layer a dispatch, a combine and an all-gather that gives the
        TP attention of the next layer every token back. ``act_bytes_per_token`` is the payload
        of one token (`collective_link_factor` turns it into bytes on this GPU's link)."""
        h, act, spec = self.hidden, DTYPE_BYTES[ACT_DTYPE], self.spec
        moe, n = spec.moe, spec.num_moe_layers
        dense = spec.num_layers - n
        ops = [Op("allreduce", "collective", "layer", 1, (h,), act_bytes_per_token=h * act)]
        if dense or moe.num_shared_experts:
            ops.append(Op("allreduce_mlp", "collective", "layer", 1, (h,),
                          act_bytes_per_token=h * act,
                          layers=0 if moe.num_shared_experts else dense))  # fmt: skip
        for name in ("ep_dispatch", "ep_combine", "ep_allgather"):
            ops.append(Op(name, "collective", "layer", 1, (h,), act_bytes_per_token=h * act,
                          layers=n, experts=moe.num_experts // self.ep, top_k=moe.top_k,
                          ep=self.ep))  # fmt: skip
        return ops

    def _attention_ops(self) -> list[Op]:
        h, d, act = self.hidden, self.head_dim, DTYPE_BYTES[ACT_DTYPE]
        q, kv = self.heads * d, self.kv_heads * d
        kv_b = DTYPE_BYTES[self.kv_cache_dtype]
        return [
            # two fused residual-add + RMSNorm: read x and residual, write both
            Op("rmsnorm", "elementwise", "layer", 2, (h,), act_bytes_per_token=4 * h * act),
            self._gemm("qkv", q + KV_TENSORS * kv, h),
            # rotary: read and write q and k
            Op("rotary", "elementwise", "layer", 1, (q + kv,),
               act_bytes_per_token=2 * (q + kv) * act),
            # KV-cache write: read k and v, store them in the cache dtype
            Op("kv_write", "elementwise", "layer", 1, (KV_TENSORS * kv,),
               out_dtype=self.kv_cache_dtype, act_bytes_per_token=KV_TENSORS * kv * (act + kv_b)),
            # QK^T and PV: head_dim multiply-adds each per (query, key) pair and head
            Op("attention", "attention", "layer", 1, (self.heads, self.kv_heads, d),
               flops_per_token=2 * FLOPS_PER_MAC * self.heads * d,
               act_bytes_per_token=2 * q * act, kv_bytes_per_key=KV_TENSORS * kv * kv_b),
            self._gemm("o", h, q),
        ]  # fmt: skip

    def _mla_ops(self) -> list[Op]:
        """MLA ops, with vLLM's two attention paths (as described in
        vllm/v1/attention/backends/mla/common.py).

        The latent projection ``kv_a`` (hidden -> kv_lora_rank + rope) is replicated on every TP
        rank. ``kv_b`` (``2 x kv_lora_rank x heads x (qk_nope + v)`` FLOPs per computed token)
        is, for a decode token, the up-projections absorbed into its query and output, and for a
        prefill token the up-projection of its own latent to per-head K (nope part) and V.

        * ``attention`` (decode, absorbed): per (query, key) pair and head, QK over the latent +
          rope and PV over the latent: ``2 x heads x (2 kv_lora_rank + rope)`` FLOPs.
        * ``attention_prefill`` (prefill, not absorbed): QK over ``qk_nope + qk_rope`` and PV
          over ``v_head_dim``: ``2 x heads x (qk_nope + qk_rope + v)`` FLOPs per pair.

        A prefill chunk after ``c`` cached tokens (an earlier chunk of the same prompt, or a
        prefix-cache hit) also up-projects the prefix's latents, every chunk again (vLLM's
        ``_compute_prefill_context``: gather ``kv_c`` from the cache, ``kv_b_proj`` to per-head
        K (nope) and V, attend without the causal mask, merge): ``kv_b``'s FLOPs and
        activations for each of the ``c`` tokens (`prefill_context_flops_per_token`,
        `prefill_context_bytes_per_token`); the step feature is the chunks' summed prefix
        length (`SimulatedExecutor` passes it as ``prefill_ctx`` to a latency model that reads
        it)."""
        h, act, mla = self.hidden, DTYPE_BYTES[ACT_DTYPE], self.spec.mla
        kv_b, width, heads = DTYPE_BYTES[self.kv_cache_dtype], mla.cache_width, self.heads
        qk = heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        q = (
            [self._gemm("q", qk, h)]
            if mla.q_lora_rank is None
            else [self._gemm("q_a", mla.q_lora_rank, h), self._gemm("q_b", qk, mla.q_lora_rank)]
        )
        return [
            Op("rmsnorm", "elementwise", "layer", 2, (h,), act_bytes_per_token=4 * h * act),
            *q,
            self._gemm("kv_a", width, h),
            self._gemm("kv_b", heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
            Op("rotary", "elementwise", "layer", 1, (qk,), act_bytes_per_token=2 * qk * act),
            Op("kv_write", "elementwise", "layer", 1, (width,), out_dtype=self.kv_cache_dtype,
               act_bytes_per_token=width * (act + kv_b)),
            Op("attention", "attention", "layer", 1, (heads, 1, width),
               flops_per_token=FLOPS_PER_MAC * heads * (width + mla.kv_lora_rank),
               act_bytes_per_token=2 * heads * mla.kv_lora_rank * act,
               kv_bytes_per_key=width * kv_b),
            Op("attention_prefill", "attention", "layer", 1, (heads, heads, qk // heads),
               flops_per_token=FLOPS_PER_MAC * heads * (qk // heads + mla.v_head_dim),
               act_bytes_per_token=(qk + heads * mla.v_head_dim) * act,
               kv_bytes_per_key=width * kv_b),
            self._gemm("o", h, heads * mla.v_head_dim),
        ]  # fmt: skip

    def _mlp_ops(self) -> list[Op]:
        """Dense SwiGLU MLP; for a MoE model, the dense layers' MLP, the router, the routed
        experts (kind ``moe``, expert width split over TP as vLLM does without expert
        parallelism) and the shared experts, each on the layers it runs in."""
        h, spec = self.hidden, self.spec
        dense_layers = spec.num_layers - spec.num_moe_layers
        ops = []
        if dense_layers:
            only = 0 if spec.moe is None else dense_layers
            ops += self._swiglu("", self.inter, only)
        if spec.moe is not None:
            moe, n = spec.moe, spec.num_moe_layers
            ie = moe.expert_intermediate_size // self.tp
            ops.append(replace(self._gemm("router", moe.num_experts, h, quantized=False),
                               layers=n))  # fmt: skip
            ops += self._routed_ops(n)
            if moe.num_shared_experts:
                ops += self._swiglu("shared_", ie * moe.num_shared_experts, n)
        return ops

    def _routed_ops(self, layers: int) -> list[Op]:
        """The routed experts' grouped GEMMs and SiLU: every expert at width ``1/tp`` (TP), or
        ``E / ep`` whole experts (EP), whose expected share of a step token is ``top_k / ep``
        expert copies; both give the same expected FLOPs and bytes per GPU when ``ep == tp``
        (EP differs in the spread over GPUs, which `ep_expert_tokens` models)."""
        moe, ep = self.spec.moe, self.ep
        if not self.expert_parallel:
            return [
                self._routed(op, moe.num_experts, moe.top_k) if op.kind == "gemm"
                else replace(op, count=moe.top_k)
                for op in self._swiglu("experts_", moe.expert_intermediate_size // self.tp, layers)
            ]  # fmt: skip
        ops = []
        for op in self._swiglu("experts_", moe.expert_intermediate_size, layers):
            if op.kind == "gemm":
                op = self._routed(op, moe.num_experts // ep, moe.top_k)
            else:
                op = replace(op, count=moe.top_k)
            ops.append(replace(op, ep=ep, flops_per_token=op.flops_per_token / ep,
                               act_bytes_per_token=op.act_bytes_per_token / ep))  # fmt: skip
        return ops

    def _swiglu(self, prefix: str, inter: int, layers: int) -> list[Op]:
        act = DTYPE_BYTES[ACT_DTYPE]
        return [
            replace(self._gemm(prefix + "gate_up", 2 * inter, self.hidden), layers=layers),
            # SiLU-and-mul: read gate and up, write the product
            Op(prefix + "silu_mul", "elementwise", "layer", 1, (inter,),
               act_bytes_per_token=3 * inter * act, layers=layers),
            replace(self._gemm(prefix + "down", self.hidden, inter), layers=layers),
        ]  # fmt: skip

    @staticmethod
    def _routed(op: Op, experts: int, top_k: int) -> Op:
        """A GEMM made a grouped GEMM over ``experts`` (each token through ``top_k``)."""
        return replace(
            op, kind="moe", experts=experts, top_k=top_k, weight_params=op.weight_params * experts,
            weight_bytes=op.weight_bytes * experts, flops_per_token=op.flops_per_token * top_k,
            act_bytes_per_token=op.act_bytes_per_token * top_k,
        )  # fmt: skip

    def _step_ops(self) -> list[Op]:
        h, act = self.hidden, DTYPE_BYTES[ACT_DTYPE]
        return [
            # embedding gather (read a row, write it), final residual-add + RMSNorm
            Op("embed", "elementwise", "step", 1, (h,), act_bytes_per_token=2 * h * act),
            Op("final_norm", "elementwise", "step", 1, (h,), act_bytes_per_token=4 * h * act),
        ]

    def _sample_ops(self) -> list[Op]:
        v = self.spec.vocab_size
        return [
            self._gemm("lm_head", self.vocab, self.hidden, scope="sample", quantized=False),
            # fp32 logits of the whole (gathered) vocabulary, written once and read once
            Op("sampling", "sampling", "sample", 1, (v,), act_bytes_per_token=2 * v * LOGIT_BYTES),
        ]

    def op(self, name: str) -> Op:
        """The op named ``name`` (KeyError if this model has none)."""
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    def layer_gemms(self) -> list[Op]:
        """The GEMMs every layer runs, in execution order."""
        return [o for o in self.ops if o.kind == "gemm" and o.scope == "layer"]

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """op name -> ``(n, k)`` of every GEMM, the LM head included (what the profiler times)."""
        return {o.name: o.shape for o in self.ops if o.kind == "gemm"}

    @property
    def op_fingerprint(self) -> str:
        """A short hash of the op list (names, kinds, scopes, counts, shapes, dtypes): a table
        measured for one op list must not time another."""
        text = ";".join(
            f"{o.name},{o.kind},{o.scope},{o.count},{'x'.join(map(str, o.shape))},"
            f"{o.in_dtype},{o.out_dtype},{o.weight_dtype}"
            + (f",L{o.layers},E{o.experts},k{o.top_k}" if o.layers or o.experts else "")
            + (f",ep{o.ep}" if o.ep else "")
            for o in self.ops
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    # ---- memory ------------------------------------------------------------------------------

    @property
    def weight_bytes(self) -> float:
        """Bytes of the whole model's weights in its weight format (summed over the TP group):
        linear layers in the format, everything else (embedding, LM head, norms, biases) bf16."""
        spec, fmt = self.spec, self.weight_format
        other = spec.num_params - spec.num_linear_params
        return spec.num_linear_params * fmt.bytes_per_param + other * DTYPE_BYTES[ACT_DTYPE]

    @property
    def weight_bytes_per_gpu(self) -> float:
        """Weight bytes one GPU holds: the TP group's share (replicated norms and routers are
        negligible). With expert parallelism: everything but the routed experts split over
        ``tp`` (attention, shared experts, dense MLPs, vocabulary: vLLM keeps them TP-sharded
        at DP 1), plus ``E / ep`` whole routed experts; with ``ep == tp`` and ``ep`` dividing
        ``E`` (checked) this equals the TP figure, so KV capacity does not change with EP."""
        if not self.expert_parallel:
            return self.weight_bytes / self.tp
        routed = self.routed_expert_bytes
        return (self.weight_bytes - routed) / self.tp + routed / self.ep

    @property
    def routed_expert_bytes(self) -> float:
        """Bytes of every routed expert of every MoE layer (0 for a dense model), in the weight
        format (gpt-oss's expert biases are left in the bf16 remainder)."""
        spec = self.spec
        if spec.moe is None:
            return 0.0
        moe, fmt = spec.moe, self.weight_format
        per = 3 * spec.hidden_size * moe.expert_intermediate_size * fmt.bytes_per_param
        return spec.num_moe_layers * moe.num_experts * per

    def kv_specs(self, block_size: int) -> list[KVSpec]:
        """The KV layout per GPU: one spec per group of layers sharing a page format (full
        attention, sliding window, MLA latent), full-attention group first."""
        spec, dtype = self.spec, self.kv_cache_dtype
        if spec.mla is not None:
            return [MLAAttentionSpec(block_size, self.layers, dtype, spec.mla.cache_width)]
        full = spec.num_full_layers
        specs: list[KVSpec] = []
        if full:
            specs.append(FullAttentionSpec(block_size, full, dtype, self.kv_heads, self.head_dim))
        if full < self.layers:
            specs.append(SlidingWindowSpec(block_size, self.layers - full, dtype, self.kv_heads,
                                           self.head_dim, spec.sliding_window))  # fmt: skip
        return specs

    def kv_pool(self, block_size: int) -> KVPool:
        """The groups' shared block pool (`KVPool`): what one pool block is and how many each
        group takes per ``block_size`` tokens."""
        specs = self.kv_specs(block_size)
        unit = pool_unit_layers([s.num_layers for s in specs])
        groups = tuple((s, -(-s.num_layers // unit)) for s in specs)
        return KVPool(groups, specs[0].page_size_bytes * unit if len(specs) > 1
                      else specs[0].bytes_per_block)  # fmt: skip

    def kv_reads(self) -> WindowedReads | None:
        """The keys-read features for a model with sliding layers (None: every layer reads
        every key, and the features are the plain context sums)."""
        spec = self.spec
        if spec.sliding_window is None:
            return None
        return WindowedReads(spec.sliding_window, spec.num_full_layers / spec.num_layers)

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """KV-cache bytes one token occupies on each GPU of the group with every layer holding
        it: the growth rate of a request's KV, and its size only without sliding layers (which
        hold only the window's tokens: see `kv_bytes_held`)."""
        return sum(s.bytes_per_token for s in self.kv_specs(1))

    def kv_bytes_held(self, num_computed: int, block_size: int) -> float:
        """KV bytes one GPU holds for a request with ``num_computed`` tokens in ``block_size``
        blocks: per layer group, the tokens its rule keeps (`KVSpec.tokens_held`, the
        allocator's freeing rule) x its bytes per token. What swap and P/D transfer copy.
        Equals ``num_computed x kv_bytes_per_token_per_gpu`` (same value, same rounding) for
        full-attention and MLA models, whose single group holds every token."""
        return sum(s.bytes_held(num_computed) for s in self.kv_specs(block_size))

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies over the whole group, replicated heads counted once
        (what a P/D transfer of the whole model's KV or MBU counts). MLA's latent is one copy
        replicated on every rank: counted once."""
        if self.spec.mla is not None:
            return self.kv_bytes_per_token_per_gpu
        return self.kv_bytes_per_token_per_gpu * self.spec.num_kv_heads / self.kv_heads

    def kv_bytes_per_block_per_gpu(self, block_size: int) -> float:
        """Bytes one KV block of ``block_size`` tokens takes on each GPU of the group."""
        return sum(s.bytes_per_block for s in self.kv_specs(block_size))

    # ---- work of a step ----------------------------------------------------------------------

    def layers_of(self, op: Op) -> int:
        """Layers ``op`` runs in (every layer unless the op says otherwise)."""
        return op.layers or self.layers

    @property
    def uniform_layers(self) -> bool:
        """Every layer runs the same four GEMMs and no experts (dense Llama-style and sliding
        models): the roofline's unrolled fast path applies."""
        return len(self.layer_gemms()) == 4 and not any(o.layers or o.experts for o in self.ops)

    @property
    def linear_flops_per_token(self) -> float:
        """FLOPs of the layers' GEMMs for one computed token (one GPU), routed experts counted
        for the ``top_k`` a token uses."""
        if self.uniform_layers:
            return self.layers * sum(o.count * o.flops_per_token for o in self.layer_gemms())
        return sum(
            self.layers_of(o) * o.count * o.flops_per_token
            for o in self.ops
            if o.kind in ("gemm", "moe") and o.scope == "layer"
        )

    @property
    def active_weight_bytes(self) -> float:
        """`weight_bytes` counting only the ``top_k`` routed experts one token uses (equal to
        it for a dense model): the fewest weight bytes a step reads."""
        spec, fmt = self.spec, self.weight_format
        other = spec.num_active_params - spec.num_active_linear_params
        return spec.num_active_linear_params * fmt.bytes_per_param + other * DTYPE_BYTES[ACT_DTYPE]

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair over all layers (one GPU)."""
        return self.layers * self.op("attention").flops_per_token

    @property
    def prefill_pair_extra_flops(self) -> float:
        """FLOPs a prefill (query, key) pair costs over all layers beyond `attn_flops_per_pair`:
        MLA's non-absorbed prefill path (``attention_prefill``) minus its absorbed decode path
        (negative: prefill attends over smaller head dims); exactly 0.0 for every other model,
        whose prefill and decode pairs cost the same, so adding it changes no figure."""
        ops = [o for o in self.ops if o.name == "attention_prefill"]
        if not ops:
            return 0.0
        return self.layers * (ops[0].flops_per_token - self.op("attention").flops_per_token)

    @property
    def prefill_context_flops_per_token(self) -> float:
        """FLOPs over all layers of one cached prefix token of a prefill chunk beyond its
        attention pairs: MLA's up-projection of the token's latent (``kv_b``, ``2 x
        kv_lora_rank x heads x (qk_nope + v)`` per layer, heads of this GPU), redone by every
        chunk that attends to it (`_mla_ops`); exactly 0.0 for every other model."""
        if self.spec.mla is None:
            return 0.0
        return self.layers * self.op("kv_b").flops_per_token

    @property
    def prefill_context_bytes_per_token(self) -> float:
        """HBM bytes over all layers of one cached prefix token of a prefill chunk for MLA's
        up-projection: the latent read from the cache (``kv_lora_rank + rope`` in the cache
        dtype), ``kv_b``'s activations in and out, and the attention reading the expanded K
        (nope + rope) and V back; the ``kv_b`` weights are read once a step already. 0.0 for
        every other model."""
        mla = self.spec.mla
        if mla is None:
            return 0.0
        act = DTYPE_BYTES[ACT_DTYPE]
        gather = mla.cache_width * DTYPE_BYTES[self.kv_cache_dtype]
        kv = self.heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim) * act
        return self.layers * (gather + self.op("kv_b").act_bytes_per_token + kv)

    @property
    def lm_head_flops_per_seq(self) -> float:
        return self.op("lm_head").flops_per_token

    def step_flops(
        self,
        tokens: float,
        attn_pairs: float,
        sample_seqs: float = 0,
        prefill_pairs: float = 0,
        prefill_ctx: float = 0,
    ) -> float:
        """FLOPs one GPU does in a step of ``tokens`` computed tokens, ``attn_pairs`` (query,
        key) pairs, ``prefill_pairs`` of which are prefill pairs (MLA prices them apart,
        `prefill_pair_extra_flops`), ``sample_seqs`` sampling sequences, and prefill chunks
        after ``prefill_ctx`` cached tokens in all (MLA's up-projection of them,
        `prefill_context_flops_per_token`; 0.0 for other models)."""
        out = (
            float(self.linear_flops_per_token) * tokens
            + float(self.attn_flops_per_pair) * attn_pairs
            + float(self.lm_head_flops_per_seq) * sample_seqs
            + self.prefill_pair_extra_flops * prefill_pairs
        )
        if prefill_ctx:
            out += self.prefill_context_flops_per_token * prefill_ctx
        return out

    def step_min_bytes(self, steps: float, kv_tokens: float) -> float:
        """The fewest HBM bytes of ``steps`` steps over the whole group: the weights once per
        step plus ``kv_tokens`` tokens of KV read or written (MBU's numerator)."""
        return self.active_weight_bytes * steps + self.kv_bytes_per_token * kv_tokens


#: Where a routing-skew figure comes from (``model.routing_skew``): NVIDIA's TensorRT-LLM tech
#: blog 4, "Scaling Expert Parallelism in TensorRT-LLM (Part 1)", Table 1
#: (https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/blogs/tech_blog/blog4_Scaling_Expert_Parallelism_in_TensorRT-LLM.md):
#: DeepSeek-R1 (256 routed experts, top-8) on a machine-translation dataset over 32 GB200s,
#: without EPLB, per layer and decode iteration (mean 128 tokens per expert): the busiest
#: expert's tokens are 10.948 above the mean, max/mean 11.95, and the std/mean of the
#: per-expert counts is 164.1 / 128 = 1.28. A Zipf exponent of 0.595 reproduces that max/mean
#: (0.642 the std/mean; binomial noise at 4,096 tokens adds < 1% to either), so
#: ``routing_skew: 0.6`` is that measurement for a 256-expert top-8 router
#: (`test_routing_skew_reproduces_the_measured_imbalance`). It is one model, one dataset, one
#: batch size; another router's skew needs its own measurement.
ROUTING_SKEW_SOURCE = (
    "https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/blogs/tech_blog/"
    "blog4_Scaling_Expert_Parallelism_in_TensorRT-LLM.md (Table 1)"
)


@functools.lru_cache(maxsize=64)
def routing_probabilities(num_experts: int, top_k: int, skew: float = 0.0) -> tuple[float, ...]:
    """Per expert, the probability that one token routes to it (its expected share of the
    load, x ``tokens``), by popularity rank: ``k/E`` each for ``skew = 0`` (uniform), else
    proportional to the Zipf weight ``rank^-skew``, scaled to sum to ``top_k`` (a token picks
    ``top_k`` distinct experts), with any probability above 1 capped at 1 and the excess spread
    over the rest in proportion (so the sum stays ``top_k``). Non-increasing; memoized."""
    e, k = num_experts, top_k
    if skew == 0.0:
        return (k / e,) * e
    w = [i**-skew for i in range(1, e + 1)]
    p = [0.0] * e
    capped, left, budget = 0, w, float(k)
    while True:  # cap the hottest experts at 1 until none exceeds it (at most k rounds)
        total = sum(left)
        scaled = [budget * x / total for x in left]
        if scaled[0] <= 1.0:
            p[capped:] = scaled
            return tuple(p)
        p[capped] = 1.0
        capped, left, budget = capped + 1, left[1:], budget - 1.0


def routing_imbalance(num_experts: int, top_k: int, skew: float = 0.0) -> float:
    """Expected max/mean of the per-expert load (the busiest expert over the mean) for a
    router of ``skew``, in the limit of many tokens: 1 for uniform routing; 11.95 measured
    for DeepSeek-R1 (`ROUTING_SKEW_SOURCE`)."""
    p = routing_probabilities(num_experts, top_k, skew)
    return p[0] * num_experts / top_k


def expected_experts_touched(num_experts: int, top_k: int, tokens: float, skew: float = 0.0):
    """Expected distinct experts ``tokens`` tokens route to, each to ``top_k`` of
    ``num_experts``: the experts whose weights a step must read.

    A token includes expert ``i`` with probability ``p_i`` (`routing_probabilities`),
    independently across tokens, so the expectation is ``sum_i 1 - (1 - p_i)^T``. ``skew =
    0`` (default) is uniform routing, ``E (1 - (1 - k/E)^T)`` exactly (each token's k experts
    are distinct, so each expert is chosen with probability k/E). A positive ``skew`` (the
    model's ``routing_skew``, a Zipf exponent over popularity ranks) touches fewer experts
    for the same tokens; `ROUTING_SKEW_SOURCE` says where a measured figure comes from.
    Non-decreasing in ``tokens``; at most ``num_experts``.
    """
    if tokens <= 0:
        return 0.0
    if skew == 0.0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return sum(1.0 - (1.0 - p) ** tokens for p in routing_probabilities(num_experts, top_k, skew))


# ---- expert parallelism --------------------------------------------------------------------

#: Expert-parallel layouts (``hardware.expert_parallel``): ``allreduce`` is vLLM's
#: ``--enable-expert-parallel`` at data parallel 1 (tokens stay replicated by TP attention, each
#: GPU runs its own experts on them, and the MoE output is all-reduced as under TP: vLLM's
#: ``FusedMoEParallelConfig.use_all2all_kernels`` is ``dp_size > 1 and use_ep``);
#: ``all_to_all`` splits the step's tokens over the group, dispatches each to the GPUs holding
#: its experts, combines them back and all-gathers the result for the next TP attention.
EP_MODES = ("allreduce", "all_to_all")


def check_expert_parallel(spec: ModelSpec, tp: int, mode, where="<config>", key="ep") -> None:
    """Raise ConfigError unless ``mode`` (None or one of `EP_MODES`) can serve ``spec`` over a
    group of ``tp``: EP needs routed experts, more than one GPU, and ``tp`` dividing the expert
    count (vLLM gives the first ranks one more expert otherwise; not modelled)."""
    if mode is None:
        return
    if mode not in EP_MODES:
        raise ConfigError(where, key, f"expected false, true or one of {EP_MODES}, got {mode!r}")
    if spec.moe is None:
        raise ConfigError(where, key, f"{spec.name} is a dense model: no experts to place")
    if tp < 2:
        raise ConfigError(where, key, f"needs tp >= 2 (experts are placed over the tp GPUs), "
                          f"got tp {tp}")  # fmt: skip
    if spec.moe.num_experts % tp:
        raise ConfigError(where, key, f"{spec.name}: {spec.moe.num_experts} experts do not split "
                          f"evenly over {tp} GPUs")  # fmt: skip


@functools.lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """``E[max]`` of ``n`` independent standard normals (0 for n = 1; 1/sqrt(pi) for n = 2),
    by quadrature of ``n x phi(x) x Phi(x)^(n-1)`` over [-10, 10]. A pure function of ``n``,
    memoized because the roofline asks for it every step."""
    if n < 2:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * dx
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * cdf ** (n - 1)
    return total * dx


def _expected_max(mean: float, spread_var: float, ep: int, cap: float) -> float:
    """``E[max_g X_g]`` of ``ep`` exchangeable loads with mean ``mean`` and ``Var(X_g) -
    Cov(X_g, X_h) = spread_var``, in the normal approximation ``mean + sqrt(spread_var) x
    E[max of ep standard normals]`` (exact in the limit of many tokens), capped at ``cap``."""
    return min(cap, mean + math.sqrt(max(spread_var, 0.0)) * expected_max_normal(ep))


def ep_expert_tokens(num_experts: int, top_k: int, ep: int, tokens: float) -> tuple[float, float]:
    """(mean, expected max over GPUs) of the expert copies of ``tokens`` tokens that land on one
    GPU of ``ep`` holding ``E / ep`` experts each, under uniform routing.

    A token's ``k`` distinct experts put a hypergeometric ``X`` on each GPU: mean ``k / ep``,
    ``Var - Cov = k (E - k) / (ep (E - 1))`` per token (loads sum to ``T k``, so they are
    negatively correlated); T independent tokens add. The max sets the step: every GPU waits for
    the busiest one. At most ``T x min(k, E / ep)``."""
    if tokens <= 0:
        return 0.0, 0.0
    e, k = num_experts, top_k
    mean = tokens * k / ep
    spread = tokens * k * (e - k) / (ep * (e - 1)) if e > 1 else 0.0
    return mean, _expected_max(mean, spread, ep, tokens * min(k, e // ep))


def ep_experts_touched(num_experts: int, top_k: int, ep: int, tokens: float):
    """(mean, expected max over GPUs) of the distinct experts ``tokens`` tokens touch among the
    ``m = E / ep`` one GPU holds, under uniform routing: the weights that GPU must read.

    An expert is untouched by a token with probability ``q = 1 - k/E``, a pair with ``q2 = (E-k)
    (E-k-1) / (E (E-1))``; ``Var - Cov`` of a GPU's count is ``m (q^T (1 - q^T) - (q2^T -
    q^2T))``. The mean is `expected_experts_touched` over ``ep``; the max is at most ``m``."""
    if tokens <= 0:
        return 0.0, 0.0
    e, k, m = num_experts, top_k, num_experts // ep
    q = 1.0 - k / e
    q2 = (e - k) * (e - k - 1) / (e * (e - 1)) if e > 1 else 0.0
    mean = m * (1.0 - q**tokens)
    spread = m * (q**tokens * (1.0 - q**tokens) - (q2**tokens - q ** (2 * tokens)))
    return mean, _expected_max(mean, spread, ep, float(m))


def collective_link_factor(op: Op, tp: int) -> float:
    """Bytes one GPU moves over its link per byte of a step token's payload
    (``op.act_bytes_per_token``) for collective ``op``.

    All-reduce (ring): ``2 (tp-1)/tp``. EP dispatch and combine: each GPU owns ``1/ep`` of the
    tokens and sends a token once to every other GPU holding at least one of its ``k`` experts
    (deduplicated by destination, as DeepEP's ``is_token_in_rank`` layout does): ``(ep - 1) x
    (1 - C(E - m, k) / C(E, k)) / ep``, ``m = E / ep``. All-gather: ``(ep-1)/ep`` arrives."""
    if op.name.startswith("allreduce"):
        return 2 * (tp - 1) / tp
    ep, m, k = op.ep, op.experts, op.top_k
    if op.name == "ep_allgather":
        return (ep - 1) / ep
    e = m * ep
    p_none = math.comb(e - m, k) / math.comb(e, k)  # a token has no expert on a given GPU
    return (ep - 1) * (1.0 - p_none) / ep


def collective_link_bytes(op: Op, tp: int) -> float:
    """Bytes one GPU moves over its link per step token for collective ``op``."""
    return collective_link_factor(op, tp) * op.act_bytes_per_token


__all__ = [
    "EP_MODES",
    "check_expert_parallel",
    "collective_link_bytes",
    "collective_link_factor",
    "ep_experts_touched",
    "ep_expert_tokens",
    "expected_max_normal",
    "FLOPS_PER_MAC",
    "expected_experts_touched",
    "ROUTING_SKEW_SOURCE",
    "routing_imbalance",
    "routing_probabilities",
    "FullAttentionSpec",
    "KVPool",
    "KVSpec",
    "MLAAttentionSpec",
    "SlidingWindowSpec",
    "WindowedReads",
    "KV_TENSORS",
    "LOGIT_BYTES",
    "Op",
    "ShardedModel",
]
