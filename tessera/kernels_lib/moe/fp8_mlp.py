"""The expert MLPs with fp8 activations and fp8 weights (DeepSeek-V3's W8A8 scheme), on fp8 tensor cores.

Activations are quantized per token and per group of G = 128 columns
(`quantize_tokens_kernel`: one float32 scale per token per group, amax /
448), the weights are `quantized.QuantizedExperts` in fp8 (any of the
three granularities, whose K blocks are a multiple of G). Each K step of
the grouped GEMMs is one group:

    acc += (xq[:, group] @ wq[:, group]^T) * x_scale[:, group] * w_scale[:, group]^T

so the dot multiplies e4m3 codes exactly on the fp8 tensor cores
(mma.sync m16n8k32 on sm_89, wgmma on sm_90a, MFMA 32x32x16 / 16x16x32
fp8 on gfx950, pipelined through direct-to-LDS rings) and the scales are
applied to each group's float32 product (the W4A8 kernel's scheme in
quant_gemm). gate_up's output h is quantized the same way before down.
sm_80 has no fp8 tensor cores and gfx942's fp8 MFMA reads the fnuz formats,
not e4m3fn: the op refuses them and names the bf16-activation path.
Forward only.
"""

from __future__ import annotations

import os

import torch

import tessera

from ..targets import device_arch, fp8_matrix_cores
from .common import check_device, kernel_arg
from .experts import activate, weighted_rows_out
from ..gemm_alignment import state_multiples
from .mlp import _check_rows, combine, permute, pipelining, tiles
from .quantized import FP8_MAX, QuantizedExperts

GROUP = 128             # activation columns per scale (DeepSeek-V3)
QUANTIZE_TOKENS = 16    # tokens one quantize program reads


@tessera.kernel
def quantize_tokens_kernel(x_ptr, q_ptr, s_ptr, T, H, s_cols, BT: tessera.constexpr, G: tessera.constexpr):
    """q[t, group] = x[t, group] / s[t, group] in e4m3, s = amax(|x[t, group]|) / 448: per token, per G columns."""
    pid_t, pid_g = tessera.program_id(0), tessera.program_id(1)
    x = tessera.view(x_ptr, (T, H)).block((BT, G), (pid_t, pid_g)).load().to(tessera.f32)
    scale = tessera.maximum(tessera.max(tessera.abs(x), 1), 1e-12) / FP8_MAX
    tessera.view(q_ptr, (T, H)).block((BT, G), (pid_t, pid_g)).store((x / scale[:, None]).to(tessera.f8e4m3))
    tessera.view(s_ptr, (T, s_cols)).block((BT, 1), (pid_t, pid_g)).store(tessera.expand_dims(scale, 1))


@tessera.func
def fp8_block_gemm(a, a_s, w, s, pid_m, n_offset, K, BM, BN, G, WG, STAGES):
    """acc = (A * its row scales) @ (W[n_offset : n_offset + BN] * its scales)^T, one group of G per step (W's
    scale columns span WG, a multiple of G)."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, G), stages=STAGES):
        codes = w.block((BN, G), offsets=(n_offset, k * G)).load()
        partial = tessera.dot(a.block((BM, G), (pid_m, k)).load(), codes.T)
        column_scale = s.block((BN, 1), offsets=(n_offset, k * G // WG)).load()
        acc = acc + partial * a_s.block((BM, 1), (pid_m, k)).load() * column_scale.T
    return acc


@tessera.kernel
def gate_up_fp8_kernel(xs_ptr, xs_s_ptr, w13_ptr, s_ptr, h_ptr, block_expert_ptr, offsets_ptr, rows, H, I, E,
                       two_i_e, x_cols, s_cols, ACTIVATION: tessera.constexpr, G: tessera.constexpr,
                       WG: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                       STAGES: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    """`gate_up_kernel` with fp8 xs (scales [rows, x_cols]) and fp8 w13 [E * 2I, H] (scales [E * 2I, s_cols])."""
    state_multiples((H, I), ALIGN)      # what the op checked H and I are multiples of (`mlp.pipelining`)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    h = tessera.view(h_ptr, (rows, I)).block((BM, BN), (pid_m, pid_n))
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        h.store(tessera.zeros((BM, BN), dtype=tessera.f32))
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    acc = fp8_block_gemm(tessera.view(xs_ptr, (rows, H)), tessera.view(xs_s_ptr, (rows, x_cols)),
                         tessera.view(w13_ptr, (two_i_e, H)), tessera.view(s_ptr, (two_i_e, s_cols)), pid_m,
                         expert * 2 * I + pid_n * 2 * BN, H, BM, 2 * BN, G, WG, STAGES)
    gate, up = tessera.split(tessera.reshape(acc, (BM, BN, 2)))
    h.store(activate(gate, ACTIVATION) * up)


@tessera.kernel
def down_fp8_kernel(h_ptr, h_s_ptr, w2_ptr, s_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr,
                    offsets_ptr, rows, H, I, E, h_e, h_cols, s_cols, numel, TOP_K: tessera.constexpr,
                    ATOMIC: tessera.constexpr, G: tessera.constexpr, WG: tessera.constexpr, BM: tessera.constexpr,
                    BN: tessera.constexpr, STAGES: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    """`down_kernel` with fp8 h (scales [rows, h_cols]) and fp8 w2 [E * H, I] (scales [E * H, s_cols])."""
    state_multiples((H, I), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    acc = fp8_block_gemm(tessera.view(h_ptr, (rows, I)), tessera.view(h_s_ptr, (rows, h_cols)),
                         tessera.view(w2_ptr, (h_e, I)), tessera.view(s_ptr, (h_e, s_cols)), pid_m,
                         expert * H + pid_n * BN, I, BM, BN, G, WG, STAGES)
    weighted_rows_out(acc, out_ptr, weights_ptr, sorted_ids_ptr, pid_m, pid_n, rows, H, numel, TOP_K, ATOMIC, BM, BN)


# ---------------------------------------------------------------------------
# The ops


def _check_target(t: torch.Tensor, name: str) -> None:
    """On a GPU, the refusal of `target_refusal` for the tensor's device."""
    interpreted = t.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"
    refusal = None if interpreted or not t.is_cuda else target_refusal(device_arch(t.device), name)
    if refusal:
        raise ValueError(refusal)


def target_refusal(arch: str, name: str) -> str | None:
    """Why op `name` cannot run on a GPU of target `arch`, naming the path that can, or None: fp8 tensor cores
    for e4m3fn are sm_89 and newer, and gfx950."""
    if fp8_matrix_cores(arch):
        return None
    if arch.startswith("gfx"):
        return (f"tessera::{name}: fp8 activations need MFMA on OCP e4m3 (float8_e4m3fn), which gfx950 has; this "
                f"GPU is {arch}, whose fp8 MFMA (if any) reads the fnuz formats: use bf16 activations with the fp8 "
                f"weights (fp8_activations=False)")
    return (f"tessera::{name}: fp8 activations need fp8 tensor cores (sm_89 or newer); this GPU is {arch}: use "
            f"bf16 activations with the fp8 weights (fp8_activations=False)")


@torch.library.custom_op("tessera::moe_quantize_tokens", mutates_args=())
def quantize_tokens(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (e4m3 codes [T, H] as uint8 bits, float32 scales [T, cdiv(H, group)]): x = codes * scale per
    token and group of `group` columns. The fp8 ops pass codes as uint8 (torch's CPU kernels, which opcheck
    runs, lack float8 arithmetic); `.view(torch.float8_e4m3fn)` reads them."""
    _check_target(x, "moe_quantize_tokens")
    T, H = x.shape
    q = torch.empty((T, H), dtype=torch.uint8, device=x.device)
    s = torch.empty((T, tessera.cdiv(H, group)), dtype=torch.float32, device=x.device)
    grid = (tessera.cdiv(T, QUANTIZE_TOKENS), s.shape[1])
    quantize_tokens_kernel[grid](kernel_arg(x.contiguous()), kernel_arg(q, tessera.f8e4m3), kernel_arg(s), T, H,
                                 s.shape[1], BT=QUANTIZE_TOKENS, G=group)
    return q, s


@quantize_tokens.register_fake
def _quantize_tokens_fake(x, group):
    T, H = x.shape
    return x.new_empty((T, H), dtype=torch.uint8), x.new_empty((T, -(-H // group)), dtype=torch.float32)


def _check_groups(name: str, scales: torch.Tensor, group_size: int, K: int, group: int) -> None:
    if group_size % group and group_size < K:
        raise ValueError(f"tessera::{name}: the weights' scale blocks ({group_size} of K = {K}) must be a multiple "
                         f"of the activations' group ({group}); quantize the weights with block={group} or more")


@torch.library.custom_op("tessera::moe_gate_up_fp8", mutates_args=())
def gate_up_fp8(xs: torch.Tensor, xs_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                block_expert: torch.Tensor, offsets: torch.Tensor, activation: str, block_m: int, group_size: int,
                group: int) -> torch.Tensor:
    """`moe_gate_up` with fp8 xs (`quantize_tokens`'s codes, permuted) and fp8 w13 (`quantized.interleave`), codes
    as uint8 bits; h in bfloat16."""
    _check_target(xs, "moe_gate_up_fp8")
    rows, H = xs.shape
    E, two_i, _ = qweight.shape
    _check_groups("moe_gate_up_fp8", scales, group_size, H, group)
    h = torch.empty((rows, two_i // 2), dtype=torch.bfloat16, device=xs.device)
    t = tiles(block_m, h, fp8=True).gate_up
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(two_i // 2, t.BN))
    gate_up_fp8_kernel[grid](kernel_arg(xs, tessera.f8e4m3), kernel_arg(xs_scale), kernel_arg(qweight, tessera.f8e4m3),
                             kernel_arg(scales.contiguous()), kernel_arg(h), kernel_arg(block_expert),
                             kernel_arg(offsets), rows, H, two_i // 2, E, E * two_i, xs_scale.shape[1],
                             scales.shape[2], ACTIVATION=activation, G=group, WG=group_size, BM=block_m, BN=t.BN,
                             num_warps=t.num_warps, **pipelining(t, (H, two_i // 2), 8, xs, qweight))
    return h


@gate_up_fp8.register_fake
def _gate_up_fp8_fake(xs, xs_scale, qweight, scales, block_expert, offsets, activation, block_m, group_size, group):
    return xs.new_empty((xs.shape[0], qweight.shape[1] // 2), dtype=torch.bfloat16)


@torch.library.custom_op("tessera::moe_down_fp8", mutates_args=())
def down_fp8(h: torch.Tensor, h_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
             weights: torch.Tensor, sorted_ids: torch.Tensor, block_expert: torch.Tensor, offsets: torch.Tensor,
             block_m: int, atomic: bool, group_size: int, group: int) -> torch.Tensor:
    """`moe_down` with fp8 h (`quantize_tokens`'s codes) and fp8 w2 [E, H, I], codes as uint8 bits: y
    [T * top_k, H] in bfloat16, or with `atomic` the top-k sum in float32 [T, H]."""
    _check_target(h, "moe_down_fp8")
    rows, I = h.shape
    E, H, _ = qweight.shape
    T, K = weights.shape
    _check_groups("moe_down_fp8", scales, group_size, I, group)
    out = torch.zeros((T, H), dtype=torch.float32, device=h.device) if atomic else \
        torch.empty((T * K, H), dtype=torch.bfloat16, device=h.device)
    t = tiles(block_m, h, fp8=True).down
    grid = (tessera.cdiv(rows, block_m), tessera.cdiv(H, t.BN))
    down_fp8_kernel[grid](kernel_arg(h, tessera.f8e4m3), kernel_arg(h_scale), kernel_arg(qweight, tessera.f8e4m3),
                          kernel_arg(scales.contiguous()), kernel_arg(out), kernel_arg(weights.contiguous().float()),
                          kernel_arg(sorted_ids), kernel_arg(block_expert), kernel_arg(offsets), rows, H, I, E, E * H,
                          h_scale.shape[1], scales.shape[2], T * K, TOP_K=K, ATOMIC=atomic, G=group, WG=group_size,
                          BM=block_m, BN=t.BN, num_warps=t.num_warps, **pipelining(t, (H, I), 8, h, qweight))
    return out


@down_fp8.register_fake
def _down_fp8_fake(h, h_scale, qweight, scales, weights, sorted_ids, block_expert, offsets, block_m, atomic,
                   group_size, group):
    T, K = weights.shape
    if atomic:
        return h.new_empty((T, qweight.shape[1]), dtype=torch.float32)
    return h.new_empty((T * K, qweight.shape[1]), dtype=torch.bfloat16)


def forward_fp8(x, w13: QuantizedExperts, w2: QuantizedExperts, weights, sorted_ids, block_expert, offsets,
                block_m: int, activation: str, atomic: bool, group: int = GROUP) -> torch.Tensor:
    """`mlp.forward` with fp8 activations: quantize x, permute codes and scales, gate_up, quantize h, down,
    combine."""
    if w13.format != "fp8" or w2.format != "fp8":
        raise ValueError("tessera::moe: fp8 activations go with fp8 weights (quantize_experts(w, 'fp8')); int4 "
                         "weights take bf16 activations")
    check_device("moe", x, w13=w13.qweight, w2=w2.qweight)
    K = weights.shape[1]
    _check_rows("moe", sorted_ids, block_expert, offsets, block_m)
    xq, x_scale = quantize_tokens(x, group)
    xs, xs_scale = permute(xq, sorted_ids, K, block_m), permute(x_scale, sorted_ids, K, block_m)
    h = gate_up_fp8(xs, xs_scale, w13.qweight.view(torch.uint8), w13.scales, block_expert, offsets, activation,
                    block_m, w13.group_size, group)
    hq, h_scale = quantize_tokens(h, group)
    y = down_fp8(hq, h_scale, w2.qweight.view(torch.uint8), w2.scales, weights, sorted_ids, block_expert, offsets,
                 block_m, atomic, w2.group_size, group)
    return y.to(x.dtype) if atomic else combine(y, K, x.dtype)
