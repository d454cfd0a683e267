"""Step-latency models: how long one engine step takes, from its batch composition."""

from simulator.latency.base import StepLatencyModel

__all__ = ["StepLatencyModel"]
