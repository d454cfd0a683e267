"""The on-disk format of a step-latency table, and its strict reader.

It lives in `simulator` because the simulator reads tables; the profiler (``profiles/``) writes
them with the writers at the end of this module. A table lives in
``profiles/<gpu>/<model>_tp<k>/`` and holds one CSV per op family plus ``meta.yaml``. Times are
microseconds (``*_us``); each measured row keeps the median and the p10 / p90 spread over
repeats. All shapes are per GPU (TP-sharded). Schema (version 1):

* ``gemm.csv``         op (qkv|o|gate_up|down|lm_head), tokens, n, k, median_us, p10_us, p90_us
* ``attn_prefill.csv`` seqs, chunk, context_before, median_us, p10_us, p90_us  (one layer, causal)
* ``attn_decode.csv``  batch, total_ctx, uneven, causal, median_us, p10_us, p90_us (one layer)
* ``attn_decode_padded.csv`` batch, padded_to, total_ctx, uneven, median_us, p10_us, p90_us
                       (optional; one layer: ``batch`` real sequences holding ``total_ctx``
                       keys plus ``padded_to - batch`` one-token dummies, as a padded decode
                       CUDA graph runs them)
* ``elementwise.csv``  op (rmsnorm|rotary|silu_mul|embed|sampling), tokens, median_us, p10_us,
                       p90_us
* ``allreduce.csv``    tp, tokens, bytes, median_us, p10_us, p90_us  (only where measured)
* ``steps.csv``        step_id, kind (decode|mixed), cuda_graph, prefill_tokens, prefill_attn,
                       prefill_seqs, decode_seqs, decode_ctx, split (train|test), median_us,
                       p10_us, p90_us, includes_allreduce; optional ``decode_max`` (the
                       longest decode context; without it the row ran the lognormal spread of
                       `uneven_lengths` and the reader fills it in); optional
                       ``wall_median_us``, ``wall_p10_us``, ``wall_p90_us`` (host wall-clock of
                       the step: input preparation, launch and GPU work; the ``*_us`` times
                       of steps.csv are the GPU's alone, by CUDA events)

``meta.yaml`` may also say what it measured: ``precision: {weights: bf16|fp8|int4,
kv_cache_dtype: bf16|fp8}`` (without it, `table_precision` derives it from ``dtype`` and
``kv_cache_dtype``) and ``op_fingerprint`` (`simulator.served.ShardedModel.op_fingerprint` of the
model it ran; checked when present).

Invariants: every file named above except allreduce.csv exists; every CSV has at least its
required columns, numbers where numbers are expected, and no negative times; ``meta.yaml`` names
the model, the TP degree and ``schema_version: 1``, and holds no key that
`simulator.latency.meta_keys` does not list. Anything else is a `ConfigError` naming the file and
the column or field, because a table is user input (it may come from another machine).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field

from simulator.errors import ConfigError
from simulator.files import load_yaml_file, read_text, refuse_repeated_columns
from simulator.latency.base import STEP_FEATURES
from simulator.latency.meta_keys import TABLE_META, check_meta_keys
from simulator.precision import META_DTYPE_NAMES, Precision

SCHEMA_VERSION = 1

#: Decode batch sizes the profiler's step runner captures CUDA graphs for: a graphed decode of b
#: sequences runs padded to the next size, and the profiled latency model charges it so.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: decode rows with ``uneven=1`` hold contexts at the (i + 0.5) / n quantiles of a lognormal
#: with this sigma (`uneven_weights`); the latency model needs the same law to know how long the
#: longest sequence of such a row was
UNEVEN_SIGMA = 0.8


def uneven_weights(n: int, sigma: float = UNEVEN_SIGMA) -> list[float]:
    """Relative context lengths of n sequences at the (i + 0.5) / n quantiles of a lognormal
    of this sigma, ascending (``uneven=1`` decode rows use `UNEVEN_SIGMA`; sigma 0 is equal)."""
    import statistics

    if n <= 1 or sigma <= 0:
        return [1.0] * max(n, 0)
    nd = statistics.NormalDist()
    return [math.exp(sigma * nd.inv_cdf((i + 0.5) / n)) for i in range(n)]


def uneven_lengths(total: int, n: int, sigma: float = UNEVEN_SIGMA) -> list[int]:
    """n positive ints summing to total, spread like real batches, deterministically.

    The lengths sit at the (i + 0.5) / n quantiles of a lognormal (`uneven_weights`), so the
    longest / mean ratio is a smooth function of n. This matters: torch 2.11's varlen
    FlashAttention has no split-KV, so a decode call lasts about as long as its LONGEST sequence
    takes, and a random draw would make the table jump by the luck of its maximum.
    """
    if n == 1:
        return [total]
    w = uneven_weights(n, sigma)
    s = sum(w)
    out = [max(1, int(total * x / s)) for x in w]
    out[-1] += total - sum(out)
    if out[-1] < 1:
        out = [max(1, total // n)] * n
        out[-1] += total - sum(out)
    return out


TIME_COLS = ("median_us", "p10_us", "p90_us")

SCHEMA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # file: (numeric columns, text columns)
    "gemm.csv": (("tokens", "n", "k") + TIME_COLS, ("op",)),
    "attn_prefill.csv": (("seqs", "chunk", "context_before") + TIME_COLS, ()),
    "attn_decode.csv": (("batch", "total_ctx", "uneven", "causal") + TIME_COLS, ()),
    "attn_decode_padded.csv": (("batch", "padded_to", "total_ctx", "uneven") + TIME_COLS, ()),
    "elementwise.csv": (("tokens",) + TIME_COLS, ("op",)),
    "allreduce.csv": (("tp", "tokens", "bytes") + TIME_COLS, ()),
    "steps.csv": (
        (
            "step_id",
            "cuda_graph",
            "prefill_tokens",
            "prefill_attn",
            "prefill_seqs",
            "decode_seqs",
            "decode_ctx",
            "includes_allreduce",
        )
        + TIME_COLS,
        ("kind", "split"),
    ),
}
OPTIONAL_FILES = ("allreduce.csv", "attn_decode_padded.csv")
#: numeric columns a file may lack (older tables); `load_table` fills them in
OPTIONAL_COLUMNS = {"steps.csv": ("decode_max", "wall_median_us", "wall_p10_us", "wall_p90_us")}
GEMM_OPS = ("qkv", "o", "gate_up", "down", "lm_head")
ELEMENTWISE_OPS = ("rmsnorm", "rotary", "silu_mul", "embed", "sampling")

META_REQUIRED = ("schema_version", "gpu", "model", "tp", "dtype", "attention_backend")


@dataclass
class Table:
    """A loaded table: rows per CSV (dicts of floats / strings) and the parsed meta.yaml."""

    path: str
    meta: dict
    rows: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``<gpu>/<model>_tp<k>[+<variant>]`` as used in the latency model's name (a variant,
        e.g. ``mixed_graphs``, says the whole steps were timed differently)."""
        gpu = str(self.meta.get("gpu", {}).get("key", "gpu"))
        variant = self.meta.get("variant")
        tail = f"+{variant}" if variant else ""
        return f"{gpu}/{self.meta['model']['name']}_tp{self.meta['tp']}{tail}"


def _num(value: str, where: str, key: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(where, key, f"expected a number, got {value!r}") from None
    if math.isnan(x) or math.isinf(x):
        raise ConfigError(where, key, f"expected a finite number, got {value!r}")
    return x


def read_csv(path: str, name: str) -> list[dict]:
    """Read one CSV of the schema; raise ConfigError naming the file and the bad column."""
    numeric, text = SCHEMA[name]
    try:
        with io.StringIO(read_text(path, "table CSV"), newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            refuse_repeated_columns(path, header)
            for col in numeric + text:
                if col not in header:
                    raise ConfigError(path, col, "required column is missing")
            optional = [c for c in OPTIONAL_COLUMNS.get(name, ()) if c in header]
            rows = []
            for i, raw in enumerate(reader, start=2):
                row: dict = {}
                for col in numeric:
                    row[col] = _num(raw.get(col), path, f"{col} (line {i})")
                for col in optional:
                    row[col] = _num(raw.get(col), path, f"{col} (line {i})")
                for col in text:
                    v = raw.get(col)
                    if v is None or v == "":
                        raise ConfigError(path, f"{col} (line {i})", "expected a value")
                    row[col] = v
                for col in TIME_COLS:
                    if row[col] < 0:
                        raise ConfigError(path, f"{col} (line {i})", "time must be >= 0")
                rows.append(row)
    except OSError as e:
        raise ConfigError(path, "", f"cannot read table file: {e.strerror}") from None
    except csv.Error as e:
        raise ConfigError(path, "", f"not valid CSV ({e})") from None
    return rows


def read_meta(path: str) -> dict:

    meta = load_yaml_file(path, "table metadata")
    if not isinstance(meta, dict):
        raise ConfigError(path, "<top>", "expected a mapping")
    check_meta_keys(meta, path, TABLE_META)
    for key in META_REQUIRED:
        if key not in meta:
            raise ConfigError(path, key, "required field is missing")
    if meta["schema_version"] != SCHEMA_VERSION:
        raise ConfigError(
            path, "schema_version", f"expected {SCHEMA_VERSION}, got {meta['schema_version']!r}"
        )
    if not isinstance(meta["model"], dict) or "name" not in meta["model"]:
        raise ConfigError(path, "model.name", "required field is missing")
    if not isinstance(meta["tp"], int) or isinstance(meta["tp"], bool) or meta["tp"] < 1:
        raise ConfigError(path, "tp", f"expected a positive integer, got {meta['tp']!r}")
    if not isinstance(meta["gpu"], dict) or "key" not in meta["gpu"]:
        raise ConfigError(path, "gpu.key", "required field is missing")
    return meta


def table_precision(meta: dict, meta_path: str) -> Precision:
    """The precision a table measured: its ``precision:`` mapping when given, else derived from
    ``dtype`` (absent: bf16 weights) and ``kv_cache_dtype`` (absent or ``auto``: bf16). A name
    outside `META_DTYPE_NAMES` / the precision tables is a ConfigError naming the field."""
    given = meta.get("precision")
    if given is not None:
        if not isinstance(given, dict) or set(given) - {"weights", "kv_cache_dtype"}:
            raise ConfigError(
                meta_path, "precision", "expected {weights: ..., kv_cache_dtype: ...}"
            )
        names = {k: str(given.get(k, "bf16")) for k in ("weights", "kv_cache_dtype")}
        fields = {k: f"precision.{k}" for k in names}
    else:
        names = {}
        fields = {"weights": "dtype", "kv_cache_dtype": "kv_cache_dtype"}
        for key, field in fields.items():
            raw = meta.get(field)
            raw = "bf16" if raw is None else str(raw)
            if raw not in META_DTYPE_NAMES:
                raise ConfigError(meta_path, field, f"unknown dtype {raw!r}")
            names[key] = META_DTYPE_NAMES[raw]
    try:
        return Precision(names["weights"], names["kv_cache_dtype"])
    except ValueError as e:
        field = fields[str(e).split()[0]]  # the message starts with the bad field's name
        raise ConfigError(meta_path, field, str(e)) from None


def load_table(table_dir: str, *, require_steps: bool = True) -> Table:
    """Load and validate every file of a table directory (no interpretation beyond the schema)."""
    if not os.path.isdir(table_dir):
        raise ConfigError(table_dir, "", "table directory does not exist")
    meta = read_meta(os.path.join(table_dir, "meta.yaml"))
    table = Table(path=table_dir, meta=meta)
    for name in SCHEMA:
        p = os.path.join(table_dir, name)
        if not os.path.exists(p):
            if name in OPTIONAL_FILES or (name == "steps.csv" and not require_steps):
                table.rows[name] = []
                continue
            raise ConfigError(p, "", "required table file is missing")
        table.rows[name] = read_csv(p, name)
    for row in table.rows["steps.csv"]:
        if "decode_max" not in row:  # older tables: every decode batch ran the lognormal spread
            n, k = int(row["decode_seqs"]), int(row["decode_ctx"])
            row["decode_max"] = float(max(uneven_lengths(k, n))) if n > 0 else 0.0
    for row in table.rows["gemm.csv"]:
        if row["op"] not in GEMM_OPS:
            raise ConfigError(
                os.path.join(table_dir, "gemm.csv"), "op", f"unknown op {row['op']!r}"
            )
    for name, need in (("gemm.csv", GEMM_OPS), ("elementwise.csv", ("rmsnorm", "silu_mul"))):
        have = {r["op"] for r in table.rows[name]}
        for op in need:
            if op not in have:
                raise ConfigError(os.path.join(table_dir, name), "op", f"no rows for op {op!r}")
    for name in ("attn_prefill.csv", "attn_decode.csv"):
        if not table.rows[name]:
            raise ConfigError(os.path.join(table_dir, name), "", "table has no rows")
    return table


# ---- writing (used by the profiler; append-only so that an interrupted run resumes) --------


def csv_columns(name: str) -> list[str]:
    numeric, text = SCHEMA[name]
    order = {
        "gemm.csv": ["op", "tokens", "n", "k"],
        "elementwise.csv": ["op", "tokens"],
        "steps.csv": [
            "step_id",
            "kind",
            "cuda_graph",
            *STEP_FEATURES,
            "includes_allreduce",
            "split",
        ],
    }.get(name)
    tail: list[str] = []
    if order is None:
        order = [c for c in numeric if c not in TIME_COLS]
        order += list(OPTIONAL_COLUMNS.get(name, ()))
    elif name == "steps.csv":
        tail = [c for c in OPTIONAL_COLUMNS[name] if c not in order]
    return order + list(TIME_COLS) + tail


def append_row(table_dir: str, name: str, row: dict) -> None:
    """Append one measured row (writing the header first if the file is new); flushes at once."""
    path = os.path.join(table_dir, name)
    cols = csv_columns(name)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != cols:
            hint = " (re-time the whole steps: --redo-steps)" if name == "steps.csv" else ""
            raise ConfigError(
                path, "<header>", f"columns {header} differ from this profiler's {cols}{hint}"
            )
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        if new:
            w.writeheader()
        out = {}
        for c in cols:
            v = row[c]
            out[c] = f"{v:.3f}" if isinstance(v, float) and c.endswith("_us") else v
        w.writerow(out)


def done_keys(table_dir: str, name: str, key_cols: tuple[str, ...]) -> set[tuple]:
    """Keys of the rows already written (for --resume); a malformed file is an error."""
    path = os.path.join(table_dir, name)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return set()
    rows = read_csv(path, name)
    out = set()
    for r in rows:
        out.add(tuple(_key_val(r[c]) for c in key_cols))
    return out


def _key_val(v):
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v
