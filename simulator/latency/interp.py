"""Interpolation on sorted Python lists, shared by the grid builders and the hot path.

Pure Python on purpose: `simulator.latency.profiled`'s ``step_time`` calls `locate` a few times
per simulated step, and a bisect on a list plus float arithmetic costs far less there than any
numpy call. No function here allocates beyond its result.

Invariants: every ``xs`` is sorted ascending with no repeats (the caller builds it so; `locate`
divides by neighbouring differences); `cummax` never lowers a value, so projecting a measured
series onto a monotone one only lifts its dips.
"""

from __future__ import annotations

import math
from bisect import bisect_right


def locate(xs: list[float], x: float) -> tuple[int, float, bool]:
    """Index i and weight w with x ~ xs[i] + w (xs[i+1]-xs[i]); out=True when x is off the grid.

    Below the grid w is clamped to 0 (callers clamp, which overestimates tiny work); above the
    grid w > 1 extrapolates linearly along the last segment.
    """
    n = len(xs)
    if n == 1:
        return 0, 0.0, x > xs[0]
    i = bisect_right(xs, x) - 1
    if i < 0:
        return 0, 0.0, False
    if i >= n - 1:
        i = n - 2
        w = (x - xs[i]) / (xs[i + 1] - xs[i])
        return i, w, w > 1.0
    return i, (x - xs[i]) / (xs[i + 1] - xs[i]), False


def cummax(vals: list[float]) -> list[float]:
    """Running maximum: the least non-decreasing series at or above ``vals``."""
    out, m = [], -math.inf
    for v in vals:
        m = max(m, v)
        out.append(m)
    return out


def interp1(xs: list[float], ys: list[float], x: float) -> float:
    """ys at x, linear between grid points (clamped below, extrapolated above), never < 0."""
    i, w, _ = locate(xs, x)
    if len(xs) == 1:
        return ys[0]
    a, b = ys[i], ys[i + 1]
    return max(0.0, a + (b - a) * w)


def fill_nan(vals: list[float], xs: list[float] | None = None, scale: bool = False):
    """Fill NaN gaps: from the nearest measured neighbour, scaled by x ratio when ``scale``."""
    idx = [i for i, v in enumerate(vals) if not math.isnan(v)]
    if not idx:
        return vals
    out = list(vals)
    for i, v in enumerate(vals):
        if not math.isnan(v):
            continue
        near = min(idx, key=lambda j: abs(j - i))
        f = 1.0
        if scale and xs is not None and xs[near] > 0:
            f = xs[i] / xs[near]
        out[i] = vals[near] * f
    return out
