"""Decode attention over a paged KV cache, split along the keys (FlashDecoding), and the merge of the splits.

The cache holds each sequence's keys and values in pages of P tokens
(k_cache, v_cache: (pages, P, H_KV, D)); block_table[b, j] is the page
holding tokens j*P .. j*P+P-1 of sequence b, and cache_seqlens[b] its
length. The Sq new queries of sequence b are its last Sq positions (masks
aligned bottom-right, as in `attention_fwd.py`).

`attention_decode_kernel` owns one key/value head of one sequence and one
split of the key blocks its queries see. The G = H / H_KV query heads that
share the key/value head are packed with the Sq queries into the rows of
one tile (row r is query r % Sq of head kv_h * G + r // Sq), so each key
and value is read once for the whole group and the tensor cores see G * Sq
rows, not one. A block of BN keys lies in one page (BN divides P), found
through the block table. The split writes its partial output (float32,
normalized) and log-sum-exp; with one split, the final O and LSE.

Softmax, two ways (both in base 2, log2(e) folded into the scale):

* synchronized (FlashAttention's online softmax): a running row max m,
  and every block rescales l and acc by exp2(m - m_new) before adding;
* asynchronous with a unified max (FlashDecoding++, Hong et al. 2023, §3):
  every block uses one max phi, known before the kernel starts, so
  p = exp2(s - phi) needs no row max and l and acc are never rescaled: no
  block waits for another's max, and all splits share one reference. The
  exponentials stay in range only while each row's true max lies within
  [phi - below, phi + above] (p is rounded to f16/bf16 for P V: above keeps
  it finite, below keeps the largest terms normal numbers). The kernel
  tracks each row's max on the side; when a row of the tile leaves that
  window (or saw no real key while phi was too high), it recomputes the
  split with the synchronized softmax and writes that instead (the
  fallback: correct for any phi, paid only where the estimate was wrong).

`merge_splits` merges the splits of packed rows: LSE = log sum_s exp(LSE_s)
and O = sum_s exp(LSE_s - LSE) O_s (with a unified max, exp(LSE_s - LSE) =
l_s / sum l). A split that saw no key has LSE_s = -inf and weight 0; a row
that saw none in any split gets O = 0 and LSE = +inf (the forward's
convention). It runs in one of two places, to the same bits:

* in the split launch (COMBINE, FlashDecoding's "split-K with a semaphore"):
  every split writes its partial, then counts itself in with an
  acquire-release atomic on its row group's counter; the program that
  counts last (old value splits - 1) has every other split's partial
  visible, merges them in split order, whichever split it is, and resets
  the counter to 0 for the next launch (so no launch clears the counters);
* in `attention_decode_combine_kernel`, launched after the split kernel.
"""

from __future__ import annotations

import tessera

from .attention_fwd import CACHE_BOUNDS_SHORTFALL, LN2, LOG2E, NO_MAX, key_blocks, visible


@tessera.func
def packed_rows(ptr, b, kv_h, G, Sq, row0, stride_b, stride_s, stride_h, stride_d, BM, D):
    """Pointers to packed rows r = row0 .. row0+BM-1 (head kv_h * G + r // Sq, query r % Sq) of a (B, Sq, H, D)
    tensor, and the mask of the rows that exist (r < G * Sq)."""
    rows = row0 + tessera.arange(0, BM)[:, None]
    cols = tessera.arange(0, D)[None, :]
    head = kv_h * G + rows // Sq
    return ptr + b * stride_b + (rows % Sq) * stride_s + head * stride_h + cols * stride_d, rows < G * Sq


@tessera.func
def page_block(cache, table, n, Sk, P, stride_page, stride_token, stride_d, BN, D, TRANSPOSED):
    """Block n of BN tokens of one sequence's keys (or values) for one head, BN x D (TRANSPOSED: D x BN): `cache`
    points at the head in page 0, `table` at the sequence's row of the block table; tokens past Sk read 0."""
    token = n * BN
    first = (token // P) * P                            # the page's first token
    base = cache + tessera.load(table + token // P) * stride_page
    tokens = min(max(Sk - first, 0), P)                 # the page's tokens that exist
    if TRANSPOSED:
        view = tessera.view(base, (D, tokens), (stride_d, stride_token))
        return view.block((D, BN), offsets=(0, token - first)).load()
    view = tessera.view(base, (tokens, D), (stride_token, stride_d))
    return view.block((BN, D), offsets=(token - first, 0)).load()


@tessera.func
def logits(q, kT, n, queries, Sk, qk_scale, softcap, left, right, masked, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP):
    """Base-2 logits of the packed rows against key block n, -inf where a row may not see a key (only `masked`
    blocks, those that straddle a mask bound or the end of the keys, pay for the mask)."""
    s = tessera.dot(q, kT)
    if SOFTCAP:         # softcap * tanh(scale * qk / softcap), in base 2: qk_scale = scale / softcap
        s = (softcap * LOG2E) * tessera.tanh(s * qk_scale)
    else:               # qk_scale = scale * log2(e)
        s = s * qk_scale
    if masked:
        s = visible(s, queries, n * BN + tessera.arange(0, BN)[None, :], Sk, left, right, HAS_LEFT, HAS_RIGHT)
    return s


@tessera.func
def write_split(o_ptr, lse_ptr, b, kv_h, G, Sq, row0, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, acc, l, m,
                BM, D, SPLIT):
    """O = acc / l and LSE = (m + log2 l) ln 2 of packed rows row0 .. row0+BM-1 that exist, into the split's O
    (B, Sq, H, D) and LSE (B, H, Sq); a row with l = 0 saw no key: O = 0 and LSE = -inf for a split (weight 0
    in the combine), +inf for the final result. (The pointers are made here, after the loop, not kept in
    registers through it.)"""
    o_ptrs, rows = packed_rows(o_ptr, b, kv_h, G, Sq, row0, stride_ob, stride_os, stride_oh, 1, BM, D)
    empty = l == 0.0
    tessera.store(o_ptrs, acc / tessera.where(empty, 1.0, l)[:, None], mask=rows)
    r = row0 + tessera.arange(0, BM)
    lse_ptrs = lse_ptr + b * stride_lb + (kv_h * G + r // Sq) * stride_lh + r % Sq
    no_key = -float("inf") if SPLIT else float("inf")
    tessera.store(lse_ptrs, tessera.where(empty, no_key, (m + tessera.log2(l)) * LN2), mask=r < G * Sq)


@tessera.kernel(fast_math=True, tolerate=(CACHE_BOUNDS_SHORTFALL,))
def attention_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, seqlens_ptr, o_ptr, lse_ptr, out_ptr, out_lse_ptr,
                            counter_ptr, Sq, H, H_KV, P, qk_scale, softcap, unified_max, below, above, left, right,
                            splits, stride_qb, stride_qs, stride_qh, stride_qd, stride_kp, stride_kt, stride_kh,
                            stride_kd, stride_vp, stride_vt, stride_vh, stride_vd, stride_tb,
                            stride_o_split, stride_ob, stride_os, stride_oh, stride_l_split, stride_lb, stride_lh,
                            stride_out_b, stride_out_s, stride_out_h, stride_out_lb, stride_out_lh,
                            D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                            HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr, SOFTCAP: tessera.constexpr,
                            SPLIT: tessera.constexpr, UNIFIED: tessera.constexpr, FALLBACK: tessera.constexpr,
                            STAGES: tessera.constexpr, COMBINE: tessera.constexpr = False, MR: tessera.constexpr = 16,
                            SPLITS: tessera.constexpr = 1, CHUNK: tessera.constexpr = 1,
                            EARLY: tessera.constexpr = True):
    """Split `split` of the key blocks of key/value head kv_h of sequence b, for BM of its G * Sq packed query
    rows (program_id(2) picks which): the partial O (float32) and LSE with SPLIT, else the final ones. UNIFIED:
    the asynchronous softmax around the base-2 max `unified_max`, valid for row maxima within [unified_max -
    below, unified_max + above], with the synchronized one as the FALLBACK outside. COMBINE (with SPLIT): the
    last split of the rows to finish merges all the splits into out and out_lse (`merge_splits`); the others
    only count themselves in (counter_ptr: one int32 per (b, kv_h, row group), 0 before and after a launch)."""
    split, bh, row0 = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2) * BM
    b, kv_h = bh // H_KV, bh % H_KV
    G = H // H_KV
    Sk = tessera.load(seqlens_ptr + b)
    q_ptrs, q_rows = packed_rows(q_ptr, b, kv_h, G, Sq, row0, stride_qb, stride_qs, stride_qh, stride_qd, BM, D)
    q = tessera.load(q_ptrs, mask=q_rows)
    o_split, lse_split = o_ptr + split * stride_o_split, lse_ptr + split * stride_l_split
    rows = row0 + tessera.arange(0, BM)
    queries = rows[:, None] % Sq + Sk - Sq              # the key each row is aligned with
    k_head, v_head = k_ptr + kv_h * stride_kh, v_ptr + kv_h * stride_vh
    table = table_ptr + b * stride_tb

    lo, hi, full_lo, full_hi = key_blocks(0, Sq, Sk, left, right, Sq, BN, HAS_LEFT, HAS_RIGHT)
    per_split = tessera.cdiv(hi - lo, splits)
    first = lo + split * per_split
    last = max(min(first + per_split, hi), first)
    redo = 1                                            # whether the synchronized softmax runs
    if UNIFIED:
        top = tessera.full((BM,), -float("inf"), tessera.f32)
        l = tessera.zeros((BM,), tessera.f32)
        acc = tessera.zeros((BM, D), tessera.f32)
        for n in tessera.pipeline(first, last, stages=STAGES):
            kT = page_block(k_head, table, n, Sk, P, stride_kp, stride_kt, stride_kd, BN, D, True)
            s = logits(q, kT, n, queries, Sk, qk_scale, softcap, left, right, (n < full_lo) | (n >= full_hi), BN,
                       HAS_LEFT, HAS_RIGHT, SOFTCAP)
            top = tessera.maximum(top, tessera.max(s, axis=1))  # only checked after the loop
            p = tessera.exp2(s - unified_max)
            l = l + tessera.sum(p, axis=1)
            v = page_block(v_head, table, n, Sk, P, stride_vp, stride_vt, stride_vd, BN, D, False)
            acc = tessera.dot(p.to(v.dtype), v, acc)
        write_split(o_split, lse_split, b, kv_h, G, Sq, row0, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    acc, l, unified_max, BM, D, SPLIT)
        redo = 0
        if FALLBACK:        # a real row whose max left the window (a row that saw no key has top = -inf)
            outside = (top > unified_max + above) | ((top < unified_max - below) & (top > -float("inf")))
            redo = tessera.max((outside & (rows < G * Sq)).to(tessera.i32), axis=0)

    if redo > 0:
        m = tessera.full((BM,), NO_MAX, tessera.f32)
        l = tessera.zeros((BM,), tessera.f32)
        acc = tessera.zeros((BM, D), tessera.f32)
        for n in tessera.pipeline(first, last, stages=STAGES):
            kT = page_block(k_head, table, n, Sk, P, stride_kp, stride_kt, stride_kd, BN, D, True)
            s = logits(q, kT, n, queries, Sk, qk_scale, softcap, left, right, (n < full_lo) | (n >= full_hi), BN,
                       HAS_LEFT, HAS_RIGHT, SOFTCAP)
            m_new = tessera.maximum(m, tessera.max(s, axis=1))
            p = tessera.exp2(s - m_new[:, None])
            alpha = tessera.exp2(m - m_new)
            l = l * alpha + tessera.sum(p, axis=1)
            v = page_block(v_head, table, n, Sk, P, stride_vp, stride_vt, stride_vd, BN, D, False)
            acc = tessera.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m = m_new
        write_split(o_split, lse_split, b, kv_h, G, Sq, row0, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    acc, l, m, BM, D, SPLIT)

    if COMBINE:         # FlashDecoding's combine in this launch: the rows' last split to finish merges them all
        counter = counter_ptr + bh * tessera.num_programs(2) + tessera.program_id(2)
        # acquire-release at GPU scope, after a barrier: it publishes this program's partial (every thread's
        # stores) and, for the last to arrive, makes every other split's visible before the merge reads them
        last = tessera.atomic_add(counter, 1) == splits - 1
        # (the merge's per-thread index math is computed in this `if`, not kept live through the key loops:
        # `passes/rematerialize_index.py`)
        if last:
            merge_splits(o_ptr, lse_ptr, out_ptr, out_lse_ptr, b, kv_h, G, Sq, row0, splits, stride_o_split,
                         stride_ob, stride_oh, stride_l_split, stride_lb, stride_lh, stride_out_b, stride_out_s,
                         stride_out_h, stride_out_lb, stride_out_lh, MR, D, SPLITS, CHUNK, EARLY)
            tessera.store(counter, 0)                   # every split has counted: ready for the next launch


@tessera.func
def load_step(o_group, lse_group, s0, splits, packed, row0, stride_o_split, stride_l_split, MR, D, CHUNK):
    """Partial O rows (MR x D each) and LSEs (MR) of splits s0 .. s0+CHUNK-1 of a row group, all loads issued
    together; a split past the last reads nothing (O 0, LSE -inf)."""
    parts, lses = (), ()
    for j in tessera.static_range(CHUNK):
        rows = tessera.where(s0 + j < splits, packed, 0)
        parts = parts + (tessera.view(o_group + (s0 + j) * stride_o_split, (rows, D), (D, 1)).block(
            (MR, D), offsets=(row0, 0)).load(),)
        lses = lses + (tessera.view(lse_group + (s0 + j) * stride_l_split, (rows,), (1,)).block(
            (MR,), offsets=(row0,)).load(fill=-float("inf")),)
    return parts, lses


@tessera.func
def add_step(parts, lses, ref, total, acc, CHUNK):
    """total and acc with the step's splits added one by one, in split order: weight exp(LSE_s - ref)."""
    for j in tessera.static_range(CHUNK):
        weight = tessera.exp2((lses[j] - ref) * LOG2E)
        total = total + weight
        acc = acc + parts[j] * weight[:, None]
    return total, acc


@tessera.func
def merge_splits(o_part, lse_part, out_ptr, out_lse_ptr, b, kv_h, G, Sq, row0, splits, stride_o_split, stride_pb,
                 stride_ph, stride_l_split, stride_lb, stride_lh, stride_out_b, stride_out_s, stride_out_h,
                 stride_out_lb, stride_out_lh, MR, D, SPLITS, CHUNK, EARLY):
    """O and LSE of packed rows row0 .. row0+MR-1 of key/value head kv_h of sequence b from the `splits` partial
    ones, into the final (B, Sq, H, D) O and (B, H, Sq) LSE: LSE = log sum_s exp(LSE_s), O = sum_s exp(LSE_s -
    LSE) O_s. The partials are packed-row-major ((splits, B, H, Sq, D) and (splits, B, H, Sq)): a group's rows
    of one split are contiguous. The reference max takes every split's LSE at once (a max is exact in any
    order), with EARLY its loads issued with the first step's; then the splits are added one by one in split
    order, 0, 1, 2, ..., CHUNK of them a step, each step's loads issued together (one round trip a step, with
    EARLY the first shared with the max's: two steps' registers live at once, which spill the head-dim-256
    tiles). Every element is the same chain of float operations whatever the tile, warps or program
    that computes it, so the split launch's last program and `attention_decode_combine_kernel` (another
    tiling) give the same bits."""
    packed = G * Sq
    o_group = o_part + b * stride_pb + kv_h * G * stride_ph
    lse_group = lse_part + b * stride_lb + kv_h * G * stride_lh
    every = tessera.view(lse_group, (splits, packed), (stride_l_split, 1)).block((SPLITS, MR), offsets=(0, row0))
    total, acc = tessera.zeros((MR,), tessera.f32), tessera.zeros((MR, D), tessera.f32)
    if EARLY:
        parts, lses = load_step(o_group, lse_group, 0, splits, packed, row0, stride_o_split, stride_l_split, MR,
                                D, CHUNK)
        top = tessera.max(every.load(fill=-float("inf")), axis=0)
        ref = tessera.where(top == -float("inf"), 0.0, top)
        total, acc = add_step(parts, lses, ref, total, acc, CHUNK)
    else:
        top = tessera.max(every.load(fill=-float("inf")), axis=0)
        ref = tessera.where(top == -float("inf"), 0.0, top)
    empty = top == -float("inf")                        # no split saw a key (or the row does not exist)
    for s0 in range(CHUNK if EARLY else 0, splits, CHUNK):
        parts, lses = load_step(o_group, lse_group, s0, splits, packed, row0, stride_o_split, stride_l_split, MR,
                                D, CHUNK)
        total, acc = add_step(parts, lses, ref, total, acc, CHUNK)
    o_ptrs, rows = packed_rows(out_ptr, b, kv_h, G, Sq, row0, stride_out_b, stride_out_s, stride_out_h, 1, MR, D)
    tessera.store(o_ptrs, acc / tessera.where(empty, 1.0, total)[:, None], mask=rows)
    r = row0 + tessera.arange(0, MR)
    lse_ptrs = out_lse_ptr + b * stride_out_lb + (kv_h * G + r // Sq) * stride_out_lh + r % Sq
    tessera.store(lse_ptrs, tessera.where(empty, float("inf"), top + tessera.log(tessera.where(empty, 1.0, total))),
                  mask=r < packed)


@tessera.kernel(fast_math=True)
def attention_decode_combine_kernel(o_part_ptr, lse_part_ptr, out_ptr, out_lse_ptr, Sq, H, H_KV, splits,
                                    stride_o_split, stride_pb, stride_ph, stride_l_split, stride_lb, stride_lh,
                                    stride_out_b, stride_out_s, stride_out_h, stride_out_lb, stride_out_lh,
                                    D: tessera.constexpr, MR: tessera.constexpr, SPLITS: tessera.constexpr,
                                    CHUNK: tessera.constexpr):
    """The two-launch path's second kernel: packed rows program_id(0) * MR .. + MR - 1 of key/value head kv_h
    of sequence b (program_id(1) = b * H_KV + kv_h), merged from the split kernel's partials by
    `merge_splits`: the bits of the split launch's own merge, in programs of their own (one row each, as many
    as the query rows, so the merge's reads are spread over the GPU)."""
    bh, row0 = tessera.program_id(1), tessera.program_id(0) * MR
    merge_splits(o_part_ptr, lse_part_ptr, out_ptr, out_lse_ptr, bh // H_KV, bh % H_KV, H // H_KV, Sq, row0, splits,
                 stride_o_split, stride_pb, stride_ph, stride_l_split, stride_lb, stride_lh, stride_out_b,
                 stride_out_s, stride_out_h, stride_out_lb, stride_out_lh, MR, D, SPLITS, CHUNK, True)
