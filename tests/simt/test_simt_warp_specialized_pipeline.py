"""Warp-specialized pipelined matmuls (`tessera.pipeline(..., warp_specialize=True)`) on the SIMT simulator.

Specification:

* lowered for sm_90 (mma.sync consumers) with 4 or 8 consumer warps, and for
  sm_90a with mma.sync consumers (setmaxnreg dec / inc) or wgmma consumers
  (64-row slabs; the TMA boxes land in wgmma's layouts), the kernel computes
  numpy's product: odd M, N, K (boxes past the edges zero-filled by TMA),
  B transposed through its strides, 2 to 4 stages, rings that wrap, loops
  shorter than the ring or empty; the simulator schedules the producer and
  consumer paths cooperatively and checks every mbarrier, race and register
  budget rule along the way;
* the mistakes warp specialization invites are reported, not computed
  through: consumers that release a slot before reading it, and a producer
  that refills a slot without waiting for its release (both: the TMA load
  overwrites bytes a consumer reads).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import F16_RESULT  # noqa: E402
from ws_pipeline_kernels import ws_matmul_case  # noqa: E402


def simulate(case, fn):
    args = case.make_args()
    run_threads(fn, args, case.grid)
    return args[2].astype(np.float32)


CASES = {   # M, N, K, BM, BN, BK, stages, trans_b, target, num_warps
    "2-stages-odd-MNK-transposed-B": (61, 37, 208, 64, 64, 64, 2, True, "sm_90", 4),
    "3-stages-two-programs-each-way": (100, 96, 328, 64, 64, 64, 3, False, "sm_90", 4),
    "4-stages-transposed-B-64B-rows": (61, 37, 304, 64, 64, 32, 4, True, "sm_90", 4),
    "3-stages-8-consumer-warps": (130, 128, 200, 128, 128, 64, 3, False, "sm_90", 8),
    "4-stages-shorter-loop-than-ring": (64, 64, 64, 64, 64, 64, 4, False, "sm_90", 4),
    "3-stages-no-iterations": (64, 64, 0, 64, 64, 64, 3, False, "sm_90", 4),
    "sm_90a-setmaxnreg-odd-MNK": (61, 200, 272, 32, 128, 64, 3, True, "sm_90a", 8),
    "sm_90a-2-stages-2-warps": (61, 37, 208, 32, 64, 64, 2, True, "sm_90a", 2),
    "sm_90a-wgmma-odd-MNK": (61, 37, 208, 64, 64, 64, 3, False, "sm_90a", 4),
    "sm_90a-wgmma-transposed-B-8-warps": (130, 128, 256, 128, 128, 64, 2, True, "sm_90a", 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_warp_specialized_pipeline_matches_numpy(name):
    M, N, K, BM, BN, BK, stages, trans_b, target, num_warps = CASES[name]
    case = ws_matmul_case(M, N, K, BM, BN, BK, stages, trans_b)
    fn = lower(case.module, target, num_warps).functions[0]
    assert fn.attrs["num_threads"] == 32 * num_warps + 128
    assert any(op.name == "wgmma" for op in fn.walk()) == ("wgmma" in name)
    np.testing.assert_allclose(simulate(case, fn), case.expected().astype(np.float32), **F16_RESULT)


def consumer_loop_body(fn):
    split = next(op for op in fn.body.ops if op.name == "if" and any(o.name == "tma_load" for o in op.walk()))
    return next(op for op in split.regions[1].ops if op.name == "for").regions[0]


def producer_loop_body(fn):
    return next(op for op in fn.walk() if op.name == "for" and any(o.name == "tma_load" for o in op.walk())).regions[0]


RACE = r"race: the tma_load overwrites bytes in use: thread \d+ writes shared byte \d+, which thread \d+ read"


def test_consumers_releasing_a_slot_before_reading_it_are_reported():
    case = ws_matmul_case(64, 64, 384, 64, 64, 64, 2)           # 6 iterations through 2 slots
    fn = lower(case.module, "sm_90", 4).functions[0]
    body = consumer_loop_body(fn)
    ops = body.ops
    arrive = next(i for i, op in enumerate(ops) if op.name == "mbarrier_arrive")
    moved = ops[arrive - 1:arrive + 1]                          # the empty[slot] address and the arrival
    assert moved[0].name == "addptr" and moved[1].operands[0] is moved[0].result
    del ops[arrive - 1:arrive + 1]
    wait = next(i for i, op in enumerate(ops) if op.name == "mbarrier_wait")
    ops[wait + 1:wait + 1] = moved
    with pytest.raises(InterpreterError, match=RACE):
        simulate(case, fn)


def test_a_producer_that_does_not_wait_for_the_release_is_reported():
    case = ws_matmul_case(64, 64, 384, 64, 64, 64, 2)
    fn = lower(case.module, "sm_90", 4).functions[0]
    body = producer_loop_body(fn)
    guarded = [op for op in body.ops if op.name == "if" and any(o.name == "mbarrier_wait" for o in op.walk())]
    assert len(guarded) == 1
    body.ops.remove(guarded[0])
    with pytest.raises(InterpreterError, match=RACE):
        simulate(case, fn)
