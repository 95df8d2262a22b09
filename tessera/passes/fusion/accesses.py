"""What a launch's tile IR does to memory, and which of its values two launches compute alike.

`Keys` gives every value of a launch a key such that two values (of one
launch or of two, keyed with one shared `Keys`) with equal keys hold equal
lanes in the same program instance: parameters by the name they are bound
to, and pure ops without regions by their name, attributes, result type
and operands' keys (sorted for commutative ops). Anything else (loads,
loop results) is a key of its own, equal to nothing but itself. The op
traits decide: `pure`, `reads_memory`, `commutative` (ir/ops.py).

`accesses(launch, keys)` lists the launch's memory accesses: each load or
store of a view block or through pointers, with the buffer it reaches (the
name bound to the pointer parameter its address derives from), whether it
sits at the top level of the kernel (not inside a loop or branch), and the
keys that say which lanes it touches. Any other op that reads or writes
memory is an access of an unknown kind; one whose address cannot be traced
to a parameter has buffer None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from tessera.ir.core import Function, Operation, Value
from tessera.ir.ops import OPS

from .launches import Launch

# Ops whose result points into the buffer their first operand points into.
_POINTER_PATH = ("addptr", "splat", "broadcast", "expand_dims", "reshape", "permute", "make_view")


class Keys:
    """Keys of values across launches (see the module docstring); interned as small ints."""

    def __init__(self):
        self.table: dict[Any, int] = {}
        self.memo: dict[Value, int] = {}
        self.params: dict[Value, str] = {}

    def bind(self, launch: Launch) -> "Keys":
        self.params.update(zip(launch.fn.args, launch.bind))
        return self

    def __call__(self, value: Value) -> int:
        key = self.memo.get(value)
        if key is None:
            key = self._intern(self._structure(value))
            self.memo[value] = key
        return key

    def _intern(self, structure: Any) -> int:
        return self.table.setdefault(structure, len(self.table))

    def _structure(self, value: Value) -> Any:
        if value in self.params:
            return ("param", self.params[value], str(value.type))
        op = value.owner
        if not isinstance(op, Operation) or not _computes_alike(op):
            return ("opaque", id(value))
        operands = [self(v) for v in op.operands]
        if OPS[op.name].commutative:
            operands.sort()
        attrs = tuple(sorted((k, _hashable(v)) for k, v in op.attrs.items()))
        return (op.name, attrs, str(value.type), value.index, tuple(operands))


def _computes_alike(op: Operation) -> bool:
    """Whether two instances of `op` with equal operands compute equal results: pure, no regions, no memory."""
    opdef = OPS.get(op.name)
    return opdef is not None and opdef.pure and not opdef.has_regions and not opdef.reads_memory


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Access:
    """One memory access of a launch."""

    op: Operation
    kind: str                    # "view_load", "view_store", "load", "store", or "other"
    buffer: Optional[str]        # the bound name of the buffer reached; None when not traceable
    top_level: bool              # directly in the kernel's body, not in a loop or branch
    where: tuple[int, ...] = ()  # keys of the lanes touched: view, offsets and block shape; or pointers and mask

    @property
    def writes(self) -> bool:
        return OPS[self.op.name].writes_memory

    @property
    def reads(self) -> bool:
        return OPS[self.op.name].reads_memory


def accesses(launch: Launch, keys: Keys) -> list[Access]:
    """Every op of the launch that reads or writes memory, in program order."""
    params = dict(zip(launch.fn.args, launch.bind))
    found = []
    for op, top in _walk(launch.fn):
        opdef = OPS[op.name]
        if not (opdef.reads_memory or opdef.writes_memory):
            continue
        found.append(_describe(op, top, params, keys))
    return found


def _walk(fn: Function):
    for op in fn.body.ops:
        yield op, True
        for region in op.regions:
            for inner in region.ops:
                for nested in inner.walk():
                    yield nested, False


def _describe(op: Operation, top: bool, params: dict[Value, str], keys: Keys) -> Access:
    if op.name in ("view_load", "view_store"):
        offsets = op.operands[1:] if op.name == "view_load" else op.operands[1:-1]
        shape = op.attrs["shape"] if op.name == "view_load" else _value_shape(op)
        where = (keys(op.operands[0]), *(keys(v) for v in offsets), hash(tuple(shape)))
        return Access(op, op.name, buffer_of(op.operands[0], params), top, where)
    if op.name in ("load", "store"):
        mask = _mask_of(op)
        where = (keys(op.operands[0]), keys(mask) if mask is not None else -1)
        return Access(op, op.name, buffer_of(op.operands[0], params), top, where)
    pointer = op.operands[0] if op.operands else None
    return Access(op, "other", buffer_of(pointer, params) if pointer is not None else None, top)


def _value_shape(op: Operation) -> tuple[int, ...]:
    return tuple(op.operands[-1].type.shape)


def _mask_of(op: Operation) -> Optional[Value]:
    """A load's (pointers, mask, other) or a store's (pointers, value, mask): the mask, if any."""
    index = 1 if op.name == "load" else 2
    return op.operands[index] if len(op.operands) > index else None


def buffer_of(value: Value, params: dict[Value, str]) -> Optional[str]:
    """The bound name of the pointer parameter `value`'s addresses derive from, through pointer arithmetic,
    splats, shape ops and views; None when they come from anywhere else (a loaded address, say)."""
    while True:
        if value in params:
            return params[value]
        op = value.owner
        if not isinstance(op, Operation) or op.name not in _POINTER_PATH or not op.operands:
            return None
        value = op.operands[0]
