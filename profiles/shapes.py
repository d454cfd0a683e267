"""Fallback model shapes, used only when ``simulator.models`` cannot be imported.

The catalog in ``simulator/models.py`` is the source of truth; these literals (Hugging Face
config.json values) let the profiler run on a checkout where the catalog is broken or absent.
"""

from __future__ import annotations

from types import SimpleNamespace

from simulator.errors import ConfigError

_SHAPES = {
    # name: layers, hidden, heads, kv heads, head_dim, intermediate, vocab, max_model_len
    "llama-3-8b": (32, 4096, 32, 8, 128, 14336, 128256, 8192),
    "llama-2-7b": (32, 4096, 32, 32, 128, 11008, 32000, 4096),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064, 32768),
    "llama-3-70b": (80, 8192, 64, 8, 128, 28672, 128256, 8192),
}


def fallback_model(name: str):
    if name not in _SHAPES:
        raise ConfigError("<cli>", "--model", f"unknown model {name!r}")
    L, h, nh, kv, d, inter, vocab, mlen = _SHAPES[name]
    return SimpleNamespace(
        name=name,
        num_layers=L,
        hidden_size=h,
        num_heads=nh,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        bytes_per_weight=2,
        bytes_per_kv=2,
        max_model_len=mlen,
        qkv_bias=name.startswith("qwen"),
    )
