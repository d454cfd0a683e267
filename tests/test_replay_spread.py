"""`profiles.replay_spread`: two serving replays of the same arrivals, compared metric by
metric (CPU; hand-built replays whose differences are known exactly)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from profiles.replay_spread import compare_phases, compare_runs, metric_values, with_replays
from profiles.vllm_validate import load_phase
from simulator.errors import ConfigError

PRINT = {"arrivals_sha256_16": "abc", "num_requests": 3, "model": "m", "gpu": "h200", "tp": 1,
         "engine": "vllm-0.24.0"}  # fmt: skip


def _phase(scale: float, fingerprint: dict | None = None) -> dict:
    """Three requests submitted at 0, 1 and 2 s; every time after its submission x ``scale``
    (so every latency x ``scale``, and the span from the first submission to the last token
    too, apart from the submissions themselves)."""
    reqs = {}
    for i in range(3):
        t0 = float(i)
        outs = [[t0 + scale * d, 1] for d in (0.1 * (i + 1), 0.3 + 0.1 * i, 0.6 + 0.2 * i)]
        reqs[f"r{i}"] = {"t_submit": t0, "times": outs}
    return {"requests": reqs, "fingerprint": dict(fingerprint or PRINT)}


def test_twice_as_slow_everywhere_is_plus_100_percent_on_every_latency():
    got = compare_phases(_phase(1.0), _phase(2.0), "b.json.gz")
    by = {m["metric"]: m for m in got["metrics"]}
    for name, m in by.items():
        if not name.startswith("throughput"):
            assert m["b"] == pytest.approx(2 * m["a"]), name
            assert m["err"] == pytest.approx(1.0), name
    # throughput: 3 requests over first submission (0 s) to last token; a: 2 + 1.0 = 3.0 s,
    # b: 2 + 2.0 = 4.0 s -> 3/3 and 3/4 req/s
    assert by["throughput.requests_per_s"]["a"] == pytest.approx(1.0)
    assert by["throughput.requests_per_s"]["err"] == pytest.approx(0.75 - 1)
    assert got["median_abs_err"] == pytest.approx(1.0)
    assert got["max_abs_err"] == pytest.approx(1.0)


def test_the_same_run_twice_differs_by_nothing():
    got = compare_phases(_phase(1.3), _phase(1.3), "b.json.gz")
    assert [m["err"] for m in got["metrics"]] == [0.0] * len(got["metrics"])


@pytest.mark.parametrize("field", ["arrivals_sha256_16", "model", "gpu"])
def test_a_replay_of_other_arrivals_or_another_model_is_refused(field):
    other = dict(PRINT, **{field: "other"})
    with pytest.raises(ConfigError) as e:
        compare_phases(_phase(1.0), _phase(1.0, other), "runs/b/conv_light.json.gz")
    assert e.value.where == "runs/b/conv_light.json.gz"
    assert e.value.key == f"fingerprint.{field}"
    assert "'other'" in e.value.message and "same experiment" in e.value.message


def _store(folder, case: str, phase: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / f"{case}.json.gz", "wt") as f:
        json.dump(phase, f)


def test_runs_compare_the_cases_both_hold_and_refuse_none_in_common(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _store(a, "conv_light", _phase(1.0))
    _store(a, "conv_heavy", _phase(1.0))
    _store(b, "conv_light", _phase(1.5))
    got = compare_runs(a, b, ["conv_light", "conv_heavy", "arxiv_light"])
    assert list(got) == ["conv_light"]
    assert got["conv_light"]["median_abs_err"] == pytest.approx(0.5)
    with pytest.raises(ConfigError) as e:
        compare_runs(a, b, ["arxiv_light"])
    assert e.value.where == str(b) and "no case stored in both runs" in e.value.message


SCRIPT = Path(__file__).resolve().parents[1] / "validation/vllm-0.24/replay_spread.py"


def test_the_script_compares_two_stored_replays_and_names_a_missing_half():
    runs = SCRIPT.parent / "serving_repeats"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--a", str(runs / "h200_qwen3-30b-a3b_host2_first"),
         "--b", str(runs / "h200_qwen3-30b-a3b_host2_second")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # six cases x 14 values; the published figures (validation/vllm-0.24/README.md)
    assert "| all | 84 | 4.4% | 16 | 33% |" in done.stdout
    half = subprocess.run([sys.executable, str(SCRIPT), "--a", str(runs)],
                          capture_output=True, text=True)  # fmt: skip
    assert half.returncode == 2 and "--a and --b go together" in half.stderr


def test_with_replays_sets_each_other_replay_beside_the_first():
    first, slower, faster = _phase(1.0), _phase(1.5), _phase(0.5)
    vals = metric_values(first)
    # a report case as `report_case` writes it: the simulated value 25% above the first replay
    case = {"metrics": [{"metric": k, "sim": 1.25 * v, "real": v, "err": 0.25}
                        for k, v in vals.items()]}  # fmt: skip
    got = with_replays(case, first, [("b.json.gz", slower), ("c.json.gz", faster)])
    by = {m["metric"]: m for m in got["metrics"]}
    ttft = by["ttft_s.p50"]
    assert ttft["replays"] == pytest.approx([1.5 * ttft["real"], 0.5 * ttft["real"]])
    assert ttft["replay_errs"] == pytest.approx([0.5, -0.5])
    assert ttft["sim_within_replays"]  # 1.25x lies between 0.5x and 1.5x
    # throughput: spans 3.0 (first), 3.5 and 2.5 s -> the others at 3/3.5 and 3/2.5 of it
    thr = by["throughput.requests_per_s"]
    assert thr["replay_errs"] == pytest.approx([3 / 3.5 - 1, 3 / 2.5 - 1])
    assert not thr["sim_within_replays"]  # 1.25x lies above the faster replay's 1.2x
    assert got["replay_spread"]["replays"] == 3
    assert got["replay_spread"]["max_abs_diff"] == pytest.approx(0.5)


def test_with_replays_refuses_a_replay_of_other_arrivals():
    first = _phase(1.0)
    case = {"metrics": [{"metric": k, "sim": v, "real": v, "err": 0.0}
                        for k, v in metric_values(first).items()]}  # fmt: skip
    other = _phase(1.0, dict(PRINT, arrivals_sha256_16="zzz"))
    with pytest.raises(ConfigError) as e:
        with_replays(case, first, [("runs/c/conv_light.json.gz", other)])
    assert e.value.where == "runs/c/conv_light.json.gz"


def test_validate_engine_vllm_sets_other_replays_beside_the_first(tmp_path, capsys):
    from simulator.cli import main

    here = SCRIPT.parent
    runs = here / "serving_repeats"
    args = ["validate", "--engine", "vllm", str(here / "configs/conv.yaml"),
            "--set", "workload.arrival.rate_scale=3.75", "--set", "model=qwen3-30b-a3b",
            "--set", "hardware.gpu=h200", "--name", "conv_moderate",
            "--real", str(runs / "h200_qwen3-30b-a3b_host2_first")]  # fmt: skip
    also = ["--also-real", str(runs / "h200_qwen3-30b-a3b_host2_second")]
    assert main(args + also + ["--out", str(tmp_path / "ok")]) == 0
    rep = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert rep["replay_spread"]["replays"] == 2
    first, second = (
        metric_values(load_phase(runs / f"h200_qwen3-30b-a3b_host2_{d}" / "conv_moderate.json.gz"))
        for d in ("first", "second")
    )
    for m in rep["metrics"]:
        assert m["real"] == pytest.approx(first[m["metric"]])
        assert m["replays"] == pytest.approx([second[m["metric"]]])
    assert "other replays" in capsys.readouterr().out
    # another case's replay as the second: refused, naming its file and the fingerprint field
    wrong = ["--also-real", str(tmp_path / "wrong")]
    (tmp_path / "wrong").mkdir()
    src = runs / "h200_qwen3-30b-a3b_host2_second" / "conv_light.json.gz"
    (tmp_path / "wrong" / "conv_moderate.json.gz").write_bytes(src.read_bytes())
    assert main(args + wrong + ["--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "wrong/conv_moderate.json.gz" in err and "fingerprint.arrivals_sha256_16" in err


def test_leave_one_out_predicts_each_run_by_the_median_of_the_others():
    from profiles.replay_spread import leave_one_out

    # three runs of one case: 1, 2 and 4 s; a second case held by two runs only
    vals = {
        "a": {"c1": {"ttft": 1.0}, "c2": {"ttft": 1.0}},
        "b": {"c1": {"ttft": 2.0}, "c2": {"ttft": 3.0}},
        "c": {"c1": {"ttft": 4.0}},
    }
    got = {(ref, case): err for ref, case, _, err in leave_one_out(vals, min_others=2)}
    # a: median(2, 4) = 3 -> +200%; b: median(1, 4) = 2.5 -> +25%; c: median(1, 2) = 1.5 -> -62.5%
    assert got == pytest.approx({("a", "c1"): 2.0, ("b", "c1"): 0.25, ("c", "c1"): -0.625})
    # with one other enough, c2 enters as a plain replay pair, both ways
    pair = {(r, c): e for r, c, _, e in leave_one_out(vals, min_others=1) if c == "c2"}
    assert pair == pytest.approx({("a", "c2"): 2.0, ("b", "c2"): 1 / 3 - 1})


def test_beyond_ratio_counts_misses_on_the_same_values():
    from profiles.replay_spread import beyond_ratio

    oracle = [0.2, -0.16, 0.1, 0.15]  # two beyond 15% (0.15 itself is not)
    assert beyond_ratio([0.3, 0.01, -0.4, 0.2], oracle, 0.15) == "1.50x"
    assert beyond_ratio([0.0, 0.0, 0.0, 0.0], oracle, 0.15) == "0.00x"
    assert beyond_ratio([0.5], [0.01], 0.15) == "-"  # the oracle misses nothing: no scale
