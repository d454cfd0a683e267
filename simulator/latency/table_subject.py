"""Did a table measure what a run serves? The model's shapes and the GPU, beside the precision,
routing and layout checks of `simulator.latency.select._table_mismatch`.

Why: tables are found by name (``profiles/<gpu>/<model>_tp<k>/``), and a run may keep a catalog
name while changing what the name stood for: ``model: {base: llama-3-8b, num_layers: 64}``, a
config.json whose folder is named like a catalog model, ``hardware.gpu: {base: h200,
hbm_bandwidth_gb_s: 100}``, or a table named with ``latency.table`` from another GPU's folder.
Each of those was timed by the table as if nothing had changed. A table times the model of its
``meta.yaml``'s ``model.name`` as the catalog defines it, on the GPU of its ``gpu.key``; a run
whose model differs in a field that sets step time, or whose GPU is another or differs in a
performance field, is not what the table measured.

Fields that do not set step time are left out: ``max_model_len`` (capacity), ``name``, and the
GPU's price, board power and notes. Precision and router skew have their own checks
(`_table_mismatch`). A table whose model is not in the catalog (a custom model profiled by name)
is checked by name where it is loaded (`EngineStepModel._check_matches`).
"""

from __future__ import annotations

import dataclasses

from simulator.hardware import GPU_ALIASES, GPUS, GPUSpec
from simulator.models import MODEL_ALIASES, MODELS, ModelSpec

#: the ModelSpec fields a step's time depends on (beyond precision and routing skew)
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
    "vocab_size", "tie_embeddings", "qkv_bias", "family", "layer_types", "sliding_window",
    "attention_sinks", "mla", "moe",
)  # fmt: skip
#: the GPUSpec fields a step's time depends on (not price, board power or notes)
GPU_FIELDS = (
    "memory_bytes", "hbm_bandwidth", "bf16_flops", "fp8_flops", "nvlink_bandwidth",
    "measured_flops", "measured_bandwidth",
)  # fmt: skip


def shape_mismatch(meta: dict, model: ModelSpec, label: str) -> str | None:
    """Why the table ``label`` (its ``meta``) did not measure ``model``'s shapes, or None."""
    name = str((meta.get("model") or {}).get("name", "")).lower()
    measured = MODELS.get(MODEL_ALIASES.get(name, name))
    if measured is None:
        return None
    diff = _differing(measured, model, SHAPE_FIELDS, _routing_free)
    if not diff:
        return None
    return (
        f"the table {label} measured {measured.name} as catalogued; this run's {model.name} "
        f"differs in {_listed(diff, measured, model)}"
    )


def gpu_mismatch(meta: dict, gpu: GPUSpec, label: str) -> str | None:
    """Why the table ``label`` (its ``meta``) did not measure ``gpu``, or None. A catalog GPU's
    table times that GPU as catalogued; a table of a GPU the catalog does not hold (new hardware,
    profiled with ``--gpu-key``) times the run's GPU of that name (its fields are the user's).
    A table without ``gpu.key`` (none shipped) is not checked here."""
    key = str((meta.get("gpu") or {}).get("key", "")).lower()
    if not key:
        return None
    measured = GPUS.get(GPU_ALIASES.get(key, key))
    if measured is None:
        if key in (k.lower() for k in gpu.table_keys()):
            return None
        return f"the table {label} measured gpu {key!r}; this run's GPU is {gpu.name}"
    name = gpu.name.lower()
    run = GPUS.get(GPU_ALIASES.get(name, name))
    if run is None or run.name != measured.name:
        return f"the table {label} measured the {measured.name}; this run's GPU is {gpu.name}"
    diff = _differing(measured, gpu, GPU_FIELDS)
    if not diff:
        return None
    return (
        f"the table {label} measured the {measured.name} as catalogued; this run's GPU "
        f"{gpu.name} differs in {_listed(diff, measured, gpu)}"
    )


def _routing_free(spec: ModelSpec) -> ModelSpec:
    """``spec`` with a uniform router: the skew is `_table_mismatch`'s own check."""
    if spec.moe is None or not spec.moe.routing_skew:
        return spec
    return dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, routing_skew=0.0))


def _differing(measured, run, fields: tuple[str, ...], normal=lambda x: x) -> list[str]:
    a, b = normal(measured), normal(run)
    return [f for f in fields if getattr(a, f) != getattr(b, f)]


def _listed(fields: list[str], measured, run) -> str:
    """``num_layers (64 here, 32 in the table's)``, for at most three fields (then a count)."""
    shown = [f"{f} ({_short(getattr(run, f))} here, {_short(getattr(measured, f))} in the "
             "table's)" for f in fields[:3]]  # fmt: skip
    more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
    return ", ".join(shown) + more


def _short(value) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
