"""Calls and attribute reads inside a kernel.

What a call means depends on what the callee evaluated to:

* a `Builtin` (`tessera.load`, ...): `impl(ctx, *args, **kwargs)` emits IR;
* a `DeviceFunction` (`@tessera.func`): its body is inlined in a new frame;
* a method of a traced value (`x.to(...)`, from `operators.attribute`);
* a Python builtin kernels understand: `min`/`max`/`abs` (traced values go
  to `tessera.minimum`/`maximum`/`abs`), `int`/`float`/`bool`/`len` on
  compile-time values, `print` (an IR `print`), `breakpoint` (an IR
  `breakpoint` over every traced variable in scope);
* a `math` function on compile-time arguments: evaluated now;
* a compile-time function (`__tessera_constexpr__ = True`, such as
  `tessera.layouts.spatial`) or a method of a compile-time object (a
  layout's `.local(...)`) on compile-time arguments: evaluated now;
* `tessera.static_range(...)` / `tessera.constexpr(...)`: compile-time values.

Anything else is a plain Python function, which kernels cannot call.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import types
from typing import TYPE_CHECKING, Any

from ..ir.dtypes import DType
from ..ir.errors import TypeRuleError
from . import operators
from .errors import CompileError, ConstexprError, TypeMismatchError, UnknownNameError, UnsupportedSyntaxError
from .function import DeviceFunction
from .scope import (
    RETURN_VALUE, RETURNED, Frame, admit_global, describe, is_compile_time_function, is_constexpr_value,
    is_math_function, python_builtin_name, suggest,
)
from .values import BUILTINS, Builtin, Tensor, constexpr, pipeline, static_range

if TYPE_CHECKING:
    from .tracer import Tracer


class TensorMethod:
    """A bound method of a traced value, e.g. `x.to` in `x.to(tessera.f16)`."""

    def __init__(self, name: str, fn: Any):
        self.name, self.fn = name, fn


def builtin_named(name: str) -> Builtin:
    from . import language  # noqa: F401  (registers every builtin)
    return BUILTINS[name]


def visit_call(gen: "Tracer", node: ast.Call) -> Any:
    func = gen.visit(node.func)
    args = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):        # a tuple's length is known while tracing: splice its items
            value = gen.visit(arg.value)
            if not isinstance(value, tuple):
                gen.at(arg).error(f"*-unpacking in a kernel needs a tuple (its length known at compile time), got "
                                  f"{describe(value)}; pass the values one by one", UnsupportedSyntaxError)
            args.extend(value)
            continue
        args.append(gen.visit(arg))
    kwargs = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            gen.at(keyword.value).error("**-unpacking in calls is not supported in kernels; pass keyword "
                                        "arguments one by one", UnsupportedSyntaxError)
        kwargs[keyword.arg] = gen.visit(keyword.value)
    return call_value(gen, func, args, kwargs, callee_text=ast.unparse(node.func))


def call_value(gen: "Tracer", func: Any, args: list[Any], kwargs: dict[str, Any],
               callee_text: str | None = None) -> Any:
    shown = callee_text or getattr(func, "__name__", None) or getattr(func, "name", None) or repr(func)
    if isinstance(func, Builtin):
        return call_checked(gen, func.impl, f"tessera.{func.name}", [gen.ctx, *args], kwargs, skip=1)
    if isinstance(func, DeviceFunction):
        return inline(gen, func, args, kwargs)
    if is_compile_time_function(func) or is_compile_time_method(func):
        fn = func.fn if isinstance(func, TensorMethod) else func
        compile_time_args(gen, shown, args, kwargs)
        return call_python(gen, fn, shown, args, kwargs)
    if isinstance(func, TensorMethod):
        return call_checked(gen, func.fn, f".{func.name}", args, kwargs)
    if func is static_range:
        compile_time_args(gen, "tessera.static_range", args, kwargs, what="bounds")
        return call_python(gen, static_range, "tessera.static_range", args, kwargs)
    if func is pipeline:
        gen.error("tessera.pipeline(...) is a loop iterator: write `for k in tessera.pipeline(start, stop, "
                  "stages=S):`", UnsupportedSyntaxError)
    if func is constexpr:
        compile_time_args(gen, "tessera.constexpr", args, kwargs)
        return args[0] if args else None
    builtin_name = python_builtin_name(func)
    if builtin_name is not None:
        return PYTHON_BUILTIN_CALLS[builtin_name](gen, args, kwargs)
    if is_math_function(func):
        compile_time_args(gen, f"math.{func.__name__}", args, kwargs, hint=f"use tessera.{func.__name__} on tiles")
        return call_python(gen, func, f"math.{func.__name__}", args, kwargs)
    gen.error(f"cannot call {shown} ({describe(func)}) inside a kernel: only tessera builtins and "
              f"@tessera.func helpers can be called; decorate the helper with @tessera.func so it is inlined")


def is_compile_time_method(func: Any) -> bool:
    """A method of a compile-time object (a layout's `.spatial`), which only computes another such value."""
    owner = getattr(func.fn, "__self__", None) if isinstance(func, TensorMethod) else None
    return owner is not None and is_constexpr_value(owner)


# ---------------------------------------------------------------------------
# Calling Python code that emits IR, with its failures turned into CompileErrors


def signature_of(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def call_checked(gen: "Tracer", fn: Any, shown: str, args: list[Any], kwargs: dict[str, Any],
                 skip: int = 0) -> Any:
    """`fn(*args, **kwargs)`, reporting a bad argument list as the user's mistake."""
    signature = signature_of(fn)
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            params = list(signature.parameters)[skip:]
            gen.error(f"bad arguments for {shown}({', '.join(params)}): {exc}")
    try:
        return fn(*args, **kwargs)
    except CompileError:
        raise
    except TypeRuleError as exc:
        gen.error(f"{shown}: {exc}", TypeMismatchError)


def call_python(gen: "Tracer", fn: Any, shown: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """A Python function on compile-time values; its exceptions become CompileErrors."""
    try:
        return fn(*args, **kwargs)
    except (ArithmeticError, TypeError, ValueError) as exc:
        gen.error(f"compile-time {shown}(...) failed: {exc}", ConstexprError)


def compile_time_args(gen: "Tracer", shown: str, args: list[Any], kwargs: dict[str, Any],
                      what: str = "arguments", hint: str = "") -> None:
    for value in [*args, *kwargs.values()]:
        if isinstance(value, Tensor):
            gen.error(f"the {what} of {shown}(...) must be compile-time values, got {describe(value)}"
                      f"{'; ' + hint if hint else ''}", ConstexprError)


# ---------------------------------------------------------------------------
# @tessera.func helpers


def inline(gen: "Tracer", func: DeviceFunction, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Trace `func`'s body at the insertion point with its parameters bound to `args`; return its value."""
    if func in gen.inlining:
        chain = " -> ".join(f.__name__ for f in [*gen.inlining, func])
        gen.error(f"recursive call to helper '{func.__name__}' ({chain}); helpers are inlined, so recursion "
                  f"cannot be compiled; rewrite it as a loop")
    source = func.source
    signature = inspect.signature(func.fn)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        gen.error(f"bad arguments for helper {func.__name__}({', '.join(source.param_names)}): {exc}")
    passed = set(bound.arguments)
    bound.apply_defaults()
    variables = {}
    for name, value in bound.arguments.items():
        if name in source.constexpr_params and contains_tensor(value):
            gen.error(f"parameter '{name}' of helper '{func.__name__}' is a tessera.constexpr, but the call passes "
                      f"{describe(value)}; pass a compile-time value", ConstexprError)
        if name not in passed:
            ok, admitted = admit_global(value)
            if not ok:
                gen.error(f"the default value of parameter '{name}' of helper '{func.__name__}' is "
                          f"{describe(value)}, which kernels cannot use")
            value = admitted
        variables[name] = value
    frame = Frame(source, variables, is_kernel=False)
    gen.inlining.append(func)
    try:
        with gen.entered(frame):
            check_signature(gen, source.tree)
            gen.visit_block(source.tree.body)
    finally:
        gen.inlining.pop()
    return _returned_value(gen, func, frame)


def _returned_value(gen: "Tracer", func: DeviceFunction, frame: Frame) -> Any:
    """What the inlined helper returns: its compile-time `return`'s value, or the value its returns inside
    runtime control flow left in RETURN_VALUE -- which needs every path to return."""
    if RETURN_VALUE not in frame.variables:
        return frame.return_value
    value = frame.variables[RETURN_VALUE]
    if value is not None and frame.variables[RETURNED] is not True:
        gen.error(f"helper '{func.__name__}' returns a value on some paths but reaches its end on others; end it "
                  f"with a `return`")
    return value


def contains_tensor(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    return isinstance(value, tuple) and any(contains_tensor(v) for v in value)


# ---------------------------------------------------------------------------
# Attributes


def attribute(gen: "Tracer", value: Any, name: str, node: ast.Attribute) -> Any:
    if isinstance(value, Tensor):
        result = operators.attribute(gen.ctx, value, name)
        if callable(result) and not isinstance(result, (Tensor, DType, type)):
            return TensorMethod(name, result)
        return result
    if isinstance(value, types.ModuleType):
        return module_attribute(gen, value, name, node)
    if isinstance(value, DType) and not name.startswith("_"):
        result = getattr(value, name, None)
        if result is not None and not callable(result):
            return result
    if isinstance(value, (tuple, int, float, bool, str)) or value is None:
        gen.error(f"cannot read attribute '{name}' of {describe(value)} inside a kernel")
    if is_language_object(value) and not name.startswith("_") and hasattr(value, name):
        result = getattr(value, name)
        return TensorMethod(name, result) if callable(result) and not isinstance(result, (DType, type)) else result
    if is_constexpr_value(value) and not name.startswith("_") and hasattr(value, name):
        ok, result = admit_global(getattr(value, name))
        if ok:
            return result
    gen.error(f"cannot read attribute '{name}' of {describe(value)} inside a kernel")


def is_language_object(value: Any) -> bool:
    """An object of a tessera class (a view's block, a layout, ...): its public attributes are the language's."""
    return (type(value).__module__.startswith("tessera.")
            and not isinstance(value, (types.ModuleType, type, DType, Tensor)))


def module_attribute(gen: "Tracer", module: types.ModuleType, name: str, node: ast.Attribute) -> Any:
    alias = ast.unparse(node.value)
    if not hasattr(module, name):
        public = [n for n in dir(module) if not n.startswith("_")]
        gen.error(f"unknown name '{alias}.{name}'{suggest(name, public)}", UnknownNameError)
    ok, value = admit_global(getattr(module, name))
    if not ok:
        gen.error(f"'{alias}.{name}' is {describe(getattr(module, name))}, which cannot be used inside a kernel; "
                  f"call it on the host and pass the result as a tessera.constexpr parameter")
    return value


# ---------------------------------------------------------------------------
# Python builtins


def where(gen: "Tracer", condition: Tensor, a: Any, b: Any) -> Any:
    return call_value(gen, builtin_named("where"), [condition, a, b], {})


def _no_keywords(gen: "Tracer", name: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        gen.error(f"keyword arguments to {name}() are not supported in kernels ({', '.join(kwargs)})",
                  UnsupportedSyntaxError)


def _range(gen, args, kwargs):
    gen.error("range(...) can only be the iterable of a `for` loop; for a tuple of numbers write it out, "
              "or loop with tessera.static_range", UnsupportedSyntaxError)


def _min_max(name: str):
    def call(gen, args, kwargs):
        _no_keywords(gen, name, kwargs)
        values = list(args[0]) if len(args) == 1 and isinstance(args[0], tuple) else list(args)
        if not values:
            gen.error(f"{name}() needs at least one value")
        if not any(isinstance(v, Tensor) for v in values):
            return call_python(gen, getattr(builtins, name), name, values, {})
        combine = builtin_named("minimum" if name == "min" else "maximum")
        result = values[0]
        for value in values[1:]:
            result = call_value(gen, combine, [result, value], {})
        return result
    return call


def _abs(gen, args, kwargs):
    _no_keywords(gen, "abs", kwargs)
    if len(args) != 1:
        gen.error(f"abs() takes one value, got {len(args)}")
    if isinstance(args[0], Tensor):
        return call_value(gen, builtin_named("abs"), args, {})
    return call_python(gen, abs, "abs", args, {})


def _convert(kind):
    return lambda gen, args, kwargs: convert(gen, kind, args, kwargs)


def convert(gen, kind, args, kwargs):
    _no_keywords(gen, kind.__name__, kwargs)
    if any(isinstance(a, Tensor) for a in args):
        target = {int: "tessera.i32", float: "tessera.f32", bool: "tessera.bool_"}[kind]
        gen.error(f"{kind.__name__}() converts compile-time values only; convert a traced value with "
                  f"x.to({target})", ConstexprError)
    return call_python(gen, kind, kind.__name__, args, {})


def _len(gen, args, kwargs):
    _no_keywords(gen, "len", kwargs)
    if len(args) == 1 and isinstance(args[0], Tensor) and args[0].shape:
        return args[0].shape[0]
    if len(args) == 1 and isinstance(args[0], (tuple, str)):
        return len(args[0])
    gen.error(f"len() takes a tuple or a tile, got {', '.join(describe(a) for a in args) or 'nothing'}")


def _print(gen, args, kwargs):
    """`print("x =", x)`: the compile-time arguments, joined by spaces, become the prefix and the traced
    values the operands (a compile-time argument after a traced one still goes into the prefix)."""
    _no_keywords(gen, "print", kwargs)
    prefix = " ".join(str(a) for a in args if not isinstance(a, Tensor))
    operands = [a.value for a in args if isinstance(a, Tensor)]
    gen.builder.create("print", operands, {"prefix": prefix})


def _breakpoint(gen, args, kwargs):
    """`breakpoint()`: stop in the CPU interpreter with every traced variable in scope."""
    if args or kwargs:
        gen.error("breakpoint() takes no arguments in kernels")
    visible = {name: v for name, v in gen.frame.user_variables().items() if isinstance(v, Tensor)}
    gen.builder.create("breakpoint", [v.value for v in visible.values()], {"names": tuple(visible)})


PYTHON_BUILTIN_CALLS = {
    "range": _range, "min": _min_max("min"), "max": _min_max("max"), "abs": _abs, "len": _len,
    "print": _print, "breakpoint": _breakpoint, "int": _convert(int), "float": _convert(float),
    "bool": _convert(bool),
}


def check_signature(gen: "Tracer", tree: ast.FunctionDef) -> None:
    """Kernels and helpers take plain parameters: no *args or **kwargs."""
    args = tree.args
    for extra, kind in ((args.vararg, "*"), (args.kwarg, "**")):
        if extra is not None:
            gen.at(extra).error(f"`{kind}{extra.arg}` parameters are not supported in kernels and helpers; "
                                f"list the parameters explicitly", UnsupportedSyntaxError)
