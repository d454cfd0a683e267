"""The vLLM driver on a real GPU (skipped without vLLM and CUDA, so always in CI): a 2-layer
Llama-shaped model in each precision (bf16; FP8 W8A8 with FP8 KV; GPTQ int4 weight-only) through
a few profiling scenarios and a short replay, recorded step by step, with the GPU's energy."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _tiny(weights="bf16", kv="bf16"):
    from simulator.models import ModelSpec

    return ModelSpec(
        name="tiny",
        num_layers=2,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=1024,
        vocab_size=32000,
        max_model_len=4096,
        weights=weights,
        kv_cache_dtype=kv,
    )


def _run_job(tmp_path, spec, tp: int, phases: list[dict]) -> Path:
    """Run ``phases`` on ``spec`` at ``tp`` in a process of its own, as profiles/device_vllm.sh
    runs it: its serving environment (vllm_run.serve_env) and a frontend that has not touched
    CUDA, so the engine core is forked with the step recorder installed (a CUDA-initialised
    parent makes vLLM spawn). Returns the run folder."""
    from profiles.hf_config import write_model_dir

    job = {
        "model_dir": str(write_model_dir(spec, tmp_path / "model")),
        "tp": tp,
        "precision": {"weights": spec.weights, "kv_cache_dtype": spec.kv_cache_dtype},
        "engine": {"gpu_memory_utilization": 0.3},
        "phases": phases,
    }
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "job.json").write_text(json.dumps(job))
    cmd = [sys.executable, "-m", "profiles.vllm_run", str(tmp_path / "job.json"), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    "weights,kv", [("bf16", "bf16"), ("fp8", "fp8"), ("int4", "bf16")], ids=["bf16", "fp8", "int4"]
)
def test_profile_and_replay_are_recorded(tmp_path, weights, kv):
    from profiles.gpu_energy import energy_between, read_energy
    from profiles.vllm_steps import read_steps
    from profiles.vllm_table import step_rows

    arr = tmp_path / "arrivals.json"
    arr.write_text(
        json.dumps(
            {"fingerprint": {"x": 1}, "requests": [[0.05 * i, 100 + 10 * i, 5] for i in range(10)]}
        )
    )
    out = _run_job(
        tmp_path,
        _tiny(weights, kv),
        1,
        [
            {"name": "profile", "kind": "profile", "limit": 4},
            {"name": "replay", "kind": "replay", "arrivals": str(arr)},
        ],
    )
    facts = json.loads((out / "engine.json").read_text())
    assert facts["vllm_version"].startswith("0.24")
    quant = facts["model"]["quantization"]
    # int4: vLLM 0.24 serves the generated GPTQ config with its auto_gptq method (hf_config.py)
    assert {"bf16": quant is None, "fp8": quant == "fp8", "int4": quant == "auto_gptq"}[weights], (
        quant
    )
    assert facts["cache"]["cache_dtype"] == ("auto" if kv == "bf16" else "fp8")
    energy = read_energy(out)
    assert energy["error"] is None and len(energy["t"]) > 10
    assert energy_between(energy, *energy["idle_window"]) > 0
    steps = read_steps(str(out / "steps.jsonl"))
    rows = step_rows(steps)
    assert any(r["prefill_tokens"] for r in rows) and any(r["decode_seqs"] for r in rows)
    assert all(r["dur_us"] > 0 for r in rows)
    with gzip.open(out / "replay.json.gz", "rt") as f:
        replay = json.load(f)
    assert replay["fingerprint"] == {"x": 1}
    assert len(replay["requests"]) == 10
    assert all(sum(k for _, k in r["times"]) == 5 for r in replay["requests"].values())


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_tp2_runs_on_two_gpus_with_multicast_off(tmp_path):
    """TP2 (the 2-GPU machine): both GPUs' energy is read, NVLink multicast is off in the
    engine's environment, and the log names the all-reduce backends the table will record."""
    from profiles.gpu_energy import read_energy
    from profiles.vllm_steps import read_steps
    from profiles.vllm_table import _kernels

    out = _run_job(tmp_path, _tiny(), 2, [{"name": "profile", "kind": "profile", "limit": 3}])
    facts = json.loads((out / "engine.json").read_text())
    assert facts["gpu_count"] >= 2 and facts["job"]["tp"] == 2
    assert facts["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert facts["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "all_reduce" in _kernels(out)
    assert len(read_energy(out)["mj"][0]) == torch.cuda.device_count()
    assert read_steps(str(out / "steps.jsonl"))
