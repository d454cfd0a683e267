"""Prefix caching over layer groups with different rules (vLLM v1's hybrid KV cache manager).

`simulator.kv.layered.LayeredPagedAllocator` with automatic prefix caching, for models that mix
full attention with sliding windows (gpt-oss, Gemma 3) or have only sliding layers. The pool
is `simulator.served.KVPool`: group ``g`` (`KVSpec`, multiple ``m_g``) takes ``m_g`` pool
blocks per ``block_size`` tokens (a "row"). Content keys are `simulator.kv.prefix`'s
(`content_keys`); pool block ``s`` of row ``j`` of group ``g`` is cached under ``(g, key_j,
s)``, so a row of a group is a hit only when all its ``m_g`` blocks are cached (an LRU
eviction of one breaks it).

Hit length, after vLLM v1 (``vllm/v1/core/single_type_kv_cache_manager.py`` and
``vllm/v1/core/kv_cache_coordinator.py``, read for their rules; the code here is servesim's):

* each group finds its own longest hit below a bound (`KVSpec.longest_cache_hit`): full
  attention the leading run of cached rows; a sliding window (``SlidingWindowManager``) the
  first run, searching right to left, of ``ceil((window - 1) / block_size)`` cached rows, the
  hit ending with it (rows before it are not needed: no query after the hit reads them), else
  the leading run;
* the groups agree as ``HybridKVCacheCoordinator.find_longest_cache_hit`` does: starting from
  the prompt's full blocks (at most ``num_prompt_tokens - 1`` tokens), each group in turn may
  shorten the bound; repeat until no group shortens it (one round for one full and one
  sliding group, full first). A hit of ``n`` rows attaches, per group, rows
  ``blocks_freeable(n x block_size) .. n - 1``; a sliding group never holds the rows before.

As the layered allocator, blocks a sliding window leaves behind are returned at the request's
next allocation (vLLM's ``remove_skipped_blocks``), later rows first; computed full prompt
rows are registered in the hash map before that (so a freed sliding block stays cached,
evictable, as in vLLM's block pool). Registration, LRU eviction of cached free blocks and the
hit statistics are `PrefixCachingAllocator`'s.

Invariants: ``len(free) + len(evictable) + #blocks with ref > 0 == num_blocks``; a request
holds exactly ``sum_g m_g x (rows - freed[g])`` blocks (``req.block_table``, group by group,
row order); ``allocate`` / ``extend`` succeed whole or change nothing; ``free`` returns every
reference; every key in the map names a block whose key it is.
"""

from __future__ import annotations

from itertools import chain

from simulator.kv.layered import LayerGroupPool
from simulator.kv.prefix import ContentKeyCache
from simulator.request import Request
from simulator.served import KVPool, WindowedReads


class _Held:
    """One request's blocks: ``rows`` covered; per group, leading rows ``freed[g]`` not held
    and the held rows' blocks ``held[g]`` (flat, ``m_g`` per row); rows below
    ``registered`` have been offered to the hash map."""

    __slots__ = ("rows", "freed", "held", "registered")

    def __init__(self, groups: int):
        self.rows = 0
        self.freed = [0] * groups
        self.held: list[list[int]] = [[] for _ in range(groups)]
        self.registered = 0


class HybridPrefixCachingAllocator(ContentKeyCache, LayerGroupPool):
    kind = "paged+prefix"
    #: growth goes one request at a time through `extend` (it registers and frees blocks)
    extend_group = None

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        pool: KVPool,
        reads: WindowedReads | None = None,
        *,
        shared_prefix_tokens: int = 0,
        hash_block_tokens: int = 512,
    ):
        super().__init__(num_blocks, block_size, pool, reads)
        self._init_content_keys(num_blocks, block_size, shared_prefix_tokens, hash_block_tokens)
        # ``_state`` (`LayerGroupPool`): request id -> `_Held`
        #: (group, content key) -> how many of the row's blocks are cached (a hit at ``m``)
        self._full_rows: dict = {}
        self._version = 0  # bumped whenever a key enters or leaves the map
        self._memo: dict[int, tuple] = {}  # request id -> (hit rows, hit blocks) at version
        self._memo_version = 0

    # -- hits ----------------------------------------------------------------------------------
    def hit_rows(self, req: Request) -> int:
        """Rows of ``req``'s prompt a fresh admission finds cached, every group agreeing (see
        the module docstring); at most ``num_prompt_tokens - 1`` tokens."""
        return self._hit(req)[0]

    def _hit(self, req: Request) -> tuple[int, list[list[int]]]:
        """(hit rows, per group the cached blocks the hit attaches: rows from the first one
        the query at the hit reads). Memoized per request until the map changes (a policy
        asks again every step while the request waits)."""
        if self._memo_version != self._version or len(self._memo) > 4096:
            self._memo.clear()  # stale (the map changed), or lookups of requests sent elsewhere
            self._memo_version = self._version
        memo = self._memo.get(req.id)
        if memo is not None:
            return memo
        keys, full = self.block_keys(req), self._full_rows
        hit = min(len(keys), (req.num_prompt_tokens - 1) // self.block_size)
        while hit:
            bound = hit
            for g, (spec, m) in enumerate(self.groups):
                bound = spec.longest_cache_hit(
                    lambda j, g=g, m=m: full.get((g, keys[j])) == m, bound
                )
            if bound >= hit:
                break
            hit = bound
        at, by_key, hits = hit * self.block_size, self._by_key, []
        for g, (spec, m) in enumerate(self.groups):
            hits.append([by_key[g, keys[j], s]
                         for j in range(min(spec.blocks_freeable(at), hit), hit)
                         for s in range(m)])  # fmt: skip
        self._memo[req.id] = (hit, hits)
        return hit, hits

    def lookup(self, req: Request) -> int:
        """Prompt tokens a fresh admission of ``req`` would find cached (no side effects)."""
        if req.block_table or req.num_computed or req.id in self._state:
            return 0
        return self.hit_rows(req) * self.block_size

    def _plan(self, req: Request, num_tokens: int):
        """What covering ``num_tokens`` tokens takes: ``(fresh hit rows or None, hit blocks,
        state, rows, at, blocks to take, per group the new freed count, blocks given back,
        net blocks leaving the free pool)``."""
        st = self._state.get(req.id)
        hit, hits = None, None
        if st is None:
            st = _Held(len(self.groups))
            if not req.num_computed:
                hit, hits = self._hit(req)
                st.rows = hit
                st.registered = hit
                for g, (spec, _) in enumerate(self.groups):
                    st.freed[g] = min(spec.blocks_freeable(hit * self.block_size), hit)
        at = hit * self.block_size if hit is not None else req.num_computed
        rows = max(-(-num_tokens // self.block_size), st.rows)
        take, gives, new_freed = 0, [], []
        for g, (spec, m) in enumerate(self.groups):
            freed = st.freed[g]
            f = min(max(freed, spec.blocks_freeable(at)), rows)
            take += m * (rows - max(st.rows, f))
            gives.append(st.held[g][: m * (min(f, st.rows) - freed)] if f > freed else [])
            new_freed.append(f)
        ref = self._ref
        leaving = take - sum(1 for gv in gives for b in gv if ref[b] == 1)
        if hits is not None:
            leaving += sum(1 for hb in hits for b in hb if ref[b] == 0)
        return hit, hits, st, rows, take, new_freed, gives, leaving

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        return max(0, self._plan(req, num_tokens)[-1])

    def can_allocate(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_needed(req, num_tokens) + reserve <= self.num_free_blocks

    # -- allocation ----------------------------------------------------------------------------
    def allocate(self, req: Request, num_tokens: int) -> bool:
        if req.id in self._state:
            self._register(req, self._state[req.id])
        hit, hits, st, rows, take, new_freed, gives, leaving = self._plan(req, num_tokens)
        if leaving > self.num_free_blocks:
            return False
        self._memo.pop(req.id, None)
        if hit is not None:
            self.query_tokens += req.num_prompt_tokens
            self.hit_tokens += hit * self.block_size
            ref, evictable = self._ref, self._evictable
            for g, blocks in enumerate(hits):
                for b in blocks:
                    if ref[b] == 0:
                        del evictable[b]
                    ref[b] += 1
                st.held[g] = list(blocks)
            self._state[req.id] = st
        elif req.id not in self._state:
            self._state[req.id] = st
            self._register(req, st)
        self._apply(req, st, rows, take, new_freed, gives)
        return True

    def _apply(self, req, st: _Held, rows: int, take: int, new_freed, gives) -> None:
        for held, given in zip(st.held, gives, strict=True):  # every group's first: the
            if given:  # blocks they return may be the ones another group takes
                for b in reversed(given):  # later rows first, as remove_skipped_blocks
                    self._release(b)
                del held[: len(given)]
        for g, (_, m) in enumerate(self.groups):
            held = st.held[g]
            start = max(st.rows, new_freed[g])
            if new_freed[g] >= st.rows:
                held.clear()
            for _ in range(m * (rows - start)):
                held.append(self._take())
            st.freed[g] = new_freed[g]
        st.rows = rows
        req.block_table = list(chain.from_iterable(st.held))

    def extend(self, req: Request) -> int:
        """One more row for a request that filled its capacity; its next query is at the
        position equal to the old capacity, so blocks the window left behind go first."""
        st = self._state.get(req.id)
        if st is None:  # holds nothing yet: a first row, as `allocate` gives it
            return self.capacity(req) if self.allocate(req, self.block_size) else -1
        self._register(req, st)
        rows = st.rows
        # the query at the old capacity: what `_plan` computes from num_computed, but here
        # the position is the capacity (the decode set grows ahead of num_computed)
        at = rows * self.block_size
        take, gives, new_freed = 0, [], []
        for g, (spec, m) in enumerate(self.groups):
            freed = st.freed[g]
            f = min(max(freed, spec.blocks_freeable(at)), rows + 1)
            take += m * (rows + 1 - max(rows, f))
            gives.append(st.held[g][: m * (min(f, rows) - freed)] if f > freed else [])
            new_freed.append(f)
        ref = self._ref
        if take - sum(1 for gv in gives for b in gv if ref[b] == 1) > self.num_free_blocks:
            return -1
        self._apply(req, st, rows + 1, take, new_freed, gives)
        return (rows + 1) * self.block_size

    def _take(self) -> int:
        if self._free:
            b = self._free.pop()
        else:
            b, _ = self._evictable.popitem(last=False)
            self._uncache(b)
            self.evictions += 1
        self._ref[b] = 1
        return b

    def _uncache(self, b: int) -> None:
        """Take block ``b``'s content out of the hash map (it is being reused)."""
        key = self._key[b]
        del self._by_key[key]
        self._full_rows[key[:2]] -= 1
        self._version += 1
        self._key[b] = None

    def _release(self, b: int) -> None:
        ref = self._ref
        ref[b] -= 1
        if ref[b] == 0:
            if self._key[b] is None:
                self._free.append(b)
            else:
                self._evictable[b] = None

    def _register(self, req, st: _Held) -> None:
        """Publish the computed full prompt rows ``req`` holds in the hash map."""
        keys = self.block_keys(req)
        done = min(req.num_computed // self.block_size, len(keys), st.rows)
        start = st.registered
        if done <= start:
            return
        by_key, key_of, rows = self._by_key, self._key, self._full_rows
        for g, (_, m) in enumerate(self.groups):
            freed, held = st.freed[g], st.held[g]
            for j in range(max(start, freed), done):
                for s in range(m):
                    b, key = held[(j - freed) * m + s], (g, keys[j], s)
                    if key_of[b] is None and key not in by_key:
                        by_key[key] = b
                        key_of[b] = key
                        rows[g, keys[j]] = rows.get((g, keys[j]), 0) + 1
                        self._version += 1
        st.registered = done

    def capacity(self, req: Request) -> int:
        st = self._state.get(req.id)
        return st.rows * self.block_size if st else 0

    def free(self, req: Request) -> None:
        st = self._state.pop(req.id, None)
        self._memo.pop(req.id, None)
        req.block_table = []
        if st is None:
            return
        self._register(req, st)
        for held in reversed(st.held):  # tail blocks first: they become the LRU victims
            for b in reversed(held):
                self._release(b)
        self._keys.pop(req.id, None)  # rebuilt if the request comes back (preempted)

    def blocks_for_request(self, req: Request) -> int:
        """Most blocks the request can hold at once (its whole sequence in one chunk)."""
        return self.pool.max_blocks_needed(req.num_prompt_tokens + req.max_output_tokens)

    def growth_bound(self, num_seqs: int, num_steps: int) -> int:
        # a row per block_size steps per request, nothing freed (an upper bound)
        return num_seqs * -(-num_steps // self.block_size) * self.pool.blocks_per_row


__all__ = ["HybridPrefixCachingAllocator"]
