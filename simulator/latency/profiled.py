"""Step latency from GPU-profiled op tables, calibrated on measured whole steps: the hot path.

`ProfileLatencyModel` sums per-op times read from a table directory (see
``simulator/latency/table.py`` for the format), then applies a small calibration fitted ONLY on
the whole steps whose ``split`` is ``train`` (`simulator.latency.calibrate`); the ``test`` steps
give the published held-out error (`simulator.latency.heldout`). The dense grids it reads are
built once from the table by `simulator.latency.op_grids`; this module holds what runs per
simulated step.

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
  in ``attn_decode_padded.csv`` at both spreads (`op_grids.padded_columns`). Tables without
  those rows (or a capture size without them) use ``(1 - w) table(t, K) + w table(t, K t / B)``
  instead, w fitted on train steps (``describe()['fit']['padded_decode_weight']``): w = 0 says
  the dummies cost nothing, w = 1 that each costs like a real sequence of the mean context;
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
equal contexts. Given the step's longest decode context (``decode_max``), decode attention is
linear in it between the equal-context value (longest = mean) and the lognormal one,
extrapolated up to ``SPREAD_EXTRAP`` gaps beyond and held there (`_decode_time`); without it
(``decode_max`` 0, or a table without equal-context rows) the lognormal spread is assumed.
Measured padded calls are placed between their own two spreads the same way (the fitted-weight
estimate is scaled by the unpadded factor). Whole-step calibration rows carry their own
``decode_max`` (lognormal and near-equal spreads; older tables without the column ran the
lognormal spread).

Decode-only steps are modeled as the runner executes them: padded to the next CUDA-graph
capture size. Mixed steps of a table whose whole steps ran as piecewise CUDA graphs (meta.yaml
``step_runner.mixed_mode: piecewise``, the default since session 3) run their GEMMs, norms and
all-reduces at the token count padded to the next of ``step_runner.piecewise_sizes`` (attention
and sampling at the real shapes); eager steps are held at or above a fitted launch-time floor.

Invariants: ``base``, ``mixed``, ``gamma`` >= 0 (`calibrate`); every op grid is monotone
(`op_grids`). The result is non-decreasing in ``prefill_attn`` and ``decode_ctx``; in
``prefill_tokens`` and ``prefill_seqs`` when the chunks grow or are added with their attention
pairs; in ``decode_seqs`` when the added sequence holds at least the mean context. Not in the
unphysical directions: adding sequences while holding the total context fixed shortens the
longest sequence and the decode kernel gets faster, and adding prompt tokens at fixed causal
pairs lets a chunk fill the kernel's query tiles better.

Hot path: `step_time` uses only bisect on Python lists and float arithmetic (a few microseconds);
no numpy, no allocation beyond floats. This module never imports torch.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left

from simulator.errors import ConfigError
from simulator.latency import op_grids
from simulator.latency.base import decode_run_times
from simulator.latency.beyond import BeyondTable
from simulator.latency.calibrate import STEP_STAT, WALL_PREFIX, calibrate, row_parts
from simulator.latency.heldout import heldout_report
from simulator.latency.interp import locate
from simulator.latency.op_grids import ATTN_Q_TILE, graph_batch, waves
from simulator.latency.table import Table, load_table, uneven_weights

# how far past the lognormal rows' longest context the spread interpolation extrapolates (in
# units of the gap between equal and lognormal contexts); beyond it the value is held
SPREAD_EXTRAP = 2.0
#: most prompt-step compositions `ProfileLatencyModel._prompt_step_time` remembers at once
PROMPT_MEMO = 1 << 16


class ProfileLatencyModel:
    """Step latency from a profiled table directory. See the module docstring for the formula.

    ``model_spec`` needs ``name`` and ``num_layers`` (a `simulator.models.ModelSpec`); the table
    must have been profiled for that model and ``tp``, else `ConfigError` naming meta.yaml.
    """

    def __init__(self, table_dir: str, model_spec, tp: int = 1):
        self.table_dir = table_dir
        table = load_table(table_dir)
        meta_path = os.path.join(table_dir, "meta.yaml")
        _check_table_matches(table, model_spec, tp, meta_path)
        self.table = table
        self.tp = int(tp)
        self.layers = int(model_spec.num_layers)
        self.name = f"profile:{table.label}"
        #: what the table itself says (`_warn_static`); a run's extrapolations are in `beyond`
        self.warnings: list[str] = []
        self.beyond = BeyondTable(f"{self.name}: ", "; extrapolating linearly")
        self._fixed_cache: dict[tuple[int, bool], tuple] = {}
        self._decode_steps: dict[int, object] = {}  # `_decode_step` per batch size
        self._chunk_shapes: dict[tuple, tuple] = {}
        #: prompt-only steps' times by (tokens, attention pairs, sequences): `step_time` memo
        self._prompt_steps: dict[tuple, float] = {}
        self._build_grids(table, model_spec, meta_path)
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

    def _build_grids(self, table: Table, model_spec, meta_path: str) -> None:
        """Read the table into the flat attributes the hot path reads (`op_grids` builds them;
        the order of the calls is the order of the warnings in ``describe()``)."""
        warn = self._warn_static
        where = os.path.join(self.table_dir, "gemm.csv")
        self._tok, self._lin, self._head = op_grids.token_grids(table, self.layers, where, warn)
        where = os.path.join(self.table_dir, "attn_decode.csv")
        grid, self._dec_even, self._dec_kmax_all = op_grids.decode_grids(table, where)
        self._dec_grid = grid
        self._dec_b, self._dec_m, self._dec = grid.bs, grid.ms, grid.grid
        self._spread: dict[float, float] = {}
        padded_rows = table.rows.get("attn_decode_padded.csv") or []
        self._pad_cols = op_grids.padded_columns(padded_rows, grid, self._dec_even)
        ss, cs, bs, cube = op_grids.prefill_cube(table)
        self._pre_s, self._pre_c, self._pre_b, self._pre = ss, cs, bs, cube
        self._heads, self._sms = op_grids.wave_shape(table, model_spec, self.tp, meta_path, warn)
        if self._sms:
            self._pre_w = [[waves(sv, cv, self._heads, self._sms) for cv in cs] for sv in ss]
        ar = op_grids.allreduce_series(table, self.tp, model_spec, warn)
        self._ar_tok, self._ar, self.allreduce_source = ar
        self._pw_sizes = op_grids.piecewise_sizes(table, meta_path)

    # ---- warnings ----------------------------------------------------------------------------

    def _warn_static(self, msg: str) -> None:
        """Record a property of the table itself (shown in ``describe()``, once per message)."""
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _beyond(self, kind: str, template: str, *values) -> None:
        """A run's step lies beyond the grid (extrapolated): `BeyondTable.note`. While the
        model calibrates, only collect the kind: the table's own steps are not the run's."""
        if self._fitting is not None:
            self._fitting.add(kind)
            return
        self.beyond.note(kind, template, *values, stacklevel=3)

    # ---- the op sum (no calibration) --------------------------------------------------------

    def _piecewise_tokens(self, t: int) -> int:
        """Tokens a mixed step's GEMMs run at: padded up to the next piecewise capture size (the
        runner pads as vLLM does), or ``t`` itself above the largest size (eager)."""
        sizes = self._pw_sizes
        if not sizes or t > sizes[-1]:
            return t
        return sizes[bisect_left(sizes, t)]

    def _lin_time(self, t: float) -> float:
        xs = self._tok
        i, w, out = locate(xs, t)
        if out:
            self._beyond("tokens", "{:.0f} tokens per step is beyond the grid ({:.0f})", t, xs[-1])
        lin = self._lin
        return lin[i] + (lin[i + 1] - lin[i]) * w

    def _head_time(self, r: float) -> float:
        i, w, _ = locate(self._tok, r)
        h = self._head
        return h[i] + (h[i + 1] - h[i]) * w

    def _decode_time(self, b: float, k: float, kmax: float = 0) -> float:
        """One layer's decode attention for b sequences holding k keys, the longest ``kmax``.

        The lognormal-spread table (linear in mean context ``k / b`` along the grid's mean
        contexts; between two grid batches geometric in ``b``, beyond the last proportional to
        it: `op_grids.DecodeGrid`) unless the longest context is known
        (``kmax > 0``) and the table has equal-context rows: then linear in the longest context
        between the equal-context value (longest = mean) and the lognormal one (longest = the
        lognormal rows' longest, `uneven_weights`), extrapolated up to ``SPREAD_EXTRAP`` gaps
        beyond it and held there; never below the equal-context value.
        """
        self._check_decode_grid(b, k)
        j, wm, _ = locate(self._dec_m, k / b)  # both spreads' grids share the mean contexts
        ln = self._dec_grid.time_at(b, j, wm)
        if kmax <= 0 or self._dec_even is None or b < 2:
            return ln
        return self._with_spread(b, k, kmax, ln, self._dec_even.time_at(b, j, wm))

    def _with_spread(self, b: float, k: float, kmax: float, ln: float, ev=None) -> float:
        """``ln`` (the lognormal-spread value at b, k) moved to the longest context ``kmax``;
        ``ev``: the equal-context value at b, k when the caller has it."""
        if ev is None:
            ev = self._dec_even.time(b, k)
        if ev >= ln:
            return ln
        return ev + (ln - ev) * _spread_weight(b, k, kmax, self._spread_ratio(b))

    def _spread_ratio(self, b: float) -> float:
        """Longest over mean context of the lognormal rows at batch b (memoized per b)."""
        r = self._spread.get(b)
        if r is None:
            w = uneven_weights(int(b))
            r = self._spread[b] = b * w[-1] / sum(w)
        return r

    def _check_decode_grid(self, b: float, k: float) -> None:
        """Note a decode batch beyond the table's grid (it is extrapolated)."""
        if k > self._dec_kmax_all or b > self._dec_b[-1]:
            self._beyond("decode", "decode batch {:.0f} / total context {:.0f} beyond grid", b, k)

    def _prefill_time(self, s: float, tokens: float, attn: float) -> float:
        """One layer's causal attention over s prompt chunks (tokens, attn pairs in total).

        What depends only on (s, tokens) is looked up once per shape (`_chunk_shape`); the rest
        follows from the mean context before the chunks. The row above the sequence count's
        grid row is only read when the result blends it in (s above the row's count).
        """
        if s < 1:
            s = 1.0
        c = tokens / s
        ctx = attn / tokens - (c + 1) / 2
        if ctx < 0:
            ctx = 0.0
        shape = self._chunk_shapes.get((s, tokens))
        if shape is None:
            shape = self._chunk_shapes[(s, tokens)] = self._chunk_shape(s, c)
        scale, cc, c0, c1, rows, e = shape
        cs = self._pre_c
        if c > cs[-1]:
            self._beyond("chunk", "prefill chunk {:.0f} beyond the grid ({:.0f})", c, cs[-1])
            scale *= (c / cs[-1]) * (ctx + c / 2) / (ctx + cs[-1] / 2)
        bs = self._pre_b
        m, wb, outb = locate(bs, ctx)
        if outb:
            self._beyond("context", "prefill context {:.0f} beyond the grid ({:.0f})", ctx, bs[-1])
        # where c lies between grid chunks c0 < c1, per grid row: wave-aware. A wave lasts
        # about as long as its longest key range (ctx + c), so the coordinate is
        # waves(s, c) * (ctx + c): a 700-token chunk (6 tiles of 128 per head, 2 waves at 32
        # heads on 132 SMs) sits next to 1024 (8 tiles, 2 waves), not 40% of the way from 512
        # (4 tiles, 1 wave). The weight is a ratio of linear functions of ctx, hence monotone
        # in ctx; the larger of its values at ctx and at 0 keeps the result non-decreasing in
        # context. Without the GPU's SM count: log-log in c.
        out = []
        for r0, r1, wv, w0, w1, w in rows:
            v0 = r0[m] + (r0[m + 1] - r0[m]) * wb
            v1 = r1[m] + (r1[m + 1] - r1[m]) * wb
            if wv:
                f0 = w0 * (ctx + c0)
                wc = (wv * (ctx + cc) - f0) / (w1 * (ctx + c1) - f0)
                w = wc if wc > w else w
                w = w if w < 1.0 else 1.0
            out.append(v0 + (v1 - v0) * w)
        lo = out[0]
        if e is None or lo <= 0:
            return scale * lo
        return scale * lo * (out[1] / lo) ** e

    def _chunk_shape(self, s: float, c: float) -> tuple:
        """What `_prefill_time` needs of s chunks of mean length c apart from their context:
        (the scale for s beyond the grid's counts, c held at the grid's longest chunk, the grid
        chunks c0 <= c < c1 around it, per grid row used (one, or two when s lies between
        rows): (chunk rows at c0 and c1, the waves of s chunks of c or 0 when the weight is
        fixed, the waves at c0 and c1, the weight or its token-only part), the exponent of the
        geometric blend between rows or None)."""
        ss, cs, cube = self._pre_s, self._pre_c, self._pre
        scale = 1.0
        if s > ss[-1]:
            scale = s / ss[-1]
            s = ss[-1]
        if c > cs[-1]:
            c = cs[-1]
        j, _, _ = locate(cs, c)
        i, _, _ = locate(ss, s)
        c0, c1 = cs[j], cs[j + 1]
        s0, s1 = ss[i], ss[i + 1]
        e = None if s <= s0 else math.log(s / s0) / math.log(s1 / s0)
        tiles = -(-c // ATTN_Q_TILE) * self._heads  # query-tile CTAs of one chunk (as waves)
        rows = []
        for ii in (i,) if e is None else (i, i + 1):
            wv = w0 = w1 = 0
            if c <= c0:
                w = 0.0
            elif self._sms:
                wv = -(-int(ss[ii] * tiles) // self._sms)
                w0, w1 = self._pre_w[ii][j], self._pre_w[ii][j + 1]
                w = (wv * c - w0 * c0) / (w1 * c1 - w0 * c0)
            else:
                w = math.log(c / c0) / math.log(c1 / c0)
            rows.append((cube[ii][j], cube[ii][j + 1], wv, w0, w1, w))
        return scale, c, c0, c1, rows, e

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
            j, wm, _ = locate(self._dec_m, decode_ctx / decode_seqs)
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
        the measured columns ``cols = (lognormal, equal or None)`` (`op_grids.padded_columns`),
        at the mean context located on the grid (j, wm), placed between the spreads like
        `_with_spread`."""
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
            jt, wt, _ = locate(self._dec_m, k / t)
            padded = col[jt] + (col[jt + 1] - col[jt]) * wt
            full = col[j] + (col[j + 1] - col[j]) * wm
        return padded + self.pad_weight * (full - padded)

    def _allreduce_time(self, t: float) -> float:
        i, w, _ = locate(self._ar_tok, t)
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
            t = graph_batch(n)
            fixed = self._lin_time(t) + self._head_time(t)
            if allreduce and self._ar:
                fixed += self._allreduce_time(t)
            col = self._dec[self._dec_b.index(t)] if t in self._dec_b else None
            hit = self._fixed_cache[key] = (fixed, t, col)
        return hit

    def _decode_step(self, n: int):
        """``run(ctx, longest, k, start, until)``: the step times of a decode-only run of ``n``
        sequences (`simulator.latency.base.run_times`'s contract: step i holds ``ctx + i n``
        keys, the longest ``longest + i``; at most ``max(k, 1)`` steps, ending with the first
        whose end, ``start`` plus the times added in order, is at or after ``until``), with
        what depends only on ``n`` bound once (`_decode_fixed`, `_attention_parts`); None
        when the padded batch is off the table's batch grid without measured rows (then runs
        go step by step). Built after calibration (`fit` drops them), so ``base`` and
        ``gamma`` are bound too.

        One closure with the step's whole computation inline (the run loop, the mean context's
        grid segment, `ops_time`'s decode attention, `_spread_weight`) because it runs once per
        simulated decode step: a Python call there costs more than the arithmetic. Invariant:
        every float is `ops_time`'s and `step_time`'s expression in the same order, so the
        times equal one `step_time` call a step (tests/test_decode_run_times.py), and the grid
        check runs at the same steps, so the same warnings. The mean context's grid segment
        (`_segment`: its bounds, each column's value and rise over it) is kept between runs:
        while the mean stays in it, `locate` would return the same index, and the weight is
        its expression; on leaving it, `locate` places the mean (clamped below the grid)."""
        fixed, t, col = self._decode_fixed(n, True)
        parts = self._attention_parts(n, t, col)
        if parts is None:
            return None
        lk, l0, l1, le, ek, e0, e1, ee, rm1, cl, ce, estimate = parts
        # ``layers`` as a float and the grid's context bound as an int: the products and the
        # test below are then float-float and int-int, which CPython 3.11 specialises (mixed
        # operands go the generic way), and the values are the same: an int operand is
        # converted to a double exactly (layers < 2**53) before the multiply, and for an int
        # ``ctx``, ``ctx > k`` iff ``ctx > floor(k)`` (``k`` a measured context: finite)
        base, gamma, layers = self.base, self.gamma, float(self.layers)
        ms, kmax_all, wide = self._dec_m, math.floor(self._dec_kmax_all), n > self._dec_b[-1]
        check = self._check_decode_grid
        here = [_segment(ms, 0, (l0, l1, e0, e1, cl, ce))]  # the mean context's segment

        def run(ctx: int, longest: int, k: int, start: float, until: float) -> list[float]:
            j, lo, hi, span, a, da, b, db, e, de, g, dg, p, dp, q, dq = here[0]
            out = []
            end = start
            for _ in range(k if k > 1 else 1):
                if wide or ctx > kmax_all:
                    check(n, ctx)
                x = ctx / n
                if lo <= x < hi:
                    wm = (x - lo) / span
                else:
                    j, wm, _ = locate(ms, x)
                    here[0] = _segment(ms, j, (l0, l1, e0, e1, cl, ce))
                    j, lo, hi, span, a, da, b, db, e, de, g, dg, p, dp, q, dq = here[0]
                att = a + da * wm  # value_at, lognormal spread
                if lk:
                    h = b + db * wm
                    if lk == 1:
                        att = h * le
                    elif att > 0.0:
                        att = att * (h / att) ** le
                f, spread = -1.0, 1.0
                if longest > 0 and ek >= 0 and att > 0.0:
                    ev = e + de * wm  # value_at, equal contexts
                    if ek:
                        h = g + dg * wm
                        if ek == 1:
                            ev = h * ee
                        elif ev > 0.0:
                            ev = ev * (h / ev) ** ee
                    adj = att
                    if ev < att:  # _with_spread, _spread_weight inline
                        f = (longest * n / ctx - 1.0) / rm1
                        if f < 0.0:
                            f = 0.0
                        elif f > SPREAD_EXTRAP:
                            f = SPREAD_EXTRAP
                        adj = ev + (att - ev) * f
                    spread = adj / att
                    att = adj
                if cl is not None:  # _padded_measured
                    pv = p + dp * wm
                    if longest > 0 and ce is not None and pv > 0.0:
                        pe = q + dq * wm
                        if pe < pv:
                            if f < 0.0:
                                f = (longest * n / ctx - 1.0) / rm1
                                if f < 0.0:
                                    f = 0.0
                                elif f > SPREAD_EXTRAP:
                                    f = SPREAD_EXTRAP
                            pv = pe + (pv - pe) * f
                    if pv > att:
                        att = pv
                elif estimate is not None:
                    pv = spread * estimate(n, ctx, t, col, j, wm)
                    if pv > att:
                        att = pv
                dt = base + gamma * (fixed + layers * att)
                out.append(dt)
                end += dt
                ctx += n
                longest += 1
                if end >= until:
                    break
            return out

        return run

    def _attention_parts(self, n: int, t: int, col) -> tuple | None:
        """What one layer's decode attention of a decode-only step of ``n`` sequences (graph
        batch ``t``, the table's column there ``col``) needs that depends only on ``n``:
        (lk, l0, l1, le) and (ek, e0, e1, ee) the lognormal and equal-context columns'
        `DecodeGrid.coeffs` (a column not used is None; ek = -1: no equal-context rows or
        n < 2), ``r - 1`` for the spread weight (r the lognormal rows' longest over mean,
        `_spread_ratio`), the measured padded columns (lognormal, equal or None; None, None
        without them) and the `_padded_estimate` method when the padded call is estimated
        (else None); None when neither a measured padded column nor the padded batch's table
        column exists."""
        cols = self._pad_cols.get(n) if t != n else None
        if t != n and cols is None and col is None:
            return None
        lk, l0, l1, le = self._dec_grid.memo_coeffs(n)
        even = self._dec_even
        ek, e0, e1, ee = even.memo_coeffs(n) if even is not None and n > 1 else (-1, None, None, 0)
        rm1 = self._spread_ratio(n) - 1.0
        cl, ce = cols if cols is not None else (None, None)
        estimate = self._padded_estimate if t != n and cols is None else None
        return lk, l0, l1, le, ek, e0, e1, ee, rm1, cl, ce, estimate

    def decode_run_times(
        self, n: int, ctx: int, longest: int, k: int, start: float, until: float
    ) -> list[float]:
        """The step times of a decode-only run (`simulator.latency.base.decode_run_times`
        says which steps): exactly `step_time`'s floats and warnings, step by step, through
        the batch's `_decode_step` run function (memoized per ``n``)."""
        run = self._decode_steps.get(n, False)
        if run is False:
            run = self._decode_steps[n] = self._decode_step(n) if n > 0 else None
        if run is None:
            return decode_run_times(self.step_time, n, ctx, longest, k, start, until)
        return run(ctx, longest, k, start, until)

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
        if decode_seqs == 0 and self._fitting is None:
            return self._prompt_step_time(prefill_tokens, prefill_attn, prefill_seqs)
        ops = self.ops_time(
            prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, True, decode_max
        )
        out = self.base + self.mixed + self.gamma * ops
        floor = self.eager_floor_dec if decode_seqs > 0 else self.eager_floor
        return out if out > floor else floor

    def _prompt_step_time(self, tokens: int, attn: float, seqs: int) -> float:
        """`step_time` of a step with prompt chunks only, memoized per (tokens, attn, seqs).

        Why: without chunked prefill every prompt step is one of these, and most repeat a
        composition seen before (a lone prompt's attention pairs follow from its length): 77%
        of a 100k-request continuous run's prompt steps hit. Same floats as the computation
        (a pure function of the key once calibrated; `fit` clears the memo, and nothing is
        kept while it calibrates), and the same record of extrapolated steps (`BeyondTable`
        keeps each kind's largest values, which a repeated composition does not change).
        Cleared when it reaches `PROMPT_MEMO` entries, so memory stays bounded on long runs."""
        key = (tokens, attn, seqs)
        memo = self._prompt_steps
        t = memo.get(key)
        if t is None:
            ops = self.ops_time(tokens, attn, seqs, 0, 0, True, 0)
            out = self.base + self.mixed + self.gamma * ops
            t = out if out > self.eager_floor else self.eager_floor
            if len(memo) >= PROMPT_MEMO:
                memo.clear()
            memo[key] = t
        return t

    # ---- calibration and the steps.csv rows ------------------------------------------------

    def fit(self) -> None:
        """Calibrate on the table's train steps (`calibrate.calibrate`; needs at least 3, else
        the model stays uncalibrated and says so), then report on its test steps."""
        steps = self.table.rows["steps.csv"]
        train = [r for r in steps if r["split"] == "train"]
        test = [r for r in steps if r["split"] == "test"]
        if len(train) < 3:
            self._warn_static("fewer than 3 whole-step measurements: model is not calibrated")
            self.fit_info = {"train_steps": len(train), "calibrated": False}
            return
        self.fit_info = calibrate(self, train)
        self.heldout = heldout_report(self, test)
        self._decode_steps.clear()  # they bind base and gamma
        self._prompt_steps.clear()  # so do these times

    def measured_column(self, stat: str = STEP_STAT) -> str:
        """The steps.csv column of ``stat`` on the clock (``step_clock``) the model is fitted to."""
        return self._prefix + stat

    def measured(self, r: dict, stat: str = STEP_STAT) -> float:
        """Seconds of a steps.csv row, by the statistic and clock (``step_clock``) the model is
        fitted to."""
        return r[self.measured_column(stat)] * 1e-6

    def launch_bound(self, r: dict) -> bool:
        """True when the fitted eager floor, not the op sum, sets this row's prediction."""
        lin, floor = row_parts(self, r)
        return floor > lin

    def predict_row(self, r: dict) -> float:
        """Prediction for a steps.csv row (all-reduce left out where the row did not have it)."""
        lin, floor = row_parts(self, r)
        return max(lin, floor)

    def describe(self) -> dict:
        """What a run's summary.json records about the model: the table's provenance, the
        calibration, the held-out error and every warning."""
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
            "warnings": self.warnings + self.beyond.texts(),
        }


def _segment(ms: list[float], j: int, cols: tuple) -> tuple:
    """Mean-context grid segment j of a decode run's columns: (j, its start, its end or inf
    for the last segment, whose values are extrapolated, its width) then, per column of
    ``cols`` (a column or None), its value at the start and its rise over the segment (0.0,
    0.0 for None). Invariant: ``v + d * wm`` is the expression ``c[j] + (c[j + 1] - c[j]) *
    wm``, term for term, so the same float."""
    hi = ms[j + 1] if j < len(ms) - 2 else math.inf
    out = [j, ms[j], hi, ms[j + 1] - ms[j]]
    for c in cols:
        if c is None:
            out += (0.0, 0.0)
        else:
            out += (c[j], c[j + 1] - c[j])
    return tuple(out)


def _spread_weight(b: float, k: float, kmax: float, r: float) -> float:
    """Where the longest context ``kmax`` of b sequences holding k keys lies between equal
    contexts (0) and the lognormal rows' spread (1, their longest over mean being r), held
    within [0, ``SPREAD_EXTRAP``] (`ProfileLatencyModel._with_spread`)."""
    f = (kmax * b / k - 1.0) / (r - 1.0)
    if f < 0.0:
        return 0.0
    if f > SPREAD_EXTRAP:
        return SPREAD_EXTRAP
    return f


def _check_table_matches(table: Table, model_spec, tp: int, meta_path: str) -> None:
    """Raise `ConfigError` naming meta.yaml unless the table measured this model (name and
    layer count) at this TP degree."""
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
