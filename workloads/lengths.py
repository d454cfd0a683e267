"""Length distributions: how many prompt and output tokens each synthetic request has.

Why these four: fixed and uniform for controlled sweeps, lognormal for the heavy right tail that
real prompt/output lengths show (given by its mean and CV, the numbers people quote), and
empirical to resample a real length column (a Vidur/Etalon CSV or a trace).

Invariant: ``sample(rng, n)`` returns ``n`` int64 values >= 1, drawn only from ``rng``, and is
prefix-stable (the first k values do not depend on n for the same generator state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator.cfg import Section
from workloads.loaders import TraceFormatError, read_length_column
from workloads.paths import resolve_file

# Lognormal draws above this are clipped even without ``max``: it keeps int64 safe and is far
# beyond any real context length.
HARD_MAX_TOKENS = 2**40

DISTS = ("fixed", "uniform", "lognormal", "empirical")


@dataclass(frozen=True)
class Fixed:
    """Every request has exactly ``value`` tokens."""

    value: int

    def __post_init__(self):
        if self.value < 1:
            raise ValueError(f"value must be >= 1, got {self.value}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed(value={self.value})"


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [low, high], both ends included."""

    low: int
    high: int

    def __post_init__(self):
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got {self.low}, {self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, n, endpoint=True, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform(low={self.low}, high={self.high})"


@dataclass(frozen=True)
class LogNormal:
    """Lognormal draws rounded to the nearest integer, then clipped to [low, high].

    ``mu``/``sigma`` are the parameters of the underlying normal; build it with ``from_mean``
    to give the distribution's own mean and CV instead. Clipping (not redrawing) moves the mean
    a little when the bounds bite; the realized mean is reported in ``Workload.info``.
    """

    mu: float
    sigma: float
    low: int = 1
    high: int | None = None
    label: str = ""

    def __post_init__(self):
        if not (self.sigma > 0 and 1 <= self.low and (self.high is None or self.high >= self.low)):
            raise ValueError(f"need sigma > 0 and 1 <= low <= high: {self}")

    @classmethod
    def from_mean(
        cls,
        mean: float,
        *,
        cv: float | None = None,
        sigma: float | None = None,
        low: int = 1,
        high: int | None = None,
    ) -> LogNormal:
        """Lognormal with mean ``mean`` and either its CV ``cv`` or the log-space ``sigma``.

        CV and sigma are linked by sigma^2 = ln(1 + cv^2); mu = ln(mean) - sigma^2 / 2.
        """
        if (cv is None) == (sigma is None):
            raise ValueError("give exactly one of cv and sigma")
        if sigma is None:
            sigma = math.sqrt(math.log1p(cv * cv))
        mu = math.log(mean) - sigma * sigma / 2
        given = f"cv={cv}" if cv is not None else f"sigma={sigma}"
        bounds = f", min={low}" + (f", max={high}" if high is not None else "")
        return cls(mu, sigma, low, high, f"lognormal(mean={mean}, {given}{bounds})")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = np.rint(rng.lognormal(self.mu, self.sigma, n))
        high = HARD_MAX_TOKENS if self.high is None else self.high
        return np.clip(draws, self.low, high).astype(np.int64)

    def describe(self) -> str:
        return self.label or f"lognormal(mu={self.mu}, sigma={self.sigma})"


@dataclass(frozen=True, eq=False)
class Empirical:
    """Values drawn uniformly, with replacement, from a column of real lengths (all >= 1)."""

    values: np.ndarray = field(repr=False)
    label: str = "empirical"

    def __post_init__(self):
        if len(self.values) == 0 or np.min(self.values) < 1:
            raise ValueError("empirical values must be a non-empty array of ints >= 1")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, len(self.values), n)]

    def describe(self) -> str:
        return self.label


LengthDist = Fixed | Uniform | LogNormal | Empirical


def parse_length_dist(sec: Section, base_dir: Path) -> LengthDist:
    """Read one ``{dist: ..., ...}`` mapping (e.g. ``workload.lengths.input``) and check it."""
    dist = sec.str("dist", choices=DISTS)
    if dist == "fixed":
        out = Fixed(sec.int("value", min=1))
    elif dist == "uniform":
        low = sec.int("low", min=1)
        high = sec.int("high", min=1)
        if high < low:
            raise sec.error("high", f"expected high >= low ({low}), got {high}")
        out = Uniform(low, high)
    elif dist == "lognormal":
        out = _parse_lognormal(sec)
    else:
        text, path = resolve_file(sec, "path", base_dir)
        column = sec.str("column")
        try:
            values = read_length_column(path, column)
        except TraceFormatError as exc:
            raise sec.error("path", exc.one_line()) from None
        out = Empirical(values, f"empirical({text}:{column}, {len(values)} values)")
    sec.done()
    return out


def _parse_lognormal(sec: Section) -> LogNormal:
    mean = sec.num("mean", min=0, strict_min=True)
    cv = sec.num("cv", None, min=0, strict_min=True)
    sigma = sec.num("sigma", None, min=0, strict_min=True)
    if (cv is None) == (sigma is None):
        raise sec.error("cv", "give exactly one of cv and sigma")
    low = sec.int("min", 1, min=1)
    high = sec.int("max", None, min=1)
    if high is not None and high < low:
        raise sec.error("max", f"expected max >= min ({low}), got {high}")
    return LogNormal.from_mean(mean, cv=cv, sigma=sigma, low=low, high=high)
