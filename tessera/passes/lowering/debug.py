"""Debugging ops: `assert` stays (per thread, on its registers); `print` and `breakpoint` are dropped.

Device-side print needs a formatting runtime (vprintf) that the backends do
not have yet, and breakpoint only means something in the CPU interpreter;
each dropped op leaves a note in `Lowering.notes` (the driver puts them in
the function's `lowering_notes` attribute).
"""

from __future__ import annotations

from . import lowering


@lowering("assert")
def _assert(ctx, op):
    cond = ctx.thread_value(ctx.operand(op, 0))
    ctx.create("assert", [cond], op.attrs)


@lowering("print", "breakpoint")
def _dropped(ctx, op):
    where = f" at {op.loc}" if op.loc is not None else ""
    ctx.notes.append(f"{op.name}{where} dropped: device-side {op.name} is not lowered to threads")
