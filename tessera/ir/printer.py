"""IR -> text: the generic, MLIR-like form that `parser.py` reads back.

    func @add(%x: ptr<f32>, %n: i32) attributes {num_warps = 4} {
      %pid = program_id {axis = 0} : i32
      %acc = for %lb, %ub, %step, %a0 : f32 {
      ^(%i: i32, %a: f32):
        yield %a
      }
      store %x, %acc
      return
    }

An op is `results = name operands {attrs} : result types regions loc(...)`,
each part present only when non-empty. Operand types are not repeated: they
follow from where the operands are defined. A region is `{`, a `^(args):`
header when it has block arguments, its ops one level deeper, and `}`.

Values are named after their `name_hint` (made an identifier and unique in
the function with `_1`, `_2`, ... suffixes); values without a hint get
`%0`, `%1`, .... Since printed names are unique, the parser keeps them as
hints and print -> parse -> print is the identity.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .core import Block, Function, Location, Module, Operation, Value, enclosing_function


def print_module(module: Module, locations: bool = False) -> str:
    """The text of `module`; with `locations`, ops and functions show `loc(...)`."""
    return "\n".join(print_function(fn, locations) for fn in module.functions)


def print_function(fn: Function, locations: bool = False) -> str:
    names = _name_function(fn)
    args = ", ".join(f"{names[a]}: {a.type}" for a in fn.args)
    header = f"func @{fn.name}({args})"
    if fn.attrs:
        header += f" attributes {format_attrs(fn.attrs)}"
    if locations and fn.loc is not None:
        header += f" {format_location(fn.loc)}"
    lines = [header + " {"]
    for op in fn.body.ops:
        lines += _op_lines(op, names, locations, "  ")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_op(op: Operation) -> str:
    """One line for error messages: `op` with its regions elided as `{...}`.

    Values are named as `print_module` names them when `op` sits in a function.
    """
    fn = enclosing_function(op)
    names = _name_function(fn) if fn is not None else _Names()
    return _op_head(op, names) + " {...}" * len(op.regions)


def print_value(value: Value) -> str:
    """`%name` of `value` as `print_module` names it in its function."""
    owner = value.owner
    fn = enclosing_function(owner) if owner is not None else None
    names = _name_function(fn) if fn is not None else _Names()
    return names[value]


# ---------------------------------------------------------------------------
# Value names


class _Names:
    """Printed names of one function's values, assigned in textual order."""

    def __init__(self):
        self.names: dict[Value, str] = {}
        self.used: set[str] = set()
        self.next_number = 0

    def define(self, value: Value) -> None:
        hint = _identifier(value.name_hint)
        if hint:
            name, k = hint, 0
            while name in self.used:
                k += 1
                name = f"{hint}_{k}"
        else:
            name, self.next_number = str(self.next_number), self.next_number + 1
        self.used.add(name)
        self.names[value] = name

    def __getitem__(self, value: Value) -> str:
        if value not in self.names:  # defined outside the function: malformed IR, still printable
            self.define(value)
        return "%" + self.names[value]


def _identifier(hint: str) -> str:
    """`hint` made a valid identifier ("" stays "": the value gets a number)."""
    hint = re.sub(r"\W", "_", hint or "", flags=re.ASCII)
    return "_" + hint if hint[:1].isdigit() else hint


def _name_function(fn: Function) -> _Names:
    names = _Names()
    _name_block(fn.body, names)
    return names


def _name_block(block: Block, names: _Names) -> None:
    for arg in block.args:
        names.define(arg)
    for op in block.ops:
        for result in op.results:
            names.define(result)
        for region in op.regions:
            _name_block(region, names)


# ---------------------------------------------------------------------------
# Ops and regions


def _op_head(op: Operation, names: _Names) -> str:
    """Everything of `op` up to its regions: results, name, operands, attributes, types."""
    text = op.name
    if op.results:
        text = ", ".join(names[r] for r in op.results) + " = " + text
    if op.operands:
        text += " " + ", ".join(names[v] for v in op.operands)
    if op.attrs:
        text += " " + format_attrs(op.attrs)
    if op.results:
        text += " : " + ", ".join(str(r.type) for r in op.results)
    return text


def _op_lines(op: Operation, names: _Names, locations: bool, indent: str) -> list[str]:
    lines = [indent + _op_head(op, names)]
    for region in op.regions:
        lines[-1] += " {"
        if region.args:
            lines.append(indent + "^(" + ", ".join(f"{names[a]}: {a.type}" for a in region.args) + "):")
        for inner in region.ops:
            lines += _op_lines(inner, names, locations, indent + "  ")
        lines.append(indent + "}")
    if locations and op.loc is not None:
        lines[-1] += " " + format_location(op.loc)
    return lines


# ---------------------------------------------------------------------------
# Attributes and locations


def format_attrs(attrs: dict[str, Any]) -> str:
    """`{key = value, ...}` sorted by key."""
    return "{" + ", ".join(f"{key} = {format_value(attrs[key])}" for key in sorted(attrs)) + "}"


def format_value(value: Any) -> str:
    """An attribute value; floats always print as floats so that they stay floats."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest text that reads back as the same double
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return f"<unprintable {type(value).__name__} {value!r}>"


def format_location(loc: Location) -> str:
    return f"loc({json.dumps(loc.file, ensure_ascii=False)}:{loc.line}:{loc.column})"
