"""Builder: the one way code creates operations.

    b = Builder()
    fn = b.function("add", [ptr_f32, ptr_f32, ScalarType(i32)], ["x", "y", "n"])
    pid = b.create("program_id", attrs={"axis": 0}).result
    ...
    b.create("return")

`create` looks the op up in `ops.OPS`, infers result types from the op's
type rule when the op has one (or takes them from the caller when the op's
result type is the producer's choice) and appends the op at the insertion
point. Type-rule violations raise `TypeRuleError` right where the op is made,
so the frontend can attach the user's source line.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from .core import Block, Function, Location, Module, Operation, Value
from .errors import TypeRuleError
from .ops import OPS, check_structure
from .types import Type


class Builder:
    def __init__(self, module: Module | None = None):
        self.module = module if module is not None else Module()
        self.block: Block | None = None
        self.loc: Location | None = None     # stamped on every op created

    def function(self, name: str, arg_types: list[Type], arg_names: list[str] = (),
                 attrs: dict[str, Any] | None = None) -> Function:
        """Add a function to the module and move the insertion point into its body."""
        fn = Function(name, Block(arg_types, arg_names), dict(attrs or {}), self.loc)
        self.module.functions.append(fn)
        self.block = fn.body
        return fn

    @contextmanager
    def at(self, block: Block) -> Iterator[Block]:
        """Temporarily insert at the end of `block` (a region being filled)."""
        saved = self.block
        self.block = block
        try:
            yield block
        finally:
            self.block = saved

    def create(self, name: str, operands: list[Value] = (), attrs: dict[str, Any] | None = None,
               result_types: list[Type] | None = None, regions: list[Block] | None = None,
               result_names: list[str] = ()) -> Operation:
        """Make op `name`, check its type rule, and append it at the insertion point."""
        opdef = OPS.get(name)
        if opdef is None:
            raise TypeRuleError(f"unknown op {name!r}")
        attrs = dict(attrs or {})
        if result_types is None:
            if opdef.infer is None:
                raise TypeRuleError(f"op {name!r} needs explicit result types")
            probe = Operation(name, list(operands), [], attrs, regions)
            check_structure(probe)
            result_types = opdef.infer([v.type for v in operands], attrs)
        op = Operation(name, list(operands), list(result_types), attrs, regions, self.loc, result_names)
        check_type_rule(op)
        if self.block is None:
            raise TypeRuleError("builder has no insertion point: call function() or use at(block)")
        return self.block.append(op)



def check_type_rule(op: Operation) -> None:
    """Raise TypeRuleError unless `op` obeys its op's type rule (regions included)."""
    check_structure(op)
    opdef = OPS[op.name]
    if opdef.check is not None:
        opdef.check(op)
    if opdef.infer is not None:
        inferred = list(opdef.infer([v.type for v in op.operands], op.attrs))
        actual = [r.type for r in op.results]
        if actual != inferred:
            raise TypeRuleError(f"{op.name} must produce ({', '.join(map(str, inferred))}), "
                                f"not ({', '.join(map(str, actual))})")
