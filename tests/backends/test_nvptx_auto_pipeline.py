"""A Triton-style matmul with a plain `range` K loop, pipelined by the compiler, in PTX and through ptxas.

Specification: `plain_matmul` compiled in strict mode (so any shortfall of
the automatic pipeline would be an error) is, on sm_80, a three-slot
cp.async ring (16-byte `cp.async.cg` copies, `cp.async.wait_group 1`, i.e.
S - 2 groups pending) feeding ldmatrix + mma.sync; on sm_90a a TMA ring
(`cp.async.bulk.tensor` onto mbarriers) feeding wgmma with one group left
in flight (`wgmma.wait_group.sync.aligned 1`). ptxas assembles both with
no spills. With `tessera.pipeline(..., stages=1)` the same loop has none of it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import find_ptxas

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from auto_pipeline_kernels import matmul_args, plain_matmul, staged_matmul  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None,
                                 reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
ARGS = matmul_args(256, 256, 256)
BLOCKS = dict(BM=64, BN=64, BK=32)


def no_spills(compiled) -> bool:
    return compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0


@needs_ptxas
def test_sm_80_range_loop_is_a_cp_async_ring_without_spills():
    ptx_of = plain_matmul.compile(*ARGS, target="sm_80", strict=True, **BLOCKS)
    ptx = ptx_of.stages["ptx"]
    assert "cp.async.cg.shared.global" in ptx and re.search(r"cp\.async\.wait_group\s+1;", ptx)
    assert "ldmatrix.sync.aligned" in ptx and "mma.sync.aligned.m16n8k16" in ptx
    assert no_spills(ptx_of)
    plain = staged_matmul.compile(*ARGS, target="sm_80", strict=True, STAGES=1, **BLOCKS).stages["ptx"]
    assert "cp.async" not in plain


@needs_ptxas
def test_sm_90a_range_loop_is_a_tma_ring_into_wgmma_with_a_group_in_flight_without_spills():
    compiled = plain_matmul.compile(*ARGS, target="sm_90a", strict=True, **BLOCKS)
    ptx = compiled.stages["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait.parity" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16" in ptx and re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    # A's and B's maps, and C's for the epilogue's TMA store
    assert [m["name"] for m in compiled.metadata["tensor_maps"]] == ["a_ptr_tma0", "b_ptr_tma1", "c_ptr_tma2"]
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx
    assert no_spills(compiled)
