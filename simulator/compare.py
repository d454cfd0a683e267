"""``servesim compare A B``: metrics of two results side by side, with deltas (B - A).

A and B are each a run folder, a folder of ``seedN`` runs, or a sweep folder (``index.csv``; its
points are matched by name). With several seeds on both sides a metric is the mean over seeds,
and p95 TTFT and goodput get a bootstrap confidence interval on the difference of means:

* the unit resampled is the seed (runs of different seeds are independent; requests within a run
  are not, as they share queues), 10,000 resamples by default, percentile interval;
* paired when both sides have the same seeds (same seed = same arrivals and lengths, so the
  per-seed differences cancel the workload's noise), otherwise each side is resampled alone;
* the bootstrap generator is seeded (``--seed``), so the output is deterministic;
* "significant" means the interval excludes 0. With fewer than 5 seeds a percentile interval is
  too narrow; the table says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.collect import (
    MAIN_METRICS,
    describe_setup,
    direction,
    headline,
    load_index,
    load_summary,
    seed_runs,
)
from simulator.errors import ConfigError

CI_METRICS = ("ttft_p95_s", "goodput_rps")


def bootstrap_diff(a, b, *, resamples: int = 10000, level: float = 0.95, seed: int = 0,
                   paired: bool = False) -> tuple[float, float, float]:  # fmt: skip
    """mean(b) - mean(a) and its percentile bootstrap interval (lo, hi)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    diff = float(b.mean() - a.mean())
    if paired:
        if a.size != b.size:
            raise ValueError("paired bootstrap needs equal sizes")
        d = b - a
        boots = d[rng.integers(0, d.size, (resamples, d.size))].mean(axis=1)
    else:
        ma = a[rng.integers(0, a.size, (resamples, a.size))].mean(axis=1)
        mb = b[rng.integers(0, b.size, (resamples, b.size))].mean(axis=1)
        boots = mb - ma
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return diff, float(lo), float(hi)


def collect_side(folder: Path) -> dict[str, dict[int, dict]]:
    """{point: {seed: headline metrics}} of a run, a seed folder or a sweep folder."""
    folder = Path(folder)
    index = load_index(folder)
    out: dict[str, dict[int, dict]] = {}
    if index is not None:
        for _, row in index[index["status"] == "done"].iterrows():
            point = row["point"] if isinstance(row["point"], str) else ""
            run = folder / row["folder"]
            out.setdefault(point, {})[int(row["seed"])] = headline(load_summary(run))
        if out:
            return out
    runs = seed_runs(folder)
    if not runs:
        raise ConfigError(str(folder), "", "no results here (no summary.json, seedN/ or index.csv)")
    return {"": {s: headline(load_summary(r)) for s, r in runs.items()}}


def compare(a: Path, b: Path, *, resamples: int = 10000, seed: int = 0,
            level: float = 0.95) -> str:  # fmt: skip
    side_a, side_b = collect_side(a), collect_side(b)
    lines = [f"A: {a}  [{_setup(a)}]", f"B: {b}  [{_setup(b)}]"]
    if len(side_a) == 1 and len(side_b) == 1:
        ra, rb = next(iter(side_a.values())), next(iter(side_b.values()))
        lines += _table(ra, rb)
        lines += _ci_lines(ra, rb, resamples, seed, level)
        return "\n".join(lines)
    common = [p for p in side_a if p in side_b]
    if not common:
        raise ConfigError(f"{a} / {b}", "", "the two sweeps have no point in common")
    only = sorted(set(side_a) ^ set(side_b))
    for point in common:
        lines.append("")
        lines.append(f"== {point or '(no swept keys)'}")
        lines += _table(side_a[point], side_b[point], CI_METRICS + ("slo_attainment",))
        lines += _ci_lines(side_a[point], side_b[point], resamples, seed, level)
    if only:
        lines.append(f"\npoints in only one side (not compared): {', '.join(only)}")
    return "\n".join(lines)


def _setup(folder: Path) -> str:
    folder = Path(folder)
    runs = seed_runs(folder)
    if not runs:
        index = load_index(folder)
        if index is None or index.empty:
            return "?"
        run = folder / index["folder"].iloc[0]
    else:
        run = runs[min(runs)]
    s = describe_setup(run)
    return f"{s['model']}, {s['gpu']} TP{s['tp']}, latency {s['latency']}"


def _mean(runs: dict[int, dict], metric: str):
    v = [r[metric] for r in runs.values() if r.get(metric) is not None]
    return float(np.mean(v)) if v else None


def _table(ra: dict, rb: dict, metrics=MAIN_METRICS) -> list[str]:
    na, nb = len(ra), len(rb)
    seeds = f"  (mean of {na} / {nb} seeds)" if max(na, nb) > 1 else ""
    head = f"{'metric':<22}{'A':>12}{'B':>12}{'B - A':>12}{'change':>9}{seeds}"
    out = [head, "-" * len(head.rstrip())]
    for m in metrics:
        va, vb = _mean(ra, m), _mean(rb, m)
        scale, name = (1000.0, f"{m[:-2]} (ms)") if _is_latency(m) else (1.0, m)
        if m == "slo_attainment":
            scale, name = 100.0, "slo_attainment (%)"
        cells = [_num(va, scale), _num(vb, scale)]
        if va is None or vb is None:
            cells += ["-", "-"]
            verdict = ""
        else:
            d = vb - va
            rel = f"{d / abs(va) * 100:+.1f}%" if va else ("0%" if d == 0 else "n/a")
            cells += [_num(d, scale, sign=True), rel]
            sgn = direction(m) * np.sign(d)
            verdict = {1: "  better", -1: "  worse"}.get(int(sgn), "") if d else ""
        out.append(f"{name:<22}{cells[0]:>12}{cells[1]:>12}{cells[2]:>12}{cells[3]:>9}{verdict}")
    return out


def _ci_lines(ra: dict, rb: dict, resamples: int, seed: int, level: float) -> list[str]:
    if len(ra) < 2 or len(rb) < 2:
        return ["(one seed on a side: no confidence interval; add `seeds: [0, 1, 2, ...]`)"]
    paired = sorted(ra) == sorted(rb)
    keys = sorted(ra) if paired else None
    out = [
        f"bootstrap {level * 100:.0f}% CI of B - A over seeds ({resamples} resamples, "
        f"{'paired by seed' if paired else 'unpaired'}, bootstrap seed {seed}):"
    ]
    for m in CI_METRICS:
        a = [ra[k][m] for k in (keys or ra)]
        b = [rb[k][m] for k in (keys or rb)]
        if any(v is None for v in a + b):
            out.append(f"  {m}: undefined in some run")
            continue
        d, lo, hi = bootstrap_diff(a, b, resamples=resamples, level=level, seed=seed,
                                   paired=paired)  # fmt: skip
        scale, unit = (1000.0, " ms") if _is_latency(m) else (1.0, " req/s")
        sig = "significant" if lo > 0 or hi < 0 else "not significant"
        out.append(
            f"  {m[:-2] if _is_latency(m) else m}: {d * scale:+.4g}{unit}  "
            f"[{lo * scale:+.4g}, {hi * scale:+.4g}]  {sig}"
        )
    if min(len(ra), len(rb)) < 5:
        out.append("  note: fewer than 5 seeds; percentile intervals are too narrow, add seeds")
    return out


def _is_latency(metric: str) -> bool:
    return metric.endswith("_s") and direction(metric) == -1


def _num(v, scale: float = 1.0, sign: bool = False) -> str:
    if v is None:
        return "-"
    x = v * scale
    plus = "+" if sign else ""
    return f"{x:{plus},.0f}" if abs(x) >= 10000 else f"{x:{plus}.4g}"
