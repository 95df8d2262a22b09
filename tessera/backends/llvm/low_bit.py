"""The low-bit ops -> LLVM: sub-byte addresses, and bytes <-> values with fast conversions.

A pointer to a sub-byte type is a bit address (`types.py`), so
`byte_address` is `inttoptr(p >> 3)` and `bit_offset` is `p & 7`.

`unpack_bits` turns registers of bytes into values: by a bit trick on
32-bit words where `fast_dequant.py` has one for the pair of types (the
kernels' dequantizations: int1/2/4/8, fp4, fp8 and e8m0 to f16/bf16, and
f32 through them), else element by element: each element shifted and
masked out of its bytes, then the ordinary `cast` conversion. `pack_bits`
ORs each element's bits into the bytes it covers. Sub-byte integers come
out as their i8 registers hold them (sign- or zero-extended).
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.low_bit_ops import packed_dtype
from tessera.ir.types import scalar_dtype

from .codegen_table import codegen_for
from .fast_dequant import BF16, fast_half
from .ops import convert
from .types import I8, I16, I32, int_constant, pointer_type, scalar_type, with_element, wrap_sub_byte


@codegen_for("byte_address")
def _byte_address(lw, op, ptr):
    byte = lw.builder.lshr(ptr, int_constant(ptr.type, 3))
    return lw.builder.inttoptr(byte, with_element(ptr.type, pointer_type("global")))


@codegen_for("bit_offset")
def _bit_offset(lw, op, ptr):
    bld = lw.builder
    return bld.trunc(bld.and_(ptr, int_constant(ptr.type, 7)), with_element(ptr.type, I32))


@codegen_for("unpack_bits")
def _unpack_bits(lw, op, data):
    packed, result = packed_dtype(op.attrs["packed"]), scalar_dtype(op.result.type)
    return unpack(lw, data, packed, result, op.result.type.count)


@codegen_for("pack_bits")
def _pack_bits(lw, op, values):
    return pack(lw.builder, values, scalar_dtype(op.operands[0].type))


def unpack(lw, data, packed: dt.DType, result: dt.DType, count: int):
    """<B x i8> holding `count` elements of `packed` (a little-endian bit stream) -> <count x result>."""
    fast = fast_half(lw.builder, data, packed, result, count)
    if fast is not None:
        half_dtype = dt.bf16 if fast.type.element == BF16 else dt.f16
        return fast if half_dtype == result else convert(lw, fast, half_dtype, result)
    patterns = _patterns(lw.builder, data, packed, count)
    return patterns if result == packed else convert(lw, patterns, packed, result)


def pack(bld: ir.IRBuilder, values, dtype: dt.DType):
    """<N x T> of a type of at most 8 bits (its bit pattern in the low bits of the register) -> the
    N * bits / 8 bytes of their little-endian bit stream."""
    count, bits = values.type.count, dtype.bits
    if bits == 8:
        return values if values.type.element == I8 else bld.bitcast(values, ir.VectorType(I8, count))
    nbytes = count * bits // 8
    field = bld.and_(values, int_constant(values.type, (1 << bits) - 1))  # (signed sub-byte values are extended)
    wide = bld.zext(field, ir.VectorType(I16, count))
    result = ir.Constant(ir.VectorType(I8, nbytes), None)
    for j in range(nbytes):
        byte = None
        for i in range(j * 8 // bits, min(count, -(-(j + 1) * 8 // bits))):
            element = bld.extract_element(wide, ir.Constant(I32, i))
            shift = i * bits - 8 * j     # where the element starts relative to the byte (may be negative)
            part = bld.shl(element, ir.Constant(I16, shift)) if shift >= 0 else bld.lshr(element, ir.Constant(
                I16, -shift))
            byte = part if byte is None else bld.or_(byte, part)
        result = bld.insert_element(result, bld.trunc(byte, I8), ir.Constant(I32, j))
    return result


# -- element by element ----------------------------------------------------------------------


def _patterns(bld: ir.IRBuilder, data, dtype: dt.DType, count: int):
    """<count x R> of `dtype`'s register type R holding each element's bits, shifted out of the bytes."""
    register = scalar_type(dtype)
    if dtype.bits == 8:
        return data if register == I8 else bld.bitcast(data, ir.VectorType(register, count))
    bits, mask = dtype.bits, (1 << dtype.bits) - 1
    result = ir.Constant(ir.VectorType(register, count), None)
    for i in range(count):
        q, r = divmod(i * bits, 8)
        window = bld.zext(bld.extract_element(data, ir.Constant(I32, q)), I16)
        if r + bits > 8:
            high = bld.zext(bld.extract_element(data, ir.Constant(I32, q + 1)), I16)
            window = bld.or_(window, bld.shl(high, ir.Constant(I16, 8)))
        pattern = bld.trunc(bld.and_(bld.lshr(window, ir.Constant(I16, r)), ir.Constant(I16, mask)), register)
        result = bld.insert_element(result, pattern, ir.Constant(I32, i))
    return wrap_sub_byte(bld, result, dtype) if dtype.kind == "int" else result


