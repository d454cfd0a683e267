"""Arrivals and routing: the process that turns a workload into requests at replicas.

One SimPy process replays the workload's arrival times; each request is handed to the replica the
router picks. Every arriving request is accounted for (finished, rejected, or still in flight at
the horizon) in ``log``, a columnar `RequestLog` that drops finished requests' objects; with
``keep_requests`` (tests, tools that inspect `Request` objects) they are also kept in
``requests``.
"""

from __future__ import annotations

import math
from functools import partial

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

    def start(self) -> None:
        self.env.process(self._arrivals())

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
