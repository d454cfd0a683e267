"""Archiving a device run (profiles/archive_run.py) and the step-time check on vLLM's own
batches (profiles/vllm_validate.step_model_on_real_batches)."""

from __future__ import annotations

import gzip
import json

import pytest

from profiles.archive_run import archive
from profiles.gpu_energy import NvmlError, read_energy, visible_devices
from profiles.vllm_steps import read_steps
from profiles.vllm_table import load_profile_phase
from profiles.vllm_validate import step_model_on_real_batches
from simulator.errors import ConfigError


def _step(i: int, t_done: float) -> dict:
    return {"i": i, "t_sched": t_done - 0.005, "t_done": t_done, "pf": [], "nd": 4}


def _run(tmp_path, cut_short: bool):
    run = tmp_path / "run"
    run.mkdir()
    (run / "engine.json").write_text('{"vllm_version": "0.24.0"}')
    (run / "log.txt").write_text("Model loading took 14.96 GiB\n")
    # two engine-core processes, their steps interleaved in time
    (run / "steps.jsonl.11").write_text(
        "".join(json.dumps(_step(k, t)) + "\n" for k, t in ((0, 1.0), (1, 3.0)))
    )
    (run / "steps.jsonl.12").write_text(json.dumps(_step(0, 2.0)) + "\n")
    (run / "energy.7.jsonl").write_text('{"period_s": 0.02}\n[0.5, [100]]\n[1.5, [900]]\n')
    scen = {
        "scenario": {"id": "dec_b1", "t0": 0.9, "t1": 3.1},
        "requests": {"dec_b1/0": {"times": [[1.2, 1], [1.3, 1]]}},
    }
    if cut_short:
        (run / "profile.partial.jsonl").write_text(json.dumps(scen) + "\n{cut")
    with gzip.open(run / "conv_light.json.gz", "wt") as f:
        json.dump({"requests": {}}, f)
    return run


def test_a_cut_short_run_is_archived_whole(tmp_path):
    dest = tmp_path / "raw"
    names = archive(_run(tmp_path, cut_short=True), dest)
    assert names == [
        "engine.json", "log.txt", "steps.jsonl.0.gz", "energy.json.gz", "profile.json.gz",
        "conv_light.json.gz",
    ]  # fmt: skip
    assert [s["t_done"] for s in read_steps(str(dest / "steps.jsonl"))] == [1.0, 2.0, 3.0]
    energy = read_energy(dest)
    assert energy["t"] == [0.5, 1.5] and energy["mj"] == [[100], [900]]
    phase = load_profile_phase(dest)
    assert phase["cut_short"] is True and [s["id"] for s in phase["scenarios"]] == ["dec_b1"]
    # a profiling request keeps its first token only: the table reads nothing later
    assert phase["requests"]["dec_b1/0"]["times"] == [[1.2, 1]] and phase["first_token_only"]


def test_energy_of_gpus_the_engine_did_not_use_is_dropped(tmp_path):
    run = _run(tmp_path, cut_short=False)
    # a sampler that read both GPUs of a host while the engine ran on GPU 0 (busy) alone
    (run / "energy.7.jsonl").write_text('{"period_s": 0.02}\n[0.5, [100, 50]]\n[1.5, [900, 60]]\n')
    archive(run, tmp_path / "raw", energy_gpus=[0])
    energy = read_energy(tmp_path / "raw")
    assert energy["mj"] == [[100], [900]] and energy["devices"] == [0]
    assert "--energy-gpus" in energy["devices_kept"]
    with pytest.raises(ConfigError, match="expected some of the record's"):
        archive(run, tmp_path / "raw2", energy_gpus=[2])


def test_the_sampler_reads_only_the_visible_gpus():
    assert visible_devices(None, 2) == [0, 1]
    assert visible_devices("1", 2) == [1]
    assert visible_devices("0, 1", 4) == [0, 1]
    for bad in ("2", "GPU-5f0c", "-1"):
        with pytest.raises(NvmlError, match="CUDA_VISIBLE_DEVICES"):
            visible_devices(bad, 2)


def test_a_replay_has_no_profile_phase(tmp_path):
    names = archive(_run(tmp_path, cut_short=False), tmp_path / "raw")
    assert "profile.json.gz" not in names and "conv_light.json.gz" in names


def test_a_folder_without_an_engine_record_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="engine.json"):
        archive(tmp_path, tmp_path / "raw")


class _Charged:
    """A latency model that charges every step 10 ms."""

    def predict_row(self, r: dict) -> float:
        return 0.010


class _Launching(_Charged):
    launch = 0.015

    def launch_s(self, tokens: int) -> float:
        return self.launch


def _row(dur_ms: float, prefill: int = 0, idle: int = 0, exposes: int = 0) -> dict:
    return {"dur_us": dur_ms * 1e3, "prefill_tokens": prefill, "after_idle": idle, "decode_seqs": 0,
            "prefill_behind": exposes}  # fmt: skip


def test_step_time_on_real_batches_by_hand():
    rows = [
        _row(8.0, idle=1),  # planned on an idle engine: left out
        _row(10.0),  # clean decode: 0%
        _row(20.0),  # decode waiting for the launch behind it: not clean
        _row(10.0, prefill=512, exposes=1),
        _row(12.5),  # clean decode: -20%
    ]
    got = step_model_on_real_batches(_Charged(), rows)
    assert got["busy_steps"] == 4
    assert got["busy_time_err"] == pytest.approx(40.0 / 52.5 - 1)
    # a 15 ms launch behind the 20 ms decode step: it lasts 15 ms at least (it does: 10 + 5 ms
    # waited), and the launched step gives the 5 ms back: the sum stays 40 ms
    launched = _Launching()
    got = step_model_on_real_batches(launched, rows)
    assert got["busy_time_err"] == pytest.approx(40.0 / 52.5 - 1)
    launched.launch = 0.030  # 20 ms waited; the launched step keeps a fifth of its 10 ms
    got = step_model_on_real_batches(launched, rows)
    assert got["busy_time_err"] == pytest.approx((10 + 30 + 2 + 10) / 52.5 - 1)
    assert got["clean_decode_steps"] == 2
    assert got["clean_decode_median_err"] == pytest.approx(-0.1)
    # by kind: the decodes are charged 10 + 30 + 10 ms for 42.5 measured, the launched prefill
    # 2 ms for 10; the two shares add up to the busy-time error
    kinds = got["by_kind"]
    assert kinds["decode"]["steps"] == 3
    assert kinds["decode"]["sum_err"] == pytest.approx(50 / 42.5 - 1)
    assert kinds["prefill_launched"]["sum_err"] == pytest.approx(2 / 10 - 1)
    assert sum(k["of_busy_time"] for k in kinds.values()) == pytest.approx(got["busy_time_err"])


def test_step_time_check_needs_a_recorded_step_model():
    assert step_model_on_real_batches(object(), [_row(10.0)]) is None
