"""The table side of engine profiling, on CPU: energy readings, precision plumbing and the
checks that refuse a run which did not measure what it claims (no vLLM, no GPU needed)."""

from __future__ import annotations

import json

import pytest
import yaml

from profiles import gpu_energy, vllm_table
from profiles.hf_config import GPTQ_INT4, engine_precision, hf_config
from simulator.errors import ConfigError
from simulator.hardware import GPUS
from simulator.models import MODELS
from simulator.served import ShardedModel


def _counter(power_w: float, t0: float, t1: float, dt: float, refresh: float = 0.1) -> dict:
    """An NVML-like record: the mJ counter of one GPU at constant power, refreshed every
    ``refresh`` s (the driver's cadence), read every ``dt`` s."""
    ts, mj, t = [], [], t0
    while t <= t1 + 1e-9:
        tick = int((t - t0) / refresh + 1e-9) * refresh
        ts.append(t)
        mj.append([int(round(power_w * tick * 1000))])
        t += dt
    return {"t": ts, "mj": mj}


def test_energy_between_by_hand():
    rec = {"t": [0.0, 1.0, 2.0], "mj": [[0, 500], [1000, 600], [3000, 700]]}
    # two GPUs: (1000 + 100) mJ over [0, 1]; half of each next second's increments over [1, 1.5]
    assert gpu_energy.energy_between(rec, 0.0, 1.0) == pytest.approx(1.1)
    assert gpu_energy.energy_between(rec, 1.0, 1.5) == pytest.approx((1000 + 50) / 1000)
    assert gpu_energy.energy_between(rec, -0.5, 1.0) is None  # not covered by readings
    assert gpu_energy.energy_between(rec, 1.0, 1.0) is None


def test_a_coarse_counter_still_gives_window_energy():
    # 300 W, counter refreshed every 100 ms, read every 20 ms: a 2 s window within one refresh
    rec = _counter(300.0, 0.0, 5.0, 0.02)
    assert gpu_energy.energy_between(rec, 1.0, 3.0) == pytest.approx(600.0, rel=0.05)


def test_scenario_energy_sums_its_steps():
    rec = _counter(500.0, 0.0, 10.0, 0.02)
    phase = {"scenarios": [{"id": "a", "split": "train", "t0": 1.0, "t1": 3.0},
                           {"id": "b", "split": "test", "t0": 20.0, "t1": 21.0}]}  # fmt: skip
    rows = [
        {"scenario": "a", "dur_us": 1000.0, "prefill_tokens": 10, "decode_seqs": 2,
         "decode_ctx": 100, "prefill_attn": 55.0},
        {"scenario": "a", "dur_us": 3000.0, "prefill_tokens": 0, "decode_seqs": 4,
         "decode_ctx": 200, "prefill_attn": 0.0},
    ]  # fmt: skip
    (a,) = vllm_table.scenario_energy(phase, rows, rec)  # b lies outside the readings
    assert a["joules"] == pytest.approx(1000.0, rel=0.05)
    assert (a["busy_s"], a["steps"], a["tokens"], a["decode_ctx"]) == (0.004, 2, 16, 300)


def _row(dur_ms, pf=0, nd=1, ctx=0):
    return {"dur_us": dur_ms * 1000, "prefill_tokens": pf, "decode_seqs": nd,
            "decode_ctx": ctx, "prefill_attn": pf * (pf + 1) / 2, "burst": 0}  # fmt: skip


def test_a_step_faster_than_the_gpu_marks_itself_and_the_step_before():
    served, gpu = ShardedModel(MODELS["llama-3-8b"]), GPUS["h200"]
    # 8k prefill tokens need >= 8192 x 2 x 8e9 FLOP / 989 TFLOP/s ~ 130 ms on an H200
    rows = [_row(190, pf=8192), _row(387, pf=8192), _row(29, pf=8192), _row(190, pf=8192)]
    assert vllm_table.flag_early_stamps(rows, served, gpu) == 2
    assert [r["burst"] for r in rows] == [0, 4, 4, 0]
    # a decode step must at least read the weights (16 GB / 4.8 TB/s = 3.3 ms)
    rows = [_row(5.0), _row(2.0), _row(5.0)]
    assert vllm_table.flag_early_stamps(rows, served, gpu) == 2
    # at TP2 each GPU reads half of a 70B model's 141 GB: 14.7 ms, so a 21 ms decode is a step
    # (the whole group's bytes on one GPU's bandwidth, 29 ms, flagged every TP2 decode step)
    tp2 = ShardedModel(MODELS["llama-3-70b"], 2)
    rows = [_row(21.0), _row(21.0), _row(12.0)]
    assert vllm_table.flag_early_stamps(rows, tp2, gpu) == 2
    assert [r["burst"] for r in rows] == [0, 4, 4]


def _in_scenario(rows, scenario="s"):
    for r in rows:
        r.update(scenario=scenario, after_idle=0)
    return rows


def test_a_stamp_shift_tags_its_long_and_short_ends():
    # Llama-3-70B fp8 on H200 (2026-11-26): 8k-token prefill steps stamped 850, 1671, 859, 39,
    # 860 ms: the loop held ~820 ms, two stamps late, the third caught up (lag 2)
    rows = _in_scenario([_row(t, pf=8192) for t in (850, 1671, 859, 39, 860)])
    assert vllm_table.flag_shifted_stamps(rows) == 2
    assert [r["burst"] for r in rows] == [0, 4, 0, 4, 0]
    # lag 3 (Llama-3-70B int4): 1,785, 3,544, 1,798, 1,799, 54 ms; the middle two are like
    rows = _in_scenario([_row(t, pf=8192) for t in (1785, 3544, 1798, 1799, 54, 1790)])
    assert vllm_table.flag_shifted_stamps(rows) == 2
    assert [r["burst"] for r in rows] == [0, 4, 0, 0, 4, 0]
    # ... but not when a step between the ends is off the reference (its own time)
    rows = _in_scenario([_row(t, pf=8192) for t in (1785, 3544, 1798, 2300, 54, 1790)])
    assert vllm_table.flag_shifted_stamps(rows) == 0
    # lag 1: one stamp late by 4 ms (10 + 4, then 10 - 4); the reference is the step before
    rows = _in_scenario([_row(10.0, nd=64, ctx=64_000), _row(14.0, nd=64, ctx=64_064),
                         _row(6.2, nd=64, ctx=64_128), _row(10.0, nd=64, ctx=64_192)])  # fmt: skip
    assert vllm_table.flag_shifted_stamps(rows) == 2
    assert [r["burst"] for r in rows] == [0, 4, 4, 0]


def test_no_stamp_shift_without_cancelling_offsets_or_like_steps():
    def tagged(rows):
        return vllm_table.flag_shifted_stamps(_in_scenario(rows))

    # offsets that do not cancel (+40%, -10%): two steps of their own times
    assert tagged([_row(t, nd=64, ctx=64_000) for t in (10.0, 14.0, 9.0, 10.0)]) == 0
    # offsets under SHIFT_MIN (+20%, -20%)
    assert tagged([_row(t, nd=64, ctx=64_000) for t in (10.0, 12.0, 8.0, 10.0)]) == 0
    # a prompt step, then a decode step: unlike compositions, a long and a short step
    assert (
        tagged([_row(300, pf=8192), _row(450, pf=8192), _row(20, nd=64), _row(300, pf=8192)]) == 0
    )
    # twice the batch is not like (decode sequences beyond LIKE_TOL)
    assert tagged([_row(10.0, nd=64), _row(14.0, nd=64), _row(6.0, nd=128), _row(10.0, nd=64)]) == 0
    # ends in two scenarios, or after an idle gap, or already left out, make no shift
    rows = [_row(t, nd=64, ctx=64_000) for t in (10.0, 14.0, 6.0, 10.0)]
    _in_scenario(rows[:2], "a"), _in_scenario(rows[2:], "b")
    assert vllm_table.flag_shifted_stamps(rows) == 0
    rows = _in_scenario([_row(t, nd=64, ctx=64_000) for t in (10.0, 14.0, 6.0, 10.0)])
    rows[2]["after_idle"] = 1
    assert vllm_table.flag_shifted_stamps(rows) == 0
    rows = _in_scenario([_row(t, nd=64, ctx=64_000) for t in (10.0, 14.0, 6.0, 10.0)])
    rows[0]["burst"] = rows[3]["burst"] = 1  # the references planned in a submission burst
    assert vllm_table.flag_shifted_stamps(rows) == 0


def test_precision_becomes_checkpoint_config_and_engine_args():
    spec = MODELS["llama-3-8b"]
    assert engine_precision("bf16", "bf16") == ({}, {})
    cfg, args = engine_precision("fp8", "fp8")
    assert cfg["quantization_config"]["quant_method"] == "fp8"
    assert args == {"kv_cache_dtype": "fp8"}
    cfg, args = engine_precision("int4", "bf16")
    assert cfg["quantization_config"] == GPTQ_INT4 and args == {}
    # vLLM 0.24 quantizes only the modules this list names (see GPTQ_INT4)
    assert set(GPTQ_INT4["modules_in_block_to_quantize"]) >= {"q_proj", "down_proj"}
    assert "quantization_config" not in hf_config(spec)
    with pytest.raises(ValueError, match="weights"):
        engine_precision("int8", "bf16")


def test_a_moe_models_engine_config_is_its_published_one_and_reads_back_to_its_spec():
    from simulator.hf_catalog import HF_CONFIGS
    from simulator.hf_models import spec_from_hf_config

    spec = MODELS["qwen3-30b-a3b"]
    cfg = hf_config(spec)
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    # every published number the catalog keeps is there unchanged, and no quantization
    assert {k: cfg[k] for k in HF_CONFIGS["qwen3-30b-a3b"][1]} == HF_CONFIGS["qwen3-30b-a3b"][1]
    assert "quantization_config" not in cfg and cfg["norm_topk_prob"] is True
    assert spec_from_hf_config(cfg, "generated", spec.name) == spec
    # Gemma 3: the text model alone, its layer pattern spelled out; same shapes as the catalog's
    import dataclasses

    gemma = MODELS["gemma-3-27b"]
    cfg = hf_config(gemma)
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and "text_config" not in cfg
    assert cfg["layer_types"].count("full_attention") == 10
    assert cfg["layer_types"][5] == "full_attention"
    assert cfg["query_pre_attn_scalar"] == gemma.hidden_size // gemma.num_heads
    back = spec_from_hf_config(cfg, "generated", gemma.name)
    assert back == dataclasses.replace(gemma, family="gemma3_text")
    # DeepSeek-V2-Lite (MLA + MoE): its published routing and YaRN fields, same shapes back
    ds = MODELS["deepseek-v2-lite"]
    cfg = hf_config(ds)
    assert cfg["topk_method"] == "greedy" and cfg["rope_scaling"]["type"] == "yarn"
    assert spec_from_hf_config(cfg, "generated", ds.name) == ds
    # Mixtral-8x7B: 8 experts top-2, full attention, its published numerics
    mx = MODELS["mixtral-8x7b"]
    cfg = hf_config(mx)
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["rope_theta"] == 1e6
    assert cfg["num_local_experts"] == 8 and cfg["sliding_window"] is None
    assert spec_from_hf_config(cfg, "generated", mx.name) == mx
    # gpt-oss-20b: alternating 128-token windows, sinks, clamped SwiGLU; bf16 experts (its
    # checkpoint's MXFP4 quantization_config is left out, as the catalog leaves it out)
    go = MODELS["gpt-oss-20b"]
    cfg = hf_config(go)
    assert cfg["architectures"] == ["GptOssForCausalLM"] and cfg["swiglu_limit"] == 7.0
    assert cfg["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert cfg["rope_scaling"]["factor"] == 32.0 and "quantization_config" not in cfg
    assert spec_from_hf_config(cfg, "generated", go.name) == go
    # Llama-3.1 keeps its published RoPE scaling for 128k
    assert hf_config(MODELS["llama-3.1-8b"])["rope_scaling"]["rope_type"] == "llama3"
    # dense Llama-style models are still written from the spec
    assert hf_config(MODELS["llama-3-8b"])["architectures"] == ["LlamaForCausalLM"]


def test_a_run_that_loaded_another_precisions_weights_is_refused(tmp_path):
    import dataclasses

    (tmp_path / "log.txt").write_text("INFO [model_runner.py:302] Model loading took 14.96 GiB\n")
    bf16 = MODELS["llama-3-8b"]
    assert vllm_table.check_weights_loaded(tmp_path, bf16, 1) == 14.96
    int4 = dataclasses.replace(bf16, weights="int4")
    with pytest.raises(ConfigError, match="did not serve that precision"):
        vllm_table.check_weights_loaded(tmp_path, int4, 1)


def test_kernels_are_read_from_the_log(tmp_path):
    (tmp_path / "log.txt").write_text(
        "INFO Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod\n"
        "INFO Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN']\n"
        "WARNING Using None for EOS token id because tokenizer is not initialized\n"
        "(Worker pid=984) INFO [cuda_communicator.py:245] Using ['CUSTOM', 'PYNCCL'] all-reduce "
        "backends (in dispatch order) for group 'tp:0' out of potential backends: ['SYMM_MEM']\n"
    )
    assert vllm_table._kernels(tmp_path) == {
        "Fp8LinearMethod": "CutlassFP8ScaledMMLinearKernel",
        "attention": "FLASH_ATTN",
        "all_reduce": "CUSTOM,PYNCCL",
    }


def test_energy_files_of_several_processes_merge(tmp_path):
    import json

    lines_a = [{"source": "nvml", "period_s": 0.02, "error": None}, [0.0, [0]], [1.0, [100000]],
               {"idle_window": [0.0, 1.0]}]  # fmt: skip
    lines_b = [
        {"source": "nvml", "period_s": 0.02, "error": None},
        [5.0, [900000]],
        [6.0, [1000000]],
    ]
    (tmp_path / "energy.11.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines_a))
    (tmp_path / "energy.22.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines_b) + "[7.0, [11"  # killed mid-line
    )
    rec = gpu_energy.read_energy(tmp_path)
    assert rec["t"] == [0.0, 1.0, 5.0, 6.0] and rec["idle_window"] == [0.0, 1.0]
    assert gpu_energy.energy_between(rec, *rec["idle_window"]) == pytest.approx(100.0)
    assert gpu_energy.energy_between(rec, 5.0, 6.0) == pytest.approx(100.0)
    assert gpu_energy.read_energy(tmp_path / "none") is None


def test_a_cut_short_profile_keeps_its_finished_scenarios(tmp_path):
    import json

    from profiles.vllm_run import read_partial

    done = [{"scenario": {"id": f"s{i}", "split": "train", "t0": i, "t1": i + 0.5},
             "requests": {f"s{i}/0": {"prompt": 10}}} for i in range(3)]  # fmt: skip
    text = "".join(json.dumps(d) + "\n" for d in done) + '{"scenario": {"id": "s3"'
    (tmp_path / "profile.partial.jsonl").write_text(text)
    assert [d["scenario"]["id"] for d in read_partial(tmp_path / "profile.partial.jsonl")] == [
        "s0",
        "s1",
        "s2",
    ]
    phase = vllm_table.load_profile_phase(tmp_path)
    assert phase["cut_short"] and len(phase["scenarios"]) == 3 and len(phase["requests"]) == 3
    with pytest.raises(ConfigError, match="no profile phase"):
        vllm_table.load_profile_phase(tmp_path / "empty")


def test_rebuilding_a_shipped_table_reproduces_it_and_refuses_another_precision(tmp_path, capsys):
    """`servesim profile --engine vllm --rebuild` on the shipped fp8 run gives back the shipped
    steps.csv byte for byte; asked for bf16 it refuses, naming the engine record."""
    import shutil
    from pathlib import Path

    from simulator.cli import main

    shipped = Path(__file__).resolve().parents[1] / "profiles/h200/vllm-0.24/llama-3-8b_fp8_tp1"
    out = tmp_path / "fp8"
    shutil.copytree(shipped / "raw", out / "raw")
    args = ["profile", "--engine", "vllm", "--model", "llama-3-8b", "--gpu-key", "h200"]
    fp8 = ["--weights", "fp8", "--kv-cache-dtype", "fp8"]
    assert main([*args, *fp8, "--out", str(out), "--rebuild"]) == 0
    assert (out / "steps.csv").read_bytes() == (shipped / "steps.csv").read_bytes()
    assert (out / "energy.csv").read_bytes() == (shipped / "energy.csv").read_bytes()
    # meta.yaml says when the engine ran where the run stamped it (a rebuild moves created_utc)
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    assert "recorded_utc" not in meta and "routing" not in meta  # a dense model has no routers
    engine = json.loads((out / "raw/engine.json").read_text())
    (out / "raw/engine.json").write_text(
        json.dumps({**engine, "engine_started_utc": "2026-11-27T08:00:00Z"})
    )
    assert main([*args, *fp8, "--out", str(out), "--rebuild"]) == 0
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    assert meta["recorded_utc"] == "2026-11-27T08:00:00Z"
    capsys.readouterr()
    assert main([*args, "--out", str(out), "--rebuild"]) == 2
    err = capsys.readouterr().err
    assert "engine.json" in err and "fp8 weights" in err and "bf16 weights" in err
