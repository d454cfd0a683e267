"""A profiled table's meta.yaml holds only known keys (`simulator.latency.meta_keys`).

Why: its readers take a missing key as "not measured" or a default, so a misspelt one would
change the model silently. Every shipped table must still load; the three readers (torch op
tables, engine-steps tables, collectives) each refuse a key they do not know, naming the file,
the key and the keys accepted there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.latency.collectives import load_collectives
from simulator.latency.engine_steps import EngineStepModel, is_engine_table
from simulator.latency.meta_keys import COLLECTIVES_META, TABLE_META, check_meta_keys
from simulator.latency.table import read_meta

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
ENGINE_TABLE = PROFILES / "h200" / "vllm-0.24" / "llama-3-8b_tp1"
COLLECTIVES = PROFILES / "h200" / "nccl_x2"


def _copy_with(tmp_path: Path, src: Path, change) -> Path:
    """A copy of table ``src`` whose meta.yaml went through ``change`` (a dict -> None)."""
    d = tmp_path / src.name
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("raw"))
    meta = yaml.safe_load((d / "meta.yaml").read_text())
    change(meta)
    (d / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return d


@pytest.mark.parametrize(
    "path", sorted(PROFILES.rglob("meta.yaml")), ids=lambda p: str(p.parent.relative_to(PROFILES))
)
def test_every_shipped_meta_has_only_accepted_keys(path):
    meta = yaml.safe_load(path.read_text())
    accepted = COLLECTIVES_META if meta.get("kind") == "collectives" else TABLE_META
    check_meta_keys(meta, str(path), accepted)


def test_every_shipped_meta_loads_through_its_reader():
    for path in sorted(PROFILES.rglob("meta.yaml")):
        if (path.parent / "collectives.csv").is_file():
            load_collectives(path.parent)
        elif not is_engine_table(path.parent):
            read_meta(str(path))


def test_engine_table_refuses_an_unknown_top_level_key(tmp_path):
    d = _copy_with(tmp_path, ENGINE_TABLE, lambda m: m.update(frontend_s=0.001))
    with pytest.raises(ConfigError) as e:
        EngineStepModel.as_measured(d)
    assert e.value.where == str(d / "meta.yaml") and e.value.key == "frontend_s"
    assert "unknown key" in e.value.message and "'frontend'" in e.value.message


def test_engine_table_refuses_an_unknown_key_in_a_read_section(tmp_path):
    d = _copy_with(tmp_path, ENGINE_TABLE, lambda m: m["frontend"].update(output=0.002))
    with pytest.raises(ConfigError) as e:
        EngineStepModel.as_measured(d)
    assert e.value.key == "frontend.output" and "'output_s'" in e.value.message


def test_free_form_sections_stay_free(tmp_path):
    """Records of how a table was made (vLLM's config, kernels) are not read key by key."""
    d = _copy_with(tmp_path, ENGINE_TABLE, lambda m: m["kernels"].update(NewLinearMethod=1))
    assert EngineStepModel.as_measured(d).meta["kernels"]["NewLinearMethod"] == 1


def test_collectives_refuse_an_unknown_key(tmp_path):
    d = _copy_with(tmp_path, COLLECTIVES, lambda m: m["gpu"].update(ranks=2))
    with pytest.raises(ConfigError) as e:
        load_collectives(d)
    assert e.value.where == str(d / "meta.yaml") and e.value.key == "gpu.ranks"
    assert "'count'" in e.value.message
