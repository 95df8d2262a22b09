"""Weight-quantized GEMM: y = x @ W^T with W stored in 1-8 bit integer codes (GPTQ/AWQ-style groups), MXFP4 or
NVFP4, and activations in float16/bfloat16 (or fp8 e4m3 for W4A8).

Each program computes a BM x BN tile of y. Walking K in steps of BK, it
loads a BM x BK block of x and the BN x BK block of W's codes (each row of
W is a bit stream along K, so a thread's 128 bits are one load that the
compiler unpacks in registers), dequantizes it, `(q - zero) * scale` per
group of G along K, in x's dtype, and multiplies it into a float32
accumulator on the tensor cores. W's codes, scales and zeros are loaded a
K step ahead (loop-carried, as in `moe.quantized_mlp`): no ring prefetches
a load that feeds a cast, and waiting for them in their own step exposed one
DRAM latency per step (2026-11-26, H100: the decode GEMM at 9% of HBM). MXFP4/NVFP4 weights go through
`tessera.dot_scaled`; W4A8 multiplies fp8 activations by the weights'
exact fp8 codes and scales each group's partial product (e4m3 tensor cores:
sm_89 and newer, gfx950's OCP fp8 MFMA; other GPUs are refused with the fix).

Two launch shapes (`plan`): for decode (M <= 16) one 16-row tile and the
K range split over SPLIT_K programs, which add their partial products into
a float32 output with atomics (every weight byte is read once, by enough
programs to keep the memory system busy); for larger M, 64- or 128-row
tiles over all of K, the x blocks software-pipelined.

Weights stored in fragment order (`quant.pack(layout="fragment")`, what
`QuantizedWeight.to` picks for NVIDIA GPUs) are read as (threads, L) tiles
of each thread's mma B-fragment codes (`weight_block`, `quant_fragment`):
128-bit loads into the registers the mma reads, no shared memory.

`quant_gemm(x, w)` is the op `torch.ops.tessera.quant_gemm` (a fake
implementation for torch.compile, opcheck-tested); `w` is a
`quant.QuantizedWeight` (`quant.pack`, `quant.from_gptq`, `quant.from_awq`,
`quant.quantize`). CPU tensors run on the tile interpreter.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch

import tessera
import tessera.torch

from .gemm_alignment import NOTHING_STATED, ROW_BYTES, operand_alignment, pointers_aligned, state_alignment
from .quant import FORMATS, LAYOUTS, QuantizedWeight
from .quant_fragment import DECODE_TILING
from .targets import device_arch, fp8_matrix_cores, plan_target


@tessera.func
def dequantize(codes, scale, zero, BN, BK, G, ZEROS, HALF, DTYPE):
    """W's BN x BK block of codes -> (codes - zero) * scale in DTYPE, each group of G along K with its own
    scale (and zero) from the [BN, groups in the block] blocks `scale_block` loaded."""
    GB = max(BK // G, 1)                        # groups in the block
    values = tessera.reshape(codes.to(DTYPE), (BN, GB, BK // GB))
    values = values - (tessera.expand_dims(zero.to(DTYPE), 2) if ZEROS else HALF)
    return tessera.reshape(values * tessera.expand_dims(scale.to(DTYPE), 2), (BN, BK))


@tessera.func
def scale_block(s, pid_n, step, BN, BK, G, SCALE_LAYOUT=None):
    """The [BN, groups in the block] scales (or zeros) of W's K step `step`. SCALE_LAYOUT (or None: the
    compiler's choice) pins the layout they are loaded in."""
    GB = max(BK // G, 1)
    return s.block((BN, GB), (pid_n, step * BK // G // GB)).load(layout=SCALE_LAYOUT)


@tessera.func
def write(out_ptr, acc, pid_m, pid_n, M, N, BM, BN, SPLIT_K):
    """The finished tile into y, or (split K) added into the float32 y that the splits share."""
    if SPLIT_K == 1:
        tessera.view(out_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)
    else:
        rows = pid_m * BM + tessera.arange(0, BM)
        cols = pid_n * BN + tessera.arange(0, BN)
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        tessera.atomic_add(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=inside)


@tessera.func
def weight_block(w_ptr, pid_n, step, N, K, BN, BK, FRAGMENT, LOAD_LAYOUT):
    """W's codes for K step `step`: the (BN, BK) block of the plain [N, K] codes, or (fragment order,
    `quant_fragment`) the block's (threads, L) stored codes, each thread's row one run of bytes (`as_block`
    re-reads them as (BN, BK))."""
    if FRAGMENT:    # step < K // BK always (fragment_plan splits K in whole steps): rows never reach the next block
        threads, per_thread = LOAD_LAYOUT.shape
        stored = tessera.view(w_ptr, (N // BN * (K // BK) * threads, per_thread))
        return stored.block((threads, per_thread), (pid_n * (K // BK) + step, 0)).load(layout=LOAD_LAYOUT)
    return tessera.view(w_ptr, (N, K)).block((BN, BK), (pid_n, step)).load()


@tessera.func
def as_block(codes, BN, BK, FRAGMENT, DIGITS, ORDER):
    """`weight_block`'s codes as the (BN, BK) block (fragment order: a permutation held in registers)."""
    if FRAGMENT:
        return tessera.reshape(tessera.permute(tessera.reshape(codes, DIGITS), ORDER), (BN, BK))
    return codes


@tessera.kernel
def quant_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, G: tessera.constexpr,
                      ZEROS: tessera.constexpr, HALF: tessera.constexpr, BM: tessera.constexpr,
                      BN: tessera.constexpr, BK: tessera.constexpr, SPLIT_K: tessera.constexpr,
                      STAGES: tessera.constexpr, FRAGMENT: tessera.constexpr = False,
                      LOAD_LAYOUT: tessera.constexpr = None, DIGITS: tessera.constexpr = None,
                      ORDER: tessera.constexpr = None, SCALE_LAYOUT: tessera.constexpr = None,
                      ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True):
    state_alignment(M, N, K, K, 1, 1, K, ALIGN)     # x [M, K] and W^T [K, N], dense (`aligned_rows`)
    STAGES = STAGES if PIPELINED else 1
    pid_m, pid_n, split = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    x = tessera.view(x_ptr, (M, K))
    s, z = tessera.view(s_ptr, (N, K // G)), tessera.view(z_ptr, (N, K // G))
    steps = tessera.cdiv(K, BK * SPLIT_K)
    first, last = split * steps, tessera.minimum(split * steps + steps, tessera.cdiv(K, BK)) - 1
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    codes = weight_block(w_ptr, pid_n, first, N, K, BN, BK, FRAGMENT, LOAD_LAYOUT)
    scale = scale_block(s, pid_n, first, BN, BK, G, SCALE_LAYOUT)
    zero = scale_block(z, pid_n, first, BN, BK, G, SCALE_LAYOUT) if ZEROS else scale
    RING = STAGES > 1       # x's blocks stream through the pipeline's ring; without one x is carried too
    xs = None if RING else x.block((BM, BK), (pid_m, first)).load()
    for step in tessera.pipeline(first, split * steps + steps, stages=STAGES):
        ahead = tessera.minimum(step + 1, last)     # the split's last step re-reads its own block (a cache hit)
        codes_ahead = weight_block(w_ptr, pid_n, ahead, N, K, BN, BK, FRAGMENT, LOAD_LAYOUT)
        scale_ahead = scale_block(s, pid_n, ahead, BN, BK, G, SCALE_LAYOUT)
        zero_ahead = scale_block(z, pid_n, ahead, BN, BK, G, SCALE_LAYOUT) if ZEROS else scale_ahead
        # x's next block is zeros past K: a step past K (an uneven split) adds nothing, whatever codes it has
        xs_ahead = None if RING else x.block((BM, BK), (pid_m, step + 1)).load()
        wt = dequantize(as_block(codes, BN, BK, FRAGMENT, DIGITS, ORDER), scale, zero, BN, BK, G, ZEROS, HALF,
                        x.dtype)
        acc = tessera.dot(x.block((BM, BK), (pid_m, step)).load() if RING else xs, wt.T, acc)
        codes, scale, zero, xs = codes_ahead, scale_ahead, zero_ahead, xs_ahead
    write(out_ptr, acc, pid_m, pid_n, M, N, BM, BN, SPLIT_K)


@tessera.kernel
def fp4_gemm_kernel(x_ptr, w_ptr, s_ptr, out_ptr, global_scale, M, N, K, G: tessera.constexpr,
                    BM: tessera.constexpr, BN: tessera.constexpr, BK: tessera.constexpr,
                    SPLIT_K: tessera.constexpr, STAGES: tessera.constexpr,
                    ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True):
    state_alignment(M, N, K, K, 1, 1, K, ALIGN)
    STAGES = STAGES if PIPELINED else 1
    pid_m, pid_n, split = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    x, w, s = tessera.view(x_ptr, (M, K)), tessera.view(w_ptr, (N, K)), tessera.view(s_ptr, (N, K // G))
    steps = tessera.cdiv(K, BK * SPLIT_K)
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for step in tessera.pipeline(split * steps, split * steps + steps, stages=STAGES):
        codes, scales = w.block((BN, BK), (pid_n, step)).load(), s.block((BN, BK // G), (pid_n, step)).load()
        acc = tessera.dot_scaled(x.block((BM, BK), (pid_m, step)).load(), None, codes.T, scales.T, acc)
    write(out_ptr, acc * global_scale, pid_m, pid_n, M, N, BM, BN, SPLIT_K)


@tessera.kernel
def w4a8_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, N, K, G: tessera.constexpr,
                ZEROS: tessera.constexpr, HALF: tessera.constexpr, BM: tessera.constexpr, BN: tessera.constexpr,
                SPLIT_K: tessera.constexpr, STAGES: tessera.constexpr,
                ALIGN: tessera.constexpr = NOTHING_STATED, PIPELINED: tessera.constexpr = True):
    """fp8 activations times the weights' exact fp8 codes q - zero, one group (BK = G) per step, each group's
    product scaled by its column scales; the rows scaled by x's scales at the end."""
    state_alignment(M, N, K, K, 1, 1, K, ALIGN)
    STAGES = STAGES if PIPELINED else 1
    pid_m, pid_n, split = tessera.program_id(0), tessera.program_id(1), tessera.program_id(2)
    x, w = tessera.view(x_ptr, (M, K)), tessera.view(w_ptr, (N, K))
    s, z = tessera.view(s_ptr, (N, K // G)), tessera.view(z_ptr, (N, K // G))
    steps = tessera.cdiv(K, G * SPLIT_K)
    acc = tessera.zeros((BM, BN), dtype=tessera.f32)
    for step in tessera.pipeline(split * steps, split * steps + steps, stages=STAGES):
        codes = w.block((BN, G), (pid_n, step)).load().to(tessera.f16)
        zero = z.block((BN, 1), (pid_n, step)).load().to(tessera.f16) if ZEROS else HALF
        exact = (codes - zero).to(tessera.f8e4m3)                   # |q - zero| <= 15: exact in e4m3
        partial = tessera.dot(x.block((BM, G), (pid_m, step)).load(), exact.T)
        acc = acc + partial * s.block((BN, 1), (pid_n, step)).load().to(tessera.f32).T
    row_scale = tessera.view(xs_ptr, (M, 1)).block((BM, 1), (pid_m, 0)).load()
    write(out_ptr, acc * row_scale, pid_m, pid_n, M, N, BM, BN, SPLIT_K)


# ---------------------------------------------------------------------------
# Launch plans


@dataclass(frozen=True)
class Plan:
    """Tile sizes, pipelining depth, warps and how many programs split K."""

    BM: int
    BN: int
    BK: int
    split_k: int
    stages: int
    num_warps: int


# The interpreter's plan: small tiles (and two K splits, so the CPU tests run the atomic path).
CPU_PLAN = Plan(BM=16, BN=16, BK=32, split_k=2, stages=1, num_warps=4)


# The K loop's ring depth of the 64- and 128-row W4A16 tiles per AMD target (NVIDIA: 3): with 3 stages x's 16 KiB
# blocks and the dequantized weight tile the dot reads (17,400 bytes at 128 x 64) need 66,552 bytes (67,568 on
# gfx950), over gfx942's 64 KiB of LDS and well within gfx950's 160 KiB (`targets.lds_bytes`); both compile
# without spills (tests/kernels_lib/test_quant_gemm.py).
AMD_STAGES = {"gfx942": 2, "gfx950": 3}


@functools.lru_cache(maxsize=4096)      # per shape: the op asks on every call
def plan(M: int, N: int, K: int, group_size: int, num_sms: int, w4a8: bool = False, target: str = "nvidia") -> Plan:
    """Decode (M <= 16): one 16-row tile, K split so that about two programs per SM stream the weights;
    otherwise 64- or 128-row tiles over all of K, their ring `AMD_STAGES[target]` deep on an AMD `target` (a
    plan key, `targets.plan_target`). BK is a whole number of groups, or divides one (W4A8: one group)."""
    bk = group_size if w4a8 else 128 if M <= 16 else 64
    if bk % group_size and group_size % bk:
        bk = group_size
    if M <= 16 and K % bk:      # decode splits K in whole steps: K = 160 in groups of 32 takes steps of one group
        bk = group_size
    if M <= 16:
        tiles = tessera.cdiv(N, 64)
        split = max(1, min(K // bk, 2 * num_sms // max(tiles, 1)))
        while K % (split * bk):     # whole steps per split
            split -= 1
        return Plan(16, 64, bk, split, 1, 4)
    if w4a8:        # two float32 tiles (the sum, and each group's product) and a whole group of K per step
        return Plan(64, 64, bk, 1, 3, 4)
    bm = 128 if M >= 1024 else 64
    return Plan(bm, 128, bk, 1, 3 if target == "nvidia" else AMD_STAGES[target], 8 if bm == 128 else 4)


@functools.lru_cache(maxsize=4096)
def fragment_plan(p: Plan, M: int, K: int, warp_size: int = 32) -> Plan:
    """`p` with the block and threads a fragment-order weight is stored for (`quant_fragment.DECODE_TILING`):
    the decode plan's own for M <= 16 (there the codes land in their mma registers); for larger M 64-row
    tiles (128 spill on sm_80), which the compiler feeds from the same loads through a layout conversion, as it
    does on AMD (64-lane warps: half as many)."""
    t = DECODE_TILING
    split = p.split_k
    while (K // t.BK) % split:
        split -= 1
    bm = 16 if M <= 16 else 64
    return Plan(bm, t.BN, t.BK, split, p.stages if M > 16 else 1, t.threads // warp_size)


def aligned_rows(M: int, N: int, K: int, x_bytes: int, code_bits: int, pointers_aligned: bool):
    """(ALIGN, PIPELINED) for the kernels (`gemm_alignment.operand_alignment`, x [M, K] and W^T [K, N] dense):
    what the sizes are multiples of, and whether both x's rows (K * x_bytes bytes) and the weight's rows of codes
    (K * code_bits / 8 bytes) start 16-byte aligned, so that the K loop's copies can be asynchronous; K = 24 in
    groups of 8 (12-byte rows of int4 codes) runs a plain loop rather than a pipeline the compiler refuses."""
    align, pipelined = operand_alignment(M, N, K, (K, 1, 1, K), x_bytes, pointers_aligned)
    return align, pipelined and K * code_bits % (8 * ROW_BYTES) == 0


# ---------------------------------------------------------------------------
# The torch op

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
_TESSERA_DTYPES = {torch.float16: tessera.f16, torch.bfloat16: tessera.bf16, torch.float8_e4m3fn: tessera.f8e4m3}


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
           perm: Optional[torch.Tensor], x_scale: Optional[torch.Tensor], bits: int, group_size: int,
           format: str, out_dtype: Optional[torch.dtype],
           layout: str = "plain") -> tuple[int, int, int, torch.dtype]:
    """Validate; return M (rows of x), N, K and the output dtype."""
    if format not in FORMATS:
        raise ValueError(f"tessera::quant_gemm: format must be one of {FORMATS}, got {format!r}")
    if layout not in LAYOUTS or (layout == "fragment" and (format != "int" or x_scale is not None)):
        raise ValueError(f"tessera::quant_gemm: layout must be one of {LAYOUTS}; 'fragment' (quant.pack) serves "
                         f"integer weights with float16/bfloat16 x, got layout={layout!r}, format={format!r}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"tessera::quant_gemm: qweight must be uint8 [N, K * bits / 8] (quant.pack), got "
                         f"{qweight.dtype} {tuple(qweight.shape)}")
    N, K = qweight.shape[0], qweight.shape[1] * 8 // bits
    if x.shape[-1] != K:
        raise ValueError(f"tessera::quant_gemm: x has {x.shape[-1]} columns but the weight has K = {K}")
    fp8 = x.dtype == torch.float8_e4m3fn
    if x.dtype not in ACTIVATION_DTYPES and not (fp8 and format == "int" and bits <= 4):
        raise ValueError(f"tessera::quant_gemm: x must be float16 or bfloat16 (float8_e4m3fn with x_scale for "
                         f"W4A8: int weights of at most 4 bits), got {x.dtype}")
    if fp8 != (x_scale is not None):
        raise ValueError("tessera::quant_gemm: x_scale (float32, one per row of x) goes with float8_e4m3fn x only")
    if tuple(scales.shape) != (N, K // group_size):
        raise ValueError(f"tessera::quant_gemm: scales must be [N, K // group_size] = [{N}, {K // group_size}], "
                         f"got {tuple(scales.shape)}")
    if perm is not None and tuple(perm.shape) != (K,):
        raise ValueError(f"tessera::quant_gemm: perm must be [K] = [{K}], got {tuple(perm.shape)}")
    if fp8 and group_size % 16:
        raise ValueError(f"tessera::quant_gemm: W4A8 needs groups of a multiple of 16, got {group_size}")
    # a K step holds whole groups or lies in one (`dequantize`), and steps are powers of two (tiles)
    power_of_two = group_size & (group_size - 1) == 0
    if not (power_of_two or (group_size % 128 == 0 and not fp8)):
        raise ValueError(f"tessera::quant_gemm: group_size must be a power of two (or, without W4A8, a multiple of "
                         f"128), so that each K step of the kernels holds whole groups or lies in one; got "
                         f"{group_size}: quantize with group_size=32, 64 or 128")
    if layout == "fragment":
        DECODE_TILING.check(N, K, "tessera::quant_gemm (a fragment-order weight)")
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else x.dtype)
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"tessera::quant_gemm: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    return x.numel() // K, N, K, out_dtype


def _quant_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                perm: Optional[torch.Tensor], x_scale: Optional[torch.Tensor], bits: int, group_size: int,
                format: str, global_scale: float, out_dtype: Optional[torch.dtype] = None,
                layout: str = "plain") -> torch.Tensor:
    """The implementation of `torch.ops.tessera.quant_gemm`: see `quant_gemm`."""
    M, N, K, out_dtype = _check(x, qweight, scales, zeros, perm, x_scale, bits, group_size, format, out_dtype,
                                layout)
    x2 = x.reshape(M, K)
    if perm is not None:
        x2 = x2.index_select(1, perm)
    cpu = x.device.type == "cpu" or os.environ.get("TESSERA_INTERPRET", "0") == "1"
    if x_scale is not None and not cpu and x.is_cuda and not fp8_matrix_cores(_arch(x.get_device())):
        raise ValueError(f"tessera::quant_gemm: W4A8 (float8_e4m3fn x) needs e4m3 tensor cores (sm_89 or newer, "
                         f"gfx950; gfx942's fp8 MFMA reads the fnuz formats); this GPU is {_arch(x.get_device())}: "
                         f"pass float16 or bfloat16 x (W4A16) instead")
    p = CPU_PLAN if cpu else plan(M, N, K, group_size, _num_sms(x.get_device()), x_scale is not None,
                                  plan_target(x.device))
    fragment = {}
    if layout == "fragment":        # the tiles the codes are stored for
        p = fragment_plan(p, M, K, 64 if torch.version.hip and not cpu else 32)
        fragment = DECODE_TILING.constexprs(group_size)
    out = torch.zeros((M, N), dtype=torch.float32 if p.split_k > 1 else out_dtype, device=x.device)
    grid = (tessera.cdiv(M, p.BM), tessera.cdiv(N, p.BN), p.split_k)
    as_arg = _host if cpu else _device
    codes = tessera.f4e2m1 if format != "int" else getattr(tessera, f"u{bits}")
    w = as_arg(qweight, codes)
    x_rows = x2.contiguous()
    align, pipelined = aligned_rows(M, N, K, x.element_size(), 4 if format != "int" else bits,
                                    pointers_aligned(x_rows, qweight))
    launch = dict(BM=p.BM, BN=p.BN, SPLIT_K=p.split_k, STAGES=p.stages, num_warps=p.num_warps, ALIGN=align,
                  PIPELINED=pipelined)
    if format != "int":
        scale_type = tessera.e8m0 if format == "mxfp4" else tessera.f8e4m3
        fp4_gemm_kernel[grid](as_arg(x_rows), w, as_arg(scales.contiguous(), scale_type), as_arg(out),
                              float(global_scale), M, N, K, G=group_size, BK=p.BK, **launch)
    else:
        zeros_arg = as_arg((zeros if zeros is not None else scales).contiguous())
        common = dict(G=group_size, ZEROS=zeros is not None, HALF=float(2 ** (bits - 1)), **launch)
        if x_scale is None:
            quant_gemm_kernel[grid](as_arg(x_rows), w, as_arg(scales.contiguous()), zeros_arg, as_arg(out),
                                    M, N, K, BK=p.BK, **common, **fragment)
        else:
            w4a8_kernel[grid](as_arg(x_rows), as_arg(x_scale.reshape(M, 1).float().contiguous()), w,
                              as_arg(scales.contiguous()), zeros_arg, as_arg(out), M, N, K, **common)
    return out.to(out_dtype).reshape(*x.shape[:-1], N)


quant_gemm_op = torch.library.custom_op("tessera::quant_gemm", _quant_gemm, mutates_args=())


@quant_gemm_op.register_fake
def _quant_gemm_fake(x, qweight, scales, zeros, perm, x_scale, bits, group_size, format, global_scale,
                     out_dtype=None, layout="plain"):
    M, N, K, out_dtype = _check(x, qweight, scales, zeros, perm, x_scale, bits, group_size, format, out_dtype,
                                layout)
    return x.new_empty((*x.shape[:-1], N), dtype=out_dtype)


def quant_gemm(x: torch.Tensor, w: QuantizedWeight, x_scale: Optional[torch.Tensor] = None, *,
               out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """y = x @ W^T for a quantized W (`quant.QuantizedWeight`), accumulated in float32.

    x is [..., K] float16 or bfloat16; for W4A8 (int weights of at most 4
    bits) float8_e4m3fn with `x_scale`, float32 [...] (one scale per row).
    The result is [..., N] in `out_dtype` (default: x's dtype; bfloat16 for
    fp8 x). This is the op `torch.ops.tessera.quant_gemm` (called directly where
    nothing observes the dispatch: `tessera.torch.unobserved`).
    """
    direct = tessera.torch.unobserved(x, w.qweight, w.scales, w.zeros, w.perm, x_scale)
    return (_quant_gemm if direct else quant_gemm_op)(x, w.qweight, w.scales, w.zeros, w.perm, x_scale, w.bits,
                                                      w.group_size, w.format, w.global_scale, out_dtype, w.layout)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _arch(device_index: int) -> str:
    """The device's target (sm_89, gfx950, ...), asked once (W4A8 checks it on every call)."""
    return device_arch(torch.device("cuda", device_index))


def _host(t: torch.Tensor, dtype: Optional[tessera.DType] = None):
    """A CPU tensor as an interpreter argument: its bytes as `dtype` (or its own type; bf16 and fp8 as bits)."""
    dtype = dtype or _TESSERA_DTYPES.get(t.dtype)
    if dtype is None:
        return t
    bits = torch.uint16 if dtype.bits == 16 and dtype != tessera.f16 else torch.uint8 if dtype.bits <= 8 else None
    array = t.view(bits).numpy() if bits is not None else t.numpy()
    return tessera.reinterpret(array, dtype)


def _device(t: torch.Tensor, dtype: Optional[tessera.DType] = None):
    """A CUDA tensor as a kernel argument: viewed as `dtype` when its torch dtype does not say it."""
    return tessera.reinterpret(t, dtype) if dtype is not None else t
