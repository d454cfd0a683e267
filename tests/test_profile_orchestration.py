"""`servesim profile`'s orchestration (profiles/cli.run_profile) on CPU, every measurement faked:
the phases run in order within their deadlines, a resumed run keeps the earlier timings, and
meta.yaml records what the table measured (precision, op fingerprint, the runner's facts). The
measurements themselves need a GPU (tests/test_gpu_profile.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import yaml

torch = pytest.importorskip("torch")

from profiles import cli, measure  # noqa: E402
from simulator.models import MODELS  # noqa: E402
from simulator.served import ShardedModel  # noqa: E402


class _FakeRunner:
    def __init__(self, spec, **kw):
        self.kv_layout, self.shared_weights, self.capacity_tokens = "paged", False, 4096
        self.block_size, self.piecewise, self.weight_bytes = 16, None, 2**30
        self.closed = False

    def close(self):
        self.closed = True


@pytest.fixture
def fake_gpu(monkeypatch):
    calls = []

    def phase(name):
        def run(out, sh, deadline, *rest):
            calls.append(name)
            return 3

        return run

    for name in ("gemm", "elementwise", "attn_decode", "attn_decode_padded", "attn_prefill"):
        monkeypatch.setattr(measure, f"profile_{name}", phase(name))
    monkeypatch.setattr(measure, "AttnBench", lambda sh, tokens: object())
    monkeypatch.setattr(
        measure, "profile_steps", lambda out, runner, deadline: calls.append("steps") or 5
    )
    monkeypatch.setattr("profiles.torch_model.StepRunner", _FakeRunner)
    monkeypatch.setattr(
        "profiles.torch_model.varlen_features", lambda: {"signature": "(q, k, v)", "paged": True}
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    props = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(cli, "_smi", lambda q: None)
    return calls


def test_phases_run_in_order_and_meta_says_what_was_measured(tmp_path, fake_gpu):
    spec = dataclasses.replace(MODELS["llama-3-8b"], weights="fp8")
    out = tmp_path / "table"
    assert cli.run_profile(spec, 1, str(out), budget_s=60, skip_steps=False) == 0
    assert fake_gpu == [
        "gemm",
        "elementwise",
        "attn_decode",
        "attn_decode_padded",
        "attn_prefill",
        "steps",
    ]
    meta = yaml.safe_load((out / "meta.yaml").read_text())
    assert list(meta)[:3] == ["schema_version", "gpu", "model"]
    assert meta["gpu"]["key"] == "h200" and meta["tp"] == 1
    assert meta["precision"] == {"weights": "fp8", "kv_cache_dtype": "bf16"}
    assert meta["op_fingerprint"] == ShardedModel(spec, 1).op_fingerprint
    assert meta["allreduce"] == "not measured"
    assert meta["step_runner"]["kv_capacity_tokens"] == 4096
    assert meta["points_measured_this_run"] == {
        "gemm": 3, "elementwise": 3, "attn_decode": 3, "attn_decode_padded": 3, "attn_prefill": 3,
        "steps": 5,
    }  # fmt: skip
    # resumed with op tables only: the step runner's facts are kept from the first run
    assert cli.run_profile(spec, 1, str(out), budget_s=60, skip_steps=True) == 0
    again = yaml.safe_load((out / "meta.yaml").read_text())
    assert again["step_runner"] == meta["step_runner"]
    assert "steps" not in again["points_measured_this_run"]


def test_tp2_on_one_gpu_says_the_allreduce_was_not_measured(tmp_path, fake_gpu):
    cli.run_profile(MODELS["llama-3-8b"], 2, str(tmp_path / "t"), budget_s=60, skip_steps=True)
    meta = yaml.safe_load((tmp_path / "t" / "meta.yaml").read_text())
    assert meta["allreduce"] == "not measured: 1 GPU(s) visible, tp=2 needs 2"
