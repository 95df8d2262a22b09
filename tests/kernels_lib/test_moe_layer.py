"""tessera.kernels_lib.moe.MoELayer and load_balancing_loss.

Specification:

* a layer built from Mixtral-, Qwen3- or DeepSeek-V3-style checkpoint weights computes what the float64
  reference computes from the same weights (routing by the model's rules, the shared experts added);
* in training, gradients reach the router, the experts and the input, as the float64 reference's do;
* load_balancing_loss is E * sum f_i P_i with f from the counts and P the mean probabilities, differentiable
  in the probabilities (the global-batch variant: test_moe_parallel.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import moe_reference as ref
from tessera.kernels_lib.moe import MoELayer, load_balancing_loss

H, I = 24, 16


def _checkpoint(style: str, E: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    names = ("w1", "w3", "w2") if style == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    state = {"gate.weight": torch.randn(E, H, generator=g) / H ** 0.5}
    for i in range(E):
        state[f"experts.{i}.{names[0]}.weight"] = torch.randn(I, H, generator=g) / H ** 0.5
        state[f"experts.{i}.{names[1]}.weight"] = torch.randn(I, H, generator=g) / H ** 0.5
        state[f"experts.{i}.{names[2]}.weight"] = torch.randn(H, I, generator=g) / I ** 0.5
    if style == "deepseek_v3":
        state["gate.e_score_correction_bias"] = torch.randn(E, generator=g) * 0.1
        state["shared_experts.0.weight"] = torch.randn(I, H, generator=g)
        state["shared_experts.2.weight"] = torch.randn(H, I, generator=g)
    return state


def _reference(layer: MoELayer, x: torch.Tensor) -> np.ndarray:
    r = layer.routing
    logits = ref.as64(x) @ ref.as64(layer.gate.weight).T
    bias = None if layer.e_score_correction_bias is None else ref.as64(layer.e_score_correction_bias)
    weights, ids = ref.route(logits, layer.top_k, r["scoring"], bias, r["n_group"], r["topk_group"],
                             r["renormalize"], r["scaling_factor"])
    w13 = torch.cat([layer.w13[:, 0::2], layer.w13[:, 1::2]], 1)
    out = ref.experts(ref.as64(x), ref.as64(w13), ref.as64(layer.w2), weights, ids, layer.activation)
    if layer.shared_experts is not None:
        out = out + layer.shared_experts.double()(x.double()).detach().numpy()
    return out


@pytest.mark.parametrize("style, E, top_k, options", [
    ("mixtral", 8, 2, {}),
    ("qwen3", 16, 8, {}),
    ("deepseek_v3", 16, 4, dict(n_group=4, topk_group=2)),
])
def test_layers_from_checkpoints_match_the_reference(style, E, top_k, options):
    shared = nn.Sequential(nn.Linear(H, I, bias=False), nn.SiLU(), nn.Linear(I, H, bias=False)) \
        if style == "deepseek_v3" else None
    layer = MoELayer.from_state_dict(_checkpoint(style, E), style, top_k, shared_experts=shared, **options)
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
    assert out.shape == x.shape
    np.testing.assert_allclose(out.reshape(10, H).numpy(), _reference(layer, x.reshape(10, H)), rtol=1e-4,
                               atol=1e-5)


def test_training_reaches_the_router_experts_and_input():
    layer = MoELayer.from_state_dict(_checkpoint("mixtral", 6, seed=2), "mixtral", 2)
    twin = MoELayer.from_state_dict(_checkpoint("mixtral", 6, seed=2), "mixtral", 2).double()
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(3))
    ours, theirs = x.clone().requires_grad_(), x.double().requires_grad_()
    out, routing = layer(ours, return_routing=True)
    loss = out.square().sum() + 0.1 * load_balancing_loss(routing.probs, routing.ids, 6)
    loss.backward()

    logits = theirs @ twin.gate.weight.T
    probs = logits.softmax(-1)
    weights = probs.gather(1, routing.ids.long())
    weights = weights / weights.sum(1, keepdim=True)
    w13 = twin.w13
    out64 = torch.zeros_like(theirs)
    for t in range(7):
        for j in range(2):
            e = int(routing.ids[t, j])
            h = w13[e] @ theirs[t]
            out64[t] = out64[t] + weights[t, j] * (twin.w2[e] @ (nn.functional.silu(h[0::2]) * h[1::2]))
    f = torch.bincount(routing.ids.reshape(-1).long(), minlength=6).double() / 14
    (out64.square().sum() + 0.1 * 6 * (f * probs.mean(0)).sum()).backward()
    for a, b in ((ours.grad, theirs.grad), (layer.gate.weight.grad, twin.gate.weight.grad),
                 (layer.w13.grad, twin.w13.grad), (layer.w2.grad, twin.w2.grad)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_load_balancing_loss_is_smallest_when_balanced_and_differentiable_in_the_probabilities():
    E = 4
    uniform = torch.full((8, E), 0.25, requires_grad=True)
    balanced = torch.tensor([[0, 1], [2, 3]] * 4)
    loss = load_balancing_loss(uniform, balanced, E)
    assert torch.isclose(loss, torch.tensor(1.0))
    loss.backward()
    np.testing.assert_allclose(uniform.grad.numpy(), np.full((8, E), E * 0.25 / 8))
    skewed = torch.tensor([[0, 1]] * 8)
    probs = torch.tensor([[0.7, 0.2, 0.05, 0.05]] * 8)
    assert torch.isclose(load_balancing_loss(probs, skewed, E), torch.tensor(E * (0.5 * 0.7 + 0.5 * 0.2)))
    assert torch.equal(load_balancing_loss(probs, skewed, E, counts=torch.tensor([8, 8, 0, 0])),
                       load_balancing_loss(probs, skewed, E))


@pytest.mark.parametrize("call, message", [
    (lambda: load_balancing_loss(torch.rand(4, 5), torch.zeros(4, 2), 4), r"router_probs must be \[tokens, 4\]"),
    (lambda: load_balancing_loss(torch.rand(4, 4), torch.zeros(3, 2), 4), r"expert_ids must be \[4, top_k\]"),
    (lambda: load_balancing_loss(torch.rand(4, 4), torch.zeros(4, 2), 4, group=object()), "init_process_group"),
    (lambda: MoELayer.from_state_dict({}, "llama", 2), "style must be one of"),
])
def test_bad_arguments_name_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()
