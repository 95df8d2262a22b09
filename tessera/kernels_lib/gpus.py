"""Per-GPU constants the library's cost models read (split K, stream K, decode attention): one row per GPU.

The models (`gemm_split_k.modelled`, `gemm_stream_k.modelled`, `attention_decode_model.modelled`) price plans in
microseconds from a GPU's memory bandwidth, its SM (CU) count and rates, and what one SM's shared memory (LDS)
holds. Each takes a `Gpu`; the ops look theirs up once per device (`of_device`, cached) and pass it on, so a warm
call costs nothing more. Rows are keyed as `targets.py` keys plans: by the target a device compiles for
(`targets.device_arch`: sm_90a, gfx942, ...), refined by the product name where one target spans GPUs of
different memory (an H200 is an sm_90a with 4.8 TB/s where an H100 has 3.35). Shared memory per SM is not kept
here: it is the target description's (`tessera.get_target(arch).shared_memory_bytes`, `Gpu.shared_per_sm`).

Vendor numbers (peak HBM bandwidth, SM/CU count, dense 16-bit matrix TFLOP/s, boost clock) are the datasheets':
* H100 SXM5 80GB: 132 SMs, 3.35 TB/s HBM3, 989 TFLOP/s dense BF16, 1.98 GHz (NVIDIA H100 datasheet, 2023);
* H200 SXM 141GB: 132 SMs, 4.8 TB/s HBM3e, 989 TFLOP/s dense BF16, 1.98 GHz (NVIDIA H200 datasheet, 2024);
* A100 SXM4 80GB: 108 SMs, 2.039 TB/s HBM2e, 312 TFLOP/s dense BF16, 1.41 GHz (NVIDIA A100 datasheet, 2021);
* L40S: 142 SMs, 864 GB/s GDDR6, 362 TFLOP/s dense BF16, 2.52 GHz (NVIDIA L40S datasheet, 2023);
* MI300X (gfx942): 304 CUs, 5.3 TB/s HBM3, 1307 TFLOP/s dense BF16, 2.1 GHz (AMD Instinct MI300X data sheet,
  and the CDNA 3 white paper, 2023);
* MI355X (gfx950): 256 CUs, 8 TB/s HBM3E, 2.5 PFLOP/s dense BF16, 2.4 GHz (AMD Instinct MI355X data sheet, 2025).

The rest were fitted on one GPU only, an H100 SXM (bench/results/2026-11-26-h100-run7: `gemm_split_k`'s decode
rows), and carry to the others by a stated rule, not a measurement (each rule is next to its constant below),
except the H200's streaming rate, which its runs measured: the next GPU session on another card refits them from
the same benchmark rows (bench/gemm.py's decode rows time the plan the H100's row would pick beside its own).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from . import targets

# What the H100 fit gave, and how each carries to another GPU:
STREAM_SHARE = 3000 / 3350       # a streaming kernel reaches ~90% of the HBM peak (H100: 3000 of 3350 GB/s)
L2_PER_HBM = 5500 / 3350         # L2 -> SMs over all SMs, as a multiple of the HBM peak (H100: 5500 GB/s)
SM_BYTES_PER_CLOCK = 64 / 1.98   # one SM's fills at most (H100: 64 GB/s at 1.98 GHz), scaled by the clock
LOADED_SHARE = 0.7               # the dense matrix rate a GEMM's SMs keep under load (H100: 5.2 of 7.5 TF/SM)
LATENCY_US = 0.8                 # DRAM latency under load (H100, run 7); no other GPU's is measured yet


@dataclass(frozen=True, eq=False)      # (identity: the rows are singletons, and a cheap key for the plan caches)
class Gpu:
    """One GPU's constants, as the cost models read them."""

    name: str                # "H100 SXM"
    arch: str                # the target it compiles for (`targets.device_arch`): where its shared memory comes from
    sms: int                 # SMs (CUs on AMD): what a model assumes where no device reports its own count
    hbm_peak_gbps: float     # the datasheet's memory bandwidth, what "% of HBM" divides by
    hbm_gbps: float          # what a streaming kernel reaches of it
    l2_gbps: float           # L2 -> SMs over all SMs
    sm_gbps: float           # one SM's fills (TMA / cp.async / direct-to-LDS loads) at most
    sm_tflops: float         # one SM's dense 16-bit matrix rate under load
    latency_us: float = LATENCY_US

    @property
    def shared_per_sm(self) -> int:
        """Shared memory (LDS) one SM holds rings in: the target description's per-block capacity (`lds_bytes`)."""
        return targets.lds_bytes(self.arch)

    @property
    def plan_key(self) -> str:
        """The key of the plans this GPU runs by default (`targets.plan_target`): 'nvidia' or its AMD target."""
        return targets.amd_plan_target(self.arch) if self.arch.startswith("gfx") else "nvidia"

    def __repr__(self) -> str:
        return f"Gpu({self.name!r})"


def _row(name: str, arch: str, sms: int, hbm_peak_gbps: float, dense_tflops: float, clock_ghz: float,
         l2_gbps: Optional[float] = None, hbm_gbps: Optional[float] = None) -> Gpu:
    """A row from the datasheet's numbers, the fitted ones carried over by the rules above (or measured:
    `hbm_gbps`, `l2_gbps`)."""
    return Gpu(name, arch, sms, hbm_peak_gbps, hbm_gbps=hbm_gbps or round(STREAM_SHARE * hbm_peak_gbps),
               l2_gbps=l2_gbps or round(L2_PER_HBM * hbm_peak_gbps), sm_gbps=round(SM_BYTES_PER_CLOCK * clock_ghz),
               sm_tflops=round(LOADED_SHARE * dense_tflops / sms, 2))


H100_SXM = Gpu("H100 SXM", "sm_90a", 132, 3350, hbm_gbps=3000, l2_gbps=5500, sm_gbps=64, sm_tflops=5.2)
# The H200: the H100's die and L2; its streaming rate measured, Tessera's vector add at 4160-4274 GB/s (torch's
# copy 4207-4238) in six runs (bench/results/2026-11-26-h200-tier1-run1 .. -tier2-run5, "bandwidth").
H200 = _row("H200", "sm_90a", 132, 4800, 989, 1.98, l2_gbps=H100_SXM.l2_gbps, hbm_gbps=4200)
A100_SXM = _row("A100 SXM", "sm_80", 108, 2039, 312, 1.41)
L40S = _row("L40S", "sm_89", 142, 864, 362, 2.52)
MI300X = _row("MI300X", "gfx942", 304, 5300, 1307, 2.1)
MI355X = _row("MI355X", "gfx950", 256, 8000, 2500, 2.4)
GPUS = (H100_SXM, H200, A100_SXM, L40S, MI300X, MI355X)

# A device's row: by its product name where one target spans several of the GPUs above, else by its target
# (an AMD target without a row, gfx90a, takes its plan target's: `targets.amd_plan_target`), else its vendor's
# reference GPU.
BY_NAME = {"H200": H200}
BY_ARCH = {"sm_90a": H100_SXM, "sm_80": A100_SXM, "sm_89": L40S, "gfx942": MI300X, "gfx950": MI355X}
DEFAULT = {"nvidia": H100_SXM, "amd": MI300X}


def lookup(arch: str, name: str = "") -> Gpu:
    """The row of a GPU that compiles for `arch` and calls itself `name` (torch's device name, "NVIDIA H200")."""
    for marker, gpu in BY_NAME.items():
        if marker in name and gpu.arch == arch:
            return gpu
    if arch.startswith("gfx"):
        return BY_ARCH.get(arch) or BY_ARCH.get(targets.amd_plan_target(arch)) or DEFAULT["amd"]
    return BY_ARCH.get(arch, DEFAULT["nvidia"])


@functools.lru_cache(maxsize=None)
def of_device(index: int) -> Gpu:
    """The row of CUDA/ROCm device `index` (`lookup` of its target and name), looked up once per device."""
    device = torch.device("cuda", index)
    return lookup(targets.device_arch(device), torch.cuda.get_device_properties(device).name)


_ROWS: dict[torch.device, Gpu] = {}     # `of`'s answers per device that names its index


def of(device: Optional[torch.device]) -> Gpu:
    """The row of the GPU torch `device` is on (`of_device`), kept per device: a warm call costs one dict lookup
    (reading `device.type` alone costs ~0.5 us); the reference GPU's (H100_SXM) for no device or one that is not
    a CUDA/ROCm one (the interpreter's CPU tensors, the stub driver's)."""
    gpu = _ROWS.get(device)
    if gpu is not None:
        return gpu
    if device is None or device.type != "cuda":
        return H100_SXM
    if device.index is None:            # ("cuda": whichever device is current, so not kept)
        return of_device(torch.cuda.current_device())
    gpu = _ROWS[device] = of_device(device.index)
    return gpu


def forget_devices() -> None:
    """Forget every device's row (`of`, `of_device`): for tests that fake a device."""
    _ROWS.clear()
    of_device.cache_clear()
