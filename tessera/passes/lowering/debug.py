"""Debugging ops in debug builds: `print` and `assert` per thread, on its registers; `breakpoint` dropped.

A debug build (`lower(..., debug=True)`: the compile driver's `debug=True`
or TESSERA_DEBUG=1) keeps `print` (each thread prints the registers it
holds) and `assert` (each thread checks its own) for the backend: vprintf
and a trap on NVIDIA. Otherwise both are dropped, like `breakpoint`
always is (it only means something in the CPU interpreter); each dropped
op leaves a note in `Lowering.notes` (the driver puts them in the
function's `lowering_notes` attribute).
"""

from __future__ import annotations

from . import lowering


@lowering("print", "assert")
def _debug_op(ctx, op):
    if not ctx.debug:
        _dropped(ctx, op, "runs in debug builds only (TESSERA_DEBUG=1, or kernel.compile(..., debug=True))")
        return
    operands = [ctx.thread_value(ctx.operand(op, i)) for i in range(len(op.operands))]
    ctx.create(op.name, operands, op.attrs)


@lowering("breakpoint")
def _breakpoint(ctx, op):
    _dropped(ctx, op, "only stops the CPU interpreter")


def _dropped(ctx, op, why: str) -> None:
    where = f" at {op.loc}" if op.loc is not None else ""
    ctx.notes.append(f"{op.name}{where} dropped: device-side {op.name} {why}")
