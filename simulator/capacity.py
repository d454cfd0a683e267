"""``servesim capacity``: the highest arrival rate a setup serves within its SLOs, per policy.

What ``--slo ttft_p95=0.5 --slo tpot_p95=0.05 --target 0.9`` means (seconds): a rate is
*feasible* when both hold in a run at that rate:

1. SLO attainment >= target: the fraction of arrived requests that completed with their own
   TTFT <= 0.5 s and TPOT <= 0.05 s is at least 90% (DistServe's attainment; rejected and
   unfinished requests count as misses). The limits go into the run's ``slo:`` section, so the
   run's goodput is measured against the same limits;
2. every named percentile meets its limit: the run's p95 TTFT <= 0.5 s and p95 TPOT <= 0.05 s
   (over completed requests). ``ttft=0.5`` (no percentile) adds the per-request limit only.

The rate is ``workload.arrival.rate_per_s`` (synthetic arrivals) or ``rate_scale`` (trace
replay). The search assumes feasibility falls with rate: from the file's rate it doubles (or
halves) until it brackets the boundary, then bisects until the bracket is within
``tolerance`` (relative). Every run is bounded (``workload.limits.max_requests``) and uses the
file's seed, so the same file gives the same answer.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import ConfigError

SLO_RE = re.compile(r"^(ttft|tpot)(?:_p(50|90|95|99))?=([0-9.eE+-]+)$")


@dataclass(frozen=True)
class SLO:
    metric: str  # ttft | tpot
    percentile: int | None
    limit_s: float

    def __str__(self) -> str:
        pct = f" p{self.percentile}" if self.percentile else ""
        return f"{self.metric.upper()}{pct} <= {self.limit_s * 1000:g} ms"


@dataclass(frozen=True)
class Probe:
    rate: float
    ok: bool
    attainment: float | None = None
    detail: str = ""
    metrics: dict = field(default_factory=dict, hash=False)


@dataclass
class Search:
    rate: float | None  # highest feasible rate found (None: even the lowest tried failed)
    bracket: tuple[float | None, float | None]
    probes: list[Probe]
    note: str = ""

    @property
    def runs(self) -> int:
        return len(self.probes)


def parse_slo(text: str) -> SLO:
    m = SLO_RE.match(text.strip())
    if not m:
        raise ConfigError("--slo", text, "expected METRIC[_pNN]=SECONDS, e.g. ttft_p95=0.5 "
                          "(metrics: ttft, tpot; percentiles: 50, 90, 95, 99)")  # fmt: skip
    limit = float(m.group(3))
    if not limit > 0:
        raise ConfigError("--slo", text, "the limit must be > 0 seconds")
    return SLO(m.group(1), int(m.group(2)) if m.group(2) else None, limit)


def search(
    evaluate: Callable[[float], Probe],
    start: float,
    *,
    tolerance: float = 0.02,
    max_runs: int = 30,
    min_rate: float = 1e-3,
    max_rate: float = 1e6,
) -> Search:
    """Bracket then bisect the boundary of a (assumed monotone) feasibility test on rates."""
    probes: list[Probe] = []
    seen: dict[float, Probe] = {}

    def probe(rate: float) -> Probe:
        if rate not in seen:
            seen[rate] = evaluate(rate)
            probes.append(seen[rate])
        return seen[rate]

    lo = hi = None
    rate = start
    if probe(rate).ok:
        lo = rate
        while len(probes) < max_runs and rate * 2 <= max_rate:
            rate *= 2
            if not probe(rate).ok:
                hi = rate
                break
            lo = rate
        if hi is None:
            return Search(lo, (lo, None), probes, "still feasible at the highest rate tried")
    else:
        hi = rate
        while len(probes) < max_runs and rate / 2 >= min_rate:
            rate /= 2
            if probe(rate).ok:
                lo = rate
                break
            hi = rate
        if lo is None:
            return Search(None, (None, hi), probes, "infeasible even at the lowest rate tried")
    while (hi - lo) > tolerance * hi and len(probes) < max_runs:
        mid = (lo + hi) / 2
        if probe(mid).ok:
            lo = mid
        else:
            hi = mid
    note = "" if (hi - lo) <= tolerance * hi else f"stopped after {max_runs} runs"
    return Search(lo, (lo, hi), probes, note)


# ------------------------------------------------------------------- running the simulator


def rate_key(config: dict) -> str:
    arrival = (config.get("workload") or {}).get("arrival") or {}
    if not isinstance(arrival, dict):
        return "rate_per_s"
    return "rate_scale" if arrival.get("process") == "trace" else "rate_per_s"


def start_rate(config: dict, where: str = "<capacity>") -> float:
    workload = config.get("workload")
    arrival = (workload.get("arrival") if isinstance(workload, dict) else None) or {}
    if not isinstance(arrival, dict):
        raise ConfigError(where, "workload.arrival", "expected a mapping with a rate to search")
    key = rate_key(config)
    value = arrival.get(key, 1.0 if key == "rate_scale" else None)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(where, f"workload.arrival.{key}", "needs a positive start rate")
    return float(value)


def probe_config(config: dict, slos: list[SLO], rate: float, max_requests: int) -> dict:
    cfg = copy.deepcopy(config)
    cfg["workload"]["arrival"][rate_key(config)] = rate
    limits = cfg["workload"].setdefault("limits", {}) or {}
    cfg["workload"]["limits"] = limits
    limits["max_requests"] = min(limits.get("max_requests") or max_requests, max_requests)
    slo = cfg.setdefault("slo", {}) or {}
    cfg["slo"] = slo
    for s in slos:
        slo[f"{s.metric}_ms"] = s.limit_s * 1000.0
    return cfg


def judge(summary: dict, slos: list[SLO], target: float) -> Probe:
    """Feasibility of one run's summary (see the module docstring)."""
    att = summary.get("slo_attainment")
    ok = att is not None and att >= target
    parts = [f"attainment {att * 100:.1f}%" if att is not None else "no requests"]
    metrics = {"slo_attainment": att}
    for s in slos:
        if s.percentile is None:
            continue
        v = (summary.get(f"{s.metric}_s") or {}).get(f"p{s.percentile}")
        metrics[f"{s.metric}_p{s.percentile}_s"] = v
        good = v is not None and v <= s.limit_s
        ok = ok and good
        parts.append(f"{s.metric} p{s.percentile} {v * 1000:.0f} ms" if v is not None else "-")
    return Probe(0.0, ok, att, ", ".join(parts), metrics)


def search_policy(job: tuple) -> tuple[str, Search]:
    """Worker: the capacity search of one policy (picklable arguments)."""
    from simulator.config import blame_overrides
    from simulator.runner import build, simulate

    config, where, base_dir, slos, target, max_requests, tolerance, max_runs, policy, sets = job

    def evaluate(rate: float) -> Probe:
        cfg = probe_config(config, slos, rate, max_requests)
        with blame_overrides(where, sets):
            built = build(cfg, where, Path(base_dir))
        summary = simulate(built).summary
        p = judge(summary, slos, target)
        print(f"  {policy}: rate {rate:.4g} -> {'ok' if p.ok else 'miss'} ({p.detail})",
              file=sys.stderr, flush=True)  # fmt: skip
        return Probe(rate, p.ok, p.attainment, p.detail, p.metrics)

    return policy, search(evaluate, start_rate(config, where), tolerance=tolerance,
                          max_runs=max_runs)  # fmt: skip


def _check_sections(raw: dict, where: str) -> None:
    """The sections a probe writes into (rate, request cap, SLO) are mappings, so that a bad
    file fails here, naming the key, instead of inside the first probe."""
    workload = raw.get("workload")
    if not isinstance(workload, dict):
        raise ConfigError(where, "workload", "expected a mapping (capacity searches its rate)")
    for key, value in (("workload.limits", workload.get("limits")), ("slo", raw.get("slo"))):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(where, key, f"expected a mapping, got {value!r}")


def capacity_cli(args) -> int:
    from simulator.config import TOOLING_KEYS, apply_overrides, load_yaml

    path = Path(args.file)
    raw = apply_overrides(load_yaml(path), args.set or [])
    slos = [parse_slo(s) for s in args.slo]
    if not 0 < args.target <= 1:
        raise ConfigError("--target", "", f"expected a fraction in (0, 1], got {args.target}")
    _check_sections(raw, str(path))
    if args.policies is not None:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ConfigError("--policies", "", f"expected policy names, got {args.policies!r}")
    else:
        swept = (raw.get("sweep") or {}).get("scheduler.policy")
        policies = swept or [(raw.get("scheduler") or {}).get("policy")]
    config = {k: v for k, v in raw.items() if k not in TOOLING_KEYS}
    start_rate(config, str(path))
    jobs = []
    for pol in policies:
        cfg = copy.deepcopy(config)
        cfg.setdefault("scheduler", {})["policy"] = pol
        jobs.append((cfg, str(path), str(path.parent), slos, args.target, args.max_requests,
                     args.tolerance, args.max_runs, pol, args.set))  # fmt: skip
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(search_policy, jobs))
    else:
        results = [search_policy(j) for j in jobs]
    unit = "x trace rate" if rate_key(config) == "rate_scale" else "req/s"
    print(f"capacity: {path}  SLO {', '.join(map(str, slos))}, attainment >= "
          f"{args.target * 100:g}%, <= {args.max_requests} requests per run")  # fmt: skip
    head = f"{'policy':<22}{'max rate':>12} {unit:<13}{'at it':<52}{'runs':>5}  bracket"
    print(head)
    print("-" * len(head))
    for pol, s in results:
        best = next((p for p in s.probes if p.rate == s.rate), None)
        rate = f"{s.rate:.4g}" if s.rate is not None else "none"
        lo, hi = s.bracket
        br = f"[{_r(lo)}, {_r(hi)})" + (f"  {s.note}" if s.note else "")
        print(f"{pol:<22}{rate:>12} {'':<13}{best.detail if best else '':<52}{s.runs:>5}  {br}")
    return 0


def _r(v) -> str:
    return "-" if v is None else f"{v:.4g}"
