"""Arithmetic on arrays of one IR dtype, as a device computes it.

Values of a dtype live in its `compute_dtype` (see `tessera.ir.dtypes`). An
operation computes in that numpy type (or float32/float64 for math
functions) and `to_dtype` then rounds the result to the values the dtype can
hold, which is what a device that computes in f32 and stores the narrow type
produces:

* f16, f32, f64 and byte-or-wider integers are numpy's own types: numpy
  already rounds (IEEE, round-to-nearest-even) and wraps (two's complement).
* bf16, fp8, fp6, fp4 and e8m0 are held in float32 and re-rounded with
  `dtype.quantize` after every operation. For + - * / and sqrt, float32 has
  more than twice their precision plus two bits, so this double rounding
  equals a single correct rounding.
* sub-byte integers are held in int8/uint8 and wrapped to their width with
  `dtype.quantize` (modular arithmetic commutes with the wrap).

Nothing here knows about ops or errors: callers check operands (integer
division by zero, say) and report problems with the op's location.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import DType

_NATIVE: dict[DType, bool] = {}


def is_native(dtype: DType) -> bool:
    """Whether numpy's arithmetic in compute_dtype already yields this dtype's values."""
    native = _NATIVE.get(dtype)
    if native is None:
        native = dtype.is_bool or dtype.compute_dtype.itemsize * 8 == dtype.bits
        _NATIVE[dtype] = native
    return native


def to_dtype(values, dtype: DType) -> np.ndarray:
    """Round/wrap a computed result to the values `dtype` holds (as compute_dtype)."""
    values = np.asarray(values)
    if values.dtype == dtype.compute_dtype and is_native(dtype):
        return values
    return np.asarray(dtype.quantize(values))


# -- binary ----------------------------------------------------------------


def _divide(a, b, dtype: DType):
    if dtype.is_float:
        return np.true_divide(a, b)
    # Truncate toward zero: a - fmod(a, b) is an exact multiple of b.
    return np.floor_divide(a - np.fmod(a, b), b)


def _shift_out_of_range(b, dtype: DType):
    return (b < 0) | (b >= dtype.bits)


def _shl(a, b, dtype: DType):
    out = _shift_out_of_range(b, dtype)
    return np.where(out, 0, np.left_shift(a, np.where(out, 0, b)))


def _shr(a, b, dtype: DType):
    out = _shift_out_of_range(b, dtype)
    shifted = np.right_shift(a, np.where(out, 0, b))  # arithmetic for signed numpy types
    # Shifting by >= bits leaves only sign bits: a >> (width - 1) is -1 or 0.
    fill = np.right_shift(a, a.dtype.itemsize * 8 - 1) if dtype.kind == "int" else 0
    return np.where(out, fill, shifted)


def _umulhi(a, b, dtype: DType):
    """The high `bits` of the 2*bits-bit product of a and b as unsigned numbers (64-bit: from 32-bit halves)."""
    bits = dtype.bits
    low = np.uint64((1 << min(bits, 32)) - 1)
    ua, ub = (np.asarray(v).astype(np.uint64) & np.uint64((1 << bits) - 1) for v in (a, b))
    if bits <= 32:
        return (ua * ub) >> np.uint64(bits)
    half = np.uint64(32)
    a_lo, a_hi, b_lo, b_hi = ua & low, ua >> half, ub & low, ub >> half
    cross = ((a_lo * b_lo) >> half) + ((a_hi * b_lo) & low) + a_lo * b_hi     # < 2**64: no wrap
    return a_hi * b_hi + ((a_hi * b_lo) >> half) + (cross >> half)


BINARY = {
    "add": lambda a, b, d: np.add(a, b),
    "sub": lambda a, b, d: np.subtract(a, b),
    "mul": lambda a, b, d: np.multiply(a, b),
    "div": _divide,
    "rem": lambda a, b, d: np.fmod(a, b),      # sign of a, like C
    "min": lambda a, b, d: np.fmin(a, b),      # a NaN operand yields the other
    "max": lambda a, b, d: np.fmax(a, b),
    "and": lambda a, b, d: np.bitwise_and(a, b),
    "or": lambda a, b, d: np.bitwise_or(a, b),
    "xor": lambda a, b, d: np.bitwise_xor(a, b),
    "umulhi": lambda a, b, d: _umulhi(a, b, d).astype(d.compute_dtype),
    "shl": _shl,
    "shr": _shr,
}


def binary(name: str, a, b, dtype: DType) -> np.ndarray:
    """`a <name> b` for operands of `dtype`, rounded to `dtype`."""
    return to_dtype(BINARY[name](a, b, dtype), dtype)


COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}


# -- unary -----------------------------------------------------------------


def _not(x, dtype: DType):
    return np.logical_not(x) if dtype.is_bool else np.invert(x)


UNARY = {
    "neg": lambda x, d: np.negative(x),
    "abs": lambda x, d: np.abs(x),
    "not": _not,
}


def unary(name: str, x, dtype: DType) -> np.ndarray:
    return to_dtype(UNARY[name](x, dtype), dtype)


_erf = np.frompyfunc(math.erf, 1, 1)

MATH = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
    "erf": lambda x: np.asarray(_erf(x.astype(np.float64)), dtype=np.float64).astype(x.dtype),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "floor": np.floor, "ceil": np.ceil,
}


def math_function(name: str, x, dtype: DType) -> np.ndarray:
    """A math function computed in float32 (float64 for f64), then rounded to `dtype`."""
    work = np.float64 if dtype.bits > 32 else np.float32
    return to_dtype(MATH[name](np.asarray(x, dtype=work)), dtype)


# -- tf32 ------------------------------------------------------------------


def round_to_tf32(values) -> np.ndarray:
    """f32 values rounded to tf32 (8-bit exponent, 10-bit mantissa) as `cvt.rna.tf32.f32` does: to nearest,
    ties away from zero (add half an ulp of tf32 to the magnitude's bits, drop the low 13), so a value past
    tf32's largest rounds to infinity; NaN stays NaN and infinities stay. Returned as float32 with the low 13
    bits zero: what tensor cores multiply when a dot asks for input_precision = "tf32"."""
    x = np.asarray(values, np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)
