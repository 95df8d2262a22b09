"""Moving a lowered tile to another register layout: renaming registers, or a trip through shared memory.

Moving a tile to another layout is free when every thread already holds
the elements it needs, at the same registers in every thread: then it is a
renaming of registers (`extract` + `pack`). Otherwise it goes through shared
memory (`SharedExchange.to_shared` / `from_shared`). Shared memory holds no
pointers, so a tile of pointers needed in another layout is rebuilt there
from its splat / addptr / select / shape-op parts (`materialize`); a pointer
tile carried through a loop in one layout and needed in another cannot be,
and is a LoweringError.
"""

from __future__ import annotations

from typing import Sequence

from tessera.ir.core import Operation, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.types import PointerType, RegsType, TileType

from .layout_math import register_map, row_major_strides
from .values import Regs


def relayout(ctx, regs: Regs, dst: RegisterLayout, weights: Sequence[int], op: Operation | None = None) -> Regs:
    """Registers of `dst` where register j holds source element (row-major) sum_k weights[k] * coord_k."""
    weights = tuple(int(w) for w in weights)
    mapping = register_map(regs.layout, dst, weights)
    if mapping is not None:
        if mapping == tuple(range(regs.count)):
            return Regs(regs.value, dst)
        return Regs(ctx.pack([ctx.extract(regs.value, i) for i in mapping]), dst)
    if isinstance(regs.element, PointerType):
        raise ctx.error(op, f"a tile of pointers would have to move from layout {regs.layout} to {dst} "
                            "through shared memory, which cannot hold pointers; compute the pointers from "
                            "offsets in the layout they are used in")
    buf = ctx.smem.to_shared(regs)
    return Regs(ctx.smem.from_shared(buf, dst, weights, regs.element.dtype), dst)


def convert(ctx, regs: Regs, dst: RegisterLayout, op: Operation | None = None) -> Regs:
    """The same tile in layout `dst`."""
    if regs.layout == dst:
        return regs
    return relayout(ctx, regs, dst, row_major_strides(dst.shape), op)


def materialize(ctx, value: Value, layout: RegisterLayout) -> Regs:
    """Tile-IR `value` in registers of `layout`; tiles of pointers are rebuilt from their parts.

    Shared memory holds no pointers, so a tile of pointers needed in
    another layout is recomputed there: a splat is splat again, an addptr
    adds its offsets converted to the layout, and a shape op
    (broadcast, ...) rebuilds its operand in the layout from which it
    needs no data movement.
    """
    lowered = ctx.env.get(value)
    if isinstance(lowered, Regs) and lowered.layout == layout:
        return lowered
    if not isinstance(value.type.element, PointerType):
        return convert(ctx, ctx.lookup(value), layout)
    key = (value, layout, id(ctx.b.block))
    if key in ctx.materialized:
        return ctx.materialized[key]
    op = value.owner
    fail = ctx.error(op if isinstance(op, Operation) else None,
                     f"a tile of pointers is needed in layout {layout}, but shared memory cannot hold "
                     "pointers and it is not built from a splat, addptr, select or shape op here; compute "
                     "the pointers from offsets in the layout they are used in")
    if not isinstance(op, Operation):
        raise fail
    t = RegsType(value.type.element, layout.local_size)
    if op.name == "splat":
        regs = Regs(ctx.splat(ctx.lookup(op.operands[0]), layout.local_size), layout)
    elif op.name in ("addptr", "select"):
        parts = [materialize(ctx, v, layout).value for v in op.operands]
        regs = Regs(ctx.emit(op.name, *parts, type=t), layout)
    elif op.name in ("broadcast", "expand_dims", "permute", "reshape") and not isinstance(op.operands[0].type,
                                                                                         TileType):
        regs = Regs(ctx.splat(ctx.lookup(op.operands[0]), layout.local_size), layout)   # a scalar: the same everywhere
    elif op.name in ("broadcast", "expand_dims", "permute", "reshape"):
        from ..layout_assignment import derived
        from .shape import source_weights
        backward = [derive for source, target, derive in derived(op) if source is value]
        if not backward:
            raise fail
        source = materialize(ctx, op.operands[0], backward[0](layout))
        regs = relayout(ctx, source, layout, source_weights(op), op)
    else:
        raise fail
    ctx.materialized[key] = regs
    return regs
