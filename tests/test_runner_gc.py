"""`simulator.runner.fewer_collections`: the interpreter's GC thresholds are restored."""

from __future__ import annotations

import gc

import pytest

from simulator.runner import GC_GEN0_THRESHOLD, fewer_collections


def test_thresholds_are_raised_inside_and_restored_after_even_on_error():
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, before[1], before[2])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before
