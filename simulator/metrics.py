"""Metrics of a finished run, named as vLLM's benchmark names them (see DESIGN.md).

Pure functions over the run's records: no plotting, no I/O. Latencies are distributions, so each
is reported as mean, p50, p90, p95, p99.

* TTFT = first token - arrival (includes queueing); TPOT = (E2E - TTFT) / (output tokens - 1),
  for requests with at least 2 output tokens; ITL = every gap between consecutive tokens of a
  request (all tokens of a step carry the step's end time); E2E = finish - arrival.
* Goodput = completed requests per second meeting every SLO; SLO attainment = the fraction of
  *arrived* requests that completed within every SLO (DistServe's definition: rejected or
  unfinished requests count as misses).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from itertools import accumulate

import numpy as np

from simulator.energy import DEFAULT_USD_PER_KWH, energy_summary
from simulator.served import ShardedModel
from simulator.steplog import NAMES as STEP_NAMES

PCTS = (50, 90, 95, 99)
_FLOAT_STEP_COLS = ("start_s", "duration_s", "prefill_attn")


def dist(values) -> dict:
    """mean and percentiles of a sample; NaNs (undefined values) are ignored."""
    a = np.asarray(values, dtype=float)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "count": 0}
    out = {"mean": float(a.mean())}
    for p, v in zip(PCTS, np.percentile(a, PCTS), strict=True):
        out[f"p{p}"] = float(v)
    out["count"] = int(a.size)
    return out


def weighted_dist(values, weights) -> dict:
    """Like `dist` for a sample given as distinct values with repeat counts (inverted CDF)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    if v.size == 0 or w.sum() == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "count": 0}
    order = _stable_order(v)
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    total = cum[-1]
    out = {"mean": float((v * w).sum() / total)}
    for p in PCTS:
        # same convention as numpy's "inverted_cdf": smallest value whose CDF >= p
        idx = int(np.searchsorted(cum, p / 100 * total - 1e-9 * total, side="left"))
        out[f"p{p}"] = float(v[min(idx, v.size - 1)])
    out["count"] = int(total)
    return out


def _stable_order(v: np.ndarray) -> np.ndarray:
    """``np.argsort(v, kind="stable")`` (equal values in index order, which fixes the order of
    the weighted mean's sum) from numpy's default sort, 2-3x faster here (0.02 s for a 100k
    run's ITL gaps): sort, number the runs of equal values, then sort (run, index) keys."""
    order = np.argsort(v)
    sv = v[order]
    if sv.size and np.isnan(sv[-1]):  # NaNs sort last but never compare equal
        return np.argsort(v, kind="stable")
    run = np.zeros(v.size, np.int64)
    np.cumsum(sv[1:] != sv[:-1], out=run[1:])
    run *= v.size
    return np.sort(run + order) - run


def request_table(requests, output_delay_s: float = 0.0) -> dict[str, np.ndarray]:
    """Column arrays of per-request facts (NaN where undefined); ``output_delay_s`` as in
    `derived_request_columns`."""
    n = len(requests)
    nan = math.nan
    cols = {
        "id": np.empty(n, dtype=np.int64),
        "arrival_s": np.empty(n),
        "input_tokens": np.empty(n, dtype=np.int64),
        "output_tokens": np.empty(n, dtype=np.int64),
        "generated_tokens": np.empty(n, dtype=np.int64),
        "first_scheduled_s": np.empty(n),
        "first_token_s": np.empty(n),
        "finish_s": np.empty(n),
        "preemptions": np.empty(n, dtype=np.int64),
        "cached_tokens": np.empty(n, dtype=np.int64),
        "replica": np.empty(n, dtype=np.int64),
    }
    status, reason = [], []
    for i, r in enumerate(requests):
        cols["id"][i] = r.id
        cols["arrival_s"][i] = r.arrival_s
        cols["input_tokens"][i] = r.num_prompt_tokens
        cols["output_tokens"][i] = r.max_output_tokens
        cols["generated_tokens"][i] = r.num_output
        cols["first_scheduled_s"][i] = nan if r.first_scheduled_s is None else r.first_scheduled_s
        cols["first_token_s"][i] = nan if r.first_token_s is None else r.first_token_s
        cols["finish_s"][i] = nan if r.finish_s is None else r.finish_s
        cols["preemptions"][i] = r.num_preemptions
        cols["cached_tokens"][i] = r.num_cached_tokens
        cols["replica"][i] = -1 if r.replica is None else r.replica
        status.append(r.status.name.lower())
        reason.append(r.reject_reason or "")
    return derived_request_columns(
        cols, np.array(status, dtype=object), np.array(reason, dtype=object), output_delay_s
    )


def derived_request_columns(
    cols: dict, status: np.ndarray, reason: np.ndarray, output_delay_s: float = 0.0
) -> dict:
    """Add TTFT, E2E, TPOT, queueing time, status and reject reason to the stored columns.

    ``output_delay_s`` is the time from a token leaving the engine to reaching the client (a
    serving frontend's output path): it moves every token time, so TTFT and E2E, not TPOT."""
    nan = math.nan
    if output_delay_s:
        cols["first_token_s"] = cols["first_token_s"] + output_delay_s
        cols["finish_s"] = cols["finish_s"] + output_delay_s
    arr = cols["arrival_s"]
    done = status == "finished"
    cols["ttft_s"] = cols["first_token_s"] - arr
    cols["e2e_s"] = np.where(done, cols["finish_s"] - arr, nan)
    out = cols["generated_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["tpot_s"] = np.where(
            done & (out > 1), (cols["finish_s"] - cols["first_token_s"]) / (out - 1), nan
        )
    cols["queue_s"] = cols["first_scheduled_s"] - arr
    cols["status"] = status
    cols["reject_reason"] = reason
    return cols


def slo_met(cols: dict, ttft_s: float | None, tpot_s: float | None) -> np.ndarray:
    ok = cols["status"] == "finished"
    if ttft_s is not None:
        ok &= cols["ttft_s"] <= ttft_s
    if tpot_s is not None:
        # a single-token request has no TPOT and cannot miss the TPOT SLO
        ok &= np.nan_to_num(cols["tpot_s"], nan=0.0) <= tpot_s
    return ok


def step_arrays(replicas, release: bool = False) -> dict[str, np.ndarray]:
    """Column arrays of every replica's steps (replica 0's rows first), one contiguous array
    per column: float64 for times and attention pairs, int64 for counts. ``release`` empties
    the replicas' step logs chunk by chunk as their rows are copied (a long run's steps would
    otherwise be held twice)."""
    total = sum(len(rep.steps) for rep in replicas)
    out = {k: np.empty(total, dtype=float if k in _FLOAT_STEP_COLS else np.int64)
           for k in STEP_NAMES}  # fmt: skip
    out["replica"] = np.empty(total, dtype=np.int64)
    lo = 0
    for rows, replica in _step_batches(replicas, release):
        hi = lo + len(rows)
        for i, k in enumerate(STEP_NAMES):
            out[k][lo:hi] = rows[:, i]
        out["replica"][lo:hi] = replica
        lo = hi
    return out


def _step_batches(replicas, release: bool, batch_rows: int = 65536):
    """(rows, replica index) batches, each chunk dropped once used when ``release``: a
    replica's chunks as they are when they are long (a lone replica's 1024 rows: joining them
    would copy them once more), else joined ``batch_rows`` rows at a time. Why: a run of 64
    replicas has ~64k chunks of ~16 rows (they pack together, `steplog.pack_together`);
    copying each chunk's 12 columns on its own cost ~8 us a chunk, and even gathering them
    one by one in Python ~1 us."""
    for rep in replicas:
        chunks = rep.steps.take_chunks() if release else [rep.steps.array()]
        ends = list(accumulate(map(len, chunks)))
        join = batch_rows if ends and ends[-1] < 256 * len(chunks) else 1  # mean < 256 rows
        lo = 0
        while lo < len(chunks):
            start = ends[lo - 1] if lo else 0
            hi = min(max(bisect_left(ends, start + join) + 1, lo + 1), len(chunks))
            yield (np.concatenate(chunks[lo:hi]) if hi - lo > 1 else chunks[lo]), rep.index
            chunks[lo:hi] = [None] * (hi - lo)
            lo = hi


def summarize(
    cols: dict,
    steps: dict,
    replicas,
    *,
    slo: dict,
    model,
    gpu,
    tp: int,
    end_s: float,
    price_per_gpu_hour: float,
    energy=None,
    usd_per_kwh: float = DEFAULT_USD_PER_KWH,
) -> dict:
    """Every metric of DESIGN.md for one run; with ``energy`` (a `simulator.energy` model) an
    ``energy`` section after ``cost``, from the same duration and token counts as ``cost``."""
    status = cols["status"]
    done = status == "finished"
    n_arrived = len(status)
    first_arrival = float(cols["arrival_s"].min()) if n_arrived else 0.0
    duration = max(end_s - first_arrival, 1e-12)
    met = slo_met(cols, slo.get("ttft_s"), slo.get("tpot_s"))
    gaps = np.concatenate([np.frombuffer(rep.itl_gaps, dtype=float) for rep in replicas] or [[]])
    counts = np.concatenate(
        [np.frombuffer(rep.itl_counts, dtype=np.int64) for rep in replicas] or [[]]
    )
    in_tok = int(cols["input_tokens"][done].sum())
    out_tok = int(cols["generated_tokens"][done].sum())
    num_gpus = tp * len(replicas)
    out = {
        "requests": _request_counts(cols, status, done),
        "duration_s": duration,
        "ttft_s": dist(cols["ttft_s"][done]),
        "tpot_s": dist(cols["tpot_s"][done]),
        "itl_s": weighted_dist(gaps, counts),
        "e2e_s": dist(cols["e2e_s"][done]),
        "queue_s": dist(cols["queue_s"][done]),
        "throughput": {
            "requests_per_s": float(done.sum()) / duration,
            "input_tokens_per_s": in_tok / duration,
            "output_tokens_per_s": out_tok / duration,
        },
        "slo": dict(slo),
        "goodput_rps": float(met.sum()) / duration,
        "slo_attainment": float(met.sum()) / n_arrived if n_arrived else None,
        "utilization": _utilization(steps, replicas, model, gpu, tp, duration),
        "cost": {
            "num_gpus": num_gpus,
            "price_per_gpu_hour": price_per_gpu_hour,
            "usd_per_million_tokens": (
                price_per_gpu_hour * num_gpus * duration / 3600 / ((in_tok + out_tok) / 1e6)
                if in_tok + out_tok else None
            ),
        },
    }  # fmt: skip
    if energy is not None:
        out["energy"] = energy_summary(
            energy, steps, duration_s=duration, replicas=len(replicas), tp=tp,
            output_tokens=out_tok, tokens=in_tok + out_tok, usd_per_kwh=usd_per_kwh,
            tdp_w=getattr(gpu, "tdp_w", None),
        )  # fmt: skip
    return out


def _request_counts(cols: dict, status, done) -> dict:
    """How many requests arrived, completed, were rejected (by reason and by cause) or are
    still in the system: every arriving request is in exactly one of these."""
    reasons: dict[str, int] = {}
    for r in cols["reject_reason"][status == "rejected"]:
        reasons[r] = reasons.get(r, 0) + 1
    causes: dict[str, int] = {}
    for r, n in reasons.items():
        causes[reject_cause(r)] = causes.get(reject_cause(r), 0) + n
    return {
        "arrived": len(status),
        "completed": int(done.sum()),
        "rejected": int((status == "rejected").sum()),
        "unfinished": int(((status == "waiting") | (status == "running")
                           | (status == "transferring")).sum()),
        "reject_reasons": reasons,
        "reject_causes": dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))),
    }  # fmt: skip


def _utilization(steps: dict, replicas, model, gpu, tp: int, duration: float) -> dict:
    """Time-weighted use of the engines: busy fraction, KV use and waste, MFU / MBU (at the
    peak of the model's GEMM dtype), mean batch, preemptions."""
    busy = float(steps["duration_s"].sum())
    flops, nbytes = step_work(steps, model)
    peak_flops = gpu.peak_flops_for(ShardedModel(model).weight_format.gemm_dtype)
    peak_bw = getattr(gpu, "peak_bandwidth", None) or gpu.hbm_bandwidth
    total_blocks = sum(rep.kv.num_blocks for rep in replicas)
    kv_frac = steps["kv_blocks_used"] / max(total_blocks / max(len(replicas), 1), 1)
    w = steps["duration_s"]
    # reserved-but-unused KV slots (time-weighted): paged wastes < 1 block per request, a
    # contiguous allocator the rest of each request's reserved extent (with prefix sharing a
    # shared block counts once but its tokens once per holder, so waste can go negative)
    block_size = replicas[0].kv.block_size if replicas else 1
    waste = steps["kv_blocks_used"] * block_size - steps["kv_tokens"]
    reserved = steps["kv_blocks_used"] * block_size
    return {
        "busy_fraction": busy / (duration * len(replicas)) if replicas else 0.0,
        "kv_use_mean": float((kv_frac * w).sum() / w.sum()) if w.sum() else 0.0,
        "kv_use_max": float(kv_frac.max()) if kv_frac.size else 0.0,
        "kv_waste_tokens_mean": float((waste * w).sum() / w.sum()) if w.sum() else 0.0,
        "kv_waste_frac": float((waste * w).sum() / (reserved * w).sum())
        if (reserved * w).sum() else 0.0,
        "mfu": flops / (busy * peak_flops * tp) if busy else 0.0,
        "mbu": nbytes / (busy * peak_bw * tp) if busy else 0.0,
        "mean_batch_size": float(((steps["prefill_seqs"] + steps["decode_seqs"]) * w).sum()
                                 / w.sum()) if w.sum() else 0.0,
        "preemptions": int(sum(rep.num_preemptions for rep in replicas)),
        "num_steps": int(steps["duration_s"].size),
    }  # fmt: skip


def step_work(steps: dict, model) -> tuple[float, float]:
    """Useful FLOPs and the fewest HBM bytes of all steps (for MFU and MBU), from the unsharded
    model's description (`ShardedModel(model, 1)`: the model's work, whatever the TP split).

    FLOPs: the layers' GEMMs per computed token, plus causal attention per (query, key) pair
    (the LM head is left out). Bytes: the weights (in their format) once per step, plus the KV
    cache (in its dtype) read by decodes and written by every new token.
    """
    served = ShardedModel(model)
    tokens = steps["prefill_tokens"] + steps["decode_seqs"]
    attn_pairs = steps["decode_ctx"].sum() + steps["prefill_attn"].sum()
    flops = served.step_flops(tokens.sum(), attn_pairs, prefill_pairs=steps["prefill_attn"].sum())
    nbytes = served.step_min_bytes(
        steps["duration_s"].size, steps["decode_ctx"].sum() + tokens.sum()
    )
    return float(flops), float(nbytes)


_REQUEST_NUMBER = re.compile(r"^(\D*?)\d+ ")


def reject_cause(reason: str) -> str:
    """A reject reason without the request's own number, so reasons group by cause:
    "prompt 9000 > max_num_batched_tokens 8192" -> "prompt > max_num_batched_tokens 8192"."""
    return _REQUEST_NUMBER.sub(r"\1", reason, count=1)
