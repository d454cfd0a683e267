"""`decode_run_times` (a decode run's step times in one call) against one `step_time` a step.

The replica charges every precomputed decode run through it, so runs must stay byte-identical
to step-by-step costing: the same floats (==, not approx), the same number of steps (the
``until`` cut sums the times in order) and the same warnings, for every shipped torch table,
over runs that cross the decode grid's mean-context segments, pass its largest context and its
largest batch (extrapolation), and at batches with and without a padded CUDA graph.
"""

from __future__ import annotations

import glob
import math
import os
import random
import warnings
import zlib

import pytest

from simulator.latency.base import decode_run_times
from simulator.latency.constant import ConstantLatencyModel
from simulator.latency.engine_steps import is_engine_table
from simulator.latency.profiled import load_for_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = sorted(
    os.path.relpath(os.path.dirname(p), REPO)
    for p in glob.glob(os.path.join(REPO, "profiles", "*", "**", "meta.yaml"), recursive=True)
    if not is_engine_table(os.path.dirname(p)) and "kind: collectives" not in open(p).read()
)


def _runs(seed: int, count: int):
    """Random decode runs (n, ctx, longest, k, start, until)."""
    rng = random.Random(seed)
    for i in range(count):
        n = rng.choice([1, 2, 3, 5, 7, 8, 9, 17, 31, 64, 100, 129, 255, 256, 300, 511, 513, 900])
        kind = i % 4
        if kind == 0:  # mean context just below a power of two: the run crosses a grid edge
            mean = 2 ** rng.randint(1, 20) - rng.randint(0, 40)
        elif kind == 1:  # past the grid's largest mean / total context: extrapolated
            mean = rng.randint(2**20 - 30, 2**21)
        else:
            mean = rng.randint(1, 20000)
        ctx = n * max(mean, 1) + rng.randint(0, n - 1)
        longest = rng.choice([0, -(-ctx // n), min(ctx, -(-ctx // n) * 3), ctx])
        k = rng.randint(1, 80)
        start = rng.uniform(0.0, 5000.0)
        until = start + rng.choice([math.inf, rng.uniform(0.0, 0.5), 0.0])
        yield n, ctx, longest, k, start, until


@pytest.mark.parametrize("table", TABLES)
def test_profile_decode_run_matches_step_time(table):
    """Two fresh models (warnings are once per model): one fast, one step by step."""
    fast, slow = load_for_report(table), load_for_report(table)
    assert fast.describe()["warnings"] == slow.describe()["warnings"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for args in _runs(zlib.crc32(table.encode()), 400):
            got = fast.decode_run_times(*args)
            want = decode_run_times(slow.step_time, *args)
            assert got == want, (table, args)
            assert fast.describe()["warnings"] == slow.describe()["warnings"], (table, args)


def test_shipped_tables_found():
    assert len(TABLES) >= 10
    assert "profiles/h200/llama-3-8b_tp1" in TABLES


def test_generic_run_cut_and_length():
    """The default: one step_time a step, at most max(k, 1) steps, cut at ``until``."""
    m = ConstantLatencyModel(0.01)
    assert decode_run_times(m.step_time, 4, 100, 30, 0, 0.0, math.inf) == [0.01]
    assert decode_run_times(m.step_time, 4, 100, 30, 5, 0.0, math.inf) == [0.01] * 5
    # ends: 0.01, 0.02, 0.03 (the first at or after 0.025 closes the run)
    assert len(decode_run_times(m.step_time, 4, 100, 30, 50, 0.0, 0.025)) == 3
    seen = []
    decode_run_times(lambda *f: seen.append(f) or 1.0, 3, 10, 5, 3, 0.0, math.inf)
    assert seen == [(0, 0.0, 0, 3, 10, 5), (0, 0.0, 0, 3, 13, 6), (0, 0.0, 0, 3, 16, 7)]
