"""reduce, scan, arg_reduce and dot against references that spell out the documented order.

reduce combines adjacent lanes pairwise, level by level (an odd last lane
moves up unchanged); scan is sequential; every combine is rounded to the
element dtype. dot rounds once.
"""

import functools

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function
from tessera.ir import dtypes as dt
from tessera.ir.core import Block
from tessera.ir.errors import TypeRuleError

from interp_kernels import const, contents, load_value, memory, new_kernel, ptr, run_op, scalar, store_value, tile

rng = np.random.default_rng(2)


def tree(values, combine):
    """The documented reduction order over a Python list."""
    while len(values) > 1:
        paired = [combine(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
        values = paired + values[-1:] if len(values) % 2 else paired
    return values[0]


def rounded(dtype, f):
    return lambda a, b: float(dtype.quantize(np.float64(f(a, b))))


def wrapped(dtype, f):
    def combine(a, b):
        v = f(a, b) % 2**dtype.bits  # two's complement: keep the low bits
        return v - 2**dtype.bits if dtype.kind == "int" and v >= 2 ** (dtype.bits - 1) else v
    return combine


COMBINE = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": max, "min": min,
           "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}


def reference_reduce(x, axis, kind, dtype):
    combine = wrapped(dtype, COMBINE[kind]) if dtype.is_int else rounded(dtype, COMBINE[kind])
    lanes = np.moveaxis(x, axis, -1)
    out = np.empty(lanes.shape[:-1], dtype=dtype.compute_dtype)
    for index in np.ndindex(out.shape):
        out[index] = tree([v.item() for v in lanes[index]], combine)
    return out


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((5, 6), 0), ((5, 6), 1), ((3, 5, 4), 1)])
@pytest.mark.parametrize("dtype, kinds", [
    (dt.i32, ["sum", "prod", "max", "min", "and", "or", "xor"]),
    (dt.i4, ["sum", "prod", "max", "xor"]),
    (dt.u8, ["sum", "min", "or"]),
    (dt.f32, ["sum", "prod", "max", "min"]),
    (dt.bf16, ["sum", "max"]),
    (dt.f16, ["sum", "prod"]),
    (dt.f8e4m3, ["sum"]),
], ids=lambda v: str(v) if isinstance(v, dt.DType) else "")
def test_reduce_follows_the_pairwise_tree(dtype, kinds, shape, axis):
    if dtype.is_float:
        x = np.asarray(dtype.quantize(rng.normal(size=shape) * 3))
    else:
        x = np.asarray(dtype.quantize(rng.integers(dtype.min_value, dtype.max_value, size=shape, endpoint=True)))
    for kind in kinds:
        result = tile(dtype, *shape[:axis], *shape[axis + 1:]) if len(shape) > 1 else scalar(dtype)
        got = run_op("reduce", (x, dtype), attrs={"axis": axis, "kind": kind}, result=result)
        np.testing.assert_array_equal(got, reference_reduce(x, axis, kind, dtype), err_msg=kind)


def test_float_sum_combines_adjacent_pairs_first():
    """(1e8 + 1) + (-1e8 + 1) in f32 is 0; a left-to-right sum would give 1."""
    x = np.array([1e8, 1, -1e8, 1], np.float32)
    assert run_op("reduce", (x, dt.f32), attrs={"axis": 0, "kind": "sum"}, result=scalar(dt.f32)) == 0.0


def test_reduce_max_and_min_ignore_nan_unless_every_lane_is_nan():
    x = np.array([[np.nan, 2.0, -1.0], [np.nan, np.nan, np.nan]], np.float32)
    for kind, expected in (("max", 2.0), ("min", -1.0)):
        got = run_op("reduce", (x, dt.f32), attrs={"axis": 1, "kind": kind}, result=tile(dt.f32, 2))
        assert got[0] == expected and np.isnan(got[1])


def test_bool_reductions():
    x = np.array([[True, False], [True, True]])
    for kind, expected in (("and", [True, False]), ("or", [True, True]), ("xor", [False, True]), ("max", [True, True])):
        got = run_op("reduce", (x, dt.bool_), attrs={"axis": 0, "kind": kind}, result=tile(dt.bool_, 2))
        assert got.tolist() == expected, kind


def test_summing_bools_is_rejected_when_built():
    with pytest.raises(TypeRuleError, match="reduce 'sum' needs numbers, not bool"):
        run_op("reduce", (np.array([True, False]), dt.bool_), attrs={"axis": 0, "kind": "sum"}, result=scalar(dt.bool_))


# -- custom combine regions -------------------------------------------------------------


def custom_kernel(op_name, dtype, shape, axis, build_combine, reverse=None):
    """out = op_name(x) with kind 'custom' and the combine region built by build_combine(b, a, c) -> value."""
    b, fn = new_kernel(("x", ptr(dtype)), ("out", ptr(dtype)))
    x = load_value(b, fn.args[0], shape)
    region = Block([scalar(dtype), scalar(dtype)], ["a", "b"])
    with b.at(region):
        b.create("yield", [build_combine(b, *region.args)])
    if op_name == "reduce":
        out_shape = shape[:axis] + shape[axis + 1:]
        result = tile(dtype, *out_shape) if out_shape else scalar(dtype)
    else:
        result = x.type
    attrs = {"axis": axis, "kind": "custom"} | ({"reverse": reverse} if reverse is not None else {})
    value = b.create(op_name, [x], attrs=attrs, result_types=[result], regions=[region]).result
    store_value(b, fn.args[1], value)
    b.create("return")
    return fn


def last_nonzero(b, a, c):
    """A lane-wise, associative, non-commutative combine: c unless c is 0."""
    zero = const(b, 0, c.type)
    return b.create("select", [b.create("cmp", [c, zero], attrs={"pred": "ne"}).result, c, a]).result


def first_nonzero(b, a, c):
    zero = const(b, 0, a.type)
    return b.create("select", [b.create("cmp", [a, zero], attrs={"pred": "ne"}).result, a, c]).result


def max_via_if(b, a, c):
    """Not lane-wise (an `if` on a scalar): the interpreter runs it once per pair."""
    greater = b.create("cmp", [a, c], attrs={"pred": "gt"}).result
    then_region, else_region = Block(), Block()
    with b.at(then_region):
        b.create("yield", [a])
    with b.at(else_region):
        b.create("yield", [c])
    return b.create("if", [greater], result_types=[a.type], regions=[then_region, else_region]).result


def run(fn, x, dtype, out_size):
    out = memory(np.zeros(out_size), dtype)
    run_function(fn, [memory(x, dtype), out], grid=1)
    return contents(out)


def test_custom_reduce_keeps_lanes_in_index_order():
    x = np.array([[0, 3, 0, 5, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    fn = custom_kernel("reduce", dt.i32, (3, 5), 1, last_nonzero)
    assert run(fn, x, dt.i32, 3).tolist() == [5, 2, 0]


def test_custom_reduce_with_control_flow_in_the_region():
    x = rng.normal(size=(4, 6)).astype(np.float32)
    fn = custom_kernel("reduce", dt.f32, (4, 6), 0, max_via_if)
    np.testing.assert_array_equal(run(fn, x, dt.f32, 6), x.max(axis=0))


def test_custom_scan_forward_and_reverse():
    x = np.array([0, 4, 0, 0, 7, 0, 1, 0], np.int8)
    forward = custom_kernel("scan", dt.i8, (8,), 0, first_nonzero)
    assert run(forward, x, dt.i8, 8).tolist() == [0, 4, 4, 4, 4, 4, 4, 4]
    backward = custom_kernel("scan", dt.i8, (8,), 0, first_nonzero, reverse=True)
    assert run(backward, x, dt.i8, 8).tolist() == [4, 4, 7, 7, 7, 1, 1, 0]


def test_custom_scan_with_control_flow_along_axis_0():
    x = rng.normal(size=(5, 3)).astype(np.float32)
    fn = custom_kernel("scan", dt.f32, (5, 3), 0, max_via_if)
    np.testing.assert_array_equal(run(fn, x, dt.f32, 15).reshape(5, 3), np.maximum.accumulate(x, axis=0))


# -- scans -----------------------------------------------------------------------------


def reference_scan(x, kind, dtype, reverse):
    combine = wrapped(dtype, COMBINE[kind]) if dtype.is_int else rounded(dtype, COMBINE[kind])
    values = [v.item() for v in (x[::-1] if reverse else x)]
    out = list(functools.reduce(lambda acc, v: acc + [combine(acc[-1], v)], values[1:], values[:1]))
    return np.array(out[::-1] if reverse else out, dtype=dtype.compute_dtype)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype, kind", [(dt.i32, "sum"), (dt.i4, "sum"), (dt.u8, "prod"), (dt.f32, "sum"),
                                         (dt.bf16, "sum"), (dt.f8e5m2, "prod"), (dt.f16, "max"), (dt.i8, "min")],
                         ids=str)
def test_scan_is_sequential_and_rounds_every_step(dtype, kind, reverse):
    if dtype.is_float:
        x = np.asarray(dtype.quantize(rng.normal(size=33) * (1.2 if kind == "prod" else 10)))
    else:
        x = np.asarray(dtype.quantize(rng.integers(dtype.min_value, dtype.max_value, size=33, endpoint=True)))
    got = run_op("scan", (x, dtype), attrs={"axis": 0, "kind": kind, "reverse": reverse}, result=tile(dtype, 33))
    np.testing.assert_array_equal(got, reference_scan(x, kind, dtype, reverse))


def test_scan_along_the_first_axis_of_a_2d_tile():
    x = rng.integers(-5, 5, size=(4, 3))
    got = run_op("scan", (x, dt.i32), attrs={"axis": 0, "kind": "sum"}, result=tile(dt.i32, 4, 3))
    np.testing.assert_array_equal(got, np.cumsum(x, axis=0))


# -- arg_reduce ------------------------------------------------------------------------


def test_arg_reduce_picks_the_smallest_index_among_ties():
    x = np.array([[1, 5, 5, 0], [0, 0, 3, 3]], np.int32)
    assert run_op("arg_reduce", (x, dt.i32), attrs={"axis": 1, "kind": "argmax"}).tolist() == [1, 2]
    assert run_op("arg_reduce", (x, dt.i32), attrs={"axis": 1, "kind": "argmin"}).tolist() == [3, 0]
    assert run_op("arg_reduce", (x, dt.i32), attrs={"axis": 0, "kind": "argmax"}).tolist() == [0, 0, 0, 1]


def test_arg_reduce_ignores_nan_and_an_all_nan_row_gives_zero():
    x = np.array([[np.nan, 1.0, 2.0, np.nan], [np.nan] * 4, [-np.inf, np.nan, -np.inf, -1.0]], np.float32)
    assert run_op("arg_reduce", (x, dt.f32), attrs={"axis": 1, "kind": "argmax"}).tolist() == [2, 0, 3]
    assert run_op("arg_reduce", (x, dt.f32), attrs={"axis": 1, "kind": "argmin"}).tolist() == [1, 0, 0]


@pytest.mark.parametrize("dtype", [dt.bf16, dt.u3, dt.bool_], ids=str)
def test_arg_reduce_matches_numpy_without_nan(dtype):
    x = np.asarray(dtype.quantize(rng.integers(0, 6, size=(6, 9))))
    got = run_op("arg_reduce", (x, dtype), attrs={"axis": 1, "kind": "argmax"})
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


# -- dot -------------------------------------------------------------------------------


def run_dot(a, b, acc, in_dtype, acc_dtype, **attrs):
    return run_op("dot", (a, in_dtype), (b, in_dtype), (acc, acc_dtype), attrs=attrs or None)


def test_dot_f16_into_f32_rounds_once():
    a = np.asarray(dt.f16.quantize(rng.normal(size=(16, 32))))
    b = np.asarray(dt.f16.quantize(rng.normal(size=(32, 8))))
    acc = rng.normal(size=(16, 8)).astype(np.float32)
    expected = dt.f32.quantize(acc.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64))
    np.testing.assert_array_equal(run_dot(a, b, acc, dt.f16, dt.f32), expected)


def test_dot_i8_into_i32_is_exact_and_wraps():
    a = rng.integers(-128, 128, size=(8, 64))
    b = rng.integers(-128, 128, size=(64, 4))
    acc = np.full((8, 4), 2**31 - 100)
    exact = acc + a @ b  # Python-int exact in int64 here
    expected = (exact + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(run_dot(a, b, acc, dt.i8, dt.i32), expected)


def test_dot_into_bf16_and_f8():
    a = np.asarray(dt.f8e4m3.quantize(rng.normal(size=(4, 16))))
    b = np.asarray(dt.f8e4m3.quantize(rng.normal(size=(16, 4))))
    for acc_dtype in (dt.bf16, dt.f32):
        acc = np.asarray(acc_dtype.quantize(rng.normal(size=(4, 4))))
        expected = acc_dtype.quantize(acc.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64))
        np.testing.assert_array_equal(run_dot(a, b, acc, dt.f8e4m3, acc_dtype), expected)


def test_dot_with_tf32_inputs_drops_low_mantissa_bits():
    a = np.array([[1.0 + 2.0**-20]], np.float32)
    b = np.array([[1.0]], np.float32)
    acc = np.zeros((1, 1), np.float32)
    assert run_dot(a, b, acc, dt.f32, dt.f32, input_precision="tf32").item() == 1.0
    assert run_dot(a, b, acc, dt.f32, dt.f32, input_precision="ieee").item() == 1.0 + 2.0**-20
