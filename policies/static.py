"""Static batching: wait for a full batch, run it to the end, then form the next.

The pre-Orca way to serve (e.g. a plain ``generate()`` loop): the engine takes ``batch_size``
waiting requests (FCFS), prefills them together in one step, and decodes the batch until its last
member finishes; nothing joins a batch in flight. Short requests therefore wait for the longest
one, and every arrival waits for a full batch: at moderate load TTFT far above continuous
batching's. When the workload is finite and every request has arrived
(``replica.arrivals_done``) the partial batch left over is flushed.

Simplifications (documented, on purpose): a finished member leaves the batch and is not charged
as padding; the batch's prompts are one prefill step with no token budget; KV grows with
decoding, and if it runs out the newest member is preempted (recompute) and joins the next batch.

YAML (``scheduler:``): ``policy: static``, ``batch_size`` (8).

Invariant: ``running`` is non-empty exactly while a batch is in flight; no request is admitted
while it is.
"""

from __future__ import annotations

from policies.base import Policy
from policies.common import grow_decodes, prefix_hit, start_from_cache, too_long
from simulator.cfg import Section
from simulator.plan import DECODE, IDLE, StepPlan


class StaticBatching(Policy):
    name = "static"

    def __init__(self, sec: Section, engine: dict):
        super().__init__(sec, engine)
        self.batch_size = sec.int("batch_size", 8, min=1)

    def params(self) -> dict:
        return {"batch_size": self.batch_size}

    def ready(self, replica, now: float) -> tuple[bool, float | None]:
        """Whether to start a batch now; if not, when to ask again (None: on the next event)."""
        return len(replica.waiting) >= self.batch_size or replica.arrivals_done, None

    def schedule(self, replica, now: float) -> StepPlan:
        if replica.running:  # a batch in flight runs to its end
            if replica.decoding and grow_decodes(replica):
                return DECODE
            if replica.running:
                raise AssertionError("static batch: running requests outside the decode set")
        while replica.waiting:
            go, wake_at = self.ready(replica, now)
            if not go:
                return StepPlan(wake_at=wake_at)
            before = len(replica.waiting)
            chunks = self._start_batch(replica, now)
            if chunks:
                return StepPlan(chunks=tuple(chunks))
            if len(replica.waiting) == before:  # KV held elsewhere: wait for it to free
                return IDLE
        return IDLE

    def _start_batch(self, replica, now: float) -> list:
        waiting, kv = replica.waiting, replica.kv
        max_len = self.engine["max_model_len"]
        chunks = []
        while waiting and len(chunks) < self.batch_size:
            req = waiting[0]
            if req.num_preemptions == 0 and req.first_scheduled_s is None:
                reason = too_long(replica, req, max_len)
                if reason:
                    waiting.popleft()
                    replica.reject(req, reason, now)
                    continue
            hit = prefix_hit(replica, req)
            if not kv.allocate(req, req.num_tokens):
                break
            waiting.popleft()
            start_from_cache(req, hit)
            replica.admit(req, now)
            chunks.append((req, req.num_pending))
        return chunks
