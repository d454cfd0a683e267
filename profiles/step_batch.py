"""Translate a simulator `StepPlan` into the batch a real engine step runs (pure Python, no torch).

Why a separate module: the translation is the part of real-GPU validation that can be wrong
silently (a step that runs the right *amount* of work over the wrong cache positions still takes
the right time). Keeping it pure lets tests check it on CPU against a reference forward
(``profiles/reference_forward.py``) with no GPU.

Two stages:

* `plan_to_batch(plan, replica)` -> `StepBatch`: which sequences run, with how many new tokens
  over how many cached ones. Same classification as ``Replica._features``, so the batch's
  features equal the features the latency model is asked about:
  - a chunk ``(req, n)`` with ``n == 1`` over a non-empty cache is a decode of context
    ``num_computed + 1``;
  - a speculative verify chunk (``plan.verify``, one pending token) is a prefill chunk of
    ``1 + verify`` tokens over ``num_computed`` cached ones;
  - every other chunk is a prefill chunk of ``n`` tokens over ``num_computed`` cached ones;
  - ``plan.decode`` adds every member of the replica's decode set as a decode of context
    ``num_computed + 1`` (its one pending token attends to the cache and itself).
  Sequence slots are request ids; block tables are the simulator's own ``req.block_table``: the
  simulated allocator's block ids ARE the real cache's block ids (a run gives the real-GPU
  executor an allocator that keeps ids, `RealGPUExecutor.reads_block_ids`; the engine's
  counting `PagedAllocator` keeps none, and its empty tables fail the check below).
* `batch_metadata(batch, block_size)` -> `StepMetadata`: the flat tensors-to-be of one step in
  the layout `profiles.torch_model.StepRunner` uses (decodes first, then prefill chunks):
  positions, slot mapping (``block_table[p // bs] * bs + p % bs``), query/KV lengths, their
  cumulative offsets, padded block-table rows and the row of each sequence's last token.

Invariants (checked, `ValueError` otherwise): every sequence's block table covers its KV length
(the simulator allocated before planning); no two sequences of a step write the same slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepBatch:
    """One engine step: ``prefills`` are ``(slot, chunk_len, context_before)``, ``decodes`` are
    ``(slot, context_len)`` (context_len counts the new token), ``block_tables`` map slot ->
    block ids (references to the simulator's lists; do not mutate)."""

    prefills: list[tuple[int, int, int]] = field(default_factory=list)
    decodes: list[tuple[int, int]] = field(default_factory=list)
    block_tables: dict[int, list[int]] = field(default_factory=dict)

    def features(self) -> tuple[int, float, int, int, int, int]:
        """(prefill_tokens, prefill_attn, prefill_seqs, decode_seqs, decode_ctx, decode_max), as
        the latency model sees a step (``Replica._features``)."""
        pt = sum(c for _, c, _ in self.prefills)
        pa = sum(c * (b + (c + 1) / 2) for _, c, b in self.prefills)
        ctx = [n for _, n in self.decodes]
        return (pt, pa, len(self.prefills), len(ctx), sum(ctx), max(ctx, default=0))


@dataclass
class StepMetadata:
    """Flat per-step inputs; sequence order is decodes then prefills (``seqs``)."""

    seqs: list[tuple[int, int, int]]  # (slot, query_len, context_before)
    positions: list[int]  # per token: its position in its sequence
    slot_mapping: list[int]  # per token: flat KV-cache index it writes
    query_lens: list[int]
    kv_lens: list[int]  # context_before + query_len
    cu_q: list[int]  # len(seqs) + 1 cumulative query offsets
    cu_k: list[int]  # len(seqs) + 1 cumulative KV offsets
    tables: list[list[int]]  # per sequence: the blocks covering kv_len, padded with 0
    logit_rows: list[int]  # per sequence: token row of its last token (sampled)
    num_decodes: int


def plan_to_batch(plan, replica) -> StepBatch:
    """The real batch of one plan on one replica, read before the replica commits the plan."""
    batch = StepBatch()
    v = plan.verify
    tables = batch.block_tables
    for req, n in plan.chunks:
        c = req.num_computed
        tables[req.id] = req.block_table
        if v and c > 0 and req.num_tokens - c == 1:
            batch.prefills.append((req.id, 1 + v, c))
        elif n == 1 and c > 0:
            batch.decodes.append((req.id, c + 1))
        else:
            batch.prefills.append((req.id, n, c))
    if plan.decode:
        for req in replica.decoding:
            tables[req.id] = req.block_table
            batch.decodes.append((req.id, req.num_computed + 1))
    return batch


def batch_metadata(batch: StepBatch, block_size: int) -> StepMetadata:
    """Flatten a batch for a paged-KV forward; see the module docstring for the invariants."""
    bs = block_size
    seqs = [(s, 1, n - 1) for s, n in batch.decodes] + list(batch.prefills)
    positions: list[int] = []
    slots: list[int] = []
    qlens, klens, tables, rows = [], [], [], []
    cu_q, cu_k = [0], [0]
    for slot, q, b in seqs:
        n = q + b
        nb = -(-n // bs)
        table = batch.block_tables.get(slot, [])
        if len(table) < nb:
            raise ValueError(
                f"sequence {slot}: block table has {len(table)} blocks, KV length {n} needs {nb}"
            )
        blocks = list(table[:nb])
        positions.extend(range(b, n))
        slots.extend(blocks[p // bs] * bs + p % bs for p in range(b, n))
        qlens.append(q)
        klens.append(n)
        tables.append(blocks)
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + n)
        rows.append(cu_q[-1] - 1)
    if len(set(slots)) != len(slots):
        raise ValueError("two tokens of one step write the same KV slot")
    width = max((len(t) for t in tables), default=0)
    tables = [t + [0] * (width - len(t)) for t in tables]
    return StepMetadata(
        seqs, positions, slots, qlens, klens, cu_q, cu_k, tables, rows, len(batch.decodes)
    )
