"""The NVPTX codegen table: the LLVM core's common ops plus NVIDIA's warp-level matrix and async-copy ops.

* `mma` is `mma.sync.aligned.m16n8k{k}.row.col` through `MMA_INTRINSICS`
  (needs sm_80+; fp8 needs sm_89+ and PTX 8.4): the A and B fragments go in
  32-bit registers, each holding 32 / bits consecutive fragment elements, the
  lowest index in the low bits, as the PTX ISA packs .f16x2/.bf16x2 and four
  8-bit values; tf32 inputs are first rounded with cvt.rna.tf32.f32
  (`llvm.nvvm.f2tf32.rna`), the rounding the `mma` op specifies. C and D are
  four f32 or four s32 registers.
* `ldmatrix` is `ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16`: one 32-bit
  register per matrix, split into registers w*j (low bits) .. w*j + w - 1
  for w = 32 / bits elements per word (2 16-bit, 4 8-bit, 1 tf32).
* `async_copy` is `cp.async.cg.shared.global` for 16 bytes (`.ca` for 4 and
  8: `.cg` only exists for 16) through the `.s` intrinsics, whose src-size
  operand is `bytes` when the predicate holds and 0 (zero fill) when not;
  `async_commit` / `async_wait` are `cp.async.commit_group` /
  `cp.async.wait_group N` (needs sm_80+).

* `stmatrix` is `stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`:
  registers 2j, 2j + 1 packed (low, high) into the 32-bit word of matrix j.

The target checks (sm_75+ for ldmatrix, sm_90+ for stmatrix, ...) are `NvptxDialect.check_op`'s.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.op_table import OpTable
from tessera.ir.types import scalar_dtype

from ..llvm.codegen import COMMON_CODEGEN
from ..llvm.types import I32, register_type

CODEGEN = OpTable("NVPTX codegen", base=COMMON_CODEGEN)
codegen_for = CODEGEN.register

_FP8_NAMES = {dt.f8e4m3: "e4m3", dt.f8e5m2: "e5m2"}


def mma_intrinsic(a: dt.DType, b: dt.DType) -> str:
    """The intrinsic of the mma.sync that multiplies A, B of these dtypes (names in `intrinsics.FIXED`)."""
    if a in _FP8_NAMES:     # .f32.<A>.<B>.f32: D and C types around the inputs'
        return f"llvm.nvvm.mma.m16n8k32.row.col.f32.{_FP8_NAMES[a]}.{_FP8_NAMES[b]}.f32"
    return {dt.f16: "llvm.nvvm.mma.m16n8k16.row.col.f32.f32", dt.bf16: "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            dt.f32: "llvm.nvvm.mma.m16n8k8.row.col.tf32", dt.i8: "llvm.nvvm.mma.m16n8k32.row.col.s8",
            dt.u8: "llvm.nvvm.mma.m16n8k32.row.col.u8"}[a]


@codegen_for("mma")
def _mma(lw, op, a, b, c):
    a_dtype, b_dtype = (scalar_dtype(v.type) for v in op.operands[:2])
    bld = lw.builder
    if a_dtype == dt.f32:       # tf32: round each f32 to nearest, ties away (cvt.rna.tf32.f32)
        a, b = ([lw.intrinsic("llvm.nvvm.f2tf32.rna", [bld.extract_element(x, ir.Constant(I32, i))])
                 for i in range(x.type.count)] for x in (a, b))
    else:
        a, b = _words(bld, a, a_dtype), _words(bld, b, b_dtype)
    accumulators = [bld.extract_element(c, ir.Constant(I32, i)) for i in range(c.type.count)]
    d = lw.intrinsic(mma_intrinsic(a_dtype, b_dtype), [*a, *b, *accumulators])
    result = ir.Constant(c.type, ir.Undefined)
    for i in range(c.type.count):
        result = bld.insert_element(result, bld.extract_value(d, i), ir.Constant(I32, i))
    return result


def _words(bld, regs, dtype):
    """The fragment as 32-bit operands, consecutive registers packed low first: <2 x half> for f16 (the
    intrinsic's type), i32 for bf16 and the 8-bit types."""
    per_word = 32 // dtype.bits
    count = regs.type.count // per_word
    if dtype == dt.f16:
        undef = ir.Constant(regs.type, ir.Undefined)
        return [bld.shuffle_vector(regs, undef, ir.Constant(ir.VectorType(I32, 2), [2 * i, 2 * i + 1]))
                for i in range(count)]
    words = bld.bitcast(regs, ir.VectorType(I32, count))
    return [bld.extract_element(words, ir.Constant(I32, i)) for i in range(count)]


@codegen_for("ldmatrix")
def _ldmatrix(lw, op, row):
    num, trans = op.attrs["num"], ".trans" if op.attrs["trans"] else ""
    bld = lw.builder
    loaded = lw.intrinsic(f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{num}{trans}.b16", [row])
    words = [loaded] if num == 1 else [bld.extract_value(loaded, j) for j in range(num)]
    result_type = register_type(op.result.type)
    per_word = op.result.type.count // num
    if per_word == 1:                                   # 32-bit elements: the word is the element
        parts = [[bld.bitcast(word, result_type.element)] for word in words]
    else:   # <2 x half> / <4 x i8> ..., element w*j in the low bits
        split = ir.VectorType(result_type.element, per_word)
        parts = [[bld.extract_element(bld.bitcast(word, split), ir.Constant(I32, e)) for e in range(per_word)]
                 for word in words]
    result = ir.Constant(result_type, ir.Undefined)
    for i, element in enumerate(e for part in parts for e in part):
        result = bld.insert_element(result, element, ir.Constant(I32, i))
    return result


@codegen_for("stmatrix")
def _stmatrix(lw, op, row, regs):
    """Registers 2j, 2j + 1 (low, high half) become word j: bitcast <2 x half/bfloat/i16> -> i32."""
    num, trans = op.attrs["num"], ".trans" if op.attrs["trans"] else ""
    bld = lw.builder
    element = register_type(op.operands[1].type).element
    pair = ir.VectorType(element, 2)
    words = []
    for j in range(num):
        word = ir.Constant(pair, ir.Undefined)
        for e in range(2):
            word = bld.insert_element(word, bld.extract_element(regs, ir.Constant(I32, 2 * j + e)), ir.Constant(I32, e))
        words.append(bld.bitcast(word, I32))
    lw.intrinsic(f"llvm.nvvm.stmatrix.sync.aligned.m8n8.x{num}{trans}.b16.p3", [row, *words])


@codegen_for("async_copy")
def _async_copy(lw, op, dst, src, pred):
    size = op.attrs["bytes"]
    cache = "cg" if size == 16 else "ca"
    src_size = lw.builder.select(pred, ir.Constant(I32, size), ir.Constant(I32, 0))
    lw.intrinsic(f"llvm.nvvm.cp.async.{cache}.shared.global.{size}.s", [dst, src, src_size])


@codegen_for("async_commit")
def _async_commit(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.commit.group", [])


@codegen_for("async_wait")
def _async_wait(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.wait.group", [ir.Constant(I32, op.attrs["pending"])])


# Hopper's warpgroup ops (wgmma) and device-side print / assert register themselves from their own files.
from . import device_print, warpgroup  # noqa: E402,F401
