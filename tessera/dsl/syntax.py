"""The Python syntax kernels use, as tables: operators, and the constructs kernels reject.

Operators map AST nodes to the operator strings `operators` takes (and to
the Python functions that fold them on compile-time values). UNSUPPORTED
names, for each construct a kernel cannot contain, what to write instead;
the tracer raises it as an UnsupportedSyntaxError at the construct.
"""

from __future__ import annotations

import ast
import operator

BINARY_OPERATORS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Pow: "**",
    ast.MatMult: "@",
}
PYTHON_BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift, "**": operator.pow, "@": operator.matmul,
}
COMPARE_OPERATORS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
PYTHON_COMPARE = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "is": operator.is_, "is not": operator.is_not, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
}
IDENTITY_OPERATORS = {ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
UNARY_OPERATORS = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~", ast.Not: "not"}
PYTHON_UNARY = {"-": operator.neg, "+": operator.pos, "~": operator.invert, "not": operator.not_}

UNSUPPORTED = {
    ast.Lambda: "lambdas are not supported in kernels; define a module-level @tessera.func helper instead",
    ast.ListComp: "list comprehensions are not supported in kernels; write a "
                  "`for ... in tessera.static_range(...)` loop",
    ast.SetComp: "set comprehensions are not supported in kernels; use a tuple",
    ast.DictComp: "dict comprehensions are not supported in kernels; use tuples or constexpr parameters",
    ast.GeneratorExp: "generator expressions are not supported in kernels; write a `tessera.static_range` loop",
    ast.NamedExpr: "assignment expressions (:=) are not supported in kernels; assign on a line of its own",
    ast.Await: "await is not supported in kernels",
    ast.Yield: "yield is not supported in kernels; kernels and helpers return values or store through pointers",
    ast.YieldFrom: "yield is not supported in kernels; kernels and helpers return values or store through pointers",
    ast.Starred: "*-unpacking is not supported in kernels; pass the values one by one",
    ast.Dict: "dicts are not supported in kernels; use tuples or constexpr parameters",
    ast.Set: "sets are not supported in kernels; use tuples",
    ast.FunctionDef: "functions cannot be defined inside a kernel; define a module-level @tessera.func helper",
    ast.AsyncFunctionDef: "functions cannot be defined inside a kernel; define a module-level @tessera.func helper",
    ast.ClassDef: "classes cannot be defined inside a kernel; define them at module level and pass values as "
                  "constexpr parameters",
    ast.Try: "try/except is not supported in kernels: there are no exceptions on the device; use "
             "tessera.static_assert for compile-time checks and `assert` for device checks",
    ast.With: "`with` blocks are not supported in kernels",
    ast.AsyncWith: "`with` blocks are not supported in kernels",
    ast.AsyncFor: "`async for` is not supported in kernels; use `for ... in range(...)`",
    ast.Global: "kernels cannot rebind globals; pass values in as parameters and results out through pointers",
    ast.Nonlocal: "kernels cannot rebind variables of enclosing functions; pass values in as parameters",
    ast.Import: "import modules at the top of the file, not inside a kernel",
    ast.ImportFrom: "import modules at the top of the file, not inside a kernel",
    ast.Delete: "`del` is not supported in kernels; reassign the variable or let it go unused",
    ast.Raise: "`raise` is not supported in kernels; use tessera.static_assert (compile time) or `assert` (device)",
    ast.Match: "`match` is not supported in kernels; use if/elif",
}
if hasattr(ast, "TryStar"):
    UNSUPPORTED[ast.TryStar] = UNSUPPORTED[ast.Try]
