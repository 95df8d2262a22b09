"""A B operand that wgmma takes from registers is stored as it is, MN-major, when its registers run along N.

Specification (issue 19, fact 6): a 16-bit B block loaded into registers
(a plain, unpipelined loop) whose registers are contiguous along N (a
row-major B) is stored into an MN-major wgmma tile with 16-byte stores and
read by wgmma through its transpose bit (`trans_b`, PTX imm-trans-b = 1),
instead of being transposed element by element into a K-major tile; a B
whose registers do not run along N (B^T in memory) stays K-major. Either way the
SIMT simulator computes what the tile interpreter computes, and ptxas
assembles it with no spills.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower

from pipeline_kernels import F16_RESULT, matmul_case


def wgmmas(fn):
    return [op for op in fn.walk() if op.name == "wgmma"]


@pytest.mark.parametrize("trans_b", [False, True], ids=["row-major-B", "column-major-B"])
def test_b_is_stored_in_the_major_its_registers_run_along(trans_b):
    case = matmul_case(61, 64, 96, 64, 64, 32, stages=1, trans_b=trans_b)
    fn = lower(case.module, "sm_90a", 4).functions[0]
    assert wgmmas(fn) and all(op.attrs.get("trans_b", False) == (not trans_b) for op in wgmmas(fn))
    b_stores = [op for op in fn.walk() if op.name == "store" and op.operands[1].type.element.dtype.bits == 16]
    widths = sorted({op.attrs.get("vector", 1) for op in b_stores})
    if not trans_b:
        assert widths == [8]                                # A and B: 16-byte stores only, none element-wise
    expected, actual = case.make_args(), case.make_args()
    run_function(case.module.functions[0], expected, case.grid)
    run_threads(fn, actual, case.grid)
    np.testing.assert_allclose(actual[2].astype(np.float32), expected[2].astype(np.float32), **F16_RESULT)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found")
def test_mn_major_b_in_ptx_sets_the_transpose_bit_and_assembles_without_spills():
    case = matmul_case(256, 256, 256, 64, 64, 32, stages=1)
    artifacts = compile_thread_ir(lower(case.module, "sm_90a", 4).functions[0], "sm_90a", isolate=False)
    ptx = artifacts.ptx
    flags = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.f16\.f16 \{[^}]*\}, %rd\d+, %rd\d+, "
                           r"p, 1, 1, (\d), (\d);", ptx))
    assert flags == {("0", "1")}                            # A K-major, B MN-major
    assert not re.search(r"st\.shared\.b16", ptx)
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
