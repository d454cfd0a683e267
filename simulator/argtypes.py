"""argparse ``type=`` functions that range-check option values when the command line is parsed.

Why: a value out of range (``--jobs 0``, ``--level 5``, ``--seed -5``) must stop the command
before any work, with argparse's one line ``argument --level: expected ...``, instead of running
with a nonsense setting or failing deep inside with a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(text: str, kind: type, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""
    what = f"an integer >= {low}"

    def parse(text: str) -> int:
        value = _number(text, int, what)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(low: float, high: float | None, *, low_open: bool, high_open: bool = False):
    """A finite float in the interval from ``low`` to ``high`` (None: no upper bound)."""
    left, right = ("(" if low_open else "["), (")" if high_open or high is None else "]")
    what = f"a number in {left}{low:g}, {'inf' if high is None else f'{high:g}'}{right}"

    def parse(text: str) -> float:
        value = _number(text, float, what)
        too_low = value <= low if low_open else value < low
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
positive_float = float_in(0.0, None, low_open=True)
fraction_open = float_in(0.0, 1.0, low_open=True, high_open=True)
fraction_upper_closed = float_in(0.0, 1.0, low_open=True)
