"""`servesim validate` compares a simulation with a real run of the same experiment only: the
real run's fingerprint (resolved config, arrivals, table) must match (issue 16)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from profiles.validate import check_fingerprint, fingerprint
from simulator.errors import ConfigError
from simulator.runner import build

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "tests" / "bad_inputs" / "base.yaml").read_text())


def _print(config: dict, table: str | None = "profile:x") -> dict:
    return fingerprint(build(copy.deepcopy(config), "exp.yaml", REPO), table)


def _real(config: dict, table: str | None = "profile:x") -> dict:
    """A saved real run as run_real writes it (only the parts the check reads)."""
    built = build(copy.deepcopy(config), "exp.yaml", REPO)
    return {"resolved": built.resolved, "fingerprint": fingerprint(built, table),
            "summary": {"requests": {"arrived": len(built.workload.requests)}}}  # fmt: skip


def test_the_same_experiment_passes():
    check_fingerprint(_real(BASE), _print(BASE), "real.json.gz")


@pytest.mark.parametrize(
    "change, key",
    [
        ({"seed": 1}, "fingerprint.seed"),
        ({"scheduler": {"policy": "continuous", "max_num_seqs": 8}}, "fingerprint.scheduler"),
        ({"hardware": {"gpu": "h200", "tp": 2}}, "fingerprint.hardware"),
        ({"kv_cache": {"allocator": "paged", "block_size": 32}}, "fingerprint.kv_cache"),
    ],
)
def test_a_real_run_of_another_config_is_refused(change, key):
    other = {**BASE, **change}
    with pytest.raises(ConfigError) as e:
        check_fingerprint(_real(other), _print(BASE), "real.json.gz")
    assert e.value.where == "real.json.gz" and e.value.key == key


def test_other_arrivals_or_table_are_refused_even_with_the_same_config():
    real = _real(BASE)
    real["fingerprint"]["arrivals"]["sha256"] = "0" * 16
    with pytest.raises(ConfigError, match="fingerprint.arrivals.sha256"):
        check_fingerprint(real, _print(BASE), "r")
    with pytest.raises(ConfigError, match="fingerprint.table"):
        check_fingerprint(_real(BASE, "profile:h100"), _print(BASE, "profile:h200"), "r")


def test_a_legacy_real_run_is_checked_on_its_resolved_config_and_request_count():
    legacy = _real(BASE)
    del legacy["fingerprint"]
    check_fingerprint(legacy, _print(BASE), "r")
    legacy["summary"]["requests"]["arrived"] += 1
    with pytest.raises(ConfigError, match="fingerprint.arrivals.count"):
        check_fingerprint(legacy, _print(BASE), "r")
    other = _real({**BASE, "seed": 4})
    del other["fingerprint"]
    with pytest.raises(ConfigError, match="fingerprint.seed"):
        check_fingerprint(other, _print(BASE), "r")
