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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.cfg import REQUIRED, Section
from simulator.errors import ConfigError
from simulator.precision import KV_CACHE_DTYPES, WEIGHT_FORMATS, Precision

#: Keys that once gave precision as free-form byte widths, and what replaces each.
RETIRED_PRECISION_KEYS = {
    "bytes_per_weight": "weights: bf16 | fp8 | int4 (e.g. weights: fp8)",
    "bytes_per_kv": "kv_cache_dtype: bf16 | fp8 (e.g. kv_cache_dtype: fp8)",
}


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
    def attn_params_per_layer(self) -> int:
        """q, k, v, o projection weights (plus q/k/v bias when ``qkv_bias``)."""
        h = self.hidden_size
        params = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            params += self.q_size + 2 * self.kv_size
        return params

    @property
    def mlp_params_per_layer(self) -> int:
        """SwiGLU gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

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

    @property
    def num_params(self) -> int:
        """Total parameters: embedding + layers (attention, MLP, norms) + final norm + lm_head."""
        per_layer = (
            self.attn_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer
        )
        return (
            self.embedding_params
            + self.num_layers * per_layer
            + self.hidden_size  # final norm
            + self.lm_head_params
        )

    @property
    def num_linear_params(self) -> int:
        """Matmul weights every computed token goes through: the layers' projections.

        Excludes the embedding (a gather, not a matmul), norms and biases (elementwise) and the
        LM head, which in serving runs only for tokens that sample. Weight formats quantize
        exactly these (`simulator.served.ShardedModel.weight_bytes`).
        """
        return self.num_layers * (
            self.hidden_size * (2 * self.q_size + 2 * self.kv_size) + self.mlp_params_per_layer
        )

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
    ``hidden_size / num_heads``). Unknown keys and bad values raise ConfigError naming ``where``
    and the full key path.
    """
    if isinstance(value, str):
        return lookup_catalog(value, MODELS, MODEL_ALIASES, "model", where, key)
    check_name_or_mapping(value, "model", where, key)
    sec = Section(value, where, key)
    for old, new in RETIRED_PRECISION_KEYS.items():
        if sec.has(old):
            raise sec.error(old, f"precision is named now: use {new}")
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
    intermediate = sec.int("intermediate_size", dflt("intermediate_size"), min=1)
    vocab = sec.int("vocab_size", dflt("vocab_size"), min=1)
    weights = sec.str("weights", dflt("weights", "bf16"), choices=list(WEIGHT_FORMATS))
    kv_dtype = sec.str("kv_cache_dtype", dflt("kv_cache_dtype", "bf16"), choices=KV_CACHE_DTYPES)
    max_len = sec.int("max_model_len", dflt("max_model_len"), min=1)
    tie = sec.bool("tie_embeddings", dflt("tie_embeddings", False))
    qkv_bias = sec.bool("qkv_bias", dflt("qkv_bias", False))
    sec.done()
    return ModelSpec(
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
    )


__all__ = [
    "MODELS",
    "MODEL_ALIASES",
    "ModelSpec",
    "load_model",
    "lookup_catalog",
]
