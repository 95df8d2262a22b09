"""Decode attention as a PyTorch op: `attention_decode`, new queries against a paged KV cache.

    o, lse = tessera.kernels_lib.attention_decode(q, k_cache, v_cache, block_table, cache_seqlens)

The custom op `torch.ops.tessera.attention_decode` (with a fake
implementation, so `torch.compile` traces it; inference only). The kernels
(`attention_split_kv.py`) split each sequence's keys across programs and
combine the parts (FlashDecoding), pack the query heads of one key/value
head into one tile (GQA), and, given `unified_max`, use FlashDecoding++'s
asynchronous softmax with its fallback. CUDA tensors launch the plan for
their head dim (`DECODE_PLANS`); CPU tensors run on the tile interpreter.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Optional

import torch

import tessera
import tessera.torch

from . import attention_decode_model as model
from . import gpus
from .attention_fwd import LOG2E
from .attention_split_kv import attention_decode_combine_kernel, attention_decode_kernel
from .targets import plan_target

MAX_SPLITS = model.MAX_SPLITS
# The window [phi - below, phi + above] (base-2 logits) around the unified max phi where the asynchronous softmax
# is exact to the dtype: p = exp2(s - phi) is rounded to q's dtype for P V, so `above` keeps every p finite (f16
# ends at 2^16) and `below` keeps the largest terms of a row normal numbers (f16's start at 2^-14; bf16 shares
# float32's range). A row outside it is recomputed by the synchronized softmax.
UNIFIED_WINDOW = {torch.float16: (8.0, 15.0), torch.bfloat16: (64.0, 64.0)}


@dataclass(frozen=True)
class DecodePlan:
    """Packed query rows per program (at most), keys per step (at most: a step stays within a page), how many
    steps of K and V are in flight (cp.async ring slots), and how the program's warps share the tile:
    `warp_per_rows` gives each warp its own 16 rows (a program of one query group is one warp, and the keys
    are shared out between programs, `num_splits`); otherwise 4 warps, those past rows / 16 repeating the
    products (chained dots split rows only)."""

    rows: int
    keys: int
    stages: int
    warp_per_rows: bool = True
    merge_registers: int = 144      # float32 registers a thread may give the merge's sum and chunk (`merge_chunk`)
    in_launch_rows: int = 64        # tiles of at most this many rows may merge in the split launch (0: none)
    merge_early: bool = True        # ... issuing the first step's loads with the max's (`merge_splits`' EARLY)

    def num_warps(self, rows: int) -> int:
        """Warps of a program whose tile has `rows` packed rows (a multiple of 16)."""
        return max(1, rows // MMA_ROWS) if self.warp_per_rows else 4


MMA_ROWS = 16       # an mma.sync / MFMA 16 x 16 tile's rows: what one warp owns of the packed rows

# Per head dim, for the online softmax and for the unified max (whose kernel also holds the fallback's loop, so it
# needs smaller tiles); none for the unified max at head dim 256, where even 16 x 16 tiles spill on sm_80. A program
# of 4 warps over one 16-row query group (G * Sq <= 16 packed rows) made every warp repeat the same products over
# the same keys and read the whole K and V block from shared memory: 4x the ldmatrix traffic and 4x the mma.sync of
# the data. A plan with `warp_per_rows` runs one warp per 16 rows instead: a single-group program is one warp, and
# the split count (`attention_decode_model.plan_for`) gives each warp its own keys and its own partial softmax (m,
# l, acc), merged by `merge_splits` (in the launch or the combine kernel): per KB of K and V an SM issues ~64 warp
# instructions (sm_90a SASS) where the 4 repeating warps issued ~102, 4 HMMA where they issued 16, and its shared
# memory is read once where it was read 4 times. (The tile language has no batched dot, so warps of one program
# cannot own different keys of one block without exchanging P through shared memory every step; separate programs
# need no exchange.)
# Bytes in flight at head dim 128: (stages - 1) x 16 keys x 2 x 256 bytes = 8 KB a program (a 16 KB ring), up to 8
# programs a SM (255 registers x 32 lanes each), against the ~18 KB a SM (3 TB/s x 0.8 us / 132) that HBM's latency
# asks for; the model picks the split count, at B = 1 about 2-3 programs a SM (16-24 KB). Every tile a plan launches
# (rows 16 .. `rows`, keys 16 .. `keys`) compiles without spills for sm_80 and sm_90a with every option compiled in
# (tests/kernels_lib/test_attention_compile.py); one-warp tiles of 32 keys spill at head dim 128 (4-48 bytes), of 16
# keys at head dim 256 (144), the unified max's at head dim 128 (16-272): those plans keep 4 warps (and the unified
# max's head dim 128 tiles at most 16 rows: 32-row tiles spill with the swizzled K/V reads).
#
# Modelled (`attention_decode_model`, bench/attention.py --part decode: B = 1, 32 query heads on 8 KV heads, D =
# 128, pages of 64, bf16, H100 SXM): context 4096 12.9 us (39% of HBM), 16384 29.7 us (68%), 65536 98 us (82%); B =
# 8 at 16384 186 us (86%). Run 9's plan models 28.2 / 89.1 us (measured 28.2 / 89.1, the fit, with its combine
# kernel of two dependent round trips) and with the swizzled reads 13.6 / 30.4: after the swizzle the loop is
# HBM-bound in the model, so this plan is modelled level with it (less shared-memory and tensor-core work, same
# bytes). What keeps B = 1 short of 85% is the fixed ~6.9 us a call against 22.4 us of HBM at 16384: the split
# kernel's launch, ramp and tail (2.4), three dependent loads before the first block (2.4), and the merge (2.1:
# the combine kernel's launch, 1.3, and one round trip, the max's loads issued with the partials'; it was 2.9 with
# the old kernel's two). Merging in the split launch instead saves the launch but costs the merging program's
# round trips: the counter's atomic and a step per 8 splits at 4 packed rows a one-warp program (5 at the ~37
# splits B = 1 takes), so the model keeps two launches at B = 1 (in the launch: 15.4 / 33.0 / 101.0 us) and merges
# in the launch at B = 8 (5 splits, one step: 185.8 us against 186.3).
# Untimed on a GPU.
# The merge in the split launch (`attention_split_kv.merge_splits`) adds registers that stay live through the key
# loop (its pointers and sizes): the head-dim-128 plans' 4-warp tiles spill with it on sm_80 (16-88 bytes; the
# unified max's on sm_90a too), so those tiles merge in the combine kernel (`in_launch_rows`); the head-dim-256
# tiles spill (sm_80 and sm_90a) with two steps of the merge in registers, so they issue the first after the max.
DECODE_PLANS = {64: DecodePlan(64, 64, 3), 128: DecodePlan(64, 16, 2, in_launch_rows=32),
                256: DecodePlan(16, 32, 2, warp_per_rows=False, merge_early=False)}
UNIFIED_DECODE_PLANS = {64: DecodePlan(64, 32, 2),
                        128: DecodePlan(16, 32, 3, warp_per_rows=False, in_launch_rows=0)}
CPU_DECODE_PLAN = DecodePlan(16, 16, 1)
# AMD's K and V ring depth per target and (unified softmax, head dim): rings of direct-to-LDS loads, 2 stages only
# where every tile the op launches compiles for that target without spills and fits its LDS (`targets.lds_bytes`;
# tests/kernels_lib/test_attention_compile.py compiles them all). On gfx942 (64 KiB) two stages spill SGPRs in
# the one-warp tiles (online D=64 16x64: 44, online D=128 16x16: 39, unified D=64 16x16 / 16x32: 10 / 41, and
# unified D=64 32x32 on two warps: 10) and the online softmax's head dim 256 needs 66680 bytes, so those keep one
# stage until a GPU run says whether the deeper ring is worth the spills. On gfx950 (160 KiB) every tile of every
# plan compiles with three stages without spills of either kind or scratch, in 13-100 KiB (online D=256 16x32:
# 99568 bytes; bench/results/amd_registers_gfx950.md). A third stage doubles the blocks a program keeps in flight
# (decode waits on HBM); where LDS rather than VGPRs then bounds the programs a CU holds (the one-wave tiles), it
# holds fewer, but at least as many blocks stay in flight per CU (online D=128 16x16: 6 programs x 2 ahead, where
# 8 x 1 at two stages).
AMD_DECODE_STAGES = {
    "gfx942": {(False, 64): 1, (False, 128): 1, (False, 256): 1, (True, 64): 1, (True, 128): 2},
    "gfx950": {(False, 64): 3, (False, 128): 3, (False, 256): 3, (True, 64): 3, (True, 128): 3},
}


@dataclass(frozen=True)
class DecodeShape:
    """The sizes of one decode call: batch, new queries, heads, head dim, page size, pages per sequence."""

    B: int
    Sq: int
    H: int
    H_kv: int
    D: int
    P: int
    max_pages: int

    @property
    def packed(self) -> int:
        """Query rows sharing one key/value head: the group's heads times the new queries."""
        return self.H // self.H_kv * self.Sq

    def tile(self, plan: DecodePlan) -> tuple[int, int]:
        """(rows per program, keys per step): the packed rows padded for the tensor cores (at most the plan's),
        and the plan's keys or the page, whichever is fewer."""
        return min(max(16, tessera.next_power_of_2(self.packed)), plan.rows), min(self.P, plan.keys)


def _check_decode(q, k_cache, v_cache, block_table, cache_seqlens) -> DecodeShape:
    """The sizes of a decode call, or a ValueError naming what to change."""
    name = "tessera::attention_decode"
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"{name}: q must be (B, Sq, H, D) and k_cache, v_cache (pages, page_size, H_KV, D) alike, "
                         f"got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, Sq, H, D = q.shape
    _, P, H_kv, D_kv = k_cache.shape
    if q.dtype not in UNIFIED_WINDOW or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"{name}: q and the caches must all be float16 or all bfloat16, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if D_kv != D or D < 16 or D & (D - 1) or H_kv == 0 or H % H_kv:
        raise ValueError(f"{name}: head dims {D} / {D_kv} must match and be a power of two >= 16, and q's {H} "
                         f"heads a multiple of the cache's {H_kv}")
    if P < 16 or P > 256 or P & (P - 1):
        raise ValueError(f"{name}: the page size {P} must be a power of two from 16 to 256 tokens")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32:
        raise ValueError(f"{name}: block_table must be int32 (B, pages per sequence) = ({B}, ...), got "
                         f"{block_table.dtype} {tuple(block_table.shape)}; convert it with .int()")
    if cache_seqlens.shape != (B,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"{name}: cache_seqlens must be int32 ({B},), got {cache_seqlens.dtype} "
                         f"{tuple(cache_seqlens.shape)}; convert it with .int()")
    if any(t.device != q.device for t in (k_cache, v_cache, block_table, cache_seqlens)):
        raise ValueError(f"{name}: every tensor must be on q's device {q.device}")
    return DecodeShape(B, Sq, H, H_kv, D, P, block_table.shape[1])


def _check_lengths(shape: DecodeShape, cache_seqlens: torch.Tensor) -> None:
    """On the CPU (where reading them costs no GPU sync): every length fits the sequence's pages."""
    capacity = shape.max_pages * shape.P
    if cache_seqlens.device.type == "cpu" and bool(((cache_seqlens < 0) | (cache_seqlens > capacity)).any()):
        raise ValueError(f"tessera::attention_decode: cache_seqlens {cache_seqlens.tolist()} must lie in 0 .. "
                         f"{capacity} (the block table's {shape.max_pages} pages of {shape.P} tokens)")


def _num_splits(shape: DecodeShape, plan: DecodePlan, on_gpu: bool, asked: int, device) -> tuple[int, bool]:
    """(splits of each sequence's keys, whether the split launch merges them): `asked` splits, else on a GPU the
    count `attention_decode_model` times fastest for this plan's tile, on the interpreter two programs per (CPU)
    core's worth (one per 2 blocks at most); the merge $TESSERA_DECODE_SEPARATE_COMBINE asks for, else on a GPU
    the model's faster one, on the interpreter the merge in the launch."""
    rows, block = shape.tile(plan)
    blocks = tessera.cdiv(shape.max_pages * shape.P, block)
    can = rows <= plan.in_launch_rows               # the tile's split launch may merge (no spills with it)
    in_launch = merge_in_launch_asked()
    if not on_gpu:
        programs = shape.B * shape.H_kv * tessera.cdiv(shape.packed, rows)
        splits = asked if asked > 0 else min(4 // max(programs, 1), tessera.cdiv(blocks, 2))
        return max(1, min(splits, blocks, MAX_SPLITS)), can and in_launch is not False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    gpu = gpus.of(device)                   # (its constants, looked up once per device)
    decode = model.Decode(shape.B, shape.H, shape.H_kv, shape.D, shape.max_pages * shape.P, shape.Sq)
    tile = model.Tile(rows, block, plan.stages, plan.num_warps(rows), merge_registers=plan.merge_registers,
                      in_launch=can, merge_early=plan.merge_early)
    if asked > 0:
        splits = max(1, min(asked, blocks, MAX_SPLITS))
        if in_launch is None:
            in_launch = model.modelled(decode, tile, splits, sms, True, gpu).total <= \
                model.modelled(decode, tile, splits, sms, False, gpu).total
        return splits, can and in_launch
    return model.plan_for(decode, tile, sms, in_launch, gpu)


@dataclass(frozen=True)
class Softmax:
    """The kernels' scalars for the logits and softmax: base-2 scale (over softcap when capping), the unified
    max in base 2 and its window (None: the synchronized softmax), and the masks' bounds (-1: none)."""

    qk_scale: float
    softcap: float
    unified_max: Optional[float]
    below: float
    above: float
    left: int
    right: int

    @classmethod
    def of(cls, shape: DecodeShape, dtype, causal, left, right, softcap, scale, unified_max) -> "Softmax":
        scale = 1.0 / math.sqrt(shape.D) if scale is None else float(scale)
        below, above = UNIFIED_WINDOW[dtype]
        phi = None if unified_max is None else float(unified_max) * LOG2E
        return cls(scale / softcap if softcap > 0 else scale * LOG2E, float(softcap), phi, below, above, left,
                   0 if causal else right)


SEPARATE_COMBINE_ENV = "TESSERA_DECODE_SEPARATE_COMBINE"
COMBINE_WARPS, COMBINE_REGISTERS = model.COMBINE_WARPS, model.COMBINE_REGISTERS


def merge_in_launch_asked() -> Optional[bool]:
    """What $TESSERA_DECODE_SEPARATE_COMBINE asks: "1" the two-launch path (the combine kernel after the split
    kernel: False), "0" the merge in the split launch (True), unset or "auto" neither (None: the model picks)."""
    value = os.environ.get(SEPARATE_COMBINE_ENV, "auto")
    if value not in ("0", "1", "auto", ""):
        raise ValueError(f"tessera::attention_decode: ${SEPARATE_COMBINE_ENV} must be 1 (two launches), 0 (the "
                         f"merge in the split launch) or auto, got {value!r}")
    return {"1": False, "0": True}.get(value)


def merge_rows(shape: DecodeShape, rows: int) -> int:
    """Rows of the merge's tile: a program's packed rows that exist, padded to a power of two."""
    return min(rows, tessera.next_power_of_2(shape.packed))


def merge_chunk(shape: DecodeShape, rows: int, warps: int, splits: int, registers: int,
                most: int = MAX_SPLITS) -> int:
    """Splits merged per step by a program of `rows` packed rows (`attention_decode_model.merge_chunk`)."""
    return model.merge_chunk(shape.packed, shape.D, rows, warps, splits, registers, most)


_COUNTERS: dict = {}


def arrival_counters(device: torch.device, count: int) -> torch.Tensor:
    """`count` int32 counters for the split launch's merge, zeroed once when made: every launch leaves them at 0
    (the merging program resets its own), so no launch clears them. One set per device, stream and size, kept
    for the process (a CUDA graph that captured a launch keeps using its set); two launches at once on one
    stream cannot share one, since a stream runs them in order."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, count)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = torch.zeros(count, dtype=torch.int32, device=device)
    return counters


def launch(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, shape: DecodeShape, plan: DecodePlan,
           softmax: Softmax, splits: int, fallback: bool = True, in_launch: bool = True) -> None:
    """Run the split kernel into o and lse: with one split, directly; with several, into float32 partials
    merged either by the split launch's last program per row group (`in_launch`) or by the combine kernel
    after it, to the same bits. `fallback=False` skips the unified max's recomputation: only for the tests
    that show it is needed."""
    rows, block = shape.tile(plan)
    row_groups, warps = tessera.cdiv(shape.packed, rows), plan.num_warps(rows)
    combine = splits > 1 and in_launch and rows <= plan.in_launch_rows
    if splits == 1:
        o_out, lse_out, counters = o, lse, lse
        o_strides, lse_strides = (0, *o.stride()[:3]), (0, *lse.stride()[:2])
    else:       # packed-row-major partials: (splits, B, H, Sq, D), a (b, kv_h) group's rows contiguous
        o_out = torch.empty((splits, shape.B, shape.H, shape.Sq, shape.D), dtype=torch.float32, device=q.device)
        lse_out = torch.empty((splits, *lse.shape), dtype=torch.float32, device=q.device)
        o_strides = (o_out.stride(0), o_out.stride(1), o_out.stride(3), o_out.stride(2))    # split, b, s, h
        lse_strides = lse_out.stride()[:3]
        counters = arrival_counters(q.device, shape.B * shape.H_kv * row_groups) if combine else lse
    merge = dict(MR=merge_rows(shape, rows), SPLITS=tessera.next_power_of_2(splits),
                 CHUNK=merge_chunk(shape, rows, warps, splits, plan.merge_registers, model.MERGE_MOST),
                 EARLY=plan.merge_early) if splits > 1 else {}
    unified = softmax.unified_max is not None
    attention_decode_kernel[(splits, shape.B * shape.H_kv, row_groups)](
        q, k_cache, v_cache, block_table, cache_seqlens, o_out, lse_out, o, lse, counters, shape.Sq, shape.H,
        shape.H_kv, shape.P, softmax.qk_scale, softmax.softcap, softmax.unified_max if unified else 0.0,
        softmax.below, softmax.above, max(softmax.left, 0), max(softmax.right, 0), splits, *q.stride(),
        *k_cache.stride(), *v_cache.stride(), block_table.stride(0), *o_strides, *lse_strides, *o.stride()[:3],
        *lse.stride()[:2],
        D=shape.D, BM=rows, BN=block, HAS_LEFT=softmax.left >= 0, HAS_RIGHT=softmax.right >= 0,
        SOFTCAP=softmax.softcap > 0, SPLIT=splits > 1, UNIFIED=unified, FALLBACK=fallback, STAGES=plan.stages,
        COMBINE=combine, **merge, num_warps=warps)
    if splits > 1 and not combine:      # one packed row a program, as many programs as query rows
        attention_decode_combine_kernel[(shape.packed, shape.B * shape.H_kv)](
            o_out, lse_out, o, lse, shape.Sq, shape.H, shape.H_kv, splits, o_strides[0], o_strides[1],
            o_strides[3], *lse_strides, *o.stride()[:3], *lse.stride()[:2], D=shape.D, MR=1,
            SPLITS=merge["SPLITS"], CHUNK=merge_chunk(shape, 1, COMBINE_WARPS, splits, COMBINE_REGISTERS),
            num_warps=COMBINE_WARPS)


def on_interpreter(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"


def gpu_decode_plan(D: int, unified: bool, target: str) -> DecodePlan:
    """The GPU plan of head dim D for the softmax asked for on `target` (a plan key, `targets.plan_target`:
    "nvidia", or an AMD target, whose rings are `AMD_DECODE_STAGES[target]` deep)."""
    plans = UNIFIED_DECODE_PLANS if unified else DECODE_PLANS
    if D not in plans:
        fix = "leave unified_max=None (the online softmax)" if D in DECODE_PLANS else "use another head dim"
        raise ValueError(f"tessera::attention_decode: head dim {D} has no GPU plan"
                         f"{' with a unified max' if unified else ''} (planned: {sorted(plans)}); {fix}")
    return plans[D] if target == "nvidia" else replace(plans[D], stages=AMD_DECODE_STAGES[target][unified, D])


def decode_plan(shape: DecodeShape, q: torch.Tensor, unified: bool) -> DecodePlan:
    """The interpreter's small plan for CPU tensors, else the GPU plan of q's device (`targets.plan_target`)."""
    if on_interpreter(q):
        return CPU_DECODE_PLAN
    return gpu_decode_plan(shape.D, unified, plan_target(q.device))


def _attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                      cache_seqlens: torch.Tensor, causal: bool = True, window_left: int = -1,
                      window_right: int = -1, softcap: float = 0.0, scale: Optional[float] = None,
                      num_splits: int = 0, unified_max: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The implementation of `torch.ops.tessera.attention_decode`: see `attention_decode`."""
    shape = _check_decode(q, k_cache, v_cache, block_table, cache_seqlens)
    _check_lengths(shape, cache_seqlens)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((shape.B, shape.H, shape.Sq), dtype=torch.float32, device=q.device)
    if o.numel() == 0 or shape.max_pages == 0:
        return o.zero_(), lse.fill_(float("inf"))
    plan = decode_plan(shape, q, unified_max is not None)
    splits, in_launch = _num_splits(shape, plan, not on_interpreter(q), num_splits, q.device)
    softmax = Softmax.of(shape, q.dtype, causal, window_left, window_right, softcap, scale, unified_max)
    launch(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, shape, plan, softmax, splits, in_launch=in_launch)
    return o, lse


attention_decode_op = torch.library.custom_op("tessera::attention_decode", _attention_decode, mutates_args=())


@attention_decode_op.register_fake
def _attention_decode_fake(q, k_cache, v_cache, block_table, cache_seqlens, causal=True, window_left=-1,
                           window_right=-1, softcap=0.0, scale=None, num_splits=0, unified_max=None):
    shape = _check_decode(q, k_cache, v_cache, block_table, cache_seqlens)
    return q.new_empty(q.shape), q.new_empty((shape.B, shape.H, shape.Sq), dtype=torch.float32)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, *, causal: bool = True, window=None, softcap: float = 0.0,
                     scale: Optional[float] = None, num_splits: int = 0,
                     unified_max: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the newest Sq queries of each sequence over its paged KV cache: (O, LSE).

    q is (B, Sq, H, D) (Sq new tokens per sequence, usually 1); k_cache and
    v_cache are (pages, page_size, H_KV, D) with pages of 16 to 256 tokens
    (a power of two); block_table (B, pages per sequence) int32 maps
    sequence b's j-th page to its page in the cache, and cache_seqlens (B,)
    int32 gives its length, the new tokens included (they are its last Sq
    positions). Masks as `attention` (causal by default). The keys are split
    into `num_splits` parts per sequence and head (0: enough to fill the
    GPU) whose partial results are merged, by the last program of each
    query group to finish or by a second kernel
    ($TESSERA_DECODE_SEPARATE_COMBINE; by default what the decode model
    times faster), to the same bits either way.

    `unified_max` (FlashDecoding++): an estimate of the largest logit
    scale * q.k (after the softcap) of typical rows, e.g. measured offline
    for a model; with it the softmax skips the running max and the
    rescaling. A row whose max lies too far from it (float16: more than
    ~10 above or ~5.5 below, in natural-log units) is recomputed with the
    ordinary online softmax, so any value is correct, a good one is faster.
    With `softcap`, the cap itself bounds every logit. (On a GPU, head
    dims 64 and 128; 256 runs the online softmax only.)

    O is (B, Sq, H, D), LSE (B, H, Sq) float32 (+inf for a row that sees no
    key, with O = 0). Inference only (no autograd). This is the op
    `torch.ops.tessera.attention_decode`, called directly where nothing
    observes the dispatch (`tessera.torch.unobserved`).
    """
    from .attention import window_bounds
    left, right = window_bounds(causal, window)
    if unified_max is not None and not math.isfinite(unified_max):
        raise ValueError(f"tessera::attention_decode: unified_max must be a finite float, got {unified_max}")
    op = _attention_decode if tessera.torch.unobserved(q, k_cache, v_cache, block_table, cache_seqlens) \
        else attention_decode_op
    return op(q, k_cache, v_cache, block_table, cache_seqlens, causal, left, right, float(softcap), scale,
              int(num_splits), None if unified_max is None else float(unified_max))
