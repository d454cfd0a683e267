"""Numeric formats a served model can run in: the one place byte widths and dtypes are named.

A model is served with a *weight format* (``weights``: bf16 | fp8 | int4) and a *KV-cache dtype*
(``kv_cache_dtype``: bf16 | fp8), as vLLM names them. Everything else that depends on precision
(weight bytes, KV bytes, the GEMMs' input dtype and so which tensor-core peak applies, the byte
width a profiled table measured) is read from the tables below, never from a literal elsewhere.
Adding a precision is an entry here, a FLOP peak for its GEMM dtype in `simulator.hardware` (when
it brings a new one), and the names a table's ``meta.yaml`` may use for it (`META_DTYPE_NAMES`).

* ``bf16``: weights, activations and GEMMs in bfloat16.
* ``fp8`` (W8A8, as vLLM's ``quantization="fp8"`` serves it): linear-layer weights in FP8 e4m3
  with per-tensor or per-channel scales (a few bytes per output row: not counted), activations
  quantized to FP8 on the fly, so each GEMM reads FP8 inputs and runs at the FP8 tensor-core peak;
  outputs are bf16. Embedding and LM head stay bf16 (vLLM does not quantize them).
* ``int4`` (weight-only, w4a16): linear-layer weights packed 4-bit with one bf16 scale per group
  of `INT4_GROUP_SIZE` weights (counted), dequantized inside the GEMM; activations and the GEMM's
  arithmetic stay bf16.
* KV ``fp8``: K and V stored as FP8 (one byte per element; per-tensor scales, not counted).

Invariants: every byte width is positive; a weight format's ``gemm_dtype`` is a key of
`DTYPE_BYTES`; the activation dtype is `ACT_DTYPE` whatever the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes per element of the dtypes tensors are stored or computed in (not weight formats:
#: int4 packs scales with its weights, see `WEIGHT_FORMATS`).
DTYPE_BYTES: dict[str, float] = {"bf16": 2, "fp8": 1}

#: The dtype of activations between ops: weight-only formats dequantize into it, W8A8 formats
#: quantize GEMM inputs from it and write their outputs in it.
ACT_DTYPE = "bf16"

#: Weights per bf16 scale of the int4 weight-only format (GPTQ / AWQ / compressed-tensors w4a16).
INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class WeightFormat:
    """How the linear layers' weights are stored and multiplied.

    ``bytes_per_param``: HBM bytes per weight, scales included. ``gemm_dtype``: the dtype of
    the GEMM's inputs, which decides the tensor-core peak (`GPUSpec.peak_flops_for`) and the bytes
    a GEMM reads per activation element.
    """

    name: str
    bytes_per_param: float
    gemm_dtype: str


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    w.name: w
    for w in (
        WeightFormat("bf16", DTYPE_BYTES["bf16"], "bf16"),
        WeightFormat("fp8", DTYPE_BYTES["fp8"], "fp8"),
        WeightFormat("int4", 0.5 + DTYPE_BYTES["bf16"] / INT4_GROUP_SIZE, ACT_DTYPE),
    )
}

#: KV-cache dtypes a model may be served with.
KV_CACHE_DTYPES: tuple[str, ...] = ("bf16", "fp8")

#: What a profiled table's ``meta.yaml`` may write for each precision name, when it gives the
#: torch / vLLM dtype strings (``dtype``, ``kv_cache_dtype``) instead of ``precision:``. None and
#: vLLM's ``auto`` mean the model dtype (bf16).
META_DTYPE_NAMES: dict[str, str] = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "auto": "bf16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
    "int4": "int4",
}


@dataclass(frozen=True)
class Precision:
    """A served model's precision, by name: ``weights`` and ``kv_cache_dtype``."""

    weights: str = "bf16"
    kv_cache_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(
                f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )

    @property
    def label(self) -> str:
        """A short name: ``bf16`` or ``fp8`` when weights and KV agree, else ``int4-kv-fp8``."""
        if self.weights == self.kv_cache_dtype:
            return self.weights
        return f"{self.weights}-kv-{self.kv_cache_dtype}"

    def describe(self) -> str:
        return f"{self.weights} weights, {self.kv_cache_dtype} KV cache"


__all__ = [
    "ACT_DTYPE",
    "DTYPE_BYTES",
    "INT4_GROUP_SIZE",
    "KV_CACHE_DTYPES",
    "META_DTYPE_NAMES",
    "Precision",
    "WEIGHT_FORMATS",
    "WeightFormat",
]
