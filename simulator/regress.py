"""``servesim regress EXPERIMENTS/ --baseline BASELINES/``: a CI gate on policy behaviour.

Every experiment YAML with a top-level ``regress:`` key is re-run in a short form: all points of
its sweep, the first of its seeds (or ``regress.seeds``), at most ``regress.max_requests``
requests per run. Each run's headline metrics are compared with ``BASELINES/<file stem>.json``
within a per-metric tolerance; a metric *regresses* when it moved the bad way (higher latency,
lower goodput, more rejections, ...) by more than ``max(abs, rel x |baseline|)``. Metrics with no
better direction (KV use, batch size, MFU) are shown as changed but never fail. A missing
baseline, a failed run or a changed set of points also fails. ``--update`` rewrites the
baselines from this run instead (review the diff it prints, then commit them).

Tolerances: defaults below, overridden by ``BASELINES/tolerances.yaml`` if present, or by the
file given with ``--tolerance-file``::

    default: {rel: 0.05, abs: 0.0}
    metrics:
      ttft_p99_s: {rel: 0.10, abs: 0.001}
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from simulator.collect import MAIN_METRICS, direction, headline, read_json
from simulator.config import load_yaml
from simulator.errors import ConfigError
from simulator.files import check_out_dir, load_yaml_file
from simulator.sweep import Task, expand, point_config, run_task

DEFAULT_TOLERANCE = {"rel": 0.05, "abs": 0.0}
# small absolute floors so that noise around tiny values (0.1 ms, one preemption) never fails
DEFAULT_METRIC_TOLERANCE = {
    **{m: {"rel": 0.05, "abs": 1e-4} for m in MAIN_METRICS if direction(m) == -1 and
       m.endswith("_s")},
    "preemptions": {"rel": 0.10, "abs": 2},
    "rejected": {"rel": 0.0, "abs": 0},
    "unfinished": {"rel": 0.0, "abs": 0},
    "completed": {"rel": 0.0, "abs": 0},
}  # fmt: skip


def load_tolerances(path: Path | None) -> tuple[dict, dict]:
    default, per = (
        dict(DEFAULT_TOLERANCE),
        {k: dict(v) for k, v in DEFAULT_METRIC_TOLERANCE.items()},
    )
    if path is None:
        return default, per
    doc = load_yaml_file(path, "tolerance file") or {}
    if not isinstance(doc, dict) or set(doc) - {"default", "metrics"}:
        raise ConfigError(str(path), "", "expected a mapping with keys default and metrics")
    default.update(_tolerance(doc.get("default") or {}, str(path), "default"))
    metrics = doc.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise ConfigError(str(path), "metrics", "expected a mapping of metric: {rel, abs}")
    for m, tol in metrics.items():
        if m not in MAIN_METRICS:
            raise ConfigError(str(path), f"metrics.{m}", f"unknown metric (known: "
                              f"{', '.join(MAIN_METRICS)})")  # fmt: skip
        per[m] = {**default, **per.get(m, {}), **_tolerance(tol, str(path), f"metrics.{m}")}
    return default, per


def _tolerance(tol, where: str, key: str) -> dict:
    """One ``{rel, abs}`` entry, both optional numbers >= 0."""
    if not isinstance(tol, dict):
        raise ConfigError(where, key, f"expected a mapping like {{rel: 0.05, abs: 0.001}}, got "
                          f"{tol!r}")  # fmt: skip
    for name, value in tol.items():
        if name not in ("rel", "abs"):
            raise ConfigError(where, f"{key}.{name}", "unknown key (known: rel, abs)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(where, f"{key}.{name}", f"expected a number >= 0, got {value!r}")
    return tol


def tolerance_for(metric: str, default: dict, per: dict) -> dict:
    return {**default, **per.get(metric, {})}


def compare_metrics(base: dict, new: dict, default: dict, per: dict) -> list[dict]:
    """One finding per metric outside tolerance: {metric, old, new, kind: worse|better|changed}."""
    out = []
    for m in MAIN_METRICS:
        old, cur = base.get(m), new.get(m)
        if old is None and cur is None:
            continue
        if old is None or cur is None:
            out.append({"metric": m, "old": old, "new": cur, "kind": "worse"})
            continue
        tol = tolerance_for(m, default, per)
        allowed = max(float(tol.get("abs", 0)), float(tol.get("rel", 0)) * abs(old))
        delta = cur - old
        if abs(delta) <= allowed:
            continue
        sign = direction(m) * (1 if delta > 0 else -1)
        kind = "better" if sign > 0 else ("worse" if sign < 0 else "changed")
        out.append({"metric": m, "old": old, "new": cur, "kind": kind, "allowed": allowed})
    return out


def regress_config(config: dict, where: str) -> tuple[dict, list, dict]:
    """The short form of an experiment: (base config, points, regress settings)."""
    spec = config.get("regress")
    if not isinstance(spec, dict):
        raise ConfigError(where, "regress", "expected a mapping like {max_requests: 300}")
    _check_spec(spec, where)
    unknown = set(spec) - {"max_requests", "seeds"}
    if unknown:
        raise ConfigError(where, f"regress.{sorted(unknown)[0]}", "unknown key "
                          "(known: max_requests, seeds)")  # fmt: skip
    cfg = dict(config)
    base, points = expand(cfg, where)
    seeds = spec.get("seeds") or [points[0].seed]
    points = [p for p in points if p.seed in seeds] or points[:1]
    limits = dict((base.get("workload") or {}).get("limits") or {})
    if spec.get("max_requests"):
        limits["max_requests"] = min(limits.get("max_requests") or 10**12, spec["max_requests"])
    base = {**base, "workload": {**base["workload"], "limits": limits}}
    return base, points, spec


def _check_spec(spec: dict, where: str) -> None:
    """``regress.max_requests`` an integer >= 1 and ``regress.seeds`` integers >= 0."""
    cap = spec.get("max_requests")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(where, "regress.max_requests", f"expected an integer >= 1, got {cap!r}")
    seeds = spec.get("seeds")
    good = isinstance(seeds, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds
    )
    if seeds is not None and not good:
        raise ConfigError(where, "regress.seeds", f"expected integers >= 0, got {seeds!r}")


def run_experiment(path: Path, jobs: int = 1) -> dict:
    """{point folder: headline metrics or {'error': ...}} of one experiment's short form."""
    config = load_yaml(path)
    base, points, _ = regress_config(config, str(path))
    tasks = [Task(point_config(base, p, str(path)), str(path), str(path.parent), p, None, None)
             for p in points]  # fmt: skip
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            recs = list(pool.map(run_task, tasks))
    else:
        recs = [run_task(t) for t in tasks]
    out = {}
    for t, rec in zip(tasks, recs, strict=True):
        if rec["status"] == "done":
            m = headline(rec["summary"])
            out[t.point.folder] = {k: m[k] for k in MAIN_METRICS}
            out[t.point.folder]["latency_model"] = rec["summary"]["latency_model"].get("name")
        else:
            out[t.point.folder] = {"error": rec["error"]}
    return out


def find_experiments(folder: Path, only: list[str] | None = None) -> list[Path]:
    """The experiment YAMLs of ``folder`` with a ``regress:`` key; an unreadable or invalid
    YAML is an error naming it (skipping it would drop its gate without a word)."""
    if not Path(folder).is_dir():
        raise ConfigError(str(folder), "", "not a folder (expected a folder of experiment YAMLs)")
    found = []
    for p in sorted(Path(folder).glob("*.yaml")):
        doc = load_yaml_file(p, "experiment YAML")
        if isinstance(doc, dict) and "regress" in doc and (not only or p.stem in only):
            found.append(p)
    return found


def regress_cli(args) -> int:
    t0 = time.monotonic()
    base_dir = Path(args.baseline)
    if args.update:  # the baselines are written after every run: check the folder first
        check_out_dir(base_dir, "--baseline")
    tol_file = Path(args.tolerance_file) if args.tolerance_file else base_dir / "tolerances.yaml"
    default, per = load_tolerances(tol_file if tol_file.is_file() or args.tolerance_file else None)
    exps = find_experiments(Path(args.experiments), args.only)
    if not exps and args.only:
        raise ConfigError("--only", ", ".join(args.only), f"no experiment YAML in "
                          f"{args.experiments} with a regress: key has this file stem")  # fmt: skip
    if not exps:
        raise ConfigError(args.experiments, "", "no experiment YAML with a regress: key here")
    failed = 0
    runs = 0
    for path in exps:
        bfile = base_dir / f"{path.stem}.json"
        old = _read(bfile)  # a broken baseline fails before the runs, not after
        new = run_experiment(path, args.jobs)
        runs += len(new)
        if args.update:
            errors = {k: v["error"] for k, v in new.items() if "error" in v}
            if errors:
                failed += 1
                print(f"{path.stem}: NOT UPDATED, {len(errors)} run(s) failed")
                for k, e in errors.items():
                    print(f"    {k}: {e}")
                continue
            base_dir.mkdir(parents=True, exist_ok=True)
            doc = {"experiment": path.stem, "source": str(path), "points": new}
            bfile.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            n = sum(len(_findings(old, new, default, per).get(k, [])) for k in new) if old else 0
            print(
                f"{path.stem}: baseline {'written' if old is None else 'updated'} "
                f"({len(new)} runs{f', {n} metrics moved' if old else ''}) -> {bfile}"
            )
            continue
        if old is None:
            failed += 1
            print(f"{path.stem}: FAIL no baseline {bfile} (create it with --update)")
            continue
        lines, bad = _report(old, new, default, per)
        failed += bad
        print(f"{path.stem}: {'REGRESSION' if bad else 'ok'} ({len(new)} runs)")
        for line in lines:
            print("    " + line)
    took = time.monotonic() - t0
    verdict = "failed" if failed else "passed"
    print(f"regress {verdict}: {len(exps)} experiments, {runs} runs, {took:.1f} s")
    return 1 if failed else 0


def _read(path: Path) -> dict | None:
    """A baseline's points (None when there is no baseline file yet)."""
    if not path.is_file():
        return None
    points = read_json(path).get("points")
    if not isinstance(points, dict) or not all(isinstance(v, dict) for v in points.values()):
        raise ConfigError(str(path), "points", "expected a mapping of point: metrics "
                          "(rewrite the baseline with --update)")  # fmt: skip
    for name, metrics in points.items():
        for m in MAIN_METRICS:
            v = metrics.get(m)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ConfigError(str(path), f"points.{name}.{m}", f"expected a number, got {v!r}")
    return points


def _findings(old: dict, new: dict, default: dict, per: dict) -> dict:
    return {
        k: compare_metrics(old[k], new[k], default, per)
        for k in new
        if k in old and "error" not in new[k] and "error" not in old[k]
    }


def _report(old: dict, new: dict, default: dict, per: dict) -> tuple[list[str], int]:
    lines, bad = [], 0
    for k in sorted(set(old) - set(new)):
        lines.append(f"{k}: in the baseline but not run now (sweep changed? --update)")
        bad = 1
    for k in sorted(set(new) - set(old)):
        lines.append(f"{k}: new point, no baseline (--update)")
        bad = 1
    for k, rec in new.items():
        if "error" in rec:
            lines.append(f"{k}: run FAILED: {rec['error']}")
            bad = 1
    for k, found in _findings(old, new, default, per).items():
        lat_old, lat_new = old[k].get("latency_model"), new[k].get("latency_model")
        if found and lat_old != lat_new:
            lines.append(f"{k}: latency model changed: {lat_old} -> {lat_new}")
        for f in found:
            bad = bad or f["kind"] == "worse"
            lines.append(f"{k}: {_show(f)}")
    return lines, int(bad)


def _show(f: dict) -> str:
    m, old, new = f["metric"], f["old"], f["new"]
    lat = m.endswith("_s") and direction(m) == -1
    scale, unit = (1000.0, " ms") if lat else (1.0, "")
    if old is None or new is None:
        return f"{m}: {old} -> {new}  WORSE (became undefined)"
    rel = f"{(new - old) / abs(old) * 100:+.1f}%" if old else "from 0"
    tag = {"worse": "WORSE", "better": "better (accept with --update)", "changed": "changed"}
    name = m[:-2] if lat else m
    return (f"{name}: {old * scale:.4g}{unit} -> {new * scale:.4g}{unit} ({rel}; allowed "
            f"+-{f['allowed'] * scale:.3g}{unit})  {tag[f['kind']]}")  # fmt: skip
