"""Inter-token gaps kept in lists and packed into arrays (`simulator.steplog.TokenGaps`) equal
the arrays appended value by value, wherever the packs fall.

The replica appends each (gap, count) pair to two lists and moves them into ``array('d')`` /
``array('q')`` once `GAP_CHUNK` are pending (`Replica._loop`) and on every read. Checked with
``==`` against the plain arrays, for packs after every pair, at random points and never, and in
whole runs whose `GAP_CHUNK` is 1, 3 or the default (the arrays must not depend on it).
"""

from array import array

import numpy as np
import pytest

import simulator.replica
from simulator.steplog import TokenGaps
from tests.helpers import LongestAwareLatency
from tests.policy_kit import run, spec


@pytest.mark.parametrize("every", [1, 7, None])
def test_packed_gaps_equal_appended_arrays(every):
    rng = np.random.default_rng(3)
    log, gaps, counts = TokenGaps(), array("d"), array("q")
    for i in range(1000):
        g = float(rng.exponential(0.02)) if i % 5 else 0.0
        c = int(rng.integers(1, 300)) if i % 3 else 1
        log.gap(g)
        log.count(c)
        gaps.append(g)
        counts.append(c)
        if every is not None and i % every == 0:
            log.pack()
        if i == 500:  # a read in the middle packs and leaves the rest to come after it
            assert log.gap_array() == gaps
    assert log.gap_array() == gaps
    assert log.count_array() == counts
    assert not log.gaps and not log.counts
    assert log.gap_array() == gaps  # reading again changes nothing


def _specs(n=300, seed=1):
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += float(rng.exponential(0.02))
        out.append(spec(t, int(rng.integers(10, 900)), int(rng.integers(1, 200))))
    return out


@pytest.mark.parametrize("policy", ["continuous", "static"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_runs_do_not_depend_on_gap_chunk(monkeypatch, policy, chunk):
    specs = _specs()
    _, base, _ = run(specs, policy, latency=LongestAwareLatency())
    monkeypatch.setattr(simulator.replica, "GAP_CHUNK", chunk)
    _, small, _ = run(specs, policy, latency=LongestAwareLatency())
    for a, b in zip(base, small, strict=True):
        assert len(a.itl_counts) > 100
        assert (a.itl_gaps, a.itl_counts) == (b.itl_gaps, b.itl_counts)
        assert sum(a.itl_counts) == sum(int(x) for x in b.itl_counts)
