"""The builtins (tessera/dsl/language/), read off the IR they emit and the errors they raise."""

import pytest

import tessera
from tessera.dsl import operators
from tessera.dsl.errors import CompileError, ConstexprError, StaticAssertionError, TypeMismatchError
from tessera.dsl.function import func
from tessera.ir.dtypes import f16, f32, i8, u8
from trace_harness import Trace, ir_text, raises


@pytest.fixture
def t():
    trace = Trace()
    yield trace
    trace.verify()  # whatever a test emitted must be valid IR


# ---------------------------------------------------------------------------
# creation


def test_program_id_and_num_programs(t):
    t.call("program_id")
    t.call("num_programs", axis=2)
    assert t.ir() == ir_text("""
        %0 = program_id {axis = 0} : i32
        %1 = num_programs {axis = 2} : i32
    """)


def test_program_id_axis_is_0_1_or_2(t):
    with raises(CompileError, "program_id's axis must be 0, 1 or 2, got 3"):
        t.call("program_id", 3)


def test_arange(t):
    assert str(t.call("arange", 16, 48).type) == "tile<32xi32>"
    assert t.ir() == ir_text("%0 = arange {end = 48, start = 16} : tile<32xi32>")


def test_arange_length_must_be_a_power_of_two(t):
    with raises(CompileError, "arange(0, 100) has 100 elements, but tile lengths must be powers of two: "
                              "use arange(0, 128) and mask the lanes >= 100"):
        t.call("arange", 0, 100)


def test_arange_bounds_must_be_constexpr(t):
    n = t.arg("i32", "n")
    with raises(ConstexprError, "arange's end must be known at compile time, but it is a traced i32 value; if it "
                                "comes from a kernel parameter, annotate that parameter `tessera.constexpr`"):
        t.call("arange", 0, n)


def test_zeros_and_full(t):
    t.call("zeros", (16, 32))
    t.call("zeros", 8, dtype=i8)
    t.call("full", (4, 4), 1.5, dtype=f16)
    t.call("full", 8, 3)
    assert t.ir() == ir_text("""
        %0 = constant {value = 0.0} : tile<16x32xf32>
        %1 = constant {value = 0} : tile<8xi8>
        %2 = constant {value = 1.5} : tile<4x4xf16>
        %3 = constant {value = 3} : tile<8xi32>
    """)


def test_full_of_a_traced_scalar_casts_and_splats(t):
    s = t.arg("f32", "s")
    t.call("full", (8,), s, dtype=f16)
    assert t.ir() == ir_text("""
        %0 = cast %s : f16
        %1 = splat %0 : tile<8xf16>
    """)


def test_full_takes_a_scalar(t):
    x = t.arg("tile<8xf32>", "x")
    with raises(CompileError, "full's value must be a scalar number, got tile<8xf32>; to stretch a tile use "
                              "tessera.broadcast_to(x, shape)"):
        t.call("full", 8, x)


def test_tile_shapes_are_powers_of_two(t):
    with raises(CompileError, "zeros' shape (48, 16) has a dimension 48; tile dimensions must be powers of two: "
                              "use 64 and mask off the extra lanes"):
        t.call("zeros", (48, 16))


def test_cast_builtin(t):
    x = t.arg("tile<8xf32>", "x")
    assert str(t.call("cast", x, tessera.bf16).type) == "tile<8xbf16>"


# ---------------------------------------------------------------------------
# memory: pointers


def test_masked_load_with_other(t):
    p, mask = t.arg("tile<64xptr<f16>>", "p"), t.arg("tile<64xbool>", "mask")
    result = t.call("load", p, mask=mask, other=float("-inf"))
    assert str(result.type) == "tile<64xf16>"
    assert t.ir() == ir_text("""
        %0 = constant {value = -inf} : tile<64xf16>
        %1 = load %p, %mask, %0 : tile<64xf16>
    """)


def test_a_scalar_pointer_loads_a_scalar(t):
    p = t.arg("ptr<i32>", "p")
    assert str(t.call("load", p).type) == "i32"


def test_load_other_needs_a_mask(t):
    p = t.arg("tile<64xptr<f16>>", "p")
    with raises(CompileError, "load's `other` is the value of masked-off lanes, so it needs a mask"):
        t.call("load", p, other=0.0)


def test_masks_are_bool(t):
    p, offs = t.arg("tile<64xptr<f16>>", "p"), t.arg("tile<64xi32>", "offs")
    with raises(TypeMismatchError, "load's mask must be bool, got tile<64xi32>; make one with a comparison, "
                                   "e.g. offs < n"):
        t.call("load", p, mask=offs)


def test_masks_broadcast_to_the_pointer_shape(t):
    p, mask = t.arg("tile<64xptr<f16>>", "p"), t.arg("tile<128xbool>", "mask")
    with raises(TypeMismatchError, "load's mask has shape (128,), which does not broadcast to the shape (64,)"):
        t.call("load", p, mask=mask)


def test_store_casts_and_broadcasts_the_value(t):
    p, x, mask = t.arg("tile<4x8xptr<f16>>", "p"), t.arg("tile<8xf32>", "x"), t.arg("tile<4x8xbool>", "mask")
    assert t.call("store", p, x, mask=mask) is None
    assert t.ir() == ir_text("""
        %0 = cast %x : tile<8xf16>
        %1 = reshape %0 : tile<1x8xf16>
        %2 = broadcast %1 : tile<4x8xf16>
        store %p, %2, %mask
    """)


def test_loads_and_stores_need_pointers(t):
    v, x = t.arg("view<f32, 1>", "v"), t.arg("tile<8xf32>", "x")
    with raises(TypeMismatchError, "store needs a pointer or a tile of pointers, got view<f32, 1>; a view is read "
                                   "and written by blocks: v.block(shape, index).load() / .store(tile)"):
        t.call("store", v, x)
    with raises(TypeMismatchError, "load needs a pointer or a tile of pointers, got tile<8xf32>"):
        t.call("load", x)


# ---------------------------------------------------------------------------
# memory: views and blocks


def test_a_view_defaults_to_contiguous_row_major_strides(t):
    p, m, n = t.arg("ptr<f32>", "p"), t.arg("i32", "m"), t.arg("i32", "n")
    v = t.call("view", p, (m, n, 4))
    assert str(v.type) == "view<f32, 3>"
    assert t.ir() == ir_text("""
        %0 = constant {value = 4} : i32
        %1 = mul %0, %n : i32
        %2 = constant {value = 4} : i32
        %3 = constant {value = 4} : i32
        %4 = constant {value = 1} : i32
        %5 = make_view %p, %m, %n, %2, %1, %3, %4 : view<f32, 3>
    """)  # strides (4 * n, 4, 1)


def test_a_view_with_explicit_strides(t):
    p, stride = t.arg("ptr<f32>", "p"), t.arg("i64", "stride")
    t.call("view", p, (64, 32), (stride, 1))
    assert t.ir() == ir_text("""
        %0 = constant {value = 64} : i32
        %1 = constant {value = 32} : i32
        %2 = constant {value = 1} : i32
        %3 = make_view %p, %0, %1, %stride, %2 : view<f32, 2>
    """)


def test_view_shape_and_strides_must_match(t):
    p = t.arg("ptr<f32>", "p")
    with raises(CompileError, "view's shape has 2 dimensions but its strides have 1"):
        t.call("view", p, (64, 32), (1,))
    with raises(TypeMismatchError, "view's shape must be integers (Python ints or integer scalars), got float 2.5"):
        t.call("view", p, (2.5,))


def test_block_index_counts_blocks(t):
    v, i = t.arg("view<f16, 2>", "v"), t.arg("i32", "i")
    block = operators.attribute(t.ctx, v, "block")((16, 32), (i, 2))
    tile = block.load()
    assert str(tile.type) == "tile<16x32xf16>"
    assert t.ir() == ir_text("""
        %0 = constant {value = 16} : i32
        %1 = mul %i, %0 : i32
        %2 = constant {value = 64} : i32
        %3 = view_load %v, %1, %2 {shape = [16, 32]} : tile<16x32xf16>
    """)


def test_block_offsets_count_elements_and_fill_pads(t):
    v = t.arg("view<f32, 1>", "v")
    operators.attribute(t.ctx, v, "block")(64, offsets=10).load(fill=float("-inf"))
    assert t.ir() == ir_text("""
        %0 = constant {value = 10} : i32
        %1 = view_load %v, %0 {fill = -inf, shape = [64]} : tile<64xf32>
    """)


def test_block_store_casts_and_broadcasts(t):
    v, x = t.arg("view<bf16, 2>", "v"), t.arg("tile<32xf32>", "x")
    operators.attribute(t.ctx, v, "block")((2, 32)).store(x)
    assert t.ir() == ir_text("""
        %0 = constant {value = 0} : i32
        %1 = constant {value = 0} : i32
        %2 = cast %x : tile<32xbf16>
        %3 = reshape %2 : tile<1x32xbf16>
        %4 = broadcast %3 : tile<2x32xbf16>
        view_store %v, %0, %1, %4
    """)


def test_block_shape_must_match_the_view_rank(t):
    v = t.arg("view<f32, 2>", "v")
    block = operators.attribute(t.ctx, v, "block")
    with raises(CompileError, "a block of the rank-2 view view<f32, 2> needs 2 dimensions, got shape (64,)"):
        block(64)
    with raises(CompileError, "the block index has 1 entries, but the view has rank 2"):
        block((8, 8), (0,))
    with raises(CompileError, "block takes either `index` (counted in blocks) or `offsets` (in elements), not both"):
        block((8, 8), (0, 0), offsets=(0, 0))


# ---------------------------------------------------------------------------
# memory: atomics


def test_atomics_return_the_old_values(t):
    p, x = t.arg("tile<8xptr<f32>>", "p"), t.arg("tile<8xf32>", "x")
    assert str(t.call("atomic_add", p, x).type) == "tile<8xf32>"
    t.call("atomic_max", p, 1.0, mask=True)
    t.call("atomic_cas", p, 0.0, x)
    assert t.ir() == ir_text("""
        %0 = atomic_rmw %p, %x {kind = "add"} : tile<8xf32>
        %1 = constant {value = 1.0} : tile<8xf32>
        %2 = constant {value = true} : tile<8xbool>
        %3 = atomic_rmw %p, %1, %2 {kind = "max"} : tile<8xf32>
        %4 = constant {value = 0.0} : tile<8xf32>
        %5 = atomic_cas %p, %4, %x : tile<8xf32>
    """)


def test_atomics_check_the_element_type(t):
    pb, pf = t.arg("ptr<bool>", "pb"), t.arg("ptr<f32>", "pf")
    with raises(TypeMismatchError, "atomic_add needs numbers, but ptr<bool> points to bool"):
        t.call("atomic_add", pb, True)
    with raises(TypeMismatchError, "atomic_xor needs integers or bool, but ptr<f32> points to f32"):
        t.call("atomic_xor", pf, 1)


# ---------------------------------------------------------------------------
# math


def test_math_functions_compute_in_a_float_of_at_least_16_bits(t):
    i, h, q = t.arg("tile<4xi32>", "i"), t.arg("tile<4xf16>", "h"), t.arg("tile<4xf8e4m3>", "q")
    t.call("exp", i)
    t.call("sqrt", h)
    t.call("tanh", q)
    assert t.ir() == ir_text("""
        %0 = cast %i : tile<4xf32>
        %1 = exp %0 : tile<4xf32>
        %2 = sqrt %h : tile<4xf16>
        %3 = cast %q : tile<4xf32>
        %4 = tanh %3 : tile<4xf32>
    """)


def test_abs(t):
    u, x = t.arg("tile<4xu8>", "u"), t.arg("tile<4xi8>", "x")
    assert t.call("abs", u) is u
    assert str(t.call("abs", x).type) == "tile<4xi8>"


def test_minimum_and_maximum_promote_and_keep_the_dtype(t):
    a, b, q = t.arg("tile<4xi32>", "a"), t.arg("tile<4xf16>", "b"), t.arg("tile<4xf8e5m2>", "q")
    assert str(t.call("minimum", a, b).type) == "tile<4xf16>"
    assert str(t.call("maximum", q, q).type) == "tile<4xf8e5m2>"


def test_minimum_and_maximum_of_bools_are_and_and_or(t):
    a, b = t.arg("tile<4xbool>", "a"), t.arg("tile<4xbool>", "b")
    t.call("minimum", a, b)
    t.call("maximum", a, b)
    assert t.ir() == ir_text("""
        %0 = and %a, %b : tile<4xbool>
        %1 = or %a, %b : tile<4xbool>
    """)


def test_where_broadcasts_and_promotes(t):
    cond, x = t.arg("tile<4x1xbool>", "cond"), t.arg("tile<8xf16>", "x")
    result = t.call("where", cond, x, 0)
    assert str(result.type) == "tile<4x8xf16>"
    assert t.ir() == ir_text("""
        %0 = reshape %x : tile<1x8xf16>
        %1 = broadcast %0 : tile<4x8xf16>
        %2 = constant {value = 0.0} : tile<4x8xf16>
        %3 = broadcast %cond : tile<4x8xbool>
        %4 = select %3, %1, %2 : tile<4x8xf16>
    """)


def test_where_with_a_numeric_condition_tests_nonzero(t):
    n, x = t.arg("tile<4xi32>", "n"), t.arg("tile<4xf32>", "x")
    t.call("where", n, x, 1.0)
    assert t.ir().splitlines()[1] == '%1 = cmp %n, %0 {pred = "ne"} : tile<4xbool>'


def test_where_between_pointers(t):
    c, p, q = t.arg("tile<4xbool>", "c"), t.arg("tile<4xptr<f32>>", "p"), t.arg("ptr<f32>", "q")
    assert str(t.call("where", c, p, q).type) == "tile<4xptr<f32>>"
    with raises(TypeMismatchError, "where cannot choose between tile<4xptr<f32>> and int 0: both must be numbers"):
        t.call("where", c, p, 0)


# ---------------------------------------------------------------------------
# shape


def test_reshape_infers_one_dimension(t):
    x = t.arg("tile<8x4xf32>", "x")
    assert str(t.call("reshape", x, (-1, 16)).type) == "tile<2x16xf32>"
    with raises(TypeMismatchError, "cannot reshape tile<8x4xf32> (32 elements) to (4, 4) (16 elements)"):
        t.call("reshape", x, (4, 4))


def test_permute_and_trans(t):
    x, y = t.arg("tile<2x4x8xf32>", "x"), t.arg("tile<2x4x8xf32>", "y")
    assert str(t.call("permute", x, (2, 0, 1)).type) == "tile<8x2x4xf32>"
    with raises(CompileError, "permute's dims (0, 0, 1) must be a permutation of 0..2 for tile<2x4x8xf32>"):
        t.call("permute", x, (0, 0, 1))
    with raises(CompileError, "trans transposes 2-D tiles, got tile<2x4x8xf32>; use tessera.permute(x, dims)"):
        t.call("trans", y)


def test_expand_dims_counts_negative_axes_from_the_end(t):
    x = t.arg("tile<8xf32>", "x")
    assert str(t.call("expand_dims", x, -1).type) == "tile<8x1xf32>"
    assert str(t.call("expand_dims", x, (0, 2)).type) == "tile<1x8x1xf32>"
    with raises(CompileError, "expand_dims's axis 3 is out of range for a rank-1 tile (valid: -2..1)"):
        t.call("expand_dims", x, 3)


def test_broadcast_to(t):
    x = t.arg("tile<4x1xf32>", "x")
    assert str(t.call("broadcast_to", x, (2, 4, 8)).type) == "tile<2x4x8xf32>"
    with raises(TypeMismatchError, "cannot broadcast tile<4x1xf32> to (8, 8): each dimension must match or be 1"):
        t.call("broadcast_to", x, (8, 8))


# ---------------------------------------------------------------------------
# reductions


def test_sum_of_everything_reshapes_to_one_dimension(t):
    x = t.arg("tile<4x8xf32>", "x")
    result = t.call("sum", x)
    assert str(result.type) == "f32"
    assert t.ir() == ir_text("""
        %0 = reshape %x : tile<32xf32>
        %1 = reduce %0 {axis = 0, kind = "sum"} : f32
    """)


def test_keep_dims_keeps_reduced_axes_as_size_1(t):
    x = t.arg("tile<4x8xf32>", "x")
    assert str(t.call("sum", x, axis=-1, keep_dims=True).type) == "tile<4x1xf32>"
    assert str(t.call("max", x, keep_dims=True).type) == "tile<1x1xf32>"


@pytest.mark.parametrize("dtype, result", [
    ("bool", "i32"), ("i8", "i32"), ("u16", "u32"), ("i64", "i64"), ("f16", "f16"), ("f8e4m3", "f32"),
])
def test_sum_dtypes(t, dtype, result):
    x = t.arg(f"tile<8x{dtype}>", "x")
    assert str(t.call("sum", x).type) == result


def test_sum_of_f16_accumulates_in_f32(t):
    x = t.arg("tile<8xf16>", "x")
    t.call("sum", x)
    assert t.ir() == ir_text("""
        %0 = cast %x : tile<8xf32>
        %1 = reduce %0 {axis = 0, kind = "sum"} : f32
        %2 = cast %1 : f16
    """)


def test_sum_with_an_explicit_dtype(t):
    x = t.arg("tile<8xi8>", "x")
    assert str(t.call("sum", x, dtype=f32).type) == "f32"


def test_max_and_min_of_bools_are_any_and_all(t):
    b = t.arg("tile<8xbool>", "b")
    t.call("max", b)
    t.call("min", b)
    assert t.ir() == ir_text("""
        %0 = reduce %b {axis = 0, kind = "or"} : bool
        %1 = reduce %b {axis = 0, kind = "and"} : bool
    """)


def test_argmax_is_i32(t):
    x = t.arg("tile<4x8xf16>", "x")
    assert str(t.call("argmax", x, axis=1).type) == "tile<4xi32>"
    assert str(t.call("argmin", x).type) == "i32"


def test_reduction_axis_out_of_range(t):
    x = t.arg("tile<4x8xf32>", "x")
    with raises(CompileError, "sum's axis 2 is out of range for a rank-2 tile (valid: -2..1)"):
        t.call("sum", x, axis=2)
    n = t.arg("i32", "n")
    with raises(ConstexprError, "sum's axis must be known at compile time"):
        t.call("sum", x, axis=n)


@func
def add_then_double(a, b):
    return (a + b) * 2


def _inline_for_tests(t):
    """Stands in for the code generator's inliner: `add_then_double` traced by hand."""
    def call_function(fn, args):
        assert fn is add_then_double
        return operators.binary(t.ctx, "*", operators.binary(t.ctx, "+", *args), 2)
    t.ctx.call_function = call_function


def test_a_custom_reduce_inlines_the_combine_function_into_its_region(t):
    _inline_for_tests(t)
    x = t.arg("tile<4x8xi8>", "x")
    assert str(t.call("reduce", x, 1, add_then_double).type) == "tile<4xi8>"
    assert t.ir() == ir_text("""
        %0 = reduce %x {axis = 1, kind = "custom"} : tile<4xi8> {
        ^(%a: i8, %b: i8):
          %1 = add %a, %b : i8
          %2 = constant {value = 2} : i8
          %3 = mul %1, %2 : i8
          yield %3
        }
    """)


def test_a_builtin_can_be_the_combine_function(t):
    x = t.arg("tile<8xf32>", "x")
    t.call("reduce", x, None, tessera.dsl.values.BUILTINS["maximum"])
    assert "max %a, %b : f32" in t.ir()


def test_the_combine_function_must_be_a_tessera_func(t):
    x = t.arg("tile<8xf32>", "x")
    with raises(CompileError, "reduce's combine function must be a @tessera.func taking (a, b), got function"):
        t.call("reduce", x, 0, lambda a, b: a)


def test_cumsum_and_scan(t):
    _inline_for_tests(t)
    x = t.arg("tile<8xu8>", "x")
    assert str(t.call("cumsum", x, reverse=True).type) == "tile<8xu32>"
    assert str(t.call("scan", x, 0, add_then_double).type) == "tile<8xu8>"
    lines = t.ir().splitlines()
    assert lines[:2] == ["%0 = cast %x : tile<8xu32>",
                         '%1 = scan %0 {axis = 0, kind = "sum", reverse = true} : tile<8xu32>']
    assert lines[2] == '%2 = scan %x {axis = 0, kind = "custom"} : tile<8xu8> {'


# ---------------------------------------------------------------------------
# linalg


def test_dot_accumulates_f16_inputs_in_f32_zeros(t):
    a, b = t.arg("tile<16x32xf16>", "a"), t.arg("tile<32x64xf16>", "b")
    assert str(t.call("dot", a, b).type) == "tile<16x64xf32>"
    assert t.ir() == ir_text("""
        %0 = constant {value = 0.0} : tile<16x64xf32>
        %1 = dot %a, %b, %0 : tile<16x64xf32>
    """)


def test_dot_promotes_mixed_inputs_and_defaults_integer_accumulators_to_i32(t):
    a, b, c = t.arg("tile<16x16xi8>", "a"), t.arg("tile<16x16xu8>", "b"), t.arg("tile<16x16xbf16>", "c")
    assert str(t.call("dot", a, a).type) == "tile<16x16xi32>"
    assert str(t.call("dot", a, b).type) == "tile<16x16xi32>"  # inputs meet in i16
    assert str(t.call("dot", c, c, out_dtype=f16).type) == "tile<16x16xf16>"


def test_dot_inner_dimensions_must_match(t):
    a, b = t.arg("tile<16x32xf16>", "a"), t.arg("tile<64x16xf16>", "b")
    with raises(TypeMismatchError, "cannot dot tile<16x32xf16> and tile<64x16xf16>: a has 32 columns but b has 64 "
                                   "rows (shapes (16, 32) @ (64, 16); the inner dimensions must match)"):
        t.call("dot", a, b)


def test_dot_accumulator_and_precision(t):
    a, acc = t.arg("tile<16x16xf32>", "a"), t.arg("tile<16x16xf32>", "acc")
    t.call("dot", a, a, acc, input_precision="tf32")
    assert t.ir() == ir_text('%0 = dot %a, %a, %acc {input_precision = "tf32"} : tile<16x16xf32>')
    with raises(CompileError, "dot's input_precision must be one of ieee, tf32, got 'fast'"):
        t.call("dot", a, a, input_precision="fast")
    wrong = t.arg("tile<16x8xf32>", "wrong")
    with raises(TypeMismatchError, "dot's acc must be a 16x16 tile (a is (16, 16), b is (16, 16)), got tile<16x8xf32>"):
        t.call("dot", a, a, wrong)


def test_dot_needs_2d_tiles(t):
    v = t.arg("tile<16xf32>", "v")
    with raises(TypeMismatchError, "dot needs 2-D tiles of numbers, got a = tile<16xf32>"):
        t.call("dot", v, v)


# ---------------------------------------------------------------------------
# debug


def test_static_assert(t):
    t.call("static_assert", 64 % 16 == 0, "BLOCK must be a multiple of 16")
    with raises(StaticAssertionError, "BLOCK must be a multiple of 16"):
        t.call("static_assert", 60 % 16 == 0, "BLOCK must be a multiple of 16")
    n = t.arg("i32", "n")
    with raises(ConstexprError, "static_assert's condition (for run-time values use tessera.device_assert) must be "
                                "known at compile time"):
        t.call("static_assert", n)


def test_static_print_shows_traced_values_as_their_type(t, capsys):
    x = t.arg("tile<8xf32>", "x")
    t.call("static_print", "x is", x, 3)
    assert capsys.readouterr().out == "x is tile<8xf32> 3\n"
    assert t.ir() == ""


def test_device_print_and_assert(t):
    x, n = t.arg("tile<8xf32>", "x"), t.arg("tile<8xi32>", "n")
    t.call("device_print", "x = ", x, 1)
    t.call("device_assert", n, "n must be nonzero")
    t.call("device_assert", True)  # checked at compile time: no IR
    assert t.ir() == ir_text("""
        %0 = constant {value = 1} : i32
        print %x, %0 {prefix = "x = "}
        %1 = constant {value = 0} : tile<8xi32>
        %2 = cmp %n, %1 {pred = "ne"} : tile<8xbool>
        assert %2 {message = "n must be nonzero"}
    """)


def test_a_constant_false_device_assert_fails_at_compile_time(t):
    with raises(StaticAssertionError, "sizes differ"):
        t.call("device_assert", False, "sizes differ")


def test_every_builtin_is_documented_with_its_signature():
    from tessera.dsl.values import BUILTINS
    for name, b in BUILTINS.items():
        assert b.doc.startswith(f"{name}("), name


def test_builtin_dtypes_arguments(t):
    assert str(t.call("zeros", 4, u8).type) == "tile<4xu8>"
    with raises(CompileError, "zeros' dtype must be a tessera dtype such as tessera.f32, got <class 'float'>"):
        t.call("zeros", 4, float)
