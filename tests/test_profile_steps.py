"""CPU tests of the whole-step profiling loop (profiles.measure) with a fake step runner."""

from __future__ import annotations

import collections
import csv
import os

import pytest

from profiles import measure as M


class FakeRunner:
    """Stands in for StepRunner: a step 'takes' a time fixed by its composition."""

    def __init__(self, capacity_tokens=400_000, max_tokens=16384, fail_after=None):
        self.capacity_tokens = capacity_tokens
        self.max_tokens = max_tokens
        self.max_model_len = 65536
        self.tp = 1
        self.use_cuda_graphs = True
        self.calls: list[tuple] = []
        self.fail_after = fail_after

    def uses_graph(self, prefills, decodes):
        return not prefills

    def run_step(self, prefills, decodes):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt  # an interrupted profiling run
        key = (tuple(prefills), tuple(decodes))
        self.calls.append(key)
        tokens = sum(c for _, c, _ in prefills) + len(decodes)
        return (1e-3 + 1e-6 * tokens + 1e-9 * sum(n for _, n in decodes)) * (
            1.0 + 0.01 * (len(self.calls) % 3)
        )


def _rows(out):
    with open(os.path.join(out, "steps.csv")) as f:
        return list(csv.DictReader(f))


def test_split_is_fixed_and_stratified():
    comps = M.step_compositions(400_000)
    again = M.step_compositions(400_000)
    assert comps == again  # seeded: same ids, shapes and split every time
    assert [c["step_id"] for c in comps] == list(range(len(comps)))
    by_kind = collections.Counter((c["group"], c["kind"], c["split"]) for c in comps)
    for group in (0, 1):  # lognormal-spread decodes, then near-equal ones: split on their own
        for kind in ("decode", "mixed"):
            n = by_kind[(group, kind, "test")] + by_kind[(group, kind, "train")]
            assert n > 0 and by_kind[(group, kind, "test")] == -(-n // 3)  # one in three
    # the near-equal-spread compositions come last, so the earlier steps keep their ids
    groups = [c["group"] for c in comps]
    assert groups == sorted(groups)
    assert {c["sigma"] for c in comps if c["group"]} == set(M.STEP_SIGMAS)
    # the random compositions are there and respect the runner's limits
    assert len(comps) > len(M.MIXED_GRID) + 28
    for c in M.step_compositions(10_000_000, max_tokens=4096, max_model_len=20_000):
        s, ch, b = c["prefills"] or (0, 0, 0)
        db, dctx = c["decodes"]
        assert s * ch + db <= 4096 and b + ch <= 20_000
        assert max(M.uneven_lengths(db * dctx, db, c["sigma"])) <= 20_000 if db else True
    for c in M.step_compositions(60_000, max_tokens=4096):
        s, ch, b = c["prefills"] or (0, 0, 0)
        db, dctx = c["decodes"]
        assert s * (b + ch) + db * dctx <= 60_000 * 0.9


def test_each_step_runs_interleaved_rounds(tmp_path):
    out = str(tmp_path)
    r = FakeRunner()
    n = M.profile_steps(out, r, deadline=float("inf"), rounds=5, min_rounds=3, block=10)
    rows = _rows(out)
    assert n == len(rows) == len(M.step_compositions(r.capacity_tokens))
    runs = collections.Counter(r.calls)
    assert set(runs.values()) == {20}  # 5 rounds x (1 untimed + 3 timed), every composition
    # within a round a composition runs 4 times back to back; rounds are shuffled
    first = r.calls[0:40:4]
    assert all(len(set(r.calls[i : i + 4])) == 1 for i in range(0, 40, 4))
    assert r.calls[40:80:4] != first and sorted(r.calls[40:80:4]) == sorted(first)
    for row in rows:
        assert float(row["p10_us"]) <= float(row["median_us"]) <= float(row["p90_us"])
        # the host wall-clock around each step is recorded too (here: the fake's own Python)
        assert 0 < float(row["wall_p10_us"]) <= float(row["wall_median_us"])
        assert float(row["wall_median_us"]) <= float(row["wall_p90_us"])
        assert row["split"] in ("train", "test")
    # each row records its longest decode context: the spread its decodes ran at
    comps = {c["step_id"]: c for c in M.step_compositions(r.capacity_tokens)}
    for row in rows:
        c = comps[int(row["step_id"])]
        db, dctx = c["decodes"]
        want = max(M.uneven_lengths(db * dctx, db, c["sigma"])) if db else 0
        assert int(row["decode_max"]) == want
        assert int(row["decode_ctx"]) == db * dctx
        if db > 1 and c["sigma"] == 0:
            assert want * db - db * dctx < db  # equal contexts (the remainder on the last)


def test_resume_after_interruption_measures_only_missing_steps(tmp_path):
    out = str(tmp_path)
    with pytest.raises(KeyboardInterrupt):  # dies inside the third block
        M.profile_steps(out, FakeRunner(fail_after=2 * 8 * 12 + 5), float("inf"), 3, 3, block=8)
    assert len(_rows(out)) == 16  # two whole blocks were written
    r = FakeRunner()
    n = M.profile_steps(out, r, float("inf"), rounds=3, min_rounds=3, block=8)
    ids = [int(row["step_id"]) for row in _rows(out)]
    assert sorted(ids) == list(range(len(M.step_compositions(r.capacity_tokens))))
    assert n == len(ids) - 16
    assert M.profile_steps(out, FakeRunner(), float("inf")) == 0  # nothing left to do
