"""Constants, ranges, program ids and the lane-moving ops (splat, broadcast,
expand_dims, reshape, permute), for numbers and for tiles of pointers."""

import numpy as np

from tessera.backends.interp import run_function
from tessera.ir import dtypes as dt
from tessera.ir.types import TileType

from interp_kernels import const, contents, memory, new_kernel, ptr, run_op, scalar, store_value, tile

rng = np.random.default_rng(1)


def test_constant_fills_a_tile_with_the_value_rounded_to_the_dtype():
    b, fn = new_kernel(("out", ptr(dt.bf16)))
    store_value(b, fn.args[0], const(b, 0.1, tile(dt.bf16, 2, 3)))
    b.create("return")
    out = memory(np.zeros(6), dt.bf16)
    run_function(fn, [out], grid=1)
    np.testing.assert_array_equal(contents(out), np.full(6, dt.bf16.quantize(0.1)))


def test_arange_counts_from_start_to_end_exclusive():
    b, fn = new_kernel(("out", ptr(dt.i32)))
    store_value(b, fn.args[0], b.create("arange", attrs={"start": 3, "end": 8}).result)
    b.create("return")
    out = np.zeros(5, dtype=np.int32)
    run_function(fn, [out], grid=1)
    assert out.tolist() == [3, 4, 5, 6, 7]


def test_program_id_and_num_programs_per_axis():
    """Each program writes (pid0, pid1, pid2, n0, n1, n2) at its linear index, axis 0 fastest."""
    b, fn = new_kernel(("out", ptr(dt.i32)))
    pid = [b.create("program_id", attrs={"axis": a}).result for a in range(3)]
    num = [b.create("num_programs", attrs={"axis": a}).result for a in range(3)]
    linear = b.create("add", [pid[0], b.create("mul", [pid[1], num[0]]).result]).result
    plane = b.create("mul", [num[0], num[1]]).result
    linear = b.create("add", [linear, b.create("mul", [pid[2], plane]).result]).result
    base = b.create("mul", [linear, const(b, 6, scalar(dt.i32))]).result
    for k, v in enumerate(pid + num):
        offset = b.create("add", [base, const(b, k, scalar(dt.i32))]).result
        b.create("store", [b.create("addptr", [fn.args[0], offset]).result, v])
    b.create("return")
    out = np.zeros((2, 3, 4, 6), dtype=np.int32)  # [z][y][x]
    run_function(fn, [out], grid=(4, 3, 2))
    z, y, x = np.meshgrid(range(2), range(3), range(4), indexing="ij")
    expected = np.stack([x, y, z, np.full_like(x, 4), np.full_like(x, 3), np.full_like(x, 2)], axis=-1)
    np.testing.assert_array_equal(out, expected)


def test_splat_broadcast_expand_dims():
    x = np.float32(2.5)
    assert run_op("splat", (x, dt.f32), result=tile(dt.f32, 2, 2)).tolist() == [[2.5, 2.5], [2.5, 2.5]]
    row = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(run_op("broadcast", (row, dt.i8), result=tile(dt.i8, 2, 3)),
                                  np.broadcast_to(row, (2, 3)))
    v = np.arange(4)
    np.testing.assert_array_equal(run_op("expand_dims", (v, dt.u3), attrs={"axis": 1}), v[:, None])


def test_reshape_is_row_major_and_permute_transposes():
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_op("reshape", (x, dt.f32), result=tile(dt.f32, 6, 4)), x.reshape(6, 4))
    np.testing.assert_array_equal(run_op("permute", (x, dt.f32), attrs={"order": (2, 0, 1)}),
                                  x.transpose(2, 0, 1))


def test_reshape_to_a_scalar():
    assert run_op("reshape", (np.array([7]), dt.i16), result=scalar(dt.i16)) == 7


def test_tiles_of_pointers_reshape_and_permute_with_their_lanes():
    """Load a 2x3 block through pointers that were permuted: the result is the transpose."""
    b, fn = new_kernel(("x", ptr(dt.f32)), ("out", ptr(dt.f32)))
    offsets = b.create("reshape", [b.create("arange", attrs={"start": 0, "end": 6}).result],
                       result_types=[tile(dt.i32, 2, 3)]).result
    p = b.create("splat", [fn.args[0]], result_types=[TileType(ptr(dt.f32), (2, 3))]).result
    p = b.create("addptr", [p, offsets]).result
    p = b.create("permute", [p], attrs={"order": (1, 0)}).result
    store_value(b, fn.args[1], b.create("load", [p]).result)
    b.create("return")
    x = np.arange(6, dtype=np.float32)
    out = np.zeros(6, dtype=np.float32)
    run_function(fn, [x, out], grid=1)
    np.testing.assert_array_equal(out.reshape(3, 2), x.reshape(2, 3).T)
