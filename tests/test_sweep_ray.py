"""The Ray backend of `servesim sweep` gives the local backend's files (skipped without ray)."""

import json
import os
from pathlib import Path

import pytest

# keep Ray on 127.0.0.1 (read when ray is imported; the sweep backend sets the same default)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from tooling_helpers import tiny  # noqa: E402

from simulator.sweep import Point, Task  # noqa: E402
from simulator.sweeprun import _ray_map, run_sweep  # noqa: E402

REPO = str(Path(__file__).resolve().parents[1])
GRID = {"scheduler.max_num_seqs": [4, 16]}
FILES = ("summary.json", "requests.csv", "steps.csv", "config.yaml", "point.json")


@pytest.fixture(scope="module", autouse=True)
def _shutdown_at_end():
    yield
    ray.shutdown()


@pytest.fixture
def ray_up():
    """A small local Ray instance shared by the tests that use it (the sweep leaves it up)."""
    if not ray.is_initialized():
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
            object_store_memory=100 * 1024**2, runtime_env={"env_vars": {"PYTHONPATH": REPO}},
        )  # fmt: skip
    yield
    assert ray.is_initialized()


def sweep(out, cfg, **kw):
    return run_sweep(cfg, "tiny.yaml", Path("."), out, jobs=2, progress=False, **kw)


def same_files(a: Path, b: Path, folders) -> None:
    for folder in folders:
        for name in FILES:
            assert (a / folder / name).read_bytes() == (b / folder / name).read_bytes(), (
                folder,
                name,
            )
    assert (a / "index.csv").read_bytes() == (b / "index.csv").read_bytes()


def test_ray_gives_local_files_and_resumes(tmp_path, ray_up):
    cfg = tiny(sweep=GRID, seeds=[0, 1])
    local = sweep(tmp_path / "local", cfg, backend="local")
    index = sweep(tmp_path / "ray", cfg, backend="ray")
    assert set(index["status"]) == {"done"} and not index["resumed"].any()
    same_files(tmp_path / "local", tmp_path / "ray", local["folder"])
    run = tmp_path / "ray" / index["folder"][0] / "summary.json"
    mtime = run.stat().st_mtime_ns
    again = sweep(tmp_path / "ray", cfg, backend="ray")
    assert again["resumed"].all() and set(again["status"]) == {"done"}
    assert run.stat().st_mtime_ns == mtime


def test_ray_failing_point_is_recorded_and_the_rest_finish(tmp_path, ray_up):
    cfg = tiny(sweep={"scheduler.max_num_seqs": [4, -1, 16]})
    index = sweep(tmp_path / "ray", cfg, backend="ray")
    assert list(index["status"]) == ["done", "failed", "done"]
    assert "max_num_seqs" in index["error"][1]
    bad = tmp_path / "ray" / index["folder"][1]
    assert "max_num_seqs" in (bad / "error.txt").read_text()
    assert json.loads((bad / "point.json").read_text())["status"] == "failed"
    again = sweep(tmp_path / "ray", cfg, backend="ray")
    assert list(again["resumed"]) == [True, False, True]


def test_ray_with_address_returns_results_to_the_driver(tmp_path, ray_up):
    # with an address the workers send results back and this process writes them
    cfg = tiny(sweep={"scheduler.max_num_seqs": [4, -1, 16]})
    local = sweep(tmp_path / "local", cfg, backend="local")
    address = ray.get_runtime_context().gcs_address
    index = sweep(tmp_path / "ray", cfg, backend="ray", address=address)
    assert list(index["status"]) == ["done", "failed", "done"]
    same_files(tmp_path / "local", tmp_path / "ray", local["folder"][[0, 2]])
    bad = local["folder"][1]
    for name in ("error.txt", "config.yaml", "point.json"):
        assert (tmp_path / "ray" / bad / name).read_bytes() == (
            tmp_path / "local" / bad / name
        ).read_bytes()


class _FailsOnWorker:
    """Unpickles to an error: the task fails before `run_task` can catch anything."""

    def __reduce__(self):
        return (int, ("not a number",))


def test_ray_task_lost_before_running_is_a_failed_record(ray_up):
    good = Task(tiny(), "tiny.yaml", REPO, Point("", {}, 0), None, None)
    lost = Task({"bad": _FailsOnWorker()}, "tiny.yaml", REPO, Point("bad", {}, 0), None, None)
    recs = {r["folder"]: r for r in _ray_map([good, lost], 2, None)}
    assert recs["seed0"]["status"] == "done"
    assert recs["bad/seed0"]["status"] == "failed" and recs["bad/seed0"]["lost"]
    assert recs["bad/seed0"]["error"]


def test_ray_starts_and_stops_its_own_instance(tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    index = sweep(tmp_path / "ray", tiny(sweep=GRID), backend="ray")
    assert list(index["status"]) == ["done", "done"]
    assert not ray.is_initialized()
