"""Per-op lowering from tile IR to thread IR, one module per op family.

`LOWERINGS` maps an op name to `fn(ctx, op)`, which reads the op's lowered
operands from the `Lowering` context (`context.py`), emits thread IR at
the context's insertion point and binds the op's results. Ops that only
touch scalars and have no regions need no entry: they are copied as they
are (`copy_scalar_op`).

    elementwise.py    constants, splat, arange, arithmetic/math/cmp/select/cast
    shape.py          broadcast, expand_dims, reshape, permute, convert_layout
    memory.py         pointer loads/stores/atomics, tensor views
    reductions.py     reduce, arg_reduce, scan
    dot.py            dot (mma.sync tensor cores, else FMA through shared memory; wgmma: wgmma_dot.py)
    control_flow.py   for, if, while and their terminators
    async_pipeline.py a `for {stages}` whose dot operands are copied ahead with cp.async
                      (which loads, in which slot layout: pipeline_plan.py)
    warp_specialized.py a `for {stages, warp_specialize}`: a producer warpgroup fills the TMA ring
    debug.py          print, breakpoint (dropped), assert
    shared_buffers.py explicit shared buffers (tessera.shared): smem_alloc/slot/load/store, async copies
    smem_mbarriers.py the language's mbarriers: copies with barrier= (TMA on sm_90), bars[s].wait(parity)
"""

from __future__ import annotations

from tessera.ir.core import Operation
from tessera.ir.op_table import OpTable
from tessera.ir.types import TileType, ViewType

from .context import Lowering, Regs

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
from . import control_flow, debug, dot, elementwise, memory, reductions, shape  # noqa: E402,F401
from . import shared_buffers, smem_mbarriers  # noqa: E402,F401

__all__ = ["LOWERINGS", "Lowering", "Regs", "lower_op", "lowering"]
