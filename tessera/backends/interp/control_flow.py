"""Structured control flow: for, if, while, and the terminators that end regions.

* `for`: iv runs lb, lb+step, ... while iv < ub (step > 0) or iv > ub
  (step < 0), like Python's range; the iv has the bounds' integer type.
  A zero step raises InterpreterError.
* `if`: runs the then or else region; its results are what that region yields.
* `while`: runs the condition region; while `condition`'s flag is true, runs
  the body on the values it passes; when false, those values are the results.
  In a cooperative launch an iteration that read memory and changed nothing
  (a spin-wait) parks the program until another one changes memory.
* `yield` / `condition` hand their operands to the parent op; `return` ends
  the program instance from any depth.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.types import scalar_dtype

from .cooperative import unchanged
from .registry import semantics
from .storage import WriteClock


@semantics("for", multi=True)
def _for(ctx, op, lb, ub, step, *carried):
    start, stop, stride = int(lb), int(ub), int(step)
    if stride == 0:
        raise ctx.error(op, "for loop step is 0, so it would never end; use a positive or negative step")
    iv_dtype = scalar_dtype(op.operands[0].type).compute_dtype
    body = op.regions[0]
    for i in range(start, stop, stride):
        carried = ctx.run_region(body, [np.asarray(i, dtype=iv_dtype), *carried])
    return carried


@semantics("if", multi=True)
def _if(ctx, op, cond):
    then_region, else_region = op.regions
    return ctx.run_region(then_region if bool(cond) else else_region, [])


# A `while` loop of one program instance that runs this often is taken to be infinite (the only construct that
# can hang the interpreter): an InterpreterError instead of a hang.
MAX_WHILE_ITERATIONS = 100_000


@semantics("while", multi=True)
def _while(ctx, op, *carried):
    before, after = op.regions
    park = getattr(ctx, "park", None)   # set in a cooperative launch (see cooperative.py): a spinning program waits there
    for _ in range(MAX_WHILE_ITERATIONS):
        reads, ticks = WriteClock.reads, WriteClock.ticks
        keep_going, *passed = ctx.run_region(before, carried)
        if not bool(keep_going):
            return passed
        went_in, carried = carried, ctx.run_region(after, passed)
        if park is not None and WriteClock.reads != reads and WriteClock.ticks == ticks and unchanged(went_in, carried):
            park(op)         # it read memory, changed nothing, and will read the same again: wait for a change
    raise ctx.error(op, f"the while loop ran {MAX_WHILE_ITERATIONS} iterations without finishing; is it infinite? "
                        "(raise tessera.backends.interp.control_flow.MAX_WHILE_ITERATIONS if not)")


@semantics("yield", "condition")
def _hand_over(ctx, op, *values):
    return values


class KernelReturn(Exception):
    """Raised by `return` to end the program instance; the walker catches it."""


@semantics("return")
def _return(ctx, op):
    raise KernelReturn()
