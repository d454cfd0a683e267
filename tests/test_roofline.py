"""Roofline step-latency model.

Call cost (not a timed test; timings vary by machine), from the repository root::

    python -m timeit -s "from simulator.models import MODELS; from simulator.hardware import GPUS; \
from simulator.latency.roofline import RooflineLatencyModel as R; \
f = R(MODELS['llama-3-8b'], GPUS['h200']).step_time" "f(512, 1536000.0, 1, 64, 96000)"

reports about 0.8 us per call on the development container (Python 3.11; target < 2 us).
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.hardware import GPUS, GPUSpec, LinkSpec
from simulator.latency.base import StepLatencyModel, chunk_attn_pairs
from simulator.latency.roofline import DEFAULT_STEP_OVERHEAD_S, RooflineLatencyModel
from simulator.models import MODELS, ModelSpec, load_model
from simulator.served import ShardedModel

FEATURES = ("prefill_tokens", "prefill_attn", "prefill_seqs", "decode_seqs", "decode_ctx")

# 2 layers, hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocab 32: small enough to count by hand.
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=8,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=16,
    vocab_size=32,
    max_model_len=64,
)
# 250 FLOP/s against 100 B/s: some of TINY's GEMMs are compute-bound, some memory-bound.
TOY_GPU = GPUSpec(
    name="toy",
    memory_bytes=1e6,
    hbm_bandwidth=200,
    bf16_flops=500,
    price_per_hour=1,
    measured_flops=250,
    measured_bandwidth=100,
)
TOY_LINK = LinkSpec(name="toy-link", bandwidth=10, latency=0.25)
# 3 prompt tokens (6 attention pairs) in 1 sequence + 2 decodes reading 10 keys in all.
STEP = (3, 6.0, 1, 2, 10)


def test_hand_computed_tp1():
    r = RooflineLatencyModel(TINY, TOY_GPU, step_overhead_s=0.5)
    # T = 5 tokens, S = 3 sampling sequences; seconds = max(FLOPs / 250, bytes / 100)
    #   QKV   : 128 params, FLOPs 2*2*5*128 = 2560 -> 10.24; bytes 2*(256 + 5*24*2) = 992 -> 9.92
    #   O     :  64 params, FLOPs 1280 -> 5.12;  bytes 2*(128 + 5*16*2) = 576 -> 5.76
    #   gate/up: 256 params, FLOPs 5120 -> 20.48; bytes 2*(512 + 5*40*2) = 1824 -> 18.24
    #   down  : 128 params, FLOPs 2560 -> 10.24; bytes 992 -> 9.92
    gemm = 10.24 + 5.76 + 20.48 + 10.24
    #   attention: FLOPs 2*4*8*(6+10) = 1024 -> 4.096; bytes 2*(2*5*8*2 + 2*(3+10)*4*2) = 736
    attention = 7.36
    #   elementwise per token: 2 layers * (2*(64 + 24 + 48) + 4*2*4) + 2*48 = 704; x 5 / 100
    elementwise = 35.2
    #   LM head: 256 params, FLOPs 2*3*256 = 1536 -> 6.144; bytes 512 + 3*(40*2 + 2*32*4) = 1520
    lm_head = 15.2
    expected = gemm + attention + elementwise + lm_head + 0.5
    assert r.step_time(*STEP) == pytest.approx(expected, rel=1e-12)
    parts = r.breakdown(*STEP)
    assert parts["gemm"] == pytest.approx(gemm, rel=1e-12)
    assert parts["attention"] == pytest.approx(attention, rel=1e-12)
    assert parts["elementwise"] == pytest.approx(elementwise, rel=1e-12)
    assert parts["lm_head"] == pytest.approx(lm_head, rel=1e-12)
    assert parts["allreduce"] == 0.0 and parts["overhead"] == 0.5


def test_hand_computed_tp2():
    r = RooflineLatencyModel(TINY, TOY_GPU, tp=2, step_overhead_s=0.5, allreduce_link=TOY_LINK)
    # per GPU: 1 query head (4 wide), the single KV head replicated, MLP 8, vocab 16
    #   QKV    96 params: FLOPs 1920 -> 7.68;  bytes 2*(192 + 5*20*2) = 784 -> 7.84
    #   O      32 params: FLOPs 640 -> 2.56;   bytes 2*(64 + 5*12*2) = 368 -> 3.68
    #   gate/up 128:      FLOPs 2560 -> 10.24; bytes 2*(256 + 5*24*2) = 992 -> 9.92
    #   down   64:        FLOPs 1280 -> 5.12;  bytes 2*(128 + 5*16*2) = 576 -> 5.76
    gemm = 7.84 + 3.68 + 10.24 + 5.76
    #   attention: FLOPs 2*4*4*16 = 512 -> 2.048; bytes 2*(2*5*4*2 + 2*13*4*2) = 576 -> 5.76
    attention = 5.76
    #   elementwise per token: 2 * (2*(64 + 16 + 24) + 32) + 96 = 576; x 5 / 100
    elementwise = 28.8
    #   LM head 128 params: FLOPs 768 -> 3.072; bytes 256 + 3*(24*2 + 256) = 1168 -> 11.68
    lm_head = 11.68
    #   all-reduce: 4 of them, ring 2*(2-1)/2 * 5*8*2 bytes / 10 + 0.25 = 8.25 each
    allreduce = 33.0
    expected = gemm + attention + elementwise + lm_head + allreduce + 0.5
    assert r.step_time(*STEP) == pytest.approx(expected, rel=1e-12)
    assert r.breakdown(*STEP)["allreduce"] == pytest.approx(allreduce, rel=1e-12)


def test_zero_work_is_overhead():
    r = RooflineLatencyModel(MODELS["llama-3-8b"], GPUS["h200"], tp=2)
    assert r.step_time(0, 0.0, 0, 0, 0) == DEFAULT_STEP_OVERHEAD_S
    r0 = RooflineLatencyModel(MODELS["llama-3-8b"], GPUS["h200"], step_overhead_s=0.0)
    assert r0.step_time(0, 0.0, 0, 0, 0) == 0.0
    assert r0.step_time(0, 0.0, 0, 1, 1) > 0.0


def _models():
    return [
        RooflineLatencyModel(TINY, TOY_GPU, step_overhead_s=0.5),
        RooflineLatencyModel(TINY, TOY_GPU, tp=2, allreduce_link=TOY_LINK),
        RooflineLatencyModel(MODELS["llama-3-8b"], GPUS["h200"]),
        RooflineLatencyModel(MODELS["llama-2-7b"], GPUS["l40s"], tp=4),
        RooflineLatencyModel(MODELS["llama-3-70b"], GPUS["h100-sxm"], tp=8),
    ]


@pytest.mark.parametrize("r", _models(), ids=repr)
def test_monotone_in_every_feature(r):
    rng = np.random.default_rng(0)
    scales = (8192, 8192 * 4096, 16, 256, 256 * 8192)
    for _ in range(300):
        x = [0 if rng.random() < 0.2 else float(rng.integers(0, s + 1)) for s in scales]
        base = r.step_time(*x)
        assert base >= r.step_time(0, 0.0, 0, 0, 0)
        for i, s in enumerate(scales):
            for delta in (1, float(rng.integers(1, s + 1))):
                y = list(x)
                y[i] += delta
                assert r.step_time(*y) >= base, (FEATURES[i], x, delta)


@pytest.mark.parametrize("r", _models(), ids=repr)
def test_breakdown_sums_to_step_time(r):
    rng = np.random.default_rng(1)
    for _ in range(100):
        chunk, ctx = int(rng.integers(0, 4096)), int(rng.integers(0, 4096))
        n_dec = int(rng.integers(0, 128))
        x = (chunk, chunk_attn_pairs(chunk, ctx), int(chunk > 0), n_dec, n_dec * ctx)
        parts = r.breakdown(*x)
        total = sum(parts[k] for k in ("gemm", "attention", "elementwise", "lm_head"))
        total += parts["allreduce"] + parts["overhead"]
        assert r.step_time(*x) == pytest.approx(total, rel=1e-9)


def test_llama3_8b_decode_reads_all_weights_h200():
    m = MODELS["llama-3-8b"]
    r = RooflineLatencyModel(m, GPUS["h200"])
    weights = ShardedModel(m).weight_bytes
    t = r.step_time(0, 0.0, 0, 1, 1024)
    assert t >= weights / 4.3e12  # ~3.7 ms (plus overhead)
    # Without overhead: every weight but the embedding table (a gather) is read once.
    r0 = RooflineLatencyModel(m, GPUS["h200"], step_overhead_s=0.0)
    read = weights - m.embedding_params * 2
    assert read / 4.3e12 <= r0.step_time(0, 0.0, 0, 1, 1024) <= 1.05 * read / 4.3e12


def test_long_prefill_is_compute_bound():
    r = RooflineLatencyModel(MODELS["llama-3-8b"], GPUS["h200"])
    parts = r.breakdown(8192, chunk_attn_pairs(8192, 0), 1, 0, 0)
    assert parts["gemm_compute_s"] > 5 * parts["gemm_memory_s"]
    assert parts["flops"] / GPUS["h200"].peak_flops > 5 * parts["bytes"] / 4.3e12
    # and decode at batch 1 is memory-bound
    parts = r.breakdown(0, 0.0, 0, 1, 1024)
    assert parts["gemm_memory_s"] > 50 * parts["gemm_compute_s"]


def test_gqa_reads_less_kv_than_mha():
    mha = MODELS["llama-2-7b"]
    gqa = load_model({"base": "llama-2-7b", "num_kv_heads": 8}, "t", "model")
    kv_mha = ShardedModel(mha).kv_bytes_per_token
    assert ShardedModel(gqa).kv_bytes_per_token * 4 == kv_mha
    step = (0, 0.0, 0, 64, 64 * 4096)
    a_mha = RooflineLatencyModel(mha, GPUS["h200"]).breakdown(*step)
    a_gqa = RooflineLatencyModel(gqa, GPUS["h200"]).breakdown(*step)
    assert a_gqa["attention"] < a_mha["attention"] / 3.5
    kv_read = 64 * 4096 * kv_mha
    assert a_mha["attention"] >= kv_read / GPUS["h200"].peak_bandwidth


def test_tp2_halves_gemms_and_adds_allreduce():
    m, g = MODELS["llama-3-8b"], GPUS["h200"]
    r1 = RooflineLatencyModel(m, g)
    r2 = RooflineLatencyModel(m, g, tp=2)
    # compute-bound prefill: GEMM FLOPs split exactly in two
    step = (8192, chunk_attn_pairs(8192, 0), 1, 0, 0)
    p1, p2 = r1.breakdown(*step), r2.breakdown(*step)
    assert p2["gemm"] == pytest.approx(p1["gemm"] / 2, rel=1e-12)
    link = r2.allreduce_link
    ar = 2 * m.num_layers * (2 * (2 - 1) / 2 * 8192 * m.hidden_size * 2 / link.bandwidth)
    ar += 2 * m.num_layers * link.latency
    assert p2["allreduce"] == pytest.approx(ar, rel=1e-12)
    assert r2.step_time(*step) < r1.step_time(*step)
    # memory-bound decode: half the weights per GPU (activations are not split: ~half)
    step = (0, 0.0, 0, 1, 1024)
    p1, p2 = r1.breakdown(*step), r2.breakdown(*step)
    assert p2["gemm"] == pytest.approx(p1["gemm"] / 2, rel=1e-3)
    assert p2["allreduce"] == pytest.approx(2 * m.num_layers * (link.latency + 4096 * 2 / 450e9))


def test_interface_and_describe():
    r = RooflineLatencyModel(MODELS["llama-3-70b"], GPUS["h200"], tp=4)
    assert isinstance(r, StepLatencyModel)
    assert r.name == "roofline"
    d = r.describe()
    assert d["kind"] == "roofline" and d["gpu"] == "h200" and d["tp"] == 4
    assert d["ceilings"] == {"flops": "measured", "bandwidth": "measured"}
    assert d["allreduce_link"]["bandwidth"] == 450e9
    assert any("optimistic" in w for w in d["warnings"])
    assert RooflineLatencyModel(TINY, TOY_GPU).describe()["allreduce_link"] is None


def test_bad_tp_is_config_error():
    with pytest.raises(ConfigError) as e:
        RooflineLatencyModel(MODELS["llama-3-8b"], GPUS["h200"], tp=3, where="x.yaml", key="hw.tp")
    assert (e.value.where, e.value.key) == ("x.yaml", "hw.tp")
