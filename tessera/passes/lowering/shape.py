"""Ops that move lanes without changing values: broadcast, expand_dims, reshape, permute,
convert_layout.

Each is a `relayout`: result register j holds the source element whose
row-major index is a linear function of j's coordinates (zero weight on
broadcast dims, the source's strides permuted for permute, the result's
own row-major strides for reshape). With the layouts that layout
assignment derives (the broadcast operand is the result's layout reduced
over the broadcast dims, permute permutes the layout, ...) every thread
already holds what it needs and this is a renaming of registers; otherwise
the tile goes through shared memory.

convert_layout is the same move with the identity map, to the layout it
pins (`relayout.materialize`: tiles of pointers are rebuilt there instead).
"""

from __future__ import annotations

from tessera.ir.types import PointerType, TileType

from . import lowering
from .layout_math import row_major_strides
from .relayout import materialize, relayout
from .values import Regs


def source_weights(op) -> list[int]:
    """Result coordinate k of shape op `op` reads source element (row-major) sum_k w_k * coord_k."""
    src_shape = op.operands[0].type.shape
    strides = list(row_major_strides(src_shape))
    if op.name == "broadcast":
        return [0 if n == 1 else s for n, s in zip(src_shape, strides)]
    if op.name == "expand_dims":
        axis = op.attrs["axis"]
        return strides[:axis] + [0] + strides[axis:]
    if op.name == "permute":
        return [strides[d] for d in op.attrs["order"]]
    return list(row_major_strides(op.result.type.shape))     # reshape: same row-major index


@lowering("broadcast", "expand_dims", "permute", "reshape")
def _shape_op(ctx, op):
    if not isinstance(op.result.type, TileType):   # reshape of a one-element tile to a scalar: all threads hold it
        src = ctx.operand(op, 0)
        ctx.define(op.result, ctx.extract(src.value, 0), op)
        return
    layout = ctx.assignment.layout(op.result)
    if not isinstance(op.operands[0].type, TileType):    # a scalar widened (expand_dims(tessera.sum(x), 0)): splat
        ctx.define(op.result, Regs(ctx.splat(ctx.lookup(op.operands[0]), layout.local_size), layout), op)
        return
    if isinstance(op.result.type.element, PointerType):
        ctx.define(op.result, materialize(ctx, op.result, layout), op)
        return
    ctx.define(op.result, relayout(ctx, ctx.operand(op, 0), layout, source_weights(op), op), op)


@lowering("convert_layout")
def _convert_layout(ctx, op):
    ctx.define(op.result, materialize(ctx, op.operands[0], ctx.assignment.layout(op.result)), op)
