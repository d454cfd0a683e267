"""Token-dependent routers for mixture-of-experts models on dummy weights (needs torch).

Why: vLLM's dummy loader draws every weight uniform in +-1e-3. A router's logits are then ~1e-4:
a router bias (gpt-oss) or score-correction bias (DeepSeek-V3) of dummy size outweighs them, and
in bf16 such small logits tie often (top-k then breaks ties by expert index). Decode batches go
to a few experts and run faster than with a trained router: `simulator/latency/routing_check.py`
flags four shipped tables (profiles/README.md, "Dummy-weight routing").

Two changes make the routing token-dependent; only values change, so every kernel and shape is
the same, and both are seeded (the same model and seed give the same weights):

* `reinit_routers` gives every router logits of about ``logit_std`` (spread over experts as
  uniform routing): its weight drawn N(0, s^2) with ``s = logit_std / (sqrt(H) x rms(norm))``,
  where ``norm`` is the weight of the RMSNorm that feeds it (the layer's
  ``post_attention_layernorm``: its normalized input is O(1) a channel, times that dummy
  weight), and its bias and score-correction bias set to zero.
* `spread_embeddings` draws the token embedding N(0, 1). Why: a router reads the normalized
  residual stream, which on dummy weights is the token's embedding (+-1e-3) plus what every
  layer adds, and a model with biases adds a token-independent vector each layer (gpt-oss: the
  attention output bias, the experts' down-projection biases, +-1e-3 each). By the middle layers
  that constant part is ~4x the token's, every token's logits share its offsets, and a batch
  goes to the same few experts: a gpt-oss-20b table recorded with the routers re-drawn alone
  (H100, 2026-11-26) still had 94% of its decode steps below the uniform-routing bound (batch
  8-31 at 0.52x it). With embeddings of rms 1 the token's part dominates the stream in every
  layer (the layers' additions stay ~1e-3). A numpy replica of that stream (gpt-oss-20b's sizes,
  64 tokens) touches 9-21 of 32 experts a layer before, 31-32 after (uniform: 32.0).

`register` makes the loader ``dummy_routed`` (vLLM's dummy load, then both changes), which a
job selects with ``"routing": "token_dependent"`` (`profiles.vllm_run`; vLLM forks its engine
process after this one registers it: no spawn, see `profiles.vllm_run`).

**Skewed routing** (a job's ``"routing_skew": s``): the same loader, with per-expert logit
offsets and a constant embedding part calibrated in `profiles.routing_skew` (see there).
"""

from __future__ import annotations

import math

import numpy as np

from profiles.routing_skew import (
    SkewPlan,
    num_experts_of,
    offset_router,
    skew_plan,
    summarize_routing,
    top_k_of,
)

#: last name component of a router module in vLLM's MoE models: ``mlp.gate`` (Qwen3-MoE,
#: DeepSeek-V2/V3), ``block_sparse_moe.gate`` (Mixtral), ``mlp.router`` (gpt-oss)
ROUTER_NAMES = ("gate", "router")
#: the RMSNorm whose output a layer's router reads, relative to the layer
ROUTER_INPUT_NORM = "post_attention_layernorm"
#: last name component of the token embedding in vLLM's MoE models (``model.embed_tokens``;
#: gpt-oss: ``model.embedding``); never the LM head (``lm_head``)
EMBEDDING_NAMES = ("embed_tokens", "embedding")
LOAD_FORMAT = "dummy_routed"


def reinit_routers(
    model, num_experts: int, seed: int = 0, logit_std: float = 1.0, skew: SkewPlan | None = None
) -> list[str]:
    """Re-draw every router of ``model`` (a torch module; see the module docstring) and return
    their names. A router is a submodule named ``*.gate`` or ``*.router`` whose 2-D ``weight``
    has ``num_experts`` rows; none found is a ValueError (the caller asked for routers). With
    ``skew``, each router also gets its layer's offsets along the direction it sees the
    embedding's constant part in (module docstring; the embedding gets it in
    `spread_embeddings`)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = np.random.default_rng(seed)  # which expert holds which popularity rank, per layer
    x_rms = 1.0 if skew is None else skew.input_rms
    done = []
    for name, mod, w in _matrices_named(model, ROUTER_NAMES):
        if w.shape[0] != num_experts:
            continue
        scale = logit_std * x_rms / (math.sqrt(w.shape[1]) * _input_rms(model, name))
        with torch.no_grad():
            draw = torch.randn(tuple(w.shape), generator=gen, dtype=torch.float32) * scale
            if skew is not None:
                u = _norm_weight(model, name, w.shape[1]) * skew.constant / x_rms
                b = skew.offsets[order.permutation(num_experts)]
                draw = torch.from_numpy(offset_router(draw.double().numpy(), u, b))
            w.copy_(draw.to(dtype=w.dtype, device=w.device))
            for bias in ("bias", "e_score_correction_bias"):
                b = getattr(mod, bias, None)
                if b is not None:
                    b.zero_()
        done.append(name)
    if not done:
        raise ValueError(f"no router with {num_experts} experts found (modules named "
                         f"*.{' / *.'.join(ROUTER_NAMES)})")  # fmt: skip
    return done


def _matrices_named(model, names: tuple[str, ...]):
    """``(name, module, weight)`` of every submodule whose last name component is in ``names``
    and whose ``weight`` is 2-D (the routers and embeddings these functions re-draw)."""
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if name.rsplit(".", 1)[-1] in names and w is not None and w.dim() == 2:
            yield name, mod, w


def _input_rms(model, router_name: str) -> float:
    """RMS of the weight of the norm feeding ``router_name`` (its layer's
    ``post_attention_layernorm``), or 1.0 where the model has none there."""
    norm = _input_norm(model, router_name)
    if norm is None:
        return 1.0
    w = norm.weight.detach().float()
    rms = float(w.pow(2).mean().sqrt())
    return rms if rms > 0 else 1.0


def _input_norm(model, router_name: str):
    """The norm module feeding ``router_name`` (its layer's ``post_attention_layernorm``), or
    None where the model has none there."""
    layer = router_name.rsplit(".", 2)[0]  # model.layers.N.mlp.gate -> model.layers.N
    try:
        return model.get_submodule(f"{layer}.{ROUTER_INPUT_NORM}")
    except AttributeError:
        return None


def _norm_weight(model, router_name: str, hidden: int) -> np.ndarray:
    """The per-channel weight (float64) of the norm feeding ``router_name``; ones without one."""
    norm = _input_norm(model, router_name)
    if norm is None:
        return np.ones(hidden)
    return norm.weight.detach().double().cpu().numpy()


def spread_embeddings(model, seed: int = 0, skew: SkewPlan | None = None) -> list[str]:
    """Re-draw the token embedding of ``model`` N(0, 1) (module docstring), plus ``skew``'s
    constant vector in every row when given, and return its module names; none found is a
    ValueError. Drawn on the weight's device by a seeded generator of that device (a 200k x
    2880 table in one call, no host copy)."""
    import torch

    done = []
    for name, _, w in _matrices_named(model, EMBEDDING_NAMES):
        gen = torch.Generator(device=w.device).manual_seed(seed)
        with torch.no_grad():
            w.copy_(torch.randn(tuple(w.shape), generator=gen, device=w.device, dtype=w.dtype))
            if skew is not None:
                w.add_(torch.from_numpy(skew.constant).to(dtype=w.dtype, device=w.device))
        done.append(name)
    if not done:
        raise ValueError(
            f"no token embedding found (modules named *.{' / *.'.join(EMBEDDING_NAMES)})"
        )
    return done


def routing_at_load(model, num_experts: int, top_k: int, tokens: int = 4096, seed: int = 0) -> dict:
    """What the routers of ``model`` do with ``tokens`` random token ids (seeded) right after
    the load, to set against the routing asked for: each router's top-k over the ids'
    embedding rows, RMS-normalized and times its norm's weight (what its layer's
    post-attention norm gives it, less the ~1e-3 that the layers before add). Per router, the
    experts' shares by rank (`topk_shares`) and the distinct experts that groups of 8 and 64
    tokens touch; returned as medians over the routers (`summarize_routing`)."""
    import torch

    emb = next(w for _, _, w in _matrices_named(model, EMBEDDING_NAMES))
    gen = torch.Generator(device="cpu").manual_seed(seed + 2)
    ids = torch.randint(0, emb.shape[0], (tokens,), generator=gen).to(emb.device)
    with torch.no_grad():
        x = emb[ids].float()
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        tops = []
        for name, _, w in _matrices_named(model, ROUTER_NAMES):
            if w.shape[0] != num_experts:
                continue
            norm = _input_norm(model, name)
            xn = x * norm.weight.float() if norm is not None else x
            tops.append(torch.topk(xn @ w.float().T, top_k, dim=1).indices.cpu().numpy())
    return summarize_routing(tops, num_experts, top_k)


def register(hf_cfg: dict, seed: int = 0, skew: float = 0.0, report: str | None = None) -> str:
    """Register vLLM's ``dummy_routed`` load format for the model of config.json ``hf_cfg``
    (needs vLLM; before the engine starts: its processes are forked from this one) and return
    its name. ``skew``: the routers' Zipf exponent (module docstring; 0 = uniform). ``report``:
    a path stem under which each engine process writes `routing_at_load` as
    ``<report>.<pid>.json``."""
    import json
    import os

    num_experts, top_k = num_experts_of(hf_cfg), top_k_of(hf_cfg)
    # calibrated (and a router that cannot be skewed refused) before vLLM is imported and forks
    plan = skew_plan(hf_cfg, skew, seed) if skew else None

    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(LOAD_FORMAT)
    class DummyRoutedLoader(DummyModelLoader):
        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            reinit_routers(model, num_experts, seed, skew=plan)
            spread_embeddings(model, seed, skew=plan)
            if report is not None:
                seen = routing_at_load(model, num_experts, top_k, seed=seed)
                with open(f"{report}.{os.getpid()}.json", "w") as f:
                    json.dump(seen, f)

    return LOAD_FORMAT


__all__ = [
    "reinit_routers", "spread_embeddings", "register", "num_experts_of", "routing_at_load",
    "LOAD_FORMAT",
]  # fmt: skip
