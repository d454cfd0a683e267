"""``servesim plan``: the cheapest deployment that meets latency SLOs at a target request rate.

A plan file (YAML, read strictly: an unknown key is an error naming the file and the key)::

    name: plan_llama70b
    experiment: {...}            # a base experiment (inline mapping, or a path to its YAML)
    target_rate_per_s: 50        # the load to serve (synthetic arrivals: workload.arrival)
    slo: {ttft_p95_ms: 2000, tpot_p95_ms: 100, attainment: 0.9}
    space:                       # dotted keys -> lists, as a sweep's grid (mappings merge)
      hardware.gpu: [h100-sxm, h200]
      hardware.tp: [2, 4, 8]
      model: [{base: llama-3-70b}, {base: llama-3-70b, weights: fp8, kv_cache_dtype: fp8}]
    search: {max_requests: 300, tolerance: 0.05, max_runs: 12, verify_top: 3}

Each point of the space is one *unit*: one replica (colocated), or one prefill + decode group
(``cluster.mode: disaggregated``, its P:D split as written). Why the search is cheap:

1. Pruned without simulating: a unit that does not fit in GPU memory, and a unit whose decode
   step of one request alone (the latency model at the workload's p95 prompt length) already
   exceeds the TPOT limit: batching only adds work to a step, so no load can meet the SLO.
2. The capacity bisection of ``servesim capacity`` (`simulator.capacity.search`) finds the
   unit's highest feasible rate (``slo.attainment`` of requests within both limits, and both p95
   limits), searching no higher than the target.
3. ASSUMPTION: round-robin routing scales linearly, so the deployment needs
   ``ceil(target / unit capacity)`` units; cost = GPUs x $/GPU-hour. The ``verify_top``
   cheapest are then simulated at the full target rate with that many units (and as many more
   requests), and the table says whether each passed; the answer is the cheapest that passed.

Energy is the second objective, reported beside the cost: each row carries the joules per
output token of the run its p95 latencies come from (summary.json's ``energy``: measured when
the unit's step table has power readings, else a TDP estimate, `simulator.energy`); the ranking
is by $/hour alone, as before. Results: ``OUT/units/<point>.json`` and
``OUT/verify/<point>.json`` (one file per search; ``--resume`` reuses those whose inputs hash
the same), ``OUT/plan.csv`` (ranked), ``OUT/plan.json`` and ``OUT/pareto.png`` (drawn from
plan.csv by `simulator.plots.plot_pareto`).
"""

from __future__ import annotations

import copy
import json
import math
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator.capacity import SLO, Probe, judge, probe_config, rate_key, search
from simulator.cfg import Section
from simulator.errors import ConfigError

#: Parts of the build errors that mean "this unit does not fit in GPU memory" (a prune, not a
#: mistake in the file): `hardware.kv_capacity_blocks` and `runner._check_fits`.
MEMORY_ERRORS = ("does not fit on", "the KV cache (")
#: Keys the plan derives itself, so the space may not set them.
DERIVED_KEYS = ("cluster.replicas", "cluster.prefill.replicas", "cluster.decode.replicas")
ENERGY_NOTE = (
    "energy: J/tok is joules per output token of the run each row's latencies come from "
    "(energy_source: a measured table, or tdp_estimate: busy time x TDP, idle not counted); "
    "the ranking is by $/hour only"
)


@dataclass(frozen=True)
class PlanSpec:
    """A plan file, read and checked."""

    name: str
    where: str
    base_dir: str
    experiment: dict
    target_rate: float
    slos: tuple[SLO, ...]
    attainment: float
    space: dict
    max_requests: int = 300
    tolerance: float = 0.05
    max_runs: int = 12
    verify_top: int = 3
    description: str = field(default="", compare=False)
    #: the file the base experiment came from (build errors name it)
    experiment_where: str = ""


def read_plan(path: Path) -> PlanSpec:
    """Read a plan file strictly: every key known, every value checked, before any run."""
    from simulator.config import load_yaml

    where = str(path)
    top = Section(load_yaml(path), where)
    name = top.str("name", path.stem)
    description = top.str("description", "")
    experiment, exp_where = _read_experiment(top, path)
    target = top.num("target_rate_per_s", min=0, strict_min=True)
    slo = top.section("slo")
    slos = (
        SLO("ttft", 95, slo.num("ttft_p95_ms", min=0, strict_min=True) / 1000.0),
        SLO("tpot", 95, slo.num("tpot_p95_ms", min=0, strict_min=True) / 1000.0),
    )
    attainment = slo.num("attainment", 0.9, min=0, max=1, strict_min=True)
    slo.done()
    space = _read_space(top)
    sec = top.section("search", {})
    knobs = {
        "max_requests": sec.int("max_requests", 300, min=1),
        "tolerance": sec.num("tolerance", 0.05, min=0, strict_min=True),
        "max_runs": sec.int("max_runs", 12, min=1),
        "verify_top": sec.int("verify_top", 3, min=1),
    }
    sec.done()
    top.done()
    base_dir = str(Path(exp_where).parent.resolve())  # absolute: Ray workers run elsewhere
    return PlanSpec(name, where, base_dir, experiment, target, slos, attainment, space,
                    description=description, experiment_where=exp_where, **knobs)  # fmt: skip


def _read_experiment(top: Section, path: Path) -> tuple[dict, str]:
    """The base experiment and the file that holds it: inline, or a YAML path relative to the
    plan file."""
    from simulator.config import TOOLING_KEYS, load_yaml

    value, where = top.raw("experiment"), str(path)
    if isinstance(value, str):
        where = str(path.parent / value)
        value = load_yaml(where)
    if not isinstance(value, dict):
        raise top.error("experiment", "expected an experiment mapping or the path of its YAML")
    for key in TOOLING_KEYS:
        if key in value:
            raise top.error(f"experiment.{key}", "a plan searches its own space; leave it out")
    arrival = (value.get("workload") or {}).get("arrival") if isinstance(
        value.get("workload"), dict) else None  # fmt: skip
    if not isinstance(arrival, dict) or rate_key(value) != "rate_per_s":
        raise top.error(
            "experiment.workload.arrival",
            "a plan needs synthetic arrivals with rate_per_s (poisson, gamma or constant; a "
            "trace's lengths can be re-timed by one)",
        )
    return value, where


def _read_space(top: Section) -> dict:
    space = top.section("space")
    grid = {}
    for key in list(space.data):
        values = space.list(str(key))
        if not isinstance(key, str) or not all(key.split(".")):
            raise space.error(str(key), "expected a dotted key like hardware.tp")
        if key in DERIVED_KEYS:
            raise space.error(key, "the replica count is derived (ceil(target rate / one "
                              "unit's capacity)); leave it out")  # fmt: skip
        if not values:
            raise space.error(key, "expected a non-empty list of values")
        grid[key] = values
    space.done()
    return grid


# ------------------------------------------------------------------------ units and configs


def unit_points(spec: PlanSpec) -> tuple[dict, list]:
    """The base config and one sweep `Point` per combination of the space."""
    from simulator.sweep import expand

    return expand({**copy.deepcopy(spec.experiment), "sweep": spec.space}, spec.where)


def unit_config(spec: PlanSpec, base: dict, point) -> dict:
    """One unit's config: the point's values, one replica (colocated) at the target rate."""
    from simulator.sweep import point_config

    cfg = point_config(base, point, spec.where)
    cluster = cfg.get("cluster")
    if not isinstance(cluster, dict):
        cluster = cfg["cluster"] = {}
    if cluster.get("mode", "colocated") == "colocated":
        cluster["replicas"] = 1
    return probe_config(cfg, list(spec.slos), spec.target_rate, spec.max_requests)


def scaled_config(unit: dict, units: int, rate: float, max_requests: int) -> dict:
    """``units`` copies of a unit (replicas, or both P/D pools) at ``rate``."""
    cfg = copy.deepcopy(unit)
    cluster = cfg["cluster"]
    if cluster.get("mode", "colocated") == "colocated":
        cluster["replicas"] = units
    else:
        for pool in ("prefill", "decode"):
            cluster[pool]["replicas"] = units * int(cluster[pool].get("replicas", 1))
    cfg["workload"]["arrival"]["rate_per_s"] = rate
    cfg["workload"]["limits"]["max_requests"] = max_requests
    return cfg


def point_name(point) -> str:
    return point.key or "base"


# ------------------------------------------------------------------------------- pruning


def describe_unit(built) -> dict:
    """What a built unit costs and which latency model times it (for the table)."""
    cluster = built.resolved["cluster"]
    per_unit = (
        cluster["prefill"]["replicas"] + cluster["decode"]["replicas"]
        if cluster["mode"] == "disaggregated" else 1
    )  # fmt: skip
    lat = built.latency.describe()
    return {
        "gpu": built.gpu.name,
        "tp": built.tp,
        "precision": precision(built.model),
        "unit_gpus": built.tp * per_unit,
        "price_per_gpu_hour": built.price_per_gpu_hour,
        "latency_model": lat.get("kind") or lat.get("name"),
        "warnings": list(lat.get("warnings") or []),
    }


def fallback_warnings(unit: dict, rec: dict) -> list[str]:
    """Why ``latency: auto`` gave a unit the roofline bound: said per precision and GPU, so the
    plan's output shows which rows are optimistic bounds rather than profiled step times."""
    latency = unit.get("latency") if isinstance(unit.get("latency"), dict) else {}
    if latency.get("model", "auto") != "auto" or rec["latency_model"] != "roofline":
        return []
    return [f"{rec['gpu']} {rec['precision']} units use the roofline model: no table is shipped "
            "for this GPU, model, TP and precision"]  # fmt: skip


def precision(model) -> str:
    """A short name of a model's precision: ``bf16``, ``fp8`` (weights and KV agree), else
    ``<weights>-kv-<kv dtype>`` (`Precision.label`)."""
    return model.precision.label


def tpot_floor(built) -> float:
    """A lower bound of the unit's p95 TPOT at any load: one decode step of one request alone
    at the workload's p95 prompt length (each request's TPOT is at least the batch-1 step at its
    own prompt length, and a step's time grows with its context and batch)."""
    from workloads.spec import RequestColumns

    prompts = RequestColumns.of(built.workload.requests).num_prompt_tokens
    ctx = int(np.percentile(prompts, 95)) if prompts.size else 1
    return float(built.latency.step_time(0, 0.0, 0, 1, ctx, ctx))


def prune(spec: PlanSpec, unit: dict) -> dict:
    """Build one unit in this process and decide whether it needs simulating at all.

    A build error other than "does not fit in memory" is a mistake in the plan or experiment
    and stops the plan (ConfigError), as any strict reader does."""
    from simulator.runner import build

    try:
        built = build(unit, spec.experiment_where, Path(spec.base_dir))
    except ConfigError as e:
        if any(m in e.message for m in MEMORY_ERRORS):
            return {"status": "pruned", "prune": "memory", "reason": e.message}
        raise
    rec = {"status": "viable", **describe_unit(built)}
    rec["warnings"] += fallback_warnings(unit, rec)
    tpot = next(s for s in spec.slos if s.metric == "tpot")
    rec["tpot_floor_s"] = floor = tpot_floor(built)
    if floor > tpot.limit_s:
        rec.update(status="pruned", prune="tpot", reason=(
            f"one request alone decodes at {floor * 1000:.1f} ms per token > TPOT limit "
            f"{tpot.limit_s * 1000:g} ms"))  # fmt: skip
    return rec


# ------------------------------------------------------------------ the work of one worker


def _simulate(job: dict, cfg: dict) -> Probe:
    """One simulation, judged against the plan's SLOs (the same test as ``servesim capacity``)."""
    from simulator.runner import build, simulate

    summary = simulate(build(cfg, job["where"], Path(job["base_dir"]))).summary
    probe = judge(summary, list(job["slos"]), job["attainment"])
    energy = summary.get("energy") or {}
    probe.metrics.update(joules_per_output_token=energy.get("joules_per_output_token"),
                         energy_source=energy.get("source"))  # fmt: skip
    return probe


def size_unit(job: dict) -> dict:
    """Worker: the capacity search of one unit (picklable job; never raises)."""
    rec = {"name": job["name"], "kind": "size", "hash": job["hash"]}
    try:
        unit = job["config"]

        def evaluate(rate: float) -> Probe:
            cfg = copy.deepcopy(unit)
            cfg["workload"]["arrival"]["rate_per_s"] = rate
            p = _simulate(job, cfg)
            return Probe(rate, p.ok, p.attainment, p.detail, p.metrics)

        s = search(evaluate, job["target"], tolerance=job["tolerance"],
                   max_runs=job["max_runs"], max_rate=job["target"])  # fmt: skip
    except Exception as e:  # a bug in one unit must not stop the plan
        return {**rec, "status": "failed", "sims": 0, "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()}  # fmt: skip
    probes = [{"rate": p.rate, "ok": p.ok, "detail": p.detail, **p.metrics} for p in s.probes]
    status = "sized" if s.rate is not None else "infeasible"
    return {**rec, "status": status, "capacity_rps": s.rate, "bracket": list(s.bracket),
            "note": s.note, "sims": s.runs, "probes": probes}  # fmt: skip


def verify_unit(job: dict) -> dict:
    """Worker: the chosen number of units simulated together at the full target rate."""
    rec = {"name": job["name"], "kind": "verify", "hash": job["hash"], "sims": 1}
    try:
        p = _simulate(job, job["config"])
    except Exception as e:  # noqa: BLE001 - reported in the table, the plan goes on
        return {**rec, "status": "failed", "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()}  # fmt: skip
    return {**rec, "status": "passed" if p.ok else "missed", "detail": p.detail, **p.metrics}


def run_worker(job: dict) -> dict:
    """The one entry point workers import (local processes and Ray alike)."""
    return size_unit(job) if job["kind"] == "size" else verify_unit(job)


def _lost(job: dict, exc: Exception) -> dict:
    """A job whose Ray worker died outside `run_worker`."""
    return {"name": job["name"], "kind": job["kind"], "hash": job["hash"], "status": "failed",
            "sims": 0, "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip


def run_jobs(jobs: list[dict], workers: int, backend: str, address: str | None):
    """Yield each job's record as it finishes: inline, on local processes, or on Ray (through
    `simulator.sweeprun._ray_map`, the sweep's way of starting or joining Ray)."""
    if not jobs:
        return
    if backend == "ray":
        from simulator.sweeprun import _ray_map

        yield from _ray_map(jobs, workers, address, fn=run_worker, lost=_lost)
    elif workers <= 1 or len(jobs) == 1:
        for job in jobs:
            yield run_worker(job)
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            for f in as_completed([pool.submit(run_worker, j) for j in jobs]):
                yield f.result()


# ------------------------------------------------------------------------ the whole search


@dataclass
class PlanRun:
    """What a plan search found: one row per unit, and how much simulating it took."""

    spec: PlanSpec
    units: list[dict]
    sims_run: int = 0
    sims_reused: int = 0
    answer: dict | None = None

    def count(self, **match) -> int:
        return sum(all(u.get(k) == v for k, v in match.items()) for u in self.units)


def _job_hash(job: dict) -> str:
    from simulator.sweep import config_hash

    return config_hash({k: v for k, v in job.items() if k not in ("name", "hash")})


def _reuse(path: Path, job: dict, resume: bool) -> dict | None:
    """A finished record of this very job (same inputs hash) from an earlier run, if wanted."""
    if not resume or not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return None
    ok = isinstance(rec, dict) and rec.get("hash") == job["hash"] and rec.get("status") != "failed"
    return rec if ok else None


def _run_phase(run: PlanRun, jobs: list[dict], folder: Path, opts: dict) -> dict[str, dict]:
    """Run (or reuse, with --resume) one job per unit; write each record as it comes back."""
    folder.mkdir(parents=True, exist_ok=True)
    records, todo = {}, []
    for job in jobs:
        job["hash"] = _job_hash(job)
        old = _reuse(folder / record_file(job["name"]), job, opts["resume"])
        if old is not None:
            records[job["name"]] = {**old, "resumed": True}
            run.sims_reused += old.get("sims", 0)
        else:
            todo.append(job)
    for rec in run_jobs(todo, opts["jobs"], opts["backend"], opts["address"]):
        text = json.dumps(rec, indent=1, default=str) + "\n"
        (folder / record_file(rec["name"])).write_text(text)
        records[rec["name"]] = {**rec, "resumed": False}
        run.sims_run += rec.get("sims", 0)
        if opts.get("say"):
            opts["say"](f"  {rec['kind']} {rec['name']}: {rec['status']}")
    return records


def record_file(name: str) -> str:
    """A unit's record file: its point name, shortened with a hash where a long space would
    pass the file system's 255-byte limit on a name."""
    if len(name) <= 200:
        return f"{name}.json"
    import hashlib

    return f"{name[:180]}~{hashlib.sha256(name.encode()).hexdigest()[:12]}.json"


def _job(spec: PlanSpec, kind: str, name: str, config: dict) -> dict:
    return {"kind": kind, "name": name, "config": config, "where": spec.experiment_where,
            "base_dir": spec.base_dir, "slos": list(spec.slos), "attainment": spec.attainment,
            "target": spec.target_rate, "tolerance": spec.tolerance,
            "max_runs": spec.max_runs}  # fmt: skip


def size_units(run: PlanRun, out: Path, opts: dict) -> None:
    """Prune every unit, then search the capacity of the rest and derive replicas and cost."""
    spec = run.spec
    viable = [u for u in run.units if u["status"] == "viable"]
    jobs = [_job(spec, "size", u["point"], u["config"]) for u in viable]
    records = _run_phase(run, jobs, out / "units", opts)
    for u in viable:
        rec = records[u["point"]]
        u.update(status=rec["status"], sims=rec.get("sims", 0), resumed=rec["resumed"],
                 capacity_rps=rec.get("capacity_rps"), reason=rec.get("error") or rec.get(
                     "note") or "")  # fmt: skip
        if rec["status"] != "sized":
            continue
        n = math.ceil(spec.target_rate / rec["capacity_rps"] - 1e-9)
        u.update(replicas=n, gpus=n * u["unit_gpus"])
        u["usd_per_hour"] = u["gpus"] * u["price_per_gpu_hour"]
        u.update(_estimate_at_load(rec["probes"], spec.target_rate / n))


def _estimate_at_load(probes: list[dict], load: float) -> dict:
    """p95 TTFT and TPOT of one unit at (at least) its share of the target load: the feasible
    probe with the lowest rate >= that share (a pessimistic estimate until verified)."""
    above = [p for p in probes if p["ok"] and p["rate"] >= load * (1 - 1e-9)]
    best = min(above, key=lambda p: p["rate"]) if above else None
    keys = ("ttft_p95_s", "tpot_p95_s", "joules_per_output_token", "energy_source")
    if best is None:
        return {**dict.fromkeys(keys), "metrics_from": ""}
    return {**{k: best.get(k) for k in keys},
            "metrics_from": f"1 unit at {best['rate']:.4g} req/s"}  # fmt: skip


def rank(units: list[dict]) -> list[dict]:
    """Sized units, cheapest first; energy is the second objective (ties in $/hour: fewer
    joules per output token), then lower p95 TTFT, then name. A unit whose energy is unknown
    ranks after the known ones at its price."""
    sized = [u for u in units if u["status"] == "sized"]
    inf = float("inf")

    def key(u):
        joules = u.get("joules_per_output_token")
        return (u["usd_per_hour"], inf if joules is None else joules, u["ttft_p95_s"] or inf,
                u["point"])  # fmt: skip

    return sorted(sized, key=key)


#: A deployment that misses its verification is tried again with one more unit, at most this
#: many times (linear scaling was optimistic for it); at most this many verification rounds.
MAX_EXTRA_UNITS = 2
MAX_VERIFY_ROUNDS = 6


def verify(run: PlanRun, out: Path, opts: dict) -> None:
    """Simulate the cheapest deployments at the full target rate until the cheapest one left
    has passed: each round verifies up to ``verify_top`` of the cheapest not yet passed, in
    parallel; one that misses comes back with one more unit (and a higher cost)."""
    for _ in range(MAX_VERIFY_ROUNDS):
        left = [u for u in rank(run.units) if not u.get("given_up")]
        if not left or left[0].get("verified") == "passed":
            break
        batch = [u for u in left[: run.spec.verify_top] if u.get("verified") != "passed"]
        _verify_round(run, batch, out, opts)
    run.answer = next((u for u in rank(run.units) if u.get("verified") == "passed"), None)


def _verify_round(run: PlanRun, batch: list[dict], out: Path, opts: dict) -> None:
    spec = run.spec
    jobs = [
        _job(spec, "verify", f"{u['point']},units={u['replicas']}", scaled_config(
            u["config"], u["replicas"], spec.target_rate, spec.max_requests * u["replicas"]))
        for u in batch
    ]  # fmt: skip
    records = _run_phase(run, jobs, out / "verify", opts)
    for u, job in zip(batch, jobs, strict=True):
        rec, n = records[job["name"]], u["replicas"]
        u["sims"] = u.get("sims", 0) + rec.get("sims", 0)
        u.setdefault("missed_at", [])
        if rec["status"] == "failed":
            u.update(verified="failed", given_up=True, reason=rec.get("error", ""))
            continue
        u.update(ttft_p95_s=rec.get("ttft_p95_s"), tpot_p95_s=rec.get("tpot_p95_s"),
                 attainment=rec.get("slo_attainment"),
                 joules_per_output_token=rec.get("joules_per_output_token"),
                 energy_source=rec.get("energy_source"),
                 metrics_from=f"{n} unit{'s' * (n > 1)} at {spec.target_rate:g} req/s")  # fmt: skip
        if rec["status"] == "passed":
            u["verified"] = "passed"
            continue
        u["missed_at"].append(n)
        if len(u["missed_at"]) > MAX_EXTRA_UNITS:
            u.update(verified="missed", given_up=True)
        else:
            u.update(verified="", replicas=n + 1, gpus=(n + 1) * u["unit_gpus"])
            u["usd_per_hour"] = u["gpus"] * u["price_per_gpu_hour"]


def plan(spec: PlanSpec, out: Path, *, jobs: int = 1, backend: str = "local",
         address: str | None = None, resume: bool = False, say=None) -> PlanRun:  # fmt: skip
    """Prune, size and verify every unit of the plan's space; write plan.csv and plan.json."""
    base, points = unit_points(spec)
    run = PlanRun(spec, [])
    for point in points:
        cfg = unit_config(spec, base, point)
        run.units.append({"point": point_name(point), "values": point.values, "config": cfg,
                          "verified": "", **prune(spec, cfg)})  # fmt: skip
    opts = {"jobs": jobs, "backend": backend, "address": address, "resume": resume, "say": say}
    size_units(run, out, opts)
    verify(run, out, opts)
    write_table(run, out)
    return run


TABLE_COLUMNS = (
    "rank", "point", "status", "gpu", "tp", "precision", "unit_gpus", "capacity_rps", "replicas",
    "gpus", "price_per_gpu_hour", "usd_per_hour", "ttft_p95_s", "tpot_p95_s", "attainment",
    "joules_per_output_token", "metrics_from", "verified", "answer", "tpot_floor_s",
    "latency_model", "energy_source", "sims", "resumed", "reason",
)  # fmt: skip


def table_rows(run: PlanRun) -> list[dict]:
    """One row per unit: ranked sized units first, then the infeasible, failed and pruned."""
    ranked = rank(run.units)
    order = {"sized": 0, "infeasible": 1, "failed": 2, "pruned": 3}
    rest = sorted((u for u in run.units if u["status"] != "sized"),
                  key=lambda u: (order.get(u["status"], 4), u["point"]))  # fmt: skip
    rows = []
    for i, u in enumerate(ranked + rest):
        row = {c: u.get(c) for c in TABLE_COLUMNS}
        row["rank"] = i + 1 if u["status"] == "sized" else None
        row["answer"] = u is run.answer
        row["verified"] = u.get("verified") or ("not run" if u["status"] == "sized" else "")
        if u.get("missed_at"):
            row["verified"] += f" (missed with {', '.join(map(str, u['missed_at']))} units)"
            row["verified"] = row["verified"].replace("missed (missed", "missed (")
        if u["status"] == "pruned":
            row["status"] = f"pruned ({u['prune']})"
        for key, value in u["values"].items():
            row[f"space.{key}"] = json.dumps(value) if isinstance(value, (dict, list)) else value
        rows.append(row)
    return rows


def write_table(run: PlanRun, out: Path) -> None:
    import pandas as pd

    rows = table_rows(run)
    pd.DataFrame(rows).to_csv(out / "plan.csv", index=False, float_format="%.6g")
    warnings = sorted({w for u in run.units for w in u.get("warnings", [])})
    doc = {
        "plan": run.spec.name,
        "target_rate_per_s": run.spec.target_rate,
        "slo": [str(s) for s in run.spec.slos] + [f"attainment >= {run.spec.attainment}"],
        "assumption": "round-robin routing scales linearly: units = ceil(target / capacity)",
        "answer": run.answer["point"] if run.answer else None,
        "units": len(run.units),
        "pruned": {"memory": run.count(prune="memory"), "tpot": run.count(prune="tpot")},
        "simulations": {"run": run.sims_run, "reused": run.sims_reused},
        "energy": ENERGY_NOTE,
        "latency_warnings": warnings,
        "rows": rows,
    }
    (out / "plan.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


# ---------------------------------------------------------------------------------- the CLI


def _ms(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.0f}"


def _num(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def format_table(run: PlanRun) -> str:
    """The ranked table as printed (plan.csv has every column)."""
    rows = table_rows(run)
    w = min(max([len(r["point"]) for r in rows] + [5]), 80) + 1
    head = (f"{'#':>3} {'point':<{w}}{'status':<16}{'cap/unit':>9}{'units':>6}{'GPUs':>5}"
            f"{'$/h':>8}{'TTFT95':>7}{'TPOT95':>7}{'J/tok':>7}  verified")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        cap = f"{r['capacity_rps']:.3g}" if r["capacity_rps"] else "-"
        cost = f"{r['usd_per_hour']:.2f}" if r["usd_per_hour"] is not None else "-"
        mark = " <- answer" if r["answer"] else ""
        lines.append(
            f"{r['rank'] or '':>3} {r['point'][: w - 1]:<{w}}{r['status']:<16}{cap:>9}"
            f"{r['replicas'] or '-':>6}{r['gpus'] or '-':>5}{cost:>8}{_ms(r['ttft_p95_s']):>7}"
            f"{_ms(r['tpot_p95_s']):>7}{_num(r['joules_per_output_token']):>7}  "
            f"{r['verified']}{mark}"
        )
    return "\n".join(lines)


def format_report(run: PlanRun, wall_s: float) -> str:
    """Everything after the table: the answer, what was pruned, simulations, caveats."""
    spec, a = run.spec, run.answer
    lines = []
    if a:
        lines.append(
            f"answer: {a['point']}: {a['replicas']} x {a['unit_gpus']} {a['gpu']} = {a['gpus']} "
            f"GPUs, ${a['usd_per_hour']:.2f}/h; verified at {spec.target_rate:g} req/s: TTFT "
            f"p95 {_ms(a['ttft_p95_s'])} ms, TPOT p95 {_ms(a['tpot_p95_s'])} ms, attainment "
            f"{(a.get('attainment') or 0) * 100:.1f}%; {_num(a.get('joules_per_output_token'))} J "
            f"per output token ({a.get('energy_source') or 'energy unknown'})"
        )
    else:
        lines.append("answer: none: no deployment in the space passed verification at the "
                     "target rate (see the table)")  # fmt: skip
    lines.append(
        f"units: {len(run.units)}: {run.count(status='sized')} sized, "
        f"{run.count(status='infeasible')} infeasible at every rate tried, "
        f"{run.count(status='failed')} failed, pruned without simulating "
        f"{run.count(prune='memory')} (do not fit in memory) + {run.count(prune='tpot')} "
        f"(TPOT SLO missed by one request alone)"
    )
    lines.append(
        f"simulations: {run.sims_run + run.sims_reused} ({run.sims_run} run now, "
        f"{run.sims_reused} reused by --resume) in {wall_s:.1f} s"
    )
    lines.append(ENERGY_NOTE)
    by_warning: dict[str, list[str]] = {}
    for u in run.units:
        for w in u.get("warnings", []):
            by_warning.setdefault(w, []).append(u["point"])
    for w, names in sorted(by_warning.items()):
        lines.append(f"warning ({len(names)} unit{'s' * (len(names) > 1)}): {w}")
    return "\n".join(lines)


def plan_cli(args) -> int:
    import sys
    import time

    from simulator.files import check_out_dir
    from simulator.plots import plot_pareto

    path = Path(args.file)
    if args.out:
        check_out_dir(args.out)
    spec = read_plan(path)
    out = check_out_dir(args.out or Path("results") / spec.name)
    t0 = time.perf_counter()
    say = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    run = plan(spec, out, jobs=args.jobs, backend=args.backend, address=args.address,
               resume=args.resume, say=say)  # fmt: skip
    wall = time.perf_counter() - t0
    s = ", ".join(str(x) for x in spec.slos)
    print(f"plan: {path}  target {spec.target_rate:g} req/s, SLO {s}, attainment >= "
          f"{spec.attainment * 100:g}%; <= {spec.max_requests} requests per unit run")  # fmt: skip
    print(
        "assumption: round-robin routing scales linearly, so units = ceil(target / one "
        f"unit's capacity); the {spec.verify_top} cheapest are verified at the full rate"
    )
    print(format_table(run))
    print(format_report(run, wall))
    png = plot_pareto(out / "plan.csv", out / "pareto.png")
    print(f"results: {out / 'plan.csv'}, {out / 'plan.json'}, {png or '(no sized unit to plot)'}")
    return 0 if run.answer else 1
