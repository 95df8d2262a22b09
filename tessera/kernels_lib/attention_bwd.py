"""FlashAttention backward: dQ, dK, dV from dO, recomputing the probabilities from Q, K and the forward's LSE.

(FlashAttention-2, Dao 2023, Algorithm 2.) With P = exp(scale * Q K^T - LSE),
O = P V and dO given:

    delta = rowsum(dO * O)                    `attention_bwd_delta_kernel`, first
    dV    = P^T dO
    dP    = dO V^T
    dS    = P * (dP - delta)                  (softcap: times 1 - tanh^2, the derivative of the cap)
    dK    = scale * dS^T Q
    dQ    = scale * dS K

`attention_bwd_kv_kernel` owns one block of BN keys of one key/value head:
it keeps K and V in registers (or shared memory) and walks the query blocks
that see those keys, for every query head of the group (GQA: the group's
dK and dV are summed in registers, so no atomics and a fixed order), and
accumulates dK and dV. It works with the transposed scores S^T = K Q^T
(BN x BM), so that P^T and dS^T come out of their products already as the
A operands of dV += P^T dO and dK += dS^T Q. dQ is either added by atomics
into a float32 buffer from the same loop (`ATOMIC_DQ`: one pass, the order
of the additions varies from run to run), or computed by
`attention_bwd_q_kernel`, which owns a block of queries and walks the key
blocks (recomputing S and dP: two more products, but every dQ element is
summed in one fixed order: the deterministic mode).

OVERLAP (sm_90a, where wgmma is asynchronous; `BWD_OVERLAP_ENV` in attention.py) issues the two products
that need only the loaded blocks, S and dP, back to back, so that `passes/defer_wgmma_wait.py` leaves dP in
flight under the masking and exp2 of P (`wgmma_wait {pending = 1}`) and, in the dK/dV kernel, dV under dS
(another depth-1 wait). The LSE and delta rows are broadcast to the scores' shape before the products (in the
dQ pass once, before the loop): broadcast where they are used, they go through shared memory there, and a
shared-memory store stops a wait from moving down.

The mask conventions and the LSE are the forward's (`attention_fwd.py`); a
row whose LSE is +inf saw no key and gets no gradient. A gradient of the
LSE itself folds into delta (d LSE / d S = P, so dS = P * (dP - delta + dLSE)).
"""

from __future__ import annotations

import tessera

from .attention_fwd import CACHE_BOUNDS_SHORTFALL, LOG2E, key_blocks, sequence, visible


@tessera.kernel(fast_math=True)
def attention_bwd_delta_kernel(o_ptr, do_ptr, dlse_ptr, delta_ptr, cu_q_ptr, Sq, H,
                               stride_ob, stride_os, stride_oh, stride_od, stride_gb, stride_gs, stride_gh,
                               stride_gd, stride_lb, stride_lh, D: tessera.constexpr, BM: tessera.constexpr,
                               HAS_DLSE: tessera.constexpr, VARLEN: tessera.constexpr):
    """delta = rowsum(dO * O) - dLSE for BM rows of one (batch, head); delta and dLSE are laid out like the LSE."""
    pid_m, bh = tessera.program_id(0), tessera.program_id(1)
    b, h = bh // H, bh % H
    q_start, Sq = sequence(cu_q_ptr, b, Sq, VARLEN)
    o = tessera.view(o_ptr + b * stride_ob + q_start * stride_os + h * stride_oh, (Sq, D), (stride_os, stride_od))
    do = tessera.view(do_ptr + b * stride_gb + q_start * stride_gs + h * stride_gh, (Sq, D), (stride_gs, stride_gd))
    rows = b * stride_lb + h * stride_lh + q_start
    products = o.block((BM, D), (pid_m, 0)).load().to(tessera.f32) * do.block((BM, D), (pid_m, 0)).load()
    delta = tessera.sum(products, axis=1)
    if HAS_DLSE:
        delta = delta - tessera.view(dlse_ptr + rows, (Sq,)).block((BM,), (pid_m,)).load()
    tessera.view(delta_ptr + rows, (Sq,)).block((BM,), (pid_m,)).store(delta)


@tessera.func
def query_blocks(n0, Sq, Sk, left, right, BM, BN, HAS_LEFT, HAS_RIGHT):
    """The query blocks that see some of keys n0 .. n0+BN-1, [lo, hi), and those whose every query sees all of
    them, [full_lo, full_hi): the blocks outside the second range need the mask."""
    diag = Sk - Sq                                    # query i is aligned with key i + diag
    lo, full_lo = 0, 0
    hi, full_hi = tessera.cdiv(Sq, BM), tessera.cdiv(Sq, BM)
    if HAS_RIGHT:                                     # key j is seen by queries i >= j - diag - right
        lo = max(n0 - diag - right, 0) // BM
        full_lo = tessera.cdiv(max(n0 + BN - 1 - diag - right, 0), BM)
    if HAS_LEFT:                                      # ... and i <= j - diag + left
        hi = min(hi, max(n0 + BN - diag + left, 0) // BM + 1)
        full_hi = min(full_hi, max(n0 - diag + left + 1, 0) // BM)
    return lo, hi, full_lo, max(full_hi, full_lo)


@tessera.func
def logits(s, qk_scale, softcap, SOFTCAP):
    """(base-2 logits, the factor dS picks up from the cap) of the products s = q.k, as the forward scales them."""
    if SOFTCAP:
        t = tessera.tanh(s * qk_scale)
        return (softcap * LOG2E) * t, 1.0 - t * t
    return s * qk_scale, 1.0


@tessera.kernel(fast_math=True, tolerate=(CACHE_BOUNDS_SHORTFALL,))    # varlen: as the forward
def attention_bwd_kv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, cu_q_ptr,
                            cu_k_ptr, Sq, Sk, H, H_KV, qk_scale, softcap, scale, left, right,
                            stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                            stride_vb, stride_vs, stride_vh, stride_vd, stride_gb, stride_gs, stride_gh, stride_gd,
                            stride_dqb, stride_dqs, stride_dqh, stride_dkb, stride_dks, stride_dkh,
                            stride_lb, stride_lh,
                            D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                            HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr, SOFTCAP: tessera.constexpr,
                            VARLEN: tessera.constexpr, ATOMIC_DQ: tessera.constexpr, STAGES: tessera.constexpr,
                            TRANSPOSED: tessera.constexpr = False, OVERLAP: tessera.constexpr = False):
    """dK, dV of BN keys of one key/value head (summed over its query heads), and with ATOMIC_DQ their share of
    dQ / scale added into the float32 dQ buffer. dK and dV share their strides (dk_*) and, like the dQ buffer, are
    contiguous in the head dim. TRANSPOSED accumulates dK^T = Q^T dS and dV^T = dO^T P (D x BN) instead: their
    rows, the head dim, then split across the warps (FlashAttention-3's swapped dK/dV products, for D = 256)."""
    pid_n, bh = tessera.program_id(0), tessera.program_id(1)
    b, kv_h = bh // H_KV, bh % H_KV
    group = H // H_KV
    q_start, Sq = sequence(cu_q_ptr, b, Sq, VARLEN)
    k_start, Sk = sequence(cu_k_ptr, b, Sk, VARLEN)
    k = tessera.view(k_ptr + b * stride_kb + k_start * stride_ks + kv_h * stride_kh, (Sk, D), (stride_ks, stride_kd))
    v = tessera.view(v_ptr + b * stride_vb + k_start * stride_vs + kv_h * stride_vh, (Sk, D), (stride_vs, stride_vd))
    k_block = k.block((BN, D), (pid_n, 0)).load()
    v_block = v.block((BN, D), (pid_n, 0)).load()
    k_for_dq = k.block((BN, D), (pid_n, 0)).load()         # its own load: an operand of its own dot
    dk = tessera.zeros((D, BN) if TRANSPOSED else (BN, D), tessera.f32)
    dv = tessera.zeros((D, BN) if TRANSPOSED else (BN, D), tessera.f32)
    n0 = pid_n * BN
    keys = n0 + tessera.arange(0, BN)[:, None]
    lo, hi, full_lo, full_hi = query_blocks(n0, Sq, Sk, left, right, BM, BN, HAS_LEFT, HAS_RIGHT)
    for h in range(kv_h * group, kv_h * group + group):
        q_base = q_ptr + b * stride_qb + q_start * stride_qs + h * stride_qh
        do_base = do_ptr + b * stride_gb + q_start * stride_gs + h * stride_gh
        q, qT = tessera.view(q_base, (Sq, D), (stride_qs, stride_qd)), tessera.view(q_base, (D, Sq), (stride_qd, stride_qs))
        do, doT = (tessera.view(do_base, (Sq, D), (stride_gs, stride_gd)),
                   tessera.view(do_base, (D, Sq), (stride_gd, stride_gs)))
        lse = tessera.view(lse_ptr + b * stride_lb + h * stride_lh + q_start, (1, Sq))
        delta = tessera.view(delta_ptr + b * stride_lb + h * stride_lh + q_start, (1, Sq))
        for m in tessera.pipeline(lo, hi, stages=STAGES):
            if OVERLAP:     # both products of the loaded blocks at once: dP^T runs under P^T's exp2
                lse_m = tessera.broadcast_to(lse.block((1, BM), (0, m)).load(fill=float("inf")) * LOG2E,
                                             (BN, BM))
                delta_m = tessera.broadcast_to(delta.block((1, BM), (0, m)).load(), (BN, BM))
                sT = tessera.dot(k_block, qT.block((D, BM), (0, m)).load())
                dpT = tessera.dot(v_block, doT.block((D, BM), (0, m)).load())
                sT, cap = logits(sT, qk_scale, softcap, SOFTCAP)
            else:
                sT, cap = logits(tessera.dot(k_block, qT.block((D, BM), (0, m)).load()), qk_scale, softcap, SOFTCAP)
            if (m < full_lo) | (m >= full_hi):
                queries = m * BM + Sk - Sq + tessera.arange(0, BM)[None, :]
                sT = visible(sT, queries, keys, Sk, left, right, HAS_LEFT, HAS_RIGHT)
            if not OVERLAP:
                lse_m = lse.block((1, BM), (0, m)).load(fill=float("inf")) * LOG2E
            pT = tessera.exp2(sT - lse_m)
            if TRANSPOSED:
                dv = tessera.dot(doT.block((D, BM), (0, m)).load(), tessera.trans(pT.to(v.dtype)), dv)
            else:
                dv = tessera.dot(pT.to(v.dtype), do.block((BM, D), (m, 0)).load(), dv)
            if not OVERLAP:
                dpT = tessera.dot(v_block, doT.block((D, BM), (0, m)).load())
                delta_m = delta.block((1, BM), (0, m)).load()
            dsT = pT * (dpT - delta_m) * cap     # (OVERLAP: dV still in flight)
            if TRANSPOSED:
                dk = tessera.dot(qT.block((D, BM), (0, m)).load(), tessera.trans(dsT.to(q.dtype)), dk)
            else:
                dk = tessera.dot(dsT.to(q.dtype), q.block((BM, D), (m, 0)).load(), dk)
            if ATOMIC_DQ:   # dQ / scale: added straight from the product's registers (the caller scales)
                rows = m * BM + tessera.arange(0, BM)[:, None]
                cols = tessera.arange(0, D)[None, :]
                tessera.atomic_add(dq_ptr + b * stride_dqb + (q_start + rows) * stride_dqs + h * stride_dqh + cols,
                                   tessera.dot(tessera.trans(dsT).to(q.dtype), k_for_dq), mask=rows < Sq)
    dk_base = b * stride_dkb + k_start * stride_dks + kv_h * stride_dkh
    if TRANSPOSED:
        tessera.view(dk_ptr + dk_base, (D, Sk), (1, stride_dks)).block((D, BN), (0, pid_n)).store(dk * scale)
        tessera.view(dv_ptr + dk_base, (D, Sk), (1, stride_dks)).block((D, BN), (0, pid_n)).store(dv)
    else:
        tessera.view(dk_ptr + dk_base, (Sk, D), (stride_dks, 1)).block((BN, D), (pid_n, 0)).store(dk * scale)
        tessera.view(dv_ptr + dk_base, (Sk, D), (stride_dks, 1)).block((BN, D), (pid_n, 0)).store(dv)


@tessera.kernel(fast_math=True, tolerate=(CACHE_BOUNDS_SHORTFALL,))
def attention_bwd_q_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr,
                           Sq, Sk, H, H_KV, qk_scale, softcap, scale, left, right,
                           stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                           stride_vb, stride_vs, stride_vh, stride_vd, stride_gb, stride_gs, stride_gh, stride_gd,
                           stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh,
                           D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                           HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr, SOFTCAP: tessera.constexpr,
                           VARLEN: tessera.constexpr, STAGES: tessera.constexpr,
                           OVERLAP: tessera.constexpr = False):
    """dQ of BM queries of one head, summed over the key blocks in order (the deterministic mode); dQ is
    contiguous in the head dim."""
    pid_m, bh = tessera.program_id(0), tessera.program_id(1)
    b, h = bh // H, bh % H
    kv_h = h // (H // H_KV)
    q_start, Sq = sequence(cu_q_ptr, b, Sq, VARLEN)
    k_start, Sk = sequence(cu_k_ptr, b, Sk, VARLEN)
    q = tessera.view(q_ptr + b * stride_qb + q_start * stride_qs + h * stride_qh, (Sq, D), (stride_qs, stride_qd))
    do = tessera.view(do_ptr + b * stride_gb + q_start * stride_gs + h * stride_gh, (Sq, D), (stride_gs, stride_gd))
    k_base = k_ptr + b * stride_kb + k_start * stride_ks + kv_h * stride_kh
    k, kT = tessera.view(k_base, (Sk, D), (stride_ks, stride_kd)), tessera.view(k_base, (D, Sk), (stride_kd, stride_ks))
    vT = tessera.view(v_ptr + b * stride_vb + k_start * stride_vs + kv_h * stride_vh, (D, Sk), (stride_vd, stride_vs))
    rows = b * stride_lb + h * stride_lh + q_start
    lse = tessera.view(lse_ptr + rows, (Sq,)).block((BM,), (pid_m,)).load(fill=float("inf"))[:, None] * LOG2E
    delta = tessera.view(delta_ptr + rows, (Sq,)).block((BM,), (pid_m,)).load()[:, None]
    if OVERLAP:     # in the scores' layout once, not through shared memory in every step (it would stop the waits)
        lse, delta = tessera.broadcast_to(lse, (BM, BN)), tessera.broadcast_to(delta, (BM, BN))

    m0 = pid_m * BM
    q_block = q.block((BM, D), (pid_m, 0)).load()
    do_block = do.block((BM, D), (pid_m, 0)).load()
    dq = tessera.zeros((BM, D), tessera.f32)
    lo, hi, full_lo, full_hi = key_blocks(m0, Sq, Sk, left, right, BM, BN, HAS_LEFT, HAS_RIGHT)
    for n in tessera.pipeline(lo, hi, stages=STAGES):
        if OVERLAP:         # both products of the loaded blocks at once: dP runs under P's exp2
            s = tessera.dot(q_block, kT.block((D, BN), (0, n)).load())
            dp = tessera.dot(do_block, vT.block((D, BN), (0, n)).load())
            s, cap = logits(s, qk_scale, softcap, SOFTCAP)
        else:
            s, cap = logits(tessera.dot(q_block, kT.block((D, BN), (0, n)).load()), qk_scale, softcap, SOFTCAP)
        if (n < full_lo) | (n >= full_hi):
            queries = m0 + Sk - Sq + tessera.arange(0, BM)[:, None]
            s = visible(s, queries, n * BN + tessera.arange(0, BN)[None, :], Sk, left, right, HAS_LEFT, HAS_RIGHT)
        p = tessera.exp2(s - lse)
        if not OVERLAP:
            dp = tessera.dot(do_block, vT.block((D, BN), (0, n)).load())
        ds = p * (dp - delta) * cap
        dq = tessera.dot(ds.to(q.dtype), k.block((BN, D), (n, 0)).load(), dq)
    dq_view = tessera.view(dq_ptr + b * stride_dqb + q_start * stride_dqs + h * stride_dqh, (Sq, D), (stride_dqs, 1))
    dq_view.block((BM, D), (pid_m, 0)).store(dq * scale)
