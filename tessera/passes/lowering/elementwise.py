"""Values made from nothing (constants, splat, arange) and lane-wise ops.

A tile constant becomes a register array of that constant, a splat copies
the scalar into every register, and `arange(start, end)` is the
coordinate itself: thread part (from `thread_id`) plus a constant per
register (see `thread_index.ThreadIndex.regs`). Lane-wise ops (arithmetic, math,
comparisons, select, casts, addptr) keep their names and apply register by
register to operands that layout assignment gave one layout (converted
first where it recorded a conversion).
"""

from __future__ import annotations

from tessera.ir.types import RegsType, TileType

from tessera.ir.ops import op_names

from . import copy_scalar_op, lowering
from .values import Regs


@lowering("constant")
def _constant(ctx, op):
    t = op.result.type
    if not isinstance(t, TileType):
        copy_scalar_op(ctx, op)
        return
    layout = ctx.assignment.layout(op.result)
    value = ctx.const_regs([op.attrs["value"]] * layout.local_size, t.element.dtype)
    ctx.define(op.result, Regs(value, layout), op)


@lowering("splat")
def _splat(ctx, op):
    layout = ctx.assignment.layout(op.result)
    scalar = ctx.operand(op, 0)
    ctx.define(op.result, Regs(ctx.splat(scalar, layout.local_size), layout), op)


@lowering("arange")
def _arange(ctx, op):
    layout = ctx.assignment.layout(op.result)
    ctx.define(op.result, Regs(ctx.index.regs(layout, [1], bias=op.attrs["start"]), layout), op)


@lowering(*op_names(elementwise=True))
def _elementwise(ctx, op):
    result = op.results[0]
    if not isinstance(result.type, TileType):
        copy_scalar_op(ctx, op)
        return
    layout = ctx.assignment.layout(result)
    operands = []
    for i in range(len(op.operands)):
        regs = ctx.operand(op, i)
        operands.append(regs.value)
    t = RegsType(result.type.element, layout.local_size)
    value = ctx.create(op.name, operands, op.attrs, [t]).result
    ctx.define(result, Regs(value, layout), op)
