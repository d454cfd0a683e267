"""The block pool of the KV allocators that keep block ids (`PagedTableAllocator`, prefix
caching, layer groups, contiguous): ``num_blocks`` blocks of ``block_size`` tokens. (The
engine's plain paged allocator, `PagedAllocator`, keeps counts instead.)

Free blocks are a stack (the most recently freed block is reused first), which keeps runs
deterministic. Invariant: ``len(free list) + sum(len(req.block_table)) == num_blocks``.
Subclasses decide how many blocks a request takes and when (paged: one at a time as it grows;
contiguous: one extent up front).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.request import Request


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, ids: Sequence[int] | None = None):
        """``ids``: the block ids ``0 .. num_blocks - 1`` as one sequence that the pools of a
        cluster's replicas share (`EngineSpec`). Same ids, same behaviour; what it saves: every
        pool otherwise holds its own int object per block, and with 64 replicas the blocks moved
        between free lists and block tables are scattered over 64x the memory (a run's KV work
        got ~8% slower per block from cache misses)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if ids is not None and len(ids) != num_blocks:
            raise ValueError(f"{len(ids)} block ids for {num_blocks} blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(reversed(ids if ids is not None else range(num_blocks)))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def free(self, req: Request) -> None:
        """Return every block ``req`` holds (in reverse, so its first block is reused last)."""
        table = req.block_table
        if table:
            table.reverse()
            self._free.extend(table)
            req.block_table = []
