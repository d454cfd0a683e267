"""The contract every registered policy keeps (iterates POLICIES; a new policy is tested free).

On a small mixed workload with a tight KV cache (preemptions happen): every plan respects the
policy's token budget; ``schedule()`` never advances progress (``num_computed`` may only drop, by
preemption, or jump from 0 to a prefix-cache hit, also after a preemption); every chunk's KV is
allocated when planned; every request ends finished or rejected with a reason; every KV block is
back at the end; and results are identical with decode-run coalescing on and off.
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import POLICIES
from simulator.kv.prefix import PrefixCachingAllocator
from tests.policy_kit import run, spec

PARAMS = {
    "static": {"batch_size": 4},
    "dynamic": {"batch_size": 4, "max_wait_s": 0.05},
    "chunked_prefill": {"max_num_batched_tokens": 64, "max_num_seqs": 8},
    "continuous": {"max_num_seqs": 8},
    "speculative": {"max_num_seqs": 8, "num_speculative_tokens": 3},
}


def workload(n=40, seed=1):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.02, n))
    prompts = rng.integers(1, 200, n)
    outs = rng.integers(1, 60, n)
    return [spec(a, p, o) for a, p, o in zip(t, prompts, outs, strict=True)]


def cache_hit(q, after: int) -> bool:
    """Whether ``q`` starting at ``after`` tokens is a prefix-cache hit: its recorded hit on
    first admission, or, after a recompute preemption (the hit is recorded once), part of
    its prompt short of the last token."""
    if after <= 0:
        return False
    if after == q.num_cached_tokens:
        return True
    return q.num_preemptions > 0 and after < q.num_prompt_tokens


def checked_run(name, coalesce, make_kv=None, latency=None):
    from simulator.latency.constant import ConstantLatencyModel  # noqa: F401

    problems = []

    def wrap(rep):
        inner = rep.policy.schedule
        budget = getattr(rep.policy, "token_budget", None)

        def schedule(replica, now):
            reqs = list(replica.waiting) + list(replica.running.values())
            before = {q.id: q.num_computed for q in reqs}
            plan = inner(replica, now)
            for q in reqs:
                after = q.num_computed
                if after > before[q.id] and not (before[q.id] == 0 and cache_hit(q, after)):
                    problems.append(f"{name}: schedule advanced request {q.id}")
            tokens = sum(n for _, n in plan.chunks)
            if plan.decode:
                tokens += len(replica.decoding)
            if budget is not None and tokens > budget:
                problems.append(f"{name}: {tokens} tokens > budget {budget}")
            for q, n in plan.chunks:
                if replica.kv.capacity(q) < min(q.num_computed + n, q.num_tokens):
                    problems.append(f"{name}: chunk of request {q.id} not allocated")
            held = getattr(replica.kv, "held", None)  # the counting allocator: no block lost
            if held is not None and sum(map(held, reqs)) != replica.kv.num_used_blocks:
                problems.append(f"{name}: blocks held != blocks used")
            return plan

        rep.policy.schedule = schedule

    from simulator.latency.base import StepLatencyModel  # noqa: F401
    from tests.helpers import LinearLatency

    reqs, reps, cols = run(
        workload(), name, PARAMS.get(name, {}), latency=latency or LinearLatency(), num_blocks=64,
        block_size=8, max_model_len=512, coalesce=coalesce, wrap=wrap, make_kv=make_kv,
    )  # fmt: skip
    return problems, reqs, reps, cols


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_contract(name):
    problems, reqs, reps, cols = checked_run(name, coalesce=True)
    assert problems == []
    for q in reqs:
        assert q.status.name in ("FINISHED", "REJECTED"), q
        if q.status.name == "REJECTED":
            assert q.reject_reason
        else:
            assert q.num_output == q.max_output_tokens
    assert sum(q.status.name == "FINISHED" for q in reqs) > 30
    for rep in reps:
        assert rep.kv.num_used_blocks == 0 and not rep.running and not rep.waiting


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_coalesce_invariance(name):
    _, _, _, a = checked_run(name, coalesce=True)
    _, _, _, b = checked_run(name, coalesce=False)
    for key in ("first_token_s", "finish_s", "generated_tokens", "preemptions"):
        assert np.array_equal(a[key], b[key], equal_nan=True), key


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_counting_and_table_paged_allocators_run_alike(name):
    """The paged allocator that keeps block ids (what the real-GPU executor gets) gives every
    policy the same run as the counting one, preemptions included (64 blocks)."""
    from simulator.kv.paged import PagedTableAllocator

    problems, _, reps, a = checked_run(name, coalesce=True)
    _, _, treps, b = checked_run(name, coalesce=True, make_kv=lambda: PagedTableAllocator(64, 8))
    assert problems == []
    for key in a:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key
    assert np.array_equal(np.array(reps[0].steps), np.array(treps[0].steps))
    assert sorted(treps[0].kv._free) == list(range(64))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_contract_with_prefix_cache(name):
    def kv():
        return PrefixCachingAllocator(64, 8, shared_prefix_tokens=64)

    problems, reqs, reps, _ = checked_run(name, coalesce=True, make_kv=kv)
    assert problems == []
    assert all(q.status.name in ("FINISHED", "REJECTED") for q in reqs)
    assert reps[0].kv.num_used_blocks == 0 and reps[0].kv.hit_tokens > 0


def _layered_kv():
    """A gpt-oss-like pool (one full and one sliding group, window 20 tokens) over 64 blocks."""
    from simulator.kv.layered import LayeredPagedAllocator
    from simulator.served import FullAttentionSpec, KVPool, SlidingWindowSpec, WindowedReads

    full = FullAttentionSpec(8, 2, "bf16", 1, 8)
    slide = SlidingWindowSpec(8, 2, "bf16", 1, 8, sliding_window=20)
    pool = KVPool(((full, 1), (slide, 1)), full.bytes_per_block)
    return LayeredPagedAllocator(64, 8, pool, WindowedReads(20, 0.5))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_contract_sliding_window(name):
    """Every policy keeps the contract over a pool whose sliding group frees blocks, and
    decode-run coalescing changes nothing (the run also ends where a window fills)."""
    problems, reqs, reps, a = checked_run(name, coalesce=True, make_kv=_layered_kv)
    assert problems == []
    assert all(q.status.name in ("FINISHED", "REJECTED") for q in reqs)
    assert sum(q.status.name == "FINISHED" for q in reqs) > 30
    assert reps[0].kv.num_used_blocks == 0 and not reps[0].kv._state
    _, _, _, b = checked_run(name, coalesce=False, make_kv=_layered_kv)
    for key in ("first_token_s", "finish_s", "generated_tokens", "preemptions"):
        assert np.array_equal(a[key], b[key], equal_nan=True), key


def _layered_prefix_kv():
    """`_layered_kv`'s pool with prefix caching (vLLM's hybrid manager): the shared 64-token
    prefix hits on both groups."""
    from simulator.kv.hybrid_prefix import HybridPrefixCachingAllocator

    kv = _layered_kv()
    return HybridPrefixCachingAllocator(64, 8, kv.pool, kv.reads, shared_prefix_tokens=64)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_contract_sliding_window_with_prefix_cache(name):
    problems, reqs, reps, a = checked_run(name, coalesce=True, make_kv=_layered_prefix_kv)
    assert problems == []
    assert all(q.status.name in ("FINISHED", "REJECTED") for q in reqs)
    assert sum(q.status.name == "FINISHED" for q in reqs) > 30
    kv = reps[0].kv
    assert kv.num_used_blocks == 0 and not kv._state and kv.hit_tokens > 0
    assert not any(kv._ref)
    _, _, _, b = checked_run(name, coalesce=False, make_kv=_layered_prefix_kv)
    for key in ("first_token_s", "finish_s", "generated_tokens", "preemptions"):
        assert np.array_equal(a[key], b[key], equal_nan=True), key


def _dipped_latency():
    """`LinearLatency` with a clock dip that prompts of 64+ tokens trigger (the workload's
    prompts are 1-200 tokens): decode steps after them are stretched up to 30%."""
    from simulator.latency.clock_dip import ClockDip
    from tests.helpers import LinearLatency

    lat = LinearLatency()
    lat.clock_dip = ClockDip(0.3, rise_s=0.002, recover_s=0.01, min_prefill_tokens=64)
    return lat


@pytest.mark.parametrize("make_kv", [None, _layered_kv], ids=["paged", "sliding"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_coalesce_invariance_with_clock_dip(name, make_kv):
    """With a latency model whose decode steps slow after long prefills (the executor's
    per-replica heat), coalesced decode runs still equal step-by-step execution, and the dip
    changes the run (so the comparison covers it), except under speculative decoding, whose
    verify steps carry 1 + k query tokens each and are never decode-only steps."""
    _, _, _, a = checked_run(name, coalesce=True, make_kv=make_kv, latency=_dipped_latency())
    _, _, _, b = checked_run(name, coalesce=False, make_kv=make_kv, latency=_dipped_latency())
    for key in ("first_token_s", "finish_s", "generated_tokens", "preemptions"):
        assert np.array_equal(a[key], b[key], equal_nan=True), key
    _, _, _, steady = checked_run(name, coalesce=True, make_kv=make_kv)
    changed = not np.array_equal(a["finish_s"], steady["finish_s"], equal_nan=True)
    assert changed == (name != "speculative")
