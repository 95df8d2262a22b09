"""Split-K GEMM for `tessera::gemm`: programs that split K, for the shapes whose tiles are too few for the SMs.

One program computes a BM x BN tile of C over one contiguous slice of K
(`steps` K steps of BK), streaming its A and B blocks through a STAGES-deep
ring; the grid is (column strips, splits, row tiles). Two kinds of GEMM take
it (the op, `gemm.py`, decides):

* small M (decode, M <= 64: `small_m_plan`): the GEMM moves K x N elements
  of B for 2 M N K flops, so it is bound by memory bandwidth, and the tiled
  kernel launches only cdiv(N, BN) programs (64 for N = 4096: half an H100),
  each walking all of K. Here all M rows are one BM-row tile (BM = 16, 32 or
  64), so B is read exactly once, by enough programs to cover the SMs:
  narrower column strips (BN = 32) where they alone cover them, else K
  split, each program reading a contiguous K slice of B. A bandwidth model
  (`modelled`: HBM, L2 -> SM, per-SM bytes in flight, the reduce launch)
  picks among the row tile's tiles and splits;
* few tiles (`few_tiles_plan`): a larger M whose 128 x 128 tiles leave SMs
  idle (M = 256, N = 4096: 64 tiles on 132 SMs) splits K as far as one wave
  of programs allows.

The splits meet in one of three ways:

* SPLIT_K == 1: the program has all of K and applies the epilogue itself;
* SPLIT_K > 1, deterministic (the default): each split writes its float32
  partial tile to a workspace [SPLIT_K * row tiles * BM, N];
  `gemm_split_k_reduce_kernel` sums the splits in split order (the same bits
  on every run), applies the epilogue (`gemm_epilogue.py`) and stores C;
* SPLIT_K > 1 with ATOMIC: the splits add into one zeroed float32 [row tiles *
  BM, N] with atomics (less workspace, but the sum's order, so its last bits,
  vary run to run), and the reduce kernel applies the epilogue to it.

The tiles come from `gemm_configs.json` ("small_m", "split_k"); the split
counts from the models below. The K slice is pipelined only where every
operand row starts on a 16-byte boundary, with the alignment the op checked
stated to the compiler (`main_constexprs`, `gemm_alignment.py`). The kernels use only tile-level ops, so the dot
runs on whatever the target has: mma.sync on sm_80/sm_89 (and on sm_90a for
BM < 64), wgmma on sm_90a for BM >= 64, MFMA on gfx942 / gfx950, whose tiles
are the same ones with no more stages than the target's LDS holds
(`gemm_configs.small_m_tiles` / `split_k_tile` by plan key). The models price
plans with the launching GPU's constants (`gpus.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

import tessera

from . import gemm_configs, gpus
from .gemm_alignment import NOTHING_STATED, operand_alignment, pointers_aligned, state_alignment
from .gemm_epilogue import epilogue

SMALL_M = 64                 # the op takes the small-M path for M <= SMALL_M
ROW_TILES = (16, 32, 64)     # its BM: the smallest that holds M (the matrix instructions' M is 16)


@tessera.kernel
def gemm_split_k_kernel(a_ptr, b_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, partial_ptr, M, N, K, alpha,
                        stride_am, stride_ak, stride_bk, stride_bn, steps,
                        HAS_BIAS: tessera.constexpr, SCALE_A: tessera.constexpr,
                        SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                        BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                        STAGES: tessera.constexpr, SPLIT_K: tessera.constexpr, ATOMIC: tessera.constexpr,
                        ALIGN: tessera.constexpr = NOTHING_STATED):
    """Program (pid_n, split, pid_m): tile (pid_m, pid_n) of C over K steps split * steps .. (split + 1) * steps.
    ALIGN: what the op checked M, N, K and the four strides are multiples of (`gemm_alignment.py`)."""
    state_alignment(M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ALIGN)
    pid_n, split, pid_m = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    first = split * steps
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(first, min(first + steps, tessera.cdiv(K, BK)), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    if SPLIT_K == 1:
        acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                       HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN)
        tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)
    elif ATOMIC:        # one shared [row tiles * BM, N] float32 sum (zeroed by the caller)
        rows = pid_m * BM + tessera.arange(0, BM)[:, None]
        cols = pid_n * BN + tessera.arange(0, BN)[None, :]
        tessera.atomic_add(partial_ptr + rows * N + cols, acc, mask=(rows < M) & (cols < N))
    else:               # this split's tile of the [SPLIT_K * row tiles * BM, N] workspace
        row_tiles = tessera.cdiv(M, BM)
        partials = tessera.view(partial_ptr, (SPLIT_K * row_tiles * BM, N))
        partials.block((BM, BN), (split * row_tiles + pid_m, pid_n)).store(acc)


@tessera.kernel
def gemm_split_k_reduce_kernel(partial_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, M, N, alpha,
                               HAS_BIAS: tessera.constexpr, SCALE_A: tessera.constexpr,
                               SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                               BM: tessera.constexpr, BN: tessera.constexpr, SPLITS: tessera.constexpr):
    """Program (pid_n, pid_m): C's tile = epilogue(the sum of its SPLITS partial tiles, in split order)."""
    pid_n, pid_m = tessera.program_id(0), tessera.program_id(1)
    row_tiles = tessera.cdiv(M, BM)
    partials = tessera.view(partial_ptr, (SPLITS * row_tiles * BM, N))
    acc = partials.block((BM, BN), (pid_m, pid_n)).load()
    for split in range(1, SPLITS):
        acc = acc + partials.block((BM, BN), (split * row_tiles + pid_m, pid_n)).load()
    acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                   HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


# The same kernels with fast math (fma contraction, approximate exp2 and division), which the op runs where
# the output's precision allows (`gemm._fast_math_allows`), as for the tiled kernel.
gemm_split_k_kernel_fast = tessera.kernel(fast_math=True)(gemm_split_k_kernel.fn)
gemm_split_k_reduce_kernel_fast = tessera.kernel(fast_math=True)(gemm_split_k_reduce_kernel.fn)


# ---------------------------------------------------------------------------
# Launch plans: how far to split K

# Small M is bound by memory bandwidth. Bytes of B each program keeps in flight: STAGES - 1 ring slots of
# BK x BN. An H100 streams ~3.35 TB/s with ~0.8 us of DRAM latency, so ~2.7 MB must be in flight, ~20 KB per
# SM (Little's law): one program per SM with 32-56 KB of slots in flight covers it, so the split count aims
# at one program per SM (or more: two small-M programs fit an SM); `small_m_plan` weighs it against not
# splitting (`modelled`).
PARTIAL_TRAFFIC = 8          # small M: the workspace (written once, read once) stays <= 1/8 of B's bytes
# Few tiles are bound by the tensor cores of the SMs they reach: splitting K by S cuts each program's work by
# S while the tiles times S still fit one wave (equal work per program: a partial second wave idles SMs).
PARTIAL_SHARE_TILED = 2      # few tiles: the workspace traffic stays <= 1/2 of the operands' bytes


@dataclass(frozen=True)
class SplitKPlan:
    """One split-K launch: the tile (BM x BN, BK deep, STAGES ring slots), warps, and how K is split."""

    BM: int
    BN: int
    BK: int
    STAGES: int
    num_warps: int
    split_k: int         # programs per tile of C, each with a contiguous slice of K
    steps: int           # K steps (of BK) per split; the last split may have fewer


def row_tile(M: int) -> int:
    """The small-M path's BM: the smallest of ROW_TILES that holds M rows."""
    if not 1 <= M <= SMALL_M:
        raise ValueError(f"tessera::gemm small-M path: M = {M} is not in 1..{SMALL_M}; larger M uses the tiled "
                         f"kernel (gemm.gemm_kernel) or `few_tiles_plan`")
    return next(bm for bm in ROW_TILES if bm >= M)


def split_count(M: int, N: int, K: int, element_bytes: int, num_sms: int, BM: int, BN: int, BK: int,
                STAGES: int) -> int:
    """Small M: how many programs split K. Enough that the cdiv(N, BN) column strips times the splits give
    every SM a program (each reading a contiguous K slice of B, so B is read once, at full bandwidth), but no
    more than keeps the partial sums' traffic (2 * splits * BM * N * 4 bytes) under 1/PARTIAL_TRAFFIC of B's
    K * N * element_bytes, and no more than leaves each split STAGES K steps (a full ring)."""
    strips = tessera.cdiv(N, BN)
    k_steps = tessera.cdiv(K, BK)
    cover = tessera.cdiv(num_sms, strips)
    traffic = K * element_bytes // (PARTIAL_TRAFFIC * 2 * BM * 4)
    ring = k_steps // STAGES
    return max(1, min(cover, traffic, ring))


def few_tiles_split_count(M: int, N: int, K: int, element_bytes: int, num_sms: int, BM: int, BN: int, BK: int,
                          STAGES: int) -> int:
    """Few tiles: how many programs split K. As many as keep tiles * splits within one wave of num_sms, each
    split at least two rings deep (2 * STAGES K steps: the fill and drain amortized), and the partials'
    traffic (2 * splits * M * N * 4 bytes) under 1/PARTIAL_SHARE_TILED of the operands' (M + N) * K *
    element_bytes; 1 when the tiles already fill the SMs."""
    tiles = tessera.cdiv(M, BM) * tessera.cdiv(N, BN)
    wave = num_sms // tiles
    ring = tessera.cdiv(K, BK) // (2 * STAGES)
    traffic = (M + N) * K * element_bytes // (PARTIAL_SHARE_TILED * 2 * M * N * 4)
    return max(1, min(wave, ring, traffic))


def _even(BM: int, BN: int, BK: int, STAGES: int, num_warps: int, K: int, split: int) -> SplitKPlan:
    """The plan with `split` made even: every split a whole, non-empty slice of the K steps."""
    k_steps = max(1, tessera.cdiv(K, BK))
    steps = tessera.cdiv(k_steps, split)
    return SplitKPlan(BM, BN, BK, STAGES, num_warps, tessera.cdiv(k_steps, steps), steps)


def _tile(config: dict, element_bytes: int) -> tuple[int, int, int, int]:
    """(BN, BK, STAGES, num_warps) of a config entry; BK holds K_BYTES of each row, at least one k16 step."""
    return config["BN"], max(16, config["K_BYTES"] // element_bytes), config["STAGES"], config["num_warps"]


# The small-M model (`modelled`): what a plan's launch(es) cost on a GPU, in microseconds, as the slowest of
# three streams plus the reduce. Ratios between plans matter, not the absolute values. The GPU's constants come
# from its row in `gpus.py` (HBM and L2 -> SM bandwidth, one SM's fill rate, DRAM latency, the shared memory an
# SM holds rings in); the H100 SXM's were checked against bench/results/2026-11-26-h100-run7 (64 x 4096 x
# 14336, split 3: the model's 46.8 us, measured 47.3), and a model given no GPU prices plans on it.
# The two below are fitted on that H100 alone (no other GPU has run them):
STEP_US = 0.125              # a program streams at most a K step's bytes per K step: the sm_90a SASS of a 64-deep
#                              step is the ring's wait, a barrier, ldmatrix and 4 dependent HMMA.16816 (~220 clk)
REDUCE_US = 2.0              # the reduce kernel: its launch and ramp after the main one, before its traffic


class Streams(NamedTuple):
    """The small-M model's times for one plan, in microseconds (`modelled`)."""

    hbm: float           # B and A read once from HBM
    l2: float            # B once and A once per column strip, through L2 to the SMs (A is re-read per strip)
    sm: float            # the busiest SM streaming its programs' bytes at its rate
    reduce: float        # K split: the reduce kernel's launch and the partials' traffic; 0 unsplit

    @property
    def total(self) -> float:
        """The plan's time: the slowest stream, then the reduce."""
        return max(self.hbm, self.l2, self.sm) + self.reduce


def modelled(M: int, N: int, K: int, element_bytes: int, num_sms: int, p: SplitKPlan,
             gpu: gpus.Gpu = gpus.H100_SXM) -> Streams:
    """The small-M bandwidth model of plan `p` on `gpu` (see `Streams`). An SM's rate is its resident programs
    (as many rings as fit its shared memory, at most those it is given) times what each keeps in flight (STAGES
    - 1 slots) over the latency, at most the SM's fill rate; the partials are written and read once, BM rows
    each. A program reads the rows of A that exist (a slot's rows past M are zero-filled, not read). A program
    streams no faster than one K step's bytes per STEP_US either (its loop is one dependent chain)."""
    rows, strips = min(M, p.BM), tessera.cdiv(N, p.BN)
    per_sm = tessera.cdiv(strips * p.split_k, num_sms)
    resident = max(1, gpu.shared_per_sm // (p.STAGES * (p.BM + p.BN) * p.BK * element_bytes))
    in_flight = (p.STAGES - 1) * (rows + p.BN) * p.BK * element_bytes
    step = (rows + p.BN) * p.BK * element_bytes
    rate = min(gpu.sm_gbps, min(per_sm, resident) * min(in_flight / gpu.latency_us, step / STEP_US) / 1e3)
    return Streams(
        hbm=(K * N + M * K) * element_bytes / (gpu.hbm_gbps * 1e3),
        l2=(K * N + strips * rows * K) * element_bytes / (gpu.l2_gbps * 1e3),
        sm=per_sm * (rows + p.BN) * p.steps * p.BK * element_bytes / (rate * 1e3),
        reduce=0.0 if p.split_k == 1 else REDUCE_US + 2 * p.split_k * p.BM * N * 4 / (gpu.hbm_gbps * 1e3))


def small_m_candidates(M: int, N: int, K: int, element_bytes: int, num_sms: int,
                       tiles: list[dict] | None = None, plans_of: str = "nvidia") -> list[SplitKPlan]:
    """The plans the small-M model compares: each of M's row tile's tiles (`tiles`, or those GPUs of plan key
    `plans_of` run: `gemm_configs.small_m_tiles`, fitted to an AMD target's LDS; where a target's LDS left a row
    tile none, the next larger row tile's) unsplit, and split as far as `split_count` covers the SMs, made even."""
    BM = row_tile(M)
    if not tiles:
        table = gemm_configs.small_m_tiles(plans_of)
        BM = next((bm for bm in ROW_TILES if bm >= BM and table.get(bm)), 0)
        if not BM:
            raise ValueError(f"tessera::gemm small-M path: plan key {plans_of!r} has no tile of {row_tile(M)} or "
                             f"more rows (`gemm_configs.small_m_tiles`: none fits its shared memory 2 stages "
                             f"deep); ship a smaller tile for it in gemm_configs.json")
        tiles = table[BM]
    plans = []
    for config in tiles:
        BN, BK, STAGES, num_warps = _tile(config, element_bytes)
        for split in sorted({1, split_count(M, N, K, element_bytes, num_sms, BM, BN, BK, STAGES)}):
            plans.append(_even(BM, BN, BK, STAGES, num_warps, K, split))
    return plans


def small_m_plan(M: int, N: int, K: int, element_bytes: int, num_sms: int, config: dict | None = None,
                 gpu: gpus.Gpu = gpus.H100_SXM, plans_of: str | None = None) -> SplitKPlan:
    """The small-M plan on `gpu` (its constants: `gpus.py`), from the tiles of plan key `plans_of` (default the
    GPU's own, `Gpu.plan_key`): the candidate (`small_m_candidates`) the bandwidth model (`modelled`) times
    fastest; among equals the one whose SM and L2 streams leave the most headroom below HBM, then fewer splits,
    then the tiles' order. With `config` (the interpreter's one tile: {"BN", "K_BYTES", "STAGES", "num_warps"})
    there is nothing to time: that tile, split by `split_count`."""
    if config is not None:
        BM = row_tile(M)
        BN, BK, STAGES, num_warps = _tile(config, element_bytes)
        split = split_count(M, N, K, element_bytes, num_sms, BM, BN, BK, STAGES)
        return _even(BM, BN, BK, STAGES, num_warps, K, split)
    plans = small_m_candidates(M, N, K, element_bytes, num_sms, plans_of=plans_of or gpu.plan_key)

    def cost(indexed):
        i, p = indexed
        streams = modelled(M, N, K, element_bytes, num_sms, p, gpu)
        return round(streams.total, 3), round(max(streams.l2, streams.sm), 3), p.split_k, i

    return min(enumerate(plans), key=cost)[1]


def few_tiles_plan(M: int, N: int, K: int, element_bytes: int, num_sms: int,
                   config: dict | None = None, plans_of: str = "nvidia") -> SplitKPlan | None:
    """The few-tiles split for M > SMALL_M (the tile GPUs of plan key `plans_of` run, `gemm_configs.split_k_tile`:
    fitted to an AMD target's LDS; or `config`: {"BM", "BN", "K_BYTES", "STAGES", "num_warps"}), or None where
    splitting does not pay (`few_tiles_split_count` is 1) or the target has no such tile: the tiled kernel runs
    then."""
    config = config or gemm_configs.split_k_tile(plans_of)
    if config is None:
        return None
    BM = config["BM"]
    BN, BK, STAGES, num_warps = _tile(config, element_bytes)
    split = few_tiles_split_count(M, N, K, element_bytes, num_sms, BM, BN, BK, STAGES)
    return None if split == 1 else _even(BM, BN, BK, STAGES, num_warps, K, split)


def main_constexprs(p: SplitKPlan, M: int, N: int, K: int, strides: tuple[int, int, int, int], element_bytes: int,
                    pointers_aligned: bool) -> dict:
    """`gemm_split_k_kernel`'s ALIGN and STAGES for these arguments (`gemm_alignment.operand_alignment`): the
    plan's STAGES where every operand's rows start 16-byte aligned, else 1, a plain loop (no asynchronous copy,
    or only cp.async of 4- or 8-byte chunks where sm_90a wants TMA, could fill the ring)."""
    align, pipelined = operand_alignment(M, N, K, strides, element_bytes, pointers_aligned)
    return dict(ALIGN=align, STAGES=p.STAGES if pipelined else 1)


# ---------------------------------------------------------------------------
# The launch


def _direct(kernel, grid, args: tuple, kwargs: dict) -> None:
    kernel[grid](*args, **kwargs)


def launch(args: tuple, p: SplitKPlan, M: int, N: int, flags: dict, device, *, element_bytes: int,
           fast: bool = False, atomic: bool = False, launches=None) -> SplitKPlan:
    """Compute C = op(A) @ op(B) with the epilogue by plan `p`; return `p`.

    `args` are `gemm.gemm_kernel`'s 14 arguments (C at index 5), already host arrays for the interpreter;
    `flags` its HAS_BIAS / SCALE_A / SCALE_B / ACTIVATION; `element_bytes` the size of A's and B's
    elements (ALIGN and STAGES follow from it and the arguments: `main_constexprs`). `atomic` sums the splits with atomics
    instead of the deterministic workspace; `fast` runs the fast-math compilations. `launches` (the op's
    `gemm_plan.Direct` or `Recording`) launches each kernel and hands the workspace to the kernels."""
    c, (bias, scale_a, scale_b), alpha = args[5], args[2:5], args[9]
    atomic = atomic and p.split_k > 1
    row_tiles = -(-M // p.BM)              # ceiling divisions inline: tessera.cdiv is a host call each
    if p.split_k == 1:
        partials = c                    # unused: the one split writes C itself
    elif atomic:
        partials = torch.zeros((row_tiles * p.BM, N), dtype=torch.float32, device=device)
    else:
        partials = torch.empty((p.split_k * row_tiles * p.BM, N), dtype=torch.float32, device=device)
    if partials is not c and launches is not None:
        partials = launches.workspace(partials, atomic)
    strips = -(-N // p.BN)
    tile = dict(BM=p.BM, BN=p.BN, num_warps=p.num_warps)
    main = gemm_split_k_kernel_fast if fast else gemm_split_k_kernel
    chosen = main_constexprs(p, M, N, args[8], args[10:14], element_bytes, pointers_aligned(*args[:2]))
    run = launches.launch if launches is not None else _direct
    run(main, (strips, p.split_k, row_tiles), (*args[:6], partials, *args[6:], p.steps),
        dict(**flags, BK=p.BK, SPLIT_K=p.split_k, ATOMIC=atomic, **chosen, **tile))
    if p.split_k > 1:
        reduce = gemm_split_k_reduce_kernel_fast if fast else gemm_split_k_reduce_kernel
        run(reduce, (strips, row_tiles), (partials, bias, scale_a, scale_b, c, M, N, alpha),
            dict(**flags, SPLITS=1 if atomic else p.split_k, **tile))
    return p
