"""Paged KV allocation over layer groups with different rules (vLLM's hybrid KV cache manager).

Used for models whose layers do not all keep every token, today full attention mixed with
sliding windows (gpt-oss, Gemma 3, Mistral-7B-v0.1). The pool is `simulator.served.KVPool`:
a pool block is one page for ``unit_layers`` layers, and each group (`KVSpec`, multiple ``m``)
takes ``m`` pool blocks per ``block_size`` tokens ("a row"). Each request covers ``rows`` rows
and, per group, has returned its first ``freed[g]`` rows: those its spec says no query at or
after the request's position reads (`KVSpec.blocks_freeable`). Blocks are freed when the
request next allocates (as vLLM's ``remove_skipped_blocks`` runs in ``allocate_slots``), so
``capacity(req) == rows x block_size`` keeps the meaning it has for every allocator.

Invariants (the `KVAllocator` contract): ``len(free list) + sum(len(block_table)) ==
num_blocks``; a request holds exactly ``sum_g m_g x (rows - freed[g])`` blocks;
``allocate`` / ``extend`` either succeed whole or change nothing (freeing included); ``free``
returns every block. With prefix caching these layouts get
`simulator.kv.hybrid_prefix.HybridPrefixCachingAllocator` (same rows, blocks with identities);
the contiguous allocator is not modelled for them (`simulator.engine` refuses it).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv.pool import BlockPool
from simulator.request import Request
from simulator.served import KVPool, WindowedReads


class LayerGroupPool(BlockPool):
    """A block pool whose rows serve a model's layer groups (``pool``, `KVPool`), with the
    model's keys-read features (the replica computes step features through them): what the
    layered allocator and its prefix-caching twin (`HybridPrefixCachingAllocator`) share."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        pool: KVPool,
        reads: WindowedReads | None = None,
        ids: Sequence[int] | None = None,
    ):
        super().__init__(num_blocks, block_size, ids)
        if any(s.block_size != block_size for s, _ in pool.groups):
            raise ValueError("pool specs must use the allocator's block_size")
        self.pool = pool
        self.groups = pool.groups
        self.reads = reads
        #: per request (by id) what it holds in each group; its form is the subclass's
        self._state: dict = {}


class LayeredPagedAllocator(LayerGroupPool):
    kind = "paged"
    #: growth goes one request at a time through `extend` (a row may free blocks as it takes)
    extend_group = None

    #: ``_state``: req.id -> [rows, freed rows per group...]

    def _plan(self, req: Request, rows: int, at: int) -> tuple[int, int, list[int]]:
        """(blocks to take, blocks to return, new state) to cover ``rows`` rows when the next
        query is at position ``at``."""
        state = self._state.get(req.id) or [0] * (1 + len(self.groups))
        rows = max(rows, state[0])
        take = give = 0
        new = [rows]
        for (spec, m), freed in zip(self.groups, state[1:], strict=True):
            f = min(max(freed, spec.blocks_freeable(at)), rows)
            take += m * (rows - max(state[0], f))
            give += m * (min(f, state[0]) - freed)
            new.append(f)
        return take, give, new

    def _apply(self, req: Request, take: int, give: int, new: list[int]) -> None:
        table, free = req.block_table, self._free
        if give:
            free.extend(reversed(table[:give]))
            del table[:give]
        for _ in range(take):
            table.append(free.pop())
        self._state[req.id] = new

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        take, give, _ = self._plan(req, -(-num_tokens // self.block_size), req.num_computed)
        return max(0, take - give)

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_needed(req, num_tokens) + reserve <= len(self._free)

    def allocate(self, req: Request, num_tokens: int) -> bool:
        take, give, new = self._plan(req, -(-num_tokens // self.block_size), req.num_computed)
        if take > len(self._free) + give:
            return False
        self._apply(req, take, give, new)
        return True

    def extend(self, req: Request) -> int:
        """One more row for a request that filled its capacity; its next query is at the
        position equal to the old capacity, so blocks the window left behind go first."""
        state = self._state.get(req.id)
        rows = state[0] if state else 0
        take, give, new = self._plan(req, rows + 1, rows * self.block_size)
        if take > len(self._free) + give:
            return -1
        self._apply(req, take, give, new)
        return (rows + 1) * self.block_size

    def capacity(self, req: Request) -> int:
        state = self._state.get(req.id)
        return state[0] * self.block_size if state else 0

    def free(self, req: Request) -> None:
        super().free(req)
        self._state.pop(req.id, None)

    def blocks_for_request(self, req: Request) -> int:
        """Most blocks the request can hold at once (its whole sequence in one chunk)."""
        return self.pool.max_blocks_needed(req.num_prompt_tokens + req.max_output_tokens)

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        # a row per block_size steps per request, nothing freed (an upper bound)
        return num_seqs * -(-num_steps // self.block_size) * self.pool.blocks_per_row


__all__ = ["LayeredPagedAllocator"]
