"""Arrival processes: when requests arrive.

Why renewal processes: serving benchmarks (vLLM's ``benchmark_serving``, Vidur, DistServe) drive
load with Poisson or gamma inter-arrival gaps, or replay a trace's own timestamps. Each process
here draws only from the ``numpy.random.Generator`` it is given (the run's arrival stream), never
from global state, so the same seed gives the same times.

Invariants of every time array returned here:

* float64 seconds, non-decreasing;
* synthetic processes put the first request at t = 0 and draw n - 1 gaps for n requests;
* prefix-stable: the first k times do not depend on how many were asked for, or on whether they
  were asked for by count (``times``) or by horizon (``times_until``), for the same generator
  state. So adding ``limits.duration_s`` or raising ``num_requests`` never moves earlier requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class TooManyArrivals(ValueError):
    """More arrivals than the caller's cap would be needed (e.g. a huge rate x duration)."""


@dataclass(frozen=True)
class _Renewal:
    """A renewal process: i.i.d. gaps with mean 1 / rate_per_s."""

    rate_per_s: float

    name = "renewal"

    def __post_init__(self):
        if not (self.rate_per_s > 0 and np.isfinite(self.rate_per_s)):
            raise ValueError(f"rate_per_s must be finite and > 0, got {self.rate_per_s}")

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` arrival times; the first is 0."""
        if n <= 0:
            return np.zeros(0)
        return np.cumsum(np.concatenate(([0.0], self.gaps(rng, n - 1))))

    def times_until(self, rng: np.random.Generator, horizon_s: float, max_n: int) -> np.ndarray:
        """All arrival times <= ``horizon_s`` (first at 0); ``TooManyArrivals`` beyond ``max_n``.

        Gaps are drawn in chunks; each chunk's cumulative sum starts from the previous time, so
        the additions happen in the same order as in ``times`` and the values are bit-identical.
        """
        expected = horizon_s * self.rate_per_s
        if expected > 2 * max_n:  # fail before allocating: the count is ~ expected
            raise TooManyArrivals(
                f"about {expected:.3g} arrivals before {horizon_s} s, more than {max_n}"
            )
        chunk = int(min(max_n, expected * 1.1)) + 64
        parts = [np.zeros(1)]
        count, last = 1, 0.0
        while last <= horizon_s:
            if count > max_n:
                raise TooManyArrivals(f"more than {max_n} arrivals before {horizon_s} s")
            part = np.cumsum(np.concatenate(([last], self.gaps(rng, chunk))))[1:]
            parts.append(part)
            count += chunk
            last = float(part[-1])
        out = np.concatenate(parts)
        out = out[: np.searchsorted(out, horizon_s, side="right")]
        if len(out) > max_n:
            raise TooManyArrivals(f"{len(out)} arrivals before {horizon_s} s, more than {max_n}")
        return out

    def describe(self) -> dict:
        return {"arrival": self.name, "rate_per_s": self.rate_per_s}


@dataclass(frozen=True)
class Poisson(_Renewal):
    """Exponential gaps: memoryless arrivals (CV of gaps = 1)."""

    name = "poisson"

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate_per_s, n)


@dataclass(frozen=True)
class Gamma(_Renewal):
    """Gamma gaps with mean 1 / rate and coefficient of variation ``cv`` (shape = 1 / cv^2).

    cv > 1 is burstier than Poisson, cv < 1 smoother, cv = 1 is Poisson.
    """

    cv: float = 1.0

    name = "gamma"

    def __post_init__(self):
        super().__post_init__()
        if not (self.cv > 0 and np.isfinite(self.cv)):
            raise ValueError(f"cv must be finite and > 0, got {self.cv}")

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (self.rate_per_s * shape), n)

    def describe(self) -> dict:
        return {**super().describe(), "cv": self.cv}


@dataclass(frozen=True)
class Constant(_Renewal):
    """Evenly spaced arrivals: request k arrives at exactly k / rate (no accumulated error)."""

    name = "constant"

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate_per_s)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.arange(max(n, 0)) / self.rate_per_s

    def times_until(self, rng: np.random.Generator, horizon_s: float, max_n: int) -> np.ndarray:
        n = int(np.floor(horizon_s * self.rate_per_s)) + 2
        if n > max_n + 2:
            raise TooManyArrivals(f"more than {max_n} arrivals before {horizon_s} s")
        out = self.times(rng, n)
        out = out[out <= horizon_s]
        if len(out) > max_n:
            raise TooManyArrivals(f"{len(out)} arrivals before {horizon_s} s, more than {max_n}")
        return out


PROCESSES = {"poisson": Poisson, "gamma": Gamma, "constant": Constant}


def poisson_arrivals(rng: np.random.Generator, n: int, rate_per_s: float) -> np.ndarray:
    """``n`` Poisson arrival times at mean rate ``rate_per_s``, first at 0."""
    return Poisson(rate_per_s).times(rng, n)


def gamma_arrivals(rng: np.random.Generator, n: int, rate_per_s: float, cv: float) -> np.ndarray:
    """``n`` gamma-renewal arrival times at mean rate ``rate_per_s`` and gap CV ``cv``."""
    return Gamma(rate_per_s, cv).times(rng, n)


def constant_arrivals(n: int, rate_per_s: float) -> np.ndarray:
    """``n`` arrival times exactly ``1 / rate_per_s`` apart, first at 0."""
    return Constant(rate_per_s).times(None, n)


# ---------------------------------------------------------------------------- trace replay


def replay_arrivals(timestamps_s: np.ndarray, rate_scale: float = 1.0) -> np.ndarray:
    """A trace's own times with the rate multiplied by ``rate_scale`` (times / rate_scale).

    Scaling divides every time, so the span shrinks by exactly ``rate_scale`` and the burst
    structure (relative gaps) is kept.
    """
    if not (rate_scale > 0 and np.isfinite(rate_scale)):
        raise ValueError(f"rate_scale must be finite and > 0, got {rate_scale}")
    times = np.asarray(timestamps_s, dtype=np.float64)
    return times / rate_scale if rate_scale != 1.0 else times.copy()


def spread_quantized(timestamps_s: np.ndarray, window_s: float) -> np.ndarray:
    """Spread requests that share a timestamp evenly over the window that follows it.

    For traces whose clock was quantized (Mooncake's conversation trace: 3 s steps), the m
    requests stamped t arrive at t + w * j / m, j = 0..m-1, where w = min(window_s, next distinct
    timestamp - t). Deterministic (no RNG) and order-preserving; singletons do not move.
    Requires non-decreasing input.
    """
    times = np.asarray(timestamps_s, dtype=np.float64)
    if window_s <= 0 or len(times) == 0:
        return times.copy()
    if np.any(np.diff(times) < 0):
        raise ValueError("timestamps must be non-decreasing")
    starts = np.flatnonzero(np.r_[True, times[1:] != times[:-1]])
    counts = np.diff(np.r_[starts, len(times)])
    group_t = times[starts]
    widths = np.minimum(window_s, np.r_[np.diff(group_t), window_s])
    group = np.repeat(np.arange(len(starts)), counts)
    rank = np.arange(len(times)) - starts[group]
    return group_t[group] + widths[group] * rank / counts[group]


def repeat_period(timestamps_s: np.ndarray) -> float:
    """The period for cycling a trace: its span plus one mean gap, span * n / (n - 1).

    So the first request of a new cycle follows the last one of the previous cycle by the mean
    gap, and the mean rate of the repeated trace equals the trace's own.
    """
    times = np.asarray(timestamps_s, dtype=np.float64)
    span = float(times[-1] - times[0]) if len(times) else 0.0
    if len(times) < 2 or span <= 0:
        raise ValueError("a trace needs at least two distinct timestamps to be repeated")
    return span * len(times) / (len(times) - 1)


def repeat_arrivals(timestamps_s: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` times of the trace repeated end to end (cycle k is shifted by k periods)."""
    times = np.asarray(timestamps_s, dtype=np.float64)
    period = repeat_period(times)
    index = np.arange(n)
    return times[index % len(times)] + (index // len(times)) * period
