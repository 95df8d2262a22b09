"""Cooperative scheduling of divergent paths in the SIMT simulator (`backends/simt/paths.py`), on the producer/consumer
kernels of `ws_kernels.py`: warp-specialized handoffs finish with the right values, and what breaks them is
reported (a race, a deadlock naming every blocked path, a phase error), never hangs."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError

from tessera.backends.simt import run_threads

from ws_kernels import handoff
from ir_text import kernel


def run(text, rounds):
    x = np.arange(32 * rounds, dtype=np.float32) + 1
    out = np.zeros_like(x)
    run_threads(kernel(text), [x, out], grid=2)
    return x, out


@pytest.mark.parametrize("rounds", [1, 2, 5])
def test_producer_and_consumer_paths_hand_values_through_a_ring(rounds):
    x, out = run(handoff(rounds), rounds)
    np.testing.assert_array_equal(out, x)


def test_nested_divergent_consumers_take_turns_with_the_producer():
    x, out = run(handoff(6, split_consumers=True), 6)
    np.testing.assert_array_equal(out, x)


def test_refilling_a_stage_without_waiting_for_its_consumers_is_a_race():
    with pytest.raises(InterpreterError, match=r"race: thread \d+ writes shared byte .* which thread \d+ read"):
        run(handoff(4, empty_wait=False), 4)


def test_a_producer_that_never_arrives_deadlocks_and_every_blocked_path_is_named():
    with pytest.raises(InterpreterError) as info:
        run(handoff(4, produce=False), 4)
    message = str(info.value)
    assert "DEADLOCK: no thread of the block can make progress" in message
    assert "threads 0..31 wait" in message and "shared byte 272 for phase 0 (parity 0)" in message   # empty[0]
    assert "threads 32..95 wait" in message and "shared byte 256 for phase 0 (parity 0)" in message   # full[0]
    assert "0 of 32 arrivals seen" in message


def test_a_phase_error_inside_a_path_is_still_an_error():
    with pytest.raises(InterpreterError, match=r"phase error: thread 32 waits on the mbarrier at shared byte 256 "
                                               r"for parity 0, but the next phase it has not seen complete is phase 1"):
        run(handoff(4, consumer_parity="%c0"), 4)


def test_named_barrier_among_nested_consumer_paths_waits_for_both():
    x, out = run(handoff(4, split_consumers=True, consumer_sync=64), 4)
    np.testing.assert_array_equal(out, x)


def test_named_barrier_that_never_fills_is_a_deadlock():
    with pytest.raises(InterpreterError, match=r"(?s)DEADLOCK.*named_barrier 1 \(bar.sync 1, 96\), which 64 of its "
                                               r"96 threads have reached"):
        run(handoff(2, consumer_sync=96), 2)


def test_more_threads_than_a_named_barrier_counts_is_an_error():
    text = handoff(2, consumer_sync=64).replace("  barrier\n", "  named_barrier {count = 64, id = 1}\n", 1)
    with pytest.raises(InterpreterError, match="96 threads .* arrive at named_barrier 1, which expects 64"):
        run(text, 2)


def test_a_block_wide_barrier_inside_a_path_is_an_error_that_points_to_named_barriers():
    with pytest.raises(InterpreterError, match="barrier in divergent code: 32 of 96 threads.*use named_barrier"):
        run(handoff(2, block_barrier=True), 2)


def test_a_block_that_never_diverges_around_a_wait_starts_no_thread(monkeypatch):
    import threading
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self))
    from tma_kernels import tile_copy  # every thread waits, after divergent ifs without waits
    from tessera.runtime.tensor_map import TensorMapDescription
    from tessera.ir import dtypes as dt
    x = dt.bf16.encode(np.ones((64, 64), np.float32)).astype(np.uint16)
    desc = TensorMapDescription.for_array(x, (64, 64), dtype=dt.bf16)
    run_threads(kernel(tile_copy()), [desc, np.zeros(4096, np.uint16), 0, 0], grid=1)
    assert started == []


def test_a_failed_block_leaves_no_path_threads_behind():
    import threading
    before = threading.active_count()
    for broken in (handoff(4, produce=False), handoff(4, empty_wait=False), handoff(6, split_consumers=True,
                                                                                    consumer_parity="%c0")):
        with pytest.raises(InterpreterError):
            run(broken, 6)
    assert threading.active_count() == before
