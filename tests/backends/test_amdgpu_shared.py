"""Explicit shared memory on AMD: the double-buffered matmul compiles for gfx942 and gfx950 with direct-to-LDS
copies (`global_load_lds_dword`, 4 bytes a lane; `..._dwordx4` on gfx950), MFMA, and a loop that keeps the next
block's copies in flight across the dot: `s_waitcnt vmcnt(<copies of one group>)`, never vmcnt(0), inside the
loop; linked, without spills or scratch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.amdgpu import compile_thread_ir, find_linker
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "interp"))
from amdgcn_loops import loop_body  # noqa: E402
from shared_kernels import MatmulCase  # noqa: E402

needs_linker = pytest.mark.skipif(find_linker() is None, reason="no ld.lld found (pip install ziglang)")


@needs_linker
@pytest.mark.parametrize("target, instruction, per_group", [("gfx942", "global_load_lds_dword", 8),
                                                            ("gfx950", "global_load_lds_dwordx4", 2)])
def test_the_double_buffered_matmul_keeps_a_group_of_lds_copies_in_flight(target, instruction, per_group):
    fn = lower(MatmulCase(256, 256, 256).module(), target, num_warps=4).functions[0]
    assert fn.attrs["shared_bytes"] <= 64 * 1024
    artifacts = compile_thread_ir(fn, target, link=True)
    assert re.search(r"\bv_mfma_f32_(32x32x(8|16)|16x16x(16|32))_?(f16|_f16)", artifacts.assembly)
    body = loop_body(artifacts.assembly)
    copies = [line for line in body if line.split()[0] == instruction]
    assert len(copies) == per_group      # A and B blocks of 64x32 / 32x64 f16 over 256 lanes
    waits = [line for line in body if line.startswith("s_waitcnt") and "vmcnt" in line]
    assert waits and all(f"vmcnt({per_group})" in w for w in waits), waits
    assert artifacts.hsaco is not None
    meta = artifacts.metadata
    assert meta["vgpr_spill_count"] == 0 and meta["sgpr_spill_count"] == 0
    assert meta["private_segment_fixed_size"] == 0
