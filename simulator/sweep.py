"""Sweeps: one experiment YAML with a grid of values and a list of seeds, run point by point.

Two top-level keys of an experiment YAML (stripped before the runner sees the config):

* ``sweep:`` dotted keys -> lists of values; the points are their Cartesian product, in the
  order written (the last key varies fastest). A value that is a mapping is merged into the
  mapping at that key (``kv_cache: [{allocator: paged}, {allocator: contiguous, reserve: max}]``).
* ``seeds:`` a list of seeds; every point runs once per seed (default: the file's ``seed``, 0).

Each run lands in ``OUT/<point>/seed<N>/`` where ``<point>`` names the swept values readably
(``rate_per_s=4,policy=chunked_prefill``; the last part of a dotted key, the full key where two
would clash). Beside the usual results each run folder has ``point.json`` (values, seed, status,
and the hash of its resolved config) and, on failure, ``error.txt``. A rerun of the same sweep
skips every run whose ``point.json`` says done with the same resolved-config hash, so an
interrupted sweep resumes; failed runs are retried. ``OUT/index.csv`` has one row per run.

Execution is `simulator.sweeprun`'s job; this module only plans and runs one point.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from simulator.config import TOOLING_KEYS, apply_overrides, blame_overrides
from simulator.errors import ConfigError


@dataclass(frozen=True)
class Point:
    """One run of a sweep: swept values (dotted key -> value) and a seed."""

    key: str  # readable name of the values, "" when nothing is swept
    values: dict = field(hash=False)
    seed: int = 0

    @property
    def folder(self) -> str:
        return f"{self.key}/seed{self.seed}" if self.key else f"seed{self.seed}"


def read_plan(config: dict, where: str) -> tuple[dict, dict, list[int]]:
    """Split a config into (base config for the runner, grid, seeds)."""
    base = {k: v for k, v in config.items() if k not in TOOLING_KEYS}
    grid = config.get("sweep") or {}
    if not isinstance(grid, dict):
        raise ConfigError(where, "sweep", "expected a mapping of dotted keys to lists of values")
    for key, values in grid.items():
        if not isinstance(key, str) or not all(key.split(".")):
            raise ConfigError(where, f"sweep.{key}", "expected a dotted key like scheduler.policy")
        if not isinstance(values, list) or not values:
            raise ConfigError(where, f"sweep.{key}", "expected a non-empty list of values")
        shown = [repr(v) for v in values]  # repr: 1 and 1.0, or 1 and True, are other values
        if len(set(shown)) != len(shown):
            raise ConfigError(where, f"sweep.{key}", f"repeated value in {values}: two points "
                              "would be one run")  # fmt: skip
    default_seed = config.get("seed", 0)
    seeds = config.get("seeds", [default_seed])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise ConfigError(where, "seeds", "expected a non-empty list of integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(where, "seeds", f"repeated seed in {seeds}")
    return base, grid, list(seeds)


def expand(config: dict, where: str = "<sweep>") -> tuple[dict, list[Point]]:
    """The base config and every point of the sweep (product of the lists x seeds)."""
    base, grid, seeds = read_plan(config, where)
    keys = list(grid)
    labels = _labels(keys)
    combos = list(itertools.product(*(grid[k] for k in keys)))
    names = [",".join(f"{lab}={_fmt(v)}" for lab, v in zip(labels, c, strict=True)) for c in combos]
    if len(set(names)) != len(names):  # short value texts clashed: use full reprs
        names = [
            ",".join(f"{lab}={_safe(repr(v))}" for lab, v in zip(labels, c, strict=True))
            for c in combos
        ]
    points = [
        Point(name, dict(zip(keys, combo, strict=True)), seed)
        for name, combo in zip(names, combos, strict=True)
        for seed in seeds
    ]
    return base, points


def point_config(base: dict, point: Point, where: str = "<sweep>") -> dict:
    """The runner's config for one point: base with the point's values applied."""
    out = copy.deepcopy(base)
    for key, value in point.values.items():
        if isinstance(value, dict):
            node = out
            for part in key.split("."):
                nxt = node.get(part)
                if not isinstance(nxt, dict):
                    nxt = node[part] = {}
                node = nxt
            node.update(copy.deepcopy(value))
        else:
            out = apply_overrides(out, [f"{key}={json.dumps(value)}"], where=f"{where}: sweep")
    return out


def config_hash(resolved: dict) -> str:
    """A short stable hash of a resolved config (what decides whether a finished run is reused)."""
    from simulator.results import _plain

    text = json.dumps(_plain(resolved), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Task:
    """What a worker needs to run one point (picklable, no open files)."""

    config: dict
    where: str
    base_dir: str
    point: Point
    done_hash: str | None  # hash in the folder's point.json if it finished before
    write_dir: str | None  # where the worker writes; None = return results to the caller
    overrides: tuple[str, ...] = ()  # the command line's --set items (errors name them)


def run_task(task: Task) -> dict:
    """Build, skip if already done, simulate, write. Never raises: failures become records."""
    from simulator.results import write_config, write_error, write_results
    from simulator.runner import build, simulate

    out = Path(task.write_dir) / task.point.folder if task.write_dir else None
    rec = {"folder": task.point.folder, "status": "failed", "hash": None, "error": None}
    built = None
    try:
        with blame_overrides(task.where, list(task.overrides)):
            built = build(task.config, task.where, Path(task.base_dir), seed=task.point.seed)
        rec["hash"] = config_hash(built.resolved)
        if task.done_hash == rec["hash"]:
            rec["status"] = "skipped"
            return rec
        if out is not None:
            write_config(out, built.resolved)
        results = simulate(built)
    except ConfigError as e:
        rec["error"] = e.one_line()
        rec["trace"] = rec["error"]
        rec["config"] = {"as_given": task.config}
    except Exception as e:  # a bug or a policy error in one point must not stop the sweep
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["trace"] = traceback.format_exc()
        # returned to the caller: the resolved config, as a local run leaves in config.yaml
        rec["config"] = built.resolved if out is None and built else {"as_given": task.config}
    else:
        rec["status"] = "done"
        rec["summary"] = results.summary
        rec["wall_s"] = results.wall_s
        if out is not None:
            write_results(out, results)
        else:
            rec["results"] = results
    if rec["status"] == "failed" and out is not None:
        if not (out / "config.yaml").is_file():
            write_config(out, rec["config"])
        write_error(out, rec["trace"].rstrip())
    if out is not None:
        write_point_json(out, task.point, rec)
    return rec


def write_point_json(out: Path, point: Point, rec: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "point": point.key,
        "values": point.values,
        "seed": point.seed,
        "status": rec["status"],
        "config_hash": rec["hash"],
        "error": rec["error"],
    }
    (out / "point.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def read_done_hash(run_dir: Path) -> str | None:
    """The config hash of a finished run in ``run_dir`` (None if absent, failed or partial)."""
    p = Path(run_dir) / "point.json"
    if not p.is_file() or not (Path(run_dir) / "summary.json").is_file():
        return None
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError:
        return None
    return doc.get("config_hash") if doc.get("status") == "done" else None


def _labels(keys: list[str]) -> list[str]:
    last = [k.split(".")[-1] for k in keys]
    return [k if last.count(lab) > 1 else lab for k, lab in zip(keys, last, strict=True)]


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _safe(f"{value:g}")
    if isinstance(value, dict):
        return "+".join(f"{k}-{_fmt(v)}" for k, v in value.items()) or "default"
    if isinstance(value, (list, tuple)):
        return "+".join(_fmt(v) for v in value)
    return _safe(str(value))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", text)
