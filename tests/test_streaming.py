"""The memory- and time-saving output paths give exactly what the old ones gave.

* `simulator.csvfast` writes the bytes ``pandas.DataFrame.to_csv(index=False,
  float_format="%.9g")`` wrote (the old `write_results`);
* `simulator.steplog.StepLog` gives back the rows a list of tuples held, and `step_arrays`
  the columns it built from ``np.array(rows, dtype=float)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator import csvfast
from simulator.metrics import step_arrays
from simulator.steplog import NAMES, StepLog


def _pandas_csv(cols: dict, path) -> bytes:
    pd.DataFrame(cols).to_csv(path, index=False, float_format="%.9g")
    return path.read_bytes()


def test_csv_matches_pandas(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    n = 1000
    f = rng.exponential(size=n) * 10.0 ** rng.integers(-12, 12, size=n)
    f[::7] = np.nan
    f[3] = np.inf
    f[5] = -0.0
    cols = {
        "id": np.arange(n, dtype=np.int64),
        "t": f,
        "whole": np.round(rng.normal(size=n) * 1e6),
        "neg": -rng.integers(0, 2**40, size=n),
        "status": np.array(["finished", "rejected", "waiting"] * 333 + ["running"], dtype=object),
        "reason": np.array(["", 'a "quoted", reason', "line\nbreak", "x > 5"] * 250, dtype=object),
    }
    monkeypatch.setattr(csvfast, "CHUNK_ROWS", 97)  # several chunks, a short last one
    csvfast.write_csv(tmp_path / "fast.csv", cols)
    assert (tmp_path / "fast.csv").read_bytes() == _pandas_csv(cols, tmp_path / "pd.csv")


def test_csv_empty_matches_pandas(tmp_path):
    cols = {k: np.zeros(0) for k in ("a", "b")}
    csvfast.write_csv(tmp_path / "fast.csv", cols)
    assert (tmp_path / "fast.csv").read_bytes() == _pandas_csv(cols, tmp_path / "pd.csv")


class _Rep:
    def __init__(self, index, rows):
        self.index = index
        self.steps = StepLog()
        for i, r in enumerate(rows):
            self.steps.append(r)
            if i % 5 == 4:
                self.steps.pack()  # chunks of several sizes plus pending rows


def _old_step_arrays(rows_by_rep):
    """`metrics.step_arrays` as it was: one float array of tuples, then int columns cast."""
    rows = [row + (i,) for i, rows in enumerate(rows_by_rep) for row in rows]
    a = np.array(rows, dtype=float)
    out = {k: a[:, i] for i, k in enumerate(NAMES)}
    out["replica"] = a[:, -1].astype(np.int64)
    for k in NAMES[2:]:
        if k != "prefill_attn":
            out[k] = out[k].astype(np.int64)
    return out


def test_step_log_and_arrays_equal_the_tuple_list():
    rng = np.random.default_rng(1)
    rows_by_rep = [
        [
            (float(rng.random()), float(rng.random()) / 3, int(rng.integers(0, 9000)),
             float(rng.random() * 1e7), 1, int(rng.integers(0, 256)), int(rng.integers(0, 2**40)),
             7, 0, 3, 12345)
            for _ in range(n)
        ]
        for n in (23, 0, 11)
    ]  # fmt: skip
    reps = [_Rep(i, rows) for i, rows in enumerate(rows_by_rep)]
    assert [list(r.steps) for r in reps] == [
        [tuple(float(v) for v in row) for row in rows] for rows in rows_by_rep
    ]
    assert reps[0].steps[4] == tuple(float(v) for v in rows_by_rep[0][4])
    assert len(reps[2].steps) == 11
    new, old = step_arrays(reps, release=True), _old_step_arrays(rows_by_rep)
    assert list(new) == list(old)
    for k in old:
        assert new[k].dtype == old[k].dtype and np.array_equal(new[k], old[k]), k
        assert new[k].sum() == old[k].sum(), k  # contiguous vs strided: same float sums
    assert all(len(r.steps) == 0 for r in reps)
