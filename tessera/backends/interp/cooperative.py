"""Cooperative scheduling of program instances that wait for each other (spin loops on flags and tickets).

The plain launch runs each program to completion before the next starts, so a program that spins on a flag
a later program sets would spin forever. A kernel with a `while` loop instead runs its programs here, each
on its own thread, exactly one thread running at a time (a baton), which makes the run deterministic:

* a program runs until an iteration of a `while` loop changes nothing: its carried values come out equal to
  the ones it went in with, and no store or atomic anywhere changed a bit (`storage.WriteClock`). That is a
  spin-wait; the program *parks* there (`park`);
* the scheduler then resumes the next parked program, in round-robin order, for which memory has changed
  since it parked (rerunning the others would only spin again), or, when there is none, starts the next
  program of the grid in row-major order if fewer than `resident` are live;
* when every live program is parked, memory has not changed since, and no program may start, the launch is
  deadlocked: an `InterpreterError` names the kernel and, for each waiting program, the loop's source line.

A kernel that never spins runs its programs in the plain order, one after another, so results (including
the order of racing float atomics) are those of the sequential launch. `resident` models how many programs
the GPU holds at once: 1 reproduces a GPU running programs one at a time, and shows that a persistent kernel
whose waits point only to smaller tickets cannot deadlock; a kernel whose program 0 waits for program 1
deadlocks there, and runs with resident >= 2.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from tessera.ir.core import Function, Operation

from .errors import InterpreterError
from .storage import WriteClock
from .values import Pointers, View


class _Abort(BaseException):
    """Unwinds a parked program's thread when the launch ends early (another program failed, or deadlock)."""


class _Slot:
    """One live program: its thread, the semaphore that hands it the baton, and where it parked."""

    def __init__(self, launch: "CooperativeLaunch", program_id: tuple[int, int, int], run: Callable[[Any], None]):
        self.program_id = program_id
        self.go = threading.Semaphore(0)
        self.parked_op: Operation | None = None
        self.parked_tick = -1
        self.done = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(launch, run), daemon=True,
                                       name=f"tessera program {program_id}")

    def _main(self, launch: "CooperativeLaunch", run: Callable[[Any], None]) -> None:
        self.go.acquire()
        try:
            if not launch.aborting:
                run(self)
        except _Abort:
            pass
        except BaseException as e:       # handed to the main thread, which re-raises it
            self.error = e
        finally:
            self.done = True
            launch.back.release()


class CooperativeLaunch:
    """Run `programs` (grid points, in order) with at most `resident` live at once; see the module docstring.

    `run(slot)` runs one program to completion; the program calls `park(slot, op)` when it spins.
    """

    def __init__(self, fn: Function, programs: Sequence[tuple[int, int, int]], resident: int,
                 run: Callable[[_Slot], None]):
        if resident < 1:
            raise InterpreterError(f"resident must be >= 1 (programs the GPU holds at once), got {resident}",
                                   kernel=fn.name)
        self.fn = fn
        self.pending = list(reversed(programs))       # popped from the end: row-major order
        self.resident = resident
        self.run_program = run
        self.back = threading.Semaphore(0)            # released when the running program parks or ends
        self.aborting = False
        self.live: list[_Slot] = []

    def run(self) -> None:
        WriteClock.watching += 1
        try:
            self._schedule()
        finally:
            WriteClock.watching -= 1
            self._abort_all()

    def park(self, slot: _Slot, op: Operation) -> None:
        """Called on the program's own thread: hand the baton back and wait until the scheduler resumes it."""
        slot.parked_op, slot.parked_tick = op, WriteClock.ticks
        self.back.release()
        slot.go.acquire()
        slot.parked_op = None
        if self.aborting:
            raise _Abort()

    def _schedule(self) -> None:
        cursor = 0
        while self.pending or self.live:
            slot = self._next_ready(cursor)
            if slot is None:
                if self.pending and len(self.live) < self.resident:
                    slot = _Slot(self, self.pending.pop(), self.run_program)
                    self.live.append(slot)
                    slot.thread.start()
                else:
                    raise self._deadlock()
            cursor = self.live.index(slot)
            slot.go.release()
            self.back.acquire()
            if slot.done:
                slot.thread.join()
                self.live.remove(slot)
                if slot.error is not None:
                    raise slot.error
            else:
                cursor += 1

    def _next_ready(self, cursor: int) -> _Slot | None:
        """The first parked program from `cursor` on (wrapping) for which memory changed since it parked."""
        n = len(self.live)
        for i in range(n):
            slot = self.live[(cursor + i) % n]
            if slot.parked_tick != WriteClock.ticks:
                return slot
        return None

    def _deadlock(self) -> InterpreterError:
        waits = "; ".join(f"program {s.program_id} spins in the while loop at {s.parked_op.loc or 'unknown location'}"
                          for s in self.live)
        more = (f"{len(self.pending)} program(s) of the grid cannot start because {self.resident} are resident; "
                if self.pending else "")
        first = self.live[0].parked_op
        return InterpreterError(
            f"deadlock: every live program waits for memory that no running program will change ({waits}); "
            f"{more}a program may wait only for programs that already run (e.g. hand out work by tickets "
            f"from an atomic counter and wait only on smaller tickets), or launch with a larger resident=",
            op=first.name, loc=first.loc, kernel=self.fn.name)

    def _abort_all(self) -> None:
        """End every still-parked program's thread (after an error); a no-op after a clean run."""
        self.aborting = True
        for slot in self.live:
            if not slot.done:
                slot.go.release()
                slot.thread.join()
        self.live.clear()


def unchanged(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether a loop iteration handed on the very values it received (bitwise, so NaN equals NaN)."""
    for a, b in zip(before, after, strict=True):
        if a is b:
            continue
        if isinstance(a, Pointers) and isinstance(b, Pointers):
            if a.memory is not b.memory or not np.array_equal(a.offsets, b.offsets):
                return False
        elif isinstance(a, View) or isinstance(b, View) or isinstance(a, Pointers) or isinstance(b, Pointers):
            return False
        else:
            x, y = np.asarray(a), np.asarray(b)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
    return True
