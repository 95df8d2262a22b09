"""Lane-by-lane ops: arithmetic, bitwise, shifts, comparisons, math, select, casts.

The arithmetic itself (rounding to narrow floats, wrapping integers) is in
`tessera/ir/numerics.py`; this file binds it to ops and checks what the hardware would
turn into garbage:

* integer `div`/`rem` by zero gives 0 in that lane (a GPU gives an
  unspecified value). It is not an error: kernels routinely divide lanes
  that a mask later discards (a divisor loaded with `other=0`, say).
  Float division by zero gives inf/NaN as IEEE says.
* `min`/`max` with a NaN operand return the other operand (fmin/fmax).
* shifts by a negative amount or by >= bits give 0 (`shl`, logical `shr`)
  or the sign fill (arithmetic `shr` of a signed integer).
"""

from __future__ import annotations

import numpy as np

from tessera.ir.ops import COMPARE_PREDICATES, op_names
from tessera.ir.types import scalar_dtype

from tessera.ir import numerics
from .registry import semantics
from .values import Pointers


def _dtype(op):
    return scalar_dtype(op.result.type)


@semantics(*op_names(numerics="binary"))
def _binary(ctx, op, a, b):
    return numerics.binary(op.name, a, b, _dtype(op))


@semantics(*op_names(numerics="compare"))
def _cmp(ctx, op, a, b):
    assert op.attrs["pred"] in COMPARE_PREDICATES
    return numerics.COMPARE[op.attrs["pred"]](a, b)


@semantics(*op_names(numerics="unary"))
def _unary(ctx, op, x):
    return numerics.unary(op.name, x, _dtype(op))


@semantics(*op_names(numerics="math"))
def _math(ctx, op, x):
    return numerics.math_function(op.name, x, _dtype(op))


@semantics("select")
def _select(ctx, op, cond, a, b):
    if cond.ndim == 0:  # a scalar condition picks a whole value: any type, any memory
        return a if bool(cond) else b
    if isinstance(a, Pointers):
        if a.memory is not b.memory:
            raise ctx.error(op, "lane-wise select between pointers into different memories is not supported "
                                "by the interpreter; select offsets instead")
        return Pointers(a.memory, np.where(cond, a.offsets, b.offsets))
    return np.where(cond, a, b)


@semantics("cast")
def _cast(ctx, op, x):
    """dtype.quantize: round-to-nearest-even, saturating float->int with NaN->0, wrapping int->int, x != 0 for bool."""
    return np.asarray(_dtype(op).quantize(x))


@semantics("bitcast")
def _bitcast(ctx, op, x):
    source = scalar_dtype(op.operands[0].type)
    return _dtype(op).decode(source.encode(x))
