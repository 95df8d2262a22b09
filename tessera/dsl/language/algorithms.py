"""Tile algorithms: sort, topk, gather, join, split, interleave, histogram.

Each is built here, while tracing, from ops every backend already runs --
comparisons, selects, reductions, reshapes -- so it computes the same in
the interpreter, the SIMT simulator and on every GPU target. Two patterns:

* ranking: element i of a row goes to position rank(i), the number of
  elements that sort before it (ties: the lower index first, so sorts are
  stable). That compares every pair of a row: n x n comparisons per row,
  held in registers, which suits the rows of up to a few hundred lanes of
  top-k routing and small sorts (bigger ones are refused at their line,
  with the sizes);
* picking: out[r] = x[i] for the one i a mask selects, by an `or` reduction
  of the bit patterns with every other lane zeroed, which is exact for
  every dtype (a float sum would turn -0.0 into 0.0).

Float keys sort as numpy does: NaN after everything, -0.0 equal to 0.0.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.dtypes import i8, i16, i32, i64
from ...ir.types import ScalarType, TileType, with_shape
from .. import operators
from ..constexpr_args import describe, is_power_of_two, static_axis, static_bool, static_int
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin

MAX_PAIRS = 1 << 15       # comparisons (or one-hot lanes) one ranking may hold: n x n x the other dims
_BITS = {8: i8, 16: i16, 32: i32, 64: i64}


@builtin
def sort(ctx: Context, x, axis=-1, descending=False) -> Tensor:
    """sort(x, axis=-1, descending=False) -> x sorted along `axis` (stable; NaN after every number)."""
    x = _tile(ctx, "sort", x)
    axis = static_axis(ctx, axis, len(x.shape), "sort's axis")
    descending = static_bool(ctx, descending, "sort's descending")
    return _along(ctx, x, axis, lambda row: _pick(ctx, row, _ranks(ctx, row, descending), row.shape[-1]))


@builtin
def topk(ctx: Context, x, k, axis=-1) -> tuple[Tensor, Tensor]:
    """topk(x, k, axis=-1) -> (values, indices): the k largest elements along `axis`, largest first (ties: the
    lower index first), and their i32 indices. `k` is a compile-time power of two up to the axis' size."""
    x = _tile(ctx, "topk", x)
    axis = static_axis(ctx, axis, len(x.shape), "topk's axis")
    k = static_int(ctx, k, "topk's k")
    n = x.shape[axis]
    if not (is_power_of_two(k) and k <= n):
        ctx.error(f"topk's k must be a power of two no larger than the axis ({n}), got {k}")
    indices = operators.broadcast_to_shape(ctx, _iota_along(ctx, n, axis, len(x.shape)), x.shape)

    def both(row: Tensor, index_row: Tensor) -> tuple[Tensor, Tensor]:
        ranks = _ranks(ctx, row, True)
        return _pick(ctx, row, ranks, k), _pick(ctx, index_row, ranks, k)
    return _along_pair(ctx, x, indices, axis, both)


@builtin
def gather(ctx: Context, src, index, axis) -> Tensor:
    """gather(src, index, axis) -> out with index's shape: out[..., i, ...] = src[..., index[..., i, ...], ...]
    along `axis` (elsewhere index's shape equals src's). An index outside [0, size) gives 0."""
    src = _tile(ctx, "gather", src)
    if not isinstance(index, Tensor) or index.dtype is None or not index.dtype.is_int:
        ctx.error(f"gather's index must be an integer tile, got {describe(index)}", TypeMismatchError)
    axis = static_axis(ctx, axis, len(src.shape), "gather's axis")
    if len(index.shape) != len(src.shape) or any(a != b for d, (a, b) in enumerate(zip(index.shape, src.shape))
                                                 if d != axis):
        ctx.error(f"gather's index {index.type} must have src's shape {src.shape} except along axis {axis}",
                  TypeMismatchError)

    def pick(row: Tensor, index_row: Tensor) -> Tensor:
        n = row.shape[-1]
        wanted = operators.cast(ctx, index_row, i32)
        return _pick(ctx, row, wanted, index_row.shape[-1], positions=n)
    return _along_pair(ctx, src, index, axis, lambda a, b: (pick(a, b),))[0]


@builtin
def join(ctx: Context, a, b) -> Tensor:
    """join(a, b) -> a tile of a's shape plus a trailing axis of 2: [..., 0] is a, [..., 1] is b (same types)."""
    a, b = _tile(ctx, "join", a, allow_scalar=True), _tile(ctx, "join", b, allow_scalar=True)
    if a.type != b.type:
        ctx.error(f"join needs two tiles of one type, got {a.type} and {b.type}", TypeMismatchError)
    shape = a.shape + (2,)
    first = operators.compare(ctx, "==", _iota_along(ctx, 2, len(shape) - 1, len(shape)), 0)
    halves = [operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", v, axis=len(a.shape)), shape)
              for v in (a, b)]
    return operators.emit(ctx, "select", operators.broadcast_to_shape(ctx, first, shape), *halves)


@builtin
def split(ctx: Context, x) -> tuple[Tensor, Tensor]:
    """split(x) -> (x[..., 0], x[..., 1]) for a tile whose last axis has size 2 (the inverse of join)."""
    x = _tile(ctx, "split", x)
    if x.shape[-1] != 2:
        ctx.error(f"split takes a tile whose last axis has size 2, got {x.type}", TypeMismatchError)
    which = operators.broadcast_to_shape(ctx, _iota_along(ctx, 2, len(x.shape) - 1, len(x.shape)), x.shape)
    halves = []
    for half in (0, 1):
        wanted = operators.compare(ctx, "==", which, half)
        halves.append(_or_reduce(ctx, x, wanted, len(x.shape) - 1))
    return halves[0], halves[1]


@builtin
def interleave(ctx: Context, a, b) -> Tensor:
    """interleave(a, b) -> a0, b0, a1, b1, ... along the last axis (twice its size)."""
    joined = join.impl(ctx, _tile(ctx, "interleave", a), _tile(ctx, "interleave", b))
    shape = joined.shape[:-2] + (joined.shape[-2] * 2,)
    return operators.emit(ctx, "reshape", joined, result_type=TileType(joined.type.element, shape))


@builtin
def histogram(ctx: Context, x, num_bins, mask=None) -> Tensor:
    """histogram(x, num_bins, mask=None) -> i32 counts of the values 0 .. num_bins-1 among x's lanes (a 1-D
    integer tile; values outside the bins, and masked-off lanes, count nowhere). num_bins: a power of two."""
    x = _tile(ctx, "histogram", x)
    if x.dtype is None or not x.dtype.is_int or len(x.shape) != 1:
        ctx.error(f"histogram counts the values of a 1-D integer tile, got {x.type}", TypeMismatchError)
    bins = static_int(ctx, num_bins, "histogram's num_bins")
    if not is_power_of_two(bins):
        ctx.error(f"histogram's num_bins must be a power of two, got {bins}")
    _check_pairs(ctx, "histogram", x.shape[0] * bins, f"{x.shape[0]} values x {bins} bins")
    shape = (x.shape[0], bins)
    values = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", operators.cast(ctx, x, i64),
                                                              axis=1), shape)
    hits = operators.compare(ctx, "==", values, operators.broadcast_to_shape(ctx, _iota_along(ctx, bins, 1, 2), shape))
    if mask is not None:
        keep = operators.as_bool(ctx, mask, "histogram's mask")
        keep = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", keep, axis=1), shape)
        hits = operators.logical(ctx, "and", hits, keep)
    counts = operators.cast(ctx, hits, i32)
    return operators.emit(ctx, "reduce", counts, result_type=TileType(ScalarType(i32), (bins,)), axis=0, kind="sum")


# ---------------------------------------------------------------------------
# The patterns


def _ranks(ctx: Context, row: Tensor, descending: bool) -> Tensor:
    """For each lane i of the last axis, how many lanes sort before it (ties: lower index first)."""
    n = row.shape[-1]
    _check_pairs(ctx, "sort" if not descending else "topk", math.prod(row.shape) * n,
                 f"{n} x {n} comparisons for each of the {math.prod(row.shape[:-1])} rows")
    rank = len(row.shape)
    pair = row.shape + (n,)                                   # [..., i, j]
    mine = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", row, axis=rank), pair)
    theirs = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", row, axis=rank - 1), pair)
    i = operators.broadcast_to_shape(ctx, _iota_along(ctx, n, rank - 1, rank + 1), pair)
    j = operators.broadcast_to_shape(ctx, _iota_along(ctx, n, rank, rank + 1), pair)
    first = _before(ctx, theirs, mine) if not descending else _before(ctx, mine, theirs)
    tie = operators.logical(ctx, "and", _same(ctx, theirs, mine), operators.compare(ctx, "<", j, i))
    before = operators.cast(ctx, operators.logical(ctx, "or", first, tie), i32)
    return operators.emit(ctx, "reduce", before, result_type=TileType(ScalarType(i32), row.shape), axis=rank,
                          kind="sum")


def _before(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a sorts before b ascending: a < b, and a number before NaN."""
    less = operators.compare(ctx, "<", a, b)
    if not a.dtype.is_float:
        return less
    nan_b = operators.compare(ctx, "!=", b, b)
    number_a = operators.compare(ctx, "==", a, a)
    return operators.logical(ctx, "or", less, operators.logical(ctx, "and", nan_b, number_a))


def _same(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a and b tie: equal, or both NaN."""
    equal = operators.compare(ctx, "==", a, b)
    if not a.dtype.is_float:
        return equal
    both_nan = operators.logical(ctx, "and", operators.compare(ctx, "!=", a, a), operators.compare(ctx, "!=", b, b))
    return operators.logical(ctx, "or", equal, both_nan)


def _pick(ctx: Context, row: Tensor, where: Tensor, count: int, positions: int | None = None) -> Tensor:
    """out[..., r] for r < count: the lane i of `row` whose `where[..., i]` equals r (`where` as ranks); for a
    gather, `where` holds per output lane the source lane to take (`positions`: the row's size)."""
    n = row.shape[-1]
    rank = len(row.shape)
    lead = row.shape[:-1]
    pair = lead + (count, positions or n)                         # [..., r, i]
    _check_pairs(ctx, "this selection", math.prod(pair), f"{count} x {positions or n} lanes per row")
    values = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", row, axis=rank - 1), pair)
    if positions is None:      # ranks: lane i goes to r = where[i]
        target = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", where, axis=rank - 1), pair)
        slot = operators.broadcast_to_shape(ctx, _iota_along(ctx, count, rank - 1, rank + 1), pair)
    else:                      # gather: output r takes lane where[r]
        target = operators.broadcast_to_shape(ctx, operators.emit(ctx, "expand_dims", where, axis=rank), pair)
        slot = operators.broadcast_to_shape(ctx, _iota_along(ctx, n, rank, rank + 1), pair)
    return _or_reduce(ctx, values, operators.compare(ctx, "==", target, slot), rank)


def _or_reduce(ctx: Context, values: Tensor, wanted: Tensor, axis: int) -> Tensor:
    """The one lane along `axis` that `wanted` selects (0 where none does), exactly: an `or` of bit patterns."""
    dtype = values.dtype
    bits = values if dtype.is_int or dtype.is_bool else operators.cast(ctx, values, _BITS[dtype.bits], bitcast=True)
    zero = operators.constant(ctx, False if dtype.is_bool else 0, bits.dtype, bits.shape)
    kept = operators.emit(ctx, "select", wanted, bits, zero)
    shape = bits.shape[:axis] + bits.shape[axis + 1:]
    picked = operators.emit(ctx, "reduce", kept, result_type=with_shape(ScalarType(bits.dtype), shape), axis=axis,
                            kind="or")
    return picked if picked.dtype == dtype else operators.cast(ctx, picked, dtype, bitcast=True)


def _along(ctx: Context, x: Tensor, axis: int, work) -> Tensor:
    """`work` on `x` with `axis` moved last, the result moved back."""
    return _along_pair(ctx, x, x, axis, lambda row, _: (work(row),))[0]


def _along_pair(ctx: Context, x: Tensor, y: Tensor, axis: int, work) -> tuple:
    """`work(x_row, y_row)` with `axis` of both moved last; each result moved back."""
    rank = len(x.shape)
    if axis == rank - 1:
        return work(x, y)
    order = tuple(d for d in range(rank) if d != axis) + (axis,)
    back = tuple(order.index(d) for d in range(rank))
    moved = [operators.emit(ctx, "permute", v, order=order) for v in (x, y)]
    return tuple(operators.emit(ctx, "permute", r, order=back) for r in work(*moved))


def _iota_along(ctx: Context, n: int, axis: int, rank: int) -> Tensor:
    """0 .. n-1 (i32) along `axis` of a rank-`rank` tile whose other dims are 1."""
    line = operators.emit(ctx, "arange", start=0, end=n)
    shape = tuple(n if d == axis else 1 for d in range(rank))
    return line if rank == 1 else operators.emit(ctx, "reshape", line, result_type=TileType(ScalarType(i32), shape))


def _tile(ctx: Context, name: str, x: Any, allow_scalar: bool = False) -> Tensor:
    if not isinstance(x, Tensor) or x.dtype is None or (not x.is_tile and not allow_scalar):
        ctx.error(f"{name} works on tiles of numbers, got {describe(x)}", TypeMismatchError)
    if x.dtype.bits not in _BITS and not x.dtype.is_bool:
        ctx.error(f"{name} works on bool and 8- to 64-bit numbers, got {x.dtype.name}; convert it first "
                  f"(.to(tessera.f16))", TypeMismatchError)
    return x


def _check_pairs(ctx: Context, name: str, count: int, what: str) -> None:
    if count > MAX_PAIRS:
        ctx.error(f"{name} here needs {what} = {count} lanes in registers, more than the {MAX_PAIRS} Tessera holds "
                  f"for one: split the tile (fewer rows per program, or a shorter axis)")
