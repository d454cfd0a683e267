"""Scheduling steps shared by several policies (each small, each a vLLM idiom)."""

from __future__ import annotations

from simulator.request import Request


def read_watermark(sec, engine: dict, default: float) -> tuple[float, int]:
    """``scheduler.watermark`` (the fraction of KV blocks admission keeps free, as vLLM v0's
    block manager does) and the block count it reserves on this engine."""
    watermark = sec.num("watermark", default, min=0, max=0.5)
    return watermark, int(watermark * engine["num_blocks"])


def batching_params(policy) -> dict:
    """The resolved parameters of a policy that batches up to ``max_num_seqs`` sequences and
    ``max_num_batched_tokens`` tokens a step, keeps a ``watermark`` and preempts
    (``policy.preemption``), as written to config.yaml."""
    return {
        "max_num_seqs": policy.max_num_seqs,
        "max_num_batched_tokens": policy.max_num_batched_tokens,
        "watermark": policy.watermark,
        **policy.preemption.params(),
    }


def grow_decodes(replica, preempt=None) -> bool:
    """Give every decode-set member the KV it needs for the next decode step.

    When the allocator says no, preempt the newest running request (vLLM's policy: the last
    admitted loses its cache and goes back to the front of ``waiting``), until the allocation
    succeeds or the request itself was the victim. ``preempt(replica, victim)`` defaults to
    recompute. Returns True if any decode remains to run.
    """
    d, kv = replica.decoding, replica.kv
    group = replica._extend_group  # the allocator's `extend_group`, None when it has none
    # all due members at once when the KV has room for all (the usual case); else one by one
    due = d.grow_due_grouped(group, kv.block_size) if group is not None else d.pop_due_growth()
    if not due:
        return bool(d.members)
    preempt = preempt or _recompute
    for req in due:
        if req._dset is None:  # preempted as a victim earlier in this loop
            continue
        while (cap := kv.extend(req)) < 0:
            victim = newest_running(replica)
            preempt(replica, victim)
            if victim is req:
                break
        else:
            d.set_capacity(req, cap)
    return bool(d.members)


def _recompute(replica, victim) -> None:
    replica.preempt(victim)


def newest_running(replica) -> Request:
    return next(reversed(replica.running.values()))


def prefix_hit(replica, req: Request) -> int:
    """Prompt tokens of ``req`` the prefix cache holds, for a request starting from scratch.

    0 without prefix caching, or when the request already has progress or KV (swapped out, or
    handed over by P/D disaggregation). ``kv.allocate`` attaches exactly these blocks; the
    policy then calls `start_from_cache`.
    """
    lookup = getattr(replica.kv, "lookup", None)
    if lookup is None or req.num_computed or req.block_table:
        return 0
    return lookup(req)


def start_from_cache(req: Request, hit: int) -> None:
    """A request admitted with a prefix-cache hit starts with its cached tokens computed.

    This is the one place a policy sets progress: no compute happens, the KV was already there.
    """
    if hit:
        req._num_computed = hit
        if req.num_preemptions == 0:
            req.num_cached_tokens = hit


def too_long(replica, req: Request, max_tokens: int, reserve_blocks: int = 0) -> str | None:
    """Reason to reject a request that this engine can never run, else None.

    ``reserve_blocks`` are blocks the policy keeps free (watermark): a request needing more than
    the rest could never be admitted, and would block the queue forever.
    """
    total = req.num_prompt_tokens + req.max_output_tokens
    if total > replica.policy.engine["max_model_len"]:
        return f"prompt+output {total} > max_model_len {replica.policy.engine['max_model_len']}"
    if req.num_prompt_tokens > max_tokens:
        return f"prompt {req.num_prompt_tokens} > max_num_batched_tokens {max_tokens}"
    need = (
        replica.kv.blocks_for_request(req)
        if hasattr(replica.kv, "blocks_for_request")
        else (-(-total // replica.kv.block_size))
    )
    if need + reserve_blocks > replica.kv.num_blocks:
        return f"needs {need} KV blocks > {replica.kv.num_blocks - reserve_blocks} usable"
    return None


def admit_whole_prompts(policy, replica, now: float, preemption=None) -> list:
    """Admit waiting requests whole, FCFS, as vLLM v0's prefill step does.

    Stops at the first request that does not fit: ``policy.max_num_seqs`` running,
    ``policy.max_num_batched_tokens`` tokens this step, or KV for all its tokens while keeping
    ``policy._watermark_blocks`` free. A request the engine can never hold is rejected with its
    reason. Prefix-cache hits start a request from its cached tokens; a swapped-out request is
    swapped back in through ``preemption``. Returns the step's ``(request, tokens)`` chunks.
    """
    waiting, kv, running = replica.waiting, replica.kv, replica.running
    budget, max_seqs = policy.max_num_batched_tokens, policy.max_num_seqs
    reserve = policy._watermark_blocks
    caching = getattr(kv, "lookup", None) is not None
    chunks = []
    while waiting and len(running) < max_seqs:
        req = waiting[0]
        if req.num_preemptions == 0 and req.first_scheduled_s is None:
            reason = too_long(replica, req, policy.max_num_batched_tokens, reserve)
            if reason:
                waiting.popleft()
                replica.reject(req, reason, now)
                continue
        # only a preempted request can be swapped out (`Preemption.preempt` counts it)
        swapped = preemption is not None and req.num_preemptions and preemption.is_swapped(req)
        hit = prefix_hit(replica, req) if caching else 0
        # a waiting request is outside the decode set: its progress is in its own fields
        tokens = req.num_prompt_tokens + req._num_output
        n = tokens - req._num_computed - hit
        if n > budget or not kv.can_allocate(req, tokens, reserve):
            break
        waiting.popleft()
        kv.allocate(req, tokens)
        if hit:
            start_from_cache(req, hit)
        if swapped:
            preemption.swap_in(req)
        replica.admit(req, now)
        chunks.append((req, n))
        budget -= n
    return chunks
