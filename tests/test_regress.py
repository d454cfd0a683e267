import json

import pytest
import yaml
from tooling_helpers import tiny

from simulator.cli import main
from simulator.regress import compare_metrics, load_tolerances


def test_compare_metrics_flags_a_20_percent_worse_p95():
    default, per = load_tolerances(None)
    base = {"ttft_p95_s": 0.100, "goodput_rps": 3.0, "kv_use_mean": 0.5}
    assert compare_metrics(base, dict(base), default, per) == []
    worse = compare_metrics(base, {**base, "ttft_p95_s": 0.120}, default, per)
    assert [(f["metric"], f["kind"]) for f in worse] == [("ttft_p95_s", "worse")]
    better = compare_metrics(base, {**base, "goodput_rps": 3.6}, default, per)
    assert [f["kind"] for f in better] == ["better"]
    moved = compare_metrics(base, {**base, "kv_use_mean": 0.8}, default, per)
    assert [f["kind"] for f in moved] == ["changed"]
    assert compare_metrics(base, {**base, "ttft_p95_s": 0.104}, default, per) == []


def test_tolerance_file(tmp_path):
    f = tmp_path / "tol.yaml"
    f.write_text("metrics:\n  ttft_p95_s: {rel: 0.5}\n")
    default, per = load_tolerances(f)
    base = {"ttft_p95_s": 0.100}
    assert compare_metrics(base, {"ttft_p95_s": 0.120}, default, per) == []
    f.write_text("metrics:\n  ttft_p96_s: {rel: 0.5}\n")
    with pytest.raises(Exception, match="unknown metric"):
        load_tolerances(f)


@pytest.fixture
def exp_dir(tmp_path):
    d = tmp_path / "experiments"
    d.mkdir()
    cfg = tiny(sweep={"scheduler.max_num_seqs": [4, 64]}, seeds=[3, 4],
               regress={"max_requests": 20})  # fmt: skip
    (d / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    (d / "not_in_ci.yaml").write_text(yaml.safe_dump(tiny()))
    return d


def test_regress_update_pass_and_fail(exp_dir, tmp_path, capsys):
    base = tmp_path / "baselines"
    args = ["regress", str(exp_dir), "--baseline", str(base)]
    assert main(args) == 1  # no baseline yet
    assert "no baseline" in capsys.readouterr().out
    assert main(args + ["--update"]) == 0
    doc = json.loads((base / "tiny.json").read_text())
    assert sorted(doc["points"]) == ["max_num_seqs=4/seed3", "max_num_seqs=64/seed3"]
    assert doc["points"]["max_num_seqs=4/seed3"]["completed"] == 20
    capsys.readouterr()
    assert main(args) == 0  # identical run passes
    assert "regress passed" in capsys.readouterr().out
    # make the baseline 20% better than what the code does now: the run is a regression
    pt = doc["points"]["max_num_seqs=4/seed3"]
    pt["ttft_p95_s"] = pt["ttft_p95_s"] / 1.2
    (base / "tiny.json").write_text(json.dumps(doc))
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "ttft_p95" in out and "WORSE" in out


def test_regress_point_set_change_fails(exp_dir, tmp_path, capsys):
    base = tmp_path / "baselines"
    args = ["regress", str(exp_dir), "--baseline", str(base)]
    assert main(args + ["--update"]) == 0
    cfg = yaml.safe_load((exp_dir / "tiny.yaml").read_text())
    cfg["sweep"]["scheduler.max_num_seqs"] = [4, 128]
    (exp_dir / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "new point" in out and "not run now" in out
