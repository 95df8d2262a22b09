"""break, continue and return in structured IR: flags and guards instead of jumps.

Tile IR has no jumps: an `if` runs one region, a loop runs its whole body.
Early exits are traced as flags, pseudo-variables of the frame (`scope.py`):

1. Each loop iteration starts with `broke = continued = False`. `break`
   sets `broke = True`, `continue` sets `continued = True`, `return` sets
   `returned = True` (and, inside a loop, `broke = True` as well: a return
   leaves every enclosing loop).
2. A statement list stops at a flag that is True at compile time: what
   follows is dead. This alone gives break/continue/return under a
   constexpr `if`, and in unrolled loops, their Python meaning.
3. Set inside a runtime `if`, a flag becomes one of the `if`'s results (a
   traced bool). The statements after it are then wrapped in
   `if not (broke or continued or returned): ...`, so they run only on the
   paths that did not exit.
4. `continue` needs nothing more: the flag is reset for the next iteration.
   A runtime `for` whose body has a `break` (or a `return`, at any depth)
   becomes an IR `while` that carries the induction variable and `broke`
   and stops when either says so:

       for i in range(lb, ub, st):              i, broke, x = lb, False, x0
           x = f(x)                             while i < ub and not broke:   # i > ub when st < 0
           if x > t:                                x = f(x)
               break               ==>              broke = x > t      # an `if` yielding True / False
           x = g(x)                                 if not broke:
                                                        x = g(x)
                                                    i = i + st

   A `while` loop with a `break` carries `broke` the same way; its
   condition region evaluates the user's condition only while not broke.
   A loop holding a `return` also carries `returned` out, and after it an
   enclosing loop's `broke` is set to `returned`, so the return leaves
   that loop too. An unrolled loop stops unrolling at a compile-time break
   and guards the remaining iterations with `if not broke` after a runtime one.
5. A helper's `return value` inside runtime control flow stores the value
   in the pseudo-variable `RETURN_VALUE`, merged across branches like any
   variable; the helper's result is its value at the end.
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
from .errors import UnsupportedSyntaxError
from .scope import BROKE, CONTINUED, EXIT_FLAGS, RETURN_VALUE, RETURNED
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


def has_return(stmts: list[ast.stmt]) -> bool:
    """Whether `stmts` hold a `return`, nested loops and ifs included."""
    return any(isinstance(node, ast.Return) for stmt in stmts for node in ast.walk(stmt))


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
    """`broke or continued or returned` when any is a traced bool, else None."""
    flags = [gen.frame.variables.get(f) for f in EXIT_FLAGS]
    flags = [f for f in flags if isinstance(f, Tensor)]
    if not flags:
        return None
    result = flags[0]
    for flag in flags[1:]:
        result = Tensor(gen.builder.create("or", [result.value, flag.value]).result)
    return result


def guard(gen: "Tracer", exiting: Tensor, rest: list[ast.stmt]) -> None:
    """`if not exiting: rest` (the else branch keeps every variable as it is, but a lone traced `returned`
    is known true there, so that a helper whose every path returns is seen to)."""
    traced = [flag for flag in EXIT_FLAGS if isinstance(gen.frame.variables.get(flag), Tensor)]
    with gen.located(rest[0]):
        keep_going = Tensor(gen.builder.create("not", [exiting.value]).result)

        def then() -> None:
            for flag in traced:                  # known false on this path
                gen.frame.variables[flag] = False
            trace_statements(gen, rest)

        def orelse() -> None:
            if traced == [RETURNED]:
                gen.frame.variables[RETURNED] = True

        control_flow.runtime_if(gen, keep_going, then, orelse)


def visit_return(gen: "Tracer", node: ast.Return) -> None:
    """`return`: set `returned` (and `broke`, inside a loop); a helper's value is kept for its caller."""
    frame = gen.frame
    value = None if node.value is None else gen.visit(node.value)
    if frame.is_kernel and value is not None:
        gen.error("kernels cannot return values; store results through a pointer or view argument",
                  UnsupportedSyntaxError)
    if not frame.is_kernel:
        if frame.region_depth == 0:
            frame.return_value = value
        else:
            _runtime_return_value(gen, value)
    frame.variables[RETURNED] = True
    if BROKE in frame.variables:        # inside a loop: leave it (after_loop leaves the enclosing ones)
        frame.variables[BROKE] = True


def _runtime_return_value(gen: "Tracer", value: Any) -> None:
    """A helper's `return value` under runtime control flow: the value goes into RETURN_VALUE."""
    frame = gen.frame
    where = f"helper '{frame.source.name}'"
    if value is not None and BROKE in frame.variables:
        gen.error(f"`return` with a value inside a runtime loop of {where} is not supported; `break` out of the "
                  f"loop with the value in a variable and return it after the loop", UnsupportedSyntaxError)
    if isinstance(value, tuple) or (isinstance(value, Tensor) and value.dtype is None):
        gen.error(f"`return` of {'a tuple' if isinstance(value, tuple) else value.type} inside a runtime `if` of "
                  f"{where} is not supported (only numbers and tiles of numbers merge across branches); assign "
                  f"the values in the branches and return them after the `if`", UnsupportedSyntaxError)
    frame.variables[RETURN_VALUE] = value


def after_loop(gen: "Tracer") -> None:
    """A `return` inside a loop that just ended leaves the enclosing loop too."""
    variables = gen.frame.variables
    if BROKE in variables and variables[RETURNED] is not False:
        variables[BROKE] = variables[RETURNED]


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
    flags = exit_flags(node.body)
    for _ in range(control_flow.MAX_LOOP_TRACES):
        types, hints = [index, *[BOOL] * len(flags), *carried.types], [target, *flags.values(), *carried.hints]
        condition_block, body = Block(types, hints), Block(types, hints)
        with gen.builder.at(condition_block):
            iv, broke = condition_block.args[:2]
            in_range = in_range_condition(gen, iv, stop, step)
            not_broke = gen.builder.create("not", [broke]).result
            keep_going = gen.builder.create("and", [in_range, not_broke]).result
            gen.builder.create("condition", [keep_going, *condition_block.args], result_types=[])
        variables = start_iteration(dict(before))
        variables[target] = Tensor(body.args[0])
        carried.bind(variables, body.args[1 + len(flags):], line)
        trace_region(gen, body, variables, lambda: gen.visit_block(node.body))
        yields = carried.yields(variables, body, line)
        if yields is None:
            carried.retrace(line)
            continue
        with gen.builder.at(body):
            next_iv = gen.builder.create("add", [body.args[0], step.value]).result
            exits = [flag_tensor(gen, variables[flag]) for flag in flags]
            gen.builder.create("yield", [next_iv, *(t.value for t in exits), *(v.value for v in yields)])
        inits = [start, *[constant_flag(gen, False)] * len(flags), *carried.inits]
        op = gen.builder.create("while", [t.value for t in inits], result_types=types,
                                regions=[condition_block, body], result_names=hints)
        after = carried.leave(before, variables, op.results[1 + len(flags):], line, loop_only=(target,))
        gen.frame.rebind(leave_exits(after, flags, op.results[1:]))
        return
    control_flow.unsettled(gen, carried)


def exit_flags(body: list[ast.stmt]) -> dict[str, str]:
    """The flags a loop with early exits carries (flag -> IR name): `broke`, and `returned` when its body
    holds a `return`."""
    return {BROKE: "broke", **({RETURNED: "returned"} if has_return(body) else {})}


def leave_exits(after: dict[str, Any], flags: dict[str, str], results: list) -> dict[str, Any]:
    """The variables after a loop with early exits: `returned` is the loop's result for it."""
    if RETURNED in flags:
        after[RETURNED] = Tensor(results[list(flags).index(RETURNED)])
    return after


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

