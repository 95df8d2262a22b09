"""Checking builtin arguments that must be known at compile time.

Shapes, axes, dtypes and arange bounds shape the IR itself, so they must be
Python values while the kernel is traced. A traced value in their place
usually means a kernel parameter is missing its `tessera.constexpr`
annotation; the errors here say so.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ..ir.dtypes import DType, dtype_from_name
from .errors import ConstexprError
from .values import Context, Tensor


def require_constexpr(ctx: Context, value: Any, what: str) -> None:
    """Fail with ConstexprError when `value` is a traced value."""
    if isinstance(value, Tensor):
        ctx.error(f"{what} must be known at compile time, but it is a traced {value.type} value; "
                  f"if it comes from a kernel parameter, annotate that parameter `tessera.constexpr`",
                  ConstexprError)


def static_int(ctx: Context, value: Any, what: str) -> int:
    """`value` as a Python int (numpy integers accepted; bools are not ints here)."""
    require_constexpr(ctx, value, what)
    if isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        ctx.error(f"{what} must be an int, got {value!r}")
    return value


def static_bool(ctx: Context, value: Any, what: str) -> bool:
    require_constexpr(ctx, value, what)
    if not isinstance(value, (bool, np.bool_)):
        ctx.error(f"{what} must be True or False, got {value!r}")
    return builtins.bool(value)


def static_str(ctx: Context, value: Any, what: str) -> str:
    require_constexpr(ctx, value, what)
    if not isinstance(value, str):
        ctx.error(f"{what} must be a string, got {value!r}")
    return value


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def static_shape(ctx: Context, shape: Any, what: str, *, power_of_two: bool = True) -> tuple[int, ...]:
    """A tile shape: an int or a tuple of ints, each positive (and a power of two unless told otherwise)."""
    require_constexpr(ctx, shape, what)
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    result = tuple(static_int(ctx, d, f"each dimension of {what}") for d in dims)
    for d in result:
        if d <= 0:
            ctx.error(f"{what} {result} has a dimension {d}; tile dimensions must be positive")
        if power_of_two and not is_power_of_two(d):
            ctx.error(f"{what} {result} has a dimension {d}; tile dimensions must be powers of two: "
                      f"use {1 << (d - 1).bit_length()} and mask off the extra lanes")
    return result


def static_axis(ctx: Context, axis: Any, rank: int, what: str, *, inserting: bool = False) -> int:
    """An axis in [-rank, rank) made non-negative; with `inserting`, a new axis position in [-rank-1, rank]."""
    axis = static_int(ctx, axis, what)
    size = rank + 1 if inserting else rank
    if not -size <= axis < size:
        valid = f"{-size}..{size - 1}" if size else "none"
        ctx.error(f"{what} {axis} is out of range for a rank-{rank} tile (valid: {valid})")
    return axis + size if axis < 0 else axis


def static_dtype(ctx: Context, dtype: Any, what: str) -> DType:
    """A tessera dtype (`tessera.f16`), or its name (`'f16'`)."""
    require_constexpr(ctx, dtype, what)
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        try:
            return dtype_from_name(dtype)
        except ValueError as exc:
            ctx.error(f"{what}: {exc}")
    ctx.error(f"{what} must be a tessera dtype such as tessera.f32, got {dtype!r}")


def describe(value: Any) -> str:
    """How error messages name an operand: its IR type, or the Python value."""
    if isinstance(value, Tensor):
        return str(value.type)
    return f"{type(value).__name__} {value!r}"

