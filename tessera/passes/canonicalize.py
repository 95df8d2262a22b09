"""Canonicalize: fold constants, apply exact algebraic identities, resolve
control flow whose outcome is known, until nothing changes.

The frontend emits IR as the user wrote it: `1 * K`, constants that feed
casts and splats, `if`s on constexpr conditions, loops over `range(0, 1)`.
This pass rewrites such ops into simpler equivalents so that later passes
(and humans reading dumps) see less: an elementwise op, `cmp`, `select`,
`cast`, `bitcast`, `splat` or shape op whose operands are all constants
becomes one constant, computed with the interpreter's own numerics
(`ir/numerics.py` on `dtypes` values) so the folded value is
exactly what the op would have produced; identities that hold for every
input (`x + 0`, `x * 1`, `x * 0` on integers, `x * 1` and `x + -0.0` on
floats, `and(x, true)`, `select(c, a, a)`, a cast to the same type, ...)
replace the op by one of its operands; an `if` on a constant condition
becomes its taken region, and a `for` with constant bounds that runs zero
times becomes its initial values (once: its body). Nothing that could
change a result is rewritten: integer division by zero, float `x + 0.0`
(-0.0 + 0.0 is +0.0) and float `x * 0` (inf * 0 is NaN) stay as they are.
A rewritten op is removed; ops it leaves unused are left for DCE.
"""

from __future__ import annotations

import numpy as np

from tessera.ir import numerics
from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.dtypes import DType
from tessera.ir.ops import OPS
from tessera.ir.types import scalar_dtype

from .manager import FunctionPass
from .rewrite import inline_region, remap_operands, splice

# A rewrite: the ops that take the old op's place, and the values that replace its results.
Rewrite = tuple[list[Operation], list[Value]]

_SELF_COMPARISON = {"eq": True, "le": True, "ge": True, "ne": False, "lt": False, "gt": False}  # cmp(x, x), no NaN


def canonicalize_function(fn: Function) -> bool:
    """Rewrite `fn` in place until no rule applies; whether anything changed."""
    changed = False
    while _sweep(fn.body, {}):
        changed = True
    return changed


def _sweep(block: Block, replaced: dict[Value, Value]) -> bool:
    """One program-order walk: rewrite every op that a rule matches.

    Uses always follow definitions in program order, so substituting each
    op's operands by `replaced` as the walk reaches it updates every use.
    """
    changed = False
    i = 0
    while i < len(block.ops):
        op = block.ops[i]
        remap_operands(op, replaced)
        for region in op.regions:
            changed |= _sweep(region, replaced)
        rewrite = _rewrite(op)
        if rewrite is None:
            i += 1
            continue
        new_ops, values = rewrite
        splice(op, new_ops)
        replaced.update(zip(op.results, values))
        i += len(new_ops)
        changed = True
    return changed


def _rewrite(op: Operation) -> Rewrite | None:
    if op.name == "if":
        return _known_if(op)
    if op.name == "for":
        return _known_for(op)
    if op.name == "constant" or len(op.results) != 1 or op.regions:
        return None
    value = _fold(op)
    constant = make_constant(op, value) if value is not None else None
    if constant is not None:
        return [constant], [constant.result]
    return _simplify(op)


# ---------------------------------------------------------------------------
# Constants


def constant_value(value: Value) -> np.ndarray | None:
    """The value every lane of `value` holds if a `constant` defines it (a 0-d
    array of its dtype's compute type, as the interpreter holds it), else None."""
    owner = value.owner
    if not isinstance(owner, Operation) or owner.name != "constant":
        return None
    dtype = scalar_dtype(value.type)
    try:
        return np.asarray(dtype.quantize(owner.attrs["value"]))
    except (TypeError, ValueError, OverflowError):  # a value numpy cannot hold: leave it to the interpreter
        return None


def make_constant(op: Operation, value: np.ndarray) -> Operation | None:
    """A `constant` of `op`'s result type holding `value`, named and located like `op`.

    None if no attribute reproduces `value` bit for bit: a NaN whose sign or
    payload differs from the one a `nan` attribute gives (x86 computes 0/0
    as -NaN, which a later `bitcast` could tell apart).
    """
    result = op.result
    dtype = scalar_dtype(result.type)
    value = np.asarray(value).reshape(())
    attr = _attribute(value, dtype)
    if dtype.encode(dtype.quantize(attr)) != dtype.encode(value):
        return None
    return Operation("constant", [], [result.type], {"value": attr}, loc=op.loc, result_names=[result.name_hint])


def _attribute(value: np.ndarray, dtype: DType) -> bool | int | float:
    """A constant's attribute that the interpreter turns back into exactly `value`."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(value)
    return float(value)  # exact: every value of every float dtype is a double


# ---------------------------------------------------------------------------
# Folding: every operand is a constant


def _fold(op: Operation) -> np.ndarray | None:
    """The constant result of `op`, when its operands are constants and folding is safe."""
    inputs = [constant_value(v) for v in op.operands]
    if not inputs or any(x is None for x in inputs):
        return None
    name, dtype = op.name, scalar_dtype(op.result.type)
    if dtype is None:
        return None
    family = OPS[name].numerics
    with np.errstate(all="ignore"):
        if family == "binary":
            a, b = inputs
            if name in ("div", "rem") and dtype.is_int and b == 0:
                return None  # undefined on GPUs: keep the op so the program behaves as written
            return numerics.binary(name, a, b, dtype)
        if family == "compare":
            return numerics.COMPARE[op.attrs["pred"]](*inputs)
        if family == "unary":
            return numerics.unary(name, inputs[0], dtype)
        if family == "math":
            return numerics.math_function(name, inputs[0], dtype)
        if name == "cast":
            return dtype.quantize(inputs[0])
        if name == "bitcast":
            source = scalar_dtype(op.operands[0].type)
            return dtype.decode(source.encode(inputs[0]))
        if OPS[name].shape_op:
            return inputs[0]  # a constant is the same in every lane
    return None  # select folds as a simplification; other ops are not folded


# ---------------------------------------------------------------------------
# Identities: the op equals one of its operands (or a new constant)


def _simplify(op: Operation) -> Rewrite | None:
    name = op.name
    if OPS[name].numerics == "binary":
        return _simplify_binary(op)
    x = op.operands[0] if op.operands else None
    same_type = x is not None and x.type == op.result.type
    if name in ("cast", "bitcast", "broadcast", "reshape") and same_type:
        return [], [x]
    if name == "permute" and tuple(op.attrs["order"]) == tuple(range(len(op.attrs["order"]))):
        return [], [x]
    if name == "select":
        cond, a, b = op.operands
        if a is b:
            return [], [a]
        c = constant_value(cond)
        return None if c is None else ([], [a if bool(c) else b])
    if name == "cmp":
        return _simplify_compare(op)
    if OPS[name].numerics == "unary":
        return _simplify_unary(op)
    if name == "addptr" and _is(constant_value(op.operands[1]), 0):
        return [], [x]
    return None


def _simplify_binary(op: Operation) -> Rewrite | None:
    name = op.name
    x, y = op.operands
    dtype = scalar_dtype(op.result.type)
    exact = not dtype.is_float  # integer and bool arithmetic is exact, so more identities hold
    cx, cy = constant_value(x), constant_value(y)
    keep = lambda v: ([], [v])  # noqa: E731  (the op equals operand v)

    if x is y:
        if name in ("and", "or", "min", "max"):
            return keep(x)
        if name in ("sub", "xor") and exact:
            return _new_constant(op, 0)
    if name == "add":
        zero = _is_zero if exact else _is_negative_zero  # x + (-0.0) == x for every float x, +0.0 is not
        if zero(cy):
            return keep(x)
        if zero(cx):
            return keep(y)
    if name == "sub" and (_is_zero(cy) if exact else _is_positive_zero(cy)):
        return keep(x)
    if name == "mul":
        if _is(cy, 1):
            return keep(x)
        if _is(cx, 1):
            return keep(y)
        if exact and _is(cy, 0):
            return keep(y)
        if exact and _is(cx, 0):
            return keep(x)
    if name == "div" and _is(cy, 1):
        return keep(x)
    if name == "rem" and exact and _is(cy, 1):
        return _new_constant(op, 0)
    if name in ("and", "or", "xor"):
        for constant, c, other in ((y, cy, x), (x, cx, y)):
            if _is(c, 0):  # and(x, 0) = 0; or(x, 0) = xor(x, 0) = x
                return keep(constant if name == "and" else other)
            if name != "xor" and _is_all_ones(c, dtype):  # and(x, ~0) = x; or(x, ~0) = ~0
                return keep(other if name == "and" else constant)
    if name in ("shl", "shr") and _is(cy, 0):
        return keep(x)
    return None


def _simplify_compare(op: Operation) -> Rewrite | None:
    x, y = op.operands
    dtype = scalar_dtype(x.type)
    if x is y and dtype is not None and not dtype.is_float:  # NaN != NaN, so only for integers and bool
        return _new_constant(op, _SELF_COMPARISON[op.attrs["pred"]])
    return None


def _simplify_unary(op: Operation) -> Rewrite | None:
    (x,) = op.operands
    dtype = scalar_dtype(x.type)
    inner = x.owner if isinstance(x.owner, Operation) else None
    # not(not(x)) = x; neg(neg(x)) = x too, wrapping or not, except in e8m0, which has no sign to flip
    involution = op.name == "not" or (op.name == "neg" and (dtype.is_signed or dtype.kind == "uint"))
    if involution and inner is not None and inner.name == op.name:
        return [], [inner.operands[0]]
    if op.name == "abs" and (dtype.kind == "uint" or (inner is not None and inner.name == "abs")):
        return [], [x]  # abs(unsigned x) = x; abs(abs(x)) = abs(x)
    return None


def _new_constant(op: Operation, value: int | bool) -> Rewrite:
    """The op equals this integer or bool (which every such dtype holds exactly)."""
    constant = make_constant(op, scalar_dtype(op.result.type).quantize(value))
    return [constant], [constant.result]


def _is(c: np.ndarray | None, number) -> bool:
    """Whether the constant value `c` (None: not a constant) equals `number`."""
    return c is not None and bool(c == number)


def _is_zero(c: np.ndarray | None) -> bool:
    return _is(c, 0)


def _is_positive_zero(c: np.ndarray | None) -> bool:
    return _is(c, 0) and not np.signbit(c)


def _is_negative_zero(c: np.ndarray | None) -> bool:
    return _is(c, 0) and bool(np.signbit(c))


def _is_all_ones(c, dtype: DType) -> bool:
    """True for bool, -1 for signed, the maximum for unsigned integers."""
    if c is None or dtype.is_float:
        return False
    if dtype.is_bool:
        return bool(c)
    return int(c) == (-1 if dtype.kind == "int" else dtype.max_value)


# ---------------------------------------------------------------------------
# Control flow with a known outcome


def _known_if(op: Operation) -> Rewrite | None:
    """`if` on a constant: the taken region's ops, and what it yields."""
    cond = constant_value(op.operands[0])
    if cond is None:
        return None
    return inline_region(op.regions[0 if bool(cond) else 1], [])


def _known_for(op: Operation) -> Rewrite | None:
    """`for` with constant bounds running 0 times: its inits; once: its body with iv = lb."""
    lb, ub, step, *inits = op.operands
    bounds = [constant_value(v) for v in (lb, ub, step)]
    if any(b is None for b in bounds) or int(bounds[2]) == 0:  # step 0 fails at run time: keep it
        return None
    trips = len(range(*(int(b) for b in bounds)))
    if trips == 0:
        return [], inits
    if trips == 1:
        return inline_region(op.regions[0], [lb, *inits])
    return None


class Canonicalize(FunctionPass):
    """The pass object for `PassManager` (see the module docstring)."""

    name = "canonicalize"
    rewrite = staticmethod(canonicalize_function)
