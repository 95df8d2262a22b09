"""The type-promotion rules, as a specification (see tessera/dsl/promotion.py)."""

import itertools

import pytest
from hypothesis import given, strategies as st

from tessera.dsl import promotion
from tessera.dsl.promotion import (
    PromotionError, holds_exactly, operator_dtype, promote, python_scalar_dtype, weak_promote,
)
from tessera.ir.dtypes import (
    ALL_DTYPES, bf16, bool_, dtype_from_name, e8m0, f16, f32, f4e2m1, f64, f8e4m3, f8e5m2,
    i4, i8, i16, i32, i64, u4, u8, u16, u32, u64,
)

# ---------------------------------------------------------------------------
# Two tensors

INTEGER_AND_MIXED_CASES = [
    # same kind: the wider
    (i8, i32, i32), (u8, u16, u16), (i4, i8, i8), (u4, u8, u8),
    # signed with unsigned: a signed type that holds both
    (i16, u8, i16), (i8, u8, i16), (i8, u16, i32), (i32, u32, i64), (i64, u32, i64), (i4, u4, i8),
    # bool takes the other side's type
    (bool_, bool_, bool_), (bool_, i8, i8), (bool_, u4, u4), (bool_, f16, f16),
    # integer with float: the float, however wide the integer
    (i64, f16, f16), (u8, bf16, bf16), (i32, f8e4m3, f8e4m3),
]


@pytest.mark.parametrize("a, b, expected", INTEGER_AND_MIXED_CASES)
def test_common_dtype_of_two_tensors(a, b, expected):
    assert promote(a, b) == expected
    assert promote(b, a) == expected


def test_signed_integers_with_u64_have_no_common_type():
    with pytest.raises(PromotionError, match=r"no integer type holds both i64 and u64 values \(it would need more "
                                             r"than 64 bits\); cast one operand explicitly"):
        promote(i64, u64)
    with pytest.raises(PromotionError, match="no integer type holds both i8 and u64 values"):
        promote(u64, i8)


def _docstring_float_table() -> dict[tuple[str, str], str]:
    doc = promotion.__doc__
    start = doc.index("    a \\ b     f16")
    rows = doc[start:].split("\n\n")[0].splitlines()
    columns = rows[0].split()[3:]
    table = {}
    for row in rows[1:]:
        name, *cells = row.split()
        table.update({(name, col): cell for col, cell in zip(columns, cells)})
    return table


def test_the_float_table_in_the_docstring_is_what_promote_does():
    table = _docstring_float_table()
    floats = [d for d in ALL_DTYPES if d.is_float]
    assert len(table) == len(floats) ** 2
    for (a, b), expected in table.items():
        assert promote(dtype_from_name(a), dtype_from_name(b)).name == expected, (a, b)


@pytest.mark.parametrize("a, b, expected", [
    (f16, bf16, f32),          # neither holds the other
    (f16, f8e5m2, f16),        # e5m2 is the top byte of f16
    (f8e4m3, f8e5m2, f16),     # different fp8 formats meet in f16
    (f4e2m1, f8e4m3, f8e4m3),  # every fp4 value is an e4m3 value
    (e8m0, f16, f32),          # 2^-127 .. 2^127 exceed f16's range
    (e8m0, bf16, bf16),
    (f32, f64, f64),
])
def test_common_dtype_of_two_floats(a, b, expected):
    assert promote(a, b) == expected


@given(st.sampled_from(ALL_DTYPES), st.sampled_from(ALL_DTYPES))
def test_promote_is_symmetric(a, b):
    try:
        forward = promote(a, b)
    except PromotionError:
        with pytest.raises(PromotionError):
            promote(b, a)
        return
    assert promote(b, a) == forward


@given(st.sampled_from(ALL_DTYPES), st.sampled_from(ALL_DTYPES))
def test_common_type_of_same_kind_operands_holds_both_exactly(a, b):
    """Only integer + float may round (as in Triton); everything else is exact."""
    if a.is_float != b.is_float and not (a.is_bool or b.is_bool):
        return
    try:
        common = promote(a, b)
    except PromotionError:
        assert u64 in (a, b) and (a.kind == "int" or b.kind == "int")
        return
    for operand in (a, b):
        if common.is_float and operand.is_float:
            assert holds_exactly(common, operand)
        elif not operand.is_bool:
            assert common.min_value <= operand.min_value and operand.max_value <= common.max_value


def test_promote_is_associative_where_defined():
    dtypes = [bool_, i8, i16, i32, u8, u16, u32, f16, bf16, f32, f8e4m3]
    for a, b, c in itertools.product(dtypes, repeat=3):
        assert promote(promote(a, b), c) == promote(a, promote(b, c)), (a, b, c)


# ---------------------------------------------------------------------------
# A tensor with a Python scalar (NEP 50: the tensor's dtype wins)

@pytest.mark.parametrize("tensor, value, expected", [
    (i8, 1, i8), (u8, 255, u8), (u4, 3, u4), (i16, True, i16),
    (i8, 1.5, f32), (u64, 2.0, f32),
    (f16, 1, f16), (bf16, 1.5, bf16), (f8e4m3, 3, f8e4m3),
    (bool_, True, bool_), (bool_, 1, i32), (bool_, 2**40, i64), (bool_, 0.5, f32),
])
def test_weak_promotion(tensor, value, expected):
    assert weak_promote(tensor, value) == expected


def test_a_python_int_must_fit_the_integer_tensor():
    with pytest.raises(PromotionError,
                       match=r"the Python int 300 does not fit in u8 \(range 0..255\); cast the tensor first"):
        weak_promote(u8, 300)
    with pytest.raises(PromotionError, match="the Python int -1 does not fit in u32"):
        weak_promote(u32, -1)


@pytest.mark.parametrize("value, expected", [
    (True, bool_), (0, i32), (-2**31, i32), (2**31, i64), (-2**63, i64), (2**63, u64), (2**64 - 1, u64), (0.5, f32),
])
def test_python_scalars_on_their_own(value, expected):
    assert python_scalar_dtype(value) == expected


def test_python_ints_beyond_64_bits_are_errors():
    with pytest.raises(PromotionError, match="the integer 18446744073709551616 does not fit in 64 bits"):
        python_scalar_dtype(2**64)


# ---------------------------------------------------------------------------
# Operators

@pytest.mark.parametrize("op, common, expected", [
    ("+", i8, i8), ("*", bool_, i32), ("-", bool_, i32), ("//", u16, u16), ("%", f16, f16),
    ("+", f8e4m3, f32), ("*", e8m0, f32), ("+", bf16, bf16),
    ("/", i32, f32), ("/", bool_, f32), ("/", i64, f32), ("/", f16, f16), ("/", f64, f64), ("/", f8e5m2, f32),
    ("&", bool_, bool_), ("|", u8, u8), ("^", i64, i64),
    ("<<", i8, i8), (">>", bool_, i32),
    ("==", f8e4m3, f8e4m3), ("<", bool_, bool_),
])
def test_operator_dtype(op, common, expected):
    assert operator_dtype(op, common) == expected


def test_bitwise_operators_reject_floats_and_point_to_bitcasts():
    with pytest.raises(PromotionError, match=r"bitwise `&` needs integer or bool operands, not f32; .*bitcast=True"):
        operator_dtype("&", f32)


def test_shifts_reject_floats():
    with pytest.raises(PromotionError, match="shift `<<` needs integer operands, not f16"):
        operator_dtype("<<", f16)
