"""phase_barrier, set_priority, sched_fence and wave_uniform in the SIMT simulator (`ir/wave_schedule_ops.py`).

* `phase_barrier` is AMD's s_barrier: it counts waves, not program points.
  Whole waves arrive (a partly active wave is an error); when every wave of
  the block has arrived the round completes and they all go on, the
  arrivals possibly from different ops (two wave groups staggered by one
  phase meet at different barriers, each on its own path: `paths.py`).
  A round whose every arrival is `fenced` orders every shared-memory access
  before it before every one after it (`barrier`'s rule); otherwise the
  accesses of the threads that arrived fenced are ordered before everyone's
  after it (they released; a wave that arrived unfenced, one phase apart,
  works on its own copy of shared memory), and nothing else is. A
  wave that arrives twice in one round, a round no other path can complete
  (a DEADLOCK), and a round left incomplete when the block ends (a group
  that skipped its closing barrier) are errors.
* `set_priority` and `sched_fence` change no value (they schedule).
* `wave_uniform` checks that its operand is the same in every active lane
  of each wave, as readfirstlane would silently assume.
"""

from __future__ import annotations

import numpy as np

from ..interp.errors import InterpreterError
from .ops import live_mask, simt, whole_units
from .paths import span, wait_until


class _Round:
    """Which threads have arrived at the block's phase barrier in the current round, and how many completed."""

    def __init__(self, num_threads: int):
        self.arrived = np.zeros(num_threads, bool)
        self.fenced = np.zeros(num_threads, bool)       # arrived at a fenced phase_barrier
        self.rounds = 0


@simt("phase_barrier")
def _phase_barrier(ctx, op):
    whole_units(ctx, op, ctx.warp_size, "wave", "s_barrier counts whole waves, so all lanes of a wave must reach it")
    live = live_mask(ctx)
    state = ctx.state.get("phase_barrier")
    if state is None:
        state = ctx.state["phase_barrier"] = _Round(ctx.num_threads)
    twice = live & state.arrived
    if twice.any():
        raise ctx.error(op, f"thread {int(np.argmax(twice))} arrives at a phase_barrier twice in one round (its wave "
                            "runs ahead of a wave that has not arrived once): the wave groups' barrier counts differ")
    state.arrived |= live
    if op.attrs.get("fenced"):
        state.fenced |= live
    if state.arrived.all():
        fenced = np.flatnonzero(state.fenced)
        state.arrived[:] = False
        state.fenced[:] = False
        state.rounds += 1
        if fenced.size == ctx.num_threads:
            ctx.shared.barrier()
        else:           # only the waves that fenced their side have their accesses ordered
            ctx.shared.order_after(fenced)
        return
    round_ = state.rounds
    mine = np.flatnonzero(live)

    def waiting() -> str:
        missing = np.flatnonzero(~state.arrived)
        return (f"a phase_barrier (s_barrier, round {round_ + 1}), which threads {span(np.flatnonzero(state.arrived))} "
                f"have reached and threads {span(missing)} have not")

    wait_until(ctx, op, lambda: state.rounds != round_, waiting,
               lambda: (f"DEADLOCK: threads {span(mine)} wait at {waiting()}, and no other thread of the block is "
                        "running that could arrive; every wave must reach the same number of phase barriers"))


@simt("set_priority", "sched_fence")
def _schedule_only(ctx, op):
    return None


@simt("wave_uniform")
def _wave_uniform(ctx, op, x):
    live = live_mask(ctx).reshape(-1, ctx.warp_size)
    lanes = np.asarray(x).reshape(-1, ctx.warp_size)
    for wave in np.flatnonzero(live.any(axis=1)):
        values = lanes[wave][live[wave]]
        if (values != values[0]).any():
            raise ctx.error(op, f"wave_uniform: wave {int(wave)}'s lanes hold different values "
                                f"({', '.join(map(str, np.unique(values)[:4].tolist()))}); readfirstlane would "
                                "keep only the first: make the value depend on the wave, not the lane")
    return x


def finish_block(block) -> None:
    """At the block's end no wave may be left at a phase barrier round that never completed."""
    state = block.state.get("phase_barrier")
    if state is not None and state.arrived.any():
        raise InterpreterError(f"the block ends with threads {span(np.flatnonzero(state.arrived))} arrived at a "
                               "phase_barrier round the other waves never reached: the wave groups' barrier counts "
                               "differ (is a group missing its closing barrier?)",
                               kernel=block.fn.name, program_id=block.program_id)
