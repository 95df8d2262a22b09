"""dot on tensor cores: mma.sync m16n8k16 for f16/bf16 inputs with an f32 accumulator.

Specification:

* layout assignment puts a qualifying dot's accumulator in the mma C
  fragment layout, warps tiling M x N, and asks for A and B in the matching
  fragment layouts (replicated over the warps that share rows / columns);
* the lowered kernel runs `mma` ops and, on the SIMT simulator,
  computes what the tile interpreter computes (to f32 rounding: each mma
  adds its 16 products in f32 where the interpreter rounds an exact sum once);
* other dots (K not a multiple of 16, f32 inputs, N = 8 on an AMD target,
  which no MFMA fragment tiles) keep the FMA lowering (MFMA itself:
  tests/passes/test_mfma_dot.py);
* the PTX holds `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}...` and
  ptxas assembles it without spills for sm_80 and sm_90a (where a dot with
  fewer than 64 rows stays on mma.sync; wgmma: test_wgmma_dot.py).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir.layouts import local, mma_m16n8k16_a, mma_m16n8k16_b, mma_m16n8k16_c, replicated, spatial
from tessera.ir.target import get_target
from tessera.passes.layout_assignment import assign_layouts
from tessera.passes.mma import mma_plan
from tessera.passes.thread_passes import lower

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
F32_ACC = dict(rtol=1e-5, atol=1e-5)     # f32 results: per-k rounding vs one rounding of the exact sum


@tessera.kernel
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tessera.constexpr, N: tessera.constexpr, K: tessera.constexpr,
               DTYPE: tessera.constexpr):
    a = tessera.view(a_ptr, (M, K)).block((M, K), (0, 0)).load().to(DTYPE)
    b = tessera.view(b_ptr, (K, N)).block((K, N), (0, 0)).load().to(DTYPE)
    c = tessera.view(c_ptr, (M, N))
    acc = c.block((M, N), (0, 0)).load()
    c.block((M, N), (0, 0)).store(tessera.dot(a, b, acc))


def dot_args(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal((m, n)).astype(np.float32)]


def dot_module(m, n, k, dtype=tessera.f16):
    return dot_kernel.specialize(*dot_args(m, n, k), M=m, N=n, K=k, DTYPE=dtype).module


def mma_count(fn) -> int:
    return sum(op.name == "mma" for op in fn.walk())


def test_a_64x64x32_f16_dot_with_4_warps_gets_the_fragment_layouts():
    fn = dot_module(64, 64, 32).functions[0]
    assignment = assign_layouts(fn, get_target("sm_80"), num_warps=4)
    dot = next(op for op in fn.walk() if op.name == "dot")
    # 2 x 2 warps, each holding 2 x 4 accumulator fragments (32 x 32) and walking K in 2 steps.
    assert assignment.layout(dot.result) == local(2, 4) * spatial(2, 2) * mma_m16n8k16_c()
    assert assignment.operand_layout(dot, 2) == assignment.layout(dot.result)
    assert assignment.operand_layout(dot, 0) == local(2, 2) * spatial(2, 1) * replicated(2) * mma_m16n8k16_a()
    assert assignment.operand_layout(dot, 1) == local(2, 4) * replicated(2) * spatial(1, 2) * mma_m16n8k16_b()
    lowered = lower(fn, "sm_80", num_warps=4).functions[0]
    assert mma_count(lowered) == 2 * 4 * 2


@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape", [(16, 8, 16), (64, 64, 32), (32, 16, 64), (16, 64, 16)], ids=str)
@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_mma_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = dot_args(m, n, k), dot_args(m, n, k)
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "sm_80", num_warps=num_warps).functions[0]
    dot = next(op for op in module.functions[0].walk() if op.name == "dot")
    plan = mma_plan(dot, get_target("sm_80"), num_warps)
    assert plan.rk == k // 16 and mma_count(fn) == plan.rm * plan.rn * plan.rk   # each warp: its fragments x K
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


def tutorial_matmul_on(target, num_warps, blocks=(64, 64, 32), grid=(2, 2)):
    """Tutorial 03's matmul at 80 x 72 x 40 (no size divides its block: the edge blocks read zeros and mask
    their stores), lowered for `target` and run on the SIMT simulator; asserts it matches the tile
    interpreter and returns the thread IR, so callers can check which matrix instruction it used."""
    matmul = runpy.run_path(str(TUTORIALS / "03-matmul.py"))["matmul"]
    m, n, k = 80, 72, 40
    bm, bn, bk = blocks

    def args():
        rng = np.random.default_rng(3)
        a, b = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
        return [a, b, np.zeros((m, n), np.float16), m, n, k]

    expected, actual = args(), args()
    module = matmul.specialize(*expected, BM=bm, BN=bn, BK=bk).module
    run_function(module.functions[0], expected, grid)
    fn = lower(module, target, num_warps=num_warps).functions[0]
    run_threads(fn, actual, grid)
    # f16 outputs: the f32 sums differ in the last bits, which can move an f16 rounding by one ulp.
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), rtol=1e-3, atol=1e-3)
    return fn


def test_tutorial_matmul_uses_tensor_cores_and_matches_the_tile_interpreter():
    assert mma_count(tutorial_matmul_on("sm_80", 4)) == 16


@pytest.mark.parametrize("case", ["k8", "f32", "amd"])
def test_dots_that_do_not_fit_mma_keep_the_fma_lowering(case):
    shape, dtype, target = {"k8": ((16, 8, 8), tessera.f16, "sm_80"), "f32": ((16, 8, 16), tessera.f32, "sm_80"),
                            "amd": ((16, 8, 16), tessera.f16, "gfx90a")}[case]
    module = dot_module(*shape, dtype)
    fn = lower(module, target, num_warps=1).functions[0]
    assert mma_count(fn) == 0
    assert any(op.name == "for" for op in fn.walk())     # the FMA loop over k
    expected, actual = dot_args(*shape), dot_args(*shape)
    run_function(module.functions[0], expected, (1,))
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
def test_mma_dot_ptx_assembles_without_spills(target, dtype):
    m = 64 if target == "sm_80" else 32     # on sm_90a a 64-row dot runs on wgmma (test_wgmma_dot.py)
    fn = lower(dot_module(m, 64, 32, dtype), target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    name = "bf16" if dtype == tessera.bf16 else "f16"
    instruction = f"mma.sync.aligned.m16n8k16.row.col.f32.{name}.{name}.f32"
    assert sum(instruction in line for line in artifacts.ptx.splitlines()) == (m // 16) * (64 // 8) * (32 // 16) // 4   # per warp
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0


MMA_IN_A_BRANCH = """\
func @k(%out: ptr<f32>) attributes {num_threads = 64} {
  %tid = thread_id : i32
  %limit = constant {value = LIMIT} : i32
  %go = cmp %tid, %limit {pred = "lt"} : bool
  %a = constant {value = 1.0} : regs<8xf16>
  %b = constant {value = 0.5} : regs<4xf16>
  %c = constant {value = 1.0} : regs<4xf32>
  %d = if %go : regs<4xf32> {
    %m = mma %a, %b, %c {k = 16, m = 16, n = 8} : regs<4xf32>
    yield %m
  } {
    yield %c
  }
  %x = extract %d {index = 3} : f32
  %p = addptr %out, %tid : ptr<f32>
  store %p, %x
  return
}
"""


def test_mma_runs_per_whole_warp_and_rejects_a_partial_one():
    from tessera.backends.interp import InterpreterError
    from tessera.ir.parser import parse_module

    out = np.zeros(64, np.float32)
    run_threads(parse_module(MMA_IN_A_BRANCH.replace("LIMIT", "32")).functions[0], [out], (1,))
    np.testing.assert_array_equal(out, [1.0 + 16 * 0.5] * 32 + [1.0] * 32)   # warp 0 only: 1 + sum of 16 halves
    with pytest.raises(InterpreterError, match=r"only 16 of the 32 lanes of warp 0 execute it"):
        run_threads(parse_module(MMA_IN_A_BRANCH.replace("LIMIT", "16")).functions[0], [out], (1,))
