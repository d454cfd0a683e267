"""The held-out report of a calibrated `ProfileLatencyModel`: its error on whole steps it was
not fitted on.

A table's ``steps.csv`` splits its measured steps into ``train`` (calibration,
`simulator.latency.calibrate`) and ``test``; this report is what a table publishes about its
accuracy (``describe()['heldout']``, ``servesim profile``'s printout, the held-out floor of
shipped tables). It never refits anything: it reads the model's predictions.

Errors are relative, ``predicted / measured - 1``, against the statistic and clock the model was
fitted to (``measured_stat``), and also against each step's p10, the uncontended view of a step
whose samples CPU contention only ever lengthens. Steps are split by what sets the prediction:
the op sum (``gpu_bound``) or the fitted eager floor (``launch_bound``).
"""

from __future__ import annotations

from simulator.latency.calibrate import quantile, row_parts


def heldout_report(model, test_rows: list[dict], worst: int = 3) -> dict:
    """Median / p95 / max relative error on steps the model was not fitted on, worst first."""
    if not test_rows:
        return {"test_steps": 0}
    errs, vs_p10, bound = [], [], []
    for r in test_rows:
        lin, floor = row_parts(model, r)
        pred = max(lin, floor)
        errs.append((pred / model.measured(r) - 1.0, r, pred))
        vs_p10.append(abs(pred / model.measured(r, "p10_us") - 1.0))
        bound.append(floor > lin)
    absv = [abs(e[0]) for e in errs]
    by_bound = {}
    for name, want in (("gpu_bound", False), ("launch_bound", True)):
        sub = [a for a, b in zip(absv, bound, strict=True) if b == want]
        by_bound[name] = {"steps": len(sub), "median_abs_err": quantile(sub, 0.5)}
        by_bound[name]["p95_abs_err"] = quantile(sub, 0.95)
    errs.sort(key=lambda e: -abs(e[0]))
    return {
        "test_steps": len(errs),
        "measured_stat": model.measured_column(),
        "median_abs_err": quantile(absv, 0.5),
        "p95_abs_err": quantile(absv, 0.95),
        "max_abs_err": round(max(absv), 5),
        **by_bound,
        "vs_measured_p10": {
            "median_abs_err": quantile(vs_p10, 0.5),
            "p95_abs_err": quantile(vs_p10, 0.95),
        },
        "worst": [_worst_row(model, r, p, e) for e, r, p in errs[:worst]],
    }


def _worst_row(model, r: dict, pred: float, err: float) -> dict:
    """One steps.csv row of the report's worst list: its composition, measured and predicted."""
    return {
        "kind": r["kind"],
        "prefill_tokens": int(r["prefill_tokens"]),
        "prefill_seqs": int(r["prefill_seqs"]),
        "mean_prefill_ctx": round(
            r["prefill_attn"] / r["prefill_tokens"]
            - (r["prefill_tokens"] / max(1, r["prefill_seqs"]) + 1) / 2
        )
        if r["prefill_tokens"]
        else 0,
        "decode_seqs": int(r["decode_seqs"]),
        "decode_ctx": int(r["decode_ctx"]),
        "measured_ms": round(model.measured(r) * 1e3, 3),
        "predicted_ms": round(pred * 1e3, 3),
        "rel_err": round(err, 4),
    }
