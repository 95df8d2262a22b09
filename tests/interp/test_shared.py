"""Explicit shared memory in the tile interpreter: exact async-copy semantics.

Specification:

* data copied with `tessera.async_copy` (from a view block, lanes outside the
  view zero-filled; or from pointers, masked-off lanes zero-filled) is what
  `.load()` returns once `async_wait` retired its group; `.store()` then
  `.load()` round-trips a tile; slots are separate;
* groups retire oldest first: `async_wait(n)` leaves the n newest in flight,
  and copies never committed are never retired;
* reading bytes an in-flight copy writes, overwriting them, reading bytes
  never written, ending the kernel with copies in flight and a slot index
  out of range are InterpreterErrors at the op's line with the fix;
* the double-buffered matmul matches numpy, and without its wait it is
  caught, naming the wait to add.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, run_function

from shared_kernels import F16_RESULT, MatmulCase, line_of, no_wait_matmul


@tessera.kernel
def copy_view_block(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    x = tessera.view(x_ptr, (M, N))
    buf = tessera.shared((BM, BN), tessera.f32)
    tessera.async_copy(buf, x.block((BM, BN), (0, 0)))
    tessera.async_commit()
    tessera.async_wait(0)
    tessera.barrier()
    tessera.view(out_ptr, (BM, BN)).block((BM, BN)).store(buf.load())


def test_a_waited_copy_of_a_view_block_loads_the_block_with_zeros_outside_the_view():
    x = np.arange(5 * 6, dtype=np.float32).reshape(5, 6) + 1
    out = np.full((8, 8), -1, np.float32)
    copy_view_block.interpret(x, out, 5, 6, grid=(1,), BM=8, BN=8)
    expected = np.zeros((8, 8), np.float32)
    expected[:5, :6] = x
    np.testing.assert_array_equal(out, expected)


@tessera.kernel
def copy_pointers(x_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    buf = tessera.shared((2, BLOCK), tessera.i32)
    tessera.async_copy(buf[1], x_ptr + offs, mask=offs < n)
    tessera.async_commit()
    buf[0].store(offs * 10)
    tessera.async_wait(0)
    tessera.store(out_ptr + offs, buf[1].load() + buf[0].load())


def test_a_copy_from_masked_pointers_zero_fills_and_slots_are_separate():
    x = np.arange(1, 17, dtype=np.int32)
    out = np.zeros(16, np.int32)
    copy_pointers.interpret(x, out, 11, grid=(1,), BLOCK=16)
    np.testing.assert_array_equal(out, np.where(np.arange(16) < 11, x, 0) + np.arange(16) * 10)


@tessera.kernel
def two_groups(x_ptr, out_ptr, WAIT: tessera.constexpr, READ: tessera.constexpr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((2, 16), tessera.f32)
    tessera.async_copy(buf[0], x_ptr + offs)
    tessera.async_commit()
    tessera.async_copy(buf[1], x_ptr + 16 + offs)
    tessera.async_commit()
    tessera.async_wait(WAIT)
    tessera.store(out_ptr + offs, buf[READ].load())
    tessera.async_wait(0)


def test_async_wait_n_retires_all_but_the_n_newest_groups():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(16, np.float32)
    two_groups.interpret(x, out, grid=(1,), WAIT=1, READ=0)        # the older group has landed
    np.testing.assert_array_equal(out, x[:16])
    two_groups.interpret(x, out, grid=(1,), WAIT=0, READ=1)
    np.testing.assert_array_equal(out, x[16:])


def test_reading_the_newest_group_after_wait_1_names_the_wait_that_retires_it():
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(InterpreterError, match=r"still writing .*add tessera\.async_wait\(0\) before this load") as e:
        two_groups.interpret(x, np.zeros(16, np.float32), grid=(1,), WAIT=1, READ=1)
    assert e.value.loc.line == line_of(two_groups, "buf[READ].load()")


@tessera.kernel
def uncommitted(x_ptr, out_ptr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((16,), tessera.f32)
    tessera.async_copy(buf, x_ptr + offs)
    tessera.async_wait(0)
    tessera.store(out_ptr + offs, buf.load())


def test_a_wait_does_not_retire_copies_never_committed():
    with pytest.raises(InterpreterError, match=r"add tessera\.async_commit\(\) after the copy at .*, then "
                                               r"tessera\.async_wait\(0\)"):
        uncommitted.interpret(np.ones(16, np.float32), np.zeros(16, np.float32), grid=(1,))


@tessera.kernel
def store_over_copy(x_ptr, out_ptr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((16,), tessera.f32)
    tessera.async_copy(buf, x_ptr + offs)
    tessera.async_commit()
    buf.store(offs.to(tessera.f32))
    tessera.async_wait(0)
    tessera.store(out_ptr + offs, buf.load())


def test_overwriting_bytes_a_copy_has_in_flight_is_an_error_at_the_store():
    with pytest.raises(InterpreterError, match=r"overwrites shared memory .*async_wait\(0\) before this store") as e:
        store_over_copy.interpret(np.ones(16, np.float32), np.zeros(16, np.float32), grid=(1,))
    assert e.value.loc.line == line_of(store_over_copy, "buf.store(")


@tessera.kernel
def read_unwritten(out_ptr):
    offs = tessera.arange(0, 16)
    buf = tessera.shared((2, 16), tessera.f32)
    buf[0].store(offs.to(tessera.f32))
    tessera.store(out_ptr + offs, buf[1].load())


def test_reading_shared_memory_never_written_is_an_error():
    with pytest.raises(InterpreterError, match=r"reads shared memory never written \(lane \(0,\) of 'buf'\)"):
        read_unwritten.interpret(np.zeros(16, np.float32), grid=(1,))


@tessera.kernel
def never_waited(x_ptr):
    buf = tessera.shared((16,), tessera.f32)
    tessera.async_copy(buf, x_ptr + tessera.arange(0, 16))
    tessera.async_commit()


def test_ending_the_kernel_with_copies_in_flight_is_an_error():
    with pytest.raises(InterpreterError, match=r"ends with 1 async copies in flight.*async_wait\(0\)"):
        never_waited.interpret(np.ones(16, np.float32), grid=(1,))


@tessera.kernel
def runtime_slot(out_ptr, s):
    buf = tessera.shared((2, 16), tessera.f32)
    buf[s].store(tessera.zeros((16,), dtype=tessera.f32))


def test_a_slot_index_out_of_range_is_an_error():
    with pytest.raises(InterpreterError, match=r"slot 2 of a buffer with 2 slots"):
        runtime_slot.interpret(np.zeros(16, np.float32), 2, grid=(1,))


@pytest.mark.parametrize("M,N,K", [(64, 64, 96), (61, 37, 80), (130, 70, 33)], ids=str)
def test_the_double_buffered_matmul_matches_numpy(M, N, K):
    case = MatmulCase(M, N, K)
    args = case.args()
    run_function(case.module().functions[0], args, case.grid)
    np.testing.assert_allclose(args[2].astype(np.float32), case.expected(), **F16_RESULT)


def test_the_matmul_without_its_wait_is_caught_naming_the_wait():
    case = MatmulCase(64, 64, 96)
    with pytest.raises(InterpreterError, match=r"reads shared memory that the async copy at .* is still writing "
                                               r".*add tessera\.async_wait\(1\) before this load") as e:
        run_function(case.module(no_wait_matmul).functions[0], case.args(), case.grid)
    assert e.value.loc.line == line_of(no_wait_matmul, "acc = tessera.dot(")
    assert e.value.kernel == "no_wait_matmul"
