"""A latency table times only the model and GPU it measured: a run that keeps a catalog name but
changes a shape, or runs another GPU or a catalog GPU with other performance fields, is refused
a table (`simulator.latency.table_subject`): ``auto`` falls back to the roofline model and says
why, a named table or ``profile`` is an error naming the field."""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from simulator.hardware import GPUS
from simulator.latency.table_subject import gpu_mismatch, shape_mismatch
from simulator.models import MODELS
from simulator.runner import build
from tests.policy_kit import REPO, config

WHERE = str(REPO / "t.yaml")


def _cfg(model="llama-3-8b", gpu="h200", policy="continuous", **latency):
    cfg = config(n=20, scheduler={"policy": policy}, latency={"model": "auto", **latency})
    cfg["hardware"] = {"gpu": gpu}
    cfg["model"] = model
    return cfg


@pytest.mark.parametrize("policy", ["continuous", "vllm"])
def test_a_changed_shape_under_a_catalog_name_gets_no_table(policy):
    stock = build(_cfg(policy=policy), WHERE, REPO).latency
    assert stock.name != "roofline"  # the shipped table times the catalog model
    changed = build(_cfg({"base": "llama-3-8b", "num_layers": 64}, policy=policy), WHERE, REPO)
    assert changed.latency.name == "roofline"
    assert "num_layers (64 here, 32 in the table's)" in changed.latency.fallback_reason


def test_capacity_fields_keep_the_table():
    # max_model_len sets how many requests fit, not how long a step takes
    b = build(_cfg({"base": "llama-3-8b", "max_model_len": 16384}), WHERE, REPO)
    assert b.latency.name != "roofline"


def _refused(cfg: dict) -> ConfigError:
    """The error of ``cfg`` built with ``latency.model: profile`` (no roofline fallback)."""
    cfg["latency"]["model"] = "profile"
    with pytest.raises(ConfigError) as e:
        build(cfg, WHERE, REPO)
    return e.value


def test_profile_on_a_changed_shape_is_an_error_naming_the_field():
    e = _refused(_cfg({"base": "llama-3-8b", "intermediate_size": 28672}))
    assert e.key == "latency.model"
    assert "intermediate_size (28672 here, 14336 in the table's)" in e.message


def test_a_catalog_gpu_with_other_performance_fields_gets_no_table():
    slow = build(_cfg(gpu={"base": "h200", "hbm_bandwidth_gb_s": 100}), WHERE, REPO).latency
    assert slow.name == "roofline" and "hbm_bandwidth" in slow.fallback_reason
    # price and board power do not set step time
    priced = build(_cfg(gpu={"base": "h200", "price_per_hour": 1.0, "tdp_w": 600}), WHERE, REPO)
    assert priced.latency.name != "roofline"
    # another GPU's fields under this GPU's name
    renamed = build(_cfg(gpu={"base": "h100-sxm", "name": "h200"}), WHERE, REPO).latency
    assert renamed.name == "roofline" and "hbm_bandwidth" in renamed.fallback_reason


def test_a_named_table_of_another_gpu_is_an_error():
    e = _refused(_cfg(table=str(REPO / "profiles/h100/llama-3-8b_tp1")))
    assert e.key == "latency.table"
    assert "measured the h100-sxm; this run's GPU is h200" in e.message


def test_gpu_mismatch_by_hand():
    h200 = GPUS["h200"]
    assert gpu_mismatch({"gpu": {"key": "h200"}}, h200, "T") is None
    assert gpu_mismatch({"gpu": {"key": "h200-sxm"}}, h200, "T") is None  # an alias
    assert gpu_mismatch({}, h200, "T") is None  # no key: not checked here
    assert "this run's GPU is h200" in gpu_mismatch({"gpu": {"key": "h100"}}, h200, "T")
    # new hardware the catalog does not hold: its table times the run's GPU of that name
    new = type(h200)(**{**h200.__dict__, "name": "b300-sxm"})
    assert gpu_mismatch({"gpu": {"key": "b300"}}, new, "T") is None
    assert "measured gpu 'b300'" in gpu_mismatch({"gpu": {"key": "b300"}}, h200, "T")


def test_shape_mismatch_by_hand():
    llama = MODELS["llama-3-8b"]
    assert shape_mismatch({"model": {"name": "llama-3-8b"}}, llama, "T") is None
    assert shape_mismatch({"model": {"name": "my-own-model"}}, llama, "T") is None  # by name
    # Llama-3.1-8B has Llama-3-8B's shapes: only its context (not a step-time field) differs
    assert shape_mismatch({"model": {"name": "llama-3-8b"}}, MODELS["llama-3.1-8b"], "T") is None
    got = shape_mismatch({"model": {"name": "llama-3-8b"}}, MODELS["qwen2.5-7b"], "T")
    assert got.startswith("the table T measured llama-3-8b as catalogued; this run's qwen2.5-7b")
    assert "and " in got and "more" in got  # more than three fields differ: counted
