"""dot on wgmma (sm_90a): plan, simulated results, PTX.

Specification:

* on a target with "wgmma", a dot of f16/bf16 inputs into f32 with M % 64,
  N % 8, K % 16 and whole warpgroups plans wgmma m64nNk16: warpgroups split
  M into 64-row slabs, the accumulator is in `wgmma_accumulator(N)`
  composed with local / spatial digits, and the operands go to shared memory
  (no operand layouts asked); elsewhere (sm_80, shapes that do not fit,
  fewer than 4 warps) the mma.sync plan stays;
* the lowered kernel runs one wgmma per slab per 16-wide K slice and, on the
  SIMT simulator, computes what the tile interpreter computes (to f32
  rounding), also for the tutorial matmul with partial (masked) blocks;
* the PTX holds `wgmma.mma_async.sync.aligned.m64n...` and ptxas assembles
  it without spills.

(A dot in a software-pipelined loop runs on wgmma too, reading the cp.async
ring slots: `test_pipelined_wgmma.py`.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir.layouts import local, replicated, spatial
from tessera.ir.target import get_target
from tessera.ir.wgmma_layouts import wgmma_accumulator
from tessera.passes.layout_assignment import assign_layouts
from tessera.passes.mma import MMA_M16N8K16, mma_plan
from tessera.passes.thread_passes import lower

from test_mma_dot import F32_ACC, dot_args, dot_module, tutorial_matmul_on

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def plan_for(m, n, k, num_warps, target="sm_90a", dtype=tessera.f16):
    dot = next(op for op in dot_module(m, n, k, dtype).functions[0].walk() if op.name == "dot")
    return mma_plan(dot, get_target(target), num_warps)


def wgmma_count(fn) -> int:
    return sum(op.name == "wgmma" for op in fn.walk())


@pytest.mark.parametrize("shape, num_warps, c", [
    ((64, 64, 16), 4, wgmma_accumulator(64)),
    ((64, 64, 64), 4, wgmma_accumulator(64)),
    ((128, 128, 64), 4, local(2, 1) * wgmma_accumulator(128)),
    ((128, 128, 64), 8, spatial(2, 1) * wgmma_accumulator(128)),
    ((64, 128, 32), 8, replicated(2) * wgmma_accumulator(128)),      # one slab: both warpgroups compute it
    ((256, 64, 16), 8, local(2, 1) * spatial(2, 1) * wgmma_accumulator(64)),
    ((64, 512, 16), 4, local(1, 2) * wgmma_accumulator(256)),         # N > 256: two column blocks
], ids=str)
def test_sm90a_plans_wgmma_slabs_of_64_rows_per_warpgroup(shape, num_warps, c):
    plan = plan_for(*shape, num_warps)
    m, n, k = shape
    assert plan.instruction.op == "wgmma" and plan.instruction.attrs["dtype"] == "f16"
    assert plan.c == c and plan.a is None and plan.b is None and plan.rk == k // 16
    fn = dot_module(*shape).functions[0]
    assignment = assign_layouts(fn, get_target("sm_90a"), num_warps=num_warps)
    dot = next(op for op in fn.walk() if op.name == "dot")
    assert assignment.layout(dot.result) == c


def test_warpgroup_g_holds_slab_rm_times_wm_plus_g():
    plan = plan_for(256, 64, 16, 8)
    table = plan.c.table()          # (threads, registers, 2)
    for g in range(plan.wm):
        for rm in range(plan.rm):
            assert tuple(table[128 * g, rm * 32]) == ((rm * plan.wm + g) * 64, 0)


@pytest.mark.parametrize("case, shape, num_warps", [
    ("sm_80", (64, 64, 32), 4), ("sm_80 8 warps", (128, 128, 64), 8), ("M = 32", (32, 64, 32), 4),
    ("K = 8", (64, 64, 8), 4), ("2 warps", (64, 64, 32), 2)], ids=str)
def test_other_targets_and_unfitting_shapes_keep_mma_sync(case, shape, num_warps):
    target = "sm_80" if case.startswith("sm_80") else "sm_90a"
    plan = plan_for(*shape, num_warps, target)
    assert plan is None or plan.instruction == MMA_M16N8K16
    if case != "K = 8":
        assert plan.instruction == MMA_M16N8K16


@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape, num_warps", [((64, 64, 32), 4), ((128, 64, 64), 8), ((64, 32, 128), 4),
                                              ((64, 16, 16), 8)], ids=str)
def test_wgmma_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = dot_args(m, n, k), dot_args(m, n, k)
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "sm_90a", num_warps=num_warps).functions[0]
    plan = plan_for(m, n, k, num_warps, dtype=dtype)
    assert wgmma_count(fn) == plan.rm * plan.rn * plan.rk and not any(op.name == "mma" for op in fn.walk())
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


@pytest.mark.parametrize("num_warps", [4, 8])
def test_tutorial_matmul_on_wgmma_matches_the_tile_interpreter_with_masked_edges(num_warps):
    assert wgmma_count(tutorial_matmul_on("sm_90a", num_warps)) == 2


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape, num_warps", [((64, 64, 32), 4), ((128, 128, 64), 8)], ids=str)
def test_wgmma_dot_ptx_assembles_without_spills(dtype, shape, num_warps):
    m, n, k = shape
    fn = lower(dot_module(m, n, k, dtype), "sm_90a", num_warps=num_warps).functions[0]
    artifacts = compile_thread_ir(fn, "sm_90a", isolate=False)
    name = "bf16" if dtype == tessera.bf16 else "f16"
    instruction = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{name}.{name}"
    assert sum(instruction in line for line in artifacts.ptx.splitlines()) == k // 16 * (m // 64) // (num_warps // 4)
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
