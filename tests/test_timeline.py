import json
from pathlib import Path

import pandas as pd
from tooling_helpers import tiny

from simulator.cli import main
from simulator.sweeprun import run_sweep


def test_timeline_has_one_complete_event_per_step(tmp_path, capsys):
    run_sweep(tiny(), "t.yaml", Path("."), tmp_path, progress=False)
    run = tmp_path / "seed0"
    assert main(["timeline", str(run), "--out", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    ev = doc["traceEvents"]
    steps = pd.read_csv(run / "steps.csv")
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(steps)
    assert xs[0]["dur"] > 0 and "decode_seqs" in xs[0]["args"]
    begins = [e for e in ev if e["ph"] == "b"]
    ends = [e for e in ev if e["ph"] == "e"]
    assert len(begins) == len(ends) == 4 * 40  # request + queued, prefill, decode
    for b in begins:
        assert b["ts"] <= next(
            e["ts"] for e in ends if e["id"] == b["id"] and e["name"] == b["name"]
        )
    assert {e["name"] for e in ev if e["ph"] == "C"} == {"KV blocks in use", "batch size",
                                                          "queue"}  # fmt: skip
