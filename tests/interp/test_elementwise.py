"""Lane-by-lane ops against numpy/Python references, across dtypes.

The rule for narrow floats: a result is what a device computing in f32 (or
wider) and rounding once to the dtype stores, i.e. the correctly rounded
exact result for + - * /. Integers wrap modulo 2**bits; division truncates.
"""

import math

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from tessera.ir import dtypes as dt

from interp_kernels import run_op, tile

rng = np.random.default_rng(0)
N = 64

INT_TYPES = [dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64, dt.i4, dt.u3, dt.i1, dt.u7]
FLOAT_TYPES = [dt.f16, dt.bf16, dt.f32, dt.f64, dt.f8e4m3, dt.f8e5m2, dt.f6e3m2, dt.f4e2m1]


def ints(dtype, n=N):
    """Random values of an integer dtype, including its extremes, 0 and 1."""
    lo, hi = dtype.min_value, dtype.max_value
    edges = [lo, hi, 0, min(1, hi), max(-1, lo)]
    draw_type = np.uint64 if hi >= 2**63 else np.int64
    body = [int(x) for x in rng.integers(lo, hi, size=n - len(edges), endpoint=True, dtype=draw_type)]
    return np.array(edges + body, dtype=dtype.compute_dtype)


def floats(dtype, n=N, scale=None):
    """Random values representable in a float dtype, with zeros, and infinities/NaN where it has them."""
    scale = scale or min(float(dtype.max_value) / 8, 100.0)
    specials = [0.0, -0.0, 1.0, -1.5]
    specials += [np.inf, -np.inf] if dtype.has_inf else []
    specials += [np.nan] if dtype.has_nan else []
    body = rng.normal(size=n - len(specials)) * scale
    return np.asarray(dtype.quantize(np.array(specials + list(body))))


def wrap(python_ints, dtype):
    """Exact integers -> dtype by keeping the low bits (two's complement)."""
    out = []
    for v in python_ints:
        v &= (1 << dtype.bits) - 1
        if dtype.kind == "int" and v >= 1 << (dtype.bits - 1):
            v -= 1 << dtype.bits
        out.append(v)
    return np.array(out, dtype=dtype.compute_dtype)


def c_div(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


INT_REFERENCE = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": c_div,
    "rem": lambda a, b: a - c_div(a, b) * b,
    "min": min,
    "max": max,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
}


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
@pytest.mark.parametrize("name", list(INT_REFERENCE))
def test_integer_binary_ops_wrap_and_truncate_like_c(name, dtype):
    a, b = ints(dtype), rng.permutation(ints(dtype))
    if name in ("div", "rem"):
        b = np.where(b == 0, 1 if dtype.max_value >= 1 else -1, b).astype(b.dtype)
    expected = wrap([INT_REFERENCE[name](int(x), int(y)) for x, y in zip(a, b)], dtype)
    np.testing.assert_array_equal(run_op(name, (a, dtype), (b, dtype)), expected)


@pytest.mark.parametrize("name", ["div", "rem"])
def test_integer_division_by_zero_gives_zero_in_that_lane_only(name):
    # Not an error: masked-off lanes are routinely divided by a zero `other`.
    result = run_op(name, (np.array([7, 8, 9]), dt.i32), (np.array([2, 3, 0]), dt.i32))
    assert result.tolist() == ([3, 2, 0] if name == "div" else [1, 2, 0])


def test_int_min_divided_by_minus_one_wraps():
    assert run_op("div", (np.array([-128]), dt.i8), (np.array([-1]), dt.i8)).tolist() == [-128]


FLOAT_REFERENCE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "rem": np.fmod}


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=str)
@pytest.mark.parametrize("name", list(FLOAT_REFERENCE))
def test_float_arithmetic_is_the_exact_result_rounded_once(name, dtype):
    a, b = floats(dtype), rng.permutation(floats(dtype))
    with np.errstate(all="ignore"):
        expected = dtype.quantize(FLOAT_REFERENCE[name](a.astype(np.float64), b.astype(np.float64)))
    np.testing.assert_array_equal(run_op(name, (a, dtype), (b, dtype)), expected)


def test_bf16_addition_rounds_to_nearest_even():
    one = np.float32(1.0)
    half_ulp, three_half_ulps = np.float32(2.0**-8), np.float32(3 * 2.0**-8)
    got = run_op("add", (np.array([one, one]), dt.bf16), (np.array([half_ulp, three_half_ulps]), dt.bf16))
    assert got.tolist() == [1.0, 1.0 + 2.0**-6]


def test_float_division_by_zero_follows_ieee():
    got = run_op("div", (np.array([1.0, -1.0, 0.0]), dt.f32), (np.zeros(3), dt.f32))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


@pytest.mark.parametrize("name, expected", [("min", [1.0, 2.0, -1.0]), ("max", [1.0, 2.0, 3.0])])
def test_min_max_of_a_nan_and_a_number_is_the_number(name, expected):
    a = np.array([np.nan, 2.0, -1.0])
    b = np.array([1.0, np.nan, 3.0])
    assert run_op(name, (a, dt.f32), (b, dt.f32)).tolist() == expected


@pytest.mark.parametrize("dtype", [dt.i8, dt.u8, dt.i4, dt.u3, dt.i64, dt.u32], ids=str)
def test_shifts_by_at_least_the_width_give_zero_or_the_sign(dtype):
    values = ints(dtype, n=16)
    amounts = np.arange(-1, dtype.bits + 2) if dtype.kind == "int" else np.arange(0, dtype.bits + 3)
    a = np.repeat(values, len(amounts)).astype(dtype.compute_dtype)
    s = np.tile(amounts, len(values)).astype(dtype.compute_dtype)

    def shl(x, k):
        return 0 if k < 0 or k >= dtype.bits else x << k

    def shr(x, k):
        if 0 <= k < dtype.bits:
            return x >> k  # Python's >> is arithmetic; unsigned values are non-negative
        return -1 if x < 0 else 0

    for name, ref in (("shl", shl), ("shr", shr)):
        expected = wrap([ref(int(x), int(k)) for x, k in zip(a, s)], dtype)
        np.testing.assert_array_equal(run_op(name, (a, dtype), (s, dtype)), expected, err_msg=name)


@pytest.mark.parametrize("dtype", [dt.f32, dt.bf16, dt.i32, dt.u3, dt.bool_], ids=str)
@pytest.mark.parametrize("pred", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_give_bool(pred, dtype):
    if dtype.is_bool:
        a, b = rng.integers(0, 2, N).astype(bool), rng.integers(0, 2, N).astype(bool)
    elif dtype.is_float:
        a = floats(dtype)
        b = np.where(rng.random(N) < 0.3, a, rng.permutation(a)).astype(a.dtype)
    else:
        a, b = ints(dtype), rng.permutation(ints(dtype))
    ufunc = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
             "gt": np.greater, "ge": np.greater_equal}[pred]
    got = run_op("cmp", (a, dtype), (b, dtype), attrs={"pred": pred})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ufunc(a, b))


@pytest.mark.parametrize("dtype", [dt.i8, dt.i4, dt.u8, dt.u3], ids=str)
def test_integer_unary_ops_wrap(dtype):
    a = ints(dtype)
    np.testing.assert_array_equal(run_op("neg", (a, dtype)), wrap([-int(x) for x in a], dtype))
    np.testing.assert_array_equal(run_op("abs", (a, dtype)), wrap([abs(int(x)) for x in a], dtype))
    np.testing.assert_array_equal(run_op("not", (a, dtype)), wrap([~int(x) for x in a], dtype))


def test_not_of_bool_is_logical_not():
    assert run_op("not", (np.array([True, False]), dt.bool_)).tolist() == [False, True]


@pytest.mark.parametrize("dtype", [dt.f16, dt.bf16, dt.f8e4m3], ids=str)
def test_float_neg_and_abs_are_exact(dtype):
    a = floats(dtype)
    np.testing.assert_array_equal(run_op("neg", (a, dtype)), -a)
    np.testing.assert_array_equal(run_op("abs", (a, dtype)), np.abs(a))


MATH_CASES = {
    # name: (reference on float64, input range)
    "exp": (np.exp, (-5, 5)), "exp2": (np.exp2, (-5, 5)), "log": (np.log, (0.1, 100)),
    "log2": (np.log2, (0.1, 100)), "sqrt": (np.sqrt, (0, 100)), "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 100)),
    "sin": (np.sin, (-3, 3)), "cos": (np.cos, (-3, 3)), "tanh": (np.tanh, (-4, 4)),
    "erf": (np.vectorize(math.erf), (-3, 3)), "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    "floor": (np.floor, (-10, 10)), "ceil": (np.ceil, (-10, 10)),
}


@pytest.mark.parametrize("dtype", [dt.f16, dt.bf16, dt.f32, dt.f64], ids=str)
@pytest.mark.parametrize("name", list(MATH_CASES))
def test_math_functions_are_accurate_to_the_dtype(name, dtype):
    ref, (lo, hi) = MATH_CASES[name]
    x = np.asarray(dtype.quantize(rng.uniform(lo, hi, N)))
    got = run_op(name, (x, dtype))
    assert got.dtype == dtype.compute_dtype
    np.testing.assert_array_equal(got, dtype.quantize(got))  # representable in the dtype
    eps = 2.0 ** -dtype.mantissa_bits
    tolerance = 1e-13 if dtype is dt.f64 else 2 * eps
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=tolerance, atol=tolerance)


def test_erf_in_f64_is_math_erf():
    x = rng.normal(size=N)
    np.testing.assert_array_equal(run_op("erf", (x, dt.f64)), [math.erf(v) for v in x])


def test_math_on_special_values():
    got = run_op("sqrt", (np.array([-1.0, np.inf, 0.0]), dt.f32))
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0
    assert run_op("exp", (np.array([1000.0]), dt.bf16)).tolist() == [np.inf]


@pytest.mark.parametrize("dtype", [dt.f32, dt.i4, dt.bool_], ids=str)
def test_select_picks_lane_by_lane(dtype):
    cond = rng.integers(0, 2, N).astype(bool)
    a = np.asarray(dtype.quantize(rng.integers(-8, 8, N)))
    b = np.asarray(dtype.quantize(rng.integers(-8, 8, N)))
    np.testing.assert_array_equal(run_op("select", (cond, dt.bool_), (a, dtype), (b, dtype)), np.where(cond, a, b))


CASTS = [
    # (source values, source dtype, target dtype, expected)
    ([7.9, -7.9, np.nan, 1e10, -1e10, 127.5], dt.f32, dt.i8, [7, -7, 0, 127, -128, 127]),
    ([3.7, -1.0, 300.0], dt.f32, dt.u8, [3, 0, 255]),
    ([9, -9, 15, 16], dt.i32, dt.i4, [-7, 7, -1, 0]),
    ([9, 255], dt.i32, dt.u3, [1, 7]),
    ([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1e39], dt.f64, dt.bf16, [1.0, 1.0 + 2.0**-6, np.inf]),
    ([500.0, -500.0, 0.3], dt.f32, dt.f8e4m3, [448.0, -448.0, 0.3125]),
    ([2.0, 0.0, -0.5, np.nan], dt.f32, dt.bool_, [True, False, True, True]),
    ([True, False], dt.bool_, dt.f32, [1.0, 0.0]),
    ([2**24 + 1, -(2**24 + 3)], dt.i32, dt.f32, [2.0**24, -(2.0**24 + 4)]),
    ([65520.0, 65519.0], dt.f32, dt.f16, [np.inf, 65504.0]),
    ([-3, 2], dt.i4, dt.f4e2m1, [-3.0, 2.0]),
]


@pytest.mark.parametrize("values, source, target, expected", CASTS,
                         ids=[f"{s}->{t}" for _, s, t, _ in CASTS])
def test_cast_rounds_saturates_and_wraps(values, source, target, expected):
    got = run_op("cast", (np.array(values), source), result=tile(target, len(values)))
    np.testing.assert_array_equal(got, np.array(expected, dtype=target.compute_dtype))


@pytest.mark.parametrize("source, target", [(dt.f32, dt.i32), (dt.f32, dt.u32), (dt.bf16, dt.i16),
                                            (dt.f16, dt.u16), (dt.i4, dt.u4), (dt.f8e5m2, dt.u8)], ids=str)
def test_bitcast_reinterprets_the_bits(source, target):
    values = floats(source) if source.is_float else ints(source)
    got = run_op("bitcast", (values, source), result=tile(target, len(values)))
    np.testing.assert_array_equal(target.encode(got), source.encode(values))
    if source is dt.f32:
        np.testing.assert_array_equal(got, values.view(target.compute_dtype))
