"""The `servesim run` command end to end: outputs, determinism, and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli import main

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "tiny",
    "seed": 3,
    "model": "llama-3-8b",
    "hardware": {"gpu": "h200", "tp": 1},
    "scheduler": {"policy": "continuous", "max_num_seqs": 32},
    "latency": {"model": "roofline"},
    "workload": {
        "arrival": {"process": "poisson", "rate_per_s": 8.0},
        "lengths": {
            "input": {"dist": "lognormal", "mean": 600, "cv": 1.0, "min": 1, "max": 4096},
            "output": {"dist": "uniform", "low": 1, "high": 200},
        },
        "num_requests": 300,
    },
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
}


def write(tmp_path, cfg, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_run_writes_results_and_accounts_for_every_request(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, BASE)), "--out", str(out)]) == 0
    for f in ("config.yaml", "requests.csv", "steps.csv", "summary.json"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    r = s["requests"]
    assert r["arrived"] == 300
    assert r["completed"] + r["rejected"] + r["unfinished"] == r["arrived"]
    assert s["latency_model"]["name"] == "roofline"
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(s[key]) >= {"mean", "p50", "p90", "p95", "p99"}
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["scheduler"]["max_num_seqs"] == 32
    assert resolved["kv_cache"]["num_blocks"] > 0
    assert "TTFT" in capsys.readouterr().out


def test_same_seed_identical_files_different_seed_differs(tmp_path):
    p = write(tmp_path, BASE)
    for d in ("a", "b"):
        assert main(["run", str(p), "--out", str(tmp_path / d), "--quiet"]) == 0
    assert main(["run", str(p), "--out", str(tmp_path / "c"), "--seed", "4", "--quiet"]) == 0
    for f in ("requests.csv", "steps.csv", "summary.json", "config.yaml"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    a = (tmp_path / "a" / "requests.csv").read_bytes()
    assert a != (tmp_path / "c" / "requests.csv").read_bytes()


def test_set_overrides_a_nested_key(tmp_path):
    out = tmp_path / "o"
    p = write(tmp_path, BASE)
    assert (
        main(["run", str(p), "--out", str(out), "--quiet", "--set", "workload.num_requests=50"])
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["requests"]["arrived"] == 50


def _with(path_value_pairs):
    cfg = json.loads(json.dumps(BASE))
    for dotted, value in path_value_pairs:
        node = cfg
        *parents, last = dotted.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return cfg


BAD = [
    ("unknown key", [("scheduler.max_num_seq", 4)], "scheduler.max_num_seq", "unknown key"),
    ("wrong type", [("scheduler.max_num_seqs", "many")], "scheduler.max_num_seqs", "integer"),
    ("negative rate", [("workload.arrival.rate_per_s", -3)], "workload.arrival.rate_per_s", "> 0"),
    ("unknown policy", [("scheduler.policy", "fastest")], "scheduler.policy", "expected one of"),
    ("unknown model", [("model", "gpt-9")], "model", "llama-3-8b"),
    (
        "missing trace file",
        [("workload", {"trace": {"path": "nope/missing.csv"}, "arrival": {"process": "trace"}})],
        "workload.trace.path",
        "missing.csv",
    ),
    (
        "never fits in KV",
        [("kv_cache", {"num_blocks": 4, "block_size": 16})],
        "workload",
        "KV cache",
    ),
    ("unknown section", [("engine", {})], "engine", "unknown section"),
]


@pytest.mark.parametrize("label,edits,key,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_error_exit_2(tmp_path, label, edits, key, needle):
    p = write(tmp_path, _with(edits))
    proc = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", str(p), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert str(p) in err and key in err and needle in err, err
    assert (tmp_path / "o" / "config.yaml").is_file()  # the config is written even on failure
    assert (tmp_path / "o" / "error.txt").is_file()


def test_missing_experiment_file(capsys):
    assert main(["run", "no/such/experiment.yaml"]) == 2
    err = capsys.readouterr().err
    assert "no/such/experiment.yaml" in err and "not found" in err


def test_oversize_reject_mode_accounts_rejections(tmp_path):
    cfg = _with([("kv_cache", {"num_blocks": 40, "block_size": 16, "on_oversize": "reject"})])
    out = tmp_path / "o"
    assert main(["run", str(write(tmp_path, cfg)), "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "summary.json").read_text())["requests"]
    assert r["rejected"] > 0 and r["completed"] + r["rejected"] == r["arrived"]
    assert all("KV blocks" in k for k in r["reject_reasons"])
