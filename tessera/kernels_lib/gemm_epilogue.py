"""The fixed epilogue of `tessera::gemm`, shared by its kernels: float32 accumulator -> scales, alpha, bias,
activation, for one BM x BN tile of C.

The tiled kernel (`gemm.py`) applies it to the tile it has just accumulated;
the small-M split-K kernel (`gemm_split_k.py`) applies it once the K splits
of a tile are summed, so every path rounds the same float32 value.
"""

from __future__ import annotations

import math

import tessera

ACTIVATIONS = ("none", "relu", "gelu", "silu")
# SCALE_A / SCALE_B: no fp8 scale, one f32 for the whole operand (its 0-d tensor read as it is: no vector made
# per call), or one f32 per row of op(A) / column of op(B)
SCALE_MODES = ("none", "tensor", "vector")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@tessera.func
def epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
             HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN):
    """act(alpha * acc * scale_a[:, None] * scale_b[None, :] + bias) for tile (pid_m, pid_n), still float32;
    a "tensor" scale is one scalar (`SCALE_MODES`)."""
    tessera.static_assert(SCALE_A in SCALE_MODES and SCALE_B in SCALE_MODES,
                          "SCALE_A / SCALE_B must be 'none', 'tensor' (one f32 scalar) or 'vector' (one per row of "
                          "op(A) / column of op(B)); True/False are the old HAS_SCALE_A / HAS_SCALE_B flags")
    if SCALE_A == "tensor":
        acc = acc * tessera.load(scale_a_ptr)
    elif SCALE_A == "vector":
        acc = acc * tessera.view(scale_a_ptr, (M, 1)).block((BM, 1), (pid_m, 0)).load()
    if SCALE_B == "tensor":
        acc = acc * tessera.load(scale_b_ptr)
    elif SCALE_B == "vector":
        acc = acc * tessera.view(scale_b_ptr, (1, N)).block((1, BN), (0, pid_n)).load()
    acc = acc * alpha
    if HAS_BIAS:
        bias = tessera.view(bias_ptr, (1, N)).block((1, BN), (0, pid_n)).load()
        acc = acc + bias.to(tessera.f32)
    if ACTIVATION == "relu":
        acc = tessera.maximum(acc, 0.0)
    elif ACTIVATION == "gelu":      # tanh approximation
        acc = 0.5 * acc * (1.0 + tessera.tanh(SQRT_2_OVER_PI * (acc + 0.044715 * acc * acc * acc)))
    elif ACTIVATION == "silu":
        acc = acc * tessera.sigmoid(acc)
    return acc
