"""Per-op lowering from tile IR to thread IR, one module per op family, and the context they share. It may
import `tessera.ir` and the rest of `tessera.passes` (`passes/schedule/` only for type annotations).

`LOWERINGS` maps an op name to `fn(ctx, op)`, which reads the op's lowered
operands from the `Lowering` context (`context.py`), emits thread IR at
the context's insertion point and binds the op's results. Ops that only
touch scalars and have no regions need no entry: they are copied as they
are (`copy_scalar_op`). The scheduling transforms (software pipelining,
TMA fills, warp specialization, explicit shared buffers) are
`passes/schedule/`, which registers the lowerings of `for` and the smem_*
ops here; this package imports it only for type annotations.

    context.py        Lowering: tile values -> lowered forms, regions; its helpers:
    emitter.py          the op-creating verbs (emit, const, hoist, splat, when, ...)
    thread_index.py     index math from thread_id (hoisted)
    thread_groups.py    who still runs, and what a barrier is
    shared_exchange.py  values exchanged through shared memory, mbarriers
    relayout.py         moving a tile to another register layout
    values.py         Regs, ViewParts, RingOperand: what a lowered value is
    layout_math.py    digits, register maps, strides of register layouts (pure)
    vector_facts.py   what the alignment analysis proves about widths
    elementwise.py    constants, splat, arange, arithmetic/math/cmp/select/cast
    shape.py          broadcast, expand_dims, reshape, permute, convert_layout
    memory.py         pointer loads/stores/atomics, tensor views
    reductions.py     reduce, arg_reduce, scan
    dot.py            dot (mma.sync / MFMA tensor cores, else FMA through shared memory; wgmma: wgmma_dot.py)
    mma_operands.py, mfma_operands.py   tensor-core operand fragments (ldmatrix, LDS)
    control_flow.py   if, while, plain for loops, and the terminators
    debug.py          print, breakpoint (dropped), assert
    hints.py          multiple_of, max_contiguous (their operand), assume (dropped)
"""

from __future__ import annotations

from tessera.ir.core import Operation
from tessera.ir.op_table import OpTable
from tessera.ir.types import TileType, ViewType

from .context import Lowering
from .values import Regs

LOWERINGS = OpTable("tile -> thread lowering")
lowering = LOWERINGS.register       # @lowering("add", "sub"): fn(ctx, op)


def lower_op(ctx: Lowering, op: Operation) -> None:
    fn = LOWERINGS.get(op.name)
    if fn is None:
        involved = [v for v in (*op.operands, *op.results) if isinstance(v.type, (TileType, ViewType))]
        if involved or op.regions:
            raise ctx.error(op, f"the thread-level lowering does not handle '{op.name}' on tiles yet")
        fn = copy_scalar_op
    saved, ctx.b.loc = ctx.b.loc, op.loc      # every op made for `op` carries its source location
    try:
        fn(ctx, op)
        for then in ctx.after.pop(op, {}).values():
            then()
    finally:
        ctx.b.loc = saved


def copy_scalar_op(ctx: Lowering, op: Operation) -> None:
    """Re-create a scalar op with lowered operands (every thread computes the same value)."""
    operands = [ctx.thread_value(ctx.operand(op, i)) for i in range(len(op.operands))]
    new = ctx.create(op.name, operands, op.attrs, [r.type for r in op.results])
    new.loc = op.loc
    for old, result in zip(op.results, new.results):
        result.name_hint = old.name_hint
        ctx.define(old, result)


# Importing the families fills LOWERINGS.
from . import control_flow, debug, dot, elementwise, hints, memory, reductions, shape  # noqa: E402,F401

__all__ = ["LOWERINGS", "Lowering", "Regs", "lower_op", "lowering"]
