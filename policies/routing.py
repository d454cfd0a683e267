"""Routers: which replica gets an arriving request. Registry in ROUTERS.

A router that reads replica state must call ``replica.sync()`` first (replicas may have decode
steps that ended but are not yet committed). Ties go to the lowest replica index (deterministic).

* ``round_robin``: replicas in turn, blind to load.
* ``least_outstanding``: fewest requests waiting + running (vLLM production-stack / Ray Serve's
  default "least requests").
* ``least_kv``: least KV load: blocks in use plus blocks the waiting requests' prompts will need,
  as a fraction of the replica's cache.
* ``prefix_aware``: most prompt tokens already in the replica's prefix cache (needs
  ``kv_cache.prefix_caching``; without it every hit is 0), ties broken by fewest outstanding.
  ``balance_threshold`` (default 0: off) sends the request to the least-outstanding replica
  instead when the prefix winner has that many more outstanding requests than it (SGLang's
  cache-aware router idea), so one hot prefix does not pile every request on one replica.
"""

from __future__ import annotations

from simulator.cfg import Section


class RoundRobin:
    """Arrival ``i`` (``req.id``, the cluster's arrival ordinal) goes to replica ``i % R``.
    Stateless on purpose: a router is built once per experiment and a `Built` may be simulated
    more than once (a counter kept here started the second run on another replica), and
    `Cluster.add_replica` bounds each replica's decode runs by this very rule."""

    name = "round_robin"

    def __init__(self, sec: Section):
        pass

    def route(self, req, replicas):
        return replicas[req.id % len(replicas)]

    def params(self) -> dict:
        return {}


class LeastOutstanding:
    name = "least_outstanding"

    def __init__(self, sec: Section):
        pass

    def route(self, req, replicas):
        for r in replicas:
            r.sync()
        return min(replicas, key=lambda r: r.num_outstanding)

    def params(self) -> dict:
        return {}


def kv_load(replica) -> float:
    """Fraction of the replica's KV in use or claimed by its waiting prompts."""
    kv = replica.kv
    bs = kv.block_size
    claimed = sum(-(-r.num_prompt_tokens // bs) for r in replica.waiting)
    return (kv.num_used_blocks + claimed) / kv.num_blocks


class LeastKV:
    name = "least_kv"

    def __init__(self, sec: Section):
        pass

    def route(self, req, replicas):
        for r in replicas:
            r.sync()
        return min(replicas, key=kv_load)

    def params(self) -> dict:
        return {}


class PrefixAware:
    name = "prefix_aware"

    def __init__(self, sec: Section):
        self.balance_threshold = sec.int("balance_threshold", 0, min=0)

    def route(self, req, replicas):
        best, best_key = None, None
        for r in replicas:
            r.sync()
            lookup = getattr(r.kv, "lookup", None)
            hit = lookup(req) if lookup is not None else 0
            key = (-hit, r.num_outstanding)
            if best_key is None or key < best_key:
                best, best_key = r, key
        if self.balance_threshold:
            idle = min(replicas, key=lambda r: r.num_outstanding)
            if best.num_outstanding - idle.num_outstanding >= self.balance_threshold:
                return idle
        return best

    def params(self) -> dict:
        return {"balance_threshold": self.balance_threshold}


ROUTERS = {cls.name: cls for cls in (RoundRobin, LeastOutstanding, LeastKV, PrefixAware)}
