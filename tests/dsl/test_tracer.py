"""The code generator as a specification: small kernels and the tile IR they trace to.

Kernels are module-level functions (so their source can be read), traced
with `build_kernel_ir(KernelSource.of(fn), params)`; the tests check the IR
structure (ops, result types, regions, name hints, locations). A few run
the IR in the CPU interpreter to pin down the meaning of break/continue.
"""

from __future__ import annotations

import inspect
import math
import re
import types

import numpy as np
import pytest

import tessera.dsl.language  # noqa: F401  (registers the builtins)
from tessera.dsl.tracer import build_kernel_ir
from tessera.dsl.function import func
from tessera.dsl.source import KernelSource
from tessera.dsl.specialization import ParamSpec
from tessera.dsl.values import BUILTINS, constexpr, static_range
from tessera.ir import dtypes as dt
from tessera.ir.core import Operation
from tessera.ir.printer import print_module
from tessera.ir.types import PointerType, ScalarType, TileType
from tessera.ir.verifier import verify_module

# The kernel language as kernels see it (what `import tessera` exports).
tl = types.ModuleType("tl")
tl.__dict__.update(BUILTINS)
tl.__dict__.update({d.name: d for d in dt.ALL_DTYPES})
tl.constexpr, tl.static_range, tl.func = constexpr, static_range, func

I32, I64, F32, BOOL = ScalarType(dt.i32), ScalarType(dt.i64), ScalarType(dt.f32), ScalarType(dt.bool_)
PTR_F32 = PointerType(dt.f32)


def arg(name, type, **facts):
    return ParamSpec(name, False, type=type, **facts)


def const(name, value):
    return ParamSpec(name, True, value=value)


def trace(fn, *params):
    module = build_kernel_ir(KernelSource.of(fn), list(params))
    verify_module(module)
    return module.functions[0]


def ops(function, name=None) -> list[Operation]:
    return [op for op in function.walk() if name is None or op.name == name]


def top_ops(function) -> list[str]:
    return [op.name for op in function.body.ops]


def line_of(fn, text: str) -> int:
    """The file line of the first line of `fn` containing `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ---------------------------------------------------------------------------
# Signature and specialization

def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def test_kernel_signature_is_the_runtime_parameters():
    fn = trace(vector_add, arg("x_ptr", PTR_F32, divisible_by_16=True), arg("y_ptr", PTR_F32),
               arg("out_ptr", PTR_F32, divisible_by_16=True), arg("n", I32), const("BLOCK", 128))
    assert fn.name == "vector_add"
    assert [(a.name_hint, a.type) for a in fn.args] == [
        ("x_ptr", PTR_F32), ("y_ptr", PTR_F32), ("out_ptr", PTR_F32), ("n", I32)]
    assert fn.attrs == {"divisible_by_16": (0, 2), "noalias": (0, 1, 2)}
    assert top_ops(fn)[-1] == "return"
    assert {"program_id", "arange", "load", "store"} <= {op.name for op in ops(fn)}
    (arange,) = ops(fn, "arange")
    assert arange.attrs == {"start": 0, "end": 128}


def test_no_attributes_when_nothing_is_divisible_and_pointers_may_alias():
    may_alias = dict(may_alias=True)
    fn = trace(vector_add, arg("x_ptr", PTR_F32, **may_alias), arg("y_ptr", PTR_F32, **may_alias),
               arg("out_ptr", PTR_F32, **may_alias), arg("n", I32), const("BLOCK", 64))
    assert fn.attrs == {}


def strided_copy(x_ptr, out_ptr, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK) * stride
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def test_parameter_equal_to_one_is_bound_to_the_constant_1():
    general = trace(strided_copy, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("stride", I32),
                    const("BLOCK", 16))
    unit = trace(strided_copy, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("stride", I32, equals_one=True),
                 const("BLOCK", 16))
    assert len(unit.args) == 3 and unit.args[2].name_hint == "stride"      # stays in the signature
    uses = lambda fn: [v for op in ops(fn) for v in op.operands if v is fn.args[2]]  # noqa: E731
    assert uses(general) and not uses(unit)                                   # traced as the constant 1


# ---------------------------------------------------------------------------
# Compile-time evaluation

SIZES = (16, 32, 64)
LABEL = "tile"


def constexpr_folding(out_ptr, BLOCK: tl.constexpr, MODE: tl.constexpr):
    half = BLOCK // 2
    width = SIZES[1] + half * 2 - max(BLOCK, 8) + min(4, 3)
    name = f"{LABEL}-{MODE}:{width:04d}"
    assert name == "tile-fast:0031", name
    root = int(math.sqrt(width + 18))
    if MODE == "fast" and 1 < root < 10 and not (root is None):
        tl.store(out_ptr, root)
    else:
        tl.store(out_ptr, this_name_is_never_traced)  # noqa: F821


def test_compile_time_values_fold_in_python():
    fn = trace(constexpr_folding, arg("out_ptr", PointerType(dt.i32)), const("BLOCK", 4), const("MODE", "fast"))
    assert top_ops(fn) == ["constant", "store", "return"]
    assert ops(fn, "constant")[0].attrs["value"] == 7
    assert not ops(fn, "if")


def short_circuit(out_ptr, USE: tl.constexpr):
    if USE and undefined_helper():  # noqa: F821
        tl.store(out_ptr, 1)


def test_and_or_short_circuit_on_compile_time_values():
    fn = trace(short_circuit, arg("out_ptr", PointerType(dt.i32)), const("USE", False))
    assert top_ops(fn) == ["return"]


def chained_compare(out_ptr, n):
    ok = 0 <= n < 10
    tl.store(out_ptr, ok)


def test_chained_comparison_is_a_conjunction():
    fn = trace(chained_compare, arg("out_ptr", PointerType(dt.bool_)), arg("n", I32))
    assert len(ops(fn, "cmp")) == 2 and [op.attrs["pred"] for op in ops(fn, "cmp")] == ["le", "lt"]
    assert ops(fn, "and")


# ---------------------------------------------------------------------------
# if

def runtime_if(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    if n > 0:
        a = x + 1.0
        b = 2
    else:
        a = x - 1.0
        b = n
    tl.store(out_ptr + tl.arange(0, BLOCK), a * b)


def test_runtime_if_yields_the_variables_its_branches_set():
    fn = trace(runtime_if, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("n", I32), const("BLOCK", 8))
    (op,) = ops(fn, "if")
    assert [r.type for r in op.results] == [TileType(F32, (8,)), I32]
    assert [r.name_hint for r in op.results] == ["a", "b"]
    then, orelse = op.regions
    assert then.terminator.name == "yield" and orelse.terminator.name == "yield"
    # the Python 2 became an i32 constant inside the then branch
    assert any(o.name == "constant" and o.attrs["value"] == 2 for o in then.ops)
    assert op.loc.line == line_of(runtime_if, "if n > 0")


def constant_meets_tile(x_ptr, n, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    if n > 3:
        x = 0
    tl.store(x_ptr + tl.arange(0, BLOCK), x)


def test_python_constant_takes_the_type_of_the_other_branch():
    fn = trace(constant_meets_tile, arg("x_ptr", PTR_F32), arg("n", I32), const("BLOCK", 4))
    (op,) = ops(fn, "if")
    assert [r.type for r in op.results] == [TileType(F32, (4,))]
    (zero,) = [o for o in op.regions[0].ops if o.name == "constant"]
    assert zero.results[0].type == TileType(F32, (4,)) and zero.attrs["value"] == 0.0


def constant_branches(out_ptr, n):
    if n > 0:
        v = 1
        unchanged = 5
    else:
        v = 2.5
        unchanged = 5
    tl.store(out_ptr, v + unchanged)


def test_python_constants_in_both_branches_share_one_type():
    fn = trace(constant_branches, arg("out_ptr", PTR_F32), arg("n", I32))
    (op,) = ops(fn, "if")
    assert [(r.name_hint, r.type) for r in op.results] == [("v", F32)]   # `unchanged` stays a constexpr


def constexpr_if(out_ptr, MODE: tl.constexpr):
    if MODE == 1:
        value = 10
    elif MODE == 2:
        value = undefined_in_this_specialization  # noqa: F821
    else:
        value = 30
    tl.store(out_ptr, value)


def test_constexpr_if_traces_only_the_taken_branch():
    fn = trace(constexpr_if, arg("out_ptr", PointerType(dt.i32)), const("MODE", 3))
    assert not ops(fn, "if")
    assert ops(fn, "constant")[0].attrs["value"] == 30


def conditional_expression(out_ptr, n, FAST: tl.constexpr):
    a = 1.5 if FAST else undefined_name  # noqa: F821
    b = n if n > 0 else 0
    tl.store(out_ptr, a + b)


def test_conditional_expression_selects_lanes_or_folds():
    fn = trace(conditional_expression, arg("out_ptr", PTR_F32), arg("n", I32), const("FAST", True))
    (select,) = ops(fn, "select")
    assert select.results[0].type == I32


# ---------------------------------------------------------------------------
# for

def accumulate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.f32)
    count = 0
    for i in range(n):
        acc += tl.load(x_ptr + i * BLOCK + offs)
        count = count + 1
    tl.store(out_ptr + offs, acc / count)


def test_for_carries_the_variables_its_body_assigns():
    fn = trace(accumulate, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("n", I32), const("BLOCK", 32))
    (loop,) = ops(fn, "for")
    assert [r.type for r in loop.results] == [TileType(F32, (32,)), I32]
    assert [r.name_hint for r in loop.results] == ["acc", "count"]
    body = loop.regions[0]
    assert [a.name_hint for a in body.args] == ["i", "acc", "count"]
    assert [a.type for a in body.args] == [I32, TileType(F32, (32,)), I32]
    lb, ub, step = loop.operands[:3]
    assert ub is fn.args[2]


def retyped_accumulator(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = 0
    for i in range(0, n, 2):
        acc = acc + tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.arange(0, BLOCK), acc)


def test_python_number_accumulator_takes_the_type_the_body_gives_it():
    fn = trace(retyped_accumulator, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("n", I32), const("BLOCK", 16))
    (loop,) = ops(fn, "for")
    assert [r.type for r in loop.results] == [TileType(F32, (16,))]
    init = loop.operands[3].owner
    assert init.name == "constant" and init.attrs["value"] == 0.0 and init.parent is fn.body
    # the first attempt's i32 constant is gone
    assert not [o for o in fn.body.ops if o.name == "constant" and o.results[0].type == I32 and o.attrs["value"] == 0
                and o is not loop.operands[0].owner]


def wide_bounds(out_ptr, start, stop):
    total = 0
    for i in range(start, stop):
        total += 1
    tl.store(out_ptr, total)


def test_for_bounds_are_i64_when_a_bound_is():
    fn = trace(wide_bounds, arg("out_ptr", PointerType(dt.i32)), arg("start", I32), arg("stop", I64))
    (loop,) = ops(fn, "for")
    assert [v.type for v in loop.operands[:3]] == [I64, I64, I64]
    assert loop.operands[0].owner.name == "cast"


def loop_local(out_ptr, n):
    for i in range(n):
        tmp = i * 2
        tl.store(out_ptr + i, tmp)


def test_variables_first_set_in_the_body_are_not_carried():
    fn = trace(loop_local, arg("out_ptr", PointerType(dt.i32)), arg("n", I32))
    (loop,) = ops(fn, "for")
    assert loop.results == []


def unrolled(x_ptr, out_ptr, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), tl.f32)
    for k in tl.static_range(1, 4):
        acc += tl.load(x_ptr + k * BLOCK + tl.arange(0, BLOCK))
    for scale in (0.5, 2.0):
        acc = acc * scale
    tl.store(out_ptr + tl.arange(0, BLOCK), acc)


def test_static_range_and_tuples_unroll():
    fn = trace(unrolled, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), const("BLOCK", 8))
    assert not ops(fn, "for") and not ops(fn, "while")
    assert len(ops(fn, "load")) == 3
    assert len(ops(fn, "mul")) == 2


# ---------------------------------------------------------------------------
# while, break, continue

def countdown(out_ptr, n):
    k = n
    steps = 0
    while k > 1:
        k = k // 2
        steps += 1
    while False:
        steps = undefined_name  # noqa: F821
    tl.store(out_ptr, steps)


def test_while_reevaluates_its_condition_on_the_carried_values():
    fn = trace(countdown, arg("out_ptr", PointerType(dt.i32)), arg("n", I32))
    (loop,) = ops(fn, "while")
    condition, body = loop.regions
    assert [a.name_hint for a in condition.args] == ["k", "steps"]
    assert condition.terminator.name == "condition"
    cmp = [o for o in condition.ops if o.name == "cmp"][0]
    assert cmp.operands[0] is condition.args[0]
    assert [r.type for r in loop.results] == [I32, I32]


def search(x_ptr, out_ptr, n, threshold):
    found = -1
    for i in range(n):
        if tl.load(x_ptr + i) > threshold:
            found = i
            break
    tl.store(out_ptr, found)


def test_break_turns_the_for_into_a_while_with_a_flag():
    fn = trace(search, arg("x_ptr", PTR_F32), arg("out_ptr", PointerType(dt.i32)), arg("n", I32), arg("threshold", F32))
    assert not ops(fn, "for")
    (loop,) = ops(fn, "while")
    assert [r.name_hint for r in loop.results] == ["i", "broke", "found"]
    assert [r.type for r in loop.results] == [I32, BOOL, I32]
    condition = loop.regions[0]
    assert [o.name for o in condition.ops] == ["cmp", "not", "and", "condition"]


def skip_odd(out_ptr, n):
    total = 0
    for i in range(n):
        if i % 2 == 1:
            continue
        total += i
    tl.store(out_ptr, total)


def test_continue_guards_the_rest_of_the_body():
    fn = trace(skip_odd, arg("out_ptr", PointerType(dt.i32)), arg("n", I32))
    (loop,) = ops(fn, "for")
    body_ifs = [o for o in loop.regions[0].ops if o.name == "if"]
    assert len(body_ifs) == 2     # the `if ...: continue`, then `if not continued: total += i`
    guard = body_ifs[1]
    assert guard.operands[0].owner.name == "not"
    assert [r.name_hint for r in guard.results] == ["total", "continued"]


def exits(out_ptr, n, t):
    s = 0
    for i in range(n):
        if i == 2:
            continue
        s += i
        if s > t:
            break
        s += 100
    k = 0
    acc = 0.0
    while k < n:
        k += 1
        if k % 2 == 0:
            continue
        acc = acc + k
    z = 0
    for j in tl.static_range(5):
        if z > t:
            break
        z = z + j * 10
    q = 0
    for j in range(10, 0, -3):
        q = q * 10 + j
        if q > t * 1000:
            break
    tl.store(out_ptr, s)
    tl.store(out_ptr + 1, k)
    tl.store(out_ptr + 2, acc.to(tl.i32))
    tl.store(out_ptr + 3, z)
    tl.store(out_ptr + 4, q)


def exits_reference(n, t):
    """`exits` in plain Python."""
    s = 0
    for i in range(n):
        if i == 2:
            continue
        s += i
        if s > t:
            break
        s += 100
    k, acc = 0, 0.0
    while k < n:
        k += 1
        if k % 2 == 0:
            continue
        acc = acc + k
    z = 0
    for j in range(5):
        if z > t:
            break
        z = z + j * 10
    q = 0
    for j in range(10, 0, -3):
        q = q * 10 + j
        if q > t * 1000:
            break
    return [s, k, int(acc), z, q]


@pytest.mark.parametrize("n", [0, 1, 3, 7])
@pytest.mark.parametrize("t", [0, 5, 150, 500])
def test_break_and_continue_mean_what_they_mean_in_python(n, t):
    from tessera.backends.interp import run_function
    fn = trace(exits, arg("out_ptr", PointerType(dt.i32)), arg("n", I32), arg("t", I32))
    out = np.zeros(5, np.int32)
    run_function(fn, [out, n, t], (1,))
    assert list(out) == exits_reference(n, t)


def compile_time_exits(out_ptr, LIMIT: tl.constexpr):
    total = 0
    for i in tl.static_range(10):
        if i == LIMIT:
            break
        if i % 2 == 0:
            continue
        total += i
    tl.store(out_ptr, total)


def test_break_and_continue_under_constexpr_conditions_unroll_like_python():
    fn = trace(compile_time_exits, arg("out_ptr", PointerType(dt.i32)), const("LIMIT", 6))
    assert top_ops(fn) == ["constant", "store", "return"]
    assert ops(fn, "constant")[0].attrs["value"] == 1 + 3 + 5


# ---------------------------------------------------------------------------
# Helpers

@tl.func
def scaled(x, factor=2.0, SHIFT: tl.constexpr = 0):
    """A helper with a default and a constexpr parameter."""
    if SHIFT == 0:
        return x * factor
    return x * factor + SHIFT


@tl.func
def min_max(a, b):
    return tl.minimum(a, b), tl.maximum(a, b)


@tl.func
def larger(a, b):
    return tl.maximum(a, b)


def uses_helpers(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = scaled(x)
    z = scaled(x, SHIFT=3, factor=0.5)
    lo, hi = min_max(y, z)
    top = tl.reduce(hi, 0, larger)
    tl.store(out_ptr + offs, lo + top)


def test_helpers_are_inlined():
    fn = trace(uses_helpers, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), const("BLOCK", 8))
    assert [op.name for op in ops(fn)].count("mul") == 2
    assert len(ops(fn, "min")) == 1
    (reduce,) = ops(fn, "reduce")
    region = reduce.regions[0]
    assert [o.name for o in region.ops] == ["max", "yield"]     # the combine helper, inlined in the region


# ---------------------------------------------------------------------------
# Debugging ops, asserts, locations

def debugging(x_ptr, n, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    print("x at", BLOCK, x, n)
    breakpoint()
    assert BLOCK >= 4, "static: never emitted"
    assert n > 0, "n must be positive"


def test_print_breakpoint_and_assert_ops():
    fn = trace(debugging, arg("x_ptr", PTR_F32), arg("n", I32), const("BLOCK", 4))
    (printed,) = ops(fn, "print")
    assert printed.attrs == {"prefix": "x at 4"} and [v.name_hint for v in printed.operands] == ["x", "n"]
    (stop,) = ops(fn, "breakpoint")
    assert stop.attrs["names"] == ("x_ptr", "n", "x")
    (check,) = ops(fn, "assert")
    assert check.attrs == {"message": "n must be positive"}
    assert check.loc.line == line_of(debugging, "assert n > 0")


def test_every_op_carries_its_source_line():
    fn = trace(vector_add, arg("x_ptr", PTR_F32), arg("y_ptr", PTR_F32), arg("out_ptr", PTR_F32),
               arg("n", I32), const("BLOCK", 8))
    assert all(op.loc is not None and op.loc.file == inspect.getsourcefile(vector_add) for op in ops(fn))
    (store,) = ops(fn, "store")
    assert store.loc.line == line_of(vector_add, "tl.store(")
    assert store.loc.column == 4


def test_ir_prints_with_variable_names():
    fn = trace(accumulate, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("n", I32), const("BLOCK", 4))
    from tessera.ir.core import Module
    text = print_module(Module([fn]))
    assert re.search(r"%acc\w*, %count\w* = for ", text)


def scalar_meets_tile(x_ptr, n, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    s = tl.load(x_ptr)
    if n > 0:
        v = x
    else:
        v = s
    acc = s
    for i in range(n):
        acc = acc + x
    tl.store(x_ptr + tl.arange(0, BLOCK), v + acc)


def test_a_scalar_meeting_a_tile_of_its_type_is_splat():
    fn = trace(scalar_meets_tile, arg("x_ptr", PTR_F32), arg("n", I32), const("BLOCK", 4))
    (branch,) = ops(fn, "if")
    assert [r.type for r in branch.results] == [TileType(F32, (4,))]
    assert [o.name for o in branch.regions[1].ops] == ["splat", "yield"]
    (loop,) = ops(fn, "for")
    assert [r.type for r in loop.results] == [TileType(F32, (4,))]
    assert loop.operands[3].owner.name == "splat"


def early_return(out_ptr, n, SKIP: tl.constexpr):
    if SKIP:
        return
    tl.store(out_ptr, n)


def test_return_under_a_constexpr_condition_ends_the_kernel():
    skipped = trace(early_return, arg("out_ptr", PointerType(dt.i32)), arg("n", I32), const("SKIP", True))
    kept = trace(early_return, arg("out_ptr", PointerType(dt.i32)), arg("n", I32), const("SKIP", False))
    assert top_ops(skipped) == ["return"]
    assert top_ops(kept) == ["store", "return"]


def until_break(x_ptr, out_ptr, n):
    k = 0
    while k < n:
        if tl.load(x_ptr + k) < 0.0:
            break
        k += 1
    steps = 0
    while True:
        steps += 1
        if steps * steps > n:
            break
    tl.store(out_ptr, k + steps)


def test_while_with_break_tests_its_condition_only_while_not_broken():
    fn = trace(until_break, arg("x_ptr", PTR_F32), arg("out_ptr", PointerType(dt.i32)), arg("n", I32))
    first, second = ops(fn, "while")
    assert [r.name_hint for r in first.results] == ["broke", "k"]
    condition = first.regions[0]
    guarded = [o for o in condition.ops if o.name == "if"][0]     # `k < n` evaluated only when not broke
    assert [o.name for o in guarded.regions[0].ops] == ["cmp", "yield"]
    assert [o.name for o in second.regions[0].ops] == ["not", "condition"]   # `while True` with a break


def unpacking_loop(out_ptr):
    total = 0
    for scale, offset in ((2, 1), (3, 4)):
        total = total * scale + offset
    first, (second, third) = 1, (2, 3)
    tl.store(out_ptr, total + first + second + third)


def test_unrolled_loops_and_assignments_unpack_tuples():
    fn = trace(unpacking_loop, arg("out_ptr", PointerType(dt.i32)))
    assert top_ops(fn) == ["constant", "store", "return"]
    assert ops(fn, "constant")[0].attrs["value"] == (0 * 2 + 1) * 3 + 4 + 1 + 2 + 3


def block_per_iteration(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    x = tl.view(x_ptr, (n * BLOCK,))
    block = x.block((BLOCK,), (0,))
    total = block.load()
    for i in range(1, n):
        block = x.block((BLOCK,), (i,))
        total += block.load()
    tl.store(out_ptr + tl.arange(0, BLOCK), total)


def test_compile_time_handles_reassigned_in_a_loop_are_per_iteration_locals():
    fn = trace(block_per_iteration, arg("x_ptr", PTR_F32), arg("out_ptr", PTR_F32), arg("n", I32), const("BLOCK", 4))
    (loop,) = ops(fn, "for")
    assert [r.name_hint for r in loop.results] == ["total"]
    assert [o.name for o in loop.regions[0].ops].count("view_load") == 1
