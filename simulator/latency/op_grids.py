"""Interpolation grids built once from a profiled op table, for `ProfileLatencyModel`'s hot path.

A table (`simulator.latency.table`) holds measured points: per-op times over token counts,
decode attention over (batch, total context, spread), padded decode-graph attention, prefill
attention over (sequences, chunk, context before) and all-reduce over tokens. The functions here
turn them into the dense grids `simulator.latency.profiled` reads with bisect and float
arithmetic only:

* `token_grids`: the per-step linear part (GEMMs, norms, rotary, SiLU-mul per layer, times the
  layers, plus embedding and final norm) and the LM head + sampler part, over one token grid;
* `decode_grids` / `DecodeGrid`: decode attention on a (batch, mean context) grid per context
  spread (lognormal rows and, where measured, equal-context rows);
* `padded_columns`: padded decode-graph attention per real batch, at both spreads;
* `prefill_cube`: prefill attention on the (sequences, chunk, context before) cube;
* `allreduce_series`: all-reduce time over tokens, measured or estimated with a ring formula;
* `wave_shape` / `waves`, `piecewise_sizes`: what meta.yaml says about the GPU's SMs, the heads
  per GPU and the piecewise CUDA-graph sizes of the whole steps.

Invariants: every grid is projected onto a monotone one before use (cumulative max along each
axis, which only lifts dips; decode is kept on a (batch, mean context) grid); the padded columns
never exceed the unpadded column at their capture size. Nothing here runs per simulated step.
"""

from __future__ import annotations

import math

from simulator.errors import ConfigError
from simulator.latency.interp import cummax, fill_nan, interp1, locate
from simulator.latency.table import CAPTURE_SIZES, GEMM_OPS, Table
from simulator.models import ModelSpec
from simulator.precision import ACT_DTYPE, DTYPE_BYTES
from simulator.served import ShardedModel

LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
# elementwise ops run per layer, with their count per layer
LAYER_ELEMENTWISE = (("rmsnorm", 2), ("rotary", 1), ("silu_mul", 1))
# default ring all-reduce estimate when allreduce.csv lacks the TP degree
DEFAULT_AR_BUS_GBPS = 300.0
DEFAULT_AR_LATENCY_US = 12.0
# query rows per FlashAttention-2 forward CTA at head_dim 128; the prefill tables step where
# seqs * ceil(chunk / 128) * heads crosses a multiple of the SM count (profiles/README.md)
ATTN_Q_TILE = 128
# mean decode contexts (keys per sequence) of the decode grids: powers of two up to 1M
DECODE_MEAN_CTX = tuple(float(2**i) for i in range(0, 21))
# the CUDA-graph batch a decode of n sequences runs at (index n; n above the largest capture
# size runs eagerly, unpadded)
_GRAPH_BATCH = [0] + [
    next(c for c in CAPTURE_SIZES if c >= b) for b in range(1, CAPTURE_SIZES[-1] + 1)
]


def graph_batch(n: int) -> int:
    """Batch a decode-only step of ``n`` sequences runs at: the next capture size, or ``n``."""
    return _GRAPH_BATCH[n] if n < len(_GRAPH_BATCH) else n


def _series(table: Table, name: str, op: str) -> tuple[list[float], list[float]]:
    """(tokens, seconds) of one op in one CSV, lifted to a non-decreasing series."""
    pts: dict[float, float] = {}
    for r in table.rows[name]:
        if r["op"] == op:
            pts[r["tokens"]] = r["median_us"] * 1e-6
    xs = sorted(pts)
    return xs, cummax([pts[x] for x in xs])


def token_grids(table: Table, layers: int, where: str, warn) -> tuple[list, list, list]:
    """(token grid, linear part, head part): dense 1-D tables over tokens of one step's linear
    ops (GEMMs, norms, rotary, SiLU-mul per layer times ``layers``, plus embedding and final
    norm) and of its LM head + sampler. ``warn(msg)`` records ops the table lacks (counted 0)."""
    grid: set[float] = set()
    series = {}
    for op in GEMM_OPS:
        series[op] = _series(table, "gemm.csv", op)
        grid.update(series[op][0])
    for op in ("rmsnorm", "rotary", "silu_mul", "embed", "sampling"):
        xs, ys = _series(table, "elementwise.csv", op)
        if xs:
            series[op] = (xs, ys)
            grid.update(xs)
        elif op in ("rotary", "embed", "sampling"):
            warn(f"elementwise.csv has no {op!r} rows; counted as 0")
    if not grid:
        raise ConfigError(where, "tokens", "no token grid")
    xs = sorted(grid)
    lin, head = [], []
    for t in xs:
        per_layer = sum(interp1(*series[op], t) for op in LAYER_GEMMS)
        for op, count in LAYER_ELEMENTWISE:
            if op in series:
                per_layer += count * interp1(*series[op], t)
        total = layers * per_layer
        total += interp1(*series["rmsnorm"], t)  # final norm
        if "embed" in series:
            total += interp1(*series["embed"], t)
        lin.append(total)
        h = interp1(*series["lm_head"], t)
        if "sampling" in series:
            h += interp1(*series["sampling"], t)
        head.append(h)
    return xs, cummax(lin), cummax(head)


def decode_grids(table: Table, where: str) -> tuple[DecodeGrid, DecodeGrid | None, float]:
    """(lognormal-spread grid, equal-context grid or None, largest measured total context) of
    the non-causal decode rows, on the (batch B, mean context m = K / B) grid.

    Measured on (B, total context K); resampled at fixed m (linear in K at fixed B, linear
    extrapolation past the largest K, clamp below the smallest), then lifted by cumulative
    max along m and along B. At fixed B that is monotone in K; at fixed mean context it is
    monotone in B (the kernel's wave quantization makes some batch sizes measure faster than
    smaller ones; the projection removes those dips). The equal-context grid exists when the
    table has equal-context rows at batch >= 2 (one sequence has no spread).
    """
    rows = [r for r in table.rows["attn_decode.csv"] if r["causal"] == 0]
    if not rows:
        raise ConfigError(where, "causal", "no non-causal decode rows")
    pts: dict[tuple[float, float], float] = {}
    even: dict[tuple[float, float], float] = {}
    for r in rows:
        key = (r["batch"], r["total_ctx"])
        if r["uneven"] or r["batch"] <= 1:  # one sequence has no spread
            pts[key] = r["median_us"] * 1e-6
        if not r["uneven"]:
            even[key] = r["median_us"] * 1e-6
    ms = list(DECODE_MEAN_CTX)
    bs, grid = _decode_columns(pts, ms)
    lognormal = DecodeGrid(bs, ms, grid)
    equal = None
    if any(b >= 2 for b, _ in even):
        eb, eg = _decode_columns(even, ms)
        equal = DecodeGrid(eb, ms, eg)
    kmax_all = max(max(k for (bb, k) in pts if bb == b) for b in lognormal.bs)
    return lognormal, equal, kmax_all


def _decode_columns(pts: dict[tuple[float, float], float], ms: list[float]):
    """(batches, columns) of decode times {(batch, total context): s} on the mean-context grid
    ``ms``: linear in total context at fixed batch (clamped below the smallest, extrapolated
    linearly past the largest), lifted by cumulative max along the mean context and along the
    batch."""
    bs = sorted({b for b, _ in pts})
    grid = []
    for b in bs:
        ks = sorted(k for (bb, k) in pts if bb == b)
        vs = cummax([pts[(b, k)] for k in ks])
        col = []
        for m in ms:
            k = b * m
            if len(ks) == 1 or k <= ks[0]:
                col.append(vs[0])
                continue
            i, w, _ = locate(ks, k)
            col.append(vs[i] + (vs[i + 1] - vs[i]) * w)
        grid.append(cummax(col))
    for j in range(len(ms)):
        colb = cummax([grid[i][j] for i in range(len(bs))])
        for i in range(len(bs)):
            grid[i][j] = colb[i]
    return bs, grid


class DecodeGrid:
    """Decode attention of one spread on a (batch, mean context) grid (`decode_grids`): linear
    in mean context; between two grid batches geometric in batch; beyond the last one
    proportional to batch. The batch-dependent part is memoized per batch (the hot path sees
    few distinct batches).

    ``bs`` ascending batches, ``ms`` ascending mean contexts, ``grid[i]`` the column at
    ``bs[i]`` (one value per ``ms``), non-decreasing along both axes."""

    __slots__ = ("bs", "ms", "grid", "memo")

    def __init__(self, bs: list[float], ms: list[float], grid: list[list[float]]):
        self.bs, self.ms, self.grid = bs, ms, grid
        self.memo: dict[float, tuple] = {}

    def coeffs(self, b: float) -> tuple:
        """(kind, column below, column above, exponent or factor): kind 0 = one column, 1 =
        beyond the last grid batch (factor b / b_last), 2 = geometric blend."""
        bs, g = self.bs, self.grid
        if b <= bs[0] or len(bs) == 1:
            return (0, g[0], None, 0.0)
        i, _, _ = locate(bs, b)
        b0, b1 = bs[i], bs[i + 1]
        if b >= b1:
            return (1, g[i], g[i + 1], b / b1)
        if b <= b0:
            return (0, g[i], None, 0.0)
        return (2, g[i], g[i + 1], math.log(b / b0) / math.log(b1 / b0))

    def time(self, b: float, k: float) -> float:
        """One layer's decode attention for b sequences holding k keys in total."""
        j, wm, _ = locate(self.ms, k / b)
        return self.time_at(b, j, wm)

    def time_at(self, b: float, j: int, wm: float) -> float:
        """`time` with the mean context already located on ``ms`` (index j, weight wm)."""
        c = self.memo.get(b)
        if c is None:
            c = self.memo[b] = self.coeffs(b)
        return value_at(c, j, wm)

    def memo_coeffs(self, b: float) -> tuple:
        """`coeffs` of batch b, memoized (what `time_at` uses)."""
        c = self.memo.get(b)
        if c is None:
            c = self.memo[b] = self.coeffs(b)
        return c


def value_at(c: tuple, j: int, wm: float) -> float:
    """A `DecodeGrid`'s value for the batch whose `DecodeGrid.coeffs` are ``c``, at the mean
    context located on its ``ms`` (index j, weight wm)."""
    kind, lo_c, hi_c, e = c
    lo = lo_c[j] + (lo_c[j + 1] - lo_c[j]) * wm
    if kind == 0:
        return lo
    hi = hi_c[j] + (hi_c[j + 1] - hi_c[j]) * wm
    if kind == 1:
        return hi * e
    if lo <= 0.0:
        return lo
    return lo * (hi / lo) ** e


def padded_columns(rows: list[dict], lognormal: DecodeGrid, equal: DecodeGrid | None) -> dict:
    """Padded decode-graph attention per real batch b (``attn_decode_padded.csv`` rows), at
    both spreads: ``{b: (lognormal column, equal column or None)}`` on the mean-context grid,
    for every b whose capture size has measured rows (empty without rows).

    Between measured batches of one capture size t the columns are linear in b, ending at
    the unpadded column at t (b = t: no padding). Each spread is lifted by cumulative max
    along mean context and batch (`_decode_columns`), then capped at the unpadded column at t
    (b real sequences and t - b one-token dummies never hold more keys than t real
    sequences of the same mean): non-decreasing in b within a capture size. Capture sizes
    without rows keep the model's fitted-weight estimate (`ProfileLatencyModel.ops_time`).
    """
    if not rows:
        return {}
    dense: dict[int, list] = {}
    for uneven, unpadded in ((1, lognormal), (0, equal)):
        pts = {
            (r["batch"], r["total_ctx"]): r["median_us"] * 1e-6
            for r in rows
            if r["uneven"] == uneven
        }
        if not pts or unpadded is None:
            continue
        bs, grid = _decode_columns(pts, lognormal.ms)
        by_t: dict[int, list[tuple[int, list]]] = {}
        for b, col in zip(bs, grid, strict=True):
            by_t.setdefault(graph_batch(int(b)), []).append((int(b), col))
        for t, anchors in by_t.items():
            if t not in unpadded.bs:
                continue
            top = unpadded.grid[unpadded.bs.index(t)]
            anchors.append((t, top))
            for b in range(anchors[0][0], t):
                dense.setdefault(b, [None, None])[uneven] = _between_anchors(anchors, b, top)
    return {b: (c[1], c[0]) for b, c in dense.items() if c[1] is not None}


def _between_anchors(anchors: list[tuple[int, list]], b: int, top: list[float]) -> list[float]:
    """The column at batch b, linear between the measured anchor batches around it (ascending
    ``anchors``, the first at or below b), capped elementwise at ``top``."""
    i = max(i for i, (ba, _) in enumerate(anchors) if ba <= b)
    (b0, c0), (b1, c1) = anchors[i], anchors[min(i + 1, len(anchors) - 1)]
    w = (b - b0) / (b1 - b0) if b1 > b0 else 0.0
    return [min(x + (y - x) * w, cap) for x, y, cap in zip(c0, c1, top, strict=True)]


def prefill_cube(table: Table) -> tuple[list, list, list, list]:
    """(seqs, chunks, contexts before, cube[seqs][chunk][context]) of one layer's causal
    prefill attention, gap-filled and monotone along every axis.

    Gaps (shapes beyond the profiled token budget) are filled from the nearest measured point
    along the context, then along the chunk and the number of sequences scaled by their ratio
    (work is proportional there); then cumulative max along every axis, three passes (it
    converges in a pass or two)."""
    rows = table.rows["attn_prefill.csv"]
    ss = sorted({r["seqs"] for r in rows})
    cs = sorted({r["chunk"] for r in rows})
    bs = sorted({r["context_before"] for r in rows})
    pts = {(r["seqs"], r["chunk"], r["context_before"]): r["median_us"] * 1e-6 for r in rows}
    cube = [[[pts.get((s, c, b), math.nan) for b in bs] for c in cs] for s in ss]
    dims = (len(ss), len(cs), len(bs))
    _map_lines(cube, dims, 2, lambda v: fill_nan(v, xs=bs))
    _map_lines(cube, dims, 1, lambda v: fill_nan(v, xs=cs, scale=True))
    _map_lines(cube, dims, 0, lambda v: fill_nan(v, xs=ss, scale=True))
    for _ in range(3):
        for axis in (2, 1, 0):
            _map_lines(cube, dims, axis, cummax)
    return ss, cs, bs, cube


def _map_lines(cube: list, dims: tuple[int, int, int], axis: int, f) -> None:
    """Replace every line of the 3-D ``cube`` along ``axis`` (0: seqs, 1: chunk, 2: context)
    by ``f(line)``, in place."""
    ns, nc, nb = dims
    if axis == 2:
        for i in range(ns):
            for j in range(nc):
                cube[i][j] = f(cube[i][j])
    elif axis == 1:
        for i in range(ns):
            for m in range(nb):
                col = f([cube[i][j][m] for j in range(nc)])
                for j in range(nc):
                    cube[i][j][m] = col[j]
    else:
        for j in range(nc):
            for m in range(nb):
                col = f([cube[i][j][m] for i in range(ns)])
                for i in range(ns):
                    cube[i][j][m] = col[i]


def waves(s: float, c: float, heads: int, sms: int) -> int:
    """Waves of FlashAttention query-tile CTAs over the SMs for s chunks of c tokens."""
    return -(-int(s * -(-c // ATTN_Q_TILE) * heads) // sms)


def wave_shape(table: Table, model_spec, tp: int, meta_path: str, warn) -> tuple[int, int]:
    """(query heads per GPU, SM count) for the wave-aware chunk interpolation, or (0, 0) when
    meta.yaml lacks either (then said once through ``warn``)."""
    shapes = table.meta.get("per_gpu_shapes") or {}
    gpu = table.meta.get("gpu") or {}
    try:
        heads = int(shapes.get("heads") or _heads_per_gpu(model_spec, tp))
        sms = int(gpu.get("sm_count") or 0)
    except (TypeError, ValueError):
        raise ConfigError(
            meta_path, "gpu.sm_count / per_gpu_shapes.heads", "expected integers"
        ) from None
    if heads <= 0 or sms <= 0:
        warn(
            "meta.yaml lacks gpu.sm_count or per_gpu_shapes.heads: prefill chunks are "
            "interpolated smoothly, without FlashAttention's wave steps"
        )
        return 0, 0
    return heads, sms


def _heads_per_gpu(model_spec, tp: int) -> int:
    """Query heads per GPU from the served model's description (0 for the shape-less stand-in
    `load_for_report` builds from a table's meta)."""
    return ShardedModel(model_spec, tp).heads if isinstance(model_spec, ModelSpec) else 0


def piecewise_sizes(table: Table, meta_path: str) -> list[int]:
    """Token counts the whole steps' piecewise graphs were captured for (empty: the mixed
    steps ran eagerly or as whole graphs, at their exact token count)."""
    runner = table.meta.get("step_runner") or {}
    sizes = runner.get("piecewise_sizes") if runner.get("mixed_mode") == "piecewise" else None
    if sizes is None:
        return []
    ok = isinstance(sizes, list) and sizes and all(isinstance(x, int) and x > 0 for x in sizes)
    if not ok or sizes != sorted(set(sizes)):
        raise ConfigError(
            meta_path,
            "step_runner.piecewise_sizes",
            f"expected an ascending list of positive token counts, got {sizes!r}",
        )
    return sizes


def allreduce_series(table: Table, tp: int, model_spec, warn) -> tuple[list, list, str]:
    """(tokens, seconds of one all-reduce, source) at ``tp``: measured rows of allreduce.csv,
    else a ring estimate from meta.yaml's ``allreduce_estimate`` (or the defaults above), said
    once through ``warn``. Empty series at tp=1."""
    if tp == 1:
        return [], [], "none (tp=1)"
    rows = [r for r in table.rows["allreduce.csv"] if int(r["tp"]) == tp]
    if rows:
        pts = {r["tokens"]: r["median_us"] * 1e-6 for r in rows}
        tok = sorted(pts)
        return tok, cummax([pts[t] for t in tok]), "measured"
    est = table.meta.get("allreduce_estimate") or {}
    bw = float(est.get("bus_gbps", DEFAULT_AR_BUS_GBPS)) * 1e9
    lat = float(est.get("latency_us", DEFAULT_AR_LATENCY_US)) * 1e-6
    hidden = int(table.meta["model"].get("hidden_size", model_spec.hidden_size))
    tok = [1.0, 1e6]
    act = DTYPE_BYTES[ACT_DTYPE]
    ar = [lat + 2 * (tp - 1) / tp * t * hidden * act / bw for t in tok]
    warn(
        f"all-reduce for tp={tp} not measured: estimated with a ring formula "
        f"({bw / 1e9:.0f} GB/s bus bandwidth, {lat * 1e6:.0f} us latency)"
    )
    return tok, ar, f"estimated (ring, {bw / 1e9:.0f} GB/s bus, {lat * 1e6:.0f} us)"
