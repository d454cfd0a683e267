"""Step latency from GPU-profiled op tables, calibrated on measured whole steps.

`ProfileLatencyModel` sums per-op times read from a table directory (see
``simulator/latency/table.py`` for the format), then applies a small calibration fitted ONLY on
the whole steps whose ``split`` is ``train``; the ``test`` steps give the published held-out error.

Step time (seconds) = ``base + mixed * [prefill_tokens > 0] + gamma * ops + allreduce``, with

* ``ops`` = ``lin(T)`` + ``head(R)`` + ``L * attn_decode(B, K)`` + ``L * attn_prefill(s, T_p, A)``
  where ``T = prefill_tokens + decode_seqs`` (tokens through the GEMMs), ``R = prefill_seqs +
  decode_seqs`` (rows through the LM head and sampler), ``L`` the number of layers;
* ``lin(T)`` = per layer (qkv, o, gate_up, down GEMMs, 2 RMSNorms, rotary, SiLU-mul) times L,
  plus embedding and final norm: piecewise-linear in T over the profiled token grid;
* ``attn_decode`` = FlashAttention decode (query length 1, not causal) per layer, on a
  (batch B, mean context K / B) grid: linear in mean context, log-log in B; for decode-only
  steps the larger of the value at B and the padded-graph call at B: B real sequences plus
  t - B one-token dummies up to the capture size t, as the runner's graph runs them, measured
  in ``attn_decode_padded.csv`` at both spreads (`_build_padded`). Tables without those rows
  (or a capture size without them) use ``(1 - w) table(t, K) + w table(t, K t / B)`` instead,
  w fitted on train steps (``describe()['fit']['padded_decode_weight']``): w = 0 says the
  dummies cost nothing, w = 1 that each costs like a real sequence of the mean context;
* ``attn_prefill`` = causal FlashAttention over prompt chunks per layer, looked up at the mean
  chunk ``T_p / s`` and mean cached context ``A / T_p - (chunk + 1) / 2``: linear in context,
  log-log in number of sequences, and in chunk length linear in ``waves * (context + chunk)``
  with ``waves = ceil(s * ceil(chunk / 128) * heads / SMs)`` (the kernel's time steps with
  waves of 128-row query tiles over the SMs; see ``_prefill_time``);
* ``allreduce`` = 2 per layer at T tokens, from ``allreduce.csv`` when measured, else a ring
  estimate (said in ``describe()['warnings']``).

Decode attention and the spread of contexts: torch 2.11's varlen_attn takes no block table and
no split-KV setting, and a decode call lasts about as long as its longest sequence takes (its
kernel time jumps with batch size and ``max_k``). The ``uneven=1`` rows hold contexts at fixed
lognormal (sigma 0.8) quantiles (`simulator.latency.table.uneven_weights`), the ``uneven=0`` rows
equal
contexts. Given the step's longest decode context (``decode_max``), decode attention is linear
in it between the equal-context value (longest = mean) and the lognormal one, extrapolated up to
``SPREAD_EXTRAP`` gaps beyond and held there (`_decode_time`); without it (``decode_max`` 0, or a
table without equal-context rows) the lognormal spread is assumed. Measured padded calls are
placed between their own two spreads the same way (the fitted-weight estimate is scaled by the
unpadded factor). Whole-step calibration rows carry their own ``decode_max`` (lognormal and
near-equal spreads; older tables without the column ran the lognormal spread).

Calibration (fitted on train steps only, to each step's host wall-clock median where steps.csv
has it, else its GPU time: ``step_clock``; see ``WALL_PREFIX``): ``base`` (every step),
``mixed`` (eager steps, i.e. any prefill), ``gamma`` (scale on the op sum), the padded-graph
decode weight ``w`` (searched on a 0..1 grid in steps of 0.1 when a train decode step is padded
at a batch without measured padded rows; else 0), and an eager floor: an eager step can't be
faster than the Python launch time of its forward (fitted separately for prefill-only steps and
for steps with two attention calls a layer).
Decode-only steps are modeled as the runner executes them: padded to the next CUDA-graph
capture size. Mixed steps of a table whose whole steps ran as piecewise CUDA graphs (meta.yaml
``step_runner.mixed_mode: piecewise``, the default since session 3) run their GEMMs, norms and
all-reduces at the token count padded to the next of ``step_runner.piecewise_sizes`` (attention
and sampling at the real shapes); their "eager floor" is then the launch time of the pieces and
the eager attention calls, much lower than an eager forward's.

Invariants: ``base``, ``mixed``, ``gamma`` >= 0 (non-negative least squares); every op table is
projected onto a monotone one before use (cumulative max along each axis, which only lifts
dips; decode is kept on a (batch, mean context) grid). The result is non-decreasing in
``prefill_attn`` and ``decode_ctx``; in ``prefill_tokens`` and ``prefill_seqs`` when the chunks
grow or are added with their attention pairs; in ``decode_seqs`` when the added sequence holds
at least the mean context. Not in the unphysical directions: adding sequences while holding
the total context fixed shortens the longest sequence and the decode kernel gets faster, and
adding prompt tokens at fixed causal pairs lets a chunk fill the kernel's query tiles better.

Hot path: `step_time` uses only bisect on Python lists and float arithmetic (a few microseconds);
no numpy, no allocation beyond floats. This module never imports torch.
"""

from __future__ import annotations

import math
import os
import warnings
from bisect import bisect_left, bisect_right

from simulator.errors import ConfigError
from simulator.latency.table import CAPTURE_SIZES, GEMM_OPS, Table, load_table, uneven_weights
from simulator.models import ModelSpec
from simulator.precision import ACT_DTYPE, DTYPE_BYTES
from simulator.served import ShardedModel

LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
# elementwise ops run per layer, with their count per layer
LAYER_ELEMENTWISE = (("rmsnorm", 2), ("rotary", 1), ("silu_mul", 1))
# default ring all-reduce estimate when allreduce.csv lacks the TP degree
DEFAULT_AR_BUS_GBPS = 300.0
DEFAULT_AR_LATENCY_US = 12.0
# how far past the lognormal rows' longest context the spread interpolation extrapolates (in
# units of the gap between equal and lognormal contexts); beyond it the value is held
SPREAD_EXTRAP = 2.0
# candidate weights of the padded-graph decode term (see ``ops_time``), searched on train steps
PAD_WEIGHT_GRID = tuple(i / 10 for i in range(11))
# query rows per FlashAttention-2 forward CTA at head_dim 128; the prefill tables step where
# seqs * ceil(chunk / 128) * heads crosses a multiple of the SM count (profiles/README.md)
ATTN_Q_TILE = 128
# which statistic of a whole step's samples the model is fitted to and judged against: the
# median, which is what a step costs in a real run (issue 6's real runs include the host's noise
# too). Eager steps are bound by the CPU's launch speed and CPU contention only ever adds time
# (on the lent H200 a 14 ms step ran 13.3-14.1 ms quiet and 25-33 ms in contention bursts), so
# the held-out error is also reported against the steps' p10, the uncontended view. Fitting to
# the p10 instead was tried: held-out p95 fell (e.g. H100 Llama-3-8B 31.6% -> 10.8%) but the
# end-to-end validation against real runs got worse (median 4.8% -> 5.3%, max 31% -> 52%).
STEP_STAT = "median_us"
# which clock: a step's WALL time (host work + GPU, ``wall_*_us`` columns, profiled since
# session 4) where every steps.csv row has it, else its GPU time (CUDA events, ``*_us``). Wall
# time is what a synchronous engine's step costs and what advances the clock of issue 6's real
# runs: the input preparation and launch before the GPU starts (0.1-0.4 ms a step) is in it;
# fitted on GPU time alone the model ran 3-5% fast on every real decode step.
WALL_PREFIX = "wall_"


# ---- small interpolation helpers (pure Python; used at build time and in the hot path) -------


def _locate(xs: list[float], x: float) -> tuple[int, float, bool]:
    """Index i and weight w with x ~ xs[i] + w (xs[i+1]-xs[i]); out=True when x is off the grid.

    Below the grid w is clamped to 0 (callers clamp, which overestimates tiny work); above the
    grid w > 1 extrapolates linearly along the last segment.
    """
    n = len(xs)
    if n == 1:
        return 0, 0.0, x > xs[0]
    i = bisect_right(xs, x) - 1
    if i < 0:
        return 0, 0.0, False
    if i >= n - 1:
        i = n - 2
        w = (x - xs[i]) / (xs[i + 1] - xs[i])
        return i, w, w > 1.0
    return i, (x - xs[i]) / (xs[i + 1] - xs[i]), False


def _lerp(a: float, b: float, w: float) -> float:
    return a + (b - a) * w


def _loglerp(a: float, b: float, xa: float, xb: float, x: float) -> float:
    """Power-law interpolation between (xa, a) and (xb, b); exact for t ~ x^p."""
    if a <= 0.0 or b <= 0.0 or x <= xa:
        return a if x <= xa else _lerp(a, b, (x - xa) / (xb - xa))
    p = math.log(b / a) / math.log(xb / xa)
    return a * (x / xa) ** p


def _cummax(vals: list[float]) -> list[float]:
    out, m = [], -math.inf
    for v in vals:
        m = max(m, v)
        out.append(m)
    return out


def _interp1(xs: list[float], ys: list[float], x: float) -> float:
    i, w, _ = _locate(xs, x)
    if len(xs) == 1:
        return ys[0]
    return max(0.0, _lerp(ys[i], ys[i + 1], w))


# ---- the model ---------------------------------------------------------------------------------


class ProfileLatencyModel:
    """Step latency from a profiled table directory. See the module docstring for the formula.

    ``model_spec`` needs ``name`` and ``num_layers`` (a `simulator.models.ModelSpec`); the table
    must have been profiled for that model and ``tp``, else `ConfigError` naming meta.yaml.
    """

    def __init__(self, table_dir: str, model_spec, tp: int = 1):
        self.table_dir = table_dir
        table = load_table(table_dir)
        meta_path = os.path.join(table_dir, "meta.yaml")
        if str(table.meta["model"]["name"]).lower() != str(model_spec.name).lower():
            raise ConfigError(
                meta_path,
                "model.name",
                f"table was profiled for {table.meta['model']['name']!r}, "
                f"the experiment uses {model_spec.name!r}",
            )
        if int(table.meta["tp"]) != int(tp):
            raise ConfigError(
                meta_path, "tp", f"table was profiled for tp={table.meta['tp']}, not tp={tp}"
            )
        layers = table.meta["model"].get("num_layers", model_spec.num_layers)
        if int(layers) != int(model_spec.num_layers):
            raise ConfigError(
                meta_path,
                "model.num_layers",
                f"table has {layers} layers, model {model_spec.name} has {model_spec.num_layers}",
            )
        self.table = table
        self.tp = int(tp)
        self.layers = int(model_spec.num_layers)
        self.name = f"profile:{table.label}"
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._fixed_cache: dict[tuple[int, bool], tuple] = {}
        self._pad = [0] + [
            next(c for c in CAPTURE_SIZES if c >= b) for b in range(1, CAPTURE_SIZES[-1] + 1)
        ]
        self._build_linear()
        self._build_decode()
        self._build_prefill()
        self._heads, self._sms = self._wave_shape(table, model_spec, meta_path)
        if self._sms:
            self._pre_w = [[self._waves(sv, cv) for cv in self._pre_c] for sv in self._pre_s]
        self._build_allreduce(model_spec)
        self._pw_sizes = self._piecewise_sizes(table, meta_path)
        self.base = 0.0
        self.mixed = 0.0
        self.gamma = 1.0
        self.eager_floor = 0.0
        self.eager_floor_dec = 0.0
        self.pad_weight = 0.0
        self.fit_info: dict = {}
        self.heldout: dict = {}
        steps = table.rows["steps.csv"]
        wall = bool(steps) and all(WALL_PREFIX + STEP_STAT in r for r in steps)
        self.step_clock = "wall" if wall else "gpu"
        self._prefix = WALL_PREFIX if wall else ""
        # calibration steps may lie beyond the op grid: note that once in describe(), but do not
        # raise the per-run "batch beyond the grid" warning on behalf of the table itself
        self._fitting: set[str] | None = set()
        self.fit()
        beyond, self._fitting = self._fitting, None
        if beyond:
            self._warn_static(
                "some whole-step calibration measurements lie beyond the op grid "
                f"({', '.join(sorted(beyond))}); the model extrapolated there"
            )

    # ---- building the op tables ------------------------------------------------------------

    def _series(self, name: str, op: str) -> tuple[list[float], list[float]]:
        rows = [r for r in self.table.rows[name] if r["op"] == op]
        pts: dict[float, float] = {}
        for r in rows:
            pts[r["tokens"]] = r["median_us"] * 1e-6
        xs = sorted(pts)
        return xs, _cummax([pts[x] for x in xs])

    def _build_linear(self) -> None:
        """Dense 1-D tables over tokens: per-step linear part and the LM head + sampler part."""
        where = os.path.join(self.table_dir, "gemm.csv")
        grid: set[float] = set()
        series = {}
        for op in GEMM_OPS:
            series[op] = self._series("gemm.csv", op)
            grid.update(series[op][0])
        for op in ("rmsnorm", "rotary", "silu_mul", "embed", "sampling"):
            xs, ys = self._series("elementwise.csv", op)
            if xs:
                series[op] = (xs, ys)
                grid.update(xs)
            elif op in ("rotary", "embed", "sampling"):
                self._warn_static(f"elementwise.csv has no {op!r} rows; counted as 0")
        if not grid:
            raise ConfigError(where, "tokens", "no token grid")
        xs = sorted(grid)
        lin, head = [], []
        for t in xs:
            per_layer = sum(_interp1(*series[op], t) for op in LAYER_GEMMS)
            for op, count in LAYER_ELEMENTWISE:
                if op in series:
                    per_layer += count * _interp1(*series[op], t)
            total = self.layers * per_layer
            total += _interp1(*series["rmsnorm"], t)  # final norm
            if "embed" in series:
                total += _interp1(*series["embed"], t)
            lin.append(total)
            h = _interp1(*series["lm_head"], t)
            if "sampling" in series:
                h += _interp1(*series["sampling"], t)
            head.append(h)
        self._tok = xs
        self._lin = _cummax(lin)
        self._head = _cummax(head)
        self._tok_max = xs[-1]

    def _build_decode(self) -> None:
        """Decode table on a (batch B, mean context m = K / B) grid, monotone along both.

        Measured on (B, total context K); resampled at fixed m (linear in K at fixed B, linear
        extrapolation past the largest K, clamp below the smallest), then lifted by cumulative
        max along m and along B. At fixed B that is monotone in K; at fixed mean context it is
        monotone in B (the kernel's wave quantization makes some batch sizes measure faster than
        smaller ones; the projection removes those dips).
        """
        where = os.path.join(self.table_dir, "attn_decode.csv")
        rows = [r for r in self.table.rows["attn_decode.csv"] if r["causal"] == 0]
        if not rows:
            raise ConfigError(where, "causal", "no non-causal decode rows")
        # the lognormal-spread grid: uneven contexts (what real batches have; batch 1 only has
        # even ones); and, where measured, the equal-context grid for batch >= 2
        pts: dict[tuple[float, float], float] = {}
        even: dict[tuple[float, float], float] = {}
        for r in rows:
            key = (r["batch"], r["total_ctx"])
            if r["uneven"] or r["batch"] <= 1:  # one sequence has no spread
                pts[key] = r["median_us"] * 1e-6
            if not r["uneven"]:
                even[key] = r["median_us"] * 1e-6
        ms = [float(2**i) for i in range(0, 21)]
        bs, grid = _decode_grid(pts, ms)
        self._dec_b, self._dec_m, self._dec = bs, ms, grid
        self._dec_grid = _DecodeGrid(bs, ms, grid)
        self._dec_even = None
        if any(b >= 2 for b, _ in even):
            eb, eg = _decode_grid(even, ms)
            self._dec_even = _DecodeGrid(eb, ms, eg)
        self._spread: dict[float, float] = {}
        self._dec_kmax = {b: max(k for (bb, k) in pts if bb == b) for b in bs}
        self._dec_kmax_all = max(self._dec_kmax.values())
        self._build_padded()

    def _build_padded(self) -> None:
        """Padded decode-graph attention per real batch b (``attn_decode_padded.csv``), at
        both spreads: ``self._pad_cols[b] = (lognormal column, equal column or None)`` on the
        mean-context grid, for every b whose capture size has measured rows.

        Between measured batches of one capture size t the columns are linear in b, ending at
        the unpadded column at t (b = t: no padding). Each spread is lifted by cumulative max
        along mean context and batch (`_decode_grid`), then capped at the unpadded column at t
        (b real sequences and t - b one-token dummies never hold more keys than t real
        sequences of the same mean): non-decreasing in b within a capture size. Capture sizes
        without rows keep the fitted-weight estimate (`ops_time`).
        """
        self._pad_cols: dict[int, tuple] = {}
        rows = self.table.rows.get("attn_decode_padded.csv") or []
        if not rows:
            return
        ms = self._dec_m
        dense: dict[int, list] = {}
        for uneven, unpadded in ((1, self._dec_grid), (0, self._dec_even)):
            pts = {
                (r["batch"], r["total_ctx"]): r["median_us"] * 1e-6
                for r in rows
                if r["uneven"] == uneven
            }
            if not pts or unpadded is None:
                continue
            bs, grid = _decode_grid(pts, ms)
            by_t: dict[int, list[tuple[int, list]]] = {}
            for b, col in zip(bs, grid, strict=True):
                by_t.setdefault(self._pad_of(int(b)), []).append((int(b), col))
            for t, anchors in by_t.items():
                if t not in unpadded.bs:
                    continue
                top = unpadded.grid[unpadded.bs.index(t)]
                anchors.append((t, top))
                for b in range(anchors[0][0], t):
                    i = max(i for i, (ba, _) in enumerate(anchors) if ba <= b)
                    (b0, c0), (b1, c1) = anchors[i], anchors[min(i + 1, len(anchors) - 1)]
                    w = (b - b0) / (b1 - b0) if b1 > b0 else 0.0
                    col = [min(x + (y - x) * w, cap) for x, y, cap in zip(c0, c1, top, strict=True)]
                    dense.setdefault(b, [None, None])[uneven] = col
        self._pad_cols = {b: (c[1], c[0]) for b, c in dense.items() if c[1] is not None}

    def _build_prefill(self) -> None:
        rows = self.table.rows["attn_prefill.csv"]
        ss = sorted({r["seqs"] for r in rows})
        cs = sorted({r["chunk"] for r in rows})
        bs = sorted({r["context_before"] for r in rows})
        pts = {(r["seqs"], r["chunk"], r["context_before"]): r["median_us"] * 1e-6 for r in rows}
        cube = [[[pts.get((s, c, b), math.nan) for b in bs] for c in cs] for s in ss]
        # fill gaps (shapes beyond the profiled token budget) by scaling the nearest measured
        # point along s, then c (work is proportional there), then b
        for i in range(len(ss)):
            for j in range(len(cs)):
                cube[i][j] = _fill_nan(cube[i][j], xs=bs)
        for i in range(len(ss)):
            for m in range(len(bs)):
                col = _fill_nan([cube[i][j][m] for j in range(len(cs))], xs=cs, scale=True)
                for j in range(len(cs)):
                    cube[i][j][m] = col[j]
        for j in range(len(cs)):
            for m in range(len(bs)):
                col = _fill_nan([cube[i][j][m] for i in range(len(ss))], xs=ss, scale=True)
                for i in range(len(ss)):
                    cube[i][j][m] = col[i]
        for _ in range(3):  # cumulative max along every axis (converges in a pass or two)
            for i in range(len(ss)):
                for j in range(len(cs)):
                    cube[i][j] = _cummax(cube[i][j])
            for i in range(len(ss)):
                for m in range(len(bs)):
                    col = _cummax([cube[i][j][m] for j in range(len(cs))])
                    for j in range(len(cs)):
                        cube[i][j][m] = col[j]
            for j in range(len(cs)):
                for m in range(len(bs)):
                    col = _cummax([cube[i][j][m] for i in range(len(ss))])
                    for i in range(len(ss)):
                        cube[i][j][m] = col[i]
        self._pre_s, self._pre_c, self._pre_b, self._pre = ss, cs, bs, cube

    def _wave_shape(self, table: Table, model_spec, meta_path: str) -> tuple[int, int]:
        """(query heads per GPU, SM count) for the wave-aware chunk interpolation, or (0, 0)."""
        shapes = table.meta.get("per_gpu_shapes") or {}
        gpu = table.meta.get("gpu") or {}
        try:
            heads = int(shapes.get("heads") or _heads_per_gpu(model_spec, self.tp))
            sms = int(gpu.get("sm_count") or 0)
        except (TypeError, ValueError):
            raise ConfigError(
                meta_path, "gpu.sm_count / per_gpu_shapes.heads", "expected integers"
            ) from None
        if heads <= 0 or sms <= 0:
            self._warn_static(
                "meta.yaml lacks gpu.sm_count or per_gpu_shapes.heads: prefill chunks are "
                "interpolated smoothly, without FlashAttention's wave steps"
            )
            return 0, 0
        return heads, sms

    @staticmethod
    def _piecewise_sizes(table: Table, meta_path: str) -> list[int]:
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

    def _piecewise_tokens(self, t: int) -> int:
        """Tokens a mixed step's GEMMs run at: padded up to the next piecewise capture size (the
        runner pads as vLLM does), or ``t`` itself above the largest size (eager)."""
        sizes = self._pw_sizes
        if not sizes or t > sizes[-1]:
            return t
        return sizes[bisect_left(sizes, t)]

    def _build_allreduce(self, model_spec) -> None:
        self._ar_tok: list[float] = []
        self._ar: list[float] = []
        self.allreduce_source = "none (tp=1)"
        if self.tp == 1:
            return
        rows = [r for r in self.table.rows["allreduce.csv"] if int(r["tp"]) == self.tp]
        if rows:
            pts = {r["tokens"]: r["median_us"] * 1e-6 for r in rows}
            self._ar_tok = sorted(pts)
            self._ar = _cummax([pts[t] for t in self._ar_tok])
            self.allreduce_source = "measured"
            return
        est = self.table.meta.get("allreduce_estimate") or {}
        bw = float(est.get("bus_gbps", DEFAULT_AR_BUS_GBPS)) * 1e9
        lat = float(est.get("latency_us", DEFAULT_AR_LATENCY_US)) * 1e-6
        hidden = int(self.table.meta["model"].get("hidden_size", model_spec.hidden_size))
        self._ar_tok = [1.0, 1e6]
        act = DTYPE_BYTES[ACT_DTYPE]
        self._ar = [lat + 2 * (self.tp - 1) / self.tp * t * hidden * act / bw for t in self._ar_tok]
        self.allreduce_source = f"estimated (ring, {bw / 1e9:.0f} GB/s bus, {lat * 1e6:.0f} us)"
        self._warn_static(
            f"all-reduce for tp={self.tp} not measured: estimated with a ring formula "
            f"({bw / 1e9:.0f} GB/s bus bandwidth, {lat * 1e6:.0f} us latency)"
        )

    # ---- warnings ----------------------------------------------------------------------------

    def _warn_static(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _warn_once(self, kind: str, msg: str) -> None:
        if self._fitting is not None:
            self._fitting.add(kind)
            return
        if kind in self._warned:
            return
        self._warned.add(kind)
        text = f"{self.name}: {msg}; extrapolating linearly"
        self.warnings.append(text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)

    # ---- the op sum (no calibration) --------------------------------------------------------

    def _lin_time(self, t: float) -> float:
        xs = self._tok
        i, w, out = _locate(xs, t)
        if out:
            self._warn_once("tokens", f"{t:.0f} tokens per step is beyond the grid ({xs[-1]:.0f})")
        lin = self._lin
        return lin[i] + (lin[i + 1] - lin[i]) * w

    def _head_time(self, r: float) -> float:
        i, w, _ = _locate(self._tok, r)
        h = self._head
        return h[i] + (h[i + 1] - h[i]) * w

    def _decode_time(self, b: float, k: float, kmax: float = 0) -> float:
        """One layer's decode attention for b sequences holding k keys, the longest ``kmax``.

        The lognormal-spread table (``_decode_time_ln``) unless the longest context is known
        (``kmax > 0``) and the table has equal-context rows: then linear in the longest context
        between the equal-context value (longest = mean) and the lognormal one (longest = the
        lognormal rows' longest, `uneven_weights`), extrapolated up to ``SPREAD_EXTRAP`` gaps
        beyond it and held there; never below the equal-context value.
        """
        ln = self._decode_time_ln(b, k)
        if kmax <= 0 or self._dec_even is None or b < 2:
            return ln
        return self._with_spread(b, k, kmax, ln)

    def _with_spread(self, b: float, k: float, kmax: float, ln: float, ev=None) -> float:
        """``ln`` (the lognormal-spread value at b, k) moved to the longest context ``kmax``;
        ``ev``: the equal-context value at b, k when the caller has it."""
        r = self._spread.get(b)
        if r is None:
            w = uneven_weights(int(b))
            r = self._spread[b] = b * w[-1] / sum(w)
        if ev is None:
            ev = self._dec_even.time(b, k)
        if ev >= ln:
            return ln
        f = (kmax * b / k - 1.0) / (r - 1.0)
        if f < 0.0:
            f = 0.0
        elif f > SPREAD_EXTRAP:
            f = SPREAD_EXTRAP
        return ev + (ln - ev) * f

    def _decode_time_ln(self, b: float, k: float) -> float:
        """One layer's decode attention for b sequences holding k keys in total, at the
        lognormal context spread of the table's ``uneven=1`` rows.

        Linear in mean context ``k / b`` along the table's context grid; between two grid
        batches, geometric in ``b``; beyond the last grid batch, proportional to ``b``. The
        batch-dependent part is memoized per ``b`` (the hot path sees few distinct batches).
        """
        self._check_decode_grid(b, k)
        return self._dec_grid.time(b, k)

    def _check_decode_grid(self, b: float, k: float) -> None:
        """Say once when a decode batch lies beyond the table's grid (it is extrapolated)."""
        if k > self._dec_kmax_all or b > self._dec_b[-1]:
            self._warn_once("decode", f"decode batch {b:.0f} / total context {k:.0f} beyond grid")

    def _waves(self, s: float, c: float) -> int:
        """Waves of FlashAttention query-tile CTAs over the SMs for s chunks of c tokens."""
        return -(-int(s * -(-c // ATTN_Q_TILE) * self._heads) // self._sms)

    def _prefill_time(self, s: float, tokens: float, attn: float) -> float:
        """One layer's causal attention over s prompt chunks (tokens, attn pairs in total)."""
        if s < 1:
            s = 1.0
        c = tokens / s
        ctx = attn / tokens - (c + 1) / 2
        if ctx < 0:
            ctx = 0.0
        ss, cs, bs, cube = self._pre_s, self._pre_c, self._pre_b, self._pre
        scale = 1.0
        if s > ss[-1]:
            scale = s / ss[-1]
            s = ss[-1]
        if c > cs[-1]:
            self._warn_once("chunk", f"prefill chunk {c:.0f} beyond the grid ({cs[-1]:.0f})")
            scale *= (c / cs[-1]) * (ctx + c / 2) / (ctx + cs[-1] / 2)
            c = cs[-1]
        m, wb, outb = _locate(bs, ctx)
        if outb:
            self._warn_once("context", f"prefill context {ctx:.0f} beyond the grid ({bs[-1]:.0f})")
        j, _, _ = _locate(cs, c)
        i, _, _ = _locate(ss, s)
        # where c lies between grid chunks c0 < c1, per grid row: wave-aware. A wave lasts
        # about as long as its longest key range (ctx + c), so the coordinate is
        # waves(s, c) * (ctx + c): a 700-token chunk (6 tiles of 128 per head, 2 waves at 32
        # heads on 132 SMs) sits next to 1024 (8 tiles, 2 waves), not 40% of the way from 512
        # (4 tiles, 1 wave). The weight is a ratio of linear functions of ctx, hence monotone
        # in ctx; the larger of its values at ctx and at 0 keeps the result non-decreasing in
        # context. Without the GPU's SM count: log-log in c.
        c0, c1 = cs[j], cs[j + 1]
        tiles = -(-c // ATTN_Q_TILE) * self._heads  # query-tile CTAs of one chunk (as _waves)
        out = []
        for ii in (i, i + 1):
            r0, r1 = cube[ii][j], cube[ii][j + 1]
            v0 = r0[m] + (r0[m + 1] - r0[m]) * wb
            v1 = r1[m] + (r1[m + 1] - r1[m]) * wb
            if c <= c0:
                w = 0.0
            elif self._sms:
                wv = -(-int(ss[ii] * tiles) // self._sms)
                w0, w1 = self._pre_w[ii][j], self._pre_w[ii][j + 1]
                w = (wv * c - w0 * c0) / (w1 * c1 - w0 * c0)
                f0 = w0 * (ctx + c0)
                wc = (wv * (ctx + c) - f0) / (w1 * (ctx + c1) - f0)
                w = wc if wc > w else w
                w = w if w < 1.0 else 1.0
            else:
                w = math.log(c / c0) / math.log(c1 / c0)
            out.append(v0 + (v1 - v0) * w)
        s0, s1 = ss[i], ss[i + 1]
        lo, hi = out
        if s <= s0 or lo <= 0:
            return scale * lo
        return scale * lo * (hi / lo) ** (math.log(s / s0) / math.log(s1 / s0))

    def ops_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        allreduce: bool = True,
        decode_max: int = 0,
    ) -> float:
        """Sum of the profiled op times for one step (seconds), before calibration.

        Decode-only steps replay a CUDA graph captured for the next capture size, as in the step
        runner: the GEMMs, norms and sampling run at the padded batch. Attention takes the larger
        of the table at the real batch (the longest real sequence sets the kernel time) and the
        padded call: measured (`_padded_measured`) or, in tables without those rows, estimated
        from the padded batch's column (`_padded_estimate`). With the longest decode context
        known (``decode_max``), attention follows it between the equal-context and lognormal
        values (`_with_spread`); the estimate is scaled by the real batch's factor.
        """
        if prefill_tokens <= 0:
            if decode_seqs <= 0:
                return 0.0
            fixed, t, col = self._decode_fixed(decode_seqs, allreduce)
            self._check_decode_grid(decode_seqs, decode_ctx)
            j, wm, _ = _locate(self._dec_m, decode_ctx / decode_seqs)
            att = self._dec_grid.time_at(decode_seqs, j, wm)
            spread = 1.0
            even = self._dec_even
            if decode_max > 0 and even is not None and decode_seqs > 1 and att > 0.0:
                ev = even.time_at(decode_seqs, j, wm)
                adj = self._with_spread(decode_seqs, decode_ctx, decode_max, att, ev)
                spread = adj / att
                att = adj
            if t != decode_seqs:
                cols = self._pad_cols.get(decode_seqs)
                if cols is not None:  # the padded call itself, measured
                    padded = self._padded_measured(cols, decode_seqs, decode_ctx, decode_max, j, wm)
                else:
                    padded = spread * self._padded_estimate(decode_seqs, decode_ctx, t, col, j, wm)
                if padded > att:
                    att = padded
            return fixed + self.layers * att
        t = self._piecewise_tokens(prefill_tokens + decode_seqs)
        total = self._lin_time(t) + self._head_time(prefill_seqs + decode_seqs)
        if decode_seqs > 0:
            total += self.layers * self._decode_time(decode_seqs, decode_ctx, decode_max)
        total += self.layers * self._prefill_time(prefill_seqs, prefill_tokens, prefill_attn)
        if allreduce and self._ar:
            total += self._allreduce_time(t)
        return total

    def _padded_measured(self, cols, b, k, kmax, j: int, wm: float) -> float:
        """One layer's padded decode-graph attention of b sequences (k keys, longest kmax) from
        the measured columns ``cols = (lognormal, equal or None)`` (`_build_padded`), at the
        mean context located on the grid (j, wm), placed between the spreads like `_with_spread`."""
        cl, ce = cols
        padded = cl[j] + (cl[j + 1] - cl[j]) * wm
        if kmax > 0 and ce is not None and padded > 0.0:
            pe = ce[j] + (ce[j + 1] - ce[j]) * wm
            padded = self._with_spread(b, k, kmax, padded, pe)
        return padded

    def _padded_estimate(self, b, k, t: int, col, j: int, wm: float) -> float:
        """The session-2 estimate of padded decode attention at the lognormal spread, for
        tables without measured padded rows: ``(1 - w) table(t, k) + w table(t, k t / b)``
        (``col``: the table's column at t, or None when t is off its batch grid)."""
        if col is None:  # padded batch off the table's batch grid (not the case so far)
            padded = self._decode_time(t, k)
            full = self._decode_time(t, k * t / b)
        else:  # padded batch on the grid: one column, linear in mean context
            jt, wt, _ = _locate(self._dec_m, k / t)
            padded = col[jt] + (col[jt + 1] - col[jt]) * wt
            full = col[j] + (col[j + 1] - col[j]) * wm
        return padded + self.pad_weight * (full - padded)

    def _allreduce_time(self, t: float) -> float:
        i, w, _ = _locate(self._ar_tok, t)
        ar = self._ar
        return 2 * self.layers * (ar[i] + (ar[i + 1] - ar[i]) * w)

    def _decode_fixed(self, n: int, allreduce: bool) -> tuple[float, int, list | None]:
        """Context-independent time of a decode-only step of ``n`` sequences, the padded
        batch its CUDA graph runs at, and the decode table's column at that batch (None when it
        is not a grid batch). Memoized per ``n``: the decode hot path calls this once per
        simulated step."""
        key = (n, allreduce)
        hit = self._fixed_cache.get(key)
        if hit is None:
            t = self._pad_of(n)
            fixed = self._lin_time(t) + self._head_time(t)
            if allreduce and self._ar:
                fixed += self._allreduce_time(t)
            col = self._dec[self._dec_b.index(t)] if t in self._dec_b else None
            hit = self._fixed_cache[key] = (fixed, t, col)
        return hit

    # ---- the public interface --------------------------------------------------------------

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        decode_max: int = 0,
    ) -> float:
        if prefill_tokens <= 0:
            if decode_seqs <= 0:
                return 0.0
            ops = self.ops_time(0, 0.0, 0, decode_seqs, decode_ctx, True, decode_max)
            return self.base + self.gamma * ops
        ops = self.ops_time(
            prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, True, decode_max
        )
        out = self.base + self.mixed + self.gamma * ops
        floor = self.eager_floor_dec if decode_seqs > 0 else self.eager_floor
        return out if out > floor else floor

    # ---- calibration on whole steps --------------------------------------------------------

    def _step_features(self, r: dict) -> tuple[float, float]:
        ops = self.ops_time(
            int(r["prefill_tokens"]),
            r["prefill_attn"],
            int(r["prefill_seqs"]),
            int(r["decode_seqs"]),
            int(r["decode_ctx"]),
            allreduce=bool(r["includes_allreduce"]),
            decode_max=int(r["decode_max"]),
        )
        mixed = 0.0
        if r["prefill_tokens"] > 0:
            mixed = 2.0 if r["decode_seqs"] > 0 else 1.0  # eager; 2 = two attention calls
        return ops, mixed

    def fit(self) -> None:
        """Fit base, mixed, gamma >= 0 on the train steps (relative least squares)."""
        steps = self.table.rows["steps.csv"]
        train = [r for r in steps if r["split"] == "train"]
        test = [r for r in steps if r["split"] == "test"]
        if len(train) < 3:
            self._warn_static("fewer than 3 whole-step measurements: model is not calibrated")
            self.fit_info = {"train_steps": len(train), "calibrated": False}
            return
        # the padded-graph decode weight is searched on a grid (train steps only; it only
        # matters where a train decode step is padded); the linear terms and floors are fitted
        # for each candidate, and the candidate with the least squared relative error is kept
        padded = any(
            r["prefill_tokens"] <= 0
            and self._pad_of(int(r["decode_seqs"])) != r["decode_seqs"]
            and int(r["decode_seqs"]) not in self._pad_cols
            for r in train
        )
        best = None
        for lam in PAD_WEIGHT_GRID if padded else (0.0,):
            self.pad_weight = lam
            self._fit_linear(train)
            err = sum(e * e for e in self._errors(train))
            if best is None or err < best[0] - 1e-12:
                best = (err, lam, self.base, self.mixed, self.gamma)
                best += (self.eager_floor, self.eager_floor_dec)
        _, self.pad_weight, self.base, self.mixed, self.gamma = best[:5]
        self.eager_floor, self.eager_floor_dec = best[5:]
        train_err = self._errors(train)
        self.fit_info = {
            "calibrated": True,
            "step_clock": self.step_clock,
            "train_steps": len(train),
            "base_overhead_ms": round(self.base * 1e3, 4),
            "mixed_overhead_ms": round(self.mixed * 1e3, 4),
            "gamma": round(self.gamma, 4),
            "eager_floor_ms": round(self.eager_floor * 1e3, 3),
            "eager_floor_with_decode_ms": round(self.eager_floor_dec * 1e3, 3),
            "padded_decode_weight": self.pad_weight,
            "train_median_abs_err": _q(train_err, 0.5),
            "train_p95_abs_err": _q(train_err, 0.95),
        }
        self.heldout = heldout_report(self, test)

    def _pad_of(self, n: int) -> int:
        return self._pad[n] if n < len(self._pad) else n

    def _fit_linear(self, train: list[dict]) -> None:
        """NNLS for base, mixed, gamma on the steps no floor binds, then the eager floors."""
        feats = [(self._step_features(r), self.measured(r)) for r in train]
        floor, use = 0.0, list(range(len(feats)))
        for _ in range(2):  # fit the linear terms on steps the floor does not bind, then floor
            coef = _nnls(
                [[1.0 / y, min(f[1], 1) / y, f[0] / y] for f, y in (feats[i] for i in use)],
                [1.0] * len(use),
            )
            lin = [coef[0] + coef[1] * min(f[1], 1) + coef[2] * f[0] for f, _ in feats]
            floor = _best_floor(lin, feats, 1.0)
            floor_dec = max(floor, _best_floor(lin, feats, 2.0))
            use = [
                i
                for i, (f, _) in enumerate(feats)
                if not (f[1] and (floor if f[1] == 1 else floor_dec) > lin[i])
            ]
            if len(use) < 3:
                use = list(range(len(feats)))
        self.base, self.mixed, self.gamma = coef
        self.eager_floor = floor
        self.eager_floor_dec = floor_dec

    def measured(self, r: dict, stat: str = STEP_STAT) -> float:
        """Seconds of a steps.csv row, by the statistic and clock (``step_clock``) the model is
        fitted to."""
        return r[self._prefix + stat] * 1e-6

    def _errors(self, rows: list[dict]) -> list[float]:
        out = []
        for r in rows:
            out.append(abs(self.predict_row(r) / self.measured(r) - 1.0))
        return out

    def _row_parts(self, r: dict) -> tuple[float, float]:
        """(calibrated op sum, eager floor or 0) of a steps.csv row (all-reduce left out where
        the row did not have it); the prediction is their maximum."""
        ops, mixed = self._step_features(r)
        lin = self.base + self.mixed * min(mixed, 1) + self.gamma * ops
        if not mixed:
            return lin, 0.0
        return lin, self.eager_floor_dec if mixed == 2 else self.eager_floor

    def launch_bound(self, r: dict) -> bool:
        """True when the fitted eager floor, not the op sum, sets this row's prediction."""
        lin, floor = self._row_parts(r)
        return floor > lin

    def predict_row(self, r: dict) -> float:
        """Prediction for a steps.csv row (all-reduce left out where the row did not have it)."""
        lin, floor = self._row_parts(r)
        return max(lin, floor)

    def describe(self) -> dict:
        meta = self.table.meta
        return {
            "kind": "profile",
            "name": self.name,
            "table": self.table_dir,
            "gpu": meta.get("gpu"),
            "torch": meta.get("torch_version"),
            "attention_backend": meta.get("attention_backend"),
            "dtype": meta.get("dtype"),
            "date": meta.get("date"),
            "git_commit": meta.get("git_commit"),
            "allreduce": self.allreduce_source,
            "fit": self.fit_info,
            "heldout": self.heldout,
            "warnings": list(self.warnings),
        }


def _decode_grid(pts: dict[tuple[float, float], float], ms: list[float]):
    """(batches, columns) of decode times {(batch, total context): s} on the mean-context grid
    ``ms``: linear in total context at fixed batch (clamped below the smallest, extrapolated
    linearly past the largest), lifted by cumulative max along the mean context and along the
    batch."""
    bs = sorted({b for b, _ in pts})
    grid = []
    for b in bs:
        ks = sorted(k for (bb, k) in pts if bb == b)
        vs = _cummax([pts[(b, k)] for k in ks])
        col = []
        for m in ms:
            k = b * m
            if len(ks) == 1 or k <= ks[0]:
                col.append(vs[0])
                continue
            i, w, _ = _locate(ks, k)
            col.append(vs[i] + (vs[i + 1] - vs[i]) * w)
        grid.append(_cummax(col))
    for j in range(len(ms)):
        colb = _cummax([grid[i][j] for i in range(len(bs))])
        for i in range(len(bs)):
            grid[i][j] = colb[i]
    return bs, grid


class _DecodeGrid:
    """Decode attention of one spread on a (batch, mean context) grid (`_decode_grid`): linear
    in mean context; between two grid batches geometric in batch; beyond the last one
    proportional to batch. The batch-dependent part is memoized per batch."""

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
        i, _, _ = _locate(bs, b)
        b0, b1 = bs[i], bs[i + 1]
        if b >= b1:
            return (1, g[i], g[i + 1], b / b1)
        if b <= b0:
            return (0, g[i], None, 0.0)
        return (2, g[i], g[i + 1], math.log(b / b0) / math.log(b1 / b0))

    def time(self, b: float, k: float) -> float:
        j, wm, _ = _locate(self.ms, k / b)
        return self.time_at(b, j, wm)

    def time_at(self, b: float, j: int, wm: float) -> float:
        """`time` with the mean context already located on ``ms`` (index j, weight wm)."""
        c = self.memo.get(b)
        if c is None:
            c = self.memo[b] = self.coeffs(b)
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


def _q(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    s = sorted(vals)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (pos - lo), 5)


def heldout_report(model: ProfileLatencyModel, test_rows: list[dict], worst: int = 3) -> dict:
    """Median / p95 / max relative error on steps the model was not fitted on, worst first."""
    if not test_rows:
        return {"test_steps": 0}
    errs, vs_p10, bound = [], [], []
    for r in test_rows:
        lin, floor = model._row_parts(r)
        pred = max(lin, floor)
        errs.append((pred / model.measured(r) - 1.0, r, pred))
        vs_p10.append(abs(pred / model.measured(r, "p10_us") - 1.0))
        bound.append(floor > lin)
    absv = [abs(e[0]) for e in errs]
    by_bound = {}
    for name, want in (("gpu_bound", False), ("launch_bound", True)):
        sub = [a for a, b in zip(absv, bound, strict=True) if b == want]
        by_bound[name] = {"steps": len(sub), "median_abs_err": _q(sub, 0.5)}
        by_bound[name]["p95_abs_err"] = _q(sub, 0.95)
    errs.sort(key=lambda e: -abs(e[0]))
    return {
        "test_steps": len(errs),
        "measured_stat": model._prefix + STEP_STAT,
        "median_abs_err": _q(absv, 0.5),
        "p95_abs_err": _q(absv, 0.95),
        "max_abs_err": round(max(absv), 5),
        **by_bound,
        "vs_measured_p10": {
            "median_abs_err": _q(vs_p10, 0.5),
            "p95_abs_err": _q(vs_p10, 0.95),
        },
        "worst": [
            {
                "kind": r["kind"],
                "prefill_tokens": int(r["prefill_tokens"]),
                "prefill_seqs": int(r["prefill_seqs"]),
                "mean_prefill_ctx": round(
                    r["prefill_attn"] / r["prefill_tokens"]
                    - (r["prefill_tokens"] / max(1, r["prefill_seqs"]) + 1) / 2
                )
                if r["prefill_tokens"]
                else 0,
                "decode_seqs": int(r["decode_seqs"]),
                "decode_ctx": int(r["decode_ctx"]),
                "measured_ms": round(model.measured(r) * 1e3, 3),
                "predicted_ms": round(p * 1e3, 3),
                "rel_err": round(e, 4),
            }
            for e, r, p in errs[:worst]
        ],
    }


def _best_floor(lin: list[float], feats: list, kind: float) -> float:
    """Eager-step floor (CPU-bound launch time) of one kind of eager step (1: prefill only,
    2: prefill + decode, two attention calls a layer) minimizing squared relative error."""
    best, best_err = 0.0, math.inf
    cands = [0.0] + sorted(y for (f, y) in feats if f[1] == kind)
    for fl in cands:
        err = 0.0
        for p, (f, y) in zip(lin, feats, strict=True):
            if f[1] != kind:
                continue
            q = max(p, fl)
            err += (q / y - 1.0) ** 2
        if err < best_err - 1e-12:
            best, best_err = fl, err
    return best


def _fill_nan(vals: list[float], xs: list[float] | None = None, scale: bool = False):
    """Fill NaN gaps: from the nearest measured neighbour, scaled by x ratio when ``scale``."""
    idx = [i for i, v in enumerate(vals) if not math.isnan(v)]
    if not idx:
        return vals
    out = list(vals)
    for i, v in enumerate(vals):
        if not math.isnan(v):
            continue
        near = min(idx, key=lambda j: abs(j - i))
        f = 1.0
        if scale and xs is not None and xs[near] > 0:
            f = xs[i] / xs[near]
        out[i] = vals[near] * f
    return out


def _nnls(a_rows: list[list[float]], y: list[float]) -> list[float]:
    """Non-negative least squares (Lawson-Hanson through scipy, imported only when fitting)."""
    import numpy as np
    from scipy.optimize import nnls

    coef, _ = nnls(np.asarray(a_rows, dtype=float), np.asarray(y, dtype=float))
    return [float(c) for c in coef]


def _heads_per_gpu(model_spec, tp: int) -> int:
    """Query heads per GPU from the served model's description (0 for the shape-less stand-in
    `load_for_report` builds from a table's meta)."""
    return ShardedModel(model_spec, tp).heads if isinstance(model_spec, ModelSpec) else 0


def load_for_report(table_dir: str) -> ProfileLatencyModel:
    """Build the model for a table using the model shape recorded in its meta.yaml."""
    table: Table = load_table(table_dir)
    m = table.meta["model"]

    class _Spec:
        name = m["name"]
        num_layers = int(m.get("num_layers", 0))
        hidden_size = int(m.get("hidden_size", 0))

    if not _Spec.num_layers:
        raise ConfigError(os.path.join(table_dir, "meta.yaml"), "model.num_layers", "missing")
    return ProfileLatencyModel(table_dir, _Spec, tp=int(table.meta["tp"]))
