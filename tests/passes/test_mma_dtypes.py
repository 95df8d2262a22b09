"""dot on tensor cores beyond f16/bf16: tf32 (m16n8k8), i8/u8 -> i32 and fp8 -> f32 (m16n8k32).

Specification:

* f32 x f32 -> f32 runs on mma.sync m16n8k8 .tf32 only with
  `input_precision="tf32"`; by default (and with "ieee") it stays an exact
  FMA loop. The tensor-core result matches the tile interpreter, which rounds
  the inputs to tf32 the same way (ties away from zero, cvt.rna.tf32.f32);
* i8 x i8 and u8 x u8 -> i32 run on mma.sync m16n8k32 .s8/.u8 on sm_80+
  and agree with the interpreter exactly (wrapping like it);
* e4m3 / e5m2 -> f32 run on mma.sync m16n8k32 .e4m3/.e5m2 where the target
  has "mma.fp8" (sm_89, sm_90, and sm_90a where wgmma does not fit); sm_80
  keeps the FMA loop;
* every one of them, with 1 or 4 warps, whole or masked (odd-sized) tiles,
  computes on the SIMT simulator what the tile interpreter computes;
* the PTX holds the instruction and ptxas assembles it without spills.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.backends.nvptx import CodegenError, compile_thread_ir, find_ptxas
from tessera.ir.parser import parse_module
from tessera.passes.thread_passes import lower

F32_ACC = dict(rtol=1e-5, atol=1e-4)
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia wheel)")


@tessera.kernel
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
           A: tessera.constexpr, B: tessera.constexpr, ACC: tessera.constexpr, PRECISION: tessera.constexpr):
    """C += A @ B over BM x BN blocks, the inputs converted to A / B in the kernel (bounds-checked blocks:
    edges read zeros)."""
    a, b, c = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N)), tessera.view(c_ptr, (M, N))
    block = c.block((BM, BN), (tessera.program_id(0), tessera.program_id(1)))
    acc = block.load().to(ACC)
    for k in range(0, tessera.cdiv(K, BK)):
        x = a.block((BM, BK), (tessera.program_id(0), k)).load().to(A)
        y = b.block((BK, BN), (k, tessera.program_id(1))).load().to(B)
        acc = tessera.dot(x, y, acc, input_precision=PRECISION)
    block.store(acc)


CASES = {   # name: (A, B, acc, input_precision, numpy inputs, numpy acc)
    "tf32": (tessera.f32, tessera.f32, tessera.f32, "tf32", np.float32, np.float32),
    "i8": (tessera.i8, tessera.i8, tessera.i32, None, np.int8, np.int32),
    "u8": (tessera.u8, tessera.u8, tessera.i32, None, np.uint8, np.int32),
    "e4m3": (tessera.f8e4m3, tessera.f8e4m3, tessera.f32, None, np.float32, np.float32),
    "e5m2": (tessera.f8e5m2, tessera.f8e5m2, tessera.f32, None, np.float32, np.float32),
}


def args(case, m, n, k, seed=0):
    *_, inputs, acc = CASES[case]
    rng = np.random.default_rng(seed)
    if np.issubdtype(inputs, np.integer):
        info = np.iinfo(inputs)
        a, b = (rng.integers(info.min, info.max + 1, shape).astype(inputs) for shape in ((m, k), (k, n)))
        c = rng.integers(-1000, 1000, (m, n)).astype(acc)
    else:
        a, b, c = (rng.standard_normal(shape).astype(inputs) for shape in ((m, k), (k, n), (m, n)))
    return [a, b, c, m, n, k]


def specialize(case, m, n, k, bm, bn, bk, precision="default"):
    a, b, acc, case_precision, *_ = CASES[case]
    precision = case_precision if precision == "default" else precision
    return matmul.specialize(*args(case, m, n, k), BM=bm, BN=bn, BK=bk, A=a, B=b, ACC=acc,
                             PRECISION=precision).module


def instructions(fn) -> list[dict]:
    return [dict(op.attrs) for op in fn.walk() if op.name == "mma"]


def simulate(case, target, shape, blocks, num_warps, precision="default"):
    """(SIMT result, tile-interpreter result, lowered function) of the matmul."""
    (m, n, k), (bm, bn, bk) = shape, blocks
    module = specialize(case, m, n, k, bm, bn, bk, precision)
    grid = (-(-m // bm), -(-n // bn))
    expected, actual = args(case, m, n, k), args(case, m, n, k)
    run_function(module.functions[0], expected, grid)
    fn = lower(module, target, num_warps=num_warps).functions[0]
    run_threads(fn, actual, grid)
    return actual[2], expected[2], fn


SHAPES = [((32, 32, 32), (32, 32, 32), 1), ((64, 64, 64), (64, 64, 64), 4), ((40, 24, 50), (32, 16, 32), 1),
          ((72, 40, 96), (64, 32, 32), 4)]     # the last two: masked edges and K not a multiple of the block
SHAPE_IDS = ["32x32x32-1w", "64x64x64-4w", "masked-1w", "masked-4w"]


@pytest.mark.parametrize("shape, blocks, num_warps", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("case, target, k", [("tf32", "sm_80", 8), ("i8", "sm_80", 32), ("u8", "sm_80", 32),
                                             ("e4m3", "sm_90", 32), ("e5m2", "sm_89", 32)], ids=str)
def test_tensor_core_dot_on_the_simt_simulator_matches_the_tile_interpreter(case, target, k, shape, blocks,
                                                                             num_warps):
    actual, expected, fn = simulate(case, target, shape, blocks, num_warps)
    used = instructions(fn)
    assert used and all(inst == {"m": 16, "n": 8, "k": k} for inst in used)
    if CASES[case][2] == tessera.i32:
        np.testing.assert_array_equal(actual, expected)      # integer products and sums are exact
    else:
        np.testing.assert_allclose(actual, expected, **F32_ACC)


def test_tf32_rounds_the_inputs_like_the_interpreter_and_unlike_ieee():
    tf32, interpreted, _ = simulate("tf32", "sm_80", (32, 32, 64), (32, 32, 64), 1)
    ieee = args("tf32", 32, 32, 64)
    ieee = ieee[2] + ieee[0].astype(np.float64) @ ieee[1].astype(np.float64)
    np.testing.assert_allclose(tf32, interpreted, **F32_ACC)
    assert np.abs(tf32 - ieee).max() > 100 * np.abs(tf32 - interpreted).max()   # 10-bit mantissas, not 23


@pytest.mark.parametrize("precision", [None, "ieee"])
def test_plain_f32_dot_stays_exact_fma(precision):
    actual, expected, fn = simulate("tf32", "sm_80", (32, 32, 32), (32, 32, 32), 1, precision)
    assert instructions(fn) == []
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-5)


def test_fp8_on_sm_80_keeps_the_fma_loop():
    actual, expected, fn = simulate("e4m3", "sm_80", (32, 32, 32), (32, 32, 32), 1)
    assert instructions(fn) == [] and any(op.name == "for" for op in fn.walk())
    np.testing.assert_allclose(actual, expected, **F32_ACC)


WRAPPING_MMA = """\
func @k(%out: ptr<i32>) attributes {num_threads = 32} {
  %tid = thread_id : i32
  %a = constant {value = 127} : regs<16xi8>
  %b = constant {value = 127} : regs<8xi8>
  %c = constant {value = 2147483000} : regs<4xi32>
  %d = mma %a, %b, %c {k = 32, m = 16, n = 8} : regs<4xi32>
  %x = extract %d {index = 0} : i32
  %p = addptr %out, %tid : ptr<i32>
  store %p, %x
  return
}
"""


def test_integer_mma_wraps_its_i32_accumulator():
    out = np.zeros(32, np.int32)
    run_threads(parse_module(WRAPPING_MMA).functions[0], [out], (1,))
    wrapped = (2147483000 + 32 * 127 * 127 + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(out, [wrapped] * 32)


@needs_ptxas
@pytest.mark.parametrize("case, target, instruction", [
    ("tf32", "sm_80", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("tf32", "sm_90a", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("i8", "sm_80", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"),
    ("u8", "sm_90a", "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32"),
    ("e4m3", "sm_90", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),     # sm_90a: wgmma (test_simt_wgmma_fp8)
    ("e5m2", "sm_89", "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32"),
], ids=str)
def test_ptx_holds_the_instruction_and_assembles_without_spills(case, target, instruction):
    fn = lower(specialize(case, 64, 64, 32, 64, 64, 32), target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    k = 8 if case == "tf32" else 32
    # 4 warps of 2 x 4 fragments (32 x 32 each), 32 / k steps along K
    assert sum(instruction in line for line in artifacts.ptx.splitlines()) == 2 * 4 * (32 // k)
    if case == "tf32":
        assert "cvt.rna.tf32.f32" in artifacts.ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0


MIXED_FP8 = """\
func @k(%out: ptr<f32>) attributes {num_threads = 32} {
  %tid = thread_id : i32
  %a = constant {value = 1.5} : regs<16xf8e4m3>
  %b = constant {value = 0.25} : regs<8xf8e5m2>
  %c = constant {value = 1.0} : regs<4xf32>
  %d = mma %a, %b, %c {k = 32, m = 16, n = 8} : regs<4xf32>
  %x = extract %d {index = 2} : f32
  %p = addptr %out, %tid : ptr<f32>
  store %p, %x
  return
}
"""


def test_mixed_fp8_mma_computes_and_is_rejected_before_llvm_on_sm_80():
    out = np.zeros(32, np.float32)
    run_threads(parse_module(MIXED_FP8).functions[0], [out], (1,))
    np.testing.assert_array_equal(out, [1.0 + 32 * 1.5 * 0.25] * 32)
    with pytest.raises(CodegenError, match=r"mma on fp8 \(e4m3/e5m2\) fragments needs sm_89\+, which sm_80 is not"):
        compile_thread_ir(parse_module(MIXED_FP8).functions[0], "sm_80", isolate=False)
    if find_ptxas() is not None:
        artifacts = compile_thread_ir(parse_module(MIXED_FP8).functions[0], "sm_90a", isolate=False)
        assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32" in artifacts.ptx


@pytest.mark.parametrize("target, shape", [("gfx942", (32, 32, 32)), ("sm_80", (16, 8, 4))], ids=["amd", "k4"])
def test_a_tf32_dot_without_a_tensor_core_rounds_its_inputs_like_the_interpreter(target, shape):
    actual, expected, fn = simulate("tf32", target, shape, shape, 1)
    assert instructions(fn) == []
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-5)     # far inside tf32's ~1e-3
