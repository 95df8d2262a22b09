"""FlashAttention forward: O = softmax(scale * Q K^T + mask) V, one BM-row block of queries per program.

(FlashAttention-2, Dao 2023, Algorithm 1.) A program owns rows m0 .. m0+BM-1
of one (batch, head) and keeps its Q block in registers. It walks the key
blocks this row block can see, BN keys at a time, and keeps for each row the
running maximum m of the scores seen so far, the running sum l of their
exponentials and the running output acc (the online softmax): for each block

    s     = Q K_j^T * scale * log2(e)            (base-2 logits: exp2 is the fast one)
    m_new = max(m, rowmax(s))
    p     = exp2(s - m_new)                      (with a positive scale, one fma a score:
                                                  m_new = max(m, rowmax(QK^T) c), p = exp2(QK^T c - m_new))
    l     = l * exp2(m - m_new) + rowsum(p)
    acc   = acc * exp2(m - m_new) + p V_j

and at the end O = acc / l and LSE = (m + log2 l) * ln 2, the natural log
of sum_j exp(scale * q.k_j). The K and V blocks stream through a
`tessera.pipeline`, so the next blocks are in flight while this one computes;
with WS (sm_90a) a producer warpgroup of its own issues their TMA fills and
the kernel's warps, the consumers, read Q and run the loop behind mbarriers
(`passes/schedule/warp_specialization.py`, `consumer_prologue.py`). With
OVERLAP (sm_90a: wgmma is asynchronous) the loop takes FlashAttention-3's
order (section 3.2): S of block j is issued, then acc * alpha + P V of block
j - 1, and block j's softmax runs while that P V is in flight.

Masks (FlashAttention's conventions): query i of Sq sees key j of Sk when
`i + Sk - Sq - left <= j <= i + Sk - Sq + right`, each bound present only if
enabled; causal is right = 0, aligned to the bottom-right corner when
Sq != Sk. Key blocks no row of the block can see are never visited, and only
the blocks that straddle a bound (or the end of K) pay for the mask. A row
that sees no key at all gets O = 0 and LSE = +inf (FlashAttention's
convention: exp(s - LSE) is then 0 in the backward pass). Softcapping
replaces the logits by `softcap * tanh(scale * q.k / softcap)` (Gemma 2).

Q, K, V and O are (batch, seq, heads, head_dim) with any strides; query head
h reads key/value head h // (H / H_KV) (GQA, MQA). With VARLEN the batch is
packed along seq: sequence b is rows cu_q[b] .. cu_q[b+1] of Q (cu_k for K
and V), and the batch strides are 0.

With FP8, Q, K and V hold float8 e4m3 codes (V contiguous along its Sk_v
keys, Sk rounded up to 16, the rows past Sk zero) and descale_ptr three float32
per-tensor descales (FlashAttention-3's q_descale, k_descale, v_descale:
the real tensor is codes * descale). S = Q K^T multiplies the codes exactly
on fp8 tensor cores and the q and k descales fold into the logits' scale;
P, in [0, 1], is scaled by P_SCALE = 2^8 into e4m3's range and quantized
for P V on fp8 tensor cores (the scaling is exact and moves e4m3's
subnormals, which would lose P's small entries, eight binades down); l
sums the unquantized P, and O = acc * v_descale / (P_SCALE * l).

A program's work is `attention_tile`: the one-tile kernel below runs it for
its (pid_m, batch * head), the persistent one (`attention_fwd_persistent.py`)
for each tile it takes.
"""

from __future__ import annotations

import tessera

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The running max starts here rather than at -inf, so that exp2(s - m) of a masked (-inf) score is 0, never
# exp2(-inf - -inf) = NaN, while no row has seen a key (every real base-2 logit is far above it).
NO_MAX = -1.0e30
P_SCALE = 256.0     # FP8: P * 2^8 <= 256 stays below e4m3's largest finite value, 448


@tessera.func
def sequence(cu_ptr, b, S, VARLEN):
    """(first row, length) of sequence b: from cu_seqlens with VARLEN, else (0, S)."""
    if VARLEN:
        start = tessera.load(cu_ptr + b)
        return start, tessera.load(cu_ptr + b + 1) - start
    return 0, S


@tessera.func
def key_blocks(m0, Sq, Sk, left, right, BM, BN, HAS_LEFT, HAS_RIGHT):
    """The key blocks rows m0 .. m0+BM-1 see, [lo, hi), and those every row sees whole, [full_lo, full_hi):
    the blocks outside the second range are the ones that need a mask."""
    diag = Sk - Sq                                    # query i is aligned with key i + diag
    lo, full_lo = 0, 0
    hi, full_hi = tessera.cdiv(Sk, BN), Sk // BN
    if HAS_LEFT:
        lo = max(m0 + diag - left, 0) // BN
        full_lo = tessera.cdiv(max(m0 + BM - 1 + diag - left, 0), BN)
    if HAS_RIGHT:
        hi = min(hi, tessera.cdiv(max(m0 + BM + diag + right, 0), BN))
        full_hi = min(full_hi, max(m0 + diag + right + 1, 0) // BN)
    return lo, hi, full_lo, max(full_hi, full_lo)


@tessera.func
def visible(s, queries, keys, Sk, left, right, HAS_LEFT, HAS_RIGHT):
    """Scores s with -inf where a query may not see a key: `queries` (each query's index + Sk - Sq, the key it
    is aligned with) and `keys` are index tiles that broadcast to s's shape."""
    seen = keys < Sk
    if HAS_LEFT:
        seen = seen & (keys >= queries - left)
    if HAS_RIGHT:
        seen = seen & (keys <= queries + right)
    return tessera.where(seen, s, -float("inf"))


@tessera.func
def masked_block(s, n, rows, flags):
    """The scores s of key block n with -inf where `visible` says a query may not see a key."""
    m0, Sq, Sk, left, right = rows[:5]
    BM, BN, HAS_LEFT, HAS_RIGHT = flags[:4]
    queries = m0 + Sk - Sq + tessera.arange(0, BM)[:, None]
    return visible(s, queries, n * BN + tessera.arange(0, BN)[None, :], Sk, left, right, HAS_LEFT, HAS_RIGHT)


@tessera.func
def online_softmax(s, m, l, n, MASK, rows, flags):
    """One key block's step of the online softmax from its raw scores s = Q K_n^T: (m_new, p, l_new, alpha),
    alpha = exp2(m - m_new) being what the output so far is rescaled by. The mask is applied where block n
    straddles a bound (always with MASK); `rows` and `flags` are the kernel's values and constexprs it needs."""
    m0, Sq, Sk, left, right, full_lo, full_hi, qk_scale, softcap, b, h, mod_values = rows
    BM, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP, POSITIVE_SCALE, FP8, SCORE_MOD, SM_ORDER = flags
    if SCORE_MOD is not None:     # the user's function sees natural units (scale * q.k, softcapped)
        if SOFTCAP:
            s = softcap * tessera.tanh(s * qk_scale)
        else:
            s = s * (qk_scale * LN2)
        q_idx = tessera.minimum(m0 + tessera.arange(0, BM), tessera.maximum(Sq - 1, 0))[:, None]
        s = modified_scores(s, SCORE_MOD, SM_ORDER, mod_values, b, h, q_idx, n, Sk, BN)
    elif SOFTCAP:       # softcap * tanh(scale * qk / softcap), in base 2: qk_scale = scale / softcap
        s = (softcap * LOG2E) * tessera.tanh(s * qk_scale)
    elif not POSITIVE_SCALE:    # qk_scale = scale * log2(e)
        s = s * qk_scale
    if MASK:
        s = masked_block(s, n, rows, flags)
    elif (n < full_lo) | (n >= full_hi):
        s = masked_block(s, n, rows, flags)
    if SCORE_MOD is None and not SOFTCAP and POSITIVE_SCALE:
        # s is the raw q.k: a positive scale commutes with the row max and folds into exp2's argument,
        # one fma a score (FlashAttention-3's softmax) where scaling s first took a multiply and a subtract
        m_new = tessera.maximum(m, tessera.max(s, axis=1) * qk_scale)
        p = tessera.exp2(s * qk_scale - m_new[:, None])
    else:
        m_new = tessera.maximum(m, tessera.max(s, axis=1))
        p = tessera.exp2(s - m_new[:, None])
    alpha = tessera.exp2(m - m_new)
    l = l * alpha + tessera.sum(p, axis=1)
    if FP8:     # P in [0, 1], into e4m3's range (l has summed it unscaled)
        p = p * P_SCALE
    return m_new, p, l, alpha


@tessera.func
def call_hook(HOOK, first, values, ORDER):
    """HOOK(first, values[ORDER[0]], values[ORDER[1]], ...): a fused user function's arguments in its order."""
    picked = ()
    for i in tessera.static_range(len(ORDER)):
        picked = picked + (values[ORDER[i]],)
    return HOOK(first, *picked)


@tessera.func
def modified_scores(s, SCORE_MOD, SM_ORDER, mod_values, b, h, q_idx, n, Sk, BN):
    """The user's score_mod on the natural-unit scores s, given its operands and the (b, h, q_idx, kv_idx) of
    each score (indices clamped into range, so loads through them stay in bounds; the kernel masks the scores
    past the end anyway); returned in base 2, as the kernel's other paths leave them."""
    kv_idx = tessera.minimum(n * BN + tessera.arange(0, BN), Sk - 1)[None, :]
    s = call_hook(SCORE_MOD, s, mod_values + (b, h, q_idx, kv_idx), SM_ORDER)
    tessera.static_assert(s.shape == (q_idx.shape[0], BN), "score_mod must return the score tile's shape")
    return s * LOG2E


@tessera.func
def output_epilogue(out, EPILOGUE, EP_ORDER, EP_TILE, ep_ptr, ep_strides, ep_s0, b, h, q_start, Sq, pid_m, BM, D):
    """EPILOGUE(out, operand?, scalar?, b, h, q_idx): with EP_TILE, the operand is the (BM, D) f32 block of a
    tensor shaped like O at this program's rows and head."""
    tile = 0.0
    if EP_TILE:
        sb, ss, sh, sd = ep_strides
        view = tessera.view(ep_ptr + b * sb + q_start * ss + h * sh, (Sq, D), (ss, sd))
        tile = view.block((BM, D), (pid_m, 0)).load().to(tessera.f32)
    q_idx = tessera.minimum(pid_m * BM + tessera.arange(0, BM), tessera.maximum(Sq - 1, 0))[:, None]
    out = call_hook(EPILOGUE, out, (tile, ep_s0, b, h, q_idx), EP_ORDER)
    tessera.static_assert(out.shape == (BM, D), "the attention epilogue must return the output tile's shape")
    return out


# With VARLEN a block's bounds (its sequence's length, from cu_seqlens), and in decode a page's tokens (from the
# block table), are values the kernel reads, which a tensor map (built by the host) cannot hold: on sm_90a those
# K and V blocks come by cp.async, not TMA (zero-filled past the length, where TMA would read the neighbour's or
# the page's stale rows: a NaN there times P = 0 is NaN in O). That shortfall is accepted, so a user's strict
# mode ($TESSERA_STRICT) still launches varlen and decode; any other one fails as before
# (tests/kernels_lib/test_attention_compile.py).
CACHE_BOUNDS_SHORTFALL = "its view's sizes and row stride are not constants or kernel arguments"


@tessera.func
def attention_tile(pid_m, bh, tensors, sizes, strides, hook_args, FLAGS, HOOKS):
    """One program's work: query block pid_m of (batch, head) pair bh (= b * H + h). `tensors`, `sizes`,
    `strides` and `hook_args` are the kernel's arguments of those kinds, FLAGS and HOOKS its constexprs
    (`attention_fwd_kernel`'s signature says what each is); the one-tile kernel runs it once, the persistent one
    (`attention_fwd_persistent.py`) once per tile it takes."""
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, descale_ptr = tensors
    Sq, Sk, H, H_KV, qk_scale, softcap, left, right, Sk_v = sizes
    stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd = strides[:8]
    stride_vb, stride_vs, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_od = strides[8:16]
    stride_lb, stride_lh = strides[16:]
    mod_ptr0, mod_ptr1, mod_s0, mod_s1, ep_ptr, stride_eb, stride_es, stride_eh, stride_ed, ep_s0 = hook_args
    D, BM, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP, VARLEN, STAGES, FP8, WS, POSITIVE_SCALE, OVERLAP, PINGPONG = FLAGS
    SCORE_MOD, SM_ORDER, EPILOGUE, EP_ORDER, EP_TILE = HOOKS
    b, h = bh // H, bh % H
    kv_h = h // (H // H_KV)
    q_start, Sq = sequence(cu_q_ptr, b, Sq, VARLEN)
    k_start, Sk = sequence(cu_k_ptr, b, Sk, VARLEN)
    q = tessera.view(q_ptr + b * stride_qb + q_start * stride_qs + h * stride_qh, (Sq, D), (stride_qs, stride_qd))
    kT = tessera.view(k_ptr + b * stride_kb + k_start * stride_ks + kv_h * stride_kh, (D, Sk), (stride_kd, stride_ks))
    v_len = Sk
    if FP8:     # V comes contiguous along the keys (8-bit B operands must be K-major), zero-padded to Sk_v keys
        v_len = Sk_v
    v = tessera.view(v_ptr + b * stride_vb + k_start * stride_vs + kv_h * stride_vh, (v_len, D),
                     (stride_vs, stride_vd))
    o = tessera.view(o_ptr + b * stride_ob + q_start * stride_os + h * stride_oh, (Sq, D), (stride_os, stride_od))
    lse = tessera.view(lse_ptr + b * stride_lb + h * stride_lh + q_start, (Sq,))

    if FP8:     # e4m3 codes: the real q.k is the codes' product times both descales
        qk_scale = qk_scale * tessera.load(descale_ptr) * tessera.load(descale_ptr + 1)
    m0 = pid_m * BM
    q_block = q.block((BM, D), (pid_m, 0)).load()
    m = tessera.full((BM,), NO_MAX, tessera.f32)
    l = tessera.zeros((BM,), tessera.f32)
    acc = tessera.zeros((BM, D), tessera.f32)
    lo, hi, full_lo, full_hi = key_blocks(m0, Sq, Sk, left, right, BM, BN, HAS_LEFT, HAS_RIGHT)
    rows = (m0, Sq, Sk, left, right, full_lo, full_hi, qk_scale, softcap, b, h, (mod_ptr0, mod_ptr1, mod_s0, mod_s1))
    flags = (BM, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP, POSITIVE_SCALE, FP8, SCORE_MOD, SM_ORDER)
    if OVERLAP:
        # FlashAttention-3's intra-warpgroup overlap (section 3.2): the loop issues S = Q K_n^T, rescales O by
        # the previous block's alpha while it runs, issues O += P V_{n-1} with the previous block's P, and runs
        # block n's softmax while P V is in flight (`passes/defer_wgmma_wait.py` puts each wgmma_wait just
        # before the first read: pending = 1 before the softmax, 0 at the iteration's end). Block lo's softmax
        # comes first, block hi - 1's P V last. PINGPONG (with WS): the two consumer warpgroups take turns
        # issuing their products, one's softmax under the other's (section 3.1).
        m, p, l, alpha = online_softmax(tessera.dot(q_block, kT.block((D, BN), (0, lo)).load()), m, l, lo, True,
                                        rows, flags)
        for n in tessera.pipeline(lo + 1, hi, stages=STAGES, warp_specialize=WS, pingpong=PINGPONG):
            s = tessera.dot(q_block, kT.block((D, BN), (0, n)).load())
            acc = tessera.dot(p.to(v.dtype), v.block((BN, D), (n - 1, 0)).load(), acc * alpha[:, None])
            m, p, l, alpha = online_softmax(s, m, l, n, False, rows, flags)
        acc = tessera.dot(p.to(v.dtype), v.block((BN, D), (hi - 1, 0)).load(), acc * alpha[:, None])
    else:       # FlashAttention-2's order: each block's softmax between its two products (PINGPONG on AMD: two
        # groups of waves, each on its own row block, one phase apart: `passes/wave_pingpong.py`)
        for n in tessera.pipeline(lo, hi, stages=STAGES, warp_specialize=WS, pingpong=PINGPONG):
            s = tessera.dot(q_block, kT.block((D, BN), (0, n)).load())
            m_new, p, l, alpha = online_softmax(s, m, l, n, False, rows, flags)
            acc = tessera.dot(p.to(v.dtype), v.block((BN, D), (n, 0)).load(), acc * alpha[:, None])
            m = m_new

    empty = l == 0.0                                    # rows that saw no key
    if FP8:
        acc = acc * (tessera.load(descale_ptr + 2) / P_SCALE)
    out = acc / tessera.where(empty, 1.0, l)[:, None]
    if EPILOGUE is not None:          # the user's function on the normalized output tile
        out = output_epilogue(out, EPILOGUE, EP_ORDER, EP_TILE, ep_ptr, (stride_eb, stride_es, stride_eh, stride_ed),
                              ep_s0, b, h, q_start, Sq, pid_m, BM, D)
    o.block((BM, D), (pid_m, 0)).store(out)
    lse.block((BM,), (pid_m,)).store(tessera.where(empty, float("inf"), (m + tessera.log2(l)) * LN2))


@tessera.kernel(fast_math=True, tolerate=(CACHE_BOUNDS_SHORTFALL,))
def attention_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
                         Sq, Sk, H, H_KV, qk_scale, softcap, left, right,
                         stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                         stride_vb, stride_vs, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_od,
                         stride_lb, stride_lh, mod_ptr0, mod_ptr1, mod_s0, mod_s1,
                         ep_ptr, stride_eb, stride_es, stride_eh, stride_ed, ep_s0, descale_ptr, Sk_v,
                         D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                         HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr, SOFTCAP: tessera.constexpr,
                         VARLEN: tessera.constexpr, STAGES: tessera.constexpr,
                         SCORE_MOD: tessera.constexpr = None, SM_ORDER: tessera.constexpr = (),
                         EPILOGUE: tessera.constexpr = None, EP_ORDER: tessera.constexpr = (),
                         EP_TILE: tessera.constexpr = False, FP8: tessera.constexpr = False,
                         WS: tessera.constexpr = False, POSITIVE_SCALE: tessera.constexpr = True,
                         OVERLAP: tessera.constexpr = False, PINGPONG: tessera.constexpr = False):
    attention_tile(tessera.program_id(0), tessera.program_id(1),
                   (q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, descale_ptr),
                   (Sq, Sk, H, H_KV, qk_scale, softcap, left, right, Sk_v),
                   (stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                    stride_vb, stride_vs, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_od,
                    stride_lb, stride_lh),
                   (mod_ptr0, mod_ptr1, mod_s0, mod_s1, ep_ptr, stride_eb, stride_es, stride_eh, stride_ed, ep_s0),
                   (D, BM, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP, VARLEN, STAGES, FP8, WS, POSITIVE_SCALE, OVERLAP,
                    PINGPONG),
                   (SCORE_MOD, SM_ORDER, EPILOGUE, EP_ORDER, EP_TILE))
