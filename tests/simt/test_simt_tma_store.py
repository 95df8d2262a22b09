"""TMA stores in the SIMT simulator, with hand-written thread IR (`tma_store_kernels.py`).

The store writes the box where it lies inside the tensor and nothing
outside it (TMA clips stores), reads through the map's swizzle; missing
fences, barriers and waits, and rewriting the tile while the store may
still read it, are reported with what to add. In a loop (a persistent
kernel's tiles) the wait may move to just before the next iteration's
writes, if a barrier follows it; placed after those writes, missing, not
followed by a barrier, or missing after the loop, it is reported.
"""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.runtime.tensor_map import TensorMapDescription

from tma_store_kernels import BOX_COLS, BOX_ROWS, tile_store, tile_store_loop
from ir_text import kernel

RNG = np.random.default_rng(19)
SENTINEL = 0x7FC1       # a bf16 NaN pattern no tile value has: shows which elements were written


def run_store(text, rows, cols, row, col, swizzle="none"):
    """Store a random 64x64 tile at (row, col) of a rows x cols tensor of SENTINELs; the tile and the tensor."""
    tile = dt.bf16.encode(RNG.standard_normal((BOX_ROWS, BOX_COLS)).astype(np.float32)).astype(np.uint16)
    padded = np.full((rows, -(-cols // 8) * 8), SENTINEL, np.uint16)     # 16-byte row strides, as TMA needs
    out = padded[:, :cols]
    desc = TensorMapDescription.for_array(out, (BOX_ROWS, BOX_COLS), dtype=dt.bf16, swizzle=swizzle)
    run_threads(kernel(text), [desc, tile.reshape(-1).copy(), row, col], grid=1)
    return tile, padded


def expected(tile, padded, cols, row, col):
    """`padded` after TMA writes the part of `tile` at (row, col) that lies in its first `cols` columns."""
    want = padded.copy()
    r0, c0 = max(row, 0), max(col, 0)
    r1, c1 = min(row + BOX_ROWS, padded.shape[0]), min(col + BOX_COLS, cols)
    if r0 < r1 and c0 < c1:
        want[r0:r1, c0:c1] = tile[r0 - row:r1 - row, c0 - col:c1 - col]
    return want


@pytest.mark.parametrize("row, col", [(0, 0), (64, 128), (100, 20), (-8, 200), (200, 0)])
def test_tma_store_writes_the_box_and_clips_it_at_the_tensor_edges(row, col):
    # 150 x 250: (100, 20) hangs over the last rows, (-8, 200) over two edges, (200, 0) lies wholly outside.
    before = np.full((150, 256), SENTINEL, np.uint16)
    tile, padded = run_store(tile_store(), 150, 250, row, col)
    want = expected(tile, before, 250, row, col)
    np.testing.assert_array_equal(padded, want)
    assert (padded[:, 250:] == SENTINEL).all()          # the row padding beyond the view is never touched


def test_128B_swizzled_store_reads_the_tile_where_the_swizzle_put_it():
    before = np.full((128, 128), SENTINEL, np.uint16)
    tile, padded = run_store(tile_store(swizzled=True), 128, 128, 64, 64, swizzle="128B")
    np.testing.assert_array_equal(padded, expected(tile, before, 128, 64, 64))
    # Written plainly but stored through a 128B-swizzled map, rows come out with their 16-byte chunks permuted.
    tile, padded = run_store(tile_store(), 128, 128, 64, 64, swizzle="128B")
    got = padded[64:128, 64:128]
    np.testing.assert_array_equal(got[0], tile[0])
    np.testing.assert_array_equal(got[1].reshape(8, 8), tile[1].reshape(8, 8)[[1, 0, 3, 2, 5, 4, 7, 6]])


def test_store_without_fence_proxy_async_is_reported():
    with pytest.raises(InterpreterError, match="no fence_proxy_async has run"):
        run_store(tile_store(fence=False), 64, 64, 0, 0)


def test_store_without_barrier_after_the_writes_is_a_race():
    with pytest.raises(InterpreterError, match=r"race: thread 0's tma_store reads shared byte \d+, which thread "
                                               r"[1-9]\d* wrote since the last barrier"):
        run_store(tile_store(barrier=False), 64, 64, 0, 0)


def test_rewriting_the_tile_before_the_wait_is_a_race():
    with pytest.raises(InterpreterError, match="which a tma_store may still be reading.*bulk_wait_group_read"):
        run_store(tile_store(rewrite_before_wait=True), 64, 64, 0, 0)


@pytest.mark.parametrize("commit, advice", [(True, r"add bulk_wait_group_read \{pending = 0\}"),
                                            (False, r"add bulk_commit_group, then bulk_wait_group_read")])
def test_ending_the_kernel_before_the_store_is_retired_is_reported(commit, advice):
    with pytest.raises(InterpreterError, match=f"1 tma_store copies of thread 0 never waited for.*{advice}"):
        run_store(tile_store(commit=commit, wait=False), 64, 64, 0, 0)


def test_waiting_without_commit_does_not_retire_the_open_group():
    # PTX: wait_group waits for committed groups only, so the store stays in flight until the block ends.
    with pytest.raises(InterpreterError, match="1 tma_store copies of thread 0 never waited for"):
        run_store(tile_store(commit=False), 64, 64, 0, 0)


def run_store_loop(text):
    """Run `tile_store_loop` text: two random tiles stored side by side at (0, 0) of a 64 x 128 tensor; (the
    tiles side by side, the tensor)."""
    tiles = dt.bf16.encode(RNG.standard_normal((2, BOX_ROWS, BOX_COLS)).astype(np.float32)).astype(np.uint16)
    out = np.full((BOX_ROWS, 2 * BOX_COLS), SENTINEL, np.uint16)
    desc = TensorMapDescription.for_array(out, (BOX_ROWS, BOX_COLS), dtype=dt.bf16)
    run_threads(kernel(text), [desc, tiles.reshape(-1).copy(), 0, 0], grid=1)
    return np.concatenate(list(tiles), axis=1), out


def test_a_loop_may_wait_for_the_last_store_just_before_rewriting_its_tile():
    tiles, out = run_store_loop(tile_store_loop())
    np.testing.assert_array_equal(out, tiles)


@pytest.mark.parametrize("wait", ["after_write", "none"])
def test_a_loop_rewriting_the_tile_before_waiting_for_the_last_store_is_a_race(wait):
    with pytest.raises(InterpreterError, match=r"thread \d+ writes shared byte \d+ .*which a tma_store may still "
                                               r"be reading"):
        run_store_loop(tile_store_loop(wait=wait))


def test_other_threads_rewriting_the_tile_without_a_barrier_after_the_issuers_wait_is_a_race():
    # only thread 0 knows its store has read the tile: the others must wait for it at a barrier
    with pytest.raises(InterpreterError, match=r"thread [1-9]\d* writes shared byte \d+ .*which thread 0 read since "
                                               r"the last barrier"):
        run_store_loop(tile_store_loop(barrier_after_wait=False))


def test_a_loop_without_the_wait_after_it_ends_the_kernel_with_the_last_store_unread():
    with pytest.raises(InterpreterError, match="1 tma_store copies of thread 0 never waited for"):
        run_store_loop(tile_store_loop(final_wait=False))
