"""CSE: compute each pure value once.

Two ops compute the same value when they are the same side-effect-free op
(`OpDef.pure`, no regions) applied to the same operands with the same
attributes and result types; the frontend emits many such twins (a
`constant 16` per use, `mul %pid, 16` for every block index, a `splat` of
the same pointer for each access). This pass keeps the first of each and
makes users of the others use it. An op may be replaced by one in its own
block or in an enclosing one, whose value is visible to it, but never by an
op inside a region, whose value is not visible outside it. Loads, stores and
other ops with side effects are never merged: memory may change between two
loads, and a load can fault. Merged-away ops are removed.
"""

from __future__ import annotations

from typing import Hashable

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.printer import format_attrs
from tessera.ir.types import scalar_dtype

from .manager import FunctionPass
from .rewrite import remap_operands


def cse_function(fn: Function) -> bool:
    """Merge identical pure ops of `fn` in place; whether any was merged."""
    return _Eliminator().block(fn.body, [])


def op_key(op: Operation) -> Hashable | None:
    """What identifies the value `op` computes, or None if `op` must not be merged.

    Attributes are compared by their printed text, so 0.0 and -0.0 differ
    (Python's == would merge them) and NaN equals NaN; a constant's value by
    its bits in the result dtype.
    """
    opdef = OPS.get(op.name)
    if opdef is None or not opdef.pure or opdef.terminator or op.regions or not op.results:
        return None
    value = _constant_bits(op) if op.name == "constant" else None
    attrs = value if value is not None else format_attrs(op.attrs)
    return op.name, tuple(op.operands), attrs, tuple(r.type for r in op.results)


def _constant_bits(op: Operation) -> bytes | None:
    """A constant's value as the bits it has in its dtype: `1` and `1.0` are one f32."""
    dtype = scalar_dtype(op.results[0].type)
    try:
        return dtype.encode(dtype.quantize(op.attrs["value"])).tobytes()
    except (TypeError, ValueError, OverflowError):  # a value numpy cannot hold: compare the text
        return None


class _Eliminator:
    def __init__(self):
        self.replaced: dict[Value, Value] = {}

    def block(self, block: Block, enclosing: list[dict]) -> bool:
        """Walk `block` in program order; `enclosing` holds the scopes of outer blocks, innermost last."""
        scopes = enclosing + [{}]
        changed = False
        kept = []
        for op in block.ops:
            remap_operands(op, self.replaced)  # uses follow definitions: earlier merges reach every use
            for region in op.regions:
                changed |= self.block(region, scopes)
            key = op_key(op)
            twin = _lookup(scopes, key) if key is not None else None
            if twin is None:
                if key is not None:
                    scopes[-1][key] = op
                kept.append(op)
                continue
            self.replaced.update(zip(op.results, twin.results))
            op.parent = None
            changed = True
        block.ops = kept
        return changed


def _lookup(scopes: list[dict], key: Hashable) -> Operation | None:
    for scope in reversed(scopes):
        twin = scope.get(key)
        if twin is not None:
            return twin
    return None


class CSE(FunctionPass):
    """The pass object for `PassManager` (see the module docstring)."""

    name = "cse"
    rewrite = staticmethod(cse_function)
