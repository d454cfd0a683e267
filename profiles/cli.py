"""``servesim profile``: measure a table, report its held-out error, diff two tables.

Forms (argv excludes the word "profile"):

* ``--model NAME --tp K --out DIR [--budget-minutes M] [--resume] [--skip-steps]
  [--mixed-mode piecewise|eager|full]`` measures every op family and whole steps on the local
  GPU into DIR (resumable: with ``--resume`` rows already in DIR are kept and skipped; without it
  DIR must be empty or absent). ``--mixed-mode`` says how whole mixed steps run: piecewise CUDA
  graphs with eager attention (the default, as vLLM v1), eager, or one whole-step graph per
  composition; the table's meta.yaml records it and the latency model's name carries it as a
  variant (``+eager``, ``+mixed_graphs``) when it is not the default;
* ``report DIR``: error of the latency model on the whole steps it was not fitted on;
* ``diff OLD NEW [--threshold 0.1]``: per-op relative change of the median times;
* ``tables [ROOT]``: every engine table under ROOT (default ``profiles``) with its held-out
  error and whether it meets the floor (`profiles.table_index`).

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback) or no torch / CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time

import yaml

from profiles.report_fmt import pct
from profiles.torch_model import MIXED_MODES, torch_dtype_name
from simulator.argtypes import positive_float, positive_int
from simulator.errors import ConfigError
from simulator.files import check_out_dir, load_yaml_file
from simulator.latency.base import STEP_FEATURES
from simulator.precision import KV_CACHE_DTYPES, WEIGHT_FORMATS
from simulator.served import ShardedModel

#: meta.yaml's description of each mixed-step mode, and the table variant it names
MIXED_STEPS_NOTE = {
    "piecewise": "piecewise CUDA graphs per padded token count, attention eager (vLLM v1)",
    "eager": "eager",
    "full": "CUDA graph (whole step)",
}
VARIANTS = {"piecewise": None, "eager": "eager", "full": "mixed_graphs"}

# share of the budget per phase; unused time carries over to the next phase
PHASES = (
    ("gemm", 0.12),
    ("elementwise", 0.05),
    ("attn_decode", 0.15),
    ("attn_decode_padded", 0.08),
    ("attn_prefill", 0.16),
    ("allreduce", 0.04),
    ("steps", 0.40),
)


def main(argv: list[str]) -> int:
    if any(x == "--engine" or x.startswith("--engine=") for x in argv):
        from profiles.vllm_cli import main as engine_main

        return engine_main(argv, "profile")
    try:
        if argv and argv[0] == "report":
            return _report(argv[1:])
        if argv and argv[0] == "diff":
            return _diff(argv[1:])
        if argv and argv[0] == "tables":
            from profiles.table_index import main as tables_main

            return tables_main(argv[1:])
        return _profile(argv)
    except ConfigError as e:
        print(f"servesim profile: error: {e.one_line()}", file=sys.stderr)
        return 2


# ---- report / diff (no torch) ------------------------------------------------------------


def _report(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="servesim profile report",
        description="held-out error of a table's latency model (no GPU needed)",
    )
    ap.add_argument("dir", help="a table folder (meta.yaml + the op and step CSVs)")
    a = ap.parse_args(argv)
    from simulator.latency.engine_steps import EngineStepModel, is_engine_table
    from simulator.latency.profiled import load_for_report

    if is_engine_table(a.dir):
        m = EngineStepModel.as_measured(a.dir)
        meta = m.meta
        dip = m.describe()["clock_dip"]  # what the held-out decode steps were charged with
        out = {"table": m.name, "heldout": m.heldout(), "clock_dip": dip}
        if meta.get("shard"):  # judged on its own steps: the layout's collectives not in them
            out["shard"] = {**meta["shard"], "heldout": "the shard's own steps, no collectives"}
        routing = _routing_check(m, meta)
        if routing is not None:
            out["routing_check"] = routing
        for key in ("routing_skew", "routing_at_load"):  # what its routers did (skewed tables)
            if key in meta:
                out[key] = meta[key]
        print(json.dumps(out, indent=1))
        return 0
    m = load_for_report(a.dir)
    print(format_report(m))
    return 0


def format_report(m) -> str:
    d = m.describe()
    fit, ho = d["fit"], d["heldout"]
    lines = [f"{m.name}  ({m.table_dir})"]
    lines.append(
        f"  gpu {d['gpu'].get('name')}  torch {d['torch']}  attention {d['attention_backend']}"
        f"  dtype {d['dtype']}  date {d['date']}"
    )
    if fit.get("calibrated"):
        lines.append(
            f"  fit on {fit['train_steps']} steps: base {fit['base_overhead_ms']} ms, "
            f"mixed +{fit['mixed_overhead_ms']} ms, gamma {fit['gamma']}; train median "
            f"{pct(fit['train_median_abs_err'])}, p95 {pct(fit['train_p95_abs_err'])}"
        )
    if ho.get("test_steps"):
        lines.append(
            f"  held-out ({ho['test_steps']} steps never used in the fit, vs their "
            f"{ho['measured_stat'][:-3]}): median {pct(ho['median_abs_err'])}, p95 "
            f"{pct(ho['p95_abs_err'])}, max {pct(ho['max_abs_err'])}; vs their p10: "
            f"median {pct(ho['vs_measured_p10']['median_abs_err'])}, p95 "
            f"{pct(ho['vs_measured_p10']['p95_abs_err'])}"
        )
        for part in ("gpu_bound", "launch_bound"):
            sub = ho.get(part) or {}
            if sub.get("steps"):
                lines.append(
                    f"    {part.replace('_', '-')} ({sub['steps']} steps): median "
                    f"{pct(sub['median_abs_err'])}, p95 {pct(sub['p95_abs_err'])}"
                )
        for w in ho["worst"]:
            lines.append(
                f"    worst: {w['kind']:<6} prefill {w['prefill_tokens']} tok / "
                f"{w['prefill_seqs']} seq (ctx {w['mean_prefill_ctx']}), decode "
                f"{w['decode_seqs']} seq / {w['decode_ctx']} ctx: measured "
                f"{w['measured_ms']} ms, model {w['predicted_ms']} ms ({w['rel_err']:+.1%})"
            )
    else:
        lines.append("  held-out: no test steps in steps.csv")
    lines.append(f"  all-reduce: {d['allreduce']}")
    for w in d["warnings"]:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


DIFF_KEYS = {
    "gemm.csv": ("op", "tokens"),
    "elementwise.csv": ("op", "tokens"),
    "attn_decode.csv": ("batch", "total_ctx", "uneven", "causal"),
    "attn_decode_padded.csv": ("batch", "padded_to", "total_ctx", "uneven"),
    "attn_prefill.csv": ("seqs", "chunk", "context_before"),
    "allreduce.csv": ("tp", "tokens"),
    "steps.csv": STEP_FEATURES,
}


def _diff(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="servesim profile diff",
        description="per-op relative change of the median times of two tables (no GPU needed)",
    )
    ap.add_argument("old", help="the table folder to compare against")
    ap.add_argument("new", help="the new table folder")
    ap.add_argument(
        "--threshold",
        type=positive_float,
        default=0.1,
        help="flag points that moved by more than this fraction (> 0, default 0.1)",
    )
    a = ap.parse_args(argv)
    from simulator.latency.table import load_table

    old = load_table(a.old, require_steps=False)
    new = load_table(a.new, require_steps=False)
    for field in ("gpu", "torch_version", "attention_backend", "dtype", "date"):
        o, n = old.meta.get(field), new.meta.get(field)
        if isinstance(o, dict):
            o, n = o.get("name"), (n or {}).get("name")
        if o != n:
            print(f"meta {field}: {o} -> {n}")
    flagged = 0
    for name, keys in DIFF_KEYS.items():
        ro = {_key(r, keys): r for r in old.rows.get(name, [])}
        rn = {_key(r, keys): r for r in new.rows.get(name, [])}
        common = sorted(set(ro) & set(rn), key=str)
        if not common:
            continue
        groups: dict[str, list[float]] = {}
        moves = []
        for k in common:
            a_, b_ = ro[k]["median_us"], rn[k]["median_us"]
            if a_ <= 0:
                continue
            ch = b_ / a_ - 1.0
            g = str(k[0]) if name in ("gemm.csv", "elementwise.csv") else name[:-4]
            groups.setdefault(g, []).append(ch)
            if abs(ch) > a.threshold:
                moves.append((k, a_, b_, ch))
        for g, chs in groups.items():
            chs.sort()
            med = chs[len(chs) // 2]
            print(
                f"{name:<17} {g:<13} {len(chs):4d} points  median change {med:+.1%}  "
                f"range {chs[0]:+.1%} .. {chs[-1]:+.1%}"
            )
        for k, a_, b_, ch in sorted(moves, key=lambda m: -abs(m[3]))[:10]:
            where = dict(zip(keys, k, strict=True))
            print(f"  FLAG {name} {where}: {a_:.1f} -> {b_:.1f} us ({ch:+.1%})")
        flagged += len(moves)
        only_o, only_n = len(set(ro) - set(rn)), len(set(rn) - set(ro))
        if only_o or only_n:
            print(f"  {name}: {only_o} points only in OLD, {only_n} only in NEW")
    print(f"{flagged} points moved by more than {a.threshold:.0%}")
    return 0


def _key(r: dict, keys) -> tuple:
    out = []
    for k in keys:
        v = r[k]
        out.append(int(v) if isinstance(v, float) and v.is_integer() else v)
    return tuple(out)


# ---- profiling (torch imported lazily) -----------------------------------------------------


def _routing_check(m, meta: dict) -> dict | None:
    """For a mixture-of-experts engine table: its decode steps against the bound of the
    routing it was recorded with (`simulator.latency.routing_check`), on the GPU and precision
    it measured."""
    from simulator.hardware import load_gpu
    from simulator.latency.routing_check import routing_bound, routing_check

    spec = _resolve_model(meta["model"]["name"])
    if spec.moe is None:
        return None
    prec = meta.get("precision") or {}
    spec = dataclasses.replace(spec, **{k: prec[k] for k in ("weights", "kv_cache_dtype")
                                        if k in prec})  # fmt: skip
    gpu = load_gpu(meta["gpu"]["key"], "meta.yaml", "gpu.key")
    tp = int(meta["tp"])
    skew = float(meta.get("routing_skew") or 0.0)
    return routing_check(m.rows, routing_bound(spec, gpu, tp, skew=skew))


def _resolve_model(name: str):
    from simulator.models import load_model

    return load_model(name, "<cli>", "--model")


def gpu_key(name: str) -> str:
    low = name.lower()
    for k in ("h200", "h100", "a100", "l40s", "b200", "gh200"):
        if k in low:
            return k
    return "".join(ch if ch.isalnum() else "-" for ch in low).strip("-")


def _smi(query: str) -> str | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _git_commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _profile(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="servesim profile",
        description="measure a latency table of servesim's torch forward on the local GPU "
        "(needs torch + CUDA)",
        epilog="other forms: `servesim profile --engine vllm --model M --out DIR [--rebuild]` "
        "(whole engine steps through vLLM, the tables `latency: auto` prefers for the vllm "
        "policy; `--engine vllm --help` lists its options; --rebuild needs no GPU), "
        "`servesim profile report DIR` (held-out error of a table), "
        "`servesim profile diff OLD NEW [--threshold 0.1]` (compare two tables) and "
        "`servesim profile tables [ROOT]` (every engine table's held-out error and floor); "
        "the last three need no GPU",
    )
    ap.add_argument("--model", required=True, help="catalog model name (e.g. llama-3-8b)")
    ap.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (>= 1)")
    ap.add_argument("--out", required=True, help="table folder to write (empty, or --resume)")
    ap.add_argument("--budget-minutes", type=positive_float, default=5.0,
                    help="time budget of the whole profile (> 0, default 5)")  # fmt: skip
    ap.add_argument("--resume", action="store_true", help="keep rows already in --out")
    ap.add_argument("--skip-steps", action="store_true", help="op tables only")
    ap.add_argument(
        "--redo-steps",
        action="store_true",
        help="with --resume: keep the op tables, re-time every whole step (e.g. in another "
        "--mixed-mode); the steps' recorded profiling time is replaced, not added to",
    )
    ap.add_argument(
        "--mixed-mode",
        choices=MIXED_MODES,
        default="piecewise",
        help="how mixed steps run: piecewise CUDA graphs with eager attention (vLLM v1's "
        "default), eager, or one whole-step graph per composition (full)",
    )
    ap.add_argument("--max-tokens", type=positive_int, default=16384,
                    help="largest token count profiled (default 16384)")  # fmt: skip
    ap.add_argument("--weights", default="bf16", choices=list(WEIGHT_FORMATS),
                    help="torch: bf16 or fp8 (W8A8); int4 via --engine vllm")  # fmt: skip
    ap.add_argument("--kv-cache-dtype", default="bf16", choices=list(KV_CACHE_DTYPES),
                    help="KV cache dtype (torch runs bf16; fp8 through vLLM only)")  # fmt: skip
    a = ap.parse_args(argv)
    spec = dataclasses.replace(
        _resolve_model(a.model), weights=a.weights, kv_cache_dtype=a.kv_cache_dtype
    )
    _check_torch_precision(ShardedModel(spec, a.tp))
    if os.path.isdir(a.out) and os.listdir(a.out) and not a.resume:
        raise ConfigError(a.out, "--out", "directory is not empty (use --resume to continue)")
    if a.redo_steps and (a.skip_steps or not a.resume):
        raise ConfigError("<cli>", "--redo-steps", "needs --resume and no --skip-steps")
    check_out_dir(a.out)
    try:
        import torch
    except ImportError:
        print(
            "servesim profile: torch is not installed (pip install servesim[profile])",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("servesim profile: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    return run_profile(
        spec,
        a.tp,
        a.out,
        a.budget_minutes * 60,
        a.skip_steps,
        a.max_tokens,
        a.mixed_mode,
        redo_steps=a.redo_steps,
    )


def _check_torch_precision(sh: ShardedModel) -> None:
    """Refuse, before any work, a precision the torch profiler has no kernels for."""
    try:
        torch_dtype_name(sh)
    except ValueError as e:
        raise ConfigError("<cli>", "--weights / --kv-cache-dtype", str(e)) from None


def run_profile(
    spec,
    tp: int,
    out: str,
    budget_s: float,
    skip_steps: bool,
    max_tokens: int = 16384,
    mixed_mode: str = "piecewise",
    redo_steps: bool = False,
) -> int:
    """Op tables, all-reduce (tp > 1), whole steps and meta.yaml, each phase by its share of
    ``budget_s`` (`PHASES`); resumable (rows already in ``out`` are kept)."""
    sh = ShardedModel(spec, tp)
    _check_torch_precision(sh)
    import torch

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    times: dict[str, float] = {}
    counts: dict[str, int] = {}
    prev = _read_prev_meta(out)
    replaced = set()
    if redo_steps:
        steps_csv = os.path.join(out, "steps.csv")
        if os.path.exists(steps_csv):
            os.remove(steps_csv)
        replaced.add("steps")
    acc = 0.0
    deadlines = {}
    for name, frac in PHASES:
        acc += frac
        deadlines[name] = t0 + acc * budget_s
    from profiles import measure as M

    grid = M.token_grid(max_tokens)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        _profile_ops(out, sh, deadlines, grid, counts, times)
    ar_note = _profile_allreduce(out, sh, tp, grid, max_tokens, prev, counts, times)
    runner_info = {}
    if not skip_steps:
        runner_info = _profile_whole_steps(
            spec, tp, out, max_tokens, mixed_mode, deadlines["steps"], counts, times
        )
    total = round(time.time() - t0, 1)
    run = {
        "allreduce": ar_note,
        "allreduce_estimate": {"bus_gbps": 300.0, "latency_us": 12.0},
        "step_runner": runner_info or prev.get("step_runner", {}),
    }
    meta = _torch_table_meta(spec, sh, tp, mixed_mode, grid, max_tokens, run)
    meta["points_measured_this_run"] = counts
    meta["time_taken_s"] = _merge_times(prev, times, total, replaced)
    with open(os.path.join(out, "meta.yaml"), "w") as f:
        yaml.safe_dump(meta, f, sort_keys=False)
    print(
        f"profiled {spec.name} tp{tp} on {meta['gpu']['name']} in {total:.0f}s: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
    )
    if not skip_steps and os.path.exists(os.path.join(out, "steps.csv")):
        try:
            from simulator.latency.profiled import load_for_report

            print(format_report(load_for_report(out)))
        except ConfigError as e:
            print(f"report failed: {e.one_line()}")
    return 0


def _profile_ops(out: str, sh, deadlines: dict, grid: list[int], counts: dict, times: dict):
    """The op tables: GEMMs, elementwise ops, decode / padded decode / prefill attention."""
    import torch

    from profiles import measure as M

    for name in ("gemm", "elementwise", "attn_decode", "attn_decode_padded", "attn_prefill"):
        ts = time.time()
        if name == "gemm":
            counts[name] = M.profile_gemm(out, sh, deadlines[name], grid)
        elif name == "elementwise":
            counts[name] = M.profile_elementwise(out, sh, deadlines[name], grid)
        else:
            free = torch.cuda.mem_get_info()[0]
            pool_tokens = min(2**22, int(free * 0.5) // sh.op("attention").kv_bytes_per_key)
            bench = M.AttnBench(sh, pool_tokens)
            fn = getattr(M, f"profile_{name}")
            counts[name] = fn(out, sh, deadlines[name], bench)
            del bench
            torch.cuda.empty_cache()
        times[name] = round(time.time() - ts, 1)


def _profile_allreduce(out, sh, tp, grid, max_tokens, prev, counts, times) -> str:
    """All-reduce with NCCL when ``tp`` GPUs are visible; returns what meta.yaml says of it (a
    resumed run on fewer GPUs keeps the earlier measurement)."""
    if tp == 1:
        return "not measured"
    import torch

    from profiles import measure as M

    ts = time.time()
    n = torch.cuda.device_count()
    if n >= tp:
        ar_grid = [t for t in grid if t <= max_tokens]
        counts["allreduce"] = M.profile_allreduce(out, sh, tp, ar_grid)
        note = f"measured with NCCL on {tp} GPUs (NCCL_NVLS_ENABLE=0)"
    elif str(prev.get("allreduce", "")).startswith("measured"):
        note = prev["allreduce"]
    else:
        note = f"not measured: {n} GPU(s) visible, tp={tp} needs {tp}"
    times["allreduce"] = round(time.time() - ts, 1)
    return note


def _profile_whole_steps(spec, tp, out, max_tokens, mixed_mode, deadline, counts, times) -> dict:
    """Whole steps on a `StepRunner`; returns the runner's facts for meta.yaml."""
    import torch

    from profiles import measure as M
    from profiles.torch_model import StepRunner

    ts = time.time()
    runner = StepRunner(
        spec,
        tp=tp,
        max_seqs=512,
        max_tokens=max_tokens,
        max_model_len=max(getattr(spec, "max_model_len", 8192), 65536),
        mixed_mode=mixed_mode,
    )
    info = {
        "kv_layout": runner.kv_layout,
        "shared_weights": runner.shared_weights,
        "kv_capacity_tokens": runner.capacity_tokens,
        "block_size": runner.block_size,
        "mixed_steps": MIXED_STEPS_NOTE[mixed_mode],
        "mixed_mode": mixed_mode,
        **(
            {
                "piecewise_sizes": list(runner.piecewise.sizes),
                "piecewise_capture_s": round(runner.piecewise.capture_s, 1),
            }
            if runner.piecewise
            else {}
        ),
        "weight_gib": round(runner.weight_bytes / 2**30, 2),
    }
    counts["steps"] = M.profile_steps(out, runner, deadline)
    runner.close()
    del runner
    torch.cuda.empty_cache()
    times["steps"] = round(time.time() - ts, 1)
    return info


def _torch_table_meta(spec, sh, tp: int, mixed_mode: str, grid, max_tokens: int, run: dict):
    """What a torch-profiled table measured: GPU, model and its per-GPU shapes, precision, op
    fingerprint, software, attention backend, ``run`` (all-reduce and step-runner facts of this
    run) and the grids, in the order meta.yaml has always listed them."""
    import torch

    from profiles.torch_model import varlen_features

    props = torch.cuda.get_device_properties(0)
    feat = varlen_features()
    return {
        "schema_version": 1,
        **({"variant": VARIANTS[mixed_mode]} if VARIANTS.get(mixed_mode) else {}),
        "gpu": {
            "key": gpu_key(props.name),
            "name": str(props.name),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "sm_count": props.multi_processor_count,
            "driver": _smi("driver_version"),
            "clocks_mhz": _smi("clocks.sm,clocks.max.sm,clocks.mem"),
            "count_visible": torch.cuda.device_count(),
        },
        "model": {
            "name": spec.name,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "intermediate_size": spec.intermediate_size,
            "vocab_size": spec.vocab_size,
        },
        "tp": tp,
        "per_gpu_shapes": {
            "heads": sh.heads,
            "kv_heads": sh.kv_heads,
            "intermediate": sh.inter,
            "vocab": sh.vocab,
        },
        "dtype": torch_dtype_name(sh),
        "precision": {"weights": spec.weights, "kv_cache_dtype": spec.kv_cache_dtype},
        "op_fingerprint": sh.op_fingerprint,
        "torch_version": str(torch.__version__),
        "cuda_version": str(torch.version.cuda),
        "attention_backend": "flash (torch.nn.attention.varlen.varlen_attn)",
        "varlen_signature": feat["signature"],
        "attention_kv_layout": "paged (block_table, block 16)" if feat["paged"] else "contiguous",
        "decode_attention": "query length 1, causal flag OFF (see attn_decode.csv causal=1 rows)",
        **run,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": _git_commit(),
        "grid": {
            "gemm_tokens": f"{len(grid)} points in 1..{max_tokens} (powers of 2, 1.5x, multiples)",
            "attn_decode": "batch 1..512 x total context 512..2097152 (lognormal and equal "
            "contexts, batch>=2)",
            "attn_decode_padded": "every padded decode-graph batch to 64, then steps of 1/32 of "
            "the capture size, x mean context 128..32768 (total <= 2M), at both spreads",
            "attn_prefill": "seqs {1,2,4,8,16} x chunk 16..16384 (powers of 2 and 1.5x) "
            "x context_before 0..32768",
            "steps": f"decode-only (CUDA graphs) and mixed prefill+decode ({mixed_mode}): a "
            "hand-picked grid plus seeded random compositions (decodes at the lognormal spread), "
            "plus compositions with near-equal decode contexts; interleaved rounds; 1/3 held out",
        },
    }


def _read_prev_meta(out: str) -> dict:
    """The meta.yaml an earlier (resumed) run left, or {} when there is none or it is unreadable
    (it only carries accumulated timings; the new meta.yaml replaces it)."""
    p = os.path.join(out, "meta.yaml")
    if not os.path.exists(p):
        return {}
    try:
        meta = load_yaml_file(p, "table metadata")
    except ConfigError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _merge_times(prev: dict, times: dict, total: float, replaced: set = frozenset()) -> dict:
    """Accumulate time over resumed runs so the table records its whole profiling cost; the
    phases in ``replaced`` were measured afresh (``--redo-steps``): their earlier time leaves
    the total and this run's takes its place."""
    old = dict((prev.get("time_taken_s") or {}) if isinstance(prev, dict) else {})
    for k in replaced:
        old["total"] = (old.get("total") or 0) - (old.pop(k, 0) or 0)
    out = {}
    for k in set(old) | set(times) | {"total"}:
        v = (old.get(k) or 0) + (total if k == "total" else times.get(k, 0))
        out[k] = round(v, 1)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
