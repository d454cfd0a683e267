"""Op-level and whole-step measurements that fill a table directory (torch imported lazily).

Each family is a list of grid points ordered coarse-first (powers of two before the points in
between), so that a budget cut still leaves a usable grid. Points already present in the CSVs
are skipped (resume after an interruption). Every measured row is appended and flushed at once.
"""

from __future__ import annotations

import math
import random
import sys
import time

from profiles.timing import rotations, time_calls
from profiles.torch_gemm import linear, make_weight
from profiles.torch_model import torch_dtype_name
from simulator.latency import table as tbl
from simulator.latency.table import uneven_lengths
from simulator.precision import ACT_DTYPE, DTYPE_BYTES
from simulator.served import ShardedModel

#: bytes per activation element (sizes the buffers rotated between timed calls)
ACT = DTYPE_BYTES[ACT_DTYPE]

__all__ = ["uneven_lengths"]  # re-exported: the profiler's callers import it from here


def token_grid(max_tokens: int = 16384) -> list[int]:
    """1..max: powers of two first, then 1.5x points, then batch-like multiples (coarse-first)."""
    pow2 = [2**i for i in range(0, 15) if 2**i <= max_tokens]
    mid = [3 * 2**i for i in range(0, 14) if 3 * 2**i <= max_tokens and 3 * 2**i not in pow2]
    extra = [t for t in (24, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240) if t <= max_tokens]
    return list(dict.fromkeys(pow2 + mid + extra))


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.n, self.t0 = label, total, 0, time.time()

    def step(self, note: str = "") -> None:
        self.n += 1
        frac = self.n / max(1, self.total)
        bar = "#" * int(24 * frac)
        sys.stderr.write(
            f"\r{self.label:<13} [{bar:<24}] {self.n}/{self.total} "
            f"{time.time() - self.t0:5.1f}s {note[:40]:<40}"
        )
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


def torch_dtype(sh: ShardedModel):
    """The torch dtype the ops of ``sh`` run in (see `profiles.torch_model.torch_dtype_name`)."""
    import torch

    return getattr(torch, torch_dtype_name(sh))


class Budget:
    def __init__(self, seconds: float):
        self.t0 = time.time()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)


# ---- GEMMs ---------------------------------------------------------------------------------


def profile_gemm(out: str, sh: ShardedModel, deadline: float, grid: list[int]) -> int:
    import torch

    done = tbl.done_keys(out, "gemm.csv", ("op", "tokens"))
    todo = [(op, t) for t in grid for op in sh.gemm_shapes() if (op, t) not in done]
    if not todo:
        return 0
    bar = Progress("gemm", len(todo))
    weights: dict[str, list] = {}
    dt = torch_dtype(sh)
    for op, (n, k) in sh.gemm_shapes().items():
        r = rotations(sh.op(op).weight_bytes, cap=8)
        wd = sh.op(op).weight_dtype
        weights[op] = [
            make_weight(torch.randn(n, k, device="cuda", dtype=dt), wd) for _ in range(r)
        ]
    count = 0
    for op, t in todo:
        if time.time() > deadline:
            break
        n, k = sh.gemm_shapes()[op]
        ws = weights[op]
        xs = [torch.randn(t, k, device="cuda", dtype=dt) for _ in range(len(ws))]
        # `torch_gemm.linear` as the model calls it (bf16: cuBLAS F.linear; fp8: activation
        # quantization + torch._scaled_mm), so op tables and whole steps run the same kernels
        res = time_calls([lambda x=x, w=w: linear(x, w) for x, w in zip(xs, ws, strict=True)])
        tbl.append_row(out, "gemm.csv", {"op": op, "tokens": t, "n": n, "k": k, **res})
        count += 1
        bar.step(f"{op} T={t} {res['median_us']:.1f}us")
        del xs
    bar.close()
    del weights
    torch.cuda.empty_cache()
    return count


# ---- elementwise ops --------------------------------------------------------------------------


def profile_elementwise(out: str, sh: ShardedModel, deadline: float, grid: list[int]) -> int:
    import torch
    import torch.nn.functional as F

    ops = ("rmsnorm", "rotary", "silu_mul", "embed", "sampling")
    done = tbl.done_keys(out, "elementwise.csv", ("op", "tokens"))
    todo = [(op, t) for t in grid for op in ops if (op, t) not in done]
    if not todo:
        return 0
    bar = Progress("elementwise", len(todo))
    dt = torch_dtype(sh)
    w = torch.randn(sh.hidden, device="cuda", dtype=dt)
    emb = torch.randn(sh.vocab, sh.hidden, device="cuda", dtype=dt)
    half = sh.head_dim // 2
    count = 0
    for op, t in todo:
        if time.time() > deadline:
            break
        if op == "sampling" and t > 1024:
            continue  # rows are sequences, not tokens: at most max_seqs
        if op == "rmsnorm":
            nbytes = t * sh.hidden * 2 * ACT
            r = rotations(nbytes)
            xs = [torch.randn(t, sh.hidden, device="cuda", dtype=dt) for _ in range(r)]
            calls = [lambda x=x: F.rms_norm(x, (sh.hidden,), w, 1e-5) for x in xs]
        elif op == "rotary":
            nbytes = t * (sh.heads + sh.kv_heads) * sh.head_dim * 2 * ACT
            r = rotations(nbytes)
            qs = [torch.randn(t, sh.heads, sh.head_dim, device="cuda", dtype=dt) for _ in range(r)]
            ks = [
                torch.randn(t, sh.kv_heads, sh.head_dim, device="cuda", dtype=dt) for _ in range(r)
            ]
            cos = torch.randn(t, 1, half, device="cuda", dtype=dt)
            sin = torch.randn(t, 1, half, device="cuda", dtype=dt)

            def rot(x, cos=cos, sin=sin):
                x1, x2 = x[..., :half], x[..., half:]
                return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

            calls = [lambda q=q, k=k: (rot(q), rot(k)) for q, k in zip(qs, ks, strict=True)]
        elif op == "silu_mul":
            nbytes = t * sh.inter * 3 * ACT
            r = rotations(nbytes)
            xs = [torch.randn(t, 2 * sh.inter, device="cuda", dtype=dt) for _ in range(r)]
            calls = [lambda x=x, i=sh.inter: F.silu(x[:, :i]) * x[:, i:] for x in xs]
        elif op == "embed":
            ids = [torch.randint(0, sh.vocab, (t,), device="cuda") for _ in range(8)]
            calls = [lambda d=d: emb[d] for d in ids]
        else:  # sampling: softmax + argmax over the vocabulary shard, fp32 as engines do
            nbytes = t * sh.vocab * ACT
            r = rotations(nbytes)
            xs = [torch.randn(t, sh.vocab, device="cuda", dtype=dt) for _ in range(r)]
            calls = [lambda x=x: torch.argmax(torch.softmax(x.float(), -1), -1) for x in xs]
        res = time_calls(calls)
        tbl.append_row(out, "elementwise.csv", {"op": op, "tokens": t, **res})
        count += 1
        bar.step(f"{op} T={t} {res['median_us']:.1f}us")
        del calls
    bar.close()
    torch.cuda.empty_cache()
    return count


# ---- attention -----------------------------------------------------------------------------


class AttnBench:
    """Random Q and a random paged (or contiguous) KV pool for attention benchmarks."""

    def __init__(self, sh: ShardedModel, pool_tokens: int, block_size: int = 16):
        import torch

        from profiles.torch_model import make_attn, varlen_features

        self.torch = torch
        self.sh = sh
        self.feat = varlen_features()
        self.attn = make_attn(self.feat)
        self.paged = self.feat["paged"]
        self.bs = block_size
        nb = pool_tokens // block_size
        self.nb = nb
        kvh, d = sh.kv_heads, sh.head_dim
        shape = (nb, block_size, kvh, d) if self.paged else (nb * block_size, kvh, d)
        self.dtype = torch_dtype(sh)
        self.k = torch.randn(shape, device="cuda", dtype=self.dtype)
        self.v = torch.randn(shape, device="cuda", dtype=self.dtype)
        self.perm = torch.randperm(nb, device="cuda").to(torch.int32)
        self.cursor = 0

    def call(self, qlens: list[int], klens: list[int], causal: bool):
        """A zero-arg callable running one varlen call over fresh KV locations."""
        torch = self.torch
        sh = self.sh
        q = torch.randn(sum(qlens), sh.heads, sh.head_dim, device="cuda", dtype=self.dtype)
        cu_q = torch.tensor([0] + _cumsum(qlens), dtype=torch.int32, device="cuda")
        if self.paged:
            cu_k = torch.tensor([0] + _cumsum(klens), dtype=torch.int32, device="cuda")
            pages = [-(-n // self.bs) for n in klens]
            total = sum(pages)
            if total > self.nb:
                raise ValueError("pool too small")
            if self.cursor + total > self.nb:
                self.cursor = 0
            ids = self.perm[self.cursor : self.cursor + total]
            self.cursor += total
            width = max(pages)
            table = torch.zeros(len(klens), width, dtype=torch.int32, device="cuda")
            off = 0
            for i, p in enumerate(pages):
                table[i, :p] = ids[off : off + p]
                off += p
            used = torch.tensor(klens, dtype=torch.int32, device="cuda")
            mq, mk = max(qlens), _max_k(qlens, klens)
            return lambda: self.attn(
                q, self.k, self.v, cu_q, cu_k, mq, mk, causal, seqused_k=used, block_table=table
            )
        total = sum(klens)
        cap = self.k.shape[0]
        if total > cap:
            raise ValueError("pool too small")
        if self.cursor + total > cap:
            self.cursor = 0
        start = self.cursor
        self.cursor += total
        cu_k = torch.tensor(
            [start] + [start + c for c in _cumsum(klens)], dtype=torch.int32, device="cuda"
        )
        mq, mk = max(qlens), _max_k(qlens, klens)
        return lambda: self.attn(q, self.k, self.v, cu_q, cu_k, mq, mk, causal)


def _max_k(qlens: list[int], klens: list[int]) -> int:
    """max_k as the step runner passes it: decode calls round it up to a power of two."""
    from profiles.torch_model import max_k_bucket

    if max(qlens) == 1:
        return max_k_bucket(max(klens))
    return max(klens)


def _cumsum(xs):
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def decode_grid(max_batch: int = 512) -> list[tuple[int, int, int, int]]:
    """(batch, total_ctx, uneven, causal): coarse-first; uneven contexts for batch >= 2."""
    bs = [b for b in (1, 4, 16, 64, 256, 2, 8, 32, 128, 512) if b <= max_batch]
    # 1.5x batch points: the longest context of a batch (which sets the kernel time, see
    # uneven_lengths) moves with batch size, so batch needs a finer grid than powers of two
    bs_mid = [b for b in (3, 6, 12, 24, 48, 96, 192, 384) if b <= max_batch]
    ks_coarse = [512, 2048, 8192, 32768, 131072, 524288]
    ks_fine = [1024, 4096, 16384, 65536, 262144]
    # more batch points where the kernel's waves turn over (batch x kv heads crossing multiples
    # of the SM count: the held-out steps between 64 and 96 or 21 padded to 32 were 14-19% off)
    # and totals past 512k for large batches (steps of 83-160 sequences at 6-8k mean context
    # lay beyond the grid and were extrapolated)
    bs_extra = [b for b in (20, 40, 56, 80, 112, 160) if b <= max_batch]
    ks_big = [1048576, 2097152]
    pts = []
    for bl, ks in (
        (bs, ks_coarse),
        (bs, ks_fine),
        (bs_mid, ks_coarse + ks_fine),
        (bs_extra, ks_coarse + ks_fine),
        ([b for b in bs + bs_mid + bs_extra if b >= 64], ks_big),
    ):
        for b in bl:
            for k in ks:
                if k >= b:
                    pts.append((b, k, 1 if b > 1 else 0, 0))
    # equal contexts (uneven=0) for batch >= 2: with the lognormal rows they bracket the spread
    # of a real batch, which the model places by its longest context (validation/ found decode
    # steps of nearly equal contexts over-predicted by up to 50% from the lognormal rows alone)
    for b in (b for b in bs + bs_mid + bs_extra if b >= 2):
        pts += [(b, k, 0, 0) for k in ks_coarse + ks_fine if k >= b and k // b <= 65536]
    # the causal path, once, for the record (DESIGN.md: much slower on H100 for query length 1)
    pts.extend([(32, 32 * 2048, 1, 1), (128, 128 * 2048, 1, 1)])
    return list(dict.fromkeys(pts))  # without repeats, in first-seen (coarse-first) order


def _bench_points(out, name, keys, todo, deadline, bench, shapes, cap, max_s=None) -> int:
    """Time each point of ``todo`` (tuples of ``keys``) with the attention bench and append
    its row to ``out/name``. ``shapes(point) -> (qlens, klens, causal, bytes)``; ``bytes``
    (KV and query read) sizes the rotations over fresh memory (at most ``cap``)."""
    if not todo:
        return 0
    bar = Progress(name.removesuffix(".csv"), len(todo))
    count = 0
    for point in todo:
        if time.time() > deadline:
            break
        qlens, klens, causal, nbytes = shapes(point)
        r = rotations(nbytes, cap=cap)
        r = max(1, min(r, bench.nb * bench.bs // max(1, sum(klens) + len(klens) * bench.bs)))
        label = " ".join(f"{k}={v}" for k, v in zip(keys, point, strict=True))
        try:
            calls = [bench.call(qlens, klens, causal) for _ in range(r)]
            res = time_calls(calls) if max_s is None else time_calls(calls, max_s=max_s)
        except (ValueError, RuntimeError) as e:
            bar.step(f"skip {label}: {str(e)[:30]}")
            continue
        tbl.append_row(out, name, {**dict(zip(keys, point, strict=True)), **res})
        count += 1
        bar.step(f"{label} {res['median_us']:.1f}us")
    bar.close()
    return count


def profile_attn_decode(out: str, sh: ShardedModel, deadline: float, bench: AttnBench) -> int:
    """Decode attention over (batch, total context)."""
    kv_tok = sh.op("attention").kv_bytes_per_key
    keys = ("batch", "total_ctx", "uneven", "causal")
    done = tbl.done_keys(out, "attn_decode.csv", keys)

    def plain(p):
        b, k, uneven, causal = p
        klens = uneven_lengths(k, b) if uneven else [k // b] * b
        return [1] * b, klens, bool(causal), k * kv_tok

    todo = [p for p in decode_grid() if p not in done]
    return _bench_points(out, "attn_decode.csv", keys, todo, deadline, bench, plain, cap=8)


#: mean contexts of the padded-decode grid (coarse first), and its largest total context
PADDED_MEANS = (1024, 4096, 256, 16384, 2048, 512, 8192, 128, 32768)
PADDED_MAX_TOTAL = 2**21


def padded_batches(max_batch: int = 512) -> list[tuple[int, int]]:
    """(batch, padded_to): every batch a decode CUDA graph pads, densely up to 64 sequences,
    then the first batch past each capture size and steps of 1/32 of it.

    Dense because the padded call is far from linear in batch (70B TP4 at ~255k keys: 515 us
    at 33 real sequences, 287 at 36, 270 at 42; profiles/README.md): which sequences share a
    wave of CTAs with the long ones moves with every sequence added.
    """
    from simulator.latency.table import CAPTURE_SIZES

    out = []
    for lo, t in zip(CAPTURE_SIZES, CAPTURE_SIZES[1:], strict=False):
        if t > max_batch:
            break
        step = 1 if t <= 64 else t // 32
        bs = [lo + 1] + list(range(lo + step, t, step))
        out += [(b, t) for b in dict.fromkeys(bs) if lo < b < t]
    return out


def padded_decode_grid(max_batch: int = 512) -> list[tuple[int, int, int, int]]:
    """(batch, padded_to, total_ctx, uneven): each padded batch at the `PADDED_MEANS` mean
    contexts, at both spreads (lognormal and equal contexts: the padding penalty depends on
    it, up to 4x at the lognormal spread and none at near-equal contexts), coarse-first."""
    pts = []
    for m in PADDED_MEANS:
        for b, t in padded_batches(max_batch):
            if b * m <= PADDED_MAX_TOTAL:
                pts += [(b, t, b * m, 1), (b, t, b * m, 0)]
    return pts


def profile_attn_decode_padded(
    out: str, sh: ShardedModel, deadline: float, bench: AttnBench
) -> int:
    """Decode attention as a padded CUDA graph runs it: b real sequences and t - b one-token
    dummies (the runner gives each dummy its own KV block; here they read fresh locations)."""
    kv_tok = sh.op("attention").kv_bytes_per_key
    keys = ("batch", "padded_to", "total_ctx", "uneven")
    done = tbl.done_keys(out, "attn_decode_padded.csv", keys)

    def padded(p):
        b, t, k, uneven = p
        klens = uneven_lengths(k, b, tbl.UNEVEN_SIGMA if uneven else 0.0)
        return [1] * t, klens + [1] * (t - b), False, (k + t - b) * kv_tok

    todo = [p for p in padded_decode_grid() if p not in done]
    name = "attn_decode_padded.csv"
    return _bench_points(out, name, keys, todo, deadline, bench, padded, cap=8)


def prefill_grid(max_tokens: int = 16384) -> list[tuple[int, int, int]]:
    """(seqs, chunk, context_before), coarse-first."""
    chunks_c = [16, 64, 256, 1024, 4096, 16384]
    chunks_f = [32, 128, 512, 2048, 8192]
    ctx_c = [0, 1024, 8192, 32768]
    ctx_f = [256, 4096, 16384]
    # 1.5x chunks: FlashAttention's time steps with the number of 128-row query tiles per wave
    # over the SMs, so points between the powers of two check the wave-aware interpolation
    chunks_m = [384, 768, 1536, 3072, 6144]
    pts = []
    for chunks, ctxs in (
        (chunks_c, ctx_c),
        (chunks_f, ctx_c),
        (chunks_c + chunks_f, ctx_f),
        (chunks_m, ctx_c + ctx_f),
    ):
        for s in (1, 4, 16, 2, 8):  # 2 and 8 last: added in session 3, resumed onto old tables
            for c in chunks:
                for b in ctxs:
                    if s * c <= max_tokens and s * (b + c) <= 262144:
                        pts.append((s, c, b))
    return list(dict.fromkeys(pts))  # without repeats, in first-seen (coarse-first) order


def profile_attn_prefill(out: str, sh: ShardedModel, deadline: float, bench: AttnBench) -> int:
    keys = ("seqs", "chunk", "context_before")
    done = tbl.done_keys(out, "attn_prefill.csv", keys)
    kv_tok = sh.op("attention").kv_bytes_per_key

    def shapes(p):
        s, c, b = p
        return (
            [c] * s,
            [b + c] * s,
            True,
            s * (b + c) * kv_tok + s * c * sh.heads * sh.head_dim * ACT,
        )

    todo = [p for p in prefill_grid() if p not in done]
    return _bench_points(
        out, "attn_prefill.csv", keys, todo, deadline, bench, shapes, cap=4, max_s=0.3
    )


# ---- whole steps ---------------------------------------------------------------------------


# hand-picked mixed compositions: (chunk, ctx_before, n_prefill_seqs, decode_batch, decode_ctx)
MIXED_GRID = (
    (128, 0, 1, 32, 1024),
    (512, 0, 1, 0, 0),
    (512, 0, 1, 64, 2048),
    (512, 4096, 1, 16, 512),
    (1024, 0, 1, 128, 1024),
    (2048, 0, 1, 0, 0),
    (2048, 0, 1, 32, 4096),
    (2048, 6144, 1, 64, 1024),
    (4096, 0, 1, 0, 0),
    (4096, 12288, 1, 8, 2048),
    (8192, 0, 1, 0, 0),
    (8192, 8192, 1, 0, 0),
    (16, 8000, 1, 96, 1024),
    (64, 4096, 1, 128, 512),
    (256, 2048, 4, 64, 1024),
    (512, 0, 8, 0, 0),
    (1024, 1024, 4, 32, 2048),
    (200, 0, 16, 16, 256),
    (3000, 0, 1, 200, 800),
    (6000, 2000, 2, 20, 3000),
    (1500, 500, 1, 250, 1500),
    (16384, 0, 1, 0, 0),
    (700, 30000, 1, 4, 8000),
    (32, 0, 64, 128, 2048),
    (64, 0, 1, 8, 512),
    (256, 0, 1, 0, 0),
    (32, 1024, 2, 64, 256),
    (96, 2000, 1, 16, 4000),
    (400, 0, 1, 48, 3000),
    # small eager steps, where Python launch overhead may exceed GPU time
    (1, 0, 1, 0, 0),
    (8, 0, 1, 4, 1000),
    (24, 512, 1, 24, 2000),
    (48, 0, 2, 2, 6000),
    (128, 4096, 1, 0, 0),
    (16, 0, 1, 200, 1000),
)
RANDOM_DECODE, RANDOM_MIXED = 16, 40


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_compositions(rng: random.Random, n_decode: int, n_mixed: int) -> list[tuple]:
    """Compositions off every grid: (kind, (s, c, b) or None, (decode_batch, decode_ctx)).

    Drawn log-uniformly over the ranges a serving engine meets (batch 1-384, context 128-16k,
    chunks 1-8k, cached context 0-32k), so the held-out error also covers points between the
    op tables' grid points, not only hand-picked shapes.
    """
    out = []
    for _ in range(n_decode):
        out.append(("decode", None, (_log_uniform(rng, 1, 384), _log_uniform(rng, 128, 16384))))
    for _ in range(n_mixed):
        s = rng.choice((1, 1, 1, 1, 1, 2, 3, 4, 8))
        c = _log_uniform(rng, 1, 8192 // s)
        b = 0 if rng.random() < 0.4 else _log_uniform(rng, 64, 32768)
        db = 0 if rng.random() < 0.25 else _log_uniform(rng, 1, 256)
        dctx = _log_uniform(rng, 128, 8192) if db else 0
        out.append(("mixed", (s, c, b), (db, dctx)))
    return out


#: context spreads (lognormal sigma) of the decode batches of the `spread_compositions`: equal
#: contexts, and a spread like real serving batches' (longest ~1.3-1.8x the mean; the op
#: tables' lognormal rows use `tbl.UNEVEN_SIGMA`, longest up to ~5x)
STEP_SIGMAS = (0.0, 0.3)


def spread_compositions(rng: random.Random) -> list[tuple]:
    """Compositions whose decodes hold near-equal contexts, so that the held-out steps also
    score the model's interpolation in the longest context (`decode_max`) between the
    equal-context and lognormal decode tables, and its padded-graph decode lookup at the
    spreads real runs have: (kind, prefill or None, (batch, mean ctx), sigma)."""
    out = []
    for i, (b, ctx) in enumerate((b, c) for b in (4, 24, 42, 96, 160, 256) for c in (1024, 4096)):
        out.append(("decode", None, (b, ctx), STEP_SIGMAS[i % 2]))
    for i in range(16):
        b, ctx = _log_uniform(rng, 2, 384), _log_uniform(rng, 128, 16384)
        out.append(("decode", None, (b, ctx), STEP_SIGMAS[i % 2]))
    for i in range(10):
        s = rng.choice((1, 1, 1, 2, 4))
        c = _log_uniform(rng, 1, 4096 // s)
        b = 0 if rng.random() < 0.4 else _log_uniform(rng, 64, 16384)
        decodes = (_log_uniform(rng, 2, 256), _log_uniform(rng, 128, 8192))
        out.append(("mixed", (s, c, b), decodes, STEP_SIGMAS[i % 2]))
    return out


def step_compositions(
    capacity_tokens: int, max_tokens: int = 16384, max_model_len: int = 65536
) -> list[dict]:
    """Batch compositions from decode-only to prefill-heavy; ids and train/test split fixed.

    The hand-picked grid comes first, then seeded random compositions (decodes at the op
    tables' lognormal spread), then the `spread_compositions` (near-equal contexts). The split
    is drawn from seeded generators, stratified by kind, before any fitting (one in three steps
    is held out), so the held-out steps are never chosen by their error; the spread
    compositions are split on their own, which keeps the earlier steps' ids and split.
    """
    rng = random.Random(7)
    cands = []
    for b in (1, 4, 16, 48, 96, 160, 256):
        for ctx in (256, 1024, 3000, 8192):
            cands.append(("decode", None, (b, ctx), tbl.UNEVEN_SIGMA))
    cands += [
        ("mixed", (s, c, b), (db, dctx), tbl.UNEVEN_SIGMA) for c, b, s, db, dctx in MIXED_GRID
    ]
    cands += [
        (*c, tbl.UNEVEN_SIGMA)
        for c in random_compositions(random.Random(11), RANDOM_DECODE, RANDOM_MIXED)
    ]
    n_lognormal = len(cands)
    cands += spread_compositions(random.Random(13))
    comps = []
    for i, (kind, pre, (db, dctx), sigma) in enumerate(cands):
        s, c, b = pre or (0, 0, 0)
        if s * c + db > max_tokens or s * (b + c) + db * dctx > capacity_tokens * 0.9:
            continue
        longest = max(uneven_lengths(db * dctx, db, sigma)) if db else 0
        if max(longest, b + c) > max_model_len:
            continue
        comps.append(
            {
                "kind": kind,
                "prefills": pre or [],
                "decodes": (db, dctx),
                "sigma": sigma,
                "group": 0 if i < n_lognormal else 1,
            }
        )
    for i, comp in enumerate(comps):
        comp["step_id"] = i
    for group in (0, 1):
        for kind in ("decode", "mixed"):
            ids = [c for c in comps if c["kind"] == kind and c["group"] == group]
            rng.shuffle(ids)
            for j, c in enumerate(ids):
                c["split"] = "test" if j % 3 == 0 else "train"
    return comps


def _step_batch(comp: dict) -> tuple[list, list]:
    prefills, decodes = [], []
    slot = 0
    if comp["prefills"]:
        s, c, b = comp["prefills"]
        for _ in range(s):
            prefills.append((slot, c, b))
            slot += 1
    db, dctx = comp["decodes"]
    if db:
        for n in uneven_lengths(dctx * db, db, comp.get("sigma", tbl.UNEVEN_SIGMA)):
            decodes.append((slot, n))
            slot += 1
    return prefills, decodes


def profile_steps(
    out: str,
    runner,
    deadline: float,
    rounds: int = 5,
    min_rounds: int = 3,
    block: int = 24,
    timed_per_round: int = 3,
) -> int:
    """Whole steps: each composition's steady-state time, sampled in interleaved rounds.

    Eager steps are bound by the CPU's launch speed, which drifts over seconds (on H200 the
    same 80-layer step took 50 ms in one minute and 73 ms in another) and suffers contention
    bursts. Timing one composition's repeats back to back lets one burst set its whole median
    unnoticed. Hence: compositions go in blocks of ``block``; in each round a block's
    compositions run in a fresh seeded order, each one once untimed (steady state, and its
    CUDA graph captured the first time; a first version without it, where each sample followed
    an unrelated step, measured small eager steps up to 1.8x their back-to-back time, though
    an isolated check later put most of that within contention noise) and then
    ``timed_per_round`` times back to back; median, p10 and p90 are over all rounds. A block's
    rows are written when it ends (an interrupted run loses at most one block). Each block sizes its
    rounds from its first one so the blocks left share the time left; the deadline cuts
    rounds (never below ``min_rounds``) before it cuts compositions.
    """
    comps = step_compositions(runner.capacity_tokens, runner.max_tokens, runner.max_model_len)
    done = tbl.done_keys(out, "steps.csv", ("step_id",))
    todo = [c for c in comps if (c["step_id"],) not in done]
    if not todo:
        return 0
    bar = Progress("steps", len(todo))
    order_rng = random.Random(5)
    batches = {c["step_id"]: _step_batch(c) for c in todo}
    count = 0
    for lo in range(0, len(todo), block):
        if time.time() > deadline:
            break
        chunk = todo[lo : lo + block]
        samples: dict[int, list[float]] = {c["step_id"]: [] for c in chunk}
        walls: dict[int, list[float]] = {c["step_id"]: [] for c in chunk}
        failed: set[int] = set()
        t_block = time.time()
        n_rounds = rounds
        rnd = 0
        while rnd < n_rounds:
            if rnd == 1:  # size this block's rounds so the blocks left share the time left
                blocks_left = -(-(len(todo) - lo) // block)
                per_round = max(1e-3, time.time() - t_block)
                left = deadline - time.time()
                fit = rounds if math.isinf(left) else int(left / (blocks_left * per_round))
                n_rounds = max(min_rounds, min(rounds, 1 + fit))
            order = list(chunk)
            order_rng.shuffle(order)
            _step_round(runner, order, batches, (samples, walls), failed, timed_per_round, bar)
            rnd += 1
        for comp in chunk:
            sid = comp["step_id"]
            if sid in failed or not samples[sid]:
                continue
            row = _step_row(comp, batches[sid], runner, samples[sid], walls[sid])
            tbl.append_row(out, "steps.csv", row)
            count += 1
            bar.step(f"{comp['kind']} {row['median_us'] / 1e3:.2f}ms")
        sys.stderr.write(f"  block of {len(chunk)}: {rnd} rounds in {time.time() - t_block:.1f}s\n")
    bar.close()
    return count


def _step_round(runner, order, batches, into, failed: set, timed_per_round: int, bar) -> None:
    """One round over a block: each composition once untimed, then ``timed_per_round`` timed
    runs (GPU time into ``into[0]``, wall time into ``into[1]``, microseconds), with the garbage
    collector off so it cannot land inside a sample. A composition the runner refuses is added
    to ``failed`` and skipped from then on."""
    import gc

    samples, walls = into
    gc.collect()
    gc.disable()
    try:
        for comp in order:
            sid = comp["step_id"]
            if sid in failed:
                continue
            try:
                runner.run_step(*batches[sid])
                for _ in range(timed_per_round):
                    t0 = time.perf_counter()
                    gpu = runner.run_step(*batches[sid])
                    walls[sid].append((time.perf_counter() - t0) * 1e6)
                    samples[sid].append(gpu * 1e6)
            except (ValueError, RuntimeError) as e:
                failed.add(sid)
                bar.step(f"skip {sid}: {str(e)[:30]}")
    finally:
        gc.enable()


def _step_row(comp: dict, batch, runner, samples: list[float], walls: list[float]) -> dict:
    """One ``steps.csv`` row: the composition's features and its sample statistics."""
    from profiles.timing import summarize
    from simulator.latency.base import chunk_attn_pairs

    prefills, decodes = batch
    return {
        "step_id": comp["step_id"],
        "kind": comp["kind"],
        "cuda_graph": int(runner.uses_graph(prefills, decodes)),
        "prefill_tokens": sum(c for _, c, _ in prefills),
        "prefill_attn": sum(chunk_attn_pairs(c, b) for _, c, b in prefills),
        "prefill_seqs": len(prefills),
        "decode_seqs": len(decodes),
        "decode_ctx": sum(n for _, n in decodes),
        "decode_max": max((n for _, n in decodes), default=0),
        "includes_allreduce": 1 if runner.tp == 1 else 0,
        "split": comp["split"],
        **summarize(samples),
        **{f"wall_{k}": v for k, v in summarize(walls).items()},
    }


# ---- all-reduce (one process per GPU) --------------------------------------------------------


def _ar_worker(rank: int, world: int, grid: list[int], hidden: int, dtype: str, port: int, q):
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    for t in grid:
        xs = [torch.randn(t, hidden, device="cuda", dtype=getattr(torch, dtype)) for _ in range(4)]
        for x in xs:
            dist.all_reduce(x)
        torch.cuda.synchronize()
        samples = []
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(15):
            dist.barrier()
            torch.cuda.synchronize()
            s.record()
            for x in xs:
                dist.all_reduce(x)
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) * 1e3 / len(xs))
        t_all = torch.tensor(samples, device="cuda")
        dist.all_reduce(t_all, op=dist.ReduceOp.MAX)  # a collective ends when the slowest does
        rows.append((t, t_all.tolist()))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def profile_allreduce(out: str, sh: ShardedModel, tp: int, grid: list[int]) -> int:
    """NCCL all-reduce of the served model's collective ([T, hidden] activations) over tp GPUs
    (NVLink multicast kept off)."""
    import os

    import torch
    import torch.multiprocessing as mp

    from profiles.timing import summarize

    if torch.cuda.device_count() < tp:
        return 0
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    done = tbl.done_keys(out, "allreduce.csv", ("tp", "tokens"))
    todo = [t for t in grid if (tp, t) not in done]
    if not todo:
        return 0
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + random.Random().randint(0, 1000)
    procs = [
        ctx.Process(target=_ar_worker, args=(r, tp, todo, sh.hidden, torch_dtype_name(sh), port, q))
        for r in range(tp)
    ]
    for p in procs:
        p.start()
    rows = q.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    for t, samples in rows:
        res = summarize(samples)
        tbl.append_row(
            out,
            "allreduce.csv",
            {"tp": tp, "tokens": t, "bytes": t * sh.op("allreduce").act_bytes_per_token, **res},
        )
    return len(rows)
