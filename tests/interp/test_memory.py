"""Loads and stores through pointers: masks, `other`, bounds errors, narrow and
packed dtypes, atomics."""

import numpy as np

from tessera.ir.errors import TypeRuleError
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.backends.interp import InterpreterError, Memory, run_function
from tessera.ir import dtypes as dt
from tessera.ir.types import TileType

from interp_kernels import (
    const, contents, lane_pointers, load_value, memory, new_kernel, ptr, scalar, store_value, tile,
)

N = 8


def masked_copy_kernel(dtype, n=N, with_other=False):
    """out[i] = load(x + i, mask=i < limit, other=-1 or 0) for i < n; store masked the same way."""
    params = [("x", ptr(dtype)), ("out", ptr(dtype)), ("limit", scalar(dt.i32))]
    b, fn = new_kernel(*params)
    x, out, limit = fn.args
    lanes = b.create("arange", attrs={"start": 0, "end": n}).result
    limit_tile = b.create("splat", [limit], result_types=[tile(dt.i32, n)]).result
    mask = b.create("cmp", [lanes, limit_tile], attrs={"pred": "lt"}).result
    operands = [lane_pointers(b, x, (n,)), mask]
    if with_other:
        operands.append(const(b, -1, tile(dtype, n)))
    value = b.create("load", operands).result
    b.create("store", [lane_pointers(b, out, (n,)), value, mask])
    b.create("return")
    return fn


def test_masked_lanes_read_other_and_are_not_written():
    fn = masked_copy_kernel(dt.i32, with_other=True)
    x = np.arange(5, dtype=np.int32)           # only 5 elements: lanes 5..7 must stay masked
    out = np.full(N, 99, dtype=np.int32)
    run_function(fn, [x, out, 5], grid=1)
    assert out.tolist() == [0, 1, 2, 3, 4, 99, 99, 99]


def test_masked_load_without_other_reads_zero():
    b, fn = new_kernel(("x", ptr(dt.f32)), ("out", ptr(dt.f32)))
    mask = b.create("cmp", [b.create("arange", attrs={"start": 0, "end": 4}).result, const(b, 2, tile(dt.i32, 4))],
                    attrs={"pred": "lt"}).result
    value = b.create("load", [lane_pointers(b, fn.args[0], (4,)), mask]).result
    store_value(b, fn.args[1], value)
    b.create("return")
    out = np.full(4, 7.0, dtype=np.float32)
    run_function(fn, [np.array([1.0, 2.0], np.float32), out], grid=1)
    assert out.tolist() == [1.0, 2.0, 0.0, 0.0]


def test_unmasked_out_of_bounds_load_names_op_location_offset_and_size():
    fn = masked_copy_kernel(dt.i32)
    with pytest.raises(InterpreterError) as info:
        run_function(fn, [np.arange(5, dtype=np.int32), np.zeros(N, np.int32), 6], grid=1)
    message = str(info.value)
    assert message.startswith("kernel.py:7:5: in kernel 'k', program (0, 0, 0), op 'load'")
    assert "element 5 of 'x', which holds 5 i32 elements" in message
    assert "mask" in message


def test_out_of_bounds_store_is_an_error_too():
    fn = masked_copy_kernel(dt.i32)
    with pytest.raises(InterpreterError, match=r"op 'store'.*element 6 of 'out', which holds 6 i32"):
        run_function(fn, [np.arange(8, dtype=np.int32), np.zeros(6, np.int32), 8], grid=1)


def test_negative_offsets_are_out_of_bounds():
    b, fn = new_kernel(("x", ptr(dt.f32)), ("out", ptr(dt.f32)))
    before = b.create("addptr", [fn.args[0], const(b, -1, scalar(dt.i32))]).result
    b.create("store", [fn.args[1], b.create("load", [before]).result])
    b.create("return")
    with pytest.raises(InterpreterError, match=r"load out of bounds: lane \(\) addresses element -1 .*no mask"):
        run_function(fn, [np.zeros(4, np.float32), np.zeros(1, np.float32)], grid=1)


def test_stores_to_one_element_from_several_lanes_keep_the_last_lane():
    b, fn = new_kernel(("out", ptr(dt.i32)))
    p = b.create("splat", [fn.args[0]], result_types=[TileType(ptr(dt.i32), (4,))]).result
    b.create("store", [p, b.create("arange", attrs={"start": 10, "end": 14}).result])
    b.create("return")
    out = np.zeros(1, dtype=np.int32)
    run_function(fn, [out], grid=1)
    assert out.tolist() == [13]


# -- narrow and packed element types -------------------------------------------------


def test_bf16_kernels_read_and_write_uint16_bit_patterns_in_place():
    fn = masked_copy_kernel(dt.bf16, n=4)
    source = dt.bf16.encode(np.array([1.0, -2.5, 3.140625, np.inf])).astype(np.uint16)
    out = np.zeros(4, dtype=np.uint16)
    run_function(fn, [source, out, 4], grid=1)
    np.testing.assert_array_equal(out, source)
    assert dt.bf16.decode(out).tolist() == [1.0, -2.5, 3.140625, np.inf]


@pytest.mark.parametrize("dtype", [dt.f8e4m3, dt.f16, dt.bool_, dt.u64, dt.f4e2m1], ids=str)
def test_round_trip_through_memory(dtype):
    values = np.asarray(dtype.quantize(np.array([0, 1, 3, 6, 0, 1, 2, 4])))
    fn = masked_copy_kernel(dtype)
    source, out = memory(values, dtype), memory(np.zeros(N), dtype)
    run_function(fn, [source, out, N], grid=1)
    np.testing.assert_array_equal(contents(out), values)


def packed_store_then_load_kernel(dtype, n):
    """data[offs] = vals where mask; out = load(data + offs, mask)."""
    b, fn = new_kernel(("data", ptr(dtype)), ("offsets", ptr(dt.i32)), ("values", ptr(dtype)),
                       ("mask", ptr(dt.bool_)), ("out", ptr(dtype)))
    data, offsets, values, mask, out = fn.args
    p = b.create("splat", [data], result_types=[TileType(ptr(dtype), (n,))]).result
    p = b.create("addptr", [p, load_value(b, offsets, (n,))]).result
    m = load_value(b, mask, (n,))
    b.create("store", [p, load_value(b, values, (n,)), m])
    store_value(b, out, b.create("load", [p, m]).result)
    b.create("return")
    return fn


PACKED_KERNELS = {d: packed_store_then_load_kernel(d, N) for d in (dt.u4, dt.i3, dt.u7, dt.f6e3m2)}


@pytest.mark.parametrize("dtype", list(PACKED_KERNELS), ids=str)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_packed_stores_change_only_their_own_bits(dtype, data):
    count = 21                                           # elements in memory; the last byte has padding
    nbytes = -(-count * dtype.bits // 8)
    initial = np.frombuffer(data.draw(st.binary(min_size=nbytes, max_size=nbytes)), dtype=np.uint8).copy()
    offsets = data.draw(st.lists(st.integers(0, count - 1), min_size=N, max_size=N, unique=True))
    patterns = data.draw(st.lists(st.integers(0, 2**dtype.bits - 1), min_size=N, max_size=N))
    mask = data.draw(st.lists(st.booleans(), min_size=N, max_size=N))
    values = dtype.decode(np.array(patterns, dtype=np.uint8))

    mem = Memory(initial.copy(), dtype, numel=count)
    out = memory(np.zeros(N), dtype)
    run_function(PACKED_KERNELS[dtype], [mem, np.array(offsets, np.int32), memory(values, dtype),
                                         np.array(mask), out], grid=1)

    expected_patterns = dt.unpack(initial, dtype, count).copy()
    for offset, pattern, keep in zip(offsets, patterns, mask):
        if keep:
            expected_patterns[offset] = dtype.encode(dtype.decode(np.uint8(pattern)))  # NaN -> canonical NaN
    np.testing.assert_array_equal(dt.unpack(mem.array, dtype, count), expected_patterns)
    padding_start = (count * dtype.bits) % 8
    assert initial[-1] >> padding_start == mem.array[-1] >> padding_start  # bits past the last element
    loaded = contents(out)
    np.testing.assert_array_equal(dtype.encode(loaded), np.where(mask, dtype.encode(values), dtype.encode(np.zeros(N))))


def test_packed_i3_elements_straddle_bytes():
    """Element 2 of an i3 stream occupies bits 6..8: two bits of byte 0 and one of byte 1."""
    mem = Memory(np.zeros(3, dtype=np.uint8), dt.i3)
    assert mem.size == 8
    mem.store(np.array([2]), np.array([-1], dtype=np.int8))  # bit pattern 0b111
    assert mem.array.tolist() == [0b11000000, 0b00000001, 0]
    assert mem.load(np.array([2, 1, 3])).tolist() == [-1, 0, 0]


# -- Memory construction ---------------------------------------------------------------


def test_memory_takes_numpys_dtype_by_default():
    assert Memory(np.zeros(3, np.float16)).dtype is dt.f16
    assert Memory(np.zeros((2, 3), np.int64)).size == 6


@pytest.mark.parametrize("array, dtype, message", [
    (np.zeros(4, np.float32), dt.bf16, r"bf16 elements are stored as uint16 .* got a float32 array; pass bf16.encode"),
    (np.zeros(4, np.int8), dt.u4, r"u4 is stored packed, 2 elements per byte: pass a uint8 array"),
    (np.zeros(4, np.int32), dt.f32, r"f32 elements are stored as float32 .* int32 array; pass x.view\(np.float32\)"),
    (np.zeros(4, np.complex64), None, r"no tessera dtype for numpy"),
    (np.zeros((4, 4), np.float32)[:, ::2], None, r"C-contiguous .* np.ascontiguousarray\(x\)"),
    (np.zeros((4, 4), np.float32).T, None, r"C-contiguous"),
])
def test_memory_rejects_storage_that_does_not_match(array, dtype, message):
    with pytest.raises(InterpreterError, match=message):
        Memory(array, dtype)


def test_a_memory_of_the_wrong_dtype_for_a_parameter_is_an_error():
    fn = masked_copy_kernel(dt.f32)
    with pytest.raises(InterpreterError, match=r"argument 'x' \(ptr<f32>\): memory holds f16 elements"):
        run_function(fn, [Memory(np.zeros(8, np.float16)), np.zeros(8, np.float32), 8], grid=1)


def test_stores_into_a_read_only_array_are_an_error():
    fn = masked_copy_kernel(dt.f32)
    out = np.zeros(N, np.float32)
    out.setflags(write=False)
    with pytest.raises(InterpreterError, match=r"kernel.py:7:5: .*op 'store': cannot store into .*read-only"):
        run_function(fn, [np.zeros(N, np.float32), out, N], grid=1)


# -- atomics --------------------------------------------------------------------------


def atomic_kernel(kind, dtype, offsets, masked=False):
    """old = atomic_rmw(kind, data + offsets, values[, mask]); old is stored to `old`."""
    n = len(offsets)
    params = [("data", ptr(dtype)), ("values", ptr(dtype)), ("old", ptr(dtype))]
    params += [("mask", ptr(dt.bool_))] if masked else []
    b, fn = new_kernel(*params)
    p = b.create("splat", [fn.args[0]], result_types=[TileType(ptr(dtype), (n,))]).result
    offs = b.create("constant", attrs={"value": 0}, result_types=[tile(dt.i32, n)]).result
    p = b.create("addptr", [p, offs]).result
    operands = [p, load_value(b, fn.args[1], (n,))] + ([load_value(b, fn.args[3], (n,))] if masked else [])
    old = b.create("atomic_rmw", operands, attrs={"kind": kind}).result
    store_value(b, fn.args[2], old)
    b.create("return")
    return fn


def histogram_kernel(n_lanes):
    """counts[bins[i]] += 1 for each lane, via atomic add; returns the old counts per lane."""
    b, fn = new_kernel(("counts", ptr(dt.i32)), ("bins", ptr(dt.i32)), ("old", ptr(dt.i32)))
    p = b.create("splat", [fn.args[0]], result_types=[TileType(ptr(dt.i32), (n_lanes,))]).result
    p = b.create("addptr", [p, load_value(b, fn.args[1], (n_lanes,))]).result
    old = b.create("atomic_rmw", [p, const(b, 1, tile(dt.i32, n_lanes))], attrs={"kind": "add"}).result
    store_value(b, fn.args[2], old)
    b.create("return")
    return fn


def test_atomic_add_with_repeated_addresses_accumulates_lane_by_lane():
    bins = np.array([0, 2, 0, 0, 2, 1], dtype=np.int32)
    counts, old = np.zeros(3, np.int32), np.zeros(6, np.int32)
    run_function(histogram_kernel(6), [counts, bins, old], grid=(2,))
    assert counts.tolist() == [6, 2, 4]
    assert old.tolist() == [3, 2, 4, 5, 3, 1]  # the second program sees the first one's counts


@pytest.mark.parametrize("kind, dtype, start, values, final", [
    ("max", dt.f32, 1.0, [0.5, 3.0, np.nan, 2.0], 3.0),
    ("min", dt.i8, 5, [7, -3, 9, -1], -3),
    ("and", dt.u8, 0xFF, [0xF0, 0x3C, 0xFF, 0xFF], 0x30),
    ("or", dt.u8, 0, [1, 2, 4, 1], 7),
    ("xor", dt.i32, 0, [1, 3, 7, 1], 4),
    ("xchg", dt.f16, 1.0, [2.0, 3.0, 4.0, 5.0], 5.0),
    ("add", dt.bf16, 256.0, [1.0, 1.0, 1.0, 1.0], 256.0),  # each add rounds: 257 is not a bf16
])
def test_atomic_rmw_kinds_apply_sequentially_and_return_old_values(kind, dtype, start, values, final):
    data, vals, old = memory([start], dtype), memory(values, dtype), memory(np.zeros(4), dtype)
    run_function(atomic_kernel(kind, dtype, [0, 0, 0, 0]), [data, vals, old], grid=1)
    assert contents(data).tolist() == [final]
    assert contents(old)[0] == start


def test_masked_off_atomic_lanes_do_nothing_and_return_zero():
    data, vals, old = memory([10], dt.i32), memory([1, 2, 4, 8], dt.i32), memory(np.full(4, 99), dt.i32)
    mask = np.array([True, False, True, False])
    run_function(atomic_kernel("add", dt.i32, [0] * 4, masked=True), [data, vals, old, mask], grid=1)
    assert contents(data).tolist() == [15]
    assert contents(old).tolist() == [10, 0, 11, 0]


def test_bitwise_atomics_on_floats_are_rejected_when_built():
    with pytest.raises(TypeRuleError, match="atomic 'and' needs integers or bool, got f32"):
        atomic_kernel("and", dt.f32, [0] * 4)


def test_atomic_cas_swaps_only_where_memory_matches():
    b, fn = new_kernel(("data", ptr(dt.i32)), ("old", ptr(dt.i32)))
    p = lane_pointers(b, fn.args[0], (4,))
    cmp = b.create("arange", attrs={"start": 0, "end": 4}).result
    old = b.create("atomic_cas", [p, cmp, const(b, 42, tile(dt.i32, 4))]).result
    store_value(b, fn.args[1], old)
    b.create("return")
    data, old_out = np.array([0, 5, 2, 7], np.int32), np.zeros(4, np.int32)
    run_function(fn, [data, old_out], grid=1)
    assert data.tolist() == [42, 5, 42, 7]
    assert old_out.tolist() == [0, 5, 2, 7]


def test_atomic_cas_with_repeated_addresses_sees_earlier_lanes():
    """A spin-lock style CAS: only the first of four lanes finds 0 and takes the lock."""
    b, fn = new_kernel(("lock", ptr(dt.i32)), ("old", ptr(dt.i32)))
    p = b.create("splat", [fn.args[0]], result_types=[TileType(ptr(dt.i32), (4,))]).result
    old = b.create("atomic_cas", [p, const(b, 0, tile(dt.i32, 4)),
                                  b.create("arange", attrs={"start": 1, "end": 5}).result]).result
    store_value(b, fn.args[1], old)
    b.create("return")
    lock, old_out = np.zeros(1, np.int32), np.zeros(4, np.int32)
    run_function(fn, [lock, old_out], grid=1)
    assert lock.tolist() == [1] and old_out.tolist() == [0, 1, 1, 1]


# -- pointers as values ------------------------------------------------------------------


def select_pointers_kernel():
    """Lanes 0, 2 read x[i]; lanes 1, 3 read x[i + 4] (a lane-wise select of pointers)."""
    b, fn = new_kernel(("x", ptr(dt.i32)), ("y", ptr(dt.i32)), ("out", ptr(dt.i32)))
    x, y, out = fn.args
    lanes = b.create("arange", attrs={"start": 0, "end": 4}).result
    odd = b.create("cmp", [b.create("and", [lanes, const(b, 1, tile(dt.i32, 4))]).result,
                           const(b, 1, tile(dt.i32, 4))], attrs={"pred": "eq"}).result
    near = lane_pointers(b, x, (4,))
    far = b.create("addptr", [near, const(b, 4, tile(dt.i32, 4))]).result
    store_value(b, out, b.create("load", [b.create("select", [odd, far, near]).result]).result)
    other = lane_pointers(b, y, (4,))
    b.create("load", [b.create("select", [odd, far, other]).result])
    b.create("return")
    return fn


def test_selecting_pointers_lane_by_lane_needs_one_memory():
    out = np.zeros(4, np.int32)
    with pytest.raises(InterpreterError, match="select between pointers into different memories"):
        run_function(select_pointers_kernel(), [np.arange(8, dtype=np.int32), np.zeros(4, np.int32), out], grid=1)
    assert out.tolist() == [0, 5, 2, 7]


def test_memory_values_decodes_every_element():
    mem = Memory(dt.pack(dt.u4.encode(np.array([1, 2, 3, 15, 0])), dt.u4), dt.u4, numel=5)
    assert mem.values().tolist() == [1, 2, 3, 15, 0]
