"""The allocator interface shared by the paged and contiguous KV caches.

Contract (tests check it for every allocator):

* ``allocate(req, num_tokens)`` makes ``req``'s cache cover ``num_tokens`` tokens and returns
  True, or changes nothing and returns False. It never evicts anything a running request holds:
  choosing a victim is the policy's job.
* ``free(req)`` returns everything ``req`` holds.
* ``capacity(req)`` is the number of tokens ``req`` can hold without another allocation.
* Block conservation: ``num_free_blocks + blocks held by requests (+ cached free blocks) ==
  num_blocks`` at all times; after a run every block is free.
"""

from __future__ import annotations

from typing import Protocol

from simulator.request import Request


class KVAllocator(Protocol):
    block_size: int
    num_blocks: int

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        """Blocks ``allocate(req, num_tokens)`` would take now (0 if already covered)."""
        ...

    def allocate(self, req: Request, num_tokens: int) -> bool: ...

    def capacity(self, req: Request) -> int: ...

    def extend(self, req: Request) -> int:
        """Grow a request that has filled its capacity by one unit (paged: one block).

        Returns the new capacity in tokens, or -1 (and changes nothing) if memory is short.
        The decode hot path calls this instead of ``allocate``.
        """
        ...

    def free(self, req: Request) -> None: ...

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        """Most blocks ``num_seqs`` decoding requests can need over ``num_steps`` decode steps."""
        ...
