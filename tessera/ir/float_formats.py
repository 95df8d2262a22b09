"""One codec for every binary floating-point format, from fp4 to f64.

A format is described by a handful of numbers (any object with these
attributes works; `tessera.ir.dtypes.DType` is the usual one):

    exponent_bits  E     mantissa_bits  M     bias
    has_sign             has_subnormals       has_inf      has_nan

A bit pattern is [sign][exponent e: E bits][mantissa m: M bits] and means

    e == 0 and has_subnormals:   (-1)^s * m / 2^M       * 2^(1 - bias)
    otherwise:                   (-1)^s * (1 + m / 2^M) * 2^(e - bias)

except for the all-ones exponent, whose meaning follows from the flags:

    has_inf (IEEE style: f16, bf16, f32, f8e5m2)
        m == 0 is +-inf, every other m is NaN.
    has_nan only ("fn" style: f8e4m3, e8m0)
        only m == all ones is NaN (for e8m0, with M == 0, the whole
        exponent 255); the rest of that binade holds finite values.
    neither (f6e2m3, f6e3m2, f4e2m1)
        every pattern is a finite number.

All arithmetic is done on float64, which holds every value of every format
exactly (E <= 11, M <= 52), so decoding is exact and rounding is a single
round-to-nearest-even step: no double rounding, no per-element Python loops.
"""

from __future__ import annotations

import numpy as np

# Every integer below this is exact in float64.
_EXACT_INT_LIMIT = 2**53


def _field_max(width: int) -> int:
    return (1 << width) - 1


def max_finite_pattern(fmt) -> int:
    """Bit pattern of the largest finite value (sign bit clear)."""
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    if fmt.has_inf:  # top exponent is reserved: the binade below, all ones
        return ((_field_max(E) - 1) << M) | _field_max(M)
    if fmt.has_nan:  # only the all-ones pattern is NaN
        return _field_max(E + M) - 1
    return _field_max(E + M)


def max_finite(fmt) -> float:
    return float(decode(fmt, np.uint64(max_finite_pattern(fmt))))


def min_positive(fmt) -> float:
    """Smallest value above zero: the first subnormal, or 2^-bias without subnormals."""
    return float(decode(fmt, np.uint64(1 if fmt.has_subnormals else 0)))


def decode(fmt, bits) -> np.ndarray:
    """Bit patterns (unsigned integers, low E+M(+1) bits used) -> float64 values."""
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    b = np.asarray(bits).astype(np.uint64)
    m = (b & np.uint64(_field_max(M))).astype(np.float64)
    e = ((b >> np.uint64(M)) & np.uint64(_field_max(E))).astype(np.int64)
    implicit = 2.0**M
    scale = np.where(e == 0, 1, e) if fmt.has_subnormals else e
    significand = np.where((e == 0) & fmt.has_subnormals, m, m + implicit)
    with np.errstate(over="ignore"):  # f64's top exponent (inf/NaN) is replaced below
        mag = np.ldexp(significand, scale - bias - M)

    top = e == _field_max(E)
    if fmt.has_inf:
        mag = np.where(top & (m == 0), np.inf, mag)
        mag = np.where(top & (m != 0), np.nan, mag)
    elif fmt.has_nan:
        mag = np.where(top & (m == _field_max(M)), np.nan, mag)

    if fmt.has_sign:
        negative = ((b >> np.uint64(E + M)) & np.uint64(1)) == 1
        mag = np.where(negative, -mag, mag)
    return mag


def encode(fmt, values) -> np.ndarray:
    """Float64 values that the format represents exactly -> uint64 bit patterns.

    NaN encodes as the canonical NaN (positive; quiet for IEEE-style formats).
    A value the format cannot hold gives a meaningless pattern: round first.
    """
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    x = np.asarray(values, dtype=np.float64)
    nan, inf = np.isnan(x), np.isinf(x)
    a = np.where(nan | inf, 0.0, np.abs(x))

    _, exp2 = np.frexp(a)  # a = f * 2^exp2 with f in [0.5, 1)
    e_unbiased = exp2.astype(np.int64) - 1
    m = np.ldexp(a, M - e_unbiased) - 2.0**M
    e = e_unbiased + bias
    if fmt.has_subnormals:
        sub = (e <= 0) | (a == 0)
        m = np.where(sub, np.ldexp(np.where(sub, a, 0.0), bias - 1 + M), m)
        e = np.where(sub, 0, e)

    top = _field_max(E)
    nan_mantissa = (1 << (M - 1)) if fmt.has_inf else _field_max(M)
    e = np.where(nan | inf, top, e)
    m = np.where(inf, 0.0, np.where(nan, nan_mantissa, m))

    out = (e.astype(np.uint64) << np.uint64(M)) | m.astype(np.uint64)
    if fmt.has_sign:
        negative = np.signbit(x) & ~nan
        out = out | (negative.astype(np.uint64) << np.uint64(E + M))
    return np.asarray(out)


def round_to_format(fmt, values) -> np.ndarray:
    """Float64 values -> nearest value of the format (float64), ties to even.

    Beyond the range: +-inf if the format has infinities, else +-max finite.
    NaN stays NaN if the format has one, else becomes +0.
    Formats without a sign bit (e8m0) send every x <= 0 (and -inf) to their
    smallest value; formats without zero (e8m0) send tiny x to the smallest.
    """
    M = fmt.mantissa_bits
    x = np.asarray(values, dtype=np.float64)
    nan = np.isnan(x)
    a = np.where(np.isfinite(x), np.abs(x), 0.0)

    # Scale so that one unit in the last place of the target is 1.0, round
    # with rint (ties to even), and scale back. Below the normal range the
    # exponent is pinned at the smallest one, which yields the subnormals.
    _, exp2 = np.frexp(a)
    min_exponent = (1 if fmt.has_subnormals else 0) - fmt.bias
    e = np.maximum(exp2.astype(np.int64) - 1, min_exponent)
    with np.errstate(over="ignore"):  # near float64's max, r may become inf
        r = np.ldexp(np.rint(np.ldexp(a, M - e)), e - M)

    biggest = max_finite(fmt)
    overflow = (r > biggest) | np.isinf(x)
    r = np.where(overflow, np.inf if fmt.has_inf else biggest, r)

    smallest = min_positive(fmt)
    if not fmt.has_subnormals:  # no zero either
        r = np.maximum(r, smallest)
    if fmt.has_sign:
        r = np.copysign(r, x)
    else:
        r = np.where(np.signbit(x), smallest, r)
    return np.where(nan, np.nan if fmt.has_nan else 0.0, r)


def integers_to_float64(values) -> np.ndarray:
    """Integer array -> float64 that rounds correctly to any format of <= 41 bits.

    Integers below 2^53 are exact. Larger ones (from i64/u64) are cut to 53
    bits with the discarded bits OR-ed into the lowest kept one ("round to
    odd"); a later round-to-nearest-even to 41 or fewer significant bits then
    gives the same result as rounding the exact integer. Use numpy's own cast
    for f64, whose 53 bits this does not cover.
    """
    x = np.asarray(values)
    u = x.astype(np.uint64)  # two's complement for negatives
    negative = x < 0
    with np.errstate(over="ignore"):  # -u wraps for the positive lanes np.where discards
        magnitude = np.where(negative, ~u + np.uint64(1), u)
    kept = magnitude >> np.uint64(11)
    sticky = (magnitude & np.uint64(0x7FF)) != 0
    rounded_to_odd = np.ldexp((kept | sticky.astype(np.uint64)).astype(np.float64), 11)
    big = magnitude >= np.uint64(_EXACT_INT_LIMIT)
    result = np.where(big, rounded_to_odd, magnitude.astype(np.float64))
    return np.where(negative, -result, result)
