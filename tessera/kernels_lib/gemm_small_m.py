"""The small-M (decode) path of `tessera::gemm`: M <= 64 rows, B streamed once by programs that split K.

With M <= 64 the GEMM moves K x N elements of B for 2 M N K flops: it is
bound by memory bandwidth, and the tiled kernel, one program per BM x BN
tile of C, launches only cdiv(N, BN) programs (64 for N = 4096), half an
H100, each walking all of K. Here one program owns one BN-column strip of C
(all M rows in one BM-row tile, BM = 16, 32 or 64) and one contiguous slice
of K, so B is read exactly once and every program streams its own slice
through a STAGES-deep ring:

* SPLIT_K == 1: the program has all of K and applies the epilogue itself;
* SPLIT_K > 1, deterministic (the default): each split writes its float32
  partial tile to a workspace [SPLIT_K * BM, N]; `gemm_small_m_reduce_kernel`
  sums the splits in split order (the same bits on every run), applies the
  epilogue and stores C;
* SPLIT_K > 1 with ATOMIC: the splits add into one zeroed float32 [BM, N]
  with atomics (less workspace, but the sum's order, so its last bits, vary
  run to run), and the reduce kernel applies the epilogue to it.

`plan` picks the tile config (`gemm_configs.json`, "small_m") and the split
count from a bandwidth model (see there). The kernels use only tile-level
ops, so the dot runs on whatever the target has: mma.sync on sm_80/sm_89 (and
on sm_90a for BM < 64), wgmma on sm_90a for BM = 64, MFMA on gfx942.
"""

from __future__ import annotations

from dataclasses import dataclass

import tessera

from . import gemm_configs
from .gemm_epilogue import epilogue

SMALL_M = 64                 # the op takes this path for M <= SMALL_M
ROW_TILES = (16, 32, 64)     # BM: the smallest that holds M (the matrix instructions' M is 16)


@tessera.kernel
def gemm_small_m_kernel(a_ptr, b_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, partial_ptr, M, N, K, alpha,
                        stride_am, stride_ak, stride_bk, stride_bn, steps,
                        HAS_BIAS: tessera.constexpr, HAS_SCALE_A: tessera.constexpr,
                        HAS_SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                        BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                        STAGES: tessera.constexpr, SPLIT_K: tessera.constexpr, ATOMIC: tessera.constexpr):
    """Program (pid_n, split): rows 0..BM-1, columns pid_n * BN.., K steps split * steps .. (split + 1) * steps."""
    pid_n, split = tessera.program_id(0), tessera.program_id(1)
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    first = split * steps
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for k in tessera.pipeline(first, min(first + steps, tessera.cdiv(K, BK)), stages=STAGES):
        acc = tessera.dot(a.block((BM, BK), (0, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    if SPLIT_K == 1:
        acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, 0, pid_n,
                       HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN)
        tessera.view(c_ptr, (M, N)).block((BM, BN), (0, pid_n)).store(acc)
    elif ATOMIC:        # one shared [BM, N] float32 sum (zeroed by the caller)
        rows = tessera.arange(0, BM)[:, None]
        cols = pid_n * BN + tessera.arange(0, BN)[None, :]
        tessera.atomic_add(partial_ptr + rows * N + cols, acc, mask=(rows < M) & (cols < N))
    else:               # this split's rows of the [SPLIT_K * BM, N] workspace
        tessera.view(partial_ptr, (SPLIT_K * BM, N)).block((BM, BN), (split, pid_n)).store(acc)


@tessera.kernel
def gemm_small_m_reduce_kernel(partial_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, M, N, alpha,
                               HAS_BIAS: tessera.constexpr, HAS_SCALE_A: tessera.constexpr,
                               HAS_SCALE_B: tessera.constexpr, ACTIVATION: tessera.constexpr,
                               BM: tessera.constexpr, BN: tessera.constexpr, SPLITS: tessera.constexpr):
    """C[:, pid_n] = epilogue(sum of the SPLITS partial tiles, in split order)."""
    pid_n = tessera.program_id(0)
    partials = tessera.view(partial_ptr, (SPLITS * BM, N))
    acc = partials.block((BM, BN), (0, pid_n)).load()
    for split in range(1, SPLITS):
        acc = acc + partials.block((BM, BN), (split, pid_n)).load()
    acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, 0, pid_n,
                   HAS_BIAS, HAS_SCALE_A, HAS_SCALE_B, ACTIVATION, BM, BN)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (0, pid_n)).store(acc)


# The same kernels with fast math (fma contraction, approximate exp2 and division), which the op runs where
# the output's precision allows (`gemm._fast_math_allows`), as for the tiled kernel.
gemm_small_m_kernel_fast = tessera.kernel(fast_math=True)(gemm_small_m_kernel.fn)
gemm_small_m_reduce_kernel_fast = tessera.kernel(fast_math=True)(gemm_small_m_reduce_kernel.fn)


# ---------------------------------------------------------------------------
# The launch plan: a bandwidth model

# Bytes of B each program may keep in flight: STAGES - 1 ring slots of BK x BN. An H100 streams ~3.35 TB/s
# with ~0.8 us of DRAM latency, so ~2.7 MB must be in flight, ~20 KB per SM (Little's law): one program per SM
# with two or three 16 KB slots in flight covers it, so the split count aims at one program per SM.
PARTIAL_TRAFFIC = 8          # the workspace (each partial written once, read once) stays <= 1/8 of B's bytes


@dataclass(frozen=True)
class SmallMPlan:
    """One small-M launch: the tile (BM x BN, BK deep, STAGES ring slots), warps, and how K is split."""

    BM: int
    BN: int
    BK: int
    STAGES: int
    num_warps: int
    split_k: int         # programs per BN-column strip, each with a contiguous slice of K
    steps: int           # K steps (of BK) per split; the last split may have fewer


def row_tile(M: int) -> int:
    """BM: the smallest of ROW_TILES that holds M rows."""
    if not 1 <= M <= SMALL_M:
        raise ValueError(f"tessera::gemm small-M path: M = {M} is not in 1..{SMALL_M}; larger M uses the tiled "
                         f"kernel (gemm.gemm_kernel)")
    return next(bm for bm in ROW_TILES if bm >= M)


def split_count(M: int, N: int, K: int, element_bytes: int, num_sms: int, BM: int, BN: int, BK: int,
                STAGES: int) -> int:
    """How many programs split K: enough that the cdiv(N, BN) column strips times the splits give every SM a
    program (each reading a contiguous K slice of B, so B is read once, at full bandwidth), but no more than
    keeps the partial sums' traffic (2 * splits * BM * N * 4 bytes) under 1/PARTIAL_TRAFFIC of B's K * N *
    element_bytes, and no more than leaves each split STAGES K steps (a full ring)."""
    strips = tessera.cdiv(N, BN)
    k_steps = tessera.cdiv(K, BK)
    cover = tessera.cdiv(num_sms, strips)
    traffic = K * element_bytes // (PARTIAL_TRAFFIC * 2 * BM * 4)
    ring = k_steps // STAGES
    return max(1, min(cover, traffic, ring))


def plan(M: int, N: int, K: int, element_bytes: int, num_sms: int, config: dict | None = None) -> SmallMPlan:
    """The tile config for M's row tile (`gemm_configs.SMALL_M`, or `config`: {"BN", "K_BYTES", "STAGES",
    "num_warps"}) and the split count (`split_count`), made even: every split gets a whole, non-empty slice."""
    BM = row_tile(M)
    tile = config or gemm_configs.SMALL_M[BM]
    BN, BK, STAGES = tile["BN"], max(16, tile["K_BYTES"] // element_bytes), tile["STAGES"]
    k_steps = max(1, tessera.cdiv(K, BK))
    split = split_count(M, N, K, element_bytes, num_sms, BM, BN, BK, STAGES)
    steps = tessera.cdiv(k_steps, split)
    return SmallMPlan(BM, BN, BK, STAGES, tile["num_warps"], tessera.cdiv(k_steps, steps), steps)


# ---------------------------------------------------------------------------
# The launch


def launch(args: tuple, M: int, N: int, K: int, element_bytes: int, num_sms: int, flags: dict, device, *,
           config: dict | None = None, fast: bool = False, atomic: bool = False) -> SmallMPlan:
    """Compute C = op(A) @ op(B) with the epilogue on the small-M path; return the plan it ran.

    `args` are `gemm.gemm_kernel`'s 14 arguments (C at index 5), already host arrays for the interpreter;
    `flags` its HAS_BIAS / HAS_SCALE_A / HAS_SCALE_B / ACTIVATION. `config` overrides the shipped tile (the
    interpreter's small one); `atomic` sums the splits with
    atomics instead of the deterministic workspace; `fast` runs the fast-math compilations."""
    import torch

    p = plan(M, N, K, element_bytes, num_sms, config)
    c, (bias, scale_a, scale_b), alpha = args[5], args[2:5], args[9]
    atomic = atomic and p.split_k > 1
    if p.split_k == 1:
        partials = c                    # unused: the one split writes C itself
    elif atomic:
        partials = torch.zeros((p.BM, N), dtype=torch.float32, device=device)
    else:
        partials = torch.empty((p.split_k * p.BM, N), dtype=torch.float32, device=device)
    strips = tessera.cdiv(N, p.BN)
    tile = dict(BM=p.BM, BN=p.BN, num_warps=p.num_warps)
    main = gemm_small_m_kernel_fast if fast else gemm_small_m_kernel
    main[(strips, p.split_k)](*args[:6], partials, *args[6:], p.steps, **flags, BK=p.BK, STAGES=p.STAGES,
                              SPLIT_K=p.split_k, ATOMIC=atomic, **tile)
    if p.split_k > 1:
        reduce = gemm_small_m_reduce_kernel_fast if fast else gemm_small_m_reduce_kernel
        reduce[(strips,)](partials, bias, scale_a, scale_b, c, M, N, alpha, **flags,
                          SPLITS=1 if atomic else p.split_k, **tile)
    return p
