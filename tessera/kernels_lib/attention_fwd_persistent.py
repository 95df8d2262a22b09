"""The persistent attention forward: one program per SM, looping over (batch, head, query-block) tiles.

FlashAttention-3 runs its sm_90a forward this way: a grid of min(tiles, SMs)
programs, each taking every num_programs-th tile, so that with the key loop
warp-specialized the producer warpgroup walks the tiles too and starts the
next tile's K and V fills while the consumers run this tile's epilogue (O's
store, the LSE) (`passes/schedule/warp_specialized_tiles.py`); a TMA store of
O inside the tile loop waits for its reads only before the next tile's
(`passes/schedule/tma_store.py`); the producer loads each tile's Q block by
TMA as soon as the consumers' last Q K^T of the tile before has retired, so
it lands during that tile's epilogue, and, in FlashAttention-3's order, the
tile's first K block before it waits for that (with the overlapped order
also the last V block after the tile's fills: every K and V load is the
producer's; `passes/schedule/tile_operands.py`).
The per-tile body is `attention_tile`, the one the one-tile kernel runs.

Tile order. Tile t is (m-block, batch * head) by scalar math, which the
producer can run (it reads no memory). With a right bound (causal), query
block m sees about m + 1 key blocks: the heaviest blocks go first (m-blocks
in descending order, every (batch, head) of one m-block before the next), so
the last wave of tiles is the lightest and the tail short (FlashAttention-3's
longest-processing-time-first order). Without one every block costs the
same, and the m-blocks of one (batch, head) run next to each other, reading
the same K and V while they are in L2.

Plain calls only (what the warp-specialized forward takes: not varlen, fp8
or fused hooks), and not PINGPONG: the lowering refuses `pingpong=True`
inside a persistent tile loop (`persistent.specialized_tile_loop_refusal`),
since each consumer warpgroup would need its own copy of the tile loop.
`attention.py` launches it where TESSERA_ATTENTION_PERSISTENT=1 asks.
"""

from __future__ import annotations

import tessera

from .attention_fwd import attention_tile


@tessera.func
def tile_coordinates(tile, num_m, pairs, HEAVIEST_FIRST):
    """(m-block, batch * head pair) of tile index `tile` of num_m * pairs: with HEAVIEST_FIRST the m-block is
    the slow index, counted down from num_m - 1; else the pair is, and the m-blocks of one pair are adjacent."""
    if HEAVIEST_FIRST:
        return num_m - 1 - tile // pairs, tile % pairs
    return tile % num_m, tile // num_m


@tessera.kernel(fast_math=True)
def attention_fwd_persistent_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, batch,
                                    Sq, Sk, H, H_KV, qk_scale, softcap, left, right,
                                    stride_qb, stride_qs, stride_qh, stride_qd,
                                    stride_kb, stride_ks, stride_kh, stride_kd,
                                    stride_vb, stride_vs, stride_vh, stride_vd,
                                    stride_ob, stride_os, stride_oh, stride_od, stride_lb, stride_lh,
                                    D: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                                    HAS_LEFT: tessera.constexpr, HAS_RIGHT: tessera.constexpr,
                                    SOFTCAP: tessera.constexpr, STAGES: tessera.constexpr,
                                    WS: tessera.constexpr = False, POSITIVE_SCALE: tessera.constexpr = True,
                                    OVERLAP: tessera.constexpr = False):
    """`attention_fwd_kernel`'s plain forward (batch sequences of Sq queries, Sk keys) over a grid of at most
    one program per SM (`attention._forward`), each taking every num_programs(0)-th tile."""
    num_m = tessera.cdiv(Sq, BM)
    pairs = batch * H
    for tile in range(tessera.program_id(0), num_m * pairs, tessera.num_programs(0)):
        pid_m, bh = tile_coordinates(tile, num_m, pairs, HAS_RIGHT)
        attention_tile(pid_m, bh, (q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q_ptr, q_ptr, q_ptr),  # (unused: varlen, fp8)
                       (Sq, Sk, H, H_KV, qk_scale, softcap, left, right, Sk),
                       (stride_qb, stride_qs, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
                        stride_vb, stride_vs, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_od,
                        stride_lb, stride_lh),
                       (q_ptr, q_ptr, 0, 0, q_ptr, 0, 0, 0, 0, 0.0),      # no fused hooks
                       (D, BM, BN, HAS_LEFT, HAS_RIGHT, SOFTCAP, False, STAGES, False, WS, POSITIVE_SCALE, OVERLAP,
                        False),
                       (None, (), None, (), False))
