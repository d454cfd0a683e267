"""Reading saved results back: run folders, sweep indexes, and a flat table of headline metrics.

Everything that looks at finished runs (plots, compare, regress, capacity, the sweep index) goes
through here, so the metric names are the same everywhere:

* latencies in seconds: ``ttft_p95_s``, ``tpot_p50_s``, ``e2e_mean_s``, ...;
* ``goodput_rps``, ``slo_attainment``, ``throughput_rps``, ``output_tok_s``, ...;
* utilization: ``kv_use_mean``, ``mean_batch_size``, ``preemptions``, ``mfu``, ``mbu``;
* request accounting: ``completed``, ``rejected``, ``unfinished``.

``DIRECTION`` says which way is better (+1 higher, -1 lower, 0 neither) for each.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pandas as pd

from simulator.errors import ConfigError
from simulator.files import load_yaml_file, read_text, refuse_repeated_columns

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queue")
STATS = ("mean", "p50", "p90", "p95", "p99")


def headline(summary: dict) -> dict:
    """A flat {metric: number} view of a summary.json (missing values as None)."""
    out: dict = {}
    for lat in LATENCIES:
        d = summary.get(f"{lat}_s") or {}
        for st in STATS:
            out[f"{lat}_{st}_s"] = d.get(st)
    t = summary.get("throughput", {})
    out["throughput_rps"] = t.get("requests_per_s")
    out["input_tok_s"] = t.get("input_tokens_per_s")
    out["output_tok_s"] = t.get("output_tokens_per_s")
    out["goodput_rps"] = summary.get("goodput_rps")
    out["slo_attainment"] = summary.get("slo_attainment")
    u = summary.get("utilization", {})
    for k in ("kv_use_mean", "kv_use_max", "mean_batch_size", "preemptions", "mfu", "mbu",
              "busy_fraction", "num_steps"):  # fmt: skip
        out[k] = u.get(k)
    out["usd_per_mtok"] = (summary.get("cost") or {}).get("usd_per_million_tokens")
    r = summary.get("requests", {})
    for k in ("arrived", "completed", "rejected", "unfinished"):
        out[k] = r.get(k)
    out["duration_s"] = summary.get("duration_s")
    return out


def direction(metric: str) -> int:
    """+1 if higher is better, -1 if lower is better, 0 if it is neither (a description)."""
    if metric in ("throughput_rps", "input_tok_s", "output_tok_s", "goodput_rps",
                  "slo_attainment", "completed"):  # fmt: skip
        return 1
    if metric.endswith("_s") and metric.split("_")[0] in LATENCIES:
        return -1
    if metric in ("usd_per_mtok", "rejected", "unfinished", "preemptions"):
        return -1
    return 0


# Metrics shown by `compare` and checked by `regress`, in display order.
MAIN_METRICS = (
    "ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
    "tpot_mean_s", "tpot_p50_s", "tpot_p95_s", "tpot_p99_s",
    "itl_p50_s", "itl_p99_s", "e2e_p50_s", "e2e_p95_s",
    "throughput_rps", "output_tok_s", "goodput_rps", "slo_attainment",
    "kv_use_mean", "mean_batch_size", "preemptions", "mfu", "mbu", "usd_per_mtok",
    "completed", "rejected", "unfinished",
)  # fmt: skip


def is_run(path: Path) -> bool:
    return (Path(path) / "summary.json").is_file()


def load_summary(run_dir: Path) -> dict:
    p = Path(run_dir) / "summary.json"
    if not p.is_file():
        raise ConfigError(str(run_dir), "", "no summary.json here (not a finished run folder)")
    summary = read_json(p)
    check_summary(summary, p)
    return summary


SUMMARY_SECTIONS = (*(f"{lat}_s" for lat in LATENCIES), "throughput", "utilization", "requests")


def check_summary(summary: dict, path: Path) -> None:
    """The sections and numbers `headline` reads have the shapes a run writes, so an edited or
    foreign summary.json fails naming the key instead of deep inside compare or regress."""
    for section in (*SUMMARY_SECTIONS, "cost"):
        value = summary.get(section)
        if (
            section in summary
            and not isinstance(value, dict)
            and not (value is None and section == "cost")
        ):
            raise ConfigError(str(path), section, f"expected a mapping, got {value!r}"[:120])
    for metric, value in headline(summary).items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(str(path), metric, f"expected a number, got {value!r}"[:120])


def read_json(path: Path) -> dict:
    """A saved JSON mapping (summary, baseline); bad content is an error naming the file."""
    try:
        doc = json.loads(read_text(path, "JSON file"))
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), f"line {e.lineno}", f"not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ConfigError(str(path), "", "not readable: nested too deeply") from None
    if not isinstance(doc, dict):
        raise ConfigError(str(path), "<top>", f"expected a JSON mapping, got {type(doc).__name__}")
    return doc


def load_config(run_dir: Path) -> dict:
    p = Path(run_dir) / "config.yaml"
    if not p.is_file():
        return {}
    doc = load_yaml_file(p, "run config")
    if not isinstance(doc, dict):
        raise ConfigError(str(p), "<top>", "expected a mapping (the run's resolved config)")
    return doc


#: columns every steps.csv and requests.csv has (simulator.results writes them), for readers
STEP_COLUMNS = (
    "start_s", "duration_s", "prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs",
    "decode_ctx", "kv_blocks_used", "num_waiting", "num_running", "kv_tokens", "replica",
)  # fmt: skip
REQUEST_FILLED = ("id", "arrival_s", "input_tokens", "output_tokens", "replica", "status")
REQUEST_NUMBERS = (
    "id", "arrival_s", "input_tokens", "output_tokens", "generated_tokens", "first_scheduled_s",
    "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions",
    "cached_tokens", "replica",
)  # fmt: skip


def read_results_csv(path: Path, required=(), numeric=(), filled=(), **pandas_kw) -> pd.DataFrame:
    """A results CSV (steps, requests, index) checked for its columns and numbers.

    Why: these files are meant to be read back, but users edit, truncate and mix them up; a
    missing column or a text cell must name the file, the column and the line, not end in a
    pandas KeyError deep inside a plot.
    """
    path = Path(path)
    text = read_text(path, "CSV file")
    if not text.strip():
        raise ConfigError(str(path), "", "the file is empty (no CSV header)")
    # pandas renames a repeated column ("x.1") silently: the header is checked as written
    refuse_repeated_columns(path, next(csv.reader(io.StringIO(text)), []))
    try:
        df = pd.read_csv(io.StringIO(text), **pandas_kw)
    except (pd.errors.ParserError, ValueError) as e:
        raise ConfigError(str(path), "", f"not a valid CSV file ({str(e).strip()})") from None
    for col in required:
        if col not in df.columns:
            raise ConfigError(
                str(path), col, f"required column is missing (has {list(df.columns)})"
            )
    for col in numeric:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna()
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise ConfigError(str(path), f"{col} (line {row + 2})",
                              f"expected a number, got {df[col].iloc[row]!r}")  # fmt: skip
    for col in filled:  # columns every row has a value in (no empty cell, no nan)
        empty = df[col].isna()
        if empty.any():
            row = int(empty.to_numpy().argmax())
            raise ConfigError(str(path), f"{col} (line {row + 2})", "expected a value, got none")
    return df


SEED_DIR = re.compile(r"^seed(\d+)$")


def seed_runs(folder: Path) -> dict[int, Path]:
    """{seed: run folder} for ``folder`` itself (a run) or its ``seedN`` subfolders."""
    folder = Path(folder)
    out = {}
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = SEED_DIR.match(sub.name)
        if m and is_run(sub):
            out[int(m.group(1))] = sub
    if not out and is_run(folder):
        seed = load_config(folder).get("seed", 0)
        out[int(seed) if isinstance(seed, int) else 0] = folder
    return out


def load_index(folder: Path) -> pd.DataFrame | None:
    p = Path(folder) / "index.csv"
    if not p.is_file():
        return None
    return read_results_csv(p, ("point", "seed", "folder", "status"), ("seed",),
                            keep_default_na=False, na_values=[""])  # fmt: skip


def describe_setup(run_dir: Path) -> dict:
    """Model, GPU, TP, latency model of a run (for plot titles and table headers)."""
    cfg = load_config(run_dir)
    mcfg = cfg.get("model") or {}
    model = mcfg.get("name", "?")
    precision = [mcfg.get("weights", "bf16"), mcfg.get("kv_cache_dtype", "bf16")]
    if precision != ["bf16", "bf16"]:  # e.g. "llama-3-8b (fp8, KV fp8)"
        model = f"{model} ({precision[0]}, KV {precision[1]})"
    hw = cfg.get("hardware") or {}
    gpu = (hw.get("gpu") or {}).get("name", "?")
    lat = cfg.get("latency") or {}
    latency = lat.get("name", "?")
    if lat.get("table") and Path(str(lat["table"])).name not in latency:
        latency = f"{latency} ({Path(str(lat['table'])).name})"
    return {"model": model, "gpu": gpu, "tp": hw.get("tp", 1), "latency": latency,
            "replicas": (cfg.get("cluster") or {}).get("replicas", 1)}  # fmt: skip
