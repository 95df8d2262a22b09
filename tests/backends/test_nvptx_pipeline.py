"""Pipelined K loops in PTX, assembled without spills: TMA ring fills on sm_90 (feeding ldmatrix + mma.sync)
and sm_90a (feeding wgmma through descriptors); cp.async ring copies with wait_group S-2 on sm_80 and on
sm_90a for loads TMA cannot fill (here: an sm_90a with TMA taken away)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

import tessera
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir.target import get_target
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from pipeline_kernels import matmul_case  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None,
                                 reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("dtype,trans_b,stages", [(tessera.f16, False, 3), (tessera.bf16, True, 4)], ids=str)
def test_pipelined_matmul_on_tma_targets_assembles_with_tma_fills_and_no_spills(target, dtype, trans_b, stages):
    """On sm_90 and sm_90a the ring slots are filled by TMA from the two by-value tensor maps (read in place,
    no local copy), announced on one mbarrier per slot and waited for with try_wait loops; no cp.async
    remains. On sm_90a wgmma reads the slots (two accumulator fragments per warpgroup: nothing in flight,
    so S - 1 ahead), and a row-major B's 256-byte slot rows are two 128B boxes; no proxy fence for the ring
    (the one fence orders C's st.shared before its TMA store, by a third map: `schedule/tma_store.py`)."""
    case = matmul_case(256, 256, 256, 128, 128, 32, stages, dtype, trans_b)
    fn = lower(case.module, target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    ptx = artifacts.ptx
    boxes = 3 if target == "sm_90a" and not trans_b else 2       # per slot of A and B together
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") == \
        boxes * stages
    assert "cp.async.cg" not in ptx and "cp.async.wait_group" not in ptx
    assert len(re.findall(r"\.param \.align 64 \.b8 pipelined_matmul_param_\d+\[128\]", ptx)) == 3
    # C (128 x 128, 16-bit): stmatrix into 128B-swizzled column blocks, one TMA store per 64 columns
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group") == 2 and "st.global" not in ptx
    assert "stmatrix.sync.aligned.m8n8.x4" in ptx
    assert "st.local" not in ptx and "mbarrier.try_wait.parity.shared.b64" in ptx
    assert ptx.count("mbarrier.init.shared.b64") == ptx.count("mbarrier.inval.shared.b64") == stages
    if target == "sm_90a":
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in ptx and "ldmatrix" not in ptx
        assert ptx.count("fence.proxy.async") == 1 and ptx.index("fence.proxy.async") > ptx.rindex("wgmma.wait_group")
    else:
        assert "ldmatrix.sync.aligned.m8n8.x4" in ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0


SM_90A_WITHOUT_TMA = dataclasses.replace(get_target("sm_90a"), features=get_target("sm_90a").features - {"tma"})


@needs_ptxas
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype,trans_b,stages", [(tessera.f16, False, 3), (tessera.bf16, True, 4)], ids=str)
def test_pipelined_matmul_assembles_with_cp_async_and_no_spills(target, dtype, trans_b, stages):
    """sm_90a here is lowered as if it had no TMA: the cp.async fill of wgmma slots (what loads TMA cannot
    fill get)."""
    case = matmul_case(256, 256, 256, 128, 128, 32, stages, dtype, trans_b)
    fn = lower(case.module, SM_90A_WITHOUT_TMA if target == "sm_90a" else target, num_warps=4).functions[0]
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
