"""if / for / while: compile-time control flow runs in Python, runtime control flow becomes IR regions.

* `if C:` with a compile-time C traces only the taken branch. With a traced
  C it emits an IR `if` whose results are the variables the branches set
  (see `carried.py` for the merge rules).
* `for x in tessera.static_range(...)` or over a compile-time tuple is
  unrolled: the body is traced once per element.
* `for i in range(a, b, c)` emits an IR `for` (bounds i32, or i64 when a
  traced bound is i64) carrying the variables the body assigns; a body with
  `break` becomes an IR `while` instead (see `loop_exits.py`).
* `for i in tessera.pipeline(a, b, c, stages=S)` is the same loop with
  `stages = S` on the IR `for` (S a compile-time int >= 1; a pipelined loop
  cannot `break`): the lowering may software-pipeline its copies S deep;
  `stages = 1` says "plain", where a `range` loop, with no `stages`, is
  pipelined by the compiler when it feeds a dot and may be
  (`passes/schedule/auto_pipeline.py`);
  `warp_specialize=True` adds `warp_specialize = true` (a producer
  warpgroup fills the ring on sm_90/sm_90a), and `pingpong=True` with it
  `pingpong = true` (two consumer warpgroups take turns at the tensor cores).
* `while C:` emits an IR `while` whose condition region evaluates C again
  with the carried values. A compile-time false C emits nothing.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any, Callable

from ..ir import dtypes as dt
from ..ir.core import Block
from ..ir.types import ScalarType
from . import loop_exits, operators
from .carried import MISSING, Carried, return_value_placeholders, same_value, trace_region, unify_branches
from .errors import CompileError, ConstexprError, TypeMismatchError, UnsupportedSyntaxError
from .scope import RETURN_VALUE, Unbound, describe, hint_of
from .values import Tensor, pipeline, static_range

if TYPE_CHECKING:
    from .tracer import Tracer

MAX_LOOP_TRACES = 8     # attempts at tracing a loop while its carried variables settle (see Carried)


# ---------------------------------------------------------------------------
# if


def lower_if(gen: "Tracer", node: ast.If) -> None:
    condition = gen.visit(node.test)
    if not isinstance(condition, Tensor):
        gen.visit_block(node.body if condition else node.orelse)
        return
    predicate = operators.truth(gen.ctx, condition)
    runtime_if(gen, predicate, lambda: gen.visit_block(node.body), lambda: gen.visit_block(node.orelse))


def runtime_if(gen: "Tracer", predicate: Tensor, then: Callable[[], None], orelse: Callable[[], None]) -> None:
    """Emit an IR `if` on the bool scalar `predicate`; variables the branches change become its results."""
    line = gen.line()
    before = gen.frame.variables
    blocks = Block(), Block()
    then_vars, else_vars = dict(before), dict(before)
    trace_region(gen, blocks[0], then_vars, then)
    trace_region(gen, blocks[1], else_vars, orelse)
    after: dict[str, Any] = {}
    names, then_values, else_values = [], [], []
    for name in dict.fromkeys([*then_vars, *else_vars]):
        a, b = then_vars.get(name, MISSING), else_vars.get(name, MISSING)
        if name == RETURN_VALUE:
            a, b = return_value_placeholders(gen, a, b, blocks)
        if same_value(a, b):
            after[name] = a
        elif isinstance(a, Unbound) or isinstance(b, Unbound):
            after[name] = a if isinstance(a, Unbound) and isinstance(b, Unbound) else Unbound(
                f"is only assigned in one branch of the `if` at line {line}, so it is not defined after it; "
                f"assign it before the `if` or in both branches")
        else:
            x, y = unify_branches(gen, name, a, b, blocks, line)
            names.append(name)
            then_values.append(x)
            else_values.append(y)
    for block, values in zip(blocks, (then_values, else_values)):
        with gen.builder.at(block):
            gen.builder.create("yield", [v.value for v in values])
    op = gen.builder.create("if", [predicate.value], result_types=[v.type for v in then_values],
                            regions=list(blocks), result_names=[hint_of(n) for n in names])
    for name, result in zip(names, op.results):
        after[name] = Tensor(result)
    gen.frame.rebind(after)


# ---------------------------------------------------------------------------
# for


def lower_for(gen: "Tracer", node: ast.For) -> None:
    if node.orelse:
        gen.error("`for ... else` is not supported in kernels; use a flag variable", UnsupportedSyntaxError)
    iterable = node.iter
    func = gen.visit(iterable.func) if isinstance(iterable, ast.Call) else None
    if func is range or func is pipeline:
        stages, specialize, pingpong = pipeline_options(gen, iterable) if func is pipeline else (None, False, False)
        bounds = range_bounds(gen, iterable, "tessera.pipeline" if func is pipeline else "range")
        if not isinstance(node.target, ast.Name):
            gen.at(node.target).error("the variable of a runtime `for` loop must be a single name",
                                      UnsupportedSyntaxError)
        if loop_exits.has_exit(node.body, ast.Break) or loop_exits.has_return(node.body):
            if func is pipeline:
                gen.error("a tessera.pipeline loop cannot `break` or `return` (its copies run ahead of the "
                          "iterations); loop over range(...) instead", UnsupportedSyntaxError)
            loop_exits.lower_for_with_break(gen, node, *bounds)
        else:
            runtime_for(gen, node, *bounds, stages=stages, warp_specialize=specialize, pingpong=pingpong)
        loop_exits.after_loop(gen)
        return
    values = gen.visit(iterable)
    if isinstance(values, static_range):
        values = tuple(values)
    if not isinstance(values, tuple):
        gen.at(iterable).error(f"cannot loop over {describe(values)}; loop over range(...), "
                               f"tessera.static_range(...) or a compile-time tuple")
    unroll(gen, node, values)
    loop_exits.after_loop(gen)


def pipeline_options(gen: "Tracer", call: ast.Call) -> tuple[int, bool, bool]:
    """The `stages=` (a compile-time int >= 1, default 2), `warp_specialize=` (a compile-time bool, default
    False; it needs stages >= 2) and `pingpong=` (a compile-time bool, default False: with
    warp_specialize=True two consumer warpgroups take turns (sm_90a); without it, on AMD, two groups of waves
    run one phase apart (`passes/wave_pingpong.py`)) of `tessera.pipeline(...)`."""
    options = {"stages": 2, "warp_specialize": False, "pingpong": False}
    for keyword in call.keywords:
        if keyword.arg not in options:
            gen.at(keyword.value if keyword.arg is None else keyword).error(
                "tessera.pipeline() takes start/stop/step positionally and only the keywords `stages`, "
                "`warp_specialize` and `pingpong`: tessera.pipeline(start, stop, step, stages=3, "
                "warp_specialize=True)")
        value = gen.visit(keyword.value)
        name = f"tessera.pipeline({keyword.arg}=...)"
        if isinstance(value, Tensor):
            kind = "int" if keyword.arg == "stages" else "bool"
            gen.at(keyword.value).error(f"{name} must be a compile-time {kind}; make it a tessera.constexpr "
                                        "parameter or a literal", ConstexprError)
        if keyword.arg == "stages" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            gen.at(keyword.value).error(f"{name} must be an int >= 1 (1: no pipelining), got {value!r}")
        if keyword.arg in ("warp_specialize", "pingpong") and not isinstance(value, bool):
            gen.at(keyword.value).error(f"{name} must be True or False, got {value!r}")
        options[keyword.arg] = value
    if options["warp_specialize"] and options["stages"] < 2:
        gen.at(call).error("tessera.pipeline(warp_specialize=True) needs a ring of stages >= 2 slots; "
                           "pass stages=2 or more")
    return options["stages"], options["warp_specialize"], options["pingpong"]


def range_bounds(gen: "Tracer", call: ast.Call, name: str = "range") -> tuple[Tensor, Tensor, Tensor]:
    """range(...)'s (start, stop, step) as integer scalars of one type: i32, or i64 if a traced bound is 64-bit
    (or u32), or a compile-time bound does not fit in i32."""
    keywords = [k for k in call.keywords
                if not (name == "tessera.pipeline" and k.arg in ("stages", "warp_specialize", "pingpong"))]
    if keywords or not 1 <= len(call.args) <= 3 or any(isinstance(a, ast.Starred) for a in call.args):
        gen.at(call).error(f"{name}() takes 1 to 3 positional arguments: {name}(stop), {name}(start, stop) "
                           f"or {name}(start, stop, step)")
    values = [gen.visit(a) for a in call.args]
    for node, value in zip(call.args, values):
        ok = isinstance(value, int) and not isinstance(value, bool) or (
            isinstance(value, Tensor) and not value.is_tile and value.dtype is not None and value.dtype.is_int)
        if not ok:
            gen.at(node).error(f"{name}() bounds must be integers (compile-time or scalar), got {describe(value)}",
                               TypeMismatchError)
    if len(values) == 3 and not isinstance(values[2], Tensor) and values[2] == 0:
        gen.at(call.args[2]).error(f"{name}() step must not be zero")
    start, stop, step = ([0, values[0], 1] if len(values) == 1 else
                         [*values, 1] if len(values) == 2 else values)
    wide = any(isinstance(v, Tensor) and needs_i64(v.dtype) for v in (start, stop, step)) or any(
        isinstance(v, int) and not dt.i32.min_value <= v <= dt.i32.max_value for v in (start, stop, step))
    index = ScalarType(dt.i64 if wide else dt.i32)
    return tuple(as_index(gen, v, index) for v in (start, stop, step))


def needs_i64(dtype: dt.DType) -> bool:
    """i64 and the unsigned types whose values i32 cannot hold."""
    return dtype.bits == 64 or (not dtype.is_signed and dtype.bits == 32)


def as_index(gen: "Tracer", value: Any, index: ScalarType) -> Tensor:
    if isinstance(value, Tensor):
        return value if value.type == index else operators.cast(gen.ctx, value, index.dtype)
    return Tensor(gen.builder.create("constant", attrs={"value": value}, result_types=[index]).result)


def runtime_for(gen: "Tracer", node: ast.For, start: Tensor, stop: Tensor, step: Tensor,
                stages: int | None = None, warp_specialize: bool = False, pingpong: bool = False) -> None:
    target, line = node.target.id, gen.line()
    before = gen.frame.variables
    carried = Carried(gen, node.body, exclude=(target,))
    for _ in range(MAX_LOOP_TRACES):
        body = Block([start.type, *carried.types], [target, *carried.hints])
        variables = loop_exits.start_iteration(dict(before))
        variables[target] = Tensor(body.args[0])
        carried.bind(variables, body.args[1:], line)
        trace_region(gen, body, variables, lambda: gen.visit_block(node.body))
        yields = carried.yields(variables, body, line)
        if yields is None:
            carried.retrace(line)
            continue
        with gen.builder.at(body):
            gen.builder.create("yield", [v.value for v in yields])
        op = gen.builder.create("for", [start.value, stop.value, step.value, *(t.value for t in carried.inits)],
                                attrs=_loop_attrs(stages, warp_specialize, pingpong),
                                result_types=carried.types, regions=[body], result_names=carried.hints)
        gen.frame.rebind(carried.leave(before, variables, op.results, line, loop_only=(target,)))
        return
    unsettled(gen, carried)


def _loop_attrs(stages: int | None, warp_specialize: bool, pingpong: bool = False) -> dict | None:
    """The IR `for`'s attributes: `stages` when given by tessera.pipeline (1: kept plain; None, a `range`
    loop: the compiler's choice), `warp_specialize = true` and `pingpong = true` when asked for."""
    attrs = ({"stages": stages} if stages is not None else {}) | ({"warp_specialize": True} if warp_specialize else {})
    return (attrs | ({"pingpong": True} if pingpong else {})) or None


def unsettled(gen: "Tracer", carried: Carried) -> None:
    gen.error(f"the types of the loop-carried variables ({', '.join(carried.hints)}) keep changing from one "
              f"iteration to the next; give them their final types before the loop", CompileError)


def unroll(gen: "Tracer", node: ast.For, values: tuple) -> None:
    """Trace the body once per compile-time value; break/continue follow Python (see loop_exits)."""
    with loop_exits.unrolled_loop(gen):
        for value in values:
            if not loop_exits.begin_unrolled_iteration(gen):
                break
            gen.bind_target(node.target, value)
            gen.visit_block(node.body)


# ---------------------------------------------------------------------------
# while


def lower_while(gen: "Tracer", node: ast.While) -> None:
    if node.orelse:
        gen.error("`while ... else` is not supported in kernels; use a flag variable", UnsupportedSyntaxError)
    exits = loop_exits.has_exit(node.body, ast.Break) or loop_exits.has_return(node.body)
    flags = loop_exits.exit_flags(node.body) if exits else {}
    line, before = gen.line(), gen.frame.variables
    parent, mark = gen.builder.block, len(gen.builder.block.ops)
    carried = Carried(gen, node.body)
    for _ in range(MAX_LOOP_TRACES):
        types = [*[ScalarType(dt.bool_)] * len(flags), *carried.types]
        hints = [*flags.values(), *carried.hints]
        condition_block, body = Block(types, hints), Block(types, hints)
        variables = dict(before)
        carried.bind(variables, condition_block.args[len(flags):], line)
        keep_going = trace_region(gen, condition_block, variables,
                                  lambda: while_condition(gen, node, condition_block.args[:len(flags)]))
        if keep_going is None:     # compile-time false: the loop never runs
            del parent.ops[mark:]
            return
        variables = loop_exits.start_iteration(dict(before))
        carried.bind(variables, body.args[len(flags):], line)
        trace_region(gen, body, variables, lambda: gen.visit_block(node.body))
        yields = carried.yields(variables, body, line)
        if yields is None:
            carried.retrace(line)
            continue
        with gen.builder.at(condition_block):
            gen.builder.create("condition", [keep_going.value, *condition_block.args], result_types=[])
        with gen.builder.at(body):
            lead = [loop_exits.flag_tensor(gen, variables[flag]) for flag in flags]
            gen.builder.create("yield", [v.value for v in [*lead, *yields]])
        inits = [*[loop_exits.constant_flag(gen, False)] * len(flags), *carried.inits]
        op = gen.builder.create("while", [t.value for t in inits], result_types=types,
                                regions=[condition_block, body], result_names=hints)
        after = carried.leave(before, variables, op.results[len(flags):], line)
        gen.frame.rebind(loop_exits.leave_exits(after, flags, op.results))
        loop_exits.after_loop(gen)
        return
    unsettled(gen, carried)


def while_condition(gen: "Tracer", node: ast.While, lead: list) -> Tensor | None:
    """The condition region's `keep going` flag; None when the condition is compile-time false. `lead` holds
    the loop's exit flags (`broke` first) when its body can break or return."""
    has_break = bool(lead)
    if not has_break:
        condition = gen.visit(node.test)
        if isinstance(condition, Tensor):
            return operators.truth(gen.ctx, condition)
        if condition:
            with gen.located(node.test):
                gen.error("this `while` loop never ends: its condition is always true at compile time and "
                          "its body has no `break`", ConstexprError)
        return None
    # `not broke and cond`, evaluating cond only while not broke
    not_broke = Tensor(gen.builder.create("not", [lead[0]]).result)
    then = Block()
    with gen.builder.at(then):
        condition = gen.visit(node.test)
    if not isinstance(condition, Tensor):
        return not_broke if condition else None
    with gen.builder.at(then):
        truth = operators.truth(gen.ctx, condition)
        gen.builder.create("yield", [truth.value])
    otherwise = Block()
    with gen.builder.at(otherwise):
        gen.builder.create("yield", [loop_exits.constant_flag(gen, False).value])
    op = gen.builder.create("if", [not_broke.value], result_types=[truth.type], regions=[then, otherwise],
                            result_names=["keep_going"])
    return Tensor(op.result)
