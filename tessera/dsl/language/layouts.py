"""Register layouts: pin which thread holds which element of a tile.

Layout inference picks a layout for every tile; `convert_layout(x, layout)`
(or `layout=` on `zeros`, `full`, `load` and a view block's `.load`) pins
one. A layout is a `tessera.layouts` value (a global, a constexpr
argument, or built while tracing from compile-time values, e.g.
`tessera.layouts.mma_m16n8k16_c()`), or its text form:

    MMA_C = tessera.layouts.local(2, 1).spatial(8, 4).local(1, 2)   # mma.sync m16n8 accumulator
    acc = tessera.zeros((16, 8), layout=MMA_C)
    y = tessera.convert_layout(x, "local(2,1).spatial(8,4).local(1,2)")

The pin is the IR op `convert_layout {layout = "..."}`; the tile
interpreter treats it as the identity, and lowering makes the pinned value
live in exactly that layout (a register renaming or a trip through shared
memory when its producer used another). A layout whose shape differs from
the tile's is an error here; one for the wrong number of threads is an
error when the kernel is compiled with `num_warps`.
"""

from __future__ import annotations

from typing import Any

from ...ir.layouts import LayoutError, RegisterLayout, parse_layout
from .. import operators
from ..constexpr_args import describe, require_constexpr
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin


def static_layout(ctx: Context, layout: Any, what: str) -> RegisterLayout:
    """A compile-time register layout: a `tessera.layouts` value, or its text."""
    require_constexpr(ctx, layout, what)
    if isinstance(layout, RegisterLayout):
        return layout
    if isinstance(layout, str):
        try:
            return parse_layout(layout)
        except LayoutError as exc:
            ctx.error(f"{what}: {exc}")
    ctx.error(f"{what} must be a register layout (tessera.layouts.local(...).spatial(...), ...) or its text, "
              f"got {layout!r}")


def pin_layout(ctx: Context, x: Tensor, layout: Any, what: str) -> Tensor:
    """`x` pinned to `layout` (a convert_layout op); `x` itself when `layout` is None."""
    if layout is None:
        return x
    layout = static_layout(ctx, layout, what)
    if not x.is_tile:
        ctx.error(f"{what} applies to tiles, got {x.type}", TypeMismatchError)
    if layout.shape != x.shape:
        ctx.error(f"{what} {layout} covers shape {layout.shape}, but the tile is {x.type}; pin a layout of "
                  f"shape {x.shape}", TypeMismatchError)
    return operators.emit(ctx, "convert_layout", x, layout=str(layout))


@builtin
def convert_layout(ctx: Context, x, layout) -> Tensor:
    """convert_layout(x, layout) -> x, held in registers as `layout` says.

    `layout` is a `tessera.layouts` register layout (or its text) of x's
    shape, for the block's `num_warps * warp_size` threads. Values are
    unchanged; the compiler moves data between threads if x was computed
    in another layout.
    """
    if not isinstance(x, Tensor) or x.is_view:
        ctx.error(f"convert_layout works on tiles, got {describe(x)}", TypeMismatchError)
    return pin_layout(ctx, x, layout, "convert_layout's layout")
