"""Models served today beyond Llama-style dense GQA: config.json loading (issue 15, item 1).

Parameter counts are checked against the totals the model cards publish, which checks the
shipped config.json literals and the counting together.
"""

from __future__ import annotations

import json

import pytest

from simulator.errors import ConfigError
from simulator.hf_catalog import HF_CONFIGS
from simulator.models import MODELS, load_model

#: (total, active) parameters in billions as published on the model cards; gpt-oss's "active"
#: excludes the embedding (OpenAI's model card), so 0.58B is added here for it.
PUBLISHED = {
    "qwen3-8b": (8.2, 8.2),
    "qwen3-30b-a3b": (30.5, 3.3),
    "mixtral-8x7b": (46.7, 12.9),
    "deepseek-v2-lite": (15.7, None),
    "deepseek-v3": (671, 37),
    "gpt-oss-20b": (20.9, 3.6 + 0.58),
    "gpt-oss-120b": (116.8, 5.1 + 0.58),
    "gemma-3-27b": (27.0, 27.0),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_model_cards(name):
    total, active = PUBLISHED[name]
    m = MODELS[name]
    assert m.num_params / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert m.num_active_params / 1e9 == pytest.approx(active, rel=0.03)


def test_layer_patterns():
    gemma = MODELS["gemma-3-27b"]
    assert gemma.num_full_layers == 10 and gemma.layer_types[5] == "full_attention"
    assert gemma.sliding_window == 1024 and gemma.tie_embeddings
    oss = MODELS["gpt-oss-20b"]
    assert oss.layer_types[:2] == ("sliding_attention", "full_attention")
    assert oss.num_full_layers == 12 and oss.sliding_window == 128 and oss.attention_sinks
    v3 = MODELS["deepseek-v3"]
    assert v3.mla.cache_width == 576 and v3.moe.first_dense_layers == 3
    assert v3.num_moe_layers == 58
    assert MODELS["llama-3.1-8b"].max_model_len == 131072


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_config_json_file_equals_catalog(tmp_path, name):
    """A config.json on disk loads through `model: {config: ...}` to the catalog's spec."""
    _, cfg = HF_CONFIGS[name]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_theta": 1e6}))
    exp = tmp_path / "e.yaml"
    exp.write_text("")
    m = load_model({"config": "config.json", "name": name}, str(exp), "model")
    assert m == MODELS[name]


def test_config_json_overrides_and_strictness(tmp_path):
    _, cfg = HF_CONFIGS["qwen3-8b"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model({"config": str(path), "max_model_len": 4096, "kv_cache_dtype": "fp8"}, "x", "m")
    assert (m.max_model_len, m.kv_cache_dtype, m.name) == (4096, "fp8", tmp_path.name.lower())
    with pytest.raises(ConfigError, match="m.num_layers"):
        load_model({"config": str(path), "num_layers": 3}, "x", "m")
    path.write_text(json.dumps({**cfg, "use_sliding_window": True}))
    with pytest.raises(ConfigError, match="use_sliding_window.*not modelled"):
        load_model({"config": str(path)}, "x", "m")
    path.write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError, match="architectures"):
        load_model({"config": str(path)}, "x", "m")
    ds = dict(HF_CONFIGS["deepseek-v3"][1], quantization_config={"quant_method": "fp8"})
    path.write_text(json.dumps(ds))
    assert load_model({"config": str(path)}, "x", "m").weights == "fp8"


def test_gpt_oss_router_k_named_twice_must_agree(tmp_path):
    """gpt-oss files may give the router's k as num_experts_per_tok and experts_per_token."""
    _, cfg = HF_CONFIGS["gpt-oss-20b"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "experts_per_token": 4}))  # the same k: accepted
    assert load_model({"config": str(path)}, "x", "m").moe.top_k == 4
    alone = {k: v for k, v in cfg.items() if k != "num_experts_per_tok"}
    path.write_text(json.dumps({**alone, "experts_per_token": 2}))  # the other name alone
    assert load_model({"config": str(path)}, "x", "m").moe.top_k == 2
    path.write_text(json.dumps({**cfg, "experts_per_token": 8}))
    with pytest.raises(ConfigError, match="8 differs from num_experts_per_tok 4"):
        load_model({"config": str(path)}, "x", "m")


# ---- item 2: KV per layer group ---------------------------------------------------------------

#: KV bytes per token per GPU at TP1, bf16, by hand: layers x 2 (K, V) x kv_heads x head_dim x 2 B
#: for attention with K and V; layers x (kv_lora_rank + qk_rope_head_dim) x 2 B for MLA.
KV_BYTES_BY_HAND = {
    "llama-3.1-8b": 32 * 2 * 8 * 128 * 2,
    "qwen3-8b": 36 * 2 * 8 * 128 * 2,
    "qwen3-30b-a3b": 48 * 2 * 4 * 128 * 2,
    "mixtral-8x7b": 32 * 2 * 8 * 128 * 2,
    "deepseek-v2-lite": 27 * (512 + 64) * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,
    "gpt-oss-20b": 24 * 2 * 8 * 64 * 2,
    "gpt-oss-120b": 36 * 2 * 8 * 64 * 2,
    "gemma-3-27b": 62 * 2 * 16 * 128 * 2,
}


@pytest.mark.parametrize("name", sorted(KV_BYTES_BY_HAND))
def test_kv_bytes_per_token_by_hand(name):
    from simulator.served import ShardedModel

    assert ShardedModel(MODELS[name]).kv_bytes_per_token_per_gpu == KV_BYTES_BY_HAND[name]


def test_mla_latent_is_replicated_over_tp():
    from simulator.served import ShardedModel

    m = MODELS["deepseek-v2-lite"]
    one, two = ShardedModel(m, 1), ShardedModel(m, 2)
    assert two.kv_bytes_per_token_per_gpu == one.kv_bytes_per_token_per_gpu == 31104
    assert two.kv_bytes_per_token == 31104  # the group holds one copy's worth of information


def test_mla_capacity_on_h200():
    """MLA's 576-element latent: DeepSeek-V2-Lite holds ~4x the tokens of Qwen3-8B's GQA per
    GiB; capacity in blocks is the KV budget over one block's bytes."""
    from simulator.hardware import GPUS, kv_capacity_blocks
    from simulator.served import ShardedModel

    m, gpu = MODELS["deepseek-v2-lite"], GPUS["h200"]
    blocks = kv_capacity_blocks(m, gpu, 1, 16)
    sm = ShardedModel(m)
    from simulator.hardware import default_activation_reserve_bytes

    free = gpu.memory_bytes * 0.9 - sm.weight_bytes_per_gpu - default_activation_reserve_bytes(m)
    assert blocks == int(free // (16 * 31104))


def test_pool_of_layer_groups():
    from simulator.served import ShardedModel, pool_unit_layers

    pool = ShardedModel(MODELS["gemma-3-27b"]).kv_pool(16)
    (full, mf), (slide, ms) = pool.groups
    # as vLLM 0.24 groups them: pages of 10 layers (the "1" of Gemma 3's 5:1), the 52 sliding
    # layers padded to 6 pages (vLLM's log: "Add 8 padding layers")
    assert (full.num_layers, mf, slide.num_layers, ms) == (10, 1, 52, 6)
    assert slide.sliding_window == 1024 and pool.frees_blocks
    assert pool.unit_bytes == 16 * 2 * 16 * 128 * 2 * 10
    # vLLM 0.24 at 0.92 utilization reported 59,824 such pages on an H200 (its log); servesim's
    # budget gives 61,161 (+2.2%: its weights are 0.43 GiB lighter than the 50.74 GiB vLLM
    # loaded, and its activation reserve smaller); before the padding it held 13% more
    from simulator.hardware import GPUS, kv_capacity_blocks

    pages = kv_capacity_blocks(MODELS["gemma-3-27b"], GPUS["h200"], 1, 16, 0.92, max_num_seqs=1024)
    assert abs(pages / 59824 - 1) < 0.03
    # near-equal types share one page size (12 sliding + 13 full: 13), else the smaller count
    assert pool_unit_layers([12, 13]) == 13 and pool_unit_layers([52, 10]) == 10
    assert pool_unit_layers([24]) == 24
    llama = ShardedModel(MODELS["llama-3-8b"]).kv_pool(16)
    assert llama.blocks_per_row == 1 and not llama.frees_blocks
    assert llama.unit_bytes == 16 * 131072


def test_sliding_window_frees_blocks_as_the_request_advances():
    from simulator.kv.layered import LayeredPagedAllocator
    from simulator.request import Request
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS["gpt-oss-20b"])  # 12 full + 12 sliding layers, window 128
    kv = LayeredPagedAllocator(1000, 16, sm.kv_pool(16), sm.kv_reads())
    req = Request(0, 0.0, 1000, 500)
    assert kv.allocate(req, 1000)  # the prompt in one chunk holds every block of both groups
    assert len(req.block_table) == 2 * 63 and kv.capacity(req) == 1008
    req._num_computed = 1000
    while kv.capacity(req) < 1500:  # decode growth, a row at a time
        assert kv.extend(req) > 0
    cap = kv.capacity(req)
    # full group: every row; sliding group: rows from the first one that the query at the last
    # growth (position cap - 16, the capacity before it) reads
    assert len(req.block_table) == cap // 16 + (cap // 16 - (cap - 16 - 128 + 1) // 16)
    assert kv.num_free_blocks + len(req.block_table) == 1000
    kv.free(req)
    assert kv.num_free_blocks == 1000 and not kv._state


def test_windowed_reads_against_brute_force():
    from simulator.decode import DecodeSet
    from simulator.request import Request
    from simulator.served import WindowedReads

    r = WindowedReads(window=7, full_fraction=0.25)
    for c in range(0, 20):
        for n in range(1, 12):
            brute = sum(0.25 * (q + 1) + 0.75 * min(q + 1, 7) for q in range(c, c + n))
            assert r.prefill_pairs(c, n) == pytest.approx(brute)
    d = DecodeSet(window=7)
    reqs = []
    for i, ctx in enumerate([1, 3, 6, 9]):
        q = Request(i, 0.0, ctx, 50)
        q._num_computed = ctx - 1
        d.add(q, 64)
        reqs.append(q)
    for _ in range(8):
        ctxs = [q.num_computed + 1 for q in reqs]
        assert d.decode_excess() == sum(max(0, c - 7) for c in ctxs)
        assert r.decode(d.decode_ctx(), d.decode_excess()) == pytest.approx(
            sum(r.one(c) for c in ctxs)
        )
        d.clock += 1
    d.remove(reqs[3])
    reqs.pop()
    assert d.decode_excess() == sum(max(0, q.num_computed + 1 - 7) for q in reqs)


#: Bytes one GPU holds (`ShardedModel.kv_bytes_held`) at 16-token blocks, TP1, bf16, by hand.
#: gpt-oss-20b: 12 full + 12 sliding layers (window 128), 2 x 8 x 64 x 2 B = 2,048 B per layer
#: and token; a sliding layer at n computed tokens has freed (n - 128 + 1) // 16 blocks (the
#: allocator's rule): 248 blocks at 4,096 and 2,040 at 32,768, so it holds 128 tokens in both.
#: Gemma-3-27B: 10 full + 52 sliding layers (window 1,024), 2 x 16 x 128 x 2 B = 8,192 B; a
#: sliding layer frees 192 blocks at 4,096 and 1,984 at 32,768: it holds 1,024 tokens.
KV_HELD_BY_HAND = {
    ("gpt-oss-20b", 4096): 4096 * 12 * 2048 + 128 * 12 * 2048,  # 103,809,024
    ("gpt-oss-20b", 32768): 32768 * 12 * 2048 + 128 * 12 * 2048,  # 808,452,096
    ("gemma-3-27b", 4096): 4096 * 10 * 8192 + 1024 * 52 * 8192,  # 771,751,936
    ("gemma-3-27b", 32768): 32768 * 10 * 8192 + 1024 * 52 * 8192,  # 3,120,562,176
}


@pytest.mark.parametrize(("name", "tokens"), sorted(KV_HELD_BY_HAND))
def test_kv_bytes_held_by_hand(name, tokens):
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS[name])
    assert sm.kv_bytes_held(tokens, 16) == KV_HELD_BY_HAND[name, tokens]
    assert sm.kv_bytes_held(tokens, 16) < tokens * sm.kv_bytes_per_token_per_gpu


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_kv_bytes_held_is_every_token_without_sliding_layers(name):
    """Full attention and MLA hold every token: swap and P/D bytes stay what they were."""
    from simulator.served import ShardedModel

    for tp in (1, 2):
        sm = ShardedModel(MODELS[name], tp)
        for n in (1, 17, 4096, 32768):
            assert sm.kv_bytes_held(n, 16) == n * sm.kv_bytes_per_token_per_gpu


def test_pd_transfer_of_a_sliding_model_copies_only_held_kv():
    """gpt-oss-20b, two 4,096-token prompts, 1P1D over NVLink (450 GB/s, 3 us): each copy is
    103,809,024 B (`KV_HELD_BY_HAND`), 0.5156x the 201,326,592 B of every layer x token."""
    from tests.policy_kit import config, simulate_config

    lengths = {"input": {"dist": "fixed", "value": 4096}, "output": {"dist": "fixed", "value": 2}}
    cfg = config(cluster={"mode": "disaggregated", "prefill": {"replicas": 1},
                          "decode": {"replicas": 1}, "link": "nvlink"},
                 model="gpt-oss-20b", hardware={"gpu": "h200"},
                 workload={"arrival": {"process": "poisson", "rate_per_s": 1.0},
                           "lengths": lengths, "num_requests": 2})  # fmt: skip
    pd = simulate_config(cfg)["disaggregation"]
    held, every = KV_HELD_BY_HAND["gpt-oss-20b", 4096], 4096 * 24 * 2048
    assert pd["transfers"] == 2 and pd["bytes"] == 2 * held
    assert pd["copy_s_mean"] == pytest.approx(3e-6 + held / 450e9)
    assert (pd["copy_s_mean"] - 3e-6) / (every / 450e9) == pytest.approx(held / every)
    assert held / every == pytest.approx(0.515625)


def test_swap_of_a_sliding_model_copies_only_held_kv():
    from policies.preemption import Preemption
    from simulator.cfg import Section
    from simulator.request import Request
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS["gpt-oss-20b"])
    engine = {"kv_bytes_held": lambda n: sm.kv_bytes_held(n, 16)}
    pre = Preemption(Section({"preemption": "swap"}, "t.yaml", "scheduler"), engine)
    req = Request(0, 0.0, 5000, 10)
    req._num_computed = 4096
    pre.swap_in(req)
    assert pre.stats["swap_in_s"] == pytest.approx(
        pre.link.latency + KV_HELD_BY_HAND["gpt-oss-20b", 4096] / pre.link.bandwidth
    )


# ---- item 3: mixture of experts ---------------------------------------------------------------


@pytest.mark.parametrize("experts,top_k,tokens", [(8, 2, 1), (8, 2, 5), (128, 8, 16), (64, 6, 3)])
def test_experts_touched_against_brute_force(experts, top_k, tokens):
    """Uniform routing: each token picks top_k distinct experts at random; the mean number of
    distinct experts over many simulated steps matches E (1 - (1 - k/E)^T)."""
    import numpy as np

    from simulator.served import expected_experts_touched

    rng = np.random.default_rng(0)
    trials = 4000
    keys = rng.random((trials, tokens, experts))
    picks = np.argpartition(keys, top_k, axis=2)[:, :, :top_k]  # k distinct experts per token
    touched = np.zeros((trials, experts), bool)
    np.put_along_axis(touched, picks.reshape(trials, -1), True, axis=1)
    brute = touched.sum(1).mean()
    assert expected_experts_touched(experts, top_k, tokens) == pytest.approx(brute, rel=0.01)
    skewed = expected_experts_touched(experts, top_k, tokens, skew=1.0)
    assert skewed < expected_experts_touched(experts, top_k, tokens) + 1e-9


def test_moe_step_counts_active_experts():
    from simulator.hardware import GPUS
    from simulator.latency.roofline import RooflineLatencyModel
    from simulator.served import ShardedModel

    m = MODELS["mixtral-8x7b"]
    sm = ShardedModel(m)
    # a token goes through 2 of 8 experts: FLOPs of the active linear weights only
    assert sm.linear_flops_per_token == pytest.approx(
        2 * (m.num_active_linear_params + 32 * 8 * 4096)
    )
    assert sm.step_min_bytes(1, 0) == pytest.approx(sm.active_weight_bytes)
    assert sm.active_weight_bytes < sm.weight_bytes / 3
    r = RooflineLatencyModel(m, GPUS["h200"], 1)
    one = r.breakdown(0, 0, 0, 1, 100)
    many = r.breakdown(0, 0, 0, 256, 25600)
    experts_bytes = 32 * 8 * 3 * 4096 * 14336 * 2
    # one token reads 2 of 8 experts' weights; 256 tokens touch (almost) all 8
    assert one["bytes"] < experts_bytes / 4 + 3e9
    assert many["bytes"] > experts_bytes * 0.99
    total = sum(one[k] for k in ("gemm", "attention", "elementwise", "lm_head", "allreduce"))
    assert r.step_time(0, 0, 0, 1, 100) == pytest.approx(total + one["overhead"])


def test_mla_attention_reads_the_latent():
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS["deepseek-v3"], 8)
    attn = sm.op("attention")
    assert attn.kv_bytes_per_key == 576 * 2  # one latent per key, not K and V per head
    assert sm.op("kv_a").shape == (576, 7168)  # replicated: not split over TP
    assert sm.heads == 16


def test_base_keeps_the_architecture():
    """`{base: <moe model>, ...}` keeps experts, MLA and layer types (never a silent dense
    model); a shape override that breaks them is a ConfigError."""
    m = load_model({"base": "qwen3-30b-a3b", "max_model_len": 4096}, "e.yaml", "model")
    assert m.moe == MODELS["qwen3-30b-a3b"].moe and m.max_model_len == 4096
    g = load_model({"base": "gemma-3-27b", "kv_cache_dtype": "fp8"}, "e.yaml", "model")
    assert g.layer_types == MODELS["gemma-3-27b"].layer_types and g.sliding_window == 1024
    with pytest.raises(ConfigError, match="layer_types"):
        load_model({"base": "gpt-oss-20b", "num_layers": 4}, "e.yaml", "model")


def test_mla_prefill_flops_by_hand():
    """DeepSeek-V2-Lite (27 layers, 16 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128,
    hidden 2,048), one 1,024-token prefill chunk with no prefix, TP1: causal pairs per layer
    1,024 x 1,025 / 2 = 524,800.

    * attention through vLLM's non-absorbed prefill path: 2 x 16 x (128 + 64 + 128) = 10,240
      FLOPs per pair and layer: 27 x 10,240 x 524,800 = 145,096,704,000 (the absorbed decode
      path's 2 x 16 x (576 + 512) = 34,816 would give 493,328,793,600);
    * up-projection of the chunk's 1,024 latents (its whole context): 2 x 512 x 16 x (128 +
      128) = 4,194,304 per token and layer, 27 x 1,024 x 4,194,304 = 115,964,116,992 (``kv_b``);
    * the other GEMMs per token: q 2 x 2,048 x 3,072, kv_a 2 x 2,048 x 576, o 2 x 2,048 x 2,048
      in 27 layers; one dense MLP 6 x 2,048 x 10,944; 26 MoE layers of router 2 x 2,048 x 64,
      6 routed experts 6 x 2,048 x 1,408 each and 2 shared 6 x 2,048 x 2,816.
    """
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS["deepseek-v2-lite"])
    pairs = 1024 * 1025 // 2
    attention = 27 * 10240 * pairs
    assert attention == 145_096_704_000
    up = 27 * 1024 * 2 * 512 * 16 * 256
    assert up == 115_964_116_992
    other = 27 * 2 * 2048 * (3072 + 576 + 2048) + 6 * 2048 * 10944
    other += 26 * (2 * 2048 * 64 + 6 * 6 * 2048 * 1408 + 6 * 2048 * 2816)
    total = attention + up + 1024 * other
    assert total == 4_735_879_872_512
    assert sm.step_flops(1024, pairs, prefill_pairs=pairs) == total
    # decode pairs keep the absorbed path
    assert sm.step_flops(0, 1, prefill_pairs=0) == 27 * 34816


def test_mla_prefill_attention_in_roofline_breakdown():
    from simulator.hardware import GPUS
    from simulator.latency.roofline import RooflineLatencyModel

    rl = RooflineLatencyModel(MODELS["deepseek-v2-lite"], GPUS["h200"])
    pairs = 1024 * 1025 / 2
    prefill = rl.breakdown(1024, pairs, 1, 0, 0)
    decode = rl.breakdown(0, 0, 0, 1024, pairs)
    lm = rl.served.op("lm_head").flops_per_token
    assert prefill["flops"] == pytest.approx(4_735_879_872_512 + lm, rel=1e-12)
    linear = 1024 * rl.served.linear_flops_per_token
    assert decode["flops"] == pytest.approx(linear + 27 * 34816 * pairs + 1024 * lm, rel=1e-12)


def test_mla_prefill_context_up_projection_by_hand():
    """DeepSeek-V2-Lite, TP1: a 1,024-token chunk after 3,072 cached tokens (an earlier chunk
    or a prefix-cache hit). vLLM's ``_compute_prefill_context`` gathers the 3,072 latents and
    up-projects them through ``kv_b`` again: 2 x 512 x 16 x (128 + 128) = 4,194,304 FLOPs per
    prefix token and layer, 27 x 3,072 x 4,194,304 = 347,892,350,976 FLOPs in the step.
    Bytes per prefix token and layer: the latent read from the cache (576 x 2 = 1,152), kv_b's
    activations (512 x 2 in + 16 x 256 x 2 out = 9,216) and the attention reading the expanded
    K (nope + rope) and V (16 x 320 x 2 = 10,240): 20,608, x 27 x 3,072 = 1,709,309,952."""
    from simulator.hardware import GPUS
    from simulator.latency.roofline import RooflineLatencyModel
    from simulator.served import ShardedModel

    sm = ShardedModel(MODELS["deepseek-v2-lite"])
    up = 27 * 3072 * 2 * 512 * 16 * 256
    assert up == 347_892_350_976
    assert sm.prefill_context_flops_per_token * 3072 == up
    assert sm.prefill_context_bytes_per_token * 3072 == 27 * 3072 * 20608 == 1_709_309_952
    pairs = 1024 * (3072 + 1025 / 2)  # the chunk's (query, key) pairs per layer
    without = sm.step_flops(1024, pairs, prefill_pairs=pairs)
    assert sm.step_flops(1024, pairs, prefill_pairs=pairs, prefill_ctx=3072) == without + up
    # TP2: half the heads per GPU, half the up-projection
    assert ShardedModel(MODELS["deepseek-v2-lite"], 2).prefill_context_flops_per_token == (
        27 * 2 * 512 * 8 * 256
    )
    # the roofline charges it under gemm (its own roofline: compute-bound here)
    rl = RooflineLatencyModel(MODELS["deepseek-v2-lite"], GPUS["h200"])
    assert rl.uses_prefill_ctx
    a, b = rl.breakdown(1024, pairs, 1, 0, 0), rl.breakdown(1024, pairs, 1, 0, 0, 3072)
    assert b["flops"] - a["flops"] == pytest.approx(up, rel=1e-12)
    assert b["bytes"] - a["bytes"] == pytest.approx(1_709_309_952, rel=1e-12)
    peak = rl._gemm_peak
    bw = rl.gpu.peak_bandwidth
    assert b["gemm"] - a["gemm"] == pytest.approx(max(up / peak, 1_709_309_952 / bw), rel=1e-9)
    assert rl.step_time(1024, pairs, 1, 0, 0, 0, prefill_ctx=3072) > rl.step_time(
        1024, pairs, 1, 0, 0, 0
    )
    # other models: no term, no flag, figures unchanged
    for name in ("llama-3-8b", "qwen3-30b-a3b", "gpt-oss-20b"):
        other = ShardedModel(MODELS[name])
        assert other.prefill_context_flops_per_token == 0.0
        assert not RooflineLatencyModel(MODELS[name], GPUS["h200"]).uses_prefill_ctx


def test_executor_passes_the_chunks_cached_prefix():
    """`SimulatedExecutor` sums ``num_computed`` over prefill chunks (not decodes, not a fresh
    prompt) and passes it to a model that reads it."""
    from simulator.executor import SimulatedExecutor, prefill_context
    from simulator.hardware import GPUS
    from simulator.latency.roofline import RooflineLatencyModel
    from simulator.plan import StepPlan
    from simulator.request import Request

    a, b, c = Request(0, 0.0, 4096, 10), Request(1, 0.0, 512, 10), Request(2, 0.0, 100, 10)
    a._num_computed, c._num_computed = 3072, 101  # c decodes (its 101st token)
    plan = StepPlan(chunks=((a, 1024), (b, 512), (c, 1)))
    assert prefill_context(plan) == 3072
    rl = RooflineLatencyModel(MODELS["deepseek-v2-lite"], GPUS["h200"])
    feats = (1536, 1024 * (3072 + 1025 / 2) + 512 * 513 / 2, 2, 1, 102, 102)
    t = SimulatedExecutor(rl).execute(plan, None, feats)
    assert t == rl.step_time(*feats, prefill_ctx=3072) > rl.step_time(*feats)
