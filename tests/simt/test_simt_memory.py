"""The SIMT simulator's memory: vector promises, shared memory and its race
check, bounds, masks and atomics, with hand-written thread IR."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from ir_text import kernel


# -- vectorized global access ---------------------------------------------------

VECTOR_COPY = """\
func @copy(%x: ptr<f16>, %out: ptr<f16>, %n: i32) attributes {num_threads = 32} {
  %tid = thread_id : i32
  %pid = program_id {axis = 0} : i32
  %c128 = constant {value = 128} : i32
  %c4 = constant {value = 4} : i32
  %block = mul %pid, %c128 : i32
  %mine = mul %tid, %c4 : i32
  %o0 = add %block, %mine : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c3 = constant {value = 3} : i32
  %o1 = add %o0, R1 : i32
  %o2 = add %o0, R2 : i32
  %o3 = add %o0, R3 : i32
  %start = add %o0, SHIFT : i32
  %offs = pack %start, %o1, %o2, %o3 : regs<4xi32>
  %ns = splat %n : regs<4xi32>
  %mask = cmp %offs, %ns {pred = "lt"} : regs<4xbool>
  %xs = splat %x : regs<4xptr<f16>>
  %px = addptr %xs, %offs : regs<4xptr<f16>>
  %v = load %px, %mask {vector = 4} : regs<4xf16>
  %os = splat %out : regs<4xptr<f16>>
  %po = addptr %os, %offs : regs<4xptr<f16>>
  store %po, %v, %mask {vector = 4}
  return
}
"""


def copy_kernel(r1="%c1", r2="%c2", r3="%c3", shift="%c0"):
    text = VECTOR_COPY.replace("R1", r1).replace("R2", r2).replace("R3", r3).replace("SHIFT", shift)
    return kernel(text.replace("  %c4 = ", "  %c0 = constant {value = 0} : i32\n  %c4 = "))


def test_vectorized_copy_keeps_its_promise():
    x = np.arange(512, dtype=np.float16)
    out = np.zeros(512, np.float16)
    run_threads(copy_kernel(), [x, out, 500], grid=4)  # the mask cuts whole groups of 4
    np.testing.assert_array_equal(out, np.where(np.arange(512) < 500, x, 0))


def test_vector_promise_broken_by_non_consecutive_addresses():
    with pytest.raises(InterpreterError, match=r"op 'load': vector = 4 promise broken: thread 0, registers 0..3 "
                                               r"address elements \[0, 1, 3, 2\], which are not consecutive"):
        run_threads(copy_kernel(r2="%c3", r3="%c2"), [np.zeros(128, np.float16)] * 2 + [128], grid=1)


def test_vector_promise_broken_by_misalignment():
    shifted = kernel(VECTOR_COPY.replace("R1", "%c2").replace("R2", "%c3").replace("R3", "%c4")
                     .replace("SHIFT", "%c1"))
    with pytest.raises(InterpreterError, match=r"thread 0, registers 0..3 start at element 1, which is not aligned "
                                               r"to 8 bytes \(4 f16 elements\)"):
        run_threads(shifted, [np.zeros(256, np.float16)] * 2 + [129], grid=1)


def test_vector_promise_broken_by_a_mask_that_splits_a_group():
    with pytest.raises(InterpreterError, match="thread 31 has a mask that differs within registers 0..3; a vector "
                                               "access has one mask"):
        run_threads(copy_kernel(), [np.zeros(128, np.float16)] * 2 + [126], grid=1)


def test_vector_width_must_divide_the_registers():
    fn = kernel(VECTOR_COPY.replace("{vector = 4}", "{vector = 8}").replace("R1", "%c1").replace("R2", "%c2")
                .replace("R3", "%c3").replace("SHIFT", "%c1"))
    with pytest.raises(InterpreterError, match="vector = 8 needs registers in groups of 8, but the pointer has 4"):
        run_threads(fn, [np.zeros(128, np.float16)] * 2 + [128], grid=1)


# -- global memory: bounds and masks ----------------------------------------------

def test_an_active_out_of_bounds_lane_names_thread_and_register():
    with pytest.raises(InterpreterError, match=r"op 'load': load out of bounds: thread 31, register 2 addresses "
                                               r"element 126 of 'x', which holds 126 f16 elements; its mask lets "
                                               r"this lane through"):
        run_threads(copy_kernel(), [np.zeros(126, np.float16), np.zeros(128, np.float16), 128], grid=1)


DIVERGENT_STORE = """\
func @k(%out: ptr<i32>, %n: i32) attributes {num_threads = 64} {
  %tid = thread_id : i32
  %p = addptr %out, %tid : ptr<i32>
  %inside = cmp %tid, %n {pred = "lt"} : bool
  if %inside {
    %old = load %p : i32
    %c1 = constant {value = 1} : i32
    %new = add %old, %c1 : i32
    store %p, %new
    yield
  } {
    yield
  }
  return
}
"""


def test_inactive_threads_never_touch_memory():
    out = np.arange(40, dtype=np.int32)
    run_threads(kernel(DIVERGENT_STORE), [out, 40], grid=1)  # threads 40..63 would be out of bounds
    np.testing.assert_array_equal(out, np.arange(40) + 1)
    with pytest.raises(InterpreterError, match="thread 40 addresses element 40 of 'out', which holds 40 i32"):
        run_threads(kernel(DIVERGENT_STORE), [out, 41], grid=1)


# -- shared memory ---------------------------------------------------------------

SHARED = """\
func @k(%out: ptr<i32>) attributes {num_threads = 64, shared_bytes = 512} {
  %tid = thread_id : i32
  %smem = shared_alloc {bytes = 256, offset = 256} : ptr<i32, shared>
  %c1 = constant {value = 1} : i32
  %c63 = constant {value = 63} : i32
BODY
  return
}
"""


def shared_kernel(body: str, **replace):
    text = SHARED.replace("BODY", body)
    for old, new in replace.items():
        text = text.replace(old, new)
    return kernel(text)


ROTATE = """\
  %mine = addptr %smem, %tid : ptr<i32, shared>
  %v = mul %tid, %tid : i32
  store %mine, %v
  barrier
  %next = add %tid, %c1 : i32
  %wrapped = and %next, %c63 : i32
  %theirs = addptr %smem, %wrapped : ptr<i32, shared>
  %w = load %theirs : i32
  %po = addptr %out, %tid : ptr<i32>
  store %po, %w"""


def test_threads_exchange_values_through_shared_memory():
    out = np.zeros(64, np.int32)
    run_threads(shared_kernel(ROTATE), [out], grid=2)
    np.testing.assert_array_equal(out, np.roll(np.arange(64) ** 2, -1))


def test_reading_another_threads_write_without_a_barrier_is_a_race():
    with pytest.raises(InterpreterError, match=r"op 'load': shared-memory race: thread 63 reads shared byte 256 "
                                               r"\(element 0 of the shared_alloc at byte 256 \(256 bytes\)\), which "
                                               r"thread 0 wrote since the last barrier \(missing barrier\?\)"):
        run_threads(shared_kernel(ROTATE.replace("  barrier\n", "")), [np.zeros(64, np.int32)], grid=1)


def test_writing_what_another_thread_read_without_a_barrier_is_a_race():
    body = """\
  %mine = addptr %smem, %tid : ptr<i32, shared>
  %seen = load %smem : i32
  store %mine, %tid"""
    with pytest.raises(InterpreterError, match="op 'store': .*thread 0 writes shared byte 256 .*which thread 63 read"):
        run_threads(shared_kernel(body), [np.zeros(64, np.int32)], grid=1)


def test_threads_writing_different_values_to_one_address_race_but_equal_values_do_not():
    different = "  store %smem, %tid"
    with pytest.raises(InterpreterError, match="threads 0 and 63 write different values to shared byte 256 .* in "
                                               "the same store, so which one lands is undefined"):
        run_threads(shared_kernel(different), [np.zeros(64, np.int32)], grid=1)
    same = "  store %smem, %c1\n  store %smem, %c1\n  barrier\n  %v = load %smem : i32\n" \
           "  %po = addptr %out, %tid : ptr<i32>\n  store %po, %v"
    out = np.zeros(64, np.int32)
    run_threads(shared_kernel(same), [out], grid=1)
    np.testing.assert_array_equal(out, 1)
    later = "  store %smem, %c1\n  %lone = cmp %tid, %c63 {pred = \"eq\"} : bool\n" \
            "  if %lone {\n    store %smem, %c63\n    yield\n  } {\n    yield\n  }"
    with pytest.raises(InterpreterError, match="thread 63 writes shared byte 256 .*which thread 0 wrote with a "
                                               "different value since the last barrier"):
        run_threads(shared_kernel(later), [np.zeros(64, np.int32)], grid=1)


def test_a_thread_may_reread_and_rewrite_its_own_shared_memory():
    body = """\
  %mine = addptr %smem, %tid : ptr<i32, shared>
  store %mine, %tid
  %a = load %mine : i32
  %b = add %a, %c1 : i32
  store %mine, %b
  %c = load %mine : i32
  %po = addptr %out, %tid : ptr<i32>
  store %po, %c"""
    out = np.zeros(64, np.int32)
    run_threads(shared_kernel(body), [out], grid=1)
    np.testing.assert_array_equal(out, np.arange(64) + 1)


def test_out_of_bounds_shared_access_is_an_error():
    body = "  %past = addptr %smem, %tid : ptr<i32, shared>\n  %k = add %tid, %c1 : i32\n" \
           "  %far = addptr %past, %tid : ptr<i32, shared>\n  store %far, %tid"
    with pytest.raises(InterpreterError, match=r"store out of bounds: thread 32 addresses element 64 of 'the "
                                               r"shared_alloc at byte 256 \(256 bytes\)', which holds 64 i32"):
        run_threads(shared_kernel(body), [np.zeros(64, np.int32)], grid=1)


def test_shared_alloc_needs_an_offset_inside_the_blocks_shared_memory():
    with pytest.raises(InterpreterError, match=r"shared_alloc has no offset yet \(-1\): run the shared-memory "
                                               "allocator"):
        run_threads(shared_kernel("", **{"offset = 256": "offset = -1"}), [np.zeros(1, np.int32)], grid=1)
    with pytest.raises(InterpreterError, match=r"shared_alloc of bytes \[256, 512\) lies outside the block's 384 "
                                               "bytes of shared memory"):
        run_threads(shared_kernel("", **{"shared_bytes = 512": "shared_bytes = 384"}), [np.zeros(1, np.int32)],
                    grid=1)
    with pytest.raises(InterpreterError, match="shared_alloc at byte 250 is not aligned to its i32 elements"):
        run_threads(shared_kernel("", **{"offset = 256": "offset = 250"}), [np.zeros(1, np.int32)], grid=1)


def test_unwritten_shared_memory_reads_as_poison():
    body = "  %mine = addptr %smem, %tid : ptr<i32, shared>\n  %v = load %mine : i32\n" \
           "  %po = addptr %out, %tid : ptr<i32>\n  store %po, %v"
    out = np.zeros(64, np.int32)
    run_threads(shared_kernel(body), [out], grid=1)
    np.testing.assert_array_equal(out, -1)


# -- atomics -----------------------------------------------------------------------

ATOMICS = """\
func @k(%counter: ptr<i32>, %old: ptr<i32>) attributes {num_threads = 64, shared_bytes = 4} {
  %tid = thread_id : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c0 = constant {value = 0} : i32
  %two = mul %tid, %c2 : i32
  %two1 = add %two, %c1 : i32
  %amounts = pack %tid, %c1 : regs<2xi32>
  %ps = splat %counter : regs<2xptr<i32>>
  %zeros = splat %c0 : regs<2xi32>
  %same = addptr %ps, %zeros : regs<2xptr<i32>>
  %c50 = constant {value = 50} : i32
  %some = cmp %tid, %c50 {pred = "lt"} : bool
  if %some {
    %prev = atomic_rmw %same, %amounts {kind = "add"} : regs<2xi32>
    %slots = pack %two, %two1 : regs<2xi32>
    %os = splat %old : regs<2xptr<i32>>
    %po = addptr %os, %slots : regs<2xptr<i32>>
    store %po, %prev
    yield
  } {
    yield
  }
  return
}
"""


def test_atomics_apply_in_thread_then_register_order_for_active_threads():
    counter, old = np.array([1000], np.int32), np.full(128, -1, np.int32)
    run_threads(kernel(ATOMICS), [counter, old], grid=1)
    amounts = np.stack([np.arange(50), np.ones(50, int)], axis=1).reshape(-1)
    prefix = 1000 + np.concatenate([[0], np.cumsum(amounts)[:-1]])
    np.testing.assert_array_equal(old[:100], prefix)
    np.testing.assert_array_equal(old[100:], -1)
    assert counter[0] == 1000 + amounts.sum()


def test_atomic_cas_in_shared_memory_lets_one_thread_win():
    fn = kernel("""\
func @k(%out: ptr<i32>) attributes {num_threads = 32, shared_bytes = 4} {
  %tid = thread_id : i32
  %smem = shared_alloc {bytes = 4, offset = 0} : ptr<i32, shared>
  %none = constant {value = -1} : i32
  store %smem, %none
  barrier
  %prev = atomic_cas %smem, %none, %tid : i32
  %po = addptr %out, %tid : ptr<i32>
  store %po, %prev
  return
}
""")
    out = np.zeros(32, np.int32)
    run_threads(fn, [out], grid=1)
    np.testing.assert_array_equal(out, [-1] + [0] * 31)  # thread 0 swapped first; the rest saw its id
