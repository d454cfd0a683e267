"""How precisely a replay pins its own percentiles: a bootstrap over its requests.

A real run's TTFT p99 at a light load is the slowest 1% of ~60 requests; its ITL p99 is set by
the few dozen token gaps that fall behind a prefill. Such a percentile would come out
differently from another draw of the same workload, and a simulator cannot be held to a
precision the measurement does not have. This module resamples a run's requests with
replacement (each request keeps all its token gaps) and returns, per metric, the interval that
holds the middle ``level`` of the resampled percentiles.

What it is not: a run-to-run interval. Requests in one serving run interact (a slow prefill
delays everyone queued behind it), and a resample treats them as independent, so the interval
is a lower bound on how much a repeat of the run would move. A simulated value outside it is
not thereby wrong; one inside it cannot be told apart from the measurement by this run alone.

Deterministic: a fixed seed, and each metric is resampled with the same draws. Percentiles of a
resample are inverted-CDF (the smallest value whose cumulative weight reaches the quantile),
computed from each request's multiplicity without materializing the resample.
"""

from __future__ import annotations

import numpy as np

#: resamples per interval: the 5% / 95% bounds move by well under 1% of the value beyond this
RESAMPLES = 400
QUANTILES = (50, 95, 99)


def percentile_intervals(
    samples: dict[str, tuple[np.ndarray, np.ndarray]],
    num_requests: int,
    level: float = 0.9,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, list[float]]:
    """``{"<metric>.p50": [lo, hi], ...}`` for every metric in ``samples``: ``metric ->
    (values, owner)``, where ``owner[i]`` is the index (< ``num_requests``) of the request
    value ``i`` belongs to (one value per request for TTFT; one per token gap for ITL)."""
    if num_requests < 1:
        raise ValueError("percentile_intervals needs at least one request")
    rng = np.random.default_rng(seed)
    counts = np.stack(
        [np.bincount(rng.integers(0, num_requests, num_requests), minlength=num_requests)
         for _ in range(resamples)]
    )  # fmt: skip
    out = {}
    tail = (1.0 - level) / 2.0
    for name, (values, owner) in samples.items():
        order = np.argsort(values, kind="stable")
        v, own = values[order], owner[order]
        got: dict[int, list[float]] = {q: [] for q in QUANTILES}
        for c in counts:  # one resample at a time: a (resamples x gaps) matrix is ~0.5 GB
            cum = np.cumsum(c[own])
            if cum[-1] == 0:
                continue  # no drawn request has a value of this metric (e.g. TPOT of 1 token)
            for q in QUANTILES:
                got[q].append(weighted_quantile(v, cum, q / 100.0))
        for q in QUANTILES:
            g = np.asarray(got[q])
            out[f"{name}.p{q}"] = [float(np.quantile(g, tail)), float(np.quantile(g, 1 - tail))]
    return out


def weighted_quantile(values: np.ndarray, cum_weights: np.ndarray, u: float) -> float:
    """The inverted-CDF ``u``-quantile of ascending ``values`` whose weights sum cumulatively to
    ``cum_weights``: the smallest value whose cumulative weight reaches ``u`` of the total."""
    i = int(np.searchsorted(cum_weights, u * cum_weights[-1]))
    return float(values[min(i, len(values) - 1)])
