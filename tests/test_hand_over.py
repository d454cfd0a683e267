"""Replicas that take their own arrivals (round robin) give the same run as one event per arrival.

`Cluster.start(hand_over=True)`: no SimPy event per request; each replica takes its arrivals
when its process next runs, as `add_request` at the arrival's own clock (`Replica._arrive`),
and `Cluster._finale` does at the last arrival's clock what the arrivals process does after it.
Checked with ``==`` on every request column, step row and inter-token gap against
``hand_over=False`` (the SimPy process), for every coalescable policy, one and three replicas,
ample and tight KV (preemptions), runs stopped at horizons; exact ties between a replica's events
and its arrivals raise `ArrivalTie`, and `runner.simulate` then starts over with the process.
"""

import math

import numpy as np
import pytest
import simpy

from policies.routing import ROUTERS
from simulator import replica as replica_module
from simulator.cfg import Section
from simulator.cluster import ArrivalTie, Cluster, OwnArrivals, arrival_event_times, delays_to
from simulator.kv.paged import PagedAllocator
from simulator.latency.constant import ConstantLatencyModel
from simulator.runner import build, simulate
from tests.helpers import LongestAwareLatency, assert_same_outputs
from tests.policy_kit import REPO, config, engine_facts, make_engine, spec


def _poisson(n, rate, seed, prompt=(10, 900), output=(1, 150)):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return [
        spec(float(t[i]), int(rng.integers(*prompt)), int(rng.integers(*output))) for i in range(n)
    ]


def _run(specs, hand_over, *, policy="continuous", params=None, replicas=1, num_blocks=20_000,
         until=None, latency=None, coalesce=True, told="until"):  # fmt: skip
    """(request table, replicas) of ``specs`` under round robin, as `runner.simulate` runs them."""
    env = simpy.Environment()
    cluster = Cluster(
        env, list(specs), ROUTERS["round_robin"](Section({}, "t.yaml")), keep_requests=False
    )
    reps = []
    for i in range(replicas):
        engine = engine_facts(num_blocks, 16, 8192, seed=i)
        rep = make_engine(
            env, i, policy, params, latency=latency or LongestAwareLatency(),
            kv=PagedAllocator(num_blocks, 16), coalesce=coalesce, engine=engine,
        )  # fmt: skip
        cluster.add_replica(rep)
        reps.append(rep)
    assert cluster.can_hand_over()
    cluster.start(hand_over, until if told == "until" else told)  # not to run ahead past it
    env.run(until=until)
    if until is not None:
        if hand_over:
            cluster.take_late_arrivals(until)
        for rep in reps:
            rep.sync()
    return cluster.log.table(0.0), reps, cluster.num_arrived, env.now


def _same(a, b):
    (ca, ra, na, ea), (cb, rb, nb, eb) = a, b
    assert na == nb
    assert ea == eb and type(ea) is type(eb)  # the clock at the end (the summary's end_s)
    assert ca.keys() == cb.keys()
    assert_same_outputs(ca, ra, cb, rb)
    for x, y in zip(ra, rb, strict=True):
        assert [r.id for r in x.waiting] == [r.id for r in y.waiting]
        assert [r.queued_s for r in x.waiting] == [r.queued_s for r in y.waiting]
        assert sorted(x.running) == sorted(y.running)


POLICIES = [
    ("continuous", None),
    ("chunked_prefill", None),
    ("vllm", None),
    ("dynamic", {"max_wait_s": 0.04}),
    ("static", {"batch_size": 8}),
]


@pytest.mark.parametrize("policy,params", POLICIES)
@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("num_blocks", [20_000, 400])  # ample, and tight (preemptions)
def test_same_run_as_one_event_per_arrival(policy, params, replicas, num_blocks):
    specs = _poisson(240, 9.0 * replicas, seed=replicas * 7 + num_blocks)
    kw = dict(policy=policy, params=params, replicas=replicas, num_blocks=num_blocks)
    _same(_run(specs, True, **kw), _run(specs, False, **kw))


@pytest.mark.parametrize("until", [3.0, 6.37, 25.0])
@pytest.mark.parametrize("replicas", [1, 3])
def test_same_state_at_a_horizon(until, replicas):
    """Stopped mid-run: arrivals a busy replica has not taken yet are taken as at their clocks
    (`Cluster.take_late_arrivals`): same queues, ``queued_s`` and rows."""
    specs = _poisson(400, 14.0 * replicas, seed=3, output=(20, 400))
    a = _run(specs, True, replicas=replicas, until=until)
    b = _run(specs, False, replicas=replicas, until=until)
    _same(a, b)
    assert (a[2] < len(specs)) == (until < specs[-1].arrival_s)


@pytest.mark.parametrize("ahead_s", [0.3, 30.0])
@pytest.mark.parametrize("replicas", [1, 3])
def test_running_ahead_of_simpys_clock(monkeypatch, ahead_s, replicas):
    """A replica taking its own arrivals skips the waits that land before the last arrival
    (up to `AHEAD_S` past its last real wait; `Replica.take_arrivals`): the same run as one
    event per arrival and as without skipping (`AHEAD_S` 0), at every stretch length, with
    fewer SimPy events the longer the stretches (588 and 611 events without skipping; 88
    and 99 with 0.3 s stretches, 7 and 10 with 30 s)."""
    events, step = [0], simpy.Environment.step

    def counted(env):
        events[0] += 1
        return step(env)

    monkeypatch.setattr(simpy.Environment, "step", counted)
    specs = _poisson(300, 9.0 * replicas, seed=11, output=(20, 300))
    runs = {}
    for s in (0.0, ahead_s):
        monkeypatch.setattr(replica_module, "AHEAD_S", s)
        events[0] = 0
        runs[s] = (_run(specs, True, replicas=replicas), events[0])
    _same(runs[ahead_s][0], _run(specs, False, replicas=replicas))
    _same(runs[ahead_s][0], runs[0.0][0])
    # ~33 s of arrivals: stretches of 0.3 s still skip most waits; 30 s nearly all
    assert runs[ahead_s][1] < (0.5 if ahead_s < 1 else 0.05) * runs[0.0][1]


def test_a_horizon_start_was_not_told_of_is_refused():
    """Replicas ran ahead up to where `Cluster.start` said the run stops: taking the late
    arrivals of another stop would give a state no run had."""
    with pytest.raises(ValueError, match=r"stopped at 5.0, but start\(\) was told 4.0"):
        _run(_poisson(50, 9.0, seed=1), True, until=5.0, told=4.0)


def test_clumps_and_step_by_step():
    """Several arrivals inside one decode step (the run's deferred commit, then a second one)
    and the step-by-step loop (no decode runs)."""
    rng = np.random.default_rng(5)
    specs, t = [], 0.0
    for _ in range(120):
        t += float(rng.exponential(0.05))
        for j in range(int(rng.integers(1, 4))):
            specs.append(spec(t + 1e-4 * j, int(rng.integers(10, 400)), int(rng.integers(1, 90))))
    for coalesce in (True, False):
        _same(_run(specs, True, coalesce=coalesce), _run(specs, False, coalesce=coalesce))


def test_a_wake_timer_beaten_by_an_arrival_is_left_pending():
    """Dynamic batching waits up to 100 s for a second request, which comes at 2 s: the timer
    left pending is the run's last event in both (the clock at the end is 100 s)."""
    specs = [spec(0.0, 100, 5), spec(2.0, 100, 5)]
    kw = dict(policy="dynamic", params={"batch_size": 2, "max_wait_s": 100.0})
    a, b = _run(specs, True, **kw), _run(specs, False, **kw)
    _same(a, b)
    assert a[3] == 100.0


def test_exact_ties_raise():
    """Arrivals every 0.25 s and steps of exactly 0.25 s: a step ends at an arrival's clock."""
    specs = [spec(0.125 + 0.25 * i, 100, 20) for i in range(40)]
    with pytest.raises(ArrivalTie):
        _run(specs, True, latency=ConstantLatencyModel(0.25))


@pytest.mark.parametrize("replicas", [1, 2])
def test_arrivals_at_the_start_and_all_at_once(replicas):
    """Arrivals at 0 s (the replicas' first `schedule` sees none either way; SimPy's clock is
    an int there) and a whole workload at one clock (`Cluster._finale` at its first event)."""
    early = [spec(0.0, 100, 5), spec(0.0, 50, 9), spec(0.0, 70, 3), spec(1.0, 100, 5)]
    burst = [spec(2.5, 40 + i, 1 + i % 7) for i in range(30)]
    for specs in (early, burst):
        kw = dict(replicas=replicas, policy="static", params={"batch_size": 4})
        _same(_run(specs, True, **kw), _run(specs, False, **kw))


AZURE = "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def _constant_config(arrival):
    return config(
        n=60, latency={"model": "constant", "step_ms": 250},
        workload={"trace": {"path": AZURE},
                  "arrival": arrival, "num_requests": 60, "limits": {"max_total_tokens": 2048}},
        cluster={"replicas": 2, "router": {"name": "round_robin"}},
    )  # fmt: skip


@pytest.mark.parametrize(
    "arrival",
    [{"process": "constant", "rate_per_s": 8.0}, {"process": "poisson", "rate_per_s": 8.0}],
)
def test_simulate_starts_over_at_a_tie(monkeypatch, arrival):
    """`runner.simulate`: a tie (constant arrivals from 0 s and 250 ms steps) starts the run over
    with one event per arrival; without ties (Poisson) it runs once; either way the results
    are those of ``hand_over=False``."""
    built = build(_constant_config(arrival), str(REPO / "t.yaml"), REPO)
    starts = []
    start = Cluster.start
    monkeypatch.setattr(
        Cluster,
        "start",
        lambda self, h=False, until=None: (starts.append(h), start(self, h, until)),
    )
    a = simulate(built)
    assert starts == ([True, False] if arrival["process"] == "constant" else [True])
    b = simulate(built, hand_over=False)
    assert starts[-1] is False
    _same_results(a, b)


def _same_results(a, b):
    for k in a.requests:
        x, y = a.requests[k], b.requests[k]
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
    for k in a.steps:
        assert np.array_equal(a.steps[k], b.steps[k]), k
    a.summary.pop("latency_model"), b.summary.pop("latency_model")
    assert a.summary == b.summary


@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_simulate_with_wake_times(policy):
    """Policies that idle with a wake time (a timer the arrival may beat, left pending: it can
    be the run's last event, the clock ``summary`` ends at) and read ``arrivals_done``."""
    sched = {"policy": policy, "max_wait_s": 0.3} if policy == "dynamic" else {"policy": policy}
    cfg = config(rate=3.0, n=80, cluster={"replicas": 2}, scheduler=sched)
    built = build(cfg, str(REPO / "t.yaml"), REPO)
    _same_results(simulate(built), simulate(built, hand_over=False))


def test_the_record_of_extrapolated_steps_does_not_depend_on_the_replicas_order():
    """Three replicas running ahead compute their steps in another order than one event per
    arrival does; the latency model's record of steps beyond its grid (prompt steps of up to
    65,535 tokens against a grid of 16,384) is the same (`BeyondTable`: the largest, per kind)."""
    cfg = config(
        rate=600.0, n=600, latency={"model": "auto"}, model="llama-3-8b",
        hardware={"gpu": "h200", "tp": 1},
        workload={"trace": {"path": AZURE}, "arrival": {"process": "poisson", "rate_per_s": 600.0},
                  "num_requests": 600, "limits": {"max_total_tokens": 8192}},
        scheduler={"policy": "continuous", "max_num_seqs": 1024, "max_num_batched_tokens": 65536},
        cluster={"replicas": 3, "router": {"name": "round_robin"}},
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match="beyond the grid"):
        a = simulate(build(cfg, str(REPO / "t.yaml"), REPO))
    with pytest.warns(RuntimeWarning, match="beyond the grid"):
        b = simulate(build(cfg, str(REPO / "t.yaml"), REPO), hand_over=False)
    said = a.summary["latency_model"]["warnings"]
    assert any("tokens per step is beyond the grid (16384)" in w for w in said)
    assert said == b.summary["latency_model"]["warnings"]
    _same_results(a, b)


@pytest.mark.parametrize("horizon", [2.0, 4.3])
def test_simulate_stopped_at_a_horizon(horizon):
    """`runner.simulate` with ``sim.horizon_s``: requests in flight and not yet arrived alike."""
    cfg = config(rate=30.0, n=200, cluster={"replicas": 2}, sim={"horizon_s": horizon})
    built = build(cfg, str(REPO / "t.yaml"), REPO)
    a, b = simulate(built), simulate(built, hand_over=False)
    assert 0 < a.summary["requests"]["not_arrived_by_horizon"] < 200
    _same_results(a, b)


def test_event_times_are_the_processes_clock():
    """`arrival_event_times` == the clock `Cluster._arrivals` hands each arrival over at, on
    times where ``now + (t - now) != t`` (jumps past twice the clock), repeats and zeros."""
    rng = np.random.default_rng(11)
    cases = [
        np.sort(rng.uniform(0, 1e4, 3000)),
        np.cumsum(rng.exponential(1.0, 2000) ** 4),  # heavy jumps
        np.repeat(np.sort(rng.uniform(0, 50, 300)), 3),
        np.array([0.0, 0.0, 1e-300, 3e-300, 0.1, 0.30000000000000004, 7.0, 7.0, 1e9]),
        np.sort(rng.uniform(0, 1, 50)) * 1e-3 + np.arange(50) * 0.125,
    ]
    for times in cases:
        now, want = 0, []
        for t in times.tolist():
            if t > now:
                now = now + (t - now)
            want.append(now)
        assert arrival_event_times(times).tolist() == want
    env = simpy.Environment()  # and the process itself, on heavy jumps
    times = cases[1][:300]

    class Recorder:
        on_finish = on_prefilled = None
        seen: list = []

        def add_request(self, req):
            self.seen.append(env.now)

        def sync(self):
            pass

        def poke(self):
            pass

    cluster = Cluster(
        env, [spec(t, 10, 1) for t in times], ROUTERS["round_robin"](Section({}, "t.yaml"))
    )
    rec = Recorder()
    cluster.add_replica(rec)
    cluster.start()
    env.run()
    assert rec.seen == arrival_event_times(times).tolist()


def test_delays_land_on_the_time():
    """`delays_to`: the waits land on the time exactly, with two where no single one does."""
    rng = np.random.default_rng(2)
    nows = np.concatenate([[0.0, 1e-9], rng.uniform(0, 10, 500), rng.uniform(0, 1e-3, 200)])
    pairs = [(0.07644973401008871, 0.24158332661732437)]  # every single sum rounds past it
    assert len(delays_to(*pairs[0])) == 2
    for now in nows.tolist():
        pairs += [(now, t) for t in (now, now * 2.7 + 0.1, now + 1e-12, now * 1e6 + 3.3)]
        pairs.append((now, math.nextafter(now, 9e9)))
    for now, t in pairs:
        clock = now
        for d in delays_to(now, t):
            assert d >= 0
            clock = clock + d  # what SimPy's timeout does
        assert clock == t


def test_not_for_other_routers_or_callbacks():
    built = build(
        config(n=50, cluster={"replicas": 2, "router": {"name": "least_outstanding"}}),
        str(REPO / "t.yaml"), REPO,
    )  # fmt: skip
    env = simpy.Environment()
    cluster = Cluster(env, built.workload.requests, built.router, keep_requests=False)
    built.make_replicas(env, cluster)
    assert not cluster.can_hand_over()


@pytest.mark.parametrize("chunk", [1, 3])
def test_columns_read_in_chunks(monkeypatch, chunk):
    """`OwnArrivals` reads its columns a chunk at a time: any chunk size gives the same run."""
    monkeypatch.setattr(OwnArrivals, "CHUNK", chunk)
    specs = _poisson(150, 20.0, seed=9)
    for replicas in (1, 3):
        _same(_run(specs, True, replicas=replicas), _run(specs, False, replicas=replicas))
