"""Pipelined matmuls whose ring slots TMA fills (sm_90, sm_90a), run on the SIMT simulator against numpy.

Specification:

* on a target with TMA, a `tessera.pipeline` K loop whose A and B views are
  kernel pointer parameters with 16-byte aligned rows fills its ring slots
  with `tma_load`s from hidden `tensormap` parameters instead of cp.async,
  and computes numpy's product: edges of odd M, N, K (zero-filled boxes),
  B transposed through its strides, 2 to 4 stages, 128B / 64B / unswizzled
  slots; on sm_90 the slots feed ldmatrix + mma.sync (one box per slot), on
  sm_90a wgmma (one box per column block of the wgmma layout; the copies
  run `plan.prefetch` iterations ahead, S - 2 with a wgmma group in flight,
  so a prologue may fill fewer than S - 1 slots);
* `run_threads` takes only the kernel's own arguments: the simulator builds
  the maps from the recipes the compiler recorded, as a GPU launch does;
* the simulator's checks hold all along: every slot is read only after the
  mbarrier wait for its fill, no fill overwrites a slot still being read,
  no TMA load is left in flight at the end, and no phase is left half-counted;
* a view the host could not describe falls back to cp.async for that load
  only: a row stride the specialization does not know to be 16-byte aligned,
  or a base pointer the kernel computes; on sm_90a that load's wgmma slots
  keep the generic -> async proxy fence (the other load's TMA landings,
  visible to wgmma without one, do not make the cp.async bytes visible).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads
from tessera.ir.target import get_target
from tessera.ir.tensor_map import kernel_recipes
from tessera.ir.types import TensorMapType
from tessera.passes.schedule.pipeline_plan import pipeline_plan
from tessera.passes.lowering.vector_facts import VectorFacts
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import F16_RESULT, _exact, _host, matmul_case  # noqa: E402


def simulate(case, target="sm_90", num_warps=4):
    """The simulator's C (float32) and the thread-IR function."""
    fn = lower(case.module, target, num_warps).functions[0]
    args = case.make_args()
    run_threads(fn, args, case.grid)
    return args[2].astype(np.float32), fn


def fills(fn) -> tuple[int, int]:
    """(tma_load ops, async_copy ops) in the kernel."""
    names = [op.name for op in fn.walk()]
    return names.count("tma_load"), names.count("async_copy")


def plan_of(case, target):
    fn = case.module.functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    return pipeline_plan(loop, get_target(target), 4, VectorFacts(fn).facts)


# Every case runs more K steps than stages, so each ring wraps (the wait parity flips, slots are refilled).
CASES = {   # M, N, K, BM, BN, BK, stages, trans_b, the maps' swizzles on sm_90 (mma.sync slots) and sm_90a (wgmma)
    "3-stages": (64, 64, 448, 64, 64, 64, 3, False, {"128B"}, {"128B"}),
    "2-stages-odd-MNK-transposed-B": (61, 37, 208, 64, 64, 64, 2, True, {"128B"}, {"128B"}),
    "4-stages-two-programs": (100, 64, 600, 64, 64, 64, 4, False, {"128B"}, {"128B"}),
    "4-stages-transposed-B-64B-rows": (61, 37, 304, 64, 64, 32, 4, True, {"64B"}, {"64B"}),
    # sm_90a: B's 256-byte slot rows are two 128B column blocks, two boxes per slot
    "3-stages-unswizzled-wide-B": (64, 128, 288, 64, 128, 64, 3, False, {"128B", "none"}, {"128B"}),
    # sm_90a: A (K-major) and B^T in two 128B column blocks each
    "3-stages-wide-K-transposed-B": (64, 64, 384, 64, 64, 128, 3, True, {"none"}, {"128B"}),
}


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("name", list(CASES))
def test_tma_filled_pipeline_matches_numpy(name, target):
    M, N, K, BM, BN, BK, stages, trans_b, *swizzles = CASES[name]
    case = matmul_case(M, N, K, BM, BN, BK, stages, tessera.bf16, trans_b)
    actual, fn = simulate(case, target)
    plan = plan_of(case, target)
    recipes = kernel_recipes(fn.attrs)
    tma_loads, copies = fills(fn)
    # `prefetch` prologue issues and one in the loop, each a box per column block of each slot
    assert copies == 0 and tma_loads == (plan.prefetch + 1) * sum(load.tma.boxes for load in plan.loads)
    # one map per pipelined load, then C's for the epilogue's TMA store (`schedule/tma_store.py`), 128B-swizzled:
    # stmatrix writes the bf16 accumulator into 64-column swizzled blocks (`schedule/stmatrix_store.py`);
    # and one TMA store per 64 columns of the tile; N = 37 gives C rows no 16-byte stride, so there C keeps the
    # threads' stores
    ops = [op.name for op in fn.walk()]
    by_tma = N != 37
    assert ops.count("tma_store") == (BN // 64 if by_tma else 0) and len(recipes) == len(plan.loads) + by_tma
    assert all(r.pointer == 2 and r.swizzle == "128B" for r in recipes[len(plan.loads):])
    assert ("stmatrix" in ops) == by_tma
    assert {r.swizzle for r in recipes[:len(plan.loads)]} == swizzles[target == "sm_90a"]
    assert ("wgmma" in [op.name for op in fn.walk()]) == (target == "sm_90a")
    assert [a.type for a in fn.args[-len(recipes):]] == [TensorMapType()] * len(recipes)
    np.testing.assert_allclose(actual, case.expected().astype(np.float32), **F16_RESULT)


def test_recipes_describe_the_views_from_the_kernel_parameters():
    case = matmul_case(61, 37, 80, 64, 64, 64, 3, tessera.bf16, trans_b=True)
    fn = lower(case.module, "sm_90", 4).functions[0]
    names = [a.name_hint for a in fn.args]
    assert [r.to_json(names) for r in kernel_recipes(fn.attrs)] == [
        {"param": 8, "name": "a_ptr_tma0", "pointer": "a_ptr", "dtype": "bf16", "shape": ["M", "K"],
         "strides": ["K", "1"], "box": [64, 64], "swizzle": "128B", "oob_fill": "zero"},
        # B^T stored N x K: the map's rows run along N, its contiguous dim is K (the view's dim 0)
        {"param": 9, "name": "b_ptr_tma1", "pointer": "b_ptr", "dtype": "bf16", "shape": ["N", "K"],
         "strides": ["stride_bn", "1"], "box": [64, 64], "swizzle": "128B", "oob_fill": "zero"}]


def test_sm_90a_wgmma_slots_are_filled_by_tma_without_proxy_fences():
    """TMA writes and wgmma reads through the async proxy: no fence_proxy_async for the ring (the one fence
    orders C's st.shared before the epilogue's TMA store, after the last wgmma_wait), and the slot waits
    are the mbarriers' alone (no cp.async group to wait for)."""
    case = matmul_case(61, 64, 96, 64, 64, 64, 3, tessera.bf16)
    actual, fn = simulate(case, "sm_90a")
    names = [op.name for op in fn.walk()]
    assert fills(fn) == (6, 0)          # prefetch 2 (S - 1) + 1 refill, for A and for B
    assert names.count("fence_proxy_async") == 1 and names.index("fence_proxy_async") > max(
        i for i, n in enumerate(names) if n == "wgmma_wait") and names.count("tma_store") == 1
    assert "async_wait" not in names and "wgmma" in names
    np.testing.assert_allclose(actual, case.expected().astype(np.float32), **F16_RESULT)


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("K", [0, 64], ids=["no-iterations", "one-iteration"])
def test_loops_shorter_than_the_pipeline_leave_no_phase_unbalanced(K, target):
    case = matmul_case(64, 64, K, 64, 64, 64, stages=4, dtype=tessera.bf16)
    actual, fn = simulate(case, target)
    assert fills(fn)[0]
    np.testing.assert_allclose(actual, case.expected().astype(np.float32), **F16_RESULT)


def test_a_row_stride_not_known_to_be_16_byte_aligned_keeps_cp_async_for_that_load():
    # K = 100 is a constexpr: A's rows are 200 bytes (8-byte cp.async copies); B's rows (N = 64) qualify
    case = matmul_case(61, 64, 100, 64, 64, 32, 3, tessera.bf16, fixed_k=True)
    actual, fn = simulate(case)
    assert [fn.args[r.pointer].name_hint for r in kernel_recipes(fn.attrs)] == ["b_ptr", "c_ptr"]   # C: stored
    tma_loads, copies = fills(fn)
    assert tma_loads == 3 and copies > 0
    np.testing.assert_allclose(actual, case.expected().astype(np.float32), **F16_RESULT)


@tessera.kernel
def offset_a_matmul(a_ptr, b_ptr, c_ptr, M, N, K, a_offset, BM: tessera.constexpr, BN: tessera.constexpr,
                    BK: tessera.constexpr, STAGES: tessera.constexpr):
    """A starts `a_offset` elements into its buffer: its view's base is computed in the kernel."""
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr + a_offset, (M, K))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_a_view_of_a_pointer_computed_in_the_kernel_keeps_cp_async(target):
    M, N, K, offset = 64, 64, 128, 32
    rng = np.random.default_rng(1)
    a, b = _exact(rng.standard_normal((M, K)), tessera.bf16), _exact(rng.standard_normal((K, N)), tessera.bf16)
    a_buffer = np.concatenate([np.zeros(offset, np.uint16), _host(a, tessera.bf16).reshape(-1)])
    args = [a_buffer, _host(b, tessera.bf16), np.zeros((M, N), np.float16), M, N, K, offset]
    typed = [tessera.reinterpret(x, tessera.bf16) if i < 2 else x for i, x in enumerate(args)]
    module = offset_a_matmul.specialize(*typed, BM=64, BN=64, BK=64, STAGES=3).module
    fn = lower(module, target, 4).functions[0]
    assert [fn.args[r.pointer].name_hint for r in kernel_recipes(fn.attrs)] == ["b_ptr", "c_ptr"]   # C: stored
    assert fills(fn)[1] > 0
    run_threads(fn, args, (1, 1))
    np.testing.assert_allclose(args[2].astype(np.float32), (a @ b).astype(np.float16).astype(np.float32),
                               **F16_RESULT)
    if target == "sm_90a":      # A's cp.async-filled wgmma slots still need the generic -> async proxy fence
        body = next(op for op in fn.body.ops if op.name == "for" and op.attrs.get("stages")).regions[0]
        body.ops.remove(next(op for op in body.ops if op.name == "fence_proxy_async"))
        with pytest.raises(InterpreterError, match="fence_proxy_async"):     # B's TMA landings do not cover A
            run_threads(fn, args, (1, 1))


@tessera.kernel
def row_of_tiles_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                        BK: tessera.constexpr, STAGES: tessera.constexpr, TRIANGLE: tessera.constexpr = False):
    """Each program walks a column of C tiles: the pipelined K loop runs once per tile, as in a persistent
    GEMM, so its tiles share its mbarriers (set up once); with TRIANGLE, tile pid_m sums only the first
    pid_m + 1 K steps, so the loop's bounds vary per tile and it sets up its mbarriers for each."""
    pid_n = tessera.program_id(0)
    a = tessera.view(a_ptr, (M, K))
    b = tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N))
    for pid_m in range(0, tessera.cdiv(M, BM)):
        acc = tessera.zeros((BM, BN), dtype=tessera.f32)
        steps = pid_m + 1 if TRIANGLE else tessera.cdiv(K, BK)
        for k in tessera.pipeline(0, steps, stages=STAGES):
            acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
        c.block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


@pytest.mark.parametrize("triangle", [False, True], ids=["same-bounds", "bounds-per-tile"])
def test_a_pipeline_entered_again_shares_its_mbarriers_when_its_bounds_stay(triangle):
    """Same bounds in every tile: the mbarriers are initialized once, before the tile loop, never invalidated,
    and their phases run on across tiles (issue 19); bounds per tile: initialized before the K loop and
    invalidated after it, tile by tile."""
    M, N, K = 150, 64, 320
    rng = np.random.default_rng(2)
    a, b = _exact(rng.standard_normal((M, K)), tessera.bf16), _exact(rng.standard_normal((K, N)), tessera.bf16)
    args = [_host(a, tessera.bf16), _host(b, tessera.bf16), np.zeros((M, N), np.float16), M, N, K]
    typed = [tessera.reinterpret(x, tessera.bf16) if i < 2 else x for i, x in enumerate(args)]
    module = row_of_tiles_matmul.specialize(*typed, BM=64, BN=64, BK=64, STAGES=3, TRIANGLE=triangle).module
    fn = lower(module, "sm_90", 4).functions[0]
    tiles = next(op for op in fn.body.ops if op.name == "for")
    in_tiles = [op.name for op in tiles.walk()]
    assert in_tiles.count("mbarrier_inval") == in_tiles.count("mbarrier_init") == (3 if triangle else 0)
    assert sum(op.name == "mbarrier_init" for op in fn.walk()) == 3
    run_threads(fn, args, (1,))
    expected = a @ b
    if triangle:
        expected = np.concatenate([a[m:m + 64, :(m // 64 + 1) * 64] @ b[:(m // 64 + 1) * 64] for m in range(0, M, 64)])
    np.testing.assert_allclose(args[2].astype(np.float32), expected.astype(np.float16).astype(np.float32),
                               **F16_RESULT)


@tessera.kernel
def strided_a_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, BM: tessera.constexpr,
                     BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


def test_a_transposed_a_is_a_map_over_k_by_m_boxes():
    """A stored as A^T (K x M): its map runs along M, the contiguous dim, with BK x BM boxes."""
    M, N, K = 80, 48, 200
    rng = np.random.default_rng(3)
    a, b = _exact(rng.standard_normal((M, K)), tessera.bf16), _exact(rng.standard_normal((K, N)), tessera.bf16)
    args = [np.ascontiguousarray(_host(a, tessera.bf16).T), _host(b, tessera.bf16), np.zeros((M, N), np.float16),
            M, N, K, 1, M]
    typed = [tessera.reinterpret(x, tessera.bf16) if i < 2 else x for i, x in enumerate(args)]
    module = strided_a_matmul.specialize(*typed, BM=64, BN=64, BK=64, STAGES=3).module
    fn = lower(module, "sm_90", 4).functions[0]
    names = [arg.name_hint for arg in fn.args]
    a_map = kernel_recipes(fn.attrs)[0].to_json(names)
    assert (a_map["pointer"], a_map["shape"], a_map["strides"], a_map["box"]) == ("a_ptr", ["K", "M"],
                                                                                 ["stride_ak", "1"], [64, 64])
    assert fills(fn) == (6, 0)
    run_threads(fn, args, (2, 1))
    np.testing.assert_allclose(args[2].astype(np.float32), (a @ b).astype(np.float16).astype(np.float32),
                               **F16_RESULT)
