"""Number formatting shared by the profiling reports (`profile report`, `profile tables`,
`validate`): one place decides how a fraction prints and what a missing value shows."""

from __future__ import annotations

import math


def pct(x: float | None, signed: bool = False, missing: str = "n/a") -> str:
    """``x`` (a fraction) as a percentage with one decimal, ``+`` shown when ``signed``;
    ``missing`` for None or NaN (a statistic over no steps)."""
    if x is None or math.isnan(x):
        return missing
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"
