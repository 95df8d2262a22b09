"""The AMDGPU lowering table: the LLVM core's common ops plus AMD's own.

Every target-neutral op comes from `tessera.backends.llvm.lowerings.COMMON`
(with `AmdgpuDialect` supplying ids, barrier, shuffles, LDS and math).
NVIDIA's warp-level ops (mma_m16n8k16, ldmatrix, cp.async) have no entry:
`AmdgpuDialect.unsupported_ops` rejects them with the reason before LLVM
sees anything.

MFMA: the `mfma` thread op (matrix-core multiply-accumulate, with its
layouts and SIMT semantics) is being added to the IR separately. Its
lowering belongs here, registered as

    @lowering("mfma")
    def _mfma(lw, op, a, b, c):
        # llvm.amdgcn.mfma.f32.{32x32x8f16, 16x16x16f16, 32x32x8bf16.1k, 16x16x16bf16.1k, ...}
        # (names in LLVM-NOTES.md), entries added to `intrinsics.FIXED`

and until then the validator reports `mfma` as not supported yet.
"""

from __future__ import annotations

from ..llvm.codegen import COMMON_LOWERINGS
from ..llvm.lowerings import LoweringTable

LOWERINGS = LoweringTable("AMDGPU", base=COMMON_LOWERINGS)
lowering = LOWERINGS.register
