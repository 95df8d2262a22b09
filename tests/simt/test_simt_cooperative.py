"""Blocks that wait for each other in the SIMT simulator: the lowered spin loops (one thread's atomic broadcast
through shared memory between barriers) park and resume as programs do in the tile interpreter."""

import threading

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads
from tessera.passes.thread_passes import lower
from cooperative_kernels import handoff, polite_handoff, ticket_prefix_sum  # noqa: E402  (tests/interp, via conftest)


def thread_ir(kernel, *args):
    return lower(kernel.specialize(*args).module, "sm_80", num_warps=2).functions[0]


def test_a_block_waits_for_a_later_one():
    flag, data, out = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    run_threads(thread_ir(handoff, flag, data, out), [flag, data, out], grid=2)
    assert out[0] == 42


def test_waiting_for_a_block_that_cannot_start_is_a_deadlock():
    flag, data, out = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    before = threading.active_count()
    with pytest.raises(InterpreterError, match=r"deadlock(.|\n)*program \(0, 0, 0\) spins in the while loop at "
                                               r"\S*cooperative_kernels.py:\d+"):
        run_threads(thread_ir(handoff, flag, data, out), [flag, data, out], grid=2, resident=1)
    assert threading.active_count() == before


@pytest.mark.parametrize("blocks, resident", [(1, 1), (3, 2), (3, None)])
def test_tickets_that_wait_only_on_smaller_tickets_finish(blocks, resident):
    n = 5
    queue, done, out = np.zeros(1, np.int32), np.zeros(n, np.int32), np.full(n, -1, np.int32)
    fn = thread_ir(ticket_prefix_sum, queue, done, out, n)
    run_threads(fn, [queue, done, out, n], grid=blocks, resident=resident)
    np.testing.assert_array_equal(out, np.cumsum(np.arange(n)))


def test_a_backing_off_acquire_poll_parks_once_its_pause_stops_growing():
    """polite_handoff's block 0 polls with an acquire load (thread 0's, broadcast through shared memory) and a
    doubling nanosleep: it waits for block 1, and with one block resident it is a deadlock naming its loop."""
    n = 64
    args = [np.zeros(1, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)]
    fn = lower(polite_handoff.specialize(*args, N=n).module, "sm_80", num_warps=2).functions[0]
    run_threads(fn, args, grid=2)
    np.testing.assert_array_equal(args[2], np.arange(n) * 3 + 1)
    with pytest.raises(InterpreterError, match=r"deadlock(.|\n)*program \(0, 0, 0\) spins in the while loop"):
        run_threads(fn, [np.zeros(1, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)], grid=2, resident=1)
