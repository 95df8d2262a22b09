"""Hints: facts the author knows and the compiler cannot prove, which widen accesses and enable pipelining.

    K = tessera.multiple_of(tessera.load(sizes_ptr + 2), 16)     # a size loaded from memory: rows stay aligned
    tessera.assume(stride % 16 == 0)                              # the same, stated about a kernel argument
    offs = tessera.max_contiguous(tessera.multiple_of(offs, BLOCK), BLOCK)

Each is a promise the CPU interpreter checks (a broken one is an error at
its line); the GPU code trusts it. See `tessera/ir/hint_ops.py` for what
each states exactly.
"""

from __future__ import annotations

from typing import Any

from .. import operators
from ..constexpr_args import describe, require_constexpr
from ..errors import StaticAssertionError, TypeMismatchError
from ..values import Context, Tensor, builtin


def _values(ctx: Context, name: str, x: Tensor, values: Any) -> tuple[int, ...]:
    """The per-dim hint values: an int (scalars and 1-D tiles) or a tuple with one power of two per dim."""
    require_constexpr(ctx, values, f"{name}'s values")
    rank = max(len(x.shape), 1)
    if isinstance(values, int) and not isinstance(values, bool):
        if rank > 1:
            ctx.error(f"{name} of a {len(x.shape)}-D tile needs one value per dim, e.g. {name}(x, "
                      f"({', '.join(['1'] * (rank - 1))}, {values}))")
        values = (values,)
    if not isinstance(values, tuple) or len(values) != rank or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values):
        ctx.error(f"{name}'s values must be an int or a tuple of {rank} ints, got {values!r}")
    if not all(v >= 1 and v & (v - 1) == 0 for v in values):
        ctx.error(f"{name}'s values must be powers of two, got {values!r}")
    return values


def _integers(ctx: Context, name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor) or x.dtype is None or not x.dtype.is_int:
        hint = "; state it of the integer offsets before adding them to the pointer" if operators.is_pointer(x) \
            else ""
        ctx.error(f"{name} states facts about integers (scalars or tiles), got {describe(x)}{hint}",
                  TypeMismatchError)
    return x


@builtin
def multiple_of(ctx: Context, x, values) -> Tensor:
    """multiple_of(x, values) -> x, stated to hold multiples of `values`: a scalar is a multiple of the value;
    along each dim d of a tile, the lanes whose index is a multiple of min(values[d], size) are.

    Use it where the alignment analysis cannot see a fact (a size loaded from
    memory, an offset after `%`): 16-byte vector loads and cp.async/TMA
    pipelining need rows and offsets that are multiples of 16 bytes.
    """
    x = _integers(ctx, "multiple_of", x)
    return operators.emit(ctx, "multiple_of", x, values=_values(ctx, "multiple_of", x, values))


@builtin
def max_contiguous(ctx: Context, x, values) -> Tensor:
    """max_contiguous(x, values) -> x, stated to run in consecutive integers: along each dim d, every aligned
    group of min(values[d], size) lanes holds v, v + 1, v + 2, ... Pair it with multiple_of for offsets the
    analysis lost track of: `tessera.max_contiguous(tessera.multiple_of(offs, BLOCK), BLOCK)`."""
    x = _integers(ctx, "max_contiguous", x)
    if not x.shape:
        ctx.error("max_contiguous states how the lanes of a tile run; this is a scalar (use multiple_of or assume)")
    return operators.emit(ctx, "max_contiguous", x, values=_values(ctx, "max_contiguous", x, values))


@builtin
def assume(ctx: Context, cond) -> None:
    """assume(cond): state that the scalar condition holds from here on, e.g. `tessera.assume(K % 16 == 0)` or
    `tessera.assume(n > 0)`; the alignment analysis reads `x % 2**k == 0`, `x & (2**k - 1) == 0`, `x > c`,
    `x >= c` (c >= 0) and `and`s of them. A compile-time false condition is an error."""
    if not isinstance(cond, Tensor):
        if not cond:
            ctx.error("tessera.assume's condition is false at compile time", StaticAssertionError)
        return
    if cond.is_tile:
        ctx.error(f"tessera.assume takes a scalar condition, got {cond.type}; state facts of tiles with "
                  f"multiple_of / max_contiguous", TypeMismatchError)
    operators.emit(ctx, "assume", operators.as_bool(ctx, cond, "tessera.assume's condition"))
