"""IR types -> LLVM types, and IR constants -> LLVM constants.

| IR                   | in registers                  | in memory |
| -------------------- | ----------------------------- | --------- |
| bool                 | i1                            | i8 (0/1)  |
| i8..i64, u8..u64     | i8..i64 (sign lives in ops)   | same      |
| f16 / bf16 / f32 / f64 | half / bfloat / float / double | same    |
| f8e4m3 / f8e5m2      | i8 (the bit pattern)          | same      |
| ptr<T> / ptr<T, shared> | ptr addrspace(1) / addrspace(3) | -    |
| regs<N x T>          | <N x T> (a vector: elementwise ops apply as is) | - |

fp8 values only move and convert (`fp8.py`). Sub-byte integers,
fp6/fp4 and e8m0 are not lowered yet: the validator rejects them (`unsupported_dtype_reason`) before any LLVM is built.

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

SUPPORTED_DTYPES: frozenset[dt.DType] = frozenset({
    dt.bool_, dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64,
    dt.f16, dt.bf16, dt.f32, dt.f64, dt.f8e4m3, dt.f8e5m2,
})

FP8 = (dt.f8e4m3, dt.f8e5m2)  # held as i8 bit patterns: LLVM has no fp8 type
_FLOATS = {dt.f16: ir.HalfType(), dt.bf16: BFloatType(), dt.f32: F32, dt.f64: F64, dt.f8e4m3: I8, dt.f8e5m2: I8}


def unsupported_dtype_reason(dtype: dt.DType, backend: str) -> str | None:
    """Why `backend` (NVPTX, AMDGPU) cannot hold `dtype` in a register yet, or None if it can."""
    if dtype in SUPPORTED_DTYPES:
        return None
    kind = "sub-byte" if dtype.is_subbyte else "8-bit float" if dtype.bits == 8 else "this"
    return (f"{kind} dtype {dtype.name} is not supported by the {backend} backend yet; "
            f"supported: {', '.join(d.name for d in sorted(SUPPORTED_DTYPES, key=_dtype_order))}. "
            f"Cast to a supported type (f16/bf16/f32 or an 8-bit integer) before this op")


def _dtype_order(d: dt.DType) -> int:
    return dt.ALL_DTYPES.index(d)


def scalar_type(dtype: dt.DType) -> ir.Type:
    """The register type of one value of `dtype` (bool -> i1)."""
    if dtype.is_bool:
        return I1
    if dtype.is_float:
        return _FLOATS[dtype]
    return ir.IntType(dtype.bits)


def memory_type(dtype: dt.DType) -> ir.Type:
    """The in-memory type of one element of `dtype` (bool -> i8)."""
    return I8 if dtype.is_bool else scalar_type(dtype)


def pointer_type(address_space: str) -> ir.PointerType:
    return ir.PointerType(addrspace=ADDRSPACES[address_space])


def element_type(t: ScalarType | PointerType) -> ir.Type:
    if isinstance(t, PointerType):
        return pointer_type(t.address_space)
    return scalar_type(t.dtype)


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
    if dtype in FP8:
        bits = int(dtype.encode(value))
        return ir.Constant(I8, bits - 256 if bits >= 128 else bits)
    if dtype.is_float:
        return ir.FormattedConstant(scalar_type(dtype), _float_literal(dtype, value))
    wrapped = int(dtype.quantize(value))
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
