"""One kind of replica, resolved from config: its policy and its KV allocator.

`EngineSpec.parse` reads a ``scheduler`` section (policy name + that policy's own parameters,
validated by the policy) and a ``kv_cache`` section (allocator, block size, capacity, reserve
mode, prefix caching) once; the KV capacity keeps out an activation reserve sized by the
policy's own token and sequence budgets (`scheduler_budgets`); ``make_policy()`` and
``make_kv()`` then build a fresh instance per
replica. Colocated clusters have one EngineSpec; P/D disaggregation has one per pool.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from policies import POLICIES
from simulator.cfg import Section
from simulator.hardware import kv_capacity_blocks
from simulator.kv.contiguous import RESERVE_MODES, ContiguousAllocator
from simulator.kv.hybrid_prefix import HybridPrefixCachingAllocator
from simulator.kv.layered import LayeredPagedAllocator
from simulator.kv.paged import PagedAllocator, PagedTableAllocator
from simulator.kv.prefix import PrefixCachingAllocator
from simulator.served import ShardedModel

#: Upper bounds that catch a typo before it exhausts memory: allocators that keep block ids keep
#: a list of them per replica (a real GPU holds well under a million), and every replica
#: simulates its own engine.
MAX_BLOCKS = 2**24
MAX_REPLICAS = 1024


@dataclass
class EngineSpec:
    """One kind of replica: its policy (from a ``scheduler`` section) and KV allocator (from a
    ``kv_cache`` section), resolved once and instantiated per replica.

    ``kv_cache`` keys: ``allocator`` (paged | contiguous), ``block_size`` (16),
    ``gpu_memory_utilization`` (0.9) or ``num_blocks``, ``reserve`` (contiguous only:
    max_model_len | prompt_plus_output), ``prefix_caching`` (paged only: false | true |
    ``{shared_prefix_tokens: N, hash_block_tokens: 512}``).
    """

    policy_cls: type
    sched: Section
    engine: dict
    num_blocks: int
    block_size: int
    make_kv: object
    resolved_scheduler: dict
    resolved_kv: dict

    @classmethod
    def parse(cls, sched: Section, kvs: Section, model, gpu, tp: int, where: str) -> EngineSpec:
        policy_name = sched.str("policy", choices=sorted(POLICIES))
        policy_cls = POLICIES[policy_name]
        allocator = kvs.str("allocator", "paged", choices=["paged", "contiguous"])
        block_size = kvs.int("block_size", 16, min=1)
        num_blocks = kvs.int("num_blocks", None, min=1, max=MAX_BLOCKS)
        if num_blocks is not None and kvs.has("gpu_memory_utilization"):
            # num_blocks sets the pool; a utilization beside it would be silently ignored
            raise kvs.error("gpu_memory_utilization", "give num_blocks or gpu_memory_utilization, "
                            "not both (num_blocks sets the KV pool)")  # fmt: skip
        util = kvs.num("gpu_memory_utilization", 0.9, min=0, max=1, strict_min=True)
        max_len = model.max_model_len
        served = ShardedModel(model, tp)
        if num_blocks is None:
            tokens, seqs = scheduler_budgets(policy_cls, sched, max_len, served)
            num_blocks = kv_capacity_blocks(
                model, gpu, tp, block_size, util, where=where,
                key=kvs.key("gpu_memory_utilization"), block_key=kvs.key("block_size"),
                max_num_batched_tokens=tokens, max_num_seqs=seqs,
            )  # fmt: skip
            if num_blocks > MAX_BLOCKS:
                raise kvs.error("block_size", f"gives {num_blocks} KV blocks per replica, more "
                                f"than {MAX_BLOCKS} (raise block_size)")  # fmt: skip
        reserve = kvs.str("reserve", None, choices=RESERVE_MODES)
        if allocator == "contiguous" and reserve is None:
            raise kvs.error("reserve", f"the contiguous allocator needs one of {RESERVE_MODES}")
        if allocator != "contiguous" and reserve is not None:
            raise kvs.error("reserve", "only used with allocator: contiguous")
        prefix, shared, hash_block = _read_prefix_caching(kvs, allocator, block_size, where)

        pool = served.kv_pool(block_size)
        if pool.frees_blocks and allocator != "paged":
            raise kvs.error("allocator", f"{model.name} has sliding-window layers: only the "
                            "paged allocator models them")  # fmt: skip

        make_kv = _kv_factory(
            allocator, num_blocks, block_size, reserve, max_len, prefix, shared, hash_block,
            pool, served,
        )  # fmt: skip

        engine = _engine_dict(max_len, block_size, num_blocks, served)
        probe = make_policy(policy_cls, sched, engine)
        mark_all_used(sched)
        resolved_kv = {
            "allocator": allocator,
            "block_size": block_size,
            "gpu_memory_utilization": util,
            "num_blocks": num_blocks,
            "reserve": reserve,
            "prefix_caching": (
                False if prefix is False
                else {"shared_prefix_tokens": shared, "hash_block_tokens": hash_block}
            ),
        }  # fmt: skip
        return cls(
            policy_cls, sched, engine, num_blocks, block_size, make_kv,
            {"policy": policy_name, **probe.params()}, resolved_kv,
        )  # fmt: skip

    def make_policy(self, rng=None):
        engine = dict(self.engine, rng=rng) if rng is not None else self.engine
        return make_policy(self.policy_cls, self.sched, engine)


def _read_prefix_caching(kvs: Section, allocator: str, block_size: int, where: str):
    """``kv_cache.prefix_caching``: false, true or ``{shared_prefix_tokens,
    hash_block_tokens}``; returns ``(prefix, shared, hash_block)`` (prefix False when off)."""
    prefix = kvs.raw("prefix_caching", False)
    shared = hash_block = 0
    if prefix is not False:
        if allocator != "paged":
            raise kvs.error("prefix_caching", "only the paged allocator caches prefixes")
        if prefix is True:
            prefix = {}
        psec = Section(prefix, where, kvs.key("prefix_caching"))
        shared = psec.int("shared_prefix_tokens", 0, min=0)
        hash_block = psec.int("hash_block_tokens", 512, min=1)
        psec.done()
        if hash_block % block_size:
            raise kvs.error(
                "block_size", f"must divide prefix_caching.hash_block_tokens {hash_block}"
            )
    return prefix, shared, hash_block


def _kv_factory(allocator, num_blocks, block_size, reserve, max_len, prefix, shared, hash_block,
                pool, served):  # fmt: skip
    """``make_kv(block_ids=False)``: a fresh KV allocator for one replica, of the configured
    kind. ``block_ids``: the executor reads which blocks a request holds (the real-GPU
    executor's paged layout, ``reads_block_ids``), so plain paged KV keeps ids
    (`PagedTableAllocator`) instead of counts (`PagedAllocator`); the two decide alike."""

    @functools.cache
    def ids() -> tuple[int, ...]:  # built once, shared by every replica's pool
        return tuple(range(num_blocks))

    def make_kv(block_ids: bool = False):
        if allocator == "contiguous":
            return ContiguousAllocator(num_blocks, block_size, reserve, max_len)
        if prefix is not False and pool.frees_blocks:
            return HybridPrefixCachingAllocator(
                num_blocks, block_size, pool, served.kv_reads(), shared_prefix_tokens=shared,
                hash_block_tokens=hash_block,
            )  # fmt: skip
        if prefix is not False:
            return PrefixCachingAllocator(
                num_blocks, block_size, shared_prefix_tokens=shared,
                hash_block_tokens=hash_block,
            )  # fmt: skip
        if pool.frees_blocks:
            return LayeredPagedAllocator(num_blocks, block_size, pool, served.kv_reads(),
                                         ids())  # fmt: skip
        if block_ids:
            return PagedTableAllocator(num_blocks, block_size, ids())
        return PagedAllocator(num_blocks, block_size)

    return make_kv


def _engine_dict(max_len: int, block_size: int, num_blocks: int, served: ShardedModel) -> dict:
    """What a policy is told about its replica's engine."""
    return {
        "max_model_len": max_len,
        "block_size": block_size,
        "num_blocks": num_blocks,
        "kv_bytes_per_token_per_gpu": served.kv_bytes_per_token_per_gpu,
        # bytes a request's KV holds on one GPU (what a swap copies): see kv_bytes_held
        "kv_bytes_held": functools.partial(served.kv_bytes_held, block_size=block_size),
        "model": served.spec,
    }


#: vLLM's defaults, for policies without a token or sequence budget (static batching)
DEFAULT_BUDGETS = (8192, 256)


def scheduler_budgets(policy_cls, sched: Section, max_len: int, served) -> tuple[int, int]:
    """The policy's ``max_num_batched_tokens`` and ``max_num_seqs``, which size the activation
    reserve kept out of the KV cache (as vLLM's profiling run does); `DEFAULT_BUDGETS` for a
    policy that has neither. Budgets never depend on the KV size, so the policy is read here
    with a placeholder capacity (`MAX_BLOCKS`) and built again once the capacity is known."""
    probe = make_policy(policy_cls, sched, _engine_dict(max_len, 1, MAX_BLOCKS, served))
    return (
        getattr(probe, "max_num_batched_tokens", DEFAULT_BUDGETS[0]),
        getattr(probe, "max_num_seqs", DEFAULT_BUDGETS[1]),
    )


def make_policy(policy_cls, sched: Section, engine: dict):
    """Build a policy from the ``scheduler`` section; its unknown keys are errors."""
    sec = Section(sched.data, sched.where, sched.path)
    sec.raw("policy")
    policy = policy_cls(sec, engine)
    sec.done()
    return policy


def mark_all_used(sec: Section) -> None:
    # the section was validated by its owner (policy/router) on a separate Section view
    for k in sec.data:
        sec._used.add(k)
