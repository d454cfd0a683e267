"""Writing a run's results folder and printing its summary table.

Layout of ``results/<experiment>/<run>/``:
* ``config.yaml``  the resolved config (written first, so it exists even when the run fails;
                   a failed run also gets ``error.txt``);
* ``requests.csv`` one row per arrived request;
* ``steps.csv``    one row per engine step;
* ``summary.json`` every metric, the latency model used, and request accounting;
* ``timing.json``  wall-clock cost of the simulation (kept apart so the other files are
                   byte-identical for the same config and seed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from simulator.csvfast import write_csv

REQUEST_COLUMNS = (
    "id", "arrival_s", "input_tokens", "output_tokens", "generated_tokens", "first_scheduled_s",
    "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions",
    "cached_tokens", "replica", "status", "reject_reason",
)  # fmt: skip


def write_config(out_dir: Path, resolved: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(_plain(resolved), sort_keys=False))


def write_results(out_dir: Path, results, write_steps: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_config(out_dir, results.resolved)
    write_csv(out_dir / "requests.csv", {k: results.requests[k] for k in REQUEST_COLUMNS})
    if write_steps:
        write_csv(out_dir / "steps.csv", results.steps)
    (out_dir / "summary.json").write_text(json.dumps(_plain(results.summary), indent=2) + "\n")
    (out_dir / "timing.json").write_text(json.dumps({"simulate_wall_s": results.wall_s}) + "\n")


def write_error(out_dir: Path, message: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "error.txt").write_text(message + "\n")


def _plain(obj):
    """JSON/YAML-safe copy: numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def format_summary(summary: dict, name: str = "") -> str:
    """A one-screen table of the run's main numbers."""
    lines = []
    lat = summary["latency_model"]
    lines.append(f"servesim run {name}  [latency model: {lat.get('name', '?')}]")
    lines += _request_lines(summary)
    lines.append(f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}  (ms)")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        d = summary[key]
        vals = [d.get(k) for k in ("mean", "p50", "p90", "p95", "p99")]
        cells = "".join(f"{v * 1000:>10.1f}" if v is not None else f"{'-':>10}" for v in vals)
        lines.append(f"{label:<10}{cells}")
    t = summary["throughput"]
    lines.append(
        f"throughput: {t['requests_per_s']:.2f} req/s, {t['input_tokens_per_s']:.0f} input tok/s, "
        f"{t['output_tokens_per_s']:.0f} output tok/s over {summary['duration_s']:.1f} s"
    )
    slo = summary["slo"]
    slo_txt = ", ".join(
        f"{k.replace('_s', '')} <= {v * 1000:.0f} ms" for k, v in slo.items() if v is not None
    )
    att = summary["slo_attainment"]
    lines.append(
        f"goodput: {summary['goodput_rps']:.2f} req/s under SLO ({slo_txt or 'none'}); "
        f"attainment {att * 100 if att is not None else float('nan'):.1f}%"
    )
    u = summary["utilization"]
    lines.append(
        f"KV use: mean {u['kv_use_mean'] * 100:.1f}%, max {u['kv_use_max'] * 100:.1f}%; "
        f"preemptions {u['preemptions']}; mean batch {u['mean_batch_size']:.1f}; "
        f"MFU {u['mfu'] * 100:.1f}%, MBU {u['mbu'] * 100:.1f}%; steps {u['num_steps']}"
    )
    c = summary["cost"]
    if c.get("usd_per_million_tokens") is not None:
        lines.append(
            f"cost: ${c['usd_per_million_tokens']:.3f} per million tokens "
            f"({c['num_gpus']} GPU(s) at ${c['price_per_gpu_hour']:.2f}/h)"
        )
    if summary.get("energy"):
        lines.append(energy_line(summary["energy"]))
        if summary["energy"].get("warning"):
            lines.append(f"warning: {summary['energy']['warning']}")
    for w in lat.get("warnings", []) or []:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def energy_line(e: dict) -> str:
    """The energy section in one line, saying whether it is measured or an estimate."""
    if e.get("joules") is None:
        return f"energy: unknown ({e.get('reason', 'no energy model')})"
    jpt = e["joules_per_output_token"]
    per_tok = f"{jpt:.3g} J per output token, " if jpt is not None else ""
    usd = e.get("usd_per_million_tokens")
    usd_txt = f", ${usd:.4f} per million tokens" if usd is not None else ""
    if e["kind"] == "measured":
        ho = (e.get("model") or {}).get("heldout") or {}
        err = f", held-out median error {ho['median'] * 100:.1f}%" if ho.get("median") else ""
        how = f"measured: {e['source']}{err}"
    else:
        how = "TDP estimate: busy time x TDP, idle not counted"
    return (
        f"energy: {e['joules'] / 3.6e6:.3g} kWh, {per_tok}avg {e['avg_power_w']['per_gpu']:.0f} "
        f"W per GPU{usd_txt} at ${e['usd_per_kwh']:.2f}/kWh ({how})"
    )


def _request_lines(summary: dict) -> list[str]:
    """The request account (every request of the workload in exactly one count), the reject
    causes with their counts, and whether the seed mattered."""
    r = summary["requests"]
    cuts = r.get("cut_by_workload_limits") or {}
    cut_txt = ", ".join(f"{k}: {v}" for k, v in cuts.items() if v) or "none"
    late = r.get("not_arrived_by_horizon") or 0
    late_txt = f", {late} not arrived by the horizon" if late else ""
    lines = [
        f"requests: {r['arrived']} arrived, {r['completed']} completed, {r['rejected']} rejected, "
        f"{r['unfinished']} unfinished{late_txt}; cut by workload limits: {cut_txt}"
    ]
    causes = r.get("reject_causes") or {}
    if causes:
        lines.append("rejected: " + "; ".join(f"{n} x {cause}" for cause, n in causes.items()))
    seed = summary.get("seed")
    if isinstance(seed, dict) and not seed.get("matters"):
        lines.append(
            f"seed {seed['value']}: no random draws (trace replayed as recorded), so every seed "
            "gives these results"
        )
    return lines
