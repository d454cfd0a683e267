"""``servesim profile --engine vllm`` and ``servesim validate --engine vllm``.

* ``profile --engine vllm --model M [--tp K [--expert-parallel]] [--weights fp8|int4]
  [--kv-cache-dtype fp8] --out DIR``: on a GPU machine with vLLM 0.24.0, writes the model's
  ``config.json`` and a job under ``DIR/raw/``, runs the profiling scenarios through vLLM
  (`profiles.vllm_run`), and builds the table in ``DIR`` (`profiles.vllm_table`). ``--rebuild``
  rebuilds ``DIR`` from ``DIR/raw/`` on any machine (no GPU). Both print the held-out error.
* ``validate --engine vllm FILE.yaml [--set K=V] [--real DIR]``: replays the experiment's
  arrivals through vLLM (GPU), or reads a stored real run (``--real``: a folder with
  ``<name>.json.gz`` and the engine's step log), refuses a real run of other arrivals, model,
  GPU or engine, simulates the experiment and writes ``report.json`` / ``report.md``.
  ``--also-real DIR`` (repeatable) sets other stored replays of the same arrivals beside the
  first (`profiles.replay_spread.with_replays`): how far vLLM lands from itself, per metric.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from profiles import engine_jobs, vllm_grid, vllm_validate
from profiles.cli import _resolve_model, gpu_key
from profiles.hf_config import write_model_dir
from profiles.replay_spread import with_replays
from profiles.vllm_steps import read_steps
from simulator.argtypes import positive_int
from simulator.config import blame_overrides
from simulator.errors import ConfigError
from simulator.files import check_out_dir
from simulator.models import load_model, with_routing_skew
from simulator.precision import KV_CACHE_DTYPES, WEIGHT_FORMATS

ENGINES = ("vllm",)


def _profile_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="servesim profile --engine vllm")
    ap.add_argument("--engine", choices=ENGINES, required=True, help="serving engine to time")
    ap.add_argument("--model", required=True, help="catalog model name")
    ap.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (>= 1)")
    ap.add_argument("--weights", default="bf16", choices=list(WEIGHT_FORMATS), help="weights")
    ap.add_argument(
        "--kv-cache-dtype", default="bf16", choices=list(KV_CACHE_DTYPES), help="KV cache dtype"
    )
    ap.add_argument(
        "--shard",
        action="store_true",
        help="time one GPU's shard of the --tp layout at TP1 (per-GPU shapes; the simulator "
        "adds the layout's collectives): for layouts larger than the machine",
    )
    ap.add_argument(
        "--expert-parallel",
        action="store_true",
        help="vLLM's --enable-expert-parallel over the --tp GPUs (whole experts per GPU, "
        "attention TP; the simulator's hardware.expert_parallel: true)",
    )
    ap.add_argument(
        "--routing-skew",
        type=float,
        default=0.0,
        metavar="S",
        help="MoE routers skewed as the simulator's model.routing_skew S (a Zipf exponent over "
        "the experts' popularity; default 0 = uniform; profiles/dummy_routing.py)",
    )
    ap.add_argument("--gpu-key", default=None, help="table folder name (default from the GPU)")
    ap.add_argument("--out", required=True, help="table folder (raw runs go to OUT/raw)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild OUT from OUT/raw (no GPU)")
    ap.add_argument(
        "--repeats",
        type=positive_int,
        default=vllm_grid.REPEATS,
        help="passes over the scenario grid; a step's time is the median of its repeats",
    )
    ap.add_argument(
        "--passes-per-engine",
        type=positive_int,
        default=1,
        help="passes run by one engine process before a fresh one takes the next (default 1: "
        "a prompt step's launch time differs between engine processes, profiles/vllm_run.py)",
    )
    return ap


def profile_main(argv: list[str]) -> int:
    a = _profile_parser().parse_args(argv)
    spec = dataclasses.replace(
        _resolve_model(a.model), weights=a.weights, kv_cache_dtype=a.kv_cache_dtype
    )
    if a.routing_skew:
        spec = with_routing_skew(spec, a.routing_skew, "<cli>", "--routing-skew")
    ep = engine_jobs.expert_layout(
        spec, a.tp, a.shard, a.expert_parallel, "<cli>", "--expert-parallel"
    )
    out = check_out_dir(a.out)
    raw = out / "raw"
    if not a.rebuild:
        phase = {
            "name": "profile",
            "kind": "profile",
            "repeats": a.repeats,
            "passes_per_engine": a.passes_per_engine,
            "resume": True,  # each engine after the first continues the run (fresh raw/ below)
        }
        if a.shard and a.tp < 2:
            raise ConfigError("<cli>", "--shard", "needs --tp 2 or more (the layout sharded)")
        _run_engine_job(spec, a.tp, raw, [phase], shard=a.shard, expert_parallel=ep)
    return _build_and_report(raw, out, a.gpu_key, spec, a.tp, ep)


def _run_engine_job(
    spec, tp: int, raw: Path, phases: list[dict], shard: bool = False, expert_parallel=None
) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError(
            "<cli>",
            "--engine",
            "vLLM is not importable here (see profiles/README.md, 'Tables through vLLM')",
        ) from None
    from profiles import vllm_run

    if (raw / "engine.json").exists():
        raise ConfigError(
            "--out", str(raw), "already holds a recorded run: pick a new folder, or --rebuild it"
        )
    mdir = write_model_dir(spec, raw / "model", tp if shard else None)
    job = engine_jobs.engine_job(spec, str(mdir), tp, shard, bool(expert_parallel))
    job["phases"] = phases
    (raw / "job.json").write_text(json.dumps(job))
    rc = vllm_run.run_until_done(raw / "job.json", raw)
    if rc != 0:
        raise ConfigError("--engine", "vllm", f"the engine job exited with status {rc} ({raw})")


def _build_and_report(raw: Path, out: Path, key: str | None, spec, tp: int, ep=None) -> int:
    from profiles.vllm_table import build_table
    from simulator.latency.engine_steps import EngineStepModel

    if not (raw / "engine.json").is_file():
        raise ConfigError(str(raw), "engine.json", "no recorded engine run here")
    if key is None:
        key = gpu_key(json.loads((raw / "engine.json").read_text())["gpu"])
    meta = build_table(raw, out, key, spec, tp, ep)
    # a shard table's held-out error is its own steps' (the shard's fit, no collectives)
    m = EngineStepModel(out, spec.name, tp)
    if "shard" in meta:
        print(f"one GPU's shard of tp {tp}: held-out error of the shard's own steps")
    print(json.dumps(m.heldout(), indent=1))
    return 0


def validate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="servesim validate --engine vllm")
    ap.add_argument("config", help="experiment YAML (the vllm policy, a GPU and a model)")
    ap.add_argument("--engine", choices=ENGINES, required=True, help="serving engine")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (repeatable)",
    )
    ap.add_argument("--real", default=None, help="stored real run folder (no GPU needed)")
    ap.add_argument("--name", default="case", help="the real run's phase name")
    ap.add_argument("--also-real", action="append", default=[], metavar="DIR",
                    help="another stored replay of the same arrivals (repeatable): the report "
                    "sets its values beside the first's (vLLM against itself)")  # fmt: skip
    ap.add_argument("--out", default=None, help="report folder (default results/validate)")
    a = ap.parse_args(argv)
    out = check_out_dir(a.out or "results/validate")
    with blame_overrides(str(a.config), a.set):
        return _validate(a, out)


def _validate(a, out: Path) -> int:
    cfg = engine_jobs.experiment(a.config, a.set)
    real = Path(a.real) if a.real else out / "real"
    if a.real is None:
        arr = real / "arrivals.json"
        engine_jobs.write_arrivals(cfg, a.config, arr)
        spec = load_model(cfg["model"], a.config, "model")
        phase = {"name": a.name, "kind": "replay", "arrivals": str(arr)}
        _run_engine_job(spec, int(cfg.get("hardware", {}).get("tp", 1)), real, [phase])
    path = real / f"{a.name}.json.gz"
    if not path.is_file():
        raise ConfigError(str(path), "--real", "no real run of that name in the folder")
    phase = vllm_validate.load_phase(path)
    others = [_other_replay(Path(d), a.name) for d in a.also_real]
    res = vllm_validate.report_case(cfg, a.config, phase, read_steps(str(real / "steps.jsonl")))
    if others:
        res = with_replays(res, phase, others)
    if "schedule_match" in res:
        print(f"steps planned exactly as vLLM did: {res['schedule_match']['identical']:.1%}")
    (out / "report.json").write_text(json.dumps(res, indent=1))
    print(f"median |error| {res['median_abs_err']:.1%}, max {res['max_abs_err']:.1%}")
    if others:
        spread = res["replay_spread"]
        med, top = spread["median_abs_diff"], spread["max_abs_diff"]
        print(f"the other {spread['replays'] - 1} replay(s) against the first: median "
              f"|difference| {med:.1%}, max {top:.1%}")  # fmt: skip
    for m in res["metrics"]:
        line = f"  {m['metric']:<32} sim {m['sim']:.4g}  real {m['real']:.4g}  {m['err']:+.1%}"
        if others:
            line += "  other replays " + " ".join(f"{e:+.1%}" for e in m["replay_errs"])
            line += "  (sim between replays)" if m["sim_within_replays"] else ""
        print(line)
    return 0


def _other_replay(folder: Path, name: str) -> tuple[str, dict]:
    """(file, phase) of the phase ``name`` in another stored replay folder (``--also-real``)."""
    path = folder / f"{name}.json.gz"
    if not path.is_file():
        raise ConfigError(str(path), "--also-real", "no real run of that name in the folder")
    return str(path), vllm_validate.load_phase(path)


def main(argv: list[str], which: str) -> int:
    try:
        return profile_main(argv) if which == "profile" else validate_main(argv)
    except ConfigError as e:
        print(e.one_line(), file=sys.stderr)
        return 2
