"""Floats LLVM has no type for (fp8, fp6, fp4, e8m0) <-> wider types, in plain integer LLVM IR.

Such a value lives in an `i8` register holding its bit pattern in the low
bits (fp8 and e8m0 in memory are the same byte; fp6 and fp4 are packed, and
the low-bit pass unpacks them into these registers). Only data movement
(load, store, select, shuffle, pack/extract/splat, loops) and conversions
touch them (`SMALL_FLOAT_OPS`); arithmetic happens after a cast to f32 (the
frontend promotes), or on an fp8 tensor core (`mma`, sm_89+; `mfma`,
gfx950), and the validator rejects anything else.

Conversions follow `tessera.ir.dtypes` bit for bit, so the GPU and the CPU
interpreter agree:

* decode (small float -> f32) is exact: normal patterns move their fields
  into an f32, subnormals are `m * 2^(1 - bias - M)` (e8m0, which has none,
  `2^-bias` at exponent 0), the all-ones patterns give inf (e5m2) or NaN
  (e4m3's S.1111.111, e8m0's 0xFF); fp6 and fp4 have neither;
* encode (f32/f64 -> small float) rounds once to nearest even, subnormals
  included; beyond the largest finite value a format without inf
  saturates (e4m3 at +-448, fp6 at +-7.5 / +-28, fp4 at +-6) and e5m2 gives
  +-inf; NaN becomes the canonical NaN that `DType.encode` writes, or +0 in
  a format without NaN. e8m0 rounds to a power of two (`_encode_e8m0`).

Integer arithmetic rather than PTX's `cvt.*.e4m3x2` keeps one definition for
every target (that instruction needs sm_89, and its `.satfinite` would also
saturate e5m2's infinities), and lets the CPU test run this very IR.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir import float_formats

from .types import F32, F64, int_constant, splat_constant, with_element

# Ops that may hold small floats (as i8 bit patterns; ldmatrix moves them); computing needs a cast to f32 first,
# except in `mma` / `mfma`, whose fp8 matrix instructions take the bit patterns (the dialects check the target).
SMALL_FLOAT_OPS = frozenset({"constant", "load", "store", "cast", "bitcast", "select", "pack", "extract", "splat",
                             "shuffle", "for", "if", "while", "breakpoint", "mma", "mfma", "ldmatrix", "unpack_bits",
                             "pack_bits"})

_SOURCE = {32: (F32, 8, 23), 64: (F64, 11, 52)}  # float width -> (type, exponent bits, mantissa bits)


def _ints(t: ir.Type, bits: int) -> ir.Type:
    return with_element(t, ir.IntType(bits))


def decode(bld: ir.IRBuilder, x, fmt: dt.DType):
    """Bit patterns `x` (i8 or <N x i8>) of the small float `fmt` -> f32, exactly."""
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    t32 = _ints(x.type, 32)

    def c(v):
        return int_constant(t32, v)

    b = bld.zext(x, t32)
    sign = bld.shl(bld.lshr(b, c(E + M)), c(31)) if fmt.has_sign else None
    e = bld.and_(bld.lshr(b, c(M)), c((1 << E) - 1))
    m = bld.and_(b, c((1 << M) - 1))
    normal = bld.or_(bld.shl(bld.add(e, c(127 - bias)), c(23)), bld.shl(m, c(23 - M)))
    # Exponent 0: subnormals m * 2^(1 - bias - M); without subnormals (e8m0) the value (2^M + m) * 2^(-bias - M).
    implicit, lowest = (0, 1 - bias) if fmt.has_subnormals else (1 << M, -bias)
    scale = splat_constant(with_element(x.type, F32), ir.Constant(F32, 2.0 ** (lowest - M)))
    significand = bld.uitofp(bld.add(m, c(implicit)) if implicit else m, with_element(x.type, F32))
    subnormal = bld.bitcast(bld.fmul(significand, scale), t32)  # exact
    mag = bld.select(bld.icmp_unsigned("==", e, c(0)), subnormal, normal)
    top = bld.icmp_unsigned("==", e, c((1 << E) - 1))
    if fmt.has_inf:  # IEEE style: m == 0 is inf, the rest NaN
        special = bld.select(bld.icmp_unsigned("==", m, c(0)), c(0x7F800000), c(0x7FC00000))
        mag = bld.select(top, special, mag)
    elif fmt.has_nan:  # "fn" style: only S.1111.111 is NaN
        nan = bld.and_(top, bld.icmp_unsigned("==", m, c((1 << M) - 1)))
        mag = bld.select(nan, c(0x7FC00000), mag)
    return bld.bitcast(mag if sign is None else bld.or_(mag, sign), with_element(x.type, F32))


def encode(bld: ir.IRBuilder, x, fmt: dt.DType):
    """f32 or f64 values `x` -> bit patterns (i8) of the small float `fmt`, rounded as `fmt.quantize` does."""
    if not fmt.has_subnormals:
        return _encode_e8m0(bld, x, fmt)
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    width, src_e, src_m, src_bias, c = _source(x)
    tw = _ints(x.type, width)
    bits = bld.bitcast(x, tw)
    sign = bld.lshr(bits, c(width - 1))
    mag = bld.and_(bits, c((1 << (width - 1)) - 1))
    is_nan = bld.icmp_unsigned(">", mag, c(((1 << src_e) - 1) << src_m))
    e_src = bld.lshr(mag, c(src_m))
    implicit = bld.shl(bld.zext(bld.icmp_unsigned("!=", e_src, c(0)), tw), c(src_m))
    significand = bld.or_(bld.and_(mag, c((1 << src_m) - 1)), implicit)
    # The target's biased exponent; at or below 0 the value is subnormal there and shifts right further.
    e = bld.sub(e_src, c(src_bias - bias))
    below = bld.sub(c(1), e)
    shift = bld.add(bld.select(bld.icmp_signed(">", below, c(0)), below, c(0)), c(src_m - M))
    # The significand has src_m + 1 bits: a shift of src_m + 2 already rounds it to 0 (and stays below `width`).
    shift = bld.select(bld.icmp_signed(">", shift, c(src_m + 2)), c(src_m + 2), shift)
    # Round `significand >> shift` to nearest even: add half - 1, plus the bit that becomes the last one.
    half_less_one = bld.sub(bld.shl(c(1), bld.sub(shift, c(1))), c(1))
    odd = bld.and_(bld.lshr(significand, shift), c(1))
    rounded = bld.lshr(bld.add(bld.add(significand, half_less_one), odd), shift)
    # A normal result carries its implicit bit in `rounded`, so the exponent field is e - 1 (a carry adds one).
    base = bld.select(bld.icmp_signed(">", e, c(1)), bld.shl(bld.sub(e, c(1)), c(M)), c(0))
    result = bld.add(base, rounded)
    largest = float_formats.max_finite_pattern(fmt)
    overflow_to = ((1 << E) - 1) << M if fmt.has_inf else largest  # e5m2: inf; the others saturate
    result = bld.select(bld.icmp_unsigned(">", result, c(largest)), c(overflow_to), result)
    result = bld.or_(result, bld.shl(sign, c(E + M)))
    nan = (((1 << E) - 1) << M) | (1 << (M - 1) if fmt.has_inf else (1 << M) - 1) if fmt.has_nan else 0
    result = bld.select(is_nan, c(nan), result)
    return bld.trunc(result, with_element(x.type, ir.IntType(8)))


def _source(x):
    """(width, exponent bits, mantissa bits, bias, constant maker) of the f32 or f64 values `x`, the constants
    being integers of x's width and shape."""
    width = 64 if (x.type.element if isinstance(x.type, ir.VectorType) else x.type) == F64 else 32
    _, src_e, src_m = _SOURCE[width]
    tw = _ints(x.type, width)
    return width, src_e, src_m, (1 << (src_e - 1)) - 1, lambda v: int_constant(tw, v)


def _encode_e8m0(bld: ir.IRBuilder, x, fmt: dt.DType):
    """f32/f64 -> e8m0 (2^(e - 127)): the nearest power of two, a tie 1.5 * 2^k going up; x <= 0 (and -inf)
    and anything below 2^-127 -> 0 (2^-127: there is no zero), beyond 2^127 -> 254, NaN -> 255."""
    width, src_e, src_m, src_bias, c = _source(x)
    tw = _ints(x.type, width)
    bits = bld.bitcast(x, tw)
    mag = bld.and_(bits, c((1 << (width - 1)) - 1))
    e_src = bld.lshr(mag, c(src_m))
    m = bld.and_(mag, c((1 << src_m) - 1))
    up = bld.zext(bld.icmp_unsigned(">=", m, c(1 << (src_m - 1))), tw)          # 1.5 * 2^k and above go up
    e = bld.add(bld.sub(e_src, c(src_bias - fmt.bias)), up)
    if src_e == 8:      # f32 holds values near 2^-127 as subnormals: m * 2^-149 >= 1.5 * 2^-127 rounds up to 2^-126
        tiny = bld.zext(bld.icmp_unsigned(">=", m, c(3 << (src_m - 2))), tw)
        e = bld.select(bld.icmp_unsigned("==", e_src, c(0)), tiny, e)
    e = bld.select(bld.icmp_signed("<", e, c(0)), c(0), e)
    e = bld.select(bld.icmp_signed(">", e, c(254)), c(254), e)
    negative = bld.icmp_signed("<", bits, c(0))
    e = bld.select(negative, c(0), e)
    is_nan = bld.icmp_unsigned(">", mag, c(((1 << src_e) - 1) << src_m))
    e = bld.select(is_nan, c(255), e)
    return bld.trunc(e, with_element(x.type, ir.IntType(8)))
