"""A 16-bit tile in a tensor-core accumulator layout -> a 128B-swizzled shared tile with stmatrix (sm_90+).

Input: the registers of a `rows` x `cols` tile of 16-bit elements (the
GEMM epilogue's C after its cast: the wgmma or mma.sync accumulator layout,
registers converted pairwise by cvt.rn.bf16x2.f32) about to be stored to a
shared tile that one TMA store per column block writes out. Job: when every
register pair (2j, 2j + 1) of every group of eight registers is row r, columns
2 (l % 4) .. +1 of an 8x8 matrix whose rows lane 8j + r can address (what
`mma_operands.ldmatrix_rows` finds for ldmatrix: stmatrix is its inverse), give
the plan (`StmatrixPlan`) and emit one stmatrix x4 per group into the tile
laid out as `WgmmaTileLayout(rows, cols, 2, 128)`: column blocks of 64
elements (128-byte rows, what a TMA box with 128B swizzle holds), each block
row-major, 16-byte chunks XORed with the row index mod 8.

Why: the threads' st.shared of a row-major tile after a layout conversion
moved the f32 accumulator through shared memory twice (64 KB out and back for
a 128x128 tile) before storing 32 KB of bf16; stmatrix stores the 32 KB
straight from the accumulator registers, 16 bytes per lane per instruction,
and the swizzle puts each phase's eight 16-byte rows in eight different bank
groups (checked here, `conflict_free`). Triton and CUTLASS's sm90 epilogues
do the same.

Guarantees: the plan is checked against the stmatrix semantics for every
thread before anything is emitted (the simulator's `_stmatrix` executes the
same rule); a layout with replicas (two threads holding one element), with
rows that do not start on 16 bytes, or row addresses not linear in the
thread-id bits gets None and the caller keeps the threads' st.shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.ir.layouts import RegisterLayout
from tessera.ir.smem_layouts import swizzle_bytes
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..lowering.mma_operands import RowPlan, row_offset, thread_bit_weights, ldmatrix_rows

SWIZZLE = 128           # bytes: the widest TMA swizzle; a 16-bit column block is 64 elements
ELEMENT_BYTES = 2


@dataclass(frozen=True)
class StmatrixPlan:
    """Where each lane's rows go: `tile` (the shared layout), the rows (`RowPlan`), the row addresses
    (unswizzled element offsets) as `base[g] + sum_b bit_b(thread) * weight[b]`, and the column block each
    stmatrix g writes for every lane (`blocks[g]`; None where one spans blocks: then the tile cannot go out a
    block at a time, `tma_store.py`'s sliced staging)."""

    tile: WgmmaTileLayout
    rows: RowPlan
    thread_bits: tuple
    blocks: tuple | None = None


def stmatrix_plan(layout: RegisterLayout, warp: int = 32) -> StmatrixPlan | None:
    """The stmatrix stores of a 16-bit tile of `layout` into a 128B-swizzled `WgmmaTileLayout`, or None."""
    if layout.rank != 2 or not layout.is_bijective:
        return None
    rows, cols = layout.shape
    if rows % 8 or cols % (SWIZZLE // ELEMENT_BYTES):
        return None
    plan = ldmatrix_rows(layout, False, warp, ELEMENT_BYTES)
    if plan is None or set(plan.nums) != {4}:
        return None
    tile = WgmmaTileLayout(rows, cols, ELEMENT_BYTES, SWIZZLE)
    starts = plan.starts                                     # (threads, groups, 2): (row, col) of the lane's row
    plain = tile.plain_offset(starts[..., 0], starts[..., 1]) // ELEMENT_BYTES
    thread_bits = thread_bit_weights(np.asarray(plain, np.int64))
    if thread_bits is None or not conflict_free(tile, starts, warp):
        return None
    block = starts[..., 1] // tile.atom                      # (threads, stmatrices)
    blocks = tuple(int(b) for b in block[0]) if (block == block[:1]).all() else None
    return StmatrixPlan(tile, plan, thread_bits, blocks)


def conflict_free(tile: WgmmaTileLayout, starts: np.ndarray, warp: int = 32) -> bool:
    """Whether each phase of every stmatrix (the 8 rows of one matrix, 16 bytes each) falls in 8 different
    16-byte bank groups of the 128-byte bank line."""
    groups = tile.byte_offset(starts[..., 0], starts[..., 1]) // 16 % 8     # (threads, stmatrices)
    phases = groups.reshape(-1, warp // 8, 8, groups.shape[-1])             # (warps, matrix, row, stmatrix)
    return all(len(set(phases[w, j, :, g])) == 8 for w in range(phases.shape[0])
               for j in range(phases.shape[1]) for g in range(phases.shape[3]))


def store_fragments(ctx, buf, plan: StmatrixPlan, value, block: int | None = None) -> None:
    """One stmatrix x4 per eight registers of `value` (regs of 16-bit elements, the plan's layout) into `buf`
    (the plan's tile, on a 1024-byte boundary); no fence, no barrier. With `block`, only the stmatrices of that
    column block (`plan.blocks`), into `buf` holding that block alone (rows x 64 elements, the same swizzle:
    a block is a whole number of the swizzle's 1024-byte periods)."""
    swizzle = swizzle_bytes(SWIZZLE, ELEMENT_BYTES)
    registers = ctx.unpack(value)
    groups = range(len(plan.rows.nums))
    base, weights = plan.thread_bits
    if block is not None:
        groups = [g for g in groups if plan.blocks[g] == block]
        base = np.asarray(base) - block * plan.tile.rows * plan.tile.atom      # offsets in the block's slice
    for g in groups:
        row = ctx.emit("addptr", buf, row_offset(ctx, (base, weights), g, swizzle))
        ctx.create("stmatrix", [row, ctx.pack(registers[8 * g:8 * g + 8])], {"num": 4, "trans": False})
