"""Model shapes: the numbers a latency or memory model needs about a transformer.

A `ModelSpec` describes a decoder-only transformer of the Llama family: RMSNorm, rotary
embeddings, grouped-query attention (MHA when ``num_kv_heads == num_heads``, MQA when it is 1) and
a SwiGLU MLP (gate, up, down projections). Weight values never matter to the simulator, only
shapes and precision: they decide how many bytes a step reads and how many FLOPs it does.

Invariants (checked in ``__post_init__``; user input is checked earlier, in `load_model`, so that
errors name the file and key):

* all sizes are positive; ``num_heads % num_kv_heads == 0``;
* ``head_dim`` defaults to ``hidden_size // num_heads`` and then must divide it exactly;
* ``weights`` is a weight format of `simulator.precision.WEIGHT_FORMATS` (bf16 | fp8 | int4)
  and ``kv_cache_dtype`` one of `KV_CACHE_DTYPES` (bf16 | fp8): precision is named, and every
  byte width follows from the name (`simulator.served.ShardedModel`), never given as a number.

The catalog `MODELS` holds the published Hugging Face ``config.json`` values of a few popular
models. It is a dict of frozen dataclasses built from literals: nothing is read from disk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from simulator.cfg import REQUIRED, Section
from simulator.errors import ConfigError
from simulator.precision import KV_CACHE_DTYPES, WEIGHT_FORMATS, Precision

#: Keys that once gave precision as free-form byte widths, and what replaces each.
RETIRED_PRECISION_KEYS = {
    "bytes_per_weight": "weights: bf16 | fp8 | int4 (e.g. weights: fp8)",
    "bytes_per_kv": "kv_cache_dtype: bf16 | fp8 (e.g. kv_cache_dtype: fp8)",
}


#: Layer types of `ModelSpec.layer_types` (Hugging Face's ``layer_types`` names).
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): K and V are rebuilt from one cached latent.

    The cache holds, per token and layer, the compressed KV latent (``kv_lora_rank``) and the
    decoupled rotary key (``qk_rope_head_dim``), shared by all heads. ``q_lora_rank`` None means
    a plain query projection (DeepSeek-V2-Lite).
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def cache_width(self) -> int:
        """Elements cached per token and layer: the latent plus the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class MoEConfig:
    """Routed mixture-of-experts MLP (SwiGLU experts), in the layers it replaces the dense MLP.

    ``num_experts`` routed experts of width ``expert_intermediate_size``, ``top_k`` per token;
    ``num_shared_experts`` always-on experts of the same width (DeepSeek); the first
    ``first_dense_layers`` layers keep the dense MLP (DeepSeek's ``first_k_dense_replace``).
    ``expert_bias``: gpt-oss experts carry biases. ``routing_skew``: how far from uniform the
    router spreads tokens, a Zipf exponent over the experts' popularity ranks (0: uniform, the
    default; `simulator.served.routing_probabilities`, and `ROUTING_SKEW_SOURCE` there for a
    measured figure). Set by ``model.routing_skew``; the roofline model reads it, and an engine
    table is used only for the skew it was recorded with (`simulator.latency.select`).
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    expert_bias: bool = False
    routing_skew: float = 0.0

    def expert_params(self, hidden: int) -> int:
        """Parameters of one expert: gate, up and down projections (+ biases for gpt-oss)."""
        inter = self.expert_intermediate_size
        return 3 * hidden * inter + ((2 * inter + hidden) if self.expert_bias else 0)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer (Llama-style GQA + SwiGLU).

    All fields are keyword-only. ``max_model_len`` is the longest sequence (prompt + output) a
    request may have; ``head_dim=None`` means ``hidden_size // num_heads``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    intermediate_size: int
    vocab_size: int
    #: weight format (`simulator.precision.WEIGHT_FORMATS`) and KV-cache dtype, by name
    weights: str = "bf16"
    kv_cache_dtype: str = "bf16"
    max_model_len: int
    tie_embeddings: bool = False
    #: Qwen2-style bias on the q, k, v projections (a few hundred thousand parameters).
    qkv_bias: bool = False
    #: Hugging Face ``model_type`` the shapes came from (``llama`` for the Llama-style default).
    family: str = "llama"
    #: per layer, one of `LAYER_TYPES`; None means every layer has full attention
    layer_types: tuple[str, ...] | None = None
    #: tokens a sliding-attention layer sees (itself included); required iff any layer slides
    sliding_window: int | None = None
    #: gpt-oss's learned per-head attention sinks (one logit per head: no KV, no shape change)
    attention_sinks: bool = False
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads"):
            _require_pos_int(self, f)
        for f in ("intermediate_size", "vocab_size", "max_model_len"):
            _require_pos_int(self, f)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"{self.name}: hidden_size {self.hidden_size} not divisible by "
                    f"num_heads {self.num_heads}; give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require_pos_int(self, "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: num_heads {self.num_heads} not divisible by "
                f"num_kv_heads {self.num_kv_heads}"
            )
        try:
            Precision(self.weights, self.kv_cache_dtype)
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None
        self._check_architecture()

    def _check_architecture(self) -> None:
        """Layer types, window and MoE fields agree with each other and the layer count."""
        types = self.layer_types
        if types is not None:
            if len(types) != self.num_layers or not set(types) <= set(LAYER_TYPES):
                raise ValueError(
                    f"{self.name}: layer_types must list {self.num_layers} of {LAYER_TYPES}"
                )
        sliding = types is not None and "sliding_attention" in types
        if sliding != (self.sliding_window is not None):
            raise ValueError(f"{self.name}: sliding_window is required iff a layer slides")
        if self.sliding_window is not None:
            _require_pos_int(self, "sliding_window")
        if self.mla is not None and sliding:
            raise ValueError(f"{self.name}: MLA with sliding layers is not modelled")
        moe = self.moe
        if moe is not None and not (
            0 < moe.top_k <= moe.num_experts and 0 <= moe.first_dense_layers < self.num_layers
        ):
            raise ValueError(f"{self.name}: MoE needs 0 < top_k <= num_experts and "
                             "first_dense_layers < num_layers")  # fmt: skip
        if moe is not None and not (0 <= moe.routing_skew < math.inf):
            raise ValueError(f"{self.name}: routing_skew must be >= 0, got {moe.routing_skew}")

    @property
    def precision(self) -> Precision:
        """The model's precision by name (weights and KV cache)."""
        return Precision(self.weights, self.kv_cache_dtype)

    # ---- parameter counts -------------------------------------------------------------------

    @property
    def q_size(self) -> int:
        """Width of the query projection output (= attention output width)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of one of the key / value projection outputs."""
        return self.num_kv_heads * self.head_dim

    @property
    def attn_linear_params_per_layer(self) -> int:
        """Attention projection weights of one layer (matmuls only: no biases, no norms)."""
        h, mla = self.hidden_size, self.mla
        if mla is None:
            return h * (2 * self.q_size + 2 * self.kv_size)
        qk = self.num_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
        q = h * qk if mla.q_lora_rank is None else mla.q_lora_rank * (h + qk)
        kv_a = h * mla.cache_width
        kv_b = mla.kv_lora_rank * self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv_a + kv_b + self.num_heads * mla.v_head_dim * h

    @property
    def attn_params_per_layer(self) -> int:
        """Attention projections plus their biases (``qkv_bias``), MLA's latent norms and
        gpt-oss's per-head sinks."""
        params = self.attn_linear_params_per_layer
        if self.qkv_bias:
            params += self.q_size + 2 * self.kv_size
        if self.mla is not None:
            params += self.mla.kv_lora_rank + (self.mla.q_lora_rank or 0)
        if self.attention_sinks:
            params += self.num_heads
        return params

    @property
    def mlp_params_per_layer(self) -> int:
        """SwiGLU gate, up and down projections of a dense layer."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    def moe_params_per_layer(self, active: bool = False) -> int:
        """Expert weights of one MoE layer: all routed experts (or the ``top_k`` a token uses
        when ``active``) plus the shared ones; the router is counted apart (`router_params`)."""
        moe = self.moe
        if moe is None:
            return 0
        routed = moe.top_k if active else moe.num_experts
        return (routed + moe.num_shared_experts) * moe.expert_params(self.hidden_size)

    @property
    def router_params(self) -> int:
        """Router (gate) weights of one MoE layer (plus gpt-oss's router bias)."""
        moe = self.moe
        if moe is None:
            return 0
        return moe.num_experts * (self.hidden_size + (1 if moe.expert_bias else 0))

    @property
    def norm_params_per_layer(self) -> int:
        """Input and post-attention RMSNorm weights."""
        return 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Output projection; 0 extra parameters when tied to the embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def _mlp_params(self, active: bool) -> int:
        """MLP weights of all layers: dense layers, MoE layers (experts and routers)."""
        dense = self.num_layers - self.num_moe_layers
        moe = self.moe_params_per_layer(active) + self.router_params
        return dense * self.mlp_params_per_layer + self.num_moe_layers * moe

    @property
    def num_params(self) -> int:
        """Total parameters: embedding + layers (attention, MLP or experts, norms) + final norm
        + lm_head."""
        per_layer = self.attn_params_per_layer + self.norm_params_per_layer
        return (
            self.embedding_params
            + self.num_layers * per_layer
            + self._mlp_params(active=False)
            + self.hidden_size  # final norm
            + self.lm_head_params
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token goes through: as `num_params` with only ``top_k`` routed
        experts per MoE layer (equal to `num_params` for a dense model)."""
        return self.num_params - self._mlp_params(False) + self._mlp_params(True)

    @property
    def num_linear_params(self) -> int:
        """Matmul weights of the layers' projections, every expert included.

        Excludes the embedding (a gather, not a matmul), norms and biases (elementwise), MoE
        routers (kept bf16 by vLLM) and the LM head, which in serving runs only for tokens that
        sample. Weight formats quantize exactly these (`simulator.served.ShardedModel`).
        """
        dense = self.num_layers - self.num_moe_layers
        return (
            self.num_layers * self.attn_linear_params_per_layer
            + dense * self.mlp_params_per_layer
            + self.num_moe_layers * self._expert_linear_params(active=False)
        )

    def _expert_linear_params(self, active: bool) -> int:
        moe = self.moe
        if moe is None:
            return 0
        routed = moe.top_k if active else moe.num_experts
        return (
            (routed + moe.num_shared_experts)
            * 3
            * self.hidden_size
            * (moe.expert_intermediate_size)
        )

    @property
    def num_active_linear_params(self) -> int:
        """`num_linear_params` counting only the ``top_k`` routed experts a token uses."""
        if self.moe is None:
            return self.num_linear_params
        return self.num_linear_params - self.num_moe_layers * (
            self._expert_linear_params(False) - self._expert_linear_params(True)
        )

    @property
    def num_full_layers(self) -> int:
        """Layers with full attention (all of them unless `layer_types` says otherwise)."""
        if self.layer_types is None:
            return self.num_layers
        return self.layer_types.count("full_attention")

    def resolved(self) -> dict:
        """The spec as a plain dict for resolved configs; architecture fields at their dense
        defaults are left out, so a Llama-style model resolves exactly as before they existed."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _ARCH_FIELDS and value == f.default:
                continue
            if isinstance(value, (MLAConfig, MoEConfig)):  # routing_skew only when set: a
                value = {g.name: getattr(value, g.name) for g in fields(value)  # uniform MoE
                         if g.name != "routing_skew" or value.routing_skew}  # fmt: skip
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # ---- sharding ---------------------------------------------------------------------------

    def kv_heads_per_gpu(self, tp: int) -> int:
        """KV heads each GPU of a TP group holds: split when tp divides them, else replicated.

        vLLM replicates KV heads when ``tp > num_kv_heads`` (each GPU keeps one head), so KV memory
        per GPU stops shrinking there. Call `check_tp` first.
        """
        return max(1, self.num_kv_heads // tp)

    def check_tp(self, tp: int, where: str = "<config>", key: str = "tp") -> None:
        """Raise ConfigError unless ``tp`` can shard this model (vLLM's rules).

        Query heads must split evenly; KV heads must split evenly or be replicated evenly
        (``tp % num_kv_heads == 0``); the MLP's intermediate dimension must split evenly.
        """
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(where, key, f"expected a positive integer, got {tp!r}")
        if self.num_heads % tp:
            raise ConfigError(
                where,
                key,
                f"{self.name}: {self.num_heads} attention heads are not divisible by {tp}",
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ConfigError(
                where,
                key,
                f"{self.name} has {self.num_kv_heads} KV heads: tp must divide it or be a "
                f"multiple of it, got {tp}",
            )
        if self.intermediate_size % tp:
            raise ConfigError(
                where,
                key,
                f"{self.name}: intermediate_size {self.intermediate_size} is not divisible by {tp}",
            )
        if self.moe is not None and self.moe.expert_intermediate_size % tp:
            raise ConfigError(
                where, key, f"{self.name}: expert intermediate size "
                f"{self.moe.expert_intermediate_size} is not divisible by {tp}",
            )  # fmt: skip


#: ModelSpec fields that describe non-Llama architectures (left out of `ModelSpec.resolved`
#: when at their defaults)
_ARCH_FIELDS = ("family", "layer_types", "sliding_window", "attention_sinks", "mla", "moe")


def _require_pos_int(spec: ModelSpec, name: str) -> None:
    v = getattr(spec, name)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{spec.name}: {name} must be a positive integer, got {v!r}")


#: Published config.json values (Hugging Face). Sliding windows and RoPE scaling do not change
#: shapes; the simulator assumes full attention over the whole context.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # meta-llama/Llama-2-7b-hf: MHA (32 KV heads).
        ModelSpec(
            name="llama-2-7b",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
            max_model_len=4096,
        ),
        # meta-llama/Meta-Llama-3-8B: GQA (8 KV heads).
        ModelSpec(
            name="llama-3-8b",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_model_len=8192,
        ),
        # meta-llama/Llama-3.1-8B: same shapes, 128k context.
        ModelSpec(
            name="llama-3.1-8b",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_model_len=131072,
        ),
        # meta-llama/Meta-Llama-3-70B: GQA (8 KV heads), 80 layers.
        ModelSpec(
            name="llama-3-70b",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            intermediate_size=28672,
            vocab_size=128256,
            max_model_len=8192,
        ),
        # meta-llama/Llama-3.1-70B: same shapes, 128k context.
        ModelSpec(
            name="llama-3.1-70b",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            intermediate_size=28672,
            vocab_size=128256,
            max_model_len=131072,
        ),
        # mistralai/Mistral-7B-v0.3 (v0.3 vocab 32768; v0.1 had 32000 and a 4096 sliding window).
        ModelSpec(
            name="mistral-7b",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=32768,
            max_model_len=32768,
        ),
        # Qwen/Qwen2.5-7B-Instruct: GQA (4 KV heads), qkv bias; 32768 native context (131072
        # only with YaRN scaling).
        ModelSpec(
            name="qwen2.5-7b",
            num_layers=28,
            hidden_size=3584,
            num_heads=28,
            num_kv_heads=4,
            intermediate_size=18944,
            vocab_size=152064,
            max_model_len=32768,
            qkv_bias=True,
        ),
    )
}

#: Hugging Face repository ids accepted as names (lower-cased).
MODEL_ALIASES: dict[str, str] = {
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-7b-chat-hf": "llama-2-7b",
    "meta-llama/meta-llama-3-8b": "llama-3-8b",
    "meta-llama/meta-llama-3-8b-instruct": "llama-3-8b",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/meta-llama-3-70b": "llama-3-70b",
    "meta-llama/meta-llama-3-70b-instruct": "llama-3-70b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "mistralai/mistral-7b-v0.3": "mistral-7b",
    "mistralai/mistral-7b-instruct-v0.3": "mistral-7b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
}


def _add_hf_catalog() -> None:
    """Add the shipped config.json literals (`simulator.hf_catalog`) to the catalog, through
    the same reader as a user's config.json. Imported here, after `ModelSpec` exists, because
    the reader builds ModelSpecs (literals only: no file is read)."""
    from simulator.hf_catalog import HF_CONFIGS
    from simulator.hf_models import spec_from_hf_config

    for name, (repo, cfg) in HF_CONFIGS.items():
        MODELS[name] = spec_from_hf_config(cfg, f"simulator/hf_catalog.py:{name}", name)
        MODEL_ALIASES[repo.lower()] = name


_add_hf_catalog()


def lookup_catalog(
    value: str,
    catalog: Mapping[str, Any],
    aliases: Mapping[str, str],
    what: str,
    where: str,
    key: str,
) -> Any:
    """Case-insensitive catalog lookup; unknown names raise ConfigError listing known names."""
    name = value.strip().lower()
    name = aliases.get(name, name)
    if name not in catalog:
        known = ", ".join(sorted(catalog))
        raise ConfigError(where, key, f"unknown {what} {value!r}; known: {known}")
    return catalog[name]


def check_name_or_mapping(value: Any, what: str, where: str, key: str) -> None:
    """Raise ConfigError unless ``value`` is a mapping (callers handle names before)."""
    if not isinstance(value, Mapping):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(where, key, f"expected a {what} name or a mapping of fields, got {shown}")


def load_model(value: Any, where: str, key: str) -> ModelSpec:
    """Read a model from config: a catalog name, or a mapping of custom fields.

    A mapping may name ``base`` (a catalog model) and override some of its fields, e.g.
    ``{base: llama-3-8b, max_model_len: 4096, kv_cache_dtype: fp8}``; without ``base`` it must give
    every shape field (``num_kv_heads`` defaults to ``num_heads``, ``head_dim`` to
    ``hidden_size / num_heads``). ``routing_skew`` (MoE models, base or config file) sets the
    router's skew (`MoEConfig.routing_skew`; default uniform). Unknown keys and bad values raise
    ConfigError naming ``where`` and the full key path.
    """
    if isinstance(value, str):
        return lookup_catalog(value, MODELS, MODEL_ALIASES, "model", where, key)
    check_name_or_mapping(value, "model", where, key)
    sec = Section(value, where, key)
    for old, new in RETIRED_PRECISION_KEYS.items():
        if sec.has(old):
            raise sec.error(old, f"precision is named now: use {new}")
    if sec.has("config"):
        return _load_config_file(sec, where)
    base_name = sec.str("base", None)
    base = None
    if base_name is not None:
        base = lookup_catalog(base_name, MODELS, MODEL_ALIASES, "model", where, sec.key("base"))

    def dflt(field: str, fallback: Any = REQUIRED) -> Any:
        """Default of a field: the base model's value, else ``fallback`` (required if none)."""
        return getattr(base, field) if base is not None else fallback

    name = sec.str("name", base.name if base else "custom")
    num_layers = sec.int("num_layers", dflt("num_layers"), min=1)
    hidden = sec.int("hidden_size", dflt("hidden_size"), min=1)
    heads, kv_heads, head_dim = _read_heads(sec, dflt, base, hidden)
    intermediate = sec.int("intermediate_size", dflt("intermediate_size"), min=1)
    vocab = sec.int("vocab_size", dflt("vocab_size"), min=1)
    weights = sec.str("weights", dflt("weights", "bf16"), choices=list(WEIGHT_FORMATS))
    kv_dtype = sec.str("kv_cache_dtype", dflt("kv_cache_dtype", "bf16"), choices=KV_CACHE_DTYPES)
    max_len = sec.int("max_model_len", dflt("max_model_len"), min=1)
    tie = sec.bool("tie_embeddings", dflt("tie_embeddings", False))
    qkv_bias = sec.bool("qkv_bias", dflt("qkv_bias", False))
    skew = sec.num("routing_skew", None, min=0)
    sec.done()
    # the base's architecture (experts, MLA, layer types) comes along: never a silent dense model
    arch = {f: getattr(base, f) for f in _ARCH_FIELDS} if base is not None else {}
    try:
        spec = ModelSpec(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            weights=weights,
            kv_cache_dtype=kv_dtype,
            max_model_len=max_len,
            tie_embeddings=tie,
            qkv_bias=qkv_bias,
            **arch,
        )
    except ValueError as e:
        raise ConfigError(where, key, f"{e} (overriding shapes of {base_name})") from None
    if skew is not None:
        spec = with_routing_skew(spec, skew, sec.where, sec.key("routing_skew"))
    return spec


def with_routing_skew(spec: ModelSpec, skew: float, where: str, key: str) -> ModelSpec:
    """``spec`` with its router skewed by ``skew`` (a Zipf exponent, see `MoEConfig`): a model
    section's ``routing_skew`` and ``servesim profile --routing-skew``; a ConfigError naming
    ``where`` and ``key`` for a dense model or a skew that is not finite and >= 0."""
    if spec.moe is None:
        raise ConfigError(where, key, f"{spec.name} is a dense model: no experts to route to")
    if not 0 <= skew < math.inf:
        raise ConfigError(where, key, f"expected a Zipf exponent >= 0, got {skew}")
    return replace(spec, moe=replace(spec.moe, routing_skew=float(skew)))


def _read_heads(sec: Section, dflt, base, hidden: int) -> tuple[int, int, int]:
    """``num_heads``, ``num_kv_heads`` (default: MHA) and ``head_dim`` (default: the base's,
    unless the shape changed, else ``hidden_size / num_heads``), checked."""
    heads = sec.int("num_heads", dflt("num_heads"), min=1)
    kv_heads = sec.int("num_kv_heads", dflt("num_kv_heads", heads), min=1)
    if heads % kv_heads:
        raise sec.error(
            "num_kv_heads", f"num_heads {heads} must be divisible by num_kv_heads {kv_heads}"
        )
    if base is not None and (sec.has("hidden_size") or sec.has("num_heads")):
        head_dim_default = None  # shape changed: recompute from hidden / heads
    else:
        head_dim_default = base.head_dim if base is not None else None
    head_dim = sec.int("head_dim", head_dim_default, min=1)
    if head_dim is None:
        if hidden % heads:
            raise sec.error(
                "head_dim",
                f"required when hidden_size {hidden} is not divisible by num_heads {heads}",
            )
        head_dim = hidden // heads
    return heads, kv_heads, head_dim


def _load_config_file(sec: Section, where: str) -> ModelSpec:
    """``{config: path/to/config.json, name?, max_model_len?, weights?, kv_cache_dtype?}``: a
    Hugging Face config.json (relative to the experiment file's folder), with the serving
    choices beside it. Shape fields cannot be overridden here (edit the file)."""
    from simulator.hf_models import load_hf_config_file

    path = Path(sec.str("config"))
    if not path.is_absolute() and Path(where).is_file():
        path = Path(where).parent / path
    if sec.has("base"):
        raise sec.error("base", "give either base or config, not both")
    over = {
        "name": sec.str("name", None),
        "max_model_len": sec.int("max_model_len", None, min=1),
        "weights": sec.str("weights", None, choices=list(WEIGHT_FORMATS)),
        "kv_cache_dtype": sec.str("kv_cache_dtype", None, choices=KV_CACHE_DTYPES),
    }
    skew = sec.num("routing_skew", None, min=0)
    sec.done()
    spec = load_hf_config_file(path, where, sec.key("config"),
                               **{k: v for k, v in over.items() if v is not None})  # fmt: skip
    if skew is not None:
        spec = with_routing_skew(spec, skew, sec.where, sec.key("routing_skew"))
    return spec


__all__ = [
    "with_routing_skew",
    "MODELS",
    "MODEL_ALIASES",
    "ModelSpec",
    "load_model",
    "lookup_catalog",
]
