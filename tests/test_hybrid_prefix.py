"""Prefix caching for models with sliding-window layers (issue 15: KV per layer group).

Hit lengths follow vLLM v1's hybrid KV cache manager (`simulator.kv.hybrid_prefix`): a full
attention group hits on the leading run of cached blocks, a sliding group on the rightmost run
of ``ceil((window - 1) / block_size)`` cached blocks, and the groups take the length they all
agree on. The cases below are worked by hand; the runs check the allocator contract (every
block back, no request lost) on gpt-oss-20b and Gemma-3-27B.
"""

from __future__ import annotations

import pytest

from simulator.kv.hybrid_prefix import HybridPrefixCachingAllocator
from simulator.request import Request
from simulator.served import FullAttentionSpec, KVPool, SlidingWindowSpec, WindowedReads

#: block 4 tokens, window 9: a query reads itself and the 8 tokens before it, 2 blocks
FULL = FullAttentionSpec(4, 1, "bf16", 1, 8)
SLIDE = SlidingWindowSpec(4, 1, "bf16", 1, 8, sliding_window=9)


@pytest.mark.parametrize(
    ("cached", "max_blocks", "full", "slide"),
    [
        # full: blocks 0-2 lead; sliding from the right: 9 no, 8 (run 1), 7 no, 6, 5 (run 2:
        # the hit ends after block 6)
        ({0, 1, 2, 5, 6, 8}, 10, 3, 7),
        # no run of 2 anywhere: the sliding hit is the leading run (block 0)
        ({0, 4, 7}, 10, 1, 1),
        # every block: both groups hit the bound
        (set(range(10)), 10, 10, 10),
        # the bound cuts the search: blocks 8, 9 are not looked at
        ({0, 1, 2, 3, 8, 9}, 6, 4, 4),
        ({1, 2}, 10, 0, 3),  # a run of 2 after a miss: only the window's blocks are needed
        (set(), 10, 0, 0),
    ],
)
def test_longest_cache_hit_per_group_by_hand(cached, max_blocks, full, slide):
    assert FULL.longest_cache_hit(cached.__contains__, max_blocks) == full
    assert SLIDE.longest_cache_hit(cached.__contains__, max_blocks) == slide


def small_kv(num_blocks=64, groups=((FULL, 1), (SLIDE, 1))) -> HybridPrefixCachingAllocator:
    pool = KVPool(groups, FULL.bytes_per_block)
    return HybridPrefixCachingAllocator(num_blocks, 4, pool, WindowedReads(9, 0.5),
                                        shared_prefix_tokens=40)  # fmt: skip


def evict(kv, group: int, row: int, req) -> None:
    """Drop row ``row`` of ``group`` from the cache as an LRU eviction would."""
    drop(kv, kv._by_key[group, kv.block_keys(req)[row], 0])


def drop(kv, b: int) -> None:
    del kv._evictable[b]
    kv._uncache(b)
    kv._free.append(b)


def check_conserved(kv, live=()) -> None:
    held = {}
    for r in live:
        for b in r.block_table:
            held[b] = held.get(b, 0) + 1
    assert all(kv._ref[b] == n for b, n in held.items())
    referenced = sum(1 for x in kv._ref if x > 0)
    assert len(kv._free) + len(kv._evictable) + referenced == kv.num_blocks
    assert not set(kv._free) & set(kv._evictable)
    assert all(kv._key[b] == k for k, b in kv._by_key.items())
    rows = {}
    for g, key, _ in kv._by_key:
        rows[g, key] = rows.get((g, key), 0) + 1
    assert rows == {k: n for k, n in kv._full_rows.items() if n}


def run_prompt(kv, rid: int, prompt: int = 41) -> Request:
    """Admit a request whole, compute its prompt, free it: its full blocks are then cached."""
    req = Request(rid, 0.0, prompt, 2)
    hit = kv.lookup(req)
    assert kv.allocate(req, prompt)
    req._num_computed = prompt
    kv.free(req)
    check_conserved(kv)
    return req, hit


def test_hybrid_hit_lengths_by_hand():
    """40 shared tokens = 10 blocks; a 41-token prompt may hit at most 10 (one token must be
    computed). Window 9 at block 4: a hit of n blocks needs sliding blocks n-2 and n-1."""
    kv = small_kv()
    a, hit = run_prompt(kv, 0)
    assert hit == 0 and len(kv._by_key) == 20  # 10 rows x 2 groups registered
    b = Request(1, 0.0, 41, 2)
    assert kv.lookup(b) == 40
    # sliding rows 9 and 6 evicted: full hits 10; sliding searches below 10: 9 missing,
    # 8 and 7 cached -> 9; full agrees with 9 -> 36 tokens
    evict(kv, 1, 9, a)
    evict(kv, 1, 6, a)
    assert kv.lookup(b) == 36
    # what the hit attaches: full rows 0-8, sliding rows (36 - 9 + 1) // 4 = 7 and 8; the
    # 41 tokens need rows 9 and 10 in both groups: 4 new blocks + 11 cached (none in use)
    assert kv.blocks_needed(b, 41) == 15
    assert kv.allocate(b, 41)
    assert len(b.block_table) == 9 + 2 + 2 * 2 and kv.capacity(b) == 44
    b._num_computed = 36  # start_from_cache
    check_conserved(kv, [b])
    # a second request on the same prefix while b runs: its hits are b's blocks (in use),
    # so only its own rows leave the free pool
    c = Request(2, 0.0, 41, 2)
    assert kv.lookup(c) == 36 and kv.blocks_needed(c, 41) == 4
    kv.free(b)
    check_conserved(kv)
    # full row 4 evicted too: full hits 4 blocks; sliding below 4: rows 3, 2 -> 4; 16 tokens
    evict(kv, 0, 4, a)
    assert kv.lookup(c) == 16
    assert kv.allocate(c, 41)
    # full rows 0-3 and sliding rows (16 - 8) // 4 = 2, 3 attached, rows 4-10 new
    assert len(c.block_table) == 4 + 2 + 2 * 7
    check_conserved(kv, [c])
    kv.free(c)
    check_conserved(kv)
    assert kv.num_used_blocks == 0
    assert kv.stats()["hit_tokens"] == 36 + 16


def test_sliding_blocks_freed_while_decoding_stay_cached():
    """A request's prompt rows that slide out of its window are registered before they are
    returned, so a later request still hits them (they sit in the evictable list)."""
    kv = small_kv()
    a = Request(0, 0.0, 41, 40)
    assert kv.allocate(a, 41)
    a._num_computed = 41
    while kv.capacity(a) < 80:  # decode growth frees the sliding rows behind the window
        assert kv.extend(a) > 0
        a._num_computed = kv.capacity(a) - 3
    st = kv._state[a.id]
    assert st.freed[0] == 0 and st.freed[1] > 10  # every prompt row of the sliding group
    assert len(kv._evictable) >= 10
    b = Request(1, 0.0, 41, 2)
    assert kv.lookup(b) == 40  # full rows shared with a, sliding rows 8, 9 from the cache
    assert kv.allocate(b, 41)
    check_conserved(kv, [a, b])
    kv.free(a)
    kv.free(b)
    check_conserved(kv)
    assert kv.num_used_blocks == 0 and not kv._state


def test_only_sliding_layers_and_group_multiples():
    """One sliding group (Mistral-7B-v0.1 style) and groups of several pool blocks a row
    (Gemma 3 style: 5 + 26 for 10 + 52 layers): a row is a hit only with all its blocks."""
    kv = small_kv(groups=((SLIDE, 1),))
    a, _ = run_prompt(kv, 0)
    b = Request(1, 0.0, 41, 2)
    assert kv.lookup(b) == 40
    evict(kv, 0, 9, a)
    evict(kv, 0, 7, a)  # rows 8 alone, then 5-6 is the rightmost run of 2 -> 7 blocks
    assert kv.lookup(b) == 28
    kv = small_kv(num_blocks=200, groups=((FULL, 2), (SLIDE, 3)))
    a, _ = run_prompt(kv, 0)
    assert len(kv._by_key) == 10 * (2 + 3)
    b = Request(1, 0.0, 41, 2)
    assert kv.lookup(b) == 40
    drop(kv, kv._by_key[1, kv.block_keys(a)[8], 2])  # one of the 3 blocks of sliding row 8
    # sliding: 9 cached, 8 broken, 7 and 6 -> 8 blocks; full agrees
    assert kv.lookup(b) == 32
    assert kv.allocate(b, 41)
    assert len(b.block_table) == 2 * 8 + 3 * 2 + (2 + 3) * 3
    kv.free(b)
    check_conserved(kv)


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gemma-3-27b"])
def test_prefix_caching_on_a_sliding_model_end_to_end(model):
    """Through the config: every request completes, and the requests admitted after the
    first one's prompt was computed hit the whole 512-token shared prefix (32 rows of 16
    tokens); a few arrive while it is computed (Gemma's slower prefill: 3) and miss."""
    from tests.policy_kit import config, simulate_config

    lengths = {"input": {"dist": "uniform", "low": 600, "high": 1400},
               "output": {"dist": "uniform", "low": 20, "high": 200}}  # fmt: skip
    cfg = config(model=model, hardware={"gpu": "h200"}, scheduler={"policy": "vllm"},
                 kv_cache={"prefix_caching": {"shared_prefix_tokens": 512}},
                 workload={"arrival": {"process": "poisson", "rate_per_s": 20.0},
                           "lengths": lengths, "num_requests": 100})  # fmt: skip
    s = simulate_config(cfg)
    assert s["requests"]["completed"] == 100
    hits = s["prefix_cache"]["hit_tokens"]
    assert hits % 512 == 0 and 95 * 512 <= hits <= 99 * 512


#: pools that hold a few requests: a row of 16 tokens is 2 pool blocks for gpt-oss-20b (12 + 12
#: layers), 31 for Gemma-3-27B (10 + 52 layers, 5 + 26 blocks of 2 layers)
TIGHT_BLOCKS = {"gpt-oss-20b": 300, "gemma-3-27b": 1000}


@pytest.mark.parametrize("model", sorted(TIGHT_BLOCKS))
@pytest.mark.parametrize("policy", ["vllm", "continuous", "chunked_prefill"])
def test_tight_pool_conserves_blocks_and_loses_no_request(model, policy):
    """A pool too small for the load (preemptions and evictions happen), Mooncake-style
    prefix ids shared between requests: every request finishes, every block comes back."""
    import numpy as np

    from simulator.models import MODELS
    from simulator.served import ShardedModel
    from tests.helpers import LinearLatency
    from tests.policy_kit import run, spec

    sm = ShardedModel(MODELS[model])
    nb = TIGHT_BLOCKS[model]
    rng = np.random.default_rng(3)
    specs = []
    for i in range(60):
        prompt = int(rng.integers(100, 1500))
        family = int(rng.integers(0, 3))  # three documents: requests share their leading ids
        ids = tuple(family * 100 + j for j in range(-(-prompt // 64)))
        specs.append(spec(0.01 * i, prompt, int(rng.integers(100, 600)), ids))
    kvs = []

    def make_kv():
        kv = HybridPrefixCachingAllocator(nb, 16, sm.kv_pool(16), sm.kv_reads(),
                                          hash_block_tokens=64)  # fmt: skip
        kvs.append(kv)
        return kv

    reqs, _, _ = run(specs, policy, {"max_num_seqs": 16}, latency=LinearLatency(),
                     num_blocks=nb, block_size=16, max_model_len=4096, make_kv=make_kv)  # fmt: skip
    lost = [(q.id, q.status.name, q.reject_reason) for q in reqs if q.status.name != "FINISHED"]
    assert lost == []
    kv = kvs[0]
    check_conserved(kv)
    assert kv.num_used_blocks == 0 and not kv._state and all(x == 0 for x in kv._ref)
    assert kv.hit_tokens > 0 and kv.evictions > 0
    assert sum(q.num_preemptions for q in reqs) > 0
