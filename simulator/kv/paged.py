"""Paged KV allocation (vLLM's PagedAttention block manager, without prefix caching).

Memory is ``num_blocks`` blocks of ``block_size`` tokens. A request holds a ``block_table`` of
block ids that grows one block at a time as its tokens grow, so the only waste is the unfilled
tail of each request's last block (< block_size tokens per request).

Invariants: ``len(free list) + sum(len(block_table)) == num_blocks``; a block id is in exactly one
place; ``capacity(req) == len(req.block_table) * block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv.pool import BlockPool
from simulator.request import Request


class PagedAllocator(BlockPool):
    kind = "paged"

    def __init__(self, num_blocks: int, block_size: int = 16, ids: Sequence[int] | None = None):
        super().__init__(num_blocks, block_size, ids)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        need = -(-num_tokens // self.block_size) - len(req.block_table)
        return need if need > 0 else 0

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        need = -(-num_tokens // self.block_size) - len(req.block_table)  # blocks_needed
        return (need if need > 0 else 0) + reserve <= len(self._free)

    def allocate(self, req: Request, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - len(req.block_table)
        if need <= 0:
            return True
        free = self._free
        if need > len(free):
            return False
        table = req.block_table
        if need == 1:
            table.append(free.pop())
        else:
            table.extend(free[: -need - 1 : -1])  # the last need free blocks, last first
            del free[-need:]
        return True

    def extend(self, req: Request) -> int:
        free = self._free
        if not free:
            return -1
        table = req.block_table
        table.append(free.pop())
        return len(table) * self.block_size

    def extend_group(self, reqs: list[Request]) -> bool:
        """`extend` each of ``reqs`` in order (each gains exactly ``block_size`` tokens), or,
        when fewer blocks are free than ``reqs``, change nothing and return False.

        The decode set's grouped growth (`DecodeSet.grow_due_grouped`): blocks are handed out
        exactly as one ``extend`` per request would hand them out."""
        free = self._free
        if len(reqs) > len(free):
            return False
        pop = free.pop
        for req in reqs:
            req.block_table.append(pop())
        return True

    def used_count_parts(self) -> tuple[int, list[int]] | None:
        """``(num_blocks, free list)``, with ``num_used_blocks == num_blocks - len(free list)``
        at all times (the list object is never replaced): for the replica's commit loops, which
        log the count every step and save the property call. None where a subclass counts
        used blocks otherwise (prefix caching's evictable blocks)."""
        if type(self).num_used_blocks is not PagedAllocator.num_used_blocks:
            return None
        return self.num_blocks, self._free

    def capacity(self, req: Request) -> int:
        return len(req.block_table) * self.block_size

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        # each decoding request crosses a block boundary at most once per block_size steps
        return num_seqs * -(-num_steps // self.block_size)
