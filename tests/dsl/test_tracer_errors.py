"""Every mistake in a kernel is a CompileError subclass that names the kernel,
the line, and what to change. Each case: the error class, the message, the
reported line (computed from the kernel's source, so editing this file does
not break the tests)."""

from __future__ import annotations

import inspect
import math  # noqa: F401  (kernels below use it)
import types

import numpy as np
import pytest

import tessera.dsl.language  # noqa: F401  (registers the builtins)
from tessera.dsl.tracer import build_kernel_ir
from tessera.dsl.errors import (
    CompileError, ConstexprError, LoopCarriedTypeError, StaticAssertionError, TypeMismatchError, UnknownNameError,
    UnsupportedSyntaxError,
)
from tessera.dsl.function import func
from tessera.dsl.source import KernelSource
from tessera.dsl.specialization import ParamSpec
from tessera.dsl.values import BUILTINS, Builtin, constexpr, static_range
from tessera.ir import dtypes as dt
from tessera.ir.types import PointerType, ScalarType

tl = types.ModuleType("tl")
tl.__dict__.update(BUILTINS)
tl.__dict__.update({d.name: d for d in dt.ALL_DTYPES})
tl.constexpr, tl.static_range, tl.func = constexpr, static_range, func

I32, F32 = ScalarType(dt.i32), ScalarType(dt.f32)
PTR = PointerType(dt.f32)
DEFAULT_PARAMS = {"ptr": ParamSpec("ptr", False, type=PTR), "n": ParamSpec("n", False, type=I32),
                  "x": ParamSpec("x", False, type=F32), "BLOCK": ParamSpec("BLOCK", True, value=16)}


def compile_error(fn) -> CompileError:
    """Trace `fn` (parameters by name from DEFAULT_PARAMS) and return the CompileError it raises."""
    params = [DEFAULT_PARAMS[name] for name in inspect.signature(fn).parameters]
    with pytest.raises(CompileError) as info:
        build_kernel_ir(KernelSource.of(fn), params)
    return info.value


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def check(fn, cls, at: str, *fragments: str, where=None):
    error = compile_error(fn)
    assert type(error) is cls, f"{type(error).__name__}: {error}"
    assert error.kernel == fn.__name__
    assert error.line == line_of(where or fn, at), str(error)
    assert error.file == inspect.getsourcefile(where or fn)
    for fragment in fragments:
        assert fragment in error.message, error.message
    return error


# ---------------------------------------------------------------------------
# Names

def misspelled_local(ptr, BLOCK):
    offs = tl.arange(0, BLOCK)
    tl.store(ptr + ofs, 1.0)  # noqa: F821


def test_unknown_name_suggests_the_closest():
    error = check(misspelled_local, UnknownNameError, "ptr + ofs", "unknown name 'ofs'", "did you mean 'offs'?")
    assert "tl.store(ptr + ofs, 1.0)" in str(error)        # the source line is shown


def misspelled_builtin(ptr):
    tl.stor(ptr, 1.0)


def test_unknown_builtin_suggests_the_closest():
    check(misspelled_builtin, UnknownNameError, "tl.stor", "unknown name 'tl.stor'", "did you mean 'store'?")


TABLE = [1, 2, 3]
ARRAY = np.arange(4)


def list_global(ptr):
    tl.store(ptr, TABLE[0])


def test_globals_must_be_compile_time_values():
    check(list_global, CompileError, "TABLE[0]", "global 'TABLE' is a Python list", "tessera.constexpr")


def host_function_global(ptr):
    tl.store(ptr, np.sum(ARRAY))


def test_module_attributes_that_are_not_language_values_are_rejected():
    check(host_function_global, CompileError, "np.sum", "'np.sum'", "cannot be used inside a kernel")


def one_branch_only(ptr, n):
    if n > 0:
        y = 1.0
    tl.store(ptr, y)


def test_variable_set_in_one_branch_is_not_defined_after_it():
    check(one_branch_only, UnknownNameError, "tl.store(ptr, y)", "'y' is only assigned in one branch",
          f"line {line_of(one_branch_only, 'if n > 0')}")


def loop_local_used_after(ptr, n):
    for i in range(n):
        last = i
    tl.store(ptr, last)


def test_variable_first_set_in_a_loop_is_not_defined_after_it():
    check(loop_local_used_after, UnknownNameError, "tl.store(ptr, last)", "'last' is first assigned inside the loop",
          "assign it before the loop")


def loop_variable_after(ptr, n):
    for i in range(n):
        pass
    tl.store(ptr, i)  # noqa: F821


def test_loop_variable_is_only_defined_inside_the_loop():
    check(loop_variable_after, UnknownNameError, "tl.store(ptr, i)", "'i' is the loop variable")


# ---------------------------------------------------------------------------
# Unsupported syntax

def item_assignment(ptr, BLOCK):
    x = tl.zeros((BLOCK,), tl.f32)
    x[0] = 1.0
    tl.store(ptr, x)


def uses_lambda(ptr):
    f = lambda v: v + 1  # noqa: E731
    tl.store(ptr, f(1.0))


def uses_comprehension(ptr):
    values = [i for i in range(4)]
    tl.store(ptr, values[0])


def uses_walrus(ptr, n):
    if (m := n + 1) > 0:
        tl.store(ptr, m)


def uses_try(ptr):
    try:
        tl.store(ptr, 1.0)
    except Exception:
        pass


def uses_with(ptr):
    with open("x"):
        tl.store(ptr, 1.0)


def uses_global_statement(ptr):
    global TABLE
    tl.store(ptr, 1.0)


def uses_import(ptr):
    import os  # noqa: F401
    tl.store(ptr, 1.0)


def uses_del(ptr, n):
    m = n
    del m
    tl.store(ptr, 1.0)


def uses_raise(ptr):
    raise ValueError("no")


def uses_nested_def(ptr):
    def inner():
        return 1
    tl.store(ptr, 1.0)


def uses_star_args(ptr):
    shape = ptr             # a traced value: its length is not known at compile time
    tl.store(ptr, tl.zeros(*shape))


def uses_for_else(ptr, n):
    for i in range(n):
        pass
    else:
        tl.store(ptr, 1.0)


def returns_value(ptr):
    return 1


def star_parameter(ptr, *rest):
    tl.store(ptr, 1.0)


DEFAULT_PARAMS["rest"] = ParamSpec("rest", True, value=())


@pytest.mark.parametrize("fn, at, fragment", [
    (item_assignment, "x[0] = 1.0", "tiles are values; use tessera.where"),
    (uses_lambda, "lambda v", "define a module-level @tessera.func helper"),
    (uses_comprehension, "[i for", "tessera.static_range"),
    (uses_walrus, ":=", "assign on a line of its own"),
    (uses_try, "try:", "no exceptions on the device"),
    (uses_with, "with open", "`with` blocks are not supported"),
    (uses_global_statement, "global TABLE", "kernels cannot rebind globals"),
    (uses_import, "import os", "import modules at the top of the file"),
    (uses_del, "del m", "`del` is not supported"),
    (uses_raise, "raise ValueError", "tessera.static_assert"),
    (uses_nested_def, "def inner", "@tessera.func helper"),
    (uses_star_args, "*shape", "*-unpacking in a kernel needs a tuple"),
    (uses_for_else, "for i in range(n)", "`for ... else` is not supported"),
    (returns_value, "return 1", "kernels cannot return values"),
    (star_parameter, "*rest", "`*rest` parameters are not supported"),
])
def test_unsupported_syntax_names_the_construct_and_the_alternative(fn, at, fragment):
    check(fn, UnsupportedSyntaxError, at, fragment)


# ---------------------------------------------------------------------------
# Types across branches and iterations

def branch_types_differ(ptr, n):
    if n > 0:
        v = tl.zeros((16,), tl.f32)
    else:
        v = tl.zeros((16,), tl.i32)
    tl.store(ptr, v)


def test_if_branches_must_agree_on_types():
    check(branch_types_differ, LoopCarriedTypeError, "if n > 0", "'v' is tile<16xf32> in the then branch but "
          "tile<16xi32> in the else branch", ".to(tessera.")


def loop_type_changes(ptr, n):
    acc = tl.zeros((16,), tl.i32)
    for i in range(n):
        acc = acc + 0.5
    tl.store(ptr, acc)


def test_loop_carried_variable_must_keep_its_type():
    loop, assignment = line_of(loop_type_changes, "for i"), line_of(loop_type_changes, "acc = acc + 0.5")
    check(loop_type_changes, LoopCarriedTypeError, "for i in range(n)",
          f"'acc' is tile<16xi32> before the loop at line {loop} but tile<16xf32> at the end of its body",
          f"assigned at line {assignment}", "acc.to(tessera.f32)")


def compile_time_value_changes_in_loop(ptr, n):
    mode = "a"
    for i in range(n):
        if mode == "a":
            tl.store(ptr, 1.0)
        mode = "b"


def test_compile_time_values_cannot_change_across_iterations():
    check(compile_time_value_changes_in_loop, ConstexprError, 'if mode == "a"', "'mode' holds the compile-time "
          f"value 'a' before the loop at line {line_of(compile_time_value_changes_in_loop, 'for i')}",
          "tessera.static_range")


def compile_time_value_after_loop(ptr, n):
    mode = "a"
    for i in range(n):
        mode = "b"
    tl.store(ptr, len(mode))


def test_compile_time_values_reassigned_in_a_loop_are_not_defined_after_it():
    check(compile_time_value_after_loop, UnknownNameError, "len(mode)", "'mode' is assigned a compile-time value "
          "inside the loop")


def float_range(ptr, x):
    for i in range(x):
        pass


def test_range_bounds_must_be_integers():
    check(float_range, TypeMismatchError, "for i in range(x)", "range() bounds must be integers")


# ---------------------------------------------------------------------------
# Compile-time evaluation

def traced_static_range(ptr, n):
    for i in tl.static_range(n):
        tl.store(ptr + i, 1.0)


def test_static_range_bounds_must_be_constexpr():
    check(traced_static_range, ConstexprError, "tl.static_range(n)", "tessera.static_range", "compile-time")


def failing_static_assert(ptr, BLOCK):
    assert BLOCK % 32 == 0, f"BLOCK must be a multiple of 32, got {BLOCK}"


def test_static_assert_failure():
    check(failing_static_assert, StaticAssertionError, "assert BLOCK", "BLOCK must be a multiple of 32, got 16")


def constexpr_division_by_zero(ptr, BLOCK):
    tl.store(ptr, BLOCK // (BLOCK - 16))


def test_compile_time_arithmetic_errors():
    check(constexpr_division_by_zero, ConstexprError, "BLOCK // (BLOCK - 16)", "compile-time `16 // 0` failed")


def infinite_loop(ptr):
    while True:
        tl.store(ptr, 1.0)


def test_while_true_without_break_is_an_error():
    check(infinite_loop, ConstexprError, "while True", "never ends")


def fstring_of_traced(ptr, n):
    label = f"n={n}"


def test_fstrings_format_compile_time_values_only():
    check(fstring_of_traced, ConstexprError, 'f"n={n}"', "f-strings can only format compile-time values")


def int_of_traced(ptr, x):
    tl.store(ptr, int(x))


def test_int_of_a_traced_value_points_to_to():
    check(int_of_traced, ConstexprError, "int(x)", "x.to(tessera.i32)")


def tuple_indexed_by_traced(ptr, n):
    sizes = (1, 2, 3)
    tl.store(ptr, sizes[n])


def test_compile_time_tuples_need_compile_time_indices():
    check(tuple_indexed_by_traced, ConstexprError, "sizes[n]", "indices of compile-time tuples must be compile-time")


# ---------------------------------------------------------------------------
# Calls and helpers

def host_helper(v):
    return v + 1


def calls_plain_python(ptr, x):
    tl.store(ptr, host_helper(x))


def test_plain_python_functions_cannot_be_called():
    check(calls_plain_python, CompileError, "host_helper(x)", "decorate it with @tessera.func so it is inlined")


def bad_builtin_arguments(ptr):
    tl.store(ptr)


def test_wrong_arguments_to_a_builtin():
    check(bad_builtin_arguments, CompileError, "tl.store(ptr)",
          "bad arguments for tessera.store(pointer, value, mask, sem, scope)", "missing a required argument: 'value'")


@tl.func
def returns_on_some_paths(v):
    if v > 0:
        return v
    v = -v


def calls_runtime_return(ptr, x):
    tl.store(ptr, returns_on_some_paths(x))


def test_a_helper_returning_a_value_on_some_paths_only():
    check(calls_runtime_return, CompileError, "returns_on_some_paths(x)",
          "helper 'returns_on_some_paths' returns a value on some paths but reaches its end on others")


@tl.func
def recursive(v):
    return recursive(v - 1)


def calls_recursive(ptr, x):
    tl.store(ptr, recursive(x))


def test_recursion_is_reported():
    check(calls_recursive, CompileError, "return recursive(v - 1)", "recursive call to helper 'recursive'",
          where=recursive.fn)


@tl.func
def needs_constexpr(v, SIZE: tl.constexpr):
    return v * SIZE


def passes_traced_constexpr(ptr, n):
    tl.store(ptr, needs_constexpr(1.0, n))


def test_helper_constexpr_parameters_need_compile_time_arguments():
    check(passes_traced_constexpr, ConstexprError, "needs_constexpr(1.0, n)", "parameter 'SIZE' of helper "
          "'needs_constexpr' is a tessera.constexpr")


def wrong_helper_arguments(ptr):
    tl.store(ptr, needs_constexpr(1.0))


def test_wrong_arguments_to_a_helper():
    check(wrong_helper_arguments, CompileError, "needs_constexpr(1.0)", "bad arguments for helper needs_constexpr")


# ---------------------------------------------------------------------------
# Failures inside builtins surface at the user's line

def _emits_a_bad_op(ctx, v):
    ctx.builder.create("add", [v.value, ctx.builder.create("constant", attrs={"value": 1},
                                                           result_types=[I32]).result])


def _crashes(ctx):
    raise RuntimeError("boom")


bad_op = Builtin("bad_op", _emits_a_bad_op)
crashes = Builtin("crashes", _crashes)


def calls_bad_op(ptr, x):
    bad_op(x)


def calls_crashing_builtin(ptr):
    crashes()


def test_type_rule_errors_become_type_mismatch_errors_at_the_line():
    check(calls_bad_op, TypeMismatchError, "bad_op(x)", "arithmetic operands must have the same type")


def test_unexpected_exceptions_become_compile_errors_at_the_line():
    check(calls_crashing_builtin, CompileError, "crashes()", "internal compiler error", "RuntimeError: boom")


def augmented_item_assignment(ptr, BLOCK):
    x = tl.zeros((BLOCK,), tl.f32)
    x[0] += 1.0
    tl.store(ptr, x)


def test_augmented_item_assignment_is_rejected_like_item_assignment():
    check(augmented_item_assignment, UnsupportedSyntaxError, "x[0] += 1.0", "tiles are values")


@tl.func
def helper_with_a_typo(v):
    return v + undefined_thing  # noqa: F821


def calls_helper_with_a_typo(ptr, x):
    tl.store(ptr, helper_with_a_typo(x))


def test_errors_inside_helpers_point_into_the_helper():
    error = check(calls_helper_with_a_typo, UnknownNameError, "undefined_thing", "unknown name 'undefined_thing'",
                  where=helper_with_a_typo.fn)
    assert error.kernel == "calls_helper_with_a_typo"
