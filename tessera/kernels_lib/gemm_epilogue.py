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
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@tessera.func
def epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
             HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN):
    """act(alpha * acc * scale_a[:, None] * scale_b[None, :] + bias) for tile (pid_m, pid_n), still float32."""
    if HAS_SCALE_A:     # one f32 scale per row of op(A) (per-tensor scales arrive expanded)
        acc = acc * tessera.view(scale_a_ptr, (M, 1)).block((BM, 1), (pid_m, 0)).load()
    if HAS_SCALE_B:     # one f32 scale per column of op(B)
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
