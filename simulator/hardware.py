"""GPU and interconnect catalogs, and how many KV-cache blocks fit on a replica.

`GPUSpec` keeps two kinds of ceilings:

* the vendor *spec* numbers (``hbm_bandwidth``, ``bf16_flops`` / ``fp8_flops``: dense bf16 /
  FP8 tensor-core FLOP/s, without sparsity; ``fp8_flops`` is None on GPUs without FP8 tensor
  cores, A100), and
* *measured* ceilings (``measured_flops``, ``measured_bandwidth``) where we have them: large bf16
  matmuls and device-to-device copies timed with torch 2.11 on this workplace's H100 and H200
  machines (about 800 TFLOP/s and 3.0 TB/s on H100, 790 TFLOP/s and 4.3 TB/s on H200).

Latency models use `GPUSpec.peak_flops` / `GPUSpec.peak_bandwidth`: the measured ceiling when
present, else the spec times a default efficiency derived from those same measurements (about 0.80
of spec FLOP/s and 0.90 of spec bandwidth on both H100 and H200). `GPUSpec.peak_flops_for` gives
the ceiling of a GEMM input dtype: FP8's is its spec times the efficiency measured for bf16 (an
assumption until FP8 matmuls are timed here).

``memory_bytes`` is the capacity the CUDA driver reports (``torch.cuda.mem_get_info()[1]``), which
is what vLLM multiplies by ``gpu_memory_utilization``; it is a little below the marketing figure
("80 GB" H100: 79.18 GiB). ``price_per_hour`` is an ASSUMPTION (on-demand $/GPU-hour, typical of
2024-25 GPU-cloud list prices, not a quote); override it in YAML, e.g.
``gpu: {base: h100-sxm, price_per_hour: 2.2}``.

Everything here is a frozen dataclass built from literals: no file is read at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.cfg import REQUIRED, Section
from simulator.errors import ConfigError
from simulator.models import ModelSpec, check_name_or_mapping, lookup_catalog
from simulator.precision import ACT_DTYPE, DTYPE_BYTES
from simulator.served import LOGIT_BYTES, ShardedModel

GiB = 1024**3

#: Fraction of spec dense bf16 FLOP/s a large torch matmul reaches (H100 800/989, H200 790/989).
DEFAULT_FLOPS_EFFICIENCY = 0.80
#: Fraction of spec HBM bandwidth a large device-to-device copy reaches (H100 3.0/3.35,
#: H200 4.3/4.8).
DEFAULT_BANDWIDTH_EFFICIENCY = 0.90


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU model. Bandwidths in bytes/s, compute in FLOP/s, memory in bytes, $ per hour.

    Invariants: all numbers positive; ``nvlink_bandwidth`` (per direction) is None for GPUs
    without NVLink; measured ceilings, when given, are positive. ``tdp_w`` (datasheet board
    power) only feeds the energy estimate of runs without measured power (`simulator.energy`).
    """

    name: str
    memory_bytes: float
    hbm_bandwidth: float
    bf16_flops: float
    price_per_hour: float
    nvlink_bandwidth: float | None = None
    measured_flops: float | None = None
    measured_bandwidth: float | None = None
    fp8_flops: float | None = None
    #: board power limit in W (datasheet TDP); None: unknown, and so is a TDP energy estimate
    tdp_w: float | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        for f in ("memory_bytes", "hbm_bandwidth", "bf16_flops", "price_per_hour"):
            _require_pos(self, f, getattr(self, f))
        for f in ("nvlink_bandwidth", "measured_flops", "measured_bandwidth", "fp8_flops", "tdp_w"):
            if getattr(self, f) is not None:
                _require_pos(self, f, getattr(self, f))

    @property
    def peak_flops(self) -> float:
        """Compute ceiling for latency models: measured, else spec x default efficiency."""
        if self.measured_flops is not None:
            return self.measured_flops
        return self.bf16_flops * DEFAULT_FLOPS_EFFICIENCY

    def peak_flops_for(self, dtype: str) -> float:
        """Compute ceiling of GEMMs whose inputs are ``dtype`` (bf16 | fp8): `peak_flops` for
        bf16; for fp8 the FP8 spec times the efficiency bf16 reaches here (measured / spec, else
        the default). ValueError when this GPU has no tensor cores for ``dtype``."""
        if dtype == ACT_DTYPE:
            return self.peak_flops
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores (no fp8_flops)")
            return self.fp8_flops * (self.peak_flops / self.bf16_flops)
        raise ValueError(f"no FLOP ceiling for GEMM inputs of dtype {dtype!r}")

    @property
    def peak_bandwidth(self) -> float:
        """Memory ceiling for latency models: measured, else spec x default efficiency."""
        if self.measured_bandwidth is not None:
            return self.measured_bandwidth
        return self.hbm_bandwidth * DEFAULT_BANDWIDTH_EFFICIENCY

    def table_keys(self) -> list[str]:
        """The ``profiles/<key>/`` names whose tables may time this GPU, in order: its name, then
        its family (h200-nvl -> h200)."""
        return list(dict.fromkeys([self.name, self.name.split("-")[0]]))

    @property
    def ceilings_source(self) -> dict[str, str]:
        """Where `peak_flops` and `peak_bandwidth` come from, for run metadata."""
        return {
            "flops": "measured" if self.measured_flops is not None else "spec x efficiency",
            "bandwidth": "measured" if self.measured_bandwidth is not None else "spec x efficiency",
        }


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """A point-to-point link: bandwidth in bytes/s per direction, fixed latency in seconds.

    Transfer time model (used for KV transfer and TP collectives): ``latency + bytes/bandwidth``.
    """

    name: str
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        _require_pos(self, "bandwidth", self.bandwidth)
        if not self.latency >= 0:
            raise ValueError(f"{self.name}: latency must be >= 0, got {self.latency!r}")

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` one way."""
        return self.latency + nbytes / self.bandwidth


def _require_pos(obj: Any, field: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{obj.name}: {field} must be a positive number, got {v!r}")


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="h100-sxm",
            memory_bytes=85_017_493_504,  # measured: torch total_memory, "80GB HBM3", 79.18 GiB
            hbm_bandwidth=3.35e12,
            bf16_flops=989e12,
            price_per_hour=3.00,
            nvlink_bandwidth=450e9,  # NVLink 4: 900 GB/s bidirectional
            measured_flops=800e12,
            measured_bandwidth=3.0e12,
            fp8_flops=1979e12,
            tdp_w=700,  # datasheet max TDP
            notes="spec: NVIDIA H100 SXM5 datasheet; measured: torch 2.11 on this workplace",
        ),
        GPUSpec(
            name="h200",
            memory_bytes=150_109_880_320,  # measured: torch total_memory, "141GB", 139.80 GiB
            hbm_bandwidth=4.8e12,
            bf16_flops=989e12,
            price_per_hour=3.80,
            nvlink_bandwidth=450e9,
            measured_flops=790e12,
            measured_bandwidth=4.3e12,
            fp8_flops=1979e12,
            tdp_w=700,  # datasheet max TDP
            notes="spec: NVIDIA H200 SXM datasheet; measured: torch 2.11 on this workplace",
        ),
        GPUSpec(
            name="a100-80gb",
            memory_bytes=79.15
            * GiB,  # as PyTorch reports it (out-of-memory messages); not measured
            hbm_bandwidth=2.039e12,
            bf16_flops=312e12,
            price_per_hour=1.80,
            nvlink_bandwidth=300e9,  # NVLink 3: 600 GB/s bidirectional
            tdp_w=400,  # datasheet max TDP
            notes="spec: NVIDIA A100 80GB SXM datasheet; ceilings = spec x default efficiency",
        ),
        GPUSpec(
            name="l40s",
            memory_bytes=44.5 * GiB,  # 48 GB GDDR6 (46068 MiB in nvidia-smi) less driver reserve
            hbm_bandwidth=864e9,
            bf16_flops=362e12,
            fp8_flops=733e12,
            price_per_hour=1.00,
            nvlink_bandwidth=None,  # PCIe Gen4 x16 only
            tdp_w=350,  # datasheet max TDP
            notes="spec: NVIDIA L40S datasheet; ceilings = spec x default efficiency",
        ),
    )
}

GPU_ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h200-sxm": "h200",
    "a100": "a100-80gb",
    "a100-sxm": "a100-80gb",
}

#: Link presets. Bandwidth is per direction; latency is the small-message cost of one transfer
#: or collective step through NCCL (a few microseconds), not the wire latency alone.
LINKS: dict[str, LinkSpec] = {
    lk.name: lk
    for lk in (
        LinkSpec(name="nvlink4", bandwidth=450e9, latency=3e-6),  # H100/H200, 900 GB/s bidir
        LinkSpec(name="nvlink3", bandwidth=300e9, latency=3e-6),  # A100, 600 GB/s bidir
        LinkSpec(name="infiniband-ndr", bandwidth=50e9, latency=5e-6),  # 400 Gb/s
        LinkSpec(name="infiniband-hdr", bandwidth=25e9, latency=5e-6),  # 200 Gb/s
        LinkSpec(name="roce-400g", bandwidth=50e9, latency=8e-6),
        LinkSpec(name="roce-200g", bandwidth=25e9, latency=8e-6),
        LinkSpec(name="pcie-gen5-x16", bandwidth=50e9, latency=5e-6),  # 64 GB/s theoretical
        LinkSpec(name="pcie-gen4-x16", bandwidth=25e9, latency=5e-6),  # 32 GB/s theoretical
    )
}

#: Latency of an intra-node NVLink hop, used for `default_tp_link` of custom NVLink GPUs.
NVLINK_LATENCY_S = 3e-6


def default_tp_link(gpu: GPUSpec) -> LinkSpec:
    """Link TP collectives use inside a node: the GPU's NVLink, else PCIe Gen4 x16."""
    if gpu.nvlink_bandwidth is None:
        return LINKS["pcie-gen4-x16"]
    return LinkSpec(
        name=f"nvlink:{gpu.name}", bandwidth=gpu.nvlink_bandwidth, latency=NVLINK_LATENCY_S
    )


def load_gpu(value: Any, where: str, key: str) -> GPUSpec:
    """Read a GPU from config: a catalog name (case-insensitive) or a mapping.

    Mapping keys use decimal units: ``memory_gb`` (1e9 bytes), ``hbm_bandwidth_gb_s``,
    ``bf16_tflops``, ``price_per_hour``, ``nvlink_bandwidth_gb_s`` (null: none),
    ``fp8_tflops`` (null: no FP8), ``measured_tflops``, ``measured_bandwidth_gb_s``, ``tdp_w``
    (watts; null or absent on a GPU without ``base``: energy is reported as unknown), ``name``.
    With ``base: <catalog name>``
    every key is optional and overrides the base value.
    """
    if isinstance(value, str):
        return lookup_catalog(value, GPUS, GPU_ALIASES, "gpu", where, key)
    check_name_or_mapping(value, "GPU", where, key)
    sec = Section(value, where, key)
    base_name = sec.str("base", None)
    base = None
    if base_name is not None:
        base = lookup_catalog(base_name, GPUS, GPU_ALIASES, "gpu", where, sec.key("base"))

    def dflt(field: str, scale: float, fallback: Any = REQUIRED) -> Any:
        if base is None:
            return fallback
        v = getattr(base, field)
        return None if v is None else v / scale

    def pos(name: str, field: str, scale: float, fallback: Any = REQUIRED) -> float | None:
        if fallback is None and sec.has(name) and sec.data[name] is None:
            sec.raw(name)  # optional field explicitly set to null: "none"
            return None
        v = sec.num(name, dflt(field, scale, fallback), min=0, strict_min=True)
        if v is not None and not math.isfinite(v):  # NaN passes the range check
            raise sec.error(name, f"expected a finite number > 0, got {v}")
        return None if v is None else v * scale

    name = sec.str("name", base.name if base else "custom")
    gpu = GPUSpec(
        name=name,
        memory_bytes=pos("memory_gb", "memory_bytes", 1e9),
        hbm_bandwidth=pos("hbm_bandwidth_gb_s", "hbm_bandwidth", 1e9),
        bf16_flops=pos("bf16_tflops", "bf16_flops", 1e12),
        price_per_hour=pos("price_per_hour", "price_per_hour", 1.0),
        nvlink_bandwidth=pos("nvlink_bandwidth_gb_s", "nvlink_bandwidth", 1e9, None),
        measured_flops=pos("measured_tflops", "measured_flops", 1e12, None),
        measured_bandwidth=pos("measured_bandwidth_gb_s", "measured_bandwidth", 1e9, None),
        fp8_flops=pos("fp8_tflops", "fp8_flops", 1e12, None),
        tdp_w=pos("tdp_w", "tdp_w", 1.0, None),
        notes=sec.str("notes", base.notes if base else "custom GPU from config"),
    )
    sec.done()
    return gpu


def load_link(value: Any, where: str, key: str) -> LinkSpec:
    """Read a link: a preset name, or ``{bandwidth_gb_s, latency_s, name}`` (``base`` allowed)."""
    if isinstance(value, str):
        return lookup_catalog(value, LINKS, {}, "link", where, key)
    check_name_or_mapping(value, "link", where, key)
    sec = Section(value, where, key)
    base_name = sec.str("base", None)
    base = None
    if base_name is not None:
        base = lookup_catalog(base_name, LINKS, {}, "link", where, sec.key("base"))
    bw = sec.num(
        "bandwidth_gb_s", base.bandwidth / 1e9 if base else REQUIRED, min=0, strict_min=True
    )
    lat = sec.num("latency_s", base.latency if base else REQUIRED, min=0)
    name = sec.str("name", base.name if base else "custom")
    sec.done()
    return LinkSpec(name=name, bandwidth=bw * 1e9, latency=lat)


# ---- KV capacity ---------------------------------------------------------------------------

#: Memory outside torch's activations that an engine holds per GPU: CUDA context, cuBLAS and
#: NCCL workspaces, allocator slack (vLLM's profiling reports a few hundred MiB "non-torch").
NON_TORCH_RESERVE_BYTES = 0.5 * GiB


def default_activation_reserve_bytes(
    model: ModelSpec, tp: int = 1, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256
) -> float:
    """Per-GPU memory kept out of the KV cache for activations, like vLLM's profiling run.

    ``0.5 GiB`` (non-torch) ``+ max_num_batched_tokens x 2 B x (2 x hidden + 3 x
    intermediate / tp)`` (peak live tensors in the MLP: residual and hidden states, the gate/up
    output, the SiLU product) ``+ max_num_seqs x vocab x 8 B`` (fp32 logits and probabilities
    for the sampler). Llama-3-8B, TP1: about 1.6 GB, close to the ~1.4 GiB vLLM reports. The
    budgets are the scheduler's (`EngineSpec.parse` passes them), as vLLM profiles with them.
    """
    served = ShardedModel(model, tp)
    per_token = DTYPE_BYTES[ACT_DTYPE] * (2 * served.hidden + 3 * served.inter)
    logits = max_num_seqs * model.vocab_size * 2 * LOGIT_BYTES
    return NON_TORCH_RESERVE_BYTES + max_num_batched_tokens * per_token + logits


def check_precision(model: ModelSpec, gpu: GPUSpec, where: str, key: str) -> None:
    """Raise ConfigError when ``gpu`` cannot run ``model``'s GEMMs in their input dtype (FP8
    W8A8 on a GPU without FP8 tensor cores, e.g. A100)."""
    dtype = ShardedModel(model).weight_format.gemm_dtype
    try:
        gpu.peak_flops_for(dtype)
    except ValueError as e:
        raise ConfigError(
            where, key, f"{model.name} with weights: {model.weights} needs {dtype} GEMMs: {e}"
        ) from None


def kv_capacity_blocks(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: float | None = None,
    *,
    where: str = "<config>",
    key: str = "",
    block_key: str = "",
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
) -> int:
    """KV-cache blocks of ``block_size`` tokens one replica (a TP group of ``tp`` GPUs) holds.

    Each GPU keeps ``memory x utilization - weights / tp - reserve`` for KV, where ``reserve``
    is ``activation_reserve_bytes`` (per GPU) or `default_activation_reserve_bytes`. A token's KV
    is split over the group's GPUs, so the replica holds
    ``floor(free_per_gpu / (block_size x kv_bytes_per_token_per_gpu))`` blocks; when tp divides
    the KV heads this equals ``floor((memory x util x tp - weights - tp x reserve) /
    (block_size x kv_bytes_per_token))``. (When tp exceeds the KV heads, heads are replicated and
    capacity stops growing with tp.)

    With layer groups that free blocks (sliding windows) a block is one pool block of
    `simulator.served.KVPool` (a page for ``unit_layers`` layers) instead of a block over all
    layers; with one group (dense or MLA models) the two are the same.

    Raises ConfigError (at ``where`` / ``key``) when the weights and reserve do not fit or not
    even one block is left; at ``block_key`` (when given) instead when a smaller block would
    fit, so that the error names the field to change.
    """
    model.check_tp(tp, where, key)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(where, key, f"block_size must be a positive integer, got {block_size!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(
            where, key, f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    if activation_reserve_bytes is None:
        reserve = default_activation_reserve_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    else:
        reserve = float(activation_reserve_bytes)
    served = ShardedModel(model, tp)
    budget = gpu.memory_bytes * gpu_memory_utilization
    weights = served.weight_bytes_per_gpu
    free = budget - weights - reserve
    block_bytes = served.kv_pool(block_size).unit_bytes  # one pool block (KVPool)
    blocks = math.floor(free / block_bytes) if free > 0 else 0
    if blocks < 1:
        smaller_fits = free >= block_bytes / block_size  # a one-token block would fit
        fix = "a smaller block_size" if smaller_fits else "a higher gpu_memory_utilization"
        raise ConfigError(
            where,
            block_key if smaller_fits and block_key else key,
            f"{model.name} does not fit on {tp} x {gpu.name}: per GPU, weights "
            f"{weights / GiB:.1f} GiB + activation reserve {reserve / GiB:.1f} GiB leave "
            f"{max(free, 0) / GiB:.2f} GiB of {budget / GiB:.1f} GiB "
            f"(memory x gpu_memory_utilization {gpu_memory_utilization}) for the KV cache, "
            f"less than one block ({block_bytes / 2**20:.1f} MiB of block_size "
            f"{block_size}); use {fix}, more GPUs (tp) or a larger GPU",
        )
    return blocks


__all__ = [
    "DEFAULT_BANDWIDTH_EFFICIENCY",
    "DEFAULT_FLOPS_EFFICIENCY",
    "GPUS",
    "GPU_ALIASES",
    "GPUSpec",
    "LINKS",
    "LinkSpec",
    "default_activation_reserve_bytes",
    "check_precision",
    "default_tp_link",
    "kv_capacity_blocks",
    "load_gpu",
    "load_link",
]
