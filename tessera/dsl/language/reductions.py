"""Reductions and scans: sum, max, min, argmax, argmin, reduce; cumsum, cumprod, scan.

`axis=None` reduces every dimension to a scalar; `keep_dims=True` keeps
reduced dimensions with size 1. Result dtypes:

    sum, cumsum, cumprod  bool and integers narrower than 32 bits accumulate
                          in i32 (unsigned: u32); f16 and bf16 accumulate in
                          f32 and the result is cast back to f16/bf16 (Triton
                          keeps their dtype too, but adds in it); fp8, fp6,
                          fp4 and e8m0 give f32. `dtype=` overrides all this.
    max, min              the input dtype (for bool: any / all)
    argmax, argmin        i32; ties pick the smallest index
    reduce, scan          the input dtype; the combine function's result is
                          cast to it
"""

from __future__ import annotations

import math as pymath
from typing import Any, Callable

from ...ir.core import Block
from ...ir.dtypes import DType, f32, i32, u32
from ...ir.types import ScalarType, TileType, element_of, with_shape
from .. import operators
from ..constexpr_args import describe, static_axis, static_bool, static_dtype
from ..errors import TypeMismatchError
from ..function import DeviceFunction
from ..values import Builtin, Context, Tensor, builtin


def _numbers(ctx: Context, x: Any, what: str) -> Tensor:
    if not operators.is_number_operand(x):
        ctx.error(f"{what} needs numbers, got {describe(x)}", TypeMismatchError)
    return operators.to_tensor(ctx, x)


def accumulation_dtype(dtype: DType) -> DType:
    """What sum, cumsum and cumprod add in (the table in the module docstring)."""
    if dtype.is_bool or (dtype.is_int and dtype.bits < 32):
        return u32 if dtype.kind == "uint" else i32
    if dtype.is_float and dtype.bits <= 16:
        return f32
    return dtype


def _sum_result_dtype(dtype: DType) -> DType:
    return dtype if dtype.is_float and dtype.bits == 16 else accumulation_dtype(dtype)


def _reduce_along(ctx: Context, x: Tensor, axis: Any, keep_dims: Any, what: str,
                  emit_one: Callable[[Tensor, int], Tensor]) -> Tensor:
    """Reduce `x` along `axis` (None: everything, via a 1-D reshape) with `emit_one(tile, axis)`."""
    keep_dims = static_bool(ctx, keep_dims, f"{what}'s keep_dims")
    rank = len(x.shape)
    if axis is None:
        if rank == 0:
            return x
        flat_type = TileType(element_of(x.type), (pymath.prod(x.shape),))
        flat = x if rank == 1 else operators.emit(ctx, "reshape", x, result_type=flat_type)
        result = emit_one(flat, 0)
        return operators.broadcast_to_shape(ctx, result, (1,) * rank) if keep_dims else result
    if rank == 0:
        ctx.error(f"{what} along axis {axis} needs a tile, got the scalar {x.type}; use axis=None")
    axis = static_axis(ctx, axis, rank, f"{what}'s axis")
    result = emit_one(x, axis)
    return operators.emit(ctx, "expand_dims", result, axis=axis) if keep_dims else result


def _reduce_kind(ctx: Context, x: Tensor, axis: Any, keep_dims: Any, kind: str, what: str) -> Tensor:
    def emit_one(t: Tensor, a: int) -> Tensor:
        return operators.emit(ctx, "reduce", t, result_type=_reduced_type(t, a), axis=a, kind=kind)
    return _reduce_along(ctx, x, axis, keep_dims, what, emit_one)


def _reduced_type(t: Tensor, axis: int):
    return with_shape(element_of(t.type), t.shape[:axis] + t.shape[axis + 1:])


@builtin
def sum(ctx: Context, x, axis=None, keep_dims=False, dtype=None) -> Tensor:
    """sum(x, axis=None, keep_dims=False, dtype=None): the sum along `axis` (None: of every element).

    Small integers and bool accumulate in i32 (u32 for unsigned); f16/bf16
    accumulate in f32 and return their own dtype; fp8/fp6/fp4 return f32.
    `dtype` sets both the accumulation and the result dtype.
    """
    x = _numbers(ctx, x, "sum")
    if dtype is not None:
        dtype = static_dtype(ctx, dtype, "sum's dtype")
    accumulate = dtype or accumulation_dtype(x.dtype)
    result = _reduce_kind(ctx, operators.cast(ctx, x, accumulate), axis, keep_dims, "sum", "sum")
    return operators.cast(ctx, result, dtype or _sum_result_dtype(x.dtype))


@builtin
def max(ctx: Context, x, axis=None, keep_dims=False) -> Tensor:
    """max(x, axis=None, keep_dims=False): the largest element along `axis` (None: of all), in x's dtype.

    NaNs are skipped unless every element is NaN. For bool, max is "any lane true".
    """
    x = _numbers(ctx, x, "max")
    return _reduce_kind(ctx, x, axis, keep_dims, "or" if x.dtype.is_bool else "max", "max")


@builtin
def min(ctx: Context, x, axis=None, keep_dims=False) -> Tensor:
    """min(x, axis=None, keep_dims=False): the smallest element along `axis` (None: of all), in x's dtype.

    NaNs are skipped unless every element is NaN. For bool, min is "all lanes true".
    """
    x = _numbers(ctx, x, "min")
    return _reduce_kind(ctx, x, axis, keep_dims, "and" if x.dtype.is_bool else "min", "min")


def _arg_reduce(ctx: Context, x: Any, axis: Any, keep_dims: Any, kind: str) -> Tensor:
    x = _numbers(ctx, x, kind)
    if not x.is_tile:
        ctx.error(f"{kind} needs a tile, got the scalar {x.type}")
    return _reduce_along(ctx, x, axis, keep_dims, kind,
                         lambda t, a: operators.emit(ctx, "arg_reduce", t, axis=a, kind=kind))


@builtin
def argmax(ctx: Context, x, axis=None, keep_dims=False) -> Tensor:
    """argmax(x, axis=None, keep_dims=False) -> i32: the index of the largest element along `axis`.

    With axis=None, the index into x flattened row-major. Ties pick the smallest index.
    """
    return _arg_reduce(ctx, x, axis, keep_dims, "argmax")


@builtin
def argmin(ctx: Context, x, axis=None, keep_dims=False) -> Tensor:
    """argmin(x, axis=None, keep_dims=False) -> i32: the index of the smallest element along `axis`.

    With axis=None, the index into x flattened row-major. Ties pick the smallest index.
    """
    return _arg_reduce(ctx, x, axis, keep_dims, "argmin")


def combine_region(ctx: Context, combine_fn: Any, element: ScalarType, what: str) -> Block:
    """The region of a custom reduce or scan: two `element` arguments, the combine function inlined, a yield."""
    if isinstance(combine_fn, DeviceFunction):
        names = combine_fn.source.param_names[:2]
        if len(combine_fn.source.param_names) != 2:
            ctx.error(f"{what}'s combine function {combine_fn.__name__} must take two arguments (a, b), "
                      f"got {len(combine_fn.source.param_names)}")
    elif isinstance(combine_fn, Builtin):
        names = ["a", "b"]
    else:
        ctx.error(f"{what}'s combine function must be a @tessera.func taking (a, b), got {describe(combine_fn)}")
    block = Block([element, element], names)
    with ctx.builder.at(block):
        a, b = (Tensor(v) for v in block.args)
        if isinstance(combine_fn, Builtin):
            result = combine_fn.impl(ctx, a, b)
        else:
            if ctx.call_function is None:
                raise RuntimeError("custom reductions need the tracer's call_function")
            result = ctx.call_function(combine_fn, [a, b])
        if not operators.is_number_operand(result) or operators.shape_of_operand(result):
            ctx.error(f"{what}'s combine function must return one scalar number, got {describe(result)}")
        result = operators.to_tensor(ctx, result, element.dtype)
        operators.emit(ctx, "yield", result)
    return block


@builtin
def reduce(ctx: Context, x, axis, combine_fn, keep_dims=False) -> Tensor:
    """reduce(x, axis, combine_fn, keep_dims=False): combine x's elements along `axis` with `combine_fn`.

    `combine_fn` is a `@tessera.func` (or a builtin such as tessera.maximum)
    taking two scalars and returning one; it must be associative (the
    order of combination is unspecified) and its result is cast to x's dtype.
    `axis=None` reduces everything.
    """
    x = _numbers(ctx, x, "reduce")
    if not x.is_tile:
        ctx.error(f"reduce needs a tile, got the scalar {x.type}")
    element = element_of(x.type)

    def emit_one(t: Tensor, a: int) -> Tensor:
        region = combine_region(ctx, combine_fn, element, "reduce")
        result = ctx.builder.create("reduce", [t.value], {"axis": a, "kind": "custom"},
                                    result_types=[_reduced_type(t, a)], regions=[region])
        return Tensor(result.result)
    return _reduce_along(ctx, x, axis, keep_dims, "reduce", emit_one)


def _scan(ctx: Context, x: Any, axis: Any, reverse: Any, kind: str, what: str, combine_fn: Any = None,
          dtype: DType | None = None) -> Tensor:
    x = _numbers(ctx, x, what)
    if not x.is_tile:
        ctx.error(f"{what} needs a tile, got the scalar {x.type}")
    if dtype is not None:
        x = operators.cast(ctx, x, dtype)
    axis = static_axis(ctx, axis, len(x.shape), f"{what}'s axis")
    attrs = {"axis": axis, "kind": kind}
    if static_bool(ctx, reverse, f"{what}'s reverse"):
        attrs["reverse"] = True
    regions = [combine_region(ctx, combine_fn, element_of(x.type), what)] if kind == "custom" else []
    return Tensor(ctx.builder.create("scan", [x.value], attrs, result_types=[x.type], regions=regions).result)


def _arithmetic_scan(ctx: Context, x: Any, axis: Any, reverse: Any, dtype: Any, kind: str, what: str) -> Tensor:
    x = _numbers(ctx, x, what)
    if dtype is not None:
        dtype = static_dtype(ctx, dtype, f"{what}'s dtype")
    result = _scan(ctx, x, axis, reverse, kind, what, dtype=dtype or accumulation_dtype(x.dtype))
    return operators.cast(ctx, result, dtype or _sum_result_dtype(x.dtype))


@builtin
def cumsum(ctx: Context, x, axis=0, reverse=False, dtype=None) -> Tensor:
    """cumsum(x, axis=0, reverse=False, dtype=None): inclusive running sums along `axis`.

    From the end if `reverse`. Dtypes as for sum: small integers and bool accumulate in i32 (u32 for
    unsigned), f16/bf16 in f32 (returned as f16/bf16), fp8 and smaller give f32.
    """
    return _arithmetic_scan(ctx, x, axis, reverse, dtype, "sum", "cumsum")


@builtin
def cumprod(ctx: Context, x, axis=0, reverse=False, dtype=None) -> Tensor:
    """cumprod(x, axis=0, reverse=False, dtype=None): inclusive running products along `axis`.

    From the end if `reverse`. Dtypes as for sum and cumsum.
    """
    return _arithmetic_scan(ctx, x, axis, reverse, dtype, "prod", "cumprod")


@builtin
def scan(ctx: Context, x, axis, combine_fn, reverse=False) -> Tensor:
    """scan(x, axis, combine_fn, reverse=False): inclusive running combination along `axis` with `combine_fn`.

    `combine_fn` is an associative `@tessera.func` (or a builtin) taking two
    scalars; its result is cast to x's dtype. Element i of the result
    combines elements 0..i (i..end with `reverse`).
    """
    return _scan(ctx, x, axis, reverse, "custom", "scan", combine_fn)

