"""Operators and conversions on traced values, read off the IR they emit (tessera/dsl/operators.py)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera.dsl import operators, promotion
from tessera.dsl.errors import CompileError, ConstexprError, TypeMismatchError
from tessera.dsl.language.memory import BlockRef
from tessera.ir.dtypes import ALL_DTYPES, bool_, f16, f32, i32
from trace_harness import Trace, ir_text, raises


@pytest.fixture
def t():
    trace = Trace()
    yield trace
    trace.verify()  # whatever a test emitted must be valid IR


# ---------------------------------------------------------------------------
# to_tensor and cast


@pytest.mark.parametrize("value, type_text", [
    (True, "bool"), (7, "i32"), (-2**31, "i32"), (2**31, "i64"), (2**63, "u64"), (0.5, "f32"),
])
def test_python_numbers_become_constants_of_their_own_type(t, value, type_text):
    assert str(operators.to_tensor(t.ctx, value).type) == type_text


def test_a_python_int_beyond_64_bits_is_an_error(t):
    with raises(CompileError, "the integer 18446744073709551616 does not fit in 64 bits"):
        operators.to_tensor(t.ctx, 2**64)


def test_to_tensor_returns_tensors_unchanged_and_casts_them_when_asked(t):
    x = t.arg("tile<16xi32>", "x")
    assert operators.to_tensor(t.ctx, x) is x
    assert str(operators.to_tensor(t.ctx, x, f16).type) == "tile<16xf16>"


def test_to_tensor_checks_that_a_python_int_fits_the_requested_integer_type(t):
    from tessera.ir.dtypes import u8
    with raises(CompileError, "the Python int 300 does not fit in u8 (range 0..255)"):
        operators.to_tensor(t.ctx, 300, u8)


def test_numpy_scalars_count_as_python_numbers(t):
    assert str(operators.to_tensor(t.ctx, np.int64(3)).type) == "i32"
    assert str(operators.to_tensor(t.ctx, np.float64(0.5)).type) == "f32"


def test_to_tensor_rejects_non_numbers(t):
    with raises(CompileError, "expected a number or a tensor, got str 'x'"):
        operators.to_tensor(t.ctx, "x")


def test_cast_converts_and_bitcast_reinterprets(t):
    x = t.arg("tile<16xf32>", "x")
    operators.cast(t.ctx, x, f16)
    operators.cast(t.ctx, x, i32, bitcast=True)
    assert operators.cast(t.ctx, x, f32) is x
    assert t.ir() == ir_text("""
        %0 = cast %x : tile<16xf16>
        %1 = bitcast %x : tile<16xi32>
    """)


def test_casting_a_python_number_folds_like_a_cast(t):
    operators.cast(t.ctx, 2.7, i32)
    operators.cast(t.ctx, -1, "u8")  # dtypes may be named
    assert t.ir() == ir_text("""
        %0 = constant {value = 2} : i32
        %1 = constant {value = 255} : u8
    """)


def test_bitcast_needs_equal_widths(t):
    x = t.arg("tile<16xf32>", "x")
    with raises(TypeMismatchError, "cannot bitcast tile<16xf32> to f16: a bitcast needs equal widths (32 vs 16 bits)"):
        operators.cast(t.ctx, x, f16, bitcast=True)


def test_pointers_cast_only_to_their_64_bit_addresses(t):
    p = t.arg("ptr<f32>", "p")
    with raises(CompileError, "a pointer converts to its address, a 64-bit integer (tessera.i64 or tessera.u64), "
                              "not i32"):
        operators.cast(t.ctx, p, i32)


def test_the_cast_dtype_must_be_known_at_compile_time(t):
    n = t.arg("i32", "n")
    with raises(ConstexprError, "annotate that parameter `tessera.constexpr`"):
        operators.cast(t.ctx, n, n)


# ---------------------------------------------------------------------------
# Broadcasting


def test_a_python_scalar_becomes_a_constant_of_the_tile_shape(t):
    x = t.arg("tile<64xi8>", "x")
    operators.binary(t.ctx, "+", x, 1)
    assert t.ir() == ir_text("""
        %0 = constant {value = 1} : tile<64xi8>
        %1 = add %x, %0 : tile<64xi8>
    """)


def test_a_traced_scalar_splats(t):
    x, s = t.arg("tile<64xf32>", "x"), t.arg("f32", "s")
    operators.binary(t.ctx, "*", s, x)
    assert t.ir() == ir_text("""
        %0 = splat %s : tile<64xf32>
        %1 = mul %0, %x : tile<64xf32>
    """)


def test_shapes_align_at_the_right_and_size_1_dimensions_stretch(t):
    row, col = t.arg("tile<32xf32>", "row"), t.arg("tile<64x1xf32>", "col")
    result = operators.binary(t.ctx, "+", row, col)
    assert str(result.type) == "tile<64x32xf32>"
    assert t.ir() == ir_text("""
        %0 = reshape %row : tile<1x32xf32>
        %1 = broadcast %0 : tile<64x32xf32>
        %2 = broadcast %col : tile<64x32xf32>
        %3 = add %1, %2 : tile<64x32xf32>
    """)


def test_shapes_that_do_not_broadcast_are_an_error(t):
    a, b = t.arg("tile<64xf32>", "a"), t.arg("tile<32xf32>", "b")
    with raises(TypeMismatchError, "cannot add tile<64xf32> and tile<32xf32>: shapes (64,) and (32,) do not broadcast"):
        operators.binary(t.ctx, "+", a, b)


# ---------------------------------------------------------------------------
# Arithmetic and promotion


def test_operands_convert_to_the_common_type_first(t):
    a, b = t.arg("tile<16xi8>", "a"), t.arg("tile<16xf16>", "b")
    operators.binary(t.ctx, "-", a, b)
    assert t.ir() == ir_text("""
        %0 = cast %a : tile<16xf16>
        %1 = sub %0, %b : tile<16xf16>
    """)


def test_a_python_int_keeps_the_tensor_dtype_and_must_fit(t):
    x = t.arg("tile<16xu8>", "x")
    assert str(operators.binary(t.ctx, "+", x, 255).type) == "tile<16xu8>"
    with raises(TypeMismatchError, "cannot add tile<16xu8> and int 300: the Python int 300 does not fit in u8"):
        operators.binary(t.ctx, "+", x, 300)


def test_a_python_float_with_an_integer_tensor_is_f32(t):
    x = t.arg("tile<16xi32>", "x")
    assert str(operators.binary(t.ctx, "*", x, 0.5).type) == "tile<16xf32>"


def test_bool_arithmetic_computes_in_i32(t):
    a, b = t.arg("tile<16xbool>", "a"), t.arg("tile<16xbool>", "b")
    assert str(operators.binary(t.ctx, "+", a, b).type) == "tile<16xi32>"


def test_fp8_arithmetic_computes_in_f32(t):
    a, b = t.arg("tile<16xf8e4m3>", "a"), t.arg("tile<16xf8e4m3>", "b")
    assert str(operators.binary(t.ctx, "*", a, b).type) == "tile<16xf32>"


def test_true_division_of_integers_is_f32(t):
    a, b = t.arg("tile<16xi32>", "a"), t.arg("tile<16xi32>", "b")
    operators.binary(t.ctx, "/", a, b)
    assert t.ir() == ir_text("""
        %0 = cast %a : tile<16xf32>
        %1 = cast %b : tile<16xf32>
        %2 = div %0, %1 : tile<16xf32>
    """)


def test_integer_floor_division_truncates_like_c(t):
    """`//` on integers is the IR's truncating `div` (-7 // 2 == -3), as on the hardware."""
    a, b = t.arg("tile<16xi32>", "a"), t.arg("tile<16xi32>", "b")
    operators.binary(t.ctx, "//", a, b)
    assert t.ir() == ir_text("%0 = div %a, %b : tile<16xi32>")


def test_float_floor_division_floors(t):
    a, b = t.arg("tile<16xf32>", "a"), t.arg("tile<16xf32>", "b")
    operators.binary(t.ctx, "//", a, b)
    assert t.ir() == ir_text("""
        %0 = div %a, %b : tile<16xf32>
        %1 = floor %0 : tile<16xf32>
    """)


def test_remainder_is_the_ir_rem_with_the_sign_of_the_dividend(t):
    a = t.arg("tile<16xi32>", "a")
    operators.binary(t.ctx, "%", a, 3)
    assert t.ir() == ir_text("""
        %0 = constant {value = 3} : tile<16xi32>
        %1 = rem %a, %0 : tile<16xi32>
    """)


def test_bitwise_operators_keep_bool(t):
    a, b = t.arg("tile<16xbool>", "a"), t.arg("tile<16xbool>", "b")
    assert str(operators.binary(t.ctx, "&", a, b).type) == "tile<16xbool>"
    assert str(operators.binary(t.ctx, "^", a, b).type) == "tile<16xbool>"


def test_bitwise_operators_reject_floats(t):
    a = t.arg("tile<16xf32>", "a")
    with raises(TypeMismatchError, "cannot bitwise-or tile<16xf32> and int 1: bitwise `|` needs integer or bool "
                                   "operands, not f32"):
        operators.binary(t.ctx, "|", a, 1)


def test_shifts(t):
    a = t.arg("tile<16xu32>", "a")
    operators.binary(t.ctx, ">>", a, 4)
    assert t.ir() == ir_text("""
        %0 = constant {value = 4} : tile<16xu32>
        %1 = shr %a, %0 : tile<16xu32>
    """)


def test_power_is_an_error_that_points_to_exp2(t):
    a = t.arg("tile<16xf32>", "a")
    with raises(CompileError, "`**` is not supported on traced values: for floats write "
                              "tessera.exp2(y * tessera.log2(x))"):
        operators.binary(t.ctx, "**", a, 2)


def test_views_have_no_operators(t):
    v = t.arg("view<f32, 2>", "v")
    with raises(TypeMismatchError, "cannot add view<f32, 2> and int 1: a view has no elementwise operators; "
                                   "load a block of it first"):
        operators.binary(t.ctx, "+", v, 1)


def test_non_numbers_are_not_operands(t):
    a = t.arg("tile<16xf32>", "a")
    with raises(TypeMismatchError, "cannot multiply tile<16xf32> and NoneType None: NoneType None is not a number"):
        operators.binary(t.ctx, "*", a, None)


# ---------------------------------------------------------------------------
# Pointer arithmetic


def test_pointer_plus_offsets_is_a_tile_of_pointers(t):
    p, offs = t.arg("ptr<f16>", "p"), t.arg("tile<64xi32>", "offs")
    result = operators.binary(t.ctx, "+", p, offs)
    operators.binary(t.ctx, "+", offs, p)
    assert str(result.type) == "tile<64xptr<f16>>"
    assert t.ir() == ir_text("""
        %0 = splat %p : tile<64xptr<f16>>
        %1 = addptr %0, %offs : tile<64xptr<f16>>
        %2 = splat %p : tile<64xptr<f16>>
        %3 = addptr %2, %offs : tile<64xptr<f16>>
    """)


def test_pointer_minus_an_int_adds_the_negated_offset(t):
    p, u = t.arg("tile<4xptr<f32>>", "p"), t.arg("u32", "u")
    operators.binary(t.ctx, "-", p, 3)
    operators.binary(t.ctx, "-", p, u)
    assert t.ir() == ir_text("""
        %0 = constant {value = -3} : tile<4xi32>
        %1 = addptr %p, %0 : tile<4xptr<f32>>
        %2 = cast %u : i64
        %3 = neg %2 : i64
        %4 = splat %3 : tile<4xi64>
        %5 = addptr %p, %4 : tile<4xptr<f32>>
    """)


@pytest.mark.parametrize("op, other, message", [
    ("+", 1.5, "pointer offsets must be integers, got float 1.5"),
    ("*", 2, "pointers support only `pointer + integer`, `integer + pointer` and `pointer - integer`"),
])
def test_other_pointer_arithmetic_is_an_error(t, op, other, message):
    p = t.arg("ptr<f32>", "p")
    with raises(TypeMismatchError, message):
        operators.binary(t.ctx, op, p, other)


def test_two_pointers_do_not_add_or_subtract(t):
    p, q = t.arg("ptr<f32>", "p"), t.arg("ptr<f32>", "q")
    for op in ("+", "-"):
        with raises(TypeMismatchError, "pointers support only `pointer + integer`"):
            operators.binary(t.ctx, op, p, q)


def test_float_offsets_are_an_error(t):
    p, f = t.arg("ptr<f32>", "p"), t.arg("tile<4xf32>", "f")
    with raises(TypeMismatchError, "pointer offsets must be integers, got tile<4xf32>"):
        operators.binary(t.ctx, "+", p, f)


# ---------------------------------------------------------------------------
# Comparisons, unary and logical operators, truth


def test_comparisons_promote_broadcast_and_give_bool(t):
    offs, n = t.arg("tile<64xi32>", "offs"), t.arg("i64", "n")
    result = operators.compare(t.ctx, "<", offs, n)
    assert str(result.type) == "tile<64xbool>"
    assert t.ir() == ir_text("""
        %0 = cast %offs : tile<64xi64>
        %1 = splat %n : tile<64xi64>
        %2 = cmp %0, %1 {pred = "lt"} : tile<64xbool>
    """)


def test_pointers_do_not_compare(t):
    p = t.arg("ptr<f32>", "p")
    with raises(TypeMismatchError, "pointers cannot be compared; compare their integer offsets instead"):
        operators.compare(t.ctx, "==", p, p)


def test_negating_bool_computes_in_i32(t):
    b = t.arg("tile<4xbool>", "b")
    operators.unary(t.ctx, "-", b)
    assert t.ir() == ir_text("""
        %0 = cast %b : tile<4xi32>
        %1 = neg %0 : tile<4xi32>
    """)


def test_unary_plus_is_the_value_itself(t):
    x = t.arg("tile<4xf32>", "x")
    assert operators.unary(t.ctx, "+", x) is x


def test_invert_needs_integers_or_bool(t):
    x, f = t.arg("tile<4xi8>", "x"), t.arg("tile<4xf32>", "f")
    assert str(operators.unary(t.ctx, "~", x).type) == "tile<4xi8>"
    with raises(TypeMismatchError, "cannot apply `~` to tile<4xf32>: it needs integer or bool operands"):
        operators.unary(t.ctx, "~", f)


def test_not_is_logical_per_lane(t):
    x, b = t.arg("tile<4xi32>", "x"), t.arg("tile<4xbool>", "b")
    operators.unary(t.ctx, "not", x)
    operators.unary(t.ctx, "not", b)
    assert t.ir() == ir_text("""
        %0 = constant {value = 0} : tile<4xi32>
        %1 = cmp %x, %0 {pred = "eq"} : tile<4xbool>
        %2 = not %b : tile<4xbool>
    """)


def test_and_or_convert_both_sides_to_bool_and_combine_lanes(t):
    x, flag = t.arg("tile<4xi32>", "x"), t.arg("bool", "flag")
    result = operators.logical(t.ctx, "and", x, flag)
    assert str(result.type) == "tile<4xbool>"
    assert t.ir() == ir_text("""
        %0 = constant {value = 0} : tile<4xi32>
        %1 = cmp %x, %0 {pred = "ne"} : tile<4xbool>
        %2 = splat %flag : tile<4xbool>
        %3 = and %1, %2 : tile<4xbool>
    """)


def test_logical_operators_take_python_operands_as_bools(t):
    mask = t.arg("tile<4xbool>", "mask")
    operators.logical(t.ctx, "or", mask, 0)
    assert t.ir() == ir_text("""
        %0 = constant {value = false} : tile<4xbool>
        %1 = or %mask, %0 : tile<4xbool>
    """)


def test_pointers_have_no_truth_value(t):
    p = t.arg("ptr<f32>", "p")
    with raises(TypeMismatchError, "a ptr<f32> has no truth value; a condition must be a bool or a number"):
        operators.truth(t.ctx, p)
    with raises(CompileError, "an operand of `and` must be bool or numeric, got ptr<f32>"):
        operators.logical(t.ctx, "and", p, True)


def test_truth_of_a_bool_scalar_is_itself_and_of_a_number_is_nonzero(t):
    flag, n = t.arg("bool", "flag"), t.arg("f32", "n")
    assert operators.truth(t.ctx, flag) is flag
    operators.truth(t.ctx, n)
    assert t.ir() == ir_text("""
        %0 = constant {value = 0.0} : f32
        %1 = cmp %n, %0 {pred = "ne"} : bool
    """)


def test_a_tile_has_no_truth_value(t):
    mask = t.arg("tile<64xbool>", "mask")
    with raises(TypeMismatchError, "the condition is a tile<64xbool>, but `if` and `while` need a single bool: for a "
                                   "per-lane choice use tessera.where(condition, a, b)"):
        operators.truth(t.ctx, mask)


# ---------------------------------------------------------------------------
# Subscripts


def test_none_inserts_size_1_axes(t):
    x = t.arg("tile<64xf32>", "x")
    assert str(operators.subscript(t.ctx, x, (None, slice(None))).type) == "tile<1x64xf32>"
    assert str(operators.subscript(t.ctx, x, (slice(None), None)).type) == "tile<64x1xf32>"
    assert str(operators.subscript(t.ctx, x, None).type) == "tile<1x64xf32>"
    assert str(operators.subscript(t.ctx, x, (Ellipsis, None)).type) == "tile<64x1xf32>"
    assert t.ir().splitlines()[0] == "%0 = expand_dims %x {axis = 0} : tile<1x64xf32>"


@pytest.mark.parametrize("index, shown", [(0, "0"), (slice(0, 4), "0:4"), ((slice(None), 1), ":, 1")])
def test_tiles_are_not_indexable(t, index, shown):
    x = t.arg("tile<64x4xf32>", "x")
    with raises(TypeMismatchError, f"cannot index tile<64x4xf32> with [{shown}]: tiles are not indexable; only None "
                                   f"(a new axis), `:` and `...` may appear"):
        operators.subscript(t.ctx, x, index)


def test_indexing_with_a_traced_value_explains_how_to_load(t):
    x, i = t.arg("tile<64xf32>", "x"), t.arg("i32", "i")
    with raises(TypeMismatchError, "[i32]: tiles are not indexable"):
        operators.subscript(t.ctx, x, i)
    with raises(TypeMismatchError, "tessera.load(ptr + offsets)"):
        operators.subscript(t.ctx, x, i)


# ---------------------------------------------------------------------------
# Attributes and methods


def test_dtype_and_shape_are_compile_time_values(t):
    x, p = t.arg("tile<8x4xbf16>", "x"), t.arg("ptr<f16>", "p")
    assert operators.attribute(t.ctx, x, "shape") == (8, 4)
    assert operators.attribute(t.ctx, x, "dtype").name == "bf16"
    assert operators.attribute(t.ctx, p, "dtype") == f16  # a pointer's dtype is what it points to
    assert t.ir() == ""


def test_T_transposes_2d_tiles(t):
    x, v = t.arg("tile<8x4xf32>", "x"), t.arg("tile<8xf32>", "v")
    assert str(operators.attribute(t.ctx, x, "T").type) == "tile<4x8xf32>"
    with raises(CompileError, ".T transposes 2-D tiles, got tile<8xf32>"):
        operators.attribute(t.ctx, v, "T")


def test_methods_are_the_builtins_bound_to_the_value(t):
    x = t.arg("tile<8x4xf16>", "x")
    method = lambda name: operators.attribute(t.ctx, x, name)  # noqa: E731
    assert str(method("to")(f32).type) == "tile<8x4xf32>"
    assert method("to")(f16) is x
    assert str(method("sum")(axis=1).type) == "tile<8xf16>"
    assert str(method("max")(0, keep_dims=True).type) == "tile<1x4xf16>"
    assert str(method("argmin")().type) == "i32"
    assert str(method("reshape")(4, 8).type) == "tile<4x8xf16>"
    assert str(method("reshape")((32,)).type) == "tile<32xf16>"
    assert str(method("permute")(1, 0).type) == "tile<4x8xf16>"
    assert str(method("expand_dims")(0).type) == "tile<1x8x4xf16>"
    assert str(method("broadcast_to")(2, 8, 4).type) == "tile<2x8x4xf16>"
    assert str(method("cumsum")(axis=1).type) == "tile<8x4xf16>"


def test_unknown_attributes_list_what_exists(t):
    x = t.arg("tile<8xf32>", "x")
    with raises(CompileError, "tile<8xf32> has no attribute 'size'; tiles, scalars and pointers have: dtype, shape, T, "
                              "to, sum"):
        operators.attribute(t.ctx, x, "size")


def test_a_view_has_blocks(t):
    v = t.arg("view<f32, 2>", "v")
    assert operators.attribute(t.ctx, v, "dtype") == f32
    assert operators.attribute(t.ctx, v, "rank") == 2
    assert isinstance(operators.attribute(t.ctx, v, "block")((16, 16), (0, 1)), BlockRef)
    with raises(CompileError, "view<f32, 2> has no attribute 'load'; views have: dtype, rank, block"):
        operators.attribute(t.ctx, v, "load")


@pytest.mark.parametrize("value, dtype, stored", [(1, bool_, True), (1.9, i32, 1), (3, f32, 3.0)])
def test_constants_convert_their_value_as_a_cast_does(t, value, dtype, stored):
    attrs = operators.constant(t.ctx, value, dtype).value.owner.attrs
    assert attrs == {"value": stored} and type(attrs["value"]) is type(stored)


# ---------------------------------------------------------------------------
# Every operator, every dtype pair, broadcastable and not


SHAPES = [(), (4,), (1, 4), (2, 1), (2, 4), (8,)]


def _spelled(shape, dtype) -> str:
    return f"tile<{''.join(f'{d}x' for d in shape)}{dtype}>" if shape else dtype.name


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(["+", "-", "*", "/", "//", "%", "&", "|", "^", "<<", ">>", "==", "<"]),
       a_dtype=st.sampled_from(ALL_DTYPES), b_dtype=st.sampled_from(ALL_DTYPES),
       a_shape=st.sampled_from(SHAPES), b_shape=st.sampled_from(SHAPES))
def test_operators_follow_the_promotion_table_and_numpy_broadcasting(op, a_dtype, b_dtype, a_shape, b_shape):
    t = Trace()
    a, b = t.arg(_spelled(a_shape, a_dtype), "a"), t.arg(_spelled(b_shape, b_dtype), "b")
    try:
        expected_shape = np.broadcast_shapes(a_shape, b_shape)
        expected_dtype = promotion.operator_dtype(op, promotion.promote(a_dtype, b_dtype))
    except (ValueError, promotion.PromotionError):
        expected_shape = None
    try:
        if op in operators.PREDICATES:
            result = operators.compare(t.ctx, op, a, b)
            expected_dtype = bool_
        else:
            result = operators.binary(t.ctx, op, a, b)
    except TypeMismatchError:
        assert expected_shape is None
        return
    assert expected_shape is not None
    assert (result.shape, result.dtype) == (expected_shape, expected_dtype)
    t.verify()
