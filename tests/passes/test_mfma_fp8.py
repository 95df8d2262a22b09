"""gfx950's OCP fp8 MFMA: e4m3 / e5m2 dots on v_mfma_f32_{32x32x64,16x16x128}_f8f6f4 and
v_mfma_f32_{32x32x16,16x16x32}_{fp8,bf8}_{fp8,bf8}; gfx942 stays on FMA.

Specification:

* on gfx950 ("mfma.fp8") an e4m3 / e5m2 dot, either mix, into f32 takes a 32x32 form when M and N are
  multiples of 32, else a 16x16 one, and of that size the double-rate f8f6f4 form (k 64 / 128) where K
  allows, else the fp8 one (k 16 / 32), else FMA; gfx942 and gfx90a never take an fp8 MFMA: gfx942's reads
  the fnuz formats, in which an OCP byte is another number (half of it, -0 a NaN, e5m2's infinity finite),
  so its fp8 dots stay exact on FMA;
* lowered for gfx950, an fp8 dot computes on the SIMT simulator what the tile interpreter computes, to the
  error bound of f32 sums taken in another order, with every finite code of the format among the inputs:
  subnormals, the largest normals (448, 57344), negative zero; on each of the four instructions, e4m3 and
  e5m2, with 1, 2 and 4 waves (and, marked gpu / amdgpu, on an MI350 / MI355, to the same bound);
* the AMDGPU backend calls `llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4` on <8 x i32> operands with zero
  scales for gfx950 (`v_mfma_f32_32x32x64_f8f6f4`, unscaled, no spills); the same dot for gfx942 has no MFMA
  at all; an e4m3 x e5m2 mfma calls `...32x32x16.fp8.bf8` (and the f8f6f4 form with formats 0 and 1) on
  gfx950 and is refused for gfx942 with the reason before LLVM.
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
from tessera.passes.mma import MFMA_16X16X32, MFMA_16X16X128, MFMA_32X32X16, MFMA_32X32X64, instruction_for
from tessera.passes.thread_passes import lower
from test_mma_dot import dot_kernel, dot_module

E4M3, E5M2 = tessera.f8e4m3, tessera.f8e5m2


@pytest.mark.parametrize("shape,gfx950", [
    ((64, 64, 128), MFMA_32X32X64),
    ((32, 32, 64), MFMA_32X32X64),
    ((64, 64, 32), MFMA_32X32X16),      # K % 64 != 0: the fp8 form
    ((32, 32, 16), MFMA_32X32X16),
    ((16, 16, 256), MFMA_16X16X128),
    ((16, 16, 32), MFMA_16X16X32),
    ((32, 16, 64), MFMA_16X16X32),      # N = 16: a 16x16 form, K % 128 != 0
    ((16, 16, 16), None),               # K = 16: no 16x16 fp8 form takes it; FMA
    ((32, 32, 8), None),
], ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else getattr(x, "attrs", None) and
                 "mfma{m}x{n}x{k}".format(**x.attrs) or "fma")
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


FOUR_INSTRUCTIONS = pytest.mark.parametrize("dtype,shape,num_warps,instruction", [
    (E4M3, (64, 64, 32), 4, (32, 32, 16)),
    (E5M2, (16, 32, 64), 1, (16, 16, 32)),
    (E5M2, (64, 32, 128), 2, (32, 32, 64)),
    (E4M3, (16, 16, 256), 1, (16, 16, 128)),
], ids=["e4m3-32x32x16-4waves", "e5m2-16x16x32-1wave", "e5m2-32x32x64-2waves", "e4m3-16x16x128-1wave"])


def assert_within_reordering(got, operands, dtype):
    """`got` is C + A @ B summed in f32 in some order: within k + 1 roundings of the exact sum, finite, and
    reaching the largest products (the extremes met)."""
    a, b, c = (x.astype(np.float64) for x in operands)
    bound = (a.shape[1] + 1) * 2.0 ** -24 * (np.abs(a) @ np.abs(b) + np.abs(c))
    assert np.all(np.abs(got - (c + a @ b)) <= bound)
    assert np.isfinite(got).all() and np.abs(got).max() > dtype.max_value ** 2 / 2


@FOUR_INSTRUCTIONS
def test_fp8_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps, instruction):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = odd_operands(m, n, k, dtype, seed=k), odd_operands(m, n, k, dtype, seed=k)
    operands = [x.copy() for x in expected]
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "gfx950", num_warps=num_warps).functions[0]
    assert {(op.attrs["m"], op.attrs["n"], op.attrs["k"]) for op in fn.walk() if op.name == "mfma"} == {instruction}
    run_threads(fn, actual, (1,))
    assert_within_reordering(expected[2], operands, dtype)
    assert_within_reordering(actual[2], operands, dtype)


@pytest.mark.gpu
@pytest.mark.amdgpu
@FOUR_INSTRUCTIONS
def test_on_a_gfx950_gpu_each_fp8_mfma_computes_the_product(dtype, shape, num_warps, instruction):
    """What the CPU cannot settle: that gfx950 reads these bytes as OCP e4m3 / e5m2 (as fnuz, 448 would come out
    224 and -0 NaN), that the f8f6f4 forms with zero scales are unscaled, and the lane layouts. The same odd
    operands as the simulator test, launched for real on an MI350 / MI355."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    from tessera.kernels_lib.targets import device_arch
    if device_arch() != "gfx950":
        pytest.skip(f"needs gfx950 (MI350 / MI355), this GPU is {device_arch()}")
    m, n, k = shape
    operands = odd_operands(m, n, k, dtype, seed=k)
    a, b, c = (torch.from_numpy(x.copy()).cuda() for x in operands)
    dot_kernel[(1,)](a, b, c, M=m, N=n, K=k, DTYPE=dtype, num_warps=num_warps)
    torch.cuda.synchronize()
    assert_within_reordering(c.cpu().numpy().astype(np.float64), operands, dtype)


@pytest.fixture(scope="module")
def e4m3_dot():
    """A 64x64x64 e4m3 dot with 4 waves, compiled for gfx950 and for gfx942 (unlinked)."""
    module = dot_module(64, 64, 64, E4M3)
    return {target: compile_thread_ir(lower(module, target, num_warps=4).functions[0], target, link=False)
            for target in ("gfx950", "gfx942")}


def test_gfx950_issues_the_ocp_fp8_mfma_and_gfx942_none(e4m3_dot):
    gfx950, gfx942 = e4m3_dot["gfx950"], e4m3_dot["gfx942"]
    # one 32x32 block and one k-step a wave, unscaled (the scale intrinsic with A and B in e4m3, zero scales)
    assert re.findall(r"\bv_mfma_\w+", gfx950.assembly) == ["v_mfma_f32_32x32x64_f8f6f4"]
    assert re.search(r'call <16 x float> @"llvm\.amdgcn\.mfma\.scale\.f32\.32x32x64\.f8f6f4\.v8i32\.v8i32"'
                     r'\(<8 x i32> %"?[.\w]+"?, <8 x i32> %"?[.\w]+"?, <16 x float> %"?[.\w]+"?, '
                     r'i32 0, i32 0, i32 0, i32 0, i32 0, i32 0\)', gfx950.llvm_ir)
    assert gfx950.metadata["vgpr_spill_count"] == 0
    assert not re.search(r"\bv_mfma", gfx942.assembly)       # fnuz MFMA would misread the bytes: FMA


MIXED = """\
func @k() attributes {num_threads = 64, warp_size = 64} {
  %a = constant {value = 1.5} : regs<8xf8e4m3>
  %b = constant {value = 0.25} : regs<8xf8e5m2>
  %c = constant {value = 0.0} : regs<16xf32>
  %d = mfma %a, %b, %c {k = 16, m = 32, n = 32} : regs<16xf32>
  %a4 = constant {value = 1.5} : regs<32xf8e4m3>
  %b4 = constant {value = 0.25} : regs<32xf8e5m2>
  %d4 = mfma %a4, %b4, %c {k = 64, m = 32, n = 32} : regs<16xf32>
  return
}
"""


def test_a_mixed_fp8_mfma_is_fp8_bf8_on_gfx950_and_refused_for_gfx942_before_llvm():
    fn = parse_module(MIXED).functions[0]
    # (the results are unused, so only the IR keeps them; the intrinsics table test sees them become instructions)
    llvm_ir = compile_thread_ir(fn, "gfx950", link=False).llvm_ir
    assert '@"llvm.amdgcn.mfma.f32.32x32x16.fp8.bf8"(i64' in llvm_ir
    # A's format e4m3 (0), B's e5m2 (1), no scales
    assert re.search(r'f8f6f4\.v8i32\.v8i32"\(.*, i32 0, i32 1, i32 0, i32 0, i32 0, i32 0\)', llvm_ir)
    with pytest.raises(CodegenError, match=r"mfma on fp8 \(e4m3/e5m2\) fragments needs gfx950's OCP fp8 MFMA "
                                           r"\(\"mfma.fp8\"\), which gfx942 lacks \(gfx942's fp8 MFMA reads the "
                                           r"fnuz formats.*compile for gfx950"):
        compile_thread_ir(fn, "gfx942", link=False)

