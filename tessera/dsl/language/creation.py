"""Where tiles come from: program ids, ranges, constants, casts."""

from __future__ import annotations

from ...ir.dtypes import f32, i32
from .. import operators
from ..constexpr_args import describe, is_power_of_two, static_dtype, static_int, static_shape
from ..values import Context, Tensor, builtin
from .layouts import pin_layout


@builtin
def program_id(ctx: Context, axis=0) -> Tensor:
    """program_id(axis=0) -> i32: this program instance's index along grid axis 0, 1 or 2."""
    axis = static_int(ctx, axis, "program_id's axis")
    if axis not in (0, 1, 2):
        ctx.error(f"program_id's axis must be 0, 1 or 2, got {axis}")
    return operators.emit(ctx, "program_id", axis=axis)


@builtin
def num_programs(ctx: Context, axis=0) -> Tensor:
    """num_programs(axis=0) -> i32: the number of program instances along grid axis 0, 1 or 2."""
    axis = static_int(ctx, axis, "num_programs's axis")
    if axis not in (0, 1, 2):
        ctx.error(f"num_programs's axis must be 0, 1 or 2, got {axis}")
    return operators.emit(ctx, "num_programs", axis=axis)


@builtin
def arange(ctx: Context, start, end) -> Tensor:
    """arange(start, end) -> tile<(end-start) x i32>: the integers start, start+1, ..., end-1.

    `start` and `end` are compile-time ints and the length end - start must
    be a power of two; to cover n elements, take the next power of two and
    mask the extra lanes: `offs = tessera.arange(0, 128); mask = offs < n`.
    """
    start = static_int(ctx, start, "arange's start")
    end = static_int(ctx, end, "arange's end")
    length = end - start
    if length <= 0:
        ctx.error(f"arange({start}, {end}) is empty; it needs end > start")
    if not is_power_of_two(length):
        padded = 1 << (length - 1).bit_length()
        ctx.error(f"arange({start}, {end}) has {length} elements, but tile lengths must be powers of two: "
                  f"use arange({start}, {start + padded}) and mask the lanes >= {end}")
    if not (i32.min_value <= start and end - 1 <= i32.max_value):
        ctx.error(f"arange({start}, {end}) does not fit in i32")
    return operators.emit(ctx, "arange", start=start, end=end)


@builtin
def zeros(ctx: Context, shape, dtype=f32, layout=None) -> Tensor:
    """zeros(shape, dtype=tessera.f32, layout=None) -> a tile of zeros.

    `shape` is a compile-time int or tuple of ints, each a power of two.
    `layout` pins the tile's register layout (see `tessera.convert_layout`).
    """
    shape = static_shape(ctx, shape, "zeros' shape")
    dtype = static_dtype(ctx, dtype, "zeros' dtype")
    return pin_layout(ctx, operators.constant(ctx, 0, dtype, shape), layout, "zeros' layout")


@builtin
def full(ctx: Context, shape, value, dtype=None, layout=None) -> Tensor:
    """full(shape, value, dtype=None, layout=None) -> a tile with every lane `value`.

    `shape` is a compile-time int or tuple of ints, each a power of two.
    `value` is a number or a traced scalar; it is converted to `dtype` (as a
    cast converts), which defaults to the value's own type (a Python int is
    i32, a float f32). `layout` pins the tile's register layout (see
    `tessera.convert_layout`).
    """
    shape = static_shape(ctx, shape, "full's shape")
    dtype = None if dtype is None else static_dtype(ctx, dtype, "full's dtype")
    if isinstance(value, Tensor):
        if value.is_tile or value.dtype is None:
            ctx.error(f"full's value must be a scalar number, got {value.type}; "
                      f"to stretch a tile use tessera.broadcast_to(x, shape)")
        tile = operators.broadcast_to_shape(ctx, operators.cast(ctx, value, dtype or value.dtype), shape)
    else:
        if not operators.is_python_number(value):
            ctx.error(f"full's value must be a number, got {describe(value)}")
        tile = operators.constant(ctx, value, dtype or operators.python_number_dtype(ctx, value), shape)
    return pin_layout(ctx, tile, layout, "full's layout")


@builtin
def cast(ctx: Context, x, dtype, bitcast=False) -> Tensor:
    """cast(x, dtype, bitcast=False) -> x converted to `dtype` (same as `x.to(dtype)`).

    Conversions round to nearest even; float -> int truncates toward zero
    and saturates (NaN -> 0); int -> int wraps. With `bitcast=True` the bits
    are reinterpreted instead, which needs equal widths (f32 <-> i32).
    """
    return operators.cast(ctx, x, dtype, bitcast)


MAX_CLUSTER_BLOCKS = 16         # sm_90 (8 portable; 16 where the driver allows non-portable sizes)


@builtin
def cluster_dims(ctx: Context, dims) -> None:
    """cluster_dims(dims): launch the kernel's programs in thread-block clusters of `dims` programs (an int:
    along axis 0; or a tuple of up to three), compile-time ints.

    Programs whose program_id // dims agree along every axis form one
    cluster, run at once on neighbouring SMs (sm_90+), so that a block load
    they all make (`block.load(multicast=True)`) can be fetched once per
    cluster. The grid must be a multiple of `dims` along each axis (the
    launch says so otherwise); at most 16 programs per cluster; (1, 1, 1)
    launches without clusters. State it once, at the kernel's top level.
    """
    if isinstance(dims, (int, Tensor)):
        dims = (dims,)
    if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3:
        ctx.error(f"cluster_dims takes an int or a tuple of 1 to 3 ints, got {describe(dims)}")
    dims = tuple(static_int(ctx, d, "cluster_dims") for d in dims) + (1,) * (3 - len(dims))
    if any(d < 1 for d in dims) or dims[0] * dims[1] * dims[2] > MAX_CLUSTER_BLOCKS:
        ctx.error(f"cluster_dims {dims}: each must be >= 1 and the cluster at most {MAX_CLUSTER_BLOCKS} programs")
    fn = ctx.builder.module.functions[0]
    given = tuple(fn.attrs.get("cluster_dims", (1, 1, 1)))
    if given != (1, 1, 1) and given != dims:
        ctx.error(f"cluster_dims {dims} contradicts the kernel's earlier cluster_dims {given}; state it once")
    if dims != (1, 1, 1):
        fn.attrs["cluster_dims"] = dims


@builtin
def cluster_rank(ctx: Context) -> Tensor:
    """cluster_rank() -> i32: this program's rank in its cluster (`tessera.cluster_dims`), 0 .. cluster size - 1,
    x fastest (%cluster_ctarank); 0 without clusters."""
    return operators.emit(ctx, "cluster_rank")


@builtin
def cluster_id(ctx: Context, axis=0) -> Tensor:
    """cluster_id(axis=0) -> i32: this program's cluster along grid axis 0, 1 or 2, program_id(axis) //
    cluster_dims[axis] (%clusterid)."""
    axis = static_int(ctx, axis, "cluster_id's axis")
    if axis not in (0, 1, 2):
        ctx.error(f"cluster_id's axis must be 0, 1 or 2, got {axis}")
    return operators.emit(ctx, "cluster_id", axis=axis)
