"""Tensor views: block loads and stores that are bounds-checked by construction."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function
from tessera.ir import dtypes as dt

from interp_kernels import const, new_kernel, ptr, scalar, store_value, tile

I32 = scalar(dt.i32)


def block_copy_kernel(dtype, block, fill=None):
    """Copy block `block` at (r, c) of an R x C view of x (strides sr, sc) to out, row-major."""
    b, fn = new_kernel(("x", ptr(dtype)), ("out", ptr(dtype)), ("R", I32), ("C", I32), ("sr", I32), ("sc", I32),
                       ("r", I32), ("c", I32))
    x, out, rows, cols, sr, sc, r, c = fn.args
    view = b.create("make_view", [x, rows, cols, sr, sc]).result
    attrs = {"shape": block} | ({"fill": fill} if fill is not None else {})
    value = b.create("view_load", [view, r, c], attrs=attrs).result
    store_value(b, out, value)
    b.create("return")
    return fn


def reference_block(x2d, r, c, block, fill):
    out = np.full(block, fill, dtype=x2d.dtype)
    for i in range(block[0]):
        for j in range(block[1]):
            if 0 <= r + i < x2d.shape[0] and 0 <= c + j < x2d.shape[1]:
                out[i, j] = x2d[r + i, c + j]
    return out


@pytest.mark.parametrize("r, c", [(0, 0), (4, 4), (5, 6), (-2, 3), (7, -3), (10, 10)])
def test_view_load_reads_fill_outside_the_view(r, c):
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    out = np.zeros((4, 4), np.float32)
    run_function(block_copy_kernel(dt.f32, (4, 4), fill=-1.0), [x, out, 6, 7, 7, 1, r, c], grid=1)
    np.testing.assert_array_equal(out, reference_block(x, r, c, (4, 4), -1.0))


def test_view_load_fill_defaults_to_zero_and_strides_can_transpose():
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    out = np.full((4, 4), 9, np.int16)
    # The 4x3 transpose of x: sizes (4, 3), strides (1, 4).
    run_function(block_copy_kernel(dt.i16, (4, 4)), [x, out, 4, 3, 1, 4, 0, 0], grid=1)
    np.testing.assert_array_equal(out, reference_block(x.T, 0, 0, (4, 4), 0))


def test_view_load_fill_is_rounded_to_the_dtype():
    x = np.zeros(4, np.uint16)
    out = np.zeros(4, np.uint16)
    run_function(block_copy_kernel(dt.bf16, (2, 2), fill=0.1), [x, out, 1, 1, 1, 1, 0, 0], grid=1)
    assert dt.bf16.decode(out).tolist() == [0.0] + [float(dt.bf16.quantize(0.1))] * 3


def test_view_store_writes_only_inside_the_view():
    b, fn = new_kernel(("y", ptr(dt.i32)), ("r", I32), ("c", I32))
    y, r, c = fn.args
    view = b.create("make_view", [y, const(b, 3, I32), const(b, 5, I32), const(b, 5, I32), const(b, 1, I32)]).result
    value = b.create("reshape", [b.create("arange", attrs={"start": 1, "end": 17}).result],
                     result_types=[tile(dt.i32, 4, 4)]).result
    b.create("view_store", [view, r, c, value])
    b.create("return")
    y_mem = np.zeros((4, 5), np.int32)  # one row more than the view: it must stay untouched
    run_function(fn, [y_mem, 1, 2], grid=1)
    expected = np.zeros((4, 5), np.int32)
    expected[1:3, 2:5] = np.arange(1, 17).reshape(4, 4)[:2, :3]
    np.testing.assert_array_equal(y_mem, expected)


def test_a_view_larger_than_its_memory_is_an_error():
    x = np.zeros((3, 3), np.float32)
    message = r"op 'view_load'.*view .*sizes \(4, 3\).* reaches element 9 outside 'x'"
    with pytest.raises(InterpreterError, match=message):
        run_function(block_copy_kernel(dt.f32, (4, 4)), [x, np.zeros(16, np.float32), 4, 3, 3, 1, 0, 0], grid=1)
