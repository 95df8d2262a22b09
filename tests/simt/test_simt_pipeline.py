"""Software-pipelined matmuls on the SIMT simulator: what the tile interpreter and numpy compute.

Specification:

* a `tessera.pipeline(..., stages=S)` K loop lowered for sm_80 (cp.async rings
  read by ldmatrix into mma.sync) computes on the SIMT simulator what the
  tile interpreter computes, for f16 and bf16, S = 2, 3, 4, blocks 64x64x32
  and 128x128x32 with 4 warps, K not a multiple of BK, M and N not multiples
  of the blocks (zero-filled chunks), B transposed through its strides, 8- and
  4-byte copies where K is only that aligned, loops shorter than the pipeline
  and loops that never run;
* the simulator's checks run all along: no thread reads a slot before its
  copy's group is waited for and a barrier published it, no copy refills a
  slot another thread read since the last barrier, no copy is left in flight.
  Taking out the loop's barrier, waiting for one group too few, or refilling
  a slot before the barrier is caught.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import F16_RESULT, matmul_case  # noqa: E402


def simulate(case, num_warps=4, target="sm_80"):
    """(tile interpreter's C, SIMT simulator's C) as float32; the thread IR is checked to be pipelined and
    its copy sizes are kept in `case.copy_bytes`."""
    expected, actual = case.make_args(), case.make_args()
    run_function(case.module.functions[0], expected, case.grid)
    fn = lower(case.module, target, num_warps).functions[0]
    case.copy_bytes = {op.attrs["bytes"] for op in fn.walk() if op.name == "async_copy"}
    assert case.copy_bytes
    run_threads(fn, actual, case.grid)
    return expected[2].astype(np.float32), actual[2].astype(np.float32)


CASES = {   # M, N, K, BM, BN, BK, stages, dtype, trans_b
    "f16-2stages": (64, 64, 96, 64, 64, 32, 2, tessera.f16, False),
    "bf16-3stages-odd-MN-transposed-B": (61, 37, 80, 64, 64, 32, 3, tessera.bf16, True),
    "f16-4stages-two-programs-transposed-B": (100, 64, 160, 64, 64, 32, 4, tessera.f16, True),
    "bf16-4stages": (64, 48, 112, 64, 64, 32, 4, tessera.bf16, False),
    "f16-3stages-128x128": (128, 120, 96, 128, 128, 32, 3, tessera.f16, False),
    "bf16-2stages-128x128-transposed-B": (90, 128, 48, 128, 128, 32, 2, tessera.bf16, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pipelined_matmul_matches_the_tile_interpreter(name):
    M, N, K, BM, BN, BK, stages, dtype, trans_b = CASES[name]
    case = matmul_case(M, N, K, BM, BN, BK, stages, dtype, trans_b)
    expected, actual = simulate(case)
    np.testing.assert_allclose(actual, expected, **F16_RESULT)
    np.testing.assert_allclose(actual, case.expected().astype(np.float32), **F16_RESULT)


@pytest.mark.parametrize("K,a_copy_bytes", [(100, 8), (50, 4)], ids=["8-byte-copies", "4-byte-copies"])
def test_narrower_copies_of_a_compile_time_k(K, a_copy_bytes):
    case = matmul_case(61, 64, K, 64, 64, 32, 3, tessera.bf16, fixed_k=True)
    expected, actual = simulate(case)
    assert case.copy_bytes == {a_copy_bytes, 16}            # A's rows are only that aligned; B's are 16
    np.testing.assert_allclose(actual, expected, **F16_RESULT)


@pytest.mark.parametrize("K", [0, 32], ids=["no-iterations", "one-iteration"])
def test_loops_shorter_than_the_pipeline(K):
    case = matmul_case(64, 64, K, 64, 64, 32, stages=4)
    expected, actual = simulate(case)
    np.testing.assert_allclose(actual, expected, **F16_RESULT)
    if K == 0:
        assert not actual.any()


@tessera.kernel
def pinned_a_matmul(a_ptr, b_ptr, c_ptr, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr):
    a = tessera.view(a_ptr, (BM, K))
    b = tessera.view(b_ptr, (K, BN))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=3):
        a_block = tessera.convert_layout(a.block((BM, BK), (0, k)).load(),
                                         tessera.layouts.local(2, 8) * tessera.layouts.spatial(32, 4))
        acc = tessera.dot(a_block, b.block((BK, BN), (k, 0)).load(), acc)
    tessera.view(c_ptr, (BM, BN)).block((BM, BN), (0, 0)).store(acc.to(tessera.f16))


def test_a_load_reaching_the_dot_through_convert_layout_is_pipelined_too():
    rng = np.random.default_rng(3)
    K = 96
    a = rng.standard_normal((64, K)).astype(np.float16)
    b = rng.standard_normal((K, 64)).astype(np.float16)
    args = lambda: [a, b, np.zeros((64, 64), np.float16), K]     # noqa: E731
    module = pinned_a_matmul.specialize(*args(), BM=64, BN=64, BK=32).module
    fn = lower(module, "sm_80", 4).functions[0]
    assert sum(op.name == "async_copy" for op in fn.walk()) == 3 * 4      # A and B, 2 copies each, 3 places
    out = args()
    run_threads(fn, out, (1,))
    np.testing.assert_allclose(out[2].astype(np.float32), (a.astype(np.float32) @ b.astype(np.float32)),
                               **F16_RESULT)


def sabotaged(case, remove):
    """The pipelined thread IR with `remove(loop_body)` applied (to prove the simulator's checks bite)."""
    fn = lower(case.module, "sm_80", 4).functions[0]
    loop = next(op for op in fn.body.ops if op.name == "for")
    remove(loop.regions[0])
    return fn


def test_without_the_loop_barrier_the_simulator_reports_a_race():
    case = matmul_case(64, 64, 128, 64, 64, 32, stages=3)
    fn = sabotaged(case, lambda body: body.ops.remove(next(op for op in body.ops if op.name == "barrier")))
    with pytest.raises(InterpreterError, match="shared-memory race"):
        run_threads(fn, case.make_args(), case.grid)


def test_waiting_for_one_group_too_few_is_a_read_before_the_wait():
    case = matmul_case(64, 64, 128, 64, 64, 32, stages=3)

    def wait_less(body):
        body.ops[0].attrs["pending"] += 1

    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run_threads(sabotaged(case, wait_less), case.make_args(), case.grid)


def test_refilling_a_slot_before_the_barrier_races_with_last_iterations_reads():
    # Issue the refill between the wait and the barrier: the slot it refills was read by other threads in
    # the previous iteration, with no barrier since.
    case = matmul_case(64, 64, 128, 64, 64, 32, stages=3)

    def barrier_after_refill(body):
        barrier = next(op for op in body.ops if op.name == "barrier")
        body.ops.remove(barrier)
        commit = next(i for i, op in enumerate(body.ops) if op.name == "async_commit")
        body.ops.insert(commit + 1, barrier)

    fn = sabotaged(case, barrier_after_refill)
    with pytest.raises(InterpreterError, match="(?s)op 'async_copy'.*shared-memory race.*read since the last barrier"):
        run_threads(fn, case.make_args(), case.grid)
