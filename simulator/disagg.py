"""P/D disaggregation (DistServe, Splitwise): separate prefill and decode pools.

A cluster mode, not a batching policy. Arrivals are routed (``cluster.router``) to a prefill pool;
each pool has its own replica count, policy (a ``scheduler`` section) and KV allocator (a
``kv_cache`` section merged over the top-level one). Life of a request:

1. it prefills on a prefill replica, which emits its first token there: **TTFT is measured on the
   prefill side**, and TPOT counts from that token;
2. it leaves the prefill replica's ``running`` (status TRANSFERRING) but keeps its prefill-side
   KV, and is assigned the decode replica with the fewest requests (outstanding + queued for
   transfer);
3. **decode memory first**: it waits in that decode replica's FIFO transfer queue until the
   decode cache can hold its ``num_computed + 1`` tokens (keeping the decode policy's watermark
   free); the blocks are allocated there *before* the copy starts, so an arriving KV always has
   a place, and a request never holds link time while waiting for memory;
4. the copy of the bytes the request's ``num_computed`` tokens hold on one prefill GPU
   (``ShardedModel.kv_bytes_held`` at the prefill pool's block size: ``num_computed x
   kv_bytes_per_token_per_gpu`` unless sliding-window layers hold only their window; each GPU of
   a TP group sends its own shard, in parallel) takes ``link.latency + bytes / link.bandwidth``
   on its prefill replica's outgoing link. A link carries ``link_concurrency`` copies at a time
   (default 1), each at the full per-copy bandwidth (more lanes / NICs, not a shared pipe);
   others queue FIFO;
5. when the copy ends, the prefill-side KV is freed and the request enters the decode replica's
   ``waiting`` queue already holding its KV with one pending token; the decode policy admits it
   like any request (its first decode computes one token over the copied cache).

A request whose output is one token finishes on the prefill side. A request that the decode cache
can never hold is rejected there, with its reason. Decode replicas have ``arrivals_done`` set from
the start (their input is handoffs, not a finite arrival stream). The prefix cache, if on,
applies to the prefill pool (the decode side allocates fresh blocks for copied KV).

YAML::

    cluster:
      mode: disaggregated
      router: {name: round_robin}          # over the prefill pool
      prefill: {replicas: 1, scheduler: {policy: chunked_prefill}, kv_cache: {...}}
      decode: {replicas: 1, scheduler: {policy: chunked_prefill}}
      link: nvlink                         # preset (nvlink, infiniband, pcie or any of
                                           # simulator.hardware.LINKS) or {bandwidth_gb_s, ...}
      link_concurrency: 1

Pool ``scheduler`` defaults to the top-level ``scheduler``; pool ``kv_cache`` keys override the
top-level ``kv_cache``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from simulator.cfg import Section
from simulator.engine import MAX_REPLICAS
from simulator.executor import SimulatedExecutor
from simulator.hardware import LinkSpec, load_link
from simulator.replica import Replica
from simulator.request import Request
from simulator.served import ShardedModel
from simulator.steplog import chunk_rows, share_packing

LINK_ALIASES = {"nvlink": "nvlink4", "infiniband": "infiniband-ndr", "pcie": "pcie-gen5-x16"}


class _Held:
    """The prefill-side KV of a request in transfer (what the allocator's ``free`` reads)."""

    __slots__ = ("id", "block_table", "kv_blocks", "num_computed", "num_prompt_tokens", "hash_ids")

    def __init__(self, req: Request):
        self.id = req.id
        self.block_table = req.block_table
        self.kv_blocks = req.kv_blocks
        self.num_computed = req.num_computed
        self.num_prompt_tokens = req.num_prompt_tokens
        self.hash_ids = req.hash_ids


@dataclass
class DisaggSpec:
    prefill: object  # engine.EngineSpec
    decode: object
    prefill_replicas: int
    decode_replicas: int
    link: LinkSpec
    link_concurrency: int
    #: bytes one GPU sends for a request of n computed tokens (`ShardedModel.kv_bytes_held`)
    kv_bytes_held: Callable[[int], float]

    @classmethod
    def parse(cls, cl: Section, top_sched, kvs: Section, model, gpu, tp, where) -> DisaggSpec:
        from simulator.engine import EngineSpec, mark_all_used

        mark_all_used(kvs)  # validated below, through each pool's merged view
        base_kv = {k: v for k, v in kvs.data.items() if k != "on_oversize"}
        pools = {}
        for pool in ("prefill", "decode"):
            psec = cl.section(pool)
            n = psec.int("replicas", 1, min=1, max=MAX_REPLICAS)
            if psec.has("scheduler"):
                sched = psec.section("scheduler")
            else:
                sched = Section(top_sched, where, "scheduler")
            kv_over = psec.section("kv_cache", {})
            kv_path = psec.key("kv_cache") if psec.has("kv_cache") else kvs.path
            kv_sec = Section({**base_kv, **kv_over.data}, where, kv_path)
            mark_all_used(kv_over)
            spec = EngineSpec.parse(sched, kv_sec, model, gpu, tp, where)
            kv_sec.done()
            psec.done()
            pools[pool] = (n, spec)
        link_val = cl.raw("link", "nvlink")
        if isinstance(link_val, str):
            link_val = LINK_ALIASES.get(link_val, link_val)
        link = load_link(link_val, where, cl.key("link"))
        conc = cl.int("link_concurrency", 1, min=1)
        return cls(
            pools["prefill"][1], pools["decode"][1], pools["prefill"][0], pools["decode"][0],
            link, conc, functools.partial(ShardedModel(model, tp).kv_bytes_held,
                                          block_size=pools["prefill"][1].block_size),
        )  # fmt: skip

    def resolved(self) -> dict:
        return {
            "prefill": {
                "replicas": self.prefill_replicas,
                "scheduler": self.prefill.resolved_scheduler,
                "kv_cache": self.prefill.resolved_kv,
            },
            "decode": {
                "replicas": self.decode_replicas,
                "scheduler": self.decode.resolved_scheduler,
                "kv_cache": self.decode.resolved_kv,
            },
            "link": {
                "name": self.link.name,
                "bandwidth_gb_s": self.link.bandwidth / 1e9,
                "latency_s": self.link.latency,
            },
            "link_concurrency": self.link_concurrency,
        }

    def make_replicas(self, env, cluster, latency, coalesce, streams) -> list[Replica]:
        return KVTransfer(env, cluster, self, latency, coalesce, streams).replicas


class KVTransfer:
    """Owns both pools and moves each prefilled request's KV from one to the other."""

    def __init__(self, env, cluster, spec: DisaggSpec, latency, coalesce, streams):
        self.env = env
        self.spec = spec
        self.prefill: list[Replica] = []
        self.decode: list[Replica] = []
        chunk = chunk_rows(spec.prefill_replicas + spec.decode_replicas)
        for i in range(spec.prefill_replicas):
            rng = np.random.default_rng(streams.spawn(1)[0])
            rep = Replica(
                env, i, spec.prefill.make_policy(rng), spec.prefill.make_kv(),
                SimulatedExecutor(latency), coalesce=coalesce, on_prefilled=self._handoff,
                step_chunk=chunk,
            )  # fmt: skip
            cluster.add_replica(rep)
            self.prefill.append(rep)
        for j in range(spec.decode_replicas):
            rng = np.random.default_rng(streams.spawn(1)[0])
            rep = Replica(
                env, spec.prefill_replicas + j, spec.decode.make_policy(rng),
                spec.decode.make_kv(), SimulatedExecutor(latency), coalesce=coalesce,
                on_finish=lambda req, j=j: self._pump_soon(j), step_chunk=chunk,
            )  # fmt: skip
            rep.arrivals_done = True
            self.decode.append(rep)
        self.replicas = self.prefill + self.decode
        share_packing([rep.steps for rep in self.replicas])
        self.queues: list[deque] = [deque() for _ in self.decode]
        self.links = [simpy.Resource(env, capacity=spec.link_concurrency) for _ in self.prefill]
        self.in_flight = [0] * len(self.decode)
        self.stats = {"transfers": 0, "bytes": 0.0, "copy_s": [], "wait_memory_s": [],
                      "wait_link_s": []}  # fmt: skip
        cluster.describe = self.describe

    # -- handoff ------------------------------------------------------------------------------
    def _handoff(self, req: Request) -> None:
        """Called by a prefill replica when ``req`` emitted its first token (inside its commit)."""
        held = _Held(req)
        req.block_table = []
        req.kv_blocks = 0
        prep = self.prefill[req.replica]
        for r in self.decode:
            r.sync()
        j = min(range(len(self.decode)),
                key=lambda j: self.decode[j].num_outstanding + len(self.queues[j])
                + self.in_flight[j])  # fmt: skip
        drep = self.decode[j]
        need = -(-(req.num_prompt_tokens + req.max_output_tokens) // drep.kv.block_size)
        reserve = getattr(drep.policy, "_watermark_blocks", 0)
        if need + reserve > drep.kv.num_blocks:
            prep.touch()
            prep.kv.free(held)  # it left `running` at its first token: `reject` just records it
            prep.reject(req, f"decode pool: needs {need} KV blocks > {drep.kv.num_blocks}",
                        self.env.now)  # fmt: skip
            return
        self.queues[j].append((req, held, prep, self.env.now))
        self._pump(j)

    def _pump_soon(self, j: int) -> None:
        # a decode replica freed KV inside its own commit: retry after it (never re-entrantly)
        ev = self.env.timeout(0)
        ev.callbacks.append(lambda _ev: self._pump(j))

    def _pump(self, j: int) -> None:
        q = self.queues[j]
        if not q:
            return
        drep = self.decode[j]
        drep.touch()  # commit ended sub-steps, cut its decode run: its free KV is about to change
        reserve = getattr(drep.policy, "_watermark_blocks", 0)
        while q:
            req, held, prep, t0 = q[0]
            if not drep.kv.can_allocate(req, req.num_tokens, reserve):
                break
            q.popleft()
            drep.kv.allocate(req, req.num_tokens)
            self.in_flight[j] += 1
            self.stats["wait_memory_s"].append(self.env.now - t0)
            self.env.process(self._copy(req, held, prep, j))

    def _copy(self, req: Request, held: _Held, prep: Replica, j: int):
        env = self.env
        nbytes = self.spec.kv_bytes_held(req.num_computed)
        t0 = env.now
        with self.links[prep.index].request() as slot:
            yield slot
            self.stats["wait_link_s"].append(env.now - t0)
            dt = self.spec.link.transfer_time(nbytes)
            yield env.timeout(dt)
        self.stats["transfers"] += 1
        self.stats["bytes"] += nbytes
        self.stats["copy_s"].append(dt)
        prep.touch()
        prep.kv.free(held)
        self.in_flight[j] -= 1
        self.decode[j].add_request(req)
        self._pump(j)

    def describe(self) -> dict:
        s = self.stats

        def mean(xs):
            return float(np.mean(xs)) if xs else None

        return {
            "prefill_replicas": len(self.prefill),
            "decode_replicas": len(self.decode),
            "link": self.spec.link.name,
            "link_concurrency": self.spec.link_concurrency,
            "transfers": s["transfers"],
            "bytes": s["bytes"],
            "copy_s_mean": mean(s["copy_s"]),
            "wait_memory_s_mean": mean(s["wait_memory_s"]),
            "wait_link_s_mean": mean(s["wait_link_s"]),
        }
