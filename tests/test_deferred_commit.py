"""An arrival's commit deferred to the decode run's next commit equals step-by-step execution.

`Replica.add_request` no longer commits the sub-steps of a decode run that ended before the
arrival (`Replica._defer_commit`): they are committed with the run's next commit, their step rows
counting one request fewer waiting. Checked with ``==`` on every step row (``num_waiting``
included), inter-token gap and request column against ``coalesce=False``, through arrivals in
clumps (a second arrival while the first one's commit is still deferred), members finishing in
the deferred sub-steps (the finish path re-reads the queue lengths), a KV cache small enough to
preempt, several replicas under routers that do and do not `sync` first, and runs stopped at a
horizon (the runner's `sync`).
"""

import math

import numpy as np
import pytest

from simulator.replica import Replica
from tests.helpers import LongestAwareLatency, assert_same_outputs
from tests.policy_kit import run, spec


def _clumps(n, seed):
    """Arrivals in clumps of one to three within a millisecond (shorter than a step), clumps
    ~30 ms apart; short outputs, so members finish inside the runs that arrivals cut."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while len(out) < n:
        t += float(rng.exponential(0.03))
        for j in range(int(rng.integers(1, 4))):
            out.append(spec(t + 2e-4 * j, int(rng.integers(10, 600)), int(rng.integers(1, 120))))
    return out[:n]


def _run(monkeypatch, specs, coalesce, **kw):
    """(request columns, replicas, how often an arrival found a deferred one's commit pending)."""
    seconds = [0]
    defer = Replica._defer_commit

    def counting(self):
        seconds[0] += self._arrived_s != -math.inf
        defer(self)

    monkeypatch.setattr(Replica, "_defer_commit", counting)
    _, reps, cols = run(specs, latency=LongestAwareLatency(), coalesce=coalesce, **kw)
    monkeypatch.undo()
    return cols, reps, seconds[0]


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill", "dynamic", "vllm"])
@pytest.mark.parametrize("num_blocks", [20_000, 300])  # ample, and tight (preemptions)
def test_clumped_arrivals(monkeypatch, policy, num_blocks):
    specs = _clumps(1200, 5)
    a, ra, _ = _run(monkeypatch, specs, False, policy=policy, num_blocks=num_blocks)
    b, rb, seconds = _run(monkeypatch, specs, True, policy=policy, num_blocks=num_blocks)
    assert_same_outputs(a, ra, b, rb)
    if policy == "continuous":
        assert seconds > 20  # a second arrival found the first one's commit still deferred
    if num_blocks == 300 and policy in ("continuous", "vllm"):
        assert rb[0].num_preemptions > 0


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv"])
def test_clumped_arrivals_replicas(monkeypatch, router):
    specs = _clumps(1500, 7)
    kw = dict(replicas=3, router=router, num_blocks=600)
    a, ra, _ = _run(monkeypatch, specs, False, **kw)
    b, rb, _ = _run(monkeypatch, specs, True, **kw)
    assert_same_outputs(a, ra, b, rb)


@pytest.mark.parametrize("until", [3.0, 7.77, 15.0])
def test_clumped_arrivals_stopped_at_a_horizon(monkeypatch, until):
    specs = _clumps(800, 9)
    a, ra, _ = _run(monkeypatch, specs, False, until=until)
    b, rb, _ = _run(monkeypatch, specs, True, until=until)
    assert_same_outputs(a, ra, b, rb)


@pytest.mark.parametrize("seed", [0, 1])
def test_arrivals_on_sub_step_ends(seed):
    """Steps of a constant 1/4 s and arrivals on multiples of it: an arrival lands exactly at a
    sub-step's end, which counts as ended by then (its row does not count the arrival), as the
    arrival's own `sync` had it. Compared with that path (``_defer_ok`` off), not with
    ``coalesce=False``: at such an exact tie the step-by-step loop's row counts the arrival when
    SimPy happens to run the arrival first (so it did before this change too)."""
    from simulator.latency.constant import ConstantLatencyModel

    rng = np.random.default_rng(seed)
    ticks = np.cumsum(rng.integers(0, 4, 400))
    specs = [spec(0.25 * int(k), int(rng.integers(10, 300)), int(rng.integers(1, 40)))
             for k in ticks]  # fmt: skip
    kw = dict(latency=ConstantLatencyModel(0.25))
    _, ra, a = run(specs, wrap=lambda rep: setattr(rep, "_defer_ok", False), **kw)
    _, rb, b = run(specs, **kw)
    assert not ra[0]._defer_ok and rb[0]._defer_ok
    assert_same_outputs(a, ra, b, rb)


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_arrivals_cut_runs_planned_past_them(monkeypatch, policy):
    """Runs planned without knowing the next arrival (the horizon at infinity), so an arrival
    lands mid-run and cuts it after the sub-step in progress, the first not ended, which the
    deferred commit has not reached: `_cut_run` finds it by the ends, not by what is
    committed."""
    from simulator.cluster import Cluster

    specs = _clumps(1000, 11)
    a, ra, _ = _run(monkeypatch, specs, False, policy=policy)
    monkeypatch.setattr(Cluster, "_next_arrival_for", lambda self, position: math.inf)
    cuts = [0]
    cut = Replica._cut_run

    def counting(self):
        run = self._run
        cuts[0] += run is not None and run[-1][0] > self.env.now
        cut(self)

    monkeypatch.setattr(Replica, "_cut_run", counting)
    _, rb, b = run(specs, policy=policy, latency=LongestAwareLatency())
    assert_same_outputs(a, ra, b, rb)
    assert cuts[0] > 100
