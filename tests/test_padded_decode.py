"""CPU tests of the padded decode-graph attention table (``attn_decode_padded.csv``): the
profiler's grid, the loader, and the model's lookup at both context spreads."""

from __future__ import annotations

import csv
import os

import pytest

from profiles import measure as M
from simulator.errors import ConfigError
from simulator.latency.profiled import ProfileLatencyModel
from simulator.latency.table import CAPTURE_SIZES, append_row, load_table, uneven_weights
from tests.test_profiled import (
    SPEC,
    _t,
    _write,
    even_us,
    gemm_us,
    make_table,
)


def _cap(b):
    return next(c for c in CAPTURE_SIZES if c >= b)


def padded_us(b, t, k, uneven):
    """b real sequences (k keys) padded to t: the padded launch grid costs like t sequences,
    and at the lognormal spread the dummies cost extra (never more than t real sequences of
    the same mean would: 0.001 * mean per dummy < the 0.002 the lognormal law charges)."""
    m = k / b
    if uneven:
        return 5.0 + 0.002 * k + 0.05 * t + 0.001 * m * (t - b)
    return 5.0 + 0.001 * k + 0.05 * t


def padded_table(path, drop_t=()):
    """The toy table with equal-context decode rows and the profiler's padded grid."""
    make_table(path)
    rows = list(csv.DictReader(open(os.path.join(path, "attn_decode.csv"))))
    for b in (2, 4, 8, 16, 32, 64, 128, 256, 512):
        for k in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288):
            if k >= b:
                rows.append(
                    {"batch": b, "total_ctx": k, "uneven": 0, "causal": 0, **_t(even_us(b, k))}
                )
    _write(path, "attn_decode.csv", rows)
    pad = [
        {"batch": b, "padded_to": t, "total_ctx": k, "uneven": u, **_t(padded_us(b, t, k, u))}
        for b, t, k, u in M.padded_decode_grid()
        if t not in drop_t
    ]
    _write(path, "attn_decode_padded.csv", pad)
    return path


def _fixed_s(t):
    """Context-free part of a decode-only step graph-padded to t (the toy law)."""
    L = SPEC.num_layers
    return (L * (4 * gemm_us(t) + 4.0) + 2.0 + gemm_us(t) + 1.0) * 1e-6


def _longest_ln(b, m):
    w = uneven_weights(b)
    return m * b * w[-1] / sum(w)


def test_grid_covers_every_padded_batch():
    pb = M.padded_batches()
    assert all(_cap(b) == t and b < t for b, t in pb)
    small = {b for b, _ in pb if b < 64}
    assert small == {b for b in range(3, 64) if b not in CAPTURE_SIZES}  # dense below 64
    for lo, t in zip(CAPTURE_SIZES[2:], CAPTURE_SIZES[3:], strict=False):
        assert (lo + 1, t) in pb  # the first padded batch of every capture size
    grid = M.padded_decode_grid()
    assert len(grid) == len(set(grid))
    assert {u for *_, u in grid} == {0, 1}  # both spreads
    assert all(k <= M.PADDED_MAX_TOTAL and k % b == 0 for b, _, k, _ in grid)


def test_lookup_is_the_measured_call_at_both_spreads(tmp_path):
    m = ProfileLatencyModel(padded_table(str(tmp_path / "toy_tp1")), SPEC, tp=1)
    assert m.pad_weight == 0.0
    L = SPEC.num_layers
    for b in (24, 33, 42, 63, 65, 72):  # (below ~8 the real-batch value, interpolated, binds)
        t = _cap(b)
        for mean in (256, 1024, 4096):
            k = b * mean
            base = m.base + m.gamma * _fixed_s(t)
            ln, ev = padded_us(b, t, k, 1) * 1e-6, padded_us(b, t, k, 0) * 1e-6
            got_ln = m.step_time(0, 0.0, 0, b, k, int(round(_longest_ln(b, mean))))
            assert got_ln == pytest.approx(base + m.gamma * L * ln, rel=1e-3)
            assert m.step_time(0, 0.0, 0, b, k) == pytest.approx(got_ln, rel=1e-3)  # unknown
            got_ev = m.step_time(0, 0.0, 0, b, k, mean)
            assert got_ev == pytest.approx(base + m.gamma * L * ev, rel=1e-6)
            mid = m.step_time(0, 0.0, 0, b, k, int(round((mean + _longest_ln(b, mean)) / 2)))
            assert got_ev < mid < got_ln


def test_between_measured_batches_linear_and_monotone(tmp_path):
    m = ProfileLatencyModel(padded_table(str(tmp_path / "toy_tp1")), SPEC, tp=1)
    L = SPEC.num_layers
    b, mean = 70, 1024  # measured: 68 and 72 (padded to 128); the toy law is linear in b
    want = m.base + m.gamma * (_fixed_s(128) + L * padded_us(b, 128, b * mean, 0) * 1e-6)
    assert m.step_time(0, 0.0, 0, b, b * mean, mean) == pytest.approx(want, rel=1e-6)
    for longest in (lambda n, mean: mean, _longest_ln, None):
        prev = 0.0
        for n in range(1, 400):
            kmax = 0 if longest is None else int(round(longest(n, mean)))
            cur = m.step_time(0, 0.0, 0, n, n * mean, kmax)
            assert cur >= prev, (n, kmax)
            prev = cur


def test_capture_size_without_rows_keeps_the_fitted_weight(tmp_path):
    m = ProfileLatencyModel(padded_table(str(tmp_path / "toy_tp1"), drop_t=(128,)), SPEC, 1)
    assert 70 not in m._pad_cols and 42 in m._pad_cols and 130 in m._pad_cols
    assert m.step_time(0, 0.0, 0, 70, 70 * 1024) > 0.0


def test_padded_rows_malformed_or_missing(tmp_path):
    path = padded_table(str(tmp_path / "toy_tp1"))
    load_table(path)
    p = os.path.join(path, "attn_decode_padded.csv")
    text = open(p).read().splitlines()
    open(p, "w").write("\n".join([text[0].replace("padded_to", "pad")] + text[1:]) + "\n")
    with pytest.raises(ConfigError) as e:
        load_table(path)
    assert "attn_decode_padded.csv" in str(e.value) and "padded_to" in str(e.value)
    os.remove(p)  # optional: an older table loads without it
    assert load_table(path).rows["attn_decode_padded.csv"] == []


def test_steps_decode_max_column(tmp_path):
    path = make_table(str(tmp_path / "toy_tp1"))
    p = os.path.join(path, "steps.csv")
    old = list(csv.DictReader(open(p)))
    cols = [c for c in old[0] if c != "decode_max"]
    with open(p, "w", newline="") as f:  # an older table's steps.csv: no decode_max column
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(old)
    rows = load_table(path).rows["steps.csv"]
    for r in rows:
        n, k = int(r["decode_seqs"]), int(r["decode_ctx"])
        assert r["decode_max"] == (max(M.uneven_lengths(k, n)) if n else 0)
    # the profiler refuses to append rows with other columns than the file's header
    with pytest.raises(ConfigError) as e:
        append_row(path, "steps.csv", {c: 1 for c in ("step_id",)})
    assert "steps.csv" in str(e.value) and "--redo-steps" in str(e.value)


def test_fit_on_padded_steps_of_both_spreads_is_exact(tmp_path):
    """Whole padded decode steps at equal and lognormal contexts (as the profiler now times
    them, with their ``decode_max``) are fitted and predicted from the padded rows: no weight
    is searched, and the known overhead comes back exactly."""
    from tests.test_profiled import BASE_S, _step_t

    path = padded_table(str(tmp_path / "toy_tp1"))
    p = os.path.join(path, "steps.csv")
    rows = list(csv.DictReader(open(p)))
    L = SPEC.num_layers
    comps = ((48, 1024, 0), (48, 1024, 1), (96, 512, 0), (24, 2048, 1), (40, 256, 0), (72, 512, 1))
    for j, (b, mean, uneven) in enumerate(comps):
        t, k = _cap(b), b * mean
        longest = int(round(_longest_ln(b, mean))) if uneven else mean
        y = BASE_S + _fixed_s(t) + L * padded_us(b, t, k, uneven) * 1e-6
        rows.append(
            {
                **rows[0],
                "step_id": 100 + j,
                "decode_seqs": b,
                "decode_ctx": k,
                "decode_max": longest,
                "split": "test" if j % 2 else "train",
                **_step_t(y * 1e6),
            }
        )
    _write(path, "steps.csv", rows)
    m = ProfileLatencyModel(path, SPEC, tp=1)
    assert m.pad_weight == 0.0
    assert m.base == pytest.approx(BASE_S, rel=1e-3) and m.gamma == pytest.approx(1.0, rel=1e-3)
    padded = [r for r in m.table.rows["steps.csv"] if r["step_id"] >= 100]
    assert len(padded) == len(comps)
    for r in padded:
        assert m.predict_row(r) == pytest.approx(r["median_us"] * 1e-6, rel=2e-3)


def test_model_fits_wall_time_where_every_step_has_it(tmp_path):
    """A steps.csv with host wall-clock columns is fitted on them: a constant host cost per
    step (input preparation before the GPU starts) comes back in ``base``, exactly."""
    from tests.test_profiled import BASE_S

    host_s = 0.25e-3
    path = make_table(str(tmp_path / "toy_tp1"))
    p = os.path.join(path, "steps.csv")
    rows = list(csv.DictReader(open(p)))
    gpu_only = ProfileLatencyModel(path, SPEC, tp=1)
    assert gpu_only.step_clock == "gpu" and gpu_only.describe()["fit"]["step_clock"] == "gpu"
    for r in rows:
        for stat in ("median", "p10", "p90"):
            r[f"wall_{stat}_us"] = float(r[f"{stat}_us"]) + host_s * 1e6
    _write(path, "steps.csv", rows)
    m = ProfileLatencyModel(path, SPEC, tp=1)
    assert m.step_clock == "wall" and m.heldout["measured_stat"] == "wall_median_us"
    assert m.base == pytest.approx(BASE_S + host_s, rel=1e-3)
    assert m.gamma == pytest.approx(gpu_only.gamma, rel=1e-4)
    # one row without wall time: the whole table falls back to GPU time
    rows[0] = {k: v for k, v in rows[0].items() if not k.startswith("wall_")}
    cols = list(rows[1])
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows({c: r.get(c, "") for c in cols} for r in rows)
    with pytest.raises(ConfigError):  # an empty wall cell is malformed, not silently dropped
        load_table(path)


REQUIRED = ("h200/llama-3-8b_tp1", "h200/llama-2-7b_tp1", "h200/qwen2.5-7b_tp1",
            "h100/llama-3-8b_tp1", "h100/llama-2-7b_tp1", "h200/llama-3-70b_tp4",
            "h200/llama-3-70b_tp2")  # fmt: skip


@pytest.mark.parametrize("table", REQUIRED)
def test_shipped_tables_meet_the_floor_on_wall_clock(table):
    """Issue 3's floor on the six required tables, held-out steps only, with the padded rows
    and wall-clock steps in use (a regression guard for the shipped data, not a fit target)."""
    from simulator.latency.profiled import load_for_report

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "profiles", table)
    m = load_for_report(path)
    assert m.step_clock == "wall" and m._pad_cols
    ho = m.heldout
    assert ho["test_steps"] >= 40
    assert ho["median_abs_err"] <= 0.05 and ho["p95_abs_err"] <= 0.10
