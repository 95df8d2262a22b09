"""DCE: remove ops whose results nobody uses and that do nothing else.

Canonicalization and CSE leave behind ops whose results lost their last use
(the constants of a folded expression, the twins CSE merged away), and the
frontend emits values a kernel never reads. An op can go when none of its
results is used and running it has no effect besides computing them: a pure
op (`OpDef.pure`), including one with a combine region of pure ops, an `if`
whose regions hold only such ops, and a `for` whose body does and whose
step is a nonzero constant (so it is known to finish). Everything else
stays even if its results are unused: stores, atomics, prints, asserts,
barriers, `while` loops (which may not terminate), and loads, which are not
pure because they can fault. Removal runs backwards through each block, so
an op that only fed removed ops (in its block or in regions nested later)
goes in the same walk.
"""

from __future__ import annotations

from collections import Counter

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS

from .manager import FunctionPass
from .rewrite import use_counts

_REGION_ENDS = ("yield", "condition")  # hand values to the parent op: no effect of their own


def dce_function(fn: Function) -> bool:
    """Remove dead ops from `fn` in place; whether any was removed."""
    return _sweep(fn.body, use_counts(fn))


def has_effects(op: Operation) -> bool:
    """Whether running `op` may do anything besides computing its results."""
    opdef = OPS.get(op.name)
    if opdef is None:
        return True
    if op.name in _REGION_ENDS:
        return False
    if op.name == "for" and not _nonzero_constant(op.operands[2]):
        return True
    if not opdef.pure and op.name not in ("if", "for"):
        return True
    return any(has_effects(inner) for region in op.regions for inner in region.ops)


def _sweep(block: Block, uses: Counter[Value]) -> bool:
    changed = False
    kept: list[Operation] = []
    for op in reversed(block.ops):
        for region in op.regions:
            changed |= _sweep(region, uses)
        if _dead(op, uses):
            for inner in op.walk():
                uses.subtract(inner.operands)
            op.parent = None
            changed = True
        else:
            kept.append(op)
    block.ops = kept[::-1]
    return changed


def _dead(op: Operation, uses: Counter[Value]) -> bool:
    opdef = OPS.get(op.name)
    if opdef is None or opdef.terminator:
        return False
    return all(uses[r] == 0 for r in op.results) and not has_effects(op)


def _nonzero_constant(value: Value) -> bool:
    owner = value.owner
    return isinstance(owner, Operation) and owner.name == "constant" and owner.attrs["value"] != 0


class DCE(FunctionPass):
    """The pass object for `PassManager` (see the module docstring)."""

    name = "dce"
    rewrite = staticmethod(dce_function)
