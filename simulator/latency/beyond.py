"""What a run asked of a latency table beyond what the table measured (extrapolated steps).

A latency model calls `BeyondTable.note` for every step it extrapolates (or, where it memoizes a
computation, every time it computes one); the run's record, ``describe()['warnings']``, says per
kind how far beyond the table the run went: the largest value any such step reached.

Why the extreme and not the first such step: the record goes into summary.json, and which step a
run computes first is not fixed by the simulation. Replicas that take their own arrivals are
simulated one stretch at a time, not in lockstep (`simulator.replica`), so "the first step
beyond the grid" of a multi-replica run depends on the order the replicas ran in; the largest
value reached does not (nor does the set of compositions a memo computes). It is also what a user
needs to judge the extrapolation. A Python warning is still raised at the first such step of
each kind, naming that step, for whoever watches the run.

Invariants: per kind, the extreme is the element-wise maximum of every value tuple noted for it;
`texts` lists the kinds in sorted order (not the order they were first seen), each its template
filled with its extreme.
"""

from __future__ import annotations

import warnings


class BeyondTable:
    """Per kind of extrapolation: a ``str.format`` template and the largest values noted."""

    __slots__ = ("_template", "_extreme", "prefix", "suffix")

    def __init__(self, prefix: str = "", suffix: str = ""):
        #: put around every text (the model's name, what it does about it)
        self.prefix, self.suffix = prefix, suffix
        self._template: dict[str, str] = {}
        self._extreme: dict[str, list] = {}

    def note(self, kind: str, template: str, *values, stacklevel: int = 2) -> None:
        """A step of ``kind`` lies beyond the table with ``values`` (``template``'s fields, in
        order; constants such as the table's bound may be among them). The first one of a
        kind is warned about, naming its values; ``stacklevel`` counts from the caller."""
        extreme = self._extreme.get(kind)
        if extreme is None:
            self._extreme[kind] = list(values)
            self._template[kind] = template
            warnings.warn(self._text(kind), RuntimeWarning, stacklevel=stacklevel + 1)
            return
        for i, v in enumerate(values):
            if v > extreme[i]:
                extreme[i] = v

    def __contains__(self, kind: str) -> bool:
        return kind in self._extreme

    def _text(self, kind: str) -> str:
        return self.prefix + self._template[kind].format(*self._extreme[kind]) + self.suffix

    def texts(self) -> list[str]:
        """One text per kind noted, in sorted kind order, with the largest values noted."""
        return [self._text(kind) for kind in sorted(self._extreme)]
