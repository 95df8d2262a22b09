"""Values made from nothing: constants, index ranges, program ids."""

from __future__ import annotations

import numpy as np

from tessera.ir.types import scalar_dtype, shape_of

from .registry import semantics


@semantics("constant")
def _constant(ctx, op):
    """The attribute's value rounded to the result dtype, filling the result shape."""
    t = op.result.type
    dtype = scalar_dtype(t)
    return ctx.memo(op, lambda: np.full(shape_of(t), dtype.quantize(op.attrs["value"]), dtype=dtype.compute_dtype))


@semantics("arange")
def _arange(ctx, op):
    return ctx.memo(op, lambda: np.arange(op.attrs["start"], op.attrs["end"], dtype=np.int32))


@semantics("program_id")
def _program_id(ctx, op):
    return np.asarray(ctx.program_id[op.attrs["axis"]], dtype=np.int32)


@semantics("num_programs")
def _num_programs(ctx, op):
    return np.asarray(ctx.grid[op.attrs["axis"]], dtype=np.int32)


def _cluster_dims(ctx) -> tuple[int, int, int]:
    return tuple(int(d) for d in (tuple(ctx.fn.attrs.get("cluster_dims") or ()) + (1, 1, 1))[:3])


@semantics("cluster_rank")
def _cluster_rank(ctx, op):
    """The program's rank in its cluster (`tessera.cluster_dims`): its coordinates within the cluster, x fastest."""
    (dx, dy, dz), (x, y, z) = _cluster_dims(ctx), ctx.program_id
    return np.asarray(x % dx + dx * (y % dy + dy * (z % dz)), dtype=np.int32)


@semantics("cluster_id")
def _cluster_id(ctx, op):
    axis = op.attrs["axis"]
    return np.asarray(ctx.program_id[axis] // _cluster_dims(ctx)[axis], dtype=np.int32)
