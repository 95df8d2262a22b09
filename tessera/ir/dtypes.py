"""Element data types of the IR, and the one definition of how values convert.

A `DType` is a value: its IR name, its width in bits, its kind, and for
floats the numbers that define the format (see `float_formats`). Everything
else is derived from those fields: which numpy type holds the values in the
CPU interpreter (`compute_dtype`), which holds them in memory
(`storage_dtype`), the range, and the conversions:

    quantize   any number -> the value it becomes in this type (casts)
    encode     value -> bit pattern          decode   bit pattern -> value
    pack       bit patterns -> bytes          unpack   bytes -> bit patterns

Conversion rules (what `quantize` does; the interpreter's casts are these):

    float -> float   round to nearest, ties to even, subnormals exact.
                     Too large: +-inf where the format has inf, else +-max.
                     NaN: NaN where the format has one, else +0.
    float -> int     NaN -> 0, truncate toward zero, saturate to the range
                     (PTX cvt.rzi.sat).
    int   -> int     keep the low `bits` bits, two's complement (wraps).
    int   -> float   round the exact integer to nearest even (i64/u64 too).
    any   -> bool    x != 0.
    e8m0             positive x -> nearest power of two, a tie 1.5 * 2^k
                     going up to 2^(k+1); x <= 0, -inf and anything below
                     2^-127 -> 2^-127 (there is no zero); NaN -> NaN.

`bool` occupies a whole byte like numpy's and torch's (bits == 8); the
one-bit integers are `i1` (values -1, 0) and `u1` (0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import float_formats

_KINDS = ("bool", "int", "uint", "float")
# Float formats that numpy implements natively: (exponent, mantissa) bits.
_NUMPY_FLOATS = {(5, 10): np.float16, (8, 23): np.float32, (11, 52): np.float64}


def _unsigned(bits: int) -> np.dtype:
    """Smallest unsigned numpy integer type with at least `bits` bits."""
    for t in (np.uint8, np.uint16, np.uint32, np.uint64):
        if bits <= np.dtype(t).itemsize * 8:
            return np.dtype(t)
    raise ValueError(f"no numpy integer holds {bits} bits")


@dataclass(frozen=True)
class DType:
    """An element type: IR name, width, kind and, for floats, the format."""

    name: str
    bits: int
    kind: str  # 'bool' | 'int' (signed) | 'uint' | 'float'
    exponent_bits: int = 0
    mantissa_bits: int = 0
    bias: int = 0
    has_inf: bool = False
    has_nan: bool = False
    has_sign: bool = True  # floats only: e8m0 has no sign bit
    has_subnormals: bool = True  # floats only: e8m0 has neither them nor zero

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"DType kind must be one of {_KINDS}, got {self.kind!r}")
        if self.is_float:
            fields = self.has_sign + self.exponent_bits + self.mantissa_bits
            if fields != self.bits:
                raise ValueError(f"{self.name}: sign+exponent+mantissa = {fields} bits, not {self.bits}")

    def __repr__(self) -> str:      # how a user writes it (and how help() shows a default)
        return f"tessera.{'bool_' if self.name == 'bool' else self.name}"

    def __str__(self) -> str:
        return self.name

    # -- classification ------------------------------------------------------

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """Signed or unsigned integer; bool is not an integer here."""
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int" or (self.is_float and self.has_sign)

    @property
    def is_subbyte(self) -> bool:
        return self.bits < 8

    @property
    def _numpy_float(self):
        """numpy's own type for this float format, or None."""
        if not self.is_float:
            return None
        return _NUMPY_FLOATS.get((self.exponent_bits, self.mantissa_bits))

    # -- numpy representations -----------------------------------------------

    @property
    def compute_dtype(self) -> np.dtype:
        """numpy type holding values in the CPU interpreter.

        Floats numpy lacks (bf16, fp8, fp6, fp4, e8m0) compute in float32,
        restricted to the values this type can represent.
        """
        if self.is_bool:
            return np.dtype(np.bool_)
        if self.is_float:
            return np.dtype(self._numpy_float or np.float32)
        unsigned = _unsigned(self.bits)
        return unsigned if self.kind == "uint" else np.dtype(f"i{unsigned.itemsize}")

    @property
    def storage_dtype(self) -> np.dtype:
        """numpy type of one element in memory; sub-byte types are packed bytes."""
        if self.is_subbyte:
            return np.dtype(np.uint8)
        if self.is_float and self._numpy_float is None:
            return _unsigned(self.bits)  # bf16 -> uint16, fp8 / e8m0 -> uint8
        return self.compute_dtype

    @property
    def min_value(self):
        """Smallest finite value (exact int for integers; e8m0: 2^-127)."""
        if self.is_bool:
            return False
        if self.kind == "int":
            return -(1 << (self.bits - 1))
        if self.kind == "uint":
            return 0
        if not self.has_sign:
            return float_formats.min_positive(self)
        return -self.max_value

    @property
    def max_value(self):
        """Largest finite value (exact int for integers)."""
        if self.is_bool:
            return True
        if self.kind == "int":
            return (1 << (self.bits - 1)) - 1
        if self.kind == "uint":
            return (1 << self.bits) - 1
        return float_formats.max_finite(self)

    # -- conversions -----------------------------------------------------------

    def quantize(self, values) -> np.ndarray:
        """Numbers of any numpy numeric kind -> compute_dtype array of the
        values they become in this type (rules in the module docstring)."""
        x = _numeric_array(values)
        if self.is_bool:
            return np.asarray(x != 0)
        if self.is_int:
            return self._float_to_int(x) if x.dtype.kind == "f" else self._wrap(x)
        if x.dtype.kind != "f" and self is not f64:  # numpy rounds ints to f64 exactly itself
            x = float_formats.integers_to_float64(x)
        if self._numpy_float is not None:
            with np.errstate(over="ignore"):  # overflow to inf is the rule
                return x.astype(self.compute_dtype)
        return float_formats.round_to_format(self, x).astype(self.compute_dtype)

    def encode(self, values) -> np.ndarray:
        """Values -> bit patterns in the smallest unsigned type of `bits` bits
        (sub-byte: uint8, low bits). Values are quantized first, so encoding
        is total; NaN encodes as the format's canonical NaN."""
        q = self.quantize(values)
        patterns = _unsigned(self.bits)
        if self.is_float and self._numpy_float is not None:
            return q.view(patterns)
        if self.is_float:
            return float_formats.encode(self, q).astype(patterns)
        mask = np.uint64((1 << self.bits) - 1)
        return np.asarray(q.astype(np.uint64) & mask).astype(patterns)

    def decode(self, bits) -> np.ndarray:
        """Bit patterns (unsigned ints, low `bits` bits used) -> compute_dtype values."""
        b = np.asarray(bits)
        if b.dtype.kind not in "biu":
            raise TypeError(f"{self.name}.decode expects integer bit patterns, got {b.dtype}")
        u = np.asarray(b.astype(np.uint64) & np.uint64((1 << self.bits) - 1))
        if self.is_bool:
            return np.asarray(u != 0)
        if self.is_int:
            return self._wrap(u)
        if self._numpy_float is not None:
            return u.astype(_unsigned(self.bits)).view(self.compute_dtype)
        return float_formats.decode(self, u).astype(self.compute_dtype)

    def _wrap(self, x: np.ndarray) -> np.ndarray:
        """Integers -> this integer type, modulo 2^bits (two's complement)."""
        mask = np.uint64((1 << self.bits) - 1)
        u = np.asarray(x.astype(np.uint64) & mask)
        if self.kind == "uint":
            return u.astype(self.compute_dtype)
        negative = (u >> np.uint64(self.bits - 1)) != 0
        u = np.where(negative, u | ~mask, u)  # sign-extend to 64 bits
        return u.view(np.int64).astype(self.compute_dtype)

    def _float_to_int(self, x: np.ndarray) -> np.ndarray:
        """Floats -> this integer type: NaN -> 0, truncate, saturate."""
        t = np.trunc(x.astype(np.float64))
        t = np.where(np.isnan(t), 0.0, t)
        lo, hi = float(self.min_value), float(self.max_value + 1)  # both exact powers of 2
        wide = np.int64 if self.kind == "int" else np.uint64
        in_range = np.where((t >= lo) & (t < hi), t, 0.0).astype(wide)
        result = np.where(t >= hi, wide(self.max_value), np.where(t < lo, wide(self.min_value), in_range))
        return result.astype(self.compute_dtype)


def _numeric_array(values) -> np.ndarray:
    x = np.asarray(values)
    if x.dtype.kind not in "biuf":
        raise TypeError(f"expected bool, integer or float numbers, got dtype {x.dtype}")
    return x


# -- the types ----------------------------------------------------------------

bool_ = DType("bool", 8, "bool")
i8, i16, i32, i64 = (DType(f"i{b}", b, "int") for b in (8, 16, 32, 64))
u8, u16, u32, u64 = (DType(f"u{b}", b, "uint") for b in (8, 16, 32, 64))
i1, i2, i3, i4, i5, i6, i7 = (DType(f"i{b}", b, "int") for b in range(1, 8))
u1, u2, u3, u4, u5, u6, u7 = (DType(f"u{b}", b, "uint") for b in range(1, 8))


def _float(name, exponent_bits, mantissa_bits, bias, has_inf, has_nan):
    bits = 1 + exponent_bits + mantissa_bits
    return DType(name, bits, "float", exponent_bits, mantissa_bits, bias, has_inf, has_nan)


# fmt: off
#                name     exp  man  bias  inf    nan
f16 = _float(    "f16",     5,  10,   15, True,  True)
bf16 = _float(   "bf16",    8,   7,  127, True,  True)   # top half of f32
f32 = _float(    "f32",     8,  23,  127, True,  True)
f64 = _float(    "f64",    11,  52, 1023, True,  True)
f8e4m3 = _float( "f8e4m3",  4,   3,    7, False, True)   # OCP E4M3FN: NaN = S.1111.111, max 448
f8e5m2 = _float( "f8e5m2",  5,   2,   15, True,  True)   # IEEE-like, max 57344
f6e2m3 = _float( "f6e2m3",  2,   3,    1, False, False)  # max 7.5
f6e3m2 = _float( "f6e3m2",  3,   2,    3, False, False)  # max 28
f4e2m1 = _float( "f4e2m1",  2,   1,    1, False, False)  # +-{0, .5, 1, 1.5, 2, 3, 4, 6}
# fmt: on
# MX block scale: 2^(e - 127), no sign, no zero, 0xFF is NaN.
e8m0 = DType("e8m0", 8, "float", 8, 0, 127, False, True, has_sign=False, has_subnormals=False)

ALL_DTYPES: tuple[DType, ...] = (
    bool_, i8, i16, i32, i64, u8, u16, u32, u64,
    f16, bf16, f32, f64, f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1, e8m0,
    i1, i2, i3, i4, i5, i6, i7, u1, u2, u3, u4, u5, u6, u7,
)  # fmt: skip

_BY_NAME = {t.name: t for t in ALL_DTYPES}
_BY_NUMPY = {
    np.dtype(np.bool_): bool_,
    **{np.dtype(f"i{t.bits // 8}"): t for t in (i8, i16, i32, i64)},
    **{np.dtype(f"u{t.bits // 8}"): t for t in (u8, u16, u32, u64)},
    np.dtype(np.float16): f16, np.dtype(np.float32): f32, np.dtype(np.float64): f64,
}  # fmt: skip


def dtype_from_name(name: str) -> DType:
    """IR spelling ('f32', 'i4', 'bool', ...) -> DType."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype {name!r}; valid names: {', '.join(_BY_NAME)}") from None


def dtype_from_numpy(dt) -> DType:
    """numpy bool, int8..uint64 or float16/32/64 (any byte order) -> DType."""
    try:
        key = np.dtype(dt).newbyteorder("=")
    except TypeError:
        key = None
    if key not in _BY_NUMPY:
        supported = "bool, int8..int64, uint8..uint64, float16/32/64"
        raise ValueError(f"no tessera dtype for numpy {dt!r}; supported: {supported}")
    return _BY_NUMPY[key]


# -- memory layout ------------------------------------------------------------


def pack(bit_patterns: np.ndarray, dtype: DType) -> np.ndarray:
    """Bit patterns -> 1-D uint8 array of the bytes in memory (little-endian).

    Sub-byte types form one little-endian bit stream: element k occupies bits
    [k*bits, (k+1)*bits), i.e. starts at bit (k*bits) % 8 of byte
    (k*bits) // 8, so a 3-, 5-, 6- or 7-bit element may straddle two bytes.
    The last byte is zero-padded. Wider types are their patterns' bytes.
    """
    p = np.asarray(bit_patterns)
    if p.dtype.kind not in "biu":
        raise TypeError(f"pack expects integer bit patterns (see {dtype.name}.encode), got {p.dtype}")
    p = p.reshape(-1)
    if not dtype.is_subbyte:
        return p.astype(_unsigned(dtype.bits).newbyteorder("<")).view(np.uint8)
    shifts = np.arange(dtype.bits, dtype=np.uint8)
    stream = (p.astype(np.uint8)[:, None] >> shifts) & 1  # row k: bits of element k, LSB first
    return np.packbits(stream.reshape(-1), bitorder="little")


def unpack(packed: np.ndarray, dtype: DType, count: int) -> np.ndarray:
    """Bytes from `pack` -> the first `count` bit patterns (uint8 for sub-byte)."""
    data = np.asarray(packed, dtype=np.uint8).reshape(-1)
    needed = -(-count * dtype.bits // 8)
    if data.size < needed:
        raise ValueError(f"{count} {dtype.name} elements need {needed} bytes, got {data.size}")
    if not dtype.is_subbyte:
        wide = _unsigned(dtype.bits)
        return data[:needed].view(wide.newbyteorder("<")).astype(wide)
    stream = np.unpackbits(data[:needed], count=count * dtype.bits, bitorder="little")
    weights = (1 << np.arange(dtype.bits)).astype(np.uint8)
    return (stream.reshape(count, dtype.bits) * weights).sum(axis=1, dtype=np.uint8)
