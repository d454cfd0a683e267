"""How far one engine process's launch times move a pair's validation (CPU, ~1 min a pair).

    python validation/vllm-0.24/launch_band.py h100/deepseek-v2-lite h200/gemma-3-27b

Why: the host time of launching a prompt step is drawn per engine process (profiles/README.md,
"One pass per engine process"), and a serving run is one process. For a pair whose table's raw
run spans several engine processes, this splits the run by process
(`profiles.vllm_steps.engine_processes`), fits a table on each process's steps alone, and
validates the pair (`run_all.report`, the shipped replay) with the shipped table as it is and
with its launch times (`EngineStepModel.launch_waits`, per kind) replaced by each process's,
every other part of the fit the shipped table's. What it tells: how much of a pair's error a
different draw of the launch time would move, and how many of the replay's values lie between
the simulations with the fastest and the slowest process's launches ("inside the band").

Nothing here fits anything on the replays; the per-process tables come from the profiling run
only. A process whose steps are too few to fit (a resumed tail of a few scenarios) is left out
and named. Writes ``launch_band.md`` beside this file.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from run_all import PAIRS, report, served_spec  # noqa: E402

from profiles.diag_launch import by_process  # noqa: E402
from profiles.vllm_steps import read_steps  # noqa: E402
from profiles.vllm_table import build_table, load_profile_phase  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.latency.engine_steps import MIN_LAUNCHES, EngineStepModel  # noqa: E402

#: the shipped tables of the pairs this can split (their raw runs span several engine processes)
TABLES = {
    "h100/llama-3-8b": "profiles/h100/vllm-0.24/llama-3-8b_tp1",
    "h100/qwen2.5-7b": "profiles/h100/vllm-0.24/qwen2.5-7b_tp1",
    "h100/deepseek-v2-lite": "profiles/h100/vllm-0.24/deepseek-v2-lite_tp1",
    "h200/gemma-3-27b": "profiles/h200/vllm-0.24/gemma-3-27b_tp1",
    "h200/qwen3-30b-a3b-tp2": "profiles/h200/vllm-0.24/qwen3-30b-a3b_tp2",
}
#: the files of a raw run a table build reads besides the steps and the profile phase
RUN_FILES = ("energy.json.gz", "engine.json", "log.txt")


def split_run(raw: Path, out: Path) -> list[Path]:
    """One raw folder per engine process of the run in ``raw``: its steps, and the scenarios
    (with their requests) that started while it ran."""
    phase = load_profile_phase(raw)
    dirs = []
    for k, mine in enumerate(by_process(read_steps(str(raw / "steps.jsonl")))):
        t_lo, t_hi = mine[0]["t_sched"] - 1.0, mine[-1]["t_done"]
        scs = [sc for sc in phase["scenarios"] if t_lo <= sc["t0"] <= t_hi]
        ids = {sc["id"] for sc in scs}
        reqs = {r: v for r, v in phase["requests"].items() if r.split("/")[0] in ids}
        d = out / f"proc{k}" / "raw"
        d.mkdir(parents=True)
        for name in RUN_FILES:
            shutil.copy(raw / name, d / name)
        with gzip.open(d / "steps.jsonl.0.gz", "wt") as f:
            f.writelines(json.dumps(s) + "\n" for s in mine)
        with gzip.open(d / "profile.json.gz", "wt") as f:
            json.dump({**phase, "scenarios": scs, "requests": reqs}, f)
        dirs.append(d)
    return dirs


def process_tables(pair, table: Path, tmp: Path) -> dict[str, EngineStepModel | str]:
    """Each engine process's own table, or why it has none: too few steps to fit, or too few
    launches of either kind to charge one (a process that ran only decode scenarios would
    otherwise stand in the band with launches of 0 ms)."""
    meta = yaml.safe_load((table / "meta.yaml").read_text())
    spec = served_spec(pair.model)
    out: dict[str, EngineStepModel | str] = {}
    for raw in split_run(table / "raw", tmp):
        name = raw.parent.name
        try:
            build_table(raw, raw.parent, meta["gpu"]["key"], spec, pair.tp,
                        meta.get("expert_parallel"))  # fmt: skip
            model = EngineStepModel(raw.parent, spec.name, pair.tp)
        except ConfigError as e:
            out[name] = f"not fitted ({str(e).replace(str(tmp) + '/', '')})"
            continue
        counts = model.launch_counts
        if min(counts.values()) < MIN_LAUNCHES:
            out[name] = (f"too few launches to charge (graph {counts[True]}, eager "
                         f"{counts[False]}; {MIN_LAUNCHES} needed)")  # fmt: skip
        else:
            out[name] = model
    return out


@contextlib.contextmanager
def launches_of(donor: EngineStepModel | None):
    """Every `EngineStepModel` fitted inside keeps its own fit but the launch times of
    ``donor`` (None: its own)."""
    fit = EngineStepModel._fit_launch

    def swapped(self, train):
        fit(self, train)
        if donor is not None:
            self.launch_waits, self.launch = donor.launch_waits, donor.launch
            self.launch_counts = donor.launch_counts

    EngineStepModel._fit_launch = swapped
    try:
        yield
    finally:
        EngineStepModel._fit_launch = fit


def band(pair, table: Path, real: Path) -> dict:
    """The pair validated with its table's own launches and with each process's."""
    with tempfile.TemporaryDirectory() as tmp:
        donors = process_tables(pair, table, Path(tmp))
        runs = {}
        for name, donor in [("pooled", None), *donors.items()]:
            if isinstance(donor, str):
                continue
            with launches_of(donor), contextlib.redirect_stdout(sys.stderr):
                runs[name] = report(real, {pair.key: str(table)})
    fitted = {k: v for k, v in donors.items() if not isinstance(v, str)}
    shipped = EngineStepModel(table, served_spec(pair.model).name, pair.tp)
    return {
        "runs": runs,
        "skipped": {k: v for k, v in donors.items() if isinstance(v, str)},
        "launch_ms": {
            "pooled": _launch_ms(shipped),
            **{k: _launch_ms(v) for k, v in fitted.items()},
        },
    }


def _launch_ms(m: EngineStepModel) -> str:
    return " / ".join(f"{m.launch[g] * 1e3:.1f}" for g in (True, False))


def coverage(runs: dict) -> dict:
    """Latency values (throughput left out) and how many lie between the simulations with the
    processes' launches, for all values and for the pooled table's values beyond 15%."""
    procs = [k for k in runs if k != "pooled"]
    out = {"values": 0, "inside": 0, "beyond": 0, "beyond_inside": 0}
    for case in runs["pooled"]:
        errs = {k: {m["metric"]: m["err"] for m in runs[k][case]["metrics"]} for k in runs}
        for metric, e in errs["pooled"].items():
            if metric.startswith("throughput"):
                continue
            lo = min(errs[p][metric] for p in procs)
            hi = max(errs[p][metric] for p in procs)
            inside = lo <= 0.0 <= hi
            out["values"] += 1
            out["inside"] += inside
            if abs(e) > 0.15:
                out["beyond"] += 1
                out["beyond_inside"] += inside
    return out


def summary_rows(key: str, found: dict) -> list[str]:
    rows = []
    for name, res in found["runs"].items():
        errs = [abs(m["err"]) for r in res.values() for m in r["metrics"]]
        launch = found["launch_ms"][name]
        rows.append(f"| {key} | {name} | {launch} | {np.median(errs):.1%} | "
                    f"{sum(e > 0.15 for e in errs)} of {len(errs)} |")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", nargs="*", default=list(TABLES), help="GPU/MODEL keys")
    ap.add_argument("--real", default=str(HERE / "real"), help="folder of the real runs")
    ap.add_argument("--out", default=str(HERE / "launch_band.md"), help="markdown written")
    a = ap.parse_args(argv)
    by_key = {p.key: p for p in PAIRS}
    for key in a.pairs:
        if key not in TABLES or key not in by_key:
            ap.error(f"{key}: no split table for it (known: {', '.join(TABLES)})")
    lines = ["| pair | launches from | graph / eager launch, ms | median abs error | beyond 15% |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    bands = ["| pair | latency values | real between the processes' simulations | pooled beyond "
             "15% | of those, between |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for key in a.pairs:
        found = band(by_key[key], ROOT / TABLES[key], Path(a.real))
        lines += summary_rows(key, found)
        for name, why in found["skipped"].items():
            lines.append(f"| {key} | {name} | {why} | - | - |")
        if len(found["runs"]) > 2:
            c = coverage(found["runs"])
            bands.append(f"| {key} | {c['values']} | {c['inside']} | {c['beyond']} | "
                         f"{c['beyond_inside']} |")  # fmt: skip
    text = "\n".join(lines) + "\n\n" + "\n".join(bands) + "\n"
    Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
