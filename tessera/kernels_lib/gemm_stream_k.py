"""Stream-K GEMM for `tessera::gemm`: the persistent kernel with its last, partial wave of tiles split in K.

A persistent GEMM of T tiles on P programs runs ceil(T / P) waves; where
T mod P is small the last wave leaves most SMs idle (M = N = 3072 with
128 x 128 tiles: 576 tiles on 132 SMs, 4.36 waves, so 5 waves of time for
4.36 of work). CUTLASS's data-parallel + stream-K hybrid (Osama et al.,
"Stream-K", PPoPP 2023) keeps the full waves data-parallel and splits only
the rest, `sk_tiles` tiles at the end of the grouped order (the partial
wave, or it and the wave before: `stream_k_tiles`), in K steps: their
sk_tiles x k_steps multiply-accumulate iterations are cut into P equal,
contiguous ranges, one per program, which may start and end inside a tile.
Every program then does the same work, DP waves plus its range (3072^3:
3 waves + 66 of 48-step tiles' K steps, against 5 waves).

A program that covers only part of a tile's K writes its float32 partial
to its own workspace slot (two per program: the tile its range starts in,
the tile it ends in) and bumps the tile's arrival counter, an acquire-release
atomic at GPU scope after a barrier (so it publishes every thread's stores of
the slot; on sm_90a the slot and C leave by TMA stores, the partial's
completed by the full bulk wait before the counter: `schedule/tma_store.py`).
The program that arrives last, known by the counter's old value, sums every
contributor's partial in program order (= K order: the same
float32 additions whoever arrives last, so C's bits do not depend on the
schedule), applies the epilogue (`gemm_epilogue.py`), stores the tile and
sets the counter back to 0 for the next launch. Nobody waits for anybody, so
no schedule can deadlock, and no second launch or memset is needed. This is
the decode attention's in-launch merge (`attention_split_kv.py`) applied to
GEMM tiles. A range that covers a whole tile stores it directly.

The op (`gemm.py`) launches it where `stream_k_plan` (the wave model below)
says it pays, or where $TESSERA_GEMM_STREAM_K forces it; the tile comes from
`gemm_configs.json` ("stream_k"), on AMD with no more stages than the target's
LDS holds (`gemm_configs.stream_k_tile`: 2 on gfx942, whose two K loops share
one 64 KiB ring; gfx950 keeps 3). The counters (`arrival_counters`) are
zeroed once per device and stream; the workspace is fresh per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

import tessera

from . import gemm_configs, gpus
from .gemm import STREAM_K_ENV, gemm_tile, grouped_tile
from .gemm_alignment import NOTHING_STATED, operand_alignment, pointers_aligned, state_alignment
from .gemm_epilogue import epilogue


@tessera.func
def k_range(a, b, pid_m, pid_n, k0, k1, BM, BN, BK, STAGES):
    """A[pid_m, k0:k1] @ B[k0:k1, pid_n] in float32 (K steps of BK), streamed through a STAGES-deep ring."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(k0, k1, stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    return acc


@tessera.func
def slot_of(program, tile, per_program, k_steps):
    """Workspace slot of `program`'s partial of stream-K tile `tile`: 2 * program for the tile its range starts
    in, 2 * program + 1 for the tile it ends in."""
    return 2 * program + tessera.where(tile == (program * per_program) // k_steps, 0, 1)


@tessera.func
def fixed_order_sum(partials, tile, per_program, k_steps, BM, BN):
    """The sum of stream-K tile `tile`'s partials, contributor by contributor in program (= K) order."""
    first = (tile * k_steps) // per_program                     # the program whose range holds its first step
    last = ((tile + 1) * k_steps - 1) // per_program            # ... and its last
    acc = partials.block((BM, BN), (slot_of(first, tile, per_program, k_steps), 0)).load()
    for q in range(first + 1, last + 1):
        acc = acc + partials.block((BM, BN), (slot_of(q, tile, per_program, k_steps), 0)).load()
    return acc


@tessera.func
def store_tile(c, acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
               HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN):
    """C[pid_m, pid_n] = the epilogue (`gemm_epilogue.py`) of the tile's float32 sum `acc`."""
    acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                   HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.kernel
def gemm_stream_k_kernel(a_ptr, b_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, partial_ptr, counter_ptr,
                         M, N, K, alpha, stride_am, stride_ak, stride_bk, stride_bn, partial_rows, sk_tiles,
                         HAS_BIAS: tessera.constexpr, SCALE_A: tessera.constexpr,
                         SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                         BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                         GROUP_M: tessera.constexpr, STAGES: tessera.constexpr,
                         ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True):
    """`gemm.gemm_kernel`'s GEMM, persistent: the first tiles - sk_tiles tiles (grouped order) one program each,
    num_programs apart, then the last sk_tiles split in K steps over all programs (see the module docstring).
    partial_ptr: float32 [partial_rows = 2 * num_programs * BM, BN] (the rows an argument, so that the host can
    build the partials' TMA store map); counter_ptr: int32 [sk_tiles], 0 before and after."""
    state_alignment(M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ALIGN)
    STAGES = STAGES if PIPELINED else 1
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    c = tessera.view(c_ptr, (M, N))
    num_pid_m, num_pid_n = tessera.cdiv(M, BM), tessera.cdiv(N, BN)
    program, programs = tessera.program_id(0), tessera.num_programs(0)
    dp_tiles = num_pid_m * num_pid_n - sk_tiles
    for tile in range(program, dp_tiles, programs):             # data-parallel: whole tiles
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        gemm_tile(pid_m, pid_n, a, b, c, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, K, alpha,
                  HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN, BK, STAGES, False)

    # stream-K: iterations start .. end - 1 of the sk_tiles * k_steps, tile t's steps t * k_steps ..
    k_steps = tessera.cdiv(K, BK)
    total = sk_tiles * k_steps
    per_program = tessera.cdiv(total, programs)
    start = min(program * per_program, total)
    end = min(start + per_program, total)
    first = start // k_steps
    partials = tessera.view(partial_ptr, (partial_rows, BN))
    stop = tessera.where(start < end, tessera.cdiv(end, k_steps), first)       # past the last tile it touches
    t = first
    # a `while`, not a `for`: the index math of the partial, the sum and the epilogue is recomputed in it rather
    # than hoisted to the kernel's start and kept live through the data-parallel tiles
    # (`passes/rematerialize_index.py`; as a `for` it took 236 registers on sm_90a and spilled on sm_80)
    while t < stop:
        k0 = max(start - t * k_steps, 0)
        k1 = min(end - t * k_steps, k_steps)
        pid_m, pid_n = grouped_tile(dp_tiles + t, num_pid_m, num_pid_n, GROUP_M)
        acc = k_range(a, b, pid_m, pid_n, k0, k1, BM, BN, BK, STAGES)
        if (k0 == 0) & (k1 == k_steps):                        # the whole tile: no one to meet
            store_tile(c, acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                       HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN)
        else:
            partials.block((BM, BN), (slot_of(program, t, per_program, k_steps), 0)).store(acc)
            # acquire-release at GPU scope, after a barrier: publishes this program's partial and, for the last
            # contributor to arrive, makes every other one's visible before the sum reads them
            contributors = ((t + 1) * k_steps - 1) // per_program - (t * k_steps) // per_program + 1
            if tessera.atomic_add(counter_ptr + t, 1, scope="gpu") == contributors - 1:
                store_tile(c, fixed_order_sum(partials, t, per_program, k_steps, BM, BN), bias_ptr, scale_a_ptr,
                           scale_b_ptr, M, N, alpha, pid_m, pid_n, HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION,
                           BM, BN)
                tessera.store(counter_ptr + t, 0)       # every contributor has counted: 0 for the next launch
        t = t + 1


# With fast math, as the op runs the tiled kernel where the output's precision allows (`gemm._fast_math_allows`).
gemm_stream_k_kernel_fast = tessera.kernel(fast_math=True)(gemm_stream_k_kernel.fn)


# ---------------------------------------------------------------------------
# The plan: when stream K pays, by a wave model

@dataclass(frozen=True)
class StreamKPlan:
    """One stream-K launch: the tile (BM x BN, BK deep, STAGES ring slots, GROUP_M), warps, the programs (one per
    SM) and how many tiles, the last of the grouped order, are split in K steps over them."""

    BM: int
    BN: int
    BK: int
    GROUP_M: int
    STAGES: int
    num_warps: int
    programs: int
    sk_tiles: int


# The wave model (`modelled`), in microseconds of one SM (CU) of the GPU's row in `gpus.py`: its dense 16-bit
# matrix rate under load (`Gpu.sm_tflops`: the H100 SXM's 989 TFLOP/s / 132 SMs at ~70%) and its traffic to and
# from L2 (`Gpu.sm_gbps`, the partials' writes and reads); the ratios between its two times decide.
MARGIN = 0.03            # stream K must model at least 3% faster than the data-parallel persistent kernel


class Waves(NamedTuple):
    """The wave model's times for one shape, in microseconds (`modelled`)."""

    data_parallel: float     # ceil(tiles / programs) waves of whole tiles
    stream_k: float          # the full waves, one equal share of the rest's K steps, the partials' traffic


def _tile(config: dict, element_bytes: int) -> tuple[int, int, int, int, int, int]:
    """(BM, BN, BK, GROUP_M, STAGES, num_warps) of a config entry; BK holds K_BYTES of a row, at least 16."""
    return (config["BM"], config["BN"], max(16, config["K_BYTES"] // element_bytes), config.get("GROUP_M", 8),
            config["STAGES"], config["num_warps"])


def stream_k_tiles(tiles: int, programs: int) -> tuple[int, ...]:
    """The stream-K tile counts a plan chooses from (CUTLASS's hybrids): the last, partial wave alone ("DP + one
    tile": each program gets under one tile of K steps, so a tile may have many contributors), or with one more
    wave ("DP + two tiles": each program gets one to two tiles' steps, at most three contributors a tile)."""
    rest = tiles % programs
    return (rest, rest + programs) if tiles >= rest + programs else (rest,)     # (one wave only: split K's)


def modelled(M: int, N: int, K: int, element_bytes: int, programs: int, BM: int, BN: int, BK: int,
             sk_tiles: int | None = None, gpu: gpus.Gpu = gpus.H100_SXM) -> Waves:
    """The wave model of one persistent launch of `programs` programs (one per SM) on `gpu`, `sk_tiles` of its
    tiles stream-K (default: the partial last wave). A K step costs 2 BM BN BK flops at the SM's matrix rate
    (scaled by 2 / element_bytes: fp8 runs twice as fast); data-parallel, every program runs ceil(tiles /
    programs) tiles of k_steps steps. Stream K runs (tiles - sk_tiles) / programs whole tiles, then its share,
    cdiv(sk_tiles * k_steps, programs) steps, and the busiest program writes two float32 partials and reads
    every partial of one tile (cdiv(k_steps, share) + 1 of them) at the SM's L2 rate."""
    tiles, k_steps = tessera.cdiv(M, BM) * tessera.cdiv(N, BN), max(1, tessera.cdiv(K, BK))
    step = 2 * BM * BN * BK / (gpu.sm_tflops * 1e6 * 2 / element_bytes)
    data_parallel = tessera.cdiv(tiles, programs) * k_steps * step
    sk_tiles = tiles % programs if sk_tiles is None else sk_tiles
    if sk_tiles == 0:
        return Waves(data_parallel, data_parallel)
    share = tessera.cdiv(sk_tiles * k_steps, programs)
    partial = BM * BN * 4 / (gpu.sm_gbps * 1e3)
    readers = min(tessera.cdiv(k_steps, share) + 1, programs)
    whole = (tiles - sk_tiles) // programs * k_steps
    return Waves(data_parallel, (whole + share) * step + (2 + readers) * partial)


def stream_k_plan(M: int, N: int, K: int, element_bytes: int, num_sms: int, mode: str = "auto",
                  config: dict | None = None, gpu: gpus.Gpu = gpus.H100_SXM,
                  plans_of: str | None = None) -> StreamKPlan | None:
    """The stream-K plan for this GEMM on `gpu` (the tile GPUs of plan key `plans_of`, default the GPU's own, run:
    `gemm_configs.stream_k_tile`, fitted to an AMD target's LDS; or `config`), or None: the tiled kernel.
    Only grids of more than one wave whose last one is partial (tiles > num_sms, tiles % num_sms > 0) qualify;
    of `stream_k_tiles`' counts the one the wave model (`modelled`, with the GPU's constants) times fastest is
    split. `mode` is $TESSERA_GEMM_STREAM_K: "1" takes every such grid, "0" none, "auto" those the model times
    MARGIN faster than the data-parallel persistent kernel, once a run on GPUs of this plan key has measured the
    stream-K config (`gemm_configs.stream_k_measured`: an NVIDIA run does not vouch for an AMD GPU)."""
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"tessera::gemm: ${STREAM_K_ENV} must be 1 (always stream K where a persistent grid's "
                         f"last wave is partial), 0 (never) or auto, got {mode!r}")
    plans_of = plans_of or gpu.plan_key
    config = config or gemm_configs.stream_k_tile(plans_of)
    if config is None:                  # (no stream-K tile fits this target's shared memory)
        return None
    BM, BN, BK, GROUP_M, STAGES, num_warps = _tile(config, element_bytes)
    tiles = tessera.cdiv(M, BM) * tessera.cdiv(N, BN)
    if mode == "0" or tiles <= num_sms or tiles % num_sms == 0 or K == 0:
        return None
    if mode == "auto" and not gemm_configs.stream_k_measured(plans_of):
        return None
    times = {sk: modelled(M, N, K, element_bytes, num_sms, BM, BN, BK, sk, gpu)
             for sk in stream_k_tiles(tiles, num_sms)}
    sk_tiles = min(times, key=lambda sk: (times[sk].stream_k, sk))
    if mode == "auto" and times[sk_tiles].stream_k > times[sk_tiles].data_parallel * (1 - MARGIN):
        return None
    return StreamKPlan(BM, BN, BK, GROUP_M, STAGES, num_warps, num_sms, sk_tiles)


# ---------------------------------------------------------------------------
# The launch

_COUNTERS: dict = {}
_RETIRED: list = []          # replaced sets, kept alive


def arrival_counters(device: torch.device, count: int) -> tuple[torch.Tensor, int]:
    """(at least `count` int32 arrival counters, the stream they belong to), zeroed once when made: every launch
    leaves them at 0 (the last contributor of a tile resets its own), so no launch clears them. One set per
    device and stream (two launches on one stream run in order, so they may share it; a CUDA graph that captured
    a launch keeps its set), kept for the process; a larger one replaces a smaller (after the stream's work)."""
    if device.type != "cuda":       # the interpreter: fresh ones, so a run stopped halfway leaves nothing behind
        return torch.zeros(max(count, 1), dtype=torch.int32), 0
    stream = torch.cuda.current_stream(device).cuda_stream
    key = (str(device), stream)
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < count:
        counters = torch.zeros(max(count, 256), dtype=torch.int32, device=device)
        if key in _COUNTERS:
            _RETIRED.append(_COUNTERS[key])     # a recorded plan or a captured graph may still pass the old one
        _COUNTERS[key] = counters
    return counters, stream


def _direct(kernel, grid, args: tuple, kwargs: dict) -> None:
    kernel[grid](*args, **kwargs)


def launch(args: tuple, p: StreamKPlan, M: int, N: int, flags: dict, device, *, element_bytes: int,
           fast: bool = False, launches=None) -> StreamKPlan:
    """Compute C = op(A) @ op(B) with the epilogue by plan `p`; return `p`. `args` are `gemm.gemm_kernel`'s 14
    arguments (C at index 5; host arrays for the interpreter), `flags` its HAS_BIAS / SCALE_A / SCALE_B /
    ACTIVATION; `fast` runs the fast-math compilation; `launches` (the op's `gemm_plan.Direct` or `Recording`)
    launches the kernel and hands it the workspace, and replays it only on this stream (`arrival_counters`)."""
    partials = torch.empty((2 * p.programs * p.BM, p.BN), dtype=torch.float32, device=device)
    if launches is not None:
        partials = launches.workspace(partials, False)
    counters, stream = arrival_counters(device, p.sk_tiles)
    if launches is not None:
        counters = launches.adapt((counters,))[0]
        launches.pin_stream(stream)
    align, pipelined = operand_alignment(M, N, args[8], args[10:14], element_bytes, pointers_aligned(*args[:2]))
    kernel = gemm_stream_k_kernel_fast if fast else gemm_stream_k_kernel
    run = launches.launch if launches is not None else _direct
    run(kernel, (p.programs,), (*args[:6], partials, counters, *args[6:], 2 * p.programs * p.BM, p.sk_tiles),
        dict(**flags, BM=p.BM, BN=p.BN, BK=p.BK, GROUP_M=p.GROUP_M, STAGES=p.STAGES, ALIGN=align,
             PIPELINED=pipelined, num_warps=p.num_warps))
    return p
