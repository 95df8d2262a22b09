"""Thread-block clusters in the SIMT simulator: blocks that write each other's shared memory and mbarriers.

A kernel with `cluster_dims` (`tessera/ir/cluster_ops.py`) runs its grid
cluster by cluster. The blocks of one cluster each run on their own Python
thread, exactly one at a time (a baton, as `interp/cooperative.py` passes it
between programs), so the run stays deterministic: a block runs until it
ends or waits for something only a peer can give (an mbarrier phase that its
own threads cannot complete, a `cluster_wait`); then the next block of the
cluster, round robin, that has not started or has something new to look at
(any block executed an op since it stalled) runs. When every unfinished
block is stalled and nothing ran since, that is a DEADLOCK naming each
block's wait.

What is modelled, and checked:

* `cluster_rank` / `cluster_id`: the block's rank (x fastest) and its
  cluster's index along an axis; a launch without clusters is a cluster of
  one (rank 0), as on the GPU;
* `cluster_arrive` / `cluster_wait` (every thread of the block, never in
  divergent code): the wait returns once every block of the cluster has
  arrived as often as this one; it also orders this block's shared-memory
  accesses like a `barrier`. Arriving publishes the block's fenced
  mbarrier inits to the cluster;
* `tma_load {multicast = mask}`: the box lands at the same shared offset in
  every block of `mask` and its bytes complete the mbarrier at the same
  offset in each, which must exist, be fenced and have been published by a
  `cluster_arrive` (a peer's init is invisible before the cluster barrier);
  the landed bytes stay in flight in each receiving block until one of its
  waits observes the phase, exactly as for a local copy (`mbarrier.py`), so
  a refill into a peer's slot it still reads is reported;
* `mbarrier_arrive_cluster bar, cta`: an arrival on block `cta`'s mbarrier
  at `bar`'s offset, with the same checks and too-many-arrivals report as a
  local one;
* a block that has ended may not be written or arrived on by a peer: the
  final cluster barrier that prevents it is checked.

Not modelled: distributed shared memory loads and stores through `mapa`
addresses (no op makes them), multicast of non-TMA copies, and clusters in
kernels whose blocks spin on each other's flags (`while` loops: refused).
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from ..interp.errors import InterpreterError
from .ops import simt


class _Abort(BaseException):
    """Unwinds a stalled block's thread when its cluster fails elsewhere."""


def cluster_dims(fn) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in fn.attrs.get("cluster_dims") or ())
    return dims + (1,) * (3 - len(dims))


def clusters(fn, grid: tuple[int, int, int]) -> list[list[tuple[int, int, int]]]:
    """The grid's blocks, cluster by cluster (clusters in the grid's order, blocks by rank, x fastest)."""
    dims = cluster_dims(fn)
    if any(g % d for g, d in zip(grid, dims)):
        raise InterpreterError(f"the grid {grid} is not a whole number of clusters of {dims} blocks: launch a grid "
                               "that is a multiple of cluster_dims along each axis", kernel=fn.name)
    counts = [g // d for g, d in zip(grid, dims)]
    out = []
    for cz in range(counts[2]):
        for cy in range(counts[1]):
            for cx in range(counts[0]):
                out.append([(cx * dims[0] + x, cy * dims[1] + y, cz * dims[2] + z)
                            for z in range(dims[2]) for y in range(dims[1]) for x in range(dims[0])])
    return out


class Cluster:
    """The blocks of one cluster, run one at a time (see the module docstring)."""

    def __init__(self, fn, dims: tuple[int, int, int], blocks: list):
        self.fn = fn
        self.dims = dims
        self.blocks = blocks
        for rank, block in enumerate(blocks):
            block.cluster, block.cluster_rank = self, rank
        n = len(blocks)
        self.arrivals = [np.zeros(b.num_threads, np.int64) for b in blocks]    # cluster_arrives per thread
        self.exited = [False] * n
        self.started = [False] * n
        self.stamp: list[int | None] = [None] * n          # total steps when the block stalled
        self.waits: list[Callable[[], str] | None] = [None] * n
        self.errors: list[BaseException | None] = [None] * n
        self.go = [threading.Semaphore(0) for _ in range(n)]
        self.back = threading.Semaphore(0)
        self.threads: list[threading.Thread | None] = [None] * n
        self.aborting = False

    def total_steps(self) -> int:
        return sum(b.steps for b in self.blocks)

    def run(self, bound) -> None:
        if len(self.blocks) == 1:
            self.blocks[0].run(bound)
            self.exited[0] = True
            return
        cursor = 0
        try:
            while not all(self.exited):
                i = self._next(cursor)
                if i is None:
                    raise self._deadlock()
                if not self.started[i]:
                    self.started[i] = True
                    self.threads[i] = threading.Thread(target=self._main, args=(i, bound), daemon=True,
                                                       name=f"tessera cluster block {self.blocks[i].program_id}")
                    self.threads[i].start()
                self.go[i].release()
                self.back.acquire()
                if self.errors[i] is not None:
                    raise self.errors[i]
                cursor = i + 1
        finally:
            self._abort_all()

    def _main(self, i: int, bound) -> None:
        self.go[i].acquire()
        try:
            if not self.aborting:
                self.blocks[i].run(bound)
        except _Abort:
            pass
        except BaseException as e:          # handed to the scheduling thread, which re-raises it
            self.errors[i] = e
        finally:
            self.exited[i] = True
            self.back.release()

    def _next(self, cursor: int) -> int | None:
        n, total = len(self.blocks), self.total_steps()
        for k in range(n):
            i = (cursor + k) % n
            if not self.exited[i] and (not self.started[i] or self.stamp[i] != total):
                return i
        return None

    def stall(self, block, describe: Callable[[], str]) -> None:
        """Called by `block` (on whichever thread runs it) when only a peer can help: let the others run."""
        i = block.cluster_rank
        self.stamp[i], self.waits[i] = self.total_steps(), describe
        self.back.release()
        self.go[i].acquire()
        self.stamp[i] = self.waits[i] = None
        if self.aborting:
            raise _Abort()

    def _deadlock(self) -> InterpreterError:
        lines = [f"block {b.program_id} (cluster rank {i}): {self.waits[i]() if self.waits[i] else 'running'}"
                 for i, b in enumerate(self.blocks) if not self.exited[i]]
        return InterpreterError("DEADLOCK: no block of the cluster can make progress:\n  " + "\n  ".join(lines),
                                kernel=self.fn.name, program_id=self.blocks[0].program_id)

    def _abort_all(self) -> None:
        self.aborting = True
        for i, t in enumerate(self.threads):
            if t is not None and not self.exited[i]:
                self.go[i].release()
                t.join()

    def peer(self, ctx, op, rank: int, what: str):
        """Block `rank` of `ctx`'s cluster, which `op` writes into or arrives on; it must still run."""
        if not 0 <= rank < len(self.blocks):
            raise ctx.error(op, f"{op.name}: cluster rank {rank} is outside the cluster of {len(self.blocks)} blocks "
                                f"{self.dims}")
        if self.exited[rank] and rank != ctx.cluster_rank:
            raise ctx.error(op, f"{op.name} {what} block {self.blocks[rank].program_id} (cluster rank {rank}), which "
                                "has already ended: end the kernel with cluster_arrive and cluster_wait, so that no "
                                "block exits while a peer may still write into it or arrive on its mbarriers")
        return self.blocks[rank]


def peer_block(ctx, op, rank: int, what: str):
    """Block `rank` of `ctx`'s cluster (`ctx` itself without one, where only rank 0 exists)."""
    if ctx.cluster is None:
        if rank != 0:
            raise ctx.error(op, f"{op.name} names cluster rank {rank}, but the kernel runs without clusters "
                                "(only rank 0, the block itself, exists): give it cluster_dims")
        return ctx
    return ctx.cluster.peer(ctx, op, rank, what)


def wait_for_peers(ctx, op, ready: Callable[[], bool], describe: Callable[[], str]) -> bool:
    """Let the other blocks of the cluster run until `ready()`; False without a cluster (nobody else can help)."""
    if ctx.cluster is None or len(ctx.cluster.blocks) == 1:
        return False
    while not ready():
        ctx.cluster.stall(ctx, describe)
    return True


# -- the ops -------------------------------------------------------------------------------

@simt("cluster_rank")
def _rank(ctx, op):
    return np.full(ctx.num_threads, ctx.cluster_rank, dtype=np.int32)


@simt("cluster_id")
def _cluster_id(ctx, op):
    axis = op.attrs["axis"]
    dims = ctx.cluster.dims if ctx.cluster is not None else (1, 1, 1)
    return np.full(ctx.num_threads, ctx.program_id[axis] // dims[axis], dtype=np.int32)


def _aligned(ctx, op) -> None:
    """barrier.cluster is .aligned: every thread of a warp executes it together (warps may reach it apart, on
    the two sides of a warp-specialized `if`)."""
    if ctx.mask is None:
        return
    warps = ctx.mask.reshape(-1, ctx.warp_size)
    split = np.flatnonzero(warps.any(axis=1) & ~warps.all(axis=1))
    if split.size:
        raise ctx.error(op, f"{op.name} in divergent code: warp {int(split[0])} runs it with only some of its "
                            "threads, but barrier.cluster is .aligned (every thread of a warp together); move it "
                            "out of the branch")


def _arrivals(ctx) -> list[np.ndarray]:
    """Per block of the cluster (just this one without a cluster), how often each thread arrived."""
    if ctx.cluster is not None:
        return ctx.cluster.arrivals
    if "cluster_arrivals" not in ctx.state:
        ctx.state["cluster_arrivals"] = [np.zeros(ctx.num_threads, np.int64)]
    return ctx.state["cluster_arrivals"]


def _threads(ctx) -> np.ndarray:
    return np.arange(ctx.num_threads) if ctx.mask is None else np.flatnonzero(ctx.mask)


@simt("cluster_arrive")
def _arrive(ctx, op):
    _aligned(ctx, op)
    from .mbarrier import publish_to_cluster
    publish_to_cluster(ctx)
    _arrivals(ctx)[ctx.cluster_rank][_threads(ctx)] += 1


@simt("cluster_wait")
def _wait(ctx, op):
    """Returns once every thread of every block of the cluster has arrived as often as the waiting threads."""
    _aligned(ctx, op)
    from .paths import span, wait_until
    arrivals, threads = _arrivals(ctx), _threads(ctx)
    mine = arrivals[ctx.cluster_rank][threads]
    if threads.size == 0:
        return
    need = int(mine.max())
    if need == 0 or (mine != need).any():
        raise ctx.error(op, "cluster_wait without a cluster_arrive first: a thread waits for its own arrival")

    def behind() -> list[str]:
        return [f"rank {i}: threads {span(np.flatnonzero(counts < need))}" for i, counts in enumerate(arrivals)
                if (counts < need).any()]

    def describe() -> str:
        return (f"cluster_wait{f' at {op.loc}' if op.loc else ''} for arrival {need} of every thread of the "
                f"cluster; not yet arrived (or ended without arriving): {'; '.join(behind())}")

    wait_until(ctx, op, lambda: not behind(), describe, lambda: f"DEADLOCK: {describe()}")
    ctx.shared.barrier()
