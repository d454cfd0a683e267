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
ran outside any scenario window (none, normally) are dropped and counted in ``meta.yaml``. For a
model with sliding layers the attention features count the keys actually read, as the simulator
charges them; a step whose decode contexts could not be rebuilt exactly is left out and counted
(``window_contexts_unresolved``).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import yaml

from profiles.diag_launch import launches_by_process
from profiles.gpu_energy import energy_between, read_energy
from profiles.vllm_contexts import decode_contexts
from profiles.vllm_run import read_partial
from profiles.vllm_steps import engine_processes, read_steps, record_key
from simulator.energy import ENERGY_COLUMNS, EXPERT_TERM, ExpertReads
from simulator.errors import ConfigError
from simulator.hardware import load_gpu
from simulator.latency.base import chunk_attn_pairs
from simulator.latency.engine_steps import STEP_COLUMNS
from simulator.models import ModelSpec
from simulator.precision import Precision
from simulator.served import ShardedModel, expected_experts_touched, routing_imbalance


def step_rows(steps: list[dict], reads=None, contexts: list | None = None) -> list[dict]:
    """Latency features and measured duration (µs) of each recorded step, in completion order.

    ``after_idle`` is 1 when the step was planned after the previous one had completed (the
    engine was idle, so nothing of its host work overlapped a running step).

    ``prefill_behind`` marks a step with prompt tokens planned while another step ran. Its
    launch is host work on the engine loop (inductor graphs run kernel by kernel above the
    largest CUDA-graph size, attention metadata, input copies: 7-47 ms measured, by GPU machine
    more than by model), done before the loop takes the running step's outputs, so a running
    step shorter than the launch is stamped late (a 4-sequence decode stamped 31 ms after its
    plan, the 1024-token prefill behind it 3 ms later). That holds behind a short prefill step
    too (serving: a 1,000-token prefill followed by the next arrival's). Whether the launch
    really showed is the model's call (`simulator.latency.engine_steps`): a long step hides it.

    ``reads`` (`simulator.served.WindowedReads`, a model with sliding layers): the attention
    features count the keys actually read, as the simulator charges them; a decode past the
    window needs the step's decode contexts (``contexts``, per step, `profiles.vllm_contexts`),
    and a step whose contexts are unknown gets ``decode_ctx`` None (left out of a table).

    ``proc`` is the engine process that ran the step (`profiles.vllm_steps.engine_processes`):
    a table's launch times are put on one scale across processes
    (`simulator.latency.engine_steps.launches_across_processes`)."""
    rows, prev = [], None
    procs = engine_processes(steps)
    for k, s in enumerate(steps):
        idle = prev is None or s["t_sched"] >= prev
        start = s["t_sched"] if idle else prev
        prev = s["t_done"]
        pf = s["pf"]
        rows.append(
            {
                "prefill_tokens": sum(n for _, n, _ in pf),
                "prefill_attn": round(_prefill_pairs(pf, reads), 1),
                "prefill_seqs": len(pf),
                "decode_seqs": s["nd"],
                "decode_ctx": _decode_reads(s, reads, contexts[k] if contexts else None),
                "decode_max": s["dmax"],
                "after_idle": int(idle),
                "dur_us": round((s["t_done"] - start) * 1e6, 1),
                "proc": procs[k],
                "t_sched": s["t_sched"],
                "t_done": s["t_done"],
            }
        )
    for r in rows:
        r["prefill_behind"] = int(r["prefill_tokens"] > 0 and not r["after_idle"])
    return rows


def _prefill_pairs(pf: list, reads) -> float:
    """(query, key) pairs of a step's prompt chunks (``[rid, n, before]``), per layer."""
    if reads is None:
        return sum(chunk_attn_pairs(n, b) for _, n, b in pf)
    return sum(reads.prefill_pairs(b, n) for _, n, b in pf)


def _decode_reads(s: dict, reads, ctxs: list | None):
    """Keys a step's decodes read per layer: the context sum, or with sliding layers the sum
    less what the window cuts (None when that needs contexts the rebuild did not give)."""
    if reads is None or s["dmax"] <= reads.window:
        return s["dctx"]
    if ctxs is None:
        return None
    excess = sum(c - reads.window for c in ctxs if c > reads.window)
    return round(reads.decode(s["dctx"], excess), 1)


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


def flag_early_stamps(rows: list[dict], served, gpu) -> int:
    """Tag ``burst = 4`` on a step whose interval is shorter than the GPU can physically run it
    (its FLOPs per GPU at the datasheet's dense peak for its GEMM dtype, or one GPU's share of
    the weight and KV bytes at the datasheet's HBM bandwidth), and on the step before it;
    returns how many were tagged.

    Why: the engine core stamps a step when it processes that step's output. Seen on H200: in
    a run of 8k-token prefill steps (~190 ms each), one step stamped 387 ms after the previous
    and the next 29 ms after it: the first stamp came ~180 ms late (the engine loop was held),
    so neither interval is a step time, while their sum is two. Both are left out of the fit and
    of the held-out report, and counted in ``meta.yaml``."""
    peak = gpu.fp8_flops if served.weight_format.gemm_dtype == "fp8" else gpu.bf16_flops
    tagged = 0
    for prev, r in zip([None, *rows], rows, strict=False):
        tokens = r["prefill_tokens"] + r["decode_seqs"]
        flops = served.step_flops(tokens, r["decode_ctx"] + r["prefill_attn"])
        # the group's bytes split over its GPUs (a lower bound on any one GPU's share, also
        # where KV heads are replicated): a TP2 70B decode reads 70 GB per GPU, not 140
        nbytes = served.step_min_bytes(1, r["decode_ctx"] + tokens) / served.tp
        if r["dur_us"] / 1e6 < max(flops / peak, nbytes / gpu.hbm_bandwidth):
            for x in (prev, r):
                if x is not None and x.get("burst") != 4:
                    x["burst"] = 4
                    tagged += 1
    return tagged


#: a stamp shift (`flag_shifted_stamps`): the long end at least this much above its like
#: neighbour's interval, the short end this much below, their offsets cancelling to this share
SHIFT_MIN = 0.25
SHIFT_CANCEL = 0.10
#: the most steps a shift spans (a 3-step one seen, `flag_shifted_stamps`)
SHIFT_MAX_LAG = 3
#: like compositions (`_like_steps`): prompt tokens, decode sequences and decode context within
#: this share of each other
LIKE_TOL = 0.10


def flag_shifted_stamps(rows: list[dict]) -> int:
    """Tag ``burst = 4`` on both ends of a stamp shift; returns how many steps were tagged.

    A stamp shift: step ``i``'s interval is ``d`` longer than that of a step of like composition
    next to it (its reference) and step ``i + lag`` (``lag`` 1 to `SHIFT_MAX_LAG`) is ``d``
    shorter, so that the two intervals sum to twice the reference's (to `SHIFT_CANCEL` of it),
    with ``d`` at least `SHIFT_MIN` of it. Why: the engine loop stamps a step when it takes the
    step's output; held for ``d`` (host work, a collection), it stamps step ``i`` late and the
    steps behind it late too, until a stamp catches up. Seen on H200 in runs of 8k-token prefill
    steps: Llama-3-70B fp8 stamped 850, 1,671, 859, 39, 860 ms (``lag`` 2: the middle interval
    has both ends late, so it is right), its int4 twin 1,785, 3,544, 1,798, 1,799, 54 ms
    (``lag`` 3) and DeepSeek-V3's shard 276, 398, 276, 142 ms. The GPU never idled (the sum over
    the shift is the steps' time), so neither end's interval is its step's time;
    `flag_early_stamps` catches the short end only where it is below the GPU's physical floor
    (the 39 ms, not the 142). Like: same scenario, no step after an idle gap, all with prompt
    tokens (within `LIKE_TOL`) or all decode-only (decode sequences and context within it). For
    ``lag`` > 1 every step between the ends is like them and within `SHIFT_CANCEL` of the first
    of them, the reference; for ``lag`` 1 the reference is the step before or after the pair.
    A step already left out (``burst``, a submission burst's or a shift's) is neither an end
    nor a reference. Runs before `flag_early_stamps`, which then also tags the step before a
    short end."""
    tagged = 0
    n = len(rows)
    for i in range(n):
        for lag in range(1, SHIFT_MAX_LAG + 1):
            j = i + lag
            if j >= n or rows[i]["burst"] or rows[j]["burst"]:
                continue
            ref = _shift_reference(rows, i, j)
            if ref is not None and _shifted(rows[i]["dur_us"], ref["dur_us"], rows[j]["dur_us"]):
                rows[i]["burst"] = rows[j]["burst"] = 4
                tagged += 2
                break
    return tagged


def _shift_reference(rows: list[dict], i: int, j: int) -> dict | None:
    """The reference step of a possible shift from step ``i`` to step ``j`` (see
    `flag_shifted_stamps`), or None when there is none."""
    if j - i == 1:
        refs = [k for k in (i - 1, i + 2) if 0 <= k < len(rows)]
        return next((rows[k] for k in refs if _like_steps(rows, i, j, k)), None)
    between = range(i + 1, j)
    if not _like_steps(rows, i, j, *between):
        return None
    ref = rows[i + 1]["dur_us"]
    if any(abs(rows[k]["dur_us"] - ref) > SHIFT_CANCEL * ref for k in between):
        return None
    return rows[i + 1]


def _shifted(long_us: float, ref_us: float, short_us: float) -> bool:
    """Whether ``long_us`` and ``short_us`` are ``ref_us`` plus and minus one delay (see
    `flag_shifted_stamps`)."""
    return (
        ref_us > 0
        and long_us >= (1 + SHIFT_MIN) * ref_us
        and short_us <= (1 - SHIFT_MIN) * ref_us
        and abs(long_us + short_us - 2 * ref_us) <= SHIFT_CANCEL * ref_us
    )


def _like_steps(rows: list[dict], *idx: int) -> bool:
    """Whether the steps at ``idx`` ran in one scenario, none after an idle gap, with like
    compositions (`flag_shifted_stamps`)."""
    sel = [rows[k] for k in idx]
    if len({r["scenario"] for r in sel}) > 1 or any(r["after_idle"] or r["burst"] for r in sel):
        return False
    if len({r["prefill_tokens"] > 0 for r in sel}) > 1:
        return False
    keys = ("prefill_tokens",) if sel[0]["prefill_tokens"] else ("decode_seqs", "decode_ctx")
    for key in keys:
        vals = [r[key] for r in sel]
        if max(vals) - min(vals) > LIKE_TOL * max(vals):
            return False
    return True


#: a repeat's step and the base pass's step are one composition when their decode context and
#: prefill attention sums differ by at most this fraction (one decode token per sequence moves
#: a 128-token batch's context by 0.8%; prefill chunks start where the submission burst ended)
REPEAT_MATCH_TOL = 0.01


def group_repeats(rows: list[dict], scenarios: list[dict]) -> int:
    """Give every row a ``group``: the index (in ``rows``) of the base pass's step of the same
    composition when the row ran in a repeat scenario (`profiles.vllm_grid.repeated`), else its
    own index; returns how many repeat steps joined a base step.

    Same composition: the repeat's scenario repeats the base step's, with the same prefill
    tokens and sequences, decode sequences, idle start and launch position, and decode context
    and prefill attention within ``REPEAT_MATCH_TOL``; each base step takes at most one step of
    each pass, the nearest. Steps left out of the fit (``burst``) neither lead nor join a group.
    Why not by position: a batch's first chunks depend on how fast its submission burst
    arrived, which moves every later context of the same scenario a little."""
    base_of = {s["id"]: s.get("repeat_of") for s in scenarios}
    heads: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        r["group"] = i
        if not base_of.get(r["scenario"]) and not r["burst"]:
            heads.setdefault((r["scenario"], *_composition(r)), []).append(i)
    taken: set[tuple[int, str]] = set()
    joined = 0
    for r in rows:
        base = base_of.get(r["scenario"])
        if not base or r["burst"]:
            continue
        near = [
            (_distance(rows[h], r), h)
            for h in heads.get((base, *_composition(r)), ())
            if (h, r["scenario"]) not in taken
        ]
        dist, h = min(near, default=(math.inf, -1))
        if dist <= REPEAT_MATCH_TOL:
            taken.add((h, r["scenario"]))
            r["group"] = h
            joined += 1
    return joined


def _composition(r: dict) -> tuple:
    return (
        r["prefill_tokens"], r["prefill_seqs"], r["decode_seqs"], r["after_idle"],
        r["prefill_behind"],
    )  # fmt: skip


def _distance(a: dict, b: dict) -> float:
    """The larger relative difference of two steps' decode context and prefill attention."""
    return max(
        abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), 1.0) for k in ("decode_ctx", "prefill_attn")
    )


def frontend_delays(phase: dict, steps: list[dict]) -> dict:
    """The serving path outside the engine loop.

    * input: a request submitted at ``t`` is first seen by the plan at or after ``t + input_s``
      (the frontend's input processing and the hop into the engine core). Measured on the
      prompts injected into a running engine (``inj`` requests), where every plan is a chance
      to see them: each bounds ``input_s`` between two step completions, on the clock the
      simulator plans by (`_input_bounds`), and ``input_s`` is the middle of the range that
      the fewest bounds contradict (`_busy_input_s`). An idle engine's first plan comes later
      (its loop wakes from a blocking wait): ``idle_plan_s`` is the single-request prefill
      scenarios' median submit-to-plan time less ``input_s``, charged to a step planned on an
      idle engine (`StepPlan.after_idle`).
      A per-prompt-token term (``input_s_per_token``, which `Frontend` can charge) is not
      resolved by these bounds (a plan every 5-40 ms): it is written as 0.
    * output: client receipt of the first token less the completion of its step, median over
      the single-request prefill scenarios."""
    outs, idle = [], []
    for sc in phase["scenarios"]:
        rec = phase["requests"].get(sc["id"] + "/0")
        if not sc["id"].startswith("prefill_p") or rec is None:
            continue
        first = [s for s in steps if sc["t0"] <= s["t_sched"] <= sc["t1"] and s["pf"]]
        if first and rec["times"]:
            outs.append(rec["times"][0][0] - first[0]["t_done"])
            idle.append(first[0]["t_sched"] - rec["t_submit"])
    bounds = _input_bounds(phase["requests"], steps)
    if len(outs) < 3 or len(bounds) < 10:
        return {}
    input_s, outside = _busy_input_s(bounds)
    return {
        "input_s": round(input_s, 6),
        "input_s_per_token": 0.0,
        "idle_plan_s": round(max(float(np.median(idle)) - input_s, 0.0), 6),
        "output_s": round(float(np.median(outs)), 6),
        "requests": len(bounds),
        "input_bounds_contradicted": outside,
    }


def _input_bounds(requests: dict, steps: list[dict]) -> list[tuple[float, float]]:
    """(lower, upper) bound on the input delay of each injected request first planned while
    the engine ran another step, on the clock the simulator plans by: a plan made while step
    ``i - 1`` runs sees what arrived by the completion of step ``i - 2`` (`policies.vllm`,
    rule 6), so the request arrived after step ``i - 3`` completed and by step ``i - 2``'s
    completion, less its submission. Engine request ids carry a ``-<hex>`` suffix (vLLM's)."""
    first: dict[str, int] = {}
    for i, s in enumerate(steps):
        for rid, _, _ in s["pf"]:
            first.setdefault(record_key(rid), i)
    out = []
    for rid, rec in requests.items():
        i = first.get(rid, 0)
        if "/inj" not in rid or i < 3 or steps[i]["t_sched"] >= steps[i - 1]["t_done"]:
            continue
        t = rec["t_submit"]
        out.append((steps[i - 3]["t_done"] - t, steps[i - 2]["t_done"] - t))
    return out


def _busy_input_s(bounds: list[tuple[float, float]]) -> tuple[float, int]:
    """The middle of the delay range that the fewest bounds contradict (a lower bound at or
    above it, an upper bound below it), and how many do."""
    cands = sorted({max(lo, 0.0) for lo, _ in bounds} | {hi for _, hi in bounds if hi > 0})

    mids = [(a + b) / 2 for a, b in zip(cands, cands[1:], strict=False)] or cands
    bad = [sum(lo >= d or hi < d for lo, hi in bounds) for d in mids]
    best = min(bad)
    good = [d for d, n in zip(mids, bad, strict=True) if n == best]
    return (min(good) + max(good)) / 2, best


def scenario_energy(
    phase: dict, rows: list[dict], record: dict, experts: ExpertReads | None = None
) -> list[dict]:
    """Per profiling scenario: the GPUs' energy over its window and the sums of its steps'
    features (what `simulator.energy` fits joules on; with ``experts``, a mixture of experts'
    expert reads too, counted as a run's steps are). Scenarios the readings do not cover are
    left out. Every step of the window counts here, burst steps too: they drew power."""
    by_sc: dict[str, list[dict]] = {}
    for r in rows:
        by_sc.setdefault(r["scenario"], []).append(r)
    out = []
    for sc in phase["scenarios"]:
        joules = energy_between(record, sc["t0"], sc["t1"])
        rs = by_sc.get(sc["id"], [])
        if joules is None or not rs:
            continue
        out.append(
            {
                "scenario": sc["id"],
                "split": sc["split"],
                "window_s": round(sc["t1"] - sc["t0"], 6),
                "joules": round(joules, 3),
                "busy_s": round(sum(r["dur_us"] for r in rs) / 1e6, 6),
                "steps": len(rs),
                "tokens": sum(r["prefill_tokens"] + r["decode_seqs"] for r in rs),
                "decode_ctx": sum(r["decode_ctx"] for r in rs),
                "prefill_attn": round(sum(r["prefill_attn"] for r in rs), 1),
            }
        )
        if experts is not None:
            tokens = np.array([r["prefill_tokens"] + r["decode_seqs"] for r in rs])
            out[-1][EXPERT_TERM] = round(float(experts.per_step(tokens).sum()), 3)
    return out


def _expert_reads(spec: ModelSpec) -> ExpertReads | None:
    """How the table's expert reads are counted: its model's router, at the skew it was
    recorded with (None for a dense model)."""
    moe = spec.moe
    return None if moe is None else ExpertReads(moe.num_experts, moe.top_k, moe.routing_skew)


def _write_energy(
    run_dir: Path, out_dir: Path, phase: dict, rows: list[dict], spec: ModelSpec
) -> dict | None:
    """``energy.csv`` and the meta's ``energy`` section, or None (and no file) without readings."""
    record = read_energy(run_dir)
    if record is None:
        return None
    idle = record.get("idle_window")
    idle_j = energy_between(record, *idle) if idle else None
    experts = _expert_reads(spec)
    per_sc = scenario_energy(phase, rows, record, experts)
    if idle_j is None or not per_sc:
        return None
    with open(out_dir / "energy.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ENERGY_COLUMNS + ((EXPERT_TERM,) if experts else ()))
        w.writeheader()
        w.writerows(per_sc)
    return {
        "source": f"{record['source']}, sampled every {record['period_s']} s",
        "idle_w": round(idle_j / (idle[1] - idle[0]), 2),
        "gpus": len(record["mj"][0]) if record["mj"] else 0,
        "counter_refresh_s": 0.1,
        "scenarios": len(per_sc),
        # how energy.csv's expert_reads column is counted (`simulator.energy.ExpertReads`)
        **({"experts": experts.describe()} if experts else {}),
    }


def _kernels(run_dir: Path) -> dict:
    """The kernels vLLM's log says it selected: linear layers (by quantization method), the
    attention backend, the fused-MoE backend and, at TP > 1, the all-reduce backends in
    dispatch order (on a host with NVLink multicast off vLLM drops its symmetric-memory
    all-reduce and says so). A method whose choice the log does not print is absent."""
    log = run_dir / "log.txt"
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = {m.group(2): m.group(1) for m in _LINEAR_KERNEL.finditer(text)}
    backend = _ATTENTION_BACKEND.search(text)
    if backend:
        found["attention"] = backend.group(1)
    moe = _MOE_BACKEND.search(text)
    if moe:
        found["moe"] = moe.group(1)
    allreduce = _ALLREDUCE_BACKENDS.search(text)
    if allreduce:
        found["all_reduce"] = allreduce.group(1).replace("'", "").replace(" ", "")
    return found


#: "Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod" (or "Using ... for ...")
_LINEAR_KERNEL = re.compile(r"(?:Selected|Using) (\w+Kernel) for (\w+)")
#: "Using FLASH_ATTN attention backend out of potential backends: [...]"
_ATTENTION_BACKEND = re.compile(r"Using (\w+) attention backend")
#: "Using TRITON Fp8 MoE backend out of potential backends: [...]" (or "Unquantized MoE")
_MOE_BACKEND = re.compile(r"Using (\w+) \w+ MoE backend")
#: "Using ['CUSTOM', 'PYNCCL'] all-reduce backends (in dispatch order) for group 'tp:0' ..."
_ALLREDUCE_BACKENDS = re.compile(r"Using \[([^\]]*)\] all-reduce backends")


#: "Model loading took 14.96 GiB and 1.98 seconds"
_WEIGHTS_LOADED = re.compile(r"Model loading took ([0-9.]+) GiB")


def check_weights_loaded(run_dir: Path, spec: ModelSpec, tp: int) -> float | None:
    """The GiB of weights the engine loaded per GPU (its log), checked against the served model's
    description: a run that loaded another precision's bytes is refused. Why: a quantization
    config vLLM reads but does not apply leaves the bf16 model in place without an error (seen:
    a GPTQ config without ``modules_in_block_to_quantize``). None when the log does not say."""
    log = run_dir / "log.txt"
    m = _WEIGHTS_LOADED.search(log.read_text(errors="replace")) if log.is_file() else None
    if m is None:
        return None
    loaded = float(m.group(1))
    expected = ShardedModel(spec, tp).weight_bytes_per_gpu / 2**30
    if abs(loaded / expected - 1) > WEIGHTS_TOLERANCE:
        raise ConfigError(
            str(log),
            "Model loading took",
            f"{loaded:.2f} GiB of weights per GPU; {spec.name} with {spec.precision.describe()} "
            f"at tp{tp} has {expected:.2f} GiB: the engine did not serve that precision",
        )
    return loaded


#: loaded vs described weight bytes (the description leaves out norms' and scales' few MB)
WEIGHTS_TOLERANCE = 0.05


def load_profile_phase(run_dir: Path) -> dict:
    """The profile phase of a run: ``profile.json.gz``, or, for a run cut short (or resumed and
    cut again), the scenarios it finished (``profile.partial.jsonl``)."""
    path = run_dir / "profile.json.gz"
    if path.is_file():
        with gzip.open(path, "rt") as f:
            return json.load(f)
    finished = read_partial(run_dir / "profile.partial.jsonl")
    if not finished:
        raise ConfigError(str(run_dir), "profile.json.gz", "no profile phase recorded here")
    return {
        "scenarios": [d["scenario"] for d in finished],
        "requests": {k: v for d in finished for k, v in d["requests"].items()},
        "cut_short": True,
        "repeats": _passes_finished([d["scenario"] for d in finished]),
    }


def _passes_finished(scenarios: list[dict]) -> int:
    """Whole passes over the grid a cut-short run finished (at least 1): its repeat scenarios
    (`profiles.vllm_grid.repeated`) over its first pass's, plus that first pass."""
    repeats = sum(1 for sc in scenarios if sc.get("repeat_of"))
    return 1 + repeats // max(1, len(scenarios) - repeats)


def build_table(
    run_dir: Path, out_dir: Path, gpu_key: str, spec: ModelSpec, tp: int,
    expert_parallel: str | None = None,
) -> dict:  # fmt: skip
    """Write ``steps.csv``, ``energy.csv`` (when the run read the GPUs' energy) and
    ``meta.yaml`` for the run's profile phase; returns the meta. ``expert_parallel``: the
    `simulator.served.EP_MODES` layout the table is for (None: experts split over TP)."""
    engine = json.loads((run_dir / "engine.json").read_text())
    # refuse a run of another precision or expert layout before writing anything
    precision = _served_precision(run_dir, engine, spec)
    _check_expert_parallel(run_dir, engine, expert_parallel)
    skew = _check_routing_skew(run_dir, engine, spec)
    shard = _shard(run_dir, engine, tp)
    loaded_gib = check_weights_loaded(run_dir, spec, tp)
    phase = load_profile_phase(run_dir)
    bursts = submit_bursts(phase["scenarios"], phase["requests"])
    steps = read_steps(str(run_dir / "steps.jsonl"))
    rows, dropped = label(_windowed_rows(steps, phase, spec, tp), phase["scenarios"], bursts)
    unresolved = sum(1 for r in rows if r["decode_ctx"] is None)
    rows = [r for r in rows if r["decode_ctx"] is not None]
    served = ShardedModel(spec, tp, expert_parallel)
    shifted = flag_shifted_stamps(rows)
    early = flag_early_stamps(rows, served, load_gpu(gpu_key, "--gpu-key", "gpu"))
    joined = group_repeats(rows, phase["scenarios"])
    frontend = frontend_delays(phase, steps)
    _write_steps_csv(out_dir, rows)
    measured = {
        "launches_by_engine_process": launches_by_process(
            steps, engine["compilation"]["max_cudagraph_capture_size"]
        ),
        "precision": precision,
        "weights_loaded_gib_per_gpu": loaded_gib,
        "energy": _write_energy(run_dir, out_dir, phase, rows, spec),
        "frontend": frontend,
        "steps": {
            "recorded": len(rows) + dropped + unresolved,
            "outside_scenarios": dropped,
            "early_stamp_steps_left_out": early,
            "shifted_stamp_steps_left_out": shifted,
            **_pass_counts(phase, joined),
        },
    }
    if spec.sliding_window is not None:
        measured["steps"]["window_contexts_unresolved"] = unresolved
    meta = _meta(run_dir, engine, gpu_key, spec, tp, measured)
    if shard:
        meta["shard"] = shard
    if expert_parallel:
        meta["expert_parallel"] = expert_parallel
    if skew:
        meta["routing_skew"] = skew
    if "routing_at_load" in engine:
        meta["routing_at_load"] = routing_seen(engine["routing_at_load"], spec, skew)
    (out_dir / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return meta


def _write_steps_csv(out_dir: Path, rows: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STEP_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow({"step_id": i, **r})


def _pass_counts(phase: dict, joined: int) -> dict:
    """meta.yaml's counts of the grid's passes: how many, how many later-pass steps joined a
    first-pass one (`group_repeats`), the scenarios run and whether the run was cut short."""
    return {
        "repeats": phase.get("repeats", 1),
        "repeat_steps_joined": joined,
        "scenarios": len(phase["scenarios"]),
        "grid_scenarios": phase.get("grid_scenarios"),
        "cut_short": bool(phase.get("cut_short")),
    }


def _windowed_rows(steps: list[dict], phase: dict, spec: ModelSpec, tp: int) -> list[dict]:
    """`step_rows` with the keys-read features of a model with sliding layers (the decode
    contexts rebuilt from the run's requests, `profiles.vllm_contexts`), else the plain ones."""
    reads = ShardedModel(spec, tp).kv_reads()
    if reads is None:
        return step_rows(steps)
    return step_rows(steps, reads, decode_contexts(steps, phase["requests"], phase["scenarios"]))


def _shard(run_dir: Path, engine: dict, tp: int) -> dict | None:
    """The ``shard`` entry of a table of one GPU's shard of a ``tp``-way layout (the run's job
    says ``shard_tp: tp`` and ran at TP1), None for a run of the whole engine at ``tp``; a run
    of another layout is refused before anything is written."""
    job = engine.get("job") or {}
    ran, shard_tp = int(job.get("tp", 1)), job.get("shard_tp")
    path = str(run_dir / "engine.json")
    if shard_tp is None:
        if ran != tp:
            raise ConfigError(path, "job.tp", f"the run served tp {ran}; the table is for tp {tp}")
        return None
    if shard_tp != tp or ran != 1:
        raise ConfigError(path, "job.shard_tp", f"the run timed one GPU's shard of tp "
                          f"{shard_tp} at tp {ran}; the table is for tp {tp} (expected "
                          f"shard_tp {tp} at tp 1)")  # fmt: skip
    return {
        "tp": tp,
        "timed": "one GPU's shard at TP1: per-GPU shapes (profiles.hf_config.shard_config); "
        "the simulator adds the layout's collectives (simulator.latency.shard)",
    }


def _check_expert_parallel(run_dir: Path, engine: dict, mode: str | None) -> None:
    """Refuse a run whose expert layout is not ``mode``'s: vLLM's ``enable_expert_parallel``
    as the engine read it back (``parallel`` in engine.json; runs recorded before it was kept
    served experts split over TP), with data parallelism 1 (the ``allreduce`` layout; vLLM
    runs its all-to-all kernels only with data parallelism, which no table measured)."""
    par = engine.get("parallel") or {}
    ran = bool(par.get("enable_expert_parallel", False))
    path = str(run_dir / "engine.json")
    if ran != bool(mode):
        said = "ran expert parallelism" if ran else "split experts over TP"
        want = f"expert parallelism ({mode})" if mode else "experts split over TP"
        raise ConfigError(path, "parallel.enable_expert_parallel", f"the run {said}; the table "
                          f"is asked for {want}")  # fmt: skip
    if mode not in (None, "allreduce") or int(par.get("data_parallel_size", 1)) != 1:
        raise ConfigError(path, "parallel.data_parallel_size", f"tables measure the allreduce "
                          f"layout (data parallelism 1); asked for {mode!r}, run had "
                          f"{par.get('data_parallel_size', 1)}")  # fmt: skip


def _served_precision(run_dir: Path, engine: dict, spec: ModelSpec) -> dict:
    """The precision the run served (its engine.json), which must be the table's model's."""
    # runs recorded before precision was a job field served bf16 weights and KV
    precision = engine.get("precision") or {"weights": "bf16", "kv_cache_dtype": "bf16"}
    if Precision(**precision) != spec.precision:
        raise ConfigError(
            str(run_dir / "engine.json"),
            "precision",
            f"the run served {Precision(**precision).describe()}; the table is asked for "
            f"{spec.precision.describe()}",
        )
    return precision


def _check_routing_skew(run_dir: Path, engine: dict, spec: ModelSpec) -> float:
    """The router skew the run served (engine.json ``routing_skew``, absent: 0 = uniform);
    a ConfigError naming the file and field unless it is the model's ``routing_skew``: a
    table timed one router's expert load, and no other."""
    ran = float(engine.get("routing_skew", 0.0))
    asked = spec.moe.routing_skew if spec.moe is not None else 0.0
    if ran != asked:
        raise ConfigError(str(run_dir / "engine.json"), "routing_skew", f"the run routed with "
                          f"skew {ran:g}; the table is asked for skew {asked:g} (model."
                          "routing_skew, --routing-skew)")  # fmt: skip
    return ran


def routing_seen(seen: dict, spec: ModelSpec, skew: float) -> dict:
    """What the run's routers did with random tokens at load (`profiles.dummy_routing.
    routing_at_load`) beside what the simulator assumes for ``skew``
    (`simulator.served.routing_imbalance`, `expected_experts_touched`)."""
    e, k = spec.moe.num_experts, spec.moe.top_k
    touched = {t: round(expected_experts_touched(e, k, int(t), skew), 2) for t in seen["touched"]}
    return {
        "routers": seen["routers"],
        "tokens": seen["tokens"],
        "max_over_mean": {"seen": seen["max_over_mean"],
                          "asked": round(routing_imbalance(e, k, skew), 3)},
        "experts_touched": {"seen": seen["touched"], "asked": touched},
        "note": "seen: each router's top-k of random token ids' embedding rows at load, "
                "medians over routers (profiles/dummy_routing.py routing_at_load); asked: the "
                "simulator's (max_over_mean in the many-token limit: a 4,096-token sample's "
                "max sits above it by sampling noise, ~1.1-1.25 for uniform routing)",
    }  # fmt: skip


#: engine.json's start time (`profiles.vllm_run`)
_STARTED = "engine_started_utc"


def _meta(run_dir: Path, engine: dict, gpu_key: str, spec: ModelSpec, tp: int, m: dict) -> dict:
    """meta.yaml: what was run (engine, config, kernels) and what the build measured (``m``)."""
    return {
        "schema_version": 1,
        "kind": "engine_steps",
        "engine": {"name": "vllm", "version": engine["vllm_version"]},
        "gpu": {"key": gpu_key, "name": engine["gpu"], "count_visible": engine["gpu_count"]},
        "model": {"name": spec.name},
        "tp": tp,
        "precision": m["precision"],
        "dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16"
        if engine["cache"]["cache_dtype"] == "auto"
        else engine["cache"]["cache_dtype"],
        "quantization": engine["model"].get("quantization"),
        "weights_loaded_gib_per_gpu": m["weights_loaded_gib_per_gpu"],
        "kernels": _kernels(run_dir),
        "torch_version": engine["torch_version"],
        "engine_config": {k: engine[k] for k in ("scheduler", "cache", "model", "compilation")},
        "kv_capacity_tokens": engine["cache"]["num_gpu_blocks"] * engine["cache"]["block_size"],
        "weights": "dummy (load_format=dummy); config.json generated from the catalog",
        # MoE routers as the dummy load left them, or re-drawn (`profiles.dummy_routing`);
        # a dense model has none to describe
        **({"routing": engine.get("routing", "dummy")} if spec.moe else {}),
        "steps": m["steps"],
        "step_time": "interval from max(previous completion, plan) to completion, engine clock",
        "frontend": m["frontend"],
        # a prompt step's launch time is drawn per engine process (profiles/vllm_run.py)
        "launches_by_engine_process": m["launches_by_engine_process"],
        "energy": m["energy"],
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # when the engine ran (runs recorded before 2026-11-27 did not stamp it)
        **({"recorded_utc": engine[_STARTED]} if _STARTED in engine else {}),
        "source": "servesim profile --engine vllm (profiles/vllm_run.py, profiles/vllm_grid.py)",
    }
