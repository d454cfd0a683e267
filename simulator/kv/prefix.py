"""Paged KV with automatic prefix caching (vLLM's APC, v1 KVCacheManager style).

A full block of prompt tokens is identified by a chained hash of its content: the hash of the
previous block plus its own token ids. Token ids are not simulated, so content comes from:

* the request's ``hash_ids`` (Mooncake traces: one id per ``hash_block_tokens``-token block, 512
  in the FAST'25 release, equal ids = equal content). A hash block of 512 tokens is
  ``512 / block_size`` KV blocks; KV block j of a request is keyed by
  ``(key of block j-1, hash_ids[j * block_size // 512], sub-block)``; or
* for requests without ``hash_ids``, ``shared_prefix_tokens`` (a synthetic system prompt that
  every request starts with): its full blocks are keyed ``(previous, "shared", j)``.

Blocks: each physical block has a reference count (requests whose ``block_table`` holds it). A
computed full prompt block is registered in the hash map; when its last holder frees it, it stays
cached in an LRU list of evictable blocks (it still counts as free). Allocating a new block takes
a never-cached free block first, else evicts the least recently freed cached block.

Hits: ``lookup(req)`` counts the leading blocks of the prompt present in the map, at most
``num_prompt_tokens - 1`` tokens (one token must be computed to sample). ``allocate`` on a request
with no blocks and no progress attaches exactly those blocks (ref + 1) before adding new ones, and
records the query / hit tokens for the hit rate. Blocks are registered when the request that
computes them next allocates or frees (so a block is shared only once it is computed).

Invariants: ``len(free) + len(evictable) + #blocks with ref > 0 == num_blocks``; a block is in at
most one of free / evictable / referenced; every key in ``_by_key`` maps to a block whose
``_key`` is that key.
"""

from __future__ import annotations

from collections import OrderedDict

from simulator.kv.paged import PagedTableAllocator
from simulator.request import Request


def content_keys(req, block_size: int, shared_prefix_tokens: int, hash_block_tokens: int) -> list:
    """The chained content keys of ``req``'s full prompt blocks of ``block_size`` tokens that
    can be shared (see the module docstring): from its ``hash_ids``, else the blocks of the
    synthetic shared prefix. Equal keys = equal content and equal content before it."""
    n_full = req.num_prompt_tokens // block_size
    keys, prev = [], None
    if req.hash_ids:
        per = hash_block_tokens // block_size
        for j in range(min(n_full, len(req.hash_ids) * per)):
            prev = hash((prev, req.hash_ids[j // per], j % per))
            keys.append(prev)
    else:
        for j in range(min(n_full, shared_prefix_tokens // block_size)):
            prev = hash((prev, "shared", j))
            keys.append(prev)
    return keys


class ContentKeyCache:
    """The content-key state both prefix-caching allocators keep (mixed into a `BlockPool`):
    per block its reference count and key, the key -> block map, the LRU of evictable cached
    blocks, each request's keys (`block_keys`), and the hit / eviction counters. The
    allocators read these fields directly on their hot paths."""

    def _init_content_keys(
        self, num_blocks: int, block_size: int, shared_prefix_tokens: int, hash_block_tokens: int
    ) -> None:
        if hash_block_tokens % block_size:
            raise ValueError(
                f"block_size {block_size} must divide the trace's hash block {hash_block_tokens}"
            )
        self.shared_prefix_tokens = shared_prefix_tokens
        self.hash_block_tokens = hash_block_tokens
        self._ref = [0] * num_blocks
        self._key: list = [None] * num_blocks
        self._by_key: dict = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._keys: dict[int, list] = {}  # request id -> keys of its full prompt blocks
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    # cached blocks nobody holds still count as free (an allocation may evict them)
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def stats(self) -> dict:
        """This allocator's prefix-cache hits and evictions (the runner sums the counters over
        replicas itself)."""
        return {
            "query_tokens": self.query_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "evictions": self.evictions,
        }

    def block_keys(self, req: Request) -> list:
        keys = self._keys.get(req.id)
        if keys is None:
            keys = self._keys[req.id] = content_keys(
                req, self.block_size, self.shared_prefix_tokens, self.hash_block_tokens
            )
        return keys


class PrefixCachingAllocator(ContentKeyCache, PagedTableAllocator):
    kind = "paged+prefix"

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        shared_prefix_tokens: int = 0,
        hash_block_tokens: int = 512,
    ):
        super().__init__(num_blocks, block_size)
        self._init_content_keys(num_blocks, block_size, shared_prefix_tokens, hash_block_tokens)
        self._registered: dict[int, int] = {}  # request id -> blocks of its table registered

    # -- content keys --------------------------------------------------------------------------
    def _hit_blocks(self, req: Request) -> list[int]:
        keys, by_key, out = self.block_keys(req), self._by_key, []
        limit = (req.num_prompt_tokens - 1) // self.block_size
        for key in keys[:limit]:
            b = by_key.get(key)
            if b is None:
                break
            out.append(b)
        return out

    def lookup(self, req: Request) -> int:
        """Prompt tokens a fresh admission of ``req`` would find cached (no side effects)."""
        if req.block_table or req.num_computed:
            return 0
        return len(self._hit_blocks(req)) * self.block_size

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        total = -(-num_tokens // self.block_size)
        if req.block_table or req.num_computed:
            need = total - len(req.block_table)
            return need if need > 0 else 0
        hits = self._hit_blocks(req)
        in_use = sum(1 for b in hits if self._ref[b] > 0)  # evictable hits leave the free pool
        return max(total - in_use, 0)

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_needed(req, num_tokens) + reserve <= self.num_free_blocks

    # -- allocation ----------------------------------------------------------------------------
    def allocate(self, req: Request, num_tokens: int) -> bool:
        table = req.block_table
        fresh = not table and not req.num_computed
        hits = self._hit_blocks(req) if fresh else []
        need = -(-num_tokens // self.block_size) - len(table) - len(hits)
        taken_from_free = sum(1 for b in hits if self._ref[b] == 0)
        if need > 0 and need + taken_from_free > self.num_free_blocks:
            return False
        if fresh:
            self.query_tokens += req.num_prompt_tokens
            self.hit_tokens += len(hits) * self.block_size
            for b in hits:
                if self._ref[b] == 0:
                    del self._evictable[b]
                self._ref[b] += 1
                table.append(b)
            self._registered[req.id] = len(hits)
        else:
            self._register(req)
        if need > 0:
            self._take_into(table, need)
        return True

    def _take_into(self, table: list[int], need: int) -> None:
        """Append ``need`` blocks to ``table``, exactly as ``need`` calls of `_take` would.

        Why: a long prompt takes hundreds of blocks at once (Mooncake prompts average ~450 of
        16 tokens), and one method call a block was a fifth of a prefix-caching run. Blocks
        never cached come off the free stack as one slice (in pop order); the rest evict,
        least recently freed first (the caller checked that enough blocks are free)."""
        free, ref = self._free, self._ref
        k = need if need < len(free) else len(free)
        if k:
            blocks = free[: -k - 1 : -1]
            del free[-k:]
            for b in blocks:
                ref[b] = 1
            table += blocks
        if need > k:
            popitem, by_key, key_of = self._evictable.popitem, self._by_key, self._key
            for _ in range(need - k):
                b = popitem(last=False)[0]
                del by_key[key_of[b]]
                key_of[b] = None
                ref[b] = 1
                table.append(b)
            self.evictions += need - k

    #: growth goes through `extend` one request at a time (it registers full blocks' hashes
    #: and may evict cached blocks), never through the paged allocator's grouped path
    extend_group = None

    def extend(self, req: Request) -> int:
        """The decode hot path: one more block (see KVAllocator.extend)."""
        if not self._free and not self._evictable:
            return -1
        self._register(req)
        req.block_table.append(self._take())
        return len(req.block_table) * self.block_size

    def _take(self) -> int:
        if self._free:
            b = self._free.pop()
        else:
            b, _ = self._evictable.popitem(last=False)
            del self._by_key[self._key[b]]
            self._key[b] = None
            self.evictions += 1
        self._ref[b] = 1
        return b

    def _register(self, req: Request) -> None:
        """Publish the computed full prompt blocks of ``req`` in the hash map."""
        keys = self.block_keys(req)
        done = min(req.num_computed // self.block_size, len(keys), len(req.block_table))
        start = self._registered.get(req.id, 0)
        table, by_key, key_of = req.block_table, self._by_key, self._key
        for j in range(start, done):
            b, key = table[j], keys[j]
            if key_of[b] is None and key not in by_key:
                by_key[key] = b
                key_of[b] = key
        if done > start:
            self._registered[req.id] = done

    def free(self, req: Request) -> None:
        table = req.block_table
        if not table:
            return
        self._register(req)
        self._registered.pop(req.id, None)
        ref, key_of = self._ref, self._key
        for b in reversed(table):  # tail blocks first: they become the LRU victims
            ref[b] -= 1
            if ref[b] == 0:
                if key_of[b] is None:
                    self._free.append(b)
                else:
                    self._evictable[b] = None
        req.block_table = []
