"""The torch reference engine's GEMMs per weight dtype (profiles/torch_gemm.py), on CPU: the
fp8 path (per-tensor weight scale, dynamic per-tensor activation scale, torch._scaled_mm)
computes what the bf16 GEMM computes, within float8 e4m3's rounding; precisions torch has no
kernel for are refused with a message that points to vLLM."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from profiles.torch_gemm import FP8_MAX, GemmWeight, linear, make_weight, quantize_fp8  # noqa: E402
from profiles.torch_model import torch_dtype_name  # noqa: E402
from simulator.models import MODELS  # noqa: E402
from simulator.served import ShardedModel  # noqa: E402


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_fp8_quantization_keeps_e4m3_precision():
    t = torch.randn(64, 128, generator=torch.Generator().manual_seed(0), dtype=torch.bfloat16)
    q, scale = quantize_fp8(t)
    assert q.dtype == torch.float8_e4m3fn and scale.dim() == 0
    assert float(q.float().abs().max()) == pytest.approx(FP8_MAX)  # amax maps to the top code
    # 3 mantissa bits: each value within 2^-4 relative, the whole tensor within a few percent
    assert _rel(q.float() * scale, t) < 0.04


def test_fp8_linear_matches_bf16_linear():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 256, generator=g, dtype=torch.bfloat16)
    w = torch.randn(64, 256, generator=g, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(64, generator=g, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x, w, bias)
    got = linear(x, make_weight(w, "fp8"), bias)
    assert got.shape == (10, 64) and got.dtype == torch.bfloat16
    assert _rel(got, ref) < 0.06
    # bf16 is F.linear exactly
    assert torch.equal(linear(x, make_weight(w, "bf16"), bias), ref)
    assert isinstance(make_weight(w, "bf16"), GemmWeight) and make_weight(w, "bf16").scale is None


def test_formats_without_a_torch_kernel_are_refused():
    with pytest.raises(ValueError, match="int4"):
        make_weight(torch.zeros(16, 16, dtype=torch.bfloat16), "int4")
    base = MODELS["llama-3-8b"]

    def dtype(**p):
        return torch_dtype_name(ShardedModel(dataclasses.replace(base, **p), 1))

    assert dtype() == "bfloat16"
    assert dtype(weights="fp8") == "bfloat16"  # fp8 GEMMs, bf16 activations and KV
    for p in ({"weights": "fp8", "kv_cache_dtype": "fp8"}, {"weights": "int4"}):
        with pytest.raises(ValueError, match="--engine vllm"):
            dtype(**p)
