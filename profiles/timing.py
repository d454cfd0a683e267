"""GPU timing helpers (torch imported lazily, inside functions).

How a kernel is timed, and why:

* inputs are random (``randn``), never zeros: zeros run faster on some kernels;
* small shapes rotate among several copies of their inputs (weights included) so that the
  working set exceeds the L2 cache (60 MB on H200, 50 MB on H100): a step reads its weights from
  HBM once per layer, and a repeated single buffer would measure L2 instead;
* each sample is ``iters`` back-to-back calls captured in one CUDA graph (launch gaps removed, as
  in a graph-captured engine), timed with CUDA events, divided by ``iters``; where capture fails
  the same calls are issued back to back eagerly;
* warm-up (one call per input set, one graph replay) first, so that cuBLAS handles, workspaces
  and autotuning stay out of the numbers; then ``repeats`` samples; median, p10 and p90 are kept.
"""

from __future__ import annotations

import statistics

L2_FLUSH_BYTES = 256 * 2**20


def percentile(vals: list[float], q: float) -> float:
    s = sorted(vals)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples_us: list[float]) -> dict:
    return {
        "median_us": float(statistics.median(samples_us)),
        "p10_us": float(percentile(samples_us, 0.1)),
        "p90_us": float(percentile(samples_us, 0.9)),
    }


def rotations(bytes_per_call: int, cap: int = 16) -> int:
    """How many input copies make the rotating working set exceed the L2 flush size."""
    if bytes_per_call <= 0:
        return cap
    return max(1, min(cap, -(-L2_FLUSH_BYTES // bytes_per_call)))


def time_calls(
    calls: list,
    *,
    target_ms: float = 2.0,
    max_iters: int = 64,
    repeats: int = 12,
    max_s: float = 0.4,
    use_graph: bool = True,
) -> dict:
    """Time a rotating list of zero-argument callables; returns median/p10/p90 per call (us).

    ``iters`` is chosen so one sample lasts about ``target_ms``; ``repeats`` shrinks so that the
    point costs at most about ``max_s`` seconds of GPU time.
    """
    import torch

    stream = torch.cuda.current_stream()
    for c in calls:  # warm-up, and a single-call estimate
        c()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(stream)
    for c in calls:
        c()
    e.record(stream)
    torch.cuda.synchronize()
    one_ms = max(1e-4, s.elapsed_time(e) / len(calls))
    iters = int(max(1, min(max_iters, round(target_ms / one_ms))))
    iters = max(iters, min(len(calls), max_iters))
    repeats = int(max(3, min(repeats, max_s * 1e3 / max(one_ms * iters, 1e-3))))

    def body():
        for i in range(iters):
            calls[i % len(calls)]()

    graph = None
    if use_graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                body()
            stream.wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
            graph.replay()
            torch.cuda.synchronize()
        except Exception:  # capture unsupported for this op: fall back to eager back-to-back
            graph = None
            torch.cuda.synchronize()
    run = graph.replay if graph is not None else body
    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        s.record(stream)
        run()
        e.record(stream)
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3 / iters)
    del graph
    out = summarize(samples)
    out["graph"] = use_graph and run is not body
    return out
