"""Arrivals and routing: the process that turns a workload into requests at replicas.

One SimPy process replays the workload's arrival times; each request is handed to the replica the
router picks. Every arriving request is kept in ``requests`` so the run can account for all of
them (finished, rejected, or still in flight at the horizon).
"""

from __future__ import annotations

import math

import simpy

from simulator.request import Request
from workloads.spec import RequestSpec


class Cluster:
    def __init__(self, env: simpy.Environment, specs: list[RequestSpec], router, input_delay=None):
        """``input_delay(prompt_tokens) -> s``: time from a request's arrival at the server to
        its arrival in the engine (a serving frontend's input path; None: no delay). Requests
        enter the engine in arrival order (FIFO), each at the later of its own entry time and
        the previous one's; ``Request.arrival_s`` stays the arrival at the server."""
        self.env = env
        self.input_delay = input_delay
        self.specs = specs
        self.router = router
        self.replicas: list = []
        self.requests: list[Request] = []
        #: arrival time of the next request not yet arrived (replicas bound decode runs by it)
        self.next_arrival_s = specs[0].arrival_s if specs else math.inf

    def add_replica(self, replica) -> None:
        replica.next_external_s = self.next_external_s
        self.replicas.append(replica)

    def next_external_s(self) -> float:
        return self.next_arrival_s

    def start(self) -> None:
        self.env.process(self._arrivals())

    def _arrivals(self):
        env, prev = self.env, -math.inf
        for i, spec in enumerate(self.specs):
            entry = spec.arrival_s
            if self.input_delay is not None:
                entry = max(entry + self.input_delay(spec.num_prompt_tokens), prev)
            prev = self.next_arrival_s = entry
            if entry > env.now:
                yield env.timeout(entry - env.now)
            req = Request(
                i, spec.arrival_s, spec.num_prompt_tokens, spec.num_output_tokens, spec.hash_ids
            )
            self.requests.append(req)
            self.router.route(req, self.replicas).add_request(req)
        self.next_arrival_s = math.inf
        for replica in self.replicas:
            replica.sync()
            replica.arrivals_done = True
            replica.poke()
