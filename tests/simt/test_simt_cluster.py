"""Thread-block clusters in the SIMT simulator (`tessera/backends/simt/cluster.py`), with hand-written thread IR
(`cluster_kernels.py`): a box each block of a pair loads half of and multicasts to both lands whole in both,
remote arrivals complete a peer's mbarrier, and every missing piece of the protocol (the cluster barrier after
the inits or before the exit, the peer's half, the remote arrival) is reported, never hangs."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads
from tessera.ir import dtypes as dt
from tessera.runtime.tensor_map import TensorMapDescription

from cluster_kernels import BOX_COLS, HALF_ROWS, multicast_copy
from ir_text import kernel

RNG = np.random.default_rng(11)


def run(text, x, grid=2, row=0, col=0):
    desc = TensorMapDescription.for_array(x, (HALF_ROWS, BOX_COLS), dtype=dt.bf16)
    out = np.zeros((grid, 2 * HALF_ROWS, BOX_COLS), np.uint16)
    run_threads(kernel(text), [desc, out, row, col], grid=grid)
    return out


def matrix():
    return dt.bf16.encode(RNG.standard_normal((128, 128)).astype(np.float32)).astype(np.uint16)


@pytest.mark.parametrize("grid", [2, 4])
def test_each_block_gets_the_whole_box_from_two_multicast_halves(grid):
    x = matrix()
    out = run(multicast_copy(), x, grid=grid, row=16, col=64)
    for block in range(grid):
        np.testing.assert_array_equal(out[block], x[16:80, 64:128])


def test_cluster_rank_and_id_follow_the_block_index():
    from tessera.backends.simt.cluster import clusters
    fn = kernel(multicast_copy(cluster=(2, 1, 1)))
    assert clusters(fn, (4, 1, 1)) == [[(0, 0, 0), (1, 0, 0)], [(2, 0, 0), (3, 0, 0)]]


def test_a_grid_that_is_not_a_whole_number_of_clusters_is_refused():
    with pytest.raises(InterpreterError, match=r"grid \(3, 1, 1\) is not a whole number of clusters of \(2, 1, 1\)"):
        run(multicast_copy(), matrix(), grid=3)


def test_without_the_start_cluster_barrier_a_peer_barrier_is_not_yet_visible():
    with pytest.raises(InterpreterError, match="never initialized|not yet visible to the cluster"):
        run(multicast_copy(start_barrier=False), matrix())


def test_without_the_end_cluster_barrier_a_block_may_be_arrived_on_after_it_ended():
    # (the wait for both arrivals on `empty` would keep each block alive until its peer's arrival is in)
    x = matrix()
    with pytest.raises(InterpreterError, match="has already ended: end the kernel with cluster_arrive"):
        run(multicast_copy(end_barrier=False, wait_empty=False), x)
    out = run(multicast_copy(wait_empty=False), x)
    np.testing.assert_array_equal(out[1], x[:64, :64])


def test_a_missing_peer_half_is_a_deadlock_naming_the_outstanding_bytes():
    with pytest.raises(InterpreterError, match="(?s)DEADLOCK.*rank 1.*4096 transaction bytes outstanding"):
        run(multicast_copy(peer_half=False), matrix())


def test_an_empty_barrier_counting_one_arrival_where_the_cluster_sends_two_is_a_phase_error():
    # each remote arrival completes a phase of its own: the peer's second one runs the barrier a phase ahead
    with pytest.raises(InterpreterError, match="phase error: thread 0 waits on the mbarrier at shared byte 8200 "
                                               "for phase 0 .* but phases 0 and 1 have both completed"):
        run(multicast_copy(empty_count=1), matrix())


def test_multicast_to_a_rank_outside_the_cluster_is_reported():
    with pytest.raises(InterpreterError, match="cluster rank 2 is outside the cluster of 2 blocks"):
        run(multicast_copy(mask=5), matrix())
