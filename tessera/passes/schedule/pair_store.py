"""A 32-bit tile in a tensor-core accumulator layout -> a 128B-swizzled shared tile with st.shared.v2 (sm_90+).

Input: the registers of a `rows` x `cols` tile of 32-bit elements (the GEMM
epilogue's C with out_dtype float32: the wgmma or mma.sync accumulator, each
thread holding register pairs (2j, 2j + 1) at row r, columns c, c + 1 with c
even) about to be stored to a shared tile that one TMA store per column
block writes out. Job: give the plan (`PairPlan`) and emit one 8-byte
st.shared.v2 per register pair into the tile laid out as
`WgmmaTileLayout(rows, cols, 4, 128)`: column blocks of 32 elements (128-byte
rows, what a TMA box with 128B swizzle holds), each block row-major, 16-byte
chunks XORed with the row index mod 8. A pair is 8 bytes of one 16-byte chunk,
so the swizzle keeps it whole.

Why: without it the layout assignment converted the accumulator to a
row-major-friendly layout through a shared buffer (64 KiB for a 128 x 128 f32
tile) and the threads then wrote the staging tile again: two trips through
shared memory. This is stmatrix's path (`stmatrix_store.py`) for elements
stmatrix cannot move (it is 16-bit only). In the accumulator a quad of lanes
holds 8 consecutive columns of one row and a warp 8 rows, so a half-warp
phase of v2 stores (16 lanes x 8 bytes) touches 4 rows x 32 bytes: without
swizzle the rows, 128 bytes apart, would fall on the same 8 banks (4-way
conflict); the swizzle XORs the 16-byte chunk with row % 8, which moves rows
2i and 2i + 1 onto the same two chunks (swapped), so 2-way remains.
`PairPlan.conflicts` is the worst phase's degree (`bank_conflicts`): 2 for the
wgmma and mma.sync accumulators. (Conflict-free would need the odd rows'
lanes to store the column group 16 columns over in the same instruction:
two selects per register pair, not done.) A plan is made whatever its
degree: the alternative, a conversion through shared memory and a second
write, costs more.

Guarantees: every register is written exactly once (a bijective layout, each
pair two adjacent columns from an even one); the row addresses are linear in
the thread-id bits (`thread_bit_weights`) or there is no plan. A layout whose
row-major store is already wider than a pair (a blocked layout with 4
contiguous f32: 16-byte vectors into a row-major tile) gets None: it keeps
the threads' st.shared.v4 of `tma_store.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.ir.layouts import RegisterLayout
from tessera.ir.smem_layouts import SmemLayout, bank_conflicts, swizzle_bytes
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..lowering.layout_math import row_major_strides, shared_vector_width
from ..lowering.mma_operands import folded_row_offset, thread_bit_weights

SWIZZLE = 128           # bytes: the widest TMA swizzle; a 32-bit column block is 32 elements
ELEMENT_BYTES = 4


@dataclass(frozen=True)
class PairPlan:
    """Where each thread's register pairs go: `tile` (the shared layout), the pairs' unswizzled element offsets
    as `base[g] + sum_b bit_b(thread) * weight[b]` (`thread_bits`), the worst bank-conflict degree of one
    warp's v2 stores (`conflicts`, 1 = conflict-free), and the column block each pair g lies in for every
    thread (`blocks[g]`; None where the threads' pair g spans blocks: then the tile cannot go out a block at a
    time, `tma_store.py`'s sliced staging)."""

    tile: WgmmaTileLayout
    thread_bits: tuple
    conflicts: int
    blocks: tuple | None = None


def pair_plan(layout: RegisterLayout, max_vector_bits: int = 128, warp: int = 32, banks: int = 32) \
        -> PairPlan | None:
    """The st.shared.v2 stores of a 32-bit tile of `layout` into a 128B-swizzled `WgmmaTileLayout`, or None."""
    if layout.rank != 2 or not layout.is_bijective or layout.local_size % 2 or layout.num_threads % warp:
        return None
    rows, cols = layout.shape
    if rows % 8 or cols % (SWIZZLE // ELEMENT_BYTES):
        return None
    if shared_vector_width(layout, row_major_strides(layout.shape), 32, max_vector_bits) > 2:
        return None                                         # the row-major tile takes wider stores
    table = layout.table()                                  # (threads, registers, 2): (row, col)
    first, second = table[:, 0::2], table[:, 1::2]
    if (first[..., 1] % 2).any() or not np.array_equal(second, first + np.array([0, 1])):
        return None
    tile = WgmmaTileLayout(rows, cols, ELEMENT_BYTES, SWIZZLE)
    plain = tile.plain_offset(first[..., 0], first[..., 1]) // ELEMENT_BYTES   # (threads, pairs)
    thread_bits = thread_bit_weights(np.asarray(plain, np.int64))
    if thread_bits is None:
        return None
    block = first[..., 1] // tile.atom                      # (threads, pairs)
    blocks = tuple(int(b) for b in block[0]) if (block == block[:1]).all() else None
    return PairPlan(tile, thread_bits, _conflicts(tile, first, warp, banks), blocks)


def swizzled_tile(tile: WgmmaTileLayout) -> SmemLayout:
    """`tile` as an `SmemLayout` of (column block, row, column in block) in elements: the same offsets
    (a column block is rows x 128 bytes, a multiple of the swizzle's 1024-byte period)."""
    atom = tile.atom
    return SmemLayout((tile.cols // atom, tile.rows, atom), (tile.rows * atom, atom, 1),
                      swizzle_bytes(tile.swizzle, tile.element_bytes))


def _conflicts(tile: WgmmaTileLayout, first: np.ndarray, warp: int, banks: int) -> int:
    """Worst bank-conflict degree of any warp's v2 store of any pair (`bank_conflicts`, phases of 16 lanes)."""
    smem = swizzled_tile(tile)
    atom = tile.atom
    worst = 1
    for g in range(first.shape[1]):
        row, col = first[:, g, 0], first[:, g, 1]
        pair = np.stack([np.stack([col // atom, row, col % atom + e], axis=-1) for e in (0, 1)], axis=1)
        for w in range(0, len(pair), warp):
            worst = max(worst, bank_conflicts(smem, pair[w:w + warp], ELEMENT_BYTES, banks))
    return worst


def store_pairs(ctx, buf, plan: PairPlan, value, block: int | None = None) -> None:
    """One st.shared.v2 per register pair of `value` (regs of 32-bit elements, the plan's layout) into `buf`
    (the plan's tile, on a 1024-byte boundary): one vector-2 `store` of the whole tile; no fence, no barrier.
    With `block`, only the pairs of that column block (`plan.blocks`), into `buf` holding that block alone
    (rows x 32 elements, the same swizzle: a block is a whole number of the swizzle's 1024-byte periods)."""
    swizzle = swizzle_bytes(SWIZZLE, ELEMENT_BYTES)
    pairs = range(value.type.count // 2)
    base, weights = plan.thread_bits
    if block is not None:
        pairs = [g for g in pairs if plan.blocks[g] == block]
        base = np.asarray(base) - block * plan.tile.rows * plan.tile.atom      # offsets in the block's slice
    pointers, registers = [], []
    for g in pairs:
        pair = ctx.emit("addptr", buf, folded_row_offset(ctx, (base, weights), g, swizzle))
        pointers += [pair, ctx.emit("addptr", pair, ctx.const(1))]
        registers += [ctx.extract(value, 2 * g), ctx.extract(value, 2 * g + 1)]
    ctx.create("store", [ctx.pack(pointers), ctx.pack(registers)], {"vector": 2})
