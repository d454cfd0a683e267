"""The batch compositions an engine-backed profile drives vLLM through (pure Python).

vLLM is not a kernel bench: it decides its own batches. So the grid is a list of *scenarios*,
sets of requests submitted together, chosen so that the engine's own scheduler produces the
compositions the latency model needs (see ``profiles/README.md``):

* ``batch``: ``B`` prompts of length ``C`` (or lognormal lengths of mean ``C``, the spread real
  batches have). vLLM prefills them in 8192-token chunks (pure and multi-sequence prefill steps,
  chunks over cached context), while the early ones decode beside later prefills (mixed steps),
  then all ``B`` decode together for ``out`` steps (decode-only steps at batch ``B`` and
  contexts ``C .. C + out``): each request's output is ``out`` plus the steps it decodes while
  the batch fills (``outs``, `covering_outs`);
* ``drain``: ``B`` equal prompts whose outputs end two per decode step (``outs``), so after
  the prefill the decode batch shrinks from ``B`` to 1 and runs at every CUDA-graph size the
  engine pads to: measured, not interpolated between the ``batch`` sizes (vLLM's FP8 GEMMs get
  faster from batch 192 to 256 and 384 to 512 on an H200, profiles/README.md);
* ``inject``: a running decode batch, into which single prompts of length ``P`` are injected one
  at a time (mixed steps: ``B`` decodes + one chunk of ``P``);
* ``long`` (only for models served past ``LONG_FROM`` tokens, e.g. Llama-3.1's 128k): single
  prompts of 16k-128k tokens (8192-token chunks over ever longer cached context, then decode at
  batch 1 there), small decode batches at 16k-64k contexts, and long prompts injected beside a
  running batch (mixed steps whose chunk attends over tens of thousands of cached keys): the
  context terms measured where long-context serving runs, not extrapolated from 8k;
* ``wide`` (only for engines that run more sequences than their largest CUDA graph): decode
  batches of 768 and 1,024 sequences, which run eagerly, then shrink ``WIDE_END_PER_STEP`` a step
  to the largest graph. Serving with a large KV cache reaches
  them (DeepSeek-V2-Lite's 3.4M tokens: 1,018 running decodes at 75-117 ms a step, where a table
  that stopped at 513 extrapolated 15-20 ms; validation/vllm-0.24/README.md);
* ``inject`` with ``rate_per_s``: prompts of lognormal lengths arrive at seeded exponential gaps
  beside a running batch of 8-32 or (near saturation) 128-256 decodes, as they do in serving.
  Each arrival's prefill is launched behind whatever runs then, mostly a 5-6 ms decode step
  that hides little of a 7-47 ms launch: the pairs serving runs most (600-900 per served model
  in the validation replays) and one-at-a-time injection samples least (~30 per run), where the
  tables charged serving's pairs 8-14% short (validation/vllm-0.24/README.md).

Every prompt is random token ids, distinct per request, so prefix caching (on, as ``vllm serve``
has it) never hits. The held-out split is by scenario, so no held-out step has a near-twin (the
next decode step of the same batch) in the training set, and by family (`_split`), so every kind
of scenario has training members. Tables recorded before keep the split they were recorded with
(a run stores each scenario's split).
"""

from __future__ import annotations

import math
import random

# a repeat pass's scenario id is ``<id>~r<k>`` (``REPEAT_SEP``: a ``~`` no base id contains),
# defined beside the table reader that parses it back
from simulator.latency.step_oracle import REPEAT_SEP, scenario_pass

DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
DECODE_CONTEXTS = (128, 1024, 4096)
SPREAD_BATCHES = (8, 32, 128)
SPREAD_CONTEXTS = (512, 2048)
#: (decode batch, context) of the injection scenarios. The large batches cover what serving
#: near saturation runs most (a small prompt chunk beside 100+ decodes): with only B <= 128 the
#: first tables were 8-27% fast there (validation/vllm-0.24/README.md)
INJECT_BASES = (
    (4, 512), (32, 512), (128, 512), (256, 512), (512, 256),
    (4, 2048), (32, 2048), (96, 2048), (192, 1024),
)  # fmt: skip
INJECT_PROMPTS = (8, 64, 256, 512, 1024, 3000, 7000)
#: (decode batch, context) of the arrival scenarios, their prompts' lognormal mean, how many
#: arrive and at what rate (conversation-like prompts at a moderate serving rate). The two
#: large batches (added 2026-11-27, session 26) are near-saturation serving: chunks of a few
#: hundred to 2k prompt tokens launched beside 100+ decodes. The int4 8B table, whose grid had
#: only the small ones, held 19 steps of 129+ decodes beside 513-2,048 prompt tokens and charged
#: them 7-12% short, where its conversation replay at heavy load ran 369 launched prompt steps
#: and the table charged those 4.7% short in sum (validation/vllm-0.24/README.md)
ARRIVAL_BASES = ((8, 1024), (16, 1024), (16, 2048), (32, 1024), (128, 1024), (256, 512))
ARRIVAL_MEAN, ARRIVAL_COUNT, ARRIVAL_RATE_PER_S, ARRIVAL_OUT = 1000, 40, 12.0, 4
#: prompt lengths of the drain scenarios; each runs the largest decode batch that fits the cap
DRAIN_CONTEXTS = (128, 1024)
#: decode steps over which a drain's batch shrinks, per sequence: 0.5 = two end per step (~8
#: steps at each capture size of the 16-wide steps above 32)
DRAIN_STEPS_PER_SEQ = 0.5
#: long-context scenarios are added for models whose max_model_len exceeds this
LONG_FROM = 16384
#: single prompts (each then decodes ``DECODE_OUT`` steps at batch 1)
LONG_PROMPTS = (16384, 32768, 65536, 131072)
#: (decode batch, context) of long-context decode batches
LONG_DECODE = ((8, 16384), (4, 32768), (2, 65536))
#: (decode batch, context) of running batches beside which long prompts are injected
LONG_INJECT = ((16, 2048), (4, 16384))
LONG_INJECT_PROMPTS = (24576, 98304)
#: decode batches above the largest CUDA graph (kept to the engine's max_num_seqs), their
#: contexts, and the tokens a wide scenario may hold (its own cap: a 1,024 x 1,024 batch)
WIDE_BATCHES = (768, 1024)
WIDE_CONTEXTS = (128, 1024)
WIDE_MAX_TOKENS = 1_250_000
#: requests of a wide batch that end a step once it has decoded together (`_wide_outs`)
WIDE_END_PER_STEP = 8
PREFILL_ONLY = (16, 48, 100, 200, 350, 500, 700, 1000, 1500, 2500, 4000, 6000, 8000)
#: decode steps per batch scenario, all its requests together (`covering_outs`)
DECODE_OUT = 24
#: the engine's ``max_num_batched_tokens`` (``vllm serve``'s default) when none is given
TOKEN_BUDGET = 8192
#: a batch scenario's prompt tokens at most (its prefill time is the grid's main cost)
MAX_SCENARIO_TOKENS = 300_000
TEST_EVERY = 3  # every third scenario of each family (by a seeded shuffle) is held out
#: passes over the grid a new profile runs (`repeated`): each step's time is the median of its
#: repeats, as a kernel bench takes the median of repeated timings
REPEATS = 3


def scenarios(
    max_model_len: int,
    kv_tokens: int,
    seed: int = 0,
    max_tokens: int = MAX_SCENARIO_TOKENS,
    max_num_seqs: int = 0,
    max_graph: int = 0,
    token_budget: int = TOKEN_BUDGET,
) -> list[dict]:
    """The profiling scenarios for a model whose engine holds ``kv_tokens`` KV tokens; a
    scenario holds ``max_tokens`` prompt + output tokens at most (a 70B model's prefill is ~9x
    an 8B's, so its grid is capped lower to fit a GPU call). ``max_num_seqs`` and
    ``max_graph`` (the engine's largest CUDA graph): the ``wide`` family when the first
    exceeds the second (0: neither known, no such family). ``token_budget``: the engine's
    ``max_num_batched_tokens``, which sets how many steps a batch takes to fill
    (`covering_outs`)."""
    rng = random.Random(seed)
    fill = _Fill(token_budget, max_model_len)
    cap = min(max_tokens, int(0.8 * kv_tokens))
    out = _batches(max_model_len, kv_tokens, cap, fill, rng)
    for p in PREFILL_ONLY:
        if p + 2 < max_model_len:
            out.append({"id": f"prefill_p{p}", "kind": "batch", "prompts": [p], "out": 2})
    for b, c in INJECT_BASES:
        inj = [p for p in INJECT_PROMPTS if p + c < max_model_len]
        if b * c <= cap:
            out.append(
                {"id": f"inject_b{b}_c{c}", "kind": "inject", "prompts": [c] * b, "inject": inj}
            )
    for b, c in ARRIVAL_BASES:
        if b * c <= cap:
            hi = max_model_len - c - ARRIVAL_OUT - 1
            out.append(
                _arrivals(
                    f"arrive_b{b}_c{c}", b, c, _lognormal(rng, ARRIVAL_COUNT, ARRIVAL_MEAN, 1.0, hi)
                )
            )
    if max_model_len > LONG_FROM:
        out += _long(max_model_len, cap, fill)
    if max_num_seqs > max_graph > 0:
        out += _wide(max_model_len, kv_tokens, max_num_seqs, max_graph, max_tokens, fill)
    _split(out, rng)
    return out


def _batches(max_model_len: int, kv_tokens: int, cap: int, fill: _Fill, rng) -> list[dict]:
    """The ``dec``, ``spread`` and ``drain`` families (module docstring), within ``cap``
    tokens a scenario; ``rng`` draws the spread prompts (first of the grid's draws)."""
    out: list[dict] = []
    for c in DECODE_CONTEXTS:
        for b in DECODE_BATCHES:
            sc = fill.batch(f"dec_b{b}_c{c}", [c] * b)
            if tokens(sc) <= cap and c + DECODE_OUT < max_model_len:
                out.append(sc)
    for c in SPREAD_CONTEXTS:
        for b in SPREAD_BATCHES:
            lens = _lognormal(rng, b, c, 1.0, max_model_len - DECODE_OUT - 1)
            sc = fill.batch(f"spread_b{b}_c{c}", lens)
            if tokens(sc) <= cap:
                out.append(sc)
    longest = max(_drain_outs(DECODE_BATCHES[-1]))  # the largest drain's last request
    for c in DRAIN_CONTEXTS:
        b = min(DECODE_BATCHES[-1], cap // c, int(0.8 * kv_tokens) // (c + longest))
        if b >= 2 and c + longest < max_model_len:
            out.append(fill.batch(f"drain_b{b}_c{c}", [c] * b, _drain_outs(b)))
    return out


def _long(max_model_len: int, cap: int, fill: _Fill) -> list[dict]:
    """The ``long`` family (module docstring); every scenario fits ``max_model_len`` (a prompt
    at the limit is cut to leave room for its outputs) and the token cap."""
    out = []
    # prompts cut to the model's limit once: two cut to the same length would be one scenario
    # id twice (Qwen3's 40,960: 65,536 and 131,072 both became long_p40935, run twice a pass)
    for p in sorted({min(p, max_model_len - DECODE_OUT - 1) for p in LONG_PROMPTS}):
        if p + DECODE_OUT <= cap:
            out.append(fill.batch(f"long_p{p}", [p]))
    for b, c in LONG_DECODE:
        sc = fill.batch(f"long_b{b}_c{c}", [c] * b)
        if tokens(sc) <= cap and c + DECODE_OUT < max_model_len:
            out.append(sc)
    for b, c in LONG_INJECT:
        inj = [p for p in LONG_INJECT_PROMPTS if p + c < max_model_len]
        if inj and b * c + sum(inj) <= cap:
            out.append(
                {"id": f"long_inj_b{b}_c{c}", "kind": "inject", "prompts": [c] * b, "inject": inj}
            )
    return out


def _wide(
    max_model_len: int, kv_tokens: int, seqs: int, graph: int, max_tokens: int, fill: _Fill
) -> list:
    """The ``wide`` family (module docstring): batches above ``graph`` sequences up to
    ``seqs``, within the KV cache and ``WIDE_MAX_TOKENS`` (or the grid's own cap, if larger).
    Once all are in, the batch decodes ``DECODE_OUT`` steps, then ``WIDE_END_PER_STEP`` requests
    end a step down to ``graph``: eager decode is a step function of the batch (DeepSeek-V2-Lite:
    11 ms at 522, 64 at 582), which only the sizes a run visits show (`_wide_outs`)."""
    cap = min(max(WIDE_MAX_TOKENS, max_tokens), int(0.8 * kv_tokens))
    scs = [
        fill.batch(f"wide_b{b}_c{c}", [c] * b, _wide_outs(b, graph))
        for c in WIDE_CONTEXTS
        for b in WIDE_BATCHES
        if graph < b <= seqs and c + DECODE_OUT < max_model_len
    ]
    return [sc for sc in scs if tokens(sc) <= cap]


def _wide_outs(b: int, graph: int) -> list[int]:
    """Output lengths of a wide batch of ``b``: ``DECODE_OUT`` steps together, then
    ``WIDE_END_PER_STEP`` end a step until ``graph`` are left, which end together."""
    return [DECODE_OUT + min(i, b - graph) // WIDE_END_PER_STEP for i in range(b)]


def pass_index(scenario_id: str) -> int:
    """Which pass over the grid a scenario id belongs to (`repeated`: ``<id>~r<r>``; 0 for a
    base id)."""
    return scenario_pass(scenario_id)[1]


def repeated(scs: list[dict], repeats: int) -> list[dict]:
    """The grid run ``repeats`` times over, pass after pass (not scenario after scenario, so
    that the repeats of one scenario are minutes apart and share no transient host state).
    Pass ``r > 0`` names its scenarios ``<id>~r<r>`` with ``repeat_of: <id>`` and the base's
    split: distinct request ids, so distinct prompt tokens, so no repeat hits the prefix cache
    of an earlier pass. Why repeat: a step is timed once per pass, by the engine's output
    stamps, and 1-5% of single intervals carry a host stall or a stamp moved into the next
    interval (a step at 11.7 ms, the next at 3.8, around a 6.9 ms pair; profiles/README.md)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out = list(scs)
    for r in range(1, repeats):
        out += [{**sc, "id": f"{sc['id']}{REPEAT_SEP}{r}", "repeat_of": sc["id"]} for sc in scs]
    return out


def _split(scs: list[dict], rng: random.Random) -> None:
    """Hold out every ``TEST_EVERY``-th scenario of each family (``dec``, ``spread``, ``drain``,
    ``prefill``, ``inject``, ``arrive``, ``long``, ``wide``) in a seeded order, the last of
    each three: every family keeps training scenarios, and one of two or fewer is never held
    out. Why by family: a split over the whole grid held out 4 of the 6 spread scenarios of
    the H200 fp8 table, so nothing in its training pinned the cost of a batch's longest context
    (its decode_max coefficient came out 0) and the held-out spread steps were charged 3-7%
    short."""
    families: dict[str, list[dict]] = {}
    for sc in scs:
        families.setdefault(sc["id"].split("_")[0], []).append(sc)
    for members in families.values():
        rng.shuffle(members)
        for rank, sc in enumerate(members):
            sc["split"] = "test" if rank % TEST_EVERY == TEST_EVERY - 1 else "train"


class _Fill:
    """Output lengths that let a batch scenario reach its batch size (`covering_outs`)."""

    def __init__(self, token_budget: int, max_model_len: int):
        self.budget, self.max_model_len = token_budget, max_model_len

    def outs(self, prompts: list[int], outs: list[int]) -> list[int]:
        """`covering_outs`, each request kept within the model's context."""
        longer = covering_outs(prompts, outs, self.budget)
        return [
            max(o, min(m, self.max_model_len - 1 - p))
            for p, o, m in zip(prompts, outs, longer, strict=True)
        ]

    def batch(self, sid: str, prompts: list[int], base: list[int] | None = None) -> dict:
        """A batch scenario: once all are in, every request decodes ``DECODE_OUT`` steps, or
        its ``base`` output less what it decoded while the batch filled (a drain's, a wide
        batch's). ``out``: the steps all decode together; ``outs`` where they differ."""
        outs = self.outs(prompts, base or [DECODE_OUT] * len(prompts))
        sc = {"id": sid, "kind": "batch", "prompts": prompts, "out": DECODE_OUT}
        if len(set(outs)) > 1:
            sc["outs"] = outs
        return sc


def outputs(sc: dict) -> list[int]:
    """The output length of each request of a batch scenario."""
    return sc.get("outs") or [sc["out"]] * len(sc["prompts"])


def tokens(sc: dict) -> int:
    """Prompt and output tokens of a batch scenario: the KV it holds at its fullest."""
    return sum(sc["prompts"]) + sum(outputs(sc))


def covering_outs(prompts: list[int], outs: list[int], token_budget: int) -> list[int]:
    """``outs`` lengthened so that request ``i`` is still decoding when the batch's last
    prompt has been prefilled: ``outs[i]`` plus the steps between the end of its own prefill
    and the end of the last one.

    Why: a batch submitted at once is prefilled in chunks of the token budget, and its first
    requests decode while the later ones prefill. With every output ``DECODE_OUT`` long, a batch
    whose prompts take more steps than that to prefill never ran at its size: the first tables'
    ``dec_b256_c1024`` peaked at 176 decodes, ``wide_b1024_c1024`` at 179, ``dec_b64_c4096`` at
    46, so decode at large batches over 1k+ contexts was never measured (DeepSeek-V2-Lite's
    eager decode at 1.2k contexts: 105-130 ms a step in serving, 64-80 ms measured at 128).
    Steps are counted at the budget less one token per sequence (the decodes' share of a step
    at most), so the counts are upper bounds: the early requests may decode a few steps past
    the batch's full size before ending, which only adds decode steps near it."""
    rate = max(token_budget - len(prompts), token_budget // 2)
    last = -(-sum(prompts) // rate)
    cum, out = 0, []
    for p, o in zip(prompts, outs, strict=True):
        cum += p
        out.append(o + last - -(-cum // rate))
    return out


def _drain_outs(b: int) -> list[int]:
    """Output lengths of a drain of ``b`` requests: all decode ``DECODE_OUT`` steps together,
    then they end ``1 / DRAIN_STEPS_PER_SEQ`` per step, the batch shrinking to 1."""
    return [DECODE_OUT + int(i * DRAIN_STEPS_PER_SEQ) for i in range(b)]


def _arrivals(sid: str, b: int, c: int, prompts: list[int]) -> dict:
    return {
        "id": sid, "kind": "inject", "prompts": [c] * b, "inject": prompts,
        "rate_per_s": ARRIVAL_RATE_PER_S, "inject_out": ARRIVAL_OUT,
    }  # fmt: skip


def _lognormal(rng: random.Random, n: int, mean: float, sigma: float, hi: int) -> list[int]:
    """``n`` lengths, lognormal with the given mean and sigma, clipped to [16, hi]."""
    mu = math.log(mean) - sigma * sigma / 2
    return [max(16, min(hi, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def prompt_ids(seed: int, rid: str, n: int, vocab: int) -> list[int]:
    """Random token ids for request ``rid``: distinct per request, reproducible per seed."""
    r = random.Random(f"{seed}/{rid}")
    return [r.randrange(100, vocab - 100) for _ in range(n)]
