"""mbarriers and TMA box loads in the SIMT simulator, with hand-written thread IR (`tma_kernels.py`).

The right kernels copy the right boxes (zero-filled where the box leaves the
tensor, unswizzled by the reader when the map swizzles); the broken ones are
reported with what is wrong, never hang.
"""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.runtime.tensor_map import TensorMapDescription

from tma_kernels import BOX_COLS, BOX_ROWS, ring, tile_copy
from ir_text import kernel

RNG = np.random.default_rng(5)


def bf16_matrix(rows, cols):
    """A bf16 tensor stored as uint16 bit patterns, of values that survive a load/store round trip."""
    return dt.bf16.encode(RNG.standard_normal((rows, cols)).astype(np.float32)).astype(np.uint16)


def box_of(x, row, col):
    """The 64x64 box at (row, col) of x, zeros outside x: what TMA delivers."""
    box = np.zeros((BOX_ROWS, BOX_COLS), np.uint16)
    r0, c0 = max(row, 0), max(col, 0)
    r1, c1 = min(row + BOX_ROWS, x.shape[0]), min(col + BOX_COLS, x.shape[1])
    if r0 < r1 and c0 < c1:
        box[r0 - row:r1 - row, c0 - col:c1 - col] = x[r0:r1, c0:c1]
    return box


def run_tile(text, x, row, col, swizzle="none"):
    desc = TensorMapDescription.for_array(x, (BOX_ROWS, BOX_COLS), dtype=dt.bf16, swizzle=swizzle)
    out = np.zeros((BOX_ROWS, BOX_COLS), np.uint16)
    run_threads(kernel(text), [desc, out, row, col], grid=1)
    return out


@pytest.mark.parametrize("row, col", [(0, 0), (64, 128), (100, 20), (-8, 200)])
def test_tma_load_copies_the_box_and_zero_fills_outside_the_tensor(row, col):
    # A 150 x 250 view of padded rows (TMA needs 16-byte row strides); (100, 20): the box hangs over the last
    # rows; (-8, 200) over two edges.
    x = bf16_matrix(150, 256)[:, :250]
    np.testing.assert_array_equal(run_tile(tile_copy(), x, row, col), box_of(x, row, col))


def test_two_boxes_on_one_barrier_complete_its_phase_together():
    x = bf16_matrix(128, 128)
    desc = TensorMapDescription.for_array(x, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    out = np.zeros((2, BOX_ROWS, BOX_COLS), np.uint16)
    run_threads(kernel(tile_copy(second_box=True, expect_bytes=16384)), [desc, out, 0, 64], grid=1)
    np.testing.assert_array_equal(out[0], box_of(x, 0, 64))
    np.testing.assert_array_equal(out[1], box_of(x, 64, 0))


def test_128B_swizzle_moves_16_byte_chunks_and_the_reader_undoes_it():
    x = bf16_matrix(128, 128)
    np.testing.assert_array_equal(run_tile(tile_copy(swizzled=True), x, 64, 64, swizzle="128B"), box_of(x, 64, 64))
    # Reading a swizzled box as if it were plain gives rows whose 16-byte chunks are permuted.
    plain = run_tile(tile_copy(), x, 64, 64, swizzle="128B")
    assert not np.array_equal(plain, box_of(x, 64, 64))
    assert np.array_equal(plain[0], box_of(x, 64, 64)[0])      # row 0: chunk j ^ 0 = j
    chunks = plain[1].reshape(8, 8)                             # row 1: chunk j holds chunk j ^ 1
    np.testing.assert_array_equal(chunks, box_of(x, 64, 64)[1].reshape(8, 8)[[1, 0, 3, 2, 5, 4, 7, 6]])


@pytest.mark.parametrize("num_tiles", [2, 3, 6])
def test_two_stage_ring_flips_each_barriers_parity_per_reuse(num_tiles):
    x = bf16_matrix(BOX_ROWS * num_tiles, BOX_COLS)
    desc = TensorMapDescription.for_array(x, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    out = np.zeros_like(x)
    run_threads(kernel(ring(num_tiles)), [desc, out], grid=1)
    np.testing.assert_array_equal(out, x)


def test_ring_prefetching_a_box_nobody_waits_for_is_reported():
    # With one tile the prologue still fills stage 1, and the kernel ends with that copy unobserved.
    x = bf16_matrix(BOX_ROWS, BOX_COLS)
    desc = TensorMapDescription.for_array(x, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    with pytest.raises(InterpreterError, match="1 tma_load copies never waited for.*shared byte 16392"):
        run_threads(kernel(ring(1)), [desc, np.zeros_like(x)], grid=1)


def test_ring_that_never_flips_the_parity_is_a_phase_error():
    x = bf16_matrix(BOX_ROWS * 4, BOX_COLS)
    desc = TensorMapDescription.for_array(x, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    with pytest.raises(InterpreterError, match=r"phase error: thread 0 waits .* for parity 0, but the next phase it "
                                               r"has not seen complete is phase 1.*flip the parity"):
        run_threads(kernel(ring(4, flip_parity=False)), [desc, np.zeros_like(x)], grid=1)


# -- broken kernels ---------------------------------------------------------------------

X = bf16_matrix(64, 64)


def test_missing_arrive_is_a_deadlock_naming_barrier_phase_arrivals_and_bytes():
    with pytest.raises(InterpreterError, match=r"DEADLOCK: mbarrier_wait on the mbarrier at shared byte 8192 for "
                                               r"phase 0 \(parity 0\).*0 of 1 arrivals seen, -?8192 .*every thread"):
        run_tile(tile_copy(arrive=False), X, 0, 0)


def test_announcing_too_few_bytes_is_a_deadlock_with_the_surplus_named():
    with pytest.raises(InterpreterError, match="1 of 1 arrivals seen, 4096 more transaction bytes delivered"):
        run_tile(tile_copy(expect_bytes=4096), X, 0, 0)


def test_announcing_too_many_bytes_is_a_deadlock_with_the_outstanding_bytes():
    with pytest.raises(InterpreterError, match="1 of 1 arrivals seen, 8192 transaction bytes outstanding"):
        run_tile(tile_copy(expect_bytes=16384), X, 0, 0)


def test_waiting_on_parity_one_first_is_a_phase_error():
    # On the GPU this wait would return at once, before the box is there.
    with pytest.raises(InterpreterError, match=r"phase error: thread 0 .*parity 1, but the next phase it has not "
                                               r"seen complete is phase 0 \(parity 0\); no phase has completed"):
        run_tile(tile_copy(parity=1), X, 0, 0)


def test_reading_the_box_before_the_wait_is_reported():
    with pytest.raises(InterpreterError, match="read of shared memory before the mbarrier_wait that completes its "
                                               "tma_load.*parity 0"):
        run_tile(tile_copy(read_before_wait=True), X, 0, 0)


def test_never_waiting_is_reported_when_the_block_ends():
    with pytest.raises(InterpreterError, match="read of shared memory before the mbarrier_wait"):
        run_tile(tile_copy(wait=False), X, 0, 0)


def test_uninitialized_barrier_is_reported():
    with pytest.raises(InterpreterError, match="never initialized"):
        run_tile(tile_copy(init=False, fence=False), X, 0, 0)


def test_tma_on_an_unfenced_barrier_is_reported():
    with pytest.raises(InterpreterError, match="add fence_mbarrier_init"):
        run_tile(tile_copy(fence=False), X, 0, 0)


def test_other_threads_need_a_barrier_after_the_init():
    with pytest.raises(InterpreterError, match="used before its initialization is visible"):
        run_tile(tile_copy(sync_after_init=False), X, 0, 0)


def test_divergent_wait_nobody_can_help_names_every_path():
    text = tile_copy().replace("  mbarrier_wait %bar, %par\n", "").replace(
        "    tma_load %tile, %tm, %row, %col, %bar\n", "    mbarrier_wait %bar, %par\n")
    with pytest.raises(InterpreterError, match=r"(?s)op 'mbarrier_wait'.*DEADLOCK: no thread of the block can make "
                                               r"progress.*thread 0 wait.*shared byte 8192 for phase 0 \(parity 0\).*"
                                               r"0 of 1 arrivals seen.*threads 1\.\.127 have finished their side"):
        run_tile(text.replace("mbarrier_arrive_expect_tx %bar, %box_bytes", "fence_proxy_async"), X, 0, 0)


def test_mismatched_destination_type_is_reported():
    text = tile_copy().replace("ptr<bf16, shared>", "ptr<f32, shared>").replace("load %src : bf16", "load %src : f32")
    text = text.replace("ptr<bf16>", "ptr<f32>").replace("%out: ptr<f32>", "%out: ptr<f32>")
    desc = TensorMapDescription.for_array(X, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    with pytest.raises(InterpreterError, match="destination holds f32 but the tensor map's elements are bf16"):
        run_threads(kernel(text), [desc, np.zeros(4096, np.float32), 0, 0], grid=1)
