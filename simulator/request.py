"""The request record.

One mutable `Request` per arrival. Progress follows vLLM v1's idea: a request has ``num_tokens``
known tokens (prompt + emitted output) of which ``num_computed`` are in the KV cache;
``num_pending = num_tokens - num_computed`` is what the next steps must compute. That single number
covers a fresh prompt, a prompt chunk, a decode (pending == 1) and a recompute after preemption.

A step that brings ``num_computed`` up to ``num_tokens`` samples one new token (emits it), so a
decoding request always has exactly one pending token, and the last emitted token's KV is never
computed (as in real engines).

While a request is in its replica's `DecodeSet` its progress lives on the set's shared clock
(see `simulator.decode`); the properties below read through to it, so policies never see stale
numbers.
"""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    WAITING = 0  # in a replica's waiting queue (new, or preempted and waiting to recompute)
    RUNNING = 1  # admitted: holds KV and is scheduled step by step
    TRANSFERRING = 2  # P/D disaggregation: KV being copied between pools
    FINISHED = 3
    REJECTED = 4


# The members the hot paths set or test (a request's arrival, admission, hand-off and finish,
# the request log's sweep, policies' passes over ``running``), as module names: the same
# objects, but ``Status.RUNNING`` is slow in CPython 3.11: `EnumType` defines ``__getattr__``,
# so every attribute lookup on the class goes through ``slot_tp_getattr_hook`` (a wrapper
# object and an argument tuple a lookup, ~50 ns), while a module global is ~2 ns.
WAITING, RUNNING, TRANSFERRING, FINISHED = (
    Status.WAITING,
    Status.RUNNING,
    Status.TRANSFERRING,
    Status.FINISHED,
)


class Request:
    __slots__ = (
        "id",
        "arrival_s",
        "queued_s",
        "num_prompt_tokens",
        "max_output_tokens",
        "hash_ids",
        "status",
        "replica",
        "block_table",
        "kv_blocks",
        "first_scheduled_s",
        "first_token_s",
        "last_token_s",
        "finish_s",
        "num_preemptions",
        "reject_reason",
        "num_cached_tokens",
        "_num_computed",
        "_num_output",
        "_dset",
        "_dbase",
        "_fin_clock",
        "_gbucket",
        "extra",
    )

    def __init__(
        self,
        id: int,
        arrival_s: float,
        num_prompt_tokens: int,
        max_output_tokens: int,
        hash_ids: tuple[int, ...] | None = None,
    ):
        if num_prompt_tokens < 1 or max_output_tokens < 1:
            raise ValueError(f"request {id}: prompt and output lengths must be >= 1")
        self.id = id
        self.arrival_s = arrival_s
        #: when it entered its replica's ``waiting`` (after a serving frontend's input path;
        #: `Replica.add_request`): what an engine's scheduler can see, not the client's arrival
        self.queued_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        #: output length the request will produce (from the trace); engines do not know it
        #: in advance, so policies must not use it except where a config says so explicitly.
        self.max_output_tokens = max_output_tokens
        self.hash_ids = hash_ids
        self.status = WAITING
        self.replica = None
        #: ids of the KV blocks it holds, under the allocators that keep ids (prefix caching,
        #: sliding windows, `PagedTableAllocator`); empty under the counting `PagedAllocator`
        self.block_table: list[int] = []
        #: how many KV blocks it holds under the counting `PagedAllocator` (0 under the others);
        #: while it sits in a decode set's growth bucket the bucket holds the count instead
        #: (`PagedAllocator.held`), written back here when it leaves the bucket
        self.kv_blocks = 0
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.reject_reason: str | None = None
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self._num_computed = 0
        self._num_output = 0
        self._dset = None
        self._dbase = 0
        self._fin_clock = -1
        self._gbucket = None  # the DecodeSet growth bucket it is filed in, if any
        self.extra = None  # free slot for policies (e.g. static batching's batch id)

    # -- progress (reads through to the decode set's clock while the request is in it) --------
    @property
    def num_computed(self) -> int:
        d = self._dset
        return self._num_computed if d is None else d.clock + self._dbase

    @property
    def num_output(self) -> int:
        d = self._dset
        if d is None:
            return self._num_output
        return d.clock + self._dbase + 1 - self.num_prompt_tokens

    @property
    def _grow_clock(self) -> int:
        """Decode-set clock value at which this member next needs a KV block (-1: none filed)."""
        b = self._gbucket
        return -1 if b is None else b.key

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def holds_kv(self) -> bool:
        """Whether it holds KV blocks, under any allocator (ids or a count)."""
        return bool(self.block_table) or self.kv_blocks > 0

    @property
    def in_decode_set(self) -> bool:
        return self._dset is not None

    @property
    def is_prefill(self) -> bool:
        """True until the first token is emitted, and again while recomputing after preemption."""
        return self.num_pending > 1 or self._num_output == 0

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output}/{self.max_output_tokens}, computed={self.num_computed})"
        )
