"""Checks and prints, at compile time and on the device."""

from __future__ import annotations

from ..constexpr_args import describe, require_constexpr, static_str
from ..errors import StaticAssertionError
from .. import operators
from ..values import Context, Tensor, builtin


@builtin
def static_assert(ctx: Context, cond, msg="") -> None:
    """static_assert(cond, msg=""): fail compilation with `msg` unless the compile-time `cond` holds.

    Use it to check constexpr parameters: `tessera.static_assert(BLOCK % 16 == 0, "BLOCK must be a multiple of 16")`.
    For values known only at run time, use device_assert.
    """
    if isinstance(cond, Tensor):
        require_constexpr(ctx, cond, "static_assert's condition (for run-time values use tessera.device_assert)")
    msg = static_str(ctx, msg, "static_assert's message")
    if not cond:
        ctx.error(msg or "static_assert failed", StaticAssertionError)


@builtin
def static_print(ctx: Context, *args) -> None:
    """static_print(*args): print at compile time (once per compilation); traced values print as their type."""
    print(*(describe(a) if isinstance(a, Tensor) else a for a in args))


@builtin
def device_print(ctx: Context, prefix, *args) -> None:
    """device_print(prefix, *args): print `prefix` and the values of `args` on the device, for every program instance.

    Tiles print every lane. Printing is for debugging: GPU builds emit it in
    debug mode only (TESSERA_DEBUG=1 or debug=True: each thread prints the
    lanes it holds, with vprintf on NVIDIA); the CPU interpreter always prints.
    """
    prefix = static_str(ctx, prefix, "device_print's prefix")
    values = []
    for a in args:
        if not isinstance(a, Tensor) and not operators.is_python_number(a):
            ctx.error(f"device_print prints numbers and tensors, got {describe(a)}; use static_print for "
                      f"compile-time values")
        value = operators.to_tensor(ctx, a)
        if value.is_view:
            ctx.error(f"device_print cannot print the view {value.type}; print a block of it")
        values.append(value)
    operators.emit(ctx, "print", *values, prefix=prefix)


@builtin
def device_assert(ctx: Context, cond, msg="") -> None:
    """device_assert(cond, msg=""): stop the launch with `msg` where any lane of `cond` is false.

    A compile-time `cond` is checked while compiling. Non-bool conditions
    mean `cond != 0`. Like device_print, GPU builds check it in debug mode only
    (a failing thread prints the file, line and message and traps on NVIDIA;
    traps on AMD).
    """
    msg = static_str(ctx, msg, "device_assert's message")
    if not isinstance(cond, Tensor):
        if not cond:
            ctx.error(msg or "device_assert failed (its condition is false at compile time)", StaticAssertionError)
        return
    operators.emit(ctx, "assert", operators.as_bool(ctx, cond, "device_assert's condition"), message=msg)
