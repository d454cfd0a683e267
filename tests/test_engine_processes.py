"""A profile spread over several engine processes (`profiles.vllm_run`'s ``passes_per_engine``):
which scenarios each process runs, the exit status that asks for the next, and the step records
of several processes told apart (`profiles.vllm_steps`). No GPU: the engine is faked."""

import asyncio
import gzip
import json

import pytest

from profiles import vllm_run
from profiles.vllm_grid import pass_index, repeated
from profiles.vllm_steps import engine_processes, read_steps

GRID = [{"id": f"dec_b{b}", "split": "train", "kind": "batch"} for b in (1, 2, 4)]


def test_a_scenarios_pass_is_its_repeat_suffix():
    assert [pass_index(sc["id"]) for sc in repeated(GRID, 3)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert pass_index("arrive_b8_c1024") == 0 and pass_index("x~r12") == 12


def test_each_engine_runs_its_passes_from_the_first_unfinished_one():
    scs = repeated(GRID, 3)
    share = vllm_run.this_engines_share
    assert share(scs, None) == scs  # no limit: all
    assert [s["id"] for s in share(scs, 1)] == ["dec_b1", "dec_b2", "dec_b4"]
    # a process cut short in pass 0 left dec_b4: the next runs it and pass 1, not pass 2
    left = scs[2:]
    assert [s["id"] for s in share(left, 1)] == ["dec_b4"]
    assert [s["id"] for s in share(left, 2)] == ["dec_b4", "dec_b1~r1", "dec_b2~r1", "dec_b4~r1"]
    assert share([], 1) == []


def _facts():
    return {
        "cache": {"num_gpu_blocks": 1000, "block_size": 16},
        "model": {"max_model_len": 8192},
        "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        "compilation": {"max_cudagraph_capture_size": 512},
    }


def test_three_passes_one_per_engine_take_three_processes_and_lose_nothing(tmp_path, monkeypatch):
    """Each call of `run_profile` stands for one engine process resuming the folder: it runs
    one pass, says how many scenarios are left, and the third finishes with none left; every
    scenario of every pass is recorded exactly once."""
    monkeypatch.setattr(vllm_run.vllm_grid, "scenarios", lambda **k: [dict(s) for s in GRID])
    ran = _fake_engine(monkeypatch)
    phase = {"name": "profile", "repeats": 3, "passes_per_engine": 1, "resume": True}
    left = []
    for _ in range(3):
        info = asyncio.run(vllm_run.run_profile(_Client(), phase, _facts(), tmp_path))
        left.append(info["unfinished"])
    assert left == [6, 3, 0]
    assert ran == [s["id"] for s in repeated(GRID, 3)]
    assert [s["id"] for s in info["scenarios"]] == ran


class _Client:
    records: dict = {}


def _fake_engine(monkeypatch) -> list[str]:
    """Scenarios 'run' instantly; the ids run, in order, are appended to the returned list."""
    ran = []

    async def fake_scenario(client, sc):
        ran.append(sc["id"])
        return {"id": sc["id"], "split": sc["split"], "t0": 0.0, "t1": 0.1}

    async def no_sleep(_s):
        return None

    monkeypatch.setattr(vllm_run, "run_scenario", fake_scenario)
    monkeypatch.setattr(vllm_run.asyncio, "sleep", no_sleep)
    return ran


def test_later_engines_run_the_first_engines_grid(tmp_path, monkeypatch):
    """KV capacity differs between engine starts (an H100: 28,957 blocks, then 29,074), and the
    grid sizes some scenarios by it: a later engine keeps the first one's grid, so no scenario
    is renamed and run again as unfinished, and the passes stay repeats of one grid."""
    first, later = _facts(), _facts()
    first["cache"]["num_gpu_blocks"], later["cache"]["num_gpu_blocks"] = 28957, 29074
    grid = vllm_run.vllm_grid.scenarios
    ids = [s["id"] for s in grid(**vllm_run.grid_args({"name": "a"}, first, tmp_path))]
    assert ids != [s["id"] for s in grid(**vllm_run.grid_args({"name": "b"}, later, tmp_path))]
    ran = _fake_engine(monkeypatch)
    phase = {"name": "profile", "repeats": 2, "passes_per_engine": 1, "resume": True}
    for facts in (first, later):
        asyncio.run(vllm_run.run_profile(_Client(), phase, facts, tmp_path))
    assert ran == [s["id"] for s in repeated([{"id": i} for i in ids], 2)]


def test_passes_per_engine_without_resume_is_refused():
    """The next process would drop what this one recorded and start over, forever."""
    job = {"phases": [{"name": "p", "kind": "profile", "passes_per_engine": 1}]}
    with pytest.raises(SystemExit, match="needs resume: true"):
        vllm_run.check_passes_per_engine(job)
    job["phases"][0].update(resume=True, passes_per_engine=0)
    with pytest.raises(SystemExit, match="integer >= 1"):
        vllm_run.check_passes_per_engine(job)
    job["phases"][0]["passes_per_engine"] = 2
    vllm_run.check_passes_per_engine(job)  # accepted


def test_the_job_is_started_again_while_it_asks_for_another_engine(tmp_path, monkeypatch):
    codes = iter([vllm_run.MORE_PASSES, vllm_run.MORE_PASSES, 0])
    calls = []

    class Done:
        def __init__(self, rc):
            self.returncode = rc

    monkeypatch.setattr(
        vllm_run.subprocess, "run", lambda cmd, check: calls.append(cmd) or Done(next(codes))
    )
    assert vllm_run.run_until_done(tmp_path / "job.json", tmp_path) == 0
    assert len(calls) == 3 and calls[0][1:3] == ["-m", "profiles.vllm_run"]
    monkeypatch.setattr(vllm_run.subprocess, "run", lambda cmd, check: Done(vllm_run.MORE_PASSES))
    with pytest.raises(SystemExit, match="still unfinished after 2"):
        vllm_run.run_until_done(tmp_path / "job.json", tmp_path, max_engines=2)


def _write(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_steps_of_several_processes_carry_their_process_in_start_order(tmp_path):
    """Files are named by pid, which says nothing of order: the process numbers follow the
    first plan in each file; the rows are merged in completion order."""
    _write(tmp_path / "steps.jsonl.900", [{"t_sched": 1.0, "t_done": 1.1, "i": 0}])
    _write(tmp_path / "steps.jsonl.12", [{"t_sched": 100.0, "t_done": 100.2, "i": 0},
                                         {"t_sched": 100.2, "t_done": 100.3, "i": 1}])  # fmt: skip
    steps = read_steps(str(tmp_path / "steps.jsonl"))
    assert [(r["t_done"], r["proc"]) for r in steps] == [(1.1, 0), (100.2, 1), (100.3, 1)]
    assert engine_processes(steps) == [0, 1, 1]


def test_an_archived_run_without_process_tags_splits_at_restart_gaps(tmp_path):
    rows = [{"t_sched": t, "t_done": t + 0.01} for t in (0.0, 0.5, 10.0, 45.0, 45.1)]
    _write(tmp_path / "steps.jsonl.0.gz", rows, gz=True)
    steps = read_steps(str(tmp_path / "steps.jsonl"))
    assert "proc" not in steps[0]  # one file: nothing to tell apart
    assert engine_processes(steps) == [0, 0, 0, 1, 1]  # 9.5 s idle is one engine; 35 s is two


def test_a_phase_is_written_whole_with_what_it_left(tmp_path, monkeypatch):
    """`_run_phase` writes ``<name>.json.gz`` (renamed into place, no ``.tmp`` left) with the
    phase's window, requests and its ``unfinished`` count, which `main_async` reads to end the
    engine."""

    async def fake_profile(client, phase, facts, out):
        client.records["dec_b1/0"] = {"prompt": 1, "out": 1}
        return {"scenarios": [], "unfinished": 3}

    async def no_sleep(_s):
        return None

    monkeypatch.setattr(vllm_run, "run_profile", fake_profile)
    monkeypatch.setattr(vllm_run.asyncio, "sleep", no_sleep)
    phase = {"name": "profile", "kind": "profile"}
    info = asyncio.run(vllm_run._run_phase(object(), 100, phase, {}, tmp_path))
    with gzip.open(tmp_path / "profile.json.gz", "rt") as f:
        stored = json.load(f)
    assert stored["unfinished"] == info["unfinished"] == 3
    assert stored["requests"] == {"dec_b1/0": {"prompt": 1, "out": 1}}
    assert stored["name"] == "profile" and stored["t1"] >= stored["t0"]
    assert not list(tmp_path.glob("*.tmp"))
