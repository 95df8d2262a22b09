"""GEMM with a fused epilogue: C = act(alpha * op(A) @ op(B) * scales + bias).

C is cut into BM x BN tiles. Computing a tile walks K in steps of BK,
multiplying a BM x BK block of op(A) by a BK x BN block of op(B) into a
float32 accumulator, then applies alpha, the bias and the activation and
stores the tile in the output dtype. The K loop is a `tessera.pipeline`:
the blocks of the next STAGES - 1 steps stream into shared memory (cp.async
on sm_80/sm_89, TMA on sm_90/sm_90a) while the tensor cores work on this one
(on sm_90a a slot is refilled once the wgmma group before this step's has
retired). Transposed operands are views with
swapped strides, so nothing is copied; block loads are bounds-checked, so
the sizes need not be multiples of the blocks. The op states what the sizes and
strides are multiples of (ALIGN) and pipelines only operands whose rows
start 16-byte aligned (PIPELINED; `gemm_alignment.py`), so any legal shape
compiles, strict mode included.

Tiles are numbered in grouped order (`grouped_tile`): GROUP_M rows of tiles
at a time, column by column, so programs running together share rows of A
and columns of B in L2. The grid is 1-D: one program per tile, or with
PERSISTENT one program per SM that loops over tiles num_programs apart (on
TMA targets its tiles share the K loop's mbarriers, set up once:
`passes/schedule/persistent.py`; a tile's C leaves by a TMA store that
reads its shared-memory buffer while the next tile's K loop runs:
`passes/schedule/tma_store.py`).
A config with WS = True (sm_90/sm_90a, TMA-filled K loop) warp-specializes
the K loop: a producer warpgroup beyond num_warps issues the TMA loads
(`passes/schedule/warp_specialization.py`); with PERSISTENT too, the
producer walks the program's tiles as well, filling the next tile's stages
while the consumers run this one's epilogue (CUTLASS's cooperative
persistent kernel: `passes/schedule/warp_specialized_tiles.py`). It defaults
to False; the one shipped config that sets it (sm_90, persistent 128 x 256)
is left to the timed autotuner until measured. A config with CLUSTER_M = 2
(sm_90a; with WS, PERSISTENT or both) runs pairs of programs as one thread-block
cluster on the two rows of tiles (pid_m, pid_n) that share B's column
(`cluster_tile`): each loads its own A block and half of the shared B block,
TMA-multicast to both, halving B's L2 -> SM traffic; CLUSTER_N = 2 pairs two
columns of tiles sharing A's rows the same way. Persistent, a cluster walks cluster-tiles
(CUTLASS's persistent cluster kernels): cluster c takes c, c + num_clusters, ..., each program its member tile,
the multicast ring counting on across tiles (`passes/schedule/multicast.py`).

fp8 operands (float8_e4m3fn / float8_e5m2, either mixed) take optional
float32 dequantization scales, per tensor ([]) or per row of op(A) ([M]) /
per column of op(B) ([N]), applied to the float32 accumulator before alpha:
acc * scale_a[:, None] * scale_b[None, :]. The kernels take each scale as it
is, a [] one read as one scalar (SCALE_A / SCALE_B: `gemm_epilogue.SCALE_MODES`).

A warm call on the GPU replays what the first calls of its shape, dtypes,
alignment and layout launched, fp8 scales included (`gemm_plan.py`): no
checks, binding or config selection, one prepared launch per kernel.

On the GPU the op runs the kernel compiled with fast math (`gemm_kernel_fast`:
fma contraction, approximate exp2 and division) wherever the output's
precision hides the difference (`_fast_math_allows`); `gemm_kernel` itself
stays exact.

For M <= 64 (decode) the op takes the small-M path instead, and for larger M
whose tiles are too few for the SMs the few-tiles split (`gemm_split_k.py`):
programs that each own a contiguous slice of K, so B is read once by enough
programs to cover the SMs, the K splits summed in a fixed order (or with
atomics: TESSERA_GEMM_ATOMIC_SPLIT_K=1) before the same epilogue
(`gemm_epilogue.py`).
With TESSERA_GEMM_STREAM_K=1 (or, once measured, where its wave model says it
pays), a grid of more than one wave of tiles whose last wave is partial runs
the stream-K kernel (`gemm_stream_k.py`): whole tiles for the full waves,
the rest split in K steps evenly over the persistent programs.

`gemm(a, b, ...)` is the `torch.ops.tessera.gemm` custom op (`gemm_op`, with a
fake implementation, so `torch.compile` traces it, and autograd for float
inputs, whose backward is two more `gemm` calls); where nothing observes the
dispatch it calls the implementation directly (see `gemm`). CUDA tensors launch the
autotuned kernel; CPU tensors run on the tile interpreter with one small
pinned config (`CPU_CONFIG`, `CPU_SMALL_M_CONFIG`), since timing configs there
is meaningless.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Optional

import torch

import tessera
import tessera.torch

from . import gemm_configs
from . import gemm_plan
from . import gemm_split_k
from . import gpus, targets
from .gemm_alignment import NOTHING_STATED, operand_alignment, pointers_aligned, state_alignment
from .gemm_epilogue import ACTIVATIONS, SQRT_2_OVER_PI, epilogue
from .gemm_tiles import cluster_tile, for_each_tile, grouped_tile  # noqa: F401 (the first and last re-exported)
from .hooks import outside_graphs


# Configs (`gemm_configs.json`, read by `gemm_configs.py`): the common ones for every GPU (CONFIGS: 64-128 x
# 64-128 tiles, STAGES-deep rings of 64-96 KB filled by cp.async on sm_80 and by TMA on sm_90/sm_90a, wgmma on
# sm_90a with one group in flight, mma.sync otherwise, fp8 on sm_89/sm_90a/gfx950), and per GPU family its own
# (HOPPER_CONFIGS: 128 x 256 tiles on two consumer warpgroups, clusters, a persistent warp-specialized kernel);
# the autotuner gets all of them and keeps the launching device's (`prune_for_device`), then prunes by what
# ptxas reports. Each compiles without register spills; not yet timed on a GPU.
CONFIGS = gemm_configs.COMMON
HOPPER_CONFIGS = gemm_configs.BY_FAMILY["sm_90"]
# The CPU interpreter's config: small blocks keep the interpreted tiles cheap.
CPU_CONFIG = tessera.Config({"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 2, "PERSISTENT": False, "STAGES": 2}, num_warps=4)
# The "SM count" persistent launches use on the interpreter (GPUs report theirs).
CPU_NUM_SMS = 4
# The split-K paths' tiles on the interpreter (`gemm_split_k.small_m_plan`'s and `few_tiles_plan`'s config).
CPU_SMALL_M_CONFIG = {"BN": 16, "K_BYTES": 16, "STAGES": 2, "num_warps": 4}
CPU_SPLIT_K_CONFIG = {"BM": 64, "BN": 32, "K_BYTES": 16, "STAGES": 2, "num_warps": 4}
# The stream-K kernel's tile on the interpreter (`gemm_stream_k.stream_k_plan`'s config).
CPU_STREAM_K_CONFIG = {"BM": 16, "BN": 16, "K_BYTES": 32, "GROUP_M": 2, "STAGES": 2, "num_warps": 4}
# "1": the persistent GEMM with its partial last wave split in K steps (`gemm_stream_k.py`), "0": never, unset or
# "auto": where its wave model says it pays, once a GPU run has measured it (`gemm_configs.awaits_measurement`).
STREAM_K_ENV = "TESSERA_GEMM_STREAM_K"
# Set to "1" to sum the split-K paths' partials with float32 atomics (less workspace, not bit-reproducible).
ATOMIC_SPLIT_K_ENV = "TESSERA_GEMM_ATOMIC_SPLIT_K"


@tessera.func
def gemm_tile(pid_m, pid_n, a, b, c, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, K, alpha,
              HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN, BK, STAGES, WS, CLUSTER_M=1, CLUSTER_N=1):
    """C[pid_m, pid_n] = act(alpha * A[pid_m, :] @ B[:, pid_n] * scales + bias), one BM x BN tile."""
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    # blocks copied ahead (see above); WS: by a producer warpgroup of their own
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=STAGES, warp_specialize=WS):
        # CLUSTER_M > 1: the cluster's programs share pid_n (`cluster_tile`), so B's block is loaded once per
        # cluster, each program a share multicast to all (`passes/schedule/multicast.py`); CLUSTER_N: A's
        a_block = a.block((BM, BK), (pid_m, k)).load(multicast=CLUSTER_N > 1)
        b_block = b.block((BK, BN), (k, pid_n)).load(multicast=CLUSTER_M > 1)
        acc = tessera.dot(a_block, b_block, acc)

    acc = epilogue(acc, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, alpha, pid_m, pid_n,
                   HAS_BIAS, SCALE_A, SCALE_B, ACTIVATION, BM, BN)
    c.block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.autotune(configs=gemm_configs.ALL, key=["M", "N", "K"], prune=gemm_configs.prune_for_device,
                  model=gemm_configs.predicted)
@tessera.kernel
def gemm_kernel(a_ptr, b_ptr, bias_ptr, scale_a_ptr, scale_b_ptr, c_ptr, M, N, K, alpha,
                stride_am, stride_ak, stride_bk, stride_bn,
                HAS_BIAS: tessera.constexpr, SCALE_A: tessera.constexpr, SCALE_B: tessera.constexpr,
                ACTIVATION: tessera.constexpr,
                BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                GROUP_M: tessera.constexpr, PERSISTENT: tessera.constexpr, STAGES: tessera.constexpr,
                WS: tessera.constexpr = False, ALIGN: tessera.constexpr = NOTHING_STATED,
                PIPELINED: tessera.constexpr = True, CLUSTER_M: tessera.constexpr = 1,
                CLUSTER_N: tessera.constexpr = 1):
    # what the op checked of the sizes and strides, and whether the rows allow a pipeline (`gemm_alignment.py`)
    state_alignment(M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ALIGN)
    STAGES = STAGES if PIPELINED else 1
    WS = WS and PIPELINED
    # CLUSTER_M (CLUSTER_N) programs in a row run as one cluster sharing B's (A's) blocks (`cluster_tile`)
    tessera.cluster_dims(CLUSTER_M * CLUSTER_N)
    a = tessera.view(a_ptr, (M, K), (stride_am, stride_ak))
    b = tessera.view(b_ptr, (K, N), (stride_bk, stride_bn))
    c = tessera.view(c_ptr, (M, N))
    num_pid_m = tessera.cdiv(M, BM)
    num_pid_n = tessera.cdiv(N, BN)
    # one tile, every num_programs-th (PERSISTENT), or clusters walking cluster-tiles (`gemm_tiles.for_each_tile`)
    for_each_tile(gemm_tile, (a, b, c, bias_ptr, scale_a_ptr, scale_b_ptr, M, N, K, alpha, HAS_BIAS, SCALE_A,
                              SCALE_B, ACTIVATION, BM, BN, BK, STAGES, WS, CLUSTER_M, CLUSTER_N),
                  num_pid_m, num_pid_n, GROUP_M, PERSISTENT, CLUSTER_M, CLUSTER_N)


# The same kernel compiled with `fast_math=True`: a*b+c contracted into one fma (FFMA: the FMA-path dot of
# float32 inputs and the alpha / bias epilogue), exp2 and division approximate (the gelu / silu
# epilogues). `_fast_math_allows` says when the op runs it; `gemm_kernel` stays exact.
gemm_kernel_fast = tessera.autotune(configs=gemm_configs.ALL, key=["M", "N", "K"],
                                    prune=gemm_configs.prune_for_device, model=gemm_configs.predicted)(
    tessera.kernel(fast_math=True)(gemm_kernel.kernel.fn))


def pin_config(config: Optional[tessera.Config]) -> None:
    """Launch the op's tiled GEMM with `config` from now on, without tuning, in both of its compilations
    (`gemm_kernel` and `gemm_kernel_fast` tune apart: pinning one leaves the other, which float16 / bfloat16
    outputs run, tuning) and in both of the fused kernel's (`gemm(..., epilogue=...)`, `gemm_fused.py`, the
    same configs); `pin_config(None)` tunes again. The split-K paths have no configs to pin."""
    from .gemm_fused import gemm_fused_kernel, gemm_fused_kernel_fast        # (gemm_fused imports this module)
    for kernel in (gemm_kernel, gemm_kernel_fast, gemm_fused_kernel, gemm_fused_kernel_fast):
        kernel.pin(config)


def _fast_math_allows(out_dtype: torch.dtype, activation: str) -> bool:
    """Whether `gemm_kernel_fast` may compute this GEMM: its approximations (about 2^-22 relative) and
    contractions (one rounding where there were two) stay far below a float16 / bfloat16 output's rounding
    (2^-11 / 2^-8); a float32 output takes only the contractions (no gelu / silu, whose exp and division
    would be approximate)."""
    return out_dtype != torch.float32 or activation in ("none", "relu")


# ---------------------------------------------------------------------------
# The torch op

TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_INPUT_DTYPES = frozenset(TORCH_DTYPES + FP8_DTYPES)
# numpy has neither bfloat16 nor fp8: the interpreter gets their bits, reinterpreted.
_HOST_BITS = {torch.bfloat16: (torch.uint16, tessera.bf16), torch.float8_e4m3fn: (torch.uint8, tessera.f8e4m3),
              torch.float8_e5m2: (torch.uint8, tessera.f8e5m2)}


def _check_scale(scale: Optional[torch.Tensor], name: str, length: int, what: str, a: torch.Tensor) -> None:
    if scale is None:
        return
    if a.dtype not in FP8_DTYPES:
        raise ValueError(f"tessera::gemm: {name} is only for fp8 inputs (float8_e4m3fn / float8_e5m2), "
                         f"but a is {a.dtype}; fold a float scale into alpha instead")
    if scale.dtype != torch.float32:
        raise ValueError(f"tessera::gemm: {name} must be float32, got {scale.dtype}")
    if scale.dim() != 0 and tuple(scale.shape) != (length,):
        raise ValueError(f"tessera::gemm: {name} must have shape () (per tensor) or ({length},) (per {what}), "
                         f"got {tuple(scale.shape)}")
    if scale.device != a.device:
        raise ValueError(f"tessera::gemm: {name} is on {scale.device} but a is on {a.device}")


def _check(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
           out_dtype: Optional[torch.dtype], trans_a: bool, trans_b: bool,
           scale_a: Optional[torch.Tensor] = None,
           scale_b: Optional[torch.Tensor] = None) -> tuple[int, int, int, torch.dtype]:
    """Validate the arguments; return M, N, K and the output dtype."""
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in _INPUT_DTYPES or b.dtype not in _INPUT_DTYPES:
        for name, x in (("a", a), ("b", b)):
            if x.dim() != 2:
                raise ValueError(f"tessera::gemm: {name} must be a 2-D matrix, got shape {tuple(x.shape)}")
            if x.dtype not in _INPUT_DTYPES:
                raise ValueError(f"tessera::gemm: {name} has dtype {x.dtype}; supported are float16, bfloat16, "
                                 f"float32, float8_e4m3fn and float8_e5m2")
    fp8 = a.dtype in FP8_DTYPES
    if a.dtype != b.dtype and not (fp8 and b.dtype in FP8_DTYPES):    # e4m3 x e5m2 is fine (dot promotes to f16)
        raise ValueError(f"tessera::gemm: a and b must have the same dtype (or both be fp8), "
                         f"got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"tessera::gemm: a is on {a.device} but b is on {b.device}")
    M, K = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    K_b, N = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if K != K_b:
        raise ValueError(f"tessera::gemm: shape mismatch: op(a) is {M}x{K} (a {tuple(a.shape)}, trans_a={trans_a}) "
                         f"but op(b) is {K_b}x{N} (b {tuple(b.shape)}, trans_b={trans_b}); inner sizes differ")
    if (activation or "none") not in ACTIVATIONS:
        raise ValueError(f"tessera::gemm: unknown activation {activation!r}; choose one of {ACTIVATIONS} or None")
    if out_dtype is None:
        out_dtype = torch.bfloat16 if fp8 else a.dtype
    if out_dtype not in TORCH_DTYPES:
        raise ValueError(f"tessera::gemm: out_dtype {out_dtype} is not supported; use float16, bfloat16 or float32")
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"tessera::gemm: bias must have shape ({N},) to match the output's N, "
                             f"got {tuple(bias.shape)}")
        if bias.dtype not in (torch.float32, out_dtype):
            raise ValueError(f"tessera::gemm: bias has dtype {bias.dtype}; use float32 or the output dtype {out_dtype}")
        if bias.device != a.device:
            raise ValueError(f"tessera::gemm: bias is on {bias.device} but a is on {a.device}")
    _check_scale(scale_a, "scale_a", M, "row of op(a)", a)
    _check_scale(scale_b, "scale_b", N, "column of op(b)", a)
    return M, N, K, out_dtype


def _strided(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """A logical matrix -> (its dense storage, row stride, column stride); only non-dense layouts are copied."""
    if not x.is_contiguous():
        if x.t().is_contiguous():
            return x.t(), x.stride(0), x.stride(1)     # column-major: the transpose is the dense tensor
        x = x.contiguous()
    row, column = x.stride()
    return x, row, column


def _host(x: torch.Tensor):
    """A CPU tensor as an interpreter argument (bfloat16 and fp8 go as their bits)."""
    if x.dtype in _HOST_BITS:
        bits, dtype = _HOST_BITS[x.dtype]
        return tessera.reinterpret(x.view(bits).numpy(), dtype)
    return x


def _grid(M: int, N: int, meta: dict, num_sms: int) -> tuple[int]:
    """One program per tile, or per SM (at most one per tile) for persistent configs; with CLUSTER_M (CLUSTER_N),
    rows (columns) of tiles rounded up to whole clusters (`cluster_tile`), and persistent programs a whole number
    of clusters (num_sms rounded down to one, at least one cluster)."""
    rows, columns = -(-M // meta["BM"]), -(-N // meta["BN"])      # ceiling divisions, on every launch
    cluster_m, cluster_n = meta.get("CLUSTER_M", 1), meta.get("CLUSTER_N", 1)
    if cluster_m > 1:
        rows = -(-rows // cluster_m) * cluster_m
    if cluster_n > 1:
        columns = -(-columns // cluster_n) * cluster_n
    num_tiles = rows * columns
    if not meta["PERSISTENT"]:
        return (num_tiles,)
    size = cluster_m * cluster_n        # persistent clusters: whole clusters, at most one per SM each
    return (max(min(num_tiles, num_sms) // size, 1) * size,)


@torch.library.custom_op("tessera::gemm", mutates_args=())
def gemm_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
            scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None, *,
            activation: Optional[str] = None, out_dtype: Optional[torch.dtype] = None,
            trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0) -> torch.Tensor:
    """`torch.ops.tessera.gemm`: see `gemm`."""
    return _gemm(a, b, bias, scale_a, scale_b, activation, out_dtype, trans_a, trans_b, alpha)


def gemm(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None,
         scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None, *,
         activation: Optional[str] = None, out_dtype: Optional[torch.dtype] = None,
         trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, **hooks) -> torch.Tensor:
    """act(alpha * (op(a) @ op(b)) * scale_a[:, None] * scale_b[None, :] + bias), accumulated in float32.

    op transposes when trans_a / trans_b: a is [M, K] ([K, M] with trans_a),
    b is [K, N] ([N, K] with trans_b). a and b are float16, bfloat16 or
    float32 (the same), or fp8 (float8_e4m3fn / float8_e5m2, mixing allowed).
    scale_a / scale_b (fp8 only) are float32, shape [] (per tensor) or [M] /
    [N] (per row of op(a) / per column of op(b)). bias is [N] in float32 or
    the output dtype, activation is None, "relu", "gelu" (tanh
    approximation) or "silu"; the result is [M, N] in out_dtype (default:
    the inputs' dtype, bfloat16 for fp8 inputs).

    This is the op `torch.ops.tessera.gemm`. Where nothing would see the op
    being dispatched (`tessera.torch.unobserved`: plain CUDA tensors, no gradient to
    record, no torch.compile, tracing, vmap or torch function/dispatch mode)
    it runs the CUDA implementation directly, as the dispatcher would, but
    without its ~9 µs of Python; otherwise it dispatches.

    Fused user functions (`gemm_fusion.py`): `epilogue=fn, epilogue_args=(...)`
    (and `epilogue_outputs=`) on the float32 accumulator, `prologue_a=` /
    `prologue_b=` (with `_args`) on the operand blocks as they load, and
    `gather_a=` row indices; each fn a `@tessera.func` compiled into the kernel;
    `epilogue_reference=` (the epilogue in torch) gives it autograd. This path
    is not the custom op: torch.compile breaks the graph at it.
    """
    if hooks:
        return _with_hooks(a, b, bias, scale_a, scale_b, activation, out_dtype, trans_a, trans_b, alpha, hooks)
    if tessera.torch.unobserved(a, b, bias, scale_a, scale_b):
        return _gemm(a, b, bias, scale_a, scale_b, activation, out_dtype, trans_a, trans_b, alpha)
    return gemm_op(a, b, bias, scale_a, scale_b, activation=activation, out_dtype=out_dtype, trans_a=trans_a,
                   trans_b=trans_b, alpha=alpha)


@outside_graphs("tessera::gemm", "epilogue=, prologue_a=, prologue_b=, gather_a=")
def _with_hooks(a, b, bias, scale_a, scale_b, activation, out_dtype, trans_a, trans_b, alpha, hooks):
    """The GEMM with user functions fused in (`gemm_fusion.fused_gemm`); the fixed epilogue's arguments are
    refused there, since the user's epilogue says what to do with the accumulator. torch.compile does not trace
    it (`hooks.outside_graphs`): a clean graph break rather than Dynamo failing inside the hook machinery."""
    from .gemm_fusion import HOOK_ARGUMENTS, fused_gemm

    unknown = sorted(set(hooks) - set(HOOK_ARGUMENTS))
    if unknown:
        raise TypeError(f"tessera::gemm got unexpected keyword argument(s) {unknown}; the fusion hooks are "
                        f"{', '.join(HOOK_ARGUMENTS)}")
    fixed = dict(bias=bias, scale_a=scale_a, scale_b=scale_b, activation=activation)
    given = [name for name, value in fixed.items() if value is not None] + (["alpha"] if alpha != 1.0 else [])
    if given:
        raise ValueError(f"tessera::gemm: {', '.join(given)} cannot be combined with fused functions; apply "
                         f"{'them' if len(given) > 1 else 'it'} in the epilogue instead (pass tensors as "
                         f"epilogue_args)")
    return fused_gemm(a, b, out_dtype=out_dtype, trans_a=trans_a, trans_b=trans_b, **hooks)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _gpu_of(device: Optional[torch.device]) -> tuple[gpus.Gpu, str]:
    """(the constants of the GPU `device` is on, the key of the plans it runs): its row in `gpus.py`, looked up
    once per device (`gpus.of`), and on an AMD GPU `targets.plan_target` (its AMD target, or the one
    $TESSERA_AMD_PLANS names, read per call); 'nvidia' on the others. Without a device, or with tensors not on a
    CUDA/ROCm one (the stub driver's CPU tensors), the op plans as on the reference GPU, an H100 SXM."""
    gpu = gpus.of(device)
    return gpu, (targets.plan_target(device) if gpu.plan_key != "nvidia" else "nvidia")


@functools.lru_cache(maxsize=4096)
def _split_k_plan(M: int, N: int, K: int, element_bytes: int, num_sms: int, cpu: bool,
                  gpu: gpus.Gpu = gpus.H100_SXM, plans_of: str = "nvidia") -> Optional[gemm_split_k.SplitKPlan]:
    """The split-K plan the op runs (`gemm_split_k.py`) on `gpu` with the tiles of plan key `plans_of` (`_gpu_of`):
    always for M <= 64 (decode: B streamed once), for larger M where the tiles are too few for the SMs and
    splitting K pays; None: the tiled kernel. Kept per shape and GPU: the bandwidth model costs ~7 µs of Python,
    more than the launch it plans."""
    if M <= gemm_split_k.SMALL_M:
        return gemm_split_k.small_m_plan(M, N, K, element_bytes, num_sms, CPU_SMALL_M_CONFIG if cpu else None,
                                         gpu, plans_of)
    return gemm_split_k.few_tiles_plan(M, N, K, element_bytes, num_sms, CPU_SPLIT_K_CONFIG if cpu else None,
                                       plans_of)


@functools.lru_cache(maxsize=4096)
def _stream_k_plan(M: int, N: int, K: int, element_bytes: int, num_sms: int, cpu: bool, mode: str,
                   gpu: gpus.Gpu = gpus.H100_SXM, plans_of: str = "nvidia"):
    """The stream-K plan the op runs (`gemm_stream_k.stream_k_plan`; `mode`: $TESSERA_GEMM_STREAM_K), or None:
    the tiled kernel. Kept per shape, mode and GPU, as `_split_k_plan`."""
    from . import gemm_stream_k
    return gemm_stream_k.stream_k_plan(M, N, K, element_bytes, num_sms, mode, CPU_STREAM_K_CONFIG if cpu else None,
                                       gpu, plans_of)


def gemm_stream_k_mode() -> str:
    """$TESSERA_GEMM_STREAM_K: "1" (always, where a persistent grid's last wave is partial), "0" or "auto"."""
    return os.environ.get(STREAM_K_ENV, "auto") or "auto"


# The op's plans (`gemm_plan.py`): plan key -> what a warm call of that key launches.
_PLANS = gemm_plan.Plans()


def _runs_on_gpu(a: torch.Tensor) -> bool:
    """Whether the op launches GPU kernels for `a` (else the CPU interpreter: CPU tensors, $TESSERA_INTERPRET)."""
    return a.device.type != "cpu" and os.environ.get("TESSERA_INTERPRET", "0") != "1"


def _same(args: tuple) -> tuple:
    return args


# The op's tensors -> what its GPU launches take: the tensors themselves (`gemm_plan.stub_gpu_operands` swaps in
# `__cuda_array_interface__` views of CPU tensors, to run this path on the stub driver).
_device_args = _same


def _atomic_split_k() -> bool:
    return os.environ.get(ATOMIC_SPLIT_K_ENV, "0") == "1"


def _gemm(a, b, bias, scale_a, scale_b, activation, out_dtype, trans_a, trans_b, alpha) -> torch.Tensor:
    """The implementation: a warm call replays its plan (`gemm_plan.py`); otherwise check, allocate the output,
    launch (the interpreter for CPU tensors), and on the GPU record the launches as the key's plan."""
    planned = tessera.launching_directly()
    if planned:
        key, pa, pb, pbias = gemm_plan.plan_key(a, b, bias, activation, out_dtype, trans_a, trans_b, scale_a, scale_b)
        plan = _PLANS.get(key)
        if plan is not None:
            c = plan.run(pa, pb, pbias, alpha, scale_a, scale_b)
            if c is not None:
                return c
            _PLANS.pop(key, None)          # recorded again below
    M, N, K, out_dtype = _check(a, b, bias, activation, out_dtype, trans_a, trans_b, scale_a, scale_b)
    c = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    a_mem, stride_am, stride_ak = _strided(a.t() if trans_a else a)
    b_mem, stride_bk, stride_bn = _strided(b.t() if trans_b else b)
    bias_mem = bias.contiguous() if bias is not None else c       # c stands in when there is no bias/scale
    scale_a_mem, scale_b_mem = gemm_plan.scale_operand(scale_a), gemm_plan.scale_operand(scale_b)
    args = (a_mem, b_mem, bias_mem, c if scale_a_mem is None else scale_a_mem,
            c if scale_b_mem is None else scale_b_mem, c,
            M, N, K, float(alpha), stride_am, stride_ak, stride_bk, stride_bn)
    activation = activation or "none"
    flags = dict(HAS_BIAS=bias is not None, SCALE_A=gemm_plan.scale_mode(scale_a),
                 SCALE_B=gemm_plan.scale_mode(scale_b), ACTIVATION=activation)
    cpu = not _runs_on_gpu(a)
    recording = None
    if cpu:
        args = tuple(_host(x) if isinstance(x, torch.Tensor) else x for x in args)
        launches = gemm_plan.Direct(_same)
    else:
        args = _device_args(args)
        # a plan replays addresses, so only operands passed as they are (dense, not copied), and a non-empty K
        if planned and K > 0 and a_mem.data_ptr() == pa and b_mem.data_ptr() == pb and \
                bias_mem is (c if bias is None else bias):
            launches = recording = gemm_plan.Recording(_device_args, args[0], args[1], args[2], args[5], args[9],
                                                       args[3] if scale_a is not None else None,
                                                       args[4] if scale_b is not None else None)
        else:
            launches = gemm_plan.Direct(_device_args)
    atomic = launch_kernels(args, M, N, K, flags, out_dtype, a.element_size(), a.device,
                            CPU_NUM_SMS if cpu else _num_sms(a.get_device()), cpu=cpu, launches=launches)
    if recording is not None:
        plans_of = _gpu_of(a.device)[1]     # (read per call on AMD: a replay checks it; 'nvidia' never moves)
        _PLANS.remember(key, recording, c, atomic, _atomic_split_k,
                        None if plans_of == "nvidia" else (plans_of, lambda device=a.device: _gpu_of(device)[1]))
    return c


def clear_plans() -> None:
    """Forget the op's plans (`gemm_plan.py`): after changing what decides its launches in place (a test patching
    the split-K model or the configs); pinning a config and forgetting prepared launches need not."""
    _PLANS.clear()


def launch_kernels(args: tuple, M: int, N: int, K: int, flags: dict, out_dtype: torch.dtype, element_bytes: int,
                   device, num_sms: int, *, cpu: bool = False,
                   launches: Optional[gemm_plan.Direct] = None) -> Optional[bool]:
    """The op's launches for `gemm_kernel`'s 14 arguments `args` (tensors already laid out; C at index 5, host
    arrays for the interpreter when `cpu`): the split-K plan when the shape takes one, else the autotuned tiled
    kernel (the interpreter's pinned config on the CPU). `flags` are HAS_BIAS / SCALE_A / SCALE_B /
    ACTIVATION; `device` is where split-K workspaces are allocated; `launches` launches each kernel (and records
    it for a plan: `gemm_plan.Recording`). Returns whether split K sums atomically (None: K not split), which a
    plan keeps. tests/kernels_lib/test_gemm_launch_calls.py counts its driver calls on the stub's arrays."""
    launches = launches or gemm_plan.Direct(_same)
    capturing = tessera.capturing()
    fast = not cpu and _fast_math_allows(out_dtype, flags["ACTIVATION"]) and not capturing
    c = args[5]
    gpu, plans_of = (gpus.H100_SXM, "nvidia") if cpu else _gpu_of(device)
    split = _split_k_plan(M, N, K, element_bytes, num_sms, cpu, gpu, plans_of)
    if split is not None:                   # small M, or too few tiles for the SMs: K split over programs
        atomic = split.split_k > 1 and _atomic_split_k()
        # (inside tessera.fusion(), declare that C is stored whole, as `launch_tuned` does)
        with tessera.writes_whole(c) if capturing else contextlib.nullcontext():
            gemm_split_k.launch(args, split, M, N, flags, device, element_bytes=element_bytes, fast=fast,
                                atomic=atomic, launches=launches)
        return atomic if split.split_k > 1 else None
    stream = _stream_k_plan(M, N, K, element_bytes, num_sms, cpu, gemm_stream_k_mode(), gpu, plans_of)
    if stream is not None:                  # a partial last wave: its tiles split in K steps over the SMs
        from . import gemm_stream_k
        with tessera.writes_whole(c) if capturing else contextlib.nullcontext():
            gemm_stream_k.launch(args, stream, M, N, flags, device, element_bytes=element_bytes, fast=fast,
                                 launches=launches)
        return None
    # what the sizes and strides are multiples of, and whether the rows allow a pipelined K loop
    align, pipelined = operand_alignment(M, N, K, args[10:14], element_bytes, pointers_aligned(args[0], args[1]))
    if cpu:
        with tessera.writes_whole(c):       # for tessera.fusion(): every tile of C is stored (issue 18)
            gemm_kernel.kernel[_grid(M, N, CPU_CONFIG.kwargs, num_sms)](*args, **flags, **CPU_CONFIG.as_dict(),
                                                                        ALIGN=align, PIPELINED=pipelined)
    else:
        launch_tuned(gemm_kernel_fast if fast else gemm_kernel, args, c, M, N, num_sms, capturing, **flags,
                     ALIGN=align, PIPELINED=pipelined, launches=launches)
    return None


def launch_tuned(kernel, args: tuple, c, M: int, N: int, num_sms: int, capturing: bool,
                 launches: Optional[gemm_plan.Direct] = None, **constexprs) -> None:
    """Launch an autotuned GEMM kernel (`gemm_kernel*`, `gemm_fused_kernel`) over C's M x N tiles. `capturing`
    (`tessera.capturing()`): inside `tessera.fusion()` the launch declares that it writes all of `c`, is recorded
    with a tuned or predicted config (`predicted_config`), and elementwise consumers of C become its epilogue;
    the op then passes the exact kernel, not the fast-math one, since a consumer fused into it keeps its own
    numerics. Outside a capture nothing is declared (the context manager would cost the launch ~3 µs).
    `launches` launches it (`gemm_plan.Direct`, or a `Recording` for the op's plan)."""
    grid = lambda meta: _grid(M, N, meta, num_sms)  # noqa: E731
    if capturing:
        with tessera.writes_whole(c):
            kernel[grid](*args, **constexprs)
    elif launches is None:
        kernel[grid](*args, **constexprs)
    else:
        launches.launch(kernel, grid, args, constexprs)


@gemm_op.register_fake
def _gemm_fake(a, b, bias=None, scale_a=None, scale_b=None, *, activation=None, out_dtype=None,
               trans_a=False, trans_b=False, alpha=1.0):
    M, N, _, out_dtype = _check(a, b, bias, activation, out_dtype, trans_a, trans_b, scale_a, scale_b)
    return a.new_empty((M, N), dtype=out_dtype)


# ---------------------------------------------------------------------------
# Autograd (float inputs only)

def _activation_grad(pre: torch.Tensor, activation: Optional[str]) -> Optional[torch.Tensor]:
    """d act / d pre at the float32 pre-activation (None for the identity)."""
    if activation == "relu":
        return (pre > 0).to(pre.dtype)
    if activation == "gelu":        # tanh approximation, as in the kernel
        inner = SQRT_2_OVER_PI * (pre + 0.044715 * pre ** 3)
        t = torch.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * pre * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * pre * pre)
    if activation == "silu":
        s = torch.sigmoid(pre)
        return s * (1.0 + pre * (1.0 - s))
    return None


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    a, b, bias, scale_a, scale_b = inputs
    if a.dtype in FP8_DTYPES or b.dtype in FP8_DTYPES:
        raise RuntimeError("tessera::gemm: fp8 inputs have no gradients (the op is inference-only for fp8); "
                           "detach the fp8 operands and scales, or use float16/bfloat16/float32 inputs")
    ctx.kw = dict(keyword_only_inputs)
    ctx.wants = (a.requires_grad, b.requires_grad, bias is not None and bias.requires_grad)
    ctx.save_for_backward(a, b, bias)


def _backward(ctx, grad):
    a, b, bias = ctx.saved_tensors
    kw = ctx.kw
    activation, alpha = kw.get("activation"), float(kw.get("alpha", 1.0))
    trans_a, trans_b = kw.get("trans_a", False), kw.get("trans_b", False)
    g = grad.float()
    if (activation or "none") != "none":      # recompute the pre-activation in float32 rather than storing it
        pre = gemm(a, b, bias, activation=None, out_dtype=torch.float32, trans_a=trans_a, trans_b=trans_b,
                   alpha=alpha)
        g = g * _activation_grad(pre, activation)
    grad_a = grad_b = grad_bias = None
    if ctx.wants[2]:
        grad_bias = g.sum(0).to(bias.dtype)
    g_in = g.to(a.dtype)
    if ctx.wants[0]:     # d op(a) = alpha * g @ op(b)^T
        if trans_a:
            grad_a = gemm(b, g_in, trans_a=trans_b, trans_b=True, alpha=alpha, out_dtype=a.dtype)
        else:
            grad_a = gemm(g_in, b, trans_b=not trans_b, alpha=alpha, out_dtype=a.dtype)
    if ctx.wants[1]:     # d op(b) = alpha * op(a)^T @ g
        if trans_b:
            grad_b = gemm(g_in, a, trans_a=True, trans_b=trans_a, alpha=alpha, out_dtype=b.dtype)
        else:
            grad_b = gemm(a, g_in, trans_a=not trans_a, alpha=alpha, out_dtype=b.dtype)
    return grad_a, grad_b, grad_bias, None, None


gemm_op.register_autograd(_backward, setup_context=_setup_context)
