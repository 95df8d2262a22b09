"""`tessera.inline_asm_elementwise`: a target instruction the language has no word for, lane by lane.

    @tessera.asm_emulation                 # what the CPU interpreter runs instead of the asm
    def byte_swapped(x):
        return x.byteswap()

    y = tessera.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x0123;", "=r,r", [x], dtype=tessera.i32,
                                       is_pure=True, pack=1, emulate=byte_swapped)

The asm is PTX on NVIDIA targets and AMDGCN on AMD ones (the backend of the
target the kernel is compiled for checks the constraint letters and
register widths first, so a mistake is a CompileError at this line, never
an LLVM abort; on AMD the assembler runs in a child process, where a
rejected instruction is an error too). See `tessera/ir/asm_ops.py` for
what the op means.
"""

from __future__ import annotations

from typing import Any, Callable

from ...backends.interp.inline_asm import register_emulation
from ...ir.asm_ops import check_asm_text, parse_constraints
from ...ir.types import ScalarType, with_shape
from .. import operators
from ..constexpr_args import describe, is_power_of_two, require_constexpr, static_bool, static_dtype, static_int, \
    static_str
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin


@builtin
def inline_asm_elementwise(ctx: Context, asm, constraints, args, dtype, is_pure=True, pack=1,
                           emulate: Callable | None = None) -> Tensor:
    """inline_asm_elementwise(asm, constraints, args, dtype, is_pure=True, pack=1, emulate=None) -> a tile (or
    scalar) of `dtype` in the broadcast shape of `args`.

    `asm` uses $0 for the result and $1, $2, ... for `args`; `constraints` are
    LLVM's, the result's first: "=r,r,r" (NVIDIA: r 32-bit, l 64-bit, h
    16-bit, f f32, d f64; AMD: v vector, s scalar registers). With `pack=n`
    one asm instance handles n lanes, passed packed into one register (four
    i8 lanes in one "r"). The asm must be pure and elementwise. `emulate`,
    a numpy function of the args' arrays marked `@tessera.asm_emulation`,
    lets the CPU interpreter (and the SIMT simulator) run it.
    """
    asm = static_str(ctx, asm, "inline_asm_elementwise's asm")
    constraints = static_str(ctx, constraints, "inline_asm_elementwise's constraints")
    dtype = static_dtype(ctx, dtype, "inline_asm_elementwise's dtype")
    pack = static_int(ctx, pack, "inline_asm_elementwise's pack")
    if not static_bool(ctx, is_pure, "inline_asm_elementwise's is_pure"):
        ctx.error("inline_asm_elementwise supports pure assembly only (is_pure=True): its result must depend on "
                  "its operands alone; for memory or other side effects use tessera's own ops")
    if not is_power_of_two(pack):
        ctx.error(f"inline_asm_elementwise's pack must be a power of two, got {pack}")
    operands = _operands(ctx, args)
    try:
        _, inputs = parse_constraints(constraints)
        check_asm_text(asm, len(operands))
    except ValueError as exc:
        ctx.error(f"inline_asm_elementwise: {exc}")
    if len(inputs) != len(operands):
        ctx.error(f"inline_asm_elementwise has {len(operands)} args but {len(inputs)} input constraints in "
                  f"{constraints!r}; give one per arg")
    for x in [*operands, dtype]:
        bits = x.bits if not isinstance(x, Tensor) else x.dtype.bits
        if bits < 8 or (isinstance(x, Tensor) and x.dtype.is_bool) or (not isinstance(x, Tensor) and x.is_bool):
            ctx.error(f"inline_asm_elementwise passes 8- to 64-bit numbers, got {describe(x)}", TypeMismatchError)
    attrs: dict[str, Any] = {"asm": asm, "constraints": constraints, "pack": pack}
    if emulate is not None:
        require_constexpr(ctx, emulate, "inline_asm_elementwise's emulate")
        if not callable(emulate):
            ctx.error(f"inline_asm_elementwise's emulate must be a function of numpy arrays, got {emulate!r}")
        attrs["emulate"] = register_emulation(emulate)
    shape = operators.broadcast_shape(*(x.shape for x in operands))
    if shape is None:
        ctx.error(f"inline_asm_elementwise's args do not broadcast: {', '.join(str(x.type) for x in operands)}",
                  TypeMismatchError)
    operands = [operators.broadcast_to_shape(ctx, x, shape) for x in operands]
    return operators.emit(ctx, "inline_asm", *operands, result_type=with_shape(ScalarType(dtype), shape), **attrs)


def asm_emulation(fn: Callable) -> Callable:
    """Mark a numpy function as the CPU emulation of inline assembly, so kernels may name it (`emulate=fn`)."""
    fn.__tessera_constexpr__ = True
    return fn


def _operands(ctx: Context, args: Any) -> list[Tensor]:
    if not isinstance(args, tuple) or not args:
        ctx.error(f"inline_asm_elementwise's args must be a non-empty list of tensors, got {describe(args)}")
    operands = []
    for x in args:
        if not operators.is_number_operand(x):
            ctx.error(f"inline_asm_elementwise's args must be numbers or tiles of numbers, got {describe(x)}",
                      TypeMismatchError)
        operands.append(operators.to_tensor(ctx, x))
    return operands
