"""Specification of tessera.ir.dtypes: names, numpy types, float formats,
conversion (quantize) rules, bit patterns and packed memory layout.

Float formats are checked against references written here from the format
definitions alone: a per-pattern formula, a brute-force nearest-value search,
bit tricks on float32 for bf16, and numpy for f16.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.ir import dtypes as dt
from tessera.ir import float_formats
from tessera.ir.dtypes import (
    ALL_DTYPES, bf16, e8m0, f4e2m1, f6e2m3, f6e3m2, f8e4m3, f8e5m2, f16, f32, f64,
    i1, i3, i4, i8, i32, i64, u3, u4, u8, u16, u64,
)  # fmt: skip

FAST = settings(max_examples=200, deadline=None)

# -- names and numpy types --------------------------------------------------------

B, I8, I16, I32, I64 = np.bool_, np.int8, np.int16, np.int32, np.int64
U8, U16, U32, U64 = np.uint8, np.uint16, np.uint32, np.uint64
F16, F32, F64 = np.float16, np.float32, np.float64

#          name: (bits, compute_dtype, storage_dtype)
EXPECTED = {
    "bool": (8, B, B),
    "i8": (8, I8, I8), "i16": (16, I16, I16), "i32": (32, I32, I32), "i64": (64, I64, I64),
    "u8": (8, U8, U8), "u16": (16, U16, U16), "u32": (32, U32, U32), "u64": (64, U64, U64),
    "f16": (16, F16, F16), "bf16": (16, F32, U16), "f32": (32, F32, F32), "f64": (64, F64, F64),
    "f8e4m3": (8, F32, U8), "f8e5m2": (8, F32, U8), "e8m0": (8, F32, U8),
    "f6e2m3": (6, F32, U8), "f6e3m2": (6, F32, U8), "f4e2m1": (4, F32, U8),
    **{f"i{b}": (b, I8, U8) for b in range(1, 8)},
    **{f"u{b}": (b, U8, U8) for b in range(1, 8)},
}  # fmt: skip


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_name_bits_and_numpy_types(dtype):
    bits, compute, storage = EXPECTED[dtype.name]
    assert dt.dtype_from_name(dtype.name) is dtype
    assert str(dtype) == dtype.name
    assert dtype.bits == bits
    assert dtype.compute_dtype == np.dtype(compute)
    assert dtype.storage_dtype == np.dtype(storage)
    assert dtype.is_subbyte == (bits < 8)


def test_every_type_is_listed_once():
    assert sorted(t.name for t in ALL_DTYPES) == sorted(EXPECTED)


def test_unknown_name_is_a_value_error_listing_valid_names():
    with pytest.raises(ValueError, match="valid names: bool, i8"):
        dt.dtype_from_name("f7")


def test_dtype_from_numpy():
    assert dt.dtype_from_numpy(np.dtype(np.bool_)) is dt.bool_
    assert dt.dtype_from_numpy(np.dtype("int8")) is i8
    assert dt.dtype_from_numpy(np.uint64) is u64
    assert dt.dtype_from_numpy(np.dtype(">f4")) is f32  # byte order is storage, not type
    assert dt.dtype_from_numpy(np.float16) is f16
    for unsupported in (np.complex64, np.longdouble, np.dtype("M8[s]"), object):
        with pytest.raises(ValueError, match="no tessera dtype"):
            dt.dtype_from_numpy(unsupported)


def test_classification():
    assert dt.bool_.is_bool and not dt.bool_.is_int and not dt.bool_.is_signed
    assert i4.is_int and i4.is_signed and u4.is_int and not u4.is_signed
    assert bf16.is_float and bf16.is_signed and not bf16.is_int
    assert e8m0.is_float and not e8m0.is_signed  # a scale has no sign bit


# -- float formats: definitions ------------------------------------------------------

# Formats up to 8 bits, as the OCP / IEEE documents define them.
#           name: (exponent bits, mantissa bits, bias, special values)
DEFINITIONS = {
    "f8e4m3": (4, 3, 7, "NaN is S.1111.111 only"),
    "f8e5m2": (5, 2, 15, "IEEE"),
    "f6e2m3": (2, 3, 1, "none"),
    "f6e3m2": (3, 2, 3, "none"),
    "f4e2m1": (2, 1, 1, "none"),
}
SMALL_FLOATS = [f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1]


def reference_value(name, pattern):
    """Value of a bit pattern, straight from the format definition."""
    if name == "e8m0":
        return math.nan if pattern == 0xFF else 2.0 ** (pattern - 127)
    E, M, bias, specials = DEFINITIONS[name]
    sign = -1.0 if pattern >> (E + M) else 1.0
    exponent = (pattern >> M) % 2**E
    mantissa = pattern % 2**M
    if exponent == 2**E - 1 and specials == "IEEE":
        return sign * math.inf if mantissa == 0 else math.nan
    if exponent == 2**E - 1 and mantissa == 2**M - 1 and specials.startswith("NaN"):
        return math.nan
    if exponent == 0:  # subnormal
        return sign * (mantissa / 2**M) * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / 2**M) * 2.0 ** (exponent - bias)


@pytest.mark.parametrize("dtype", [*SMALL_FLOATS, e8m0], ids=str)
def test_decode_matches_format_definition(dtype):
    patterns = np.arange(2**dtype.bits)
    expected = np.array([reference_value(dtype.name, p) for p in patterns])
    decoded = dtype.decode(patterns)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, expected)
    numbers = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(decoded[numbers]), np.signbit(expected[numbers]))  # -0.0


def test_format_facts():
    positive_f4 = f4e2m1.decode(np.arange(8))
    assert positive_f4.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    maxima = {f8e4m3: 448, f8e5m2: 57344, f6e2m3: 7.5, f6e3m2: 28, f4e2m1: 6}
    for dtype, biggest in maxima.items():
        assert (dtype.max_value, dtype.min_value) == (biggest, -biggest)
    assert bf16.max_value == 2.0**128 - 2.0**120 and f16.max_value == 65504
    assert (e8m0.min_value, e8m0.max_value) == (2.0**-127, 2.0**127)
    smallest_subnormal = {f8e4m3: 2**-9, f8e5m2: 2**-16, f6e2m3: 2**-3, f6e3m2: 2**-4, f4e2m1: 0.5}
    for dtype, tiny in smallest_subnormal.items():
        assert dtype.decode(1) == tiny


def test_nan_and_signed_zero_encodings():
    assert f8e4m3.encode(np.nan) == 0x7F
    assert f8e5m2.encode(np.nan) == 0x7E  # quiet NaN
    assert bf16.encode(np.nan) == 0x7FC0
    assert e8m0.encode(np.nan) == 0xFF
    assert f8e4m3.encode(-0.0) == 0x80 and f4e2m1.encode(-0.0) == 0x8


@FAST
@given(st.lists(st.integers(0, 2**16 - 1), min_size=1, max_size=32))
def test_decode_then_encode_gives_back_the_bits(random_bits):
    for dtype in [f16, bf16, *SMALL_FLOATS, e8m0]:
        patterns = np.array(random_bits, dtype=np.uint64) % 2**dtype.bits
        values = dtype.decode(patterns)
        finite_or_inf = ~np.isnan(values)
        np.testing.assert_array_equal(dtype.encode(values[finite_or_inf]), patterns[finite_or_inf])


def test_bf16_is_the_top_half_of_f32():
    patterns = np.arange(2**16, dtype=np.uint32)
    np.testing.assert_array_equal(bf16.decode(patterns), (patterns << 16).view(np.float32))


def test_generic_codec_agrees_with_numpy_on_every_f16_pattern():
    patterns = np.arange(2**16, dtype=np.uint16)
    np.testing.assert_array_equal(float_formats.decode(f16, patterns), patterns.view(np.float16))
    finite = np.isfinite(patterns.view(np.float16))
    np.testing.assert_array_equal(float_formats.encode(f16, patterns.view(np.float16)[finite]), patterns[finite])


# -- float -> float rounding -------------------------------------------------------


def magnitudes(dtype):
    """(exact value, pattern) of every non-negative finite value, from the definition."""
    table = []
    for p in range(2 ** (dtype.bits - dtype.has_sign)):
        v = reference_value(dtype.name, p)
        if math.isfinite(v):
            table.append((Fraction(v), p))
    return table


TABLES = {t.name: magnitudes(t) for t in [*SMALL_FLOATS, e8m0]}
# IEEE overflow: at or beyond max + half an ulp the nearest value is 2^(emax+1).
INF_THRESHOLD = {"f8e5m2": Fraction(57344 + 4096)}


def nearest_reference(dtype, x):
    """Brute force: the representable value nearest to x, ties to even mantissa."""
    if math.isnan(x):
        return math.nan if dtype.has_nan else 0.0
    biggest = max(v for v, _ in TABLES[dtype.name])
    if math.isinf(x):
        magnitude = math.inf if dtype.has_inf else float(biggest)
    elif Fraction(abs(x)) >= INF_THRESHOLD.get(dtype.name, math.inf):
        magnitude = math.inf
    else:
        target = Fraction(abs(x))
        value, _ = min(TABLES[dtype.name], key=lambda vp: (abs(vp[0] - target), vp[1] % 2))
        magnitude = float(value)
    return math.copysign(magnitude, x)


def e8m0_reference(x):
    """Nearest power of two 2^-127..2^127, ties up; x <= 0 gives 2^-127."""
    if math.isnan(x):
        return math.nan
    if x <= 0:
        return 2.0**-127
    target = Fraction(x) if math.isfinite(x) else Fraction(2**200)
    value, _ = min(TABLES["e8m0"], key=lambda vp: (abs(vp[0] - target), -vp[0]))
    return float(value)


def probes(dtype):
    """Floats that matter for rounding: anything, in range, subnormal range,
    and exact midpoints between neighbours (ties) nudged by one float64 ulp."""
    values = sorted(v for v, _ in TABLES[dtype.name])
    points = [float(v) for v in values] + [float((a + b) / 2) for a, b in zip(values, values[1:])]
    points.append(float(values[-1] + (values[-1] - values[-2]) / 2))  # just past the top
    biggest, tiny = float(values[-1]), float(values[1])
    nudge = st.sampled_from([0, 1, -1])
    near = st.builds(lambda p, n, s: s * np.nextafter(p, n * math.inf) if n else s * p,
                     st.sampled_from(points), nudge, st.sampled_from([1.0, -1.0]))  # fmt: skip
    return st.one_of(
        st.floats(),
        st.floats(-4 * biggest, 4 * biggest),
        st.floats(-4 * tiny, 4 * tiny),
        near,
    )


PROBES = {t.name: probes(t) for t in [*SMALL_FLOATS, e8m0]}


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@pytest.mark.parametrize("dtype", SMALL_FLOATS, ids=str)
@FAST
@given(data=st.data())
def test_quantize_small_floats_rounds_to_nearest_even(dtype, data):
    x = data.draw(PROBES[dtype.name])
    got = dtype.quantize(np.float64(x))
    assert got.dtype == np.float32
    assert same(float(got), nearest_reference(dtype, x)), x


@FAST
@given(x=PROBES["e8m0"])
def test_quantize_e8m0_rounds_to_nearest_power_of_two(x):
    assert same(float(e8m0.quantize(x)), e8m0_reference(x)), x


def test_quantize_examples():
    assert f8e4m3.quantize([448, 464, 465, 1e9, -np.inf]).tolist() == [448, 448, 448, 448, -448]
    assert f8e5m2.quantize([61439, 61440, -np.inf]).tolist() == [57344, np.inf, -np.inf]
    assert f4e2m1.quantize([0.25, 0.75, 2.5, 5, 7, np.nan]).tolist() == [0, 1, 2, 4, 6, 0]
    assert e8m0.quantize([1.5, 1.49, 0, -3]).tolist() == [2, 1, 2.0**-127, 2.0**-127]


def bf16_reference(x32):
    """Round a float32 to bf16 on its bits: add 0x7FFF plus the kept LSB, cut 16 bits."""
    if math.isnan(x32):
        return math.nan
    u = int(np.float32(x32).view(np.uint32))
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return float(np.uint32(rounded << 16).view(np.float32))


float32_near_ties = st.builds(
    lambda top, low: float(np.uint32((top << 16) | low).view(np.float32)),
    st.integers(0, 0xFFFF), st.sampled_from([0x7FFF, 0x8000, 0x8001, 0, 0xFFFF]),
)  # fmt: skip


@FAST
@given(x=st.one_of(st.floats(width=32), float32_near_ties))
def test_quantize_bf16_matches_f32_bit_trick(x):
    assert same(float(bf16.quantize(np.float32(x))), bf16_reference(x)), x


def test_quantize_rounds_float64_once():
    # Through float32 this would be a tie (1 + 2^-8) and round down to 1.
    assert bf16.quantize(1 + 2**-8 + 2**-30) == 1 + 2**-7


@FAST
@given(x=st.floats())
def test_quantize_f16_matches_numpy_and_so_does_the_generic_codec(x):
    with np.errstate(over="ignore"):
        as_f16, as_f32 = float(np.float16(x)), float(np.float32(x))
    assert same(float(f16.quantize(x)), as_f16)
    assert same(float(float_formats.round_to_format(f16, x)), as_f16)
    assert same(float(float_formats.round_to_format(f32, x)), as_f32)


# -- integer -> float ----------------------------------------------------------------


def round_integer(n, dtype):
    """Exact integer rounded to the format's precision (ties to even), then range."""
    p = dtype.mantissa_bits + 1
    shift = max(abs(n).bit_length() - p, 0)
    q, r = divmod(abs(n), 2**shift)
    if shift and (2 * r > 2**shift or (2 * r == 2**shift and q % 2)):
        q += 1
    magnitude = q * 2**shift
    if magnitude > dtype.max_value:
        return math.copysign(math.inf if dtype.has_inf else dtype.max_value, n)
    return float(math.copysign(magnitude, n))


def near_integer_ties(p):
    """Integers one away from a tie between two p-bit neighbours, up to 2^64."""
    return st.builds(
        lambda q, s, d: (q << s) + (1 << (s - 1)) + d,
        st.integers(2 ** (p - 1), 2**p - 1), st.integers(1, 63 - p), st.sampled_from([-1, 0, 1]),
    )  # fmt: skip


@FAST
@given(st.one_of(st.integers(-(2**63), 2**64 - 1), *(near_integer_ties(p) for p in (2, 3, 4, 8, 11, 24))))
def test_quantize_integers_rounds_the_exact_value(n):
    array = np.array(n, dtype=np.int64 if n < 2**63 else np.uint64)
    for dtype in [f32, f16, bf16, f8e4m3, f8e5m2, f6e2m3, f6e3m2, f4e2m1]:
        assert float(dtype.quantize(array)) == round_integer(n, dtype), (dtype, n)


def test_quantize_f64_from_integers_is_numpy_cast():
    n = np.array([2**63 - 1, -(2**63)], dtype=np.int64)
    np.testing.assert_array_equal(f64.quantize(n), [2.0**63, -(2.0**63)])


# -- integers --------------------------------------------------------------------------


def test_integers_wrap_modulo_2_to_the_bits():
    assert i8.quantize([127, 128, -129, 255, 256]).tolist() == [127, -128, 127, -1, 0]
    assert u8.quantize([-1, 256, 257]).tolist() == [255, 0, 1]
    assert i4.quantize(np.arange(-9, 9)).tolist() == [7, *range(-8, 8), -8]
    assert i1.quantize([0, 1, 2, 3, -1, True]).tolist() == [0, -1, 0, -1, -1, -1]
    assert u64.quantize(np.int64(-1)) == 2**64 - 1
    assert i64.quantize(np.uint64(2**64 - 1)) == -1
    assert i32.quantize(np.uint64(2**32 + 5)) == 5


INT_TYPES = [t for t in ALL_DTYPES if t.is_int]


@FAST
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=16))
def test_integer_wrap_property(numbers):
    for dtype in INT_TYPES:
        modulus = 2**dtype.bits
        expected = [n % modulus for n in numbers]
        if dtype.is_signed:
            expected = [e - modulus if e >= modulus // 2 else e for e in expected]
        assert dtype.quantize(np.array(numbers, dtype=np.int64)).tolist() == expected, dtype


def test_float_to_int_truncates_saturates_and_zeroes_nan():
    nasty = [2.9, -2.9, np.nan, 1e30, -1e30, np.inf, -np.inf, -0.5]
    assert i8.quantize(nasty).tolist() == [2, -2, 0, 127, -128, 127, -128, 0]
    assert u8.quantize([-2.9, 255.9, 256.0, np.nan]).tolist() == [0, 255, 255, 0]
    assert i4.quantize([7.9, 8.0, -8.9, -9.0]).tolist() == [7, 7, -8, -8]
    assert i64.quantize([2.0**63, -(2.0**63)]).tolist() == [2**63 - 1, -(2**63)]
    assert u64.quantize([2.0**64, 2.0**64 - 2048, -1.0]).tolist() == [2**64 - 1, 2**64 - 2048, 0]


@FAST
@given(st.lists(st.floats(), max_size=16))
def test_float_to_int_property(floats):
    for dtype in INT_TYPES:
        expected = [0 if math.isnan(x) else int(min(max(x, dtype.min_value), dtype.max_value)) for x in floats]
        assert dtype.quantize(np.array(floats)).tolist() == expected, dtype


def test_subbyte_integer_ranges_and_patterns():
    for b in range(1, 8):
        signed, unsigned = dt.dtype_from_name(f"i{b}"), dt.dtype_from_name(f"u{b}")
        assert (signed.min_value, signed.max_value) == (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
        assert (unsigned.min_value, unsigned.max_value) == (0, 2**b - 1)
    assert i3.decode(np.arange(8)).tolist() == [0, 1, 2, 3, -4, -3, -2, -1]
    assert i3.encode([-1, -4, 3]).tolist() == [7, 4, 3]
    assert i1.decode([0, 1]).tolist() == [0, -1]


def test_to_bool_is_nonzero():
    assert dt.bool_.quantize([0, 2, -0.0, np.nan, 0.5]).tolist() == [False, True, False, True, True]
    assert f4e2m1.quantize(True) == 1.0


# -- packing ------------------------------------------------------------------------------

SUBBYTE = [t for t in ALL_DTYPES if t.is_subbyte]


def test_pack_examples():
    assert dt.pack(np.array([1, 2, 3]), u4).tolist() == [0x21, 0x03]
    # 3-bit elements straddle bytes: 1 | 2<<3 | 3<<6 | ... | 7<<18 == 0x1F58D1
    assert dt.pack(np.array([1, 2, 3, 4, 5, 6, 7, 0]), u3).tolist() == [0xD1, 0x58, 0x1F]
    assert dt.pack(f4e2m1.encode([1.0, -6.0]), f4e2m1).tolist() == [0xF2]
    assert dt.pack(np.array([0x1234]), u16).tolist() == [0x34, 0x12]  # little-endian
    assert dt.pack(bf16.encode([1.0]), bf16).tolist() == [0x80, 0x3F]


@FAST
@given(st.lists(st.integers(0, 127), max_size=50))
def test_pack_is_a_little_endian_bit_stream_and_unpack_inverts_it(random_bits):
    for dtype in SUBBYTE:
        patterns = [p % 2**dtype.bits for p in random_bits]
        packed = dt.pack(np.array(patterns, dtype=np.uint8), dtype)
        assert packed.dtype == np.uint8 and len(packed) == -(-len(patterns) * dtype.bits // 8)
        stream = int.from_bytes(packed.tobytes(), "little")
        for k, p in enumerate(patterns):
            assert (stream >> (k * dtype.bits)) % 2**dtype.bits == p
        assert dt.unpack(packed, dtype, len(patterns)).tolist() == patterns


@pytest.mark.parametrize("dtype", [u16, f32, i64, f8e5m2], ids=str)
def test_pack_wide_types_round_trip(dtype):
    values = dtype.quantize(np.array([0, 1, -2, 100, 3.5]))
    patterns = dtype.encode(values)
    unpacked = dt.unpack(dt.pack(patterns, dtype), dtype, len(patterns))
    np.testing.assert_array_equal(dtype.decode(unpacked), values)


def test_unpack_too_few_bytes_is_an_error():
    with pytest.raises(ValueError, match="3 u4 elements need 2 bytes"):
        dt.unpack(np.zeros(1, np.uint8), u4, 3)
