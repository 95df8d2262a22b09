"""`tessera.pipeline` on gfx942 / gfx950: direct-to-LDS rings read into MFMA fragments, on the SIMT simulator.

Specification:

* a `tessera.pipeline(..., stages=S)` K loop lowered for gfx942 (4-byte `global_load_lds` chunks) or gfx950
  (16-byte ones) is pipelined (the loop keeps `stages = S`, its copies are async) and computes on the SIMT
  simulator what the tile interpreter computes: f16 and bf16, S = 2, 3, 4, M and N not multiples of the
  blocks (zero-filled chunks), B transposed through its strides, loops shorter than the pipeline; e4m3 on
  gfx950's fp8 MFMA;
* the simulator checks the M0 rule of every copy (a wave's lanes fill consecutive LDS chunks) and the
  ring's waits and barriers: taking out the loop's barrier, or waiting for one group too few, is caught;
* the AMDGCN of the 3-stage loop keeps one group in flight: inside the loop `s_waitcnt vmcnt(8)` (8 copies
  a group: A and B, 64x32 f16 blocks, 4 bytes a lane over 256 lanes) and never vmcnt(0), the refill's 8
  `global_load_lds_dword` after the barrier; linked with ld.lld, no spills, no scratch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.amdgpu import compile_thread_ir, find_linker
from tessera.backends.interp import InterpreterError, run_function
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
from amdgcn_loops import loop_body  # noqa: E402
from pipeline_kernels import F16_RESULT, matmul_case  # noqa: E402

CASES = {   # M, N, K, BM, BN, BK, stages, dtype, trans_b, target
    "gfx942-f16-2stages": (64, 64, 96, 64, 64, 32, 2, tessera.f16, False, "gfx942"),
    "gfx942-bf16-3stages-odd-MN-transposed-B": (61, 37, 80, 64, 64, 32, 3, tessera.bf16, True, "gfx942"),
    "gfx942-f16-4stages-two-programs": (100, 64, 160, 64, 64, 32, 4, tessera.f16, False, "gfx942"),
    "gfx942-f16-4stages-one-iteration": (64, 64, 32, 64, 64, 32, 4, tessera.f16, False, "gfx942"),
    "gfx950-bf16-3stages-transposed-B": (64, 48, 112, 64, 64, 32, 3, tessera.bf16, True, "gfx950"),
    # OCP fp8 MFMA (32x32x16 .fp8.fp8) reading its 8-byte k runs from the rings
    "gfx950-e4m3-3stages-transposed-B": (64, 48, 192, 64, 64, 64, 3, tessera.f8e4m3, True, "gfx950"),
}


def lowered(case, target: str):
    fn = lower(case.module, target, 4).functions[0]
    loop = next(op for op in fn.body.ops if op.name == "for")
    return fn, loop


@pytest.mark.parametrize("name", list(CASES))
def test_the_pipelined_matmul_matches_the_tile_interpreter(name):
    *shape, stages, dtype, trans_b, target = CASES[name]
    case = matmul_case(*shape, stages, dtype, trans_b)
    fn, loop = lowered(case, target)
    assert loop.attrs.get("stages") == stages
    assert {op.attrs["bytes"] for op in fn.walk() if op.name == "async_copy"} == {4 if target == "gfx942" else 16}
    assert {op.operands[0].type.element.dtype for op in fn.walk() if op.name == "mfma"} == {dtype}
    expected, actual = case.make_args(), case.make_args()
    run_function(case.module.functions[0], expected, case.grid)
    run_threads(fn, actual, case.grid)
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)
    np.testing.assert_allclose(actual[2].astype(np.float32), case.expected().astype(np.float32), **F16_RESULT)


def test_without_the_loop_barrier_the_simulator_reports_a_race():
    case = matmul_case(64, 64, 128, 64, 64, 32, stages=3)
    fn, loop = lowered(case, "gfx942")
    body = loop.regions[0]
    body.ops.remove(next(op for op in body.ops if op.name == "barrier"))
    with pytest.raises(InterpreterError, match="shared-memory race"):
        run_threads(fn, case.make_args(), case.grid)


def test_waiting_for_one_group_too_few_is_a_read_before_the_wait():
    case = matmul_case(64, 64, 128, 64, 64, 32, stages=3)
    fn, loop = lowered(case, "gfx942")
    wait = next(op for op in loop.regions[0].ops if op.name == "async_wait")
    wait.attrs["pending"] += 1
    with pytest.raises(InterpreterError, match="before cp.async.wait_group"):
        run_threads(fn, case.make_args(), case.grid)


@pytest.mark.skipif(find_linker() is None, reason="no ld.lld found (pip install ziglang)")
@pytest.mark.parametrize("stages, vmcnt", [(3, 8), (4, 16)])
def test_the_amdgcn_loop_keeps_stages_minus_two_groups_in_flight(stages, vmcnt):
    case = matmul_case(256, 256, 256, 64, 64, 32, stages)
    fn, _ = lowered(case, "gfx942")
    artifacts = compile_thread_ir(fn, "gfx942", link=True)
    body = loop_body(artifacts.assembly)
    copies = [i for i, line in enumerate(body) if line.startswith("global_load_lds_dword ")]
    assert len(copies) == 8
    barrier = body.index("s_barrier")
    assert barrier < copies[0]                                  # the refill comes after the barrier
    waits = [line for line in body if line.startswith("s_waitcnt") and "vmcnt" in line]
    assert waits == [w for w in waits if f"vmcnt({vmcnt})" in w] and waits
    assert sum(line.startswith("v_mfma") for line in body) == 4
    meta = artifacts.metadata
    assert meta["vgpr_spill_count"] == 0 and meta["sgpr_spill_count"] == 0 and meta["private_segment_fixed_size"] == 0
    assert fn.attrs["shared_bytes"] == stages * 2 * 64 * 32 * 2
