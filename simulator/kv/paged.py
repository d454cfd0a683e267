"""Paged KV allocation (vLLM's PagedAttention block manager, without prefix caching).

Memory is ``num_blocks`` blocks of ``block_size`` tokens. A request's KV grows one block at a
time as its tokens grow, so the only waste is the unfilled tail of each request's last block
(< block_size tokens per request). Two allocators make exactly the same decisions (the same
answer to every call, hence the same runs); they differ in what they keep:

* `PagedAllocator` keeps counts: per request how many blocks it holds (`Request.kv_blocks`)
  and the pool's used count. What a simulated run outputs about KV is counts only
  (``kv_blocks_used``, capacities); which block a request holds is never read. Why: KV growth
  is a run's most frequent event (one per decode-set member per block), and with counts the
  growth of a whole decode-set bucket is one addition (`PagedAllocator.extend_group`), no
  member touched; with 64 replicas each touched member was a cache miss.
* `PagedTableAllocator` keeps block ids (`Request.block_table`): for the real-GPU executor,
  whose paged layout indexes its cache with them (`profiles.step_batch`), and as the base of
  prefix caching (`simulator.kv.prefix`), where blocks have identities.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv.pool import BlockPool
from simulator.request import Request


class PagedAllocator:
    """Paged KV as counts (see the module docstring). The engine's allocator for a model whose
    layers all keep every token, without prefix caching, when the executor reads no block ids.

    Invariants (checkable with `held` over the requests, `tests/test_fuzz.py`):

    * ``0 <= num_used_blocks <= num_blocks`` and ``num_used_blocks == sum(held(r))`` over all
      requests: every block taken is held by one request and comes back by its ``free``;
    * ``capacity(r) == held(r) * block_size``;
    * ``held(r) == r.kv_blocks``, except for a member of a `DecodeSet` in counting mode
      (``kv_unit == block_size``) while it sits in a growth bucket: there the bucket holds it,
      ``(bucket.key + r._dbase) // block_size`` (a bucket's key is each member's capacity less
      its ``_dbase``, and `extend_group` moves the whole bucket by one block without writing
      to its members); the set writes it back onto ``r.kv_blocks`` whenever ``r`` leaves the
      bucket (removal, growth handed out member by member). So ``allocate``, ``extend`` and
      ``free`` are only called for requests in no bucket (`Replica` removes a member from the
      set before freeing it; policies allocate for requests outside the set).

    Every call either succeeds whole or changes nothing (``can_allocate`` / ``allocate`` answer
    alike for the same arguments)."""

    kind = "paged"
    #: decode-set members' block counts live in their growth buckets (`DecodeSet` kv_unit)
    counts_in_buckets = True

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        #: a plain attribute (read every step by the replica's commit loops), not a property
        self.num_used_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    def held(self, req: Request) -> int:
        """Blocks ``req`` holds (read through to its growth bucket; see the invariants)."""
        bucket = req._gbucket
        if bucket is None:
            return req.kv_blocks
        return (bucket.key + req._dbase) // self.block_size

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        need = -(-num_tokens // self.block_size) - req.kv_blocks
        return need if need > 0 else 0

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        need = -(-num_tokens // self.block_size) - req.kv_blocks  # blocks_needed
        return (need if need > 0 else 0) + reserve <= self.num_blocks - self.num_used_blocks

    def allocate(self, req: Request, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - req.kv_blocks
        if need <= 0:
            return True
        used = self.num_used_blocks + need
        if used > self.num_blocks:
            return False
        self.num_used_blocks = used
        req.kv_blocks += need
        return True

    def extend(self, req: Request) -> int:
        if self.num_used_blocks >= self.num_blocks:
            return -1
        self.num_used_blocks += 1
        req.kv_blocks = n = req.kv_blocks + 1
        return n * self.block_size

    def extend_group(self, reqs: list[Request]) -> bool:
        """Give each of ``reqs`` (the due members of a decode set in counting mode) one more
        block, or, when fewer blocks are free than ``reqs``, change nothing and return False.

        Only the pool's count changes: the caller (`DecodeSet.grow_due_grouped`) records the
        members' new counts by moving their bucket one block on (see the invariants)."""
        used = self.num_used_blocks + len(reqs)
        if used > self.num_blocks:
            return False
        self.num_used_blocks = used
        return True

    def free(self, req: Request) -> None:
        """Return every block ``req`` holds (``req`` is in no growth bucket)."""
        self.num_used_blocks -= req.kv_blocks
        req.kv_blocks = 0

    def capacity(self, req: Request) -> int:
        bucket = req._gbucket  # `held` x block_size, inline: a joining member's capacity
        if bucket is None:
            return req.kv_blocks * self.block_size
        return bucket.key + req._dbase

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        # each decoding request crosses a block boundary at most once per block_size steps
        return num_seqs * -(-num_steps // self.block_size)


class PagedTableAllocator(BlockPool):
    """Paged KV with block ids: each request's ``block_table`` lists the blocks it holds.

    Invariants: ``len(free list) + sum(len(block_table)) == num_blocks``; a block id is in
    exactly one place; ``capacity(req) == len(req.block_table) * block_size``. Decisions equal
    `PagedAllocator`'s call for call (`tests/test_fuzz.py`)."""

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

    def capacity(self, req: Request) -> int:
        return len(req.block_table) * self.block_size

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        # each decoding request crosses a block boundary at most once per block_size steps
        return num_seqs * -(-num_steps // self.block_size)
