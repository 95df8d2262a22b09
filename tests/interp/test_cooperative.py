"""Programs that wait for each other: the interpreter's cooperative scheduler (backends/interp/cooperative.py).

A spinning program parks until another changes memory; `resident` bounds the programs live at once; when
all live programs wait on memory nobody will change, the launch is an InterpreterError naming the kernel and
the loop's line instead of a hang.
"""

import threading

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from cooperative_kernels import handoff, backward_chain, ticket_prefix_sum, wait_forever  # noqa: E402


def test_a_program_waits_for_a_later_one():
    flag, data, out = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    handoff.interpret(flag, data, out, grid=(2,))
    assert out[0] == 42


def test_waiting_for_a_program_that_cannot_start_is_a_deadlock_naming_the_loop():
    flag, data, out = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    before = threading.active_count()
    line = handoff.fn.__code__.co_firstlineno + 4          # the `while` line
    with pytest.raises(InterpreterError, match=rf"deadlock(.|\n)*program \(0, 0, 0\) spins in the while loop at "
                                               rf"\S*cooperative_kernels.py:{line}(.|\n)*1 are resident") as e:
        handoff.interpret(flag, data, out, grid=(2,), resident=1)
    assert e.value.kernel == "handoff"
    assert threading.active_count() == before          # the parked program's thread was ended


@pytest.mark.parametrize("n", [1, 2, 5])
def test_every_program_waiting_on_a_later_one_finishes_in_reverse_order(n):
    flags, out = np.zeros(n + 1, np.int32), np.full(n, -1, np.int32)
    backward_chain.interpret(flags, out, grid=(n,))
    np.testing.assert_array_equal(out, np.arange(n)[::-1])
    assert flags[n] == n


def test_a_chain_longer_than_the_resident_programs_deadlocks():
    with pytest.raises(InterpreterError, match=r"deadlock(.|\n)*program \(0, 0, 0\)(.|\n)*program \(2, 0, 0\)"
                                               r"(.|\n)*2 program\(s\) of the grid cannot start because 3"):
        backward_chain.interpret(np.zeros(6, np.int32), np.zeros(5, np.int32), grid=(5,), resident=3)


@pytest.mark.parametrize("programs, resident", [(1, 1), (2, 1), (2, 2), (3, 3), (3, None), (4, 2)])
def test_tickets_that_wait_only_on_smaller_tickets_never_deadlock(programs, resident):
    n = 7
    queue, done, out = np.zeros(1, np.int32), np.zeros(n, np.int32), np.full(n, -1, np.int32)
    ticket_prefix_sum.interpret(queue, done, out, n, grid=(programs,), resident=resident)
    np.testing.assert_array_equal(out, np.cumsum(np.arange(n)))
    assert queue[0] == n + programs      # each program took one ticket past the end, then stopped


def test_programs_waiting_on_each_other_with_nobody_to_wake_them_are_a_deadlock():
    with pytest.raises(InterpreterError, match=r"deadlock(.|\n)*program \(0, 0, 0\)(.|\n)*program \(1, 0, 0\)"
                                               r"(.|\n)*program \(2, 0, 0\)") as e:
        wait_forever.interpret(np.zeros(1, np.int32), grid=(3,))
    assert e.value.op == "while"


def test_a_failure_in_one_program_ends_the_parked_ones():
    before = threading.active_count()
    flag, data, out = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    with pytest.raises(InterpreterError, match="out of bounds"):
        handoff.interpret(flag, data, out[:0], grid=(2,))   # program 0 parks, program 1 ... never stores out
    # program 1 succeeded; program 0 resumed and stored out of bounds: the error surfaces in the caller
    assert threading.active_count() == before


def test_resident_must_be_positive():
    with pytest.raises(InterpreterError, match="resident must be >= 1"):
        wait_forever.interpret(np.ones(1, np.int32), grid=(1,), resident=0)


def test_a_lone_spinning_program_is_a_deadlock_in_run_program():
    from tessera.backends.interp import run_program
    fn = wait_forever.specialize(np.zeros(1, np.int32)).function
    with pytest.raises(InterpreterError, match="deadlock"):
        run_program(fn, [np.zeros(1, np.int32)], program_id=0)
