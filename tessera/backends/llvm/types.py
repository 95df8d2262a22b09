"""IR types -> LLVM types, and IR constants -> LLVM constants.

| IR                   | in registers                  | in memory |
| -------------------- | ----------------------------- | --------- |
| bool                 | i1                            | i8 (0/1)  |
| i8..i64, u8..u64     | i8..i64 (sign lives in ops)   | same      |
| i1..i7, u1..u7       | i8 holding the value (sign- / zero-extended; elementwise ops wrap after) | packed bits |
| f16 / bf16 / f32 / f64 | half / bfloat / float / double | same    |
| fp8, fp6, fp4, e8m0  | i8 (the bit pattern)          | fp8/e8m0 same; fp6/fp4 packed bits |
| ptr<T> / ptr<T, shared> | ptr addrspace(1) / addrspace(3) | -    |
| ptr<T> of a sub-byte T | i64 bit address (byte address * 8 + bit) | - |
| regs<N x T>          | <N x T> (a vector: elementwise ops apply as is) | - |

Small floats only move and convert (`small_floats.py`). Packed sub-byte
memory is never loaded or stored as such: the low-bit pass
(`tessera.passes.low_bit`) turns those accesses into byte accesses
(`byte_address`, `unpack_bits`, ...), and the validator rejects any left.
A kernel parameter pointing to a sub-byte type is an ordinary pointer in
the ABI; the kernel turns it into a bit address on entry.

llvmlite.ir has no `bfloat`; `BFloatType` adds it (constants print as
`0xRXXXX`). Float constants are formatted here for every width, from the
value the IR dtype rounds them to (`DType.encode`), so 1e6 in f16 is +inf
just as in the interpreter.
"""

from __future__ import annotations

import struct

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, RegsType, ScalarType, TensorMapType, Type

GLOBAL_ADDRSPACE = 1
SHARED_ADDRSPACE = 3
ADDRSPACES = {"global": GLOBAL_ADDRSPACE, "shared": SHARED_ADDRSPACE}


class BFloatType(ir.types._BaseFloatType):
    """LLVM's `bfloat` (the top half of an f32), missing from llvmlite.ir."""

    null = "0xR0000"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value) -> str:
        return f"0xR{int(dt.bf16.encode(value)):04X}"


BFloatType._create_instance()

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()

# Floats LLVM has no type for, held as i8 bit patterns (`small_floats.py`).
SMALL_FLOATS = (dt.f8e4m3, dt.f8e5m2, dt.f6e2m3, dt.f6e3m2, dt.f4e2m1, dt.e8m0)
FP8 = (dt.f8e4m3, dt.f8e5m2)
_FLOATS = {dt.f16: ir.HalfType(), dt.bf16: BFloatType(), dt.f32: F32, dt.f64: F64, **{d: I8 for d in SMALL_FLOATS}}


def scalar_type(dtype: dt.DType) -> ir.Type:
    """The register type of one value of `dtype` (bool -> i1, sub-byte integers -> i8)."""
    if dtype.is_bool:
        return I1
    if dtype.is_float:
        return _FLOATS[dtype]
    return I8 if dtype.is_subbyte else ir.IntType(dtype.bits)


def wrap_sub_byte(bld: ir.IRBuilder, x, dtype: dt.DType):
    """i8 registers `x` reduced to the value they hold as `dtype`, a sub-byte integer: the low `bits` bits,
    sign-extended (i1..i7) or zero-extended (u1..u7). Elementwise ops compute on the i8 and wrap after."""
    shift = 8 - dtype.bits
    amount = splat_constant(x.type, ir.Constant(I8, shift))
    if dtype.kind == "int":
        return bld.ashr(bld.shl(x, amount), amount)
    return bld.and_(x, splat_constant(x.type, ir.Constant(I8, (1 << dtype.bits) - 1)))


def memory_type(dtype: dt.DType) -> ir.Type:
    """The in-memory type of one element of `dtype` (bool -> i8)."""
    return I8 if dtype.is_bool else scalar_type(dtype)


def pointer_type(address_space: str) -> ir.PointerType:
    return ir.PointerType(addrspace=ADDRSPACES[address_space])


def is_bit_address(t: Type) -> bool:
    """Whether values of IR type `t` (a pointer or registers of them) are bit addresses: a sub-byte pointee."""
    elem = t.element if isinstance(t, RegsType) else t
    return isinstance(elem, PointerType) and elem.pointee.is_subbyte


def element_type(t: ScalarType | PointerType) -> ir.Type:
    if isinstance(t, PointerType):
        return I64 if t.pointee.is_subbyte else pointer_type(t.address_space)
    return scalar_type(t.dtype)


def parameter_type(t: Type) -> ir.Type:
    """The LLVM type of a kernel parameter of IR type `t`: a pointer (to any pointee), a tensor map's
    address, or a scalar (bool travels as one byte)."""
    if isinstance(t, PointerType):
        return pointer_type(t.address_space)
    if isinstance(t, ScalarType) and t.dtype.is_bool:
        return I8
    return register_type(t)


def register_type(t: Type) -> ir.Type:
    """The LLVM type of an IR value held in registers: a scalar, a pointer or a vector."""
    if isinstance(t, RegsType):
        return ir.VectorType(element_type(t.element), t.count)
    if isinstance(t, (ScalarType, PointerType)):
        return element_type(t)
    if isinstance(t, TensorMapType):
        return ir.PointerType()     # the address of the by-value map in parameter space
    raise TypeError(f"{t} has no register form")  # the validator rejects tiles and views first


def mangle(t: ir.Type) -> str:
    """The suffix an overloaded intrinsic uses for `t`: f32, bf16, i8, v4f32, p1."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.PointerType):
        return f"p{t.addrspace}"
    return t.intrinsic_name


def with_element(t: ir.Type, element: ir.Type) -> ir.Type:
    """`t`'s shape (scalar or vector) with another element type."""
    return ir.VectorType(element, t.count) if isinstance(t, ir.VectorType) else element


def lanes(t: ir.Type) -> int:
    return t.count if isinstance(t, ir.VectorType) else 1


# -- constants -------------------------------------------------------------------


def _float_literal(dtype: dt.DType, value) -> str:
    bits = int(dtype.encode(value))
    if dtype == dt.f16:
        return f"0xH{bits:04X}"
    if dtype == dt.bf16:
        return f"0xR{bits:04X}"
    if dtype == dt.f32:  # LLVM spells a float constant as the double of the same value
        (as_double,) = struct.unpack("<Q", struct.pack("<d", struct.unpack("<f", struct.pack("<I", bits))[0]))
        return f"0x{as_double:016X}"
    return f"0x{bits:016X}"


def scalar_constant(dtype: dt.DType, value) -> ir.Constant:
    """`value` as a constant of `dtype` (rounded/wrapped as a cast to `dtype` would)."""
    if dtype.is_bool:
        return ir.Constant(I1, int(bool(value)))
    if dtype in SMALL_FLOATS:
        bits = int(dtype.encode(value))
        return ir.Constant(I8, bits - 256 if bits >= 128 else bits)
    if dtype.is_float:
        return ir.FormattedConstant(scalar_type(dtype), _float_literal(dtype, value))
    wrapped = int(dtype.quantize(value))
    if dtype.is_subbyte:  # the value itself, in an i8
        return ir.Constant(I8, wrapped)
    if wrapped >= 1 << (dtype.bits - 1):  # print unsigned values two's complement
        wrapped -= 1 << dtype.bits
    return ir.Constant(ir.IntType(dtype.bits), wrapped)


def splat_constant(t: ir.Type, element: ir.Constant) -> ir.Constant:
    """`element` in every lane of `t` (or `element` itself when `t` is a scalar)."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [element] * t.count)
    return element


def constant(t: Type, value) -> ir.Constant:
    """An IR `constant` op's value: a scalar, or registers all holding `value`."""
    elem = t.element if isinstance(t, RegsType) else t
    c = scalar_constant(elem.dtype, value)
    return splat_constant(register_type(t), c)


def int_constant(t: ir.Type, value: int) -> ir.Constant:
    """An integer constant of the (scalar or vector) integer type `t`."""
    elem = t.element if isinstance(t, ir.VectorType) else t
    return splat_constant(t, ir.Constant(elem, value))
