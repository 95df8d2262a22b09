"""Attention in float64 torch, the reference the library's attention tests compare with (forward and gradients)."""

from __future__ import annotations

import math

import torch


def visible(Sq: int, Sk: int, causal: bool = False, window: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """(Sq, Sk) bool: which keys each query sees (FlashAttention's masks, diagonal at the bottom-right)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(Sq)[:, None] + Sk - Sq
    j = torch.arange(Sk)[None, :]
    ok = torch.ones(Sq, Sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """(O, LSE) of (B, S, H, D) tensors in float64: O (B, Sq, H, D), LSE (B, H, Sq), +inf where a row sees no key
    and O = 0 there. Differentiable (for the gradient checks)."""
    B, Sq, H, D = q.shape
    Sk, H_kv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    k = k.double().repeat_interleave(H // H_kv, dim=2)
    v = v.double().repeat_interleave(H // H_kv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(Sq, Sk, causal, window), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].masked_fill(torch.isinf(lse[..., None]), 0.0))
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o, lse.masked_fill(torch.isinf(lse), math.inf)


def nan_padded_kv(B: int, Sq: int, Sk: int, H: int, H_kv: int, D: int, seed: int, rows: int = 64):
    """Random float16 q (B, Sq, H, D), k, v (B, Sk, H_kv, D), and the `rows`-row buffers k and v are views of, whose
    rows past Sk are NaN (kernels get the buffers: one that reads a key past the end rather than masking it
    poisons O)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g).half()
    k_rows, v_rows = (torch.full((B, rows, H_kv, D), float("nan")).half() for _ in range(2))
    k, v = k_rows[:, :Sk], v_rows[:, :Sk]
    k.copy_(torch.randn(B, Sk, H_kv, D, generator=g))
    v.copy_(torch.randn(B, Sk, H_kv, D, generator=g))
    return q, k, v, k_rows, v_rows
