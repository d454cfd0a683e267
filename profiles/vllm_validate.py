"""Simulation vs real vLLM serving of the same arrivals (the report runs anywhere; no GPU).

A real run is one replay phase of ``profiles/vllm_run.py``: per request, its submit time and the
time and token count of every streamed output, as a client of ``AsyncLLM`` saw them, plus the
fingerprint of the arrivals it replayed (`profiles.engine_jobs`). The report simulates the same
experiment (``latency: auto``, so with the ``vllm`` policy the vLLM table) and compares TTFT,
TPOT, ITL and E2E percentiles and throughput as ``sim / real - 1``; it refuses a real run whose
fingerprint differs from the experiment's. It also compares the batches: the engine's recorded
steps (`profiles.vllm_steps`) against the simulator's (decode batch size and prefill tokens per
step, median and p90).

Real metrics follow vLLM's benchmark: TTFT = first output - submit, TPOT = (last - first) /
(tokens - 1), E2E = last - submit; ITL = the gap before each streamed output, and 0 for the
further tokens of an output that carried several (a client sees them together).
"""

from __future__ import annotations

import copy
import gzip
import json
import tempfile
from pathlib import Path

import numpy as np

from profiles import engine_jobs
from profiles.engine_jobs import job_precision
from profiles.gpu_energy import energy_between, read_energy
from profiles.metric_intervals import percentile_intervals, weighted_quantile
from profiles.vllm_table import step_rows
from simulator.errors import ConfigError
from simulator.executor import idle_wake_s
from simulator.hardware import load_gpu
from simulator.latency.base import after_launch_wait
from simulator.latency.engine_steps import LAUNCH_SHOWS, MIN_LAUNCHES
from simulator.models import load_model
from simulator.precision import Precision

METRICS = tuple(
    (sec, st) for sec in ("ttft_s", "tpot_s", "itl_s", "e2e_s") for st in ("p50", "p95", "p99")
) + (("throughput", "requests_per_s"), ("throughput", "output_tokens_per_s"))


def request_samples(phase: dict) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """Per metric (``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s``) its values in a real replay
    phase and the index of the request each belongs to (a request with one output token has
    no TPOT; each of its token gaps is one ITL value, a chunk of ``k`` tokens one gap and
    ``k - 1`` zeros, as vLLM's benchmark counts them); and the phase's ``window``: first
    submission, last token and output tokens (what throughput and energy are taken over)."""
    vals: dict[str, list[float]] = {k: [] for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s")}
    owner: dict[str, list[int]] = {k: [] for k in vals}
    first, last, tokens = [], [], 0
    for i, rec in enumerate(phase["requests"].values()):
        times = rec["times"]
        if not times:
            raise ConfigError("<real run>", "requests", "a request produced no output")
        t0, t_first, t_last = rec["t_submit"], times[0][0], times[-1][0]
        n = sum(k for _, k in times)
        tokens += n
        gaps, prev = [], t_first
        for t, k in times[1:]:
            gaps.extend([t - prev] + [0.0] * (k - 1))
            prev = t
        got = {"ttft_s": [t_first - t0], "e2e_s": [t_last - t0], "itl_s": gaps,
               "tpot_s": [(t_last - t_first) / (n - 1)] if n > 1 else []}  # fmt: skip
        for k, v in got.items():
            vals[k].extend(v)
            owner[k].extend([i] * len(v))
        first.append(t0)
        last.append(t_last)
    samples = {k: (np.asarray(vals[k]), np.asarray(owner[k], dtype=np.int64)) for k in vals}
    return samples, {"t0": min(first), "t1": max(last), "output_tokens": tokens}


def real_metrics(phase: dict, measured: tuple | None = None) -> dict:
    """The summary sections of `METRICS` from a real replay phase, and its ``window``;
    ``measured``: the phase's `request_samples`, when the caller has them already."""
    samples, window = measured or request_samples(phase)
    out = {sec: _pcts(v) for sec, (v, _) in samples.items()}
    span = window["t1"] - window["t0"]
    out["throughput"] = {
        "requests_per_s": len(phase["requests"]) / span,
        "output_tokens_per_s": window["output_tokens"] / span,
    }
    out["window"] = window
    return out


def _pcts(v: list[float]) -> dict:
    a = np.asarray(v)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}


def load_phase(path: Path) -> dict:
    """A stored real phase, with ``served_precision``: what the engine of its run served (the
    run's ``engine.json`` beside it; a run recorded before jobs named a precision served bf16)."""
    with gzip.open(path, "rt") as f:
        phase = json.load(f)
    phase["energy_record"] = read_energy(path.parent)  # None for runs recorded without it
    engine = path.parent / "engine.json"
    if engine.is_file():
        facts = json.loads(engine.read_text())
        phase["served_precision"] = facts.get("precision") or job_precision(facts.get("job", {}))
        phase["served_gpu"] = facts.get("gpu")  # the device's name, e.g. "NVIDIA H100 80GB HBM3"
    return phase


def energy_check(phase: dict, sim: dict, window: dict) -> dict | None:
    """Joules per output token, simulated (the latency table's energy model, idle included) vs
    measured (the GPUs' energy counter over the real run's ``window``: first submission to last
    token, `real_metrics`), or None when the real run read no energy."""
    rec = phase.get("energy_record")
    if not rec or not rec.get("t"):
        return None
    joules = energy_between(rec, window["t0"], window["t1"])
    tokens = window["output_tokens"]
    sim_j = (sim.get("energy") or {}).get("joules_per_output_token")
    if joules is None or not tokens or sim_j is None:
        return None
    real_j = joules / tokens
    return {
        "sim_j_per_output_token": sim_j,
        "real_j_per_output_token": real_j,
        "err": sim_j / real_j - 1,
        "sim_source": sim["energy"]["source"],
        "sim_kind": sim["energy"]["kind"],
    }


def _gpu_mismatch(cfg: dict, where: str, phase: dict) -> list[str]:
    """The GPU the real run ran on (its engine.json) against the experiment's catalog GPU key.
    Why: the arrivals' fingerprint names the GPU the job was written for, not the one that ran
    it; a job written for an H200 and run on an H100 (the lent machine decides) replays the same
    requests, but its step times and KV capacity are an H100's. The catalog GPU's family (its
    name as `load_gpu` resolves it, `h100` -> `h100-sxm` -> `h100`) must be in the device's
    name ("NVIDIA H100 80GB HBM3"). Runs recorded without the name, and custom GPUs (a
    mapping), are not checked."""
    device, key = phase.get("served_gpu"), (cfg.get("hardware") or {}).get("gpu")
    if not device or not isinstance(key, str):
        return []
    family = load_gpu(key, where, "hardware.gpu").name.split("-")[0]  # h100-sxm -> h100
    if family in device.lower().replace(" ", ""):
        return []
    return [f"gpu: experiment {key!r}, real run on {device!r}"]


def _precision_mismatch(cfg: dict, where: str, phase: dict) -> list[str]:
    served = phase.get("served_precision")
    if served is None:
        return ["the real run has no engine.json saying what precision it served"]
    ours = load_model(cfg["model"], where, "model").precision
    if Precision(**served) != ours:
        return [
            f"precision: experiment {ours.describe()}, real run {Precision(**served).describe()}"
        ]
    return []


def simulate(cfg: dict, where: str):
    from simulator.runner import build
    from simulator.runner import simulate as run

    built = build(copy.deepcopy(cfg), where, Path(where).resolve().parent)
    res = run(built)
    return res.summary, res.steps


def check_same_run(cfg: dict, where: str, phase: dict) -> list[list]:
    """Refuse a real run that replayed other arrivals, another model or precision; returns the
    experiment's scheduled requests (`engine_jobs.arrivals`)."""
    reqs = engine_jobs.arrivals(cfg, where)
    expected = engine_jobs.fingerprint(cfg, where, reqs)
    diff = engine_jobs.fingerprint_mismatch(expected, phase.get("fingerprint"))
    diff += _precision_mismatch(cfg, where, phase)
    diff += _gpu_mismatch(cfg, where, phase)
    if diff:
        raise ConfigError(where, "real run", "not a run of this experiment: " + "; ".join(diff))
    return reqs


def as_submitted(cfg: dict, phase: dict, folder: Path) -> dict:
    """``cfg`` with its workload replaced by the requests as the real client submitted them
    (``t_submit``, prompt and output lengths; a trace written to ``folder``).

    Why: the replay client submits each request at its scheduled time from one asyncio loop
    that also receives every streamed token; near saturation that loop falls behind (H100
    conv_heavy: submissions a median 1.8 ms late, p99 470 ms), so the engine served a later,
    burstier arrival process than the experiment's. Real metrics are measured from the
    submission; the simulation starts from it too. The fingerprint is still checked against
    the experiment's scheduled arrivals (`check_same_run`)."""
    recs = sorted(phase["requests"].values(), key=lambda r: r["t_submit"])
    t0 = recs[0]["t_submit"]
    path = Path(folder) / "submitted.csv"
    with open(path, "w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        f.writelines(f"{r['t_submit'] - t0:.6f},{r['prompt']},{r['out']}\n" for r in recs)
    out = copy.deepcopy(cfg)
    out["workload"] = {"trace": {"path": str(path)}, "arrival": {"process": "trace"}}
    return out


def compare(cfg: dict, where: str, phase: dict, measured: tuple) -> dict:
    """Per-metric sim / real - 1 (``cfg`` as the requests were submitted: `as_submitted`;
    ``measured``: the phase's `request_samples`)."""
    sim, sim_steps = simulate(cfg, where)
    real = real_metrics(phase, measured)
    rows = []
    ci = percentile_intervals(measured[0], len(phase["requests"]))
    for sec, st in METRICS:
        s, r = sim[sec][st], real[sec][st]
        row = {"metric": f"{sec}.{st}", "sim": s, "real": r, "err": s / r - 1}
        if f"{sec}.{st}" in ci:  # latency percentiles (not throughput)
            lo, hi = ci[f"{sec}.{st}"]
            row |= {"real_ci90": [lo, hi], "sim_in_real_ci90": lo <= s <= hi}
        rows.append(row)
    errs = [abs(x["err"]) for x in rows]
    return {
        "metrics": rows,
        "median_abs_err": float(np.median(errs)),
        "max_abs_err": float(max(errs)),
        "latency_model": sim["latency_model"].get("name"),
        # where the run left what the table measured (its steps were extrapolated)
        "latency_warnings": sim["latency_model"].get("warnings") or [],
        "sim_steps": _batch_stats(sim_steps["decode_seqs"], sim_steps["prefill_tokens"]),
        "energy": energy_check(phase, sim, real["window"]),
    }


def report_case(cfg: dict, where: str, phase: dict, steps: list[dict]) -> dict:
    """`compare` on the arrivals as submitted, plus, when the engine's steps were recorded,
    the real batches and the step-by-step scheduling match (`schedule_match`)."""
    scheduled = check_same_run(cfg, where, phase)
    measured = request_samples(phase)
    with tempfile.TemporaryDirectory() as tmp:
        submitted = as_submitted(cfg, phase, Path(tmp))
        res = compare(submitted, where, phase, measured)
        res["submit_lag_ms"] = submit_lag_ms(scheduled, phase)
        if steps:
            real = phase_steps(steps, phase)
            res["real_steps"] = real_batch_stats(real)
            gaps = measured[0]["itl_s"][0]
            res["token_gaps_engine_vs_client_ms"] = engine_vs_client_gaps(real, gaps)
            res["schedule_match"] = schedule_match(submitted, where, real)
    return res


def submit_lag_ms(scheduled: list[list], phase: dict) -> dict:
    """How late the real client submitted each request against the experiment's schedule
    (``scheduled``: `check_same_run`'s requests; p50 / p90 / p99 / max, milliseconds; the first
    request defines the origin)."""
    sched = [r[0] for r in scheduled]
    recs = sorted(phase["requests"].values(), key=lambda r: r["t_submit"])
    real = [r["t_submit"] - recs[0]["t_submit"] for r in recs]
    lag = 1e3 * (np.array(real) - (np.array(sorted(sched)) - min(sched)))
    return {
        k: float(np.percentile(lag, q))
        for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
    }


def _batch_stats(decodes, prefill) -> dict:
    d, p = np.asarray(decodes), np.asarray(prefill)
    return {
        "steps": int(len(d)),
        "decode_batch_p50": float(np.median(d)),
        "decode_batch_p90": float(np.percentile(d, 90)),
        "prefill_tokens_p90": float(np.percentile(p, 90)),
        "with_prefill": float((p > 0).mean()),
    }


def real_batch_stats(real: list[dict]) -> dict:
    """Batch sizes of a phase's steps (`phase_steps`)."""
    return _batch_stats([r["decode_seqs"] for r in real], [r["prefill_tokens"] for r in real])


class ReplayExecutor:
    """Charges the k-th step the measured time of vLLM's k-th step of the same run, so a
    simulated schedule can be compared with the engine's step by step under the engine's own
    clock; steps beyond the recorded ones fall back to the latency model."""

    can_precompute = False

    def __init__(self, durations: list[float], latency):
        self.durations = durations
        self.latency = latency
        self.k = 0
        self.idle_plan_s = idle_wake_s(latency)

    def execute(self, plan, replica, features: tuple) -> float:
        k, self.k = self.k, self.k + 1
        wake = self.idle_plan_s if plan.after_idle else 0.0
        if k < len(self.durations):
            return self.durations[k] + wake  # a measured interval starts at its plan
        return self.latency.step_time(*features) + plan.extra_s + wake


def engine_vs_client_gaps(real: list[dict], itl_s: np.ndarray) -> dict:
    """Where token gaps widen: the engine's busy step intervals, weighted by the tokens each
    step emitted (what the client's gaps would be with a constant delivery delay, as the
    simulator charges it), beside the client's measured nonzero token gaps (p50 / p95 / p99,
    ms). A client tail above the engine's is delivery jitter between the engine core and the
    client, which no step-time model produces. ``real``: the phase's steps (`phase_steps`);
    ``itl_s``: its client token gaps in seconds (`request_samples`)."""
    dur = np.array([r["dur_us"] * 1e-3 for r in real if not r["after_idle"]])
    tok = np.array([r["decode_seqs"] for r in real if not r["after_idle"]], dtype=float)
    gaps = itl_s * 1e3
    gaps = gaps[gaps > 0]
    if not len(dur) or not tok.sum() or not len(gaps):
        return {}
    order = np.argsort(dur, kind="stable")
    cum = np.cumsum(tok[order])
    engine = [weighted_quantile(dur[order], cum, q) for q in (0.5, 0.95, 0.99)]
    return {
        "engine_steps_token_weighted": [round(x, 3) for x in engine],
        "client_gaps": [round(float(x), 3) for x in np.percentile(gaps, [50, 95, 99])],
    }


def phase_steps(steps: list[dict], phase: dict) -> list[dict]:
    """The engine steps of one replay phase as `profiles.vllm_table.step_rows` gives them
    (composition features and measured interval)."""
    return step_rows([s for s in steps if phase["t0"] <= s["t_done"] <= phase["t1"]])


def schedule_match(cfg: dict, where: str, real: list[dict]) -> dict:
    """Fraction of steps whose composition (prefill tokens, running decodes) the ``vllm`` policy
    plans exactly as vLLM did, given vLLM's measured step times (`ReplayExecutor`); ``real``:
    the phase's steps (`phase_steps`)."""
    from simulator.runner import build
    from simulator.runner import simulate as run

    built = build(copy.deepcopy(cfg), where, Path(where).resolve().parent)
    ex = ReplayExecutor([r["dur_us"] * 1e-6 for r in real], built.latency)
    res = run(built, executor_factory=lambda latency, i: ex)
    sp, sd = res.steps["prefill_tokens"], res.steps["decode_seqs"]
    n = min(len(real), len(sp))
    same = near = 0
    for k in range(n):
        rp, rd = real[k]["prefill_tokens"], real[k]["decode_seqs"]
        same += int(sp[k] == rp and sd[k] == rd)
        near += int(abs(sd[k] - rd) <= 1 and abs(sp[k] - rp) <= 0.05 * max(rp, 1))
    return {
        "real_steps": len(real),
        "sim_steps": int(len(sp)),
        "identical": same / n if n else 0.0,
        "within_one_decode_and_5pct_prefill": near / n if n else 0.0,
        "step_model_on_real_batches": step_model_on_real_batches(built.latency, real),
        "launch_waits_ms": launch_waits_vs_table(built.latency, real),
    }


def launch_waits_vs_table(latency, real: list[dict]) -> dict | None:
    """The launches serving showed beside those the table fitted, per kind (``graph``: within
    the largest CUDA graph, ``eager`` above): count and p10 / p50 / p90 in ms. A serving wait
    is the interval of a decode step with a prompt-carrying step planned behind it, when that
    interval exceeds the step's predicted time by the margin the table's fit uses
    (`LAUNCH_SHOWS`). Why: the simulator draws every launch from the table's waits, and a host
    that launches faster under serving than during profiling shifts TTFT by the difference."""
    waits = getattr(latency, "launch_waits", None)
    if waits is None:
        return None
    seen: dict[bool, list[float]] = {True: [], False: []}
    for prev, r in zip(real, real[1:], strict=False):
        if not r["prefill_behind"] or prev["prefill_tokens"] or prev["after_idle"]:
            continue
        if prev["dur_us"] * 1e-6 > LAUNCH_SHOWS * latency.predict_row(prev):
            seen[latency.runs_in_graph(r["prefill_tokens"] + r["decode_seqs"])].append(
                prev["dur_us"] * 1e-3
            )

    def stats(v) -> dict:
        q = np.percentile(v, [10, 50, 90]).round(2).tolist() if len(v) else []
        return {"count": len(v), "p10_p50_p90": q}

    # a kind with too few attributed launches holds one 0 s placeholder and is charged none:
    # no table statistics (`EngineStepModel._fit_launch`)
    return {
        kind: {
            "table": stats(np.asarray(waits[g]) * 1e3 if len(waits[g]) >= MIN_LAUNCHES else []),
            "serving": stats(seen[g]),
        }
        for kind, g in (("graph", True), ("eager", False))
    }


def _step_kind(r: dict) -> str:
    """``decode`` or ``prefill``, ``_launched`` when planned behind a running step."""
    kind = "prefill" if r["prefill_tokens"] else "decode"
    return kind + ("_launched" if r["prefill_behind"] else "")


def charged_steps(latency, real: list[dict]) -> list[tuple[dict, float, float]] | None:
    """Each of vLLM's steps ``real`` as the simulator charges it (`SimulatedExecutor`): ``(row,
    predicted, charged)``, charged = the predicted time, at least the launch of a prompt step
    planned behind it, less the wait a prompt step's predecessor already held for it. None for
    a latency model without recorded-step prediction (only engine-step tables have one)."""
    predict = getattr(latency, "predict_row", None)
    if predict is None:
        return None
    launch_s = getattr(latency, "launch_s", None)
    if hasattr(latency, "set_row_dips"):
        latency.set_row_dips(real)  # the clock dip after long prefills, as the simulator charges
    out, waited = [], 0.0
    for k, r in enumerate(real):
        t = own = predict(r)
        if waited and r["prefill_tokens"]:
            t = after_launch_wait(t, waited)
        waited = 0.0
        nxt = real[k + 1] if k + 1 < len(real) else None
        if launch_s is not None and nxt is not None and nxt["prefill_behind"]:
            waited = max(0.0, launch_s(nxt["prefill_tokens"] + nxt["decode_seqs"]) - t)
        out.append((r, own, t + waited))
    return out


def step_model_on_real_batches(latency, real: list[dict]) -> dict | None:
    """The table charged with the batches vLLM really ran, as the simulator charges them: each
    step its predicted time, and where a step with prompt tokens was launched behind it, at
    least that launch, given back by the launched step (`SimulatedExecutor`); summed over the
    phase's busy steps against their summed measured intervals. Also the per-step error on
    decode-only steps with no launch behind them.

    Why: a metric error mixes step-time error with the scheduling and queueing that follow
    from it (near saturation a few percent of step time become tens of percent of TPOT); this
    isolates the first. Steps planned on an idle engine are left out (their start is the plan,
    not the previous completion). None for a latency model without recorded-step prediction
    (only engine-step tables have one)."""
    charged = charged_steps(latency, real)
    if charged is None:
        return None
    busy = [c for c in charged if not c[0]["after_idle"]]  # (row, predicted, charged)
    if not busy:
        return None
    meas = sum(r["dur_us"] for r, _, _ in busy) * 1e-6
    clean = [
        own / (r["dur_us"] * 1e-6) - 1
        for k, (r, own, _) in enumerate(busy)
        if r["prefill_tokens"] == 0 and not (k + 1 < len(busy) and busy[k + 1][0]["prefill_behind"])
    ]
    by_kind: dict[str, list[float]] = {}
    for r, _, charged in busy:
        acc = by_kind.setdefault(_step_kind(r), [0, 0.0, 0.0])
        acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + charged, acc[2] + r["dur_us"] * 1e-6
    return {
        "busy_steps": len(busy),
        "busy_time_err": sum(c for _, _, c in busy) / meas - 1,
        # where the busy-time error sits: per kind of step, its sum's error and its share of
        # the phase's measured busy time
        "by_kind": {
            k: {"steps": n, "sum_err": c / m - 1, "of_busy_time": (c - m) / meas}
            for k, (n, c, m) in sorted(by_kind.items())
        },
        "clean_decode_steps": len(clean),
        "clean_decode_median_err": float(np.median(clean)) if clean else None,
        "clean_decode_p95_abs_err": float(np.percentile(np.abs(clean), 95)) if clean else None,
    }
