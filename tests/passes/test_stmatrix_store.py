"""`schedule/stmatrix_store.stmatrix_plan`: which register layouts stmatrix x4 stores into the 128B-swizzled
column blocks a TMA store reads, and that each phase of those stores is free of bank conflicts.

* the wgmma accumulator of the library GEMM's 128 x 128 tile on 8 warps gets a plan (the mma.sync one: the sm_90
  test of tests/kernels_lib/test_gemm_tma_store.py):
  BM x BN / (32 x 8 x warps) stmatrix per thread, every phase's 8 rows in 8 different 16-byte bank groups;
* `blocks`: each stmatrix writes one 64-column block for every lane (what lets `tma_store.py` stage C a block
  at a time), 4 a block at 128 x 128 on 8 warps;
* the same rows without the swizzle (row-major rows of 128 bytes) would put all 8 in one bank group;
* a blocked layout (the threads' vector stores) and a layout with replicas get no plan.
"""

from tessera.ir.layouts import parse_layout
from tessera.ir.wgmma_layouts import WgmmaTileLayout
from tessera.passes.schedule.stmatrix_store import conflict_free, stmatrix_plan

WGMMA_128x128_8_WARPS = "local(1,16).spatial(8,1).local(2,1).spatial(8,4).local(1,2)"   # what the GEMM's acc gets
BLOCKED_128x128_8_WARPS = "local(8,1).spatial(16,16).local(1,8)"                         # its view store's anchor


def test_the_gemm_accumulator_gets_a_conflict_free_plan():
    plan = stmatrix_plan(parse_layout(WGMMA_128x128_8_WARPS))
    assert plan is not None and plan.rows.nums == (4,) * 8            # 64 registers a thread: 8 x4 stores
    assert (plan.tile.rows, plan.tile.cols, plan.tile.swizzle) == (128, 128, 128)
    assert conflict_free(plan.tile, plan.rows.starts)


def test_each_stmatrix_of_the_gemm_accumulator_writes_one_column_block():
    plan = stmatrix_plan(parse_layout(WGMMA_128x128_8_WARPS))
    starts = plan.rows.starts                                         # (threads, stmatrices, (row, col))
    assert (starts[..., 1] // 64 == plan.blocks).all() and plan.blocks == (0,) * 4 + (1,) * 4


def test_without_the_swizzle_the_eight_rows_of_a_phase_share_one_bank_group():
    plan = stmatrix_plan(parse_layout(WGMMA_128x128_8_WARPS))
    starts = plan.rows.starts
    plain = WgmmaTileLayout(128, 128, 2, 128).plain_offset(starts[..., 0], starts[..., 1])
    groups = (plain // 16 % 8).reshape(-1, 4, 8, starts.shape[1])
    assert all(len(set(groups[w, j, :, g])) == 1 for w in range(groups.shape[0]) for j in range(4)
               for g in range(starts.shape[1]))


def test_a_blocked_layout_and_a_replicated_one_get_no_plan():
    assert stmatrix_plan(parse_layout(BLOCKED_128x128_8_WARPS)) is None
    # the accumulator's fragments held twice (two threads per element): stmatrix would write each row twice
    replicated = parse_layout("local(2,16).spatial(4,1).local(2,1).spatial(8,4).local(1,2).replicated(2)")
    assert replicated.shape == (128, 128) and not replicated.is_bijective
    assert stmatrix_plan(replicated) is None
