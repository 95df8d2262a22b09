"""Tensor-core dot: when `dot` runs on mma.sync m16n8k16, and in which layouts.

`dot(a[M,K], b[K,N], acc[M,N])` with f16 or bf16 inputs, an f32
accumulator, M % 16 == N % 8 == K % 16 == 0 and a target with the
"mma.sync" feature (32-lane warps) becomes `mma_m16n8k16` thread ops;
anything else keeps the FMA lowering (`lowering/dot.py`).

The warps tile the M x N accumulator in 16x8 fragments: WM x WN warps
(split like the blocked layout: a factor of two at a time to whichever of
M, N has more elements left per warp; warps that find no fragment to own
replicate the whole accumulator), each holding RM x RN fragments of its
(M/WM) x (N/WN) block as more registers:

    C  local(RM, RN) . replicated(WR) . spatial(WM, WN) . mma_m16n8k16_c()
    A  local(RM, RK) . replicated(WR) . spatial(WM, 1) . replicated(WN) . mma_m16n8k16_a()
    B  local(RK, RN) . replicated(WR * WM) . spatial(1, WN) . mma_m16n8k16_b()

A warp needs the rows of A and the columns of B of its block, so A is
replicated over the WN warps that share rows, and B over the WM warps that
share columns. Register (rm, rn, i) of C is `(rm * RN + rn) * 4 + i`; of A
`(rm * RK + rk) * 8 + i`; of B `(rk * RN + rn) * 4 + i`, with i the
fragment's own register order (the order mma.sync takes them in).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation
from tessera.ir.layouts import (RegisterLayout, local, mma_m16n8k16_a, mma_m16n8k16_b, mma_m16n8k16_c,
                                replicated, spatial)
from tessera.ir.target import Target
from tessera.ir.types import scalar_dtype

MMA_M, MMA_N, MMA_K = 16, 8, 16
MMA_INPUTS = (dt.f16, dt.bf16)


@dataclass(frozen=True)
class MmaPlan:
    """The layouts of one tensor-core dot and how many fragments each warp holds."""

    a: RegisterLayout
    b: RegisterLayout
    c: RegisterLayout
    rm: int     # fragments per warp along M
    rn: int     # ... along N
    rk: int     # ... along K (the whole K: every warp walks it)


def mma_plan(op: Operation, target: Target, num_warps: int) -> MmaPlan | None:
    """How `op` (a dot) runs on mma.sync m16n8k16 with `num_warps` warps; None: it does not (FMA)."""
    if op.name != "dot" or not target.has("mma.sync") or target.warp_size != 32:
        return None
    a, b, acc = (v.type for v in op.operands)
    source, accumulate = scalar_dtype(a), scalar_dtype(acc)
    (m, k), (_, n) = a.shape, b.shape
    if source not in MMA_INPUTS or accumulate != dt.f32 or m % MMA_M or n % MMA_N or k % MMA_K:
        return None
    rm, rn, rk = m // MMA_M, n // MMA_N, k // MMA_K
    wm = wn = 1
    left = num_warps
    while left > 1:
        if rm % 2 == 0 and (rm * MMA_M >= rn * MMA_N or rn % 2):
            wm, rm = wm * 2, rm // 2
        elif rn % 2 == 0:
            wn, rn = wn * 2, rn // 2
        else:
            break
        left //= 2
    wr = left
    c = local(rm, rn) * replicated(wr) * spatial(wm, wn) * mma_m16n8k16_c()
    a_layout = local(rm, rk) * replicated(wr) * spatial(wm, 1) * replicated(wn) * mma_m16n8k16_a()
    b_layout = local(rk, rn) * replicated(wr * wm) * spatial(1, wn) * mma_m16n8k16_b()
    return MmaPlan(a_layout, b_layout, c, rm, rn, rk)
