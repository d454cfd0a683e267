"""The vLLM driver on a real GPU (skipped without vLLM and CUDA, so always in CI): a 2-layer
Llama-shaped model through a few profiling scenarios and a short replay, recorded step by step."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_profile_and_replay_are_recorded(tmp_path):
    from profiles import vllm_run
    from profiles.hf_config import write_model_dir
    from profiles.vllm_steps import read_steps
    from profiles.vllm_table import step_rows
    from simulator.models import ModelSpec

    spec = ModelSpec(
        name="tiny",
        num_layers=2,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=1024,
        vocab_size=32000,
        max_model_len=4096,
    )
    mdir = write_model_dir(spec, tmp_path / "model")
    arr = tmp_path / "arrivals.json"
    arr.write_text(
        json.dumps(
            {"fingerprint": {"x": 1}, "requests": [[0.05 * i, 100 + 10 * i, 5] for i in range(10)]}
        )
    )
    job = {
        "model_dir": str(mdir),
        "tp": 1,
        "engine": {"gpu_memory_utilization": 0.3},
        "phases": [
            {"name": "profile", "kind": "profile", "limit": 4},
            {"name": "replay", "kind": "replay", "arrivals": str(arr)},
        ],
    }
    out = tmp_path / "run"
    out.mkdir()
    asyncio.run(vllm_run.main_async(job, out))
    facts = json.loads((out / "engine.json").read_text())
    assert facts["vllm_version"].startswith("0.24")
    steps = read_steps(str(out / "steps.jsonl"))
    rows = step_rows(steps)
    assert any(r["prefill_tokens"] for r in rows) and any(r["decode_seqs"] for r in rows)
    assert all(r["dur_us"] > 0 for r in rows)
    with gzip.open(out / "replay.json.gz", "rt") as f:
        replay = json.load(f)
    assert replay["fingerprint"] == {"x": 1}
    assert len(replay["requests"]) == 10
    assert all(sum(k for _, k in r["times"]) == 5 for r in replay["requests"].values())
