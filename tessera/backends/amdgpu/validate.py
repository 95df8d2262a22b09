"""AMD targets the AMDGPU backend compiles for, checked before LLVM sees a CPU string.

The checks on the function itself are the LLVM core's
(`tessera.backends.llvm.validate.validate_function`, with `AmdgpuDialect`'s
additions: NVIDIA-only ops and f64 transcendental math are rejected by
name). Here: the target must be AMD's, with the amdgcn-amd-amdhsa triple,
a gfx CPU this backend has been tested with, and no feature string (an
unknown one aborts LLVM).
"""

from __future__ import annotations

from tessera.ir.target import Target

from ..llvm.errors import CodegenError
from ..llvm.validate import resolve_target as resolve_vendor_target
from ..llvm.validate import validate_function

__all__ = ["AMDGPU_TRIPLE", "SUPPORTED_CPUS", "resolve_target", "validate_function"]

AMDGPU_TRIPLE = "amdgcn-amd-amdhsa"
SUPPORTED_CPUS = frozenset({"gfx90a", "gfx942", "gfx950"})


def resolve_target(target: Target | str | None) -> Target:
    """The AMD `Target` to compile for; CodegenError for anything else."""
    target = resolve_vendor_target(target, "amd", "AMDGPU", "gfx942", triple=AMDGPU_TRIPLE, cpus=SUPPORTED_CPUS)
    if target.llvm_features:
        raise CodegenError(f"target {target.name}: the AMDGPU backend takes no LLVM features, got "
                            f"{target.llvm_features!r}")
    return target
