"""Roofline step latency: an optimistic bound, labelled ``roofline``.

Used when no profiled step-latency table exists for a (model, GPU, TP) combination. Every
operation of a forward step is charged ``max(FLOPs / peak_flops, bytes / peak_bandwidth)`` on one
GPU of the TP group, and the operations are summed. Real kernels are slower (launch gaps, tile
quantization, imperfect overlap, small-batch GEMM inefficiency), so simulated latencies are
lower bounds and simulated throughputs upper bounds; `describe` says so in every output.

Ceilings are `GPUSpec.peak_flops` / `GPUSpec.peak_bandwidth`: measured matmul / copy rates where
known (H100, H200), else spec x a default efficiency.

Operations of one step (T = prefill_tokens + decode_seqs tokens computed, S = prefill_seqs +
decode_seqs sequences that sample), per GPU of a TP group of ``tp``, are the op list of
`simulator.served.ShardedModel` (shapes, counts, dtypes and bytes come from there alone):

* per layer, four GEMMs: QKV, O, gate/up, down. Weights (1/tp of them, in the model's weight
  format) are read once per step; activations are read (in the GEMM input dtype: FP8 for W8A8)
  and written (bf16) once. FLOPs = 2 x T x weight parameters, at the tensor-core peak of the GEMM
  input dtype (`GPUSpec.peak_flops_for`: FP8 for ``weights: fp8``, else bf16).
* attention, one varlen kernel over the batch (as in vLLM v1): FLOPs = 4 x heads/tp x head_dim
  x (prefill_attn + decode_ctx) per layer; bytes = Q read and O written for every token, K and V
  read for the ``decode_ctx`` keys of decoding sequences and for the new prompt tokens (keys of
  earlier chunks are not in the features, so their reads are left out: a lower bound).
* elementwise, bandwidth-bound: two fused residual-add + RMSNorm per layer, rotary on q and k,
  SiLU-and-mul, the KV-cache write, plus the embedding gather and final norm once per step.
* LM head (1/tp of the vocabulary, bf16 in every precision, as vLLM serves it) and sampler
  (fp32 logits written and read) for the S
  sequences that sample only.
* TP all-reduce when tp > 1: two per layer over T x hidden bf16 values, ring cost
  ``2 (tp-1)/tp x bytes / link bandwidth + link latency`` each, or, with ``collectives`` (a
  table of this GPU at this group size, `simulator.latency.collectives`), NCCL's measured time
  at those link bytes.
* expert parallelism (``expert_parallel``, `simulator.served.EP_MODES`): routed experts are
  charged for the busiest GPU (expected max of its expert copies and distinct experts under
  uniform routing), and the ``all_to_all`` layout's dispatch, combine and all-gather go to the
  ``expert_comm`` term, each measured (``collectives``) or ``latency + link bytes /
  bandwidth`` (an estimate); `describe` says which.
* a fixed per-step overhead (default 1 ms): real engines spend it outside GPU kernels (scheduler,
  input preparation, sampling bookkeeping, detokenization, launch gaps even with CUDA graphs).

Weights are read only when T > 0 (and the LM head only when S > 0): a step with no work costs
exactly the overhead. Every term is a non-decreasing function of the features, so the model is.

The simulator calls `RooflineLatencyModel.step_time` once per simulated step, hundreds of
thousands of times per run; all per-model constants are folded in ``__init__`` so a call is a
few float operations (about 0.8 us per call with Python 3.11; see ``tests/test_roofline.py``).
`RooflineLatencyModel.breakdown` recomputes the same step term by term, for MFU / MBU and tests.
"""

from __future__ import annotations

from simulator.ep_skew import ep_skewed_tokens, ep_skewed_touched
from simulator.hardware import GPUSpec, LinkSpec, default_tp_link
from simulator.latency.collectives import CollectiveTimes, StepCollectives
from simulator.models import ModelSpec
from simulator.served import (
    ShardedModel,
    ep_expert_tokens,
    ep_experts_touched,
    expected_experts_touched,
)

#: Default fixed cost of one engine step outside GPU kernels, seconds (see module docstring).
DEFAULT_STEP_OVERHEAD_S = 1e-3


class RooflineLatencyModel:
    """Optimistic per-step latency from FLOPs and bytes, per GPU of a TP group.

    ``allreduce_link`` defaults to `default_tp_link` of the GPU (NVLink, else PCIe); it is
    unused when ``tp == 1``.
    """

    name = "roofline"

    __slots__ = (
        "model",
        "gpu",
        "tp",
        "step_overhead_s",
        "allreduce_link",
        "fallback_reason",
        "_fixed",
        "_lin",
        "_qkv_f",
        "_qkv_b",
        "_qkv_w",
        "_o_f",
        "_o_b",
        "_o_w",
        "_gu_f",
        "_gu_b",
        "_gu_w",
        "_dn_f",
        "_dn_b",
        "_dn_w",
        "_attn_f",
        "_attn_qo",
        "_attn_kv",
        "_lm_f",
        "_lm_b",
        "_lm_w",
        "served",
        "_gemm_peak",
        "_general",
        "moe_routing_skew",
        "expert_parallel",
        "uses_prefill_ctx",
        "collectives",
        "_step_collectives",
    )

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int = 1,
        step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
        allreduce_link: LinkSpec | None = None,
        *,
        where: str = "<config>",
        key: str = "tp",
        moe_routing_skew: float | None = None,
        expert_parallel: str | None = None,
        collectives: CollectiveTimes | None = None,
    ):
        model.check_tp(tp, where, key)
        #: why a profiled table was not used, when `latency: auto` fell back (printed, saved)
        self.fallback_reason: str | None = None
        if not step_overhead_s >= 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {step_overhead_s!r}")
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.step_overhead_s = float(step_overhead_s)
        if allreduce_link is None and tp > 1:
            allreduce_link = default_tp_link(gpu)
        self.allreduce_link = allreduce_link

        self.served = sm = ShardedModel(model, tp, expert_parallel)
        #: None, or the expert-parallel layout (`simulator.served.EP_MODES`)
        self.expert_parallel = expert_parallel
        #: router skew for the experts a step touches (`expected_experts_touched`; 0: uniform);
        #: the model's ``routing_skew`` unless given
        if moe_routing_skew is None:
            moe_routing_skew = model.moe.routing_skew if model.moe is not None else 0.0
        self.moe_routing_skew = float(moe_routing_skew)
        if expert_parallel == "all_to_all" and self.moe_routing_skew:
            raise ValueError(
                "moe_routing_skew with all_to_all expert parallelism is not modelled (the "
                "busiest GPU's dispatch and combine traffic under skew)"
            )
        #: measured collectives of this GPU and group size (`simulator.latency.collectives`),
        #: or None: the link estimate; measured times are not linear in tokens, so they are
        #: charged on the general path
        if collectives is not None and collectives.ranks != tp:
            raise ValueError(f"collectives measured at {collectives.ranks} ranks, not tp {tp}")
        self.collectives = collectives if tp > 1 else None
        self._step_collectives = (
            StepCollectives(sm, allreduce_link, self.collectives) if tp > 1 else None
        )
        #: layers differ (MoE, dense + expert layers, MLA), or collectives are measured:
        #: step_time sums `breakdown`
        self._general = not sm.uniform_layers or self.collectives is not None
        #: MLA: the executor passes the prefill chunks' cached prefix tokens (``prefill_ctx``)
        self.uses_prefill_ctx = sm.prefill_context_flops_per_token > 0
        self._gemm_peak = gpu.peak_flops_for(sm.weight_format.gemm_dtype)
        if not self._general:
            self._fold_constants(sm, gpu)

    def _fold_constants(self, sm: ShardedModel, gpu: GPUSpec) -> None:
        """Fold the op list into the few per-token / per-step constants `step_time` needs.

        Layer GEMMs: time = max(T * f, T * b + w), summed over layers (four for Llama, unrolled in
        `step_time`). Attention: max(pairs * f, T * qo + kv_tokens * kv). LM head + sampler:
        max(S * f, S * b + w). Elementwise ops and the all-reduce's bandwidth are linear in T;
        the overhead and the all-reduce's latencies are fixed.
        """
        bw, L = gpu.peak_bandwidth, sm.layers  # noqa: N806
        self._gemm_peak = gpu.peak_flops_for(sm.weight_format.gemm_dtype)
        gemms = [
            (L * o.flops_per_token / self._gemm_peak, L * o.act_bytes_per_token / bw,
             L * o.weight_bytes / bw)
            for o in sm.layer_gemms()
        ]  # fmt: skip
        if len(gemms) != 4:
            raise ValueError(f"roofline expects 4 layer GEMMs, {sm.spec.name} has {len(gemms)}")
        (self._qkv_f, self._qkv_b, self._qkv_w), (self._o_f, self._o_b, self._o_w) = gemms[:2]
        (self._gu_f, self._gu_b, self._gu_w), (self._dn_f, self._dn_b, self._dn_w) = gemms[2:]
        attn = sm.op("attention")
        self._attn_f = L * attn.flops_per_token / gpu.peak_flops
        self._attn_qo = L * attn.act_bytes_per_token / bw
        self._attn_kv = L * attn.kv_bytes_per_key / bw
        lm, sampler = sm.op("lm_head"), sm.op("sampling")
        self._lm_f = lm.flops_per_token / gpu.peak_flops_for(lm.in_dtype)
        self._lm_b = (lm.act_bytes_per_token + sampler.act_bytes_per_token) / bw
        self._lm_w = lm.weight_bytes / bw
        lin = _elementwise_bytes_per_token(sm) / bw
        fixed = self.step_overhead_s
        if self.tp > 1:
            link, ar = self.allreduce_link, sm.op("allreduce")
            ring = 2 * (self.tp - 1) / self.tp
            lin += ar.count * L * ring * ar.act_bytes_per_token / link.bandwidth
            fixed += ar.count * L * link.latency
        self._lin = lin
        self._fixed = fixed

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        decode_max: int = 0,
        prefill_ctx: int = 0,
    ) -> float:
        """Seconds one step takes (see the module docstring for what is counted). The bound
        reads every key once whatever the spread, so ``decode_max`` is not used;
        ``prefill_ctx`` (the prefill chunks' cached prefix tokens, summed) only moves MLA
        models (`uses_prefill_ctx`), which are never on the unrolled path."""
        if self._general:
            return self._step_time_general(
                prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, prefill_ctx
            )
        t = prefill_tokens + decode_seqs
        if t <= 0:
            return self.step_overhead_s
        total = self._fixed + t * self._lin
        a = t * self._qkv_f
        b = t * self._qkv_b + self._qkv_w
        total += a if a > b else b
        a = t * self._o_f
        b = t * self._o_b + self._o_w
        total += a if a > b else b
        a = t * self._gu_f
        b = t * self._gu_b + self._gu_w
        total += a if a > b else b
        a = t * self._dn_f
        b = t * self._dn_b + self._dn_w
        total += a if a > b else b
        a = (prefill_attn + decode_ctx) * self._attn_f
        b = t * self._attn_qo + (prefill_tokens + decode_ctx) * self._attn_kv
        total += a if a > b else b
        s = prefill_seqs + decode_seqs
        if s > 0:
            a = s * self._lm_f
            b = s * self._lm_b + self._lm_w
            total += a if a > b else b
        return total

    def _step_time_general(self, *features) -> float:
        """`step_time` of a model whose layers differ: the sum of `breakdown`'s time terms."""
        out = self.breakdown(*features)
        return sum(out[k] for k in _TIME_TERMS)

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        prefill_ctx: int = 0,
    ) -> dict[str, float]:
        """The same step term by term, from FLOPs and bytes (slow; for metrics and tests).
        ``prefill_ctx``: cached prefix tokens the step's prefill chunks attend to, summed
        (MLA up-projects them again, under ``gemm``; see `ShardedModel._mla_ops`).

        Returns seconds per term (``gemm``, ``attention``, ``elementwise``, ``lm_head``,
        ``allreduce``, ``overhead``; they sum to `step_time`), the FLOPs / HBM bytes of one GPU
        (``flops``, ``bytes``), and ``gemm_compute_s`` / ``gemm_memory_s`` (the two sides of the
        GEMM rooflines, summed) to tell compute-bound from memory-bound steps.
        """
        sm, bw = self.served, self.gpu.peak_bandwidth
        L = sm.layers  # noqa: N806
        t = prefill_tokens + decode_seqs
        n = prefill_seqs + decode_seqs
        out = dict.fromkeys(
            ("gemm", "attention", "elementwise", "lm_head", "allreduce", "expert_comm",
             "gemm_compute_s"), 0.0,
        )  # fmt: skip
        out.update(gemm_memory_s=0.0, flops=0.0, bytes=0.0, overhead=self.step_overhead_s)
        if t <= 0:
            return out

        def op(term: str, f: float, b: float, peak: float) -> None:
            out[term] += max(f / peak, b / bw)
            out["flops"] += f
            out["bytes"] += b

        for g in sm.ops:
            if g.scope != "layer" or g.kind not in ("gemm", "moe"):
                continue
            n_layers = sm.layers_of(g)
            load = self._ep_load(g, t) if g.ep else 1.0  # busiest GPU's tokens over the mean
            f = n_layers * t * g.count * g.flops_per_token * load
            b = n_layers * g.count * (self._weight_read(g, t) + t * g.act_bytes_per_token * load)
            op("gemm", f, b, self._gemm_peak)
            out["gemm_compute_s"] += f / self._gemm_peak
            out["gemm_memory_s"] += b / bw
        if prefill_ctx and sm.prefill_context_flops_per_token:
            # MLA: the kv_b up-projection of every cached prefix token, every chunk (its
            # weights are read once above)
            f = sm.prefill_context_flops_per_token * prefill_ctx
            b = sm.prefill_context_bytes_per_token * prefill_ctx
            op("gemm", f, b, self._gemm_peak)
            out["gemm_compute_s"] += f / self._gemm_peak
            out["gemm_memory_s"] += b / bw
        attn = sm.op("attention")
        attn_f = L * attn.flops_per_token * (prefill_attn + decode_ctx)
        attn_f += sm.prefill_pair_extra_flops * prefill_attn  # MLA's prefill path; else 0.0
        attn_b = L * (
            t * attn.act_bytes_per_token + (prefill_tokens + decode_ctx) * attn.kv_bytes_per_key
        )
        op("attention", attn_f, attn_b, self.gpu.peak_flops)
        op("elementwise", 0.0, t * _elementwise_bytes_per_token(sm), self.gpu.peak_flops)
        if n > 0:
            lm, sampler = sm.op("lm_head"), sm.op("sampling")
            lm_b = lm.weight_bytes + n * (lm.act_bytes_per_token + sampler.act_bytes_per_token)
            op("lm_head", n * lm.flops_per_token, lm_b, self.gpu.peak_flops_for(lm.in_dtype))
        if self.tp > 1:
            self._collectives(out, t)
        return out

    def _collectives(self, out: dict, t: float) -> None:
        """Charge every collective op of the step (`StepCollectives`: measured on this GPU
        when `collectives` holds its table, else the link estimate, flagged in `describe`):
        all-reduces under ``allreduce``, expert-parallel dispatch / combine / all-gather under
        ``expert_comm``."""
        allreduce, expert = self._step_collectives.seconds(t)
        out["allreduce"] += allreduce
        out["expert_comm"] += expert

    def _weight_read(self, op, tokens: float) -> float:
        """Weight bytes ``op`` reads in a step of ``tokens`` tokens: all of them, or for routed
        experts those of the distinct experts the tokens touch (`expected_experts_touched`;
        with expert parallelism, the expected most any GPU touches, `ep_experts_touched`, or
        under a skewed router `simulator.ep_skew.ep_skewed_touched`)."""
        if op.kind != "moe":
            return op.weight_bytes
        if op.ep:
            e, skew = op.experts * op.ep, self.moe_routing_skew
            if skew:
                _, touched = ep_skewed_touched(e, op.top_k, op.ep, skew, tokens)
            else:
                _, touched = ep_experts_touched(e, op.top_k, op.ep, tokens)
            return op.weight_bytes * touched / op.experts
        touched = expected_experts_touched(op.experts, op.top_k, tokens, self.moe_routing_skew)
        return op.weight_bytes * touched / op.experts

    def _ep_load(self, op, tokens: float) -> float:
        """The busiest GPU's expert copies over the mean (>= 1) for an expert-parallel op: its
        per-token figures are the mean share, the step waits for the expected max
        (`ep_expert_tokens`; under a skewed router `simulator.ep_skew.ep_skewed_tokens`, where
        the hot experts' placement adds to the sampling noise)."""
        e, skew = op.experts * op.ep, self.moe_routing_skew
        if skew:
            mean, most = ep_skewed_tokens(e, op.top_k, op.ep, skew, tokens)
        else:
            mean, most = ep_expert_tokens(e, op.top_k, op.ep, tokens)
        return most / mean if mean > 0 else 1.0

    def describe(self) -> dict:
        """Metadata for summary.json: kind, hardware, ceilings and the optimism warning (and,
        with expert parallelism, its layout and the warning that its costs are estimates)."""
        out = self._describe_base()
        if self.collectives is not None:
            out["collectives"] = self.collectives.describe()
        if self.expert_parallel:
            out["expert_parallel"] = self.expert_parallel
            measured = self.collectives is not None
            out["warnings"].append(_EP_WARNINGS[self.expert_parallel, measured])
        return out

    def _describe_base(self) -> dict:
        link = self.allreduce_link
        return {
            "kind": "roofline",
            "name": self.name,
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "peak_flops": self.gpu.peak_flops,
            "gemm_peak_flops": self._gemm_peak,
            "precision": self.model.precision.describe(),
            "peak_bandwidth": self.gpu.peak_bandwidth,
            "ceilings": self.gpu.ceilings_source,
            "step_overhead_s": self.step_overhead_s,
            "allreduce_link": (
                None
                if link is None or self.tp == 1
                else {"name": link.name, "bandwidth": link.bandwidth, "latency_s": link.latency}
            ),
            "warnings": [
                "roofline: optimistic bound from FLOPs and bytes at peak rates, not profiled; "
                "latencies are lower bounds and throughputs upper bounds"
            ]
            + ([self.fallback_reason] if self.fallback_reason else []),
        }

    def __repr__(self) -> str:
        ep = f", expert_parallel={self.expert_parallel!r}" if self.expert_parallel else ""
        return f"RooflineLatencyModel({self.model.name!r}, {self.gpu.name!r}, tp={self.tp}{ep})"


#: `breakdown` keys that are seconds (they sum to `step_time`)
_TIME_TERMS = ("gemm", "attention", "elementwise", "lm_head", "allreduce", "overhead",
               "expert_comm")  # fmt: skip


#: what `describe` says of each expert-parallel layout (`simulator.served.EP_MODES`)
_EP_WARNINGS = {
    ("allreduce", False): "expert parallelism (vLLM --enable-expert-parallel at DP 1): the MoE "
    "all-reduce is estimated from link bandwidth, not measured; the busiest GPU's expert load "
    "is the normal approximation for uniform routing",
    ("allreduce", True): "expert parallelism (vLLM --enable-expert-parallel at DP 1): the MoE "
    "all-reduce is NCCL's measured on this GPU (`collectives`), not vLLM's custom all-reduce; "
    "the busiest GPU's expert load is the normal approximation for uniform routing",
    ("all_to_all", False): "expert-parallel all-to-all estimated from link bandwidth, not "
    "measured (dispatch, combine and all-gather per MoE layer); the busiest GPU's expert load "
    "is the normal approximation for uniform routing",
    ("all_to_all", True): "expert-parallel dispatch, combine and all-gather charged NCCL's "
    "all-to-all and all-gather measured on this GPU (`collectives`; DeepEP / pplx kernels "
    "not measured); the busiest GPU's expert load is the normal approximation for uniform "
    "routing",
}


def _elementwise_bytes_per_token(sm: ShardedModel) -> float:
    """HBM bytes per computed token of the bandwidth-bound elementwise ops (layers' and the
    step's: norms, rotary, SiLU-and-mul, KV-cache write, embedding gather, final norm)."""
    total = 0.0
    for o in sm.ops:
        if o.kind == "elementwise":
            per = o.count * o.act_bytes_per_token
            total += sm.layers_of(o) * per if o.scope == "layer" else per
    return total


__all__ = ["DEFAULT_STEP_OVERHEAD_S", "RooflineLatencyModel"]
