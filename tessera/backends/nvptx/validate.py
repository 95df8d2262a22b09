"""NVIDIA targets the NVPTX backend compiles for, checked before LLVM sees a CPU or feature string.

The checks on the function itself are the LLVM core's
(`tessera.backends.llvm.validate.validate_function`, with `NvptxDialect`'s
additions); here: the target must be NVIDIA's, with the NVPTX triple, a
CPU this backend has been tested with, and PTX ISA features LLVM accepts
(an unknown one aborts LLVM).
"""

from __future__ import annotations

import re

from tessera.ir.target import Target

from ..llvm.errors import CodegenError
from ..llvm.validate import resolve_target as resolve_vendor_target
from ..llvm.validate import validate_function

__all__ = ["NVPTX_TRIPLE", "SUPPORTED_CPUS", "resolve_target", "validate_function"]

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
# CPUs and PTX ISA versions LLVM 22 accepts and this backend has been tested with.
SUPPORTED_CPUS = frozenset({"sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
                            "sm_120", "sm_120a"})
_PTX_FEATURE = re.compile(r"\+ptx(\d+)")
PTX_VERSIONS = range(70, 91)  # +ptx70 .. +ptx90


def resolve_target(target: Target | str | None) -> Target:
    """The NVIDIA `Target` to compile for; CodegenError for anything else."""
    target = resolve_vendor_target(target, "nvidia", "NVPTX", "sm_90a", triple=NVPTX_TRIPLE, cpus=SUPPORTED_CPUS)
    for feature in filter(None, target.llvm_features.split(",")):
        match = _PTX_FEATURE.fullmatch(feature)
        if not match or int(match.group(1)) not in PTX_VERSIONS:
            raise CodegenError(f"target {target.name}: LLVM feature {feature!r} is not a PTX ISA version the "
                                f"backend supports (+ptx{PTX_VERSIONS[0]} .. +ptx{PTX_VERSIONS[-1]})")
    return target
