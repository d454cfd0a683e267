"""Validation against vLLM 0.24.0 serving: arrivals, GPU jobs, and the report.

    python validation/vllm-0.24/run_all.py arrivals          # CPU: arrivals + jobs (vjobs/)
    bash profiles/device_vllm.sh vjobs/h200_llama-3-8b_replay.json:h200_llama_replay  # GPU
    python validation/vllm-0.24/run_all.py report --real DIR # CPU: README table, report.json
    python validation/vllm-0.24/run_all.py report --table h100/llama-3-8b=DIR --out DIR2
                                                   # the same cases on another table (e.g. one
                                                   # profiled on another machine), written to DIR2

The real runs of one (GPU, model) pair live in ``real/<gpu>_<model>/`` (the job's output folder:
``<case>.json.gz`` per case and the engine's step log, gzipped). Nothing here is fitted: the
simulation uses the shipped vLLM table (fitted on profiling runs only) and the ``vllm`` policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from profiles import engine_jobs, vllm_grid, vllm_validate  # noqa: E402
from profiles.hf_config import write_model_dir  # noqa: E402
from profiles.vllm_steps import read_steps  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.models import load_model  # noqa: E402

LOADS = {
    "conv": {"light": 1.0, "moderate": 3.0, "heavy": 5.5},  # workload.arrival.rate_scale
    "arxiv": {"light": 2.0, "moderate": 4.5, "heavy": 7.0},  # workload.arrival.rate_per_s
}
#: the served models, by their name in job and folder names: a catalog model, in its precision
SERVED = {
    "llama-3-8b": "llama-3-8b",
    "qwen2.5-7b": "qwen2.5-7b",
    "llama-3-8b-fp8": "{base: llama-3-8b, weights: fp8, kv_cache_dtype: fp8}",
    "llama-3-8b-int4": "{base: llama-3-8b, weights: int4}",
    "llama-3-70b": "llama-3-70b",
    "llama-3-70b-fp8": "{base: llama-3-70b, weights: fp8, kv_cache_dtype: fp8}",
    "llama-3-70b-int4": "{base: llama-3-70b, weights: int4}",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    # routers skewed as DeepSeek-R1's measured imbalance (`simulator.served.ROUTING_SKEW_SOURCE`)
    "qwen3-30b-a3b-skew0.6": "{base: qwen3-30b-a3b, routing_skew: 0.6}",
    "gpt-oss-20b-skew0.6": "{base: gpt-oss-20b, routing_skew: 0.6}",
    "mixtral-8x7b-skew0.6": "{base: mixtral-8x7b, routing_skew: 0.6}",
    "llama-3.1-8b": "llama-3.1-8b",
    "gemma-3-27b": "gemma-3-27b",
    "deepseek-v2-lite": "deepseek-v2-lite",
    "mixtral-8x7b": "mixtral-8x7b",
    "gpt-oss-20b": "gpt-oss-20b",
    "gpt-oss-120b": "gpt-oss-120b",
    # served in the checkpoint's block-wise FP8 (`profiles.hf_config._PUBLISHED_QUANT`)
    "deepseek-v3-fp8": "{base: deepseek-v3, weights: fp8}",
}


@dataclass(frozen=True)
class Pair:
    """A (GPU, served model, TP) replayed for validation, and profiled."""

    gpu: str
    model: str
    tp: int = 1
    #: the cases' arrival rates x this, so that each load sits at about the same fraction of the
    #: engine's capacity as for an 8B on one GPU. Chosen from the simulator's saturated
    #: completion rate on the conversation case (offered 20x its rate): Llama-3-8B on an H200
    #: 20.2 req/s, Llama-3-70B at TP2 on two 5.0 (bf16) and 9.0 (fp8), Qwen3-30B-A3B 25.6 and
    #: Gemma-3-27B 6.3 and DeepSeek-V2-Lite 53.5 on one H200, gpt-oss-20b 32.8 on one H100,
    #: Qwen3-30B-A3B at TP2 on two H200s 31.7
    #: (`servesim`'s run of the conv case at rate_scale 20, finished requests over the span to
    #: the last finish). An input, not a
    #: fit: nothing of the real runs is used to choose it.
    load: float = 1.0

    @property
    def name(self) -> str:
        """Folder and job names: ``h200_llama-3-8b``, ``h200_llama-3-70b_tp2``."""
        return f"{self.gpu}_{self.model}" + (f"_tp{self.tp}" if self.tp > 1 else "")

    @property
    def key(self) -> str:
        """Report keys and `--table`'s GPU/MODEL: `h200/llama-3-8b`, `h200/llama-3-70b-tp2`."""
        return f"{self.gpu}/{self.model}" + (f"-tp{self.tp}" if self.tp > 1 else "")


PAIRS = (
    Pair("h200", "llama-3-8b"), Pair("h200", "qwen2.5-7b"), Pair("h100", "llama-3-8b"),
    Pair("h100", "qwen2.5-7b"), Pair("h200", "llama-3-8b-fp8"), Pair("h100", "llama-3-8b-fp8"),
    # GPTQ int4 weights (Machete), bf16 KV: saturates at 20.4 req/s on its table, as bf16 does
    Pair("h200", "llama-3-8b-int4"),
    # on the 2-GPU machine (nvidia-h200-x2); no real run yet
    Pair("h200", "llama-3-70b", 2, load=0.25), Pair("h200", "llama-3-70b-fp8", 2, load=0.45),
    # architectures: a mixture of experts and a sliding-window model (issue 15)
    Pair("h200", "qwen3-30b-a3b", load=1.25), Pair("h200", "gemma-3-27b", load=0.3),
    Pair("h200", "deepseek-v2-lite", load=2.6),  # MLA + MoE; token-dependent routing since 11-26
    # token-dependent routing on an H100 (loads scaled by the bandwidth ratio, 2.6 / 1.43); the
    # replay (2026-11-27) and the one-pass table (2026-11-26) are from two H100 hosts
    Pair("h100", "deepseek-v2-lite", load=1.8),
    # MoE + alternating sliding windows + sinks; bf16 experts; its table is an H100's
    Pair("h100", "gpt-oss-20b", load=1.6),
    # TP2 of the MoE on 2x H200 (31.7 req/s saturated on its first TP2 table, 2026-11-27); the
    # table and the replay re-recorded on one host the same day (README, "A third 2x H200 host")
    Pair("h200", "qwen3-30b-a3b", 2, load=1.55),
)  # fmt: skip
#: profiling runs without a replay: (job name, served model, tp)
PROFILES_ONLY = (
    ("h200_llama-3-70b-fp8", "llama-3-70b-fp8", 1),
    ("h200_llama-3-70b-int4", "llama-3-70b-int4", 1),
    ("h200_llama-3.1-8b", "llama-3.1-8b", 1),  # 128k context: the grid's `long` family
    ("h200_mixtral-8x7b", "mixtral-8x7b", 1),  # MoE, 8 experts top-2; 93 GB: an H200 only
    # MoE (32 experts top-4) + alternating 128-token sliding windows + attention sinks; bf16
    # experts (42 GB: fits an H100 too; the GPU is the table's, not the job name's)
    ("h200_gpt-oss-20b", "gpt-oss-20b", 1),
    # TP2 on the 2-GPU machine: the tensor-parallel side of TP vs EP (experiments/moe_tp_vs_ep)
    ("h200_qwen3-30b-a3b_tp2", "qwen3-30b-a3b", 2),
    # skewed routing through the engine (`profiles.dummy_routing`, "Skewed routing")
    ("h200_qwen3-30b-a3b_skew0.6", "qwen3-30b-a3b-skew0.6", 1),
    ("h200_gpt-oss-20b_skew0.6", "gpt-oss-20b-skew0.6", 1),
    ("h200_mixtral-8x7b_skew0.6", "mixtral-8x7b-skew0.6", 1),
)
#: profiling runs with vLLM's --enable-expert-parallel over the tp GPUs (no data parallelism:
#: whole experts per GPU, attention TP; `simulator.served` layout ``allreduce``)
EP_PROFILES = (("h200_qwen3-30b-a3b_tp2-ep2", "qwen3-30b-a3b", 2),)


#: one GPU's shard of a TP layout, timed at TP1 (`profiles.hf_config.shard_config`; the
#: simulator adds the collectives, `simulator.latency.shard`): (job name, served model, layout
#: tp). DeepSeek-V3 at TP8, as it is usually served on one 8-GPU host (78 GiB of FP8 weights a
#: GPU: an H200); gpt-oss-120b at TP2, the layout whose collectives are measured here (109 GiB
#: of bf16 weights a GPU); Llama-3-70B at TP2 checks the method against the real TP2 table
SHARDS = (
    ("h200_deepseek-v3-fp8_tp8-shard", "deepseek-v3-fp8", 8),
    ("h200_gpt-oss-120b_tp2-shard", "gpt-oss-120b", 2),
    ("h200_llama-3-70b_tp2-shard", "llama-3-70b", 2),
)


#: models whose prefill is several times an 8B's get a smaller grid (prompt + output tokens per
#: scenario at most) and a 70B or Mixtral-8x7B one pass: (cap, passes) by the size in the job's
#: name. Such a single pass fits one GPU call; a 27B's three passes take two (`resume`)
GRID_LIMITS = {
    "70b": (120_000, 1), "27b": (120_000, vllm_grid.REPEATS), "8x7b": (120_000, vllm_grid.REPEATS),
    "deepseek-v3": (120_000, 1), "120b": (120_000, 1),
}  # fmt: skip


def case_overrides(trace: str, load: str, pair: Pair) -> list[str]:
    key = "rate_scale" if trace == "conv" else "rate_per_s"
    return [
        f"workload.arrival.{key}={LOADS[trace][load] * pair.load:g}",
        f"model={SERVED[pair.model]}",
        f"hardware.gpu={pair.gpu}",
        f"hardware.tp={pair.tp}",
    ]


def cases():
    for trace, loads in LOADS.items():
        for load in loads:
            yield trace, load, str(HERE / "configs" / f"{trace}.yaml")


def served_spec(model: str):
    """The `ModelSpec` of a served model of `SERVED` (its catalog entry, precision included)."""
    return load_model(yaml.safe_load(SERVED[model]), "run_all.SERVED", model)


def _engine_job(out: Path, model: str, tp: int, shard: bool = False, ep: bool = False) -> dict:
    """The model folder (relative to the repository root: jobs run from the root of a copy of
    the tree on the GPU machine, wherever that lies), TP and precision of a served model; with
    ``shard``, one GPU's shard of the ``tp`` layout, run at TP1; with ``ep``, expert
    parallelism over the ``tp`` GPUs."""
    spec = served_spec(model)
    folder = out / "models" / (f"{model}_tp{tp}-shard" if shard else model)
    mdir = write_model_dir(spec, folder, tp if shard else None).relative_to(ROOT)
    return engine_jobs.engine_job(spec, str(mdir), tp, shard, expert_parallel=ep)


def _profile_job(out: Path, name: str, job: dict) -> None:
    # resumable: with RESUME=1, device_vllm.sh keeps a cut-short run's folder and this phase
    # skips the scenarios it finished; one pass per engine process (vllm_run.run_profile: a
    # prompt step's launch time is drawn per process), device_vllm.sh starting the next
    phase = {"name": "profile", "kind": "profile", "seed": 0, "resume": True}
    phase["passes_per_engine"] = 1
    phase["repeats"] = vllm_grid.REPEATS
    for size, (cap, repeats) in GRID_LIMITS.items():
        if size in name:
            phase["max_scenario_tokens"], phase["repeats"] = cap, repeats
    prof = {**job, "phases": [phase]}
    (out / f"{name}_profile.json").write_text(json.dumps(prof))


def make_jobs(out: Path) -> None:
    out = out.resolve()
    for pair in PAIRS:
        phases = []
        for trace, load, path in cases():
            cfg = engine_jobs.experiment(path, case_overrides(trace, load, pair))
            arr = out / "arrivals" / f"{pair.name}_{trace}_{load}.json"
            engine_jobs.write_arrivals(cfg, path, arr)
            arr = arr.relative_to(ROOT)
            phases.append({"name": f"{trace}_{load}", "kind": "replay", "arrivals": str(arr)})
        job = _engine_job(out, pair.model, pair.tp)
        (out / f"{pair.name}_replay.json").write_text(json.dumps({**job, "phases": phases}))
        _profile_job(out, pair.name, job)
    for name, model, tp in PROFILES_ONLY:
        _profile_job(out, name, _engine_job(out, model, tp))
    for name, model, tp in SHARDS:
        _profile_job(out, name, _engine_job(out, model, tp, shard=True))
    for name, model, tp in EP_PROFILES:
        _profile_job(out, name, _engine_job(out, model, tp, ep=True))


def report(real_root: Path, tables: dict[str, str] | None = None) -> dict:
    """Every case whose real run is stored under ``real_root/<pair.name>/``; ``tables`` maps
    a pair's key to a table folder used instead of the shipped one (only those pairs run)."""
    out = {}
    for p in PAIRS:
        run, pair = real_root / p.name, p.key
        if not run.is_dir() or (tables and pair not in tables):
            continue
        steps = read_steps(str(run / "steps.jsonl"))
        for trace, load, path in cases():
            if not (run / f"{trace}_{load}.json.gz").is_file():
                continue
            over = case_overrides(trace, load, p)
            if tables:
                over.append(f"latency.table={Path(tables[pair]).resolve()}")
            cfg = engine_jobs.experiment(path, over)
            phase = vllm_validate.load_phase(run / f"{trace}_{load}.json.gz")
            res = vllm_validate.report_case(cfg, path, phase, steps)
            out[f"{pair}/{trace}_{load}"] = res
            print(
                f"{pair}/{trace}_{load}: median {res['median_abs_err']:.1%} "
                f"max {res['max_abs_err']:.1%}, identical steps "
                f"{res['schedule_match']['identical']:.1%}",
                flush=True,
            )
    return out


def table(results: dict) -> str:
    names = [m["metric"] for m in next(iter(results.values()))["metrics"]]
    head = "| case | " + " | ".join(n.replace("_s.", " ") for n in names)
    head += " | median | max | identical steps |"
    lines = [head, "|" + " --- |" * (len(names) + 4)]
    for case, r in results.items():
        cells = []
        for m in r["metrics"]:
            scale = 1000 if m["metric"].split(".")[0] != "throughput" else 1
            cells.append(f"{m['sim'] * scale:.1f} / {m['real'] * scale:.1f} ({m['err']:+.1%})")
        lines.append(
            f"| {case} | "
            + " | ".join(cells)
            + f" | {r['median_abs_err']:.1%} | {r['max_abs_err']:.1%}"
            + f" | {r['schedule_match']['identical']:.1%} |"
        )
    return "\n".join(lines)


#: the columns of the README's condensed table
SUMMARY = ("ttft_s.p50", "ttft_s.p95", "tpot_s.p50", "tpot_s.p95", "itl_s.p95", "itl_s.p99",
           "e2e_s.p50", "e2e_s.p95", "throughput.output_tokens_per_s")  # fmt: skip


def summary_table(results: dict) -> str:
    """The README's table: nine metrics (sim / real ms, error), the case's median and max,
    identical steps and the busy time charged on vLLM's own batches."""
    heads = [m.replace("_s.", " ").replace("throughput.output_tokens_per_s", "out tok/s")
             for m in SUMMARY]  # fmt: skip
    lines = [
        "| case | " + " | ".join(heads) + " | median | max | identical steps | busy time on "
        "vLLM's batches |",
        "|" + " --- |" * (len(SUMMARY) + 5),
    ]
    for case, r in results.items():
        by = {m["metric"]: m for m in r["metrics"]}
        cells = []
        for name in SUMMARY:
            m = by[name]
            if name.startswith("throughput"):
                cells.append(f"{m['err']:+.1%}")
            else:
                cells.append(f"{m['sim'] * 1e3:.1f} / {m['real'] * 1e3:.1f} ({m['err']:+.0%})")
        sm = r["schedule_match"]
        busy = (sm.get("step_model_on_real_batches") or {}).get("busy_time_err")
        lines.append(
            f"| {case} | "
            + " | ".join(cells)
            + f" | {r['median_abs_err']:.1%} | {r['max_abs_err']:.0%} | {sm['identical']:.1%} | "
            + (f"{busy:+.1%} |" if busy is not None else "- |")
        )
    return "\n".join(lines)


def interval_table(results: dict) -> str:
    """Per served model: its latency values, how many miss 15%, and how many of each lie inside
    the real run's own 90% bootstrap interval (`profiles.metric_intervals`: the percentile's
    sampling noise over the run's requests, a lower bound on run-to-run spread)."""
    by: dict[str, list[dict]] = {}
    for case, r in results.items():
        by.setdefault(case.rsplit("/", 1)[0], []).extend(
            m for m in r["metrics"] if "sim_in_real_ci90" in m
        )
    lines = [
        "| served model | latency values | sim inside real's 90% interval | beyond 15% "
        "| of those, inside the interval |",
        "| --- | --- | --- | --- | --- |",
    ]
    for pair, ms in by.items():
        miss = [m for m in ms if abs(m["err"]) > 0.15]
        lines.append(
            f"| {pair} | {len(ms)} | {sum(m['sim_in_real_ci90'] for m in ms)} | {len(miss)} "
            f"| {sum(m['sim_in_real_ci90'] for m in miss)} |"
        )
    return "\n".join(lines)


def totals_table(results: dict, miss: float = 0.15) -> str:
    """The published counts: per served model and over every case, how many metric values
    (all 14 a case), their median |error|, how many lie beyond ``miss`` and the largest."""
    by: dict[str, list[float]] = {}
    for case, r in results.items():
        by.setdefault(case.rsplit("/", 1)[0], []).extend(abs(m["err"]) for m in r["metrics"])
    by["all"] = [e for errs in list(by.values()) for e in errs]
    lines = [
        f"| served model | values | median abs error | beyond {miss:.0%} | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for pair, errs in by.items():
        lines.append(f"| {pair} | {len(errs)} | {' | '.join(error_stats(errs, miss))} |")
    return "\n".join(lines)


def error_stats(errs: list[float], miss: float = 0.15) -> tuple[str, str, str]:
    """Median |error|, how many |errors| lie beyond ``miss``, and the largest, formatted as the
    published tables print them."""
    a = np.abs(errs)
    return f"{np.median(a):.1%}", str(int((a > miss).sum())), f"{a.max():.0%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("phase", choices=["arrivals", "report"])
    ap.add_argument("--real", default=str(HERE / "real"), help="folder of the real runs")
    ap.add_argument("--jobs", default=str(ROOT / "vjobs"), help="folder for jobs (arrivals)")
    ap.add_argument(
        "--table", action="append", default=[], metavar="GPU/MODEL=DIR",
        help="report: this pair on the table in DIR instead of the shipped one (repeatable)",
    )  # fmt: skip
    ap.add_argument("--out", default=str(HERE), help="report: folder for report.json etc.")
    a = ap.parse_args()
    if a.phase == "arrivals":
        make_jobs(Path(a.jobs))
        return 0
    tables = {}
    for spec in a.table:
        pair, sep, folder = spec.partition("=")
        if not sep or pair.count("/") != 1 or not folder:
            ap.error(f"--table {spec!r}: expected GPU/MODEL=DIR (e.g. h100/llama-3-8b=/tmp/t)")
        tables[pair] = folder
    try:
        results = report(Path(a.real), tables)
    except ConfigError as e:  # a real run of other arrivals, model, precision or GPU
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results) + "\n")
    (out / "summary.md").write_text(summary_table(results) + "\n")
    (out / "intervals.md").write_text(interval_table(results) + "\n")
    (out / "totals.md").write_text(totals_table(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
