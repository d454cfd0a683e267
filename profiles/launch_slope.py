"""Does a table's launch time grow with the decodes running beside it? A held-out check.

Why: an engine table charges one launch distribution per kind (graph / eager:
`simulator.latency.engine_steps.EngineStepModel._fit_launch`), whatever the batch the launched
step is planned behind. The host work of planning and launching a step (block tables, slot
mappings, sampling metadata) may grow with the sequences it carries, and the serving replays'
stamps show eager launches growing with the decodes beside them (`profiles.diag_launch
--by-decodes`). This fits, per kind, on a table's *training* launches only, a relative line
``c0 + c1 * decodes`` on each launch over its engine process's median (the launch level is drawn
per process), and reports how much it shrinks the error on the *held-out* launches against the
constant the table charges. A reading for deciding whether the model should take the feature;
nothing here changes a table.

``python -m profiles.launch_slope TABLE_DIR ...`` (no GPU) prints one row per table and kind.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

from simulator.errors import ConfigError
from simulator.files import load_yaml_file
from simulator.latency.engine_steps import EngineStepModel, l1_fit, process_medians

#: fewer training / held-out launches of a kind than this and the kind is not judged
MIN_TRAIN, MIN_TEST = 20, 5
#: the slope is reported as the launch's relative growth over this many decodes
PER_DECODES = 256


def slope_check(rows: list[dict]) -> dict | None:
    """Fit ``wait / process median = c0 + c1 * decodes`` (median regression, ``c >= 0``) on the
    training rows; judge it and the constant (1: the process median) on the held-out rows.
    Only processes with a training median (`process_medians`: `engine_steps.MIN_LAUNCHES` training
    launches or more) take part. None when either side has too few launches."""
    train_waits: dict[int, list[float]] = {}
    for r in rows:
        if r["split"] == "train":
            train_waits.setdefault(r["proc"], []).append(r["wait_s"])
    level = process_medians(train_waits)  # the level the table charges each process at
    train = [r for r in rows if r["split"] == "train" and r["proc"] in level]
    test = [r for r in rows if r["split"] == "test" and r["proc"] in level]
    if len(train) < MIN_TRAIN or len(test) < MIN_TEST:
        return None
    y = np.array([r["wait_s"] / level[r["proc"]] for r in train])
    d = np.array([r["decode_seqs"] for r in train], float)
    scale = d.max() or 1.0
    c0, c1 = l1_fit(np.stack([np.ones_like(d), d / scale], axis=1) / y[:, None])
    yt = np.array([r["wait_s"] / level[r["proc"]] for r in test])
    dt = np.array([r["decode_seqs"] for r in test], float)
    before = np.abs(1.0 / yt - 1)
    after = np.abs((c0 + c1 * dt / scale) / yt - 1)
    return {
        "train": len(train),
        "test": len(test),
        "slope": float(c1 / scale * PER_DECODES / c0) if c0 > 0 else float("inf"),
        "median": (float(np.median(before)), float(np.median(after))),
        "p90": (float(np.quantile(before, 0.9)), float(np.quantile(after, 0.9))),
    }


def table_rows(table_dir: Path) -> list[str]:
    meta = load_yaml_file(table_dir / "meta.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = EngineStepModel(table_dir, meta["model"]["name"], int(meta["tp"]))
    out = []
    by_kind = model.launch_rows(model.rows)  # all splits: `slope_check` fits on train only
    for kind, graph in (("graph", True), ("eager", False)):
        res = slope_check(by_kind[graph])
        if res is None:
            continue
        (m0, m1), (q0, q1) = res["median"], res["p90"]
        out.append(
            f"| {table_dir} | {kind} | {res['train']} / {res['test']} | {res['slope']:+.2f} "
            f"| {m0:.1%} -> {m1:.1%} | {q0:.1%} -> {q1:.1%} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tables", nargs="+", help="engine table folders (meta.yaml, steps.csv)")
    print(
        f"| table | kind | launches train / held out | growth per {PER_DECODES} decodes "
        "| held-out median error, constant -> slope | p90 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for t in ap.parse_args(argv).tables:
        try:
            for line in table_rows(Path(t)):
                print(line, flush=True)
        except (ConfigError, OSError, KeyError) as e:
            print(f"error: {t}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
