"""Pick the step-latency model an experiment asks for.

``latency.model``:
* ``auto`` (default): the shipped profiled table for this GPU, model and TP if one exists
  (``profiles/<gpu>/<model>_tp<k>/``), else the roofline model, labelled as such;
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


def default_table_dir(model: ModelSpec, gpu: GPUSpec, tp: int) -> Path | None:
    """The shipped table for this (gpu, model, tp), if there is one."""
    for gpu_dir in dict.fromkeys([gpu.name, gpu.name.split("-")[0]]):
        cand = REPO_ROOT / "profiles" / gpu_dir / f"{model.name}_tp{tp}"
        if (cand / "meta.yaml").is_file():
            return cand
    return None


def build_latency(sec: Section, model: ModelSpec, gpu: GPUSpec, tp: int, where: str, base_dir):
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
    if table is not None:
        table_dir = _resolve(table, Path(base_dir))
        if table_dir is None:
            raise sec.error("table", f"no profiled table folder at {table!r}")
    else:
        table_dir = default_table_dir(model, gpu, tp)
    if table_dir is None:
        if kind == "profile":
            raise sec.error(
                "model",
                f"no shipped table for {gpu.name} / {model.name} / tp{tp}; profile one with "
                "`servesim profile` or use model: roofline",
            )
        return _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"))
    from simulator.latency.profiled import ProfileLatencyModel

    if overhead_ms is not None:
        raise sec.error("step_overhead_ms", "only the roofline model takes a fixed overhead")
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
