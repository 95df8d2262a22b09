"""Ops that move lanes around without changing values: splat, broadcast,
expand_dims, reshape (row-major), permute, and convert_layout (the identity:
a register layout says where lanes live on the GPU, not what they hold).
They apply to tiles of numbers and to tiles of pointers alike."""

from __future__ import annotations

import numpy as np

from tessera.ir.types import shape_of

from .registry import semantics
from .values import map_lanes


@semantics("splat")
def _splat(ctx, op, x):
    shape = shape_of(op.result.type)
    return map_lanes(x, lambda a: np.full(shape, a, dtype=a.dtype))


@semantics("broadcast")
def _broadcast(ctx, op, x):
    shape = shape_of(op.result.type)
    return map_lanes(x, lambda a: np.broadcast_to(a, shape))


@semantics("expand_dims")
def _expand_dims(ctx, op, x):
    return map_lanes(x, lambda a: np.expand_dims(a, op.attrs["axis"]))


@semantics("reshape")
def _reshape(ctx, op, x):
    shape = shape_of(op.result.type)
    return map_lanes(x, lambda a: np.reshape(a, shape))


@semantics("permute")
def _permute(ctx, op, x):
    return map_lanes(x, lambda a: np.transpose(a, op.attrs["order"]))


@semantics("convert_layout")
def _convert_layout(ctx, op, x):
    return x
