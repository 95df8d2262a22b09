"""Names while tracing: a function's variables, and what globals a kernel may use.

A `Frame` is one function being traced (the kernel, or a @tessera.func helper
being inlined): its source, its variables, and how deep inside runtime
control flow the tracer currently is. Variables map Python names to Tensors
or compile-time Python values. Three pseudo-variables, whose names cannot
clash with Python identifiers, drive early exits (see `loop_exits.py`):
`BROKE` and `CONTINUED` (the innermost loop's break/continue flags, present
only inside loops), `RETURNED` (a `return` has run; False when a frame
starts) and, in helpers, `RETURN_VALUE` (what a `return` inside runtime
control flow returned).

A name that Python would consider bound but a kernel cannot see (set in only
one branch of a runtime `if`, or first set inside a runtime loop) holds an
`Unbound` whose reason becomes the error message when the name is read.

Globals and closure variables are admitted only when they are compile-time
values the compiler knows how to fold (`admit_global`); anything else must
be passed as a constexpr parameter.
"""

from __future__ import annotations

import builtins
import difflib
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import DType
from .errors import CompileError, UnknownNameError
from .function import DeviceFunction
from .source import KernelSource
from .values import Builtin, Tensor, constexpr, pipeline, static_range

BROKE = ".broke"
CONTINUED = ".continued"
RETURNED = ".returned"
RETURN_VALUE = ".return_value"
EXIT_FLAGS = (BROKE, CONTINUED, RETURNED)

# Python builtins that mean something inside a kernel (see calls.py).
PYTHON_BUILTINS = ("range", "min", "max", "abs", "int", "float", "bool", "len", "print", "breakpoint")


def hint_of(name: str) -> str:
    """The IR name hint for a variable (pseudo-variables lose their dot)."""
    return name.lstrip(".")


@dataclass(frozen=True)
class Unbound:
    """A name Python binds but the kernel cannot see here; `reason` completes "'x' ..."."""

    reason: str
    error: type[CompileError] = UnknownNameError


@dataclass
class Frame:
    """One function being traced: the kernel or an inlined helper."""

    source: KernelSource
    variables: dict[str, Any]
    is_kernel: bool
    region_depth: int = 0                  # > 0 inside a runtime if/loop body
    assigned_at: dict[str, int] = field(default_factory=dict)   # name -> line of its last assignment
    return_value: Any = None

    def __post_init__(self):
        self.closure = self.source.closure_vars()
        self.variables.setdefault(RETURNED, False)

    def rebind(self, variables: dict[str, Any]) -> None:
        """Replace every variable in place, so that holders of `self.variables` see the change."""
        new = dict(variables)
        self.variables.clear()
        self.variables.update(new)

    def user_variables(self) -> dict[str, Any]:
        """Variables the user can name (no pseudo-variables, no unbound names)."""
        return {k: v for k, v in self.variables.items() if not k.startswith(".") and not isinstance(v, Unbound)}


# ---------------------------------------------------------------------------
# Globals


def is_constexpr_value(value: Any) -> bool:
    """Plain compile-time data: numbers, strings, None, dtypes and tuples of those."""
    if isinstance(value, (bool, int, float, str, type(None), DType)) or value is Ellipsis:
        return True
    if isinstance(value, tuple):
        return all(is_constexpr_value(v) for v in value)
    return getattr(type(value), "__tessera_constexpr__", False) is True


def is_compile_time_function(value: Any) -> bool:
    """A function that declares `__tessera_constexpr__ = True` (the layout constructors): kernels call it
    on compile-time arguments while tracing."""
    return isinstance(value, types.FunctionType) and getattr(value, "__tessera_constexpr__", False) is True


def is_math_function(value: Any) -> bool:
    return isinstance(value, types.BuiltinFunctionType) and getattr(value, "__module__", None) == "math"


def admit_global(value: Any) -> tuple[bool, Any]:
    """(True, the value the kernel sees) for a usable global, (False, None) otherwise.

    Usable: modules, constexpr data (numpy scalars become Python numbers),
    `tessera.constexpr(...)` instances (their value), builtins, helpers,
    `static_range`, `pipeline`, `tessera.constexpr`, math functions, the Python builtins
    of PYTHON_BUILTINS, and classes, objects or functions that declare
    `__tessera_constexpr__ = True` (layouts and their constructors).
    """
    if isinstance(value, constexpr):
        value = value.value
    if isinstance(value, np.generic) and not isinstance(value, np.void):
        value = value.item()
    if (isinstance(value, (types.ModuleType, Builtin, DeviceFunction)) or value is static_range or value is pipeline
            or value is constexpr or is_constexpr_value(value) or is_math_function(value)
            or is_compile_time_function(value) or python_builtin_name(value) is not None):
        return True, value
    return False, None


def python_builtin(name: str) -> Any:
    """The Python builtin `name` if kernels may call it, else None."""
    return getattr(builtins, name) if name in PYTHON_BUILTINS else None


def python_builtin_name(value: Any) -> str | None:
    """'min' for the builtin `min` (and so on) if kernels may call it, else None."""
    for name in PYTHON_BUILTINS:
        if value is getattr(builtins, name):
            return name
    return None


def lookup_global(frame: Frame, name: str) -> tuple[bool, Any]:
    """(found, value) for a closure variable, module global or allowed Python builtin (not yet admitted)."""
    if name in frame.closure:
        return True, frame.closure[name]
    if name in frame.source.globals:
        return True, frame.source.globals[name]
    value = python_builtin(name)
    return (value is not None), value


def suggest(name: str, candidates: list[str]) -> str:
    """"; did you mean 'x'?" for the closest candidate, or ""."""
    matches = difflib.get_close_matches(name, [c for c in candidates if not c.startswith(("_", "."))], n=1)
    return f"; did you mean '{matches[0]}'?" if matches else ""


def known_names(frame: Frame) -> list[str]:
    return [*frame.user_variables(), *frame.closure, *frame.source.globals, *PYTHON_BUILTINS]


def describe(value: Any) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, Tensor):
        return f"a traced value of type {value.type}"
    if isinstance(value, Unbound):
        return "unbound"
    if isinstance(value, (types.ModuleType,)):
        return f"module {value.__name__}"
    if is_constexpr_value(value):
        text = repr(value)
        return f"the compile-time value {text if len(text) < 40 else text[:37] + '...'}"
    return f"a Python {type(value).__name__}"
