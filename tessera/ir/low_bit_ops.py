"""Thread-level ops of packed low-bit data: sub-byte addresses, and bytes <-> values in registers.

Sub-byte tensors (i1..i7, u1..u7, fp4, fp6) are one little-endian bit
stream in memory: element k occupies bits [k*bits, (k+1)*bits) (see
`dtypes.pack`). A pointer to such an element is therefore a bit address,
which no load instruction takes. The low-bit pass (`passes/low_bit.py`)
rewrites every access through one into byte accesses with these ops:

    byte_address  element pointer -> the byte holding its first bit
    bit_offset    element pointer -> where in that byte (0..7) the element starts
    unpack_bits   registers of bytes -> the elements packed in them, as any dtype
    pack_bits     registers of elements -> the bytes that hold them

`unpack_bits` and `pack_bits` also serve 8-bit types (fp8, e8m0, i8, u8):
each byte is one element, and `unpack_bits` to a wider type is the fast
conversion the backends emit for the pair (magic numbers on NVIDIA and AMD).

Registered into the same op table as the tile ops (`ops.OPS`).
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import require
from .thread_ops import define_thread_op
from .types import PointerType, RegsType, ScalarType, Type, element_of, with_element


def _element_pointer(t: Type, what: str) -> PointerType:
    elem = element_of(t)
    require(isinstance(t, (PointerType, RegsType)) and isinstance(elem, PointerType)
            and elem.address_space == "global" and elem.pointee.is_subbyte,
            f"{what} takes a global pointer (or registers of them) to a sub-byte type, got {t}")
    return elem


def _infer_byte_address(ts, a):
    _element_pointer(ts[0], "byte_address")
    return [with_element(ts[0], PointerType(dt.u8))]


def _infer_bit_offset(ts, a):
    _element_pointer(ts[0], "bit_offset")
    return [with_element(ts[0], ScalarType(dt.i32))]


def packed_dtype(name: str) -> dt.DType:
    """The element type an `unpack_bits` attribute names (at most 8 bits)."""
    try:
        dtype = dt.dtype_from_name(name)
    except ValueError as e:
        require(False, f"unpack_bits: {e}")
    require(dtype.bits <= 8 and not dtype.is_bool, f"unpack_bits unpacks types of 1 to 8 bits, got {name}")
    return dtype


def _check_unpack_bits(op):
    (source,), (result,) = [v.type for v in op.operands], [r.type for r in op.results]
    require(isinstance(source, RegsType) and source.element == ScalarType(dt.u8),
            f"unpack_bits takes registers of bytes (regs<N x u8>), got {source}")
    packed = packed_dtype(op.attrs["packed"])
    require(isinstance(result, RegsType) and isinstance(result.element, ScalarType),
            f"unpack_bits produces registers of values, got {result}")
    require(result.count * packed.bits == source.count * 8,
            f"unpack_bits: {source.count} bytes hold {source.count * 8 // packed.bits} {packed.name} elements, "
            f"not {result.count}")


def _infer_pack_bits(ts, a):
    (values,) = ts
    require(isinstance(values, RegsType) and isinstance(values.element, ScalarType)
            and values.element.dtype.bits <= 8 and not values.element.dtype.is_bool,
            f"pack_bits takes registers of values of 1 to 8 bits, got {values}")
    bits = values.count * values.element.dtype.bits
    require(bits % 8 == 0, f"pack_bits: {values.count} {values.element} elements are {bits} bits, not whole bytes")
    return [RegsType(ScalarType(dt.u8), bits // 8)]


define_thread_op("byte_address", "The address of the byte holding the first bit of each sub-byte element pointer "
                 "(element k of a packed tensor starts at bit k * bits).", 1, infer=_infer_byte_address)
define_thread_op("bit_offset", "Where each sub-byte element pointer's element starts in its byte: (k * bits) % 8, "
                 "an i32 in 0..7.", 1, infer=_infer_bit_offset)
define_thread_op("unpack_bits", "The elements of type `packed` stored in the bytes (a little-endian bit stream, "
                 "element k at bits [k*bits, (k+1)*bits)), converted to the result's dtype as `cast` converts.", 1,
                 attrs={"packed": "str"}, check=_check_unpack_bits)
define_thread_op("pack_bits", "The bytes that store the elements as a little-endian bit stream (the inverse of "
                 "unpack_bits to the same type).", 1, infer=_infer_pack_bits)
