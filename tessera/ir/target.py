"""Target descriptions: what the lowering passes and backends may assume of a GPU.

Passes never ask "is this NVIDIA?": they read the warp size, shared-memory
capacity, register budget and the set of hardware features from a `Target`,
so one compiler serves every GPU. Backends add what only they need (the
LLVM triple and CPU name, PTX features) through the fields below.

| target  | vendor | warp | shared memory / block | features                                   |
| ------- | ------ | ---- | --------------------- | ------------------------------------------ |
| sm_80   | nvidia | 32   | 163 KiB (A100)        | shfl, cp.async, mma.sync, ldmatrix         |
| sm_89   | nvidia | 32   | 99 KiB (L40/4090)     | sm_80 + fp8 mma                            |
| sm_90   | nvidia | 32   | 227 KiB (H100/H200)   | sm_89 + tma, mbarrier, clusters, stmatrix  |
| sm_90a  | nvidia | 32   | 227 KiB               | sm_90 + wgmma, setmaxnreg                  |
| sm_100  | nvidia | 32   | 227 KiB (B200)        | sm_90 + tcgen05 (no wgmma)                 |
| gfx90a  | amd    | 64   | 64 KiB (MI200)        | dpp, mfma                                  |
| gfx942  | amd    | 64   | 64 KiB (MI300)        | gfx90a + lds.dma (4 B a lane)              |
| gfx950  | amd    | 64   | 160 KiB (MI350)       | gfx942 + mfma.wide (32x32x16, 16x16x32),   |
|         |        |      |                       | mfma.fp8, lds.dma.wide (16 B a lane),      |
|         |        |      |                       | lds.read.tr (ds_read_b64_tr_b16)           |

"mfma.fp8" is MFMA on OCP e4m3 / e5m2 (Tessera's f8e4m3 / f8e5m2). gfx942's
fp8 MFMA reads the fnuz formats instead (other biases, no -0 or infinities):
it would misread Tessera's fp8, so gfx942 does not have the feature and its
fp8 dots stay on FMA (`mfma_layouts`).

"lds.dma" is CDNA3's direct global -> LDS load (`global_load_lds_dword`):
each lane of a wave writes `bytes` at the wave's LDS base + lane * bytes,
tracked by vmcnt; `LDS_DMA_BYTES` lists the widths a target's lanes may
copy (gfx950 adds dwordx4; its dwordx3 is left out: chunks are powers of 2).

"lds.read.tr" is CDNA4's LDS transpose read (`ds_read_b64_tr_b16`, the thread
op `lds_read_tr`): an MFMA operand stored MN-major in LDS reaches its
K-major fragment in one read per four k instead of one read per element.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    name: str                       # what users write: --target sm_90a
    vendor: str                     # "nvidia" | "amd"
    warp_size: int
    shared_memory_bytes: int        # per block, with the opt-in above 48 KB on NVIDIA
    registers_per_thread: int       # the most a thread may use without spilling
    registers_per_block: int
    max_threads_per_block: int = 1024
    max_vector_bits: int = 128      # widest single global load/store
    shared_memory_banks: int = 32   # 4-byte banks (`smem_layouts.bank_conflicts`); 64 in gfx950's LDS
    features: frozenset[str] = field(default_factory=frozenset)
    llvm_triple: str = ""
    llvm_cpu: str = ""
    llvm_features: str = ""

    def has(self, feature: str) -> bool:
        return feature in self.features


_SM80 = frozenset({"shfl", "cp.async", "mma.sync", "ldmatrix"})
_SM89 = _SM80 | {"mma.fp8"}
_SM90 = _SM89 | {"tma", "mbarrier", "cluster", "stmatrix"}
_GFX90A = frozenset({"dpp", "mfma"})
_GFX942 = _GFX90A | {"lds.dma"}       # its fp8 MFMA reads fnuz fp8, not OCP: no "mfma.fp8" (see above)


def has_async_copies(target: "Target") -> bool:
    """Whether `target` copies global memory into shared memory asynchronously (cp.async or LDS DMA)."""
    return target.has("cp.async") or target.has("lds.dma")


def lds_dma_bytes(target: "Target") -> tuple[int, ...]:
    """The bytes a lane may copy straight into LDS on `target` (global_load_lds), widest first; () if none."""
    if not target.has("lds.dma"):
        return ()
    return (16, 4) if target.has("lds.dma.wide") else (4,)


def _nvidia(name: str, smem_kib: int, features: frozenset[str], ptx: str) -> Target:
    return Target(name, "nvidia", 32, smem_kib * 1024, 255, 65536, features=features,
                  llvm_triple="nvptx64-nvidia-cuda", llvm_cpu=name, llvm_features=f"+{ptx}")


def _amd(name: str, lds_kib: int, features: frozenset[str], lds_banks: int = 32) -> Target:
    return Target(name, "amd", 64, lds_kib * 1024, 512, 65536, shared_memory_banks=lds_banks, features=features,
                  llvm_triple="amdgcn-amd-amdhsa", llvm_cpu=name)


TARGETS: dict[str, Target] = {t.name: t for t in (
    _nvidia("sm_80", 163, _SM80, "ptx80"),
    _nvidia("sm_89", 99, _SM89, "ptx84"),      # PTX 8.4: the first with mma.sync on .e4m3/.e5m2 (LLVM needs it)
    _nvidia("sm_90", 227, _SM90, "ptx84"),
    _nvidia("sm_90a", 227, _SM90 | {"wgmma", "setmaxnreg"}, "ptx84"),
    _nvidia("sm_100", 227, _SM90 | {"tcgen05"}, "ptx86"),
    _amd("gfx90a", 64, _GFX90A),
    _amd("gfx942", 64, _GFX942),
    _amd("gfx950", 160, _GFX942 | {"mfma.wide", "mfma.fp8", "lds.dma.wide", "lds.read.tr"}, lds_banks=64),
)}

DEFAULT_TARGET = "sm_80"


def get_target(name: str) -> Target:
    """The target called `name`; a ValueError listing the known ones otherwise."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
