import io
import json
from pathlib import Path

import pytest
import yaml
from tooling_helpers import tiny

from simulator import sweeprun
from simulator.cli import main
from simulator.errors import ConfigError
from simulator.sweep import expand, point_config
from simulator.sweeprun import Progress, run_sweep

GRID = {"workload.arrival.rate_per_s": [2, 8], "scheduler.max_num_seqs": [4, 16, 64]}


def sweep(tmp_path, cfg, **kw):
    kw.setdefault("progress", False)
    return run_sweep(cfg, "tiny.yaml", Path("."), tmp_path / "out", **kw)


def test_point_count_is_product_times_seeds():
    base, points = expand(tiny(sweep=GRID, seeds=[0, 1]))
    assert len(points) == 2 * 3 * 2
    assert "sweep" not in base and "seeds" not in base
    assert points[0].folder == "rate_per_s=2,max_num_seqs=4/seed0"
    assert len({p.folder for p in points}) == len(points)
    cfg = point_config(base, points[-1])
    assert cfg["workload"]["arrival"]["rate_per_s"] == 8
    assert cfg["scheduler"]["max_num_seqs"] == 64


def test_clashing_labels_use_full_keys_and_dicts_merge():
    grid = {"a.rate": [1], "b.rate": [2], "kv_cache": [{"block_size": 32}]}
    base, points = expand(tiny(sweep=grid, kv_cache={"allocator": "paged"}))
    assert points[0].key == "a.rate=1,b.rate=2,kv_cache=block_size-32"
    cfg = point_config(base, points[0])
    assert cfg["kv_cache"] == {"allocator": "paged", "block_size": 32}


@pytest.mark.parametrize(
    "bad", [{"sweep": {"x.y": []}}, {"sweep": [1]}, {"seeds": [0, 0]}, {"seeds": [-1]}]
)
def test_bad_plans_are_config_errors(bad):
    with pytest.raises(ConfigError):
        expand(tiny(**bad))


def test_sweep_runs_indexes_and_resumes(tmp_path):
    cfg = tiny(sweep=GRID, seeds=[0, 1])
    index = sweep(tmp_path, cfg)
    assert len(index) == 12 and set(index["status"]) == {"done"}
    assert not index["resumed"].any()
    out = tmp_path / "out"
    run = out / index["folder"][0]
    assert json.loads((run / "point.json").read_text())["config_hash"] == index["config_hash"][0]
    mtime = (run / "summary.json").stat().st_mtime_ns
    again = sweep(tmp_path, cfg)
    assert again["resumed"].all()
    assert (run / "summary.json").stat().st_mtime_ns == mtime
    assert again.drop(columns="resumed").equals(index.drop(columns="resumed"))
    # a changed config changes the hash: those runs run again, the others are kept
    cfg["slo"]["ttft_ms"] = 300
    third = sweep(tmp_path, cfg)
    assert not third["resumed"].any()


def test_a_failing_point_is_recorded_and_the_rest_finish(tmp_path):
    cfg = tiny(sweep={"scheduler.max_num_seqs": [4, -1, 16]})
    index = sweep(tmp_path, cfg)
    assert list(index["status"]) == ["done", "failed", "done"]
    bad = tmp_path / "out" / index["folder"][1]
    assert "max_num_seqs" in (bad / "error.txt").read_text()
    assert (bad / "config.yaml").is_file()
    assert "max_num_seqs" in index["error"][1]
    # failed points are retried on resume, finished ones skipped
    again = sweep(tmp_path, cfg)
    assert list(again["resumed"]) == [True, False, True]


def test_an_exception_in_a_run_is_recorded(tmp_path, monkeypatch):
    import simulator.runner as runner

    real = runner.simulate

    def flaky(built):
        if built.resolved["scheduler"]["max_num_seqs"] == 8:
            raise RuntimeError("boom")
        return real(built)

    monkeypatch.setattr(runner, "simulate", flaky)
    index = sweep(tmp_path, tiny(sweep={"scheduler.max_num_seqs": [4, 8, 16]}))
    assert list(index["status"]) == ["done", "failed", "done"]
    assert "RuntimeError: boom" in index["error"][1]
    text = (tmp_path / "out" / index["folder"][1] / "error.txt").read_text()
    assert "Traceback" in text


def test_parallel_gives_the_same_files(tmp_path):
    cfg = tiny(sweep={"scheduler.max_num_seqs": [4, 16]}, seeds=[0, 1])
    a = run_sweep(cfg, "t.yaml", Path("."), tmp_path / "a", jobs=1, progress=False)
    b = run_sweep(cfg, "t.yaml", Path("."), tmp_path / "b", jobs=2, progress=False)
    assert list(a["config_hash"]) == list(b["config_hash"])
    for folder in a["folder"]:
        for name in ("summary.json", "requests.csv", "steps.csv", "config.yaml", "point.json"):
            assert (tmp_path / "a" / folder / name).read_bytes() == (
                tmp_path / "b" / folder / name
            ).read_bytes()


def test_ray_backend_missing_is_one_line(tmp_path):
    try:
        import ray  # noqa: F401

        pytest.skip("ray is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="ray is not installed"):
        sweep(tmp_path, tiny(), backend="ray")


def test_progress_line():
    s = io.StringIO()
    bar = Progress(4, 1, stream=s)
    bar.update("done")
    bar.update("skipped")
    bar.update("failed")
    assert "3/4 runs  1 skipped  1 failed" in s.getvalue().splitlines()[-1]
    assert "left" in s.getvalue().splitlines()[0]


def test_cli_sweep(tmp_path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(tiny(sweep={"scheduler.max_num_seqs": [4, 16]})))
    assert main(["sweep", str(f), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert "2 runs, 0 failed" in capsys.readouterr().out
    assert (tmp_path / "o" / "index.csv").is_file()
    assert sweeprun.INDEX_METRICS[0] in (tmp_path / "o" / "index.csv").read_text()
