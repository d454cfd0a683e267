"""Pick the step-latency model an experiment asks for.

``latency.model``:
* ``auto`` (default): the shipped profiled table for this GPU, model and TP if one exists, else
  the roofline model, labelled as such. With the ``vllm`` policy, the whole-step table measured
  through vLLM (``profiles/<gpu>/vllm-0.24/<model>_tp<k>/``, `engine_steps`) comes first: it
  times the engine that policy schedules; other policies keep servesim's own forward's tables
  (``profiles/<gpu>/<model>_tp<k>/``). A table is only used for the precision it measured
  (``dtype`` / ``kv_cache_dtype`` in its meta): otherwise ``auto`` falls back to the roofline
  model and says so, and ``profile`` or a table named with ``table`` is an error;
* ``profile``: a profiled table (``latency.table`` names its folder; default as for auto), an
  error if none;
* ``roofline``: the analytic bound from the model and GPU catalogs;
* ``constant``: every step takes ``step_ms`` (hand-computable runs; not a GPU model).
"""

from __future__ import annotations

from pathlib import Path

from simulator.cfg import Section
from simulator.errors import ConfigError
from simulator.files import load_yaml_file
from simulator.hardware import GPUSpec
from simulator.latency.constant import ConstantLatencyModel
from simulator.latency.roofline import DEFAULT_STEP_OVERHEAD_S, RooflineLatencyModel
from simulator.models import ModelSpec

REPO_ROOT = Path(__file__).resolve().parents[2]


#: folder of the tables measured through each serving engine, by the engine's policy name
ENGINE_TABLES = {"vllm": "vllm-0.24"}


def default_table_dir(
    model: ModelSpec, gpu: GPUSpec, tp: int, engine: str | None = None
) -> Path | None:
    """The shipped table for this (gpu, model, tp[, serving engine]), if there is one."""
    subdirs = ([ENGINE_TABLES[engine]], []) if engine in ENGINE_TABLES else ([],)
    for gpu_dir in dict.fromkeys([gpu.name, gpu.name.split("-")[0]]):
        for parts in subdirs:
            cand = REPO_ROOT.joinpath("profiles", gpu_dir, *parts, f"{model.name}_tp{tp}")
            if (cand / "meta.yaml").is_file():
                return cand
    return None


#: bytes per element of the dtypes a table's ``meta.yaml`` names (``dtype``, ``kv_cache_dtype``)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "float8_e4m3fn": 1, "int4": 0.5}


def _precision_mismatch(table_dir: Path, model: ModelSpec) -> str | None:
    """Why ``table_dir`` did not measure ``model``'s precision (weights and KV bytes, from the
    table's ``dtype`` / ``kv_cache_dtype``; tables that name neither measured bf16), or None.
    Every table is checked, shipped or named: no table times a precision it did not run."""
    meta_path = table_dir / "meta.yaml"
    meta = load_yaml_file(meta_path, "table meta.yaml") if meta_path.is_file() else {}
    names = (str(meta.get("dtype", "bfloat16")), str(meta.get("kv_cache_dtype", "")))
    names = (names[0], names[1] or names[0])
    for name in names:
        if name not in DTYPE_BYTES:
            raise ConfigError(str(meta_path), "dtype", f"unknown dtype {name!r}")
    w, kv = (DTYPE_BYTES[n] for n in names)
    if (w, kv) == (model.bytes_per_weight, model.bytes_per_kv):
        return None
    measured = "bf16 weights and KV" if (w, kv) == (2, 2) else (
        f"{w:g} bytes per weight and {kv:g} per KV element")  # fmt: skip
    return (
        f"the table {_label(table_dir)} measured {measured}; {model.name} "
        f"has {model.bytes_per_weight:g} bytes per weight and {model.bytes_per_kv:g} per KV "
        "element"
    )


def _label(table_dir: Path) -> str:
    """A table folder as the user knows it: relative to the repository when inside it."""
    try:
        return str(table_dir.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(table_dir)


def build_latency(
    sec: Section, model: ModelSpec, gpu: GPUSpec, tp: int, where: str, base_dir, engine=None
):
    kind = sec.str("model", "auto", choices=["auto", "profile", "roofline", "constant"])
    table = sec.str("table", None)
    overhead_ms = sec.num("step_overhead_ms", None, min=0)
    step_ms = sec.num("step_ms", None, min=0, strict_min=True)
    sec.done()
    if kind == "constant":
        if step_ms is None:
            raise sec.error("step_ms", "required with model: constant")
        return ConstantLatencyModel(step_ms / 1000.0)
    if step_ms is not None:
        raise sec.error("step_ms", "only used with model: constant")
    if kind == "roofline":
        if table is not None:
            raise sec.error("table", "a table is only used with model: profile or auto")
        return _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"))
    shipped = default_table_dir(model, gpu, tp, engine) if table is None else None
    table_dir = shipped
    if table is not None:
        table_dir = _resolve(table, Path(base_dir))
        if table_dir is None:
            raise sec.error("table", f"no profiled table folder at {table!r}")
    mismatch = _precision_mismatch(table_dir, model) if table_dir is not None else None
    if mismatch and (kind == "profile" or table is not None):
        raise sec.error(
            "table" if table is not None else "model",
            f"{mismatch} (name a table measured at that precision with latency.table)",
        )
    if table_dir is None or mismatch:
        if kind == "profile":
            raise sec.error(
                "model",
                f"no shipped table for {gpu.name} / {model.name} / tp{tp}; profile one with "
                "`servesim profile` or use model: roofline",
            )
        lat = _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"))
        if mismatch:
            lat.fallback_reason = f"latency auto: {mismatch}; using the roofline model"
        return lat
    if overhead_ms is not None:
        raise sec.error("step_overhead_ms", "only the roofline model takes a fixed overhead")
    from simulator.latency.engine_steps import EngineStepModel, is_engine_table

    if is_engine_table(table_dir):
        return EngineStepModel(table_dir, model.name, tp)
    from simulator.latency.profiled import ProfileLatencyModel

    return ProfileLatencyModel(table_dir, model, tp)


def _roofline(model, gpu, tp, overhead_ms, where, key):
    overhead = DEFAULT_STEP_OVERHEAD_S if overhead_ms is None else overhead_ms / 1000.0
    return RooflineLatencyModel(model, gpu, tp, overhead, where=where, key=key)


def _resolve(text: str, base_dir: Path) -> Path | None:
    for cand in (base_dir / text, Path.cwd() / text, REPO_ROOT / text):
        if cand.is_dir():
            return cand
    return None


__all__ = ["build_latency", "default_table_dir", "ConfigError"]
