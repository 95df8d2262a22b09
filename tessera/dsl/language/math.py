"""Elementwise math: transcendental functions, abs, minimum/maximum, where.

Math functions compute in a float of at least 16 bits: integer and bool
inputs become f32, and so do fp8/fp6/fp4/e8m0 (see promotion.py); f16,
bf16, f32 and f64 stay as they are.
"""

from __future__ import annotations

from typing import Any

from ...ir.types import element_of
from .. import operators, promotion
from ..constexpr_args import describe
from ..errors import TypeMismatchError
from ..promotion import PromotionError
from ..values import Context, Tensor, builtin


def _number(ctx: Context, x: Any, what: str) -> Tensor:
    """`x` as a traced number (Python numbers become constants); pointers and views are errors."""
    if not isinstance(x, Tensor) and not operators.is_python_number(x):
        ctx.error(f"{what} needs a number or a tensor, got {describe(x)}", TypeMismatchError)
    x = operators.to_tensor(ctx, x)
    if x.dtype is None:
        ctx.error(f"{what} needs numbers, got {x.type}", TypeMismatchError)
    return x


def _float_math(ctx: Context, name: str, x: Any) -> Tensor:
    x = _number(ctx, x, name)
    return operators.emit(ctx, name, operators.to_tensor(ctx, x, promotion.math_dtype(x.dtype)))


@builtin
def exp(ctx: Context, x) -> Tensor:
    """exp(x): e**x, elementwise."""
    return _float_math(ctx, "exp", x)


@builtin
def exp2(ctx: Context, x) -> Tensor:
    """exp2(x): 2**x, elementwise (the fast one on GPUs: prefer exp2(x * log2(e)) in hot loops)."""
    return _float_math(ctx, "exp2", x)


@builtin
def log(ctx: Context, x) -> Tensor:
    """log(x): the natural logarithm, elementwise."""
    return _float_math(ctx, "log", x)


@builtin
def log2(ctx: Context, x) -> Tensor:
    """log2(x): the base-2 logarithm, elementwise."""
    return _float_math(ctx, "log2", x)


@builtin
def sqrt(ctx: Context, x) -> Tensor:
    """sqrt(x): the square root, elementwise."""
    return _float_math(ctx, "sqrt", x)


@builtin
def rsqrt(ctx: Context, x) -> Tensor:
    """rsqrt(x): 1 / sqrt(x), elementwise."""
    return _float_math(ctx, "rsqrt", x)


@builtin
def sin(ctx: Context, x) -> Tensor:
    """sin(x): the sine (radians), elementwise."""
    return _float_math(ctx, "sin", x)


@builtin
def cos(ctx: Context, x) -> Tensor:
    """cos(x): the cosine (radians), elementwise."""
    return _float_math(ctx, "cos", x)


@builtin
def tanh(ctx: Context, x) -> Tensor:
    """tanh(x): the hyperbolic tangent, elementwise."""
    return _float_math(ctx, "tanh", x)


@builtin
def erf(ctx: Context, x) -> Tensor:
    """erf(x): the Gauss error function, elementwise."""
    return _float_math(ctx, "erf", x)


@builtin
def sigmoid(ctx: Context, x) -> Tensor:
    """sigmoid(x): 1 / (1 + exp(-x)), elementwise."""
    return _float_math(ctx, "sigmoid", x)


@builtin
def floor(ctx: Context, x) -> Tensor:
    """floor(x): round toward -infinity, elementwise (integer inputs become f32)."""
    return _float_math(ctx, "floor", x)


@builtin
def ceil(ctx: Context, x) -> Tensor:
    """ceil(x): round toward +infinity, elementwise (integer inputs become f32)."""
    return _float_math(ctx, "ceil", x)


@builtin
def abs(ctx: Context, x) -> Tensor:
    """abs(x): |x|, elementwise, in x's dtype (bool and unsigned inputs are returned unchanged;
    fp8/fp6/fp4/e8m0 compute in f32). abs of the most negative integer wraps to itself, as in C."""
    x = _number(ctx, x, "abs")
    if x.dtype.is_bool or x.dtype.kind == "uint":
        return x
    return operators.emit(ctx, "abs", operators.to_tensor(ctx, x, promotion.arithmetic_dtype(x.dtype)))


def _min_max(ctx: Context, name: str, a: Any, b: Any) -> Tensor:
    verb = f"take the {name} of"
    for x in (a, b):
        if not operators.is_number_operand(x):
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: {name} needs numbers", TypeMismatchError)
    shape = operators.common_shape(ctx, verb, a, b)
    try:
        dtype = operators.common_dtype(a, b)
    except PromotionError as exc:
        ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: {exc}", TypeMismatchError)
    x, y = (operators.fit(ctx, v, dtype, shape) for v in (a, b))
    if dtype.is_bool:  # for bools, min is `and` and max is `or`
        return operators.emit(ctx, "and" if name == "minimum" else "or", x, y)
    return operators.emit(ctx, "min" if name == "minimum" else "max", x, y)


@builtin
def minimum(ctx: Context, a, b) -> Tensor:
    """minimum(a, b): the smaller of a and b, elementwise, after broadcasting and promotion.

    Where one operand is NaN the result is the other (like C's fmin); the
    dtype is kept (a selection never rounds), so fp8 inputs give fp8.
    """
    return _min_max(ctx, "minimum", a, b)


@builtin
def maximum(ctx: Context, a, b) -> Tensor:
    """maximum(a, b): the larger of a and b, elementwise, after broadcasting and promotion.

    Where one operand is NaN the result is the other (like C's fmax); the
    dtype is kept (a selection never rounds), so fp8 inputs give fp8.
    """
    return _min_max(ctx, "maximum", a, b)


@builtin
def where(ctx: Context, condition, x, y) -> Tensor:
    """where(condition, x, y): x where condition is true, else y, lane by lane.

    All three broadcast together; x and y are promoted to their common type
    (both may also be pointers of one type); a non-bool condition means
    `condition != 0`. Both x and y are computed: `where` selects, it does
    not branch.
    """
    cond = operators.as_bool(ctx, condition, "where's condition")
    shape = operators.broadcast_shape(cond.shape, operators.shape_of_operand(x), operators.shape_of_operand(y))
    if shape is None:
        ctx.error(f"where's operands do not broadcast: condition {cond.type}, x {describe(x)}, y {describe(y)}",
                  TypeMismatchError)
    if operators.is_pointer(x) and operators.is_pointer(y):
        if element_of(x.type) != element_of(y.type):
            ctx.error(f"where cannot choose between {x.type} and {y.type}: they point to different types",
                      TypeMismatchError)
        px, py = (operators.broadcast_to_shape(ctx, v, shape) for v in (x, y))
        return operators.emit(ctx, "select", operators.broadcast_to_shape(ctx, cond, shape), px, py)
    for v in (x, y):
        if not operators.is_number_operand(v):
            ctx.error(f"where cannot choose between {describe(x)} and {describe(y)}: both must be numbers "
                      f"(or both pointers to one type)", TypeMismatchError)
    try:
        dtype = operators.common_dtype(x, y)
    except PromotionError as exc:
        ctx.error(f"where cannot choose between {describe(x)} and {describe(y)}: {exc}", TypeMismatchError)
    tx, ty = (operators.fit(ctx, v, dtype, shape) for v in (x, y))
    return operators.emit(ctx, "select", operators.broadcast_to_shape(ctx, cond, shape), tx, ty)

