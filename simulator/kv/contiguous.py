"""Contiguous KV allocation (pre-PagedAttention engines such as FasterTransformer, Orca).

At its first allocation a request reserves one fixed extent for its whole life:

* ``reserve: max_model_len``: the longest sequence the engine accepts (the engine cannot know the
  output length); or
* ``reserve: prompt_plus_output``: prompt + the request's known output length (an oracle; an
  explicit config choice because real engines do not know it).

The extent never grows, so decoding never needs an allocation; the slots it reserves beyond the
tokens in the cache are waste (``utilization.kv_waste_*`` in summary.json). Memory is counted in
``block_size``-token blocks so that capacities compare with the paged allocator; external
fragmentation is not modelled (an optimistic bound for contiguous allocation).

Invariants: ``len(free list) + sum(len(block_table)) == num_blocks``; a request's
``block_table`` is empty or exactly its extent; ``capacity(req)`` is its extent in tokens.
"""

from __future__ import annotations

from simulator.kv.pool import BlockPool
from simulator.request import Request

RESERVE_MODES = ("max_model_len", "prompt_plus_output")


class ContiguousAllocator(BlockPool):
    kind = "contiguous"

    def __init__(self, num_blocks: int, block_size: int, reserve: str, max_model_len: int):
        super().__init__(num_blocks, block_size)
        if reserve not in RESERVE_MODES:
            raise ValueError(f"reserve must be one of {RESERVE_MODES}, got {reserve!r}")
        self.reserve = reserve
        self.max_model_len = max_model_len

    def extent_tokens(self, req: Request) -> int:
        if self.reserve == "max_model_len":
            return self.max_model_len
        return req.num_prompt_tokens + req.max_output_tokens

    def blocks_for_request(self, req: Request) -> int:
        return -(-self.extent_tokens(req) // self.block_size)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        return 0 if req.block_table else self.blocks_for_request(req)

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        if num_tokens > self.extent_tokens(req):
            return False
        return self.blocks_needed(req, num_tokens) + reserve <= len(self._free)

    def allocate(self, req: Request, num_tokens: int) -> bool:
        if num_tokens > self.extent_tokens(req):
            return False  # an extent never grows (speculative drafts past it do not fit)
        if req.block_table:
            return True
        need = self.blocks_for_request(req)
        free = self._free
        if need > len(free):
            return False
        req.block_table = free[-need:][::-1]
        del free[-need:]
        return True

    def extend(self, req: Request) -> int:
        return -1  # an extent never grows (and decoding never reaches its end)

    def capacity(self, req: Request) -> int:
        return self.extent_tokens(req) if req.block_table else 0

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        return 0  # extents cover every token a request will hold
