"""`Emitter`: creates thread-IR ops at an insertion point, and hoists the kernel-wide ones into its prologue.

Every lowering writes thread IR through these verbs (`ctx.emit("add", a, b)`,
`ctx.const(4)`, `ctx.splat(x, n)`, `with ctx.when(cond): ...`). Ops that only
depend on constants and thread ids are *hoisted*: created once, at the top
of the kernel, whatever block asks for them, so index math is computed once
per kernel. Extracts and splats are memoized per block.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.types import RegsType, ScalarType, Type


class Emitter:
    """Thread-IR ops into `fn` through builder `b` (whose insertion point the lowering moves between regions)."""

    def __init__(self, b: Builder, fn: Function):
        self.b = b
        self.fn = fn
        self._prologue = 0                         # ops hoisted so far, at the top of fn's body
        self._hoisted: dict[tuple, Value] = {}
        self._hoisted_values: set[Value] = set()
        self._memo: dict[tuple, Value] = {}        # extracts and splats, per block

    def create(self, name: str, operands: Sequence[Value] = (), attrs: dict | None = None,
               result_types: list[Type] | None = None, regions: list[Block] | None = None) -> Operation:
        return self.b.create(name, list(operands), attrs, result_types, regions)

    def emit(self, name: str, *operands: Value, attrs: dict | None = None, type: Type | None = None) -> Value:
        """One op with one result at the insertion point."""
        return self.create(name, operands, attrs, [type] if type is not None else None).result

    def hoist(self, name: str, operands: Sequence[Value] = (), attrs: dict | None = None,
              type: Type | None = None) -> Value:
        """One op with one result in the kernel's prologue (operands must be hoisted too), created once."""
        attrs = dict(attrs or {})
        key = (name, tuple(id(v) for v in operands), tuple(sorted((k, repr(v)) for k, v in attrs.items())), type)
        value = self._hoisted.get(key)
        if value is None:
            saved_loc, self.b.loc = self.b.loc, None
            with self.b.at(Block()) as scratch:
                op = self.create(name, operands, attrs, [type] if type is not None else None)
            self.b.loc = saved_loc
            scratch.ops.clear()
            self.fn.body.ops.insert(self._prologue, op)
            op.parent = self.fn.body
            self._prologue += 1
            value = self._hoisted[key] = op.result
            self._hoisted_values.add(value)
        return value

    @contextmanager
    def in_prologue(self) -> Iterator[None]:
        """Ops emitted in the `with` block go to the kernel's prologue, after what is hoisted so far (for setup
        that loops must not repeat, such as mbarriers a persistent kernel's tiles share); their operands must
        be defined there too."""
        saved_loc, self.b.loc = self.b.loc, None
        with self.b.at(Block()) as scratch:
            yield
        self.b.loc = saved_loc
        body = self.fn.body
        for op in scratch.ops:
            body.ops.insert(self._prologue, op)
            op.parent = body
            self._prologue += 1

    def is_hoisted(self, value: Value) -> bool:
        """Whether `value` is shared kernel-wide (so it keeps its own name, not the tile value's it stands for)."""
        return value in self._hoisted_values

    def const(self, value, dtype: dt.DType = dt.i32) -> Value:
        return self.hoist("constant", attrs={"value": _attr_value(value, dtype)}, type=ScalarType(dtype))

    def const_regs(self, values: Sequence, dtype: dt.DType) -> Value:
        """A regs<N x dtype> holding `values`, hoisted."""
        values = [_attr_value(v, dtype) for v in values]
        t = RegsType(ScalarType(dtype), len(values))
        if all(v == values[0] for v in values):
            return self.hoist("constant", attrs={"value": values[0]}, type=t)
        return self.hoist("pack", [self.const(v, dtype) for v in values])

    def extract(self, regs: Value, index: int) -> Value:
        key = ("extract", regs, index, id(self.b.block))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.emit("extract", regs, attrs={"index": index})
        return value

    def unpack(self, regs: Value) -> list[Value]:
        return [self.extract(regs, i) for i in range(regs.type.count)]

    def pack(self, scalars: Sequence[Value]) -> Value:
        """A register array from scalars (the source array itself when they are all of its registers, in order)."""
        first = scalars[0]
        owner = first.owner
        if isinstance(owner, Operation) and owner.name == "extract":
            source = owner.operands[0]
            if source.type.count == len(scalars) and all(
                    isinstance(s.owner, Operation) and s.owner.name == "extract" and s.owner.operands[0] is source
                    and s.owner.attrs["index"] == i for i, s in enumerate(scalars)):
                return source
        return self.emit("pack", *scalars)

    def splat(self, scalar: Value, count: int) -> Value:
        key = ("splat", scalar, count, id(self.b.block))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.emit("splat", scalar, type=RegsType(scalar.type, count))
        return value

    def cast(self, value: Value, dtype: dt.DType) -> Value:
        t = value.type
        target = RegsType(ScalarType(dtype), t.count) if isinstance(t, RegsType) else ScalarType(dtype)
        return value if t == target else self.emit("cast", value, type=target)

    @contextmanager
    def when(self, cond: Value) -> Iterator[None]:
        """Ops emitted in the `with` block run only where `cond` holds: `if cond { ... }`, no else, no results."""
        then, otherwise = Block(), Block()
        with self.b.at(then):
            yield
            self.create("yield")
        with self.b.at(otherwise):
            self.create("yield")
        self.create("if", [cond], None, [], [then, otherwise])


def _attr_value(value, dtype: dt.DType):
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(value)
    return float(value)
