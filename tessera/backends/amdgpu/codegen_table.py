"""The AMDGPU codegen table: the LLVM core's common ops plus AMD's own.

Every target-neutral op comes from `tessera.backends.llvm.codegen_table.COMMON`
(with `AmdgpuDialect` supplying ids, barrier, shuffles, LDS and math).
`async_copy` / `async_commit` / `async_wait` are direct global->LDS loads and
vmcnt waits on gfx942 / gfx950 (`lds_dma.py`). NVIDIA's warp-level ops (mma,
ldmatrix, mbarriers) have no entry:
`AmdgpuDialect.unsupported_ops` rejects them with the reason before LLVM
sees anything. A failed `assert` (debug builds) traps; device-side `print`
has no printf here yet, and is refused with the reason.

`mfma` (the matrix cores, `v_mfma_f32_<m>x<n>x<k>_{f16,bf16}`) is
lowered here: register i of the thread op's A, B and C operands is element
i of the intrinsic's vectors (the fragment layouts in
`tessera.ir.mfma_layouts` are written in the instruction's own register
order), bf16 fragments travel as <4 x i16> (the `.1k` forms) or stay
<8 x bfloat> (gfx950's double-K forms, `.bf16`), fp8 ones (<8 x i8>, OCP
bytes) as one i64 each, register i in byte i (`..._{fp8,bf8}_{fp8,bf8}`),
and the broadcast controls (cbsz, abid, blgp) are 0. The double-rate fp8
forms (32x32x64, 16x16x128: <32 x i8> as <8 x i32>) go through LLVM's only
intrinsic for them, `llvm.amdgcn.mfma.scale.f32.<m>x<n>x<k>.f8f6f4`, with
A's and B's formats in cbsz / blgp (0 e4m3, 1 e5m2) and both scales 0 (op
selects and values), which LLVM selects as the unscaled
`v_mfma_f32_<m>x<n>x<k>_f8f6f4`.
`lds_read_tr` is `ds_read_b64_tr_b16` (gfx950, "lds.read.tr"): <4 x i16>
bitcast to the op's <4 x half> / <4 x bfloat>.
`AmdgpuDialect.check_op` has already refused a double-K shape on a target
without "mfma.wide" and fp8 operands on one without "mfma.fp8".
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.mfma_layouts import MFMA_F8F6F4_SHAPES, MFMA_FP8, MFMA_WIDE_SHAPES
from tessera.ir.op_table import OpTable
from tessera.ir.types import scalar_dtype

from ..llvm.codegen import COMMON_CODEGEN
from ..llvm.types import register_type
from ..llvm.types import I16, I32, I64
from .lds_dma import lds_dma

CODEGEN = OpTable("AMDGPU codegen", base=COMMON_CODEGEN)
codegen_for = CODEGEN.register

_SOURCE_SUFFIX = {dt.f16: "f16", dt.bf16: "bf16.1k"}   # the .1k forms are the bf16 ones gfx90a+ have
_WIDE_SUFFIX = {dt.f16: ".f16", dt.bf16: ".bf16"}      # gfx950's 32x32x16 / 16x16x32: bfloat operands
_FP8_NAMES = {dt.f8e4m3: "fp8", dt.f8e5m2: "bf8"}     # AMD's names of the OCP formats (gfx950)
F8F6F4_FORMATS = {dt.f8e4m3: 0, dt.f8e5m2: 1}        # the f8f6f4 forms' cbsz (A) / blgp (B) format codes


def f8f6f4_intrinsic(m: int, n: int, k: int) -> str:
    """The LLVM intrinsic of v_mfma_f32_{m}x{n}x{k}_f8f6f4 on 8-bit operands (<8 x i32> each)."""
    return f"llvm.amdgcn.mfma.scale.f32.{m}x{n}x{k}.f8f6f4.v8i32.v8i32"


def mfma_intrinsic(m: int, n: int, k: int, dtype: dt.DType, dtype_b: dt.DType | None = None) -> str:
    """The LLVM intrinsic of v_mfma_f32_{m}x{n}x{k}_{dtype} (fp8: `_{A}_{B}`, B of `dtype_b`, default `dtype`;
    the f8f6f4 shapes: `f8f6f4_intrinsic`)."""
    if (m, n, k) in MFMA_F8F6F4_SHAPES:
        return f8f6f4_intrinsic(m, n, k)
    if dtype in MFMA_FP8:
        return f"llvm.amdgcn.mfma.f32.{m}x{n}x{k}.{_FP8_NAMES[dtype]}.{_FP8_NAMES[dtype_b or dtype]}"
    suffix = (_WIDE_SUFFIX if (m, n, k) in MFMA_WIDE_SHAPES else _SOURCE_SUFFIX)[dtype]
    return f"llvm.amdgcn.mfma.f32.{m}x{n}x{k}{suffix}"


@codegen_for("mfma")
def _mfma(lw, op, a, b, c):
    dtype, dtype_b = (scalar_dtype(v.type) for v in op.operands[:2])
    shape = (op.attrs["m"], op.attrs["n"], op.attrs["k"])
    name = mfma_intrinsic(*shape, dtype, dtype_b)
    if shape in MFMA_F8F6F4_SHAPES:     # <32 x i8> -> <8 x i32>, byte i of the vector is register i
        a, b = (lw.builder.bitcast(x, ir.VectorType(I32, 8)) for x in (a, b))
        formats = [ir.Constant(I32, F8F6F4_FORMATS[t]) for t in (dtype, dtype_b)]
        no_scale = [ir.Constant(I32, 0)] * 4       # A's op select and scale, B's: the unscaled instruction
        return lw.intrinsic(name, [a, b, c, *formats, *no_scale])
    if dtype in MFMA_FP8:       # <8 x i8> -> i64: register i is byte i, the order the instruction reads k in
        a, b = (lw.builder.bitcast(x, I64) for x in (a, b))
    elif dtype == dt.bf16 and shape not in MFMA_WIDE_SHAPES:
        a, b = (lw.builder.bitcast(x, ir.VectorType(I16, 4)) for x in (a, b))
    no_broadcast = ir.Constant(I32, 0)
    return lw.intrinsic(name, [a, b, c, no_broadcast, no_broadcast, no_broadcast])


@codegen_for("lds_read_tr")
def _lds_read_tr(lw, op, row):
    loaded = lw.intrinsic("llvm.amdgcn.ds.read.tr16.b64.v4i16", [row])
    return lw.builder.bitcast(loaded, register_type(op.result.type))


@codegen_for("phase_barrier")
def _phase_barrier(lw, op):
    """s_barrier, between workgroup release and acquire fences when `fenced` (as `barrier`), bare otherwise:
    a bare one orders execution only, so loads in flight stay in flight across it."""
    if op.attrs.get("fenced"):
        lw.dialect.barrier(lw)
    else:
        lw.intrinsic("llvm.amdgcn.s.barrier", [])


@codegen_for("set_priority")
def _set_priority(lw, op):
    lw.intrinsic("llvm.amdgcn.s.setprio", [ir.Constant(I16, op.attrs["level"])])


@codegen_for("sched_fence")
def _sched_fence(lw, op):
    lw.intrinsic("llvm.amdgcn.sched.barrier", [ir.Constant(I32, 0)])     # mask 0: nothing may cross


@codegen_for("wave_uniform")
def _wave_uniform(lw, op, x):
    return lw.intrinsic("llvm.amdgcn.readfirstlane.i32", [x])


@codegen_for("assert")
def _assert(lw, op, cond):
    """A thread where any register of the condition is false traps (s_trap), ending the launch with an error;
    without a device printf the message is not shown (the CPU interpreter shows it)."""
    lanes = [cond] if not isinstance(cond.type, ir.VectorType) else [
        lw.builder.extract_element(cond, ir.Constant(I32, i)) for i in range(cond.type.count)]
    failed = lw.builder.not_(lanes[0])
    for lane in lanes[1:]:
        failed = lw.builder.or_(failed, lw.builder.not_(lane))
    lw.guarded(failed, lambda: lw.intrinsic("llvm.trap", []) and None, name="assert")


@codegen_for("async_copy")
def _async_copy(lw, op, dst, src, pred):
    lds_dma(lw).copy(dst, src, pred, op.attrs["bytes"])


@codegen_for("async_commit")
def _async_commit(lw, op):
    """Nothing: vmcnt counts instructions, and `async_wait` converts groups into them."""


@codegen_for("async_wait")
def _async_wait(lw, op):
    state = lds_dma(lw)
    if state is not None:
        state.wait(op.attrs["pending"])
    else:   # a wait with no copy in the kernel: nothing is in flight
        pass
