"""GEMM with user functions fused in: C = epilogue(prologue_a(A) @ prologue_b(B), operands...).

The kernel is the library GEMM's (`gemm.py`: grouped tile order, a pipelined
K loop into a float32 accumulator), with three hooks that are `@tessera.func`
helpers passed as constexprs and inlined where they apply:

* `PROLOGUE_A(a_block, *operands)` / `PROLOGUE_B(b_block, *operands)` on
  every BM x BK block of op(A) / BK x BN block of op(B) as it is loaded
  (scaling, dequantizing integer codes), before the tensor cores see it;
* `EPILOGUE(acc, *operands)` on the float32 BM x BN accumulator, returning
  the tile to store in C, or a tuple (C's tile, then one per extra output).

Operands come in fixed slots, placed in each hook's argument list by a
constexpr order: six tensor slots (X0..X5), each a strided 2-D view that
broadcasts against the hook's matrix (size-1 dimensions have stride 0) and
arrives as the block matching the hook's tile (float ones in float32);
four scalar slots (S0..S3); and the tile's global row and column indices
(`rows` (R, 1), `cols` (1, C), int32) for hooks that ask by parameter name.
GATHER_A reads row `idx[m]` of A for output row m (a gathered A takes
pointer loads, which the pipeline does not stream: its K loop is plain).
ALIGN and PIPELINED are the plain GEMM's (`gemm_alignment.py`): what the op
checked the sizes and strides are multiples of, and whether both operands'
rows start 16-byte aligned (else the K loop is plain rather than a pipeline
the compiler would have to refuse).
`gemm_fusion.py` checks the user's functions and operands and launches this.

The main loop and tiles are the plain GEMM's (same configs, prune and model,
so the same plan for a shape, less the tiles too large for a prologue, and for
an epilogue where the untimed model cannot compile to check); the epilogue runs on EPILOGUE_COLUMNS-wide
column slices of the accumulator, each stored when done, so that what it
computes never holds more than a slice beside the accumulator.
"""

from __future__ import annotations

import tessera

from . import gemm_configs
from .gemm_alignment import NOTHING_STATED, state_alignment
from .gemm_tiles import for_each_tile

ROLES = ("epilogue", "prologue_a", "prologue_b")
# The epilogue's slice width (EPI_BN): a thread holds 8 accumulator elements of a 128-row slice on 8 warps (of a
# 64-row one on 4), so the temporaries of a heavy epilogue fit beside the accumulator. Measured with ptxas 13.0
# on sm_90a, 128 x 128 tile, bench/fusion.py's bias + GELU + residual + dropout epilogue: the whole tile at
# once takes 255 registers and spills ~1 KB; slices of 64 / 32 / 16 columns take 174 / 166 / 124 registers
# without spills, and only 16 leaves room for two programs per SM, as the plain GEMM (90 registers) has.
EPILOGUE_COLUMNS = 16
MAX_CUTS = 4            # column_slices halves a tile at most this often (16 slices)


@tessera.func
def operand_block(ptr, rows, cols, stride_r, stride_c, FULL_R, FULL_C, i, j, BR, BC):
    """Block (i, j) of an operand broadcast against a rows x cols matrix: a BR x BC block, or 1 along each
    dimension it broadcasts over; float operands in float32."""
    view = tessera.view(ptr, (rows if FULL_R else 1, cols if FULL_C else 1), (stride_r, stride_c))
    block = view.block((BR if FULL_R else 1, BC if FULL_C else 1), (i if FULL_R else 0, j if FULL_C else 0)).load()
    if block.dtype.is_float:
        block = block.to(tessera.f32)
    return block


@tessera.func
def role_operands(ptrs, strides, SPECS, ROLE, rows, cols, i, j, BR, BC):
    """The loaded blocks of the tensor slots whose spec names ROLE (0 for the others), one per slot."""
    blocks = ()
    for s in tessera.static_range(len(SPECS)):
        spec = SPECS[s]
        if spec is None:
            blocks = blocks + (0,)
        elif spec[0] != ROLE:
            blocks = blocks + (0,)
        else:
            blocks = blocks + (operand_block(ptrs[s], rows, cols, strides[2 * s], strides[2 * s + 1],
                                             spec[1], spec[2], i, j, BR, BC),)
    return blocks


@tessera.func
def call_hook(HOOK, first, values, ORDER):
    """HOOK(first, values[ORDER[0]], values[ORDER[1]], ...): the hook's arguments in its parameters' order."""
    picked = ()
    for p in tessera.static_range(len(ORDER)):
        picked = picked + (values[ORDER[p]],)
    return HOOK(first, *picked)


@tessera.func
def index_tiles(i, j, BR, BC):
    """Global (row, column) indices of block (i, j): an (BR, 1) and a (1, BC) int32 tile."""
    return (i * BR + tessera.arange(0, BR))[:, None], (j * BC + tessera.arange(0, BC))[None, :]


@tessera.func
def fused_tile(pid_m, pid_n, a, b, c, outs, ptrs, strides, scalars, gather_ptr, M, N, K, stride_am, stride_ak,
               EPILOGUE, EP_ORDER, PROLOGUE_A, PA_ORDER, PROLOGUE_B, PB_ORDER, SPECS, N_OUT, GATHER_A,
               BM, BN, BK, STAGES, WS, EPI_BN, CLUSTER_M=1, CLUSTER_N=1):
    """One BM x BN tile of C with the hooks applied (CLUSTER_M / CLUSTER_N > 1: B's / A's block multicast, as in
    `gemm.gemm_tile`)."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=1 if GATHER_A else STAGES, warp_specialize=WS):
        if GATHER_A:
            a_block = gathered_block(a, gather_ptr, M, K, stride_am, stride_ak, pid_m, k, BM, BK)
        else:
            a_block = a.block((BM, BK), (pid_m, k)).load(multicast=CLUSTER_N > 1)
        b_block = b.block((BK, BN), (k, pid_n)).load(multicast=CLUSTER_M > 1)
        if PROLOGUE_A is not None:
            rows, ks = index_tiles(pid_m, k, BM, BK)
            values = role_operands(ptrs, strides, SPECS, "prologue_a", M, K, pid_m, k, BM, BK)
            a_block = call_hook(PROLOGUE_A, a_block, values + scalars + (rows, ks), PA_ORDER)
        if PROLOGUE_B is not None:
            ks, cols = index_tiles(k, pid_n, BK, BN)
            values = role_operands(ptrs, strides, SPECS, "prologue_b", K, N, k, pid_n, BK, BN)
            b_block = call_hook(PROLOGUE_B, b_block, values + scalars + (ks, cols), PB_ORDER)
        acc = tessera.dot(a_block, b_block, acc)
    if EPILOGUE is None:
        store_outputs(c, outs, (acc,), 0, pid_m, pid_n, BM, BN)
    else:       # EPI_BN columns at a time (`column_slices`), each slice stored as soon as it is computed
        slices = column_slices(acc, BN // EPI_BN if BN > EPI_BN else 1)
        width = BN // len(slices)
        for j in tessera.static_range(len(slices)):
            col_block = pid_n * len(slices) + j
            rows, cols = index_tiles(pid_m, col_block, BM, width)
            values = role_operands(ptrs, strides, SPECS, "epilogue", M, N, pid_m, col_block, BM, width)
            result = call_hook(EPILOGUE, slices[j], values + scalars + (rows, cols), EP_ORDER)
            store_outputs(c, outs, (result,) if N_OUT == 0 else result, N_OUT, pid_m, col_block, BM, width)


@tessera.func
def column_slices(acc, PIECES):
    """acc's columns cut into PIECES equal slices, left to right (PIECES a power of two, at most 2**MAX_CUTS).
    Each cut is a reshape, permute and `split` that layout inference keeps in registers: a thread's elements
    of a slice are some of its accumulator registers, so cutting moves no data."""
    slices = (acc,)
    for _ in tessera.static_range(MAX_CUTS):
        if len(slices) < PIECES:
            halves = ()
            for s in tessera.static_range(len(slices)):
                rows, width = slices[s].shape
                left, right = tessera.split(slices[s].reshape((rows, 2, width // 2)).permute((0, 2, 1)))
                halves = halves + (left, right)
            slices = halves
    tessera.static_assert(len(slices) == PIECES, "column_slices cuts into a power of two of slices")
    return slices


@tessera.func
def store_outputs(c, outs, results, N_OUT, pid_m, pid_n, BR, BC):
    """Store the epilogue's tiles (C's, then one per extra output) as block (pid_m, pid_n) of BR x BC."""
    tessera.static_assert(len(results) == N_OUT + 1, "the epilogue must return one tile per output: C's, then "
                          "one per epilogue_outputs tensor")
    for o in tessera.static_range(N_OUT + 1):
        tessera.static_assert(results[o].shape == (BR, BC), "the epilogue must return tiles shaped like the "
                              "accumulator it was given (each output's tile), not reduced or reshaped ones")
        if o == 0:
            c.block((BR, BC), (pid_m, pid_n)).store(results[0])
        else:
            outs[o - 1].block((BR, BC), (pid_m, pid_n)).store(results[o])


@tessera.func
def gathered_block(a, gather_ptr, M, K, stride_am, stride_ak, pid_m, k, BM, BK):
    """The BM x BK block of A at K-step k whose row m is A's row idx[m] (rows past M and columns past K: 0)."""
    idx = tessera.view(gather_ptr, (M,)).block((BM,), (pid_m,)).load()
    cols = k * BK + tessera.arange(0, BK)
    mask = ((pid_m * BM + tessera.arange(0, BM)) < M)[:, None] & (cols < K)[None, :]
    offsets = idx.to(tessera.i64)[:, None] * stride_am + cols.to(tessera.i64)[None, :] * stride_ak
    return tessera.load(a + offsets, mask=mask)


# A prologue transforms each block in registers before the dot, which then reads it from there: the code grows with
# the tile, and past 128 x 128 it outgrows what LLVM compiles in seconds (sm_90a, bench/fusion.py's int8 dequant:
# ~16.8k instructions a thread at 128 x 256, ~15.7k at 256 x 128, against the compiler's 12,288 limit).
MAX_PROLOGUE_TILE = 128 * 128
# An epilogue's code grows with the tile too (every accumulator element a thread holds goes through it), but how
# fast depends on the user's function: on sm_90a, 8 warps (compiler's estimate per thread; limit 12,288), the
# plain store 640 at 128 x 128 / 1,248 at 128 x 256, a scale-and-add ~3.1k / ~7.2k, an erf GELU ~5.3k / ~11.7k
# (fits), bench/fusion.py's tanh GELU + residual + Philox dropout ~10.8k / ~22.4k (the 128 x 256 tiles, persistent
# warp-specialized included, do not compile). Tuning compiles every config and drops those that do not compile,
# so it keeps 128 x 256 for the epilogues that fit; the untimed model, which compiles nothing, stays within this.
MAX_MODEL_EPILOGUE_TILE = 128 * 128


def prune_fused(configs: list[tessera.Config], named_args: dict) -> list[tessera.Config]:
    """The autotuner's prune hook: the plain GEMM's (`gemm_configs.prune_for_device`), less the tiles over
    `MAX_PROLOGUE_TILE` elements when a prologue hook is set, so that neither tuning nor the untimed model
    (inside `tessera.fusion()` or a CUDA graph capture, where nothing is compiled ahead to prune by) picks a tile
    that does not compile."""
    kept = gemm_configs.prune_for_device(configs, named_args)
    if named_args.get("PROLOGUE_A") is None and named_args.get("PROLOGUE_B") is None:
        return kept
    return [c for c in kept if c.kwargs["BM"] * c.kwargs["BN"] <= MAX_PROLOGUE_TILE]


def predicted_fused(configs: list[tessera.Config], named_args: dict) -> tessera.Config:
    """The autotuner's model: the plain GEMM's (`gemm_configs.predicted`, so without hooks the same config for
    every shape), over the tiles up to `MAX_MODEL_EPILOGUE_TILE` elements when an epilogue hook is set: the model
    runs where nothing may be compiled to see whether the user's epilogue fits a larger tile, and at 128 x 128
    a heavy one (bench/fusion.py's) still does."""
    if named_args.get("EPILOGUE") is not None:
        configs = [c for c in configs if c.kwargs["BM"] * c.kwargs["BN"] <= MAX_MODEL_EPILOGUE_TILE] or configs
    return gemm_configs.predicted(configs, named_args)


# The plain GEMM's configs (`gemm.gemm_kernel`), its prune and model with the hooks' limits (`prune_fused`,
# `predicted_fused`): on an H100 the fused kernel tunes over the same tiles, 128 x 256 included (without a
# prologue), and `gemm.pin_config` pins both.
@tessera.autotune(configs=gemm_configs.ALL, key=["M", "N", "K"], prune=prune_fused, model=predicted_fused)
@tessera.kernel
def gemm_fused_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, x0, x1, x2, x3, x4, x5,
                      sx0r, sx0c, sx1r, sx1c, sx2r, sx2c, sx3r, sx3c, sx4r, sx4c, sx5r, sx5c,
                      s0, s1, s2, s3, y0, y1, sy0r, sy0c, sy1r, sy1c, gather_ptr,
                      EPILOGUE: tessera.constexpr, EP_ORDER: tessera.constexpr,
                      PROLOGUE_A: tessera.constexpr, PA_ORDER: tessera.constexpr,
                      PROLOGUE_B: tessera.constexpr, PB_ORDER: tessera.constexpr,
                      SPECS: tessera.constexpr, N_OUT: tessera.constexpr, GATHER_A: tessera.constexpr,
                      BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                      GROUP_M: tessera.constexpr, PERSISTENT: tessera.constexpr, STAGES: tessera.constexpr,
                      WS: tessera.constexpr = False, EPI_BN: tessera.constexpr = EPILOGUE_COLUMNS,
                      ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True,
                      CLUSTER_M: tessera.constexpr = 1, CLUSTER_N: tessera.constexpr = 1):
    # what the op checked of the sizes and strides, and whether the rows allow a pipeline (`gemm_alignment.py`)
    state_alignment(M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ALIGN)
    STAGES = STAGES if PIPELINED else 1
    WS = WS and PIPELINED and not GATHER_A      # a gathered A's K loop is plain (below): no ring to fill
    # clusters of CLUSTER_M (CLUSTER_N) programs sharing B's (A's) blocks, as in `gemm.gemm_kernel` (persistent too)
    tessera.cluster_dims(CLUSTER_M * CLUSTER_N)
    if GATHER_A:        # row m of op(A) is a_ptr's row idx[m]: pointer arithmetic from the base
        a = a_ptr
    else:
        a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    c = tessera.view(c_ptr, (M, N), (stride_cm, stride_cn))
    outs = (tessera.view(y0, (M, N), (sy0r, sy0c)), tessera.view(y1, (M, N), (sy1r, sy1c)))
    ptrs = (x0, x1, x2, x3, x4, x5)
    strides = (sx0r, sx0c, sx1r, sx1c, sx2r, sx2c, sx3r, sx3c, sx4r, sx4c, sx5r, sx5c)
    scalars = (s0, s1, s2, s3)
    num_pid_m = tessera.cdiv(M, BM)
    num_pid_n = tessera.cdiv(N, BN)
    # the plain GEMM's tile walk (`gemm_tiles.for_each_tile`): one tile, every num_programs-th, or cluster-tiles
    for_each_tile(fused_tile, (a, b, c, outs, ptrs, strides, scalars, gather_ptr, M, N, K, stride_am, stride_ak,
                               EPILOGUE, EP_ORDER, PROLOGUE_A, PA_ORDER, PROLOGUE_B, PB_ORDER, SPECS, N_OUT,
                               GATHER_A, BM, BN, BK, STAGES, WS, EPI_BN, CLUSTER_M, CLUSTER_N),
                  num_pid_m, num_pid_n, GROUP_M, PERSISTENT, CLUSTER_M, CLUSTER_N)


# The same kernel compiled with `fast_math=True` (fma contraction, approximate exp2 and division), which the op
# runs where every output is float16 / bfloat16, whose rounding hides the difference (as `gemm.gemm_kernel_fast`):
# bench/fusion.py's epilogue loses its exact division's slow-path check per element (FCHK, a call and a branch),
# 15% of its sm_90a instructions.
gemm_fused_kernel_fast = tessera.autotune(configs=gemm_configs.ALL, key=["M", "N", "K"], prune=prune_fused,
                                          model=predicted_fused)(
    tessera.kernel(fast_math=True)(gemm_fused_kernel.kernel.fn))
