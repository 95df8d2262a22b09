"""A random MoE problem for the expert-MLP tests: tokens, one layer's expert weights, and their routing."""

from __future__ import annotations

import torch

from tessera.kernels_lib.moe import route


def random_moe(T, H, I, E, K, seed=0, empty=()):
    """x [T, H]; gate and up weights w1, w3 [E, I, H] and down weights w2 [E, H, I] scaled so the products
    stay near unit size; and `route` (Tessera's top-K of random logits) as (weights, ids, counts,
    chunk_counts), with the experts in `empty` given no token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    w1, w3 = torch.randn(E, I, H, generator=g) / H ** 0.5, torch.randn(E, I, H, generator=g) / H ** 0.5
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    logits = torch.randn(T, E, generator=g)
    logits[:, list(empty)] = -30
    return x, w1, w3, w2, route(logits, K)
