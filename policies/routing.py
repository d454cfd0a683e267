"""Routers: which replica gets an arriving request. Registry in ROUTERS.

A router that reads replica state must call ``replica.sync()`` first (replicas may have decode
steps that ended but are not yet committed).
"""

from __future__ import annotations

from simulator.cfg import Section


class RoundRobin:
    name = "round_robin"

    def __init__(self, sec: Section):
        self._next = 0

    def route(self, req, replicas):
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        return replica

    def params(self) -> dict:
        return {}


ROUTERS = {RoundRobin.name: RoundRobin}
