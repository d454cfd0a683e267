"""Measured times of the collectives a step runs between the GPUs of one host.

A folder written by ``python -m profiles.nccl_collectives`` (on a lent multi-GPU machine) holds
``collectives.csv`` (one row per mode, op and buffer size: ``link_bytes``, median / p10 / p90
microseconds per call) and ``meta.yaml`` (GPU, rank count, NCCL version). The roofline model
charges each collective of a step (`simulator.served.Op` of kind ``collective``) the measured
time at its link bytes, the bytes one GPU receives in that call, which
`simulator.served.collective_link_factor` gives for a step and the profiler records per row:

* ``allreduce`` / ``allreduce_mlp`` -> ``all_reduce``; ``ep_dispatch`` / ``ep_combine`` ->
  ``all_to_all``; ``ep_allgather`` -> ``all_gather``;
* the ``graph`` rows: calls captured in a CUDA graph, as vLLM's decode steps run them (the
  ``eager`` rows, launched from Python, measure the host's launch rate at small sizes);
* linear between measured sizes; below the smallest size its time (latency-bound); above the
  largest (128 MiB of buffer, far above a step's payload) the last segment's slope
  (bandwidth-bound); `describe` names the largest size measured.

Invariants: every op has at least two sizes, link bytes strictly increasing, times positive and
non-decreasing (the running maximum of the medians: a dip between sizes is noise).
Only a table of the run's GPU and group size is used (`simulator.latency.select`): another
GPU's or rank count's is an error when named and skipped by ``auto`` (the roofline's link
estimate then applies, flagged). The measured library is NCCL; vLLM's TP all-reduce uses its own
one-shot kernel for small messages and DeepEP / pplx all-to-all kernels at DP > 1, which these
machines cannot run: the table is what NCCL does on this host, not those kernels.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.errors import ConfigError
from simulator.files import load_yaml_file
from simulator.hardware import LinkSpec
from simulator.latency.meta_keys import COLLECTIVES_META, check_meta_keys
from simulator.served import ShardedModel, collective_link_factor

#: the measured collective that times each collective op of `simulator.served`
OP_OF = {
    "allreduce": "all_reduce",
    "allreduce_mlp": "all_reduce",
    "ep_dispatch": "all_to_all",
    "ep_combine": "all_to_all",
    "ep_allgather": "all_gather",
}
#: the rows used: calls captured in a CUDA graph (module docstring)
MODE = "graph"
COLUMNS = ("mode", "op", "ranks", "bytes", "link_bytes", "median_us", "p10_us", "p90_us")


@dataclass(frozen=True)
class CollectiveTimes:
    """Per-call seconds of each measured collective over link bytes (module docstring)."""

    source: str
    gpu_key: str
    gpu_name: str
    ranks: int
    library: str
    #: op -> (link bytes, seconds), link bytes strictly increasing
    curves: dict[str, tuple[np.ndarray, np.ndarray]]

    def seconds(self, op_name: str, link_bytes: float) -> float:
        """Measured seconds of one call of collective op ``op_name`` moving ``link_bytes``."""
        xs, ys = self.curves[OP_OF[op_name]]
        if link_bytes <= xs[0]:
            return float(ys[0])
        if link_bytes > xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return float(ys[-1] + slope * (link_bytes - xs[-1]))
        return float(np.interp(link_bytes, xs, ys))

    def describe(self) -> dict:
        return {
            "source": self.source,
            "library": self.library,
            "gpu": self.gpu_name,
            "ranks": self.ranks,
            "mode": MODE,
            "largest_link_bytes": {op: float(xs[-1]) for op, (xs, _) in self.curves.items()},
        }


def load_collectives(folder: str | Path, label: str | None = None) -> CollectiveTimes:
    """The measured collectives in ``folder`` (collectives.csv + meta.yaml), named ``label``
    in `describe` (default: the folder); a ConfigError naming the file and field when either
    is missing or malformed."""
    folder = Path(folder)
    meta_path, csv_path = folder / "meta.yaml", folder / "collectives.csv"
    for p in (meta_path, csv_path):
        if not p.is_file():
            raise ConfigError(str(p), "<file>", "missing: expected a folder written by "
                              "`python -m profiles.nccl_collectives`")  # fmt: skip
    meta = load_yaml_file(meta_path, "collectives meta.yaml")
    if isinstance(meta, dict):
        check_meta_keys(meta, str(meta_path), COLLECTIVES_META)
    gpu = meta.get("gpu") if isinstance(meta, dict) else None
    if not isinstance(gpu, dict) or not isinstance(gpu.get("key"), str):
        raise ConfigError(str(meta_path), "gpu.key", "expected the GPU catalog key (e.g. h200)")
    ranks = gpu.get("count")
    if not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(str(meta_path), "gpu.count", f"expected an integer >= 2, got {ranks!r}")
    curves = _read_curves(csv_path, ranks)
    missing = sorted(set(OP_OF.values()) - set(curves))
    if missing:
        raise ConfigError(str(csv_path), "op", f"no {MODE!r} rows for {missing}")
    name, library = str(gpu.get("name", gpu["key"])), str(meta.get("library", "nccl"))
    return CollectiveTimes(label or str(folder), gpu["key"], name, ranks, library, curves)


def _read_curves(path: Path, ranks: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    points: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or tuple(reader.fieldnames) != COLUMNS:
            raise ConfigError(str(path), "<header>", f"expected columns {list(COLUMNS)}, got "
                              f"{reader.fieldnames}")  # fmt: skip
        for i, row in enumerate(reader, start=2):
            if row["mode"] != MODE:
                continue
            try:
                lb, us, n = float(row["link_bytes"]), float(row["median_us"]), int(row["ranks"])
            except ValueError:
                raise ConfigError(str(path), f"line {i}", "expected numbers in link_bytes, "
                                  "median_us and ranks") from None  # fmt: skip
            if n != ranks or not (lb > 0 and us > 0):
                raise ConfigError(str(path), f"line {i}", f"expected ranks {ranks} (meta.yaml) "
                                  "and positive link_bytes and median_us")  # fmt: skip
            points.setdefault(row["op"], []).append((lb, us * 1e-6))
    curves = {}
    for op, pts in points.items():
        pts.sort()
        xs = np.array([p[0] for p in pts])
        if len(xs) < 2 or np.any(np.diff(xs) <= 0):
            raise ConfigError(str(path), f"op {op}", "expected two or more distinct sizes")
        # a call moving more bytes never takes less: noise-level dips between sizes are
        # flattened (running maximum), so the roofline stays non-decreasing in its features
        curves[op] = (xs, np.maximum.accumulate(np.array([p[1] for p in pts])))
    return curves


class StepCollectives:
    """Seconds the collectives of one step of ``tokens`` tokens take on one GPU of a TP group:
    every collective op of the served model's op list (`ShardedModel.ops`, kind
    ``collective``), ``count`` per layer it runs in, each at the bytes its link moves
    (`collective_link_factor`), timed by ``measured`` (this GPU's table at this group size)
    when given, else estimated as ``link latency + link bytes / link bandwidth``.

    One description for every consumer: the roofline model charges these terms, and an engine
    table timed on one GPU of a TP layout (`simulator.latency.shard`) adds them to its steps.
    Invariant: non-decreasing in ``tokens`` (link bytes grow with tokens; measured curves are
    non-decreasing, the estimate linear)."""

    def __init__(self, served: ShardedModel, link: LinkSpec, measured: CollectiveTimes | None):
        if measured is not None and measured.ranks != served.tp:
            raise ValueError(f"collectives measured at {measured.ranks} ranks, not tp {served.tp}")
        self.served, self.link, self.measured = served, link, measured
        #: (op, calls per step, link factor), in op-list order
        self._calls = [
            (o, o.count * served.layers_of(o), collective_link_factor(o, served.tp))
            for o in served.ops
            if o.kind == "collective"
        ]

    def seconds(self, tokens: float) -> tuple[float, float]:
        """``(all-reduce seconds, expert-parallel seconds)`` of a step of ``tokens`` tokens,
        summed op by op in op-list order (the roofline's terms ``allreduce`` and
        ``expert_comm``)."""
        allreduce = expert = 0.0
        link, measured = self.link, self.measured
        for o, calls, factor in self._calls:
            link_bytes = factor * tokens * o.act_bytes_per_token
            if measured is not None:
                call = measured.seconds(o.name, link_bytes)
            else:
                call = link_bytes / link.bandwidth + link.latency
            if o.ep:
                expert += calls * call
            else:
                allreduce += calls * call
        return allreduce, expert

    def describe(self) -> dict:
        """What times the collectives: the measured table, or the link estimate (flagged)."""
        if self.measured is not None:
            return {"measured": self.measured.describe()}
        link = self.link
        return {
            "estimated": {
                "link": link.name,
                "bandwidth": link.bandwidth,
                "latency_s": link.latency,
            },
            "warning": f"collectives at tp {self.served.tp} estimated from the link's bandwidth "
            "and latency, not measured on this GPU at this group size",
        }


__all__ = ["OP_OF", "CollectiveTimes", "StepCollectives", "load_collectives"]
