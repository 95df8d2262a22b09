"""The expert MLPs as grouped GEMMs over the aligned token order (`align`): gate+up, then down and combine.

Rows are the aligned order: row r holds pair sorted_ids[r] = token * K + slot
(or padding), and rows b*BM .. b*BM+BM-1 all belong to expert block_expert[b].
So every BM-row block is one dense GEMM tile against one expert's weights,
and nothing is gathered inside the K loops: both operands are block loads
of views (the token rows through `permute_kernel` first), which the
compiler software-pipelines (cp.async, TMA on sm_90a, read by wgmma there).

    permute    xs[r]    = x[sorted_ids[r] // K]              (padding rows: 0)
    gate_up    h[r]     = act(xs[r] @ Wg[e]^T) * (xs[r] @ Wu[e]^T)
    down       y[pair]  = weight[pair] * (h[r] @ W2[e]^T)     (each pair's row, written once)
    combine    out[t]   = sum over slots j of y[t * K + j]    (a fixed order: deterministic)

or, with `atomic=True`, down adds weight * (h @ W2^T) straight into a
float32 out[t] (no y, no combine; the order of the K additions varies).

Gate and up weights are stored interleaved by rows, w13[e, 2i] = gate row
i and w13[e, 2i + 1] = up row i (`interleave_gate_up`), so one dot of a
BM x BK block by a 2BN-row block gives both halves, and the mma
accumulator splits into gate and up columns within each thread (adjacent
accumulator columns live in the same thread), for any BN.

Weights are flattened to 2-D views over all experts ([E * N, K], read as
its transpose), so that every block load has the kernel's pointer argument
as its base: the host builds one TMA tensor map per weight tensor, and a
block's row offset (expert * N + column) picks the expert. Rows of a block
that run past an expert's N read the next expert's weights, into columns
that are never stored.
"""

from __future__ import annotations

import math

import tessera

from ..gemm_alignment import state_multiples

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
ACTIVATIONS = ("silu", "gelu")


@tessera.func
def expert_block_gemm(a, b, pid_m, k_first, n_offset, K, BM, BN, BK, STAGES):
    """acc = A[pid_m's BM rows, :] @ B[:, n_offset : n_offset + BN], over all of K (pipelined)."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        a_block = a.block((BM, BK), (pid_m, k)).load()
        b_block = b.block((BK, BN), offsets=(k_first + k * BK, n_offset)).load()
        acc = tessera.dot(a_block, b_block, acc)
    return acc


@tessera.func
def activate(gate, ACTIVATION):
    """SiLU, or GELU (tanh approximation), of the float32 gate."""
    if ACTIVATION == "silu":
        return gate * tessera.sigmoid(gate)
    return 0.5 * gate * (1.0 + tessera.tanh(SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)))


@tessera.kernel
def permute_kernel(x_ptr, sorted_ids_ptr, xs_ptr, rows, H, numel, TOP_K: tessera.constexpr,
                   BR: tessera.constexpr, BH: tessera.constexpr):
    """xs[r] = x[sorted_ids[r] // TOP_K]: the token rows in the aligned order (padding rows, and the unused
    rows after them, whose sorted_ids are numel too: zeros)."""
    pid_r, pid_h = tessera.program_id(0), tessera.program_id(1)
    cols = pid_h * BH + tessera.arange(0, BH)
    pairs = tessera.view(sorted_ids_ptr, (rows,)).block((BR,), (pid_r,)).load(fill=-1)
    real = ((pairs >= 0) & (pairs < numel))[:, None] & (cols < H)[None, :]
    tokens = (pairs // TOP_K).to(tessera.i64)                 # 64-bit offsets: T * H may pass 2^31
    values = tessera.load(x_ptr + tokens[:, None] * H + cols[None, :], mask=real)
    tessera.view(xs_ptr, (rows, H)).block((BR, BH), (pid_r, pid_h)).store(values)


@tessera.kernel
def gate_up_kernel(xs_ptr, w13_ptr, h_ptr, block_expert_ptr, offsets_ptr, rows, H, I, E, two_i_e,
                   ACTIVATION: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr, STAGES: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    """h[r, n] = act(xs[r] @ Wg[e, n]) * (xs[r] @ Wu[e, n]) for one BM x BN tile of h (e: the block's expert).
    ALIGN: what the op checked H and I are multiples of (`mlp.pipelining`)."""
    state_multiples((H, I), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    h = tessera.view(h_ptr, (rows, I)).block((BM, BN), (pid_m, pid_n))
    if pid_m * BM >= tessera.load(offsets_ptr + E):         # past the rows in use: zeros, no weights read
        h.store(tessera.zeros((BM, BN), dtype=tessera.f32))
        return
    gate_up_tile(xs_ptr, w13_ptr, h_ptr, block_expert_ptr, pid_m, pid_n, rows, H, I, two_i_e, ACTIVATION, BM, BN,
                 BK, STAGES)


@tessera.func
def gate_up_tile(xs_ptr, w13_ptr, h_ptr, block_expert_ptr, pid_m, pid_n, rows, H, I, two_i_e, ACTIVATION, BM, BN,
                 BK, STAGES):
    """One BM x BN tile of h = act(xs @ Wg[e]^T) * (xs @ Wu[e]^T), for a block of rows in use."""
    expert = tessera.load(block_expert_ptr + pid_m)
    xs = tessera.view(xs_ptr, (rows, H))
    w13_t = tessera.view(w13_ptr, (H, two_i_e), (1, H))           # [E * 2I, H] read as its transpose
    acc = expert_block_gemm(xs, w13_t, pid_m, 0, expert * 2 * I + pid_n * 2 * BN, H, BM, 2 * BN, BK, STAGES)
    gate, up = tessera.split(tessera.reshape(acc, (BM, BN, 2)))     # interleaved columns: gate, up, gate, ...
    tessera.view(h_ptr, (rows, I)).block((BM, BN), (pid_m, pid_n)).store(activate(gate, ACTIVATION) * up)


@tessera.func
def weighted_rows_out(acc, out_ptr, weights_ptr, sorted_ids_ptr, pid_m, pid_n, rows, H, numel, TOP_K, ATOMIC, BM,
                      BN):
    """down's epilogue: acc's rows times their pairs' routing weights, into y[pair] or (ATOMIC) added into
    out[token]; padding rows and columns past H are not written."""
    pairs = tessera.view(sorted_ids_ptr, (rows,)).block((BM,), (pid_m,)).load(fill=-1)
    real = (pairs >= 0) & (pairs < numel)
    acc = acc * tessera.load(weights_ptr + pairs, mask=real)[:, None]
    cols = pid_n * BN + tessera.arange(0, BN)
    inside = real[:, None] & (cols < H)[None, :]
    if ATOMIC:
        tokens = (pairs // TOP_K).to(tessera.i64)
        tessera.atomic_add(out_ptr + tokens[:, None] * H + cols[None, :], acc, mask=inside)
    else:
        tessera.store(out_ptr + pairs.to(tessera.i64)[:, None] * H + cols[None, :], acc, mask=inside)


@tessera.kernel
def down_kernel(h_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, offsets_ptr, rows, H, I,
                E, h_e, numel, TOP_K: tessera.constexpr, ATOMIC: tessera.constexpr, BM: tessera.constexpr,
                BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr,
                ALIGN: tessera.constexpr = (1, 1)):
    """weight[pair] * (h[r] @ W2[e]^T) for one BM x BN tile: into y[pair] (its own row), or added into out[token]
    (ATOMIC, float32). ALIGN: what the op checked H and I are multiples of."""
    state_multiples((H, I), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        return
    down_tile(h_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, pid_m, pid_n, rows, H, I, h_e,
              numel, TOP_K, ATOMIC, BM, BN, BK, STAGES)


@tessera.func
def down_tile(h_ptr, w2_ptr, out_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, pid_m, pid_n, rows, H, I, h_e,
              numel, TOP_K, ATOMIC, BM, BN, BK, STAGES):
    """One BM x BN tile of weight[pair] * (h @ W2[e]^T), into y[pair] or added into out[token] (ATOMIC)."""
    expert = tessera.load(block_expert_ptr + pid_m)
    h = tessera.view(h_ptr, (rows, I))
    w2_t = tessera.view(w2_ptr, (I, h_e), (1, I))                 # [E * H, I] read as its transpose
    acc = expert_block_gemm(h, w2_t, pid_m, 0, expert * H + pid_n * BN, I, BM, BN, BK, STAGES)
    weighted_rows_out(acc, out_ptr, weights_ptr, sorted_ids_ptr, pid_m, pid_n, rows, H, numel, TOP_K, ATOMIC, BM, BN)


@tessera.kernel
def combine_kernel(y_ptr, out_ptr, T, H, TOP_K: tessera.constexpr, K_PAD: tessera.constexpr,
                   BT: tessera.constexpr, BH: tessera.constexpr):
    """out[t] = sum over j of y[t * TOP_K + j], in float32, in slot order."""
    combine_tile(y_ptr, out_ptr, tessera.program_id(0), tessera.program_id(1), T, H, TOP_K, K_PAD, BT, BH)


@tessera.func
def combine_tile(y_ptr, out_ptr, pid_t, pid_h, T, H, TOP_K, K_PAD, BT, BH):
    """out[t] = sum over j of y[t * TOP_K + j] for a BT x BH tile of out."""
    y = tessera.view(y_ptr, (T, TOP_K, H)).block((BT, K_PAD, BH), (pid_t, 0, pid_h)).load()
    total = tessera.sum(y.to(tessera.f32), 1)
    tessera.view(out_ptr, (T, H)).block((BT, BH), (pid_t, pid_h)).store(total)


# ---------------------------------------------------------------------------
# The backward pass's GEMMs (`autograd.py`)


@tessera.kernel
def grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, block_expert_ptr, offsets_ptr, rows, N, K, E, b_rows,
                        TRANS_B: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                        BK: tessera.constexpr, STAGES: tessera.constexpr, ALIGN: tessera.constexpr = (1, 1)):
    """C[r] = A[r] @ op(B[e]) for one BM x BN tile of the aligned rows: B[e] is [N, K] (TRANS_B; B is
    [E * N, K], b_rows = E * N) or [K, N] (B is [E * K, N], b_rows = E * K). ALIGN: what N and K are multiples of."""
    state_multiples((N, K), ALIGN)
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    c = tessera.view(c_ptr, (rows, N)).block((BM, BN), (pid_m, pid_n))
    if pid_m * BM >= tessera.load(offsets_ptr + E):
        c.store(tessera.zeros((BM, BN), dtype=tessera.f32))
        return
    expert = tessera.load(block_expert_ptr + pid_m)
    a = tessera.view(a_ptr, (rows, K))
    if TRANS_B:
        b = tessera.view(b_ptr, (K, b_rows), (1, K))
        acc = expert_block_gemm(a, b, pid_m, 0, expert * N + pid_n * BN, K, BM, BN, BK, STAGES)
    else:       # rows of B past this expert's K meet A's columns past K: zeros
        b = tessera.view(b_ptr, (b_rows, N))
        acc = expert_block_gemm(a, b, pid_m, expert * K, pid_n * BN, K, BM, BN, BK, STAGES)
    c.store(acc)


@tessera.kernel
def weight_grad_kernel(g_ptr, a_ptr, dw_ptr, offsets_ptr, rows, N, K, E, BN: tessera.constexpr,
                       BK: tessera.constexpr, BR: tessera.constexpr, STAGES: tessera.constexpr,
                       ALIGN: tessera.constexpr = (1, 1)):
    """dW[e] = G[rows of e]^T @ A[rows of e], one BN x BK tile of the [E, N, K] gradient per program. An
    expert's rows start and end on multiples of BR (BR divides the alignment's BM); padding rows are 0.
    ALIGN: what N and K are multiples of."""
    state_multiples((N, K), ALIGN)
    e, pid_n, pid_k = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    first, last = tessera.load(offsets_ptr + e) // BR, tessera.load(offsets_ptr + e + 1) // BR
    g_t = tessera.view(g_ptr, (N, rows), (1, N))                 # G [rows, N] read as its transpose
    a = tessera.view(a_ptr, (rows, K))
    acc = tessera.zeros((BN, BK), dtype=tessera.f32)
    for r in tessera.pipeline(first, last, stages=STAGES):
        acc = tessera.dot(g_t.block((BN, BR), (pid_n, r)).load(), a.block((BR, BK), (r, pid_k)).load(), acc)
    dw = tessera.view(dw_ptr, (E, N, K)).block((1, BN, BK), (e, pid_n, pid_k))
    dw.store(tessera.expand_dims(acc, 0))
