"""setmaxnreg, elect_sync and named_barrier in the SIMT simulator (`ir/warp_specialization_ops.py`).

* `setmaxnreg` changes no value; it is checked: every warpgroup that runs it
  runs it with all 128 threads (it is `.sync.aligned`), `inc` raises and
  `dec` lowers the warpgroup's count (at entry, `entry_registers`), and the
  budgets the warpgroups asked for fit the 65536 registers of an SM (an
  `inc` that cannot be granted waits forever on the GPU).
* `elect_sync` is true in the lowest lane of each warp that executes it; all
  lanes of such a warp must (the lowering's member mask is the full warp).
* `named_barrier {id, count}` counts the threads arriving at barrier `id`,
  whole warps at a time; when `count` have arrived they all go on, and their
  shared-memory accesses before it are ordered before theirs after it (all
  of them: `count` = the block is a `barrier`). Threads of other paths may
  arrive meanwhile: the arriving path waits for them (`paths.py`), and
  a barrier that can never fill is a DEADLOCK. More than `count` arrivals
  is an error. With `arrive` the threads count toward the round and go on
  at once (bar.arrive); their shared-memory accesses before it are ordered
  before those of the threads that wait for the round, but not their
  warpgroups' wgmmas, which may still be reading. A round left incomplete
  when the block ends is an error (`finish_block`).
"""

from __future__ import annotations

import numpy as np

from tessera.ir.wgmma_layouts import WARPGROUP

from ..interp.errors import InterpreterError
from .ops import live_mask, simt, whole_units
from .paths import span, wait_until

REGISTERS_PER_SM = 65536
MAX_REGISTERS = 255


def entry_registers(num_threads: int) -> int:
    """Registers per thread at kernel entry: what ptxas gives a kernel with .maxntid and .minnctapersm 1 (the
    NVPTX backend emits both for kernels that use setmaxnreg): the register file split evenly, in steps of 8."""
    return min(MAX_REGISTERS, REGISTERS_PER_SM // num_threads // 8 * 8)


@simt("setmaxnreg")
def _setmaxnreg(ctx, op):
    if ctx.warp_size != 32:
        raise ctx.error(op, f"setmaxnreg needs 32-lane warps, but this block's warps have {ctx.warp_size} lanes")
    groups = whole_units(ctx, op, WARPGROUP, "warpgroup",
                    "all 128 threads of a warpgroup must execute setmaxnreg together (it is .sync.aligned)")
    budget = ctx.state.setdefault("setmaxnreg", {})
    action, count = op.attrs["action"], op.attrs["count"]
    for g in groups.tolist():
        now = budget.get(g, entry_registers(ctx.num_threads))
        if (action == "inc" and count < now) or (action == "dec" and count > now):
            raise ctx.error(op, f"setmaxnreg {action} to {count} registers, but warpgroup {g} has {now} per thread "
                                f"now: {'inc can only raise' if action == 'inc' else 'dec can only lower'} the count "
                                f"(at entry a block of {ctx.num_threads} threads has {entry_registers(ctx.num_threads)}"
                                f"); use {'dec' if action == 'inc' else 'inc'}, or another count")
        budget[g] = count
    total = sum(budget.values()) * WARPGROUP
    if op.attrs["action"] == "inc" and total > REGISTERS_PER_SM:
        asked = ", ".join(f"warpgroup {g}: {n}" for g, n in sorted(budget.items()))
        raise ctx.error(op, f"setmaxnreg inc to {op.attrs['count']} registers cannot be granted: the warpgroups ask for "
                            f"{total} registers in all ({asked}; x {WARPGROUP} threads), more than the "
                            f"{REGISTERS_PER_SM} of an SM, so the GPU would wait forever; lower the counts")


@simt("elect_sync")
def _elect_sync(ctx, op):
    warps = whole_units(ctx, op, ctx.warp_size, "warp", "elect.sync is lowered with the full-warp member mask, so every "
                   "lane of the warp must execute it; elect before the branch, or in code the whole warp runs")
    elected = np.zeros(ctx.num_threads, bool)
    elected[warps * ctx.warp_size] = True
    return elected


class _NamedBarrier:
    """Who has arrived at one barrier id in its current round, and how many rounds have completed."""

    def __init__(self, num_threads: int, count: int):
        self.count = count
        self.arrived = np.zeros(num_threads, bool)
        self.only_arrived = np.zeros(num_threads, bool)   # by `arrive`: their wgmmas may still be in flight
        self.rounds = 0


@simt("named_barrier")
def _named_barrier(ctx, op):
    barrier_id, count = op.attrs["id"], op.attrs["count"]
    whole_units(ctx, op, ctx.warp_size, "warp", "bar.sync counts whole warps, so all lanes of a warp must reach it")
    live = live_mask(ctx)
    bars = ctx.state.setdefault("named_barriers", {})
    bar = bars.get(barrier_id)
    if bar is None:
        bar = bars[barrier_id] = _NamedBarrier(ctx.num_threads, count)
    if bar.count != count and bar.arrived.any():
        raise ctx.error(op, f"named_barrier {barrier_id} expects {count} threads here, but threads "
                            f"{span(np.flatnonzero(bar.arrived))} arrived expecting {bar.count}; give every "
                            "use of one barrier id the same count")
    bar.count = count
    twice = live & bar.arrived
    if twice.any():
        raise ctx.error(op, f"thread {int(np.argmax(twice))} arrives at named_barrier {barrier_id} twice in one round")
    bar.arrived |= live
    if op.attrs.get("arrive"):
        bar.only_arrived |= live
    arrived = int(bar.arrived.sum())
    if arrived > count:
        raise ctx.error(op, f"{arrived} threads ({span(np.flatnonzero(bar.arrived))}) arrive at named_barrier "
                            f"{barrier_id}, which expects {count}; a barrier's count must be the number of threads "
                            "that use it")
    if arrived == count:
        participants = np.flatnonzero(bar.arrived)
        waited = np.flatnonzero(bar.arrived & ~bar.only_arrived)
        bar.arrived[:] = False
        bar.only_arrived[:] = False
        bar.rounds += 1
        if count == ctx.num_threads:
            ctx.shared.barrier()
        else:
            ctx.shared.order_after(participants, releasing=waited)
        return
    if op.attrs.get("arrive"):
        return
    round_ = bar.rounds
    mine = np.flatnonzero(live)

    def waiting() -> str:
        return (f"named_barrier {barrier_id} (bar.sync {barrier_id}, {count}), which {int(bar.arrived.sum())} of its "
                f"{count} threads have reached (threads {span(np.flatnonzero(bar.arrived))})")

    wait_until(ctx, op, lambda: bar.rounds != round_, waiting,
               lambda: (f"DEADLOCK: threads {span(mine)} wait at {waiting()}, and no other thread of the block is "
                        "running that could arrive; count the threads that reach it"))


def finish_block(block) -> None:
    """At the block's end no named barrier may hold arrivals of a round that never completed: on the GPU a
    `bar.arrive` nobody waits for is left pending (a ping-pong whose turns do not balance)."""
    for barrier_id, bar in block.state.get("named_barriers", {}).items():
        if bar.arrived.any():
            raise InterpreterError(f"named_barrier {barrier_id} ends the block with threads "
                                   f"{span(np.flatnonzero(bar.arrived))} arrived and {bar.count} expected: its "
                                   "last round never completed; match every arrival with a wait",
                                   kernel=block.fn.name, program_id=block.program_id)
