"""Text -> IR: reads what `printer.py` writes (grammar in `grammar.lark`).

    module = parse_module(text)

Printed value names become `name_hint`s (numbered names like `%0` become no
hint), so print -> parse -> print is the identity. Names are resolved in
text order across the whole function: a use must follow a definition, and a
name is defined once. Scoping (a value used outside the region that defines
it) and type rules are left to the verifier, so that malformed IR can be
written down and tested; the parser only needs ops, dtypes and types it knows.

Every error is a `ParseError` that starts with `line L:C:`.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from .core import Block, Function, Location, Module, Operation, Value
from .dtypes import DType, dtype_from_name
from .errors import ParseError
from .ops import OPS
from .types import PointerType, RegsType, ScalarType, SharedType, TensorMapType, TileType, Type, ViewType


def parse_module(text: str) -> Module:
    """Parse IR text into a Module; raise ParseError naming line:column and what is wrong."""
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise ParseError(_syntax_message(e, text)) from None
    return Module([_FunctionReader().function(node) for node in tree.children])


@functools.cache
def _lark() -> Lark:
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True)


def _error(where: Token | Tree, message: str) -> ParseError:
    line, column = (where.line, where.column) if isinstance(where, Token) else (where.meta.line, where.meta.column)
    return ParseError(f"line {line}:{column}: {message}")


class _FunctionReader:
    """Builds one Function from its parse tree, resolving `%names` in text order."""

    def __init__(self):
        self.values: dict[str, Value] = {}
        self.function_name = ""

    def function(self, node: Tree) -> Function:
        name, *parts = node.children
        self.function_name = name[1:]
        args = [p for p in parts if isinstance(p, Tree) and p.data == "arg"]
        ops = [p for p in parts if isinstance(p, Tree) and p.data == "op"]
        attrs, loc = {}, None
        for part in parts:
            if isinstance(part, Tree) and part.data == "fn_attrs":
                attrs = self.attrs(part.children[0])
            elif isinstance(part, Tree) and part.data == "loc":
                loc = self.location(part)
        return Function(self.function_name, self.block(args, ops), attrs, loc)

    def block(self, args: list[Tree], ops: list[Tree]) -> Block:
        block = Block()
        for arg in args:
            name, type_node = arg.children
            self.define(name, block.add_arg(self.type(type_node), _hint(name)))
        for op in ops:
            block.append(self.op(op))
        return block

    def region(self, node: Tree) -> Block:
        header = [c for c in node.children if c.data == "block_header"]
        args = [a for a in header[0].children if a is not None] if header else []
        return self.block(args, [c for c in node.children if c.data == "op"])

    def op(self, node: Tree) -> Operation:
        name = next(c for c in node.children if isinstance(c, Token))
        if name not in OPS:
            raise _error(name, f"unknown op '{name}'")
        results, operands, attrs, types, regions, loc = [], [], {}, [], [], None
        for part in node.children:
            kind = part.data if isinstance(part, Tree) else None
            if kind == "results":
                results = part.children
            elif kind == "operands":
                operands = [self.use(v) for v in part.children]
            elif kind == "attr_dict":
                attrs = self.attrs(part)
            elif kind == "result_types":
                types = [self.type(t) for t in part.children]
            elif kind == "region":
                regions.append(self.region(part))
            elif kind == "loc":
                loc = self.location(part)
        if len(results) != len(types):
            raise _error(name, f"{name} defines {len(results)} results but lists {len(types)} result types")
        op = Operation(str(name), operands, types, attrs, regions, loc, [_hint(r) for r in results])
        for token, value in zip(results, op.results):
            self.define(token, value)
        return op

    # -- values -----------------------------------------------------------------

    def define(self, token: Token, value: Value) -> None:
        if token in self.values:
            raise _error(token, f"value {token} is defined twice in function @{self.function_name}")
        self.values[str(token)] = value

    def use(self, token: Token) -> Value:
        if token not in self.values:
            raise _error(token, f"use of undefined value {token} in function @{self.function_name}")
        return self.values[token]

    # -- attributes and locations -----------------------------------------------

    def attrs(self, node: Tree) -> dict[str, Any]:
        attrs = {}
        for attr in node.children:
            key, value = attr.children
            if key in attrs:
                raise _error(key, f"attribute '{key}' given twice")
            attrs[str(key)] = self.value(value)
        return attrs

    def value(self, node: Tree) -> Any:
        kind = node.data
        if kind == "list":
            return tuple(self.value(v) for v in node.children if v is not None)
        constants = {"inf": float("inf"), "neg_inf": float("-inf"), "nan": float("nan"), "true": True, "false": False}
        if kind in constants:
            return constants[kind]
        token = node.children[0]
        if kind == "int":
            return int(token)
        if kind == "float":
            return float(token)
        return self.string(token)

    def string(self, token: Token) -> str:
        try:
            return json.loads(token)
        except json.JSONDecodeError as e:
            raise _error(token, f"bad string literal {token}: {e.msg}") from None

    def location(self, node: Tree) -> Location:
        file, line, column = node.children
        return Location(self.string(file), int(line), int(column))

    # -- types ------------------------------------------------------------------

    def type(self, node: Tree) -> Type:
        kind, parts = node.data, node.children
        if kind == "scalar_type":
            if str(parts[0]) == "tensormap":
                return TensorMapType()
            return ScalarType(self.dtype(parts[0]))
        if kind == "pointer_type":
            pointee, space = parts
            try:
                return PointerType(self.dtype(pointee), str(space) if space is not None else "global")
            except ValueError as e:
                raise _error(space, str(e)) from None
        if kind == "tile_type":
            dims = parts[0].split("x")[:-1] if len(parts) == 2 else []
            return TileType(self.type(parts[-1]), tuple(int(d) for d in dims))
        if kind == "regs_type":
            return RegsType(self.type(parts[1]), int(parts[0][:-1]))
        if kind == "smem_type":
            return SharedType(self.dtype(parts[1]), tuple(int(d) for d in parts[0].split("x")[:-1]))
        dtype, rank = parts  # view_type
        return ViewType(self.dtype(dtype), int(rank))

    def dtype(self, token: Token) -> DType:
        try:
            return dtype_from_name(str(token))
        except ValueError as e:
            raise _error(token, str(e)) from None


def _hint(token: Token) -> str:
    """`%acc` -> "acc"; numbered names (`%3`) carry no hint."""
    name = token[1:]
    return "" if name.isdigit() else name


# ---------------------------------------------------------------------------
# Syntax errors

_TERMINAL_NAMES = {
    "VALUE": "a value (%name)", "NAME": "a name", "FUNC_NAME": "a function name (@name)",
    "INT": "an integer", "FLOAT": "a float", "STRING": "a string", "DIMS": "tile dimensions (64x32x)",
    "_NL": "a line break", "$END": "end of input",
}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    try:
        pattern = _lark().get_terminal(name).pattern
    except KeyError:
        return name
    return f"'{pattern.value}'" if pattern.type == "str" else name


def _syntax_message(e: UnexpectedInput, text: str) -> str:
    if isinstance(e, UnexpectedCharacters):
        found, expected = repr(text[e.pos_in_stream]), e.allowed
    elif isinstance(e, UnexpectedToken):
        special = e.token.type in ("_NL", "$END")
        found, expected = _TERMINAL_NAMES[e.token.type] if special else repr(str(e.token)), e.expected
    else:  # UnexpectedEOF
        found, expected = "end of input", e.expected
    line, column = (e.line, e.column) if e.line != -1 else (text.count("\n") + 1, 1)
    wanted = ", ".join(sorted({_describe_terminal(t) for t in expected or ()}))
    context = e.get_context(text).rstrip("\n") if e.pos_in_stream is not None else ""
    return f"line {line}:{column}: expected {wanted}, found {found}\n{context}"
