"""GEMMs of the torch reference engine, per weight dtype: what `StepRunner` runs and what the op
profiler times (one code path, so the op tables and the whole steps agree).

* ``bf16``: ``F.linear`` (cuBLAS), weight ``[n, k]``.
* ``fp8`` (W8A8, as vLLM serves an FP8 checkpoint): the weight is stored in float8 e4m3 with one
  per-tensor scale; each call quantizes its activations dynamically with one per-tensor scale
  (``amax / 448``, vLLM's ``dynamic`` activation scheme) and multiplies with
  ``torch._scaled_mm`` (cuBLASLt FP8 on Hopper, FP32 accumulate, bf16 out, bias fused). vLLM
  quantizes activations in one fused kernel; here amax, scale and cast are three elementwise
  kernels, so small fp8 GEMMs carry a few microseconds more than vLLM's (say so when comparing).

int4 weight-only has no torch kernel (vLLM runs Machete / Marlin); an fp8 KV cache has no torch
attention kernel. Both are measured through vLLM only (`profiles.torch_model.torch_dtype_name`
refuses them with that message).

Invariant: ``linear(x, w)`` returns ``x @ W^T (+ bias)`` in ``x``'s dtype for every format, up to
the format's rounding (`tests/test_torch_gemm.py` checks fp8 against bf16 on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

#: weight dtypes of GEMMs torch can run here
TORCH_WEIGHT_DTYPES = ("bf16", "fp8")
#: largest finite float8 e4m3fn value
FP8_MAX = 448.0


@dataclass(frozen=True)
class GemmWeight:
    """A GEMM's weight ``w`` (``[n, k]``) and, for fp8, its per-tensor dequantization scale."""

    w: object
    scale: object = None

    @property
    def n(self) -> int:
        return self.w.shape[0]


def quantize_fp8(t):
    """``(t_fp8, scale)`` with ``t ~= t_fp8 * scale``: one per-tensor scale, ``amax / 448``."""
    import torch

    scale = t.abs().amax().float().clamp(min=1e-12) / FP8_MAX
    q = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def make_weight(w_bf16, weight_dtype: str) -> GemmWeight:
    """The weight as the format ``weight_dtype`` stores it (from a bf16 random tensor)."""
    if weight_dtype == "bf16":
        return GemmWeight(w_bf16)
    if weight_dtype == "fp8":
        q, scale = quantize_fp8(w_bf16)
        return GemmWeight(q, scale)
    raise ValueError(f"no torch GEMM for {weight_dtype} weights (torch runs {TORCH_WEIGHT_DTYPES})")


def linear(x, weight: GemmWeight, bias=None):
    """``x @ W^T (+ bias)`` in ``x``'s dtype (see the module docstring for fp8)."""
    import torch

    if weight.scale is None:
        return torch.nn.functional.linear(x, weight.w, bias)
    xq, x_scale = quantize_fp8(x)
    # _scaled_mm wants its second operand column-major: W [n, k] row-major, transposed
    return torch._scaled_mm(
        xq, weight.w.t(), scale_a=x_scale, scale_b=weight.scale, bias=bias, out_dtype=x.dtype
    )
