"""Which GPU a library op plans for: the device's target name, and the plan key its tables use.

Library plans are keyed by vendor ("nvidia") where one table serves every GPU of it, and by AMD target where
the AMD GPUs differ in what a plan may hold: gfx950 (MI350/MI355) has 160 KiB of LDS a workgroup where gfx942
(MI300) has 64 KiB, so its attention, decode, quantized GEMM and MoE plans keep deeper rings (`AMD_PLAN_TARGETS`).
A target's capacities come from one place, Tessera's target description (`tessera.get_target(name)`,
`tessera/ir/target.py`); `lds_bytes` reads it, and the compile tests check every plan against it.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

import tessera

# The AMD targets with plans of their own; any other AMD GPU (gfx90a) takes gfx942's, the smallest LDS.
AMD_PLAN_TARGETS = ("gfx942", "gfx950")
AMD_FALLBACK = "gfx942"
# =gfx942 on a gfx950 GPU launches gfx942's plans there (a GPU session times both in one run); unset: the device's own.
AMD_PLANS_ENV = "TESSERA_AMD_PLANS"


def device_arch(device: Optional[torch.device] = None) -> str:
    """The target a CUDA/ROCm device compiles for: 'sm_90a' on Hopper, 'sm_XY' on other NVIDIA GPUs, 'gfxNNN'
    (the current device unless `device` says)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return "sm_90a" if major == 9 else f"sm_{major}{minor}"


def amd_plan_target(arch: str) -> str:
    """The AMD target whose plans a GPU of target `arch` runs: its own where the library has them, else gfx942's."""
    return arch if arch in AMD_PLAN_TARGETS else AMD_FALLBACK


def plan_target(device: Optional[torch.device] = None) -> str:
    """The key of this device's plans: 'nvidia' on CUDA builds of torch, the AMD plan target on ROCm ones (or the
    one $TESSERA_AMD_PLANS names, if the device's LDS holds its plans)."""
    if not torch.version.hip:
        return "nvidia"
    own = amd_plan_target(device_arch(device))
    forced = os.environ.get(AMD_PLANS_ENV, "")
    if not forced:
        return own
    if forced not in AMD_PLAN_TARGETS or lds_bytes(forced) > lds_bytes(own):
        fits = [t for t in AMD_PLAN_TARGETS if lds_bytes(t) <= lds_bytes(own)]
        raise ValueError(f"{AMD_PLANS_ENV}={forced!r}: this {own} GPU runs the plans of {', '.join(fits)} (their "
                         f"rings fit its {lds_bytes(own)} bytes of LDS); set one of them or unset it")
    return forced


def fp8_matrix_cores(arch: str) -> bool:
    """Whether Tessera's dot multiplies OCP e4m3 / e5m2 (torch.float8_e4m3fn / e5m2) on `arch`'s matrix cores:
    sm_89 and newer (mma.sync / wgmma), gfx950 (MFMA, "mfma.fp8"). Not gfx942, whose fp8 MFMA reads fnuz fp8."""
    if arch.startswith("sm_"):
        return int(arch.removeprefix("sm_").rstrip("a")) >= 89
    try:
        return tessera.get_target(arch).has("mfma.fp8")
    except ValueError:          # a GPU Tessera has no description of (gfx1100, ...)
        return False


def lds_bytes(arch: str) -> int:
    """Shared memory (LDS on AMD) a block may use on target `arch`, from Tessera's target description."""
    return tessera.get_target(arch).shared_memory_bytes
