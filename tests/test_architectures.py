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
