"""Measured collectives (issue 15, item 3): the NCCL table, its interpolation by hand, the
roofline charging it, and `latency.collectives`' choices and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.errors import ConfigError
from simulator.hardware import GPUS
from simulator.latency.collectives import COLUMNS, OP_OF, load_collectives
from simulator.latency.roofline import RooflineLatencyModel
from simulator.models import MODELS
from simulator.runner import build
from simulator.served import collective_link_factor
from tests.helpers import tiny_config

SHIPPED = Path(__file__).resolve().parents[1] / "profiles" / "h200" / "nccl_x2"


def _table(tmp_path: Path, points: dict[str, list[tuple[float, float]]], ranks=2, key="h200",
           header=COLUMNS) -> Path:  # fmt: skip
    """A collectives folder with ``points``: op -> [(link bytes, median us)] ("graph" rows)."""
    d = tmp_path / "coll"
    d.mkdir(exist_ok=True)
    lines = [",".join(header)]
    for op, pts in points.items():
        for lb, us in pts:
            lines.append(f"graph,{op},{ranks},{int(lb)},{lb},{us},{us},{us}")
            lines.append(f"eager,{op},{ranks},{int(lb)},{lb},{us * 9},{us},{us}")  # ignored
    (d / "collectives.csv").write_text("\n".join(lines) + "\n")
    meta = {"kind": "collectives", "library": "nccl", "gpu": {"key": key, "count": ranks}}
    (d / "meta.yaml").write_text(yaml.safe_dump(meta))
    return d


#: one curve per measured op: 10 us up to 1,000 bytes, then 10 us per extra 1,000 bytes
LINEAR = {op: [(1000, 10.0), (2000, 20.0), (4000, 40.0)] for op in set(OP_OF.values())}


def test_interpolation_by_hand(tmp_path):
    c = load_collectives(_table(tmp_path, LINEAR))
    assert c.seconds("allreduce", 1500) == pytest.approx(15e-6)
    assert c.seconds("ep_dispatch", 3000) == pytest.approx(30e-6)
    assert c.seconds("ep_allgather", 10) == pytest.approx(10e-6)  # latency-bound floor
    assert c.seconds("ep_combine", 6000) == pytest.approx(60e-6)  # last slope, beyond
    assert c.describe()["largest_link_bytes"]["all_to_all"] == 4000


def test_a_dip_between_sizes_is_flattened(tmp_path):
    pts = dict(LINEAR, all_reduce=[(1000, 10.0), (2000, 8.0), (4000, 40.0)])
    c = load_collectives(_table(tmp_path, pts))
    assert c.seconds("allreduce", 2000) == pytest.approx(10e-6)
    assert c.seconds("allreduce", 3000) == pytest.approx(25e-6)


def test_shipped_table_is_complete_and_non_decreasing():
    c = load_collectives(SHIPPED)
    assert (c.gpu_key, c.ranks) == ("h200", 2)
    for op in set(OP_OF.values()):
        xs, ys = c.curves[op]
        assert len(xs) >= 10 and np.all(np.diff(xs) > 0) and np.all(np.diff(ys) >= 0)
        assert xs[-1] >= 64 * 2**20  # a step's payload is far below this
    # NVLink moves 64 MiB of all-to-all in well under a millisecond, and small calls cost
    # microseconds, not milliseconds (what a units slip would give)
    assert 1e-4 < c.seconds("ep_dispatch", 64 * 2**20) < 1e-3
    assert 1e-6 < c.seconds("allreduce", 1024) < 1e-4


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda d: (d / "meta.yaml").unlink(), "<file>"),
        (lambda d: (d / "meta.yaml").write_text("gpu: {count: 2}\n"), "gpu.key"),
        (lambda d: (d / "meta.yaml").write_text("gpu: {key: h200, count: 1}\n"), "gpu.count"),
        (lambda d: (d / "collectives.csv").write_text("op,bytes\n"), "<header>"),
        (lambda d: (d / "meta.yaml").write_text("gpu: {key: h200, count: 4}\n"), "line 2"),
    ],
)
def test_malformed_tables_name_file_and_field(tmp_path, edit, field):
    d = _table(tmp_path, LINEAR)
    edit(d)
    with pytest.raises(ConfigError) as e:
        load_collectives(d)
    assert e.value.key == field and str(d) in e.value.where


def test_missing_op_is_an_error(tmp_path):
    pts = {op: v for op, v in LINEAR.items() if op != "all_to_all"}
    with pytest.raises(ConfigError, match="all_to_all"):
        load_collectives(_table(tmp_path, pts))


def test_roofline_charges_the_measured_call_per_layer(tmp_path):
    """Dense Llama-3-8B at tp 2: two all-reduces per layer over T x 4096 bf16 values."""
    c = load_collectives(_table(tmp_path, LINEAR))
    m = MODELS["llama-3-8b"]
    measured = RooflineLatencyModel(m, GPUS["h200"], 2, collectives=c)
    estimate = RooflineLatencyModel(m, GPUS["h200"], 2)
    t = 3 + 2  # prompt tokens + decodes
    link_bytes = 2 * (2 - 1) / 2 * t * 4096 * 2  # ring all-reduce: 40,960 bytes
    want = 32 * 2 * (40e-6 + (link_bytes - 4000) * 1e-8)  # beyond 4,000: 10 us per 1,000 B
    got = measured.breakdown(3, 3.0, 1, 2, 100)["allreduce"]
    assert got == pytest.approx(want)
    # the rest of the step is the same model
    other = measured.step_time(3, 3.0, 1, 2, 100) - got
    est = estimate.breakdown(3, 3.0, 1, 2, 100)
    assert other == pytest.approx(estimate.step_time(3, 3.0, 1, 2, 100) - est["allreduce"])


def test_roofline_ep_collectives_use_their_ops(tmp_path):
    c = load_collectives(_table(tmp_path, LINEAR))
    m = MODELS["qwen3-30b-a3b"]
    lat = RooflineLatencyModel(m, GPUS["h200"], 2, expert_parallel="all_to_all", collectives=c)
    t = 8
    want = 0.0
    for o in lat.served.ops:
        if o.kind == "collective" and o.ep:
            lb = collective_link_factor(o, 2) * t * o.act_bytes_per_token
            want += o.count * lat.served.layers_of(o) * c.seconds(o.name, lb)
    assert lat.breakdown(0, 0.0, 0, t, 800)["expert_comm"] == pytest.approx(want)
    assert "measured" in lat.describe()["warnings"][-1]


def _config(tp=2, latency=None, gpu="h200", model="llama-3-8b"):
    lat = {"model": "roofline", **(latency or {})}
    return {"name": "coll", **tiny_config(model, {"gpu": gpu, "tp": tp}, lat)}


def test_auto_uses_the_shipped_table_of_this_gpu_and_tp(tmp_path):
    auto = build(_config(), "exp.yaml", tmp_path).latency
    assert auto.describe()["collectives"]["source"] == "profiles/h200/nccl_x2"
    est = build(_config(latency={"collectives": "estimate"}), "exp.yaml", tmp_path).latency
    assert "collectives" not in est.describe()
    for cfg in (_config(tp=4), _config(gpu="h100")):  # nothing measured there: the estimate
        assert "collectives" not in build(cfg, "exp.yaml", tmp_path).latency.describe()


@pytest.mark.parametrize(
    "cfg,match",
    [
        (_config(latency={"collectives": "nowhere"}), "no folder"),
        (_config(latency={"collectives": 3}), "expected auto, estimate or a folder"),
        (_config(gpu="h100", latency={"collectives": str(SHIPPED)}), "measured 2x h200"),
        (_config(tp=1, latency={"collectives": str(SHIPPED)}), "tp 1"),
        (
            {
                **_config(model="llama-3-70b"),
                "latency": {"model": "profile", "collectives": str(SHIPPED)},
            },  # fmt: skip
            "only the roofline model",
        ),
    ],
)
def test_collectives_config_errors_name_the_key(tmp_path, cfg, match):
    with pytest.raises(ConfigError, match=match) as e:
        build(cfg, "exp.yaml", tmp_path)
    assert e.value.where == "exp.yaml" and e.value.key == "latency.collectives"
