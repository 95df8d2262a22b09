"""Thread-level ops -> LLVM: ids, register arrays, shuffles, barriers, shared memory.

The shape of each op is common; the instructions come from the dialect:

* `thread_id`, `program_id`, `num_programs`: `TargetDialect.thread_id` ...
  (the thread's index in the block, the block's index and the grid size
  along an axis, all i32);
* `pack` / `extract` / `splat` build and read register arrays (LLVM vectors);
* `barrier`: every thread of the block waits, and shared-memory writes
  before it are visible after it (`TargetDialect.barrier`);
* `shared_alloc` is its byte `offset` into the kernel's shared buffer;
* `shuffle` moves 32-bit words with `TargetDialect.shuffle_word`, over the
  whole warp (every lane must reach it), in segments of `width` lanes as
  CUDA's `__shfl_*_sync(..., width)` does. Values narrower than 32 bits
  are zero-extended and truncated back; 64-bit values move as two halves.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir.types import scalar_dtype

from .codegen_table import codegen_for
from .types import I32, I64, register_type, scalar_type


@codegen_for("thread_id")
def _thread_id(lw, op):
    return lw.dialect.thread_id(lw, reread=op.attrs.get("reread", False))


@codegen_for("program_id")
def _program_id(lw, op):
    return lw.dialect.program_id(lw, op.attrs["axis"])


@codegen_for("num_programs")
def _num_programs(lw, op):
    return lw.dialect.num_programs(lw, op.attrs["axis"])


@codegen_for("pack")
def _pack(lw, op, *scalars):
    result = ir.Constant(register_type(op.result.type), ir.Undefined)
    for i, value in enumerate(scalars):
        result = lw.builder.insert_element(result, value, ir.Constant(I32, i))
    return result


@codegen_for("extract")
def _extract(lw, op, registers):
    return lw.builder.extract_element(registers, ir.Constant(I32, op.attrs["index"]))


@codegen_for("splat")
def _splat(lw, op, scalar):
    t = register_type(op.result.type)
    one = lw.builder.insert_element(ir.Constant(ir.VectorType(t.element, 1), ir.Undefined), scalar, ir.Constant(I32, 0))
    zeros = ir.Constant(ir.VectorType(I32, t.count), None)
    return lw.builder.shuffle_vector(one, ir.Constant(one.type, ir.Undefined), zeros)


@codegen_for("barrier")
def _barrier(lw, op):
    lw.dialect.barrier(lw)


@codegen_for("nanosleep")
def _nanosleep(lw, op, ns):
    lw.dialect.nanosleep(lw, ns)


@codegen_for("shared_alloc")
def _shared_alloc(lw, op):
    return lw.builder.gep(lw.shared_memory, [ir.Constant(I32, op.attrs["offset"])], source_etype=ir.IntType(8))


@codegen_for("shuffle")
def _shuffle(lw, op, value, lane):
    mode = op.attrs["mode"]
    width = op.attrs.get("width", 0) or lw.target.warp_size
    dtype = scalar_dtype(op.operands[0].type)
    bld = lw.builder

    def shfl(word):
        return lw.dialect.shuffle_word(lw, mode, word, lane, width)

    as_int = isinstance(value.type, ir.IntType)     # integers, bool, and small floats' i8 bit patterns
    bits = value if as_int else bld.bitcast(value, ir.IntType(dtype.bits))
    if dtype.bits == 64:
        low = shfl(bld.trunc(bits, I32))
        high = shfl(bld.trunc(bld.lshr(bits, ir.Constant(I64, 32)), I32))
        moved = bld.or_(bld.shl(bld.zext(high, I64), ir.Constant(I64, 32)), bld.zext(low, I64))
    elif dtype.bits == 32:
        moved = shfl(bits)
    else:  # bool (i1), sub-byte, 8- and 16-bit values ride in the low bits
        moved = bld.trunc(shfl(bld.zext(bits, I32)), bits.type)
    if as_int:
        return moved
    return bld.bitcast(moved, scalar_type(dtype))


@codegen_for("breakpoint")
def _breakpoint(lw, op, *values):
    return None  # stops only the CPU interpreter
