"""Exact, hand-computed runs of each policy of the suite (constant 1 s steps unless stated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.speculative import expected_tokens
from simulator.errors import ConfigError
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.prefix import PrefixCachingAllocator
from simulator.request import Request
from tests.policy_kit import by_id, engine_facts, make_engine, run, spec


# ------------------------------------------------------------------------------------ static
def test_static_waits_for_batch_then_flushes_at_end():
    # B=2. r0, r1 form a batch at t=0: prefill 0->1 (both first tokens at 1), r1 (1 token) is
    # done; r0 decodes at 2, 3. r2 arrived at 0 too but may not join: it waits for the batch to
    # end, then (arrivals done, 1 < B) is flushed alone: prefill 3->4, decode 4->5.
    reqs, _, _ = run([spec(0, 8, 3), spec(0, 8, 1), spec(0, 8, 2)], "static", {"batch_size": 2})
    r = by_id(reqs)
    assert (r[0].first_token_s, r[0].finish_s) == (1.0, 3.0)
    assert (r[1].first_token_s, r[1].finish_s) == (1.0, 1.0)
    assert (r[2].first_token_s, r[2].finish_s) == (4.0, 5.0)


def test_static_does_not_start_a_partial_batch_before_arrivals_end():
    reqs, _, _ = run([spec(0, 8, 2), spec(5, 8, 2)], "static", {"batch_size": 2})
    r = by_id(reqs)
    assert r[0].first_token_s == 6.0 and r[1].first_token_s == 6.0  # batch starts at 5


# ----------------------------------------------------------------------------------- dynamic
def test_dynamic_starts_at_max_wait_of_the_oldest():
    # B=4, max_wait 0.5: r0 (t=0) and r1 (t=0.2) start together at 0.5; tokens at 1.5, 2.5.
    params = {"batch_size": 4, "max_wait_s": 0.5}
    reqs, _, _ = run([spec(0, 8, 2), spec(0.2, 8, 2), spec(10, 8, 1)], "dynamic", params)
    r = by_id(reqs)
    assert r[0].first_scheduled_s == 0.5 and r[1].first_scheduled_s == 0.5
    assert (r[0].first_token_s, r[0].finish_s) == (1.5, 2.5)
    assert r[2].first_token_s == 11.5  # alone: waits its full max_wait


def test_dynamic_starts_at_once_when_batch_is_full():
    params = {"batch_size": 2, "max_wait_s": 100.0}
    reqs, _, _ = run([spec(0, 8, 1), spec(0.25, 8, 1)], "dynamic", params)
    assert [q.first_token_s for q in reqs] == [1.25, 1.25]


# --------------------------------------------------------------------------- chunked prefill
def test_chunked_prefill_budget_decodes_first_then_chunks():
    # budget 8: step 1 (0->1) r0 chunk 8 of 10; step 2 (1->2) r0's last 2 (running first) +
    # r1's whole 4-token prompt: both first tokens at 2; step 3 both decode (r1 done at 3);
    # step 4 r0's last token at 4.
    params = {"max_num_batched_tokens": 8, "max_num_seqs": 4}
    plans = []

    def spy(rep):
        inner = rep.policy.schedule

        def schedule(replica, now):
            p = inner(replica, now)
            if not p.is_idle:
                plans.append(([(q.id, n) for q, n in p.chunks], p.decode))
            return p

        rep.policy.schedule = schedule

    # step by step: a coalesced decode run goes on past r1's finish without asking the policy
    # (`Replica._plan_past_finishes`), and this test reads the policy's plan of every step
    reqs, _, _ = run([spec(0, 10, 3), spec(0, 4, 2)], "chunked_prefill", params, wrap=spy,
                     coalesce=False)  # fmt: skip
    r = by_id(reqs)
    assert (r[0].first_token_s, r[0].finish_s) == (2.0, 4.0)
    assert (r[1].first_token_s, r[1].finish_s) == (2.0, 3.0)
    assert plans[:4] == [([(0, 8)], False), ([(0, 2), (1, 4)], False), ([], True), ([], True)]


def test_chunked_prefill_budget_below_max_num_seqs_is_a_config_error():
    with pytest.raises(ConfigError, match="scheduler.max_num_batched_tokens"):
        run([spec(0, 8, 1)], "chunked_prefill", {"max_num_batched_tokens": 4, "max_num_seqs": 8})


# ------------------------------------------------------------------------------- speculative
def test_speculative_all_accepted_emits_k_plus_one_per_step():
    # alpha 1, k 3: prefill 0->1 emits token 1; verify steps at 2 and 3 emit 4 each -> 9.
    params = {"num_speculative_tokens": 3, "acceptance_rate": 1.0, "draft_cost": 0.0}
    reqs, reps, _ = run([spec(0, 8, 9)], "speculative", params)
    assert (reqs[0].first_token_s, reqs[0].finish_s) == (1.0, 3.0)
    assert reps[0].steps[1][2] == 4  # verify charged as a (k+1)-token chunk


def test_speculative_draft_cost_is_charged():
    # draft_cost 0.5, k 2: each verify step costs 1 + 2 * 0.5 * 1 = 2 s
    params = {"num_speculative_tokens": 2, "acceptance_rate": 1.0, "draft_cost": 0.5}
    reqs, _, _ = run([spec(0, 8, 7)], "speculative", params)
    assert reqs[0].finish_s == 1.0 + 2 * 2.0  # tokens 1 | 2-4 | 5-7


@pytest.mark.parametrize("alpha,k", [(0.6, 4), (0.8, 2), (0.0, 3)])
def test_speculative_mean_tokens_per_step_matches_formula(alpha, k):
    params = {"num_speculative_tokens": k, "acceptance_rate": alpha, "draft_cost": 0.0}
    _, reps, _ = run([spec(0, 8, 4000)] * 3, "speculative", params)
    st = reps[0].policy.stats
    got = st["emitted_tokens"] / st["verified_seqs"]
    assert got == pytest.approx(expected_tokens(alpha, k), rel=0.03)


def test_speculative_expected_mode_is_deterministic_and_exact_on_average():
    params = {"num_speculative_tokens": 4, "acceptance_rate": 0.5, "acceptance": "expected",
              "draft_cost": 0.0}  # fmt: skip
    _, reps, _ = run([spec(0, 8, 1001)], "speculative", params)
    st = reps[0].policy.stats
    assert st["emitted_tokens"] == 1000  # all but the prefill's token
    assert st["verified_seqs"] == pytest.approx(1000 / expected_tokens(0.5, 4), abs=1.5)


# -------------------------------------------------------------------------------- preemption
def _tight(mode):
    # 6 blocks of 4 tokens; two requests of prompt 8 need 2 blocks each, then grow to 4 each
    return run(
        [spec(0, 8, 8), spec(0, 8, 8)], "continuous",
        {"preemption": mode, "watermark": 0.0, "max_num_batched_tokens": 8192},
        num_blocks=6, block_size=4, max_model_len=64,
    )  # fmt: skip


def test_swap_keeps_progress_and_charges_copies():
    reqs, reps, _ = _tight("swap")
    st = reps[0].policy.preemption.stats
    assert all(q.status.name == "FINISHED" for q in reqs)
    assert st["swap"] >= 1 and st["recompute"] == 0
    assert st["swap_in_tokens"] == st["swap_out_tokens"] > 0
    link = reps[0].policy.preemption.link
    per_token = 131072.0
    assert st["swap_out_s"] == pytest.approx(
        st["swap"] * link.latency + st["swap_out_tokens"] * per_token / link.bandwidth
    )
    # the copies are extra step time: busy time = steps x 1 s + copy time
    n_steps = len(reps[0].steps)
    assert reps[0].busy_s == pytest.approx(n_steps + st["swap_out_s"] + st["swap_in_s"])


def test_recompute_counts_thrown_away_tokens():
    reqs, reps, _ = _tight("recompute")
    st = reps[0].policy.preemption.stats
    assert all(q.status.name == "FINISHED" for q in reqs)
    assert st["recompute"] >= 1 and st["recomputed_tokens"] > 0 and st["swap"] == 0


# ---------------------------------------------------------------------------- prefix caching
def test_prefix_hit_starts_after_cached_blocks():
    # shared system prompt of 32 tokens = 2 blocks of 16. r0 computes it; r1 arrives after r0
    # finished, finds both blocks (LRU-cached, free) and prefills only 8 of its 40 tokens.
    def kv():
        return PrefixCachingAllocator(100, 16, shared_prefix_tokens=32)

    plans = []

    def spy(rep):
        inner = rep.policy.schedule

        def schedule(replica, now):
            p = inner(replica, now)
            plans.append([(q.id, n) for q, n in p.chunks])
            return p

        rep.policy.schedule = schedule

    reqs, reps, _ = run([spec(0, 40, 2), spec(10, 40, 2)], make_kv=kv, wrap=spy, num_blocks=100)
    r = by_id(reqs)
    assert r[0].num_cached_tokens == 0 and r[1].num_cached_tokens == 32
    assert [(1, 8)] in plans
    assert reps[0].kv.hit_tokens == 32 and reps[0].kv.query_tokens == 80


def test_prefix_blocks_from_mooncake_hash_ids_and_lru_eviction():
    kv = PrefixCachingAllocator(6, 256, hash_block_tokens=512)
    a = Request(0, 0.0, 1024, 4, hash_ids=(1, 2))
    assert kv.allocate(a, 1024) and len(a.block_table) == 4
    a._num_computed = 1024
    kv.free(a)  # 4 cached blocks, all evictable
    assert kv.num_free_blocks == 6
    b = Request(1, 0.0, 1100, 4, hash_ids=(1, 9, 7))  # shares the first 512-token hash block
    assert kv.lookup(b) == 512
    assert kv.allocate(b, 1100) and kv.hit_tokens == 512
    # b took 2 hit blocks + 3 new ones: 2 from the free list, 1 evicted (a's LRU tail block)
    assert kv.evictions == 1 and kv.num_free_blocks == 1
    kv.free(b)
    assert kv.num_free_blocks == 6


# -------------------------------------------------------------------------------- contiguous
def test_contiguous_reserves_extent_up_front():
    kv = ContiguousAllocator(10, 16, "max_model_len", 64)  # extent 4 blocks
    a, b, c = (Request(i, 0.0, 8, 8) for i in range(3))
    assert kv.allocate(a, 8) and kv.capacity(a) == 64 and kv.num_used_blocks == 4
    assert kv.allocate(b, 8) and not kv.allocate(c, 8)  # 2 extents of 4 fit in 10 blocks
    kv2 = ContiguousAllocator(10, 16, "prompt_plus_output", 64)  # extent 16 tokens = 1 block
    assert all(kv2.allocate(Request(i, 0.0, 8, 8), 8) for i in range(10))


def test_contiguous_runs_fewer_requests_at_once_than_paged():
    specs = [spec(0, 16, 16)] * 8

    def contiguous():
        return ContiguousAllocator(16, 16, "max_model_len", 128)  # 8 blocks a request

    _, reps, _ = run(specs, make_kv=contiguous, num_blocks=16, max_model_len=128)
    _, reps_p, _ = run(specs, num_blocks=16, max_model_len=128)
    assert max(s[9] for s in reps[0].steps) == 2
    assert max(s[9] for s in reps_p[0].steps) == 8


# ------------------------------------------------------------------------------------ routers
def test_least_outstanding_and_prefix_aware_routing():
    from policies.routing import LeastOutstanding, PrefixAware
    from simulator.cfg import Section

    reps = [_Stub(3, 0), _Stub(1, 0), _Stub(1, 64)]
    assert LeastOutstanding(Section({}, "t")).route(None, reps) is reps[1]
    assert PrefixAware(Section({}, "t")).route(None, reps) is reps[2]
    assert all(r.synced for r in reps)


class _Stub:
    def __init__(self, outstanding, hit):
        self.num_outstanding = outstanding
        self.synced = False
        hit_tokens = hit

        class KV:
            def lookup(self, req):
                return hit_tokens

        self.kv = KV()

    def sync(self):
        self.synced = True


# ------------------------------------------------------------------------------ disaggregation
def test_disaggregated_request_timeline():
    # prefill 0->1 (TTFT 1); copy of 16 tokens x 1 byte at 32 B/s + 0.5 s latency = 1 s, so the
    # request reaches the decode replica at 2; decode steps 2->3 and 3->4 emit tokens 2 and 3.
    import simpy

    from simulator.cluster import Cluster
    from simulator.disagg import DisaggSpec, KVTransfer
    from simulator.engine import EngineSpec
    from simulator.hardware import LinkSpec
    from simulator.kv.paged import PagedAllocator
    from simulator.latency.constant import ConstantLatencyModel
    from tests.policy_kit import ROUTERS, Section

    def pool(policy):
        from policies import POLICIES

        sched = Section({"policy": policy}, "t.yaml", "scheduler")
        return EngineSpec(
            POLICIES[policy], sched, engine_facts(100, 16, 1024), 100, 16,
            lambda: PagedAllocator(100, 16), {}, {},
        )  # fmt: skip

    ds = DisaggSpec(
        pool("continuous"), pool("chunked_prefill"), 1, 1,
        LinkSpec(name="slow", bandwidth=32.0, latency=0.5), 1, lambda n: n * 1.0,
    )  # fmt: skip
    import numpy as np

    env = simpy.Environment()
    cl = Cluster(env, [spec(0, 16, 3), spec(0, 16, 1)], ROUTERS["round_robin"](Section({}, "t")))
    xfer = KVTransfer(env, cl, ds, ConstantLatencyModel(1.0), True, np.random.SeedSequence(0))
    cl.start()
    env.run()
    r = by_id(cl.requests)
    assert (r[0].first_token_s, r[0].finish_s) == (1.0, 4.0)
    assert r[0].replica == 1  # ends on the decode replica
    assert r[1].finish_s == 1.0  # one output token: finishes on the prefill side, no copy
    assert xfer.stats["transfers"] == 1 and xfer.stats["copy_s"] == [1.0]
    assert all(rep.kv.num_used_blocks == 0 for rep in xfer.replicas)


def test_make_engine_helper_smoke():
    import simpy

    env = simpy.Environment()
    from simulator.kv.paged import PagedAllocator
    from simulator.latency.constant import ConstantLatencyModel

    rep = make_engine(env, 0, "static", {}, latency=ConstantLatencyModel(1.0),
                      kv=PagedAllocator(10, 16), coalesce=True, engine=engine_facts())  # fmt: skip
    assert rep.policy.batch_size == 8


def test_round_robin_sends_arrival_i_to_replica_i_mod_r_on_every_run_of_a_build():
    """Round robin follows the arrival ordinal, not a counter of its own: a build simulated a
    second time (a sweep reusing it, `capacity`'s probes) routes exactly as the first did, and
    each replica's decode-run horizon (`Cluster.add_replica`, which assumes arrival i goes to
    replica i % R) is the truth. Before, the router's counter carried over: the second run
    started on replica 1 (4 requests over 3 replicas)."""
    from simulator.runner import build, simulate
    from tests.helpers import tiny_config

    cfg = tiny_config("llama-3-8b", {"gpu": "h100"}, {"model": "roofline"})
    cfg["cluster"] = {"replicas": 3, "router": {"name": "round_robin"}}
    built = build(cfg, "t.yaml", Path("."))
    first, second = simulate(built), simulate(built)
    assert list(first.requests["replica"]) == [0, 1, 2, 0]
    assert list(second.requests["replica"]) == [0, 1, 2, 0]
    assert first.summary["ttft_s"] == second.summary["ttft_s"]
