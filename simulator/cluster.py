"""Arrivals and routing: the process that turns a workload into requests at replicas.

One SimPy process replays the workload's arrival times; each request is handed to the replica the
router picks. Under round robin the replicas can take their arrivals themselves instead
(`Cluster.start` with ``hand_over``, `OwnArrivals`): no SimPy event per request, same results.
Every arriving request is accounted for (finished, rejected, or still in flight at
the horizon) in ``log``, a columnar `RequestLog` that drops finished requests' objects; with
``keep_requests`` (tests, tools that inspect `Request` objects) they are also kept in
``requests``.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import simpy

from simulator.reqlog import RequestLog
from simulator.request import Request
from workloads.spec import RequestColumns, RequestSpec


class Cluster:
    def __init__(
        self,
        env: simpy.Environment,
        specs: list[RequestSpec],
        router,
        keep_requests=True,
        input_delay=None,
    ):
        """``input_delay(prompt_tokens) -> s``: time from a request's arrival at the server to
        its arrival in the engine (a serving frontend's input path; None: no delay). Requests
        enter the engine in arrival order (FIFO), each at the later of its own entry time and
        the previous one's; ``Request.arrival_s`` stays the arrival at the server."""
        self.env = env
        self.input_delay = input_delay
        self.specs = RequestColumns.of(specs)
        self.router = router
        self.replicas: list = []
        self.requests: list[Request] = []
        self.keep_requests = keep_requests
        self.log = RequestLog(len(self.specs))
        #: arrival time of the next request not yet arrived (replicas bound decode runs by it)
        self.next_arrival_s = float(self.specs.arrival_s[0]) if len(self.specs) else math.inf
        #: where the run will stop (`start`; None: when the events run out)
        self.until: float | None = None

    @property
    def num_arrived(self) -> int:
        return self.log.num_arrived

    def add_replica(self, replica) -> None:
        """Register a replica the router may pick, and give it its decode-run horizon.

        The horizon only bounds how far ahead a replica precomputes decode steps (results do
        not depend on it: an arrival that lands mid-run cuts the run). Round robin's choice is
        known in advance (arrival ``i`` goes to the ``i % R``-th replica), so each replica is
        bounded by its own next arrival; any other router may send the next arrival anywhere,
        so every replica is bounded by it. With R replicas the first keeps runs R times longer.
        """
        position = len(self.replicas)
        if getattr(self.router, "name", None) == "round_robin":
            replica.next_external_s = partial(self._next_arrival_for, position)
        else:
            replica.next_external_s = self.next_external_s
        self.replicas.append(replica)

    def next_external_s(self) -> float:
        return self.next_arrival_s

    def _next_arrival_for(self, position: int) -> float:
        """Arrival time of the next request round robin will send to ``replicas[position]``."""
        cur = self.log.num_arrived
        i = cur + (position - cur) % len(self.replicas)
        times = self.specs.arrival_s
        return times.item(i) if i < len(times) else math.inf

    def can_hand_over(self) -> bool:
        """Whether the replicas may take their own arrivals (`start`): round robin (each
        arrival's replica is known in advance and no replica observes another), no input
        delay, no `Request` objects kept, and replicas without P/D callbacks (nobody but the
        arrivals reads or changes a replica from outside its process)."""
        return (
            getattr(self.router, "name", None) == "round_robin"
            and self.input_delay is None
            and not self.keep_requests
            and len(self.specs) > 0
            and all(r.on_finish is None and r.on_prefilled is None for r in self.replicas)
        )

    def start(self, hand_over: bool = False, until: float | None = None) -> None:
        """Start the arrivals: one SimPy process that hands each request to its replica at its
        time, or (``hand_over``, only where `can_hand_over`) each replica takes its own
        arrivals when its process next runs (`OwnArrivals`), and one event at the last
        arrival's time does what the process does after the last arrival (`_finale`).
        ``until``: the run's end (None: none), which replicas taking their own arrivals must
        not run ahead past (`Replica.take_arrivals`)."""
        self.until = until
        if not hand_over:
            self.env.process(self._arrivals())
            return
        event_s = arrival_event_times(self.specs.arrival_s)
        n, stride = len(event_s), len(self.replicas)
        for position, replica in enumerate(self.replicas):
            replica.take_arrivals(OwnArrivals(self, event_s, position, stride), until)
        self.next_arrival_s = math.inf  # read only by routers other than round robin
        last = event_s.item(n - 1)
        if self.env.now != 0:
            raise ValueError("arrivals are handed over from the start of a run (clock 0)")
        finale = self.env.timeout(last)  # from 0: lands on ``last`` exactly
        finale.callbacks.append(self._finale)

    def _finale(self, _event) -> None:
        """What `_arrivals` does after the last arrival, at its time: every replica first takes
        the arrivals it has not taken yet (each as at its own time), then as there."""
        for replica in self.replicas:
            replica.take_all_arrivals()
        for replica in self.replicas:
            replica.sync()
            replica.arrivals_done = True
            replica.poke()

    def take_late_arrivals(self, until: float) -> None:
        """After a run stopped at ``until`` with arrivals handed over: the arrivals before it
        that a replica busy past it has not taken, as `_arrivals` would have given them.
        ``until`` must be the one `start` was given (the replicas ran ahead up to it)."""
        if until != self.until:
            raise ValueError(f"the run stopped at {until}, but start() was told {self.until}")
        for replica in self.replicas:
            replica.take_arrivals_before(until)

    def _arrivals(self):
        env, route, replicas = self.env, self.router.route, self.replicas
        timeout = env.timeout  # SimPy builds a bound method at every `env.timeout` lookup
        log_add = self.log.add
        keep = self.requests.append if self.keep_requests else None
        delay, prev = self.input_delay, -math.inf
        for i, (t, prompt, output, hash_ids) in enumerate(self.specs.rows()):
            entry = t if delay is None else max(t + delay(prompt), prev)
            prev = self.next_arrival_s = entry
            now = env.now
            if entry > now:
                yield timeout(entry - now)
            req = Request(i, t, prompt, output, hash_ids)
            log_add(req)
            if keep is not None:
                keep(req)
            route(req, replicas).add_request(req)
        self.next_arrival_s = math.inf
        for replica in self.replicas:
            replica.sync()
            replica.arrivals_done = True
            replica.poke()


class ArrivalTie(Exception):
    """While replicas take their own arrivals, one of a replica's events fell at exactly the
    time of one of its arrivals (or an arrival fell inside a decode run before its last
    step). SimPy orders such events by when each was created, which taking arrivals late does
    not reproduce; the run starts over with one event per arrival (`runner.simulate`)."""


def delays_to(now: float, t: float) -> tuple:
    """Delays that, waited one after the other from ``now``, land on ``t`` exactly (``now <=
    t``): SimPy puts a timeout at ``now + delay``, and ``now + (t - now)`` can miss ``t`` by
    a unit in the last place when ``t > 2 * now``. One delay when some ``d`` has ``now + d ==
    t`` (``t - now`` or a unit or two from it; 0 when ``t == now``, so that SimPy's clock
    keeps its type: an int at the start). Else, when every sum rounds past ``t`` (``t`` odd,
    the sums halfway), two: the largest sum below ``t`` first, from where ``t - s`` is exact
    (Sterbenz: ``s <= t <= 2 s``) and ``s + (t - s) == t``."""
    if t == now:
        return (0,)
    d0 = t - now
    for d in (d0, math.nextafter(d0, math.inf), math.nextafter(d0, -math.inf)):
        if now + d == t:
            return (d,)
    d = d0
    while now + d >= t:
        d = math.nextafter(d, -math.inf)
    return (d, t - (now + d))


def arrival_event_times(times: np.ndarray) -> np.ndarray:
    """The clock at which `Cluster._arrivals` hands over each arrival (no input delay): it
    waits ``timeout(t - now)`` only when ``t > now``, and SimPy's clock then reads ``now + (t -
    now)``, which need not be ``t`` (see `delay_to`). So ``e[k] = e[k-1] + (t[k] - e[k-1])`` if
    ``t[k] > e[k-1]``, else ``e[k-1]``, from ``e[-1] = 0``.

    Computed in numpy (the same IEEE double operations) as a fixed point: start from
    ``e = t``, apply the rule to the whole array at once until it no longer changes; each pass
    makes at least one more leading entry exact, and in practice one pass finds ``e``. A
    time ``<= 0`` stays 0 (the process's clock, an int there: such an arrival coincides with
    the replicas' start, an `ArrivalTie`)."""
    t = np.asarray(times, dtype=np.float64)
    e = np.maximum(t, 0.0)
    while True:
        prev = np.concatenate(([0.0], e[:-1]))
        nxt = np.where(t > prev, prev + (t - prev), prev)
        if np.array_equal(nxt, e):
            return e
        e = nxt


class OwnArrivals:
    """The arrivals round robin sends one replica (ids ``position``, ``position + stride``,
    ...), taken by the replica itself (`Replica.take_arrivals`).

    ``next_s`` is the clock at which `Cluster._arrivals` would hand over the next one not
    taken (infinity when none is left; `Replica.take_all_arrivals` may leave a mark there,
    with ``done``), ``next_t`` its arrival time (the decode-run horizon
    `Cluster._next_arrival_for` gives). `pop` makes its `Request` and records the arrival in
    the request log, as `_arrivals` does (ids arrive out of order across replicas; the log
    keys them by id). The columns are read `CHUNK` arrivals at a time into Python objects
    (``_ahead``, next last), as `RequestColumns.rows` does for the process: the same values,
    without a numpy scalar lookup per field."""

    CHUNK = 256

    __slots__ = (
        "_log_add", "_specs", "_event_s", "_i", "_stride", "_n", "_ahead", "next_s", "next_t",
        "done", "last_s",
    )  # fmt: skip

    def __init__(self, cluster: Cluster, event_s: np.ndarray, position: int, stride: int):
        self._log_add = cluster.log.add
        self._specs = cluster.specs
        self._event_s = event_s
        self._i = position  # the next arrival's id
        self._stride = stride
        self._n = len(event_s)
        #: the last arrival's clock (`Cluster._finale`)
        self.last_s = event_s.item(self._n - 1)
        self._ahead: list = []
        self._read()

    def _read(self) -> None:
        """Read the next `CHUNK` arrivals from ``_i`` (none left: ``done``, clocks infinite)."""
        i, n, stride, specs = self._i, self._n, self._stride, self._specs
        #: no arrival left to take
        self.done = i >= n
        if self.done:
            self.next_s = self.next_t = math.inf
            return
        cut = slice(i, min(n, i + stride * self.CHUNK), stride)
        clocks = self._event_s[cut].tolist()
        hashes = specs.hash_ids[cut] if specs.hash_ids is not None else [None] * len(clocks)
        ahead = list(
            zip(
                clocks, specs.arrival_s[cut].tolist(), specs.num_prompt_tokens[cut].tolist(),
                specs.num_output_tokens[cut].tolist(), hashes, strict=True,
            )
        )  # fmt: skip
        ahead.reverse()
        self._ahead = ahead
        self.next_s, self.next_t = ahead[-1][0], ahead[-1][1]

    def horizon(self) -> float:
        """`Replica.next_external_s` under round robin: the next arrival's time."""
        return self.next_t

    def pop(self) -> Request:
        """The next arrival's request (``next_s`` is its clock), logged; then on to the next."""
        ahead = self._ahead
        _, t, prompt, output, hash_ids = ahead.pop()
        req = Request(self._i, t, prompt, output, hash_ids)
        self._log_add(req)
        self._i += self._stride
        if ahead:
            nxt = ahead[-1]
            self.next_s, self.next_t = nxt[0], nxt[1]
        else:
            self._read()
        return req
