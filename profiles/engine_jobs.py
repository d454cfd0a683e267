"""Jobs for a serving engine run (pure Python): arrivals with their fingerprint, model folders.

Why: a real run is only comparable with a simulation of the *same* arrivals on the *same* model
and engine. The arrivals are built by servesim's own workload builder from the experiment YAML
(so the simulation replays exactly them), written with a fingerprint that hashes the arrivals,
the model, the GPU, TP and the engine. The real run copies the fingerprint into its output, and
a report refuses a real run whose fingerprint differs from the experiment's.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from simulator.config import apply_overrides, load_yaml
from simulator.errors import ConfigError
from simulator.models import load_model
from simulator.served import check_expert_parallel

ENGINE = "vllm-0.24.0"


def experiment(path: str, overrides: list[str] | None = None) -> dict:
    return apply_overrides(load_yaml(path), overrides or [])


def arrivals(cfg: dict, where: str) -> list[list]:
    """``[[arrival_s, prompt_tokens, output_tokens], ...]``: the experiment's requests as
    `simulator.runner.build` draws them (it is called, so the seed streams cannot drift)."""
    from simulator.runner import build

    built = build(copy.deepcopy(cfg), where, Path(where).resolve().parent)
    return [
        [r.arrival_s, r.num_prompt_tokens, r.num_output_tokens] for r in built.workload.requests
    ]


def fingerprint(cfg: dict, where: str, reqs: list[list]) -> dict:
    """What a real run must match: arrivals hash, model, GPU, TP and engine."""
    model = load_model(cfg["model"], where, "model")
    hw = cfg.get("hardware", {})
    h = hashlib.sha256(json.dumps(reqs, separators=(",", ":")).encode()).hexdigest()[:16]
    return {
        "arrivals_sha256_16": h,
        "num_requests": len(reqs),
        "model": model.name,
        "gpu": str(hw.get("gpu", "?")),
        "tp": int(hw.get("tp", 1)),
        "engine": ENGINE,
    }


def write_arrivals(cfg: dict, where: str, out: Path) -> dict:
    reqs = arrivals(cfg, where)
    fp = fingerprint(cfg, where, reqs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"fingerprint": fp, "requests": reqs}, separators=(",", ":")))
    return fp


def engine_job(spec, model_dir: str, tp: int, shard: bool = False, expert_parallel=False) -> dict:
    """What an engine job serves (`profiles.vllm_run`): the model folder (its config.json written
    for ``spec``, of one GPU's shard when ``shard``), TP, precision; with ``shard``, one GPU of the
    ``tp`` layout run at TP1 (``shard_tp``); with ``expert_parallel``, vLLM's
    ``--enable-expert-parallel`` over the ``tp`` GPUs (whole experts per GPU, attention TP, no data
    parallelism: the `simulator.served` layout ``allreduce``); for a mixture of experts, routers
    re-drawn after the dummy load so that a batch spreads over the experts as uniform routing does
    (``routing: token_dependent``, `profiles.dummy_routing`; every shipped MoE table was recorded
    with it or passes `simulator.latency.routing_check` without it), skewed as the model's
    ``routing_skew`` says (``routing_skew``; absent: uniform).
    One builder for `servesim profile` / `validate` and `run_all.py`, so that a table and the
    replay it is judged on are recorded the same way."""
    precision = {"weights": spec.weights, "kv_cache_dtype": spec.kv_cache_dtype}
    job = {"model_dir": model_dir, "tp": 1 if shard else tp, "precision": precision}
    if shard:
        job["shard_tp"] = tp
    if expert_layout(spec, tp, shard, expert_parallel, "<engine job>", "expert_parallel"):
        job["engine"] = {"enable_expert_parallel": True}
        job["expert_parallel"] = "allreduce"
    if spec.moe is not None:
        job["routing"] = "token_dependent"
        if spec.moe.routing_skew:
            _check_skewable(spec)
            job["routing_skew"] = spec.moe.routing_skew
    return job


def _check_skewable(spec) -> None:
    """A ConfigError, before any GPU work, for a router the skew calibration cannot skew
    (`profiles.routing_skew.check_skewable`: DeepSeek-V3's grouped sigmoid routing)."""
    from profiles.hf_config import hf_config
    from profiles.routing_skew import check_skewable

    try:
        check_skewable(hf_config(spec))
    except ValueError as e:
        raise ConfigError("<engine job>", "routing_skew", f"{spec.name}: {e}") from None


def expert_layout(spec, tp: int, shard: bool, expert_parallel: bool, where: str, key: str):
    """The `simulator.served` layout an engine job with ``expert_parallel`` serves:
    ``allreduce`` (vLLM's ``--enable-expert-parallel`` at data parallelism 1), or None without
    it; a ConfigError naming ``where`` and ``key`` for a dense model, tp 1, experts that do not
    split over tp, or a shard (it runs at TP1). One check for `engine_job` and the CLI, which
    also runs it on ``--rebuild`` (no job is built then)."""
    if not expert_parallel:
        return None
    check_expert_parallel(spec, tp, "allreduce", where, key)
    if shard:
        raise ConfigError(where, key, "a shard runs at TP1: no EP")
    return "allreduce"


def job_precision(job: dict) -> dict:
    """The precision an engine job serves (``precision`` of the job; bf16 when it names none)."""
    p = job.get("precision") or {}
    return {"weights": p.get("weights", "bf16"), "kv_cache_dtype": p.get("kv_cache_dtype", "bf16")}


def fingerprint_mismatch(expected: dict, got: dict | None) -> list[str]:
    """The fields in which a real run's fingerprint differs from the experiment's."""
    if not got:
        return ["the real run has no fingerprint"]
    return [
        f"{k}: experiment {expected[k]!r}, real run {got.get(k)!r}"
        for k in expected
        if got.get(k) != expected[k]
    ]
