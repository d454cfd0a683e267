"""A one-line progress report for long ``servesim run`` simulations, on a terminal only.

Why: a run of a day-long trace takes minutes; without a sign of life a user cannot tell a slow
run from a hung one. The line (simulated time, requests done, how fast the simulation goes) is
rewritten in place on stderr, at most twice a second; it is never shown when stderr is not a
terminal, under CI, or with ``--quiet``, so logs and results files never contain it.
"""

from __future__ import annotations

import os
import sys
import time


def wanted(quiet: bool, stream=None) -> bool:
    """Progress is for a person at a terminal: not with --quiet, not in CI, not into a pipe."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not quiet and not os.environ.get("CI") and bool(isatty and isatty())


class RunProgress:
    """``simulate(progress=...)`` callback that redraws ``sim 12.3 s | 456/1000 requests done |
    5,400 simulated requests/s | wall 0:07`` on ``stream``."""

    def __init__(self, total_requests: int, stream=None, every_s: float = 0.5):
        self.total = total_requests
        self.stream = sys.stderr if stream is None else stream
        self.every_s = every_s
        self.t0 = self.last = time.perf_counter()
        self.shown = False

    def __call__(self, now_s: float, done: int) -> None:
        """``done``: requests finished or rejected so far (`runner.simulate`'s count)."""
        t = time.perf_counter()
        if t - self.last < self.every_s:
            return
        self.last = t
        wall = t - self.t0
        rate = done / wall if wall > 0 else 0.0
        line = (f"sim {now_s:,.1f} s | {done:,}/{self.total:,} requests done | {rate:,.0f} "
                f"simulated requests/s | wall {int(wall) // 60}:{int(wall) % 60:02d}")  # fmt: skip
        print("\r" + line, end="", file=self.stream, flush=True)
        self.shown = True

    def close(self) -> None:
        """End the progress line (if one was drawn) so the summary starts on a fresh line."""
        if self.shown:
            print(file=self.stream, flush=True)
