"""Structured control flow: if, while, plain for loops, and the terminators.

The ops keep their structure; a carried or yielded tile becomes its
registers (`regs<N x T>`) in the layout layout assignment gave the region
argument or result, with initial and yielded values converted to it first
where they differ. Conditions and bounds are scalars, the same in every
thread, so all threads take the same path and barriers inside regions are
safe.

Loops are scheduled by `passes/schedule/loops.py`: a `for` software-pipelined,
warp-specialized, or, as here, a plain loop (`lower_plain_for`); a `while`
as here (`lower_while`), after it says in strict mode why it is not pipelined.
"""

from __future__ import annotations

from tessera.ir.core import Operation
from tessera.ir.types import TileType

from . import lowering
from .values import Regs


def define_results(ctx, op, new_op) -> None:
    """Bind the results of tile-IR region op `op` to those of its thread-IR form `new_op`."""
    for old, new in zip(op.results, new_op.results):
        new.name_hint = old.name_hint
        if isinstance(old.type, TileType):
            ctx.define(old, Regs(new, ctx.assignment.layout(old)), op)
        else:
            ctx.define(old, new, op)


def _terminator_values(ctx, op) -> list:
    return [ctx.thread_value(ctx.operand(op, i)) for i in range(len(op.operands))]


@lowering("yield", "condition")
def _terminator(ctx, op):
    ctx.create(op.name, _terminator_values(ctx, op))


@lowering("return")
def _return(ctx, op):
    ctx.threads.end_kernel()
    ctx.create("return")


def lower_plain_for(ctx, op) -> Operation:
    """A `for` as the same loop over threads' registers (its `stages`, if any, dropped); returned."""
    operands = _terminator_values(ctx, op)
    (region,) = op.regions
    body = ctx.new_block(region)
    ctx.lower_block(region, body, ctx.region_args(region, body))
    new = ctx.create("for", operands, None, [ctx.thread_type(r) for r in op.results], [body])
    define_results(ctx, op, new)
    return new


@lowering("if")
def _if(ctx, op):
    cond = ctx.thread_value(ctx.operand(op, 0))
    regions = []
    for region in op.regions:
        block = ctx.new_block(region)
        ctx.lower_block(region, block, [])
        regions.append(block)
    new = ctx.create("if", [cond], None, [ctx.thread_type(r) for r in op.results], regions)
    define_results(ctx, op, new)


def lower_while(ctx, op) -> None:
    """A `while` as the same loop over threads' registers."""
    operands = _terminator_values(ctx, op)
    blocks = []
    for region in op.regions:
        block = ctx.new_block(region)
        ctx.lower_block(region, block, ctx.region_args(region, block))
        blocks.append(block)
    new = ctx.create("while", operands, None, [ctx.thread_type(r) for r in op.results], blocks)
    define_results(ctx, op, new)
