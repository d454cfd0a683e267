"""Token-dependent routers on dummy weights (`profiles.dummy_routing`): the re-draw on modules
named as vLLM names them (needs torch: CI installs its CPU build; skipped where it is absent),
and the expert counts read from the catalog's configs."""

from __future__ import annotations

import pytest

from profiles.dummy_routing import num_experts_of
from profiles.hf_config import hf_config
from simulator.models import load_model


@pytest.mark.parametrize(
    "model, experts",
    [("qwen3-30b-a3b", 128), ("mixtral-8x7b", 8), ("deepseek-v3", 256), ("gpt-oss-120b", 128),
     ("deepseek-v2-lite", 64)],
)  # fmt: skip
def test_expert_counts_come_from_each_familys_config_field(model, experts):
    assert num_experts_of(hf_config(load_model(model, "t", "model"))) == experts
    with pytest.raises(ValueError, match="expert count"):
        num_experts_of(hf_config(load_model("llama-3-8b", "t", "model")))


H, E, K = 256, 32, 4


def _toy(torch, router="gate", bias=True):
    """Two decoder layers named as vLLM's: a dummy-valued post-attention norm, a router of E
    experts with a dummy bias (as gpt-oss's) and a dense projection that is not a router."""
    nn = torch.nn
    layers = nn.ModuleList()
    for _ in range(2):
        layer = nn.Module()
        layer.post_attention_layernorm = nn.Module()
        layer.post_attention_layernorm.weight = nn.Parameter(torch.empty(H).uniform_(-1e-3, 1e-3))
        layer.mlp = nn.Module()
        gate = nn.Linear(H, E, bias=bias)
        nn.init.uniform_(gate.weight, -1e-3, 1e-3)
        if bias:
            nn.init.uniform_(gate.bias, -1e-3, 1e-3)
        setattr(layer.mlp, router, gate)
        layer.mlp.gate_up_proj = nn.Linear(H, 2 * E, bias=False)
        layers.append(layer)
    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = layers
    return model


def _experts_touched(torch, model, router, tokens):
    """Distinct experts the top-K of ``tokens`` normalized hidden states pick in layer 0."""
    layer = model.model.layers[0]
    x = tokens * layer.post_attention_layernorm.weight  # RMSNorm output: O(1) x dummy weight
    with torch.no_grad():
        logits = getattr(layer.mlp, router)(x).to(torch.bfloat16).float()
    return len(set(logits.topk(K, dim=-1).indices.flatten().tolist())), logits


@pytest.mark.parametrize("router", ["gate", "router"])
def test_redrawn_routers_spread_a_batch_that_the_dummy_bias_concentrated(router):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = _toy(torch, router)
    tokens = torch.randn(512, H)
    before, _ = _experts_touched(torch, model, router, tokens)
    assert before <= 2 * K  # the dummy bias outweighs the token-dependent logits
    dense = model.model.layers[0].mlp.gate_up_proj.weight.clone()
    names = __import__("profiles.dummy_routing").dummy_routing.reinit_routers(model, E, seed=3)
    assert names == [f"model.layers.{i}.mlp.{router}" for i in range(2)]
    after, logits = _experts_touched(torch, model, router, tokens)
    assert after == E  # 512 tokens over 32 experts, top-4: every expert
    assert float(logits.std()) == pytest.approx(1.0, rel=0.15)
    assert torch.equal(model.model.layers[0].mlp.gate_up_proj.weight, dense)  # not a router
    assert not getattr(model.model.layers[0].mlp, router).bias.any()


def test_redraw_is_seeded_zeroes_the_correction_bias_and_needs_a_router():
    torch = pytest.importorskip("torch")
    from profiles.dummy_routing import reinit_routers

    models = []
    for _ in range(2):  # two identical dummy models (same norm weights, so the same scale)
        torch.manual_seed(1)
        models.append(_toy(torch, bias=False))
    a, b = models
    for m in (a, b):
        m.model.layers[0].mlp.gate.e_score_correction_bias = torch.nn.Parameter(torch.ones(E))
        reinit_routers(m, E, seed=7)
    ga, gb = a.model.layers[1].mlp.gate.weight, b.model.layers[1].mlp.gate.weight
    assert torch.equal(ga, gb)
    assert not a.model.layers[0].mlp.gate.e_score_correction_bias.any()
    with pytest.raises(ValueError, match="no router with 64 experts"):
        reinit_routers(a, 64)


def _biased_stream(torch, layers=12, tokens=64):
    """A dummy model's residual stream as gpt-oss's: token embeddings, and per layer a router
    reading the normalized stream, then a token-independent bias added (the attention output
    and expert down-projection biases), all dummy-valued (+-1e-3)."""
    nn = torch.nn
    model = nn.Module()
    model.model = nn.Module()
    model.model.embedding = nn.Embedding(1000, H)
    nn.init.uniform_(model.model.embedding.weight, -1e-3, 1e-3)
    model.model.layers = nn.ModuleList()
    for _ in range(layers):
        layer = nn.Module()
        layer.post_attention_layernorm = nn.Module()
        layer.post_attention_layernorm.weight = nn.Parameter(torch.empty(H).uniform_(-1e-3, 1e-3))
        layer.mlp = nn.Module()
        layer.mlp.router = nn.Linear(H, E)
        layer.out_bias = nn.Parameter(torch.empty(H).uniform_(-1e-3, 1e-3))
        model.model.layers.append(layer)
    model.lm_head = nn.Linear(H, 1000, bias=False)
    return model, torch.randint(0, 1000, (tokens,))


def _touched_per_layer(torch, model, ids) -> list[int]:
    with torch.no_grad():
        x = model.model.embedding(ids)
        touched = []
        for layer in model.model.layers:
            xn = x / x.pow(2).mean(-1, keepdim=True).sqrt() * layer.post_attention_layernorm.weight
            top = layer.mlp.router(xn).topk(K, dim=-1).indices
            touched.append(len(set(top.flatten().tolist())))
            x = x + layer.out_bias
    return touched


def test_spread_embeddings_keep_a_biased_stream_token_dependent_in_every_layer():
    """Routers re-drawn alone leave the deep layers concentrated where each layer adds a
    constant bias (what a gpt-oss-20b table showed); with the embedding drawn N(0, 1) every
    layer's top-4 of 64 tokens covers (nearly) all 32 experts, as uniform routing does (32.0)."""
    torch = pytest.importorskip("torch")
    from profiles.dummy_routing import reinit_routers, spread_embeddings

    torch.manual_seed(0)
    model, ids = _biased_stream(torch)
    head = model.lm_head.weight.clone()
    reinit_routers(model, E, seed=1)
    routers_only = _touched_per_layer(torch, model, ids)
    assert max(routers_only[-4:]) <= 24  # the constant part dominates the deep layers
    assert spread_embeddings(model, seed=2) == ["model.embedding"]
    assert float(model.model.embedding.weight.detach().std()) == pytest.approx(1.0, rel=0.05)
    assert torch.equal(model.lm_head.weight, head)  # the LM head is not an embedding
    assert min(_touched_per_layer(torch, model, ids)) >= 30
    with pytest.raises(ValueError, match="no token embedding"):
        spread_embeddings(torch.nn.Linear(4, 4))
