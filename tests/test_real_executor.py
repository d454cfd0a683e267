"""The real-GPU executor's plan-to-batch translation, checked on CPU.

A reference executor translates every step the simulator plans (profiles.step_batch) and runs it
through a tiny paged-KV forward (profiles.reference_forward). For every sequence of every step,
the logits of its last token must equal a full recomputation of that sequence without a cache.
Runs cover chunked prefill (chunk boundaries over a cache), continuous batching with preemption
(recompute into new blocks), static batching (decodes as single-token chunks) and the contiguous
allocator. A wrong position, slot, block table or offset makes the logits differ (the cache starts
as NaN, so reading a never-written slot fails too).
"""

from __future__ import annotations

import math

import pytest
import simpy

from policies import POLICIES
from policies.routing import RoundRobin
from profiles.step_batch import StepBatch, batch_metadata, plan_to_batch
from simulator.cfg import Section
from simulator.cluster import Cluster
from simulator.kv.contiguous import ContiguousAllocator
from simulator.kv.paged import PagedTableAllocator
from simulator.metrics import request_table
from simulator.replica import Replica
from workloads.spec import RequestSpec

torch = pytest.importorskip("torch")

from profiles.reference_forward import TinyLlama  # noqa: E402

BS = 4  # small blocks: many block boundaries


def tok(slot: int, pos: int, vocab: int = 97) -> int:
    """The token at ``pos`` of sequence ``slot`` (deterministic, so recomputation sees it)."""
    return (slot * 7919 + pos * 31 + 3) % vocab


class CheckingExecutor:
    """Runs each step on the reference model and compares with recomputation."""

    can_precompute = False

    def __init__(self, num_blocks: int):
        self.model = TinyLlama(num_blocks, BS)
        self.steps = self.seqs = self.max_err = 0
        self.max_err = 0.0

    def execute(self, plan, replica, features) -> float:
        batch = plan_to_batch(plan, replica)
        assert batch.features()[0] == features[0] and batch.features()[2:] == features[2:]
        assert math.isclose(batch.features()[1], features[1], rel_tol=1e-12)
        meta = batch_metadata(batch, BS)
        ids = []
        for slot, q, b in meta.seqs:
            ids.extend(tok(slot, p) for p in range(b, b + q))
        out = self.model.step(ids, meta)
        for j, (slot, _, _) in enumerate(meta.seqs):
            ref = self.model.full([tok(slot, p) for p in range(meta.kv_lens[j])])[-1]
            err = (out[j] - ref).abs().max().item()
            assert err < 1e-4, f"step {self.steps}, seq {slot}: max |diff| {err}"
            self.max_err = max(self.max_err, err)
            self.seqs += 1
        self.steps += 1
        return 0.01


def run(policy, params, kv, specs):
    env = simpy.Environment()
    cluster = Cluster(env, specs, RoundRobin(Section({}, "test")))
    engine = {"max_model_len": 256, "block_size": BS, "num_blocks": kv.num_blocks}
    pol = POLICIES[policy](Section(dict(params), "test", "scheduler"), engine)
    ex = CheckingExecutor(kv.num_blocks)
    rep = Replica(env, 0, pol, kv, ex, coalesce=True)
    cluster.add_replica(rep)
    cluster.start()
    env.run()
    cols = request_table(cluster.requests)
    assert (cols["status"] == "finished").all()
    return ex, rep


def specs(n=8, seed=0):
    import random

    r = random.Random(seed)
    return [RequestSpec(0.005 * i, r.randint(3, 40), r.randint(2, 12)) for i in range(n)]


def test_chunked_prefill_through_paged_cache():
    ex, _ = run(
        "chunked_prefill", {"max_num_batched_tokens": 16, "max_num_seqs": 8},
        PagedTableAllocator(64, BS), specs(),
    )  # fmt: skip
    assert ex.steps > 10 and ex.seqs > 50


def test_continuous_with_preemption_recomputes_into_new_blocks():
    ex, rep = run("continuous", {"max_num_seqs": 8}, PagedTableAllocator(24, BS), specs(10, 1))
    assert rep.num_preemptions > 0  # the small cache forces recompute
    assert ex.seqs > 50


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_request_level_batching_contiguous_cache(policy):
    kv = ContiguousAllocator(128, BS, "prompt_plus_output", 256)
    ex, _ = run(policy, {"batch_size": 4}, kv, specs(8, 2))
    assert ex.seqs > 30


def test_metadata_layout_decodes_first_and_slots():
    b = StepBatch(prefills=[(7, 3, 5)], decodes=[(2, 6)], block_tables={7: [9, 4, 1], 2: [3, 8]})
    m = batch_metadata(b, BS)
    assert m.seqs == [(2, 1, 5), (7, 3, 5)]
    assert m.positions == [5, 5, 6, 7]
    # seq 2 pos 5 -> block 8 slot 1; seq 7 pos 5,6,7 -> block 4 slots 1,2,3
    assert m.slot_mapping == [8 * BS + 1, 4 * BS + 1, 4 * BS + 2, 4 * BS + 3]
    assert m.cu_q == [0, 1, 4] and m.cu_k == [0, 6, 14] and m.logit_rows == [0, 3]
    assert m.tables == [[3, 8], [9, 4]]


def test_metadata_rejects_short_block_table():
    with pytest.raises(ValueError, match="block table"):
        batch_metadata(StepBatch(decodes=[(1, 9)], block_tables={1: [0, 1]}), BS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_executor_runs_a_plan_on_gpu():
    """On a GPU: StepRunner consumes the translated batch; a tiny model keeps it quick."""
    from profiles.real_executor import RealGPUExecutor
    from simulator.models import load_model

    model = load_model("llama-3-8b", "test", "model")
    kv = PagedTableAllocator(512, 16)
    env = simpy.Environment()
    cluster = Cluster(env, specs(6, 3), RoundRobin(Section({}, "test")))
    engine = {"max_model_len": 8192, "block_size": 16, "num_blocks": 512}
    pol = POLICIES["chunked_prefill"](Section({"max_num_batched_tokens": 256}, "t", "s"), engine)
    ex = RealGPUExecutor(model, 1, 512, 16)
    rep = Replica(env, 0, pol, kv, ex)
    cluster.add_replica(rep)
    cluster.start()
    env.run()
    assert len(ex.records) == len(rep.steps)
    assert all(r[-1] >= r[-2] > 0 for r in ex.records)  # wall >= GPU time > 0
