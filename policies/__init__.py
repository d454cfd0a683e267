"""Scheduling policies. Adding one = one file here + one line in POLICIES."""

from policies.chunked_prefill import ChunkedPrefill
from policies.continuous import ContinuousBatching
from policies.dynamic import DynamicBatching
from policies.speculative import Speculative
from policies.static import StaticBatching
from policies.vllm import Vllm

POLICIES = {
    ContinuousBatching.name: ContinuousBatching,
    StaticBatching.name: StaticBatching,
    DynamicBatching.name: DynamicBatching,
    ChunkedPrefill.name: ChunkedPrefill,
    Speculative.name: Speculative,
    Vllm.name: Vllm,
}

__all__ = ["POLICIES"]
