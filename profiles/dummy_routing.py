"""Token-dependent routers for mixture-of-experts models on dummy weights (needs torch).

Why: vLLM's dummy loader draws every weight uniform in +-1e-3. A router's logits are then ~1e-4:
a router bias (gpt-oss) or score-correction bias (DeepSeek-V3) of dummy size outweighs them, and
in bf16 such small logits tie often (top-k then breaks ties by expert index). Decode batches go
to a few experts and run faster than with a trained router: `simulator/latency/routing_check.py`
flags four shipped tables (profiles/README.md, "Dummy-weight routing").

`reinit_routers` gives every router token-dependent logits of about ``logit_std`` (spread
over experts as uniform routing): its weight drawn N(0, s^2) with ``s = logit_std / (sqrt(H) x
rms(norm))``, where ``norm`` is the weight of the RMSNorm that feeds it (the layer's
``post_attention_layernorm``: its normalized input is O(1) a channel, times that dummy weight),
and its bias and score-correction bias set to zero. Only the routers change; every other weight
keeps its dummy value, so every kernel and shape is the same. Seeded: the same model and seed
give the same routers.

`register` makes the loader ``dummy_routed`` (vLLM's dummy load, then `reinit_routers`), which a
job selects with ``"routing": "token_dependent"`` (`profiles.vllm_run`). Status: the function is
tested on CPU on modules named as vLLM names them; the loader has **not yet run on a GPU**
(written 2026-11-26 with no device time left): run a smoke profile (``limit``) first and check
`servesim profile report`'s ``routing_check``.
"""

from __future__ import annotations

import math

#: last name component of a router module in vLLM's MoE models: ``mlp.gate`` (Qwen3-MoE,
#: DeepSeek-V2/V3), ``block_sparse_moe.gate`` (Mixtral), ``mlp.router`` (gpt-oss)
ROUTER_NAMES = ("gate", "router")
#: the RMSNorm whose output a layer's router reads, relative to the layer
ROUTER_INPUT_NORM = "post_attention_layernorm"
LOAD_FORMAT = "dummy_routed"


def reinit_routers(model, num_experts: int, seed: int = 0, logit_std: float = 1.0) -> list[str]:
    """Re-draw every router of ``model`` (a torch module; see the module docstring) and return
    their names. A router is a submodule named ``*.gate`` or ``*.router`` whose 2-D ``weight``
    has ``num_experts`` rows; none found is a ValueError (the caller asked for routers)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    done = []
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if name.rsplit(".", 1)[-1] not in ROUTER_NAMES or w is None or w.dim() != 2:
            continue
        if w.shape[0] != num_experts:
            continue
        scale = logit_std / (math.sqrt(w.shape[1]) * _input_rms(model, name))
        with torch.no_grad():
            draw = torch.randn(tuple(w.shape), generator=gen, dtype=torch.float32) * scale
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


def _input_rms(model, router_name: str) -> float:
    """RMS of the weight of the norm feeding ``router_name`` (its layer's
    ``post_attention_layernorm``), or 1.0 where the model has none there."""
    layer = router_name.rsplit(".", 2)[0]  # model.layers.N.mlp.gate -> model.layers.N
    try:
        norm = model.get_submodule(f"{layer}.{ROUTER_INPUT_NORM}")
    except AttributeError:
        return 1.0
    w = norm.weight.detach().float()
    rms = float(w.pow(2).mean().sqrt())
    return rms if rms > 0 else 1.0


def num_experts_of(hf_cfg: dict) -> int:
    """Routed experts per MoE layer, from a config.json (the field each family names it by)."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(hf_cfg.get(key), int):
            return hf_cfg[key]
    raise ValueError("config.json names no expert count (num_experts, num_local_experts, "
                     "n_routed_experts)")  # fmt: skip


def register(num_experts: int, seed: int = 0) -> str:
    """Register vLLM's ``dummy_routed`` load format (needs vLLM; before the engine starts: its
    processes are forked from this one) and return its name."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(LOAD_FORMAT)
    class DummyRoutedLoader(DummyModelLoader):
        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            reinit_routers(model, num_experts, seed)

    return LOAD_FORMAT


__all__ = ["reinit_routers", "register", "num_experts_of", "LOAD_FORMAT"]
