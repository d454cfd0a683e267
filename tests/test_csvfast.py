"""`simulator.csvfast` formats cells with numpy: each must equal Python's own text.

Floats must equal ``"%.9g" % v`` (NaN: empty) on the values numpy formats (plain decimals,
exponent -4 to 8) and on those it hands back to Python (exponent notation, inf, near-ties,
values next to powers of ten); integers ``str(v)`` over the whole int64 range and other widths.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator import csvfast


def _cells(values) -> list[str]:
    col = np.asarray(values)
    return csvfast.format_rows({"c": col}, 0, len(col)).decode().split("\n")[:-1]


def _expected_floats(values) -> list[str]:
    return ["" if v != v else "%.9g" % v for v in np.asarray(values, float).tolist()]  # noqa: UP031


@pytest.mark.parametrize("seed", [0, 1])
def test_random_floats_equal_percent_9g(seed):
    rng = np.random.default_rng(seed)
    n = 50_000
    draws = [
        rng.exponential(size=n) * 10.0 ** rng.integers(-12, 14, size=n),
        rng.normal(size=n) * 10.0 ** rng.integers(-6, 10, size=n),
        np.round(rng.normal(size=n) * 10.0 ** rng.integers(0, 12, size=n)),  # whole numbers
        np.round(rng.random(n) * 1e6) / 2.0 ** rng.integers(0, 12, n),  # few binary digits
        rng.integers(0, 10**9, n) / 10.0 ** rng.integers(0, 13, n),  # few decimal digits
        (rng.integers(0, 10**9, n) + 0.5) / 10.0 ** rng.integers(0, 13, n),  # near-ties
    ]
    for values in draws:
        assert _cells(values) == _expected_floats(values)


def test_edge_floats_equal_percent_9g():
    tens = np.array([10.0**k for k in range(-8, 12)])
    values = np.concatenate([
        tens, np.nextafter(tens, 0), np.nextafter(tens, np.inf), -tens,
        [0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1.7976931348623157e308, -1.5e-300],
        [12345678.5, 12345679.5, 0.5, 1.5, 2.5, 123456789.5, 999999999.5, 999999999.4],
        [99999999.95, 9.999999995, 0.00009999999995, 0.0001, 1e-5, 0.1 + 0.2, 1 / 3],
    ])  # fmt: skip
    assert _cells(values) == _expected_floats(values)
    single = values[~(np.abs(values) > 1e38)].astype(np.float32)
    assert _cells(single) == _expected_floats(single)


def test_integers_equal_str():
    rng = np.random.default_rng(2)
    info = np.iinfo(np.int64)
    values = np.concatenate([
        rng.integers(info.min, info.max, 20_000, dtype=np.int64),
        rng.integers(-1000, 1000, 2000),
        [0, -1, 1, 9, 10, -10, 2**31, -(2**31), info.max, info.min],
    ])  # fmt: skip
    assert _cells(values) == [str(v) for v in values.tolist()]
    for dtype in (np.int32, np.int16, np.uint8, np.uint64):
        small = rng.integers(0, 100, 500).astype(dtype)
        assert _cells(small) == [str(v) for v in small.tolist()]
    big = np.array([2**64 - 1, 0, 5], dtype=np.uint64)
    assert _cells(big) == [str(v) for v in big.tolist()]


def test_mixed_row_and_strings():
    cols = {
        "i": np.array([3, -40, 0]),
        "f": np.array([0.25, np.nan, -1e-7]),
        "s": np.array(["ok", "a,b", 'q"'], dtype=object),
        "b": np.array([True, False, True]),
    }
    rows = b'3,0.25,ok,True\n-40,,"a,b",False\n0,-1e-07,"q""",True\n'
    assert csvfast.format_rows(cols, 0, 3) == rows
    assert csvfast.format_rows(cols, 1, 2) == b'-40,,"a,b",False\n'
    assert csvfast.format_rows(cols, 2, 2) == b""
