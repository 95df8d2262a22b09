"""Common GEMM epilogues, each with its torch reference, so `gemm(..., epilogue=...)` trains without one of yours.

    from tessera.kernels_lib import epilogues
    y = gemm(x, w, epilogue=epilogues.bias_gelu, epilogue_args=(bias,))   # autograd included

Each function is a `@tessera.func` over the float32 accumulator tile that
`gemm` compiles into its kernel; `REFERENCES` maps it to the torch function
computing the same, which `gemm_fusion_grad` differentiates when an input
requires a gradient (`reference_of`). GELU is the erf form (torch's
default), as `gelu_tanh` is torch's approximate="tanh".
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

import tessera

SQRT_HALF = 1.0 / math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@tessera.func
def gelu(x):
    return 0.5 * x * (1.0 + tessera.erf(x * SQRT_HALF))


@tessera.func
def gelu_tanh(x):
    return 0.5 * x * (1.0 + tessera.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


@tessera.func
def bias(acc, bias):
    return acc + bias


@tessera.func
def bias_relu(acc, bias):
    return tessera.maximum(acc + bias, 0.0)


@tessera.func
def bias_gelu(acc, bias):
    return gelu(acc + bias)


@tessera.func
def bias_gelu_tanh(acc, bias):
    return gelu_tanh(acc + bias)


@tessera.func
def bias_silu(acc, bias):
    x = acc + bias
    return x * tessera.sigmoid(x)


@tessera.func
def bias_gelu_residual(acc, bias, residual):
    return gelu(acc + bias) + residual


@tessera.func
def scale_bias_residual(acc, scale, bias, residual):
    """scale * acc + bias + residual (scale a number or a broadcastable tensor)."""
    return acc * scale + bias + residual


F = torch.nn.functional
REFERENCES: dict = {
    bias: lambda acc, b: acc + b,
    bias_relu: lambda acc, b: torch.relu(acc + b),
    bias_gelu: lambda acc, b: F.gelu(acc + b),
    bias_gelu_tanh: lambda acc, b: F.gelu(acc + b, approximate="tanh"),
    bias_silu: lambda acc, b: F.silu(acc + b),
    bias_gelu_residual: lambda acc, b, r: F.gelu(acc + b) + r,
    scale_bias_residual: lambda acc, s, b, r: acc * s + b + r,
}


def reference_of(epilogue) -> Optional[Callable]:
    """The torch reference of a library epilogue (None for any other function)."""
    try:
        return REFERENCES.get(epilogue)
    except TypeError:           # an unhashable "function": certainly not one of ours
        return None
