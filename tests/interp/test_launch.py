"""Launching kernels: grids of programs, one program at a time, argument binding."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, Memory, run_function, run_program
from tessera.ir import dtypes as dt
from tessera.ir.types import TileType

from interp_kernels import const, new_kernel, ptr, scalar, tile

I32 = scalar(dt.i32)
BLOCK = 4


def vector_add_kernel(dtype=dt.f32):
    """out[i] = x[i] + y[i] for the BLOCK elements of this program, masked at n."""
    b, fn = new_kernel(("x", ptr(dtype)), ("y", ptr(dtype)), ("out", ptr(dtype)), ("n", I32), name="vector_add")
    x, y, out, n = fn.args
    start = b.create("mul", [b.create("program_id", attrs={"axis": 0}).result, const(b, BLOCK, I32)]).result
    offsets = b.create("add", [b.create("splat", [start], result_types=[tile(dt.i32, BLOCK)]).result,
                               b.create("arange", attrs={"start": 0, "end": BLOCK}).result]).result
    mask = b.create("cmp", [offsets, b.create("splat", [n], result_types=[tile(dt.i32, BLOCK)]).result],
                    attrs={"pred": "lt"}).result

    def at(base):
        return b.create("addptr", [b.create("splat", [base], result_types=[TileType(base.type, (BLOCK,))]).result,
                                   offsets]).result

    total = b.create("add", [b.create("load", [at(x), mask]).result, b.create("load", [at(y), mask]).result]).result
    b.create("store", [at(out), total, mask])
    b.create("return")
    return fn


def test_a_grid_of_programs_each_writes_its_own_block():
    n = 10
    x, y = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
    out = np.zeros(n, np.float32)
    run_function(vector_add_kernel(), [x, y, out, n], grid=(3,))
    np.testing.assert_array_equal(out, x + y)


def test_a_2d_grid_of_view_blocks_covers_a_ragged_matrix():
    """out = 2 * x block by block, BLOCK x BLOCK blocks over a 10 x 13 matrix."""
    b, fn = new_kernel(("x", ptr(dt.bf16)), ("out", ptr(dt.bf16)), ("M", I32), ("N", I32), name="scale")
    x, out, m, n = fn.args
    one = const(b, 1, I32)
    row = b.create("mul", [b.create("program_id", attrs={"axis": 0}).result, const(b, BLOCK, I32)]).result
    col = b.create("mul", [b.create("program_id", attrs={"axis": 1}).result, const(b, BLOCK, I32)]).result
    x_view = b.create("make_view", [x, m, n, n, one]).result
    out_view = b.create("make_view", [out, m, n, n, one]).result
    block = b.create("view_load", [x_view, row, col], attrs={"shape": (BLOCK, BLOCK)}).result
    doubled = b.create("mul", [block, const(b, 2.0, tile(dt.bf16, BLOCK, BLOCK))]).result
    b.create("view_store", [out_view, row, col, doubled])
    b.create("return")

    values = np.asarray(dt.bf16.quantize(np.random.default_rng(3).normal(size=(10, 13))))
    x_bits = dt.bf16.encode(values).astype(np.uint16)
    out_bits = np.zeros((10, 13), np.uint16)
    run_function(fn, [x_bits, out_bits, 10, 13], grid=(3, 4))
    np.testing.assert_array_equal(dt.bf16.decode(out_bits), values * 2)


def test_run_program_runs_just_one_instance():
    x, y = np.arange(12, dtype=np.float32), np.ones(12, np.float32)
    out = np.zeros(12, np.float32)
    run_program(vector_add_kernel(), [x, y, out, 12], program_id=(1,), grid=(3,))
    assert out.tolist() == [0] * 4 + [5, 6, 7, 8] + [0] * 4


def test_a_grid_with_a_zero_runs_nothing():
    out = np.zeros(4, np.float32)
    run_function(vector_add_kernel(), [out, out, out, 4], grid=(0,))
    assert not out.any()


def test_scalar_arguments_are_rounded_to_the_parameter_dtype():
    b, fn = new_kernel(("out", ptr(dt.bf16)), ("v", scalar(dt.bf16)), ("k", scalar(dt.i4)))
    out, v, k = fn.args
    b.create("store", [out, v])
    kf = b.create("cast", [k], result_types=[scalar(dt.bf16)]).result
    b.create("store", [b.create("addptr", [out, const(b, 1, I32)]).result, kf])
    b.create("return")
    result = np.zeros(2, np.uint16)
    run_function(fn, [result, 0.1, 9], grid=1)
    assert dt.bf16.decode(result).tolist() == [float(dt.bf16.quantize(0.1)), -7.0]


@pytest.mark.parametrize("args, message", [
    ([np.zeros(4, np.float32)] * 3, r"kernel 'vector_add'.*takes 4 arguments \(x, y, out, n\), got 3"),
    ([np.zeros(4, np.float32)] * 2 + [[0.0] * 4, 4], r"argument 'out' \(ptr<f32>\): pass a numpy array or a Memory"),
    ([np.zeros(4, np.float32)] * 3 + ["4"], r"argument 'n' \(i32\): expected a number"),
    ([np.zeros(4, np.float64)] + [np.zeros(4, np.float32)] * 2 + [4], r"f32 elements are stored as float32 .* float64"),
])
def test_bad_arguments_are_reported_by_name(args, message):
    with pytest.raises(InterpreterError, match=message):
        run_function(vector_add_kernel(), args, grid=(1,))


@pytest.mark.parametrize("grid", [(), (1, 1, 1, 1), (-1,), (2.5,)])
def test_bad_grids_are_rejected(grid):
    with pytest.raises(InterpreterError, match="grid must be 1 to 3 integers"):
        run_function(vector_add_kernel(), [np.zeros(4, np.float32)] * 3 + [4], grid=grid)


def test_memory_arguments_alias_the_callers_array():
    """In-place: out is also x."""
    data = np.arange(4, dtype=np.float32)
    mem = Memory(data)
    run_function(vector_add_kernel(), [mem, np.ones(4, np.float32), mem, 4], grid=1)
    assert data.tolist() == [1, 2, 3, 4]
