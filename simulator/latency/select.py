"""Pick the step-latency model an experiment asks for.

``latency.model``:
* ``auto`` (default): the shipped profiled table for this GPU, model and TP if one exists, else
  the roofline model, labelled as such. With the ``vllm`` policy, the whole-step table measured
  through vLLM (``profiles/<gpu>/vllm-0.24/<model>_tp<k>/``, `engine_steps`) comes first: it
  times the engine that policy schedules; other policies keep servesim's own forward's tables
  (``profiles/<gpu>/<model>_tp<k>/``). A table is only used for the bf16 model it measured;
  a quantized model falls back to the roofline model and says so;
* ``profile``: a profiled table (``latency.table`` names its folder; default as for auto), an
  error if none;
* ``roofline``: the analytic bound from the model and GPU catalogs;
* ``constant``: every step takes ``step_ms`` (hand-computable runs; not a GPU model).
"""

from __future__ import annotations

from pathlib import Path

from simulator.cfg import Section
from simulator.errors import ConfigError
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


def _is_bf16(model: ModelSpec) -> bool:
    return model.bytes_per_weight == 2 and model.bytes_per_kv == 2


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
    if table is not None:
        table_dir = _resolve(table, Path(base_dir))
        if table_dir is None:
            raise sec.error("table", f"no profiled table folder at {table!r}")
    elif _is_bf16(model):
        table_dir = shipped
    else:
        table_dir = None
        if kind == "profile":
            raise sec.error(
                "model",
                f"the shipped tables measured bf16 weights and KV; {model.name} has "
                f"{model.bytes_per_weight} bytes per weight and {model.bytes_per_kv} per KV "
                "element (name a table measured at that precision with latency.table)",
            )
    if table_dir is None:
        if kind == "profile":
            raise sec.error(
                "model",
                f"no shipped table for {gpu.name} / {model.name} / tp{tp}; profile one with "
                "`servesim profile` or use model: roofline",
            )
        lat = _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"))
        if shipped is not None and not _is_bf16(model):
            lat.fallback_reason = (
                f"latency auto: the shipped table for {gpu.name} / {model.name} / tp{tp} "
                f"measured bf16 weights and KV, this model has {model.bytes_per_weight} bytes "
                f"per weight and {model.bytes_per_kv} per KV element; using the roofline model"
            )
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
