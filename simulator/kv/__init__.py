"""KV-cache allocators. Each answers yes/no; the policy picks preemption victims."""

from simulator.kv.base import KVAllocator
from simulator.kv.paged import PagedAllocator, PagedTableAllocator

__all__ = ["KVAllocator", "PagedAllocator", "PagedTableAllocator"]
