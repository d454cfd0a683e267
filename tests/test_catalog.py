"""Model / GPU / link catalogs, config loading, and KV capacity."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.errors import ConfigError
from simulator.hardware import (
    GPUS,
    LINKS,
    GPUSpec,
    default_activation_reserve_bytes,
    default_tp_link,
    kv_capacity_blocks,
    load_gpu,
    load_link,
)
from simulator.models import MODELS, ModelSpec, load_model
from simulator.served import ShardedModel

GiB = 1024**3


# ---- models ---------------------------------------------------------------------------------

# Published parameter counts (model cards / safetensors totals) and KV bytes per bf16 token.
PUBLISHED = {
    "llama-2-7b": (6.738e9, 524288),
    "llama-3-8b": (8.030e9, 131072),
    "llama-3-70b": (70.554e9, 327680),
    "mistral-7b": (7.248e9, 131072),
    "qwen2.5-7b": (7.616e9, 57344),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_param_counts_and_kv(name):
    m = MODELS[name]
    params, kv = PUBLISHED[name]
    assert m.num_params == pytest.approx(params, rel=1e-3)
    assert ShardedModel(m).kv_bytes_per_token == kv
    assert ShardedModel(m).weight_bytes == 2 * m.num_params
    assert m.head_dim == 128


def test_llama_3_8b_sanity():
    m = MODELS["llama-3-8b"]
    assert m.num_params == 8_030_261_248
    assert ShardedModel(m).weight_bytes == pytest.approx(16.06e9, rel=1e-3)
    assert ShardedModel(m).kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert ShardedModel(MODELS["llama-2-7b"]).kv_bytes_per_token == 524288  # MHA: 4x GQA-8


def test_catalog_config_values():
    q = MODELS["qwen2.5-7b"]
    assert (q.num_layers, q.num_heads, q.num_kv_heads, q.hidden_size) == (28, 28, 4, 3584)
    assert (q.intermediate_size, q.vocab_size, q.max_model_len) == (18944, 152064, 32768)
    big = MODELS["llama-3-70b"]
    assert (big.num_layers, big.hidden_size, big.num_heads, big.num_kv_heads) == (80, 8192, 64, 8)
    assert (big.intermediate_size, big.vocab_size, big.max_model_len) == (28672, 128256, 8192)
    assert MODELS["llama-2-7b"].num_kv_heads == 32
    assert MODELS["llama-2-7b"].intermediate_size == 11008
    assert MODELS["mistral-7b"].max_model_len == 32768
    for name, m in MODELS.items():
        assert m.name == name and name == name.lower()


def test_flops_per_token_hand_count():
    m = ModelSpec(
        name="t",
        num_layers=2,
        hidden_size=8,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=16,
        vocab_size=32,
        max_model_len=64,
    )
    # per layer: q 8x8, k 8x4, v 8x4, o 8x8 = 192; MLP 3 x 8 x 16 = 384
    assert m.num_linear_params == 2 * (192 + 384)
    assert m.num_params == 32 * 8 + 2 * (192 + 384 + 16) + 8 + 32 * 8
    # 2 x (1152 + lm head 256) + 4 x 2 layers x 2 heads x 4 x context 10
    sm = ShardedModel(m)
    assert sm.step_flops(1, 10, 1) == 2 * (1152 + 256) + 4 * 2 * 2 * 4 * 10
    assert sm.step_flops(1, 10) == 2 * 1152 + 4 * 2 * 2 * 4 * 10
    tied = dataclasses.replace(m, tie_embeddings=True)
    assert tied.num_params == m.num_params - 32 * 8
    assert ShardedModel(tied).step_flops(1, 10, 1) == sm.step_flops(1, 10, 1)  # LM head runs


def test_modelspec_invariants():
    with pytest.raises(ValueError, match="divisible"):
        ModelSpec(
            name="x",
            num_layers=1,
            hidden_size=8,
            num_heads=3,
            num_kv_heads=3,
            intermediate_size=8,
            vocab_size=8,
            max_model_len=8,
        )
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec(
            name="x",
            num_layers=1,
            hidden_size=8,
            num_heads=4,
            num_kv_heads=3,
            intermediate_size=8,
            vocab_size=8,
            max_model_len=8,
        )


def test_load_model_by_name_and_alias():
    assert load_model("Llama-3-8B", "f.yaml", "model") is MODELS["llama-3-8b"]
    assert load_model("meta-llama/Meta-Llama-3-8B-Instruct", "f.yaml", "model").name == (
        "llama-3-8b"
    )


def test_load_model_unknown_name_lists_known():
    with pytest.raises(ConfigError) as e:
        load_model("llama-9", "exp.yaml", "model")
    assert e.value.where == "exp.yaml" and e.value.key == "model"
    assert "llama-3-8b" in e.value.message and "qwen2.5-7b" in e.value.message


def test_load_model_custom_mapping():
    m = load_model(
        {
            "name": "tiny",
            "num_layers": 4,
            "hidden_size": 256,
            "num_heads": 8,
            "num_kv_heads": 2,
            "intermediate_size": 512,
            "vocab_size": 1000,
            "max_model_len": 2048,
            "kv_cache_dtype": "fp8",
        },
        "exp.yaml",
        "model",
    )
    assert m.head_dim == 32 and m.num_kv_heads == 2 and m.kv_cache_dtype == "fp8"
    assert ShardedModel(m).kv_bytes_per_token == 2 * 4 * 2 * 32 * 1
    # num_kv_heads defaults to num_heads (MHA)
    mha = load_model(
        {
            "num_layers": 1,
            "hidden_size": 64,
            "num_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 10,
            "max_model_len": 16,
        },
        "e",
        "model",
    )
    assert mha.num_kv_heads == 4 and mha.name == "custom"


def test_load_model_base_override():
    m = load_model({"base": "llama-3-8b", "max_model_len": 4096}, "e", "model")
    assert m.max_model_len == 4096 and m.num_params == MODELS["llama-3-8b"].num_params
    assert m.name == "llama-3-8b"
    # changing hidden size recomputes head_dim
    wide = load_model({"base": "llama-3-8b", "hidden_size": 8192}, "e", "model")
    assert wide.head_dim == 256


@pytest.mark.parametrize(
    ("value", "key", "fragment"),
    [
        ({"base": "llama-3-8b", "num_kv_heads": 5}, "model.num_kv_heads", "divisible"),
        ({"base": "llama-3-8b", "num_layers": 0}, "model.num_layers", ">= 1"),
        ({"base": "llama-3-8b", "num_layers": True}, "model.num_layers", "integer"),
        ({"base": "llama-3-8b", "num_layer": 3}, "model.num_layer", "unknown key"),
        ({"base": "llama-3-8b", "bytes_per_kv": 1}, "model.bytes_per_kv", "kv_cache_dtype: fp8"),
        ({"base": "llama-3-8b", "bytes_per_weight": 1}, "model.bytes_per_weight", "weights: fp8"),
        ({"base": "llama-3-8b", "weights": "fp4"}, "model.weights", "bf16, fp8, int4"),
        ({"base": "llama-3-8b", "kv_cache_dtype": "int4"}, "model.kv_cache_dtype", "bf16, fp8"),
        ({"base": "nope"}, "model.base", "unknown model"),
        ({"num_layers": 2}, "model.hidden_size", "required"),
        (
            {"base": "llama-3-8b", "hidden_size": 100, "num_heads": 3, "num_kv_heads": 3},
            "model.head_dim",
            "not divisible",
        ),
        (42, "model", "mapping"),
    ],
)
def test_load_model_errors_name_key(value, key, fragment):
    with pytest.raises(ConfigError) as e:
        load_model(value, "exp.yaml", "model")
    assert e.value.where == "exp.yaml"
    assert e.value.key == key
    assert fragment in e.value.message


def test_check_tp():
    big = MODELS["llama-3-70b"]
    big.check_tp(8)
    big.check_tp(16)  # KV heads replicated
    assert big.kv_heads_per_gpu(16) == 1 and big.kv_heads_per_gpu(4) == 2
    with pytest.raises(ConfigError, match="hardware.tp"):
        big.check_tp(3, "e.yaml", "hardware.tp")
    with pytest.raises(ConfigError, match="KV heads"):
        MODELS["qwen2.5-7b"].check_tp(7)  # 28 heads split by 7, but 4 KV heads cannot be


# ---- GPUs and links -------------------------------------------------------------------------


def test_gpu_catalog_and_ceilings():
    h100, h200 = GPUS["h100-sxm"], GPUS["h200"]
    assert h100.hbm_bandwidth == 3.35e12 and h100.bf16_flops == 989e12
    assert h200.hbm_bandwidth == 4.8e12 and h200.bf16_flops == 989e12
    assert h100.memory_bytes / GiB == pytest.approx(79.18, abs=0.01)  # driver-reported "80 GB"
    assert h200.memory_bytes / GiB == pytest.approx(139.80, abs=0.01)  # driver-reported "141 GB"
    # measured ceilings win where known
    assert (h200.peak_flops, h200.peak_bandwidth) == (790e12, 4.3e12)
    assert (h100.peak_flops, h100.peak_bandwidth) == (800e12, 3.0e12)
    # spec x default efficiency otherwise
    l40s = GPUS["l40s"]
    assert l40s.hbm_bandwidth == 864e9 and l40s.bf16_flops == 362e12
    assert l40s.peak_flops == pytest.approx(0.8 * 362e12)
    assert l40s.peak_bandwidth == pytest.approx(0.9 * 864e9)
    assert l40s.ceilings_source == {"flops": "spec x efficiency", "bandwidth": "spec x efficiency"}
    for g in GPUS.values():
        assert g.price_per_hour > 0
        assert g.peak_flops <= g.bf16_flops and g.peak_bandwidth <= g.hbm_bandwidth


def test_load_gpu():
    assert load_gpu("H200", "e", "hardware.gpu") is GPUS["h200"]
    assert load_gpu("h100", "e", "hardware.gpu") is GPUS["h100-sxm"]
    cheap = load_gpu({"base": "h100-sxm", "price_per_hour": 2.2}, "e", "hardware.gpu")
    assert cheap.price_per_hour == 2.2 and cheap.peak_flops == 800e12
    custom = load_gpu(
        {
            "name": "mi300x",
            "memory_gb": 192,
            "hbm_bandwidth_gb_s": 5300,
            "bf16_tflops": 1307,
            "price_per_hour": 3.5,
            "nvlink_bandwidth_gb_s": None,
        },
        "e",
        "hardware.gpu",
    )
    assert custom.memory_bytes == 192e9 and custom.hbm_bandwidth == 5.3e12
    assert custom.bf16_flops == 1307e12 and custom.nvlink_bandwidth is None
    assert custom.measured_flops is None
    with pytest.raises(ConfigError) as e:
        load_gpu("b200", "e", "hardware.gpu")
    assert e.value.key == "hardware.gpu" and "h100-sxm" in e.value.message
    with pytest.raises(ConfigError) as e:
        load_gpu({"base": "h200", "memory_gb": -1}, "e", "hardware.gpu")
    assert e.value.key == "hardware.gpu.memory_gb"
    with pytest.raises(ConfigError) as e:
        load_gpu({"name": "x", "memory_gb": 1}, "e", "hardware.gpu")
    assert e.value.key == "hardware.gpu.hbm_bandwidth_gb_s"


def test_links():
    assert LINKS["nvlink4"].bandwidth == 450e9
    assert LINKS["infiniband-ndr"].bandwidth == 50e9
    assert LINKS["infiniband-ndr"].latency == pytest.approx(5e-6)
    assert LINKS["pcie-gen5-x16"].bandwidth == 50e9
    for lk in LINKS.values():
        assert 0 < lk.latency < 20e-6
    ndr = load_link("InfiniBand-NDR", "e", "transfer.link")
    assert ndr.transfer_time(50e9) == pytest.approx(1 + 5e-6)
    custom = load_link({"bandwidth_gb_s": 12.5, "latency_s": 1e-5}, "e", "transfer.link")
    assert (custom.bandwidth, custom.latency) == (12.5e9, 1e-5)
    slow = load_link({"base": "roce-200g", "latency_s": 2e-5}, "e", "transfer.link")
    assert slow.bandwidth == LINKS["roce-200g"].bandwidth and slow.latency == 2e-5
    with pytest.raises(ConfigError) as e:
        load_link("carrier-pigeon", "e", "transfer.link")
    assert "nvlink4" in e.value.message
    with pytest.raises(ConfigError) as e:
        load_link({"bandwidth_gb_s": 1}, "e", "transfer.link")
    assert e.value.key == "transfer.link.latency_s"
    assert default_tp_link(GPUS["h200"]).bandwidth == 450e9
    assert default_tp_link(GPUS["l40s"]) is LINKS["pcie-gen4-x16"]


# ---- KV capacity ----------------------------------------------------------------------------


def test_kv_capacity_llama3_8b_h200():
    m, g = MODELS["llama-3-8b"], GPUS["h200"]
    reserve = 2 * GiB
    blocks = kv_capacity_blocks(m, g, 1, 16, 0.9, reserve)
    weights = ShardedModel(m).weight_bytes
    assert blocks == math.floor((g.memory_bytes * 0.9 - weights - reserve) / (16 * 131072))
    # The nominal "141 GB" is really ~140 GiB (150.1e9 bytes as the driver reports it), so the
    # rough figure with 141e9 bytes undercounts by ~7.5%.
    rough = (141e9 * 0.9 - 16e9 - reserve) / (16 * 131072)
    assert 1.0 < blocks / rough < 1.1
    default = kv_capacity_blocks(m, g, 1, 16)
    assert 1 * GiB < default_activation_reserve_bytes(m) < 2 * GiB
    assert abs(default - blocks) < 0.02 * blocks


def test_kv_capacity_tp_formula():
    m, g = MODELS["llama-3-70b"], GPUS["h200"]
    reserve = 1.5 * GiB
    blocks = kv_capacity_blocks(m, g, 4, 16, 0.9, reserve)
    weights = ShardedModel(m).weight_bytes
    expected = (g.memory_bytes * 0.9 * 4 - weights - 4 * reserve) / (16 * 327680)
    assert blocks == math.floor(expected)
    # KV heads replicated past tp=8: per-GPU KV per token stops shrinking
    b8 = kv_capacity_blocks(m, g, 8, 16, 0.9, reserve)
    b16 = kv_capacity_blocks(m, g, 16, 16, 0.9, reserve)
    assert b8 < b16 < 2 * b8


def test_kv_capacity_70b_does_not_fit_one_h100():
    with pytest.raises(ConfigError) as e:
        kv_capacity_blocks(
            MODELS["llama-3-70b"], GPUS["h100-sxm"], 1, 16, where="exp.yaml", key="kv_cache"
        )
    assert e.value.where == "exp.yaml" and e.value.key == "kv_cache"
    assert "does not fit" in e.value.message and "tp" in e.value.message
    assert kv_capacity_blocks(MODELS["llama-3-70b"], GPUS["h200"], 4, 16) > 10_000


def test_kv_capacity_scales_inversely_with_block_and_kv_width():
    m, g = MODELS["llama-3-8b"], GPUS["h100-sxm"]
    b16 = kv_capacity_blocks(m, g, 1, 16, 0.9, GiB)
    b32 = kv_capacity_blocks(m, g, 1, 32, 0.9, GiB)
    assert b32 == b16 // 2
    fp8 = load_model({"base": "llama-3-8b", "kv_cache_dtype": "fp8"}, "e", "model")
    assert kv_capacity_blocks(fp8, g, 1, 16, 0.9, GiB) in (2 * b16, 2 * b16 + 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"block_size": 0}, "block_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"tp": 3}, "divisible"),
    ],
)
def test_kv_capacity_bad_args(kwargs, fragment):
    args = {"tp": 1, "block_size": 16, **kwargs}
    with pytest.raises(ConfigError, match=fragment):
        kv_capacity_blocks(MODELS["llama-3-8b"], GPUS["h200"], **args)


def test_gpuspec_is_frozen():
    with pytest.raises(AttributeError):
        GPUS["h200"].price_per_hour = 0  # type: ignore[misc]
    assert isinstance(GPUS["h200"], GPUSpec)
