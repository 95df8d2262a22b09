"""The NVPTX lowering table: the LLVM core's common ops plus NVIDIA's warp-level matrix and async-copy ops.

* `mma_m16n8k16` is `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`
  (needs sm_80+); fragment registers 2i and 2i+1 share one 32-bit register, the
  lower index in the low half, as the PTX ISA packs .f16x2/.bf16x2.
* `ldmatrix` is `ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16`: one 32-bit
  register per matrix, split into registers 2j (low half) and 2j+1.
* `async_copy` is `cp.async.cg.shared.global` for 16 bytes (`.ca` for 4 and
  8: `.cg` only exists for 16) through the `.s` intrinsics, whose src-size
  operand is `bytes` when the predicate holds and 0 (zero fill) when not;
  `async_commit` / `async_wait` are `cp.async.commit_group` /
  `cp.async.wait_group N` (needs sm_80+).

The target checks (sm_75+ for ldmatrix, ...) are `NvptxDialect.check_op`'s.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.types import scalar_dtype

from ..llvm.codegen import COMMON_LOWERINGS
from ..llvm.lowerings import LoweringTable
from ..llvm.types import I32, register_type

LOWERINGS = LoweringTable("NVPTX", base=COMMON_LOWERINGS)
lowering = LOWERINGS.register

MMA_INTRINSICS = {dt.f16: "llvm.nvvm.mma.m16n8k16.row.col.f32.f32", dt.bf16: "llvm.nvvm.mma.m16n8k16.row.col.bf16"}


@lowering("mma_m16n8k16")
def _mma_m16n8k16(lw, op, a, b, c):
    dtype = scalar_dtype(op.operands[0].type)
    bld = lw.builder
    accumulators = [bld.extract_element(c, ir.Constant(I32, i)) for i in range(4)]
    d = lw.intrinsic(MMA_INTRINSICS[dtype], [*_pairs(bld, a, dtype), *_pairs(bld, b, dtype), *accumulators])
    result = ir.Constant(c.type, ir.Undefined)
    for i in range(4):
        result = bld.insert_element(result, bld.extract_value(d, i), ir.Constant(I32, i))
    return result


def _pairs(bld, regs, dtype):
    """Registers 2i, 2i+1 as one 32-bit operand (<2 x half> for f16, i32 for bf16, 2i in the low half)."""
    count = regs.type.count // 2
    if dtype == dt.f16:
        undef = ir.Constant(regs.type, ir.Undefined)
        return [bld.shuffle_vector(regs, undef, ir.Constant(ir.VectorType(I32, 2), [2 * i, 2 * i + 1]))
                for i in range(count)]
    words = bld.bitcast(regs, ir.VectorType(I32, count))
    return [bld.extract_element(words, ir.Constant(I32, i)) for i in range(count)]


@lowering("ldmatrix")
def _ldmatrix(lw, op, row):
    num, trans = op.attrs["num"], ".trans" if op.attrs["trans"] else ""
    bld = lw.builder
    loaded = lw.intrinsic(f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{num}{trans}.b16", [row])
    words = [loaded] if num == 1 else [bld.extract_value(loaded, j) for j in range(num)]
    result_type = register_type(op.result.type)
    pair = ir.VectorType(result_type.element, 2)       # <2 x half> / <2 x bfloat>, element 2j in the low half
    result = ir.Constant(result_type, ir.Undefined)
    for j, word in enumerate(words):
        halves = bld.bitcast(word, pair)
        for e in range(2):
            result = bld.insert_element(result, bld.extract_element(halves, ir.Constant(I32, e)),
                                        ir.Constant(I32, 2 * j + e))
    return result


@lowering("async_copy")
def _async_copy(lw, op, dst, src, pred):
    size = op.attrs["bytes"]
    cache = "cg" if size == 16 else "ca"
    src_size = lw.builder.select(pred, ir.Constant(I32, size), ir.Constant(I32, 0))
    lw.intrinsic(f"llvm.nvvm.cp.async.{cache}.shared.global.{size}.s", [dst, src, src_size])


@lowering("async_commit")
def _async_commit(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.commit.group", [])


@lowering("async_wait")
def _async_wait(lw, op):
    lw.intrinsic("llvm.nvvm.cp.async.wait.group", [ir.Constant(I32, op.attrs["pending"])])


# Hopper's warpgroup ops (wgmma) register themselves into LOWERINGS from their own file.
from . import warpgroup  # noqa: E402,F401
