"""Mixture of experts, written in Tessera: routing, token alignment, grouped expert GEMMs, and the layer. It
imports only the public API (`import tessera`) and torch, like the rest of kernels_lib.

The pipeline (DESIGN.md §11): `route` (router logits -> top-k experts, weights and tokens per expert) ->
`align` (token order sorted by expert, padded to the GEMM tile) -> `experts` (permute, gate+up with the
activation, down with the routing weights, combine); with int4 or fp8 expert weights (`quantized`), the GEMMs
dequantize them in registers (`quantized_mlp`; differentiable in x and the routing weights with the weights frozen:
`quantized_autograd`), or fp8 weights meet fp8 activations (`fp8_mlp`). Each step is a
`tessera::` torch op with a fake implementation. `persistent` runs the whole layer in one launch
(`moe_layer`; `experts(..., one_launch=True)`; inference).
"""

from . import plan
from .align import align
from .balance import load_balancing_loss
from .layer import MoELayer, Routing
from .mlp import experts, interleave_gate_up
from .parallel import expert_parallel
from .persistent import moe_layer
from .quantized import QuantizedExperts, quantize_experts
from .routing import route

__all__ = ["MoELayer", "QuantizedExperts", "Routing", "align", "expert_parallel", "experts", "interleave_gate_up",
           "load_balancing_loss", "moe_layer", "plan", "quantize_experts", "route"]
