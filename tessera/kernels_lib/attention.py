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
(`GPU_PLANS`); CPU tensors run on the tile interpreter with small tiles
(`CPU_PLAN`), as `TESSERA_INTERPRET=1` makes CUDA tensors do.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Union

import torch

import tessera

from .attention_fwd import LOG2E, attention_fwd_kernel

DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)          # the GPU plans' head dims (the interpreter takes any power of two >= 16)
Window = Union[None, int, tuple[int, int]]


@dataclass(frozen=True)
class Plan:
    """Tile sizes and warps of the forward kernel: BM query rows per program, BN keys per step."""

    BM: int
    BN: int
    num_warps: int
    stages: int = 2


# Per vendor and head dim. The warps split the rows of the score and output tiles (`passes/mma.py`: chained dots
# split along M), so on NVIDIA BM = 16 rows per warp (mma.sync m16n8k16; wgmma: 64 per warpgroup) and on AMD 32
# per wave (MFMA 32x32x8). No config spills registers on sm_80, sm_90a or gfx942
# (tests/kernels_lib/test_attention_compile.py); none has been timed on a GPU yet.
GPU_PLANS = {
    "nvidia": {64: Plan(128, 64, 8), 128: Plan(128, 64, 8), 256: Plan(64, 32, 4)},
    "amd": {64: Plan(128, 64, 4), 128: Plan(128, 64, 4), 256: Plan(64, 32, 4)},
}
CPU_PLAN = Plan(16, 16, 4, stages=1)


# ---------------------------------------------------------------------------
# Arguments

def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, op: str) -> None:
    """Shapes, dtypes and devices of q, k, v: (..., S, H, D) of `rank` dims, H a multiple of H_KV."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != rank:
            layout = "(B, S, H, D)" if rank == 4 else "(total, H, D)"
            raise ValueError(f"tessera::{op}: {name} must be {layout}, got shape {tuple(x.shape)}")
        if x.dtype not in DTYPES:
            raise ValueError(f"tessera::{op}: {name} has dtype {x.dtype}; supported are float16 and bfloat16")
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


def _strides(x: torch.Tensor, batched: bool) -> tuple[int, ...]:
    """(batch, seq, head, dim) element strides; varlen tensors have no batch dim (stride 0)."""
    return tuple(x.stride()) if batched else (0, *x.stride())


def gpu_plan(D: int) -> Plan:
    """The plan for head dim D on this machine's GPUs (ROCm builds of torch: AMD's)."""
    plans = GPU_PLANS["amd" if torch.version.hip else "nvidia"]
    if D not in plans:
        raise ValueError(f"tessera::attention: head dim {D} has no GPU plan; use one of {HEAD_DIMS}")
    return plans[D]


def _on_interpreter(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"


def _forward(q, k, v, cu_q, cu_k, Sq: int, Sk: int, batch: int, causal: bool, window_left: int,
             window_right: int, softcap: float, scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel; (O, LSE). cu_q/cu_k are None for batched tensors (then Sq, Sk are theirs)."""
    varlen = cu_q is not None
    H, D, H_kv = q.shape[-2], q.shape[-1], k.shape[-2]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((H, q.shape[0]) if varlen else (batch, H, Sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("inf"))
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    left, right = window_left, 0 if causal else window_right
    qk_scale = scale / softcap if softcap > 0 else scale * LOG2E
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    cpu = _on_interpreter(q)
    plan = CPU_PLAN if cpu else gpu_plan(D)
    unused = torch.zeros(1, dtype=torch.int32, device=q.device)
    args = (q, k, v, o, lse, cu_q if varlen else unused, cu_k if varlen else unused, Sq, Sk, H, H_kv,
            qk_scale, float(softcap), max(left, 0), max(right, 0),
            *_strides(q, not varlen), *_strides(k, not varlen), *_strides(v, not varlen), *_strides(o, not varlen),
            *lse_strides)
    grid = (tessera.cdiv(Sq, plan.BM), batch * H)
    attention_fwd_kernel[grid](*args, D=D, BM=plan.BM, BN=plan.BN, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
                               SOFTCAP=softcap > 0, VARLEN=varlen, STAGES=plan.stages, num_warps=plan.num_warps)
    return o, lse


# ---------------------------------------------------------------------------
# The ops

@torch.library.custom_op("tessera::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, window_left: int = -1,
                 window_right: int = -1, softcap: float = 0.0,
                 scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.ops.tessera.attention`: see `attention`."""
    _check(q, k, v, 4, "attention")
    return _forward(q, k, v, None, None, q.shape[1], k.shape[1], q.shape[0], causal, window_left, window_right,
                    softcap, scale)


@attention_op.register_fake
def _attention_fake(q, k, v, causal=False, window_left=-1, window_right=-1, softcap=0.0, scale=None):
    _check(q, k, v, 4, "attention")
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("tessera::attention_varlen", mutates_args=())
def attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                        window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                        scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.ops.tessera.attention_varlen`: see `attention_varlen`."""
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, cu_seqlens_q.shape[0] - 1,
                    causal, window_left, window_right, softcap, scale)


@attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           window_left=-1, window_right=-1, softcap=0.0, scale=None):
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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, window: Window = None,
              softcap: float = 0.0, scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v per (batch, head): (O, LSE); see the module docstring.

    q is (B, Sq, H, D), k and v (B, Sk, H_KV, D), float16 or bfloat16, with
    H % H_KV == 0 and D a power of two (64, 128 or 256 on the GPU). O is
    (B, Sq, H, D) in q's dtype, LSE (B, H, Sq) float32.
    """
    left, right = window_bounds(causal, window)
    return attention_op(q, k, v, causal, left, right, float(softcap), scale)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     window: Window = None, softcap: float = 0.0,
                     scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention` over a batch of sequences packed along the first dim: (O, LSE).

    q is (total_q, H, D), k and v (total_k, H_KV, D); sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (cu_seqlens_k for k, v),
    both int32 of batch + 1 entries; max_seqlen_q / max_seqlen_k bound the
    lengths. O is (total_q, H, D), LSE (H, total_q) float32.
    """
    left, right = window_bounds(causal, window)
    return attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal,
                               left, right, float(softcap), scale)
