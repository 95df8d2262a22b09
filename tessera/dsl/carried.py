"""Variables that cross region boundaries: if results and loop-carried values.

SSA regions do not see later assignments, so a variable assigned inside a
runtime `if` or loop becomes a result of that op, threaded explicitly:

* after an `if`, a variable whose value differs between the branches
  becomes a result (named after the variable);
* a variable assigned in a loop body that existed before the loop is
  carried: it enters the body as a block argument and leaves as a result.

Both sides must have one IR type. A Python number on one side takes the
other side's type (`x = 0` before `x += tile` becomes a zero tile); a
traced value whose type differs is a `LoopCarriedTypeError` that names the
variable, both types and the fix. Loops learn their carried types by
tracing: Python-number initial values start with their default type, and if
the body hands back another type the loop is traced again from that type
(`Carried.retypes`).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Callable

from ..ir.core import Block
from ..ir.types import TileType, Type, scalar_dtype, shape_of
from . import operators
from .errors import ConstexprError, LoopCarriedTypeError
from .scope import Unbound, describe, hint_of
from .values import Tensor

if TYPE_CHECKING:
    from .tracer import Tracer

MISSING = Unbound("is not defined")


def is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float))


def same_value(a: Any, b: Any) -> bool:
    """True when a variable did not change: the same traced value, or an equal compile-time value."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.value is b.value
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a is b or a == b)


def assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """Every name stored to in `stmts`, nested blocks included, in order of first appearance."""
    names: dict[str, None] = {}
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names[node.id] = None
    return list(names)


def trace_region(gen: "Tracer", block: Block, variables: dict[str, Any], body: Callable[[], Any]) -> Any:
    """Run `body` with the insertion point in `block` and the frame's variables set to `variables`.

    Returns what `body` returns; `variables` (mutated) holds the variables after it.
    """
    frame = gen.frame
    saved = frame.variables
    frame.variables = variables
    frame.region_depth += 1
    try:
        with gen.builder.at(block):
            return body()
    finally:
        frame.variables = saved
        frame.region_depth -= 1


# ---------------------------------------------------------------------------
# Python numbers as IR values


def constant_of_type(gen: "Tracer", value: Any, type: Type) -> Tensor | None:
    """`value` as a constant of `type` (scalar or tile) at the insertion point, or None if it does not fit exactly."""
    dtype = scalar_dtype(type)
    if dtype is None or not is_number(value):
        return None
    if dtype.is_bool:
        if not isinstance(value, bool):
            return None
    elif dtype.is_int:
        if isinstance(value, float) or not (dtype.min_value <= int(value) <= dtype.max_value):
            return None
        value = int(value)
    else:
        value = float(value)
    return Tensor(gen.builder.create("constant", attrs={"value": value}, result_types=[type]).result)


def default_type(gen: "Tracer", value: Any) -> Type:
    """The type `operators.to_tensor` gives a Python number (traced into a scratch block)."""
    with gen.builder.at(Block()):
        return operators.to_tensor(gen.ctx, value).type


def common_number_type(gen: "Tracer", a: Any, b: Any) -> Type | None:
    """A type holding both Python numbers exactly: the default type of the float one, else of either."""
    candidates = [default_type(gen, v) for v in sorted((a, b), key=lambda v: isinstance(v, float), reverse=True)]
    for candidate in candidates:
        with gen.builder.at(Block()):
            if constant_of_type(gen, a, candidate) is not None and constant_of_type(gen, b, candidate) is not None:
                return candidate
    return None


def dtype_hint(type: Type) -> str:
    dtype = scalar_dtype(type)
    return f"tessera.{dtype.name}" if dtype is not None else "..."


def describe_side(value: Any) -> str:
    return str(value.type) if isinstance(value, Tensor) else describe(value)


def shown(value: Any) -> str:
    """A traced value's type, or a Python value's repr."""
    return str(value.type) if isinstance(value, Tensor) else repr(value)


# ---------------------------------------------------------------------------
# if/else merges


def unify_branches(gen: "Tracer", name: str, a: Any, b: Any, blocks: tuple[Block, Block],
                   line: int | None) -> tuple[Tensor, Tensor]:
    """Traced values of one type for a variable that differs between the branches of a runtime `if`."""
    where = f"the `if` at line {line}" if line else "this `if`"
    if any(isinstance(v, Tensor) and v.is_shared for v in (a, b)):
        gen.error(f"'{hint_of(name)}' is {describe_side(a)} in the then branch but {describe_side(b)} in the else "
                  f"branch of {where}; a shared buffer cannot depend on a runtime condition: pick the slot number "
                  f"in the branches and index after them (buf[s])", LoopCarriedTypeError)
    if not (isinstance(a, Tensor) or is_number(a)) or not (isinstance(b, Tensor) or is_number(b)):
        gen.error(f"'{hint_of(name)}' is {describe_side(a)} in the then branch but {describe_side(b)} in the else "
                  f"branch of {where}; compile-time values cannot depend on a runtime condition (give it a traced "
                  f"value in both branches, or decide it with a constexpr condition)", ConstexprError)
    if is_number(a) and is_number(b):
        target = common_number_type(gen, a, b)
        if target is None:
            gen.error(f"'{hint_of(name)}' is {a!r} in the then branch and {b!r} in the else branch of {where}, "
                      f"and no one type holds both", LoopCarriedTypeError)
    else:
        target = widest([v.type for v in (a, b) if isinstance(v, Tensor)])
    results = []
    for value, block, side in ((a, blocks[0], "then"), (b, blocks[1], "else")):
        with gen.builder.at(block):
            converted = fit(gen, value, target) if isinstance(value, Tensor) else constant_of_type(gen, value, target)
        if converted is None and isinstance(value, Tensor):
            other = b if side == "then" else a
            gen.error(f"'{hint_of(name)}' is {shown(a)} in the then branch but {shown(b)} in the else branch of "
                      f"{where}; both branches must give it the same type: {advice(value.type, other.type)}",
                      LoopCarriedTypeError)
        if converted is None:
            gen.error(f"'{hint_of(name)}' is the Python value {value!r} in the {side} branch of {where} but {target} "
                      f"in the other, and {value!r} is not exactly a {target}; assign a value of that type",
                      LoopCarriedTypeError)
        results.append(converted)
    return results[0], results[1]


def return_value_placeholders(gen: "Tracer", a: Any, b: Any, blocks: tuple[Block, Block]) -> tuple[Any, Any]:
    """A helper's RETURN_VALUE set in one branch of an `if` only: the other branch, which has not returned,
    gets a stand-in of the same type (zeros, or the same Python value), never read since that path returns
    later or the helper's end reports it."""
    if (a is MISSING) == (b is MISSING):
        return a, b
    value, missing = (a, 1) if b is MISSING else (b, 0)
    if isinstance(value, Tensor):
        with gen.builder.at(blocks[missing]):
            stand_in = constant_of_type(gen, False if value.dtype.is_bool else 0, value.type)
    else:
        stand_in = value
    return (stand_in, value) if missing == 0 else (value, stand_in)


def widest(types: list[Type]) -> Type:
    """The tile type when a scalar meets a tile of its element type (the scalar is splat), else the first."""
    tiles = [t for t in types if isinstance(t, TileType)]
    return tiles[0] if tiles and all(t == tiles[0] or t == tiles[0].element for t in types) else types[0]


def fit(gen: "Tracer", value: Tensor, type: Type) -> Tensor | None:
    """`value` as `type`: itself, or a scalar splat to a tile of its type; None if it does not fit."""
    if value.type == type:
        return value
    if isinstance(type, TileType) and value.type == type.element:
        return Tensor(gen.builder.create("splat", [value.value], result_types=[type]).result)
    return None


def advice(have: Type, want: Type) -> str:
    """How to make a value of type `have` agree with `want`."""
    if dtypes_differ(have, want):
        return f"convert with `.to({dtype_hint(want)})`"
    if shape_of(have) != shape_of(want):
        return f"the shapes differ ({shape_of(have)} vs {shape_of(want)}); use tessera.broadcast_to or reshape"
    return "assign values of one type"


# ---------------------------------------------------------------------------
# Loop-carried variables


def dtypes_differ(a: Type, b: Type) -> bool:
    return scalar_dtype(a) is not None and scalar_dtype(b) is not None and scalar_dtype(a) != scalar_dtype(b)


def loop_advice(name: str, before: Type, after: Type) -> str:
    """How to keep a loop-carried variable's type."""
    if dtypes_differ(before, after):
        return (f"convert it before the loop (`{name} = {name}.to({dtype_hint(after)})`) or inside the body "
                f"(`.to({dtype_hint(before)})`)")
    return advice(after, before)


class Carried:
    """The variables a runtime loop threads through its body, and their current types.

    Tracing the body may show that the first guess was wrong; `yields` then
    returns None and `retrace` prepares the next attempt:

    * a Python-number start (or a scalar) that the body turns into another
      type starts with that type instead;
    * a compile-time value (a string, a view's block, ...) that the body
      replaces is demoted to a per-iteration local: the next attempt traces
      the body with it unbound, so reading it before assigning it is an
      error, and it is not defined after the loop.
    """

    def __init__(self, gen: "Tracer", body: list[ast.stmt], exclude: tuple[str, ...] = ()):
        self.gen = gen
        self.parent = gen.builder.block
        variables = gen.frame.variables
        self.names: list[str] = []
        self.start: list[Any] = []            # what each variable held before the loop
        self.frozen: dict[str, Any] = {}      # compile-time values the body must leave alone
        self.fresh: dict[str, Any] = {}       # compile-time values the body replaces: per-iteration locals
        self.pending: dict[str, Type | None] = {}   # for the next attempt: name -> new type (None: demote)
        for name in assigned_names(body):
            value = variables.get(name, MISSING)
            if name in exclude or isinstance(value, Unbound):
                continue
            if isinstance(value, Tensor) and value.is_shared:
                gen.error(f"'{hint_of(name)}' holds the shared buffer {value.type} before the loop and the loop "
                          f"assigns it again; a shared buffer cannot be carried from one iteration to the next: "
                          f"carry the slot number instead and index inside the loop (buf[s])", LoopCarriedTypeError)
            if isinstance(value, Tensor) or is_number(value):
                self.names.append(name)
                self.start.append(value)
            else:
                self.frozen[name] = value
        self.inits = [v if isinstance(v, Tensor) else operators.to_tensor(gen.ctx, v) for v in self.start]

    @property
    def types(self) -> list[Type]:
        return [t.type for t in self.inits]

    @property
    def hints(self) -> list[str]:
        return [hint_of(n) for n in self.names]

    def bind(self, variables: dict[str, Any], args: list, line: int | None) -> None:
        """Set up a body's (or condition's) variables: the carried ones are `args`."""
        for name, arg in zip(self.names, args):
            variables[name] = Tensor(arg)
        for name, value in self.fresh.items():
            variables[name] = Unbound(
                f"holds {describe(value)} before the loop at line {line}, and the loop assigns it another "
                f"compile-time value; compile-time values cannot change from one iteration of a runtime loop to "
                f"the next: make it a traced value before the loop, or unroll with tessera.static_range",
                ConstexprError)

    def yields(self, after: dict[str, Any], block: Block, line: int | None) -> list[Tensor] | None:
        """The body's values to yield (converted into `block`), or None when the loop must be traced again."""
        gen, out = self.gen, []
        where = f"the loop at line {line}" if line else "this loop"
        for i, name in enumerate(self.names):
            value, want, start = after.get(name, MISSING), self.inits[i].type, self.start[i]
            if isinstance(value, Unbound):
                gen.error(f"'{hint_of(name)}' is defined before {where} but not at the end of its body "
                          f"(it {value.reason}); give it a value on every path through the body")
            with gen.builder.at(block):
                converted = fit(gen, value, want) if isinstance(value, Tensor) else constant_of_type(gen, value, want)
            if converted is not None:
                out.append(converted)
                continue
            if not isinstance(value, Tensor) and not is_number(value):
                self.pending[name] = None       # replaced by a compile-time value: a per-iteration local
                continue
            new_type = value.type if isinstance(value, Tensor) else default_type(gen, value)
            if not isinstance(start, Tensor) or widest([start.type, new_type]) == new_type != start.type:
                self.pending[name] = new_type   # a Python number, or a scalar the body turns into a tile
                continue
            assigned = gen.frame.assigned_at.get(name)
            at_line = f" (assigned at line {assigned})" if assigned else ""
            gen.error(f"'{hint_of(name)}' is {want} before {where} but {new_type} at the end of its body{at_line}; "
                      f"a loop-carried variable must keep its type: {loop_advice(hint_of(name), want, new_type)}",
                      LoopCarriedTypeError)
        for name, value in self.frozen.items():
            if not same_value(after.get(name, MISSING), value):
                self.pending[name] = None
        return None if self.pending else out

    def retrace(self, line: int | None) -> None:
        """Apply what the last attempt learned (see the class docstring) before tracing the loop again."""
        gen, pending = self.gen, self.pending
        self.pending = {}
        for name in [n for n, t in pending.items() if t is None]:
            if name in self.frozen:
                self.fresh[name] = self.frozen.pop(name)
                continue
            i = self.names.index(name)
            self.forget_init(i)
            self.fresh[name] = self.start[i]
            del self.names[i], self.start[i], self.inits[i]
        for name, new_type in pending.items():
            if new_type is None:
                continue
            i = self.names.index(name)
            start = self.start[i]
            self.forget_init(i)
            with gen.builder.at(self.parent):
                converted = fit(gen, start, new_type) if isinstance(start, Tensor) else \
                    constant_of_type(gen, start, new_type)
            if converted is None:
                gen.error(f"'{hint_of(name)}' starts as the Python value {start!r} but becomes {new_type} in the "
                          f"loop at line {line}; start it with a value of that type", LoopCarriedTypeError)
            self.inits[i] = converted

    def forget_init(self, i: int) -> None:
        """Drop the constant materialized for a Python-number start (unused once the loop is traced again)."""
        if isinstance(self.start[i], Tensor):
            return
        op = self.inits[i].value.owner
        if op in self.parent.ops and op.name == "constant":
            self.parent.ops.remove(op)

    def leave(self, before: dict[str, Any], after_body: dict[str, Any], results: list, line: int | None,
              loop_only: tuple[str, ...] = ()) -> dict[str, Any]:
        """The variables after the loop: carried ones are the loop's results; names the body introduced are unbound."""
        after = dict(before)
        for name, value in after_body.items():
            if name.startswith(".") or name in self.names or name in self.frozen:
                continue
            if name in loop_only:
                after[name] = Unbound(f"is the loop variable of the `for` at line {line}; it is only defined "
                                      f"inside the loop")
            elif name in self.fresh:
                after[name] = Unbound(f"is assigned a compile-time value inside the loop at line {line}, which "
                                      f"differs from iteration to iteration, so it is not defined after the loop")
            elif name not in before or not same_value(before[name], value):
                after[name] = Unbound(f"is first assigned inside the loop at line {line}, so it is not defined "
                                      f"after the loop; assign it before the loop to carry it through")
        for name, result in zip(self.names, results):
            after[name] = Tensor(result)
        return after
