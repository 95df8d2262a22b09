"""How wide the memory accesses of a tile function may be, from the alignment analysis.

Two questions, asked of the same facts (`tessera.passes.alignment`):

* for layout assignment, how many elements along the last dim one thread
  should hold in a row (`*_layout_width`): the pointer's contiguity (for
  views: a unit last stride), capped at the widest access. Alignment,
  masks and view bounds are ignored: they only decide whether the access
  can be one wide instruction, while contiguity decides which layout
  coalesces, and two accesses of one tile that differ only in alignment
  should not force a layout conversion between them;
* for lowering, how many registers one access may move (`access_width`):
  everything the vector promise needs, masks and bounds included. The
  lowering takes the smaller of this and the layout's contiguity.
"""

from __future__ import annotations

from tessera.ir.core import Function, Operation, Value
from tessera.ir.types import TileType

from .. import alignment
from ..alignment_lattice import pow2_at_most


class VectorFacts:
    """Alignment facts of one tile function, asked in vector-width terms."""

    def __init__(self, fn: Function):
        self.facts = alignment.analyze(fn)

    def pointer_layout_width(self, ptr: Value, element_bits: int, max_bits: int) -> int:
        """Elements per thread for a load/store through the pointer tile `ptr` (mask ignored)."""
        info = self.facts.get(ptr)
        if not isinstance(ptr.type, TileType) or info is None or not info.rank:
            return 1
        return max(1, min(info.contiguity[-1], pow2_at_most(max_bits // element_bits)))

    def view_layout_width(self, op: Operation, element_bits: int, max_bits: int) -> int:
        """Elements per thread for a view load/store (bounds ignored)."""
        view = self.facts.get(op.operands[0])
        if view is None or not view.unit_stride[-1]:
            return 1
        return pow2_at_most(max_bits // element_bits)

    def access_width(self, op: Operation, max_bits: int) -> int:
        """Registers one access of `op` may move (alignment, contiguity, mask/bounds constancy)."""
        try:
            return alignment.access_width(self.facts, op, max_bits)
        except KeyError:
            return 1
