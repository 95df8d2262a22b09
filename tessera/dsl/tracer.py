"""Python AST -> tile IR: the one visitor that traces a kernel.

`build_kernel_ir(source, params)` walks the kernel's AST once for one
specialization. Every expression evaluates either to a compile-time Python
value, folded right here, or to a `Tensor` (a traced IR value), in which
case the operation is delegated to `operators` (operators, attributes,
subscripts) or to a builtin from `tessera.dsl.language`. Statements update
the current `Frame`'s variables; control flow lives in `control_flow.py`
(if/for/while), `loop_exits.py` (break/continue/return) and calls in
`calls.py`.

Each visited node sets `builder.loc`, so emitted ops and errors carry the
user's file, line and column. Every failure leaves as a `CompileError`: a
`TypeRuleError` from the IR builder becomes a `TypeMismatchError` at the
node being traced, anything unexpected an internal error at that node.
"""

from __future__ import annotations

import ast
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

from ..ir.builder import Builder
from ..ir.types import PointerType
from ..ir.core import Location, Module
from ..ir.errors import TypeRuleError
from . import calls, control_flow, loop_exits, operators
from .errors import CompileError, ConstexprError, StaticAssertionError, TypeMismatchError, UnknownNameError, \
    UnsupportedSyntaxError
from .scope import Frame, Unbound, admit_global, describe, hint_of, known_names, lookup_global, suggest
from .source import KernelSource
from .syntax import (
    BINARY_OPERATORS, COMPARE_OPERATORS, IDENTITY_OPERATORS, PYTHON_BINARY, PYTHON_COMPARE, PYTHON_UNARY,
    UNARY_OPERATORS, UNSUPPORTED,
)
from .specialization import ParamSpec
from .values import Context, Tensor, constexpr


def build_kernel_ir(source: KernelSource, params: list[ParamSpec]) -> Module:
    """Trace `source` for one specialization into a module holding one IR function named like the kernel.

    The IR arguments are the non-constexpr parameters, in order. constexpr
    parameters are bound to their values; parameters known to equal 1 are
    bound to the Python int 1 (their IR argument stays, unused).
    """
    try:
        return Tracer(source).build(params)
    except CompileError as exc:
        raise exc.with_kernel(source.name)
    except Exception as exc:  # outside any node (setting up the function): still a CompileError
        raise CompileError(f"internal compiler error ({type(exc).__name__}: {exc}); please report it with the "
                           f"kernel", kernel=source.name, file=source.file, line=source.tree.lineno) from exc


class Tracer(ast.NodeVisitor):
    """Traces one kernel (and the helpers it calls) into tile IR."""

    def __init__(self, source: KernelSource):
        self.source = source
        self.builder = Builder()
        self.ctx = Context(self.builder, source.name, source.file, source.source_lines,
                           call_function=self.call_function)
        self.frame: Frame | None = None
        self.inlining: list[Any] = []       # helpers being inlined, innermost last (recursion check)

    # -- entry ------------------------------------------------------------

    def build(self, params: list[ParamSpec]) -> Module:
        tree = self.source.tree
        self.builder.loc = Location(self.source.file, tree.lineno, tree.col_offset)
        calls.check_signature(self, tree)
        runtime = [p for p in params if not p.constexpr]
        divisible = tuple(i for i, p in enumerate(runtime) if p.divisible_by_16)
        noalias = tuple(i for i, p in enumerate(runtime) if isinstance(p.type, PointerType) and not p.may_alias)
        attrs = {"divisible_by_16": divisible, "noalias": noalias}
        function = self.builder.function(self.source.name, [p.type for p in runtime], [p.name for p in runtime],
                                         {k: v for k, v in attrs.items() if v} or None)
        args = iter(function.args)
        variables: dict[str, Any] = {}
        for p in params:
            if p.constexpr:
                variables[p.name] = p.value.value if isinstance(p.value, constexpr) else p.value
            else:
                arg = next(args)
                variables[p.name] = 1 if p.equals_one else Tensor(arg)
        self.frame = Frame(self.source, variables, is_kernel=True)
        self.visit_block(tree.body)
        self.builder.loc = Location(self.source.file, tree.body[-1].end_lineno or tree.lineno, 0)
        self.builder.create("return")
        return self.builder.module

    # -- helpers for the other modules ---------------------------------------

    def error(self, message: str, cls: type[CompileError] = CompileError) -> NoReturn:
        """Raise `cls` at the node being traced."""
        self.ctx.error(message, cls)

    def locate(self, exc: CompileError) -> None:
        """Point an error raised without a location (by a builtin, say) at the node being traced."""
        loc = self.builder.loc
        exc.file, exc.line, exc.column = loc.file, loc.line, loc.column
        lines = self.ctx.source_lines
        exc.source_line = lines[loc.line - 1] if 0 < loc.line <= len(lines) else None
        exc.args = (str(exc),)

    def line(self) -> int | None:
        return self.builder.loc.line if self.builder.loc else None

    @contextmanager
    def entered(self, frame: Frame) -> Iterator[Frame]:
        """Trace inside `frame` (an inlined helper): its names, its file for error messages."""
        saved = self.frame, self.ctx.file, self.ctx.source_lines, self.builder.loc
        self.frame, self.ctx.file, self.ctx.source_lines = frame, frame.source.file, frame.source.source_lines
        try:
            yield frame
        finally:
            self.frame, self.ctx.file, self.ctx.source_lines, self.builder.loc = saved

    def call_function(self, func: Any, args: list[Any], kwargs: dict[str, Any] | None = None) -> Any:
        """`ctx.call_function`: inline helper `func` on `args` at the insertion point."""
        return calls.call_value(self, func, list(args), dict(kwargs or {}))

    def visit_block(self, stmts: list[ast.stmt]) -> None:
        """Trace statements in order, honouring break/continue/return (see loop_exits.py)."""
        loop_exits.trace_statements(self, stmts)

    def assign(self, name: str, value: Any) -> None:
        if isinstance(value, Tensor) and not value.value.name_hint:
            value.value.name_hint = hint_of(name)
        self.frame.variables[name] = value
        if self.builder.loc is not None:
            self.frame.assigned_at[name] = self.builder.loc.line

    # -- the visitor ---------------------------------------------------------

    def visit(self, node: ast.AST) -> Any:
        saved = self.builder.loc
        if hasattr(node, "lineno"):
            self.builder.loc = Location(self.ctx.file, node.lineno, node.col_offset)
        try:
            return super().visit(node)
        except CompileError as exc:
            if exc.line is None and self.builder.loc is not None:
                self.locate(exc)
            raise
        except TypeRuleError as exc:
            self.error(str(exc), TypeMismatchError)
        except RecursionError:
            self.error("the kernel is nested too deeply to trace (expression or helper calls too deep)")
        except Exception as exc:  # a bug in a builtin or the compiler: still the user's line
            self.error(f"internal compiler error while tracing this line ({type(exc).__name__}: {exc}); "
                       f"please report it with the kernel")
        finally:
            self.builder.loc = saved

    def generic_visit(self, node: ast.AST) -> NoReturn:
        message = UNSUPPORTED.get(type(node), f"Python syntax `{type(node).__name__}` is not supported in kernels")
        self.error(message, UnsupportedSyntaxError)

    # -- simple statements -----------------------------------------------------

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):   # docstrings and stray constants
            return
        self.visit(node.value)

    def visit_Pass(self, node: ast.Pass) -> None:
        pass

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.visit(node.value)
        for target in node.targets:
            self.bind_target(target, value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.bind_target(node.target, self.visit(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            self.bind_target(node.target, None)    # raises the right error for x[i] += ...
        current = self.lookup(node.target.id)
        self.assign(node.target.id, self.binary(BINARY_OPERATORS[type(node.op)], current,
                                                self.visit(node.value)))

    def bind_target(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.assign(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            self.unpack(target, value)
        elif isinstance(target, ast.Subscript):
            self.at(target).error("cannot assign to an element or slice: tiles are values; use tessera.where "
                                  "to build a new tile, or store through a pointer/view", UnsupportedSyntaxError)
        elif isinstance(target, ast.Attribute):
            self.at(target).error("cannot assign to an attribute inside a kernel; use a local variable",
                                  UnsupportedSyntaxError)
        else:
            self.visit(target)   # Starred and friends: generic_visit names them

    def unpack(self, target: ast.Tuple | ast.List, value: Any) -> None:
        if any(isinstance(e, ast.Starred) for e in target.elts):
            self.at(target).error("starred assignment (a, *rest = ...) is not supported in kernels; "
                                  "unpack every element", UnsupportedSyntaxError)
        if not isinstance(value, tuple):
            self.at(target).error(f"cannot unpack {describe(value)} into {len(target.elts)} names; only tuples "
                                  f"(e.g. what a helper or builtin returns) can be unpacked")
        if len(value) != len(target.elts):
            self.at(target).error(f"cannot unpack {len(value)} values into {len(target.elts)} names")
        for element, item in zip(target.elts, value):
            self.bind_target(element, item)

    @contextmanager
    def located(self, node: ast.AST) -> Iterator[None]:
        saved = self.builder.loc
        self.builder.loc = Location(self.ctx.file, node.lineno, node.col_offset)
        try:
            yield
        finally:
            self.builder.loc = saved

    def at(self, node: ast.AST) -> "_ErrorAt":
        return _ErrorAt(self, node)

    def visit_If(self, node: ast.If) -> None:
        control_flow.lower_if(self, node)

    def visit_For(self, node: ast.For) -> None:
        control_flow.lower_for(self, node)

    def visit_While(self, node: ast.While) -> None:
        control_flow.lower_while(self, node)

    def visit_Break(self, node: ast.Break) -> None:
        loop_exits.visit_break(self)

    def visit_Continue(self, node: ast.Continue) -> None:
        loop_exits.visit_continue(self)

    def visit_Return(self, node: ast.Return) -> None:
        loop_exits.visit_return(self, node)

    def visit_Assert(self, node: ast.Assert) -> None:
        condition = self.visit(node.test)
        message = ast.unparse(node.test) if node.msg is None else self.visit(node.msg)
        if isinstance(message, Tensor):
            self.at(node.msg).error("an assert message must be a compile-time string, not a traced value",
                                    ConstexprError)
        message = str(message)
        if not isinstance(condition, Tensor):
            if not condition:
                self.error(f"static assertion failed: {message}", StaticAssertionError)
            return
        if condition.dtype is None or not condition.dtype.is_bool:
            condition = operators.compare(self.ctx, "!=", condition, 0)
        self.builder.create("assert", [condition.value], {"message": message})

    # -- expressions -------------------------------------------------------------

    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (bool, int, float, str, type(None))) or node.value is Ellipsis:
            return node.value
        self.error(f"constants of type {type(node.value).__name__} are not supported in kernels",
                   UnsupportedSyntaxError)

    def visit_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id)

    def lookup(self, name: str) -> Any:
        frame = self.frame
        if name in frame.variables:
            value = frame.variables[name]
            if isinstance(value, Unbound):
                self.error(f"'{name}' {value.reason}", value.error)
            return value
        found, value = lookup_global(frame, name)
        if not found:
            self.error(f"unknown name '{name}'{suggest(name, known_names(frame))}", UnknownNameError)
        ok, admitted = admit_global(value)
        if not ok and callable(value) and not isinstance(value, type):
            self.error(f"'{name}' is a plain Python function; kernels can only call tessera builtins and "
                       f"@tessera.func helpers: decorate it with @tessera.func so it is inlined")
        if not ok:
            self.error(f"global '{name}' is {describe(value)}, which kernels cannot use; pass it as a "
                       f"`tessera.constexpr` parameter (or as a tensor argument if it is data)")
        return admitted

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        return calls.attribute(self, self.visit(node.value), node.attr, node)

    def visit_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> tuple:
        return tuple(self.visit(e) for e in node.elts)

    def visit_Slice(self, node: ast.Slice) -> slice:
        part = lambda e: None if e is None else self.visit(e)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        value, index = self.visit(node.value), self.visit(node.slice)
        if isinstance(value, Tensor):
            return operators.subscript(self.ctx, value, index)
        if isinstance(index, Tensor) or (isinstance(index, slice) and any(
                isinstance(p, Tensor) for p in (index.start, index.stop, index.step))):
            self.error(f"cannot index {describe(value)} with a traced value; indices of compile-time tuples "
                       f"must be compile-time (use tessera.static_range for the loop)", ConstexprError)
        if not isinstance(value, (tuple, str)):
            self.error(f"cannot index {describe(value)}")
        try:
            return value[index]
        except (IndexError, TypeError) as exc:
            self.error(f"cannot index {describe(value)} with {index!r}: {exc}")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> str:
        parts = []
        for piece in node.values:
            if isinstance(piece, ast.Constant):
                parts.append(str(piece.value))
                continue
            value = self.visit(piece.value)
            if isinstance(value, Tensor):
                self.at(piece.value).error("f-strings can only format compile-time values; to show a traced "
                                           "value use print('name', value)", ConstexprError)
            conversion = {115: str, 114: repr, 97: ascii}.get(piece.conversion)
            if conversion is not None:
                value = conversion(value)
            spec = "" if piece.format_spec is None else self.visit(piece.format_spec)
            try:
                parts.append(format(value, spec))
            except (TypeError, ValueError) as exc:
                self.error(f"cannot format {describe(value)} with '{spec}': {exc}")
        return "".join(parts)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        return self.binary(BINARY_OPERATORS[type(node.op)], self.visit(node.left), self.visit(node.right))

    def binary(self, op: str, a: Any, b: Any) -> Any:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if op == "**":
                self.error("`**` on traced values is not supported; multiply (x * x) or use tessera.exp2/log2",
                           UnsupportedSyntaxError)
            if op == "@":
                self.error("`@` is not supported; use tessera.dot(a, b)", UnsupportedSyntaxError)
            return operators.binary(self.ctx, op, a, b)
        return self.fold(PYTHON_BINARY[op], op, a, b)

    def fold(self, fn: Any, op: str, *operands: Any) -> Any:
        """Evaluate a Python operator on compile-time values, as a CompileError when Python refuses."""
        if op in ("<<", "**") and isinstance(operands[1], int) and abs(operands[1]) > 4096:
            self.error(f"compile-time `{op}` with {operands[1]} is too large", ConstexprError)
        try:
            return fn(*operands)
        except (ArithmeticError, TypeError, ValueError) as exc:
            shown = f" {op} ".join(repr(o) for o in operands) if len(operands) == 2 else f"{op} {operands[0]!r}"
            self.error(f"compile-time `{shown}` failed: {exc}", ConstexprError)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        op, operand = UNARY_OPERATORS[type(node.op)], self.visit(node.operand)
        if isinstance(operand, Tensor):
            return operators.unary(self.ctx, op, operand)
        return self.fold(PYTHON_UNARY[op], op, operand)

    def visit_Compare(self, node: ast.Compare) -> Any:
        """`a < b < c` is `(a < b) and (b < c)`, with `b` evaluated once."""
        left = self.visit(node.left)
        result = None
        for op_node, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node)
            current = self.compare(op_node, left, right)
            result = current if result is None else self.logical("and", result, current)
            if not isinstance(result, Tensor) and not result:
                return result           # Python short-circuits a false constexpr link
            left = right
        return result

    def compare(self, op_node: ast.cmpop, a: Any, b: Any) -> Any:
        if type(op_node) in IDENTITY_OPERATORS:
            op = IDENTITY_OPERATORS[type(op_node)]
            if op in ("in", "not in") and (isinstance(a, Tensor) or isinstance(b, Tensor)):
                self.error(f"`{op}` works on compile-time values only", ConstexprError)
            if op in ("is", "is not"):
                a, b = (x.value if isinstance(x, Tensor) else x for x in (a, b))
            return self.fold(PYTHON_COMPARE[op], op, a, b)
        op = COMPARE_OPERATORS[type(op_node)]
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            return operators.compare(self.ctx, op, a, b)
        return self.fold(PYTHON_COMPARE[op], op, a, b)

    def logical(self, op: str, a: Any, b: Any) -> Any:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            return operators.logical(self.ctx, op, a, b)
        return (a and b) if op == "and" else (a or b)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        """Python's short circuit on compile-time operands; traced operands combine lane by lane."""
        op = "and" if isinstance(node.op, ast.And) else "or"
        result = self.visit(node.values[0])
        for value_node in node.values[1:]:
            if not isinstance(result, Tensor):
                if (op == "and") != bool(result):
                    return result
                result = self.visit(value_node)
                continue
            result = self.logical(op, result, self.visit(value_node))
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        condition = self.visit(node.test)
        if not isinstance(condition, Tensor):
            return self.visit(node.body if condition else node.orelse)
        return calls.where(self, condition, self.visit(node.body), self.visit(node.orelse))

    def visit_Call(self, node: ast.Call) -> Any:
        return calls.visit_call(self, node)


class _ErrorAt:
    """`gen.at(node).error(...)`: an error pointing at `node` rather than the statement."""

    def __init__(self, gen: Tracer, node: ast.AST):
        self.gen, self.node = gen, node

    def error(self, message: str, cls: type[CompileError] = CompileError) -> NoReturn:
        with self.gen.located(self.node):
            self.gen.error(message, cls)

