"""How the kernel language's operators and conversions become IR.

The tracer calls these whenever an operand is a traced value:

    binary(ctx, '+', a, b)      a + b, a - b, a * b, a / b, a // b, a % b,
                                a & b, a | b, a ^ b, a << b, a >> b
    compare(ctx, '<', a, b)     a == b, a != b, a < b, ...  -> bool
    unary(ctx, '-', a)          -a, +a, ~a, not a
    logical(ctx, 'and', a, b)   a and b, a or b
    truth(ctx, x)               the bool scalar an `if` or `while` tests
    to_tensor(ctx, x)           a Python number as an IR constant
    cast(ctx, x, dtype)         x.to(dtype), tessera.cast(x, dtype)
    subscript(ctx, x, index)    x[None, :], x[:, None]
    attribute(ctx, x, name)     x.dtype, x.shape, x.T, x.sum(...), view.block(...)

Dtypes follow `promotion.py`. Shapes broadcast like numpy: a scalar splats
to any shape, shapes align at the right, and size-1 dimensions stretch.

Integer division and remainder follow C and the hardware, NOT Python:

    a // b   integers: truncates toward zero    -7 // 2 == -3    (Python: -4)
             floats: floor(a / b)               -7.0 // 2.0 == -4.0
    a % b    the sign of a (C's % and fmod)     -7 % 2 == -1     (Python: 1)
             integers and floats alike          -7.0 % 2.0 == -1.0
    a / b    true division; integers give f32   7 / 2 == 3.5

Pointer arithmetic: `ptr + int`, `int + ptr` and `ptr - int` move by whole
elements (IR `addptr`); pointer and offset broadcast together, so a scalar
base plus an `arange` is a tile of pointers. Pointers are values too:
`addr.to(tessera.pointer_type(tessera.f16))` makes pointers of 64-bit
integer addresses (IR `int_to_ptr`), `ptr.to(tessera.i64)` their addresses.

`a and b` / `a or b` with a traced operand evaluate both sides (there is no
short circuit over traced values) and combine them lane by lane as bools.
"""

from __future__ import annotations

import functools

import math

from typing import Any

import numpy as np

from ..ir.dtypes import DType, bool_, i64
from ..ir.errors import TypeRuleError
from ..ir.types import PointerType, ScalarType, SharedType, TileType, element_of, with_shape
from . import promotion
from .constexpr_args import describe, static_bool, static_dtype
from .errors import TypeMismatchError
from .promotion import PromotionError
from .values import BUILTINS, Context, Tensor

# ---------------------------------------------------------------------------
# Emitting ops and making constants


def emit(ctx: Context, op: str, *operands: Tensor, result_type=None, **attrs: Any) -> Tensor | None:
    """Create IR op `op` and return its result (None for ops without one, like `store`).

    Callers check operands first and report user-level errors; a type-rule
    violation that still gets through is reported at the source line too.
    """
    try:
        created = ctx.builder.create(op, [t.value for t in operands], attrs,
                                     result_types=None if result_type is None else [result_type])
    except TypeRuleError as exc:
        ctx.error(f"invalid {op}: {exc}", TypeMismatchError)
    for result in created.results:
        check_tile_size(ctx, result.type)
    return Tensor(created.results[0]) if created.results else None


MAX_TILE_ELEMENTS = 1 << 20     # 4 MiB of f32: more than any GPU block holds in registers and shared memory


def check_tile_size(ctx: Context, t: Any) -> None:
    """A CompileError at the current line for a tile larger than MAX_TILE_ELEMENTS, before the interpreter or
    the layout pass allocates anything for it."""
    numel = math.prod(t.shape) if isinstance(t, (TileType, SharedType)) else 0
    if numel > MAX_TILE_ELEMENTS:
        ctx.error(f"{t} has {numel:,} elements, more than tessera's limit of {MAX_TILE_ELEMENTS:,} (2**20) "
                  f"per tile: no GPU block holds that much in its registers and shared memory. Split the work: "
                  f"smaller blocks over more programs (a bigger grid), or a loop over blocks inside the kernel")


def is_python_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def is_number_operand(x: Any) -> bool:
    """A Python number, or a traced number or tile of numbers (not a pointer or view)."""
    return x.dtype is not None if isinstance(x, Tensor) else is_python_number(x)


def is_pointer(x: Any) -> bool:
    """A traced pointer or tile of pointers."""
    return isinstance(x, Tensor) and isinstance(element_of(x.type), PointerType)


def to_tensor(ctx: Context, x: Any, dtype: DType | None = None) -> Tensor:
    """`x` as a traced value: Tensors as they are (cast when `dtype` is given);
    Python numbers as IR constants of `dtype`, or on their own bool -> bool,
    int -> i32 (i64, then u64, when it does not fit), float -> f32.

    A Python int given an integer `dtype` must fit in it.
    """
    if isinstance(x, Tensor):
        return x if dtype is None else cast(ctx, x, dtype)
    return fit(ctx, x, dtype, ())


def fit(ctx: Context, x: Any, dtype: DType | None, shape: tuple[int, ...]) -> Tensor:
    """`x` converted to `dtype` and broadcast to `shape` (the caller checked that it broadcasts).

    A Python number becomes one constant of that shape, not a splat.
    """
    if isinstance(x, Tensor):
        return broadcast_to_shape(ctx, x if dtype is None else cast(ctx, x, dtype), shape)
    if not is_python_number(x):
        ctx.error(f"expected a number or a tensor, got {describe(x)}")
    x = x.item() if isinstance(x, np.generic) else x
    if dtype is None:
        dtype = python_number_dtype(ctx, x)
    elif dtype.is_int and isinstance(x, int) and not isinstance(x, bool):
        if not dtype.min_value <= x <= dtype.max_value:
            ctx.error(f"the Python int {x} does not fit in {dtype.name} "
                      f"(range {dtype.min_value}..{dtype.max_value})")
    return constant(ctx, x, dtype, shape)


def python_number_dtype(ctx: Context, x: Any) -> DType:
    """The dtype of a Python number on its own: bool, i32 (i64, u64 when larger), f32."""
    try:
        return promotion.python_scalar_dtype(x.item() if isinstance(x, np.generic) else x)
    except PromotionError as exc:
        ctx.error(str(exc))


def constant(ctx: Context, value: bool | int | float, dtype: DType, shape: tuple[int, ...] = ()) -> Tensor:
    """An IR constant of `dtype` (a tile of `shape`, when given) holding `value` converted as a cast converts it."""
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, bool) and not dtype.is_bool:
        value = int(value)
    try:
        converted = dtype.quantize(value).item()
    except (TypeError, OverflowError):
        ctx.error(f"the number {value!r} cannot be represented as {dtype.name}")
    return emit(ctx, "constant", result_type=with_shape(ScalarType(dtype), shape), value=converted)


def cast(ctx: Context, x: Any, dtype: Any, bitcast: Any = False) -> Tensor:
    """`x` converted to `dtype` (rounding to nearest even, float -> int truncating and saturating),
    or with `bitcast=True` its bits reinterpreted as `dtype` (equal widths only)."""
    if isinstance(dtype, PointerType) or is_pointer(x):
        return pointer_cast(ctx, x, dtype)
    dtype = static_dtype(ctx, dtype, "the dtype to cast to")
    bitcast = static_bool(ctx, bitcast, "bitcast")
    if not isinstance(x, Tensor):
        if not is_python_number(x):
            ctx.error(f"cannot cast {describe(x)} to {dtype.name}: only numbers and tensors convert",
                      TypeMismatchError)
        if not bitcast:
            return constant(ctx, x.item() if isinstance(x, np.generic) else x, dtype)
        x = to_tensor(ctx, x)
    if x.dtype is None:
        ctx.error(f"cannot cast {x.type} to {dtype.name}: casts convert numbers, and this is a "
                  f"{'view' if x.is_view else 'pointer'}", TypeMismatchError)
    if x.dtype == dtype:
        return x
    if bitcast and x.dtype.bits != dtype.bits:
        ctx.error(f"cannot bitcast {x.type} to {dtype.name}: a bitcast needs equal widths "
                  f"({x.dtype.bits} vs {dtype.bits} bits)", TypeMismatchError)
    return emit(ctx, "bitcast" if bitcast else "cast", x, result_type=with_shape(ScalarType(dtype), x.shape))


def pointer_cast(ctx: Context, x: Any, target: Any) -> Tensor:
    """Integers <-> pointers: an integer address (bytes; widened to i64) as a pointer of `target`
    (`tessera.pointer_type(dtype)`), a pointer as its address (`tessera.i64` or `tessera.u64`), or a pointer
    as a pointer to another type (the same address)."""
    if isinstance(target, PointerType) and target.address_space != "global":
        ctx.error(f"only global-memory pointers convert to and from integers, not {target}")
    if is_pointer(x) and isinstance(target, PointerType):
        x = pointer_cast(ctx, x, i64)
    if is_pointer(x):
        dtype = static_dtype(ctx, target, "the type to convert a pointer to")
        if not (dtype.is_int and dtype.bits == 64):
            ctx.error(f"a pointer converts to its address, a 64-bit integer (tessera.i64 or tessera.u64), not "
                      f"{dtype.name}", TypeMismatchError)
        return emit(ctx, "ptr_to_int", x, result_type=with_shape(ScalarType(dtype), x.shape))
    x = to_tensor(ctx, x)
    if x.dtype is None or not x.dtype.is_int:
        ctx.error(f"cannot convert {describe(x)} to {target}: pointers come from integer addresses (i64)",
                  TypeMismatchError)
    if x.dtype.bits != 64:
        x = cast(ctx, x, i64)
    return emit(ctx, "int_to_ptr", x, result_type=with_shape(target, x.shape))


def as_bool(ctx: Context, x: Any, what: str) -> Tensor:
    """`x` as bool lanes: bool as is, numbers `!= 0`."""
    if not isinstance(x, Tensor):
        if not is_python_number(x):
            ctx.error(f"{what} must be a number, a bool or a tensor, got {describe(x)}")
        return constant(ctx, bool(x), bool_)
    if x.dtype is None:
        ctx.error(f"{what} must be bool or numeric, got {x.type}")
    if x.dtype.is_bool:
        return x
    return compare(ctx, "!=", x, 0)


# ---------------------------------------------------------------------------
# Broadcasting


def shape_of_operand(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, Tensor) else ()


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The numpy broadcast of `shapes`, or None when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    result = []
    for dims in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def broadcast_to_shape(ctx: Context, x: Tensor, shape: tuple[int, ...], what: str = "") -> Tensor:
    """`x` stretched to `shape`: splat a scalar, add leading size-1 dims, repeat size-1 dims."""
    shape = tuple(shape)
    source = x.shape
    if source == shape:
        return x
    if broadcast_shape(source, shape) != shape:
        ctx.error(f"{what or 'cannot broadcast'}: {x.type} (shape {source}) does not broadcast to shape {shape}",
                  TypeMismatchError)
    element = element_of(x.type)
    if not source:
        return emit(ctx, "splat", x, result_type=TileType(element, shape))
    if len(source) < len(shape):
        source = (1,) * (len(shape) - len(source)) + source
        x = emit(ctx, "reshape", x, result_type=TileType(element, source))
    if source != shape:
        x = emit(ctx, "broadcast", x, result_type=TileType(element, shape))
    return x


def common_shape(ctx: Context, verb: str, a: Any, b: Any) -> tuple[int, ...]:
    """The broadcast shape of two operands, or an error `cannot <verb> A and B: shapes ... do not broadcast`."""
    shape = broadcast_shape(shape_of_operand(a), shape_of_operand(b))
    if shape is None:
        ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: shapes {shape_of_operand(a)} and "
                  f"{shape_of_operand(b)} do not broadcast", TypeMismatchError)
    return shape


def common_dtype(a: Any, b: Any) -> DType:
    """The common dtype of two operands, tensors or Python numbers (see promotion.py)."""
    def scalar(x):
        return x.item() if isinstance(x, np.generic) else x
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return promotion.promote(a.dtype, b.dtype)
    if isinstance(a, Tensor):
        return promotion.weak_promote(a.dtype, scalar(b))
    if isinstance(b, Tensor):
        return promotion.weak_promote(b.dtype, scalar(a))
    return promotion.promote(promotion.python_scalar_dtype(scalar(a)), promotion.python_scalar_dtype(scalar(b)))


# ---------------------------------------------------------------------------
# Binary operators, comparisons, unary and logical operators

BINARY_VERBS = {
    "+": "add", "-": "subtract", "*": "multiply", "/": "divide", "//": "floor-divide",
    "%": "take the remainder of", "&": "bitwise-and", "|": "bitwise-or", "^": "bitwise-xor",
    "<<": "shift", ">>": "shift", "**": "raise to a power",
}
BINARY_OPS = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "//": "div", "%": "rem",
    "&": "and", "|": "or", "^": "xor", "<<": "shl", ">>": "shr",
}
PREDICATES = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


_SHARED_NOT_A_TILE = ("a shared buffer has no elementwise operators (nor an address to offset); read it first: "
                      "buf.load() (or buf[s].load() for a slot)")


def _check_operands(ctx: Context, verb: str, a: Any, b: Any) -> None:
    for x in (a, b):
        if isinstance(x, Tensor) and x.is_view:
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: a view has no elementwise operators; "
                      f"load a block of it first: v.block(shape, index).load()", TypeMismatchError)
        if isinstance(x, Tensor) and x.is_shared:
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: {_SHARED_NOT_A_TILE}", TypeMismatchError)
        if not isinstance(x, Tensor) and not is_python_number(x):
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: {describe(x)} is not a number",
                      TypeMismatchError)


def _operator_dtype(ctx: Context, op: str, verb: str, a: Any, b: Any) -> DType:
    try:
        return promotion.operator_dtype(op, common_dtype(a, b))
    except PromotionError as exc:
        ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: {exc}", TypeMismatchError)


def binary(ctx: Context, op: str, a: Any, b: Any) -> Tensor:
    """`a <op> b` with broadcasting and promotion (integer // and % as in C: see the module docstring)."""
    if op not in BINARY_VERBS:
        raise ValueError(f"unknown binary operator {op!r}")
    verb = BINARY_VERBS[op]
    if op == "**":
        ctx.error("`**` is not supported on traced values: for floats write tessera.exp2(y * tessera.log2(x)); "
                  "for a small constant integer power multiply (x * x * x)")
    _check_operands(ctx, verb, a, b)
    if is_pointer(a) or is_pointer(b):
        return _pointer_arithmetic(ctx, op, verb, a, b)
    shape = common_shape(ctx, verb, a, b)
    dtype = _operator_dtype(ctx, op, verb, a, b)
    x, y = (fit(ctx, v, dtype, shape) for v in (a, b))
    result = emit(ctx, BINARY_OPS[op], x, y)
    if op == "//" and dtype.is_float:
        result = emit(ctx, "floor", result)
    return result


def _pointer_arithmetic(ctx: Context, op: str, verb: str, a: Any, b: Any) -> Tensor:
    if op == "+" and not (is_pointer(a) and is_pointer(b)):
        pointer, offset, negate = (a, b, False) if is_pointer(a) else (b, a, False)
    elif op == "-" and is_pointer(a) and not is_pointer(b):
        pointer, offset, negate = a, b, True
    else:
        ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: pointers support only `pointer + integer`, "
                  f"`integer + pointer` and `pointer - integer` (offsets count elements)", TypeMismatchError)
    if isinstance(offset, Tensor):
        if not offset.dtype.is_int:
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: pointer offsets must be integers, "
                      f"got {offset.type}", TypeMismatchError)
        if negate:
            if offset.dtype.kind == "uint":
                offset = cast(ctx, offset, i64)
            offset = emit(ctx, "neg", offset)
    else:
        value = offset.item() if isinstance(offset, np.generic) else offset
        if not isinstance(value, int) or isinstance(value, bool):
            ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: pointer offsets must be integers, "
                      f"got {describe(offset)}", TypeMismatchError)
        offset = -value if negate else value
    shape = common_shape(ctx, verb, a, b)
    return emit(ctx, "addptr", broadcast_to_shape(ctx, pointer, shape), fit(ctx, offset, None, shape))


def compare(ctx: Context, pred: str, a: Any, b: Any) -> Tensor:
    """`a <pred> b` lane by lane after promotion and broadcasting; the result is bool."""
    if pred not in PREDICATES:
        raise ValueError(f"unknown comparison {pred!r}")
    verb = f"compare (`{pred}`)"
    _check_operands(ctx, verb, a, b)
    if is_pointer(a) or is_pointer(b):
        ctx.error(f"cannot {verb} {describe(a)} and {describe(b)}: pointers cannot be compared; "
                  f"compare their integer offsets instead", TypeMismatchError)
    shape = common_shape(ctx, verb, a, b)
    dtype = _operator_dtype(ctx, pred, verb, a, b)
    x, y = (fit(ctx, v, dtype, shape) for v in (a, b))
    return emit(ctx, "cmp", x, y, pred=PREDICATES[pred])


def unary(ctx: Context, op: str, a: Any) -> Tensor:
    """`-a` (bool -> i32 first), `+a`, `~a` (integers and bool), `not a` (lane-wise: a == 0 for numbers)."""
    if op not in ("-", "+", "~", "not"):
        raise ValueError(f"unknown unary operator {op!r}")
    x = to_tensor(ctx, a)
    if x.is_view:
        ctx.error(f"cannot apply `{op}` to {x.type}: a view has no elementwise operators; "
                  f"load a block of it first: v.block(shape, index).load()", TypeMismatchError)
    if x.is_shared:
        ctx.error(f"cannot apply `{op}` to {x.type}: {_SHARED_NOT_A_TILE}", TypeMismatchError)
    if op == "+":
        return x
    if is_pointer(x):
        ctx.error(f"cannot apply `{op}` to the pointer {x.type}", TypeMismatchError)
    if op == "-":
        return emit(ctx, "neg", to_tensor(ctx, x, promotion.arithmetic_dtype(x.dtype)))
    if op == "~":
        if x.dtype.is_float:
            ctx.error(f"cannot apply `~` to {x.type}: it needs integer or bool operands; to flip the bits of "
                      f"floats, bitcast first: x.to(tessera.i32, bitcast=True)", TypeMismatchError)
        return emit(ctx, "not", x)
    if x.dtype.is_bool:
        return emit(ctx, "not", x)
    return compare(ctx, "==", x, 0)


def logical(ctx: Context, op: str, a: Any, b: Any) -> Tensor:
    """`a and b` / `a or b` on traced values: both sides as bool (x != 0), combined lane by lane (no short circuit)."""
    if op not in ("and", "or"):
        raise ValueError(f"unknown logical operator {op!r}")
    shape = common_shape(ctx, f"apply `{op}` to", a, b)
    x, y = (fit(ctx, as_bool(ctx, v, f"an operand of `{op}`") if isinstance(v, Tensor) else bool(v), bool_, shape)
            for v in (a, b))
    return emit(ctx, op, x, y)


def truth(ctx: Context, x: Any) -> Tensor:
    """The bool scalar an `if` or `while` tests: a bool scalar as is, a number != 0.

    Tiles have no single truth value: the error points to `tessera.where`
    for per-lane choices and to reductions for any/all tests.
    """
    if not isinstance(x, Tensor):
        return constant(ctx, bool(x), bool_)
    if x.is_tile:
        ctx.error(f"the condition is a {x.type}, but `if` and `while` need a single bool: for a per-lane choice "
                  f"use tessera.where(condition, a, b); to ask whether any or all lanes are true, reduce first: "
                  f"tessera.max(condition) (any) or tessera.min(condition) (all)", TypeMismatchError)
    if x.dtype is None:
        ctx.error(f"a {x.type} has no truth value; a condition must be a bool or a number", TypeMismatchError)
    return as_bool(ctx, x, "the condition")


# ---------------------------------------------------------------------------
# Subscripts and attributes


def _format_index(index: Any) -> str:
    def one(e):
        if e is None:
            return "None"
        if e is Ellipsis:
            return "..."
        if isinstance(e, slice):
            parts = ["" if p is None else one(p) for p in (e.start, e.stop, e.step)]
            return ":".join(parts[:2] if e.step is None else parts)
        return str(e.type) if isinstance(e, Tensor) else repr(e)
    entries = index if isinstance(index, tuple) else (index,)
    return ", ".join(one(e) for e in entries)


def subscript(ctx: Context, x: Tensor, index: Any) -> Tensor:
    """`x[None, :]`, `x[:, None]`, `x[None]`, `x[..., None]`: insert size-1 axes where None stands.

    Tiles are not indexable otherwise: lanes are spread over threads, so
    elements are read by loading through a view or pointers.
    """
    if isinstance(x, Tensor) and x.is_shared:
        from .language.shared import slot
        return slot(ctx, x, index)
    entries = index if isinstance(index, tuple) else (index,)
    is_full = [isinstance(e, slice) and e == slice(None) for e in entries]
    allowed = all(e is None or e is Ellipsis or full for e, full in zip(entries, is_full))
    if not isinstance(x, Tensor) or x.is_view or not allowed or sum(e is Ellipsis for e in entries) > 1:
        what = describe(x) if not (isinstance(x, Tensor) and x.is_view) else f"the view {x.type}"
        ctx.error(f"cannot index {what} with [{_format_index(index)}]: tiles are not indexable; only None "
                  f"(a new axis), `:` and `...` may appear, as in x[:, None] or x[None, :]. To read elements, "
                  f"load them through a view (v.block(shape, index).load()) or pointers "
                  f"(tessera.load(ptr + offsets))", TypeMismatchError)
    rank = len(x.shape)
    kept = sum(is_full)
    if kept > rank:
        ctx.error(f"cannot index {x.type} with [{_format_index(index)}]: {kept} `:` for a rank-{rank} tile",
                  TypeMismatchError)
    axis = 0
    for entry, full in zip(entries, is_full):
        if entry is None:
            x = emit(ctx, "expand_dims", x, axis=axis)
            axis += 1
        elif full:
            axis += 1
        else:  # Ellipsis: the dimensions no `:` names
            axis += rank - kept
    return x


TENSOR_METHODS = ("to", "sum", "max", "min", "argmax", "argmin", "reshape", "permute", "expand_dims",
                  "broadcast_to", "cumsum", "cumprod")
TENSOR_ATTRIBUTES = ("dtype", "shape", "T") + TENSOR_METHODS
VIEW_ATTRIBUTES = ("dtype", "rank", "block")
SHAPE_METHODS = ("reshape", "permute", "broadcast_to")  # accept x.reshape(4, 8) as well as x.reshape((4, 8))


def attribute(ctx: Context, x: Tensor, name: str) -> Any:
    """`x.<name>` on a traced value: a compile-time value (dtype, shape), a tile (T), or a method.

    Methods are returned as Python functions of the remaining arguments:
    `x.sum(axis=0)` is `tessera.sum(x, axis=0)`. For a pointer, `.dtype`
    is the element type it points to.
    """
    if x.is_view:
        return _view_attribute(ctx, x, name)
    if x.is_shared:
        from .language.shared import attribute as shared_attribute
        return shared_attribute(ctx, x, name)
    if name == "dtype":
        element = element_of(x.type)
        return element.pointee if isinstance(element, PointerType) else element.dtype
    if name == "shape":
        return x.shape
    if name == "T":
        if len(x.shape) != 2:
            ctx.error(f".T transposes 2-D tiles, got {x.type}; use x.permute(...) for other ranks")
        return emit(ctx, "permute", x, order=(1, 0))
    if name == "to":
        return lambda dtype, bitcast=False: cast(ctx, x, dtype, bitcast)
    if name in TENSOR_METHODS:
        from . import language  # noqa: F401  (fills BUILTINS)
        impl = BUILTINS[name].impl
        if name in SHAPE_METHODS:
            def shape_method(*dims, **kwargs):
                if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                    dims = dims[0]
                return impl(ctx, x, tuple(dims), **kwargs)
            return shape_method
        return functools.partial(impl, ctx, x)     # keeps impl's signature: bad arguments are the user's
    ctx.error(f"{x.type} has no attribute {name!r}; tiles, scalars and pointers have: {', '.join(TENSOR_ATTRIBUTES)}")


def _view_attribute(ctx: Context, view: Tensor, name: str) -> Any:
    if name == "dtype":
        return view.type.dtype
    if name == "rank":
        return view.type.rank
    if name == "block":
        from .language.memory import view_block
        return functools.partial(view_block, ctx, view)
    ctx.error(f"{view.type} has no attribute {name!r}; views have: {', '.join(VIEW_ATTRIBUTES)}")
