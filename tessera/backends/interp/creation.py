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
