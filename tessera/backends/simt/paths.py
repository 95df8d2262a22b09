"""Cooperative scheduling of divergent paths in the SIMT simulator (warp specialization).

The simulator runs the threads of a block in lockstep. A divergent `if`
normally runs its then region for the threads whose condition holds, then
its else region for the others (`control_flow.py`); that is one legal
schedule as long as neither side waits for the other. A producer/consumer
kernel breaks it: the producer waits on an "empty" mbarrier only the
consumers arrive on, and the consumers wait on "full" barriers only the
producer's copies complete.

So an `if` whose regions contain an op that can block (`BLOCKING_OPS`:
mbarrier_wait, named_barrier, phase_barrier) runs its two sides as *paths*: each side is a
region walk for its threads' mask, on its own Python thread, but only one
path runs at any time, so the simulation stays deterministic. A path runs
until it finishes, reaches a wait that cannot complete yet
(`Scheduler.block`) or arrives on an mbarrier (`let_others_run`); then the
scheduler resumes the next path, in the order the paths were created,
round robin, whose wait can now complete (or which has not started, or
whose child paths have all finished). Giving way after each arrival runs
waiters as early as the GPU could, which is the schedule that exposes a
producer refilling a stage its consumers have not read yet. The `if`
merges its paths' results when both are done, and the parent path goes on.
Paths nest: a path may diverge again, and its loops run inside it.

When no path can run, that is a DEADLOCK, reported with every blocked
path's threads and what it waits for. An error in any path (a race, a
phase error, a deadlock) ends the block: the other paths are unwound and
the error is raised from `run_threads` as usual.

A block-wide `barrier` inside a path is an error, as in any divergent
code (`ops.py`): on the GPU, bar.sync 0 in one side of a
warp-specialized kernel waits for threads the other side never sends
there. Threads of some paths meet at a `named_barrier {id, count}`
instead, which waits for the other paths' arrivals like an mbarrier wait.
A `return` inside a path ends the whole block, as it does in lockstep.

Without blocking ops in a divergent `if` nothing changes: its regions run
one after the other on the caller's stack, and a block that never diverges
around a wait never starts a thread (the lockstep fast path).
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..interp.errors import InterpreterError
from .cluster import wait_for_peers

BLOCKING_OPS = frozenset({"mbarrier_wait", "named_barrier", "phase_barrier"})


def may_block(ctx, op) -> bool:
    """Whether any region of `op` holds an op that can wait for other threads (memoized per op)."""
    key = (op, "may_block")
    cache = ctx.launch.cache
    found = cache.get(key)
    if found is None:
        found = cache[key] = any(inner.name in BLOCKING_OPS for inner in op.walk())
    return found


class _Abort(BaseException):
    """Unwinds a path whose block failed elsewhere (never escapes the path's thread)."""


class Path:
    """Threads `mask` running one region walk (`work`) on their own Python thread; while suspended at a wait,
    `ready` says whether it may go on and `describe` what it waits for; while suspended at a divergent `if`,
    `children` are the if's paths."""

    def __init__(self, mask: np.ndarray | None, work: Callable[[], list], parent: "Path | None"):
        self.mask = mask                 # ctx.mask while it runs
        self.work = work
        self.parent = parent
        self.children: list[Path] = []
        self.go = threading.Semaphore(0)
        self.thread: threading.Thread | None = None
        self.done = False
        self.result: list = []
        self.ready: Callable[[], bool] | None = None      # set while blocked on a wait
        self.describe: Callable[[], str] | None = None
        self.op = None                                     # the op it waits at

    def runnable(self) -> bool:
        if self.done:
            return False
        if self.thread is None and self.parent is not None:
            return True                                   # not started yet
        if self.children:
            return all(c.done for c in self.children)     # joining: ready when its paths are done
        return self.ready is not None and self.ready()

    def threads(self, num_threads: int) -> np.ndarray:
        return np.arange(num_threads) if self.mask is None else np.flatnonzero(self.mask)


class Scheduler:
    """The paths of one block; exactly one runs at a time (`current`)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.root = Path(None, lambda: [], None)
        self.root.thread = threading.current_thread()
        self.paths: list[Path] = [self.root]
        self.current = self.root
        self.failure: BaseException | None = None

    # -- what the ops call ---------------------------------------------------------------

    def fork(self, works: list[tuple[np.ndarray, Callable[[], list]]]) -> list[list]:
        """Run each (mask, work) as a path; return their results once all have finished."""
        me = self.current
        me.mask = self.ctx.mask
        me.children = [Path(mask, work, me) for mask, work in works]
        at = self.paths.index(me) + 1
        self.paths[at:at] = me.children
        self._suspend(me)
        results = [c.result for c in me.children]
        self.paths = [p for p in self.paths if p not in me.children]
        me.children = []
        return results

    def block(self, ready: Callable[[], bool], describe: Callable[[], str], op) -> None:
        """Suspend the running path until `ready()`; a DEADLOCK error when no path can run meanwhile."""
        me = self.current
        me.mask = self.ctx.mask
        me.ready, me.describe, me.op = ready, describe, op
        try:
            self._suspend(me)
        finally:
            me.ready = me.describe = me.op = None

    @property
    def forked(self) -> bool:
        return len(self.paths) > 1

    # -- switching -------------------------------------------------------------------------

    def _suspend(self, me: Path) -> None:
        nxt = self._next(me)
        if nxt is None and self.ctx.cluster is not None:   # only a peer block can help: let it run (`cluster.py`)
            while nxt is None and len(self.ctx.cluster.blocks) > 1:
                self.ctx.cluster.stall(self.ctx, lambda: str(self._deadlock()))
                nxt = self._next(me)
        if nxt is None:
            error = self._deadlock()
            if me is self.root:
                self.failure = error
                self._unwind_others()
            raise error
        if nxt is not me:
            self._hand_over(nxt)
            me.go.acquire()
            self._resumed(me)

    def _resumed(self, me: Path) -> None:
        if self.failure is not None:
            if me is self.root:
                self._unwind_others()
                raise self.failure
            raise _Abort()
        self.current = me
        self.ctx.mask = me.mask

    def _next(self, me: Path) -> Path | None:
        """The first runnable path after `me` in creation order, round robin (`me` itself last)."""
        i = self.paths.index(me) if me in self.paths else 0
        for p in self.paths[i + 1:] + self.paths[:i + 1]:
            if p.runnable():
                return p
        return None

    def _hand_over(self, nxt: Path) -> None:
        self.current = nxt
        if nxt.thread is None:
            nxt.thread = threading.Thread(target=self._run_path, args=(nxt,), daemon=True,
                                          name=f"simt-path-{id(nxt):x}")
            nxt.thread.start()
        else:
            nxt.go.release()

    def _run_path(self, me: Path) -> None:
        self.ctx.mask = me.mask
        try:
            with np.errstate(all="ignore"):
                me.result = me.work()
            me.done = True
            nxt = self._next(me)
            if nxt is None:
                raise self._deadlock()
            self._hand_over(nxt)      # and this thread ends
        except _Abort:
            return
        except BaseException as e:   # noqa: BLE001  (an error or KernelReturn: it ends the block, raised by the root)
            me.done = True
            self.failure = e
            self.current = self.root
            self.root.go.release()

    def _unwind_others(self) -> None:
        """After a failure, on the root: let every suspended path unwind (raise _Abort) and end, one at a time."""
        for p in list(self.paths):
            if p is self.root or p.thread is None:
                continue
            if p.thread.is_alive():
                if not p.done:
                    p.go.release()
                p.thread.join()

    # -- reporting -------------------------------------------------------------------------

    def _deadlock(self) -> InterpreterError:
        """The error naming every blocked path's wait (raised at the first one's op)."""
        n = self.ctx.num_threads
        lines, first = [], None
        for p in self.paths:
            if p.describe is not None:
                first = first or p.op
                where = f" (at {p.op.loc})" if p.op.loc else ""
                ids = p.threads(n)
                lines.append(f"{_threads(ids)} wait{'s' if ids.size == 1 else ''}{where}: {p.describe()}")
            elif p.done and p.parent is not None and not all(c.done for c in p.parent.children):
                lines.append(f"{_threads(p.threads(n))} have finished their side of an `if` and wait there for "
                             "the other side")
        message = "DEADLOCK: no thread of the block can make progress:\n  " + "\n  ".join(lines)
        if first is not None:
            return self.ctx.error(first, message)
        return InterpreterError(message, kernel=self.ctx.fn.name, program_id=self.ctx.program_id)


def _threads(ids: np.ndarray) -> str:
    return ("thread " if ids.size == 1 else "threads ") + span(ids)


def span(threads: np.ndarray) -> str:
    """A short description of a set of thread ids: "5", "0..127" or "0, 3, 9, ..."."""
    threads = np.asarray(threads)
    if threads.size == 1:
        return str(int(threads[0]))
    if threads.size and threads[-1] - threads[0] + 1 == threads.size:
        return f"{int(threads[0])}..{int(threads[-1])}"
    return ", ".join(map(str, threads[:4].tolist())) + (", ..." if threads.size > 4 else "")


def scheduler(ctx) -> Scheduler:
    """The block's scheduler, made on first use."""
    s = ctx.state.get("paths")
    if s is None:
        s = ctx.state["paths"] = Scheduler(ctx)
    return s


def let_others_run(ctx, op) -> None:
    """A release point (an arrival): let the next runnable path go first, so that waiters run as early as they
    could on the GPU; that is the schedule that catches a producer refilling a stage its consumers still read."""
    s = ctx.state.get("paths")
    if s is not None and s.forked:
        s.block(lambda: True, lambda: "nothing (it gave way after an arrival)", op)


def wait_until(ctx, op, ready: Callable[[], bool], describe: Callable[[], str], alone: Callable[[], str]) -> None:
    """Let other paths run until `ready()`. When no other path exists, `alone()` is the DEADLOCK message; when
    no path can run, the message names every blocked path's `describe()`."""
    if ready():
        return
    s = ctx.state.get("paths")
    if s is None or not s.forked:
        if not wait_for_peers(ctx, op, ready, describe):     # a peer block of the cluster may help (`cluster.py`)
            raise ctx.error(op, alone())
        return
    s.block(ready, describe, op)
