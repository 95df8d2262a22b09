"""Structured control flow in lockstep: conditions may differ between threads.

A condition that is the same for every active thread takes the fast path
and runs like the tile interpreter. Otherwise:

* `if` runs the then region for the threads whose condition is true and the
  else region for the others, each under its mask, and merges what they
  yield thread by thread; when a region holds an op that waits for other
  threads (mbarrier_wait, named_barrier), the two run as cooperatively
  scheduled paths instead, one after the other (`paths.py`);
* `for` gives each thread its own induction variable and runs the body
  while any thread has iterations left, masking threads that are done (they
  keep their carried values);
* `while` runs the condition region for the threads still looping; a thread
  whose `condition` is false leaves with the values it passed. In a
  cooperative launch an iteration that read global memory and changed
  nothing (no thread left, no value, shared or global byte changed) parks
  the block until another block changes memory (`interp/cooperative.py`).

Ops compute for every thread; the mask only stops side effects (see
`ops.py`), so a masked thread's values inside a region are garbage
that the merge discards.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.types import scalar_dtype

from ..interp.control_flow import KernelReturn
from ..interp.cooperative import unchanged
from ..interp.storage import WriteClock
from .ops import live_mask, merge, simt
from .paths import may_block, scheduler


def _live(ctx, values: np.ndarray) -> np.ndarray:
    """`values` of the active threads."""
    return values if ctx.mask is None else values[ctx.mask]


def _uniform(ctx, *values: np.ndarray) -> bool:
    return all(live.size == 0 or (live == live[0]).all() for live in (_live(ctx, v) for v in values))


@simt("if", multi=True)
def _if(ctx, op, cond):
    then_region, else_region = op.regions
    taken = _live(ctx, cond)
    if taken.all():
        return ctx.run_region(then_region, [], ctx.mask)
    if not taken.any():
        return ctx.run_region(else_region, [], ctx.mask)
    active = live_mask(ctx)
    then_mask, else_mask = active & cond, active & ~cond
    if may_block(ctx, op):   # either side may wait for the other: run them as cooperatively scheduled paths
        then_values, else_values = scheduler(ctx).fork([
            (then_mask, lambda: ctx.run_region(then_region, [], then_mask)),
            (else_mask, lambda: ctx.run_region(else_region, [], else_mask))])
    else:
        then_values = ctx.run_region(then_region, [], then_mask)
        else_values = ctx.run_region(else_region, [], else_mask)
    return [merge(ctx, op, cond, a, b) for a, b in zip(then_values, else_values)]


@simt("for", multi=True)
def _for(ctx, op, lb, ub, step, *carried):
    body = op.regions[0]
    iv_dtype = scalar_dtype(op.operands[0].type).compute_dtype
    if (_live(ctx, step) == 0).any():
        raise ctx.error(op, "for loop step is 0, so it would never end; use a positive or negative step")
    if _uniform(ctx, lb, ub, step):
        first = int(np.argmax(live_mask(ctx)))
        for i in range(int(lb[first]), int(ub[first]), int(step[first])):
            iv = np.full(ctx.num_threads, i, dtype=iv_dtype)
            carried = ctx.run_region(body, [iv, *carried], ctx.mask)
        return list(carried)
    iv, stop, stride = (x.astype(np.int64) for x in (lb, ub, step))
    active = live_mask(ctx)
    running = active & np.where(stride > 0, iv < stop, iv > stop)
    carried = list(carried)
    while running.any():
        new = ctx.run_region(body, [iv.astype(iv_dtype), *carried], running)
        carried = [merge(ctx, op, running, n, c) for n, c in zip(new, carried)]
        iv = iv + stride
        running &= np.where(stride > 0, iv < stop, iv > stop)
    return carried


@simt("while", multi=True)
def _while(ctx, op, *carried):
    before, after = op.regions
    running = live_mask(ctx)
    results: list | None = None
    park = ctx.park         # set in a cooperative launch: a block spinning on a flag waits there
    while True:
        reads, ticks = WriteClock.reads, WriteClock.ticks
        shared_before, running_in = (ctx.shared.bytes.tobytes() if park is not None else b""), running
        keep_going, *passed = ctx.run_region(before, list(carried), running)
        leaving = running & ~keep_going
        if results is None:
            results = passed
        elif leaving.any():
            results = [merge(ctx, op, leaving, p, r) for p, r in zip(passed, results)]
        running = running & keep_going
        if not running.any():
            return results
        went_in, carried = carried, ctx.run_region(after, passed, running)
        if park is not None and WriteClock.reads != reads and WriteClock.ticks == ticks and unchanged(went_in, carried) \
                and np.array_equal(running, running_in) and ctx.shared.bytes.tobytes() == shared_before:
            park(op)        # a spin-wait on global memory (see interp/cooperative.py): wait for another block


@simt("yield", "condition")
def _hand_over(ctx, op, *values):
    return values


@simt("return")
def _return(ctx, op):
    raise KernelReturn()
