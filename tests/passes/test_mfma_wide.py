"""gfx950's double-K MFMA: dots use v_mfma_f32_32x32x16 / 16x16x32 where the target has "mfma.wide".

Specification:

* on gfx950 a f16/bf16 dot into f32 takes the double-K form of the m x n
  it would use anyway (32x32 when M and N are multiples of 32, else 16x16)
  when K is a multiple of its k (16, 32), else the narrow form; gfx90a and
  gfx942 never take a double-K form;
* the lowered dot issues half the mfma ops of the narrow form, and the SIMT
  simulator computes what the tile interpreter computes (to f32 rounding);
* the AMDGPU backend calls `llvm.amdgcn.mfma.f32.32x32x16.bf16` on
  <8 x bfloat> (`v_mfma_f32_32x32x16_bf16`) for gfx950, and refuses a
  double-K mfma for gfx942 with the reason before LLVM (which would abort).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.amdgpu import CodegenError, compile_thread_ir
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.ir.target import get_target
from tessera.passes.mma import (MFMA_16X16X16, MFMA_16X16X32, MFMA_32X32X8, MFMA_32X32X16, instruction_for,
                                mma_plan)
from tessera.passes.thread_passes import lower
from test_mma_dot import F32_ACC, dot_args, dot_module


def mfma_shapes(fn):
    return [(op.attrs["m"], op.attrs["n"], op.attrs["k"]) for op in fn.walk() if op.name == "mfma"]


@pytest.mark.parametrize("shape,gfx950,gfx942", [
    ((64, 64, 32), MFMA_32X32X16, MFMA_32X32X8),
    ((32, 32, 16), MFMA_32X32X16, MFMA_32X32X8),
    ((32, 32, 8), MFMA_32X32X8, MFMA_32X32X8),          # K = 8: no double-K form fits
    ((32, 32, 24), MFMA_32X32X8, MFMA_32X32X8),         # K % 16 != 0
    ((16, 16, 32), MFMA_16X16X32, MFMA_16X16X16),
    ((32, 16, 64), MFMA_16X16X32, MFMA_16X16X16),       # N = 16: the 16x16 forms
    ((16, 16, 16), MFMA_16X16X16, MFMA_16X16X16),       # K = 16 < 32
    ((16, 16, 48), MFMA_16X16X16, MFMA_16X16X16),
], ids=str)
def test_gfx950_takes_the_double_k_form_where_k_allows_and_gfx942_never(shape, gfx950, gfx942):
    for dtype in (tessera.f16, tessera.bf16):
        assert instruction_for(get_target("gfx950"), *shape, dtype) == gfx950
        assert instruction_for(get_target("gfx942"), *shape, dtype) == gfx942
        assert instruction_for(get_target("gfx90a"), *shape, dtype) == gfx942


@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape,num_warps", [((64, 64, 32), 4), ((32, 32, 16), 1), ((16, 64, 64), 2),
                                             ((32, 32, 8), 1)], ids=str)
def test_wide_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = dot_args(m, n, k), dot_args(m, n, k)
    run_function(module.functions[0], expected, (1,))
    dot = next(op for op in module.functions[0].walk() if op.name == "dot")
    plan = mma_plan(dot, get_target("gfx950"), num_warps)
    narrow = mma_plan(dot, get_target("gfx942"), num_warps)
    fn = lower(module, "gfx950", num_warps=num_warps).functions[0]
    inst = plan.instruction
    assert set(mfma_shapes(fn)) == {(inst.m, inst.n, inst.k)}
    if inst.k != narrow.instruction.k:
        assert len(mfma_shapes(fn)) * 2 == len(mfma_shapes(lower(module, "gfx942", num_warps=num_warps)
                                                           .functions[0]))
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


@pytest.mark.parametrize("target,instruction", [("gfx950", "v_mfma_f32_32x32x16_bf16"),
                                                ("gfx942", "v_mfma_f32_32x32x8_bf16")])
def test_a_bf16_dot_compiles_to_the_target_s_instruction(target, instruction):
    fn = lower(dot_module(64, 64, 32, tessera.bf16), target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, link=False)
    assert set(re.findall(r"\bv_mfma_f32_\w+", artifacts.assembly)) == {instruction}
    if target == "gfx950":
        assert re.search(r'call <16 x float> @"llvm\.amdgcn\.mfma\.f32\.32x32x16\.bf16"\(<8 x bfloat>',
                         artifacts.llvm_ir)
    assert artifacts.metadata["vgpr_spill_count"] == 0


WIDE_ON_GFX942 = """\
func @k() attributes {num_threads = 64, warp_size = 64} {
  %a = constant {value = 1.0} : regs<8xbf16>
  %c = constant {value = 0.0} : regs<16xf32>
  %d = mfma %a, %a, %c {k = 16, m = 32, n = 32} : regs<16xf32>
  return
}
"""


def test_a_double_k_mfma_is_refused_for_gfx942_before_llvm():
    fn = parse_module(WIDE_ON_GFX942).functions[0]
    with pytest.raises(CodegenError, match=r"mfma 32x32x16 is a gfx950 \(\"mfma.wide\"\) instruction that gfx942 "
                                           r"lacks; lower the kernel for gfx942 .* or compile for gfx950"):
        compile_thread_ir(fn, "gfx942", link=False)
    assert '@"llvm.amdgcn.mfma.f32.32x32x16.bf16"(<8 x bfloat>' in compile_thread_ir(fn, "gfx950", link=False).llvm_ir
