"""GPU checks of the profiler: timing helper, a tiny StepRunner, a tiny resumable table.

Skipped without torch or CUDA (CI has neither); run on a GPU machine with
``pytest tests/test_gpu_profile.py``.
"""

import dataclasses

import pytest

from simulator.models import ModelSpec

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("CUDA not available", allow_module_level=True)

pytestmark = pytest.mark.gpu

# a real ModelSpec: the runner and the profiler derive every shape from ShardedModel(spec, tp)
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=512,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=1024,
    vocab_size=1000,
    max_model_len=4096,
)


def test_time_calls_returns_ordered_spread():
    from profiles.timing import time_calls

    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    res = time_calls([lambda: x @ x])
    assert 0 < res["p10_us"] <= res["median_us"] <= res["p90_us"]


def test_varlen_gqa_matches_sdpa():
    from profiles.torch_model import make_attn, varlen_features

    attn = make_attn(varlen_features())
    q = torch.randn(1, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(100, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
    out = attn(q, k, v, cu_q, cu_k, 1, 100, False)
    kk = k.repeat_interleave(4, dim=1).transpose(0, 1)[None]
    vv = v.repeat_interleave(4, dim=1).transpose(0, 1)[None]
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv)
    err = (out.float() - ref[0].transpose(0, 1).float()).norm() / ref.float().norm()
    assert err < 2e-2


def test_step_runner_mixed_and_graph_steps():
    from profiles.torch_model import StepRunner

    r = StepRunner(TINY, kv_cache_gib=0.5, max_seqs=16, max_tokens=2048)
    t_dec = r.run_step([], [(0, 100), (1, 300), (2, 7)])
    t_mix = r.run_step([(3, 512, 64)], [(0, 101)])
    t_big = r.run_step([(3, 1024, 0), (4, 1024, 512)], [(0, 102)])
    assert 0 < t_dec < 0.1 and 0 < t_mix < 0.5
    assert t_big > 0
    assert (4, 512) in r.graphs  # 3 decodes padded to batch 4, max_k 300 -> bucket 512
    r.close()


def test_fp8_weights_run_scaled_mm_steps_close_to_bf16():
    """FP8 W8A8 GEMMs (torch._scaled_mm) in eager and graph steps: same shapes, hidden states
    within float8 rounding of the bf16 runner's on the same random weights and cache."""
    from profiles.torch_model import StepRunner

    fp8 = dataclasses.replace(TINY, weights="fp8")
    runners = [StepRunner(m, kv_cache_gib=0.25, max_seqs=16, max_tokens=1024) for m in (TINY, fp8)]
    assert runners[1].layers[0]["qkv"].w.dtype == torch.float8_e4m3fn
    assert runners[1].lm_head.scale is None  # the LM head stays bf16, as vLLM's FP8 serves it
    # same seed, nothing run yet: the same bf16 draws (weights, cache, token ids), quantized in
    # the fp8 runner; one fixed block table
    step = ([(3, 48, 16)], [(0, 101), (1, 40)])
    tables = {slot: list(range(10 * slot, 10 * slot + 10)) for slot in (0, 1, 3)}
    with torch.inference_mode():
        ref, got = (r._forward(*r.prepare(*step, tables), hidden=True) for r in runners)
    assert got.shape == ref.shape
    assert float((got.float() - ref.float()).norm() / ref.float().norm()) < 0.2
    assert 0 < runners[1].run_step([], [(0, 100), (1, 7)]) < 0.1  # a decode graph
    assert 0 < runners[1].run_step([(3, 64, 32)], [(0, 101)]) < 0.5  # an eager mixed step
    for r in runners:
        r.close()


def test_mixed_graphs_replay_the_same_step_and_skip_the_launch_floor():
    from profiles.torch_model import StepRunner

    r = StepRunner(TINY, kv_cache_gib=0.5, max_seqs=16, max_tokens=2048, mixed_mode="full")
    eager = StepRunner(TINY, kv_cache_gib=0.5, max_seqs=16, max_tokens=2048)
    step = ([(3, 16, 64)], [(0, 101), (1, 40)])
    t1 = r.run_step(*step)
    g1 = r._mixed[1]
    t2 = r.run_step(*step)
    assert r._mixed[1] is g1  # same composition: the captured graph is replayed
    r.run_step([(3, 32, 0)], [(0, 101)])
    assert r._mixed[1] is not g1  # a new composition is captured afresh
    for _ in range(3):
        eager.run_step(*step)
    t_eager = min(eager.run_step(*step) for _ in range(5))
    # a 2-layer toy step is launch-bound when eager; its graph replay is not
    assert 0 < t2 < t_eager and t1 > 0
    r.close()
    eager.close()


def test_piecewise_graphs_match_the_eager_forward():
    from profiles.torch_model import StepRunner

    r = StepRunner(TINY, kv_cache_gib=0.5, max_seqs=16, max_tokens=1024, mixed_mode="piecewise")
    pw = r.piecewise
    assert pw.sizes[0] == 1 and pw.largest == 512
    assert pw.num_graphs() == len(pw.sizes) * (TINY.num_layers + 1)
    # 3 decodes + a 45-token chunk = 48 tokens (a capture size); then 51 tokens padded to 64,
    # then a smaller step in the same size, which must re-pad the rows the larger one left
    steps = [
        ([(3, 45, 64)], [(0, 101), (1, 40), (2, 7)]),
        ([(3, 48, 64)], [(0, 101), (1, 40), (2, 7)]),
        ([(3, 50, 0)], [(0, 102)]),
        ([(4, 20, 0), (5, 9, 30)], []),
    ]
    with torch.inference_mode():
        for pre, dec in steps:
            assert r.uses_graph(pre, dec)
            args = r.prepare(pre, dec)
            ref = r._forward(*args, hidden=True)
            got = pw.run(args, hidden=True)
            assert got.shape == ref.shape
            err = (got.float() - ref.float()).norm() / ref.float().norm()
            assert err < 2e-2, (pre, dec, float(err))
        assert r.run_step(*steps[0]) > 0
        big = ([(3, 600, 0)], [])
        assert not r.uses_graph(*big)  # above the largest capture size: eager
        assert r.run_step(*big) > 0
    r.close()


def test_profile_tiny_table_and_resume(tmp_path):
    from profiles.cli import run_profile
    from simulator.latency.profiled import load_for_report

    out = str(tmp_path / "tiny_tp1")
    assert run_profile(TINY, 1, out, budget_s=25, skip_steps=False, max_tokens=1024) == 0
    before = (tmp_path / "tiny_tp1" / "gemm.csv").read_text()
    assert run_profile(TINY, 1, out, budget_s=25, skip_steps=False, max_tokens=1024) == 0
    assert (tmp_path / "tiny_tp1" / "gemm.csv").read_text() == before  # resumed: nothing new
    m = load_for_report(out)
    assert m.step_time(0, 0, 0, 8, 800) > 0
    # padded decode-graph calls at both spreads, and each step's longest decode context
    from simulator.latency.table import load_table

    t = load_table(out)
    padded = t.rows["attn_decode_padded.csv"]
    assert {r["uneven"] for r in padded} == {0, 1}
    assert all(r["batch"] < r["padded_to"] for r in padded)
    assert m._pad_cols
    for r in t.rows["steps.csv"]:
        assert (r["decode_max"] > 0) == (r["decode_seqs"] > 0)
        assert r["decode_max"] * r["decode_seqs"] >= r["decode_ctx"]
