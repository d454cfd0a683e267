"""The keys a profiled table's ``meta.yaml`` may hold, and the check that refuses any other.

Why: a table is user input (it may come from another machine, or be edited by hand), and its
readers take a missing key as "not measured" or fall back to a default: a misspelt key
(``per_gpu_shape``, ``allreduce_estimat``) would change the model without a word. So every
top-level key is known, and so is every key of a section the simulator reads field by field;
sections that only record how a table was made (grids, timings, kernels, vLLM's own config)
stay free-form.

The sets are the union of what the writers write: ``profiles/cli.py`` (torch op tables),
``profiles/vllm_table.py`` (engine-steps tables) and ``profiles/nccl_collectives.py``
(collectives). A writer that adds a key adds it here too (tests load every shipped table).
"""

from __future__ import annotations

from simulator.errors import ConfigError

#: a section's accepted keys, or None for a free-form record
Accepted = dict[str, frozenset[str] | None]


def _keys(*names: str) -> frozenset[str]:
    return frozenset(names)


#: step-latency tables: torch op tables (`simulator.latency.table`) and engine-steps tables
#: (`simulator.latency.engine_steps`)
TABLE_META: Accepted = {
    "schema_version": None, "kind": None, "variant": None, "tp": None, "dtype": None,
    "kv_cache_dtype": None, "quantization": None, "op_fingerprint": None, "routing": None,
    "routing_skew": None, "expert_parallel": None, "weights": None,
    "weights_loaded_gib_per_gpu": None, "kv_capacity_tokens": None, "torch_version": None,
    "cuda_version": None, "attention_backend": None, "varlen_signature": None,
    "attention_kv_layout": None, "decode_attention": None, "allreduce": None,
    "step_time": None, "date": None, "git_commit": None, "created_utc": None,
    "recorded_utc": None, "source": None,
    # records of how the table was made (never read key by key)
    "kernels": None, "engine_config": None, "steps": None, "grid": None,
    "points_measured_this_run": None, "time_taken_s": None, "routing_at_load": None,
    "launches_by_engine_process": None,
    # sections read field by field
    "engine": _keys("name", "version"),
    "gpu": _keys("key", "name", "count_visible", "memory_gib", "sm_count", "driver",
                 "clocks_mhz"),
    "model": _keys("name", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                   "intermediate_size", "vocab_size"),
    "precision": _keys("weights", "kv_cache_dtype"),
    "per_gpu_shapes": _keys("heads", "kv_heads", "intermediate", "vocab"),
    "allreduce_estimate": _keys("bus_gbps", "latency_us"),
    "step_runner": _keys("kv_layout", "shared_weights", "kv_capacity_tokens", "block_size",
                         "mixed_steps", "mixed_mode", "piecewise_sizes", "piecewise_capture_s",
                         "weight_gib"),
    "frontend": _keys("input_s", "input_s_per_token", "idle_plan_s", "output_s", "requests",
                      "input_bounds_contradicted"),
    "energy": _keys("source", "idle_w", "gpus", "counter_refresh_s", "scenarios", "experts"),
    "shard": _keys("tp", "timed"),
}  # fmt: skip

#: measured collectives (`simulator.latency.collectives`)
COLLECTIVES_META: Accepted = {
    "schema_version": None, "kind": None, "library": None, "nccl_version": None,
    "torch_version": None, "dtype": None, "timing": None, "env": None,
    "gpu": _keys("key", "name", "count"),
}  # fmt: skip


def check_meta_keys(meta: dict, path: str, accepted: Accepted) -> None:
    """Raise a ConfigError naming ``path`` and the first key ``accepted`` lacks (top level,
    or inside a section with a fixed set), listing the keys accepted there."""
    for key, value in meta.items():
        if key not in accepted:
            raise ConfigError(path, str(key), f"unknown key; expected one of {sorted(accepted)}")
        inner = accepted[key]
        if inner is None or not isinstance(value, dict):
            continue  # free-form, or a wrong type its reader reports
        for sub in value:
            if sub not in inner:
                raise ConfigError(path, f"{key}.{sub}",
                                  f"unknown key; expected one of {sorted(inner)}")  # fmt: skip
