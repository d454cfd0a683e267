"""One GPU's shard of a TP layout: its config.json, the collectives added to its steps, the
table build's refusals, selection and energy (`simulator.latency.shard`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from profiles.hf_config import hf_config, shard_config
from profiles.vllm_table import _shard
from simulator.errors import ConfigError
from simulator.hardware import default_tp_link, load_gpu
from simulator.latency.collectives import StepCollectives, load_collectives
from simulator.latency.engine_steps import EngineStepModel
from simulator.latency.shard import ShardStepModel, shard_tp
from simulator.models import load_model
from simulator.runner import build, simulate
from simulator.served import ShardedModel
from tests.test_energy import IDLE_W, _known_law, _scenarios, _write_csv
from tests.test_engine_steps import CAPTURE, _table

REPO = Path(__file__).resolve().parents[1]
NCCL_X2 = REPO / "profiles" / "h200" / "nccl_x2"
H200 = load_gpu("h200", "t", "gpu")


def _model(m):
    return load_model(m, "test", "model")


# ------------------------------------------------------------------ the shard's config.json
def test_shard_config_has_the_per_gpu_shapes_of_the_layout():
    llama = hf_config(_model("llama-3-70b"), shard_tp=2)
    assert (llama["num_attention_heads"], llama["num_key_value_heads"]) == (32, 4)
    assert (llama["intermediate_size"], llama["vocab_size"]) == (14336, 64128)
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["head_dim"]) == (8192, 80, 128)
    ds = hf_config(_model({"base": "deepseek-v3", "weights": "fp8"}), shard_tp=8)
    assert (ds["num_attention_heads"], ds["vocab_size"]) == (128 // 8, 129280 // 8)
    assert (ds["intermediate_size"], ds["moe_intermediate_size"]) == (18432 // 8, 2048 // 8)
    # experts, top-k and MLA's latent ranks are not split: vLLM replicates the latent
    assert (ds["n_routed_experts"], ds["num_experts_per_tok"]) == (256, 8)
    assert (ds["kv_lora_rank"], ds["q_lora_rank"], ds["qk_rope_head_dim"]) == (512, 1536, 64)


def test_deepseek_v3_in_fp8_is_its_checkpoints_block_wise_fp8_and_bf16_has_none():
    q = hf_config(_model({"base": "deepseek-v3", "weights": "fp8"}))["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128]
    assert "quantization_config" not in hf_config(_model("deepseek-v3"))
    # other fp8 models keep vLLM's per-tensor fp8 checkpoint config
    llama = hf_config(_model({"base": "llama-3-8b", "weights": "fp8"}))["quantization_config"]
    assert "weight_block_size" not in llama


def test_special_token_ids_beyond_the_shard_vocabulary_move_inside_it():
    cfg = hf_config(_model("gpt-oss-120b"), shard_tp=2)
    assert cfg["vocab_size"] == 100544  # ceil(201088 / 2)
    # the published 200002 / 199999 would index the shard's logits out of bounds
    assert (cfg["eos_token_id"], cfg["pad_token_id"]) == (100543, 100542)
    # ids inside the vocabulary stay as published
    assert hf_config(_model("llama-3-70b"), shard_tp=2)["eos_token_id"] == 2


def test_shard_config_refuses_a_layout_the_model_cannot_split():
    spec = _model("llama-3-8b")
    with pytest.raises(ConfigError):
        shard_config(hf_config(spec), spec, 3)


# ------------------------------------------------------------------ collectives of a step
def test_step_collectives_estimate_by_hand():
    """Llama-3-70B at tp 2: two all-reduces a layer, 80 layers, each moving 2 (tp-1)/tp x
    8192 x 2 bytes a token over the link."""
    link = default_tp_link(H200)
    coll = StepCollectives(ShardedModel(_model("llama-3-70b"), 2), link, None)
    for t in (1, 64, 8192):
        want = 160 * (16384 * t / link.bandwidth + link.latency)
        assert coll.seconds(t) == (pytest.approx(want, rel=1e-12), 0.0)
    assert "estimated" in coll.describe() and "warning" in coll.describe()


def test_step_collectives_measured_use_the_table_at_each_calls_link_bytes():
    table = load_collectives(NCCL_X2)
    coll = StepCollectives(ShardedModel(_model("llama-3-70b"), 2), default_tp_link(H200), table)
    for t in (1, 512, 8192):
        assert coll.seconds(t)[0] == pytest.approx(160 * table.seconds("allreduce", 16384 * t))
    assert coll.describe()["measured"]["ranks"] == 2
    with pytest.raises(ValueError, match="2 ranks, not tp 4"):
        StepCollectives(ShardedModel(_model("llama-3-70b"), 4), default_tp_link(H200), table)


# ------------------------------------------------------------------ the shard step model
def _shard_table(tmp_path, tp=2, **meta_extra) -> Path:
    d = _table(tmp_path, model="llama-3-70b", tp=tp)
    meta = yaml.safe_load((d / "meta.yaml").read_text())
    meta["shard"] = {"tp": tp, **meta_extra}
    (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    return d


def _coll(spec=None, tp=2):
    """The link-estimated collectives of ``spec`` (default Llama-3-70B) at ``tp`` on an H200."""
    spec = spec or _model("llama-3-70b")
    return StepCollectives(ShardedModel(spec, tp), default_tp_link(H200), None)


def test_a_shard_step_is_the_shards_step_plus_the_collectives_at_its_padded_rows(tmp_path):
    d = _shard_table(tmp_path)
    shard = ShardStepModel(d, "llama-3-70b", 2, _coll())
    plain = EngineStepModel(d, "llama-3-70b", 2)
    cases = [  # (prefill tokens, attention pairs, prefill seqs, decodes, decode ctx, longest)
        (0, 0.0, 0, 3, 3000, 1000),  # a decode graph of 4 rows (the test table's sizes)
        (0, 0.0, 0, 100, 90_000, 1500),  # of 128
        (500, 500 * 251.0, 1, 20, 20_000, 1000),  # a mixed step of 520 tokens: eager, 520 rows
        (100, 100 * 51.0, 1, 0, 0, 0),  # a prompt alone: the graph of 128
    ]
    for c in cases:
        rows = c[0] + c[3]
        padded = next((s for s in CAPTURE if s >= rows), rows)
        extra = sum(_coll().seconds(padded))
        assert shard.step_time(*c) == pytest.approx(plain.step_time(*c) + extra, rel=1e-12)
        assert extra > 0
    # the shard's own steps are judged without collectives: same held-out as the plain fit
    assert shard.heldout()["all"] == plain.heldout()["all"]
    r = next(r for r in shard.rows if r["target"])
    assert shard.served_row(r) > shard.predict_row(r)


def test_a_shard_model_describes_itself_and_warns(tmp_path):
    shard = ShardStepModel(_shard_table(tmp_path), "llama-3-70b", 2, _coll())
    out = shard.describe()
    assert out["shard"]["tp"] == 2 and "estimated" in out["shard"]["collectives"]
    assert any("shard of tp 2" in w and "estimated" in w for w in out["warnings"])


def test_shard_meta_must_name_the_tables_tp(tmp_path):
    assert shard_tp({"tp": 1}, "m") is None
    assert shard_tp({"tp": 8, "shard": {"tp": 8}}, "m") == 8
    for bad in ({"tp": 4}, {"tp": 1}, "8", {"tp": True}):
        with pytest.raises(ConfigError, match="shard.tp"):
            shard_tp({"tp": 2, "shard": bad}, "m")
    with pytest.raises(ConfigError, match="not a shard table"):
        ShardStepModel(_table(tmp_path, model="llama-3-70b", tp=2), "llama-3-70b", 2, _coll())


# ------------------------------------------------------------------ selection and energy
def _cfg(table: Path, **latency) -> dict:
    cfg = yaml.safe_load((REPO / "tests" / "bad_inputs" / "base.yaml").read_text())
    cfg["model"] = "llama-3-70b"
    cfg["hardware"] = {"gpu": "h200", "tp": 2}
    cfg["scheduler"] = {"policy": "vllm"}
    cfg["latency"] = {"model": "profile", "table": str(table), **latency}
    return cfg


def test_a_shard_table_is_run_with_the_collectives_latency_collectives_names(tmp_path):
    d = _shard_table(tmp_path)
    auto = build(_cfg(d), "t.yaml", REPO).latency
    assert isinstance(auto, ShardStepModel) and auto.coll.measured is not None  # nccl_x2
    est = build(_cfg(d, collectives="estimate"), "t.yaml", REPO).latency
    assert est.coll.measured is None
    named = build(_cfg(d, collectives=str(NCCL_X2)), "t.yaml", REPO).latency
    assert named.coll.measured.ranks == 2
    res = simulate(build(_cfg(d), "t.yaml", REPO))
    assert res.summary["requests"]["completed"] == 20


def test_a_collectives_table_on_a_whole_engine_table_is_still_an_error(tmp_path):
    d = _table(tmp_path, model="llama-3-70b", tp=2)
    with pytest.raises(ConfigError, match="latency.collectives.*shard tables"):
        build(_cfg(d, collectives=str(NCCL_X2)), "t.yaml", REPO)


def test_a_shard_tables_one_gpu_joules_count_tp_times(tmp_path):
    d = _shard_table(tmp_path)
    _write_csv(d / "energy.csv", _scenarios(_known_law))
    meta = yaml.safe_load((d / "meta.yaml").read_text())
    meta["energy"] = {"source": "test", "idle_w": IDLE_W, "gpus": 1}
    (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    shard = ShardStepModel(d, "llama-3-70b", 2, _coll())
    totals = {"busy_s": 2.0, "steps": 10, "tokens": 100, "decode_ctx": 1e4, "prefill_attn": 1e5}
    one = shard.energy.joules(totals, 3.0)
    shard.energy.copies = 1
    assert one == {k: 2 * v for k, v in shard.energy.joules(totals, 3.0).items()}
    meta["energy"]["gpus"] = 2  # a shard read one GPU: two is a mistake, named
    (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(ConfigError, match="energy.gpus.*one GPU's shard"):
        ShardStepModel(d, "llama-3-70b", 2, _coll())


# ------------------------------------------------------------------ the table build
def test_the_build_refuses_a_run_of_another_layout(tmp_path):
    eng = {"job": {"tp": 1, "shard_tp": 8}}
    assert _shard(tmp_path, eng, 8)["tp"] == 8
    with pytest.raises(ConfigError, match="job.shard_tp"):
        _shard(tmp_path, eng, 4)
    with pytest.raises(ConfigError, match="job.shard_tp"):
        _shard(tmp_path, {"job": {"tp": 2, "shard_tp": 2}}, 2)
    assert _shard(tmp_path, {"job": {"tp": 2}}, 2) is None
    with pytest.raises(ConfigError, match="job.tp"):
        _shard(tmp_path, {"job": {"tp": 1}}, 2)


@pytest.mark.parametrize(
    "folder, model, tp",
    [("deepseek-v3_fp8-kv-bf16_tp8", {"base": "deepseek-v3", "weights": "fp8"}, 8),
     ("gpt-oss-120b_tp2", "gpt-oss-120b", 2)],
)  # fmt: skip
def test_shipped_shard_tables_load_and_the_shard_weighed_what_the_model_says(folder, model, tp):
    d = REPO / "profiles" / "h200" / "vllm-0.24" / folder
    spec = _model(model)
    m = ShardStepModel(d, spec.name, tp, _coll(spec, tp))
    assert m.meta["shard"]["tp"] == tp
    want = ShardedModel(spec, tp).weight_bytes_per_gpu / 2**30
    assert m.meta["weights_loaded_gib_per_gpu"] == pytest.approx(want, rel=0.05)
    engine = json.loads((d / "raw" / "engine.json").read_text())
    assert (engine["job"]["tp"], engine["job"]["shard_tp"]) == (1, tp)
    # a step of the layout costs more than its shard: the collectives are positive
    assert m.step_time(0, 0.0, 0, 8, 8000) > EngineStepModel.step_time(m, 0, 0.0, 0, 8, 8000)


def test_shard_tables_do_not_change_other_configs():
    # deep copies only: the catalog's published configs are not mutated by a shard
    spec = _model("llama-3-70b")
    before = copy.deepcopy(hf_config(spec))
    hf_config(spec, shard_tp=2)
    assert hf_config(spec) == before


def test_profile_report_says_a_shard_table_is_judged_on_its_own_steps(capsys):
    from profiles.cli import _report

    assert _report([str(REPO / "profiles" / "h200" / "vllm-0.24" / "gpt-oss-120b_tp2")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shard"]["tp"] == 2 and "no collectives" in out["shard"]["heldout"]
    assert out["heldout"]["all"]["steps"] > 0


def test_one_job_builder_for_the_cli_and_run_all():
    from profiles.engine_jobs import engine_job

    dense = engine_job(_model("llama-3-70b"), "m", 2)
    assert dense == {"model_dir": "m", "tp": 2,
                     "precision": {"weights": "bf16", "kv_cache_dtype": "bf16"}}  # fmt: skip
    ds = engine_job(_model({"base": "deepseek-v3", "weights": "fp8"}), "m", 8, shard=True)
    assert (ds["tp"], ds["shard_tp"], ds["routing"]) == (1, 8, "token_dependent")
    assert ds["precision"]["weights"] == "fp8"
