"""Structured control flow: for, if, while, and the terminators.

The ops keep their structure; a carried or yielded tile becomes its
registers (`regs<N x T>`) in the layout layout assignment gave the region
argument or result, with initial and yielded values converted to it first
where they differ. Conditions and bounds are scalars, the same in every
thread, so all threads take the same path and barriers inside regions are
safe.

A `for {stages = S}` whose dot operands can be copied ahead with cp.async
becomes the software-pipelined loop of `async_pipeline.py`; otherwise the
attribute is dropped and the loop lowers as any other. A `for {stages = S,
warp_specialize = true}` becomes the producer / consumer warpgroups of
`warp_specialized.py`.
"""

from __future__ import annotations

from tessera.ir.types import TileType

from . import lowering
from .async_pipeline import lower_pipelined_for
from .context import Regs
from .pipeline_plan import pipeline_plan
from .warp_specialized import end_consumer_branch, lower_warp_specialized_for


def _results(ctx, op, new_op) -> None:
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
    if ctx.consumer_threads is not None:
        end_consumer_branch(ctx)
    ctx.create("return")


@lowering("for")
def _for(ctx, op):
    stages = op.attrs.get("stages", 1)
    if op.attrs.get("warp_specialize"):
        lower_warp_specialized_for(ctx, op)
        return
    if stages > 1:
        plan = pipeline_plan(op, ctx.target, ctx.num_threads // ctx.warp_size, ctx.facts.facts)
        where = f" at {op.loc}" if op.loc else ""
        if plan is None:
            ctx.notes.append(f"for{where}: stages = {stages}, but no load qualifies for cp.async pipelining on "
                             f"{ctx.target.name}; lowered as a plain loop")
        else:
            if plan.stages < stages:
                ctx.notes.append(f"for{where}: {plan.stages} of the {stages} stages fit in shared memory")
            lower_pipelined_for(ctx, op, plan)
            return
    operands = _terminator_values(ctx, op)
    (region,) = op.regions
    body = ctx.new_block(region)
    ctx.lower_block(region, body, ctx.region_args(region, body))
    new = ctx.create("for", operands, None, [ctx.thread_type(r) for r in op.results], [body])
    _results(ctx, op, new)


@lowering("if")
def _if(ctx, op):
    cond = ctx.thread_value(ctx.operand(op, 0))
    regions = []
    for region in op.regions:
        block = ctx.new_block(region)
        ctx.lower_block(region, block, [])
        regions.append(block)
    new = ctx.create("if", [cond], None, [ctx.thread_type(r) for r in op.results], regions)
    _results(ctx, op, new)


@lowering("while")
def _while(ctx, op):
    operands = _terminator_values(ctx, op)
    blocks = []
    for region in op.regions:
        block = ctx.new_block(region)
        ctx.lower_block(region, block, ctx.region_args(region, block))
        blocks.append(block)
    new = ctx.create("while", operands, None, [ctx.thread_type(r) for r in op.results], blocks)
    _results(ctx, op, new)
