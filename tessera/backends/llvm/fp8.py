"""fp8 (f8e4m3, f8e5m2) <-> wider types, in plain integer LLVM IR.

LLVM has no fp8 type, so an fp8 value lives in an `i8` register holding its
bit pattern, and memory holds the same byte. Only data movement (load,
store, select, shuffle, pack/extract/splat, loops) and conversions touch
fp8 values; arithmetic happens after a cast to f32 (the frontend promotes),
or on an fp8 tensor core (`mma`, sm_89+), and the validator rejects anything
else (`FP8_OPS`).

Conversions follow `tessera.ir.dtypes` bit for bit, so the GPU and the CPU
interpreter agree:

* decode (fp8 -> f32) is exact: normal patterns move their fields into an
  f32, subnormals are `m * 2^(1 - bias - M)`, the all-ones patterns give inf
  (e5m2) or NaN;
* encode (f32/f64 -> fp8) rounds once to nearest even, subnormals included;
  beyond the largest finite value e4m3 saturates to +-448 (it has no inf)
  and e5m2 gives +-inf; NaN becomes the canonical positive NaN (0x7F / 0x7E)
  that `DType.encode` writes.

Integer arithmetic rather than PTX's `cvt.*.e4m3x2` keeps one definition for
every target (that instruction needs sm_89, and its `.satfinite` would also
saturate e5m2's infinities), and lets the CPU test run this very IR.
"""

from __future__ import annotations

from llvmlite import ir

from tessera.ir import dtypes as dt
from tessera.ir import float_formats

from .types import F32, F64, int_constant, splat_constant, with_element

# Ops that may hold fp8 values (as i8 bit patterns; ldmatrix moves them); computing needs a cast to f32 first,
# except in `mma`, whose fp8 tensor-core instruction takes the bit patterns (the NVPTX dialect checks the target).
FP8_OPS = frozenset({"constant", "load", "store", "cast", "bitcast", "select", "pack", "extract", "splat",
                     "shuffle", "for", "if", "while", "breakpoint", "mma", "ldmatrix"})

_SOURCE = {32: (F32, 8, 23), 64: (F64, 11, 52)}  # float width -> (type, exponent bits, mantissa bits)


def _ints(t: ir.Type, bits: int) -> ir.Type:
    return with_element(t, ir.IntType(bits))


def decode(bld: ir.IRBuilder, x, fmt: dt.DType):
    """fp8 bit patterns `x` (i8 or <N x i8>) -> f32, exactly."""
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    t32 = _ints(x.type, 32)

    def c(v):
        return int_constant(t32, v)

    b = bld.zext(x, t32)
    sign = bld.shl(bld.lshr(b, c(E + M)), c(31))
    e = bld.and_(bld.lshr(b, c(M)), c((1 << E) - 1))
    m = bld.and_(b, c((1 << M) - 1))
    normal = bld.or_(bld.shl(bld.add(e, c(127 - bias)), c(23)), bld.shl(m, c(23 - M)))
    scale = splat_constant(with_element(x.type, F32), ir.Constant(F32, 2.0 ** (1 - bias - M)))
    subnormal = bld.bitcast(bld.fmul(bld.uitofp(m, with_element(x.type, F32)), scale), t32)  # exact
    mag = bld.select(bld.icmp_unsigned("==", e, c(0)), subnormal, normal)
    top = bld.icmp_unsigned("==", e, c((1 << E) - 1))
    if fmt.has_inf:  # IEEE style: m == 0 is inf, the rest NaN
        special = bld.select(bld.icmp_unsigned("==", m, c(0)), c(0x7F800000), c(0x7FC00000))
        mag = bld.select(top, special, mag)
    else:  # "fn" style: only S.1111.111 is NaN
        nan = bld.and_(top, bld.icmp_unsigned("==", m, c((1 << M) - 1)))
        mag = bld.select(nan, c(0x7FC00000), mag)
    return bld.bitcast(bld.or_(mag, sign), with_element(x.type, F32))


def encode(bld: ir.IRBuilder, x, fmt: dt.DType):
    """f32 or f64 values `x` -> fp8 bit patterns (i8), rounded to nearest even as `fmt.quantize` does."""
    E, M, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    width = 64 if (x.type.element if isinstance(x.type, ir.VectorType) else x.type) == F64 else 32
    _, src_e, src_m = _SOURCE[width]
    src_bias = (1 << (src_e - 1)) - 1
    tw = _ints(x.type, width)

    def c(v):
        return int_constant(tw, v)

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
    overflow_to = ((1 << E) - 1) << M if fmt.has_inf else largest  # e5m2: inf; e4m3: saturate at 448
    result = bld.select(bld.icmp_unsigned(">", result, c(largest)), c(overflow_to), result)
    result = bld.or_(result, bld.shl(sign, c(E + M)))
    nan = (((1 << E) - 1) << M) | (1 << (M - 1) if fmt.has_inf else (1 << M) - 1)
    result = bld.select(is_nan, c(nan), result)
    return bld.trunc(result, with_element(x.type, ir.IntType(8)))

