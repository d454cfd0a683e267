"""A Hugging Face ``config.json`` for a catalog model, so an engine can build it with dummy weights.

Why: vLLM builds a model from its ``config.json``; with ``load_format="dummy"`` it never reads
weights, and step times do not depend on weight values. Generating the file from the catalog's
`ModelSpec` (the same numbers the simulator uses) means the table measures exactly the shapes the
simulator will charge, with no network and no weights.

Only the fields that decide shapes and kernels are set; the architecture name picks vLLM's model
class (``LlamaForCausalLM`` for Llama-style GQA + SwiGLU, ``Qwen2ForCausalLM`` when the q/k/v
projections carry a bias). Rotary parameters are the published ones; they change numbers, not
time.
"""

from __future__ import annotations

import json
from pathlib import Path

from simulator.hf_catalog import HF_CONFIGS
from simulator.hf_models import GEMMA3_TEXT_DEFAULTS
from simulator.models import ModelSpec
from simulator.precision import Precision
from simulator.served import ShardedModel

#: rope_theta per catalog family (published configs); any value gives the same step time
_ROPE_THETA = {"llama-3": 500000.0, "llama-3.1": 500000.0, "qwen2.5": 1000000.0}
#: the published ``rope_scaling`` of families served past their pre-training context
#: (meta-llama/Llama-3.1-8B config.json): it changes RoPE's frequencies, not a kernel's shape
_ROPE_SCALING = {
    "llama-3.1": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}  # fmt: skip


#: fields a published config.json has that the catalog's subsets leave out (they change no
#: shape: numerics and token ids), for the architectures an engine table was measured on from a
#: catalog subset (`simulator.hf_catalog`)
_PUBLISHED_EXTRAS = {
    "Qwen3MoeForCausalLM": {
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
        "attention_bias": False, "norm_topk_prob": True, "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    # google/gemma-3-27b-it's text_config: softcapping off, query scale 1/sqrt(hidden / heads),
    # global layers' RoPE stretched 8x for 128k, local layers' base 10k
    "Gemma3ForConditionalGeneration": {
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 168,
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "attention_bias": False, "bos_token_id": 2,
        "eos_token_id": 1,
    },
    # mistralai/Mixtral-8x7B-v0.1: the published file's numerics (8 experts, top-2, RoPE base 1e6)
    "MixtralForCausalLM": {
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "hidden_act": "silu",
        "attention_dropout": 0.0, "router_aux_loss_coef": 0.02, "output_router_logits": False,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    # deepseek-ai/DeepSeek-V2-Lite: greedy softmax top-6 routing over one group, YaRN RoPE
    # stretched 40x from 4k (it changes the rotary cache and softmax scale, not a kernel)
    "DeepseekV2ForCausalLM": {
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "rope_scaling": {
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
        },
        "topk_method": "greedy", "n_group": 1, "topk_group": 1, "scoring_func": "softmax",
        "norm_topk_prob": False, "routed_scaling_factor": 1.0, "attention_bias": False,
        "bos_token_id": 100000, "eos_token_id": 100001,
    },
    # openai/gpt-oss-20b: YaRN RoPE stretched 32x from 4k, clamped SwiGLU (limit 7), its token
    # ids. Its checkpoint's MXFP4 quantization_config is left out with the catalog's: the
    # experts run vLLM's bf16 fused-MoE kernels (with biases), not its MXFP4 ones
    "GptOssForCausalLM": {
        "rms_norm_eps": 1e-5, "rope_theta": 150000, "hidden_act": "silu", "swiglu_limit": 7.0,
        "rope_scaling": {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096, "truncate": False,
        },
        "initial_context_length": 4096, "experts_per_token": 4, "attention_dropout": 0.0,
        "router_aux_loss_coef": 0.9, "output_router_logits": False, "pad_token_id": 199999,
        "eos_token_id": 200002,
    },
    # deepseek-ai/DeepSeek-V3: sigmoid scores with a correction bias, top-8 of 4 of 8 expert
    # groups (``noaux_tc``), weights scaled 2.5; YaRN x40 from 4k. Its multi-token-prediction
    # layer (``num_nextn_predict_layers``) is left out: vLLM runs it only as a draft model
    "DeepseekV3ForCausalLM": {
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "rope_scaling": {
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        },
        "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1,
    },
}  # fmt: skip
#: a checkpoint's own quantization, by architecture and weight format, where it is not
#: `engine_precision`'s: DeepSeek-V3 ships block-wise FP8 (128 x 128 weight tiles, one scale
#: each; activations scaled per token group), which vLLM serves with block-FP8 GEMMs and MoE
_PUBLISHED_QUANT = {
    ("DeepseekV3ForCausalLM", "fp8"): {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": [128, 128],
    },
}  # fmt: skip


def hf_config(spec: ModelSpec, shard_tp: int | None = None) -> dict:
    """The ``config.json`` dict for ``spec``; int4 weights add a GPTQ checkpoint's
    ``quantization_config`` and fp8 weights an FP8 one (see `engine_precision`; a checkpoint's
    own, ``_PUBLISHED_QUANT``, where it has one). A catalog model whose published config
    servesim ships (`simulator.hf_catalog`) for an architecture in ``_PUBLISHED_EXTRAS`` gets
    that config (the same numbers its `ModelSpec` was read from), completed; Llama- and
    Qwen2-style models are written from the spec. With ``shard_tp``: the model one GPU of that
    TP layout runs (`shard_config`)."""
    cfg = _full_config(spec)
    return cfg if shard_tp is None else shard_config(cfg, spec, shard_tp)


def _full_config(spec: ModelSpec) -> dict:
    published = HF_CONFIGS.get(spec.name)
    if published and published[1]["architectures"][0] in _PUBLISHED_EXTRAS:
        arch = published[1]["architectures"][0]
        cfg = {**published[1], **_PUBLISHED_EXTRAS[arch]}
        if arch == "Gemma3ForConditionalGeneration":
            cfg = _gemma3_text(cfg)
        cfg["torch_dtype"] = "bfloat16"
        cfg["max_position_embeddings"] = spec.max_model_len
        cfg.update(engine_precision(spec.weights, spec.kv_cache_dtype)[0])
        if (arch, spec.weights) in _PUBLISHED_QUANT:
            cfg["quantization_config"] = dict(_PUBLISHED_QUANT[arch, spec.weights])
        return cfg
    family = spec.name.rsplit("-", 1)[0]
    qwen = spec.qkv_bias
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_model_len,
        "rms_norm_eps": 1e-5 if not qwen else 1e-6,
        "rope_theta": _ROPE_THETA.get(family, 10000.0),
        "hidden_act": "silu",
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if not qwen:
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
    if family in _ROPE_SCALING:
        cfg["rope_scaling"] = dict(_ROPE_SCALING[family])
    cfg.update(engine_precision(spec.weights, spec.kv_cache_dtype)[0])
    return cfg


#: the width fields a TP layout splits, besides heads and vocabulary: dense MLP (or, in
#: Mixtral's and gpt-oss's configs, the experts') and expert intermediate sizes
_SPLIT_WIDTHS = ("intermediate_size", "moe_intermediate_size")


def shard_config(cfg: dict, spec: ModelSpec, tp: int) -> dict:
    """``cfg`` with the shapes one GPU of a ``tp``-way TP layout computes, as
    `simulator.served.ShardedModel` describes them (vLLM's column / row-parallel split): query
    and KV heads (replicated where ``tp`` exceeds them), the MLP and expert intermediate sizes
    and the vocabulary split ``tp`` ways; hidden size, head size, layers, experts, top-k and
    MLA's latent ranks (replicated in vLLM) unchanged. An engine running it at TP1 times one
    GPU's step of the layout without the collectives (`simulator.latency.shard`)."""
    sm = ShardedModel(spec, tp)  # checks that tp divides the model (ConfigError)
    out = dict(cfg)
    out["num_attention_heads"] = sm.heads
    out["num_key_value_heads"] = sm.kv_heads
    out["vocab_size"] = sm.vocab
    for key in _SPLIT_WIDTHS:
        if key in out:
            out[key] = out[key] // tp
    # special token ids past the shard's vocabulary would index its logits out of bounds (the
    # min-tokens processor masks EOS; seen: gpt-oss-120b's 200002 at a vocabulary of 100544):
    # the last ids stand in for them (an id changes no shape)
    for i, key in enumerate(("eos_token_id", "pad_token_id", "bos_token_id")):
        if isinstance(out.get(key), int) and out[key] >= sm.vocab:
            out[key] = sm.vocab - 1 - i
    return out


def _gemma3_text(cfg: dict) -> dict:
    """Gemma 3's text model alone (``Gemma3ForCausalLM``): the published file is the
    vision-language model, whose tower servesim does not model and a text-only profile never
    runs; the text config's defaults the published file leaves out are written out, and its
    layer pattern as the explicit ``layer_types`` list vLLM reads."""
    text = {**GEMMA3_TEXT_DEFAULTS, **cfg.pop("text_config"), **cfg}
    pattern = text.pop("sliding_window_pattern")
    text["layer_types"] = [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(text["num_hidden_layers"])
    ]
    return {**text, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}


#: a 4-bit weight-only checkpoint as GPTQ writes it (symmetric, group size 128, no act-order).
#: vLLM 0.24 serves ``quant_method: gptq`` with its ``auto_gptq`` method, which takes the first
#: usable kernel of its mixed-precision list (``kernels/linear/__init__.py``,
#: ``_POSSIBLE_KERNELS``): on Hopper that is Machete (CUTLASS, sm90; the CutlassW4A8 kernel ahead
#: of it needs FP8 activations), Marlin elsewhere. ``modules_in_block_to_quantize`` is required:
#: without it vLLM 0.24 quantizes no layer at all (``gptq_utils.is_layer_gptq_quantized`` is
#: ``any()`` over the empty list) and, on dummy weights, silently serves bf16 (seen: a first
#: "int4" run loaded 14.96 GiB of weights, exactly the bf16 model)
GPTQ_INT4 = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "sym": True,
    "checkpoint_format": "gptq",
    "modules_in_block_to_quantize": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ],
}  # fmt: skip


#: an FP8 checkpoint as vLLM's own fp8 method writes and reads it (per-tensor weight scales)
FP8_W8A8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}


def engine_precision(weights: str, kv_cache_dtype: str) -> tuple[dict, dict]:
    """``(config.json additions, engine arguments)`` that make vLLM serve these precisions.

    * fp8 weights: an FP8 checkpoint config (``quant_method: fp8``, per-tensor weight scales,
      dynamic activation scales), vLLM's W8A8 path with FP8 tensor-core GEMMs. A checkpoint
      config and not ``--quantization fp8`` on a bf16 one: that path first materializes bf16
      weights, which for Llama-3-70B do not fit the H200 the FP8 model is served on;
    * int4 weights: a GPTQ checkpoint config (4-bit, group 128), weight-only: bf16 activations;
    * fp8 KV cache: ``kv_cache_dtype="fp8"`` (e4m3).
    """
    Precision(weights, kv_cache_dtype)  # names checked there (ValueError)
    quant = {"int4": GPTQ_INT4, "fp8": FP8_W8A8}.get(weights)
    cfg = {"quantization_config": dict(quant)} if quant else {}
    args = {"kv_cache_dtype": "fp8"} if kv_cache_dtype == "fp8" else {}
    return cfg, args


def write_model_dir(spec: ModelSpec, out_dir: Path, shard_tp: int | None = None) -> Path:
    """Write ``config.json`` (of one GPU's shard of a ``shard_tp`` layout, when given) into
    ``out_dir`` (created) and return the folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(spec, shard_tp)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out_dir
