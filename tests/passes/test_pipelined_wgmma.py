"""A dot in a software-pipelined loop on sm_90a: wgmma reading the ring slots (the plan and the IR).

Specification (the numbers are in the simulator tests, `tests/interp/test_simt_pipelined_wgmma.py`):

* `pipeline_plan` puts each pipelined block in a wgmma tile layout (`PipelinedLoad.slot_layout`): K-major
  when the view is contiguous along K, MN-major otherwise, with the widest swizzle that fits; the rings
  start on the swizzle pattern and the stages still shrink until the rings fit shared memory;
* with an accumulator carried from block argument to yield (S = 2 included), one wgmma group stays in
  flight, also with several fragments per warpgroup (one stack, each wgmma updating its fragment in
  place); the copies run S - 1 iterations ahead (issue 19: the refill comes after wgmma_wait
  {pending = 1}, so no ring slot is wasted);
* filled by cp.async (here: sm_90a with TMA taken away), the loop reads as: prologue of S - 1 copy
  groups; in the body async_wait, fence_proxy_async, barrier, wgmma_fence, the wgmmas (no ldmatrix, no
  stores to shared memory), commit, wgmma_wait {pending = 1}, barrier, the refill; after the loop
  wgmma_wait {pending = 0}, async_wait 0, barrier; with no group in flight the refill stays right after
  the first barrier;
* filled by TMA (sm_90a), the same with mbarrier_wait in place of async_wait and no barrier before the
  wgmmas (each thread waits on the slot's mbarrier itself), no proxy fence (TMA and wgmma both go
  through the async proxy), the prologue and the refill thread-0 TMA issues, and after the loop the
  mbarriers invalidated before the barrier.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tessera
from tessera.ir.target import get_target
from tessera.ir.wgmma_layouts import WgmmaTileLayout
from tessera.passes.schedule.pipeline_plan import pipeline_plan
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "simt"))
from test_simt_pipelined_wgmma import FILLS, Case  # noqa: E402


def plan_of(case: Case, num_warps: int = 4):
    fn = case.module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for" and op.attrs.get("stages", 1) > 1)
    return pipeline_plan(loop, get_target("sm_90a"), num_warps, VectorFacts(fn).facts)


SYNC_OPS = {"async_wait", "fence_proxy_async", "barrier", "async_commit", "wgmma_fence", "wgmma_commit",
            "wgmma_wait", "wgmma", "ldmatrix", "store", "for", "mbarrier_wait", "if"}


def skeleton(ops) -> list[str]:
    """The synchronization ops (and wgmmas, ldmatrix, stores) of a block, with their pending counts."""
    return [op.name + (f" {op.attrs['pending']}" if "pending" in op.attrs else "") for op in ops if op.name in SYNC_OPS]


@pytest.mark.parametrize("trans_a, trans_b, majors, swizzles", [
    (False, False, ("K", "MN"), (128, 128)),          # row-major A and B: B is N-contiguous
    (True, True, ("MN", "K"), (128, 128)),
], ids=["row-major", "both-transposed"])
def test_slots_are_wgmma_tiles_of_the_major_the_view_is_contiguous_in(trans_a, trans_b, majors, swizzles):
    plan = plan_of(Case(128, 128, 256, 128, 128, 64, 3, trans_a=trans_a, trans_b=trans_b), 8)
    a, b = plan.loads
    assert (a.slot_layout.major, b.slot_layout.major) == majors
    assert (a.slot_layout.swizzle, b.slot_layout.swizzle) == swizzles
    assert a.fragment is None and a.want is None and a.slot_layout.alignment == 1024


def test_slot_shapes_and_narrow_swizzles():
    plan = plan_of(Case(64, 32, 64, 64, 32, 16, 3))     # A: 64 x 16 K-major (32 B rows); B: 16 x 32 MN-major
    assert [load.slot_layout for load in plan.loads] == [WgmmaTileLayout(64, 16, 2, 32, "K"),
                                                         WgmmaTileLayout(16, 32, 2, 64, "MN")]


@pytest.mark.parametrize("stages, num_warps, block, in_flight", [
    (3, 4, (64, 64, 64), 1), (4, 8, (128, 128, 64), 1), (2, 4, (64, 64, 64), 1),
    (4, 4, (128, 128, 64), 1)],     # 128 rows on one warpgroup: a stack of two fragments (wgmma offset)
    ids=["3-stages", "4-stages-two-warpgroups", "2-stages", "two-fragments"])
def test_a_group_stays_in_flight_when_the_schedule_allows(stages, num_warps, block, in_flight):
    plan = plan_of(Case(128, 128, 512, *block, stages), num_warps)
    assert (plan.stages, plan.in_flight, plan.prefetch) == (stages, in_flight, stages - 1)


def test_stages_shrink_to_fit_shared_memory():
    # 128 x 128 and 128 x 128 bf16 blocks: 64 KiB a stage; sm_90a has 227 KiB per block
    plan = plan_of(Case(256, 256, 1024, 128, 128, 128, 8, tessera.bf16), 8)
    assert (plan.requested_stages, plan.stages) == (8, 3)
    assert plan.shared_bytes == 3 * 65536 <= get_target("sm_90a").shared_memory_bytes


def loop_and_after(fn):
    """(skeleton of the pipelined loop's body, skeleton of the function up to the loop's epilogue)."""
    loop = next(op for op in fn.body.ops if op.name == "for")
    top = skeleton(fn.body.ops)
    return skeleton(loop.regions[0].ops), top[:top.index("for") + 4]     # (the epilogue's own ops follow)


def test_the_lowered_loop_reads_the_slots_through_descriptors_with_a_group_in_flight():
    body, top = loop_and_after(lower(Case(128, 128, 512, 128, 128, 32, 4).module, FILLS["cp.async"], 8).functions[0])
    assert top == ["async_commit", "async_commit", "async_commit",  # prologue: iterations 0 .. 2 (S - 1 ahead)
                   "for", "wgmma_wait 0", "async_wait 0", "barrier"]
    assert body == [
        "async_wait 2", "fence_proxy_async", "barrier",     # iteration i landed, visible to wgmma, published
        "wgmma_fence", "wgmma", "wgmma", "wgmma_commit",    # BK = 32: two k16 slices, straight from the slots
        "wgmma_wait 1",                                     # this iteration's group stays in flight ...
        "barrier", "async_commit"]                          # ... group i - 1 retired everywhere: refill slot i - 1


def test_two_stages_keep_a_group_in_flight_and_prefetch_one_ahead():
    body, top = loop_and_after(lower(Case(128, 128, 512, 128, 128, 32, 2).module, FILLS["cp.async"], 8).functions[0])
    assert top[:4] == ["async_commit", "for", "wgmma_wait 0", "async_wait 0"]
    assert body == ["async_wait 0", "fence_proxy_async", "barrier", "wgmma_fence", "wgmma", "wgmma",
                    "wgmma_commit", "wgmma_wait 1", "barrier", "async_commit"]


def test_two_fragments_per_warpgroup_stay_in_flight_as_one_stack():
    # 128 rows on one warpgroup: two m64 accumulator fragments, one stack that each wgmma updates in place
    # (offset 0 for rows 0..63, 64 for rows 64..127), so the group stays in flight as with one fragment
    fn = lower(Case(128, 128, 512, 128, 128, 32, 3).module, FILLS["cp.async"], 4).functions[0]
    body, _ = loop_and_after(fn)
    assert body == ["async_wait 1", "fence_proxy_async", "barrier", "wgmma_fence",
                    "wgmma", "wgmma", "wgmma", "wgmma", "wgmma_commit", "wgmma_wait 1", "barrier", "async_commit"]
    loop = next(op for op in fn.body.ops if op.name == "for")
    assert [op.attrs["offset"] for op in loop.regions[0].ops if op.name == "wgmma"] == [0, 0, 64, 64]


def test_tma_filled_slots_are_waited_for_on_their_mbarriers_without_proxy_fences():
    body, top = loop_and_after(lower(Case(128, 128, 512, 128, 128, 32, 4).module, "sm_90a", 8).functions[0])
    assert top == ["if", "barrier",                         # thread 0 initializes the slots' mbarriers
                   "if", "if", "if",                        # prologue: TMA issues of iterations 0 .. 2
                   "for", "wgmma_wait 0", "if", "barrier"]  # after the loop: invalidate the mbarriers
    assert body == [
        "mbarrier_wait",                                    # iteration i landed (async proxy), seen by each thread
        "wgmma_fence", "wgmma", "wgmma", "wgmma_commit",
        "wgmma_wait 1", "barrier",                          # group i - 1 retired in both warpgroups
        "if"]                                               # thread 0 refills: iteration i + 3, into slot i - 1
