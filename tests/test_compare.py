from pathlib import Path

import numpy as np
import pytest
from tooling_helpers import tiny

from simulator.cli import main
from simulator.compare import bootstrap_diff, compare
from simulator.sweeprun import run_sweep


def test_bootstrap_ci_contains_true_difference():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(40):
        a = rng.normal(1.0, 0.2, 20)
        b = rng.normal(1.5, 0.2, 20)
        d, lo, hi = bootstrap_diff(a, b, resamples=2000, seed=0)
        assert lo <= d <= hi
        hits += lo <= 0.5 <= hi
    assert hits >= 34  # nominal 95%; percentile bootstrap at n=20 runs a little narrow


def test_paired_bootstrap_is_tighter_with_shared_noise():
    rng = np.random.default_rng(2)
    noise = rng.normal(0, 1.0, 10)
    a, b = 5 + noise, 5.3 + noise + rng.normal(0, 0.01, 10)
    _, lo_u, hi_u = bootstrap_diff(a, b, seed=0)
    _, lo_p, hi_p = bootstrap_diff(a, b, seed=0, paired=True)
    assert lo_u < 0 < hi_u  # unpaired: the workload noise hides the difference
    assert 0.25 < lo_p < 0.3 < hi_p < 0.35


def test_bootstrap_is_deterministic():
    a, b = [1.0, 2.0, 3.0], [2.0, 3.5, 4.0]
    assert bootstrap_diff(a, b, seed=7) == bootstrap_diff(a, b, seed=7)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    grid = {"scheduler.max_num_seqs": [2, 64]}
    run_sweep(tiny(sweep=grid, seeds=[0, 1, 2]), "t.yaml", Path("."), root, progress=False)
    return root / "max_num_seqs=2", root / "max_num_seqs=64"


def test_compare_seed_folders(two):
    text = compare(*two)
    assert "ttft_p95 (ms)" in text and "B - A" in text
    assert "paired by seed" in text
    assert text.count("significant") == 2
    assert text == compare(*two)


def test_compare_two_runs_has_deltas(two, capsys):
    a, b = two[0] / "seed0", two[1] / "seed0"
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no confidence interval" in out
    row = next(line for line in out.splitlines() if line.startswith("completed"))
    assert row.split()[1:4] == ["40", "40", "+0"]


def test_compare_identical_is_zero(two):
    text = compare(two[0], two[0])
    assert "not significant" in text
    row = next(line for line in text.splitlines() if line.startswith("ttft_p95"))
    assert row.split()[4] == "+0"
