"""Models from a Hugging Face ``config.json``: shapes only (no weights, no network).

`spec_from_hf_config(cfg, where, name)` reads the mapping of a ``config.json`` (the file itself:
`load_hf_config_file`) into a `ModelSpec` for the families servesim models:

==============  ===========================================================================
model_type      what is read beyond the Llama-style shapes
==============  ===========================================================================
llama, mistral  ``attention_bias``; Mistral's ``sliding_window`` (every layer slides)
qwen2, qwen3    q/k/v bias (qwen2); ``use_sliding_window`` must be false
qwen3_moe       ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``
mixtral         ``num_local_experts``, ``num_experts_per_tok``, ``sliding_window``
deepseek_v2/v3  MLA (``kv_lora_rank``, ``q_lora_rank``, ``qk_*_head_dim``, ``v_head_dim``) and
                MoE (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``)
gpt_oss         MoE, ``layer_types`` (alternating 128-token sliding window), attention sinks
gemma3          ``text_config`` (the vision tower is not modelled), 5 local : 1 global layers
==============  ===========================================================================

Reading is strict: every key of the file is either read, or in `IGNORED_KEYS` (fields that do
not change what a step computes, stores or reads: token ids, RoPE bases and scaling, norms'
epsilon, dropout, training-only router losses), or a ConfigError naming the file and the field;
so is a value servesim does not model (e.g. ``moe_layer_freq: 2``, ``use_sliding_window: true``,
an MXFP4 ``quantization_config``). Nothing is substituted silently: a default is used only for a
field the family's Hugging Face config class gives a default to, and each is listed below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import ConfigError
from simulator.files import DuplicateKey, loads_json_unique, read_text

if TYPE_CHECKING:
    from simulator.models import ModelSpec


def _arch():
    """`simulator.models`, imported when first needed: it imports this module to build its
    catalog, so a module-level import would make the two import each other half-built."""
    from simulator import models

    return models


#: model_type -> the ``architectures`` entry that goes with it
FAMILIES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma3_text": "Gemma3ForCausalLM",
}

#: Keys that change nothing servesim computes (listed, so that any other key is an error).
IGNORED_KEYS = frozenset(
    """architectures model_type torch_dtype dtype transformers_version bos_token_id
    eos_token_id pad_token_id rms_norm_eps rope_theta rope_scaling initializer_range use_cache
    hidden_act hidden_activation attention_dropout pretraining_tp _name_or_path auto_map
    max_window_layers norm_topk_prob output_router_logits router_aux_loss_coef
    router_jitter_noise topk_method n_group topk_group routed_scaling_factor scoring_func
    aux_loss_alpha seq_aux ep_size num_nextn_predict_layers swiglu_limit initial_context_length
    query_pre_attn_scalar final_logit_softcapping attn_logit_softcapping rope_local_base_freq
    cache_implementation use_bidirectional_attention boi_token_index eoi_token_index
    image_token_index mm_tokens_per_image vision_config head_dim_original
    """.split()
)

#: Defaults of Hugging Face's ``Gemma3TextConfig`` that published Gemma 3 files leave out.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "max_position_embeddings": 131072,
    "sliding_window_pattern": 6,
    "tie_word_embeddings": True,
}


class _Fields:
    """The mapping of a config.json, remembering which keys were read (strict reading)."""

    def __init__(self, data: Any, where: str, prefix: str = ""):
        if not isinstance(data, Mapping):
            raise ConfigError(where, prefix or "<top>", f"expected a JSON object, got {data!r:.40}")
        self.data, self.where, self.prefix, self.used = data, where, prefix, set()

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.where, self.prefix + key, message)

    def get(self, key: str, default: Any = ..., kind: type = int) -> Any:
        """The value of ``key`` (``default`` when absent; required when no default), checked to
        be a ``kind`` (positive for int; None allowed only as the default)."""
        self.used.add(key)
        if key not in self.data or (self.data[key] is None and default is None):
            if default is ...:
                raise self.error(key, "required field is missing")
            return default
        value = self.data[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise self.error(key, f"expected a positive integer, got {value!r}")
        if kind is not int and not isinstance(value, kind):
            raise self.error(key, f"expected {kind.__name__}, got {value!r}")
        return value

    def require_value(self, key: str, allowed: tuple, why: str) -> None:
        """Accept ``key`` only at one of ``allowed`` values (absent counts as the first)."""
        self.used.add(key)
        value = self.data.get(key, allowed[0])
        if value not in allowed:
            raise self.error(key, f"{value!r} is not modelled ({why}); expected {allowed}")

    def done(self) -> None:
        for key in self.data:
            if key not in self.used and key not in IGNORED_KEYS:
                raise self.error(key, "unsupported field: servesim does not model it")


def load_hf_config_file(path: str | Path, where: str, key: str, **overrides: Any) -> ModelSpec:
    """Read a ``config.json`` file into a ModelSpec named after its folder (or ``name``)."""
    text = read_text(path, "model config.json")
    try:
        data = loads_json_unique(text)
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), f"line {e.lineno}", f"not valid JSON: {e.msg}") from None
    except DuplicateKey as e:
        raise ConfigError(
            str(path), e.key, "duplicate key: given twice in one JSON object"
        ) from None
    name = overrides.pop("name", None) or Path(path).resolve().parent.name.lower()
    return spec_from_hf_config(data, str(path), name, **overrides)


def spec_from_hf_config(data: Any, where: str, name: str, **overrides: Any) -> ModelSpec:
    """A config.json mapping -> ModelSpec (see the module docstring); ``overrides`` are
    ModelSpec fields given beside the file (``max_model_len``, ``weights``, ...)."""
    top = _Fields(data, where)
    family = top.get("model_type", kind=str)
    if family not in FAMILIES:
        raise top.error("model_type", f"unsupported architecture {family!r}; supported: "
                        f"{', '.join(sorted(FAMILIES))}")  # fmt: skip
    archs = top.get("architectures", [FAMILIES[family]], kind=list)
    if archs != [FAMILIES[family]]:
        raise top.error("architectures", f"expected [{FAMILIES[family]!r}] for model_type "
                        f"{family!r}, got {archs!r}")  # fmt: skip
    f = top
    if family == "gemma3":
        f = _Fields({**GEMMA3_TEXT_DEFAULTS, **top.get("text_config", kind=dict)}, where,
                    "text_config.")  # fmt: skip
        top.get("tie_word_embeddings", None, kind=bool)
        top.done()
    elif family == "gemma3_text":
        f = _Fields({**GEMMA3_TEXT_DEFAULTS, **data}, where)
    fields = _common_fields(f, family)
    fields.update(_FAMILY_READERS.get(family, _no_extras)(f, fields))
    weights = _quantization(f)
    f.done()
    if weights is not None:
        fields["weights"] = weights
    fields.update(overrides)
    try:
        return _arch().ModelSpec(name=name, family=family, **fields)
    except ValueError as e:
        raise ConfigError(where, "<model>", str(e)) from None


def _common_fields(f: _Fields, family: str) -> dict:
    """The Llama-style shape fields every family has."""
    heads = f.get("num_attention_heads")
    return {
        "num_layers": f.get("num_hidden_layers"),
        "hidden_size": f.get("hidden_size"),
        "num_heads": heads,
        "num_kv_heads": f.get("num_key_value_heads", heads),
        "head_dim": f.get("head_dim", None),
        "intermediate_size": f.get("intermediate_size"),
        "vocab_size": f.get("vocab_size"),
        "max_model_len": f.get("max_position_embeddings"),
        "tie_embeddings": f.get("tie_word_embeddings", False, kind=bool),
    }


def _quantization(f: _Fields) -> str | None:
    """A checkpoint's ``quantization_config``: FP8 (DeepSeek-V3's block-wise W8A8) maps to
    ``weights: fp8``; any other method is an error (MXFP4, AWQ, GPTQ: give ``weights:``)."""
    q = f.get("quantization_config", None, kind=dict)
    if q is None:
        return None
    method = q.get("quant_method")
    if method != "fp8":
        raise f.error(
            "quantization_config",
            f"quant_method {method!r} is not modelled; remove the field and set the model's "
            "weights: bf16 | fp8 | int4",
        )
    return "fp8"


def _no_extras(f: _Fields, fields: dict) -> dict:
    return {}


def _llama(f: _Fields, fields: dict) -> dict:
    f.require_value("mlp_bias", (False,), "MLP biases")
    out = {"qkv_bias": f.get("attention_bias", False, kind=bool)}
    window = f.get("sliding_window", None)
    if window is not None:  # Mistral-7B-v0.1: every layer slides
        out.update(layer_types=("sliding_attention",) * fields["num_layers"], sliding_window=window)
    return out


def _qwen(f: _Fields, fields: dict) -> dict:
    f.require_value("use_sliding_window", (False,), "Qwen's per-layer sliding window")
    f.get("sliding_window", None)  # read, unused while use_sliding_window is false
    f.require_value("attention_bias", (False,), "o-projection bias")
    return {"qkv_bias": f.data.get("model_type") == "qwen2"}


def _qwen3_moe(f: _Fields, fields: dict) -> dict:
    out = _qwen(f, fields)
    f.require_value("decoder_sparse_step", (1,), "MoE in every layer only")
    f.require_value("mlp_only_layers", ([],), "MoE in every layer only")
    moe = _arch().MoEConfig(
        num_experts=f.get("num_experts"),
        top_k=f.get("num_experts_per_tok"),
        expert_intermediate_size=f.get("moe_intermediate_size"),
    )
    return {**out, "moe": moe}


def _mixtral(f: _Fields, fields: dict) -> dict:
    out = _llama(f, fields)
    out["moe"] = _arch().MoEConfig(
        num_experts=f.get("num_local_experts"),
        top_k=f.get("num_experts_per_tok"),
        expert_intermediate_size=fields["intermediate_size"],
    )
    return out


def _deepseek(f: _Fields, fields: dict) -> dict:
    f.require_value("moe_layer_freq", (1,), "MoE in every layer past the dense ones only")
    f.require_value("attention_bias", (False,), "attention biases")
    mla = _arch().MLAConfig(
        kv_lora_rank=f.get("kv_lora_rank"),
        qk_nope_head_dim=f.get("qk_nope_head_dim"),
        qk_rope_head_dim=f.get("qk_rope_head_dim"),
        v_head_dim=f.get("v_head_dim"),
        q_lora_rank=f.get("q_lora_rank", None),
    )
    moe = _arch().MoEConfig(
        num_experts=f.get("n_routed_experts"),
        top_k=f.get("num_experts_per_tok"),
        expert_intermediate_size=f.get("moe_intermediate_size"),
        num_shared_experts=f.get("n_shared_experts", 0),
        first_dense_layers=f.get("first_k_dense_replace", 0),
    )
    # MLA caches one latent per token; head_dim is the query/key width (nope + rope)
    return {"mla": mla, "moe": moe, "head_dim": mla.qk_nope_head_dim + mla.qk_rope_head_dim}


def _gpt_oss(f: _Fields, fields: dict) -> dict:
    f.require_value("attention_bias", (True,), "gpt-oss has q/k/v/o biases")
    experts = f.get("num_local_experts")
    # gpt-oss's files name the router's k twice; both present must agree
    top_k = f.get("num_experts_per_tok", None)
    other = f.get("experts_per_token", None if top_k is not None else ...)
    if top_k is not None and other is not None and other != top_k:
        raise f.error("experts_per_token", f"{other} differs from num_experts_per_tok {top_k}: "
                      "which k the router uses is ambiguous")  # fmt: skip
    top_k = top_k if top_k is not None else other
    return {
        "qkv_bias": True,
        "attention_sinks": True,
        **_layer_types(f, fields["num_layers"]),
        "moe": _arch().MoEConfig(num_experts=experts, top_k=top_k,
                         expert_intermediate_size=fields["intermediate_size"], expert_bias=True),
    }  # fmt: skip


def _gemma3(f: _Fields, fields: dict) -> dict:
    f.require_value("attention_bias", (False,), "attention biases")
    return _layer_types(f, fields["num_layers"], pattern_key="sliding_window_pattern")


def _layer_types(f: _Fields, num_layers: int, pattern_key: str | None = None) -> dict:
    """``layer_types`` as listed, else Gemma 3's pattern (every ``pattern``-th layer global)."""
    window = f.get("sliding_window")
    types = f.get("layer_types", None, kind=list)
    if pattern_key is not None:
        pattern = f.get(pattern_key)
        if types is None:
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(num_layers)]  # fmt: skip
    if types is None:
        raise f.error("layer_types", "required field is missing")
    if len(types) != num_layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise f.error("layer_types", f"expected {num_layers} entries of full_attention | "
                      "sliding_attention")  # fmt: skip
    return {"layer_types": tuple(types), "sliding_window": window}


_FAMILY_READERS = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _qwen,
    "qwen3": _qwen,
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
}

__all__ = ["FAMILIES", "IGNORED_KEYS", "load_hf_config_file", "spec_from_hf_config"]
