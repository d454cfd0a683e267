"""How a policy preempts: ``scheduler.preemption: recompute | swap`` (vLLM's two modes).

* ``recompute`` (default): the victim's KV is dropped; it goes back to the front of ``waiting``
  with ``num_computed = 0`` and later recomputes prompt + generated tokens as a prefill.
* ``swap``: the victim's KV (the bytes its ``num_computed`` tokens hold on one GPU, the engine's
  ``kv_bytes_held``: a sliding-window layer holds only its window's blocks) is copied to host
  memory over
  ``scheduler.swap_link`` (default ``pcie-gen5-x16``: bandwidth + latency, per GPU; with tensor
  parallelism each GPU copies its own shard), its GPU blocks are freed, and it keeps its progress.
  When admitted again it gets GPU blocks and is copied back before it runs.

Time: a copy is charged as extra time on the step that causes it (``StepPlan.extra_s``), i.e.
copies do not overlap compute (as in vLLM v0, which swaps on the compute stream before the step).
Host memory is unbounded. Counts, copied tokens and copy seconds are kept in ``stats`` and reported
in summary.json under ``preemption``; for recompute, the tokens thrown away (``recomputed_tokens``)
measure the work redone.

Invariant: a swapped-out request is exactly a waiting request with ``num_computed > 0`` and no
KV blocks (``is_swapped``).
"""

from __future__ import annotations

from simulator.cfg import Section
from simulator.hardware import load_link

DEFAULT_SWAP_LINK = "pcie-gen5-x16"


class Preemption:
    def __init__(self, sec: Section, engine: dict):
        self.mode = sec.str("preemption", "recompute", choices=["recompute", "swap"])
        link = sec.raw("swap_link", None)
        if link is not None and self.mode != "swap":
            raise sec.error("swap_link", "only used with preemption: swap")
        self.link = load_link(link or DEFAULT_SWAP_LINK, sec.where, sec.key("swap_link"))
        #: bytes one GPU copies for a request of n computed tokens (`ShardedModel.kv_bytes_held`)
        self.kv_bytes_held = engine.get("kv_bytes_held")
        if self.mode == "swap" and self.kv_bytes_held is None:
            raise ValueError("swap preemption needs the engine's kv_bytes_held")
        #: swap copy time accumulated while planning this step (`take_extra_s` takes it)
        self.pending_s = 0.0
        self.stats = {
            "recompute": 0,
            "swap": 0,
            "recomputed_tokens": 0,
            "swap_out_tokens": 0,
            "swap_in_tokens": 0,
            "swap_out_s": 0.0,
            "swap_in_s": 0.0,
        }

    def params(self) -> dict:
        out = {"preemption": self.mode}
        if self.mode == "swap":
            out["swap_link"] = {
                "name": self.link.name,
                "bandwidth_gb_s": self.link.bandwidth / 1e9,
                "latency_s": self.link.latency,
            }
        return out

    def preempt(self, replica, victim) -> None:
        n = victim.num_computed
        if self.mode == "swap" and n > 0:
            t = self.link.transfer_time(self.kv_bytes_held(n))
            replica.preempt(victim, swap=True)
            self.stats["swap"] += 1
            self.stats["swap_out_tokens"] += n
            self.stats["swap_out_s"] += t
            self.pending_s += t
        else:
            replica.preempt(victim)
            self.stats["recompute"] += 1
            self.stats["recomputed_tokens"] += n

    @staticmethod
    def is_swapped(req) -> bool:
        return req.num_computed > 0 and not req.holds_kv

    def swap_in(self, req) -> None:
        """Charge copying a swapped-out request's KV back (call after allocating its blocks)."""
        n = req.num_computed
        t = self.link.transfer_time(self.kv_bytes_held(n))
        self.stats["swap_in_tokens"] += n
        self.stats["swap_in_s"] += t
        self.pending_s += t

    def take_extra_s(self) -> float:
        """Copy time accumulated while planning this step (then reset)."""
        t, self.pending_s = self.pending_s, 0.0
        return t
