"""Decode steps run slow for tens of milliseconds after a long prefill: the GPU clock dips.

Measured through vLLM on H200s (profiles/README.md, "Decode after a long prefill"): a
decode-only step that starts right after a prefill step of 1,024+ tokens takes longer than the
same composition in a steady decode, and the excess decays with *time* since that prefill, not
with steps: Llama-3-8B int4 (GPTQ, Machete) +11% at once, +4% after 30 ms, 0 after ~70 ms;
Llama-3.1-8B bf16 +5% -> 0; Llama-3-70B int4 +19% -> 0 after ~110 ms; H200 fp8 +0.5%. Steps
after prefills of 256-1,023 tokens show none (-0.3..+0.8% on five tables). The cause is the SM
clock: a compute-bound burst pulls it down (1,965 -> 1,500 MHz for 27 ms after 200 ms of
8,192-row GEMMs, `profiles/h200/diag_post_prefill/`), and it climbs back while the memory-bound
decode runs; kernels whose time depends on the SM clock (int4's in-kernel dequantization most)
show it most. A composition feature cannot see it, so the latency model carries this small
piece of history.

The model: a *heat* ``h`` in [0, 1] per replica. A prefill step of ``min_prefill_tokens`` or
more lasting ``d`` seconds heats it, ``h <- 1 - (1 - h) * exp(-d / rise_s)``; it then cools,
``h(t) = h_end * exp(-(t - t_end) / recover_s)``, whatever else runs. A decode-only step that
starts at ``t`` takes ``1 + excess * h(t)`` times its steady time. Other steps are unchanged:
their fits already hold the state a prefill runs in. Once ``excess * h`` is under
``NEGLIGIBLE`` the factor is exactly 1, so a replica's coalesced decode runs and its
step-by-step execution charge the same floats (`simulator.executor.SimulatedExecutor`).

``excess``, ``rise_s`` and ``recover_s`` are fitted per table on its training decode steps
(`fit_clock_dip`); the held-out report judges the steps it never saw with the dip applied.

Invariants: the factor is >= 1 and non-increasing in the time since the last heating step; a
table whose fitted excess is under ``MIN_EXCESS`` has no dip (None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: a prefill step heats the GPU when it carries this many prompt tokens or more
HEAT_MIN_TOKENS = 1024
#: below this excess a decode step's factor is exactly 1 (and decode runs coalesce again)
NEGLIGIBLE = 1e-3
#: a fitted excess at full heat below this is no dip
MIN_EXCESS = 0.005
#: the time constants the fit tries (seconds): how fast a burst heats, how fast it cools
RISE_GRID_S = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
RECOVER_GRID_S = (0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12)


@dataclass(frozen=True)
class ClockDip:
    """A table's fitted dip (module docstring): fraction ``excess`` at full heat."""

    excess: float
    rise_s: float
    recover_s: float
    min_prefill_tokens: int = HEAT_MIN_TOKENS

    def factor(self, heat: float, since_s: float) -> float:
        """Multiplier of a decode-only step starting ``since_s`` after the last heating step
        ended with heat ``heat``."""
        e = self.excess * heat * math.exp(-since_s / self.recover_s)
        return 1.0 + e if e >= NEGLIGIBLE else 1.0

    def heated(self, heat: float, since_s: float, dur_s: float) -> float:
        """The heat after a heating step of ``dur_s`` that started ``since_s`` after the last
        one ended with ``heat``."""
        h0 = heat * math.exp(-since_s / self.recover_s)
        return 1.0 - (1.0 - h0) * math.exp(-dur_s / self.rise_s)

    def describe(self) -> dict:
        return {
            "excess": round(self.excess, 5),
            "rise_ms": self.rise_s * 1e3,
            "recover_ms": self.recover_s * 1e3,
            "min_prefill_tokens": self.min_prefill_tokens,
        }


class ClockState:
    """One replica's heat, advanced step by step in simulated time (`SimulatedExecutor`).

    ``until``: from then on every factor is exactly 1 (the excess has cooled under
    ``NEGLIGIBLE``), so the executor's per-step check is one comparison."""

    __slots__ = ("dip", "heat", "at", "until", "min_tokens")

    def __init__(self, dip: ClockDip):
        self.dip = dip
        self.heat = 0.0
        self.at = 0.0  # when the last heating step ended
        self.until = 0.0
        self.min_tokens = dip.min_prefill_tokens

    def factor(self, start: float) -> float:
        """Multiplier of a decode-only step starting at ``start``."""
        if start >= self.until:
            return 1.0
        return self.dip.factor(self.heat, start - self.at)

    def ran(self, start: float, dur_s: float, prefill_tokens: int) -> None:
        """A step with ``prefill_tokens`` prompt tokens ran from ``start`` for ``dur_s``."""
        if prefill_tokens >= self.min_tokens:
            dip = self.dip
            self.heat = dip.heated(self.heat, start - self.at, dur_s)
            self.at = start + dur_s
            peak = dip.excess * self.heat
            cool = dip.recover_s * math.log(peak / NEGLIGIBLE) if peak > NEGLIGIBLE else 0.0
            self.until = self.at + cool


def _row_starts(rows: list[dict]):
    """``(i, row, start, dur_s, cold)`` for each recorded step in order: its start is ``t_done -
    dur_us`` where the row has ``t_done`` (serving replays), else the previous step's end within
    its scenario (profiling tables, whose rows keep intervals only); ``cold`` where the heat
    starts over: at a new scenario and after an idle engine (``after_idle``: the gap is not
    recorded; assuming it cooled fully under-states the dip, never over-states it)."""
    clock, scen = 0.0, None
    for i, r in enumerate(rows):
        d = r["dur_us"] * 1e-6
        cold = False
        if "t_done" in r:
            start = r["t_done"] - d
        else:
            if r.get("scenario") != scen or r["after_idle"]:
                cold, clock = True, 0.0
            scen, start = r.get("scenario"), clock
        clock = start + d
        yield i, r, start, d, cold


def row_heats(rows: list[dict], rise_s: float, recover_s: float, min_tokens: int) -> np.ndarray:
    """The heat at the start of each recorded step (0 for steps with prompt tokens), the steps
    in recorded order, started as `_row_starts` says."""
    out = np.zeros(len(rows))
    heat, at = 0.0, 0.0
    for i, r, start, d, cold in _row_starts(rows):
        if cold:
            heat, at = 0.0, 0.0
        if not r["prefill_tokens"]:
            if heat:
                out[i] = heat * math.exp(-(start - at) / recover_s)
        elif r["prefill_tokens"] >= min_tokens:
            heat = 1.0 - (1.0 - heat * math.exp(-(start - at) / recover_s)) * math.exp(-d / rise_s)
            at = start + d
    return out


def row_factors(dip: ClockDip | None, rows: list[dict]) -> list[float]:
    """Each recorded step's multiplier under ``dip`` (all 1 without one), as `ClockState`
    would charge it."""
    if dip is None:
        return [1.0] * len(rows)
    heats = row_heats(rows, dip.rise_s, dip.recover_s, dip.min_prefill_tokens)
    return [dip.factor(float(h), 0.0) if h else 1.0 for h in heats]


class HeatLayout:
    """`row_heats` for many time constants over the same rows: the rows' starts and the chain
    of heating steps are read once (`_row_starts`, as `row_heats` reads them), then each pair
    of constants costs a loop over the heating steps only and one vectorized decay of the
    decode steps' heat (equal to `row_heats` to rounding: numpy's exp against math's)."""

    def __init__(self, rows: list[dict], min_tokens: int):
        n = len(rows)
        self.starts = np.zeros(n)
        self.last = np.full(n, -1)  # a decode step's latest heating step (index in `heavy`)
        self.heavy: list[tuple[float, float, int]] = []  # (start, dur, previous heating step)
        cur = -1
        for i, r, start, d, cold in _row_starts(rows):
            if cold:
                cur = -1
            if not r["prefill_tokens"]:
                self.starts[i], self.last[i] = start, cur
            elif r["prefill_tokens"] >= min_tokens:
                self.heavy.append((start, d, cur))
                cur = len(self.heavy) - 1
        self.warm = self.last >= 0

    def heats(self, rise_s: float, recover_s: float) -> np.ndarray:
        heat, at = np.zeros(len(self.heavy)), np.zeros(len(self.heavy))
        for j, (start, d, prev) in enumerate(self.heavy):
            h0 = heat[prev] * math.exp(-(start - at[prev]) / recover_s) if prev >= 0 else 0.0
            heat[j], at[j] = 1.0 - (1.0 - h0) * math.exp(-d / rise_s), start + d
        out = np.zeros(len(self.starts))
        w, k = self.warm, self.last[self.warm]
        out[w] = heat[k] * np.exp(-(self.starts[w] - at[k]) / recover_s)
        return out


def fit_clock_dip(rows: list[dict], fitted: list[bool], excess) -> ClockDip | None:
    """The dip that best explains ``excess`` (measured / steady prediction - 1) on the rows
    marked ``fitted`` (training decode-only steps), all ``rows`` in recorded order: for each
    pair of time constants on the grid, the least-absolute-error ``excess`` at full heat (the
    heat-weighted median of ``excess / heat``, clipped at 0), keeping the pair with the least
    total absolute error. None when the best excess is under ``MIN_EXCESS``."""
    mask = np.asarray(fitted, dtype=bool)
    y = np.asarray(excess, dtype=float)[mask]
    layout = HeatLayout(rows, HEAT_MIN_TOKENS)
    best = (float(np.abs(y).sum()), None)
    for rise in RISE_GRID_S:
        for recover in RECOVER_GRID_S:
            h = layout.heats(rise, recover)[mask]
            a = _weighted_median_ratio(y, h)
            err = float(np.abs(y - a * h).sum())
            if err < best[0]:
                best = (err, ClockDip(a, rise, recover))
    dip = best[1]
    return dip if dip is not None and dip.excess >= MIN_EXCESS else None


def _weighted_median_ratio(y: np.ndarray, h: np.ndarray) -> float:
    """``argmin_a sum |y - a h|`` over ``a >= 0`` (h >= 0): the h-weighted median of y / h."""
    on = h > 1e-6
    if not on.any():
        return 0.0
    r, w = y[on] / h[on], h[on]
    order = np.argsort(r, kind="stable")
    cum = np.cumsum(w[order])
    return max(0.0, float(r[order][np.searchsorted(cum, cum[-1] / 2)]))
