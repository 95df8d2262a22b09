"""gfx950's OCP fp8 MFMA: e4m3 / e5m2 dots on v_mfma_f32_{32x32x16,16x16x32}_{fp8,bf8}_{fp8,bf8}; gfx942 stays on FMA.

Specification:

* on gfx950 ("mfma.fp8") an e4m3 / e5m2 dot, either mix, into f32 takes the 32x32x16 form when M and N are
  multiples of 32 and K of 16, else 16x16x32 (M, N multiples of 16, K of 32), else FMA; gfx942 and gfx90a
  never take an fp8 MFMA: gfx942's reads the fnuz formats, in which an OCP byte is another number (half of it,
  -0 a NaN, e5m2's infinity finite), so its fp8 dots stay exact on FMA;
* lowered for gfx950, an fp8 dot computes on the SIMT simulator what the tile interpreter computes, to the
  error bound of f32 sums taken in another order, with every finite code of the format among the inputs:
  subnormals, the largest normals (448, 57344), negative zero; e4m3 on 32x32x16 with 4 waves, e5m2 on
  16x16x32 with 1;
* the AMDGPU backend calls `llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8` on i64 operands for gfx950
  (`v_mfma_f32_32x32x16_fp8_fp8`, no spills); the same dot for gfx942 has no MFMA at all; an e4m3 x e5m2
  mfma calls `...32x32x16.fp8.bf8` on gfx950 and is refused for gfx942 with the reason before LLVM.
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
from tessera.passes.mma import MFMA_16X16X32, MFMA_32X32X16, instruction_for
from tessera.passes.thread_passes import lower
from test_mma_dot import dot_module

E4M3, E5M2 = tessera.f8e4m3, tessera.f8e5m2


@pytest.mark.parametrize("shape,gfx950", [
    ((64, 64, 32), MFMA_32X32X16),
    ((32, 32, 16), MFMA_32X32X16),
    ((16, 16, 32), MFMA_16X16X32),
    ((32, 16, 64), MFMA_16X16X32),      # N = 16: the 16x16 form
    ((16, 16, 16), None),               # K = 16: no 16x16 fp8 form takes it; FMA
    ((32, 32, 8), None),
], ids=str)
def test_gfx950_plans_fp8_on_mfma_in_any_mix_and_gfx942_never(shape, gfx950):
    for a, b in ((E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2), (E5M2, E4M3)):
        assert instruction_for(get_target("gfx950"), *shape, a, b) == gfx950
        for target in ("gfx942", "gfx90a"):
            assert instruction_for(get_target(target), *shape, a, b) is None
    assert instruction_for(get_target("gfx950"), *shape, E4M3, tessera.f16) is None


def finite_codes(dtype) -> np.ndarray:
    """Every finite value of the fp8 format, -0 and the subnormals among them, as float32."""
    values = dtype.decode(np.arange(256, dtype=np.uint8)).astype(np.float32)
    return values[np.isfinite(values)]


def odd_operands(m, n, k, dtype, seed):
    """A, B drawn from every finite code (both signs of zero, subnormals, the largest normal), with the extremes
    placed where they meet in the products; C in f32 with a -0."""
    rng = np.random.default_rng(seed)
    codes = finite_codes(dtype)
    a, b = rng.choice(codes, (m, k)), rng.choice(codes, (k, n))
    tiny = dtype.decode(np.array([1], np.uint8))[0]                       # the smallest subnormal
    a[0, :4] = [dtype.max_value, -dtype.max_value, tiny, -0.0]
    b[:4, 0] = [dtype.max_value, tiny, -tiny, dtype.max_value]
    a[1, :] = -0.0                                                          # a row of negative zeros
    c = rng.standard_normal((m, n)).astype(np.float32)
    c[1, 0] = -0.0
    return [a, b, c]


@pytest.mark.parametrize("dtype,shape,num_warps,instruction", [
    (E4M3, (64, 64, 32), 4, (32, 32, 16)),
    (E5M2, (16, 32, 64), 1, (16, 16, 32)),
], ids=["e4m3-32x32x16-4waves", "e5m2-16x16x32-1wave"])
def test_fp8_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps, instruction):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = odd_operands(m, n, k, dtype, seed=k), odd_operands(m, n, k, dtype, seed=k)
    a, b, c = (x.astype(np.float64) for x in expected)
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "gfx950", num_warps=num_warps).functions[0]
    assert {(op.attrs["m"], op.attrs["n"], op.attrs["k"]) for op in fn.walk() if op.name == "mfma"} == {instruction}
    run_threads(fn, actual, (1,))
    # f32 sums of the exact products in two orders: each within k + 1 roundings of the exact sum
    bound = (k + 1) * 2.0 ** -24 * (np.abs(a) @ np.abs(b) + np.abs(c))
    exact = c + a @ b
    assert np.all(np.abs(actual[2] - exact) <= bound) and np.all(np.abs(expected[2] - exact) <= bound)
    assert np.isfinite(actual[2]).all() and np.abs(actual[2]).max() > dtype.max_value ** 2 / 2


@pytest.fixture(scope="module")
def e4m3_dot():
    """A 64x64x32 e4m3 dot with 4 waves, compiled for gfx950 and for gfx942 (unlinked)."""
    module = dot_module(64, 64, 32, E4M3)
    return {target: compile_thread_ir(lower(module, target, num_warps=4).functions[0], target, link=False)
            for target in ("gfx950", "gfx942")}


def test_gfx950_issues_the_ocp_fp8_mfma_and_gfx942_none(e4m3_dot):
    gfx950, gfx942 = e4m3_dot["gfx950"], e4m3_dot["gfx942"]
    assert re.findall(r"\bv_mfma_\w+", gfx950.assembly) == ["v_mfma_f32_32x32x16_fp8_fp8"] * 2     # 2 k-steps a wave
    assert re.search(r'call <16 x float> @"llvm\.amdgcn\.mfma\.f32\.32x32x16\.fp8\.fp8"\(i64', gfx950.llvm_ir)
    assert gfx950.metadata["vgpr_spill_count"] == 0
    assert not re.search(r"\bv_mfma", gfx942.assembly)       # fnuz MFMA would misread the bytes: FMA


MIXED = """\
func @k() attributes {num_threads = 64, warp_size = 64} {
  %a = constant {value = 1.5} : regs<8xf8e4m3>
  %b = constant {value = 0.25} : regs<8xf8e5m2>
  %c = constant {value = 0.0} : regs<16xf32>
  %d = mfma %a, %b, %c {k = 16, m = 32, n = 32} : regs<16xf32>
  return
}
"""


def test_a_mixed_fp8_mfma_is_fp8_bf8_on_gfx950_and_refused_for_gfx942_before_llvm():
    fn = parse_module(MIXED).functions[0]
    # (its result is unused, so only the IR keeps it; the intrinsics table test sees it become the instruction)
    assert '@"llvm.amdgcn.mfma.f32.32x32x16.fp8.bf8"(i64' in compile_thread_ir(fn, "gfx950", link=False).llvm_ir
    with pytest.raises(CodegenError, match=r"mfma on fp8 \(e4m3/e5m2\) fragments needs gfx950's OCP fp8 MFMA "
                                           r"\(\"mfma.fp8\"\); gfx942's fp8 MFMA reads the fnuz formats.*"
                                           r"compile for gfx950"):
        compile_thread_ir(fn, "gfx942", link=False)

