"""Energy per token (issue 17 item 3): the measured law fitted on a table's ``energy.csv``, the
TDP estimate, unknown energy, and summary.json's ``energy`` section, all on numbers known by hand.

Why these numbers: with ``latency: constant`` every step takes the same time, so a run's busy
time is ``steps x step_s`` exactly; a table whose joules are ``P x window`` (constant power)
must charge ``P x duration x replicas`` whatever the load, and a TDP estimate must charge
``TDP x tp x busy time`` and nothing for idle time.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.energy import (
    BUSY_TERMS,
    ENERGY_COLUMNS,
    EXPERT_TERM,
    JOULES_PER_KWH,
    ExpertReads,
    MeasuredStepEnergy,
    TdpStepEnergy,
    read_energy_csv,
    step_totals,
)
from simulator.errors import ConfigError
from simulator.latency.engine_steps import EngineStepModel
from simulator.runner import build, simulate
from simulator.served import expected_experts_touched

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "tests" / "bad_inputs" / "base.yaml").read_text())
#: idle W, then a (W busy), b (J/step), c (J/token), d (J/decode KV token), e (J/attn pair)
IDLE_W = 120.0
COEF = (300.0, 1.5, 0.01, 3e-5, 7e-7)
SUMMARY_KEYS = {
    "source",
    "kind",
    "usd_per_kwh",
    "joules",
    "idle_joules",
    "busy_joules",
    "avg_power_w",
    "joules_per_output_token",
    "usd",
    "usd_per_million_tokens",
    "model",
}


def _scenarios(law, n=16, short=3) -> list[dict]:
    """``n`` windows >= 0.5 s (every 4th held out) plus ``short`` windows of 0.1 s whose joules
    are nonsense (NVML quantization): the fit and the report must ignore them."""
    rows = []
    for i in range(n + short):
        window = 0.6 + 0.37 * i if i < n else 0.1
        x = {
            "busy_s": window * (0.5 + 0.03 * i),
            "steps": 20 + 7 * i,
            "tokens": 500 * (i + 1) ** 1.5,
            "decode_ctx": 2e5 * (1 + (i * 7) % 11),
            "prefill_attn": 1e7 * ((i * 5) % 13),
        }
        joules = law(window, x) if i < n else 1e6
        rows.append(
            {
                "scenario": f"s{i}",
                "split": "test" if i % 4 == 3 else "train",
                "window_s": window,
                "joules": joules,
                **x,
            }
        )
    return rows


def _known_law(window, x):
    return IDLE_W * window + sum(c * x[k] for c, k in zip(COEF, BUSY_TERMS, strict=True))


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ENERGY_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def test_fit_recovers_known_coefficients_and_ignores_short_windows(tmp_path):
    rows = read_energy_csv(_write_csv(tmp_path / "energy.csv", _scenarios(_known_law)))
    m = MeasuredStepEnergy(rows, IDLE_W, 1, "toy", "energy.csv")
    np.testing.assert_allclose(m.coef, COEF, rtol=1e-6)
    assert m.train_scenarios == 12  # 16 long windows, 4 held out; the 0.1 s ones left out
    ho = m.heldout()
    assert ho["scenarios"] == 4 and ho["p95"] < 1e-9


def _constant_run(tp=1, replicas=1, gpu="h200", usd_per_kwh=None, step_ms=10.0, energy=None):
    cfg = copy.deepcopy(BASE)
    cfg["hardware"] = {"gpu": gpu, "tp": tp}
    if usd_per_kwh is not None:
        cfg["hardware"]["usd_per_kwh"] = usd_per_kwh
    cfg["latency"] = {"model": "constant", "step_ms": step_ms}
    cfg["cluster"] = {"replicas": replicas}
    built = build(cfg, "energy.yaml", REPO)
    if energy is not None:
        built.energy = energy
    res = simulate(built)
    return res.summary, res.steps


def test_constant_power_table_charges_power_times_duration_exactly(tmp_path):
    power = 250.0
    rows = read_energy_csv(_write_csv(tmp_path / "energy.csv", _scenarios(lambda w, x: power * w)))
    m = MeasuredStepEnergy(rows, power, 2, "const", "energy.csv")
    assert list(m.coef) == [0.0] * 5
    s, _ = _constant_run(tp=2, replicas=2, energy=m)
    e = s["energy"]
    assert (e["source"], e["kind"]) == ("const", "measured")
    assert e["busy_joules"] == 0.0
    assert e["joules"] == pytest.approx(power * s["duration_s"] * 2, rel=1e-12)
    assert e["avg_power_w"] == pytest.approx({"per_replica": power, "per_gpu": power / 2})


def test_a_measured_model_averaging_above_the_gpus_tdp_is_flagged(tmp_path):
    """A constant 800 W (per replica, one GPU) on an H200 (700 W TDP) is more than the board
    can draw: the run says its joules extrapolate; 600 W is not flagged."""
    for power, flagged in ((800.0, True), (600.0, False)):
        path = tmp_path / f"e{power:.0f}.csv"
        rows = read_energy_csv(_write_csv(path, _scenarios(lambda w, x, p=power: p * w)))
        s, _ = _constant_run(gpu="h200", energy=MeasuredStepEnergy(rows, power, 1, "c", "e"))
        assert s["energy"]["avg_power_w"]["per_gpu"] == pytest.approx(power)
        assert ("warning" in s["energy"]) is flagged
        if flagged:
            assert "800 W per GPU exceeds the GPU's TDP (700 W)" in s["energy"]["warning"]


def test_measured_busy_terms_add_to_idle_by_hand(tmp_path):
    rows = read_energy_csv(_write_csv(tmp_path / "energy.csv", _scenarios(_known_law)))
    s, steps = _constant_run(energy=MeasuredStepEnergy(rows, IDLE_W, 1, "toy", "e.csv"))
    n = steps["duration_s"].size
    tokens = float(steps["prefill_tokens"].sum() + steps["decode_seqs"].sum())
    busy = (
        COEF[0] * n * 0.010
        + COEF[1] * n
        + COEF[2] * tokens
        + COEF[3] * steps["decode_ctx"].sum()
        + COEF[4] * steps["prefill_attn"].sum()
    )
    e = s["energy"]
    assert e["idle_joules"] == pytest.approx(IDLE_W * s["duration_s"], rel=1e-12)
    assert e["busy_joules"] == pytest.approx(busy, rel=1e-6)
    out_tok = s["throughput"]["output_tokens_per_s"] * s["duration_s"]
    assert e["joules_per_output_token"] == pytest.approx(e["joules"] / out_tok, rel=1e-9)


def test_tdp_fallback_is_labelled_and_counts_busy_time_only():
    s, steps = _constant_run(tp=2, replicas=3, usd_per_kwh=0.25)
    e = s["energy"]
    assert set(e) == SUMMARY_KEYS
    assert (e["source"], e["kind"], e["idle_joules"]) == ("tdp_estimate", "tdp_estimate", 0.0)
    assert "estimate" in e["model"]["note"] and "constant" in e["model"]["note"]
    n = steps["duration_s"].size
    assert e["joules"] == pytest.approx(700 * 2 * n * 0.010, rel=1e-12)
    assert e["usd"] == pytest.approx(e["joules"] / JOULES_PER_KWH * 0.25, rel=1e-12)
    assert e["avg_power_w"]["per_gpu"] == pytest.approx(e["joules"] / s["duration_s"] / 6)
    assert e["usd_per_kwh"] == 0.25


@pytest.mark.parametrize(
    "gpu,tdp", [("h100-sxm", 700), ("h200", 700), ("a100-80gb", 400), ("l40s", 350)]
)
def test_catalog_gpus_have_their_datasheet_tdp(gpu, tdp):
    from simulator.hardware import GPUS

    assert GPUS[gpu].tdp_w == tdp


def test_user_gpu_without_tdp_reports_unknown_energy_never_invented():
    custom = {
        "name": "mygpu",
        "memory_gb": 141,
        "hbm_bandwidth_gb_s": 4800,
        "bf16_tflops": 989,
        "price_per_hour": 2.0,
    }
    s, _ = _constant_run(gpu=custom)
    e = s["energy"]
    assert (e["source"], e["joules"], e["joules_per_output_token"]) == ("unknown", None, None)
    assert "mygpu" in e["reason"] and "tdp_w" in e["reason"]
    s, steps = _constant_run(gpu={**custom, "tdp_w": 500})
    assert s["energy"]["joules"] == pytest.approx(500 * steps["duration_s"].size * 0.010)


def test_tdp_is_not_in_the_resolved_hardware_section():
    # saved real runs are fingerprinted on the resolved hardware section (servesim validate)
    built = build(copy.deepcopy(BASE), "energy.yaml", REPO)
    assert "tdp_w" not in built.resolved["hardware"]["gpu"]
    assert isinstance(built.energy, TdpStepEnergy)


# ------------------------------------------------------------------ an engine table's readings
def _engine_table(tmp_path, energy: bool = True) -> Path:
    from tests.test_engine_steps import _table

    d = _table(tmp_path, model="llama-3-8b")
    if energy:
        _write_csv(d / "energy.csv", _scenarios(_known_law))
        meta = yaml.safe_load((d / "meta.yaml").read_text())
        meta["energy"] = {"source": "test", "idle_w": IDLE_W, "gpus": 1, "counter_refresh_s": 0.1}
        (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    return d


def _vllm_run(table: Path) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg["scheduler"] = {"policy": "vllm"}
    cfg["latency"] = {"model": "profile", "table": str(table)}
    return simulate(build(cfg, "energy.yaml", REPO)).summary


def test_engine_table_with_readings_powers_the_run_and_reports_heldout_error(tmp_path):
    d = _engine_table(tmp_path)
    m = EngineStepModel(d, "llama-3-8b", 1)
    np.testing.assert_allclose(m.energy.coef, COEF, rtol=1e-6)
    assert m.heldout()["energy"]["scenarios"] == 4
    e = _vllm_run(d)["energy"]
    assert (e["kind"], e["source"]) == ("measured", "engine:vllm-0.24.0/h200/table")
    assert e["model"]["heldout"]["median"] < 1e-9


def test_engine_table_without_readings_falls_back_to_tdp_and_says_why(tmp_path):
    d = _engine_table(tmp_path, energy=False)
    assert "no power readings" in EngineStepModel(d, "llama-3-8b", 1).heldout()["energy"]
    e = _vllm_run(d)["energy"]
    assert e["source"] == "tdp_estimate" and "no power readings" in e["model"]["note"]


@pytest.mark.parametrize(
    "change, where, key",
    [
        ({"gpus": 2}, "meta.yaml", "energy.gpus"),
        ({"idle_w": -1}, "meta.yaml", "energy.idle_w"),
        ({"idle_w": "hot"}, "meta.yaml", "energy.idle_w"),
        ("no csv", "energy.csv", "file"),
        ("bad line", "energy.csv", "line 3"),
    ],
)
def test_bad_energy_readings_name_the_file_and_field(tmp_path, change, where, key):
    d = _engine_table(tmp_path)
    if change == "no csv":
        (d / "energy.csv").unlink()
    elif change == "bad line":
        lines = (d / "energy.csv").read_text().splitlines()
        lines[2] = lines[2].replace("train", "maybe").replace("test", "maybe")
        (d / "energy.csv").write_text("\n".join(lines) + "\n")
    else:
        meta = yaml.safe_load((d / "meta.yaml").read_text())
        meta["energy"].update(change)
        (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(ConfigError) as err:
        EngineStepModel(d, "llama-3-8b", 1)
    assert err.value.where.endswith(where) and err.value.key == key


def test_shipped_h200_table_predicts_held_out_energy_within_a_few_percent():
    d = REPO / "profiles" / "h200" / "vllm-0.24" / "llama-3-8b_tp1"
    if not (d / "energy.csv").is_file():
        pytest.skip("table without energy readings")
    ho = EngineStepModel(d, "llama-3-8b", 1).heldout()["energy"]
    assert ho["scenarios"] >= 5 and ho["median"] <= 0.05 and ho["p95"] <= 0.10


# ---- a mixture of experts: expert reads -----------------------------------------------------


def test_expert_reads_per_step_by_hand():
    """Uniform routing, 4 experts top-2: a token picks each expert with probability 1/2, so T
    tokens touch 4 (1 - 2^-T): 0, 2, 3, 3.5; with a skew, the sum over experts of
    1 - (1 - p_i)^T, as `expected_experts_touched` says for one step."""
    uniform = ExpertReads(4, 2)
    np.testing.assert_array_equal(uniform.per_step(np.array([0, 1, 2, 3])), [0.0, 2.0, 3.0, 3.5])
    skewed = ExpertReads(128, 8, 0.6)
    tokens = np.array([0, 1, 8, 1, 300, 8])
    want = [expected_experts_touched(128, 8, t, 0.6) for t in tokens]
    np.testing.assert_allclose(skewed.per_step(tokens), want, rtol=1e-12)
    assert skewed.per_step(np.array([8]))[0] < ExpertReads(128, 8).per_step(np.array([8]))[0]


def _expert_scenarios(f: float) -> list[dict]:
    """`_scenarios` with an ``expert_reads`` column that grows sublinearly with steps (as
    touched experts saturate), and joules with ``f`` J per expert read on top of the law."""
    rows = _scenarios(_known_law)
    for i, r in enumerate(rows):
        r["expert_reads"] = r["steps"] * (4.0 + 60.0 * (1 - 0.8 ** (i + 1)))
        if r["window_s"] >= 0.5:
            r["joules"] += f * r["expert_reads"]
    return rows


def _write_expert_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ENERGY_COLUMNS + (EXPERT_TERM,))
        w.writeheader()
        w.writerows(rows)
    return path


def test_expert_reads_term_is_fitted_and_charged_per_expert_touched(tmp_path):
    f = 0.05
    rows = read_energy_csv(_write_expert_csv(tmp_path / "energy.csv", _expert_scenarios(f)))
    experts = ExpertReads(4, 2)
    m = MeasuredStepEnergy(rows, IDLE_W, 1, "moe", "energy.csv", experts=experts)
    np.testing.assert_allclose(m.coef, (*COEF, f), rtol=1e-6)
    assert m.describe()["coefficients"]["per_expert_read_j"] == pytest.approx(f)
    # a run's totals count its steps' expert reads as the table's build does
    steps = {
        "duration_s": np.array([0.01, 0.02, 0.03]),
        "prefill_tokens": np.array([0, 2, 0]),
        "decode_seqs": np.array([1, 0, 3]),
        "decode_ctx": np.array([100, 0, 300]),
        "prefill_attn": np.array([0.0, 3.0, 0.0]),
    }
    totals = step_totals(steps, experts)
    assert totals["expert_reads"] == pytest.approx(2.0 + 3.0 + 3.5)
    law = sum(c * totals[k] for c, k in zip((*COEF, f), m.terms, strict=True))
    assert m.joules(totals, 1.0)["busy"] == pytest.approx(law, rel=1e-6)
    assert "expert_reads" not in step_totals(steps)


def test_expert_reads_column_and_meta_must_agree(tmp_path):
    with_col = read_energy_csv(_write_expert_csv(tmp_path / "a.csv", _expert_scenarios(0.05)))
    without = read_energy_csv(_write_csv(tmp_path / "b.csv", _scenarios(_known_law)))
    with pytest.raises(ConfigError, match="expert_reads column without meta.yaml"):
        MeasuredStepEnergy(with_col, IDLE_W, 1, "moe", "a.csv")
    with pytest.raises(ConfigError, match="no expert_reads column"):
        MeasuredStepEnergy(without, IDLE_W, 1, "moe", "b.csv", experts=ExpertReads(4, 2))


def test_a_shipped_moe_table_counts_expert_reads():
    """Qwen3-30B-A3B's table: meta.yaml says how its expert reads were counted (its 128
    experts, top 8, uniform), and the law has the term; a dense table's has not."""
    moe = EngineStepModel(REPO / "profiles/h200/vllm-0.24/qwen3-30b-a3b_tp1", "qwen3-30b-a3b", 1)
    assert moe.energy.experts == ExpertReads(128, 8, 0.0)
    assert moe.energy.terms[-1] == "expert_reads"
    dense = EngineStepModel(REPO / "profiles/h200/vllm-0.24/llama-3-8b_tp1", "llama-3-8b", 1)
    assert dense.energy.experts is None and dense.energy.terms == BUSY_TERMS
