"""break, continue and return in structured IR: flags and guards instead of jumps.

Tile IR has no jumps: an `if` runs one region, a loop runs its whole body.
Early exits are traced as flags, pseudo-variables of the frame (`scope.py`):

1. Each loop iteration starts with `broke = continued = False`. `break`
   sets `broke = True`, `continue` sets `continued = True`, `return` sets
   `returned = True` (returns are only allowed outside runtime control flow).
2. A statement list stops at a flag that is True at compile time: what
   follows is dead. This alone gives break/continue/return under a
   constexpr `if`, and in unrolled loops, their Python meaning.
3. Set inside a runtime `if`, a flag becomes one of the `if`'s results (a
   traced bool). The statements after it are then wrapped in
   `if not (broke or continued): ...`, so they run only on the paths that
   did not exit.
4. `continue` needs nothing more: the flag is reset for the next iteration.
   A runtime `for` whose body has a `break` becomes an IR `while` that
   carries the induction variable and `broke` and stops when either says so:

       for i in range(lb, ub, st):              i, broke, x = lb, False, x0
           x = f(x)                             while i < ub and not broke:   # i > ub when st < 0
           if x > t:                                x = f(x)
               break               ==>              broke = x > t      # an `if` yielding True / False
           x = g(x)                                 if not broke:
                                                        x = g(x)
                                                    i = i + st

   A `while` loop with a `break` carries `broke` the same way; its
   condition region evaluates the user's condition only while not broke.
   An unrolled loop stops unrolling at a compile-time break and guards the
   remaining iterations with `if not broke` after a runtime one.
"""

from __future__ import annotations

import ast
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from ..ir import dtypes as dt
from ..ir.core import Block
from ..ir.types import ScalarType
from . import control_flow
from .carried import Carried, trace_region
from .scope import BROKE, CONTINUED, EXIT_FLAGS
from .values import Tensor

if TYPE_CHECKING:
    from .tracer import Tracer

BOOL = ScalarType(dt.bool_)


def has_exit(stmts: list[ast.stmt], kind: type[ast.stmt]) -> bool:
    """Whether `stmts` hold a `break` (or `continue`) of the loop they are the body of (not of nested loops)."""
    for stmt in stmts:
        if isinstance(stmt, kind):
            return True
        if isinstance(stmt, (ast.For, ast.While, ast.AsyncFor)):
            if has_exit(stmt.orelse, kind):
                return True
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            if has_exit(getattr(stmt, field, None) or [], kind):
                return True
    return False


def trace_statements(gen: "Tracer", stmts: list[ast.stmt]) -> None:
    """Trace `stmts`, stopping at a compile-time exit and guarding what follows a runtime one."""
    for index, stmt in enumerate(stmts):
        variables = gen.frame.variables
        if any(variables.get(flag) is True for flag in EXIT_FLAGS):
            return
        exiting = runtime_exit(gen)
        if exiting is not None:
            guard(gen, exiting, stmts[index:])
            return
        gen.visit(stmt)


def runtime_exit(gen: "Tracer") -> Tensor | None:
    """`broke or continued` when either is a traced bool, else None."""
    flags = [gen.frame.variables.get(f) for f in (BROKE, CONTINUED)]
    flags = [f for f in flags if isinstance(f, Tensor)]
    if not flags:
        return None
    result = flags[0]
    for flag in flags[1:]:
        result = Tensor(gen.builder.create("or", [result.value, flag.value]).result)
    return result


def guard(gen: "Tracer", exiting: Tensor, rest: list[ast.stmt]) -> None:
    """`if not exiting: rest` (the else branch keeps every variable as it is)."""
    with gen.located(rest[0]):
        keep_going = Tensor(gen.builder.create("not", [exiting.value]).result)

        def then() -> None:
            for flag in (BROKE, CONTINUED):      # known false on this path
                if isinstance(gen.frame.variables.get(flag), Tensor):
                    gen.frame.variables[flag] = False
            trace_statements(gen, rest)

        control_flow.runtime_if(gen, keep_going, then, lambda: None)


def visit_break(gen: "Tracer") -> None:
    gen.frame.variables[BROKE] = True


def visit_continue(gen: "Tracer") -> None:
    gen.frame.variables[CONTINUED] = True


def start_iteration(variables: dict[str, Any]) -> dict[str, Any]:
    """`variables` with the flags of a fresh loop iteration."""
    variables[BROKE] = False
    variables[CONTINUED] = False
    return variables


def constant_flag(gen: "Tracer", value: bool) -> Tensor:
    return Tensor(gen.builder.create("constant", attrs={"value": value}, result_types=[BOOL]).result)


def flag_tensor(gen: "Tracer", flag: Any) -> Tensor:
    """A flag (Python bool or traced bool) as a traced bool."""
    return flag if isinstance(flag, Tensor) else constant_flag(gen, bool(flag))


# ---------------------------------------------------------------------------
# Unrolled loops


@contextmanager
def unrolled_loop(gen: "Tracer") -> Iterator[None]:
    """Give an unrolled loop its own break/continue flags, restoring the enclosing loop's afterwards."""
    saved = {f: gen.frame.variables[f] for f in (BROKE, CONTINUED) if f in gen.frame.variables}
    gen.frame.variables[BROKE] = False
    try:
        yield
    finally:
        for flag in (BROKE, CONTINUED):
            gen.frame.variables.pop(flag, None)
        gen.frame.variables.update(saved)


def begin_unrolled_iteration(gen: "Tracer") -> bool:
    """Reset `continued`; False when a compile-time break or return ended the loop."""
    variables = gen.frame.variables
    variables[CONTINUED] = False
    return not any(variables.get(f) is True for f in EXIT_FLAGS)


# ---------------------------------------------------------------------------
# for with break -> while


def lower_for_with_break(gen: "Tracer", node: ast.For, start: Tensor, stop: Tensor, step: Tensor) -> None:
    target, line = node.target.id, gen.line()
    before = gen.frame.variables
    carried = Carried(gen, node.body, exclude=(target,))
    index = start.type
    for _ in range(control_flow.MAX_LOOP_TRACES):
        types, hints = [index, BOOL, *carried.types], [target, "broke", *carried.hints]
        condition_block, body = Block(types, hints), Block(types, hints)
        with gen.builder.at(condition_block):
            iv, broke = condition_block.args[:2]
            in_range = in_range_condition(gen, iv, stop, step)
            not_broke = gen.builder.create("not", [broke]).result
            keep_going = gen.builder.create("and", [in_range, not_broke]).result
            gen.builder.create("condition", [keep_going, *condition_block.args], result_types=[])
        variables = start_iteration(dict(before))
        variables[target] = Tensor(body.args[0])
        carried.bind(variables, body.args[2:], line)
        trace_region(gen, body, variables, lambda: gen.visit_block(node.body))
        yields = carried.yields(variables, body, line)
        if yields is None:
            carried.retrace(line)
            continue
        with gen.builder.at(body):
            next_iv = gen.builder.create("add", [body.args[0], step.value]).result
            broke_out = flag_tensor(gen, variables[BROKE])
            gen.builder.create("yield", [next_iv, broke_out.value, *(v.value for v in yields)])
        inits = [start, constant_flag(gen, False), *carried.inits]
        op = gen.builder.create("while", [t.value for t in inits], result_types=types,
                                regions=[condition_block, body], result_names=hints)
        gen.frame.rebind(carried.leave(before, variables, op.results[2:], line, loop_only=(target,)))
        return
    control_flow.unsettled(gen, carried)


def in_range_condition(gen: "Tracer", iv: Any, stop: Tensor, step: Tensor) -> Any:
    """`iv < stop` for a positive step, `iv > stop` for a negative one (chosen at run time if step is traced)."""
    b = gen.builder
    step_op = step.value.owner
    if getattr(step_op, "name", None) == "constant":
        return b.create("cmp", [iv, stop.value], {"pred": "lt" if step_op.attrs["value"] > 0 else "gt"}).result
    zero = b.create("constant", attrs={"value": 0}, result_types=[step.type]).result
    positive = b.create("cmp", [step.value, zero], {"pred": "gt"}).result
    below = b.create("cmp", [iv, stop.value], {"pred": "lt"}).result
    above = b.create("cmp", [iv, stop.value], {"pred": "gt"}).result
    return b.create("select", [positive, below, above]).result

