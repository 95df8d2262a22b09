"""Matrix multiplication: dot."""

from __future__ import annotations

from typing import Any

from ...ir.dtypes import DType, f32, f64, i32, i64
from ...ir.ops import DOT_INPUT_PRECISIONS
from .. import operators, promotion
from ..constexpr_args import describe, static_dtype, static_str
from ..errors import TypeMismatchError
from ..promotion import PromotionError
from ..values import Context, Tensor, builtin



def _matrix(ctx: Context, x: Any, name: str) -> Tensor:
    if not isinstance(x, Tensor) or x.dtype is None or len(x.shape) != 2:
        ctx.error(f"dot needs 2-D tiles of numbers, got {name} = {describe(x)}", TypeMismatchError)
    if x.dtype.is_bool:
        ctx.error(f"dot needs numbers, got {name} = {x.type}; cast it first, e.g. {name}.to(tessera.i8)",
                  TypeMismatchError)
    return x


def default_accumulator_dtype(inputs: DType) -> DType:
    """f32 for float inputs (f64 for f64), i32 for integers (i64 for 64-bit ones)."""
    if inputs.is_float:
        return f64 if inputs == f64 else f32
    return i64 if inputs.bits == 64 else i32


@builtin
def dot(ctx: Context, a, b, acc=None, input_precision=None, out_dtype=None) -> Tensor:
    """dot(a, b, acc=None, input_precision=None, out_dtype=None) -> acc + a @ b.

    `a` is an M x K tile and `b` a K x N tile; inputs of different dtypes
    are promoted to their common type (fp8 inputs stay fp8: tensor cores
    take them directly). The product accumulates in the dtype of `acc`, an
    M x N tile; without `acc` it starts from zeros of `out_dtype`, which
    defaults to f32 for float inputs (f64 for f64) and i32 for integers.

    `input_precision` chooses how f32 inputs are multiplied: "tf32" (inputs
    rounded to a 10-bit mantissa, to nearest with ties away from zero, then
    tensor cores where the target has them; the interpreter rounds the same
    way) or "ieee" (exact f32 products), the default, like Triton's.
    """
    a, b = _matrix(ctx, a, "a"), _matrix(ctx, b, "b")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        ctx.error(f"cannot dot {a.type} and {b.type}: a has {k} columns but b has {k2} rows "
                  f"(shapes {a.shape} @ {b.shape}; the inner dimensions must match)", TypeMismatchError)
    try:
        inputs = promotion.promote(a.dtype, b.dtype)
    except PromotionError as exc:
        ctx.error(f"cannot dot {a.type} and {b.type}: {exc}", TypeMismatchError)
    a, b = operators.cast(ctx, a, inputs), operators.cast(ctx, b, inputs)
    out_dtype = None if out_dtype is None else static_dtype(ctx, out_dtype, "dot's out_dtype")
    if out_dtype is not None and out_dtype.is_bool:
        ctx.error("dot's out_dtype must be a number type, got bool; use tessera.f32 (or tessera.i32)",
                  TypeMismatchError)
    if acc is None:
        acc = operators.constant(ctx, 0, out_dtype or default_accumulator_dtype(inputs), (m, n))
    else:
        if not isinstance(acc, Tensor) or acc.dtype is None or acc.shape != (m, n):
            ctx.error(f"dot's acc must be a {m}x{n} tile (a is {a.shape}, b is {b.shape}), got {describe(acc)}",
                      TypeMismatchError)
        if acc.dtype.is_bool:
            ctx.error(f"dot accumulates in acc's dtype, which must be a number, got {acc.type}; start it from "
                      f"tessera.zeros(({m}, {n}), tessera.f32) (or i32 for integer inputs)", TypeMismatchError)
        if out_dtype is not None and acc.dtype != out_dtype:
            ctx.error(f"dot's acc is {acc.type} but out_dtype is {out_dtype.name}; give one or make them agree",
                      TypeMismatchError)
    attrs = {}
    if input_precision is not None:
        precision = static_str(ctx, input_precision, "dot's input_precision")
        if precision not in DOT_INPUT_PRECISIONS:
            ctx.error(f"dot's input_precision must be one of {', '.join(DOT_INPUT_PRECISIONS)}, got {precision!r}")
        attrs["input_precision"] = precision
    return operators.emit(ctx, "dot", a, b, acc, **attrs)
