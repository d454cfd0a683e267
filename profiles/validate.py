"""``servesim validate FILE.yaml``: run one experiment simulated and on a real GPU, and compare.

Why: the simulator is only as useful as its distance from reality is known. This runs the same
config twice with the same arrivals, policy and KV allocator:

* simulated: step times from the shipped profiled table (``latency.model: auto``; the file's own
  ``latency`` section is replaced, so the comparison is always against the shipped table);
* real: every step executed on the GPU by `profiles.real_executor.RealGPUExecutor`, whose
  measured time (GPU + per-step host work, see that module) advances the clock.

and writes ``report.md`` + ``report.json`` (+ ``real.json.gz``, the real run's summary and
per-step records, from which the report can be rebuilt on a machine without a GPU:
``--real-json``). The report has, per metric (TTFT/TPOT/ITL/E2E p50/p95/p99, throughput), the
simulated value, the real value and the relative error ``sim / real - 1``; and per step, the
table's prediction for the real step's batch composition against the measured time (median and
p95 absolute relative error, by step kind, and the compositions with the largest errors).

Invariant: the table is never fitted or adjusted here; predictions come from the table as
shipped. A saved real run carries a fingerprint (`fingerprint`) and is only compared with the
experiment it was made for (`check_fingerprint`); the report needs no torch, the GPU phase says
so before any work when torch or CUDA is missing.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gzip
import hashlib
import json
import math
import os
import sys
from pathlib import Path

from profiles.real_executor import RECORD_FIELDS
from profiles.report_fmt import pct
from simulator.config import TOOLING_KEYS, apply_overrides, load_yaml
from simulator.errors import ConfigError
from simulator.files import check_out_dir, decode_text
from simulator.hardware import GPUS

#: errors print signed (`+3.1%`)
_signed = functools.partial(pct, signed=True)


#: (summary section, statistic) pairs compared between simulation and reality
METRICS = tuple(
    (sec, st) for sec in ("ttft_s", "tpot_s", "itl_s", "e2e_s") for st in ("p50", "p95", "p99")
) + (("throughput", "requests_per_s"), ("throughput", "output_tokens_per_s"))


def prepare(path: str, overrides: list[str] | None = None) -> tuple[dict, str, Path]:
    """The config validated: tooling keys dropped, latency forced to the shipped table."""
    cfg = apply_overrides(load_yaml(path), overrides or [])
    for key in TOOLING_KEYS:
        cfg.pop(key, None)
    cfg["latency"] = {"model": "auto"}
    return cfg, str(path), Path(path).resolve().parent


def run_sim(cfg: dict, where: str, base_dir: Path, real: dict | None = None, source: str = ""):
    """Simulate with the shipped table; with ``real``, first refuse a real run whose
    fingerprint differs from this experiment's (``source`` names its file)."""
    from simulator.runner import build, simulate

    built = build(copy.deepcopy(cfg), where, base_dir)
    if real is not None:
        check_fingerprint(real, fingerprint(built, built.latency.describe().get("name")), source)
    return simulate(built).summary, built.latency


def table_mixed_mode(latency) -> str:
    """How the whole steps of the latency model's table ran their mixed steps ("eager" for
    tables from before the mode was recorded, and for models without a table)."""
    table = getattr(latency, "table", None)
    runner = (table.meta.get("step_runner") or {}) if table is not None else {}
    return runner.get("mixed_mode", "eager")


def run_real(cfg, where, base_dir, runner=None, time_mode: str = "wall") -> dict:
    """Run on the GPU; returns the real run's summary, per-step records and executor info.

    Mixed steps run the way the shipped table's whole steps did (`table_mixed_mode`), so the
    comparison is between a table and the execution it models."""
    from profiles.real_executor import RealGPUExecutor
    from simulator.runner import build, simulate

    modeled = build(copy.deepcopy(cfg), where, base_dir).latency
    mixed_mode = table_mixed_mode(modeled)
    cfg = copy.deepcopy(cfg)
    cfg["latency"] = {"model": "roofline"}  # unused on the GPU; the table is read at report time
    built = build(cfg, where, base_dir)
    kv = built.resolved["kv_cache"]
    executors = []

    def factory(latency, index):
        nonlocal runner
        ex = RealGPUExecutor(
            built.model, built.tp, kv["num_blocks"], kv["block_size"], runner=runner,
            time_mode=time_mode, mixed_mode=mixed_mode,
        )  # fmt: skip
        runner = ex.runner
        if not executors:
            ex.warmup()
        executors.append(ex)
        return ex

    res = simulate(built, executor_factory=factory)
    recs = [r for ex in executors for r in ex.records]
    cols = {f: [r[i] for r in recs] for i, f in enumerate(RECORD_FIELDS) if f != "predicted_s"}
    return {
        "name": built.name,
        "summary": res.summary,
        "resolved": built.resolved,
        "executor": executors[0].describe(),
        "records": cols,
        "wall_s": res.wall_s,
        "fingerprint": fingerprint(built, modeled.describe().get("name")),
        "runner": runner,
    }


def _q(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _rel(sim: float, real: float) -> float:
    return sim / real - 1.0 if real else math.nan


def compare_metrics(sim: dict, real: dict) -> list[dict]:
    rows = []
    for sec, st in METRICS:
        s, r = sim[sec][st], real[sec][st]
        if s is None or r is None:
            continue
        rows.append({"metric": f"{sec}.{st}", "sim": s, "real": r, "rel_err": _rel(s, r)})
    return rows


def step_errors(records: dict, latency, worst: int = 8) -> dict:
    """Table prediction vs measured time on the real run's own steps."""
    n = len(records["wall_s"])
    feats = [
        tuple(records[k][i] for k in RECORD_FIELDS[:6]) for i in range(n)
    ]  # (pt, pa, ps, ds, dctx, longest decode context)
    pred = [latency.step_time(*f) for f in feats]
    out: dict = {"num_steps": n}
    for basis in ("wall_s", "gpu_s"):
        meas = records[basis]
        rel = [p / m - 1.0 for p, m in zip(pred, meas, strict=True)]
        kinds = {
            "decode_only": [i for i in range(n) if feats[i][0] == 0],
            "with_prefill": [i for i in range(n) if feats[i][0] > 0],
        }
        stats = {
            "median_abs_rel": _q([abs(x) for x in rel], 0.5),
            "p95_abs_rel": _q([abs(x) for x in rel], 0.95),
            "median_rel": _q(rel, 0.5),
            "total_time_rel": sum(pred) / sum(meas) - 1.0 if n else math.nan,
            "by_kind": {
                k: {
                    "steps": len(ix),
                    "median_abs_rel": _q([abs(rel[i]) for i in ix], 0.5),
                    "median_rel": _q([rel[i] for i in ix], 0.5),
                    "time_share": sum(meas[i] for i in ix) / sum(meas) if n else math.nan,
                }
                for k, ix in kinds.items()
            },
        }
        out[basis.removesuffix("_s")] = stats
    rel = [p / m - 1.0 for p, m in zip(pred, records["wall_s"], strict=True)]
    order = sorted(range(n), key=lambda i: -abs(rel[i]))[:worst]
    out["worst"] = [
        {
            **{k: records[k][i] for k in RECORD_FIELDS if k != "predicted_s"},
            "predicted_s": pred[i],
            "rel_err": rel[i],
        }
        for i in order
    ]
    host = [w - g for w, g in zip(records["wall_s"], records["gpu_s"], strict=True)]
    out["host_ms"] = {"median": _q(host, 0.5) * 1e3, "p95": _q(host, 0.95) * 1e3}
    return out


def build_report(name: str, sim: dict, real: dict, latency) -> dict:
    ran, modeled = real["executor"].get("mixed_mode", "eager"), table_mixed_mode(latency)
    if ran != modeled:
        raise ConfigError(
            name,
            "executor.mixed_mode",
            f"the real run executed mixed steps {ran!r} but the table models {modeled!r} "
            "ones; re-run the real phase on a GPU",
        )
    metrics = compare_metrics(sim, real["summary"])
    lm = dict(latency.describe())
    if lm.get("table"):
        root = Path(__file__).resolve().parents[1]
        lm["table"] = os.path.relpath(Path(lm["table"]).resolve(), root)
    errs = [abs(r["rel_err"]) for r in metrics if not math.isnan(r["rel_err"])]
    return {
        "name": name,
        "latency_model": lm,
        "executor": real["executor"],
        "metrics": metrics,
        "median_abs_rel_err": _q(errs, 0.5),
        "max_abs_rel_err": max(errs, default=math.nan),
        "steps": step_errors(real["records"], latency),
        "sim_summary": _trim(sim),
        "real_summary": _trim(real["summary"]),
    }


def _trim(s: dict) -> dict:
    keys = ("requests", "duration_s", "ttft_s", "tpot_s", "itl_s", "e2e_s", "throughput",
            "utilization", "preemption")  # fmt: skip
    return {k: s[k] for k in keys if k in s}


def _fmt(metric: str, v: float) -> str:
    return f"{v:.2f}" if metric.startswith("throughput") else f"{1e3 * v:.1f} ms"


def render_markdown(rep: dict) -> str:
    st = rep["steps"]
    lm = rep["latency_model"]
    ex = rep["executor"]
    lines = [
        f"# Validation: {rep['name']}",
        "",
        f"Simulated with `{lm.get('table', lm.get('name'))}` (torch {lm.get('torch')}); real run "
        f"on the GPU with StepRunner ({ex['kv_layout']} KV layout, mixed steps "
        f"{ex.get('mixed_mode', 'eager')}, time = {ex['time_mode']}: GPU + per-step host "
        "work). Relative error = sim / real - 1.",
        "",
        "| metric | sim | real | rel. error |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rep["metrics"]:
        m = r["metric"]
        err = _signed(r["rel_err"])
        lines.append(f"| {m} | {_fmt(m, r['sim'])} | {_fmt(m, r['real'])} | {err} |")
    lines += [
        "",
        f"Median |error| over these metrics: {_signed(rep['median_abs_rel_err'])}; "
        f"max: {_signed(rep['max_abs_rel_err'])}.",
        "",
        f"## Per step ({st['num_steps']} steps of the real run; prediction for each real batch)",
        "",
        "| measured as | median abs. rel. | p95 abs. rel. | median signed | total time |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for basis in ("wall", "gpu"):
        b = st[basis]
        lines.append(
            f"| {basis} | {_signed(b['median_abs_rel'])} | {_signed(b['p95_abs_rel'])} | "
            f"{_signed(b['median_rel'])} | {_signed(b['total_time_rel'])} |"
        )
    lines += ["", "| step kind (wall) | steps | share of time | median abs. rel. | median signed |",
              "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for k, b in st["wall"]["by_kind"].items():
        lines.append(
            f"| {k} | {b['steps']} | {_signed(b['time_share'])} | {_signed(b['median_abs_rel'])} | "
            f"{_signed(b['median_rel'])} |"
        )
    lines += [
        "",
        f"Host work per step (wall - GPU): median {st['host_ms']['median']:.2f} ms, "
        f"p95 {st['host_ms']['p95']:.2f} ms.",
        "",
        "Largest errors (wall):",
        "",
        "| prefill tok | prefill seqs | decode seqs | decode ctx | max ctx | predicted | GPU "
        "| wall | error |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in st["worst"]:
        lines.append(
            f"| {w['prefill_tokens']} | {w['prefill_seqs']} | {w['decode_seqs']} | "
            f"{w['decode_ctx']} | {w['max_decode_ctx']} | {1e3 * w['predicted_s']:.2f} ms | "
            f"{1e3 * w['gpu_s']:.2f} ms | {1e3 * w['wall_s']:.2f} ms | {_signed(w['rel_err'])} |"
        )
    return "\n".join(lines) + "\n"


def save_real(real: dict, path: Path) -> None:
    keep = {k: v for k, v in real.items() if k != "runner"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(keep, f, default=str)


def load_real(path: Path) -> dict:
    """A saved real run; a missing, non-gzip, non-JSON or incomplete file names itself."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "--real-json", "file not found (a real.json.gz expected)")
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ConfigError(str(path), "--real-json", f"not a gzip file ({e})") from None
    try:
        real = json.loads(decode_text(data, str(path), "real-run JSON"))
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), f"line {e.lineno}", f"not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ConfigError(str(path), "", "not readable: JSON nested too deeply") from None
    if not isinstance(real, dict):
        raise ConfigError(str(path), "<top>", "expected a JSON mapping (a saved real run)")
    for key in REAL_KEYS:
        if not isinstance(real.get(key), dict):
            raise ConfigError(str(path), key, "missing: not a real run saved by validate")
    missing = [f for f in ("wall_s", "gpu_s", *RECORD_FIELDS[:6]) if f not in real["records"]]
    if missing:
        raise ConfigError(str(path), f"records.{missing[0]}", "missing from the saved steps")
    return real


#: what every saved real run has (besides the steps' records' columns)
REAL_KEYS = ("summary", "resolved", "executor", "records")

#: resolved-config sections that decide a run's arrivals, model, policy and KV cache
FINGERPRINT_SECTIONS = ("name", "seed", "model", "hardware", "scheduler", "kv_cache", "cluster",
                        "workload", "sim")  # fmt: skip


def fingerprint(built, table: str | None) -> dict:
    """What a real run must share with the experiment it is compared with: its resolved config
    (less the latency model), the arrivals and lengths themselves, and the table modelled."""
    from simulator.results import _plain

    reqs = built.workload.requests
    rows = [(r.arrival_s, r.num_prompt_tokens, r.num_output_tokens) for r in reqs]
    digest = hashlib.sha256(json.dumps(_plain(rows)).encode()).hexdigest()[:16]
    config = {k: _plain(built.resolved.get(k)) for k in FINGERPRINT_SECTIONS}
    return {"config": config, "arrivals": {"count": len(reqs), "sha256": digest}, "table": table}


def check_fingerprint(real: dict, expected: dict, source: str) -> None:
    """Refuse a real run made for another experiment (its numbers would compare nonsense).

    Real runs saved before fingerprints existed are checked on what they hold: the resolved
    config's sections and the number of requests.
    """
    have = real.get("fingerprint") or _legacy_fingerprint(real)
    for section, value in expected["config"].items():
        theirs = _before_named_precision(section, (have.get("config") or {}).get(section, value))
        if _canon(theirs) != _canon(value):
            raise ConfigError(source, f"fingerprint.{section}", _differs(theirs, value))
    for key in ("count", "sha256"):
        theirs = (have.get("arrivals") or {}).get(key)
        if theirs is not None and theirs != expected["arrivals"][key]:
            raise ConfigError(source, f"fingerprint.arrivals.{key}",
                              _differs(theirs, expected["arrivals"][key]))  # fmt: skip
    if have.get("table") not in (None, expected["table"]):
        raise ConfigError(source, "fingerprint.table", _differs(have["table"], expected["table"]))


#: byte widths runs saved before precision was named recorded, and the name each meant
_STORED_WIDTHS = {"bytes_per_weight": ("weights", {2: "bf16", 1: "fp8"}),
                  "bytes_per_kv": ("kv_cache_dtype", {2: "bf16", 1: "fp8"})}  # fmt: skip


def _before_named_precision(section: str, value):
    """A stored run's config section as written today: runs saved before precision was named
    recorded the model's byte widths (``bytes_per_weight: 2`` is ``weights: bf16``) and GPUs
    without ``fp8_flops`` (the catalog GPU of that name gives it). Widths with no name are kept,
    so they differ from every experiment."""
    if section == "model" and isinstance(value, dict):
        value = dict(value)
        for old, (new, names) in _STORED_WIDTHS.items():
            if old in value and value[old] in names:
                value[new] = names[value.pop(old)]
    if section == "hardware" and isinstance(value, dict) and isinstance(value.get("gpu"), dict):
        if "fp8_flops" not in value["gpu"]:
            name = value["gpu"].get("name")
            gpu = GPUS.get(name)
            value = {**value, "gpu": {**value["gpu"], "fp8_flops": gpu.fp8_flops if gpu else None}}
    return value


def _legacy_fingerprint(real: dict) -> dict:
    resolved = real.get("resolved") or {}
    req = (real.get("summary") or {}).get("requests") or {}
    count = req.get("arrived")
    if count is not None:
        count += req.get("not_arrived_by_horizon") or 0
    config = {k: resolved[k] for k in FINGERPRINT_SECTIONS if k in resolved}
    return {"config": config, "arrivals": {"count": count}}


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _differs(theirs, ours) -> str:
    def short(v) -> str:
        text = _canon(v)
        return text if len(text) <= 120 else text[:117] + "..."

    return (f"the real run was made for {short(theirs)} but the experiment has {short(ours)}; "
            "pass the real run of this experiment, or run the GPU phase for it")  # fmt: skip


def write_report(rep: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(rep))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(x == "--engine" or x.startswith("--engine=") for x in argv):
        from profiles.vllm_cli import main as engine_main

        return engine_main(argv, "validate")
    args = _parser().parse_args(argv)
    try:
        return _validate(args)
    except ConfigError as e:
        print(f"servesim validate: error: {e.one_line()}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="servesim validate",
        description=__doc__.splitlines()[0],
        epilog="against vLLM: `servesim validate --engine vllm FILE.yaml [--real DIR --name "
        "PHASE]` (`--engine vllm --help` lists its options; a stored run needs no GPU)",
    )
    p.add_argument("config", help="experiment YAML (one run; sweep/seeds keys are ignored)")
    p.add_argument("--out", help="report folder (default results/validate/<name>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a key of the YAML (repeatable)")  # fmt: skip
    p.add_argument("--time-mode", choices=["wall", "gpu"], default="wall",
                   help="real step time: host wall-clock (default) or GPU events only")  # fmt: skip
    p.add_argument("--real-json", help="reuse a saved real run (real.json.gz): no GPU needed")
    p.add_argument("--real-only", action="store_true", help="run on the GPU, save, no report")
    return p


def _validate(args) -> int:
    from simulator.config import blame_overrides

    if args.real_json and args.real_only:
        raise ConfigError("--real-only", "--real-json", "the two exclude each other")
    if args.out:
        check_out_dir(args.out)
    with blame_overrides(str(args.config), args.set):
        cfg, where, base = prepare(args.config, args.set)
        name = cfg.get("name", Path(args.config).stem)
        out = check_out_dir(args.out or Path("results") / "validate" / str(name))
        if args.real_json:
            real = load_real(Path(args.real_json))
        else:
            _need_gpu()
            real = run_real(cfg, where, base, time_mode=args.time_mode)
            save_real(real, out / "real.json.gz")
        if args.real_only:
            print(f"real run saved to {out / 'real.json.gz'}")
            return 0
        sim, latency = run_sim(cfg, where, base, real, str(args.real_json or out))
    rep = build_report(str(name), sim, real, latency)
    write_report(rep, out)
    print(render_markdown(rep))
    return 0


def _need_gpu() -> None:
    """The GPU phase needs torch with CUDA; say so before any work (the report from a stored
    real run does not)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        why = "torch is not installed" if torch is None else "torch sees no CUDA GPU"
        raise ConfigError("servesim validate", "torch", f"{why}; the real (GPU) phase needs torch "
                          "with CUDA (pip install -e '.[profile]'), or pass --real-json "
                          "REAL.json.gz to report from a stored real run")  # fmt: skip
