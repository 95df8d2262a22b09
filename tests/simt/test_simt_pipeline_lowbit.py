"""Software-pipelined 8-bit and tf32 matmuls on the SIMT simulator: what the tile interpreter and numpy compute.

Specification:

* a `tessera.pipeline(..., stages=S)` K loop of i8/u8 -> i32, e4m3/e5m2 ->
  f32 (sm_89) and tf32 -> f32 dots, with A row-major and B given as B^T (both
  K-contiguous), lowered for mma.sync pipelines both loads (cp.async 16-byte
  chunks, or TMA boxes on sm_90 where the view allows, into swizzled ring
  slots; ldmatrix reads) and computes on the SIMT
  simulator what the tile interpreter computes -- i8/u8 exactly, the floats
  up to the f32 summation order -- and what numpy computes from the values
  the tensor cores see (tf32: the inputs rounded like cvt.rna.tf32.f32), for
  S = 2, 3, 4, odd M and N, K not a multiple of BK, on sm_80 / sm_89 / sm_90;
* an 8-bit or tf32 B contiguous along N cannot be read with ldmatrix (no
  .trans for them): only A is pipelined, B keeps its ordinary load, and the
  result is the same;
* the pipelined PTX assembles without spills.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.backends.interp import run_function

from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from lowbit_pipeline_kernels import lowbit_case  # noqa: E402

F32_SUMS = dict(rtol=1e-5, atol=1e-4)


def simulate(case, target, num_warps=4):
    """(tile interpreter's C, SIMT simulator's C, the pipelined thread function)."""
    expected, actual = case.make_args(), case.make_args()
    run_function(case.module.functions[0], expected, case.grid)
    fn = lower(case.module, target, num_warps).functions[0]
    run_threads(fn, actual, case.grid)
    return expected[2], actual[2], fn


def pipelined_body(fn) -> list:
    """The ops (nested ones too) of the pipelined loop's body."""
    loop = next(op for op in fn.walk() if op.name == "for" and op.attrs.get("stages"))
    return [nested for op in loop.regions[0].ops for nested in op.walk()]


def global_loads(ops) -> list:
    return [op for op in ops if op.name == "load" and op.operands[0].type.element.address_space != "shared"]


CASES = {   # name: (dtype case, M, N, K, BM, BN, BK, stages, target, warps)
    "i8-2stages": ("i8", 64, 64, 96, 64, 64, 32, 2, "sm_80", 4),
    "i8-3stages-odd": ("i8", 61, 37, 112, 64, 64, 64, 3, "sm_80", 4),
    "u8-4stages-odd": ("u8", 77, 45, 208, 64, 32, 32, 4, "sm_90", 4),
    "e4m3-3stages-odd": ("e4m3", 61, 37, 112, 64, 64, 32, 3, "sm_89", 4),
    "e5m2-4stages-one-warp": ("e5m2", 19, 13, 80, 32, 16, 32, 4, "sm_89", 1),
    "e4m3-2stages-sm90": ("e4m3", 100, 72, 144, 64, 64, 64, 2, "sm_90", 4),
    "tf32-2stages": ("tf32", 64, 64, 40, 64, 64, 16, 2, "sm_80", 4),
    "tf32-3stages-odd": ("tf32", 61, 37, 100, 64, 64, 32, 3, "sm_80", 4),
    "tf32-4stages-odd": ("tf32", 33, 70, 52, 32, 64, 16, 4, "sm_89", 4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pipelined_lowbit_matmul_matches_the_tile_interpreter_and_numpy(name):
    dtype, M, N, K, BM, BN, BK, stages, target, warps = CASES[name]
    case = lowbit_case(dtype, M, N, K, BM, BN, BK, stages)
    expected, actual, fn = simulate(case, target, warps)
    body = pipelined_body(fn)
    fills = {op.attrs["bytes"] for op in body if op.name == "async_copy"} | {"tma" for op in body
                                                                             if op.name == "tma_load"}
    # cp.async chunks (16 bytes where K's alignment allows, else 8 / 4); on sm_90 the slots may be TMA boxes
    assert fills in ({16}, {"tma"}) if K % 16 == 0 else fills
    assert any(op.name == "ldmatrix" for op in body) and not global_loads(body)     # A and B from the rings
    if dtype in ("i8", "u8"):
        np.testing.assert_array_equal(actual, expected)
        np.testing.assert_array_equal(actual, case.expected())
    else:
        np.testing.assert_allclose(actual, expected, **F32_SUMS)
        np.testing.assert_allclose(actual, case.expected(), **F32_SUMS)


@pytest.mark.parametrize("dtype, target", [("i8", "sm_80"), ("e4m3", "sm_89"), ("tf32", "sm_80")])
def test_a_b_contiguous_along_n_keeps_its_ordinary_load(dtype, target):
    case = lowbit_case(dtype, 61, 64, 96, 64, 64, 32, 3, b_k_major=False)
    expected, actual, fn = simulate(case, target)
    body = pipelined_body(fn)
    element_bytes = 4 if dtype == "tf32" else 1
    assert sum(op.name == "async_copy" for op in body) == 64 * 32 * element_bytes // 16 // 128   # A's chunks
    assert global_loads(body)                                   # B: global -> registers, as before
    if dtype == "i8":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, **F32_SUMS)


PTX_CASES = {   # dtype, target, BM, BN, BK, warps
    "i8-128x128x64-8warps": ("i8", "sm_80", 128, 128, 64, 8),
    "i8-128x64x64": ("i8", "sm_80", 128, 64, 64, 4),
    "e4m3-128x64x64": ("e4m3", "sm_89", 128, 64, 64, 4),
    "e5m2-64x64x64": ("e5m2", "sm_89", 64, 64, 64, 4),
    "tf32-64x64x32": ("tf32", "sm_80", 64, 64, 32, 4),
}


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("name", list(PTX_CASES))
def test_pipelined_lowbit_ptx_assembles_without_spills(name):
    dtype, target, BM, BN, BK, warps = PTX_CASES[name]
    case = lowbit_case(dtype, 256, 256, 512, BM, BN, BK, 3)
    fn = lower(case.module, target, warps).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in artifacts.ptx
    assert "cp.async.cg.shared.global" in artifacts.ptx or "cp.async.bulk.tensor" in artifacts.ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
