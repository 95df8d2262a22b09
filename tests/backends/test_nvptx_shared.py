"""Explicit shared memory in PTX: the double-buffered matmul assembles for sm_80 with cp.async and no spills."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "interp"))
from shared_kernels import MatmulCase  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None,
                                 reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
CP_ASYNC_16 = r"cp\.async\.cg\.shared\.global(?:\.L2::\d+B)? \[[^\]]+\], \[[^\]]+\], 16"


@needs_ptxas
@pytest.mark.parametrize("M,N,K", [(256, 256, 256), (61, 37, 80)], ids=str)
def test_the_double_buffered_matmul_assembles_for_sm_80_without_spills(M, N, K):
    case = MatmulCase(M, N, K)
    fn = lower(case.module(), "sm_80", num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, "sm_80", isolate=False)
    ptx = artifacts.ptx
    assert re.findall(CP_ASYNC_16, ptx)                    # A's rows are 16-byte aligned in both cases
    assert re.search(r"cp\.async\.wait_group\s+1;", ptx) and re.search(r"cp\.async\.wait_group\s+0;", ptx)
    assert "cp.async.commit_group" in ptx and "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0


@needs_ptxas
def test_the_mbarrier_matmul_assembles_for_sm_90_with_tma_and_without_spills():
    from shared_kernels import mbarrier_matmul
    case = MatmulCase(256, 256, 256)
    fn = lower(case.module(mbarrier_matmul), "sm_90", num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, "sm_90", isolate=False)
    ptx = artifacts.ptx
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global", ptx)) == 4
    assert "mbarrier.expect_tx" in ptx and "mbarrier.try_wait.parity" in ptx and "mbarrier.init" in ptx
    assert "cp.async.cg" not in ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
