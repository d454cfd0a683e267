"""Checks from queueing theory and conservation, where numbers cannot be computed by hand."""

import numpy as np
import pytest

from simulator.latency.constant import ConstantLatencyModel
from tests.helpers import LinearLatency, run_engine, spec


def poisson_specs(n, rate, prompt, output, seed=1, output_range=None):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    if output_range is None:
        outs = np.full(n, output)
    else:
        outs = rng.integers(output_range[0], output_range[1] + 1, n)
    prompts = (
        rng.integers(prompt[0], prompt[1] + 1, n) if isinstance(prompt, tuple) else [prompt] * n
    )
    return [spec(t[i], prompts[i], outs[i]) for i in range(n)]


def test_md1_mean_wait_matches_pollaczek_khinchine():
    # batch size 1 and one output token: each request is one step of D seconds, FIFO
    D, rate, n = 0.01, 60.0, 40_000
    rho = rate * D
    cols, _ = run_engine(
        poisson_specs(n, rate, 100, 1), latency=ConstantLatencyModel(D), params={"max_num_seqs": 1}
    )
    wq = np.mean(cols["queue_s"])
    expected = rho * D / (2 * (1 - rho))  # P-K for deterministic service
    assert wq == pytest.approx(expected, rel=0.06)
    assert np.mean(cols["e2e_s"]) == pytest.approx(expected + D, rel=0.03)


def test_littles_law_engine_counters_agree_with_request_times():
    rate, n = 20.0, 6000
    specs = poisson_specs(n, rate, (50, 500), None, seed=3, output_range=(1, 200))
    cols, reps = run_engine(specs, latency=LinearLatency(), params={"max_num_seqs": 64})
    steps = np.array(reps[0].steps)
    dur, in_system = steps[:, 1], steps[:, 8] + steps[:, 9]
    span = cols["finish_s"].max() - cols["arrival_s"].min()
    L = (in_system * dur).sum() / span  # idle time has nobody in the system
    lam = n / span
    W = np.mean(cols["e2e_s"])
    assert L == pytest.approx(lam * W, rel=0.05)


@pytest.mark.parametrize("ids", [False, True], ids=["counts", "block_ids"])
@pytest.mark.parametrize("num_blocks", [20_000, 700])  # ample memory, and heavy preemption
def test_conservation_tokens_blocks_requests(num_blocks, ids):
    """Also: the paged allocator that keeps block ids (`PagedTableAllocator`, what the real-GPU
    executor gets) gives the same run as the one that keeps counts (`PagedAllocator`)."""
    from simulator.kv.paged import PagedAllocator, PagedTableAllocator

    specs = poisson_specs(3000, 40.0, (20, 800), None, seed=5, output_range=(1, 400))
    kind = PagedTableAllocator if ids else PagedAllocator
    cols, reps = run_engine(specs, latency=LinearLatency(), num_blocks=num_blocks,
                            make_kv=lambda: kind(num_blocks, 16))  # fmt: skip
    rep = reps[0]
    if ids:
        counted, creps = run_engine(specs, latency=LinearLatency(), num_blocks=num_blocks)
        for k in cols:
            assert np.array_equal(cols[k], counted[k], equal_nan=cols[k].dtype.kind == "f"), k
        assert np.array_equal(np.array(rep.steps), np.array(creps[0].steps))
        assert (rep.itl_gaps, rep.itl_counts) == (creps[0].itl_gaps, creps[0].itl_counts)
        assert sorted(rep.kv._free) == list(range(num_blocks))  # every id back exactly once
    assert (cols["status"] == "finished").all()
    assert (cols["generated_tokens"] == cols["output_tokens"]).all()
    # every token after the first is one inter-token gap
    assert sum(rep.itl_counts) == int((cols["output_tokens"] - 1).sum())
    assert rep.kv.num_free_blocks == num_blocks
    assert rep.num_preemptions == int(cols["preemptions"].sum())
    if num_blocks == 700:
        assert rep.num_preemptions > 0
    # causality
    assert (cols["first_token_s"] > cols["arrival_s"]).all()
    assert (cols["finish_s"] >= cols["first_token_s"]).all()


def test_decode_runs_give_identical_results_to_step_by_step():
    specs = poisson_specs(2000, 30.0, (20, 800), None, seed=7, output_range=(1, 300))
    kw = dict(latency=LinearLatency(), num_blocks=400)
    a, ra = run_engine(specs, coalesce=False, **kw)
    b, rb = run_engine(specs, coalesce=True, **kw)
    for k in ("first_token_s", "finish_s", "preemptions"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12)
    assert len(ra[0].steps) == len(rb[0].steps)
    assert ra[0].num_preemptions == rb[0].num_preemptions > 0
    np.testing.assert_allclose(np.array(ra[0].steps), np.array(rb[0].steps), rtol=1e-12)
    assert ra[0].itl_counts == rb[0].itl_counts


def test_throughput_saturates_at_service_capacity():
    # batch 1, constant D: the engine cannot complete more than 1/D requests per second
    D = 0.01
    specs = poisson_specs(5000, 300.0, 10, 1, seed=9)
    cols, _ = run_engine(specs, latency=ConstantLatencyModel(D), params={"max_num_seqs": 1})
    span = cols["finish_s"].max() - cols["arrival_s"].min()
    assert len(specs) / span == pytest.approx(1 / D, rel=0.01)


class _CheckingExecutor:
    """Steps costed by ``latency``, one at a time; checks the features' longest decode context
    against every decoding request's own context."""

    can_precompute = False

    def __init__(self, latency):
        self.latency = latency
        self.step_time = latency.step_time
        self.checked = 0

    def execute(self, plan, replica, features):
        want = 0
        if plan.decode:
            want = max((r.num_computed + 1 for r in replica.decoding), default=0)
        for req, n in plan.chunks:
            if n == 1 and req.num_computed > 0 and not plan.verify:
                want = max(want, req.num_computed + 1)
        assert features[5] == want
        if features[3]:
            self.checked += 1
            assert features[4] / features[3] <= features[5] <= features[4]
        return self.step_time(*features) + plan.extra_s


def test_longest_decode_context_is_exact_and_decode_runs_agree():
    """The longest decode context the engine hands the latency model equals the brute-force
    maximum over the decoding requests, and precomputed decode runs (coalesced) advance it
    exactly as step-by-step execution does, even when the model's time depends on it."""
    from simulator.executor import SimulatedExecutor
    from tests.helpers import LongestAwareLatency
    from tests.policy_kit import run

    specs = poisson_specs(600, 30.0, (20, 800), None, seed=3, output_range=(1, 300))
    lat = LongestAwareLatency()
    checker = _CheckingExecutor(lat)
    _, _, ref = run(specs, "continuous", None, latency=lat, num_blocks=400,
                    coalesce=False, wrap=lambda rep: setattr(rep, "executor", checker))  # fmt: skip
    assert checker.checked > 1000
    for coalesce in (False, True):
        _, _, cols = run(specs, "continuous", None, latency=lat, num_blocks=400,
                         coalesce=coalesce)  # fmt: skip
        np.testing.assert_allclose(cols["finish_s"], ref["finish_s"], rtol=1e-12, atol=1e-12)
    assert SimulatedExecutor(lat).can_precompute


def test_longest_context_heap_stays_bounded():
    """Stale entries of requests that left are dropped, so the heap does not grow with the
    number of requests ever decoded."""
    from simulator.decode import DecodeSet
    from simulator.request import Request

    d = DecodeSet()
    live = []
    for i in range(5000):
        req = Request(i, 0.0, 10 + i % 97, 50)
        req._num_computed = req.num_tokens - 1
        d.add(req, capacity=10_000)
        live.append(req)
        if len(live) > 20:
            d.remove(live.pop(0))
        d.clock += 1
        assert d.decode_max() == max(d.clock + 1 + r._dbase for r in live)
    assert len(d._longest) <= 2 * len(d.members) + 64 + 1


def test_an_executor_that_reads_block_ids_gets_an_allocator_with_ids(monkeypatch):
    """A run whose executor reads block ids (`reads_block_ids`, the real-GPU one) gets the
    paged allocator that keeps them, and the same results as a run on counts (preemptions
    included: a small cache at a high rate)."""
    from simulator import runner
    from simulator.executor import SimulatedExecutor
    from simulator.kv.paged import PagedAllocator, PagedTableAllocator
    from tests.policy_kit import REPO, config

    class ReadsIds(SimulatedExecutor):
        reads_block_ids = True

    kinds, make = [], runner.Replica

    def replica(env, i, policy, kv, *a, **kw):
        kinds.append(type(kv))
        return make(env, i, policy, kv, *a, **kw)

    cfg = config(rate=20.0, n=400, kv_cache={"num_blocks": 1200}, cluster={"replicas": 2})
    monkeypatch.setattr(runner, "Replica", replica)
    # a build each: a Built's round-robin router keeps its position from one run to the next
    counted = runner.simulate(runner.build(cfg, str(REPO / "test.yaml"), REPO))
    assert kinds == [PagedAllocator] * 2
    with_ids = runner.simulate(
        runner.build(cfg, str(REPO / "test.yaml"), REPO),
        executor_factory=lambda lat, i: ReadsIds(lat),
    )
    assert kinds[2:] == [PagedTableAllocator] * 2
    assert counted.requests["preemptions"].sum() > 0
    for part in ("requests", "steps"):
        a, b = getattr(counted, part), getattr(with_ids, part)
        for k in a:
            assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
