"""Thread-level ops -> LLVM: ids, register arrays, shuffles, barriers, shared memory.

* `thread_id` is `%tid.x`; `program_id` / `num_programs` are `%ctaid` /
  `%nctaid` along the axis.
* `shuffle` is `shfl.sync.<mode>.b32` over the full warp (mask 0xffffffff:
  every lane of the warp must reach it). `width` splits the warp into
  segments as CUDA's `__shfl_*_sync(..., width)` does: the clamp operand is
  `(32 - width) << 8 | (mode == up ? 0 : 31)`. Values narrower than 32 bits
  are zero-extended and truncated back; 64-bit values move as two halves.
* `mma_m16n8k16` is `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`
  (needs sm_80+); fragment registers 2i and 2i+1 share one 32-bit register, the
  lower index in the low half, as the PTX ISA packs .f16x2/.bf16x2.
* `ldmatrix` is `ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16`: one 32-bit
  register per matrix, split into registers 2j (low half) and 2j+1.
* `barrier` is `bar.sync 0` (`llvm.nvvm.barrier.cta.sync.aligned.all`).
* `shared_alloc` is its byte `offset` into the kernel's dynamic shared buffer.
* `async_copy` is `cp.async.cg.shared.global` for 16 bytes (`.ca` for 4 and
  8: `.cg` only exists for 16) through the `.s` intrinsics, whose src-size
  operand is `bytes` when the predicate holds and 0 (zero fill) when not;
  `async_commit` / `async_wait` are `cp.async.commit_group` /
  `cp.async.wait_group N` (needs sm_80+).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.types import scalar_dtype

from .llvm_types import I32, I64, register_type, scalar_type
from .lowerings import lowering

_AXES = "xyz"
FULL_WARP = -1  # 0xffffffff as an i32


@lowering("thread_id")
def _thread_id(lw, op):
    return lw.intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", [])


@lowering("program_id")
def _program_id(lw, op):
    return lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.ctaid.{_AXES[op.attrs['axis']]}", [])


@lowering("num_programs")
def _num_programs(lw, op):
    return lw.intrinsic(f"llvm.nvvm.read.ptx.sreg.nctaid.{_AXES[op.attrs['axis']]}", [])


@lowering("pack")
def _pack(lw, op, *scalars):
    result = ir.Constant(register_type(op.result.type), ir.Undefined)
    for i, value in enumerate(scalars):
        result = lw.builder.insert_element(result, value, ir.Constant(I32, i))
    return result


@lowering("extract")
def _extract(lw, op, registers):
    return lw.builder.extract_element(registers, ir.Constant(I32, op.attrs["index"]))


@lowering("splat")
def _splat(lw, op, scalar):
    t = register_type(op.result.type)
    one = lw.builder.insert_element(ir.Constant(ir.VectorType(t.element, 1), ir.Undefined), scalar, ir.Constant(I32, 0))
    zeros = ir.Constant(ir.VectorType(I32, t.count), None)
    return lw.builder.shuffle_vector(one, ir.Constant(one.type, ir.Undefined), zeros)


@lowering("barrier")
def _barrier(lw, op):
    lw.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", [ir.Constant(I32, 0)])


@lowering("shared_alloc")
def _shared_alloc(lw, op):
    return lw.builder.gep(lw.shared_memory, [ir.Constant(I32, op.attrs["offset"])], source_etype=ir.IntType(8))


@lowering("shuffle")
def _shuffle(lw, op, value, lane):
    warp = lw.target.warp_size
    mode = op.attrs["mode"]
    width = op.attrs.get("width", 0) or warp
    clamp = ir.Constant(I32, ((warp - width) << 8) | (0 if mode == "up" else warp - 1))
    dtype = scalar_dtype(op.operands[0].type)
    bld = lw.builder

    def shfl(word):
        return lw.intrinsic(f"llvm.nvvm.shfl.sync.{mode}.i32", [ir.Constant(I32, FULL_WARP), word, lane, clamp])

    bits_type = ir.IntType(dtype.bits)
    bits = value if dtype.is_int or dtype.is_bool else bld.bitcast(value, bits_type)
    if dtype.bits == 64:
        low = shfl(bld.trunc(bits, I32))
        high = shfl(bld.trunc(bld.lshr(bits, ir.Constant(I64, 32)), I32))
        moved = bld.or_(bld.shl(bld.zext(high, I64), ir.Constant(I64, 32)), bld.zext(low, I64))
    elif dtype.bits == 32:
        moved = shfl(bits)
    else:  # bool (i1), 8- and 16-bit values ride in the low bits
        moved = bld.trunc(shfl(bld.zext(bits, I32)), bits.type)
    if dtype.is_int or dtype.is_bool:
        return moved
    return bld.bitcast(moved, scalar_type(dtype))


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


@lowering("breakpoint")
def _breakpoint(lw, op, *values):
    return None  # stops only the CPU interpreter
