"""Pipelined K loops in PTX: cp.async ring copies, wait_group S-2, assembled for sm_80 (ldmatrix + mma.sync)
and sm_90a (wgmma from the ring slots) without spills."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tessera
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.passes.pipeline_threads import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import matmul_case  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None,
                                 reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_90"])      # sm_90a's wgmma slots are filled by cp.async (below)
@pytest.mark.parametrize("dtype,trans_b,stages", [(tessera.f16, False, 3), (tessera.bf16, True, 4)], ids=str)
def test_pipelined_matmul_on_tma_targets_assembles_with_tma_fills_and_no_spills(target, dtype, trans_b, stages):
    """On sm_90 the ring slots are filled by TMA from the two by-value tensor maps (read in place, no local
    copy), announced on one mbarrier per slot and waited for with try_wait loops; no cp.async remains."""
    case = matmul_case(256, 256, 256, 128, 128, 32, stages, dtype, trans_b)
    fn = lower(case.module, target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    ptx = artifacts.ptx
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == 2 * stages
    assert "cp.async.cg" not in ptx and "cp.async.wait_group" not in ptx
    assert len(re.findall(r"\.param \.align 64 \.b8 pipelined_matmul_param_\d+\[128\]", ptx)) == 2
    assert "st.local" not in ptx and "mbarrier.try_wait.parity.shared.b64" in ptx
    assert ptx.count("mbarrier.init.shared.b64") == ptx.count("mbarrier.inval.shared.b64") == stages
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,trans_b,stages", [(tessera.f16, False, 3), (tessera.bf16, True, 4)], ids=str)
def test_pipelined_matmul_assembles_with_cp_async_and_no_spills(target, dtype, trans_b, stages):
    case = matmul_case(256, 256, 256, 128, 128, 32, stages, dtype, trans_b)
    fn = lower(case.module, target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    ptx = artifacts.ptx
    copies = re.findall(r"cp\.async\.cg\.shared\.global(?:\.L2::\d+B)? \[[^\]]+\], \[[^\]]+\], 16", ptx)
    assert copies                                              # 16-byte copies, cached in L2 only
    assert re.search(rf"cp\.async\.wait_group\s+{stages - 2};", ptx)
    assert re.search(r"cp\.async\.wait_group\s+0;", ptx)       # the drain after the loop
    assert "cp.async.commit_group" in ptx
    if target == "sm_90a":      # wgmma reads the ring slots through descriptors (two fragments: nothing in flight)
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in ptx and "ldmatrix" not in ptx
        assert "fence.proxy.async.shared::cta" in ptx
    else:
        assert "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
    assert fn.attrs["shared_bytes"] >= stages * (128 * 32 + 32 * 128) * 2
