"""Shape manipulation: reshape, permute, trans, expand_dims, broadcast_to.

Shapes, dimension orders and axes are compile-time values. None of these
ops moves data between lanes at the tile level; layout passes decide what
they cost.
"""

from __future__ import annotations

import math as pymath
from typing import Any

from ...ir.types import element_of, with_shape
from .. import operators
from ..constexpr_args import describe, require_constexpr, static_axis, static_int, static_shape
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin


def _tile(ctx: Context, x: Any, what: str) -> Tensor:
    """`x` as a traced scalar or tile (numbers or pointers); views are errors."""
    x = operators.to_tensor(ctx, x) if not isinstance(x, Tensor) else x
    if x.is_view:
        ctx.error(f"{what} works on tiles, got the view {x.type}; load a block first: v.block(shape, index).load()",
                  TypeMismatchError)
    return x


def _dims(ctx: Context, dims: Any, what: str) -> tuple[int, ...]:
    require_constexpr(ctx, dims, what)
    entries = dims if isinstance(dims, (tuple, list)) else (dims,)
    return tuple(static_int(ctx, d, f"each entry of {what}") for d in entries)


@builtin
def reshape(ctx: Context, x, shape) -> Tensor:
    """reshape(x, shape): the same elements, row-major, in a new shape (also `x.reshape(*shape)`).

    `shape` is a compile-time tuple; one entry may be -1, meaning "whatever
    makes the element count match".
    """
    x = _tile(ctx, x, "reshape")
    dims = _dims(ctx, shape, "reshape's shape")
    numel = pymath.prod(x.shape)
    if dims.count(-1) > 1:
        ctx.error(f"reshape's shape {dims} has more than one -1")
    if -1 in dims:
        known = pymath.prod(d for d in dims if d != -1)
        if known <= 0 or numel % known:
            ctx.error(f"cannot reshape {x.type} to {dims}: {numel} elements do not divide into it", TypeMismatchError)
        dims = tuple(numel // known if d == -1 else d for d in dims)
    dims = static_shape(ctx, dims, "reshape's shape")
    if pymath.prod(dims) != numel:
        ctx.error(f"cannot reshape {x.type} ({numel} elements) to {dims} ({pymath.prod(dims)} elements)",
                  TypeMismatchError)
    if dims == x.shape:
        return x
    result_type = with_shape(element_of(x.type), dims)
    if not x.shape:  # a scalar becomes a one-element tile
        return operators.emit(ctx, "splat", x, result_type=result_type)
    return operators.emit(ctx, "reshape", x, result_type=result_type)


@builtin
def permute(ctx: Context, x, dims) -> Tensor:
    """permute(x, dims): reorder dimensions; result dimension i is x's dimension dims[i] (also `x.permute(*dims)`)."""
    x = _tile(ctx, x, "permute")
    order = _dims(ctx, dims, "permute's dims")
    rank = len(x.shape)
    if sorted(order) != list(range(rank)):
        ctx.error(f"permute's dims {order} must be a permutation of 0..{rank - 1} for {x.type}")
    if order == tuple(range(rank)):
        return x
    return operators.emit(ctx, "permute", x, order=order)


@builtin
def trans(ctx: Context, x) -> Tensor:
    """trans(x): the transpose of a 2-D tile (also `x.T`)."""
    x = _tile(ctx, x, "trans")
    if len(x.shape) != 2:
        ctx.error(f"trans transposes 2-D tiles, got {x.type}; use tessera.permute(x, dims) for other ranks")
    return operators.emit(ctx, "permute", x, order=(1, 0))


@builtin
def expand_dims(ctx: Context, x, axis) -> Tensor:
    """expand_dims(x, axis): insert a size-1 dimension at `axis`.

    `axis` is an int or a tuple of ints, positions in the result; negative
    ones count from the end.
    """
    x = _tile(ctx, x, "expand_dims")
    axes = _dims(ctx, axis, "expand_dims's axis")
    rank = len(x.shape) + len(axes)
    positions = sorted(static_axis(ctx, a, rank - 1, "expand_dims's axis", inserting=True) for a in axes)
    if len(set(positions)) != len(positions):
        ctx.error(f"expand_dims's axes {axes} repeat a position")
    for position in positions:
        x = operators.emit(ctx, "expand_dims", x, axis=position)
    return x


@builtin
def broadcast_to(ctx: Context, x, shape) -> Tensor:
    """broadcast_to(x, shape): x stretched to `shape` by numpy's rules (scalars fill it; size-1 dims repeat)."""
    x = _tile(ctx, x, "broadcast_to")
    shape = static_shape(ctx, shape, "broadcast_to's shape")
    if operators.broadcast_shape(x.shape, shape) != shape:
        ctx.error(f"cannot broadcast {describe(x)} to {shape}: each dimension must match or be 1, "
                  f"aligned at the right", TypeMismatchError)
    return operators.broadcast_to_shape(ctx, x, shape)
