"""Roofline step latency: an optimistic bound, labelled ``roofline``.

Used when no profiled step-latency table exists for a (model, GPU, TP) combination. Every
operation of a forward step is charged ``max(FLOPs / peak_flops, bytes / peak_bandwidth)`` on one
GPU of the TP group, and the operations are summed. Real kernels are slower (launch gaps, tile
quantization, imperfect overlap, small-batch GEMM inefficiency), so simulated latencies are
lower bounds and simulated throughputs upper bounds; `describe` says so in every output.

Ceilings are `GPUSpec.peak_flops` / `GPUSpec.peak_bandwidth`: measured matmul / copy rates where
known (H100, H200), else spec x a default efficiency.

Operations of one step (T = prefill_tokens + decode_seqs tokens computed, S = prefill_seqs +
decode_seqs sequences that sample), per GPU of a TP group of ``tp``:

* per layer, four GEMMs: QKV, O, gate/up, down. Weights (1/tp of them) are read once per step;
  activations are read and written once. FLOPs = 2 x T x weight parameters.
* attention, one varlen kernel over the batch (as in vLLM v1): FLOPs = 4 x heads/tp x head_dim
  x (prefill_attn + decode_ctx) per layer; bytes = Q read and O written for every token, K and V
  read for the ``decode_ctx`` keys of decoding sequences and for the new prompt tokens (keys of
  earlier chunks are not in the features, so their reads are left out: a lower bound).
* elementwise, bandwidth-bound: two fused residual-add + RMSNorm per layer, rotary on q and k,
  SiLU-and-mul, the KV-cache write, plus the embedding gather and final norm once per step.
* LM head (1/tp of the vocabulary) and sampler (fp32 logits written and read) for the S
  sequences that sample only.
* TP all-reduce when tp > 1: two per layer over T x hidden bf16 values, ring cost
  ``2 (tp-1)/tp x bytes / link bandwidth + link latency`` each.
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

from simulator.hardware import GPUSpec, LinkSpec, default_tp_link
from simulator.models import ACT_BYTES, ModelSpec

#: Default fixed cost of one engine step outside GPU kernels, seconds (see module docstring).
DEFAULT_STEP_OVERHEAD_S = 1e-3

#: Bytes per logit in the sampler (fp32), written once and read once.
_LOGIT_BYTES = 4


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
        "_shape",
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

        s = _per_gpu_shape(model, tp)
        self._shape = s
        flops, bw = gpu.peak_flops, gpu.peak_bandwidth
        L, bpw = model.num_layers, model.bytes_per_weight  # noqa: N806

        # GEMMs: time = max(T * f, T * b + w), summed over layers.
        def gemm(params: float, act_in: float, act_out: float) -> tuple[float, float, float]:
            return (
                L * 2 * params / flops,
                L * (act_in + act_out) * ACT_BYTES / bw,
                L * params * bpw / bw,
            )

        self._qkv_f, self._qkv_b, self._qkv_w = gemm(s["qkv_params"], s["hidden"], s["qkv_out"])
        self._o_f, self._o_b, self._o_w = gemm(s["o_params"], s["q_out"], s["hidden"])
        self._gu_f, self._gu_b, self._gu_w = gemm(s["gu_params"], s["hidden"], 2 * s["inter"])
        self._dn_f, self._dn_b, self._dn_w = gemm(s["dn_params"], s["inter"], s["hidden"])

        # Attention: max(pairs * f, T * qo + kv_tokens * kv).
        self._attn_f = L * 4 * s["q_out"] / flops
        self._attn_qo = L * 2 * s["q_out"] * ACT_BYTES / bw
        self._attn_kv = L * 2 * s["kv_out"] * model.bytes_per_kv / bw

        # LM head + sampler: max(S * f, S * b + w), per sampling sequence.
        self._lm_f = 2 * s["lm_params"] / flops
        self._lm_b = (
            (s["hidden"] + s["vocab"]) * ACT_BYTES + 2 * model.vocab_size * _LOGIT_BYTES
        ) / bw
        self._lm_w = s["lm_params"] * bpw / bw

        # Linear in T: elementwise ops and all-reduce bandwidth; fixed: overhead + latencies.
        lin = s["elementwise_bytes_per_token"] / bw
        fixed = self.step_overhead_s
        if tp > 1:
            link = self.allreduce_link
            ring = 2 * (tp - 1) / tp
            lin += 2 * L * ring * s["hidden"] * ACT_BYTES / link.bandwidth
            fixed += 2 * L * link.latency
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
    ) -> float:
        """Seconds one step takes (see the module docstring for what is counted). The bound
        reads every key once whatever the spread, so ``decode_max`` is not used."""
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

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
    ) -> dict[str, float]:
        """The same step term by term, from FLOPs and bytes (slow; for metrics and tests).

        Returns seconds per term (``gemm``, ``attention``, ``elementwise``, ``lm_head``,
        ``allreduce``, ``overhead``; they sum to `step_time`), the FLOPs / HBM bytes of one GPU
        (``flops``, ``bytes``), and ``gemm_compute_s`` / ``gemm_memory_s`` (the two sides of the
        GEMM rooflines, summed) to tell compute-bound from memory-bound steps.
        """
        m, s = self.model, self._shape
        flops, bw = self.gpu.peak_flops, self.gpu.peak_bandwidth
        L = m.num_layers  # noqa: N806
        t = prefill_tokens + decode_seqs
        n = prefill_seqs + decode_seqs
        out = dict.fromkeys(
            ("gemm", "attention", "elementwise", "lm_head", "allreduce", "gemm_compute_s"), 0.0
        )
        out.update(gemm_memory_s=0.0, flops=0.0, bytes=0.0, overhead=self.step_overhead_s)
        if t <= 0:
            return out

        def op(term: str, f: float, b: float) -> None:
            out[term] += max(f / flops, b / bw)
            out["flops"] += f
            out["bytes"] += b

        gemms = (
            (s["qkv_params"], s["hidden"], s["qkv_out"]),
            (s["o_params"], s["q_out"], s["hidden"]),
            (s["gu_params"], s["hidden"], 2 * s["inter"]),
            (s["dn_params"], s["inter"], s["hidden"]),
        )
        for params, act_in, act_out in gemms:
            f = L * 2 * t * params
            b = L * (params * m.bytes_per_weight + t * (act_in + act_out) * ACT_BYTES)
            op("gemm", f, b)
            out["gemm_compute_s"] += f / flops
            out["gemm_memory_s"] += b / bw
        attn_f = L * 4 * s["q_out"] * (prefill_attn + decode_ctx)
        attn_b = L * (
            2 * t * s["q_out"] * ACT_BYTES
            + 2 * (prefill_tokens + decode_ctx) * s["kv_out"] * m.bytes_per_kv
        )
        op("attention", attn_f, attn_b)
        op("elementwise", 0.0, t * s["elementwise_bytes_per_token"])
        if n > 0:
            lm_f = 2 * n * s["lm_params"]
            lm_b = s["lm_params"] * m.bytes_per_weight + n * (
                (s["hidden"] + s["vocab"]) * ACT_BYTES + 2 * m.vocab_size * _LOGIT_BYTES
            )
            op("lm_head", lm_f, lm_b)
        if self.tp > 1:
            link = self.allreduce_link
            nbytes = t * s["hidden"] * ACT_BYTES
            ring = 2 * (self.tp - 1) / self.tp
            out["allreduce"] = 2 * L * (ring * nbytes / link.bandwidth + link.latency)
        return out

    def describe(self) -> dict:
        """Metadata for summary.json: kind, hardware, ceilings and the optimism warning."""
        link = self.allreduce_link
        return {
            "kind": "roofline",
            "name": self.name,
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tp": self.tp,
            "peak_flops": self.gpu.peak_flops,
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
        return f"RooflineLatencyModel({self.model.name!r}, {self.gpu.name!r}, tp={self.tp})"


def _per_gpu_shape(model: ModelSpec, tp: int) -> dict[str, float]:
    """Widths (elements) and parameter counts one GPU of a TP group handles.

    Heads, the MLP intermediate dimension and the vocabulary are split over ``tp``; KV heads are
    split, or replicated (one per GPU) when tp exceeds them, as vLLM does. ``hidden`` is not split.
    """
    h, d = model.hidden_size, model.head_dim
    q_out = model.num_heads // tp * d
    kv_out = model.kv_heads_per_gpu(tp) * d
    inter = model.intermediate_size / tp
    vocab = model.vocab_size / tp
    per_layer_elem = ACT_BYTES * (
        2 * 4 * h  # two fused residual-add + RMSNorm: read x and residual, write both
        + 2 * (q_out + kv_out)  # rotary: read and write q and k
        + 3 * inter  # SiLU-and-mul: read gate and up, write the product
    ) + 2 * kv_out * (ACT_BYTES + model.bytes_per_kv)  # KV-cache write: read k, v; store them
    per_step_elem = ACT_BYTES * (2 * h + 4 * h)  # embedding gather; final residual-add + norm
    return {
        "hidden": h,
        "q_out": q_out,
        "kv_out": kv_out,
        "qkv_out": q_out + 2 * kv_out,
        "inter": inter,
        "vocab": vocab,
        "qkv_params": h * (q_out + 2 * kv_out),
        "o_params": q_out * h,
        "gu_params": 2 * h * inter,
        "dn_params": inter * h,
        "lm_params": h * vocab,
        "elementwise_bytes_per_token": model.num_layers * per_layer_elem + per_step_elem,
    }


__all__ = ["DEFAULT_STEP_OVERHEAD_S", "RooflineLatencyModel"]
