"""`schedule/pair_store.pair_plan`: which 32-bit register layouts st.shared.v2 stores pair by pair into the
128B-swizzled column blocks (32 f32 a box row) a TMA store reads, and their measured bank conflicts.

* the wgmma accumulator of the library GEMM's 128 x 128 tile on 8 warps, and the mma.sync accumulator (sm_90
  without wgmma), get a plan: BM x BN / (2 x 32 x warps) pairs per thread, each at row r, columns c, c + 1
  (c even), whose unswizzled offsets are linear in the thread-id bits;
* `swizzled_tile` (the `SmemLayout` that `bank_conflicts` scores) has the same offsets as the
  `WgmmaTileLayout` the TMA box reads;
* measured conflicts: 2-way (a half-warp's v2 stores cover 4 rows x 8 columns; the 128B swizzle XORs the
  16-byte chunk with row % 8, so rows 2i and 2i + 1 swap the same two chunks), against 4-way for the same
  stores into unswizzled 128-byte rows;
* every register lands on its own element (the plan's offsets are a permutation of the tile);
* `blocks`: each pair lies in one 32-column block for every thread (what lets `tma_store.py` stage C a block at
  a time), 8 pairs a block for the GEMM's accumulator; a layout whose threads spread a pair over 64 columns
  still gets a plan, but no blocks;
* a blocked layout (4 contiguous f32: the row-major tile takes 16-byte stores), a replicated one, and a layout
  whose pairs are not two adjacent columns get no plan.
"""

import numpy as np

from tessera.ir.layouts import parse_layout
from tessera.ir.smem_layouts import SmemLayout, bank_conflicts
from tessera.ir.wgmma_layouts import WgmmaTileLayout
from tessera.passes.schedule.pair_store import pair_plan, swizzled_tile

WGMMA_128x128_8_WARPS = "local(1,16).spatial(8,1).local(2,1).spatial(8,4).local(1,2)"   # what the GEMM's acc gets
MMA_SYNC_64x64_4_WARPS = "local(1,8).spatial(4,1).local(2,1).spatial(8,4).local(1,2)"
BLOCKED_128x128_8_WARPS = "local(8,1).spatial(16,16).local(1,8)"


def _pair_offsets(plan, threads):
    base, weights = plan.thread_bits
    t = np.arange(threads)
    return base[None, :] + sum(((t >> b) & 1)[:, None] * w for b, w in enumerate(weights))


def test_the_gemm_accumulator_gets_a_plan_of_pairs_with_two_way_conflicts():
    layout = parse_layout(WGMMA_128x128_8_WARPS)
    plan = pair_plan(layout)
    assert plan is not None and (plan.tile.rows, plan.tile.cols, plan.tile.element_bytes) == (128, 128, 4)
    assert plan.tile.atom == 32 and plan.tile.swizzle == 128 and plan.tile.alignment == 1024
    offsets = _pair_offsets(plan, layout.num_threads)
    assert offsets.shape == (256, 32)                                  # 64 f32 a thread: 32 v2 stores
    table = layout.table()[:, 0::2]
    np.testing.assert_array_equal(offsets, plan.tile.plain_offset(table[..., 0], table[..., 1]) // 4)
    both = np.concatenate([offsets, offsets + 1], axis=1).ravel()      # each pair's two elements
    assert sorted(both) == list(range(128 * 128))
    assert plan.conflicts == 2


def test_each_pair_of_the_accumulators_lies_in_one_column_block_for_every_thread():
    layout = parse_layout(WGMMA_128x128_8_WARPS)
    plan = pair_plan(layout)
    table = layout.table()[:, 0::2]                                    # (threads, pairs, (row, col))
    np.testing.assert_array_equal(table[..., 1] // 32, np.broadcast_to(plan.blocks, table.shape[:2]))
    assert plan.blocks == tuple(g // 8 for g in range(32))
    assert pair_plan(parse_layout(MMA_SYNC_64x64_4_WARPS)).blocks == (0,) * 8 + (1,) * 8
    across = pair_plan(parse_layout("local(2,1).spatial(4,32).local(1,2)"))        # 32 threads x 2 = 64 columns
    assert across is not None and across.blocks is None


def test_the_mma_sync_accumulator_gets_a_plan_too():
    plan = pair_plan(parse_layout(MMA_SYNC_64x64_4_WARPS))
    assert plan is not None and plan.tile.cols // plan.tile.atom == 2 and plan.conflicts == 2


def test_the_smem_layout_scored_is_the_tile_the_tma_box_reads():
    tile = WgmmaTileLayout(64, 96, 4, 128)
    smem = swizzled_tile(tile)
    rows, cols = np.meshgrid(np.arange(64), np.arange(96), indexing="ij")
    np.testing.assert_array_equal(smem(cols // 32, rows, cols % 32) * 4, tile.byte_offset(rows, cols))


def test_without_the_swizzle_the_same_stores_conflict_four_ways():
    layout = parse_layout(WGMMA_128x128_8_WARPS)
    table = layout.table()[:, 0::2]
    plain = SmemLayout((4, 128, 32), (128 * 32, 32, 1))
    swizzled = swizzled_tile(WgmmaTileLayout(128, 128, 4, 128))
    worst = {}
    for name, smem in (("plain", plain), ("swizzled", swizzled)):
        worst[name] = max(bank_conflicts(smem, np.stack([np.stack([c // 32, r, c % 32 + e], -1) for e in (0, 1)], 1)
                                         [w:w + 32], 4)
                          for g in range(table.shape[1]) for r, c in [(table[:, g, 0], table[:, g, 1])]
                          for w in range(0, 256, 32))
    assert worst == {"plain": 4, "swizzled": 2}


def test_a_blocked_a_replicated_and_an_odd_column_layout_get_no_plan():
    blocked = parse_layout(BLOCKED_128x128_8_WARPS)
    assert blocked.shape == (128, 128) and pair_plan(blocked) is None
    replicated = parse_layout("local(2,16).spatial(4,1).local(2,1).spatial(8,4).local(1,2).replicated(2)")
    assert not replicated.is_bijective and pair_plan(replicated) is None
    # registers 0 and 1 are rows apart, not adjacent columns (its row-major stores are as narrow as pairs)
    column = parse_layout("local(1,16).spatial(32,8).local(4,1)")
    assert column.shape == (128, 128) and column.is_bijective and pair_plan(column) is None
