"""Decode runs that go on past finishes (`Replica._plan_past_finishes`) equal step-by-step runs.

With nothing but the decode set queued or running, continuous batching and chunked prefill
plan the decode of the remaining members after a finish, so a coalesced run goes on with them
instead of ending at the finish. The features of every step past a finish (batch size, context
sum and the longest context, read off the set's heaps without changing them) must be what the
step-by-step loop computes: checked with ``==`` on every step row, inter-token gap and request
column, with a latency model that reads all three (`LongestAwareLatency`), through bursts whose
members finish on the same step (twins), whose longest member finishes first, and a KV cache
small enough that the run's KV bound and preemptions cut runs.
"""

import numpy as np
import pytest

from simulator.replica import Replica
from tests.helpers import LongestAwareLatency, run_engine, spec
from tests.test_core_physics import poisson_specs


def _burst(n, seed):
    """``n`` requests within 50 ms: all admitted, then decoded with nobody waiting; equal
    outputs (several finish on one step) and long prompts with short outputs (the longest
    context leaves first)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = int(rng.integers(20, 800)) if i % 5 else 900 + i
        output = int(rng.integers(1, 200)) if i % 3 else 40 + (i % 2)
        if i % 5 == 0:
            output = 3 + i % 4
        out.append(spec(0.001 * i, prompt, output))
    return out


def _runs(monkeypatch, specs, policy, coalesce, **kw):
    """(request columns, replica, decode runs planned)."""
    planned = []
    plan = Replica._plan_decode_run

    def counting(self, start, wake_at):
        planned.append(start)
        plan(self, start, wake_at)

    monkeypatch.setattr(Replica, "_plan_decode_run", counting)
    cols, reps = run_engine(specs, policy=policy, latency=LongestAwareLatency(), coalesce=coalesce,
                            **kw)  # fmt: skip
    monkeypatch.undo()
    return cols, reps[0], len(planned)


def _same(a, ra, b, rb):
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
    assert np.array_equal(np.array(ra.steps), np.array(rb.steps))
    assert (ra.itl_gaps, ra.itl_counts) == (rb.itl_gaps, rb.itl_counts)
    assert ra.num_preemptions == rb.num_preemptions


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_burst_runs_past_finishes(monkeypatch, policy, seed):
    specs = _burst(60, seed)
    a, ra, _ = _runs(monkeypatch, specs, policy, False)
    b, rb, runs = _runs(monkeypatch, specs, policy, True)
    _same(a, ra, b, rb)
    finishes = len(set(b["finish_s"].tolist()))  # distinct finish steps
    assert runs < finishes / 2  # the runs did go on past most finishes
    assert rb.decoding._fin == [] or all(r._dset is None for _, _, r in rb.decoding._fin)


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
@pytest.mark.parametrize("num_blocks", [20_000, 400])  # ample, and tight (KV bound, preemption)
def test_poisson_runs_past_finishes(monkeypatch, policy, num_blocks):
    specs = poisson_specs(1500, 30.0, (20, 800), None, seed=11, output_range=(1, 300))
    a, ra, _ = _runs(monkeypatch, specs, policy, False, num_blocks=num_blocks)
    b, rb, _ = _runs(monkeypatch, specs, policy, True, num_blocks=num_blocks)
    _same(a, ra, b, rb)
    if num_blocks == 400:
        assert rb.num_preemptions > 0
