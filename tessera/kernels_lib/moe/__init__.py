"""Mixture of experts, written in Tessera: routing, token alignment, grouped expert GEMMs, and the layer.

The pipeline (DESIGN.md §11): `route` (router logits -> top-k experts, weights and tokens per expert) ->
`align` (token order sorted by expert, padded to the GEMM tile) -> the grouped GEMMs -> combine. Each step
is a `tessera::` torch op; like the rest of kernels_lib it uses only the public API (`import tessera`).
"""

from .align import align
from .routing import route

__all__ = ["align", "route"]
