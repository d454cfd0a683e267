"""Each policy shows its known behaviour on a real trace (roofline Llama-3-8B on H100, a few
hundred requests each; numbers in comments were measured when the test was written)."""

from __future__ import annotations

from tests.policy_kit import ARXIV, MOONCAKE, SHAREGPT, config, simulate_config


def _p(s, metric, q="p95"):
    return s[metric][q]


def test_static_ttft_far_above_continuous_at_moderate_load():
    # ShareGPT, 4 req/s: p95 TTFT continuous 0.15 s, static (B=16) 50 s
    cont = simulate_config(config(trace=SHAREGPT, rate=4, n=300))
    stat = simulate_config(config(trace=SHAREGPT, rate=4, n=300,
                                  scheduler={"policy": "static", "batch_size": 16}))  # fmt: skip
    assert _p(stat, "ttft_s") > 20 * _p(cont, "ttft_s")


def test_dynamic_beats_static_at_low_load_and_trails_continuous_at_high_load():
    # 0.5 req/s: p95 TTFT static 31 s, dynamic 5.5 s. 60 req/s: output tok/s continuous 3580,
    # dynamic 1058
    sched = {"batch_size": 16}
    stat = simulate_config(config(trace=SHAREGPT, rate=0.5, n=100,
                                  scheduler={"policy": "static", **sched}))  # fmt: skip
    dyn = simulate_config(config(trace=SHAREGPT, rate=0.5, n=100,
                                 scheduler={"policy": "dynamic", **sched}))  # fmt: skip
    assert _p(dyn, "ttft_s") < 0.5 * _p(stat, "ttft_s")
    cont_hi = simulate_config(config(trace=SHAREGPT, rate=60, n=600))
    dyn_hi = simulate_config(config(trace=SHAREGPT, rate=60, n=600,
                                    scheduler={"policy": "dynamic", **sched}))  # fmt: skip
    tput = "output_tokens_per_s"
    assert dyn_hi["throughput"][tput] < 0.6 * cont_hi["throughput"][tput]


def test_chunked_prefill_lowers_tpot_and_itl_tails_on_long_prompts():
    # arXiv, 5 req/s: TPOT p95/p99 13.3/14.5 ms -> 9.5/10.3 ms; ITL p99 83 -> 13 ms
    cont = simulate_config(config(trace=ARXIV, rate=5, n=300))
    chunk = simulate_config(config(trace=ARXIV, rate=5, n=300, scheduler={
        "policy": "chunked_prefill", "max_num_batched_tokens": 512}))  # fmt: skip
    for q in ("p95", "p99"):
        assert _p(chunk, "tpot_s", q) < 0.85 * _p(cont, "tpot_s", q)
    assert _p(chunk, "itl_s", "p99") < 0.5 * _p(cont, "itl_s", "p99")


def test_paged_runs_more_requests_and_more_throughput_than_contiguous():
    # same 2048 blocks, ShareGPT at 40 req/s: mean batch 9.7 vs 2.9, 2.76 vs 0.97 req/s
    # (ratio 2.9x); contiguous wastes 66 % of its reserved slots, paged 0.3 %
    paged = simulate_config(config(trace=SHAREGPT, rate=40, n=400, kv_cache={"num_blocks": 2048}))
    cont = simulate_config(config(trace=SHAREGPT, rate=40, n=400, kv_cache={
        "num_blocks": 2048, "allocator": "contiguous", "reserve": "max_model_len"}))  # fmt: skip
    u_p, u_c = paged["utilization"], cont["utilization"]
    assert u_p["mean_batch_size"] > 2 * u_c["mean_batch_size"]
    assert paged["throughput"]["requests_per_s"] > 2 * cont["throughput"]["requests_per_s"]
    assert u_c["kv_waste_frac"] > 0.5 > 0.05 > u_p["kv_waste_frac"]


def test_prefix_caching_on_mooncake_hits_and_saves_ttft():
    # Mooncake conversation, 3 req/s: hit rate 0.22; mean TTFT falls
    off = simulate_config(config(trace=MOONCAKE, rate=3, n=400))
    on = simulate_config(config(trace=MOONCAKE, rate=3, n=400,
                                kv_cache={"prefix_caching": True}))  # fmt: skip
    assert on["prefix_cache"]["hit_rate"] > 0.15
    assert _p(on, "ttft_s", "mean") < _p(off, "ttft_s", "mean")


def test_least_outstanding_beats_round_robin_on_bursty_arrivals():
    # gamma arrivals CV 4, 12 req/s over 4 replicas (max_num_seqs 16): p95 TTFT 2.17 -> 1.82 s
    def run(router):
        cfg = config(trace=SHAREGPT, rate=12, n=800,
                     cluster={"replicas": 4, "router": {"name": router}},
                     scheduler={"policy": "continuous", "max_num_seqs": 16})  # fmt: skip
        cfg["workload"]["arrival"] = {"process": "gamma", "rate_per_s": 12, "cv": 4}
        return simulate_config(cfg)

    assert _p(run("least_outstanding"), "ttft_s") < 0.95 * _p(run("round_robin"), "ttft_s")


def test_prefix_aware_router_raises_hit_rate():
    # Mooncake, 4 replicas: hit rate 0.16 (round robin) -> 0.22 (prefix aware)
    def run(router):
        return simulate_config(
            config(
                trace=MOONCAKE,
                rate=6,
                n=400,
                kv_cache={"prefix_caching": True},
                cluster={"replicas": 4, "router": {"name": router}},
            )
        )

    rr, pa = run("round_robin"), run("prefix_aware")
    assert pa["prefix_cache"]["hit_rate"] > rr["prefix_cache"]["hit_rate"] + 0.03


def test_speculative_gain_shrinks_with_batch():
    # TPOT p50: 0.5 req/s 6.9 -> 3.4 ms (2.0x); 40 req/s gain about 1.2x
    def gain(rate, n):
        c = simulate_config(config(trace=SHAREGPT, rate=rate, n=n))
        s = simulate_config(config(trace=SHAREGPT, rate=rate, n=n,
                                   scheduler={"policy": "speculative"}))  # fmt: skip
        return _p(c, "tpot_s", "p50") / _p(s, "tpot_s", "p50")

    low, high = gain(0.5, 60), gain(40, 300)
    assert low > 1.6 and high < low - 0.3


def _disagg(p, d):
    return {"mode": "disaggregated", "prefill": {"replicas": p}, "decode": {"replicas": d},
            "link": "nvlink"}  # fmt: skip


def test_disaggregation_keeps_tpot_flat_as_prompt_load_rises():
    # arXiv on 2 GPUs, 2 -> 6 req/s: colocated TPOT p95 7.1 -> 9.0 ms, ITL p99 6.7 -> 59 ms;
    # 1P+1D TPOT p95 6.8 -> 7.8 ms, ITL p99 6.9 -> 8.1 ms
    def run(rate, disagg):
        if disagg:
            return simulate_config(
                config(
                    trace=ARXIV,
                    rate=rate,
                    n=300,
                    cluster=_disagg(1, 1),
                    scheduler={"policy": "chunked_prefill"},
                )
            )
        return simulate_config(config(trace=ARXIV, rate=rate, n=300, cluster={"replicas": 2}))

    co_lo, co_hi = run(2, False), run(6, False)
    dg_lo, dg_hi = run(2, True), run(6, True)
    co_rise = _p(co_hi, "tpot_s") / _p(co_lo, "tpot_s")
    dg_rise = _p(dg_hi, "tpot_s") / _p(dg_lo, "tpot_s")
    assert dg_rise < co_rise - 0.1
    assert _p(dg_hi, "itl_s", "p99") < 1.5 * _p(dg_lo, "itl_s", "p99")
    assert _p(co_hi, "itl_s", "p99") > 3 * _p(co_lo, "itl_s", "p99")
    assert dg_hi["disaggregation"]["transfers"] > 0


def test_best_prefill_decode_ratio_moves_with_the_mix():
    # 4 GPUs, 400 requests at once: prompt-heavy (4000 in / 32 out) is fastest with 3P:1D,
    # output-heavy (128 in / 1024 out) with 1P:3D
    def best(inp, out):
        rps = {}
        for p in (1, 2, 3):
            cfg = config(cluster=_disagg(p, 4 - p), scheduler={"policy": "chunked_prefill"})
            cfg["workload"] = {
                "arrival": {"process": "poisson", "rate_per_s": 1000}, "num_requests": 400,
                "lengths": {"input": {"dist": "fixed", "value": inp},
                            "output": {"dist": "fixed", "value": out}},
            }  # fmt: skip
            rps[p] = simulate_config(cfg)["throughput"]["requests_per_s"]
        return max(rps, key=rps.get)

    assert best(4000, 32) == 3
    assert best(128, 1024) == 1


def test_swap_and_recompute_are_counted_in_summary():
    base = dict(trace=SHAREGPT, rate=40, n=200)
    for mode in ("recompute", "swap"):
        s = simulate_config(
            config(
                **base,
                kv_cache={"num_blocks": 600},
                scheduler={"policy": "continuous", "preemption": mode},
            )
        )
        pre = s["preemption"]
        assert pre["mode"] == mode and pre[mode] > 0 and s["requests"]["completed"] == 200
        if mode == "swap":
            assert pre["swap_out_s"] > 0 and pre["swap_in_tokens"] == pre["swap_out_tokens"]
