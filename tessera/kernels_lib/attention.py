"""Attention as PyTorch ops: `attention` (batched), `attention_varlen` (packed sequences).

    o, lse = tessera.kernels_lib.attention(q, k, v, causal=True)        # q (B, Sq, H, D), k/v (B, Sk, H_KV, D)
    o, lse = tessera.kernels_lib.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # q (total_q, H, D)

These are the custom ops `torch.ops.tessera.attention` and
`torch.ops.tessera.attention_varlen`, with fake implementations (so
`torch.compile` traces them) and autograd. The kernels are FlashAttention
written in Tessera (`attention_fwd.py`). Tensors keep their strides: any
layout whose head dim is contiguous is read in place (a slice of a packed
QKV tensor, say); O comes back contiguous, LSE in float32 as (B, H, Sq)
(varlen: (H, total_q)), natural log, +inf for rows that see no key.

Masks follow FlashAttention: `causal` aligns the diagonal with the
bottom-right corner when Sq != Sk (query i sees keys j <= i + Sk - Sq);
`window=(left, right)` keeps keys i + Sk - Sq - left <= j <= i + Sk - Sq
+ right (an int w means (w, w); with causal, right is 0); `softcap` > 0
replaces the logits by softcap * tanh(logits / softcap); `scale` defaults
to 1 / sqrt(D). GQA/MQA: H must be a multiple of H_KV.

CUDA tensors launch the kernel with the plan for their head dim
(`GPU_PLANS`; on Hopper from 1024 keys at head dim 128 its warp-specialized
form, `WS_GPU_PLANS`: see `wants_warp_specialization`; TESSERA_ATTENTION_OVERLAP=1 asks for FlashAttention-3's
overlapped loop order, `OVERLAP_ENV`, and TESSERA_ATTENTION_PINGPONG=1 with it for its warpgroup
ping-pong; on AMD TESSERA_ATTENTION_AMD_PINGPONG=1 the 8-wave ping-pong, `AMD_PINGPONG_ENV`;
TESSERA_ATTENTION_BWD_OVERLAP=1 the backward's OVERLAP order, `BWD_OVERLAP_ENV`;
TESSERA_ATTENTION_PERSISTENT=1 the persistent forward, `PERSISTENT_ENV`); CPU tensors
run on the tile interpreter with small tiles (`CPU_PLAN`), as `TESSERA_INTERPRET=1` makes CUDA tensors do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Optional, Union

import torch

import tessera
import tessera.torch

from .attention_bwd import attention_bwd_delta_kernel, attention_bwd_kv_kernel, attention_bwd_q_kernel
from .attention_fusion import NO_HOOKS, AttentionHooks, attention_hooks
from .hooks import outside_graphs
from .targets import plan_target
from .attention_fwd import LOG2E, attention_fwd_kernel
from .attention_fwd_persistent import attention_fwd_persistent_kernel

DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)    # routed to attention_fp8.py (which takes e4m3 only)
HEAD_DIMS = (64, 128, 256)          # the GPU plans' head dims (the interpreter takes any power of two >= 16)
Window = Union[None, int, tuple[int, int]]


@dataclass(frozen=True)
class Plan:
    """Tile sizes and warps of the forward kernel: BM query rows per program, BN keys per step."""

    BM: int
    BN: int
    num_warps: int
    stages: int = 2
    ws: bool = False        # the key loop warp-specialized (sm_90a): a producer warpgroup issues K and V's TMA fills
    overlap: bool = False   # FlashAttention-3's loop order: block n's softmax under P V of block n - 1 (`OVERLAP_ENV`)
    pingpong: bool = False  # with ws and overlap: the warpgroups take turns at the tensor cores (`PINGPONG_ENV`);
    # without ws (AMD): two groups of num_warps / 2 waves, one program each, one phase apart (`AMD_PINGPONG_ENV`;
    # a block runs two programs, so the launcher halves grid axis 0: `KernelBinary.programs_per_block`)


# Per vendor (AMD: per target, `targets.plan_target`) and head dim. The warps split the rows of the score and output
# tiles (`passes/mma.py`: chained dots split along M), so on NVIDIA BM = 16 rows per warp (mma.sync m16n8k16;
# wgmma: 64 per warpgroup) and on AMD 32 per wave (MFMA 32x32x8; on gfx950 32x32x16). No config spills registers
# on sm_80, sm_90a, gfx942 or gfx950 (tests/kernels_lib/test_attention_compile.py); none has been timed on a GPU yet.
# AMD's K and V rings are filled by direct-to-LDS loads, as deep as the target's LDS holds (`targets.lds_bytes`):
# on gfx942 (64 KiB) two stages at head dim 64 (50 KiB) and one at 128 and 256 (two need 82936 / 70136 bytes);
# on gfx950 (160 KiB) three at head dim 64 (67568 bytes) and two at 128 and 256 (83952 / 70640 bytes), which
# leave every variant without VGPR or SGPR spills or scratch (bench/results/amd_registers_gfx950.md). At 128,
# 288-298 VGPRs a wave already hold a CU to one 4-wave workgroup, so the deeper ring costs no occupancy there.
GPU_PLANS = {
    "nvidia": {64: Plan(128, 64, 8), 128: Plan(128, 64, 8), 256: Plan(64, 32, 4)},
    "gfx942": {64: Plan(128, 64, 4, stages=2), 128: Plan(128, 64, 4, stages=1), 256: Plan(64, 32, 4, stages=1)},
    "gfx950": {64: Plan(128, 64, 4, stages=3), 128: Plan(128, 64, 4, stages=2), 256: Plan(64, 32, 4, stages=2)},
}
CPU_PLAN = Plan(16, 16, 4, stages=1)
# Warp-specialized forward plans for Hopper: the tiles above plus a producer warpgroup (384 threads) whose one
# thread issues K's and V's TMA fills ahead, behind mbarriers, while the two consumer warpgroups (setmaxnreg
# 232) run the dots and the online softmax, Q read in their branch (`passes/schedule/consumer_prologue.py`).
# Chosen by `wants_warp_specialization`: where H100 run 9 timed them faster (bench/results/2026-11-26-h100-run9:
# head dim 128, bf16, from 1024 keys: 1.03x at 1k, 1.07x at 2k-4k, 1.24x at 8k, 1.10x at 16k; at 512 keys
# 0.68x, where 8 key blocks do not pay for the producer's start); not for varlen (the bounds come from
# cu_seqlens, which the producer would have to load), and not yet for fp8 or fused score_mod / epilogue hooks
# (they compile, but no simulator test covers them). Head dim 64's is untimed, so only asked for explicitly.
WS_GPU_PLANS = {64: Plan(128, 64, 8, ws=True), 128: Plan(128, 64, 8, ws=True)}
# Head dim -> the fewest keys from which the forward takes the warp-specialized plan unasked (run 9's crossover)
WS_AUTO_MIN_KEYS = {128: 1024}
WS_ENV = "TESSERA_ATTENTION_WS"
# FlashAttention-3's intra-warpgroup overlap (the kernel's OVERLAP: S = Q K_n^T and P V_{n-1} issued together,
# block n's softmax while P V runs, wgmma_wait {pending = 1}): =1 takes it on Hopper (both plans) and on the
# interpreter; unset or 0 keeps FlashAttention-2's order until a GPU run times it (bench/attention.py --part
# forward measures both).
OVERLAP_ENV = "TESSERA_ATTENTION_OVERLAP"
# Not head dim 256: its one warpgroup's 64 x 256 accumulator in flight beside the next scores and P leaves no
# headroom: under a `.maxnreg` cap it needs 232 registers (plain) to 248 (window, softcap, varlen), unbounded
# ptxas takes 254-255, where FlashAttention-2's order fits 200-216.
OVERLAP_HEAD_DIMS = (64, 128)
# FlashAttention-3's warpgroup ping-pong (section 3.1; the kernel's PINGPONG): =1 has the two consumer warpgroups
# of the warp-specialized overlapped plan take turns issuing their products (named barriers), so one's softmax
# runs under the other's GEMMs; taken only together with TESSERA_ATTENTION_WS=1 (or auto) and ..._OVERLAP=1.
PINGPONG_ENV = "TESSERA_ATTENTION_PINGPONG"
# HipKittens' 8-wave ping-pong on AMD (gfx942/gfx950; `passes/wave_pingpong.py`): =1 launches 8 waves a block in two
# groups of 4, each group one program (BM rows) with its own LDS, group 1 one s_barrier behind, each phase's MFMAs
# under s_setprio 1. Batched calls only (not varlen, fp8 or fused hooks). Off by default: never run on an AMD GPU
# (this project has none). Tiles: the largest whose 8 waves fit 256 VGPRs a wave without spilling (a workgroup of 8
# waves leaves 2 waves a SIMD, 256 of the 512 registers each): head dim 64, BM = 128 and BN = 16 (182-201 VGPRs);
# 128, BM = 64 (16x16 MFMA) and BN = 16 (256 VGPRs, no scratch); BN = 32 spills at 128 (25-27 VGPRs), and at 64
# on gfx950 with every option compiled in (42).
AMD_PINGPONG_ENV = "TESSERA_ATTENTION_AMD_PINGPONG"
AMD_PINGPONG_PLANS = {64: Plan(128, 16, 8, stages=1, pingpong=True), 128: Plan(64, 16, 8, stages=1, pingpong=True)}
# FlashAttention-3's persistent forward (`attention_fwd_persistent.py`): =1 launches min(tiles, SMs) programs, each
# walking (batch, head, query-block) tiles (causal: heaviest first), the producer warpgroup fetching the next
# tile's K and V while the consumers store this one's O (Q comes by TMA each tile: `schedule/tma_operand.py`).
# Taken with the warp-specialized plan (Hopper), either loop order, for batched calls (not varlen, fp8 or fused
# hooks), not with PINGPONG (the lowering refuses pingpong in a persistent loop: each consumer warpgroup would
# need its own copy of the tile loop); on the interpreter with CPU_NUM_SMS programs. Off by default until a GPU
# run times it (bench/attention.py --part forward).
PERSISTENT_ENV = "TESSERA_ATTENTION_PERSISTENT"
CPU_NUM_SMS = 4             # the "SM count" of persistent launches on the interpreter (as gemm.py's)


@dataclass(frozen=True)
class BackwardPlan:
    """The backward's kernels: dK/dV (BN keys per program, walking BM queries at a time), the dQ pass (BM
    queries, BN keys at a time), and whether the dK/dV kernel adds dQ itself by atomics when the caller does not
    ask for determinism (False: no such config fits the registers, so the dQ pass runs either way)."""

    kv: Plan
    q: Plan
    atomic_dq: bool
    transposed: bool = False    # the dK/dV kernel accumulates dK^T and dV^T (head dim 256: see the kernel)
    overlap: bool = False       # S and dP issued together, dP under P's exp2 and dV under dS (`BWD_OVERLAP_ENV`)


DELTA_PLAN = Plan(64, 0, 4)       # rows per program of delta = rowsum(dO * O)
# Per architecture and head dim; every config assembles without spills (tests/kernels_lib/
# test_attention_compile.py). Head dim 256 on sm_90a accumulates dK^T and dV^T (256 x BN: the head dim split
# across the two warpgroups; as dK and dV they take 256 registers a thread at 64 keys a program, whatever the
# warps). Missing: head dim 256 on sm_80 and AMD (no wgmma to split the head dim: 1.5-3 KB of spills) and
# head dim 128 on sm_80 and AMD (every config tried spills: 16-230 bytes on sm_80).
BWD_GPU_PLANS = {
    "sm_90a": {64: BackwardPlan(Plan(32, 128, 8), Plan(128, 64, 8), atomic_dq=True),
               128: BackwardPlan(Plan(16, 128, 8), Plan(64, 64, 4), atomic_dq=False),
               256: BackwardPlan(Plan(32, 32, 8), Plan(64, 32, 4), atomic_dq=False, transposed=True)},
    "sm_80": {64: BackwardPlan(Plan(32, 128, 8), Plan(128, 64, 8), atomic_dq=False)},
    "gfx942": {64: BackwardPlan(Plan(32, 64, 4, stages=1), Plan(64, 64, 4, stages=1), atomic_dq=True)},
    "gfx950": {64: BackwardPlan(Plan(32, 64, 4, stages=2), Plan(64, 64, 4, stages=2), atomic_dq=True)},
}   # (gfx950: two-stage K/V and Q/dO rings, 37872 / 58352 bytes of its 160 KiB of LDS, no spills of either kind)
BWD_CPU_PLAN = BackwardPlan(Plan(16, 16, 4, stages=1), Plan(16, 16, 4, stages=1), atomic_dq=True)
# The backward kernels' OVERLAP order (`attention_bwd.py`): =1 takes it on Hopper (sm_90a plans: wgmma is
# asynchronous there, mma.sync and MFMA are not) and on the interpreter; unset or 0 keeps FlashAttention-2's
# order until a GPU run times it (bench/attention.py --part backward: `tessera_overlap`; docs/perf/
# attention-backward-h100.md has the SASS before and after).
BWD_OVERLAP_ENV = "TESSERA_ATTENTION_BWD_OVERLAP"


def bwd_gpu_plan(D: int, device: torch.device, overlap: bool = False) -> BackwardPlan:
    """The backward plan for head dim D on `device` (Hopper: sm_90a's; other NVIDIA GPUs: sm_80's; AMD: its
    target's, `targets.plan_target`); with `overlap`, on Hopper, in the OVERLAP order (`BWD_OVERLAP_ENV`)."""
    if torch.version.hip:
        arch = plan_target(device)
    else:
        arch = "sm_90a" if torch.cuda.get_device_capability(device)[0] == 9 else "sm_80"
    plans = BWD_GPU_PLANS[arch]
    if D not in plans:
        raise ValueError(f"tessera::attention: the backward pass has no GPU plan for head dim {D} on {arch} yet "
                         f"(planned: {sorted(plans)}); run it on the CPU interpreter or use another head dim")
    return dataclasses.replace(plans[D], overlap=True) if overlap and arch == "sm_90a" else plans[D]


def wants_bwd_overlap() -> bool:
    """Whether the backward takes the OVERLAP order where it can (`bwd_gpu_plan`; the interpreter too):
    TESSERA_ATTENTION_BWD_OVERLAP=1; unset or 0 not."""
    return _env_flag(BWD_OVERLAP_ENV, "S and dP issued together on Hopper", "FlashAttention-2's order")


# ---------------------------------------------------------------------------
# Arguments

def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, op: str,
           dtypes: tuple = DTYPES) -> None:
    """Shapes, dtypes and devices of q, k, v: (..., S, H, D) of `rank` dims, H a multiple of H_KV."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != rank:
            layout = "(B, S, H, D)" if rank == 4 else "(total, H, D)"
            raise ValueError(f"tessera::{op}: {name} must be {layout}, got shape {tuple(x.shape)}")
        if x.dtype not in dtypes:
            names = " and ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"tessera::{op}: {name} has dtype {x.dtype}; supported are {names}")
        if x.dtype != q.dtype or x.device != q.device:
            raise ValueError(f"tessera::{op}: q, k and v must share dtype and device, got {name} {x.dtype} on "
                             f"{x.device} and q {q.dtype} on {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"tessera::{op}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    D, H, H_kv = q.shape[-1], q.shape[-2], k.shape[-2]
    if k.shape[-1] != D:
        raise ValueError(f"tessera::{op}: q has head dim {D} but k has {k.shape[-1]}")
    if D < 16 or D & (D - 1):
        raise ValueError(f"tessera::{op}: head dim {D} is not supported; use a power of two >= 16 (64, 128, 256)")
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"tessera::{op}: q's {H} heads are not a multiple of k/v's {H_kv} (GQA needs H % H_KV == 0)")
    if rank == 4 and (k.shape[0] != q.shape[0]):
        raise ValueError(f"tessera::{op}: q has batch {q.shape[0]} but k has {k.shape[0]}")


def window_bounds(causal: bool, window: Window) -> tuple[int, int]:
    """(left, right) keys around each query's diagonal, -1 for unbounded (FlashAttention's window_size)."""
    if window is None:
        left = right = -1
    elif isinstance(window, int):
        left = right = window
    else:
        left, right = window
    if min(left, right) < -1:
        raise ValueError(f"tessera::attention: window bounds must be >= 0 (or -1 for none), got {window}")
    return left, 0 if causal else right


def gpu_plan(D: int, warp_specialized: bool = False, overlap: bool = False, pingpong: bool = False,
             amd_pingpong: bool = False, target: Optional[str] = None) -> Plan:
    """The plan for head dim D on this machine's GPU (`target`: the `GPU_PLANS` key, by default the current
    device's, `targets.plan_target`: on ROCm builds of torch the AMD target's plans); with `warp_specialized`,
    Hopper's warp-specialized one where head dim D has one (`WS_GPU_PLANS`); with `overlap`, on Hopper, in
    FlashAttention-3's loop order (`OVERLAP_ENV`: wgmma is asynchronous there, mma.sync and MFMA are not); with
    `pingpong` too, a warp-specialized overlapped plan's warpgroups take turns (`PINGPONG_ENV`); with
    `amd_pingpong`, on AMD, the 8-wave ping-pong where head dim D has one (`AMD_PINGPONG_PLANS`)."""
    target = target or plan_target()
    plans = GPU_PLANS[target]
    if D not in plans:
        raise ValueError(f"tessera::attention: head dim {D} has no GPU plan; use one of {HEAD_DIMS}")
    if target != "nvidia":
        return AMD_PINGPONG_PLANS[D] if amd_pingpong and D in AMD_PINGPONG_PLANS else plans[D]
    hopper = torch.cuda.get_device_capability()[0] == 9
    plan = WS_GPU_PLANS[D] if warp_specialized and hopper and D in WS_GPU_PLANS else plans[D]
    if not (overlap and hopper and D in OVERLAP_HEAD_DIMS):
        return plan
    return dataclasses.replace(plan, overlap=True, pingpong=pingpong and plan.ws)


def wants_overlap() -> bool:
    """Whether the forward takes FlashAttention-3's loop order where it can (`gpu_plan`; the interpreter too):
    TESSERA_ATTENTION_OVERLAP=1; unset or 0 not."""
    return _env_flag(OVERLAP_ENV, "FlashAttention-3's overlapped loop on Hopper", "FlashAttention-2's order")


def wants_pingpong() -> bool:
    """Whether a warp-specialized overlapped forward has its warpgroups take turns: TESSERA_ATTENTION_PINGPONG=1."""
    return _env_flag(PINGPONG_ENV, "the consumer warpgroups take turns at the tensor cores", "they do not")


def wants_persistent() -> bool:
    """Whether the forward takes the persistent kernel where it can (`persistent_allowed`; the interpreter too):
    TESSERA_ATTENTION_PERSISTENT=1; unset or 0 not."""
    return _env_flag(PERSISTENT_ENV, "one program per SM looping over tiles", "one program per tile")


def persistent_allowed(plan: Plan, on_interpreter: bool) -> bool:
    """Whether `plan` has a persistent form (`PERSISTENT_ENV`): on the interpreter any plan; on a GPU the
    warp-specialized one without ping-pong."""
    return on_interpreter or (plan.ws and not plan.pingpong)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def wants_amd_pingpong() -> bool:
    """Whether the forward on AMD takes the 8-wave ping-pong (`gpu_plan`): TESSERA_ATTENTION_AMD_PINGPONG=1."""
    return _env_flag(AMD_PINGPONG_ENV, "8 waves in two staggered groups on AMD", "4 waves, one program a block")


def _env_flag(name: str, on: str, off: str) -> bool:
    setting = os.environ.get(name, "0").strip() or "0"
    if setting not in ("0", "1"):
        raise ValueError(f"tessera::attention: {name}={os.environ[name]!r} is not understood; set it to 1 ({on}) "
                         f"or 0 ({off})")
    return setting == "1"


def wants_warp_specialization(D: int, Sk: int) -> bool:
    """Whether the forward of head dim D over Sk keys should take the warp-specialized plan (where Hopper and
    the call allow it: `gpu_plan`). TESSERA_ATTENTION_WS=1 always, =0 never; unset (or `auto`) where a GPU run
    timed it faster: Sk >= WS_AUTO_MIN_KEYS[D]."""
    setting = os.environ.get(WS_ENV, "auto").strip().lower() or "auto"
    if setting not in ("0", "1", "auto"):
        raise ValueError(f"tessera::attention: {WS_ENV}={os.environ[WS_ENV]!r} is not understood; set it to 1 "
                         f"(always the warp-specialized forward on Hopper), 0 (never) or auto (by sequence length)")
    if setting != "auto":
        return setting == "1"
    return D in WS_AUTO_MIN_KEYS and Sk >= WS_AUTO_MIN_KEYS[D]


def _on_interpreter(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Problem:
    """What every attention kernel of one call takes besides its tensors: sizes, the scale, the masks."""

    batch: int
    Sq: int                     # varlen: the longest sequences
    Sk: int
    H: int
    H_kv: int
    D: int
    scale: float
    softcap: float
    left: int                   # -1: unbounded
    right: int
    cu_q: Optional[torch.Tensor] = None     # varlen: int32 starts of the sequences, then the total
    cu_k: Optional[torch.Tensor] = None

    @staticmethod
    def of(q, k, cu_q, cu_k, Sq, Sk, causal, window_left, window_right, softcap, scale) -> "Problem":
        D = q.shape[-1]
        batch = q.shape[0] if cu_q is None else cu_q.shape[0] - 1
        scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        return Problem(batch, Sq, Sk, q.shape[-2], k.shape[-2], D, scale, float(softcap), window_left,
                       0 if causal else window_right, cu_q, cu_k)

    @property
    def varlen(self) -> bool:
        return self.cu_q is not None

    def scalars(self, q: torch.Tensor) -> tuple:
        """cu_q, cu_k, Sq, Sk, H, H_KV, qk_scale (base 2, or over the cap), softcap: the kernels' common head."""
        unused = torch.zeros(1, dtype=torch.int32, device=q.device)
        qk_scale = self.scale / self.softcap if self.softcap > 0 else self.scale * LOG2E
        return (self.cu_q if self.varlen else unused, self.cu_k if self.varlen else unused, self.Sq, self.Sk,
                self.H, self.H_kv, qk_scale, self.softcap)

    def masks(self) -> dict:
        return dict(HAS_LEFT=self.left >= 0, HAS_RIGHT=self.right >= 0, SOFTCAP=self.softcap > 0, VARLEN=self.varlen)

    def strides(self, x: torch.Tensor) -> tuple[int, ...]:
        """(batch, seq, head, dim) element strides; varlen tensors have no batch dim (stride 0). A dim of size 1
        says it moves by 16 elements rather than 0 (torch lets its stride be anything; it is never stepped): on
        sm_90a the K and V blocks come by TMA over the whole tensor, whose map needs nonzero strides."""
        strides = tuple(s if s or n != 1 else 16 for n, s in zip(x.shape, x.stride()))
        return strides if not self.varlen else (0, *strides)

    def lse_strides(self, lse: torch.Tensor) -> tuple[int, int]:
        """(batch, head) strides of an LSE-shaped tensor: (B, H, Sq), or (H, total_q) for varlen."""
        return (0, lse.stride(0)) if self.varlen else (lse.stride(0), lse.stride(1))

    def new_lse(self, q: torch.Tensor) -> torch.Tensor:
        shape = (self.H, q.shape[0]) if self.varlen else (self.batch, self.H, self.Sq)
        return torch.empty(shape, dtype=torch.float32, device=q.device)


def _unbroadcast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors, each copied to a dense one if it is a broadcast (a dim of size > 1 with stride 0, as
    `expand` makes): the blocks the kernels pipeline come by TMA on sm_90a, whose maps cannot step by 0."""
    return tuple(x.contiguous() if any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())) else x
                 for x in tensors)


def _forward(q, k, v, problem: Problem, hooks: AttentionHooks = NO_HOOKS,
             descales: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
             plan: Optional[Plan] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel, with the user's fused functions if any (`attention_fusion.py`): (O, LSE).
    `descales` (float32 q, k, v descales) makes it the fp8 kernel, whose O is `out_dtype`; `plan` replaces
    the GPU plan for the head dim."""
    k, v = _unbroadcast(k, v)
    o = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse = problem.new_lse(q)
    if o.numel() == 0:
        return o, lse.fill_(float("inf"))
    plain_call = not problem.varlen and descales is None and hooks is NO_HOOKS
    ws = plain_call and wants_warp_specialization(problem.D, problem.Sk)
    overlap = descales is None and wants_overlap()
    if _on_interpreter(q):
        plan = dataclasses.replace(CPU_PLAN, overlap=overlap)
    else:
        plan = plan or gpu_plan(problem.D, ws, overlap, wants_pingpong(), plain_call and wants_amd_pingpong(),
                                plan_target(q.device))
    p = problem
    args = (q, k, v, o, lse, *p.scalars(q), max(p.left, 0), max(p.right, 0),
            *p.strides(q), *p.strides(k), *p.strides(v), *p.strides(o), *p.lse_strides(lse),
            *hooks.args(o, p.strides), lse if descales is None else descales,     # (lse: an unused pointer)
            v.shape[-3])                        # V's rows (FP8 reads them up to there: `attention_fp8.py`)
    on_interpreter = _on_interpreter(q)
    if plain_call and wants_persistent() and persistent_allowed(plan, on_interpreter):
        tiles = tessera.cdiv(p.Sq, plan.BM) * p.batch * p.H
        sms = CPU_NUM_SMS if on_interpreter else _num_sms(q.get_device())
        attention_fwd_persistent_kernel[(min(tiles, sms),)](
            q, k, v, o, lse, p.batch, *p.scalars(q)[2:], max(p.left, 0), max(p.right, 0),
            *p.strides(q), *p.strides(k), *p.strides(v), *p.strides(o), *p.lse_strides(lse),
            D=p.D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=plan.ws, OVERLAP=plan.overlap,
            num_warps=plan.num_warps, POSITIVE_SCALE=p.scale > 0, HAS_LEFT=p.left >= 0, HAS_RIGHT=p.right >= 0,
            SOFTCAP=p.softcap > 0)
        return o, lse
    grid = (tessera.cdiv(p.Sq, plan.BM), p.batch * p.H)
    with hooks.blame():
        attention_fwd_kernel[grid](*args, D=p.D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages, WS=plan.ws,
                                   OVERLAP=plan.overlap, PINGPONG=plan.pingpong,
                                   num_warps=plan.num_warps, FP8=descales is not None,
                                   POSITIVE_SCALE=p.scale > 0, **p.masks(),
                                   **hooks.constexprs())
    return o, lse


def _backward(grad_out, grad_lse, q, k, v, o, lse, problem: Problem,
              deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels: (dQ, dK, dV). delta = rowsum(dO * O) - dLSE first; then dK and dV per key
    block, with dQ added by atomics into a float32 buffer, or (deterministic) by a pass of its own."""
    p = problem
    grad_out, q, k, v = _unbroadcast(grad_out, q, k, v)
    dk, dv = torch.empty(k.shape, dtype=k.dtype, device=k.device), torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    overlap = wants_bwd_overlap()
    if _on_interpreter(q):
        plan = dataclasses.replace(BWD_CPU_PLAN, overlap=overlap)
    else:
        plan = bwd_gpu_plan(p.D, q.device, overlap)
    kv_plan, q_plan, delta_plan = plan.kv, plan.q, DELTA_PLAN
    deterministic = deterministic or not plan.atomic_dq
    delta = torch.empty_like(lse)
    dlse = grad_lse.contiguous() if grad_lse is not None else lse
    attention_bwd_delta_kernel[(tessera.cdiv(p.Sq, delta_plan.BM), p.batch * p.H)](
        o, grad_out, dlse, delta, p.scalars(q)[0], p.Sq, p.H, *p.strides(o), *p.strides(grad_out),
        *p.lse_strides(lse), D=p.D, BM=delta_plan.BM, HAS_DLSE=grad_lse is not None, VARLEN=p.varlen,
        num_warps=delta_plan.num_warps)
    dq = torch.empty(q.shape, dtype=q.dtype if deterministic else torch.float32, device=q.device)
    if not deterministic:
        dq.zero_()
    head = (q, k, v, grad_out, lse, delta)
    scalars = (*p.scalars(q), p.scale, max(p.left, 0), max(p.right, 0))
    strides = (*p.strides(q), *p.strides(k), *p.strides(v), *p.strides(grad_out))
    attention_bwd_kv_kernel[(tessera.cdiv(p.Sk, kv_plan.BN), p.batch * p.H_kv)](
        *head, dq, dk, dv, *scalars, *strides, *p.strides(dq)[:3], *p.strides(dk)[:3], *p.lse_strides(lse),
        D=p.D, BM=kv_plan.BM, BN=kv_plan.BN, ATOMIC_DQ=not deterministic, STAGES=kv_plan.stages,
        num_warps=kv_plan.num_warps, TRANSPOSED=plan.transposed, OVERLAP=plan.overlap, **p.masks())
    if not deterministic:
        return (dq * p.scale).to(q.dtype), dk, dv
    attention_bwd_q_kernel[(tessera.cdiv(p.Sq, q_plan.BM), p.batch * p.H)](
        *head, dq, *scalars, *strides, *p.strides(dq)[:3], *p.lse_strides(lse), D=p.D, BM=q_plan.BM,
        BN=q_plan.BN, STAGES=q_plan.stages, num_warps=q_plan.num_warps, OVERLAP=plan.overlap, **p.masks())
    return dq, dk, dv


# ---------------------------------------------------------------------------
# The ops

def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, window_left: int = -1,
               window_right: int = -1, softcap: float = 0.0, scale: Optional[float] = None,
               deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.attention`: see `attention`."""
    _check(q, k, v, 4, "attention")
    problem = Problem.of(q, k, None, None, q.shape[1], k.shape[1], causal, window_left, window_right, softcap, scale)
    return _forward(q, k, v, problem)


attention_op = torch.library.custom_op("tessera::attention", _attention, mutates_args=())


@attention_op.register_fake
def _attention_fake(q, k, v, causal=False, window_left=-1, window_right=-1, softcap=0.0, scale=None,
                    deterministic=False):
    _check(q, k, v, 4, "attention")
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32)


def _attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                      window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                      scale: Optional[float] = None, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.attention_varlen`: see `attention_varlen`."""
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    problem = Problem.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_left,
                         window_right, softcap, scale)
    return _forward(q, k, v, problem)


attention_varlen_op = torch.library.custom_op("tessera::attention_varlen", _attention_varlen, mutates_args=())


@attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           window_left=-1, window_right=-1, softcap=0.0, scale=None, deterministic=False):
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _check_varlen(q, k, v, cu_q, cu_k) -> None:
    _check(q, k, v, 3, "attention_varlen")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if cu.dim() != 1 or cu.dtype != torch.int32 or cu.device != q.device:
            raise ValueError(f"tessera::attention_varlen: {name} must be a 1-D int32 tensor on {q.device} "
                             f"(sequence starts, then the total), got {cu.dtype} {tuple(cu.shape)} on {cu.device}")
    if cu_q.shape != cu_k.shape or cu_q.shape[0] < 1:
        raise ValueError(f"tessera::attention_varlen: cu_seqlens_q and cu_seqlens_k must both have batch + 1 "
                         f"entries, got {tuple(cu_q.shape)} and {tuple(cu_k.shape)}")


@torch.library.custom_op("tessera::attention_backward", mutates_args=())
def attention_backward_op(grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor], q: torch.Tensor,
                          k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                          cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
                          max_seqlen_q: int, max_seqlen_k: int, causal: bool, window_left: int, window_right: int,
                          softcap: float, scale: Optional[float],
                          deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch.ops.tessera.attention_backward`: (dQ, dK, dV) of `attention` / `attention_varlen` (cu_seqlens
    None: batched) from the gradients of O and LSE (None: LSE unused), given the forward's O and LSE."""
    problem = Problem.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_left,
                         window_right, softcap, scale)
    return _backward(grad_out, grad_lse, q, k, v, o, lse, problem, deterministic)


@attention_backward_op.register_fake
def _attention_backward_fake(grad_out, grad_lse, q, k, v, o, lse, *args):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    if len(options) == 10:                  # varlen: cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...
        cu_q, cu_k, max_q, max_k, *options = options
    else:
        cu_q, cu_k, max_q, max_k = None, None, q.shape[1], k.shape[1]
    ctx.options = (max_q, max_k, *options)  # causal, window_left, window_right, softcap, scale, deterministic
    ctx.varlen = cu_q is not None
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k)


def _attention_grad(ctx, grad_out, grad_lse):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(grad_out, grad_lse, q, k, v, o, lse, cu_q, cu_k, *ctx.options)
    return (dq, dk, dv) + (None,) * (10 if ctx.varlen else 6)


attention_op.register_autograd(_attention_grad, setup_context=_setup_context)
attention_varlen_op.register_autograd(_attention_grad, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, window: Window = None,
              softcap: float = 0.0, scale: Optional[float] = None, deterministic: bool = False,
              score_mod=None, score_mod_args=(), epilogue=None, epilogue_args=(), q_descale=None, k_descale=None,
              v_descale=None, out_dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v per (batch, head): (O, LSE); see the module docstring.

    q is (B, Sq, H, D), k and v (B, Sk, H_KV, D), float16 or bfloat16, with
    H % H_KV == 0 and D a power of two (64, 128 or 256 on the GPU). O is
    (B, Sq, H, D) in q's dtype, LSE (B, H, Sq) float32. Both are
    differentiable; `deterministic` makes the backward pass sum dQ in a
    fixed order (a pass of its own instead of atomics). `score_mod=fn` and
    `epilogue=fn` (with their `_args`) fuse @tessera.func functions into the
    forward kernel (`attention_fusion.py`; forward only, outside the op:
    torch.compile breaks the graph at such a call). Without them this is the
    op `torch.ops.tessera.attention`, called directly where nothing observes
    the dispatch (`tessera.torch.unobserved`).

    float8_e4m3fn q, k, v run the fp8 kernel (`attention_fp8.py`, forward
    only): `q_descale`, `k_descale`, `v_descale` (floats or 1-element
    tensors, default 1) say what each tensor's codes are multiplied by, and
    O comes back in `out_dtype` (default bfloat16).
    """
    left, right = window_bounds(causal, window)
    fp8 = q.dtype in FP8_DTYPES or k.dtype in FP8_DTYPES or v.dtype in FP8_DTYPES
    if fp8 or any(x is not None for x in (q_descale, k_descale, v_descale, out_dtype)):
        if not fp8:
            raise ValueError(f"tessera::attention: q_descale, k_descale, v_descale and out_dtype are for float8 "
                             f"q, k, v; got {q.dtype}: leave them out (O comes back in q's dtype)")
        if score_mod is not None or epilogue is not None or score_mod_args or epilogue_args:
            raise ValueError("tessera::attention: score_mod and epilogue are not fused into the fp8 kernel yet; "
                             "apply them outside, or dequantize q, k, v to bfloat16")
        from .attention_fp8 import attention_fp8     # (that module builds on this one)
        return attention_fp8(q, k, v, left, right, softcap, scale, q_descale, k_descale, v_descale, out_dtype)
    if score_mod is not None or epilogue is not None or score_mod_args or epilogue_args:
        _check(q, k, v, 4, "attention")
        problem = Problem.of(q, k, None, None, q.shape[1], k.shape[1], causal, left, right, softcap, scale)
        return _hooked_forward(q, k, v, problem, score_mod, score_mod_args, epilogue, epilogue_args)
    op = _attention if tessera.torch.unobserved(q, k, v) else attention_op
    return op(q, k, v, causal, left, right, float(softcap), scale, deterministic)


@outside_graphs("tessera::attention", "score_mod=, epilogue=")
def _hooked_forward(q, k, v, problem, score_mod, score_mod_args, epilogue, epilogue_args):
    """The forward kernel with the user's functions fused in; torch.compile breaks the graph here
    (`hooks.outside_graphs`)."""
    return _forward(q, k, v, problem, attention_hooks(q, score_mod, score_mod_args, epilogue, epilogue_args))


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     window: Window = None, softcap: float = 0.0, scale: Optional[float] = None,
                     deterministic: bool = False, score_mod=None, score_mod_args=(), epilogue=None,
                     epilogue_args=()) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention` over a batch of sequences packed along the first dim: (O, LSE).

    q is (total_q, H, D), k and v (total_k, H_KV, D); sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (cu_seqlens_k for k, v),
    both int32 of batch + 1 entries; max_seqlen_q / max_seqlen_k bound the
    lengths. O is (total_q, H, D), LSE (H, total_q) float32. score_mod and
    epilogue as for `attention` (`b` is the sequence's index).
    """
    left, right = window_bounds(causal, window)
    if q.dtype in FP8_DTYPES:
        raise ValueError("tessera::attention_varlen: float8 q, k, v run on the batched op only (attention(..., "
                         "q_descale=, k_descale=, v_descale=)); pad the sequences to (B, S, H, D) or dequantize")
    if score_mod is not None or epilogue is not None or score_mod_args or epilogue_args:
        _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
        problem = Problem.of(q, k, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal, left,
                             right, softcap, scale)
        return _hooked_forward(q, k, v, problem, score_mod, score_mod_args, epilogue, epilogue_args)
    op = _attention_varlen if tessera.torch.unobserved(q, k, v, cu_seqlens_q, cu_seqlens_k) else attention_varlen_op
    return op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal, left, right,
              float(softcap), scale, deterministic)
