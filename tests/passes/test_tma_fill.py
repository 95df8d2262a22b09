"""The TMA fill of pipelined loads (`passes/schedule/tma_fill.py`): which loads qualify, and the thread IR.

Specification:

* on sm_90 / sm_90a the pipelined A and B loads of a matmul whose views are
  kernel pointer parameters with 16-byte aligned rows get a `TmaBox`: a recipe
  naming the parameters (sizes, strides), the box, and the TMA swizzle equal
  to the slot's; sm_80 (no TMA) keeps cp.async;
* the boxes land exactly where the slot layout puts each element: an mma.sync
  slot is one box; a wgmma slot (K- or MN-major, 128B / 64B / 32B / no
  swizzle) is one box per column block, rows x (swizzle span, 16 bytes
  unswizzled), stacked at the block offsets, each landing as TMA's
  `Swizzle<b, 4, 3>` on bytes (checked element by element against
  `WgmmaTileLayout.byte_offset`, with the simulator's TMA swizzle);
* on sm_90a (wgmma, a group in flight) the prologue issues `plan.prefetch`
  = S - 2 fills, every issue has one tma_load per box and no proxy fence, and
  the loop body neither fences nor waits for cp.async groups;
* the thread IR: the hidden `tensormap` parameters come last; before the
  prologue thread 0 initializes one mbarrier per slot (count 1) and fences
  them for the async proxy, then a barrier; each issue is thread 0 only, for
  a live iteration only: fence_proxy_async, arrive_expect_tx of the boxes'
  bytes, one tma_load per map; the loop carries (slot, phase), waits on the
  slot's mbarrier before the barrier, flips the phase when the slot wraps;
  after the loop thread 0 invalidates the mbarriers before the last barrier;
* the thread IR prints and parses back with its recipes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.tensor_map import UNBOUNDED, Extent, kernel_recipes, swizzle_offsets
from tessera.ir.types import TensorMapType
from tessera.ir.wgmma_layouts import WgmmaTileLayout
from tessera.passes.schedule.pipeline_plan import pipeline_plan
from tessera.passes.schedule.tma_fill import SLOT_ALIGN, slot_boxes
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.thread_passes import lower

from pipeline_kernels import matmul_case


def plan_for(case, target):
    fn = case.module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    return pipeline_plan(loop, get_target(target), 4, VectorFacts(fn).facts)


def names(ops):
    return [op.name for op in ops]


def effects(ops):
    """The names of `ops` without the address and index arithmetic between them."""
    return [name for name in names(ops) if name not in ("addptr", "constant", "mul", "add", "cast")]


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_both_operands_get_a_tma_box_with_the_slot_swizzle(target):
    plan = plan_for(matmul_case(128, 128, 256, 64, 64, 32, 3, tessera.bf16), target)
    boxes = [load.tma for load in plan.loads]
    assert all(boxes) and [b.recipe.box_shape for b in boxes] == [(64, 32), (32, 64)]
    # A's slot rows are 64 bytes (64B swizzle), B's 128 bytes (128B): the swizzle the ldmatrix / wgmma reads expect
    assert [(b.recipe.swizzle, b.slot_align, b.box_bytes, b.boxes) for b in boxes] == [("64B", 512, 4096, 1),
                                                                                        ("128B", 1024, 4096, 1)]
    if target == "sm_90":
        assert [load.fragment.smem.swizzle.bits for load in plan.loads] == [2, 3]
    else:                   # A K-major, B (row-major) MN-major
        assert [(load.slot_layout.swizzle, load.slot_layout.major) for load in plan.loads] == [(64, "K"),
                                                                                              (128, "MN")]


def test_wide_wgmma_slots_take_one_box_per_column_block():
    """BK = 128: A's K-major slot rows are 256 bytes, two 128B column blocks; so are B^T's."""
    plan = plan_for(matmul_case(128, 128, 256, 64, 64, 128, 3, tessera.bf16, trans_b=True), "sm_90a")
    assert [(load.tma.recipe.box_shape, load.tma.recipe.swizzle, load.tma.boxes, load.tma.slot_bytes)
            for load in plan.loads] == [((64, 64), "128B", 2, 16384)] * 2


def tma_landing(layout, boxes):
    """Byte offset in the slot where TMA puts each element (row, col) of the block: box j holds columns
    [j w, (j + 1) w), lands at j * (box bytes), row-major inside, then swizzled as its mode says."""
    mode, width, count = boxes
    e = layout.element_bytes
    rows, cols = np.meshgrid(np.arange(layout.rows), np.arange(layout.cols), indexing="ij")
    box, inner = cols // width, cols % width
    in_box = (rows * width + inner) * e
    return box * (layout.rows * width * e) + swizzle_offsets(in_box, mode)


@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", [128, 64, 32, 0])
@pytest.mark.parametrize("element_bytes", [2, 1])
def test_tma_boxes_land_where_the_wgmma_layout_puts_every_element(major, swizzle, element_bytes):
    rows, cols = 64, 3 * 128 // element_bytes               # three column blocks at 128B, more at narrower spans
    layout = WgmmaTileLayout(rows, cols, element_bytes, swizzle, major)
    boxes = slot_boxes(layout, rows, cols, element_bytes)
    mode, width, count = boxes
    assert mode == (f"{swizzle}B" if swizzle else "none") and width * element_bytes == (swizzle or 16)
    assert count * width == cols and rows * width * element_bytes % SLOT_ALIGN[mode] == 0
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    np.testing.assert_array_equal(tma_landing(layout, boxes), layout.byte_offset(r, c))


def test_a_wgmma_layout_is_not_one_wide_swizzled_box():
    """The counter-check: one box as wide as the slot (were TMA's rows allowed past the span) would put
    columns of the second block in the first block's rows."""
    layout = WgmmaTileLayout(64, 128, 2, 128, "K")
    r, c = np.meshgrid(np.arange(64), np.arange(128), indexing="ij")
    assert (tma_landing(layout, ("128B", 128, 1)) != layout.byte_offset(r, c)).any()


def test_without_tma_the_slots_are_filled_by_cp_async():
    plan = plan_for(matmul_case(128, 128, 256, 64, 64, 32, 3, tessera.bf16), "sm_80")
    assert [load.tma for load in plan.loads] == [None, None]


def test_thread_ir_of_a_tma_filled_pipeline():
    stages = 3
    fn = lower(matmul_case(128, 128, 256, 64, 64, 64, stages, tessera.bf16).module, "sm_90", 4).functions[0]
    # A's and B's maps, then C's: the epilogue stores the block by TMA (`schedule/tma_store.py`)
    assert [a.type for a in fn.args[-3:]] == [TensorMapType()] * 3 and len(kernel_recipes(fn.attrs)) == 3
    assert names(fn.walk()).count("tma_store") == 1
    top = fn.body.ops
    loop = next(op for op in top if op.name == "for" and op.attrs.get("stages"))
    before, after = top[:top.index(loop)], top[top.index(loop) + 1:]

    setup = next(op for op in before if op.name == "if")
    assert effects(setup.regions[0].ops) == ["mbarrier_init"] * stages + ["fence_mbarrier_init", "yield"]
    assert names(before)[names(before).index("if") + 1] == "barrier"
    issues = [op for op in before if op.name == "if"][1:]
    assert len(issues) == stages - 1                                 # the prologue: iterations 0 .. S-2
    for issue in issues:
        assert issue.operands[0].owner.name == "and"                 # thread 0 and the iteration is live
        assert effects(issue.regions[0].ops) == ["fence_proxy_async", "mbarrier_arrive_expect_tx", "tma_load",
                                               "tma_load", "yield"]
        assert names(issue.regions[1].ops) == ["yield"]
    assert "async_copy" not in names(fn.walk()) and "async_wait" not in names(fn.walk())

    body = loop.regions[0]
    assert [a.name_hint for a in body.args[-2:]] == ["slot", "phase"]
    assert effects(body.ops)[:2] == ["mbarrier_wait", "barrier"]
    wait = next(op for op in body.ops if op.name == "mbarrier_wait")
    assert wait.operands[1] is body.args[-1]                          # the carried phase parity
    assert [v.owner.attrs["value"] for v in loop.operands[-2:]] == [0, 0]   # slot 0, phase 0
    flip = body.ops[-1].operands[-1].owner                              # the yielded phase
    assert flip.name == "select" and flip.operands[0] is body.ops[-1].operands[-2].owner.operands[0]

    release = next(op for op in after if op.name == "if")
    assert effects(release.regions[0].ops) == ["mbarrier_inval"] * stages + ["yield"]
    assert names(after).index("if") < names(after).index("barrier")


def test_thread_ir_of_a_tma_filled_wgmma_pipeline():
    stages = 4      # A 64 x 128 (K-major, two 128B boxes), B 128 x 64 (MN-major, one 128B box)
    fn = lower(matmul_case(128, 128, 512, 64, 64, 128, stages, tessera.bf16).module, "sm_90a", 4).functions[0]
    top = fn.body.ops
    loop = next(op for op in top if op.name == "for" and op.attrs.get("stages"))
    before = top[:top.index(loop)]
    issues = [op for op in before if op.name == "if"][1:]
    assert len(issues) == stages - 1                                 # prefetch S - 1, a wgmma group in flight too
    for issue in issues:
        assert effects(issue.regions[0].ops) == ["mbarrier_arrive_expect_tx"] + ["tma_load"] * 3 + ["yield"]
        expect = next(op for op in issue.regions[0].ops if op.name == "mbarrier_arrive_expect_tx")
        assert expect.operands[1].owner.attrs["value"] == (64 * 128 + 128 * 64) * 2
    body = loop.regions[0]
    order = [n for n in names(body.ops) if n in ("mbarrier_wait", "barrier", "wgmma_fence", "wgmma_wait", "if")]
    assert order == ["mbarrier_wait", "wgmma_fence",                # each thread waited on the slot itself
                     "wgmma_wait", "barrier", "if"]                 # the refill, once every group i - 1 retired
    # no proxy fence before a refill (the epilogue's, before its TMA store of C, comes after the loop)
    filling = [*before, loop]
    assert "fence_proxy_async" not in [n for op in filling for n in names(op.walk())]
    assert "async_wait" not in names(fn.walk())
    after = top[top.index(loop) + 1:]
    epilogue = names(after)[names(after).index("fence_proxy_async"):]
    assert epilogue[:3] == ["fence_proxy_async", "barrier", "if"]        # then thread 0's TMA store
    wait = next(op for op in body.ops if op.name == "wgmma_wait")
    assert wait.attrs["pending"] == 1


def test_thread_ir_with_tensor_maps_prints_and_parses_back():
    module = lower(matmul_case(64, 64, 128, 64, 64, 64, 2, tessera.bf16, trans_b=True).module, "sm_90", 4)
    text = print_module(module)
    assert "%a_ptr_tma0: tensormap, %b_ptr_tma1: tensormap" in text and "tensor_maps = [[8, 0, \"bf16\"" in text
    again = parse_module(text)
    assert print_module(again) == text
    assert kernel_recipes(again.functions[0].attrs) == kernel_recipes(module.functions[0].attrs)


# -- views at per-program offsets: the map gets a leading dim per offset --------------------------------

@tessera.kernel
def batched_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_ab, stride_am, stride_bb, stride_bk, stride_cb,
                   BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr,
                   SHIFT: tessera.constexpr = 0):
    """C[z] = A[z] B[z], each matrix of the batch at `ptr + z * stride_*b` (the attention kernels' K and V);
    A's matrices SHIFT elements further on."""
    pid_m, pid_n, z = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    a = tessera.view(a_ptr + z * stride_ab + SHIFT, (M, K), (stride_am, 1))
    b = tessera.view(b_ptr + z * stride_bb, (K, N), (stride_bk, 1))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr + z * stride_cb, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


def batched_case(shift=0, seed=0):
    """A batch of 3 products, 40 x 48 times 48 x 32, each matrix inside a larger one whose rows and columns
    past the view are NaN (so a box that read them, rather than the zeros TMA fills in, would poison C); the
    A's matrices `shift` elements into their padded ones. (module, args, grid, expected)."""
    rng = np.random.default_rng(seed)
    Z, M, N, K = 3, 40, 32, 48
    a_pad = np.full((Z, 64, 64), np.nan, np.float16)
    b_pad = np.full((Z, 64, 48), np.nan, np.float16)
    a_pad.reshape(Z, -1)[:, shift:shift + M * 64].reshape(Z, M, 64)[:, :, :K] = rng.standard_normal((Z, M, K))
    b_pad[:, :K, :N] = rng.standard_normal((Z, K, N))
    c = np.zeros((Z, M, N), np.float32)
    args = [a_pad, b_pad, c, M, N, K, a_pad.strides[0] // 2, a_pad.strides[1] // 2, b_pad.strides[0] // 2,
            b_pad.strides[1] // 2, c.strides[0] // 4]
    module = batched_matmul.specialize(*args, BM=64, BN=32, BK=16, STAGES=2, SHIFT=shift).module
    expected = a_pad.reshape(Z, -1)[:, shift:shift + M * 64].reshape(Z, M, 64)[:, :, :K].astype(np.float32) @ b_pad[:, :K, :N].astype(np.float32)
    return module, args, (1, 1, Z), expected


def test_a_view_at_a_per_program_offset_gets_a_map_with_a_leading_dim():
    """`a_ptr + z * stride_ab`: a 3-D map over (batch, M, K), the batch dim unbounded (the pointer arithmetic
    says where the matrix is; the view's own dims bound the box) with coordinate z and box 1."""
    module, *_ = batched_case()
    fn = module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    plan = pipeline_plan(loop, get_target("sm_90a"), 4, VectorFacts(fn).facts)
    a, b = (load.tma for load in plan.loads)
    z = next(op for op in fn.walk() if op.name == "program_id" and op.attrs["axis"] == 2).result
    assert a.leading == b.leading == (z,)
    assert a.recipe.shape == (Extent(None, UNBOUNDED), Extent(3), Extent(5))            # (unbounded, M, K)
    assert a.recipe.strides == (Extent(6), Extent(7), Extent(None, 1))                   # (stride_ab, stride_am, 1)
    assert a.recipe.box_shape == (1, 64, 16) and b.recipe.box_shape == (1, 16, 32)


def test_an_offset_that_is_no_index_times_stride_keeps_cp_async_and_says_why():
    """`a_ptr + z * stride_ab + 8`: the constant offset is no dim of a map (B's view still gets TMA)."""
    module, *_ = batched_case(shift=8)
    fn = module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    a, b = pipeline_plan(loop, get_target("sm_90a"), 4, VectorFacts(fn).facts).loads
    assert a.tma is None and "sums of index * stride" in a.no_tma and b.tma is not None


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_batched_tma_fill_on_the_simt_simulator(target):
    """Each program's boxes come from its own matrix (coordinate z of the leading dim), the NaN rows and columns
    past the views' edges never reach C (TMA zero-fills out-of-bounds elements of the view's dims)."""
    from tessera.backends.simt import run_threads
    module, args, grid, expected = batched_case()
    fn = lower(module, target, 4).functions[0]
    loads = [op for op in fn.walk() if op.name == "tma_load"]
    assert loads and all(len(op.operands) == 3 + 3 for op in loads)      # dst, map, (z, row, column), bar
    run_threads(fn, args, grid)
    np.testing.assert_allclose(args[2], expected, rtol=1e-3, atol=1e-3)


def test_batched_tma_fill_compiles_to_3d_bulk_tensor_copies():
    ptx = batched_matmul.compile(target="sm_90a", signature="*f16:16,*f16:16,*f32:16,i32,i32:16,i32:16,i32:16,"
                                 "i32:16,i32:16,i32:16,i32:16", BM=64, BN=32, BK=16, STAGES=2).stages["ptx"]
    assert ptx.count("cp.async.bulk.tensor.3d.shared::cluster.global") >= 2 and "cp.async.cg" not in ptx


# -- programs that hand data to each other: a global proxy fence before TMA reads ------------------------

@tessera.kernel
def matmul_after_flag(a_ptr, b_ptr, c_ptr, flag_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                      BK: tessera.constexpr):
    """C = A B once program 0 has raised the flag: A may have been written by another program of this launch
    (through the generic proxy), then read here by TMA (the async proxy)."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    while tessera.atomic_add(flag_ptr, 0) < 1:
        pass
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.kernel
def matmul_after_acquired_flag(a_ptr, b_ptr, c_ptr, flag_ptr, M, N, K, BM: tessera.constexpr,
                               BN: tessera.constexpr, BK: tessera.constexpr):
    """`matmul_after_flag` waiting politely: acquire loads with nanosleep, no atomic anywhere in the kernel."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    while tessera.load(flag_ptr, sem="acquire") < 1:
        tessera.nanosleep(64)
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


@pytest.mark.parametrize("kernel", [matmul_after_flag, matmul_after_acquired_flag])
def test_tma_reads_after_an_atomic_handoff_are_fenced_for_the_async_proxy(kernel):
    """fence.proxy.async.global precedes each fill's TMA copies where the kernel synchronizes programs with
    atomics or acquire loads (an op with the `orders_programs` trait: their generic-proxy writes, acquired,
    become visible to its TMA reads); a plain GEMM has none."""
    signature = "*f16:16,*f16:16,*f32:16,*i32:16,i32:16,i32:16,i32:16"
    ptx = kernel.compile(target="sm_90a", signature=signature, BM=64, BN=64, BK=32).stages["ptx"]
    assert "cp.async.bulk.tensor" in ptx
    assert ptx.count("fence.proxy.async.global") >= 2          # the prologue's fill and the loop's refill
    first_copy = ptx.index("cp.async.bulk.tensor")
    assert ptx.index("fence.proxy.async.global") < first_copy
    plain = batched_matmul.compile(target="sm_90a", signature="*f16:16,*f16:16,*f32:16,i32,i32:16,i32:16,i32:16,"
                                   "i32:16,i32:16,i32:16,i32:16", BM=64, BN=32, BK=16, STAGES=2).stages["ptx"]
    assert "fence.proxy.async.global" not in plain
