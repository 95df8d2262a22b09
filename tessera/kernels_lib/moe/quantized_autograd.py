"""Autograd for the experts with frozen quantized weights (QLoRA-style): gradients in x and the routing weights.

`tessera::moe_experts_quant` runs `quantized_mlp`'s forward and, backward,
the same products as `autograd.py` (recomputed gate/up pre-activations,
dh = g @ W2[e], dx = dpre @ W13[e], the routing weights' gradient from the
unweighted down output), each a grouped GEMM that dequantizes the weight
block by block in registers, as the forward does: the weights are never
expanded to bf16 in memory. dY @ W[e] reads W [N, K] untransposed, so its
K step is a block of BK rows of W (the forward's N) by the output tile's BN
columns (the forward's K, along which the scale groups run): the output
tile must hold whole scale groups or lie inside one, as the forward's K
step must.

The codes, scales and zeros are constants of the layer: asking for their
gradient is an error that names the fix (train bf16 weights, or adapters
next to the frozen ones).
"""

from __future__ import annotations

from typing import Optional

import torch

import tessera

from ..gemm_alignment import state_multiples
from .autograd import expert_grads
from .common import kernel_arg
from .mlp import pipelining, tiles
from .quantized import QuantizedExperts
from .quantized_mlp import CODE_BITS, _check_steps, _check_weight, _weight_args, dequantized_block, forward_quantized, \
    quantized_block_gemm


@tessera.func
def dequantized_gemm(a, w, s, z, pid_m, first_row, pid_n, K, BM, BN, BK, G, FORMAT, ZEROS, STAGES):
    """acc = A[pid_m's BM rows, :K] @ W[first_row : first_row + K, pid_n's BN columns], W dequantized per K step
    (rows of W past this expert's K meet A's columns past K, which read as zeros)."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        wt = dequantized_block(w, s, z, first_row + k * BK, pid_n, BK, BN, G, FORMAT, ZEROS, a.dtype)
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), wt, acc)
    return acc


@tessera.kernel
def grouped_gemm_quant_kernel(a_ptr, w_ptr, s_ptr, z_ptr, c_ptr, block_expert_ptr, offsets_ptr, rows, N, K, E,
                              w_rows, w_cols, s_cols, TRANS_B: tessera.constexpr, FORMAT: tessera.constexpr,
                              G: tessera.constexpr, ZEROS: tessera.constexpr, BM: tessera.constexpr,
                              BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr,
                              ALIGN: tessera.constexpr = (1, 1)):
    """C[r] = A[r] @ op(W[e]) for one BM x BN float32 tile of the aligned rows. W holds E experts' quantized
    [w_rows / E, w_cols] weights as [w_rows, w_cols] codes (scales, zeros [w_rows, s_cols]); TRANS_B: A is
    [rows, K = w_cols], C [rows, N]; else A is [rows, K] and C [rows, N = w_cols] (dY @ W). ALIGN: what K and
    w_cols are multiples of (`mlp.pipelining`)."""
    state_multiples((K, w_cols), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    c = tessera.view(c_ptr, (rows, N)).block((BM, BN), (pid_m, pid_n))
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        c.store(tessera.zeros((BM, BN), dtype=tessera.f32))
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    a = tessera.view(a_ptr, (rows, K))
    w, s, z = (tessera.view(w_ptr, (w_rows, w_cols)), tessera.view(s_ptr, (w_rows, s_cols)),
               tessera.view(z_ptr, (w_rows, s_cols)))
    if TRANS_B:
        acc = quantized_block_gemm(a, w, s, z, pid_m, expert * N + pid_n * BN, K, BM, BN, BK, G, FORMAT, ZEROS,
                                   STAGES)
    else:
        acc = dequantized_gemm(a, w, s, z, pid_m, expert * K, pid_n, K, BM, BN, BK, G, FORMAT, ZEROS, STAGES)
    c.store(acc)


@torch.library.custom_op("tessera::moe_grouped_gemm_quant", mutates_args=())
def grouped_gemm_quant(a: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                       block_expert: torch.Tensor, offsets: torch.Tensor, block_m: int, trans_b: bool, format: str,
                       group_size: int) -> torch.Tensor:
    """C[r] = A[r] @ W[e]^T (trans_b) or A[r] @ W[e] over aligned rows, float32, with W [E, N, K] quantized
    (codes as uint8 bits, like `moe_gate_up_quant`'s)."""
    E, N, K = _check_weight("moe_grouped_gemm_quant", qweight, scales, zeros, format, group_size)
    rows = a.shape[0]
    t = tiles(block_m, a, quantized=True).down
    out_cols = N if trans_b else K
    if trans_b:
        _check_steps("moe_grouped_gemm_quant", format, group_size, K, t.BK)
    else:       # the output tile runs along K, the scale groups' axis
        _check_steps("moe_grouped_gemm_quant", format, group_size, K, t.BN)
    c = torch.empty((rows, out_cols), dtype=torch.float32, device=a.device)
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(out_cols, t.BN))
    a = a.contiguous()
    grouped_gemm_quant_kernel[grid](kernel_arg(a), *_weight_args(qweight, scales, zeros, format),
                                    kernel_arg(c), kernel_arg(block_expert), kernel_arg(offsets), rows, out_cols,
                                    K if trans_b else N, E, E * N, K, scales.shape[2], TRANS_B=trans_b,
                                    FORMAT=format, G=group_size, ZEROS=zeros is not None, BM=block_m, BN=t.BN,
                                    BK=t.BK, num_warps=t.num_warps,
                                    **pipelining(t, (K if trans_b else N, K), CODE_BITS[format], a, qweight))
    return c


@grouped_gemm_quant.register_fake
def _grouped_gemm_quant_fake(a, qweight, scales, zeros, block_expert, offsets, block_m, trans_b, format, group_size):
    E, N, K = _check_weight("moe_grouped_gemm_quant", qweight, scales, zeros, format, group_size)
    return a.new_empty((a.shape[0], N if trans_b else K), dtype=torch.float32)


@torch.library.custom_op("tessera::moe_experts_quant", mutates_args=())
def experts_quant_op(x: torch.Tensor, q13: torch.Tensor, s13: torch.Tensor, z13: Optional[torch.Tensor], f13: str,
                     g13: int, q2: torch.Tensor, s2: torch.Tensor, z2: Optional[torch.Tensor], f2: str, g2: int,
                     weights: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor,
                     offsets: torch.Tensor, block_m: int, activation: str, atomic: bool) -> torch.Tensor:
    """`torch.ops.tessera.moe_experts_quant`: `mlp.experts` with quantized w13 (codes q13 as uint8 bits, scales
    s13, zeros z13, format f13, group size g13) and w2, after alignment; differentiable in x and weights."""
    w13, w2 = QuantizedExperts(q13, s13, z13, f13, g13), QuantizedExperts(q2, s2, z2, f2, g2)
    return forward_quantized(x, w13, w2, weights, sorted_ids, block_expert, offsets, block_m, activation, atomic)


@experts_quant_op.register_fake
def _experts_quant_fake(x, q13, s13, z13, f13, g13, q2, s2, z2, f2, g2, weights, sorted_ids, block_expert, offsets,
                        block_m, activation, atomic):
    return x.new_empty((x.shape[0], q2.shape[1]))


def frozen_weights_error(name: str) -> ValueError:
    """What asking for a quantized weight's gradient raises."""
    return ValueError(f"tessera::{name}: the codes, scales and zeros of quantized experts are frozen: the backward "
                      f"differentiates x and the routing weights only (QLoRA-style fine-tuning). Call "
                      f".requires_grad_(False) on them (or .detach()), or train bf16 expert weights (MoELayer before "
                      f"quantize_experts) and quantize after")


def _setup_context(ctx, inputs, output):
    x, q13, s13, z13, f13, g13, q2, s2, z2, f2, g2, weights, sorted_ids, block_expert, offsets, block_m, \
        activation, atomic = inputs
    ctx.formats, ctx.block_m, ctx.activation = (f13, g13, f2, g2), block_m, activation
    ctx.save_for_backward(x, q13, s13, z13, q2, s2, z2, weights, sorted_ids, block_expert, offsets)


def _backward(ctx, grad_out):
    if any(ctx.needs_input_grad[i] for i in (1, 2, 3, 6, 7, 8)):
        raise frozen_weights_error("moe_experts_quant")
    x, q13, s13, z13, q2, s2, z2, weights, sorted_ids, block_expert, offsets = ctx.saved_tensors
    (f13, g13, f2, g2), bm = ctx.formats, ctx.block_m

    def gemm(q, s, z, f, g):
        return lambda a, trans: grouped_gemm_quant(a, q, s, z, block_expert, offsets, bm, trans, f, g)

    need = ctx.needs_input_grad
    d_x, _, _, d_weights = expert_grads(x, weights, sorted_ids, block_expert, offsets, bm, ctx.activation,
                                        grad_out, gemm(q13, s13, z13, f13, g13), gemm(q2, s2, z2, f2, g2),
                                        (need[0], False, False, need[11]))
    return (d_x,) + (None,) * 10 + (d_weights,) + (None,) * 6


experts_quant_op.register_autograd(_backward, setup_context=_setup_context)


def experts_quant(x, w13: QuantizedExperts, w2: QuantizedExperts, weights, sorted_ids, block_expert, offsets,
                  block_m: int, activation: str, atomic: bool) -> torch.Tensor:
    """`forward_quantized` as the differentiable op: what `mlp.experts` runs for quantized weights."""
    if any(t is not None and t.requires_grad for w in (w13, w2) for t in (w.qweight, w.scales, w.zeros)):
        raise frozen_weights_error("moe")
    return experts_quant_op(x, w13.qweight.view(torch.uint8), w13.scales, w13.zeros, w13.format, w13.group_size,
                            w2.qweight.view(torch.uint8), w2.scales, w2.zeros, w2.format, w2.group_size, weights,
                            sorted_ids, block_expert, offsets, block_m, activation, atomic)
