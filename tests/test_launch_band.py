"""`validation/vllm-0.24/launch_band.py`: a profiling run split by engine process, and how many
replay values lie between the simulations with each process's launches (CPU, hand-built)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "validation" / "vllm-0.24" / "launch_band.py"


def _band(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("launch_band", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_run_is_split_where_its_engine_restarted(tmp_path, monkeypatch):
    """Steps of the first engine (t < 10 s) and the second (t >= 60 s, after an idle gap longer
    than an engine start); each scenario goes with the process it started in, with its
    requests; the engine record, energy and log are copied to each."""
    raw = tmp_path / "raw"
    raw.mkdir()
    steps = [{"t_sched": t, "t_done": t + 0.01} for t in (1.0, 2.0, 60.0, 61.0)]
    with gzip.open(raw / "steps.jsonl.0.gz", "wt") as f:
        f.writelines(json.dumps(s) + "\n" for s in steps)
    phase = {"scenarios": [{"id": "a", "t0": 0.5}, {"id": "a~r1", "t0": 59.5}],
             "requests": {"a/0": {}, "a/1": {}, "a~r1/0": {}}}  # fmt: skip
    with gzip.open(raw / "profile.json.gz", "wt") as f:
        json.dump(phase, f)
    for name in ("energy.json.gz", "engine.json", "log.txt"):
        (raw / name).write_text(name)
    dirs = _band(monkeypatch).split_run(raw, tmp_path / "split")
    assert [d.parent.name for d in dirs] == ["proc0", "proc1"]
    for d, ids, reqs, times in zip(
        dirs, (["a"], ["a~r1"]), (["a/0", "a/1"], ["a~r1/0"]), ([1.0, 2.0], [60.0, 61.0]),
        strict=True,
    ):  # fmt: skip
        with gzip.open(d / "profile.json.gz", "rt") as f:
            got = json.load(f)
        assert [sc["id"] for sc in got["scenarios"]] == ids and sorted(got["requests"]) == reqs
        with gzip.open(d / "steps.jsonl.0.gz", "rt") as f:
            assert [json.loads(line)["t_sched"] for line in f] == times
        assert (d / "engine.json").read_text() == "engine.json"


def test_a_value_is_inside_the_band_when_the_processes_err_on_either_side(monkeypatch):
    def run(*errs):
        names = ("ttft_s.p50", "tpot_s.p50", "throughput.requests_per_s")
        return {
            "c": {"metrics": [{"metric": n, "err": e} for n, e in zip(names, errs, strict=True)]}
        }

    runs = {
        "pooled": run(0.20, 0.05, 0.5),  # ttft beyond 15%; throughput never counted
        "proc0": run(0.30, 0.02, 0.9),  # ttft above in both processes: outside
        "proc1": run(0.10, -0.01, -0.9),  # tpot -1% and +2%: the real value lies between
    }
    got = _band(monkeypatch).coverage(runs)
    assert got == {"values": 2, "inside": 1, "beyond": 1, "beyond_inside": 0}
    runs["proc1"] = run(-0.05, 0.03, 0.0)  # now ttft +30% / -5%: inside, and beyond pooled
    got = _band(monkeypatch).coverage(runs)
    assert got == {"values": 2, "inside": 1, "beyond": 1, "beyond_inside": 1}
