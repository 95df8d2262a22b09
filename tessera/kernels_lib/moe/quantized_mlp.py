"""The expert MLPs with quantized weights (`quantized.QuantizedExperts`): gate+up and down as grouped GEMMs.

The same aligned rows, launches and epilogues as `experts.py` and `mlp.py`
(gate+up with SiLU/GELU-and-mul, down with the routing weights and the
top-k sum); only B changes. Each K step loads the expert's BN x BK block
of codes (int4: each thread's 128 bits of a row's u4 stream in one load,
unpacked in registers by the low-bit pass; fp8: e4m3 bytes), dequantizes
it in registers with the block's scales (and zeros) into the activations'
dtype, and multiplies it on the tensor cores (mma.sync; wgmma on sm_90a,
which reads A from the TMA-filled ring and B from registers). The weights
are the [E * N, K] matrix of all experts' rows, so that a block's row
offset (expert * N + column) picks the expert, as in `experts.py`.
The dequantized block reaches shared memory in 16-byte stores (N x K for
mma.sync, K-major for wgmma); codes and scales are loaded a K step ahead
(`quantized_block_gemm`), since no ring prefetches a load that feeds a cast.

These ops are the forward pass; `quantized_autograd.py` wraps them in a
differentiable op (gradients in x and the routing weights, the quantized
weights frozen).
"""

from __future__ import annotations

from typing import Optional

import torch

import tessera

from ..gemm_alignment import state_multiples
from .common import FLOAT_DTYPES, check_device, kernel_arg
from .experts import activate, weighted_rows_out
from .mlp import ACTIVATIONS, _check_rows, combine, permute, pipelining, tiles
from .quantized import QuantizedExperts

_CODE_TYPES = {"int4": tessera.u4, "fp8": tessera.f8e4m3}
CODE_BITS = {"int4": 4, "fp8": 8}      # the narrowest operand of the GEMMs (`mlp.pipelining`)


@tessera.func
def dequantized(codes, scale, zero, BN, BK, G, FORMAT, ZEROS, DTYPE):
    """A BN x BK block of codes as DTYPE, with its scales (and zeros) [BN, groups in the block]: int4
    (q - zero) * scale with a scale per group of G along K; fp8 q * scale with one scale per row for the step
    (BK divides G). Scales are rounded to DTYPE: exact enough in bf16 (float32's range); in float16 a scale
    under 2^-14 is subnormal and keeps fewer bits."""
    if FORMAT == "fp8":
        return codes.to(DTYPE) * scale.to(DTYPE)           # e4m3 values are exact in bf16 and float16
    GB = max(BK // G, 1)                                   # groups in the block
    values = tessera.reshape(codes.to(DTYPE), (BN, GB, BK // GB))
    if ZEROS:
        values = values - tessera.expand_dims(zero.to(DTYPE), 2)
    else:
        values = values - 8.0                              # symmetric 4-bit codes: zero point 2^3
    return tessera.reshape(values * tessera.expand_dims(scale.to(DTYPE), 2), (BN, BK))


@tessera.func
def dequantized_block(w, s, z, n_offset, k, BN, BK, G, FORMAT, ZEROS, DTYPE):
    """The BN x BK block of W [E * N, K] at rows n_offset.., K step k, as DTYPE (`dequantized`)."""
    groups = (n_offset, k * BK // G)
    scale = s.block((BN, max(BK // G, 1)), offsets=groups).load()
    zero = z.block((BN, max(BK // G, 1)), offsets=groups).load() if ZEROS else scale
    return dequantized(w.block((BN, BK), offsets=(n_offset, k * BK)).load(), scale, zero, BN, BK, G, FORMAT, ZEROS,
                       DTYPE)


@tessera.func
def quantized_block_gemm(a, w, s, z, pid_m, n_offset, K, BM, BN, BK, G, FORMAT, ZEROS, STAGES):
    """acc = A[pid_m's BM rows, :] @ W[n_offset : n_offset + BN, :]^T over all of K, W dequantized per step.

    The codes feed a cast, not the dot, so no ring prefetches them (`pipeline_plan`): step k + 1's codes,
    scales and zeros are loaded while step k's are converted and multiplied, so their DRAM latency hides
    behind a step's work (each step waited for its own on main: one exposed latency per K step, with 1-4
    programs per SM to hide it). The low-bit pass carries the int4 codes as packed bytes
    (`low_bit.carried_to_casts`). Past the last step the blocks read nothing."""
    GB = max(BK // G, 1)                                   # scale columns per step
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    codes = w.block((BN, BK), offsets=(n_offset, 0)).load()
    scale = s.block((BN, GB), offsets=(n_offset, 0)).load()
    zero = z.block((BN, GB), offsets=(n_offset, 0)).load() if ZEROS else scale
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        step = (n_offset, (k + 1) * BK // G)
        codes_ahead = w.block((BN, BK), offsets=(n_offset, (k + 1) * BK)).load()
        scale_ahead = s.block((BN, GB), offsets=step).load()
        zero_ahead = z.block((BN, GB), offsets=step).load() if ZEROS else scale_ahead
        wt = dequantized(codes, scale, zero, BN, BK, G, FORMAT, ZEROS, a.dtype)
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), wt.T, acc)
        codes, scale, zero = codes_ahead, scale_ahead, zero_ahead
    return acc


@tessera.kernel
def gate_up_quant_kernel(xs_ptr, w13_ptr, s_ptr, z_ptr, h_ptr, block_expert_ptr, offsets_ptr, rows, H, I, E,
                         two_i_e, s_cols, FORMAT: tessera.constexpr, G: tessera.constexpr,
                         ZEROS: tessera.constexpr, ACTIVATION: tessera.constexpr, BM: tessera.constexpr,
                         BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr,
                         ALIGN: tessera.constexpr = (1, 1)):
    """`gate_up_kernel` with quantized w13 [E * 2I, H] (interleaved rows; scales and zeros [E * 2I, s_cols])."""
    state_multiples((H, I), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    h = tessera.view(h_ptr, (rows, I)).block((BM, BN), (pid_m, pid_n))
    if pid_m * BM >= tessera.load(offsets_ptr + E):         # past the rows in use: zeros, no weights read
        h.store(tessera.zeros((BM, BN), dtype=tessera.f32))
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    w, s, z = (tessera.view(w13_ptr, (two_i_e, H)), tessera.view(s_ptr, (two_i_e, s_cols)),
               tessera.view(z_ptr, (two_i_e, s_cols)))
    acc = quantized_block_gemm(tessera.view(xs_ptr, (rows, H)), w, s, z, pid_m, expert * 2 * I + pid_n * 2 * BN,
                               H, BM, 2 * BN, BK, G, FORMAT, ZEROS, STAGES)
    gate, up = tessera.split(tessera.reshape(acc, (BM, BN, 2)))     # interleaved columns: gate, up, gate, ...
    h.store(activate(gate, ACTIVATION) * up)


@tessera.kernel
def down_quant_kernel(h_ptr, w2_ptr, s_ptr, z_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr,
                      offsets_ptr, rows, H, I, E, h_e, s_cols, numel, FORMAT: tessera.constexpr,
                      G: tessera.constexpr, ZEROS: tessera.constexpr, TOP_K: tessera.constexpr,
                      ATOMIC: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                      BK: tessera.constexpr, STAGES: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    """`down_kernel` with quantized w2 [E * H, I] (scales and zeros [E * H, s_cols])."""
    state_multiples((H, I), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    w, s, z = (tessera.view(w2_ptr, (h_e, I)), tessera.view(s_ptr, (h_e, s_cols)), tessera.view(z_ptr, (h_e, s_cols)))
    acc = quantized_block_gemm(tessera.view(h_ptr, (rows, I)), w, s, z, pid_m, expert * H + pid_n * BN, I, BM, BN,
                               BK, G, FORMAT, ZEROS, STAGES)
    weighted_rows_out(acc, out_ptr, weights_ptr, sorted_ids_ptr, pid_m, pid_n, rows, H, numel, TOP_K, ATOMIC, BM, BN)


# ---------------------------------------------------------------------------
# The ops


def _weight_args(qweight: torch.Tensor, scales: torch.Tensor, zeros, format: str):
    """Codes (as u4 or e4m3), scales and zeros (scales again when there are none: never read) as kernel args."""
    codes = kernel_arg(qweight.contiguous(), _CODE_TYPES[format])
    return codes, kernel_arg(scales.contiguous()), kernel_arg((zeros if zeros is not None else scales).contiguous())


def _check_weight(name: str, qweight, scales, zeros, format: str, group_size: int) -> tuple[int, int, int]:
    """[E, N, K] of a quantized weight, or a ValueError naming the fix."""
    if format not in _CODE_TYPES:
        raise ValueError(f"tessera::{name}: format must be one of {tuple(_CODE_TYPES)}, got {format!r}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 3:
        raise ValueError(f"tessera::{name}: codes must be uint8 [E, N, K{' / 2' * (format == 'int4')}] (fp8: "
                         f"QuantizedExperts.qweight.view(torch.uint8)), got {qweight.dtype} {tuple(qweight.shape)}")
    E, N, k = qweight.shape
    K = 2 * k if format == "int4" else k
    columns = K // group_size if format == "int4" else -(-K // group_size)
    if tuple(scales.shape) != (E, N, columns) or (zeros is not None and zeros.shape != scales.shape):
        raise ValueError(f"tessera::{name}: scales (and zeros) must be [E, N, {columns}] for groups of "
                         f"{group_size} along K = {K}, got {tuple(scales.shape)}")
    return E, N, K


def _check_steps(name: str, format: str, group_size: int, K: int, BK: int) -> None:
    """A K step of BK must hold whole scale groups, or lie inside one (fp8: one scale column per step)."""
    whole = group_size % BK == 0 or group_size >= K or (format == "int4" and BK % group_size == 0)
    if not whole:
        raise ValueError(f"tessera::{name}: groups of {group_size} along K = {K} do not fit the GEMM's K steps of "
                         f"{BK}; quantize with a group (fp8: block) size that is a multiple of {BK}")


@torch.library.custom_op("tessera::moe_gate_up_quant", mutates_args=())
def gate_up_quant(xs: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                  block_expert: torch.Tensor, offsets: torch.Tensor, activation: str, block_m: int, format: str,
                  group_size: int) -> torch.Tensor:
    """`moe_gate_up` with a quantized w13 (`quantized.interleave` of the quantized gate and up weights); the
    codes as uint8 bits for both formats (torch's CPU kernels, which opcheck runs, lack float8 arithmetic)."""
    E, two_i, H = _check_weight("moe_gate_up_quant", qweight, scales, zeros, format, group_size)
    rows = xs.shape[0]
    h = torch.empty((rows, two_i // 2), dtype=xs.dtype, device=xs.device)
    t = tiles(block_m, xs, quantized=True).gate_up
    _check_steps("moe_gate_up_quant", format, group_size, H, t.BK)
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(two_i // 2, t.BN))
    gate_up_quant_kernel[grid](kernel_arg(xs), *_weight_args(qweight, scales, zeros, format), kernel_arg(h),
                               kernel_arg(block_expert), kernel_arg(offsets), rows, H, two_i // 2, E, E * two_i,
                               scales.shape[2], FORMAT=format, G=group_size, ZEROS=zeros is not None,
                               ACTIVATION=activation, BM=block_m, BN=t.BN, BK=t.BK, num_warps=t.num_warps,
                               **pipelining(t, (H, two_i // 2), CODE_BITS[format], xs, qweight))
    return h


@gate_up_quant.register_fake
def _gate_up_quant_fake(xs, qweight, scales, zeros, block_expert, offsets, activation, block_m, format, group_size):
    _check_weight("moe_gate_up_quant", qweight, scales, zeros, format, group_size)
    return xs.new_empty((xs.shape[0], qweight.shape[1] // 2))


@torch.library.custom_op("tessera::moe_down_quant", mutates_args=())
def down_quant(h: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
               weights: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor, offsets: torch.Tensor,
               block_m: int, atomic: bool, format: str, group_size: int) -> torch.Tensor:
    """`moe_down` with a quantized w2 [E, H, I]."""
    E, H, I = _check_weight("moe_down_quant", qweight, scales, zeros, format, group_size)
    rows = h.shape[0]
    T, K = weights.shape
    out = torch.zeros((T, H), dtype=torch.float32, device=h.device) if atomic else \
        torch.empty((T * K, H), dtype=h.dtype, device=h.device)
    t = tiles(block_m, h, quantized=True).down
    _check_steps("moe_down_quant", format, group_size, I, t.BK)
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(H, t.BN))
    down_quant_kernel[grid](kernel_arg(h), *_weight_args(qweight, scales, zeros, format), kernel_arg(out),
                            kernel_arg(weights.contiguous().float()), kernel_arg(sorted_ids), kernel_arg(block_expert),
                            kernel_arg(offsets), rows, H, I, E, E * H, scales.shape[2], T * K, FORMAT=format,
                            G=group_size, ZEROS=zeros is not None, TOP_K=K, ATOMIC=atomic, BM=block_m, BN=t.BN,
                            BK=t.BK, num_warps=t.num_warps, **pipelining(t, (H, I), CODE_BITS[format], h, qweight))
    return out


@down_quant.register_fake
def _down_quant_fake(h, qweight, scales, zeros, weights, sorted_ids, block_expert, offsets, block_m, atomic, format,
                     group_size):
    _check_weight("moe_down_quant", qweight, scales, zeros, format, group_size)
    T, K = weights.shape
    if atomic:
        return h.new_empty((T, qweight.shape[1]), dtype=torch.float32)
    return h.new_empty((T * K, qweight.shape[1]))


def check_quantized(x, w13: QuantizedExperts, w2: QuantizedExperts, weights: torch.Tensor,
                    differentiable: bool = True) -> None:
    """The shapes `experts` needs of quantized weights, or a ValueError naming the fix; `differentiable`: whether
    the path has a backward (fp8 activations have none)."""
    if not isinstance(w13, QuantizedExperts) or not isinstance(w2, QuantizedExperts):
        raise ValueError("tessera::moe: quantize both w13 and w2 (moe.quantize_experts), or neither")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"tessera::moe: with quantized weights x must be float16/bfloat16/float32, got {x.dtype}")
    E, two_i, H = w13.shape
    if H != x.shape[1] or two_i % 2 or w2.shape != (E, H, two_i // 2):
        raise ValueError(f"tessera::moe: quantized w13 must be [E, 2I, {x.shape[1]}] and w2 [E, {x.shape[1]}, I], "
                         f"got {w13.shape} and {w2.shape}")
    if weights.dim() != 2 or weights.shape[0] != x.shape[0]:
        raise ValueError(f"tessera::moe: weights and ids must both be [{x.shape[0]}, top_k] (route's), got "
                         f"{tuple(weights.shape)}")
    if not differentiable and torch.is_grad_enabled() and (x.requires_grad or weights.requires_grad):
        raise ValueError("tessera::moe: fp8 activations (W8A8) are for inference (their rounding has no "
                         "backward); run under torch.no_grad(), or fine-tune with bf16 activations "
                         "(fp8_activations=False), which differentiate in x and the routing weights")
    check_device("moe", x, w13=w13.qweight, w2=w2.qweight)


def forward_quantized(x, w13: QuantizedExperts, w2: QuantizedExperts, weights, sorted_ids, block_expert, offsets,
                      block_m: int, activation: str, atomic: bool) -> torch.Tensor:
    """`mlp.forward` with quantized weights: permute, gate_up, down, combine."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"tessera::moe: activation must be one of {ACTIVATIONS}, got {activation!r}")
    K = weights.shape[1]
    _check_rows("moe", sorted_ids, block_expert, offsets, block_m)
    xs = permute(x, sorted_ids, K, block_m)
    h = gate_up_quant(xs, w13.qweight.view(torch.uint8), w13.scales, w13.zeros, block_expert, offsets, activation,
                      block_m, w13.format, w13.group_size)
    y = down_quant(h, w2.qweight.view(torch.uint8), w2.scales, w2.zeros, weights, sorted_ids, block_expert, offsets,
                   block_m, atomic, w2.format, w2.group_size)
    return y.to(x.dtype) if atomic else combine(y, K, x.dtype)
