from pathlib import Path

import pytest
from tooling_helpers import tiny

from simulator.cli import main
from simulator.plots import plot_results
from simulator.sweeprun import run_sweep


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots") / "sweep"
    grid = {"workload.arrival.rate_per_s": [2, 8], "scheduler.max_num_seqs": [4, 64]}
    run_sweep(tiny(sweep=grid, seeds=[0, 1]), "t.yaml", Path("."), out, progress=False)
    return out


def test_sweep_figures(sweep_dir, tmp_path):
    files = plot_results(sweep_dir, tmp_path)
    stems = {f.stem for f in files}
    assert stems == {"ttft_vs_rate", "tpot_vs_rate", "goodput_vs_rate", "latency_cdf",
                     "timeseries"}  # fmt: skip
    for f in files:
        assert f.stat().st_size > 1000
        assert f.read_bytes()[:4] in (b"\x89PNG", b"<?xm")


def test_figures_are_reproducible(sweep_dir, tmp_path):
    a = plot_results(sweep_dir, tmp_path / "a")
    b = plot_results(sweep_dir, tmp_path / "b")
    for fa, fb in zip(a, b, strict=True):
        if fa.suffix == ".svg":
            assert fa.read_bytes() == fb.read_bytes()


def test_single_run_folder(sweep_dir, tmp_path, capsys):
    run = sweep_dir / "rate_per_s=2,max_num_seqs=4"  # a folder of seedN runs
    assert main(["plot", str(run), "--out", str(tmp_path)]) == 0
    assert {p.stem for p in tmp_path.glob("*.png")} == {"latency_cdf", "timeseries"}


def test_not_a_results_folder(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "neither a sweep folder" in capsys.readouterr().err


def test_lines_of_other_models_name_their_own_model_and_latency_model(tmp_path):
    """A swept model (here one model in two precisions) gives each line its own model and
    latency model: the title must not print the first run's as everybody's."""
    import pandas as pd

    from simulator.plots import Sweep

    out = tmp_path / "sweep"
    models = ["llama-3-8b", {"base": "llama-3-8b", "weights": "fp8", "kv_cache_dtype": "fp8"}]
    grid = {"workload.arrival.rate_per_s": [2, 8], "model": models}
    cfg = tiny(sweep=grid, seeds=[0], hardware={"gpu": "h100", "tp": 1},
               latency={"model": "roofline"})  # fmt: skip
    run_sweep(cfg, "t.yaml", Path("."), out, progress=False)
    sweep = Sweep(out, pd.read_csv(out / "index.csv"))
    assert sweep.per_line == ["model"]
    assert sweep.labels == ["llama-3-8b", "llama-3-8b (fp8, KV fp8)"]
    assert "models per line" in sweep.title()


def test_lines_of_other_models_keep_their_other_swept_values_once(tmp_path):
    """A swept model and another swept key: each line is named by its model, then the other
    key as ``key=value`` (the model is not repeated in the parentheses); labels that long put
    the legend below the axes, where it covers no line."""
    import pandas as pd

    from simulator.plots import Sweep, _goodput

    out = tmp_path / "sweep"
    grid = {"workload.arrival.rate_per_s": [2, 8], "model": ["llama-3-8b", "qwen2.5-7b"],
            "scheduler.max_num_seqs": [4, 64]}  # fmt: skip
    cfg = tiny(sweep=grid, seeds=[0], hardware={"gpu": "h100", "tp": 1},
               latency={"model": "roofline"})  # fmt: skip
    run_sweep(cfg, "t.yaml", Path("."), out, progress=False)
    sweep = Sweep(out, pd.read_csv(out / "index.csv"))
    assert sweep.labels == [
        f"{m} (max_num_seqs={n})" for m in ("llama-3-8b", "qwen2.5-7b") for n in (4, 64)
    ]
    fig = _goodput(sweep, sweep.title())
    assert not fig.legends and fig.axes[0].get_legend() is not None  # short labels: inside
    sweep.df["label"] = sweep.df["label"] + " with a name long enough to cover a plot"
    sweep.labels = list(dict.fromkeys(sweep.df["label"]))
    fig = _goodput(sweep, sweep.title())
    assert len(fig.legends) == 1 and fig.axes[0].get_legend() is None
    assert len(fig.legends[0].get_texts()) == 5  # four lines and the offered load
