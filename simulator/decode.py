"""The decode set: running requests that emit one token per decode step, on a shared clock.

Why it exists: a busy replica runs hundreds of thousands of decode steps with tens to hundreds of
requests each. Touching every request every step costs ~0.2 us per request-step in Python, which
caps a simulator at a few thousand requests per second. Instead, the set keeps one integer
``clock`` (decode steps taken) and each member's offset, so

    member.num_computed == clock + member._dbase          (always, while a member)

and a decode step is ``clock += 1`` plus work only for the members that finish or need a new KV
block on that step, found by the clock value at which that happens: a heap for finishes, and
for KV growth buckets (clock value -> members) looked up by the clock itself, because growth is
the most frequent event (one per member per block), members that joined at the same offset
modulo the block size share a key, and growth is checked at every clock value the set passes.
The sum of context lengths (what the latency model needs) is ``n * (clock + 1) + sum(_dbase)``,
and the longest is ``clock + 1 + max(_dbase)``, kept by a third heap (a member's ``_dbase`` never
changes while it is a member).

Invariants:
* every member has exactly one pending token (its last emitted token) and status RUNNING;
* ``_fin_clock`` on a member equals the key of its live ``_fin`` entry; stale entries (member
  left, or key changed) are skipped when popped;
* growth buckets (`_GrowthBucket`) hold only members, each in id order; a member is in at most
  one, the one its ``_gbucket`` names (none while its growth is being handed out), and its next
  growth is due at that bucket's ``key`` (``Request._grow_clock``); removal takes it out at once;
* every key of ``_grow_at`` is ``>= _low`` (a bucket may be empty), so the growth due at clock
  ``c`` (every bucket with key ``<= c``) is the bucket at ``c`` alone when ``_low == c``: the
  usual case, since growth is checked before every decode step and a check at ``c`` leaves
  ``_low = c + 1`` (a key filed below it lowers it); growth is handed out in the order (key,
  request id), as the single heap of (key, id, request) entries did;
* ``sum_dbase == sum(m._dbase for m in members)``;
* counting mode (``count_unit`` set: the allocator is the counting `PagedAllocator`, whose
  members' block counts live in their buckets): a member in a bucket holds
  ``(bucket.key + _dbase) // count_unit`` blocks (``bucket.key + _dbase`` is its capacity, a
  multiple of the block size), so a grouped growth that moves a bucket one block on grows
  every member's count with it; a member that leaves its bucket (`remove`, `_take_bucket`, a
  grouped growth handed back) has that count written onto ``Request.kv_blocks`` first;
* every member has an entry ``(-_dbase, id, req)`` in ``_longest``; entries of requests that
  left (or left and rejoined with another ``_dbase``) are stale and skipped when on top, and
  the heap is rebuilt from the members when it holds more than twice their number (+64).
"""

from __future__ import annotations

import heapq
from bisect import insort
from operator import attrgetter

from simulator.request import Request

_by_id = attrgetter("id")


class _GrowthBucket:
    """Members whose next KV growth is due at clock value ``key``, in request-id order.

    Why a bucket object that members point to (``Request._gbucket``): after a grouped growth
    every member of the bucket is due again ``block_size`` steps later, so the whole bucket
    moves by changing ``key`` alone, with no write to its members; only a merge with a bucket
    already at the new key re-points the smaller side's members."""

    __slots__ = ("key", "members")

    def __init__(self, key: int, members: list[Request]):
        self.key = key
        self.members = members


class DecodeSet:
    __slots__ = (
        "clock", "members", "sum_dbase", "_fin", "_grow_at", "_low", "_longest", "joined",
        "last_step_end", "window", "_sat_keys", "_sat", "_sat_dsum", "count_unit",
    )  # fmt: skip

    def __init__(self, window: int | None = None, count_unit: int | None = None):
        """``window``: the sliding window of a model with sliding layers, for `decode_excess`
        (None: no such layers, and none of its bookkeeping runs). ``count_unit``: the block
        size of a counting allocator (`PagedAllocator.counts_in_buckets`): counting mode (see
        the invariants); None for allocators that keep what members hold themselves."""
        self.clock = 0
        self.window = window
        self.count_unit = count_unit
        #: heap of (clock at which a member's context first exceeds the window, id, request)
        self._sat_keys: list[tuple[int, int, Request]] = []
        #: members whose context exceeds the window: id -> _dbase; and the sum of those
        self._sat: dict[int, int] = {}
        self._sat_dsum = 0
        self.members: dict[int, Request] = {}
        self.sum_dbase = 0
        #: heap of (finish clock, id, request); may hold stale entries (a member removed or
        #: re-filed): its top is a lower bound on the next finish (`next_finish_clock`). The
        #: list object is never replaced, so a caller may hold it (`finish_heap`)
        self._fin: list[tuple[int, int, Request]] = []
        #: clock value -> the bucket of members due for KV growth at it (id order)
        self._grow_at: dict[int, _GrowthBucket] = {}
        #: a lower bound on ``_grow_at``'s keys: growth checked up to ``_low - 1`` (`_due_keys`)
        self._low = 0
        self._longest: list[tuple[int, int, Request]] = []
        #: members that joined since the last decode step (their previous token time differs)
        self.joined: list[Request] = []
        self.last_step_end = 0.0

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return iter(self.members.values())

    def __contains__(self, req: Request) -> bool:
        return req._dset is self

    # -- membership ---------------------------------------------------------------------------
    def add(self, req: Request, capacity: int) -> None:
        """Add a request whose only pending token is its last emitted one.

        ``capacity`` is the number of tokens its KV allocation covers now.
        """
        # outside the set its own fields hold progress: num_tokens == prompt + _num_output
        assert req._dset is None
        assert req._num_computed == req.num_prompt_tokens + req._num_output - 1
        dbase = req._num_computed - self.clock
        req._dbase = dbase
        req._dset = self
        self.members[req.id] = req
        self.sum_dbase += dbase
        heapq.heappush(self._longest, (-dbase, req.id, req))
        req._fin_clock = req.num_prompt_tokens + req.max_output_tokens - 1 - dbase
        heapq.heappush(self._fin, (req._fin_clock, req.id, req))
        self._file(req, capacity - dbase)  # set_capacity
        self.joined.append(req)
        if self.window is not None:
            heapq.heappush(self._sat_keys, (self.window - dbase, req.id, req))

    def remove(self, req: Request) -> None:
        """Take a member out, writing its progress back onto the request."""
        assert req._dset is self
        computed = self.clock + req._dbase
        req._num_computed = computed
        req._num_output = computed + 1 - req.num_prompt_tokens
        req._dset = None
        del self.members[req.id]
        self.sum_dbase -= req._dbase
        req._fin_clock = -1
        bucket = req._gbucket
        if bucket is not None:
            bucket.members.remove(req)
            req._gbucket = None
            if self.count_unit is not None:
                req.kv_blocks = (bucket.key + req._dbase) // self.count_unit
        if self.window is not None and req.id in self._sat:
            self._sat_dsum -= self._sat.pop(req.id)
        if len(self._longest) > 2 * len(self.members) + 64:
            # stale entries below the top are never popped: rebuild (amortized O(1) a removal)
            self._longest = [(-m._dbase, m.id, m) for m in self.members.values()]
            heapq.heapify(self._longest)
        if req in self.joined:  # rare: left before its first decode step
            self.joined.remove(req)
        else:
            req.last_token_s = self.last_step_end

    def set_capacity(self, req: Request, capacity: int) -> None:
        """Record that ``req``'s KV covers ``capacity`` tokens; it needs more at that position.
        ``req`` must be in no growth bucket (new, or handed out by the growth calls)."""
        self._file(req, capacity - req._dbase)

    def _file(self, req: Request, key: int) -> None:
        """Put ``req`` into the bucket at ``key``, keeping the bucket in id order (joiners and
        put-backs mostly carry the largest id, so it is usually an append)."""
        bucket = self._grow_at.get(key)
        if bucket is None:
            self._grow_at[key] = req._gbucket = _GrowthBucket(key, [req])
            if key < self._low:
                self._low = key
            return
        req._gbucket = bucket
        members = bucket.members
        if not members or members[-1].id < req.id:
            members.append(req)
        else:
            insort(members, req, key=_by_id)

    # -- features of the next step -------------------------------------------------------------
    def decode_ctx(self) -> int:
        """Sum over members of keys read by the next decode step (context incl. the new token)."""
        return len(self.members) * (self.clock + 1) + self.sum_dbase

    def decode_excess(self) -> int:
        """Sum over members of how far the next decode step's context exceeds ``window``
        (``sum(max(0, clock + 1 + _dbase - window))``): the keys sliding layers do not read.

        A member's context exceeds the window from clock ``window - _dbase`` on; members are
        moved into the exceeding set lazily, when the clock has passed their key."""
        self._saturate()
        return len(self._sat) * (self.clock + 1 - self.window) + self._sat_dsum

    def next_excess_clock(self) -> int | None:
        """The next clock value at which another member's context exceeds the window."""
        self._saturate()
        heap = self._sat_keys
        while heap:
            key, rid, req = heap[0]
            if req._dset is self and req._dbase == self.window - key and rid not in self._sat:
                return key
            heapq.heappop(heap)
        return None

    def _saturate(self) -> None:
        heap, clock, sat, w = self._sat_keys, self.clock, self._sat, self.window
        while heap and heap[0][0] <= clock:
            key, rid, req = heapq.heappop(heap)
            if req._dset is self and req._dbase == w - key and rid not in sat:
                sat[rid] = req._dbase
                self._sat_dsum += req._dbase

    def decode_max(self) -> int:
        """Longest context among members read by the next decode step (0 when empty)."""
        heap = self._longest
        while heap:
            key, _, req = heap[0]
            if req._dset is self and req._dbase == -key:
                return self.clock + 1 - key
            heapq.heappop(heap)
        return 0

    def _due_keys(self) -> list[int]:
        """The keys of the buckets due at the clock (``<= clock``), smallest first, and every
        key now above the clock (``_low = clock + 1``): the caller takes those buckets, and
        whatever it files again at or below the clock lowers ``_low`` (`_file`, `_refile`)."""
        clock, low = self.clock, self._low
        if low > clock:
            return []
        self._low = clock + 1
        if low == clock:
            return [clock] if clock in self._grow_at else []
        return sorted([k for k in self._grow_at if k <= clock])

    def _take_bucket(self, key: int) -> list[Request]:
        """Remove bucket ``key``; return its members (id order), each out of every bucket now
        (``_gbucket = None``)."""
        members = self._grow_at.pop(key).members
        self._leave(key, members)
        return members

    def _leave(self, key: int, members: list[Request]) -> None:
        """``members`` of the (taken) bucket at ``key`` are in no bucket now; in counting mode
        their block counts go back onto the requests."""
        unit = self.count_unit
        if unit is None:
            for req in members:
                req._gbucket = None
        else:
            for req in members:
                req._gbucket = None
                req.kv_blocks = (key + req._dbase) // unit

    def pop_due_growth(self) -> list[Request]:
        """Members whose next decode step writes past their KV capacity (must allocate first).

        Cost: when growth was checked at the clock before (``_low == clock``), one dict pop and
        no list built (the bucket's own member list is handed out; the bucket is gone)."""
        clock, low = self.clock, self._low
        if low != clock:  # nothing due (checked already), or keys below the clock
            due = []
            if low < clock:
                for key in self._due_keys():
                    due += self._take_bucket(key)
            return due
        self._low = clock + 1
        bucket = self._grow_at.pop(clock, None)
        if bucket is None:
            return []
        self._leave(clock, bucket.members)
        return bucket.members

    def grow_due_grouped(self, extend_group, unit: int) -> list[Request]:
        """Give every member due for KV growth one more unit at once, or hand them back.

        ``extend_group(reqs) -> bool`` extends each of ``reqs`` in order by exactly ``unit``
        tokens, or changes nothing and returns False (`PagedAllocator.extend_group`). On success
        each member's next growth is due ``unit`` clock values later, so every due bucket moves
        whole to ``key + unit`` (what `set_capacity` would record member by member), and ``[]``
        is returned. Otherwise nothing was extended and the due members are returned exactly as
        `pop_due_growth` returns them, for the caller's member-by-member path (which picks
        preemption victims).

        Why: KV growth is the most frequent event of a run (one per member per block, ~14 a
        request); on success this touches no member object (in counting mode not even the
        allocator does: the moved bucket is the members' new block count).
        Needs: a member's KV changes only through these growth calls (so its key is
        ``capacity - _dbase``).
        Cost: when growth was checked at the clock before (``_low == clock``) one dict pop and,
        on success, one dict store (the bucket moves to ``clock + unit``, above every key).
        """
        clock = self.clock
        if self._low != clock:  # nothing due (checked already), or keys below the clock
            return [] if self._low > clock else self._grow_due_buckets(extend_group, unit)
        self._low = clock + 1
        bucket = self._grow_at.pop(clock, None)
        if bucket is None or not bucket.members:
            return []
        members = bucket.members
        if extend_group(members):
            key = clock + unit
            grow_at = self._grow_at
            if key in grow_at:
                self._refile(bucket, key)
            else:  # `_refile` when no bucket is at ``key`` (the usual case), inline
                bucket.key = key
                grow_at[key] = bucket
            return []
        self._leave(clock, members)
        return members

    def _grow_due_buckets(self, extend_group, unit: int) -> list[Request]:
        """`grow_due_grouped` when keys below the clock may be due (after a put-back or a
        skipped check): every due bucket, smallest key first."""
        grow_at = self._grow_at
        buckets = [grow_at.pop(key) for key in self._due_keys()]
        due = [req for b in buckets for req in b.members]
        if not due:
            return []
        if extend_group(due):
            for b in buckets:
                if b.members:
                    self._refile(b, b.key + unit)
            return []
        for b in buckets:
            self._leave(b.key, b.members)
        return due

    def _refile(self, bucket: _GrowthBucket, key: int) -> None:
        """File the (taken) ``bucket``'s members as due at ``key``: the bucket itself moves
        there, or is merged (id order) with the bucket already there, the smaller side's members
        re-pointed."""
        grow_at = self._grow_at
        other = grow_at.get(key)
        bucket.key = key
        if other is None or not other.members:
            if key < self._low:
                self._low = key
            grow_at[key] = bucket
            return
        a, b = bucket.members, other.members
        if len(a) < len(b):
            bucket, other, a, b = other, bucket, b, a
        for req in b:
            req._gbucket = bucket
        last = a[-1].id
        a += b
        if last > b[0].id:  # the two id runs interleave
            a.sort(key=_by_id)
        grow_at[key] = bucket

    def grow_due(self, extend, due: list[Request] | None = None) -> bool:
        """Extend every member due for KV growth by one unit with ``extend(req) -> capacity``
        (``due``: members already taken by `pop_due_growth` or `grow_due_grouped`).

        The hot path of precomputed decode runs, whose KV bound guarantees success; returns False
        at the first ``extend`` that fails (-1), leaving it and the rest due.
        """
        if due is None:
            due = self.pop_due_growth()
        set_capacity = self.set_capacity
        for i, req in enumerate(due):
            cap = extend(req)
            if cap < 0:
                for left in due[i:]:
                    self._put_back(left)
                return False
            set_capacity(req, cap)
        return True

    def _put_back(self, req: Request) -> None:
        """Undo `_take_bucket` for ``req`` (its growth is still due at the current clock; in
        counting mode at the key its block count gives, so that the bucket still holds it)."""
        unit = self.count_unit
        self._file(req, self.clock if unit is None else req.kv_blocks * unit - req._dbase)

    def next_finish_clock(self) -> int | None:
        """Clock value after the decode step on which the next member emits its last token."""
        heap = self._fin
        while heap:
            key, _, req = heap[0]
            if req._dset is self and req._fin_clock == key:
                return key
            heapq.heappop(heap)
        return None

    def finish_heap(self) -> list[tuple[int, int, Request]]:
        """The finish heap itself, for a caller that peeks its top once a decode step
        (`Replica._commit_decodes`): ``heap[0][0] <= clock`` means a member *may* finish by
        ``clock`` (stale entries included), so the caller must then take the exact path
        (`advance`); above it nobody does. Read only."""
        return self._fin

    def longest_heap(self) -> list[tuple[int, int, Request]]:
        """The longest-context heap itself (stale entries included), to be copied for
        `longest_left`. Read only."""
        return self._longest

    def longest_member(self) -> Request | None:
        """The member whose context `decode_max` measures (None when the set is empty)."""
        return self._longest[0][2] if self.decode_max() else None

    def pop_finish(self, heap: list, last: Request | None) -> tuple[int, Request | None]:
        """Pop ``heap`` (a copy of `finish_heap`, which stays unchanged) to its next live finish:
        ``(key, member)``, in the order `advance` hands finishes out (finish clock, then id),
        or ``(-1, None)`` when none is left. Stale entries are skipped, and so is a twin of
        ``last`` (the member returned before: a twin has the same key and id, so comes right
        after it). For planning a decode run past finishes (`Replica._plan_past_finishes`);
        valid only while the set is not changed.

        Why a copy popped in C, not a walk of the heap itself: the walk was a generator left
        unfinished at each run's end, and closing one costs an exception and a traceback."""
        pop = heapq.heappop
        while heap:
            key, _, req = pop(heap)
            if req._dset is self and req._fin_clock == key and req is not last:
                return key, req
        return -1, None

    def longest_left(self, heap: list, clock: int) -> Request:
        """The member with the longest context (largest ``_dbase``) among those whose finish
        clock is after ``clock``, from ``heap`` (a copy of `longest_heap`, which stays unchanged):
        entries popped are stale or of members finished by ``clock``, so a later call with a
        larger ``clock`` goes on from there. Needs such a member; valid only while the set is
        not changed."""
        while True:
            key, _, req = heap[0]
            if req._dset is self and req._dbase == -key and req._fin_clock > clock:
                return req
            heapq.heappop(heap)

    def next_growth_clock(self) -> int | None:
        """The smallest key of a bucket with members (None: none). A scan: not on a hot path."""
        return min((k for k, b in self._grow_at.items() if b.members), default=None)

    # -- advancing -----------------------------------------------------------------------------
    def advance(self) -> list[Request]:
        """One decode step: every member computes its pending token and emits one more.

        Returns the members that emitted their last token (still members; caller removes them).
        """
        self.clock = clock = self.clock + 1
        heap = self._fin
        if not heap or heap[0][0] > clock:
            return []
        done = []
        while heap and heap[0][0] <= clock:
            key, _, req = heapq.heappop(heap)
            if req._dset is self and req._fin_clock == key:
                req._fin_clock = -1  # a stale twin entry with the same key must not match
                done.append(req)
        return done
