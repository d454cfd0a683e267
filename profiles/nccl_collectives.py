"""Time NCCL collectives between the GPUs of one host: the measured side of expert parallelism.

    python -m profiles.nccl_collectives --gpu-key h200 --out profiles/h200/nccl_x2 [--ranks 2]

On a machine with ``--ranks`` GPUs (torch with NCCL; no vLLM), one process per GPU times
``all_reduce``, ``all_gather`` (``all_gather_into_tensor``), ``reduce_scatter``
(``reduce_scatter_tensor``) and ``all_to_all`` (``all_to_all_single``) on bf16 buffers from 1 KiB
to 128 MiB, each size in rounds of ``--iters`` calls between two CUDA events on rank 0, captured
in a CUDA graph (``graph``) and launched from Python (``eager``); a barrier and a device sync
precede each round and a row is the rounds' median, p10 and p90 per call. It writes
``DIR/collectives.csv`` and ``DIR/meta.yaml``, which `simulator.latency.collectives` reads.

Each row's ``link_bytes`` is what one GPU receives over its link in that call, the quantity
`simulator.served.collective_link_factor` computes for a step's collective: ring all-reduce
``2 (n-1)/n x buffer``, all-gather ``(n-1) x input``, reduce-scatter ``(n-1)/n x input``,
all-to-all ``(n-1)/n x buffer`` (an even split). A simulated collective is charged the measured
time at its link bytes, so a table of one host answers for any model's hidden size.

Why NCCL and not vLLM's kernels: vLLM 0.24 runs expert parallelism at DP 1 through the TP
all-reduce (its custom all-reduce for small messages), and all-to-all kernels (DeepEP, pplx)
only with ``dp_size > 1`` and their own packages, which the lent machines lack. NCCL's
all-to-all is the portable baseline those kernels are compared against; the table says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = [2**p for p in range(10, 28)]  # bytes per rank's buffer: 1 KiB .. 128 MiB
WARMUP = 5
MODES = ("graph", "eager")  # see `_time_size`
ROUNDS = 7  # rounds per size: their median, p10 and p90 are the row


def link_bytes(op: str, nbytes: int, n: int) -> float:
    """Bytes one GPU receives over its link in one call on a ``nbytes`` buffer (module doc)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if op == "all_gather":
        return (n - 1) * nbytes
    return (n - 1) / n * nbytes  # reduce_scatter (input buffer), all_to_all (even split)


def _call(dist, op: str, buf, out):
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, buf)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    else:
        dist.all_to_all_single(out, buf)


def _buffers(torch, op: str, nbytes: int, n: int, dev):
    elems = nbytes // 2  # bf16
    buf = torch.randn(elems, dtype=torch.bfloat16, device=dev)
    if op == "all_gather":
        return buf, torch.empty(elems * n, dtype=torch.bfloat16, device=dev)
    if op == "reduce_scatter":
        return buf, torch.empty(elems // n, dtype=torch.bfloat16, device=dev)
    return buf, torch.empty_like(buf)


def _time_size(torch, dist, op: str, nbytes: int, n: int, iters: int, dev, graph: bool):
    """Microseconds per call of ``op`` on one size, one figure per round of ``iters`` calls
    between two CUDA events on rank 0. ``graph``: the calls captured in one CUDA graph and the
    round replays it (as vLLM's decode steps run, with no host launch between calls); else
    enqueued back to back from Python (as nccl-tests times them; small sizes then measure the
    host's launch rate)."""
    buf, out = _buffers(torch, op, nbytes, n, dev)
    for _ in range(WARMUP):
        _call(dist, op, buf, out)
    torch.cuda.synchronize(dev)
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                _call(dist, op, buf, out)
        run = g.replay
    else:

        def run():
            for _ in range(iters):
                _call(dist, op, buf, out)

    events = []
    for _ in range(ROUNDS):
        dist.barrier()
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize(dev)
    return [s.elapsed_time(e) * 1e3 / iters for s, e in events]


def _worker(rank: int, n: int, iters: int, out_dir: str, gpu_key: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    rows = []
    for mode in MODES:
        for op in OPS:
            for nbytes in SIZES:
                us = _time_size(torch, dist, op, nbytes, n, iters, dev, mode == "graph")
                q = statistics.quantiles(us, n=10)
                rows.append((mode, op, n, nbytes, link_bytes(op, nbytes, n),
                             statistics.median(us), q[0], q[-1]))  # fmt: skip
    if rank == 0:
        _write(Path(out_dir), rows, n, gpu_key, torch)
    dist.barrier()
    dist.destroy_process_group()


def _write(out: Path, rows: list, n: int, gpu_key: str, torch) -> None:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    lines = ["mode,op,ranks,bytes,link_bytes,median_us,p10_us,p90_us"]
    for r in rows:
        lines.append(",".join([*map(str, r[:4]), f"{r[4]:.0f}", *(f"{x:.3f}" for x in r[5:])]))
    (out / "collectives.csv").write_text("\n".join(lines) + "\n")
    meta = {
        "schema_version": 1,
        "kind": "collectives",
        "library": "nccl",
        "nccl_version": ".".join(str(x) for x in torch.cuda.nccl.version()),
        "torch_version": str(torch.__version__),
        "gpu": {"key": gpu_key, "name": torch.cuda.get_device_name(0), "count": n},
        "dtype": "bfloat16",
        "timing": f"CUDA events on rank 0 around {ROUNDS} rounds of back-to-back calls per size "
        "(mode graph: captured in one CUDA graph; eager: launched from Python)",
        "env": {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "NCCL_ALGO") if k in os.environ},
    }
    (out / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-key", required=True, help="the GPU's catalog key (e.g. h200)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=40)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(a.ranks, a.iters, a.out, a.gpu_key), nprocs=a.ranks, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
