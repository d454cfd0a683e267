"""One serving engine (a TP group of GPUs): queues, KV cache, policy, and its SimPy process.

The loop (DESIGN.md):

    plan = policy.schedule(replica, now)     # decide; never advances progress
    dt   = executor.execute(plan, ...)       # simulated: latency model; real: GPU
    yield env.timeout(dt)                    # the only place time passes
    commit(plan)                             # advance tokens, stamp times, free KV

Decode runs. When a policy returns a decode-only plan and step times can be precomputed, the
replica computes the run of identical decode steps that would follow (until the next arrival, the
next finish, a KV-growth risk, or the policy's wake time), waits once for the whole run, and
commits the sub-steps afterwards. Each sub-step is still recorded as one step with its own time.
Anyone outside the process who reads or changes this replica (a router, a KV transfer) calls
`sync()` first, which commits every sub-step that has ended, and `add_request()` cuts the run
after the sub-step in progress. An arrival, which only lengthens ``waiting``, leaves the ended
sub-steps to the run's next commit, which counts it only in the rows of those that end after it
(`_defer_commit`). Results are therefore identical with ``coalesce=False`` (tests check this);
only the wall-clock cost differs.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable
from functools import partial

import simpy

from simulator.cluster import ArrivalTie, delays_to
from simulator.decode import DecodeSet
from simulator.executor import StepExecutor
from simulator.latency.base import decode_run_times
from simulator.plan import StepPlan
from simulator.request import FINISHED, RUNNING, TRANSFERRING, WAITING, Request, Status
from simulator.steplog import CHUNK, GAP_CHUNK, StepLog, TokenGaps

_MAX_RUN = 512  # longest precomputed decode run (bounds wasted work when a run is cut)
#: simulated seconds a replica that takes its own arrivals may run ahead of SimPy's clock
#: (`take_arrivals`): long enough that a cluster's replicas run in stretches of thousands of
#: steps (1 s stretches lost most of the gain at 64 replicas: benchmarks/RESULTS.md), short
#: enough that the clock a progress report reads keeps moving
AHEAD_S = 30.0


class Replica:
    #: Why slots: CPython 3.11 keeps an instance's attributes in a key table shared by the class
    #: only up to 30 of them; past that, every ``self.x`` on the hot paths takes the generic
    #: lookup (a 31st attribute cost P/D runs ~5% more instructions). Slots are read by index.
    __slots__ = (
        "env", "index", "policy", "kv", "_extend_group", "executor", "coalesce",
        "_decode_run_times", "next_external_s", "_defer_ok", "_past_finish", "on_finish",
        "on_prefilled", "waiting", "running", "_reads", "decoding", "arrivals_done",
        "num_preemptions", "num_finished", "num_rejected", "busy_s", "steps", "itl", "_wake",
        "_run", "_run_next", "_arrived_s", "_own", "_ahead_limit", "_proc",
    )  # fmt: skip

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        policy,
        kv,
        executor: StepExecutor,
        *,
        coalesce: bool = True,
        next_external_s: Callable[[], float] | None = None,
        on_finish: Callable[[Request], None] | None = None,
        on_prefilled: Callable[[Request], None] | None = None,
        step_chunk: int = CHUNK,
    ):
        """``step_chunk``: rows of the step log packed at a time (`steplog.chunk_rows` of the
        run's replica count); the outputs do not depend on it."""
        self.env = env
        self.index = index
        self.policy = policy
        self.kv = kv
        #: the allocator's all-at-once decode growth, if it has one (DecodeSet.grow_due_grouped)
        self._extend_group = getattr(kv, "extend_group", None)
        self.executor = executor
        self.coalesce = coalesce and executor.can_precompute and policy.coalescable
        #: a decode run's step times (`simulator.latency.base.decode_run_times`), computed once
        #: per run: the executor's, or one ``step_time`` call a step (only when coalescing)
        self._decode_run_times = None
        if self.coalesce:
            self._decode_run_times = getattr(executor, "decode_run_times", None) or partial(
                decode_run_times, executor.step_time
            )
        self.next_external_s = next_external_s or (lambda: math.inf)
        #: commits may lag the sub-steps they record: coalesced runs, and no callback that
        #: would see a finish late (P/D's `on_finish` / `on_prefilled`)
        self._defer_ok = self.coalesce and on_finish is None and on_prefilled is None
        #: decode runs may go on past a member's finish (`_plan_past_finishes`): the policy
        #: says its plan after a finish is the decode of the rest when nothing else is queued
        #: or running (and no sliding-window reads, which `_plan_read_run` plans step by step)
        self._past_finish = (
            self._defer_ok and policy.decodes_past_finish and getattr(kv, "reads", None) is None
        )
        self.on_finish = on_finish
        #: P/D disaggregation: called (instead of joining the decode set) when a request emits its
        #: first token and has more to produce; the request has left ``running`` but still holds
        #: its KV (status TRANSFERRING). See simulator.disagg.
        self.on_prefilled = on_prefilled
        self.waiting: deque[Request] = deque()
        #: admitted requests in admission order (dict: O(1) removal, ordered iteration)
        self.running: dict[int, Request] = {}
        #: keys-read features for models with sliding layers (None: plain context sums)
        self._reads = getattr(kv, "reads", None)
        #: a counting allocator's decode-set members keep their block counts in growth buckets
        counts = kv.block_size if getattr(kv, "counts_in_buckets", False) else None
        self.decoding = DecodeSet(None if self._reads is None else self._reads.window, counts)
        self.arrivals_done = False
        self.num_preemptions = 0
        self.num_finished = 0
        #: requests refused for good (`reject`, or P/D's decode pool at hand-off)
        self.num_rejected = 0
        self.busy_s = 0.0
        # one row per step: start, duration, prefill_tokens, prefill_attn, prefill_seqs,
        # decode_seqs, decode_ctx, kv_blocks_used, num_waiting, num_running, kv_tokens
        # (kv_tokens: tokens in the cache at the step's end, counting the decode set and the
        # step's chunks; reserved-but-unused KV = kv_blocks_used * block_size - kv_tokens)
        self.steps = StepLog(step_chunk)
        # inter-token gaps: gap seconds and how many tokens saw that gap (one pair per decode
        # step and per joiner, millions in a long run: packed into arrays, `itl_gaps`)
        self.itl = TokenGaps()
        self._wake: simpy.Event | None = None
        self._run: list[tuple[float, float, int]] | None = None  # (start, duration, decode_ctx)
        self._run_next = 0
        #: time of the last arrival whose commit waits for the run's next one (`add_request`,
        #: when ``_defer_ok``; -inf: none): the rows of the run's sub-steps that ended by then
        #: count one request fewer waiting
        self._arrived_s = -math.inf
        #: the arrivals this replica takes itself (`take_arrivals`; None: they are handed over)
        self._own = None
        #: no wait landing before it is made (`take_arrivals`: running ahead); -inf: none
        self._ahead_limit = -math.inf
        self._proc = env.process(self._loop())

    # -- what policies call ---------------------------------------------------------------------
    def admit(self, req: Request, now: float) -> None:
        """Move a request the policy took from ``waiting`` into ``running``."""
        req.status = RUNNING
        self.running[req.id] = req
        if req.first_scheduled_s is None:
            req.first_scheduled_s = now

    def preempt(self, req: Request, swap: bool = False) -> None:
        """Preempt: drop its KV (GPU blocks), put it at the front of ``waiting``.

        Recompute (default) forgets its progress; ``swap=True`` keeps ``num_computed`` (the
        policy has copied the KV to host memory and charges the copy time; it must allocate and
        copy back before scheduling the request again).
        """
        if req._dset is not None:
            self.decoding.remove(req)
        self.kv.free(req)
        del self.running[req.id]
        if not swap:
            req._num_computed = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def reject(self, req: Request, reason: str, now: float) -> None:
        """Refuse a request for good (e.g. longer than the engine can ever hold)."""
        if req.id in self.running:
            if req._dset is not None:
                self.decoding.remove(req)
            self.kv.free(req)
            del self.running[req.id]
        req.status = Status.REJECTED
        req.reject_reason = reason
        req.finish_s = now
        self.num_rejected += 1

    # -- what the outside world calls -----------------------------------------------------------
    def add_request(self, req: Request) -> None:
        # `touch()`: a planned decode run means a busy loop (nothing to wake); else wake the
        # loop if idle: it runs after this call, so it sees ``req``
        if self._run is not None:
            if self._defer_ok:
                self._defer_commit()
            else:
                self.sync()
            self._cut_run()
        else:
            self.poke()
        req.status = WAITING
        req.replica = self.index
        req.queued_s = self.env.now
        self.waiting.append(req)

    def touch(self) -> None:
        """Call before changing this replica's state from outside its process (allocating or
        freeing its KV, adding work): commits ended sub-steps, cuts the precomputed decode run
        after the sub-step in progress, and wakes the loop if idle."""
        self.sync()
        self._cut_run()
        self.poke()

    def poke(self) -> None:
        """Wake the loop if it is idle (new work, or no more arrivals)."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def sync(self) -> None:
        """Commit every precomputed decode sub-step that has ended by now."""
        i = self._ended()
        if i > self._run_next:
            self._commit_decodes(i)

    def _ended(self) -> int:
        """Index of the run's first sub-step not ended by now (the one in progress)."""
        return self._ended_by(self.env.now)

    def _ended_by(self, now: float) -> int:
        """Index of the run's first sub-step not ended by ``now``."""
        run = self._run
        if run is None:
            return self._run_next
        i, n = self._run_next, len(run)
        while i < n and run[i][0] + run[i][1] <= now:
            i += 1
        return i

    # -- arrivals taken by the replica itself (round robin: `Cluster.start` with hand_over) --
    def take_arrivals(self, own, until: float | None = None) -> None:
        """From now on this replica takes its arrivals itself, from ``own`` (`OwnArrivals`):
        each when its process next runs, as `add_request` at the arrival's own clock would
        have (`_arrive`), so no SimPy event is needed per request.

        Why exact: under round robin nothing but its arrivals reaches a replica from outside
        (`Cluster.can_hand_over`), and an arrival changes nothing but ``waiting`` (and a decode
        run's deferred commit, `_defer_commit`); so taking it at the replica's next event,
        before anything reads ``waiting``, gives the same state, with ``queued_s`` and the
        step rows' queue sizes as of its own time. What taking late cannot reproduce is the
        order SimPy gives two events at the same clock (by when each was created): wherever a
        replica's own event (a step's end, a policy's wake time, the last arrival's
        `Cluster._finale`) falls at exactly one of its arrivals' clocks, or an arrival falls
        before a decode run's last step (`add_request` would cut the run), `ArrivalTie` is
        raised and the run starts over with one event per arrival (`runner.simulate`).

        Running ahead: the same reasoning lets the replica skip SimPy's clock. Since nothing
        outside reads or changes it before the last arrival's `Cluster._finale` (or the run's
        ``until``), a wait that would land before that is not made: the loop keeps its own
        clock (the float SimPy's timeout would have landed on), takes the arrivals before it
        and goes on; SimPy's clock is brought to it (`delays_to`, exactly) before a wait that
        lands at or after that time, and before an idle wait on a wake-up. So the state the
        finale (or the run's end) finds, and every output, are the same; what changes is that
        a replica's stretch of steps runs without a SimPy event each, and the replicas of a
        cluster run one stretch after another instead of a step at a time (their data stay
        in cache). A stretch ends at most `AHEAD_S` of simulated time after the last real
        wait, so a progress report still sees the clock move. Not where the executor reads
        SimPy's clock as the step's start (`SimulatedExecutor.reads_env_clock`: the clock
        dip)."""
        self._own = own
        self.next_external_s = own.horizon
        if not getattr(self.executor, "reads_env_clock", True):
            self._ahead_limit = min(own.last_s, math.inf if until is None else until)
            self.steps.pack_alone()  # its rows come in stretches, not interleaved

    def _ahead_bound(self, now: float) -> float:
        """The clock before which waits are skipped, after a real wait that ended at ``now``
        (-inf: none is; see `take_arrivals`)."""
        limit = self._ahead_limit
        return limit if limit <= now + AHEAD_S else now + AHEAD_S

    def _take_arrivals(self, now: float) -> None:
        """After a wait that ended at ``now``: take the arrivals before it; one at ``now`` ties."""
        own = self._own
        if own.next_s < now:
            self._take_before(now)
        if own.next_s == now:
            raise ArrivalTie(f"replica {self.index}: an event and an arrival at {now!r}")

    def _take_before(self, t: float) -> None:
        """Take every arrival whose clock is before ``t`` (the finale's mark, ``done`` with
        ``next_s`` at its clock, is dropped once passed)."""
        own = self._own
        while own.next_s < t:
            if own.done:
                own.next_s = math.inf
                return
            e = own.next_s
            self._arrive(own.pop(), e)

    def take_all_arrivals(self) -> None:
        """`Cluster._finale`, at the last arrival's clock: take every arrival left, then leave
        ``next_s`` at this clock, so that a wait of this replica that ends here ties."""
        now, own = self.env.now, self._own
        self._take_before(now)
        while not own.done:
            self._arrive(own.pop(), now)
        own.next_s = now

    def take_arrivals_before(self, until: float) -> None:
        """After a run stopped at ``until``: the arrivals before it not taken yet."""
        if self._own is not None:
            self._take_before(until)

    def _arrive(self, req: Request, e: float) -> None:
        """`add_request` of ``req`` as at clock ``e`` (before now): a decode run in progress
        then defers its commit (a second arrival commits the first one's share first: the
        sub-steps ended by ``e``); the run was planned to end with the step that reaches the
        next arrival, so ``e`` falls in its last step (else `ArrivalTie`: it would cut it)."""
        run = self._run
        if run is not None:
            if run[-1][0] > e:
                raise ArrivalTie(f"replica {self.index}: an arrival at {e!r} cuts a decode run")
            if self._arrived_s != -math.inf:
                i = self._ended_by(e)
                if i > self._run_next:
                    self._commit_decodes(i)
            self._arrived_s = e
        req.status = WAITING
        req.replica = self.index
        req.queued_s = e
        self.waiting.append(req)

    def _defer_commit(self) -> None:
        """`sync` for an arrival (about to join ``waiting``), done later: the sub-steps ended by
        now are committed with the run's next commit, their rows counting one request fewer
        waiting (those that end by `_arrived_s`), as if committed now.

        Why: at one replica nearly every run ends with the sub-step an arrival lands in, so the
        arrival's commit and the run end's were two `_commit_decodes` calls a run (0.86 a
        request; 1.55 at 64 replicas), each with its setup. Exact because between the arrival
        and that commit nothing but ``waiting``'s length is read or changed by anyone: every
        other observer calls `sync` first (which commits with the same rule), and no callback
        observes a finish (``_defer_ok``). A second arrival before that commit commits the
        first one's share first. The arrival does not even read the run (at 64 replicas it is
        cold): the commit finds those sub-steps by their ends, `_cut_run` by the last start."""
        if self._arrived_s != -math.inf:
            self.sync()
        self._arrived_s = self.env.now

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def itl_gaps(self) -> array:
        """Every inter-token gap so far (seconds, raw doubles), in the order recorded."""
        return self.itl.gap_array()

    @property
    def itl_counts(self) -> array:
        """How many tokens saw each gap of `itl_gaps` (int64)."""
        return self.itl.count_array()

    # -- the loop ---------------------------------------------------------------------------------
    def _loop(self):
        env = self.env
        timeout = env.timeout  # SimPy builds a bound method at every `env.timeout` lookup
        pending_steps, chunk = self.steps.rows, self.steps.chunk
        itl, pending_gaps = self.itl, self.itl.gaps
        schedule = self.policy.schedule
        own = self._own  # (an arrival at the start: the first `schedule` sees none either way)
        # this replica's clock: SimPy's, or ahead of it where a wait that lands before
        # ``ahead`` is skipped (see `take_arrivals`; -inf: never)
        now, ahead = env.now, self._ahead_bound(env.now)
        while True:
            if len(pending_steps) >= chunk:
                self.steps.pack()
            if len(pending_gaps) >= GAP_CHUNK:
                itl.pack()
            start = now  # `schedule` plans; it never lets time pass
            plan: StepPlan = schedule(self, start)
            if not plan.chunks and not plan.decode:  # plan.is_idle, without the call
                if plan.wake_at is None and own is not None and own.next_s < ahead:
                    now = own.next_s  # `_idle_own`'s wait for the next arrival, skipped
                    self._take_arrivals_at(now)
                    continue
                if env.now != now:  # SimPy's clock to this replica's first
                    yield from self._wait_until(now)
                yield from self._idle(plan)
                now, ahead = env.now, self._ahead_bound(env.now)
                continue
            if plan.chunks or not self.coalesce or not plan.decode or plan.extra_s:
                feats = self._features(plan)
                dt = self.executor.execute(plan, self, feats)
                now = start + dt  # where SimPy's timeout(dt) from ``start`` lands
                if now >= ahead:
                    if env.now == start:
                        yield timeout(dt)
                    else:
                        yield from self._wait_until(now)
                    if own is not None:
                        ahead = self._ahead_bound(now)
                if own is not None:
                    self._take_arrivals(now)
                self._commit(plan, start, dt, feats)
                continue
            self._plan_decode_run(start, plan.wake_at)
            run = self._run
            now = start + (run[-1][0] + run[-1][1] - start)  # as below, when not cut
            if now >= ahead:
                if env.now != start:  # ahead: nobody cuts the run (`take_arrivals`)
                    yield from self._wait_until(now)
                else:
                    t = start
                    while True:
                        try:
                            run = self._run
                            yield timeout(run[-1][0] + run[-1][1] - t)
                            break
                        except simpy.Interrupt:
                            t = env.now
                            continue  # the run was cut; wait for its new end
                    now = env.now
                if own is not None:
                    ahead = self._ahead_bound(now)
            if own is not None:
                self._take_arrivals(now)
            self._commit_decodes(len(self._run))  # the rest has ended (up to float rounding)
            self._run = None

    def _idle(self, plan: StepPlan):
        env = self.env
        if plan.wake_at is not None and plan.wake_at <= env.now:
            raise RuntimeError(
                f"policy {self.policy.name} returned an idle plan with wake_at in the past"
            )
        own = self._own
        if own is not None:
            if not own.done:
                yield from self._idle_own(plan.wake_at)
                return
            w = plan.wake_at
            if w is not None and env.now + (w - env.now) == own.last_s:  # where it lands
                raise ArrivalTie(f"replica {self.index}: a wake time at the last arrival")
        self._wake = env.event()
        if plan.wake_at is not None:
            yield self._wake | env.timeout(plan.wake_at - env.now)
        else:
            yield self._wake
        self._wake = None

    def _idle_own(self, wake_at: float | None):
        """`_idle` while arrivals are taken here: wait until the next one (its clock exactly:
        `add_request`'s wake would run then) or the policy's wake time if earlier; at the
        same clock they tie."""
        env, own = self.env, self._own
        e = own.next_s
        if wake_at is not None:
            woken = env.now + (wake_at - env.now)  # where SimPy's timeout lands
            if woken == e:
                raise ArrivalTie(f"replica {self.index}: a wake time at an arrival, {e!r}")
            if woken < e:
                yield env.timeout(wake_at - env.now)
                self._take_arrivals(env.now)
                return
            # `_idle`'s timer, left pending when the arrival wakes it first: it changes nothing
            # when it fires, but it may be the run's last event (the clock at the end)
            env.timeout(wake_at - env.now)
        yield from self._wait_until(e)
        self._take_arrivals_at(env.now)  # == e; SimPy's own clock object

    def _wait_until(self, t: float):
        """Wait until SimPy's clock reads ``t`` exactly (`delays_to`: one timeout, or two where
        ``now + (t - now)`` would miss it)."""
        env = self.env
        for delay in delays_to(env.now, t):
            yield env.timeout(delay)

    def _take_arrivals_at(self, now: float) -> None:
        """The arrivals at clock ``now``, which woke the idle loop (`_finale` may have taken
        them and left its mark)."""
        own = self._own
        while own.next_s <= now:
            if own.done:
                own.next_s = math.inf
                return
            self._arrive(own.pop(), now)

    # -- features and commit ----------------------------------------------------------------------
    def _features(self, plan: StepPlan) -> tuple:
        if self._reads is not None:
            return self._features_read(plan)
        pt = ps = ds = dctx = dmax = 0
        pa = 0.0
        v = plan.verify
        for req, n in plan.chunks:
            c = req._num_computed
            if v and c > 0 and req.num_tokens - c == 1:  # speculative verify of 1 + v tokens
                pt += 1 + v
                pa += (1 + v) * (c + (v + 2) / 2)
                ps += 1
            elif n == 1 and c > 0:  # a single-token step over a cache is a decode
                ds += 1
                dctx += c + 1
                if c + 1 > dmax:
                    dmax = c + 1
            else:
                pt += n
                pa += n * (c + (n + 1) / 2)
                ps += 1
        d = self.decoding
        if plan.decode and d.members:
            ds += len(d.members)
            dctx += d.decode_ctx()
            m = d.decode_max()
            if m > dmax:
                dmax = m
        return (pt, pa, ps, ds, dctx, dmax)

    def _features_read(self, plan: StepPlan) -> tuple:
        """`_features` for a model with sliding layers: ``prefill_attn`` and ``decode_ctx``
        count the (query, key) pairs actually read, per layer averaged over the layers
        (`WindowedReads`); ``decode_max`` stays the longest context."""
        reads = self._reads
        pt = ps = ds = dmax = 0
        pa = dctx = 0.0
        v = plan.verify
        for req, n in plan.chunks:
            c = req._num_computed
            if v and c > 0 and req.num_tokens - c == 1:
                pt += 1 + v
                pa += reads.prefill_pairs(c, 1 + v)
                ps += 1
            elif n == 1 and c > 0:
                ds += 1
                dctx += reads.one(c + 1)
                dmax = max(dmax, c + 1)
            else:
                pt += n
                pa += reads.prefill_pairs(c, n)
                ps += 1
        d = self.decoding
        if plan.decode and len(d):
            ds += len(d)
            dctx += reads.decode(d.decode_ctx(), d.decode_excess())
            dmax = max(dmax, d.decode_max())
        return (pt, pa, ps, ds, dctx, dmax)

    def _commit(self, plan: StepPlan, start: float, dt: float, feats: tuple) -> None:
        end = start + dt
        self.busy_s += dt
        d = self.decoding
        nd = len(d.members)
        kv_tokens = d.decode_ctx() - (0 if plan.decode else nd) if nd else 0
        for req, n in plan.chunks:
            kv_tokens += req._num_computed + n
        self.steps.append(
            (start, dt, feats[0], feats[1], feats[2], feats[3], feats[4],
             self.kv.num_used_blocks, len(self.waiting), len(self.running), kv_tokens)
        )  # fmt: skip
        if plan.decode and nd:
            self._advance_decode(end)
        for req, n in plan.chunks:  # chunks are outside the decode set: own fields hold progress
            req._num_computed += n
            over = req._num_computed - req.num_prompt_tokens - req._num_output
            if over >= 0:
                self._emit(req, end, over + 1)

    def _commit_decodes(self, stop: int) -> None:
        """Commit precomputed decode sub-steps ``_run_next .. stop - 1`` of the run, each as one
        step row; after each but the run's last, allocate the KV growth of the next one (the
        run's KV bound guarantees it fits). Sub-steps that ended by a deferred arrival's time
        (`_defer_commit`; ``stop`` is past them all) count one request fewer waiting.

        A sub-step on which nobody finishes (all but the last of a run, as a rule) is
        committed inline: ``clock += 1`` and the ITL gaps, what `_advance_decode` does for it;
        the others go through `_advance_decode`. Why: this loop
        runs once per simulated decode step (~2.2 a request), and the calls it saves were a
        fifth of its cost."""
        d, kv, run, last = self.decoding, self.kv, self._run, len(self._run) - 1
        log, waiting, running, members = self.steps.append, self.waiting, self.running, d.members
        grow_due, extend, advance = d.grow_due, kv.extend, self._advance_decode
        group, grouped, unit = self._extend_group, d.grow_due_grouped, kv.block_size
        fin, joined = d.finish_heap(), d.joined
        gaps, counts = self.itl.gap, self.itl.count
        # queue and batch sizes change only where `_advance_decode` runs (a finish)
        n, nw, nr = len(members), len(waiting), len(running)
        busy = self.busy_s
        arrived, self._arrived_s = self._arrived_s, -math.inf  # a deferred arrival's time
        for i in range(self._run_next, stop):
            start, dt, ctx, kv_tokens = run[i]
            busy += dt
            end = start + dt
            log((start, dt, 0, 0.0, 0, n, ctx, kv.num_used_blocks,
                 nw if end > arrived else nw - 1, nr, kv_tokens))  # fmt: skip
            clock = d.clock + 1
            if not n or (fin and fin[0][0] <= clock):
                advance(end)
                n, nw, nr = len(members), len(waiting), len(running)
            else:  # `_advance_decode` when nobody finishes
                d.clock = clock
                if joined:
                    cont = n - len(joined)
                    if cont:
                        gaps(end - d.last_step_end)
                        counts(cont)
                    for req in joined:
                        gaps(end - req.last_token_s)
                        counts(1)
                    joined.clear()
                else:
                    gaps(end - d.last_step_end)
                    counts(n)
                d.last_step_end = end
            if i < last:
                due = grouped(group, unit) if group is not None else None
                if (due is None or due) and not grow_due(extend, due):
                    raise AssertionError("decode run outgrew its KV bound")  # the bound is exact
        self.busy_s = busy
        self._run_next = stop

    def _advance_decode(self, end: float) -> None:
        d, itl = self.decoding, self.itl
        done = d.advance()
        joined = d.joined
        cont = len(d.members) - len(joined)
        if cont:
            itl.gap(end - d.last_step_end)
            itl.count(cont)
        if joined:
            for req in joined:
                itl.gap(end - req.last_token_s)
                itl.count(1)
            joined.clear()
        d.last_step_end = end
        for req in done:
            d.remove(req)
            req.last_token_s = end
            self._finish(req, end)

    def _emit(self, req: Request, end: float, count: int = 1) -> None:
        """A request outside the decode set sampled ``count`` tokens at ``end`` (more than one
        only for accepted speculative drafts; all carry the step's end time, so the extra ones
        have inter-token gaps of 0)."""
        req._num_output += count
        if req.first_token_s is None:
            req.first_token_s = end
        else:
            self.itl.gap(end - req.last_token_s)
            self.itl.count(1)
        if count > 1:
            self.itl.gap(0.0)
            self.itl.count(count - 1)
        req.last_token_s = end
        if req._num_output >= req.max_output_tokens:
            self._finish(req, end)
        elif self.on_prefilled is not None and req._num_output == 1:
            del self.running[req.id]
            req.status = TRANSFERRING
            self.on_prefilled(req)
        elif self.policy.uses_decode_set:
            self.decoding.add(req, self.kv.capacity(req))

    def _finish(self, req: Request, end: float) -> None:
        req.status = FINISHED
        req.finish_s = end
        self.kv.free(req)
        del self.running[req.id]
        self.num_finished += 1
        if self.on_finish is not None:
            self.on_finish(req)

    # -- decode runs ------------------------------------------------------------------------------
    def _plan_decode_run(self, start: float, wake_at: float | None) -> None:
        """Precompute the identical decode steps that will follow; see the module docstring.

        The run ends at the first of: the step on which a member finishes (unless the run may go
        on past finishes, below); the first step that ends at or after the next external event
        or the policy's wake time; the last step whose KV growth is guaranteed to fit (growth
        for later steps is allocated on commit and must never fail); _MAX_RUN steps. Growth for
        the first step was done by the policy.

        Past finishes: when the policy declares ``decodes_past_finish`` and nothing but the
        decode set is queued or running, the policy's plan after a finish is the decode of the
        remaining members (nothing can be admitted: an arrival cuts the run), so the run goes on
        with them (`_plan_past_finishes`) instead of ending there and going back through the
        loop, a SimPy wait and ``schedule`` (~0.8 times a request). The KV bound is taken for
        all ``n`` members over the whole run: members only leave, and a finish frees blocks.
        """
        d = self.decoding
        n = len(d.members)
        k = _MAX_RUN
        fin = d.next_finish_clock()
        past = self._past_finish and not self.waiting and len(self.running) == n
        if fin is not None and fin - d.clock < k and not past:
            k = fin - d.clock
        if n and k > 1 and self.kv.growth_bound(n, k - 1) > self.kv.num_free_blocks:
            free = self.kv.num_free_blocks
            lo, hi = 1, k  # largest j in [1, k] with growth over steps 2..j within free blocks
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.kv.growth_bound(n, mid - 1) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        horizon = self.next_external_s()
        if wake_at is not None and wake_at < horizon:
            horizon = wake_at
        t = start
        run = []
        ctx = n * (d.clock + 1) + d.sum_dbase  # d.decode_ctx(), inline: every decode run
        if self._reads is not None:
            self._plan_read_run(run, t, k, horizon)
        elif not past or fin is None or fin - d.clock >= k:
            self._append_run(run, n, ctx, d.decode_max(), k, t, horizon)
        else:  # the first finish comes before the run's bound: plan up to it, then past it
            seg = fin - d.clock
            t = self._append_run(run, n, ctx, d.decode_max(), seg, t, horizon)
            if t < horizon:
                self._plan_past_finishes(run, t, k - seg, horizon)
        self._run = run
        self._run_next = 0

    def _append_run(
        self, run: list, n: int, ctx: int, longest: int, k: int, t: float, horizon: float
    ) -> float:
        """Append up to ``k`` decode steps of ``n`` members from context sum ``ctx`` (longest
        ``longest``), starting at ``t``, ending with the first that reaches ``horizon``
        (`decode_run_times`); return the last one's end."""
        append = run.append
        for dt in self._decode_run_times(n, ctx, longest, k, t, horizon):
            append((t, dt, ctx, ctx))
            t += dt
            ctx += n
        return t

    def _plan_past_finishes(self, run: list, t: float, k: int, horizon: float) -> None:
        """Go on planning after the run's first finish (its step is the run's last so far, ending
        at ``t`` before ``horizon``): up to ``k`` more steps, one segment per stretch between
        finishes, each with the members left then, read off the decode set without changing
        it (`DecodeSet.pop_finish`, `DecodeSet.longest_left`, on copies of its heaps).

        Each step's features are `_features`' for the set as it will be at that step: at the
        clock value ``c`` after a finish step, the members whose finish key is ``c`` have left,
        so ``n`` and ``sum_dbase`` drop by them, the context sum is ``n * (c + 1) + sum_dbase``,
        and the longest is ``c + 1 +`` the largest ``_dbase`` among members not finished by
        ``c`` (finish key ``> c``). Stops at the horizon, after ``k`` steps, or when every
        member has finished."""
        d = self.decoding
        n, sdb = len(d.members), d.sum_dbase
        fins, longest = d.finish_heap()[:], None
        key, req = d.pop_finish(fins, None)
        top = d.longest_member()
        while True:
            clock = key
            while key == clock:  # the members finishing on the step that ends at ``clock``
                n -= 1
                sdb -= req._dbase
                key, req = d.pop_finish(fins, req)
            if not n:
                return
            if top._fin_clock <= clock:  # the longest has finished: the next one left
                if longest is None:
                    longest = d.longest_heap()[:]
                top = d.longest_left(longest, clock)
            seg = k if key - clock > k else key - clock
            t = self._append_run(run, n, n * (clock + 1) + sdb, clock + 1 + top._dbase, seg, t,
                                 horizon)  # fmt: skip
            k -= seg
            if k <= 0 or t >= horizon:
                return

    def _plan_read_run(self, run: list, t: float, k: int, horizon: float) -> None:
        """`_plan_decode_run`'s loop for a model with sliding layers: the run also ends before
        another member's context passes the window, so the keys read grow by a fixed amount a
        sub-step (``n`` on full layers, the members within the window on sliding ones). With
        requests waiting it is one step: KV growth frees the window's blocks, which may admit
        one, so the policy must see every step (full attention frees nothing mid-run)."""
        d, reads, step_time = self.decoding, self._reads, self.executor.step_time
        factor = getattr(self.executor, "decode_factor", None)  # the clock dip (executor)
        n = len(d)
        nxt = d.next_excess_clock()
        if nxt is not None:
            k = min(k, nxt - d.clock)
        if self.waiting:
            k = 1
        ctx, excess, over = d.decode_ctx(), d.decode_excess(), len(d._sat)
        longest = d.decode_max()
        for _ in range(max(k, 1)):
            read = reads.decode(ctx, excess)
            dt = step_time(0, 0.0, 0, n, read, longest)
            if factor is not None:
                dt *= factor(t)
            run.append((t, dt, read, ctx))
            t += dt
            ctx += n
            excess += over
            longest += 1
            if t >= horizon:
                break

    def _cut_run(self) -> None:
        """Drop precomputed sub-steps after the one in progress (the state is about to change).
        Nothing to drop (the usual case: runs end at the next arrival) when the last one has
        started by now: sub-step ``i + 1`` starts at sub-step ``i``'s end, the same float."""
        run = self._run
        if run is None or run[-1][0] <= self.env.now:
            return
        keep = self._ended() + 1
        if keep < len(run):
            del run[keep:]
            self._proc.interrupt()
