"""The IR's data structures: values, operations, blocks, functions, modules.

The IR is SSA with structured control flow. An `Operation` names its op
definition (see `ops.py`), takes operand `Value`s, defines result `Value`s,
carries attributes and may own regions. Every region is a single `Block`
whose arguments are the region's inputs (a loop's induction variable and
carried values, say) and whose last operation is a terminator (`yield`,
`condition` or `return`). A `Function` is a kernel: its entry block's
arguments are the kernel parameters. A `Module` holds functions.

Values carry a `name_hint` (usually the Python variable they came from) that
the printer uses to make IR text readable; it has no meaning otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from .types import Type


@dataclass(frozen=True)
class Location:
    """Where an operation came from in the user's source."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class Value:
    """An SSA value: the result of an operation or an argument of a block."""

    __slots__ = ("type", "name_hint", "owner", "index")

    def __init__(self, type: Type, name_hint: str = "", owner: "Operation | Block | None" = None, index: int = 0):
        self.type = type
        self.name_hint = name_hint
        self.owner = owner
        self.index = index

    def __repr__(self) -> str:
        return f"<Value {self.name_hint or '?'}: {self.type}>"


class Block:
    """A straight-line list of operations with typed arguments."""

    def __init__(self, arg_types: list[Type] = (), arg_names: list[str] = ()):
        names = list(arg_names) + [""] * (len(arg_types) - len(arg_names))
        self.args: list[Value] = [Value(t, n, self, i) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Operation] = []
        self.parent: Operation | Function | None = None

    def add_arg(self, type: Type, name_hint: str = "") -> Value:
        value = Value(type, name_hint, self, len(self.args))
        self.args.append(value)
        return value

    def append(self, op: "Operation") -> "Operation":
        op.parent = self
        self.ops.append(op)
        return op

    @property
    def terminator(self) -> "Operation | None":
        return self.ops[-1] if self.ops else None


class Operation:
    """One instance of an op: `results = name(operands) {attrs} regions`."""

    def __init__(
        self,
        name: str,
        operands: list[Value],
        result_types: list[Type],
        attrs: dict[str, Any] | None = None,
        regions: list[Block] | None = None,
        loc: Location | None = None,
        result_names: list[str] = (),
    ):
        self.name = name
        self.operands = list(operands)
        names = list(result_names) + [""] * (len(result_types) - len(result_names))
        self.results = [Value(t, n, self, i) for i, (t, n) in enumerate(zip(result_types, names))]
        self.attrs = dict(attrs or {})
        self.regions = list(regions or [])
        for region in self.regions:
            region.parent = self
        self.loc = loc
        self.parent: Block | None = None

    @property
    def result(self) -> Value:
        """The single result of a one-result op."""
        if len(self.results) != 1:
            raise ValueError(f"op '{self.name}' has {len(self.results)} results, not one")
        return self.results[0]

    def walk(self) -> Iterator["Operation"]:
        """This op and every op nested in its regions, in program order (pre-order)."""
        yield self
        for region in self.regions:
            for op in region.ops:
                yield from op.walk()

    def __repr__(self) -> str:
        return f"<Operation {self.name}>"


@dataclass
class Function:
    """A kernel: a name, parameters (entry block arguments) and a body."""

    name: str
    body: Block
    attrs: dict[str, Any] = field(default_factory=dict)
    loc: Location | None = None

    def __post_init__(self):
        self.body.parent = self

    @property
    def args(self) -> list[Value]:
        return self.body.args

    def walk(self) -> Iterator[Operation]:
        for op in self.body.ops:
            yield from op.walk()


def enclosing_function(item: Operation | Block | None) -> Function | None:
    """The function whose body holds `item` (an op or a block, at any depth), or None when it is detached."""
    parent = item.parent if item is not None else None
    while parent is not None and not isinstance(parent, Function):
        parent = parent.parent
    return parent


@dataclass
class Module:
    """A compilation unit: one or more functions."""

    functions: list[Function] = field(default_factory=list)

    def function(self, name: str) -> Function:
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise KeyError(f"no function named {name!r} in module (have: {[f.name for f in self.functions]})")
