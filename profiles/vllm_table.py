"""Turn a recorded vLLM run into a step-latency table: ``steps.csv`` + ``meta.yaml``.

A step's time is the interval the engine spent on it: from the later of the previous step's
completion and this step's planning, to this step's completion (``t_done``, see
`profiles.vllm_steps`). Under async scheduling the next step is planned and launched while the
current one runs, so in a busy engine this is the interval between consecutive completions,
host work (scheduling, input preparation, output processing) included wherever it is not hidden
behind the GPU; after an idle gap it runs from the plan. That is exactly what a simulator must
charge per step.

Each step gets the latency features of `simulator.latency.base` and the scenario it ran in (the
phase's time windows); the held-out split is the scenario's (`profiles.vllm_grid`). Steps that
ran outside any scenario window (none, normally) are dropped and counted in ``meta.yaml``.
"""

from __future__ import annotations

import csv
import gzip
import json
import time
from pathlib import Path

import numpy as np
import yaml

from profiles.vllm_steps import read_steps
from simulator.latency.base import chunk_attn_pairs
from simulator.latency.engine_steps import STEP_COLUMNS


def step_rows(steps: list[dict]) -> list[dict]:
    """Latency features and measured duration (µs) of each recorded step, in completion order.

    ``after_idle`` is 1 when the step was planned after the previous one had completed (the
    engine was idle, so nothing of its host work overlapped a running step).

    ``exposes_launch`` marks a step with prefill tokens planned while a decode-only step ran:
    launching it costs the engine loop tens of milliseconds of host work (inductor graphs run
    kernel by kernel above the largest CUDA-graph size, attention metadata, input copies),
    which a 5 ms decode step cannot hide, so that decode step's stamp arrives late (seen on
    H100 and H200: a 4-sequence decode stamped 31 ms after its plan, the 1024-token prefill
    behind it 3 ms later). The latency model charges the pair's excess to the prefill step.
    Behind another prefill step the launch hides under the running step and nothing moves."""
    rows, prev = [], None
    for s in steps:
        idle = prev is None or s["t_sched"] >= prev
        start = s["t_sched"] if idle else prev
        prev = s["t_done"]
        pf = s["pf"]
        rows.append(
            {
                "prefill_tokens": sum(n for _, n, _ in pf),
                "prefill_attn": round(sum(chunk_attn_pairs(n, b) for _, n, b in pf), 1),
                "prefill_seqs": len(pf),
                "decode_seqs": s["nd"],
                "decode_ctx": s["dctx"],
                "decode_max": s["dmax"],
                "after_idle": int(idle),
                "dur_us": round((s["t_done"] - start) * 1e6, 1),
                "t_sched": s["t_sched"],
                "t_done": s["t_done"],
            }
        )
    for prev, r in zip(rows, rows[1:], strict=False):
        r["exposes_launch"] = int(
            r["prefill_tokens"] > 0 and not r["after_idle"] and prev["prefill_tokens"] == 0
        )
    if rows:
        rows[0]["exposes_launch"] = 0
    return rows


def submit_bursts(scenarios: list[dict], requests: dict) -> dict[str, float]:
    """Per scenario, when its last base request was submitted. Submitting a whole batch at once
    makes the engine core deserialize many requests while it plans and runs its first steps
    (measured: a 1024-token prefill took 134 ms instead of 16 next to 128 submissions), a cost
    of the profiling method that serving at real arrival rates does not pay."""
    last: dict[str, float] = {}
    for rid, rec in requests.items():
        sid, _, idx = rid.rpartition("/")
        if not idx.startswith("inj"):
            last[sid] = max(last.get(sid, 0.0), rec["t_submit"])
    return {s["id"]: last.get(s["id"], s["t0"]) for s in scenarios}


#: steps planned within this long after a scenario's last submission count as in its burst
BURST_TAIL_S = 0.010


def label(rows: list[dict], scenarios: list[dict], bursts: dict[str, float]):
    """Keep the rows inside a scenario window, tagged with its id, split and ``burst`` (1: planned
    during the scenario's submission burst; 2: the step after one, whose interval starts at
    that step's unreliable stamp; 3: the phase's first scenario, the engine's warm-up)."""
    kept, dropped, j = [], 0, 0
    wins = sorted(scenarios, key=lambda s: s["t0"])
    for r in rows:
        while j < len(wins) and r["t_done"] > wins[j]["t1"] + 0.05:
            j += 1
        if j < len(wins) and r["t_done"] >= wins[j]["t0"]:
            sid = wins[j]["id"]
            burst = int(r["t_sched"] <= bursts[sid] + BURST_TAIL_S)
            kept.append({**r, "scenario": sid, "split": wins[j]["split"], "burst": burst})
        else:
            dropped += 1
    first = wins[0]["id"] if wins else None
    for r in kept:  # the engine's first real steps pay one-time warm-up (seen: 415 ms)
        if r["scenario"] == first:
            r["burst"] = 3
    planned_in_burst = [r["burst"] == 1 for r in kept]
    for i in range(1, len(kept)):  # its interval starts at an unreliable stamp
        r = kept[i]
        if planned_in_burst[i - 1] and not r["burst"] and not r["after_idle"]:
            r["burst"] = 2
    return kept, dropped


def frontend_delays(phase: dict, steps: list[dict]) -> dict:
    """The serving path outside the engine loop, from the single-request prefill scenarios
    (an idle engine, one request): input = first step planned - submit (least squares in the
    prompt length: the frontend and the engine core copy and hash every prompt token), output =
    client receipt of the first token - that step's completion (median)."""
    pts, outs = [], []
    for sc in phase["scenarios"]:
        rec = phase["requests"].get(sc["id"] + "/0")
        if not sc["id"].startswith("prefill_p") or rec is None:
            continue
        first = [s for s in steps if sc["t0"] <= s["t_sched"] <= sc["t1"] and s["pf"]]
        if first and rec["times"]:
            pts.append((rec["prompt"], first[0]["t_sched"] - rec["t_submit"]))
            outs.append(rec["times"][0][0] - first[0]["t_done"])
    if len(pts) < 3:
        return {}
    x = np.array([[1.0, p] for p, _ in pts])
    (a, b), *_ = np.linalg.lstsq(x, np.array([d for _, d in pts]), rcond=None)
    return {
        "input_s": round(max(float(a), 0.0), 6),
        "input_s_per_token": round(max(float(b), 0.0), 10),
        "output_s": round(float(np.median(outs)), 6),
        "requests": len(pts),
    }


def build_table(run_dir: Path, out_dir: Path, gpu_key: str, model_name: str, tp: int) -> dict:
    """Write ``steps.csv`` and ``meta.yaml`` for the run's profile phase; returns the meta."""
    engine = json.loads((run_dir / "engine.json").read_text())
    with gzip.open(run_dir / "profile.json.gz", "rt") as f:
        phase = json.load(f)
    bursts = submit_bursts(phase["scenarios"], phase["requests"])
    steps = read_steps(str(run_dir / "steps.jsonl"))
    rows, dropped = label(step_rows(steps), phase["scenarios"], bursts)
    frontend = frontend_delays(phase, steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow({"step_id": i, **r})
    meta = {
        "schema_version": 1,
        "kind": "engine_steps",
        "engine": {"name": "vllm", "version": engine["vllm_version"]},
        "gpu": {"key": gpu_key, "name": engine["gpu"], "count_visible": engine["gpu_count"]},
        "model": {"name": model_name},
        "tp": tp,
        "dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16"
        if engine["cache"]["cache_dtype"] == "auto"
        else engine["cache"]["cache_dtype"],
        "torch_version": engine["torch_version"],
        "engine_config": {k: engine[k] for k in ("scheduler", "cache", "model", "compilation")},
        "kv_capacity_tokens": engine["cache"]["num_gpu_blocks"] * engine["cache"]["block_size"],
        "weights": "dummy (load_format=dummy); config.json generated from the catalog",
        "steps": {
            "recorded": len(rows) + dropped,
            "outside_scenarios": dropped,
            "scenarios": len(phase["scenarios"]),
        },
        "step_time": "interval from max(previous completion, plan) to completion, engine clock",
        "frontend": frontend,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": "servesim profile --engine vllm (profiles/vllm_run.py, profiles/vllm_grid.py)",
    }
    (out_dir / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return meta
