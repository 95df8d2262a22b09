"""The language's mbarriers lowered to threads, on the SIMT simulator: what the tile interpreter computes.

Specification:

* the mbarrier double-buffered matmul (`shared_kernels.mbarrier_matmul`)
  lowered for sm_90 is TMA-backed when its views qualify: thread 0 inits
  one mbarrier per slot, each copy is an mbarrier_expect_tx and one
  tma_load of the whole slot whose tensor-map recipe (in the kernel's
  `tensor_maps`) names the pointer argument, the view's box and the
  swizzle the slot was given; waits are mbarrier_wait; no cp.async is left;
* where a view does not qualify (a row stride that is not a multiple of 16
  bytes) the array falls back to cp.async groups, as on sm_80; on gfx942
  copies are synchronous;
* on every target the simulator, with its race, phase and deadlock checks,
  computes what the tile interpreter computes and numpy expects;
* taking thread 0's arrival out of a TMA wait is a deadlock the simulator
  reports.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function

from tessera.backends.simt import run_threads
from tessera.ir.tensor_map import kernel_recipes
from tessera.passes.thread_passes import lower

from shared_kernels import F16_RESULT, MatmulCase, mbarrier_matmul


def lower_and_compare(case: MatmulCase, target: str):
    module = case.module(mbarrier_matmul)
    expected, actual = case.args(), case.args()
    run_function(module.functions[0], expected, case.grid)
    fn = lower(module, target, 4).functions[0]
    run_threads(fn, actual, case.grid)
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)
    np.testing.assert_allclose(actual[2].astype(np.float32), case.expected(), **F16_RESULT)
    return fn


@pytest.mark.parametrize("M,N,K", [(128, 64, 96), (100, 128, 48)], ids=str)
def test_on_sm_90_the_copies_are_tma_loads_counted_on_the_slot_mbarriers(M, N, K):
    case = MatmulCase(M, N, K)
    fn = lower_and_compare(case, "sm_90")
    ops = [op.name for op in fn.walk()]
    assert ops.count("mbarrier_init") == 2 and ops.count("tma_load") == 4        # 2 slots; A and B, twice
    assert ops.count("mbarrier_expect_tx") == ops.count("tma_load") and "mbarrier_wait" in ops
    assert not {"async_copy", "async_commit", "async_wait"} & set(ops)
    recipes = {r.pointer: r for r in kernel_recipes(fn.attrs)}
    assert set(recipes) == {0, 1, 2}                          # a_ptr and b_ptr; c_ptr, for the TMA store of C
    assert ops.count("tma_store") == 1
    a, b = recipes[0], recipes[1]
    assert (a.box_shape, a.swizzle) == ((case.BM, case.BK), f"{case.BK * 2}B")   # rows of 64 / 128 bytes
    assert (b.box_shape, b.swizzle) == ((case.BK, case.BN), f"{case.BN * 2}B")
    tx = {op.operands[1].owner.attrs["value"] for op in fn.walk() if op.name == "mbarrier_expect_tx"}
    assert tx == {case.BM * case.BK * 2, case.BK * case.BN * 2}


@pytest.mark.parametrize("target", ["sm_90", "sm_80", "gfx942"])
@pytest.mark.parametrize("M,N,K", [(61, 37, 80), (100, 130, 47)], ids=str)
def test_where_tma_cannot_copy_the_threads_do_and_the_result_is_the_same(target, M, N, K):
    fn = lower_and_compare(MatmulCase(M, N, K), target)
    names = {op.name for op in fn.walk()}
    assert not names & {"tma_load", "mbarrier_init", "mbarrier_wait"}
    assert {"async_commit", "async_wait"} <= names      # cp.async, or direct-to-LDS loads on gfx942


def test_without_the_arrival_the_tma_wait_deadlocks():
    case = MatmulCase(64, 64, 64)
    fn = lower(case.module(mbarrier_matmul), "sm_90", 4).functions[0]
    arrivals = [op for op in fn.walk() if op.name == "mbarrier_arrive"]
    assert len(arrivals) == 1                           # the wait in the loop body: the phase's one arrival
    arrivals[0].parent.ops.remove(arrivals[0])
    with pytest.raises(InterpreterError, match="(?i)deadlock"):
        run_threads(fn, case.args(), case.grid)


# ---------------------------------------------------------------------------
# Copies through a tile of pointers that complete on an mbarrier (issue 21: layout assignment took the
# mbarrier operand for the copy's mask and failed with a KeyError on every target)

import tessera  # noqa: E402

import test_mbarriers as interp_cases  # noqa: E402


@tessera.kernel
def pointer_copy_on_a_barrier(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    buf = tessera.shared((1, BLOCK), tessera.f32)
    bars = tessera.mbarriers(1)
    tessera.async_copy(buf[0], x_ptr + offs, mask=offs < n, barrier=bars[0])
    bars[0].wait(0)
    tessera.store(out_ptr + offs, buf[0].load(), mask=offs < n)


def simulate(kernel, args, target, grid=(1,), **constexprs):
    module = kernel.specialize(*args, **constexprs).module
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(module.functions[0], expected, grid)
    actual = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_threads(lower(module, target, 4).functions[0], actual, grid)
    return expected, actual


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_a_masked_pointer_copy_on_an_mbarrier_compiles_and_computes_what_the_interpreter_does(target):
    x = np.arange(64, dtype=np.float32) + 1
    expected, actual = simulate(pointer_copy_on_a_barrier, [x, np.zeros(64, np.float32), 50], target, BLOCK=64)
    np.testing.assert_array_equal(expected[1][:50], x[:50])
    np.testing.assert_array_equal(actual[1], expected[1])


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_the_interpreter_mbarrier_kernels_compile_and_agree(target):
    x = np.arange(32, dtype=np.float32) + 1
    expected, actual = simulate(interp_cases.groups_and_phases, [x, np.zeros(16, np.float32)], target,
                                WAIT_PHASE=True)
    np.testing.assert_array_equal(actual[1], expected[1])


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
def test_a_copy_into_a_buffer_the_threads_just_read_needs_the_authors_barrier(target):
    """`phases` reuses its buffer right after reading it: fine in the tile interpreter (a program runs as one),
    a race between threads on a GPU. It compiles; the SIMT simulator names the missing barrier."""
    x = np.arange(32, dtype=np.float32) + 1
    with pytest.raises(InterpreterError, match=r"shared-memory race.*add a `barrier`"):
        simulate(interp_cases.phases, [x, np.zeros(32, np.float32)], target, MODE="ok")
