"""vLLM against itself: the client-side metrics of two serving replays of the same arrivals.

Why: the validation compares one simulation with one replay, metric by metric (a percentile of
TTFT, TPOT, ITL or E2E, or throughput). A replay is one draw of the engine's timing: launches
wait on the host's CPU, and near saturation queueing amplifies a few percent of step time into
tens of percent on tails. Replaying the same arrivals again (on the same machine minutes later,
or on another machine of the same kind) measures how far vLLM lands from itself on each of
those metrics: the scale any single comparison can resolve (validation/vllm-0.24/README.md,
"vLLM against itself").

Both runs are read as the report reads a real run (`profiles.vllm_validate.real_metrics`, vLLM's
benchmark definitions) and compared as ``b / a - 1``, ``a`` the reference (the replay the
simulator is validated on). Two runs of other arrivals or another served model are refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from profiles.vllm_validate import METRICS, load_phase, real_metrics
from simulator.errors import ConfigError

#: fingerprint fields two replays must share to be the same experiment
SAME = ("arrivals_sha256_16", "num_requests", "model", "gpu", "tp", "engine")


def check_same_arrivals(fa: dict, fb: dict, where: str) -> None:
    """Refuse two replays whose fingerprints differ on a field of `SAME` (``where``: the second
    run's file, named in the error)."""
    for key in SAME:
        if key in fa and fa.get(key) != fb.get(key):
            raise ConfigError(where, f"fingerprint.{key}",
                              f"expected {fa[key]!r} (as in the first run), got {fb.get(key)!r}: "
                              "not a replay of the same experiment")  # fmt: skip


def metric_values(phase: dict) -> dict[str, float]:
    """``{"ttft_s.p95": seconds, ...}`` of a replay phase: every metric of `METRICS`."""
    m = real_metrics(phase)
    return {f"{sec}.{st}": float(m[sec][st]) for sec, st in METRICS}


def compare_phases(pa: dict, pb: dict, where: str) -> dict:
    """One case: each metric's two values and ``err = b / a - 1``, with the case's median and
    largest ``|err|`` (the shape of a validation report's case, so its tables read it)."""
    check_same_arrivals(pa.get("fingerprint", {}), pb.get("fingerprint", {}), where)
    va, vb = metric_values(pa), metric_values(pb)
    rows = [{"metric": k, "a": va[k], "b": vb[k], "err": vb[k] / va[k] - 1} for k in va]
    errs = np.abs([r["err"] for r in rows])
    return {"metrics": rows, "median_abs_err": float(np.median(errs)),
            "max_abs_err": float(errs.max())}  # fmt: skip


def compare_runs(run_a: Path, run_b: Path, cases: list[str]) -> dict[str, dict]:
    """`compare_phases` for every case stored in both run folders (``<case>.json.gz``); a case
    stored in one only is skipped; none in common is a ConfigError naming ``run_b``."""
    out = {}
    for case in cases:
        fa, fb = run_a / f"{case}.json.gz", run_b / f"{case}.json.gz"
        if fa.is_file() and fb.is_file():
            out[case] = compare_phases(load_phase(fa), load_phase(fb), str(fb))
    if not out:
        want = ", ".join(cases)
        raise ConfigError(str(run_b), "", f"no case stored in both runs (expected "
                          f"<case>.json.gz for one of {want} beside {run_a})")  # fmt: skip
    return out


def with_replays(case: dict, first: dict, others: list[tuple[str, dict]]) -> dict:
    """A validation report's ``case`` (`profiles.vllm_validate.report_case`, against the replay
    ``first``) with the other replays of the same arrivals beside it: per metric the others'
    values (``replays``), their differences from ``first`` (``replay_errs``, ``b / a - 1``) and
    whether the simulated value lies between the smallest and the largest replay
    (``sim_within_replays``); and ``replay_spread``: the median and largest |difference| over
    every metric and other replay, to read the simulator's error against. ``others``: (file,
    phase) pairs, each refused if its fingerprint differs from ``first``'s."""
    vals = []
    for where, phase in others:
        check_same_arrivals(first.get("fingerprint", {}), phase.get("fingerprint", {}), where)
        vals.append(metric_values(phase))
    for m in case["metrics"]:
        theirs = [v[m["metric"]] for v in vals]
        every = [m["real"], *theirs]
        m["replays"] = theirs
        m["replay_errs"] = [v / m["real"] - 1 for v in theirs]
        m["sim_within_replays"] = bool(min(every) <= m["sim"] <= max(every))
    diffs = np.abs([e for m in case["metrics"] for e in m["replay_errs"]])
    case["replay_spread"] = {"replays": 1 + len(others),
                             "median_abs_diff": float(np.median(diffs)) if len(diffs) else 0.0,
                             "max_abs_diff": float(diffs.max()) if len(diffs) else 0.0}  # fmt: skip
    return case


__all__ = [
    "with_replays",
    "compare_runs",
    "compare_phases",
    "check_same_arrivals",
    "metric_values",
    "SAME",
]


def beyond_ratio(sim: list[float], oracle: list[float], miss: float) -> str:
    """How many of ``sim``'s errors lie beyond ``miss`` over how many of ``oracle``'s do (the
    same reference values), as ``"1.13x"``; ``"-"`` when the oracle has none. Why: the floor
    proposed for issue 13 reads on this ratio (servesim's misses against vLLM's own)."""
    o = sum(abs(e) > miss for e in oracle)
    return f"{sum(abs(e) > miss for e in sim) / o:.2f}x" if o else "-"


def leave_one_out(
    values: dict[str, dict[str, dict[str, float]]], min_others: int = 2
) -> list[tuple[str, str, str, float]]:
    """vLLM predicting itself: each run of ``values`` (run -> case -> metric -> value) in turn
    is the reference, and each of its values is predicted by the median of the other runs'
    values of the same case and metric. Returns ``(reference run, case, metric, median / value -
    1)`` for every case held by at least ``min_others`` other runs (fewer: skipped; one other
    would be a replay pair, `compare_phases`). Why: the error of this "oracle" against one replay
    is what no prediction of the expected timing can be expected to beat, so it is the scale a
    simulator's error against one replay reads on (validation/vllm-0.24/README.md)."""
    out = []
    for ref, cases in values.items():
        for case, ref_vals in cases.items():
            others = [v[case] for run, v in values.items() if run != ref and case in v]
            if len(others) < min_others:
                continue
            for metric, v in ref_vals.items():
                out.append(
                    (ref, case, metric, float(np.median([o[metric] for o in others])) / v - 1)
                )
    return out
