"""Explicit shared memory on AMD: the double-buffered matmul compiles for gfx942 (no cp.async: synchronous copies
into LDS, MFMA) without spills."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tessera.backends.amdgpu import compile_thread_ir
from tessera.passes.thread_passes import lower

sys.path.insert(0, str(Path(__file__).parents[1] / "interp"))
from shared_kernels import MatmulCase  # noqa: E402


def test_the_double_buffered_matmul_compiles_for_gfx942_with_mfma_and_lds():
    fn = lower(MatmulCase(256, 256, 256).module(), "gfx942", num_warps=4).functions[0]
    assert fn.attrs["shared_bytes"] <= 64 * 1024
    artifacts = compile_thread_ir(fn, "gfx942", link=False)
    assert re.search(r"\bv_mfma_f32_(32x32x8|16x16x16)_?f16", artifacts.assembly)
    assert re.search(r"\bds_(write|store)_b128\b", artifacts.assembly)     # 16-byte LDS stores of the copies
    assert artifacts.metadata["vgpr_spill_count"] == 0
