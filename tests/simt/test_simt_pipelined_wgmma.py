"""Software-pipelined wgmma matmuls (sm_90a) on the SIMT simulator: what the tile interpreter and numpy compute.

Specification:

* a `tessera.pipeline(..., stages=S)` K loop lowered for sm_90a runs its dot on wgmma, reading A and B
  straight from the ring slots (K-major, or MN-major for a row-major B or a column-major A, in
  every swizzle mode the block widths lead to), and computes on the SIMT simulator what the tile
  interpreter and numpy compute: f16 and bf16, S = 2, 3, 4, one and two warpgroups, one and two
  accumulator fragments per warpgroup, M / N / K not multiples of the blocks (masked, zero-filled
  chunks; odd where the dim is no row stride, since copies need 4-byte aligned rows), loops shorter
  than the pipeline and loops that never run;
* all of that with the slots filled by TMA (sm_90a: one box per column block of a slot; a load whose
  rows are not 16-byte aligned keeps cp.async) and by cp.async (sm_90a with TMA taken away);
* the simulator's checks run all along (async-proxy visibility, races, operands of wgmmas in flight,
  mbarrier phases): leaving out the proxy fence of cp.async fills, waiting for too few wgmma groups,
  refilling the slot the wgmma still in flight reads (by either fill: prefetching S ahead, or refilling
  before the wgmma_wait instead of after it), or reading the accumulator after the loop without the final
  wait is reported.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.ir.target import get_target
from tessera.passes.schedule.pipeline_plan import PipelinePlan
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import F16_RESULT, _exact, _host  # noqa: E402

SM_90A = get_target("sm_90a")
FILLS = {"tma": SM_90A, "cp.async": dataclasses.replace(SM_90A, features=SM_90A.features - {"tma"})}


@tessera.kernel
def strided_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr, STAGES: tessera.constexpr):
    pid_m = tessera.program_id(0)
    pid_n = tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc.to(tessera.f16))


class Case:
    """C = A @ B with A stored row-major or (trans_a) as A^T, B row-major or (trans_b) as B^T."""

    def __init__(self, M, N, K, BM, BN, BK, stages, dtype=tessera.f16, trans_a=False, trans_b=False, seed=0):
        rng = np.random.default_rng(seed)
        self.a = _exact(rng.standard_normal((M, K)), dtype)
        self.b = _exact(rng.standard_normal((K, N)), dtype)
        a_stored, a_strides = (np.ascontiguousarray(self.a.T), (1, M)) if trans_a else (self.a, (K, 1))
        b_stored, b_strides = (np.ascontiguousarray(self.b.T), (1, K)) if trans_b else (self.b, (N, 1))
        self.make_args = lambda: [_host(a_stored, dtype), _host(b_stored, dtype),  # noqa: E731
                                  np.zeros((M, N), np.float16), M, N, K, *a_strides, *b_strides]
        typed = [tessera.reinterpret(x, dtype) if i < 2 else x for i, x in enumerate(self.make_args())]
        self.module = strided_matmul.specialize(*typed, BM=BM, BN=BN, BK=BK, STAGES=stages).module
        self.grid = (tessera.cdiv(M, BM), tessera.cdiv(N, BN))

    def lowered(self, num_warps, fill="tma"):
        return lower(self.module, FILLS[fill], num_warps).functions[0]

    def simulate(self, num_warps, fn=None, fill="tma"):
        """(tile interpreter's C, SIMT simulator's C, numpy's C) as float32."""
        expected, actual = self.make_args(), self.make_args()
        run_function(self.module.functions[0], expected, self.grid)
        run_threads(fn or self.lowered(num_warps, fill), actual, self.grid)
        return expected[2].astype(np.float32), actual[2].astype(np.float32), self.a @ self.b


def wgmma_ops(fn):
    """The wgmma ops of the loop body."""
    loop = next(op for op in fn.body.ops if op.name == "for")
    return [op for op in loop.regions[0].ops if op.name == "wgmma"]


CASES = {   # M, N, K, BM, BN, BK, stages, dtype, trans_a, trans_b, num_warps
    "f16-2stages": (64, 64, 96, 64, 64, 32, 2, tessera.f16, False, False, 4),
    "bf16-3stages-odd-M-masked-K": (61, 48, 80, 64, 64, 32, 3, tessera.bf16, False, False, 4),
    "f16-4stages-transposed-A-and-B-odd-N": (128, 37, 112, 64, 64, 32, 4, tessera.f16, True, True, 4),
    "bf16-3stages-transposed-A-two-warpgroups": (144, 112, 64, 128, 128, 32, 3, tessera.bf16, True, False, 8),
    "f16-4stages-two-fragments-per-warpgroup": (128, 96, 128, 128, 128, 32, 4, tessera.f16, False, False, 4),
    "bf16-4stages-transposed-B-two-warpgroups": (100, 128, 208, 128, 128, 64, 4, tessera.bf16, False, True, 8),
    "f16-3stages-B-32-byte-swizzle": (64, 16, 64, 64, 16, 32, 3, tessera.f16, False, False, 4),
    "f16-3stages-B-64-byte-swizzle": (64, 32, 96, 64, 32, 16, 3, tessera.f16, False, False, 4),
    "bf16-3stages-B-no-swizzle": (64, 32, 64, 64, 8, 32, 3, tessera.bf16, False, False, 4),
    "bf16-3stages-K-major-A-two-column-blocks": (64, 64, 256, 64, 64, 128, 3, tessera.bf16, False, True, 4),
    "f16-3stages-transposed-A-two-slabs-per-warpgroup": (128, 64, 64, 128, 64, 32, 3, tessera.f16, True, False, 4),
    # B's rows (37 elements) are not 4-byte aligned: B is not pipelined, the dot stores it itself
    "f16-3stages-only-A-pipelined": (64, 37, 96, 64, 64, 32, 3, tessera.f16, False, False, 4),
}


@pytest.mark.parametrize("fill", list(FILLS))
@pytest.mark.parametrize("name", list(CASES))
def test_pipelined_wgmma_matmul_matches_the_tile_interpreter_and_numpy(name, fill):
    *problem, num_warps = CASES[name]
    case = Case(*problem)
    fn = case.lowered(num_warps, fill)
    names = [op.name for op in fn.walk()]
    assert "wgmma" in names and "ldmatrix" not in names and "mma" not in names
    if fill == "tma":       # (a wgmma load TMA cannot fill keeps cp.async: test_simt_tma_pipeline.py)
        assert "tma_load" in names and "async_copy" not in names
    else:
        assert "async_copy" in names and "tma_load" not in names
    expected, actual, exact = case.simulate(num_warps, fn)
    np.testing.assert_allclose(actual, expected, **F16_RESULT)
    np.testing.assert_allclose(actual, exact.astype(np.float16).astype(np.float32), **F16_RESULT)


@pytest.mark.parametrize("trans_a, trans_b, majors", [
    (False, False, (False, True)), (True, False, (True, True)), (False, True, (False, False)),
    (True, True, (True, False))], ids=["A-row-B-row", "A-col-B-row", "A-row-B-col", "A-col-B-col"])
def test_a_row_major_b_and_a_column_major_a_are_read_mn_major(trans_a, trans_b, majors):
    fn = Case(64, 64, 64, 64, 64, 32, 3, trans_a=trans_a, trans_b=trans_b).lowered(4)
    for op in wgmma_ops(fn):
        assert (op.attrs.get("trans_a", False), op.attrs.get("trans_b", False)) == majors


@pytest.mark.parametrize("fill", list(FILLS))
@pytest.mark.parametrize("K", [0, 32], ids=["no-iterations", "one-iteration"])
def test_loops_shorter_than_the_pipeline(K, fill):
    case = Case(64, 64, K, 64, 64, 32, 4)
    expected, actual, _ = case.simulate(4, fill=fill)
    np.testing.assert_allclose(actual, expected, **F16_RESULT)
    if K == 0:
        assert not actual.any()


def loop_body(fn):
    return next(op for op in fn.body.ops if op.name == "for").regions[0]


def test_without_the_proxy_fence_wgmma_may_not_see_the_copies():
    case = Case(64, 64, 256, 64, 64, 32, 4)
    fn = case.lowered(4, "cp.async")
    body = loop_body(fn)
    body.ops.remove(next(op for op in body.ops if op.name == "fence_proxy_async"))
    with pytest.raises(InterpreterError, match="fence_proxy_async"):
        run_threads(fn, case.make_args(), case.grid)


@pytest.mark.parametrize("fill", list(FILLS))
def test_leaving_two_groups_in_flight_lets_a_refill_overwrite_an_operand_in_flight(fill):
    case = Case(64, 64, 256, 64, 64, 32, 4)
    fn = case.lowered(4, fill)
    wait = next(op for op in loop_body(fn).ops if op.name == "wgmma_wait")
    assert wait.attrs["pending"] == 1
    wait.attrs["pending"] = 2
    with pytest.raises(InterpreterError, match="written while it was in flight"):
        run_threads(fn, case.make_args(), case.grid)


@pytest.mark.parametrize("fill", list(FILLS))
def test_prefetching_s_ahead_with_a_group_in_flight_refills_its_slot(monkeypatch, fill):
    # the refill after wgmma_wait {pending = 1} may take every slot but the in-flight group's: S - 1 ahead
    case = Case(64, 64, 256, 64, 64, 32, 4)
    monkeypatch.setattr(PipelinePlan, "prefetch", property(lambda plan: plan.stages))
    fn = case.lowered(4, fill)
    assert next(op for op in loop_body(fn).ops if op.name == "wgmma_wait").attrs["pending"] == 1
    with pytest.raises(InterpreterError, match="written while it was in flight"):
        run_threads(fn, case.make_args(), case.grid)


@pytest.mark.parametrize("fill", list(FILLS))
def test_refilling_before_the_wgmma_wait_overwrites_the_slot_in_flight(fill):
    # the refill of slot i - 1 moved back above the dot, where group i - 1 still reads it
    case = Case(64, 64, 256, 64, 64, 32, 4)
    fn = case.lowered(4, fill)
    body = loop_body(fn)
    fence = next(i for i, op in enumerate(body.ops) if op.name == "wgmma_fence")
    wait = next(i for i, op in enumerate(body.ops) if op.name == "wgmma_wait")
    refill = body.ops[wait + 1:-1]          # barrier, the address ops and the copies, slot and phase updates
    del body.ops[wait + 1:-1]
    body.ops[fence:fence] = refill
    with pytest.raises(InterpreterError, match="written while it was in flight"):
        run_threads(fn, case.make_args(), case.grid)


@pytest.mark.parametrize("fill", list(FILLS))
def test_the_accumulator_in_flight_after_the_loop_must_be_waited_for(fill):
    case = Case(64, 64, 256, 64, 64, 32, 4)
    fn = case.lowered(4, fill)
    fn.body.ops.remove(next(op for op in fn.body.ops if op.name == "wgmma_wait"))    # the one after the loop
    with pytest.raises(InterpreterError, match="reads the result of the wgmma .* before a wgmma_wait retired it"):
        run_threads(fn, case.make_args(), case.grid)
