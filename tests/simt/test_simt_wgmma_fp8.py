"""fp8 dots on wgmma m64nNk32 (sm_90a): planning, the type rule, the shared tiles, the SIMT simulator and ptxas.

Specification:

* on sm_90a an e4m3/e5m2 dot (either mix) with an f32 accumulator, M % 64,
  K % 32 and N % 8 runs on wgmma m64nNk32 (4 warps or a multiple); sm_89
  and sm_90 keep mma.sync m16n8k32, and shapes wgmma cannot tile do too;
* the wgmma op takes 8-bit inputs only at k = 32 and only K-major (no
  trans_a / trans_b), naming B's type in `dtype_b` when it differs;
* a K-major tile of 1-byte elements is read back by the descriptors of its
  32-element K slices exactly where `WgmmaTileLayout.byte_offset` put each
  element (the hardware's address map, `operand_addresses`);
* on the SIMT simulator, fp8 dots on wgmma compute what the tile interpreter
  and numpy compute (products exact, f32 sums): non-pipelined, pipelined
  with both operands K-major (A row-major, B given as B^T: both read from
  the cp.async rings, S = 2, 3, 4, odd M and N), and pipelined with a B
  contiguous along N (only A pipelined; B stored K-major every iteration);
  an e4m3 x e5m2 wgmma decodes each operand in its own format;
* the PTX holds `wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3` (or
  .e5m2, mixed) with no imm-trans operands, and ptxas assembles it for
  sm_90a without spills.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import run_function

from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir import dtypes as dt
from tessera.ir.errors import IRError
from tessera.ir.parser import parse_module
from tessera.ir.target import get_target
from tessera.ir.verifier import verify_function
from tessera.ir.wgmma_layouts import WgmmaTileLayout, operand_addresses, wgmma_tile_swizzle
from tessera.passes.mma import instruction_for
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from lowbit_pipeline_kernels import lowbit_case  # noqa: E402

F32_SUMS = dict(rtol=1e-5, atol=1e-4)
E4M3, E5M2 = dt.f8e4m3, dt.f8e5m2


# -- planning and the type rule ------------------------------------------------------------------

@pytest.mark.parametrize("a, b", [(E4M3, E4M3), (E5M2, E5M2), (E4M3, E5M2)], ids=str)
def test_sm90a_puts_fp8_dots_on_wgmma_k32(a, b):
    inst = instruction_for(get_target("sm_90a"), 128, 96, 64, a, b, dt.f32, num_warps=4)
    assert (inst.op, inst.m, inst.n, inst.k) == ("wgmma", 64, 96, 32)
    assert inst.attrs["dtype"] == a.name and inst.attrs.get("dtype_b", a.name) == b.name


@pytest.mark.parametrize("target, shape, warps", [("sm_89", (64, 64, 64), 4), ("sm_90", (64, 64, 64), 4),
                                                  ("sm_90a", (32, 64, 64), 4),
                                                  ("sm_90a", (64, 64, 64), 2)])
def test_elsewhere_fp8_dots_keep_mma_sync(target, shape, warps):
    inst = instruction_for(get_target(target), *shape, E4M3, E4M3, dt.f32, num_warps=warps)
    assert (inst.op, inst.k) == ("mma", 32)


WGMMA = """\
func @k() attributes {num_threads = 128, shared_bytes = 16384} {
  %smem = shared_alloc {bytes = 16384, offset = 0} : ptr<f8e4m3, shared>
  %d = wgmma_desc %smem {lbo = 16, sbo = 1024, swizzle = 128} : i64
  %acc = constant {value = 0.0} : f32
  %c = splat %acc : regs<32xf32>
  wgmma_fence
  %r = wgmma %d, %d, %c {ATTRS} : regs<32xf32>
  return
}
"""


@pytest.mark.parametrize("attrs, message", [
    ('dtype = "f8e4m3", k = 16, m = 64, n = 64', "m64nNk32"),
    ('dtype = "f8e4m3", k = 32, m = 64, n = 64, trans_b = true', "K-major"),
    ('dtype = "f8e4m3", dtype_b = "f16", k = 32, m = 64, n = 64', "e4m3/e5m2 x e4m3/e5m2"),
])
def test_the_wgmma_type_rule_takes_fp8_only_at_k32_and_k_major(attrs, message):
    with pytest.raises(IRError, match=message):
        verify_function(parse_module(WGMMA.replace("ATTRS", attrs)).functions[0])
    verify_function(parse_module(WGMMA.replace("ATTRS", 'dtype = "f8e4m3", dtype_b = "f8e5m2", k = 32, m = 64, '
                                                         'n = 64')).functions[0])


@pytest.mark.parametrize("rows, cols", [(64, 32), (64, 64), (128, 128), (8, 256)])
def test_k_major_one_byte_tiles_read_back_through_their_k32_descriptors(rows, cols):
    tile = WgmmaTileLayout(rows, cols, 1, wgmma_tile_swizzle(cols, 1, cols), "K")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    placed = np.asarray(tile.byte_offset(r, c))
    assert len(np.unique(placed)) == rows * cols            # a bijection onto the tile's bytes
    for s in range(cols // 32):
        for first in range(0, rows, 8 if rows < 64 else 64):
            span = min(64, rows - first)
            at = operand_addresses(tile.descriptor(0, s, first), span, 1)
            np.testing.assert_array_equal(at, placed[first:first + span, 32 * s:32 * s + 32])


# -- the SIMT simulator -----------------------------------------------------------------------------

def simulate(case, target="sm_90a", warps=4):
    expected, actual = case.make_args(), case.make_args()
    run_function(case.module.functions[0], expected, case.grid)
    fn = lower(case.module, target, warps).functions[0]
    run_threads(fn, actual, case.grid)
    return expected[2], actual[2], fn


def wgmmas(fn) -> list:
    return [op for op in fn.walk() if op.name == "wgmma"]


CASES = {   # dtype, M, N, K, BM, BN, BK, stages, B K-major
    "e4m3-not-pipelined": ("e4m3", 70, 45, 96, 64, 64, 64, 1, True),
    "e4m3-2stages": ("e4m3", 64, 64, 96, 64, 64, 32, 2, True),
    "e5m2-3stages-odd": ("e5m2", 70, 45, 160, 64, 64, 64, 3, True),
    "e4m3-4stages-odd-128x128": ("e4m3", 130, 100, 224, 128, 128, 32, 4, True),
    "e4m3-3stages-b-along-n": ("e4m3", 70, 45, 160, 64, 64, 64, 3, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp8_wgmma_dots_match_the_tile_interpreter_and_numpy(name):
    dtype, M, N, K, BM, BN, BK, stages, b_k_major = CASES[name]
    case = lowbit_case(dtype, M, N, K, BM, BN, BK, stages, b_k_major=b_k_major)
    expected, actual, fn = simulate(case)
    ops = wgmmas(fn)
    assert ops and all(op.attrs["k"] == 32 and not op.attrs.get("trans_a") and not op.attrs.get("trans_b")
                       for op in ops)
    assert not [op for op in fn.walk() if op.name == "mma"]
    if stages > 1:
        filled = [op for op in fn.walk() if op.name in ("async_copy", "tma_load")]
        assert filled                                   # the rings are filled (by TMA on sm_90a where it can)
        stored = [op for op in fn.walk() if op.name == "store" and op.operands[0].type.element.address_space
                  == "shared" and op.operands[1].type.element.dtype in (E4M3, E5M2)]
        assert bool(stored) == (not b_k_major)         # only an N-contiguous B goes through registers
    np.testing.assert_allclose(actual, expected, **F32_SUMS)
    np.testing.assert_allclose(actual, case.expected(), **F32_SUMS)


def test_an_e4m3_by_e5m2_wgmma_decodes_each_operand_in_its_own_format():
    # The frontend promotes e4m3 x e5m2 to f16, so take an e4m3 x e4m3 kernel, store B as e5m2 bits and say so
    # in the wgmmas' dtype_b: the simulator must read B as e5m2.
    case = lowbit_case("e4m3", 64, 64, 96, 64, 64, 32, 3)
    fn = lower(case.module, "sm_90a", 4).functions[0]
    for op in wgmmas(fn):
        op.attrs["dtype_b"] = "f8e5m2"
    verify_function(fn)
    args = case.make_args()
    args[1][...] = E5M2.encode(np.asarray(E4M3.decode(args[1]), np.float32))     # B^T as e5m2 bits
    b = np.asarray(E5M2.decode(args[1]), np.float64).T
    run_threads(fn, args, case.grid)
    np.testing.assert_allclose(args[2], case.a.astype(np.float64) @ b, **F32_SUMS)
    if find_ptxas() is not None:
        ptx = compile_thread_ir(fn, "sm_90a", isolate=False).ptx
        assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2" in ptx


# -- PTX ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("dtype, BM, BN, stages, warps", [("e4m3", 128, 128, 3, 8), ("e5m2", 128, 64, 3, 4),
                                                           ("e4m3", 64, 64, 1, 4)])
def test_fp8_wgmma_ptx_assembles_without_spills(dtype, BM, BN, stages, warps):
    case = lowbit_case(dtype, 256, 256, 512, BM, BN, 64, stages)
    artifacts = compile_thread_ir(lower(case.module, "sm_90a", warps).functions[0], "sm_90a", isolate=False)
    lines = [line for line in artifacts.ptx.splitlines() if "wgmma.mma_async" in line]
    assert lines and all(f"m64n{BN}k32.f32.{dtype}.{dtype}" in line for line in lines)    # N: the whole block
    assert all(line.rstrip().endswith("p, 1, 1;") for line in lines)       # no imm-trans operands
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
