"""Small tools that passes use to change IR in place.

Ops know their operands but not their users, so replacing a value means
rewriting the operands of the ops that use it:

* `replace_all_uses(fn, old, new)` and `replace_uses(fn, mapping)` walk every
  op of a function (nested regions too) and substitute operands.
* A pass that walks a function in program order can do better: since every
  use of a value follows its definition in that order (the verifier's
  scoping rule), it can record replacements in a dict as it goes and call
  `remap_operands(op, mapping)` on each op it reaches, one walk in all.

`inline_region` moves a region's ops out (substituting its block arguments)
so they can be spliced before the op that owned the region; `clone_op`,
`clone_block` and `clone_function` copy IR; `splice` and `erase_op` edit
blocks; `use_counts` counts the uses of every value.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator

from tessera.ir.core import Block, Function, Operation, Value


def replace_all_uses(fn: Function, old: Value, new: Value) -> None:
    """Make every op of `fn` (nested regions included) use `new` where it used `old`."""
    replace_uses(fn, {old: new})


def replace_uses(fn: Function, mapping: dict[Value, Value]) -> None:
    """Substitute operands of every op of `fn` by `mapping` (chains a -> b -> c are followed)."""
    if mapping:
        for op in fn.walk():
            remap_operands(op, mapping)


def resolve(mapping: dict[Value, Value], value: Value) -> Value:
    """The value `value` stands for after the replacements in `mapping`."""
    while value in mapping:
        value = mapping[value]
    return value


def remap_operands(op: Operation, mapping: dict[Value, Value]) -> None:
    """Substitute `op`'s own operands (not those of ops nested in it) by `mapping`."""
    if mapping and any(v in mapping for v in op.operands):
        op.operands = [resolve(mapping, v) for v in op.operands]


def walk_ops(ops: Iterable[Operation]) -> Iterator[Operation]:
    """`ops` and every op nested in their regions, in program order."""
    for op in ops:
        yield from op.walk()


def use_counts(fn: Function) -> Counter[Value]:
    """How many operand slots of `fn`'s ops (nested regions included) hold each value."""
    counts: Counter[Value] = Counter()
    for op in fn.walk():
        counts.update(op.operands)
    return counts


def enclosing_function(op: Operation) -> Function | None:
    """The function `op` sits in, or None for a detached op."""
    parent = op.parent
    while isinstance(parent, Block):
        owner = parent.parent
        if isinstance(owner, Function):
            return owner
        parent = owner.parent if isinstance(owner, Operation) else None
    return None


# ---------------------------------------------------------------------------
# Editing blocks


def splice(op: Operation, new_ops: list[Operation]) -> None:
    """Replace `op` in its block by `new_ops` (possibly none), in order."""
    block = op.parent
    index = _index_in(block, op)
    for new in new_ops:
        new.parent = block
    block.ops[index:index + 1] = new_ops
    op.parent = None


def erase_op(op: Operation) -> None:
    """Remove `op` (and its regions) from its block. Its results must be unused."""
    splice(op, [])


def inline_region(region: Block, args: list[Value]) -> tuple[list[Operation], list[Value]]:
    """Take `region`'s ops out of it, its block arguments replaced by `args`.

    Returns the ops except the terminator, ready to be spliced into an
    enclosing block, and the values the terminator passed on (`yield`'s
    operands), also with the arguments replaced. The region is left empty.
    """
    if len(args) != len(region.args):
        raise ValueError(f"region takes {len(region.args)} arguments, got {len(args)}")
    mapping = dict(zip(region.args, args))
    ops = list(region.ops)
    region.ops = []
    terminator = ops.pop() if ops and ops[-1].name in ("yield", "condition") else None
    for op in walk_ops(ops):
        remap_operands(op, mapping)
    passed = [resolve(mapping, v) for v in terminator.operands] if terminator is not None else []
    for op in ops:
        op.parent = None
    return ops, passed


def clone_function(fn: Function) -> Function:
    """A deep copy of `fn`, sharing nothing mutable with it."""
    return Function(fn.name, clone_block(fn.body, {}), dict(fn.attrs), fn.loc)


def clone_op(op: Operation, mapping: dict[Value, Value]) -> Operation:
    """A copy of `op` (regions deeply copied) with operands substituted by `mapping`.

    `mapping` gains old -> new entries for the copy's results and for the
    values defined in its regions, so clones of later ops can refer to them.
    """
    regions = [clone_block(region, mapping) for region in op.regions]
    copy = Operation(op.name, [resolve(mapping, v) for v in op.operands], [r.type for r in op.results],
                     dict(op.attrs), regions, op.loc, [r.name_hint for r in op.results])
    mapping.update(zip(op.results, copy.results))
    return copy


def clone_block(block: Block, mapping: dict[Value, Value]) -> Block:
    """A copy of `block` (arguments and ops); `mapping` gains the old -> new values."""
    copy = Block([a.type for a in block.args], [a.name_hint for a in block.args])
    mapping.update(zip(block.args, copy.args))
    for op in block.ops:
        copy.append(clone_op(op, mapping))
    return copy


def _index_in(block: Block | None, op: Operation) -> int:
    if block is not None:
        for i, candidate in enumerate(block.ops):
            if candidate is op:
                return i
    raise ValueError(f"op '{op.name}' is not in the block it names as its parent")
