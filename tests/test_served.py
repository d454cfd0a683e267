"""The served-model description (`simulator.served.ShardedModel`) and what follows from it:
hand-computed shapes, bytes and FLOPs per precision, table selection by precision, the fp8 run,
KV capacity from the scheduler's budgets, and the simulator's independence from the profiler."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.hardware import GPUS, kv_capacity_blocks
from simulator.latency.roofline import RooflineLatencyModel
from simulator.models import MODELS, load_model
from simulator.served import FullAttentionSpec, ShardedModel
from tests.test_profiled import make_table

REPO = Path(__file__).resolve().parents[1]

# Llama-3-8B by hand: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336,
# vocabulary 128256. Per layer: qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096,
# down 4096 x 14336 = 218,103,808 linear weights; x 32 = 6,979,321,856. The rest (embedding,
# LM head, norms) = 8,030,261,248 - 6,979,321,856 = 1,050,939,392, always bf16.
LINEAR_8B = 6_979_321_856
OTHER_8B = 1_050_939_392


def _model(**kw):
    return load_model({"base": "llama-3-8b", **kw}, "t.yaml", "model")


def test_llama3_8b_per_gpu_shapes_and_flops():
    sm = ShardedModel(MODELS["llama-3-8b"])
    assert sm.gemm_shapes() == {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
        "lm_head": (128256, 4096),
    }
    assert [o.name for o in sm.layer_gemms()] == ["qkv", "o", "gate_up", "down"]
    assert {o.kind for o in sm.ops} == {"gemm", "attention", "elementwise", "sampling"}
    assert sm.linear_flops_per_token == 2 * LINEAR_8B
    assert sm.attn_flops_per_pair == 4 * 32 * 32 * 128
    assert sm.step_flops(10, 100, 2) == 10 * 2 * LINEAR_8B + 100 * 524288 + 2 * 2 * 128256 * 4096
    assert sm.op("attention").kv_bytes_per_key == 2 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("weights", "weight_bytes", "gemm_dtype"),
    [
        ("bf16", 2 * (LINEAR_8B + OTHER_8B), "bf16"),  # 16,060,522,496
        ("fp8", LINEAR_8B + 2 * OTHER_8B, "fp8"),  # 9,081,200,640
        # 4 bits + one bf16 scale per 128 weights = 0.515625 B per linear weight
        ("int4", LINEAR_8B * 33 // 64 + 2 * OTHER_8B, "bf16"),  # 5,700,591,616
    ],
)
def test_llama3_8b_weight_bytes_per_precision(weights, weight_bytes, gemm_dtype):
    sm = ShardedModel(_model(weights=weights))
    assert sm.weight_bytes == weight_bytes
    assert sm.weight_format.gemm_dtype == gemm_dtype
    qkv = sm.op("qkv")
    assert qkv.in_dtype == gemm_dtype and qkv.out_dtype == "bf16"
    assert sm.op("lm_head").weight_dtype == "bf16"  # vLLM leaves the LM head unquantized
    assert sm.linear_flops_per_token == 2 * LINEAR_8B  # precision does not change the FLOPs


@pytest.mark.parametrize(("kv", "per_token"), [("bf16", 131072), ("fp8", 65536)])
def test_llama3_8b_kv_layout(kv, per_token):
    sm = ShardedModel(_model(kv_cache_dtype=kv))
    (spec,) = sm.kv_specs(16)
    assert isinstance(spec, FullAttentionSpec)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size, spec.dtype) == (32, 8, 128, kv)
    assert spec.page_size_bytes == 2 * 16 * 8 * 128 * (2 if kv == "bf16" else 1)
    assert sm.kv_bytes_per_token_per_gpu == sm.kv_bytes_per_token == per_token
    assert sm.kv_bytes_per_block_per_gpu(16) == 16 * per_token


def test_llama3_70b_tp2_shards():
    sm = ShardedModel(MODELS["llama-3-70b"], 2)
    assert (sm.heads, sm.kv_heads, sm.inter, sm.vocab) == (32, 4, 14336, 64128)
    assert sm.gemm_shapes() == {
        "qkv": ((32 + 8) * 128, 8192),
        "o": (8192, 4096),
        "gate_up": (28672, 8192),
        "down": (8192, 14336),
        "lm_head": (64128, 8192),
    }
    assert sm.kv_bytes_per_token_per_gpu == 2 * 80 * 4 * 128 * 2
    assert sm.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    ar = sm.op("allreduce")
    assert (ar.kind, ar.count, ar.act_bytes_per_token) == ("collective", 2, 8192 * 2)
    assert "allreduce" not in {o.name for o in ShardedModel(MODELS["llama-3-70b"]).ops}
    fp8 = ShardedModel(load_model({"base": "llama-3-70b", "weights": "fp8"}, "t", "model"), 2)
    assert fp8.weight_bytes_per_gpu == fp8.weight_bytes / 2


def test_op_fingerprint_follows_the_op_list():
    a = ShardedModel(MODELS["llama-3-8b"]).op_fingerprint
    assert a == ShardedModel(MODELS["llama-3.1-8b"]).op_fingerprint  # same shapes
    assert a != ShardedModel(_model(weights="fp8")).op_fingerprint
    assert a != ShardedModel(MODELS["llama-3-8b"], 2).op_fingerprint


def test_fp8_roofline_is_faster_and_uses_the_fp8_peak():
    g = GPUS["h200"]
    bf16 = RooflineLatencyModel(MODELS["llama-3-8b"], g)
    fp8 = RooflineLatencyModel(_model(weights="fp8", kv_cache_dtype="fp8"), g)
    assert fp8.describe()["gemm_peak_flops"] == pytest.approx(1979e12 * 790 / 989)
    decode = (0, 0.0, 0, 8, 8 * 2048)
    assert fp8.step_time(*decode) < 0.7 * bf16.step_time(*decode)  # fewer bytes read
    prefill = (8192, 8192 * 4096.5, 1, 0, 0)
    parts_bf16, parts_fp8 = bf16.breakdown(*prefill), fp8.breakdown(*prefill)
    assert parts_fp8["gemm_compute_s"] == pytest.approx(parts_bf16["gemm_compute_s"] * 790 / 1580.8)
    with pytest.raises(ValueError, match="no FP8"):
        RooflineLatencyModel(_model(weights="fp8"), GPUS["a100-80gb"])


def _run_cfg(model, **extra):
    from tests.policy_kit import config

    cfg = config(n=40, scheduler={"policy": "continuous"}, latency={"model": "auto"})
    cfg["hardware"] = {"gpu": "h200"}
    cfg["model"] = model
    cfg.update(extra)
    return cfg


def test_an_fp8_run_differs_from_the_bf16_run():
    from simulator.runner import build, simulate

    where = str(REPO / "t.yaml")
    fp8 = {"base": "llama-3-8b", "weights": "fp8", "kv_cache_dtype": "fp8"}
    b_bf16 = build(_run_cfg("llama-3-8b"), where, REPO)
    b_fp8 = build(_run_cfg(fp8), where, REPO)
    assert b_fp8.latency.name == "roofline" and b_bf16.latency.name != "roofline"
    assert b_fp8.resolved["kv_cache"]["num_blocks"] > 2 * b_bf16.resolved["kv_cache"]["num_blocks"]
    warn = b_fp8.latency.describe()["warnings"]
    assert any("measured bf16 weights, bf16 KV cache" in w and "fp8 weights" in w for w in warn)
    s_bf16, s_fp8 = simulate(b_bf16).summary, simulate(b_fp8).summary
    assert s_fp8["tpot_s"]["mean"] != s_bf16["tpot_s"]["mean"]
    assert b_fp8.resolved["model"]["weights"] == "fp8"


def test_kv_capacity_follows_the_scheduler_budgets():
    from simulator.runner import build

    where = str(REPO / "t.yaml")
    small = _run_cfg("llama-3-8b")
    small["scheduler"] = {"policy": "continuous", "max_num_batched_tokens": 8192,
                          "max_num_seqs": 16}  # fmt: skip
    large = copy.deepcopy(small)
    large["scheduler"].update(max_num_batched_tokens=65536, max_num_seqs=1024)
    b_small = build(small, where, REPO).resolved["kv_cache"]["num_blocks"]
    b_large = build(large, where, REPO).resolved["kv_cache"]["num_blocks"]
    m, g = MODELS["llama-3-8b"], GPUS["h200"]
    assert b_small == kv_capacity_blocks(m, g, 1, 16, max_num_batched_tokens=8192, max_num_seqs=16)
    assert b_large == kv_capacity_blocks(m, g, 1, 16, max_num_batched_tokens=65536,
                                         max_num_seqs=1024)  # fmt: skip
    assert b_large < b_small


# ---- table selection by precision --------------------------------------------------------------

TOY = {"name": "toy", "num_layers": 4, "hidden_size": 1024, "num_heads": 8, "num_kv_heads": 8,
       "intermediate_size": 2048, "vocab_size": 1000, "max_model_len": 16384}  # fmt: skip


def _toy_cfg(table, kind, **model):
    cfg = _run_cfg({**TOY, **model})
    cfg["latency"] = {"model": kind, "table": str(table)}
    return cfg


def test_selection_uses_a_table_of_the_same_precision(tmp_path):
    from simulator.runner import build

    table = tmp_path / "toy_tp1"
    meta = {"precision": {"weights": "fp8", "kv_cache_dtype": "fp8"}}
    make_table(str(table), meta_extra=meta)
    lat = build(_toy_cfg(table, "profile", weights="fp8", kv_cache_dtype="fp8"), "t.yaml", REPO)
    assert lat.latency.name.startswith("profile:")


@pytest.mark.parametrize("kind", ["auto", "profile"])
def test_a_named_table_of_another_precision_is_an_error_naming_both(tmp_path, kind):
    from simulator.runner import build

    table = tmp_path / "toy_tp1"
    make_table(str(table), meta_extra={"kv_cache_dtype": "fp8_e4m3"})  # bf16 weights, fp8 KV
    with pytest.raises(ConfigError) as e:
        build(_toy_cfg(table, kind, weights="fp8", kv_cache_dtype="fp8"), "t.yaml", REPO)
    assert e.value.key == "latency.table"
    assert "measured bf16 weights, fp8 KV cache" in e.value.message
    assert "served with fp8 weights, fp8 KV cache" in e.value.message


def test_a_table_of_another_op_list_is_refused(tmp_path):
    from simulator.runner import build

    table = tmp_path / "toy_tp1"
    make_table(str(table), meta_extra={"op_fingerprint": "0123456789ab"})
    with pytest.raises(ConfigError, match="op list 0123456789ab"):
        build(_toy_cfg(table, "profile"), "t.yaml", REPO)
    ours = ShardedModel(load_model(TOY, "t", "model")).op_fingerprint
    make_table(str(table), meta_extra={"op_fingerprint": ours})
    assert build(_toy_cfg(table, "profile"), "t.yaml", REPO).latency.name.startswith("profile:")


@pytest.mark.parametrize(
    ("meta", "field"),
    [({"dtype": "float32"}, "dtype"), ({"precision": {"weights": "fp4"}}, "precision.weights")],
)
def test_a_table_precision_that_names_nothing_known_is_an_error(tmp_path, meta, field):
    from simulator.runner import build

    table = tmp_path / "toy_tp1"
    make_table(str(table), meta_extra=meta)
    with pytest.raises(ConfigError) as e:
        build(_toy_cfg(table, "auto"), "t.yaml", REPO)
    assert e.value.where.endswith("meta.yaml") and e.value.key == field


# ---- layering ----------------------------------------------------------------------------------


def test_nothing_in_simulator_imports_profiles():
    offenders = []
    for path in sorted((REPO / "simulator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names
                          if n == "profiles" or n.startswith("profiles.")]  # fmt: skip
    assert not offenders, offenders
