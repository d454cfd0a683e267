"""Scheduling policies. Adding one = one file here + one line in POLICIES."""

from policies.continuous import ContinuousBatching

POLICIES = {
    ContinuousBatching.name: ContinuousBatching,
}

__all__ = ["POLICIES"]
