"""Autograd for the routed experts: `tessera::moe_experts` and the grouped GEMMs of its backward pass.

The forward pass keeps only its inputs. The backward pass recomputes the
gate/up pre-activations (one grouped GEMM) rather than storing them, and
runs every product as a grouped GEMM over the same aligned rows:

    dy_r     = grad_out[token of row r]                       (permute)
    d weight = sum_h dy_r * (h_r @ W2[e]^T)                   (the unweighted down output, recomputed)
    g_r      = weight_r * dy_r
    dW2[e]   = sum over e's rows of g_r^T h_r                  (weight_grad_kernel)
    dh_r     = g_r @ W2[e]                                     (grouped_gemm_kernel, B not transposed)
    dpre_r   = [dh * up * act'(gate), dh * act(gate)]          (interleaved, like w13's rows)
    dW13[e]  = sum over e's rows of dpre_r^T xs_r
    dxs_r    = dpre_r @ W13[e];  dx[t] = sum of t's pairs' dxs

The elementwise steps are torch; the GEMMs are Tessera kernels, as the
ops `tessera::moe_grouped_gemm` and `tessera::moe_weight_grad` (float32
results).
"""

from __future__ import annotations

import math

import torch

import tessera

from .common import kernel_arg
from .experts import grouped_gemm_kernel, weight_grad_kernel
from .mlp import forward, permute, pipelining, tiles

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@torch.library.custom_op("tessera::moe_grouped_gemm", mutates_args=())
def grouped_gemm(a: torch.Tensor, b: torch.Tensor, block_expert: torch.Tensor, offsets: torch.Tensor,
                 block_m: int, trans_b: bool) -> torch.Tensor:
    """C[r] = A[r] @ op(B[e]) over aligned rows (e: the row's block's expert), in float32: B is [E, N, K]
    read transposed (trans_b) or [E, K, N]. Rows past the ones in use are zeros."""
    rows, K = a.shape
    E = b.shape[0]
    N = b.shape[1] if trans_b else b.shape[2]
    c = torch.empty((rows, N), dtype=torch.float32, device=a.device)
    t = tiles(block_m, a).down
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(N, t.BN))
    a, b = a.contiguous(), b.contiguous()
    grouped_gemm_kernel[grid](*(kernel_arg(x) for x in (a, b, c, block_expert, offsets)),
                              rows, N, K, E, E * b.shape[1], TRANS_B=trans_b, BM=block_m, BN=t.BN, BK=t.BK,
                              **pipelining(t, (N, K), min(a.element_size(), b.element_size()) * 8, a, b),
                              num_warps=t.num_warps)
    return c


@grouped_gemm.register_fake
def _grouped_gemm_fake(a, b, block_expert, offsets, block_m, trans_b):
    return a.new_empty((a.shape[0], b.shape[1] if trans_b else b.shape[2]), dtype=torch.float32)


@torch.library.custom_op("tessera::moe_weight_grad", mutates_args=())
def weight_grad(g: torch.Tensor, a: torch.Tensor, offsets: torch.Tensor, block_m: int) -> torch.Tensor:
    """dW[e] = G[e's rows]^T @ A[e's rows], [E, N, K] in float32 (G: [rows, N], A: [rows, K] aligned)."""
    rows, N = g.shape
    K, E = a.shape[1], offsets.shape[0] - 1
    dw = torch.empty((E, N, K), dtype=torch.float32, device=g.device)
    t = tiles(block_m, g).gate_up
    reduce_rows = min(block_m, t.BK)
    grid = (E, tessera.cdiv(N, t.BN), tessera.cdiv(K, t.BK))
    g, a = g.contiguous(), a.contiguous()
    weight_grad_kernel[grid](*(kernel_arg(x) for x in (g, a, dw, offsets)), rows, N, K,
                             E, BN=t.BN, BK=t.BK, BR=reduce_rows, num_warps=t.num_warps,
                             **pipelining(t, (N, K), min(g.element_size(), a.element_size()) * 8, g, a))
    return dw


@weight_grad.register_fake
def _weight_grad_fake(g, a, offsets, block_m):
    return g.new_empty((offsets.shape[0] - 1, g.shape[1], a.shape[1]), dtype=torch.float32)


@torch.library.custom_op("tessera::moe_experts", mutates_args=())
def experts_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
               sorted_ids: torch.Tensor, block_expert: torch.Tensor, offsets: torch.Tensor, block_m: int,
               activation: str, atomic: bool) -> torch.Tensor:
    """`torch.ops.tessera.moe_experts`: `mlp.experts` after alignment."""
    return forward(x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m, activation, atomic)


@experts_op.register_fake
def _experts_fake(x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m, activation, atomic):
    return x.new_empty((x.shape[0], w2.shape[1]))


def _activation(gate: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """act(gate) and act'(gate), in float32."""
    if kind == "silu":
        s = torch.sigmoid(gate)
        return gate * s, s * (1.0 + gate * (1.0 - s))
    t = torch.tanh(SQRT_2_OVER_PI * (gate + 0.044715 * gate ** 3))
    grad = 0.5 * (1.0 + t) + 0.5 * gate * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * gate * gate)
    return 0.5 * gate * (1.0 + t), grad


def _setup_context(ctx, inputs, output):
    x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m, activation, atomic = inputs
    ctx.block_m, ctx.activation = block_m, activation
    ctx.save_for_backward(x, w13, w2, weights, sorted_ids, block_expert, offsets)


def expert_grads(x, weights, sorted_ids, block_expert, offsets, block_m: int, activation: str, grad_out, gemm13,
                 gemm2, needs: tuple[bool, bool, bool, bool]):
    """(d_x, d_w13, d_w2, d_weights) as float32/x's dtype (None where `needs`, in that order, is False).
    `gemm13(a, trans)` is a @ W13[e]^T (trans) or a @ W13[e] over the aligned rows, float32; `gemm2` the same
    for W2: the bf16 weights' grouped GEMM, or (quantized_autograd.py) one that dequantizes them per step."""
    need_x, need_w13, need_w2, need_weights = needs
    dtype = x.dtype
    T, K = weights.shape
    rows = sorted_ids.shape[0]
    real = sorted_ids < T * K
    pairs = torch.where(real, sorted_ids, 0).long()
    xs = permute(x, sorted_ids, K, block_m)
    pre = gemm13(xs, True)
    gate, up = pre[:, 0::2], pre[:, 1::2]
    act, act_grad = _activation(gate, activation)
    h = (act * up).to(dtype)
    dy = permute(grad_out.to(dtype).contiguous(), sorted_ids, K, block_m).float()
    d_weights = None
    if need_weights:
        per_row = (dy * gemm2(h, True)).sum(1)
        d_weights = torch.zeros(T * K, dtype=torch.float32, device=x.device).index_put_(
            (pairs[real],), per_row[real]).view(T, K).to(weights.dtype)
    g = (dy * torch.where(real, weights.reshape(-1).float()[pairs], 0.0)[:, None]).to(dtype)
    d_w2 = weight_grad(g, h, offsets, block_m) if need_w2 else None
    if not (need_x or need_w13):
        return None, None, d_w2, d_weights
    d_h = gemm2(g, False)
    d_pre = torch.stack((d_h * up * act_grad, d_h * act), 2).reshape(rows, -1).to(dtype)
    d_w13 = weight_grad(d_pre, xs, offsets, block_m) if need_w13 else None
    d_x = None
    if need_x:
        d_xs = gemm13(d_pre, False)
        per_pair = torch.zeros((T * K, x.shape[1]), dtype=torch.float32, device=x.device)
        d_x = per_pair.index_put_((pairs[real],), d_xs[real]).view(T, K, -1).sum(1).to(dtype)
    return d_x, d_w13, d_w2, d_weights


def _backward(ctx, grad_out):
    x, w13, w2, weights, sorted_ids, block_expert, offsets = ctx.saved_tensors
    bm, need = ctx.block_m, ctx.needs_input_grad
    d_x, d_w13, d_w2, d_weights = expert_grads(
        x, weights, sorted_ids, block_expert, offsets, bm, ctx.activation, grad_out,
        lambda a, trans: grouped_gemm(a, w13, block_expert, offsets, bm, trans),
        lambda a, trans: grouped_gemm(a, w2, block_expert, offsets, bm, trans), (need[0], need[1], need[2], need[3]))
    d_w13 = None if d_w13 is None else d_w13.to(w13.dtype)
    d_w2 = None if d_w2 is None else d_w2.to(w2.dtype)
    return d_x, d_w13, d_w2, d_weights, None, None, None, None, None, None


experts_op.register_autograd(_backward, setup_context=_setup_context)
