"""Stream-K GEMM for `tessera::gemm`: the persistent kernel with its last, partial wave of tiles split in K.

A persistent GEMM of T tiles on P programs runs ceil(T / P) waves; where
T mod P is small the last wave leaves most SMs idle (M = N = 3072 with
128 x 128 tiles: 576 tiles on 132 SMs, 4.36 waves, so 5 waves of time for
4.36 of work). CUTLASS's data-parallel + stream-K hybrid (Osama et al.,
"Stream-K", PPoPP 2023) keeps the full waves data-parallel and splits only
the remainder, `sk_tiles` tiles at the end of the grouped order, in
K steps: their sk_tiles x k_steps multiply-accumulate iterations are cut
into P equal, contiguous ranges, one per program, which may start and end
inside a tile. Every program then does the same work, DP waves plus its
range (4 waves + 18 of 48 K steps at 3072^3).

A program that covers only part of a tile's K writes its float32 partial
to its own workspace slot (two per program: the tile its range starts in,
the tile it ends in) and bumps the tile's arrival counter, an acquire-release
atomic at GPU scope after a barrier (so it publishes every thread's stores of
the slot). The program that arrives last, known by the counter's old value,
sums every contributor's partial in program order (= K order: the same
float32 additions whoever arrives last, so C's bits do not depend on the
schedule), applies the epilogue (`gemm_epilogue.py`), stores the tile and
sets the counter back to 0 for the next launch. Nobody waits for anybody, so
no schedule can deadlock, and no second launch or memset is needed. This is
the decode attention's in-launch merge (`attention_split_kv.py`) applied to
GEMM tiles. A range that covers a whole tile stores it directly.

The op (`gemm.py`) launches it where `stream_k_plan` (the wave model below)
says it pays, or where $TESSERA_GEMM_STREAM_K forces it; the tile comes from
`gemm_configs.json` ("stream_k"). The counters (`arrival_counters`) are
zeroed once per device, stream and size; the workspace is fresh per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

import tessera

from . import gemm_configs
from .gemm import gemm_tile, grouped_tile
from .gemm_alignment import NOTHING_STATED, operand_alignment, pointers_aligned, state_alignment
from .gemm_epilogue import epilogue

# $TESSERA_GEMM_STREAM_K: "1" always (where a persistent grid has a partial last wave), "0" never, unset or
# "auto" where the model says it pays and the shipped entry has been measured (`gemm_configs.STREAM_K`).
STREAM_K_ENV = "TESSERA_GEMM_STREAM_K"


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
               HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN):
    """C[pid_m, pid_n] = the epilogue (`gemm_epilogue.py`) of the tile's float32 sum `acc`."""
    acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                   HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.kernel
def gemm_stream_k_kernel(a_ptr, b_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, partial_ptr, counter_ptr,
                         M, N, K, alpha, stride_am, stride_ak, stride_bk, stride_bn, sk_tiles,
                         HAS_BIAS: tessera.constexpr, HAS_SCALE_A: tessera.constexpr,
                         HAS_SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                         BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                         GROUP_M: tessera.constexpr, STAGES: tessera.constexpr,
                         ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True):
    """`gemm.gemm_kernel`'s GEMM, persistent: the first tiles - sk_tiles tiles (grouped order) one program each,
    num_programs apart, then the last sk_tiles split in K steps over all programs (see the module docstring).
    partial_ptr: float32 [2 * num_programs * BM, BN]; counter_ptr: int32 [sk_tiles], 0 before and after."""
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
        gemm_tile(a, b, c, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, K, alpha, pid_m, pid_n,
                  HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN, BK, STAGES, False)

    # stream-K: iterations start .. end - 1 of the sk_tiles * k_steps, tile t's steps t * k_steps ..
    k_steps = tessera.cdiv(K, BK)
    total = sk_tiles * k_steps
    per_program = tessera.cdiv(total, programs)
    start = min(program * per_program, total)
    end = min(start + per_program, total)
    first = start // k_steps
    partials = tessera.view(partial_ptr, (2 * programs * BM, BN))
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
                       HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN)
        else:
            partials.block((BM, BN), (slot_of(program, t, per_program, k_steps), 0)).store(acc)
            # acquire-release at GPU scope, after a barrier: publishes this program's partial and, for the last
            # contributor to arrive, makes every other one's visible before the sum reads them
            contributors = ((t + 1) * k_steps - 1) // per_program - (t * k_steps) // per_program + 1
            if tessera.atomic_add(counter_ptr + t, 1, scope="gpu") == contributors - 1:
                store_tile(c, fixed_order_sum(partials, t, per_program, k_steps, BM, BN), bias_ptr, scale_a_ptr,
                           scale_b_ptr, M, N, alpha, pid_m, pid_n, HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION,
                           BM, BN)
                tessera.store(counter_ptr + t, 0)       # every contributor has counted: 0 for the next launch
        t = t + 1


# With fast math, as the op runs the tiled kernel where the output's precision allows (`gemm._fast_math_allows`).
gemm_stream_k_kernel_fast = tessera.kernel(fast_math=True)(gemm_stream_k_kernel.fn)
