"""Step latency from GPU-profiled op tables, calibrated on measured whole steps.

`ProfileLatencyModel` sums per-op times read from a table directory (see ``profiles/table.py``
for the format), then applies a small calibration fitted ONLY on the whole steps whose ``split``
is ``train``; the ``test`` steps give the published held-out error.

Step time (seconds) = ``base + mixed * [prefill_tokens > 0] + gamma * ops + allreduce``, with

* ``ops`` = ``lin(T)`` + ``head(R)`` + ``L * attn_decode(B, K)`` + ``L * attn_prefill(s, T_p, A)``
  where ``T = prefill_tokens + decode_seqs`` (tokens through the GEMMs), ``R = prefill_seqs +
  decode_seqs`` (rows through the LM head and sampler), ``L`` the number of layers;
* ``lin(T)`` = per layer (qkv, o, gate_up, down GEMMs, 2 RMSNorms, rotary, SiLU-mul) times L,
  plus embedding and final norm: piecewise-linear in T over the profiled token grid;
* ``attn_decode`` = FlashAttention decode (query length 1, not causal) per layer: linear in total
  context K between grid points and log-log in batch B;
* ``attn_prefill`` = causal FlashAttention over prompt chunks per layer, looked up at the mean
  chunk ``T_p / s`` and mean cached context ``A / T_p - (chunk + 1) / 2``: linear in context,
  log-log in chunk length and in number of sequences;
* ``allreduce`` = 2 per layer at T tokens, from ``allreduce.csv`` when measured, else a ring
  estimate (said in ``describe()['warnings']``).

Invariants: ``base``, ``mixed``, ``gamma`` >= 0 (non-negative least squares); every op table is
projected onto a monotone one before use (cumulative max along each axis; for decode, a
cumulative min from the right along batch at equal total context, so more sequences holding the
same keys never cost less). Hence the result is non-decreasing in ``prefill_attn``,
``decode_seqs``, ``decode_ctx``, and in ``prefill_tokens`` / ``prefill_seqs`` whenever the other
prefill features scale with them; holding ``prefill_attn`` fixed while adding prompt tokens can
lower attention time slightly (a longer chunk with the same causal pairs fills the kernel's query
tiles better), which is physical and bounded by the GEMM growth in practice.

Hot path: `step_time` uses only bisect on Python lists and float arithmetic (a few microseconds);
no numpy, no allocation beyond floats. This module never imports torch.
"""

from __future__ import annotations

import math
import os
import warnings
from bisect import bisect_right

from profiles.table import GEMM_OPS, Table, load_table
from simulator.errors import ConfigError

LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
# elementwise ops run per layer, with their count per layer
LAYER_ELEMENTWISE = (("rmsnorm", 2), ("rotary", 1), ("silu_mul", 1))
# default ring all-reduce estimate when allreduce.csv lacks the TP degree
DEFAULT_AR_BUS_GBPS = 300.0
DEFAULT_AR_LATENCY_US = 12.0


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


def _cummin_right(vals: list[float]) -> list[float]:
    out, m = [0.0] * len(vals), math.inf
    for i in range(len(vals) - 1, -1, -1):
        m = min(m, vals[i])
        out[i] = m
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
                meta_path, "tp", f"table was profiled for tp={table.meta['tp']}, experiment has {tp}"
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
        self._build_linear()
        self._build_decode()
        self._build_prefill()
        self._build_allreduce(model_spec)
        self.base = 0.0
        self.mixed = 0.0
        self.gamma = 1.0
        self.fit_info: dict = {}
        self.heldout: dict = {}
        self.fit()

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
        where = os.path.join(self.table_dir, "attn_decode.csv")
        rows = [r for r in self.table.rows["attn_decode.csv"] if r["causal"] == 0]
        if not rows:
            raise ConfigError(where, "causal", "no non-causal decode rows")
        # prefer uneven contexts (what real batches have); batch 1 only has even
        pts: dict[tuple[float, float], tuple[int, float]] = {}
        for r in rows:
            key = (r["batch"], r["total_ctx"])
            pref = 1 if r["uneven"] else 0
            if key not in pts or pref > pts[key][0]:
                pts[key] = (pref, r["median_us"] * 1e-6)
        bs = sorted({k[0] for k in pts})
        ks = sorted({k[1] for k in pts})
        grid = []
        for b in bs:
            col = []
            for k in ks:
                col.append(pts.get((b, k), (0, math.nan))[1])
            grid.append(_fill_nan(col))
        # monotone in K at fixed B, then in B at fixed K (cumulative min from the right)
        grid = [_cummax(col) for col in grid]
        for j in range(len(ks)):
            colb = _cummin_right([grid[i][j] for i in range(len(bs))])
            for i in range(len(bs)):
                grid[i][j] = colb[i]
        self._dec_b, self._dec_k, self._dec = bs, ks, grid

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
        self._ar = [
            lat + 2 * (self.tp - 1) / self.tp * t * hidden * 2 / bw for t in self._ar_tok
        ]
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
        return _lerp(self._lin[i], self._lin[i + 1], w) if len(xs) > 1 else self._lin[0]

    def _head_time(self, r: float) -> float:
        xs = self._tok
        i, w, _ = _locate(xs, r)
        return _lerp(self._head[i], self._head[i + 1], w) if len(xs) > 1 else self._head[0]

    def _decode_time(self, b: float, k: float) -> float:
        bs, ks, g = self._dec_b, self._dec_k, self._dec
        if k < b:
            k = b
        j, wk, outk = _locate(ks, k)
        if b > bs[-1] or outk:
            self._warn_once(
                "decode", f"decode batch {b:.0f} / total context {k:.0f} beyond the grid"
            )
        if len(bs) == 1:
            col = g[0]
            return col[j] + (col[j + 1] - col[j]) * wk if len(ks) > 1 else col[0]
        i, _, _ = _locate(bs, b)
        lo = g[i][j] + (g[i][j + 1] - g[i][j]) * wk
        hi = g[i + 1][j] + (g[i + 1][j + 1] - g[i + 1][j]) * wk
        if b <= bs[i]:
            return lo
        if b >= bs[i + 1]:  # beyond the last batch: proportional to batch at fixed mean context
            return hi * b / bs[i + 1] if b > bs[-1] else hi
        return _loglerp(lo, hi, bs[i], bs[i + 1], b)

    def _prefill_time(self, s: float, tokens: float, attn: float) -> float:
        if s < 1:
            s = 1.0
        c = tokens / s
        ctx = attn / tokens - (c + 1) / 2
        if ctx < 0:
            ctx = 0.0
        ss, cs, bs, cube = self._pre_s, self._pre_c, self._pre_b, self._pre
        scale = 1.0
        if s > ss[-1]:
            scale *= s / ss[-1]
            s = ss[-1]
        if c > cs[-1]:
            self._warn_once("chunk", f"prefill chunk {c:.0f} beyond the grid ({cs[-1]:.0f})")
            scale *= (c / cs[-1]) * (ctx + c / 2) / (ctx + cs[-1] / 2)
            c = cs[-1]
        m, wb, outb = _locate(bs, ctx)
        if outb:
            self._warn_once("context", f"prefill context {ctx:.0f} beyond the grid ({bs[-1]:.0f})")

        def at(i: int, j: int) -> float:
            row = cube[i][j]
            if len(bs) == 1:
                return row[0]
            return row[m] + (row[m + 1] - row[m]) * wb

        def along_c(i: int) -> float:
            if len(cs) == 1:
                return at(i, 0)
            j, _, _ = _locate(cs, c)
            return _loglerp(at(i, j), at(i, j + 1), cs[j], cs[j + 1], c)

        if len(ss) == 1:
            return scale * along_c(0)
        i, _, _ = _locate(ss, s)
        return scale * _loglerp(along_c(i), along_c(i + 1), ss[i], ss[i + 1], s)

    def ops_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
        *,
        allreduce: bool = True,
    ) -> float:
        """Sum of the profiled op times for one step (seconds), before calibration."""
        t = prefill_tokens + decode_seqs
        if t <= 0:
            return 0.0
        total = self._lin_time(t) + self._head_time(max(1, prefill_seqs + decode_seqs))
        if decode_seqs > 0:
            total += self.layers * self._decode_time(decode_seqs, decode_ctx)
        if prefill_tokens > 0:
            total += self.layers * self._prefill_time(prefill_seqs, prefill_tokens, prefill_attn)
        if allreduce and self._ar:
            i, w, _ = _locate(self._ar_tok, t)
            total += 2 * self.layers * _lerp(self._ar[i], self._ar[i + 1], w)
        return total

    # ---- the public interface --------------------------------------------------------------

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        prefill_seqs: int,
        decode_seqs: int,
        decode_ctx: int,
    ) -> float:
        t = prefill_tokens + decode_seqs
        if t <= 0:
            return 0.0
        ops = self.ops_time(prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx)
        out = self.base + self.gamma * ops
        if prefill_tokens > 0:
            out += self.mixed
        return out

    # ---- calibration on whole steps --------------------------------------------------------

    def _step_features(self, r: dict) -> tuple[float, float]:
        ops = self.ops_time(
            int(r["prefill_tokens"]),
            r["prefill_attn"],
            int(r["prefill_seqs"]),
            int(r["decode_seqs"]),
            int(r["decode_ctx"]),
            allreduce=bool(r["includes_allreduce"]),
        )
        return ops, 1.0 if r["prefill_tokens"] > 0 else 0.0

    def fit(self) -> None:
        """Fit base, mixed, gamma >= 0 on the train steps (relative least squares)."""
        steps = self.table.rows["steps.csv"]
        train = [r for r in steps if r["split"] == "train"]
        test = [r for r in steps if r["split"] == "test"]
        if len(train) < 3:
            self._warn_static("fewer than 3 whole-step measurements: model is not calibrated")
            self.fit_info = {"train_steps": len(train), "calibrated": False}
            return
        a_rows, y = [], []
        for r in train:
            ops, mixed = self._step_features(r)
            yy = r["median_us"] * 1e-6
            a_rows.append([1.0 / yy, mixed / yy, ops / yy])
            y.append(1.0)
        coef = _nnls(a_rows, y)
        self.base, self.mixed, self.gamma = coef
        if self.gamma <= 0:
            self.gamma = 1.0
            self._warn_static("calibration gave gamma=0; using raw op sums")
        train_err = self._errors(train)
        self.fit_info = {
            "calibrated": True,
            "train_steps": len(train),
            "base_overhead_ms": round(self.base * 1e3, 4),
            "mixed_overhead_ms": round(self.mixed * 1e3, 4),
            "gamma": round(self.gamma, 4),
            "train_median_abs_err": _q(train_err, 0.5),
            "train_p95_abs_err": _q(train_err, 0.95),
        }
        self.heldout = heldout_report(self, test)

    def _errors(self, rows: list[dict]) -> list[float]:
        out = []
        for r in rows:
            out.append(abs(self.predict_row(r) / (r["median_us"] * 1e-6) - 1.0))
        return out

    def predict_row(self, r: dict) -> float:
        """Prediction for a steps.csv row (all-reduce left out where the row did not have it)."""
        ops, mixed = self._step_features(r)
        return self.base + self.mixed * mixed + self.gamma * ops

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
    errs = []
    for r in test_rows:
        pred = model.predict_row(r)
        y = r["median_us"] * 1e-6
        errs.append((pred / y - 1.0, r, pred))
    absv = [abs(e[0]) for e in errs]
    errs.sort(key=lambda e: -abs(e[0]))
    return {
        "test_steps": len(errs),
        "median_abs_err": _q(absv, 0.5),
        "p95_abs_err": _q(absv, 0.95),
        "max_abs_err": round(max(absv), 5),
        "worst": [
            {
                "kind": r["kind"],
                "prefill_tokens": int(r["prefill_tokens"]),
                "prefill_seqs": int(r["prefill_seqs"]),
                "mean_prefill_ctx": round(
                    r["prefill_attn"] / r["prefill_tokens"] - (r["prefill_tokens"] / max(1,
                    r["prefill_seqs"]) + 1) / 2) if r["prefill_tokens"] else 0,
                "decode_seqs": int(r["decode_seqs"]),
                "decode_ctx": int(r["decode_ctx"]),
                "measured_ms": round(r["median_us"] / 1e3, 3),
                "predicted_ms": round(p * 1e3, 3),
                "rel_err": round(e, 4),
            }
            for e, r, p in errs[:worst]
        ],
    }


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
