"""Decode attention over a paged KV cache, split along the keys (FlashDecoding), and the combine of the splits.

The cache holds each sequence's keys and values in pages of P tokens
(k_cache, v_cache: (pages, P, H_KV, D)); block_table[b, j] is the page
holding tokens j*P .. j*P+P-1 of sequence b, and cache_seqlens[b] its
length. The Sq new queries of sequence b are its last Sq positions (causal
aligned bottom-right, as in `attention_fwd.py`).

`attention_decode_kernel` owns one key/value head of one sequence and one
split of its keys. The G = H / H_KV query heads that share the key/value
head are packed with the Sq queries into the rows of one tile (row r is
query r % Sq of head kv_h * G + r // Sq), so every key and value is read
once for the whole group and the tensor cores see G * Sq rows, not one.
The split walks its blocks of BN keys (BN divides P: a block lies in one
page, found through the block table) with the online softmax of the
forward kernel, and writes its partial output in float32 with its
log-sum-exp. With one split it writes the final O and LSE instead.

`attention_decode_combine_kernel` merges the splits of one query row:
LSE = log sum_s exp(LSE_s) and O = sum_s exp(LSE_s - LSE) O_s. A split
that saw no key has LSE_s = -inf and weight 0; a row that saw none in any
split gets O = 0 and LSE = +inf (the forward's convention).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

import tessera

from .attention_fwd import LN2, LOG2E, NO_MAX, visible


@tessera.func
def packed_rows(ptr, b, kv_h, G, Sq, row0, stride_b, stride_s, stride_h, stride_d, BM, D):
    """Pointers to packed rows r = row0 .. row0+BM-1 (head kv_h * G + r // Sq, query r % Sq) of a (B, Sq, H, D)
    tensor, and the mask of the rows that exist (r < G * Sq)."""
    rows = row0 + tessera.arange(0, BM)[:, None]
    cols = tessera.arange(0, D)[None, :]
    head = kv_h * G + rows // Sq
    return ptr + b * stride_b + (rows % Sq) * stride_s + head * stride_h + cols * stride_d, rows < G * Sq


@tessera.func
def page_block(cache_ptr, table_ptr, b, kv_h, n, Sk, P, pages, stride_tb, stride_p, stride_t, stride_h, stride_d,
               BN, D, TRANSPOSED):
    """Block n of BN tokens of sequence b's keys (or values) in the paged cache, BN x D (TRANSPOSED: D x BN);
    tokens past Sk read 0. The table is read in bounds for any n (a pipelined loop reads blocks ahead)."""
    token = n * BN
    page = tessera.load(table_ptr + b * stride_tb + min(token // P, pages - 1))
    first = (token // P) * P                            # the page's first token
    tokens = min(max(Sk - first, 0), P)                 # the page's tokens that exist
    base = cache_ptr + page * stride_p + kv_h * stride_h
    if TRANSPOSED:
        view = tessera.view(base, (D, tokens), (stride_d, stride_t))
        return view.block((D, BN), offsets=(0, token - first)).load()
    view = tessera.view(base, (tokens, D), (stride_t, stride_d))
    return view.block((BN, D), offsets=(token - first, 0)).load()


@tessera.kernel(fast_math=True)
def attention_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seqlens_ptr, o_ptr, lse_ptr, Sq, H, H_KV, P, pages,
                            qk_scale, softcap, left, right, splits,
                            stride_qb, stride_qs, stride_qh, stride_qd, stride_kp, stride_kt, stride_kh, stride_kd,
                            stride_vp, stride_vt, stride_vh, stride_vd, stride_tb,
                            stride_o_split, stride_ob, stride_os, stride_oh, stride_l_split, stride_lb, stride_lh,
                            D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                            HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr, SOFTCAP: tessera.constexpr,
                            SPLIT: tessera.constexpr, STAGES: tessera.constexpr):
    """Split `split` of the keys of key/value head kv_h of sequence b, for BM of its G * Sq packed query rows
    (program_id(2) picks which): the partial O (float32) and LSE with SPLIT, else the final ones."""
    split, bh, row0 = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2) * BM
    b, kv_h = bh // H_KV, bh % H_KV
    G = H // H_KV
    Sk = tessera.load(seqlens_ptr + b)
    q_ptrs, q_rows = packed_rows(q_ptr, b, kv_h, G, Sq, row0, stride_qb, stride_qs, stride_qh, stride_qd, BM, D)
    q = tessera.load(q_ptrs, mask=q_rows)
    queries = (row0 + tessera.arange(0, BM)[:, None]) % Sq + Sk - Sq     # the key each row is aligned with

    blocks = tessera.cdiv(Sk, BN)
    per_split = tessera.cdiv(blocks, splits)
    m = tessera.full((BM,), NO_MAX, tessera.f32)
    l = tessera.zeros((BM,), tessera.f32)
    acc = tessera.zeros((BM, D), tessera.f32)
    for n in tessera.pipeline(split * per_split, min(split * per_split + per_split, blocks), stages=STAGES):
        kT = page_block(k_ptr, table_ptr, b, kv_h, n, Sk, P, pages, stride_tb, stride_kp, stride_kt, stride_kh,
                        stride_kd, BN, D, True)
        s = tessera.dot(q, kT)
        if SOFTCAP:
            s = (softcap * LOG2E) * tessera.tanh(s * qk_scale)
        else:
            s = s * qk_scale
        s = visible(s, queries, n * BN + tessera.arange(0, BN)[None, :], Sk, left, right, HAS_LEFT, HAS_RIGHT)
        m_new = tessera.maximum(m, tessera.max(s, axis=1))
        p = tessera.exp2(s - m_new[:, None])
        alpha = tessera.exp2(m - m_new)
        l = l * alpha + tessera.sum(p, axis=1)
        v = page_block(v_ptr, table_ptr, b, kv_h, n, Sk, P, pages, stride_tb, stride_vp, stride_vt, stride_vh,
                       stride_vd, BN, D, False)
        acc = tessera.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new

    empty = l == 0.0
    o_ptrs, _ = packed_rows(o_ptr + split * stride_o_split, b, kv_h, G, Sq, row0, stride_ob, stride_os, stride_oh, 1,
                            BM, D)
    tessera.store(o_ptrs, acc / tessera.where(empty, 1.0, l)[:, None], mask=q_rows)
    rows = row0 + tessera.arange(0, BM)
    lse_ptrs = lse_ptr + split * stride_l_split + b * stride_lb + (kv_h * G + rows // Sq) * stride_lh + rows % Sq
    no_key = -float("inf") if SPLIT else float("inf")         # a split that saw no key: weight 0
    tessera.store(lse_ptrs, tessera.where(empty, no_key, (m + tessera.log2(l)) * LN2), mask=rows < G * Sq)


@tessera.kernel(fast_math=True)
def attention_decode_combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, Sq, H, splits,
                                    stride_o_split, stride_pb, stride_ps, stride_ph, stride_l_split, stride_lb,
                                    stride_lh, stride_ob, stride_os, stride_oh,
                                    D: tessera.constexpr, SPLITS: tessera.constexpr):
    """One query row (b, i, h): O and LSE from the `splits` partial ones (SPLITS: a power of two >= splits). The
    final LSE shares the partials' (batch, head) strides."""
    i, bh = tessera.program_id(0), tessera.program_id(1)
    b, h = bh // H, bh % H
    row = b * stride_lb + h * stride_lh + i
    lse_parts = tessera.view(lse_part_ptr + row, (splits,), (stride_l_split,)).block((SPLITS,), (0,)).load(
        fill=-float("inf"))
    top = tessera.max(lse_parts, axis=0)
    empty = top == -float("inf")
    weights = tessera.exp2((lse_parts - tessera.where(empty, 0.0, top)) * LOG2E)
    total = tessera.sum(weights, axis=0)
    parts = tessera.view(o_part_ptr + b * stride_pb + i * stride_ps + h * stride_ph, (splits, D),
                         (stride_o_split, 1)).block((SPLITS, D), (0, 0)).load()
    o = tessera.sum(parts * weights[:, None], axis=0) / tessera.where(empty, 1.0, total)
    tessera.view(o_ptr + b * stride_ob + i * stride_os + h * stride_oh, (D,)).block((D,), (0,)).store(o)
    lse = tessera.where(empty, float("inf"), top + tessera.log(tessera.where(empty, 1.0, total)))
    tessera.view(lse_ptr + row, (1,)).block((1,), (0,)).store(lse)


# ---------------------------------------------------------------------------
# The op

MAX_SPLITS = 64


@dataclass(frozen=True)
class DecodePlan:
    """Packed query rows per program (at most), keys per step (at most: a step stays within a page) and how many
    steps of K and V are in flight (cp.async ring slots)."""

    rows: int
    keys: int
    stages: int


# Per head dim; every combination of rows 16..`rows` and keys 16..`keys` assembles without spills for sm_80 and
# sm_90a (tests/kernels_lib/test_attention_compile.py checks the corners).
DECODE_PLANS = {64: DecodePlan(64, 64, 3), 128: DecodePlan(64, 64, 3), 256: DecodePlan(16, 32, 2)}
CPU_DECODE_PLAN = DecodePlan(16, 16, 1)


@dataclass(frozen=True)
class DecodeShape:
    """The sizes of one decode call: batch, new queries, heads, head dim, page size, pages per sequence."""

    B: int
    Sq: int
    H: int
    H_kv: int
    D: int
    P: int
    max_pages: int

    @property
    def packed(self) -> int:
        """Query rows sharing one key/value head: the group's heads times the new queries."""
        return self.H // self.H_kv * self.Sq

    def tile(self, plan: DecodePlan) -> tuple[int, int]:
        """(rows per program, keys per step): the packed rows padded for the tensor cores (at most the plan's),
        and the plan's keys or the page, whichever is fewer."""
        return min(max(16, tessera.next_power_of_2(self.packed)), plan.rows), min(self.P, plan.keys)


def _check_decode(q, k_cache, v_cache, block_table, cache_seqlens) -> DecodeShape:
    name = "tessera::attention_decode"
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"{name}: q must be (B, Sq, H, D) and k_cache, v_cache (pages, page_size, H_KV, D) alike, "
                         f"got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, Sq, H, D = q.shape
    _, P, H_kv, D_kv = k_cache.shape
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"{name}: q and the caches must all be float16 or all bfloat16, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if D_kv != D or D < 16 or D & (D - 1) or H_kv == 0 or H % H_kv:
        raise ValueError(f"{name}: head dims {D} / {D_kv} must match and be a power of two >= 16, and q's {H} "
                         f"heads a multiple of the cache's {H_kv}")
    if P < 16 or P & (P - 1):
        raise ValueError(f"{name}: the page size {P} must be a power of two >= 16 (16 to 256 tokens)")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32:
        raise ValueError(f"{name}: block_table must be int32 (B, pages per sequence) = ({B}, ...), got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if cache_seqlens.shape != (B,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"{name}: cache_seqlens must be int32 ({B},), got {cache_seqlens.dtype} "
                         f"{tuple(cache_seqlens.shape)}")
    if any(t.device != q.device for t in (k_cache, v_cache, block_table, cache_seqlens)):
        raise ValueError(f"{name}: every tensor must be on q's device {q.device}")
    return DecodeShape(B, Sq, H, H_kv, D, P, block_table.shape[1])


def _num_splits(shape: DecodeShape, block: int, on_gpu: bool, asked: int, device) -> int:
    """Splits of each sequence's keys: `asked`, or enough programs for two per SM (one per 2 blocks at most)."""
    blocks = tessera.cdiv(shape.max_pages * shape.P, block)
    if asked > 0:
        return max(1, min(asked, blocks, MAX_SPLITS))
    programs = shape.B * shape.H_kv
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 2
    return max(1, min(2 * sms // max(programs, 1), tessera.cdiv(blocks, 2), MAX_SPLITS))


@torch.library.custom_op("tessera::attention_decode", mutates_args=())
def attention_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        cache_seqlens: torch.Tensor, causal: bool = True, window_left: int = -1,
                        window_right: int = -1, softcap: float = 0.0, scale: Optional[float] = None,
                        num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.ops.tessera.attention_decode`: see `attention_decode`."""
    shape = _check_decode(q, k_cache, v_cache, block_table, cache_seqlens)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((shape.B, shape.H, shape.Sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("inf"))
    cpu = q.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"
    if not cpu and shape.D not in DECODE_PLANS:
        raise ValueError(f"tessera::attention_decode: head dim {shape.D} has no GPU plan; use one of "
                         f"{sorted(DECODE_PLANS)}")
    plan = CPU_DECODE_PLAN if cpu else DECODE_PLANS[shape.D]
    rows, block = shape.tile(plan)
    splits = _num_splits(shape, block, not cpu, num_splits, q.device)
    scale = 1.0 / math.sqrt(shape.D) if scale is None else float(scale)
    right = 0 if causal else window_right
    if splits == 1:
        o_out, lse_out = o, lse
    else:
        o_out = torch.empty((splits, *q.shape), dtype=torch.float32, device=q.device)
        lse_out = torch.empty((splits, *lse.shape), dtype=torch.float32, device=q.device)
    o_strides = (o_out.stride(0), *o_out.stride()[1:4]) if splits > 1 else (0, *o.stride()[:3])
    lse_strides = (lse_out.stride(0), *lse_out.stride()[1:3]) if splits > 1 else (0, *lse.stride()[:2])
    attention_decode_kernel[(splits, shape.B * shape.H_kv, tessera.cdiv(shape.packed, rows))](
        q, k_cache, v_cache, block_table, cache_seqlens, o_out, lse_out, shape.Sq, shape.H, shape.H_kv, shape.P,
        shape.max_pages,
        scale / softcap if softcap > 0 else scale * LOG2E, float(softcap), max(window_left, 0), max(right, 0),
        splits, *q.stride(), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), *o_strides, *lse_strides,
        D=shape.D, BM=rows, BN=block, HAS_LEFT=window_left >= 0, HAS_RIGHT=right >= 0, SOFTCAP=softcap > 0,
        SPLIT=splits > 1, STAGES=plan.stages, num_warps=4)
    if splits > 1:
        attention_decode_combine_kernel[(shape.Sq, shape.B * shape.H)](
            o_out, lse_out, o, lse, shape.Sq, shape.H, splits, *o_out.stride()[:4], *lse_out.stride()[:3],
            *o.stride()[:3], D=shape.D, SPLITS=tessera.next_power_of_2(splits), num_warps=4)
    return o, lse


@attention_decode_op.register_fake
def _attention_decode_fake(q, k_cache, v_cache, block_table, cache_seqlens, causal=True, window_left=-1,
                           window_right=-1, softcap=0.0, scale=None, num_splits=0):
    shape = _check_decode(q, k_cache, v_cache, block_table, cache_seqlens)
    return q.new_empty(q.shape), q.new_empty((shape.B, shape.H, shape.Sq), dtype=torch.float32)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, *, causal: bool = True, window=None, softcap: float = 0.0,
                     scale: Optional[float] = None, num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the newest Sq queries of each sequence over its paged KV cache: (O, LSE).

    q is (B, Sq, H, D) (Sq new tokens per sequence, usually 1); k_cache and
    v_cache are (pages, page_size, H_KV, D) with pages of 16 to 256 tokens;
    block_table (B, pages per sequence) int32 maps sequence b's j-th page to
    its page in the cache and cache_seqlens (B,) int32 gives its length
    (the new tokens included: they are its last Sq positions). Masks as
    `attention` (causal by default). The keys are split into `num_splits`
    parts per sequence and head (0: enough to fill the GPU) whose partial
    results a second kernel combines. O is (B, Sq, H, D), LSE (B, H, Sq)
    float32. Inference only (no autograd).
    """
    from .attention import window_bounds
    left, right = window_bounds(causal, window)
    return attention_decode_op(q, k_cache, v_cache, block_table, cache_seqlens, causal, left, right, float(softcap),
                               scale, int(num_splits))
