"""Pick the step-latency model an experiment asks for.

``latency.model``:
* ``auto`` (default): the shipped profiled table for this GPU, model and TP if one exists, else
  the roofline model, labelled as such. With the ``vllm`` policy, the whole-step table measured
  through vLLM (``profiles/<gpu>/vllm-0.24/<model>_tp<k>/``, `engine_steps`) comes first: it
  times the engine that policy schedules; other policies keep servesim's own forward's tables
  (``profiles/<gpu>/<model>_tp<k>/``). A table is only used for the model, TP and precision it
  measured (``precision`` in its meta, else ``dtype`` / ``kv_cache_dtype``; and its
  ``op_fingerprint`` when present): otherwise ``auto`` falls back to the roofline model and says
  so (printed and in summary.json), and ``profile`` or a table named with ``table`` is an error
  naming both sides;
* ``profile``: a profiled table (``latency.table`` names its folder; default as for auto), an
  error if none;
* ``roofline``: the analytic bound from the model and GPU catalogs;
* ``constant``: every step takes ``step_ms`` (hand-computable runs; not a GPU model).

``latency.collectives`` (tp > 1: the roofline model, and an engine table of one GPU's shard of a
TP layout, `simulator.latency.shard`, which adds the collectives that join the shards):
``auto`` (default) charges collectives the times measured on this GPU at this group size when
shipped (``profiles/<gpu>/nccl_x<tp>/``, `simulator.latency.collectives`), else the link
estimate; ``estimate`` always the link estimate; a folder: that table, which must have measured
this GPU at this tp.

``latency.launch_scale`` (a table measured through an engine only): charge the host's launch of
each step at another level than the table's median engine process, a number (a factor on every
launch time) or ``slowest`` / ``fastest`` (the table's slowest or fastest engine process);
`EngineStepModel.scale_launches` says why. Any other latency model is an error.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from simulator.cfg import Section
from simulator.errors import ConfigError
from simulator.files import load_yaml_file
from simulator.hardware import GPUSpec, default_tp_link
from simulator.latency.collectives import StepCollectives, load_collectives
from simulator.latency.constant import ConstantLatencyModel
from simulator.latency.roofline import DEFAULT_STEP_OVERHEAD_S, RooflineLatencyModel
from simulator.latency.table import table_precision
from simulator.latency.table_subject import gpu_mismatch, shape_mismatch
from simulator.models import ModelSpec
from simulator.precision import Precision
from simulator.served import ShardedModel

REPO_ROOT = Path(__file__).resolve().parents[2]


#: folder of the tables measured through each serving engine, by the engine's policy name
ENGINE_TABLES = {"vllm": "vllm-0.24"}


def table_folder(model: ModelSpec, tp: int, expert_parallel: str | None = None) -> str:
    """A table's folder name: ``<model>_tp<k>`` for bf16 weights and KV, else with the
    precision's label between (``llama-3-8b_fp8_tp1``, ``llama-3-8b_int4-kv-bf16_tp1``);
    with expert parallelism (vLLM's, the ``allreduce`` layout) ``_ep<k>`` after
    (``qwen3-30b-a3b_tp2_ep2``); a skewed router (``routing_skew``) ``_skew<s>`` before the TP
    (``qwen3-30b-a3b_skew0.6_tp1``)."""
    name = model.name if model.precision == Precision() else f"{model.name}_{model.precision.label}"
    if _skew(model):
        name += f"_skew{_skew(model):g}"
    return f"{name}_tp{tp}" + (f"_ep{tp}" if expert_parallel else "")


def _skew(model: ModelSpec) -> float:
    """The model's router skew (0 for dense models and uniform routers)."""
    return model.moe.routing_skew if model.moe is not None else 0.0


def default_table_dir(
    model: ModelSpec, gpu: GPUSpec, tp: int, engine: str | None = None,
    expert_parallel: str | None = None,
) -> Path | None:  # fmt: skip
    """The shipped table for this (gpu, model, precision, tp[, serving engine][, expert
    layout]), if any. Only a table measured through an engine times an expert layout."""
    subdirs = ([ENGINE_TABLES[engine]], []) if engine in ENGINE_TABLES else ([],)
    if expert_parallel:
        subdirs = subdirs[:1] if engine in ENGINE_TABLES else ()
    for gpu_dir in _gpu_dirs(gpu):
        for parts in subdirs:
            cand = gpu_dir.joinpath(*parts, table_folder(model, tp, expert_parallel))
            if (cand / "meta.yaml").is_file():
                return cand
    return None


def _table_mismatch(
    table_dir: Path, model: ModelSpec, gpu: GPUSpec, tp: int, expert_parallel: str | None = None
) -> str | None:
    """Why ``table_dir`` did not measure ``model`` as served on ``gpu`` at ``tp`` with
    ``expert_parallel``, or None: its GPU and its model's shapes must be the run's
    (`simulator.latency.table_subject`), its precision (`table_precision`: ``precision:``, else
    ``dtype`` / ``kv_cache_dtype``) the model's by name, its ``expert_parallel`` (absent:
    experts split over TP) the run's, and its ``op_fingerprint``, when it has one, the served
    model's op list. Every table is checked, shipped or named: no table times a model it did
    not run."""
    meta_path = table_dir / "meta.yaml"
    meta = load_yaml_file(meta_path, "table meta.yaml") if meta_path.is_file() else {}
    if not isinstance(meta, dict):
        raise ConfigError(str(meta_path), "<top>", "expected a mapping")
    subject = gpu_mismatch(meta, gpu, _label(table_dir)) or shape_mismatch(
        meta, model, _label(table_dir)
    )
    if subject:
        return subject
    measured = table_precision(meta, str(meta_path))
    if measured != model.precision:
        return (
            f"the table {_label(table_dir)} measured {measured.describe()}; {model.name} is "
            f"served with {model.precision.describe()}"
        )
    table_skew = float(meta.get("routing_skew") or 0.0)
    if table_skew != _skew(model):
        return (
            f"the table {_label(table_dir)} timed {_routing(table_skew)}; {model.name} is served "
            f"with {_routing(_skew(model))} (model.routing_skew)"
        )
    table_ep = meta.get("expert_parallel") or None
    if table_ep != expert_parallel:
        return (
            f"the table {_label(table_dir)} measured {_layout(table_ep)}; this run serves "
            f"{_layout(expert_parallel)}"
        )
    theirs = meta.get("op_fingerprint")
    ours = ShardedModel(model, tp, expert_parallel).op_fingerprint
    if theirs is not None and str(theirs) != ours:
        return (
            f"the table {_label(table_dir)} measured the op list {theirs}; {model.name} at tp{tp} "
            f"runs the op list {ours}"
        )
    return None


def _routing(skew: float) -> str:
    return f"routing skewed {skew:g} (Zipf)" if skew else "uniform routing"


def _layout(expert_parallel: str | None) -> str:
    if expert_parallel:
        return f"expert parallelism ({expert_parallel})"
    return "experts split over TP (no expert parallelism)"


def _label(table_dir: Path) -> str:
    """A table folder as the user knows it: relative to the repository when inside it."""
    try:
        return str(table_dir.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(table_dir)


def build_latency(
    sec: Section, model: ModelSpec, gpu: GPUSpec, tp: int, where: str, base_dir, engine=None,
    *, expert_parallel: str | None = None,
):  # fmt: skip
    """The latency model ``sec`` asks for (see the module docstring). With
    ``expert_parallel`` (`simulator.served.EP_MODES`) a table applies only if it measured that
    layout: vLLM's ``--enable-expert-parallel`` (``allreduce``) through the engine
    (``<model>_tp<k>_ep<k>``, `table_folder`); the ``all_to_all`` layout (vLLM runs it only
    with data parallelism) has none, so there ``profile`` or a named table is an error and
    ``auto`` falls back to the roofline model, saying why when a table of another layout
    exists."""
    launch_scale = _launch_scale(sec)  # read first: `_build_latency` closes the section
    lat = _build_latency(sec, model, gpu, tp, where, base_dir, engine,
                         expert_parallel=expert_parallel)  # fmt: skip
    if launch_scale is not None:
        _scale_launches(sec, lat, launch_scale)
    return lat


def _launch_scale(sec: Section) -> float | str | None:
    """``latency.launch_scale``: None (the table's level), a number > 0, ``slowest`` or
    ``fastest`` (`EngineStepModel.scale_launches`)."""
    how = sec.raw("launch_scale", None)
    if how is None or how in ("slowest", "fastest"):
        return how
    number = isinstance(how, (int, float)) and not isinstance(how, bool)
    if not number or not math.isfinite(how) or not how > 0:
        raise sec.error("launch_scale", f"expected a number > 0, slowest or fastest, got {how!r}")
    return float(how)


def _scale_launches(sec: Section, lat, how: float | str) -> None:
    """Charge ``lat``'s launches at another host's level; only a table measured through an
    engine charges launches (others: an error naming the model that was picked)."""
    if not hasattr(lat, "scale_launches"):
        picked = getattr(lat, "name", type(lat).__name__)
        raise sec.error("launch_scale", "only a table measured through an engine (latency: "
                        f"auto or profile with the vllm policy) charges launch times; this run "
                        f"is timed by {picked}")  # fmt: skip
    try:
        lat.scale_launches(how)
    except ValueError as e:
        raise sec.error("launch_scale", f"{lat.name}: {e}") from None


def _build_latency(
    sec: Section, model: ModelSpec, gpu: GPUSpec, tp: int, where: str, base_dir, engine=None,
    *, expert_parallel: str | None = None,
):  # fmt: skip
    """`build_latency` but for ``launch_scale`` (read by it before this closes ``sec``)."""
    kind = sec.str("model", "auto", choices=["auto", "profile", "roofline", "constant"])
    table = sec.str("table", None)
    overhead_ms = sec.num("step_overhead_ms", None, min=0)
    step_ms = sec.num("step_ms", None, min=0, strict_min=True)
    coll_spec = sec.raw("collectives", "auto")
    if not isinstance(coll_spec, str):
        raise sec.error("collectives", f"expected auto, estimate or a folder, got {coll_spec!r}")
    sec.done()

    def collectives():  # read only where a roofline is built
        return _read_collectives(sec, coll_spec, gpu, tp, Path(base_dir))

    if kind == "constant":
        if step_ms is None:
            raise sec.error("step_ms", "required with model: constant")
        return ConstantLatencyModel(step_ms / 1000.0)
    if step_ms is not None:
        raise sec.error("step_ms", "only used with model: constant")
    if kind == "roofline":
        if table is not None:
            raise sec.error("table", "a table is only used with model: profile or auto")
        return _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"), expert_parallel,
                         collectives())  # fmt: skip
    if expert_parallel and not _ep_table_possible(model, gpu, tp, engine, table, expert_parallel):
        return _ep_roofline(sec, kind, table, model, gpu, tp, overhead_ms, where, expert_parallel,
                            collectives, engine)  # fmt: skip
    table_dir, mismatch = _pick_table(sec, kind, table, model, gpu, tp, engine, base_dir,
                                      expert_parallel)  # fmt: skip
    if table_dir is None or mismatch:
        if kind == "profile":
            raise sec.error(
                "model",
                f"no shipped table for {gpu.name} / {model.name} / tp{tp}; profile one with "
                "`servesim profile` or use model: roofline",
            )
        lat = _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"), expert_parallel,
                        collectives())  # fmt: skip
        if mismatch:
            lat.fallback_reason = f"latency auto: {mismatch}; using the roofline model"
        return lat
    if overhead_ms is not None:
        raise sec.error("step_overhead_ms", "only the roofline model takes a fixed overhead")
    return _table_latency(sec, table_dir, model, gpu, tp, coll_spec, collectives, expert_parallel)


def _ep_table_possible(model, gpu, tp, engine, table, mode) -> bool:
    """Whether an expert-parallel run may be timed by a table: the ``allreduce`` layout, with a
    table named or one shipped for it (`default_table_dir`)."""
    if mode != "allreduce":
        return False
    return table is not None or default_table_dir(model, gpu, tp, engine, mode) is not None


def _pick_table(
    sec: Section, kind: str, table: str | None, model: ModelSpec, gpu: GPUSpec, tp: int,
    engine, base_dir, expert_parallel: str | None = None,
) -> tuple[Path | None, str | None]:  # fmt: skip
    """The table folder ``latency`` points at (``table``, else the shipped one for the model,
    GPU, TP, engine and expert layout) and why it does not fit the model, if it does not. A
    named table, or ``profile``, that does not fit is an error here; ``auto`` falls back (the
    caller)."""
    ep = expert_parallel
    shipped = default_table_dir(model, gpu, tp, engine, ep) if table is None else None
    table_dir = shipped
    if table is None and shipped is None and (model.precision != Precision() or _skew(model)):
        # the model's bf16 table of uniform routing, when shipped, is checked (and refused) so
        # that the fallback to the roofline model, or the error of `profile`, says why it is
        # not used
        table_dir = default_table_dir(_defaults(model), gpu, tp, engine, ep)
    if table is not None:
        table_dir = _resolve(table, Path(base_dir))
        if table_dir is None:
            raise sec.error("table", f"no profiled table folder at {table!r}")
    mismatch = _table_mismatch(table_dir, model, gpu, tp, ep) if table_dir is not None else None
    if mismatch and (kind == "profile" or table is not None):
        raise sec.error(
            "table" if table is not None else "model",
            f"{mismatch} (name a table measured for it with latency.table, or use model: roofline)",
        )
    return table_dir, mismatch


def _table_latency(
    sec: Section, table_dir: Path, model: ModelSpec, gpu: GPUSpec, tp: int, coll_spec,
    collectives, expert_parallel: str | None = None,
):  # fmt: skip
    """The latency model of a table that fits: whole engine steps (`EngineStepModel`), one
    GPU's shard of them plus the collectives (`ShardStepModel`), or per-op timings
    (`ProfileLatencyModel`)."""
    from simulator.latency.engine_steps import EngineStepModel, is_engine_table

    engine_table = is_engine_table(table_dir)
    shard = engine_table and _is_shard(table_dir)
    if coll_spec not in ("auto", "estimate") and not shard:
        raise sec.error("collectives", f"only the roofline model and shard tables read "
                        f"collectives; the table {_label(table_dir)} timed whole steps of "
                        "the whole engine")  # fmt: skip
    if shard:
        from simulator.latency.shard import ShardStepModel

        coll = StepCollectives(ShardedModel(model, tp), default_tp_link(gpu), collectives())
        return _checked_routing(ShardStepModel(table_dir, model.name, tp, coll), model, gpu, tp)
    if engine_table:
        lat = EngineStepModel(table_dir, model.name, tp)
        return _checked_routing(lat, model, gpu, tp, expert_parallel)
    if expert_parallel:  # `_table_mismatch` lets no op table through with expert parallelism
        raise sec.error("table", f"{_label(table_dir)} is not an engine table")
    from simulator.latency.profiled import ProfileLatencyModel

    return ProfileLatencyModel(table_dir, model, tp)


def _checked_routing(lat, model: ModelSpec, gpu: GPUSpec, tp: int, expert_parallel=None):
    """``lat`` (an engine table's model) with, for a mixture of experts, the check of its
    decode steps against the bound of the routing it was recorded with, the model's
    (`simulator.latency.routing_check`, `_table_mismatch` makes them the same) in
    ``lat.routing`` and, when the table's routing was concentrated, a warning every run
    carries. Step times are unchanged."""
    if model.moe is None:
        return lat
    from simulator.latency.routing_check import (
        routing_bound,
        routing_check,
        routing_warning,
    )

    bound = routing_bound(model, gpu, tp, expert_parallel, _skew(model))
    lat.routing = routing_check(lat.rows, bound)
    if lat.routing["concentrated"]:
        lat.warnings.append(routing_warning(lat.name, lat.routing))
    return lat


def _is_shard(table_dir: Path) -> bool:
    """Whether an engine table timed one GPU's shard of a TP layout (`shard_tp`)."""
    from simulator.latency.shard import shard_tp

    path = table_dir / "meta.yaml"
    meta = load_yaml_file(path, "table meta.yaml")
    return isinstance(meta, dict) and shard_tp(meta, str(path)) is not None


def _defaults(model: ModelSpec) -> ModelSpec:
    """``model`` in bf16 weights and KV, routed uniformly: what the default tables measured."""
    moe = model.moe and dataclasses.replace(model.moe, routing_skew=0.0)
    return dataclasses.replace(model, weights="bf16", kv_cache_dtype="bf16", moe=moe)


def _roofline(model, gpu, tp, overhead_ms, where, key, expert_parallel=None, collectives=None):
    overhead = DEFAULT_STEP_OVERHEAD_S if overhead_ms is None else overhead_ms / 1000.0
    return RooflineLatencyModel(
        model, gpu, tp, overhead, where=where, key=key, expert_parallel=expert_parallel,
        collectives=collectives,
    )  # fmt: skip


def _read_collectives(sec: Section, spec: str, gpu: GPUSpec, tp: int, base_dir: Path):
    """``latency.collectives`` = ``spec`` (module docstring): the measured table the roofline
    charges collectives from, or None (tp 1, ``estimate``, or ``auto`` with none shipped)."""
    if spec == "estimate" or (spec == "auto" and tp == 1):
        return None
    if spec == "auto":
        shipped = [d / f"nccl_x{tp}" for d in _gpu_dirs(gpu)]
        folder = next((d for d in shipped if (d / "meta.yaml").is_file()), None)
        return None if folder is None else load_collectives(folder, _label(folder))
    if tp == 1:
        raise sec.error("collectives", "a tp 1 engine runs no collectives")
    folder = _resolve(spec, base_dir)
    if folder is None:
        raise sec.error("collectives", f"no folder at {spec!r}")
    table = load_collectives(folder, _label(folder))
    keys = {d.name for d in _gpu_dirs(gpu)}
    if table.gpu_key not in keys or table.ranks != tp:
        raise sec.error("collectives", f"{spec!r} measured {table.ranks}x {table.gpu_key}; this "
                        f"run is tp {tp} on {gpu.name}")  # fmt: skip
    return table


def _gpu_dirs(gpu: GPUSpec) -> list[Path]:
    """``profiles/<gpu>/`` folders that may hold ``gpu``'s tables (`GPUSpec.table_keys`)."""
    return [REPO_ROOT / "profiles" / n for n in gpu.table_keys()]


def _ep_roofline(sec, kind, table, model, gpu, tp, overhead_ms, where, mode, collectives,
                 engine=None):  # fmt: skip
    """`build_latency` for an expert-parallel layout no table measured (see there);
    ``collectives()`` reads `latency.collectives` once a roofline is built."""
    if kind == "profile" or table is not None:
        how = (
            "vLLM runs it only with data parallelism"
            if mode != "allreduce"
            else "profile one with `servesim profile --engine vllm --tp K --expert-parallel`"
        )
        raise sec.error(
            "table" if table is not None else "model",
            f"no profiled table measured expert parallelism ({mode}) for {model.name} at "
            f"tp{tp} ({how}); use model: roofline or auto",
        )
    lat = _roofline(model, gpu, tp, overhead_ms, where, sec.key("model"), mode, collectives())
    if default_table_dir(model, gpu, tp, engine) is not None:
        lat.fallback_reason = (
            f"latency auto: the shipped table for {model.name} at tp{tp} timed experts split "
            f"over TP, not expert parallelism ({mode}); using the roofline model"
        )
    return lat


def _resolve(text: str, base_dir: Path) -> Path | None:
    for cand in (base_dir / text, Path.cwd() / text, REPO_ROOT / text):
        if cand.is_dir():
            return cand
    return None


__all__ = ["build_latency", "default_table_dir", "ConfigError"]
