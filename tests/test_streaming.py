"""The memory- and time-saving output paths give exactly what the old ones gave.

* `simulator.csvfast` writes the bytes ``pandas.DataFrame.to_csv(index=False,
  float_format="%.9g")`` wrote (the old `write_results`);
* `simulator.steplog.StepLog` gives back the rows a list of tuples held, and `step_arrays`
  the columns it built from ``np.array(rows, dtype=float)``, whatever the chunk size
  (`steplog.chunk_rows`, from the replica count).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator import csvfast, runner
from simulator.metrics import step_arrays
from simulator.steplog import CHUNK, MIN_CHUNK, NAMES, StepLog, chunk_rows


def _pandas_csv(cols: dict, path) -> bytes:
    pd.DataFrame(cols).to_csv(path, index=False, float_format="%.9g")
    return path.read_bytes()


def test_csv_matches_pandas(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    n = 1000
    f = rng.exponential(size=n) * 10.0 ** rng.integers(-12, 12, size=n)
    f[::7] = np.nan
    f[3] = np.inf
    f[5] = -0.0
    cols = {
        "id": np.arange(n, dtype=np.int64),
        "t": f,
        "whole": np.round(rng.normal(size=n) * 1e6),
        "neg": -rng.integers(0, 2**40, size=n),
        "status": np.array(["finished", "rejected", "waiting"] * 333 + ["running"], dtype=object),
        "reason": np.array(["", 'a "quoted", reason', "line\nbreak", "x > 5"] * 250, dtype=object),
    }
    monkeypatch.setattr(csvfast, "CHUNK_ROWS", 97)  # several chunks, a short last one
    csvfast.write_csv(tmp_path / "fast.csv", cols)
    assert (tmp_path / "fast.csv").read_bytes() == _pandas_csv(cols, tmp_path / "pd.csv")


def test_csv_empty_matches_pandas(tmp_path):
    cols = {k: np.zeros(0) for k in ("a", "b")}
    csvfast.write_csv(tmp_path / "fast.csv", cols)
    assert (tmp_path / "fast.csv").read_bytes() == _pandas_csv(cols, tmp_path / "pd.csv")


class _Rep:
    def __init__(self, index, rows):
        self.index = index
        self.steps = StepLog()
        for i, r in enumerate(rows):
            self.steps.append(r)
            if i % 5 == 4:
                self.steps.pack()  # chunks of several sizes plus pending rows


def _old_step_arrays(rows_by_rep):
    """`metrics.step_arrays` as it was: one float array of tuples, then int columns cast."""
    rows = [row + (i,) for i, rows in enumerate(rows_by_rep) for row in rows]
    a = np.array(rows, dtype=float)
    out = {k: a[:, i] for i, k in enumerate(NAMES)}
    out["replica"] = a[:, -1].astype(np.int64)
    for k in NAMES[2:]:
        if k != "prefill_attn":
            out[k] = out[k].astype(np.int64)
    return out


def test_step_log_and_arrays_equal_the_tuple_list():
    rng = np.random.default_rng(1)
    rows_by_rep = [
        [
            (float(rng.random()), float(rng.random()) / 3, int(rng.integers(0, 9000)),
             float(rng.random() * 1e7), 1, int(rng.integers(0, 256)), int(rng.integers(0, 2**40)),
             7, 0, 3, 12345)
            for _ in range(n)
        ]
        for n in (23, 0, 11)
    ]  # fmt: skip
    reps = [_Rep(i, rows) for i, rows in enumerate(rows_by_rep)]
    assert [list(r.steps) for r in reps] == [
        [tuple(float(v) for v in row) for row in rows] for rows in rows_by_rep
    ]
    assert reps[0].steps[4] == tuple(float(v) for v in rows_by_rep[0][4])
    assert len(reps[2].steps) == 11
    new, old = step_arrays(reps, release=True), _old_step_arrays(rows_by_rep)
    assert list(new) == list(old)
    for k in old:
        assert new[k].dtype == old[k].dtype and np.array_equal(new[k], old[k]), k
        assert new[k].sum() == old[k].sum(), k  # contiguous vs strided: same float sums
    assert all(len(r.steps) == 0 for r in reps)


def test_rows_packed_as_fromiter_packs_them():
    """`steplog.float64_rows` stores bit for bit what ``np.fromiter`` of the values stored,
    on its fast path (floats in `FLOAT_COLUMNS`, ints elsewhere: ints past 2**53 and at
    int64's ends, bools, numpy ints, and ints in the float columns; signed zeros, infinities,
    NaN and subnormals there) and on rows it hands to ``fromiter`` (a float or a numpy float
    in an int column, an int past int64)."""
    from itertools import chain

    from simulator.steplog import FLOAT_COLUMNS, WIDTH, float64_rows

    ints = [0, 1, -1, 2**53 + 1, 2**63 - 1, -(2**63), True, False, np.int64(-7),
            12345678901234567]  # fmt: skip
    floats = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 5e-324, 1e300, 3,
              2**53 + 1, np.float64(1.5)]  # fmt: skip
    odd = [2.0, -0.0, np.float64(3.0), 2**63, 2**70]  # refused by the fast path's int columns
    rng = np.random.default_rng(5)

    def pick(pool, scale):
        u = rng.random()
        return pool[int(rng.integers(len(pool)))] if u < 0.3 else scale(u)

    for n, spoil in ((0, False), (1, False), (17, False), (300, False), (1, True), (300, True)):
        rows = [
            tuple(
                pick(floats, lambda u: u * 1e6) if j in FLOAT_COLUMNS
                else pick(ints, lambda u: int(u * 1e12))
                for j in range(WIDTH)
            )
            for _ in range(n)
        ]  # fmt: skip
        if spoil:  # one row the fast path refuses, the last so that every other row packs
            j = next(j for j in range(WIDTH) if j not in FLOAT_COLUMNS)
            row = list(rows[-1])
            row[j] = odd[n % len(odd)]
            rows[-1] = tuple(row)
        packed = float64_rows([rows[:5], [], rows[5:]], n)
        want = np.fromiter(chain.from_iterable(rows), dtype=float, count=n * WIDTH)
        assert packed.shape == (n, WIDTH)
        assert packed.tobytes() == want.tobytes()


def _run_cluster(config_overrides, until=None):
    """Run the policy kit's cluster on a small mixed workload; return (cluster, replicas)."""
    import simpy

    from policies.routing import ROUTERS
    from simulator.cfg import Section
    from simulator.cluster import Cluster
    from simulator.kv.paged import PagedAllocator
    from simulator.latency.constant import ConstantLatencyModel
    from tests.policy_kit import engine_facts, make_engine
    from workloads.spec import RequestSpec

    rng = np.random.default_rng(3)
    specs = [
        RequestSpec(float(t), int(p), int(o))
        for t, p, o in zip(
            np.cumsum(rng.exponential(0.01, 3000)), rng.integers(1, 1200, 3000),
            rng.integers(1, 300, 3000), strict=True,
        )
    ]  # fmt: skip
    specs[7] = RequestSpec(specs[7].arrival_s, 9000, 10)  # rejected: longer than max_model_len
    env = simpy.Environment()
    cluster = Cluster(env, specs, ROUTERS["least_outstanding"](Section({}, "t.yaml")))
    for i in range(2):
        rep = make_engine(
            env, i, "continuous", config_overrides, latency=ConstantLatencyModel(0.02),
            kv=PagedAllocator(400, 16), coalesce=True, engine=engine_facts(400, 16, 8192, seed=i),
        )  # fmt: skip
        cluster.add_replica(rep)
    cluster.start()
    env.run(until=until)
    for rep in cluster.replicas:
        rep.sync()
    return cluster


def test_request_log_equals_the_request_table():
    """The columnar log (finished requests dropped on the way) gives the old table exactly,
    with preemptions, a rejection, and requests still waiting and running at a horizon."""
    from simulator.metrics import request_table

    for until in (None, 60.0):
        cluster = _run_cluster({"max_num_seqs": 64}, until=until)
        old = request_table(cluster.requests)
        new = cluster.log.table()
        assert list(new) == list(old)
        for k in old:
            assert new[k].dtype == old[k].dtype, k
            assert np.array_equal(new[k], old[k], equal_nan=new[k].dtype.kind == "f"), k
        assert (old["status"] == "rejected").sum() == 1 and old["preemptions"].sum() > 0
        if until is not None:
            assert (old["status"] == "waiting").any() and (old["status"] == "running").any()


def test_request_columns_read_as_request_specs():
    from workloads.spec import RequestColumns, RequestSpec

    rows = [RequestSpec(0.5, 10, 3, (1, 2)), RequestSpec(1.0, 7, 1, ())]
    cols = RequestColumns.of(rows)
    assert cols == rows and list(cols) == rows and cols[1] == rows[1] and len(cols) == 2
    assert type(cols[0].arrival_s) is float and type(next(iter(cols)).num_prompt_tokens) is int


def test_growth_buckets_hand_out_growth_in_key_then_id_order():
    """DecodeSet's growth buckets give the due members in the order of the (key, id) heap they
    replaced, across joins, leaves, rejoins at the same key, and keys left behind."""
    import heapq

    from simulator.decode import DecodeSet
    from simulator.request import Request

    rng = np.random.default_rng(5)
    d = DecodeSet()
    ref: list = []  # the old heap: (key, id, req), with the same staleness rules
    reqs = [Request(i, 0.0, int(rng.integers(1, 50)), 10_000) for i in range(40)]
    ref_key = {}  # request id -> key of its live entry in ref

    def ref_pop():
        due = []
        while ref and ref[0][0] <= d.clock:
            key, _, r = heapq.heappop(ref)
            if r._dset is d and ref_key[r.id] == key:
                ref_key[r.id] = -1
                due.append(r)
        return due

    multi = 0
    for _ in range(3000):
        op = rng.random()
        members = list(d)
        if op < 0.1 and len(members) < 30:
            r = reqs[int(rng.integers(len(reqs)))]
            if r._dset is None:
                r._num_computed = r.num_tokens - 1
                cap = r._num_computed + int(rng.integers(0, 20))
                d.add(r, cap)
                ref_key[r.id] = r._grow_clock
                heapq.heappush(ref, (r._grow_clock, r.id, r))
        elif op < 0.15 and members:
            d.remove(members[int(rng.integers(len(members)))])
        else:
            expected = ref_pop()

            def capacity(r):
                return d.clock + r._dbase + 1 + (r.id * 7 + d.clock) % 19  # noqa: B023

            if rng.random() < 0.5:
                due = d.pop_due_growth()
                for r in due:
                    d.set_capacity(r, capacity(r))
            else:  # the decode-run path: extend in place
                due = []
                assert d.grow_due(lambda r, due=due: due.append(r) or capacity(r))
            assert due == expected
            multi += len(due) > 1
            for r in due:
                ref_key[r.id] = r._grow_clock
                heapq.heappush(ref, (r._grow_clock, r.id, r))
            for r in d.advance():
                d.remove(r)
    assert multi > 50


def test_grouped_growth_equals_member_by_member_growth():
    """`DecodeSet.grow_due_grouped` + `PagedTableAllocator.extend_group` hand out the same
    blocks to the same members, and leave the same keys due, as one `extend` and
    `set_capacity` per member; when the pool is short they change nothing and hand the members
    back in the order `pop_due_growth` gives. The counting `PagedAllocator` in a set in
    counting mode (its members' block counts kept by their buckets) gives every member the same
    count and the pool the same used blocks. Three sets and pools, driven alike through joins,
    leaves, rejoins, overdue keys (growth skipped for a step) and a pool that runs dry."""
    from simulator.decode import DecodeSet
    from simulator.kv.paged import PagedAllocator, PagedTableAllocator
    from simulator.request import Request

    rng = np.random.default_rng(17)
    bs = 4
    sides = []
    for side in range(3):
        kv = PagedAllocator(60, bs) if side == 2 else PagedTableAllocator(60, bs)
        d = DecodeSet(count_unit=bs if side == 2 else None)
        sides.append((d, kv, [Request(i, 0.0, 3, 10_000) for i in range(30)]))
    handed_back = grouped = 0
    for _ in range(4000):
        op, pick, skip = rng.random(), int(rng.integers(30)), rng.random() < 0.05
        for side, (d, kv, reqs) in enumerate(sides):
            members = sorted(d.members)
            if op < 0.1 and len(members) < 20:
                r = reqs[pick]
                if r._dset is None and kv.allocate(r, r.num_tokens):
                    r._num_computed = r.num_tokens - 1
                    d.add(r, kv.capacity(r))
            elif op < 0.17 and members:
                r = d.members[members[pick % len(members)]]
                d.remove(r)
                kv.free(r)
            elif not skip:
                if side == 0:
                    due = d.pop_due_growth()
                else:
                    due = d.grow_due_grouped(kv.extend_group, bs)
                    handed_back += bool(due)
                    grouped += not due
                for r in due:  # the member-by-member path (a member left out when short)
                    cap = kv.extend(r)
                    if cap >= 0:
                        d.set_capacity(r, cap)
                for r in d.advance():
                    d.remove(r)
                    kv.free(r)
        (d0, kv0, reqs0), (d1, kv1, reqs1), (d2, kv2, reqs2) = sides
        assert d0.clock == d1.clock == d2.clock and kv0._free == kv1._free
        assert kv0.num_used_blocks == kv2.num_used_blocks == sum(kv2.held(r) for r in reqs2)
        for a, b, c in zip(reqs0, reqs1, reqs2, strict=True):
            assert (a.block_table, a._grow_clock, a._dset is None) == (
                b.block_table, b._grow_clock, b._dset is None
            )  # fmt: skip
            assert (len(a.block_table), a._grow_clock, a._dset is None) == (
                kv2.held(c), c._grow_clock, c._dset is None
            )  # fmt: skip
            assert kv2.capacity(c) == kv0.capacity(a)
        assert d0.next_growth_clock() == d1.next_growth_clock() == d2.next_growth_clock()
    assert handed_back > 40 and grouped > 1000


def test_round_robin_horizon_changes_nothing(monkeypatch):
    """Each replica's decode runs bounded by its own next round-robin arrival give the results
    of runs bounded by the cluster's next arrival and of step-by-step execution: the same
    steps, counts and preemptions, and the same times up to SimPy's rounding of a run's end
    (``now + (end - now)`` is exact once ``now >= end / 2``; DESIGN.md, decode runs)."""
    from simulator.cluster import Cluster
    from tests.helpers import LinearLatency
    from tests.policy_kit import run
    from tests.test_core_physics import poisson_specs

    specs = poisson_specs(1500, 60.0, (20, 800), None, seed=11, output_range=(1, 300))
    kw = dict(latency=LinearLatency(), num_blocks=300, replicas=4)
    _, own, a = run(specs, **kw)
    _, step, c = run(specs, coalesce=False, **kw)
    monkeypatch.setattr(Cluster, "_next_arrival_for", lambda self, position: self.next_arrival_s)
    _, shared, b = run(specs, **kw)
    assert sum(r.num_preemptions for r in own) > 0
    for other in (b, c):
        for k in a:
            if a[k].dtype.kind == "f":
                np.testing.assert_allclose(a[k], other[k], rtol=1e-12, atol=1e-12)
            else:
                assert np.array_equal(a[k], other[k]), k
    for x, y, z in zip(own, shared, step, strict=True):
        assert len(x.steps) == len(y.steps) == len(z.steps)
        np.testing.assert_allclose(np.array(x.steps), np.array(y.steps), rtol=1e-12)
        assert x.itl_counts == y.itl_counts == z.itl_counts


def test_chunk_rows_bounds_the_cluster_pending_rows():
    assert chunk_rows(1) == CHUNK
    assert chunk_rows(4) == 256  # 1024 // 4
    assert chunk_rows(64) == 16
    assert chunk_rows(1024) == MIN_CHUNK


def test_step_chunk_does_not_change_a_clusters_steps(monkeypatch):
    """Round robin over 8 replicas, steps packed 1024 rows at a time and 32 at a time."""
    repo = Path(__file__).resolve().parents[1]
    cfg = {
        "name": "chunks", "seed": 3, "model": "llama-3-8b", "hardware": {"gpu": "h200", "tp": 1},
        "scheduler": {"policy": "continuous", "max_num_seqs": 64},
        "workload": {
            "trace": {"path": "workloads/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"},
            "arrival": {"process": "poisson", "rate_per_s": 80.0}, "num_requests": 600,
            "limits": {"max_total_tokens": 8192},
        },
        "cluster": {"replicas": 8, "router": {"name": "round_robin"}},
    }  # fmt: skip
    steps = []
    for pending in (CHUNK * 8, MIN_CHUNK * 8):
        monkeypatch.setattr("simulator.steplog.CLUSTER_PENDING", pending)
        steps.append(runner.simulate(runner.build(dict(cfg), "chunks", repo)).steps)
    assert steps[0].keys() == steps[1].keys()
    for k in steps[0]:
        assert np.array_equal(steps[0][k], steps[1][k]), k


def test_stable_order_is_a_stable_argsort():
    """`metrics._stable_order` (the ITL distribution's sort) orders equal values by index,
    as ``np.argsort(kind="stable")`` does, with repeats, signed zeros and NaNs."""
    from simulator.metrics import _stable_order

    rng = np.random.default_rng(4)
    for _ in range(300):
        v = rng.integers(0, rng.integers(1, 40), rng.integers(0, 200)).astype(float)
        v[rng.random(v.size) < 0.1] = -0.0
        if rng.random() < 0.2:
            v[rng.random(v.size) < 0.1] = np.nan
        assert np.array_equal(_stable_order(v), np.argsort(v, kind="stable"))
    gaps = rng.exponential(0.02, 50_000).round(6)
    assert np.array_equal(_stable_order(gaps), np.argsort(gaps, kind="stable"))


def test_status_module_names_are_the_members():
    """The hot paths set and test `Status` through module names (request.py says why): they
    must be the very members."""
    from simulator import request

    for name in ("WAITING", "RUNNING", "TRANSFERRING", "FINISHED"):
        assert getattr(request, name) is getattr(request.Status, name)
