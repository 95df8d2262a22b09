"""tessera.kernels_lib.moe on an NVIDIA GPU (marked `gpu`): every shipped plan of the expert GEMMs, the layer
of each model family, and the backward pass, against the same computation in float32 torch.

Specification: at token counts that pick the decode, middle and prefill plans (16-, 64- and 128-row tiles),
`experts` in bfloat16 matches a float32 loop over the experts to bfloat16 precision, with the deterministic
and the atomic top-k sum; routing on the GPU chooses what the CPU interpreter chooses; a DeepSeek-V3-style
layer's forward and its gradients match float32 torch; the one-launch layer (`persistent.py`) equals the
multi-kernel path.
"""

from __future__ import annotations

import pytest
import torch

from tessera.kernels_lib.moe import MoELayer, experts, interleave_gate_up, plan, route

pytestmark = pytest.mark.gpu


def _loop(x, w13_cat, w2, weights, ids):
    """The float32 reference: each token's experts, one at a time."""
    I = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13_cat.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x[token].float() @ w13_cat[e].float().t()
        y = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ w2[e].float().t()
        out.index_add_(0, token, y * weights[token, slot, None])
    return out


def _close(got, expected):
    err = (got.float() - expected).abs().max().item()
    assert err <= 2e-2 * expected.abs().max().item(), f"max error {err} vs max |y| {expected.abs().max()}"


@pytest.mark.parametrize("tokens, expected_bm", [(3, 16), (100, 64), (700, 128)])
@pytest.mark.parametrize("atomic", [False, True])
def test_every_plan_matches_float32(tokens, expected_bm, atomic):
    H, I, E, K = 512, 384, 8, 2
    assert plan.plan(tokens, K, E).BM == expected_bm
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    w1, w3 = (torch.randn(E, I, H, device="cuda", generator=g).bfloat16() * H ** -0.5 for _ in range(2))
    w2 = torch.randn(E, H, I, device="cuda", generator=g).bfloat16() * I ** -0.5
    weights, ids, counts, chunk_counts = route(torch.randn(tokens, E, device="cuda", generator=g), K)
    out = experts(x, interleave_gate_up(w1, w3), w2, weights, ids, atomic=atomic, counts=counts,
                  chunk_counts=chunk_counts)
    _close(out, _loop(x, torch.cat([w1, w3], 1), w2, weights, ids))


@pytest.mark.parametrize("tokens", [1, 3, 100, 700])
@pytest.mark.parametrize("atomic", [False, True])
def test_the_one_launch_layer_matches_the_multi_kernel_path(tokens, atomic):
    """The persistent kernel (routing to combine in one launch, programs spinning on each other's counters) on
    the device: the multi-kernel path's result and the same routing."""
    from tessera.kernels_lib.moe.persistent import moe_layer
    H, I, E, K = 512, 384, 16, 4
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, H, device="cuda", generator=g).bfloat16()
    w13 = torch.randn(E, 2 * I, H, device="cuda", generator=g).bfloat16() * H ** -0.5
    w2 = torch.randn(E, H, I, device="cuda", generator=g).bfloat16() * I ** -0.5
    logits = torch.randn(tokens, E, device="cuda", generator=g)
    weights, ids, counts, chunk_counts = route(logits, K)
    expected = experts(x, w13, w2, weights, ids, atomic=atomic, counts=counts, chunk_counts=chunk_counts)
    out, got_weights, got_ids, got_counts = moe_layer(x, w13, w2, logits, K, atomic=atomic)
    torch.cuda.synchronize()
    assert torch.equal(got_ids, ids) and torch.equal(got_counts, counts)
    _close(out, expected.float())       # the same tiles, so equal up to how the compiler schedules them


def test_grouped_routing_on_the_gpu_chooses_what_the_interpreter_chooses():
    logits, bias = torch.randn(300, 256), torch.randn(256) * 0.1
    options = dict(scoring="sigmoid", bias=bias, n_group=8, topk_group=4, scaling_factor=2.5)
    cpu = route(logits, 8, **options)
    gpu = route(logits.cuda(), 8, **{**options, "bias": bias.cuda()})
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)


def test_a_deepseek_style_layer_trains_like_float32_torch():
    H, I, E, K = 256, 128, 16, 4
    layer = MoELayer(H, I, E, K, scoring="sigmoid", n_group=4, topk_group=2, scaling_factor=2.5,
                     correction_bias=True, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(40, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, routing = layer(x, return_routing=True)
    out.float().square().sum().backward()

    x32 = x.detach().float().requires_grad_()
    w13 = layer.w13.detach().float().requires_grad_()
    w2 = layer.w2.detach().float().requires_grad_()
    weights = (x32 @ layer.gate.weight.detach().float().t()).sigmoid().gather(1, routing.ids.long())
    weights = weights / weights.sum(1, keepdim=True) * 2.5            # the router's gradient path too
    w13_cat = torch.cat([w13[:, 0::2], w13[:, 1::2]], 1)
    _loop(x32, w13_cat, w2, weights, routing.ids).square().sum().backward()
    _close(out, _loop(x32.detach(), w13_cat.detach(), w2.detach(), weights.detach(), routing.ids))
    for got, expected in ((x.grad, x32.grad), (layer.w13.grad, w13.grad), (layer.w2.grad, w2.grad)):
        _close(got, expected)
