"""`Lowering`: the state of one tile -> thread lowering, which every op family's lowering function receives.

It maps each tile-IR value to its lowered form (`values.py`: a `Regs` of
registers in the value's assigned layout, a scalar, a view's parts, a ring
slot), converting operands and results to the layouts layout assignment
chose, and emits thread IR through the `Emitter` verbs it inherits. The
jobs around it are small helpers with fields of their own: `index`
(thread-id index math, `thread_index.py`), `threads` (who still runs and
what a barrier is, `thread_groups.py`), `smem` (exchanges through shared
memory and mbarriers, `shared_exchange.py`); moving tiles between layouts is
`relayout.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from tessera.ir.builder import Builder
from tessera.ir.core import Block, Function, Module, Operation, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.target import Target
from tessera.ir.types import RegsType, TileType, Type, ViewType

from ..errors import LoweringError
from ..layout_assignment import LayoutAssignment
from .emitter import Emitter
from .relayout import convert, materialize
from .shared_exchange import SharedExchange
from .thread_groups import ThreadGroups
from .thread_index import ThreadIndex
from .values import Regs, ViewParts
from .vector_facts import VectorFacts

if TYPE_CHECKING:
    from ..schedule.tma_fill import TmaBox


class Lowering(Emitter):
    """Lowers one tile-IR function to thread IR; op families add to it through `LOWERINGS`."""

    def __init__(self, fn: Function, assignment: LayoutAssignment, target: Target, facts: VectorFacts | None = None):
        self.src = fn
        self.assignment = assignment
        self.target = target
        self.facts = facts or VectorFacts(fn)
        self.num_threads = assignment.num_threads
        self.warp_size = assignment.warp_size
        self.module = Module()
        b = Builder(self.module)
        attrs = dict(fn.attrs)
        attrs.update(num_threads=self.num_threads, warp_size=self.warp_size, target=target.name)
        super().__init__(b, b.function(fn.name, [a.type for a in fn.args], [a.name_hint for a in fn.args], attrs))
        self.fn.loc = fn.loc
        self.env: dict[Value, Any] = {}
        for old, new in zip(fn.args, self.fn.args):
            if isinstance(old.type, TileType):
                raise LoweringError("tiles as kernel parameters have no thread-level form; pass a pointer and "
                                    "load the tile in the kernel", kernel=fn.name)
            if isinstance(old.type, ViewType):
                raise LoweringError("tensor views as kernel parameters are not lowered yet; pass the base "
                                    "pointer, sizes and strides and call make_view in the kernel", kernel=fn.name)
            self.env[old] = new
        self.index = ThreadIndex(self, self.num_threads)
        self.threads = ThreadGroups(self)
        self.smem = SharedExchange(self, self.index, self.threads, target, fn.name)
        self.materialized: dict[tuple[Value, RegisterLayout, int], Regs] = {}    # pointer tiles rebuilt, per block
        # the TMA box of each copy onto each language mbarrier array (None: not TMA-backed), planned once and
        # asked by its alloc, copies and waits (`schedule/mbarriers.py`)
        self.mbarrier_boxes: dict[Operation, dict[Operation, TmaBox] | None] = {}
        self.notes: list[str] = []
        # ops before a warp-specialized loop lowered in its consumers' branch instead (`schedule/consumer_prologue.py`)
        self.deferred: frozenset[Operation] = frozenset()
        # warp-specialized loops their tile loop could not specialize, with the reason (op to point at, message),
        # reported when the loop itself is lowered (`schedule/loops.py`)
        self.refused_specializations: dict[Operation, tuple[Operation, str]] = {}
        # what to emit right after a tile-IR op's lowering, by key (once per key): a persistent tile loop's one
        # cluster barrier at its end (`schedule/tma_fill.py`); `lower_op` runs them, `lower_to_threads` checks
        # that none is left
        self.after: dict[Operation, dict[str, Callable[[], None]]] = {}
        self.debug = False          # keep print and assert (a debug build); set by lower_to_threads
        # TMA stores in a loop body leave their read-wait to the next iteration's write (`schedule/tma_store.py`;
        # off: each store waits at once); the tile-IR loops whose final wait is still to come after them
        self.overlap_stores = True
        # C tiles stored from their registers (pairs, stmatrix) go out a column block at a time through
        # `STAGING_SLOTS` block-sized slots, not a whole-tile buffer (`schedule/tma_store.py`; set where the
        # whole tile does not fit)
        self.slice_stores = False
        self.overlapped_stores: set[Operation] = set()
        # whether some view_store of the kernel may take a TMA store, so that releases complete them first
        # (`schedule/tma_store.complete_before_release`); None until asked
        self.may_store_by_tma: bool | None = None
        # wgmma operands computed before a loop and stored into shared memory once, before it
        # (`wgmma_dot.stage_invariant_operands`): tile-IR value -> its `SharedOperand`
        self.staged: dict[Value, Any] = {}
        # staged operands a TMA load is still filling: tile-IR value -> (the mbarrier, the parity of the phase
        # that says they landed: 0, or in a tile loop the tile's count mod 2), waited for by the first lowering
        # that reads them (`schedule/tma_operand.py`); and that pass's plan of each block load it was asked about
        self.landing: dict[Value, tuple[Value, Value]] = {}
        self.tma_operands: dict[Operation, Any] = {}
        self.used: set[Value] = {v for op in fn.walk() for v in op.operands}

    # -- types and values -------------------------------------------------------

    def thread_type(self, value: Value) -> Type:
        t = value.type
        if isinstance(t, TileType):
            return RegsType(t.element, self.assignment.layout(value).local_size)
        return t

    def lookup(self, value: Value) -> Any:
        try:
            return self.env[value]
        except KeyError:
            raise LoweringError(f"internal error: {value!r} was not lowered before its use", kernel=self.src.name)

    def operand(self, op: Operation, index: int) -> Any:
        """Operand `index` of tile op `op`, lowered and converted to the layout `op` reads it in."""
        value = self.lookup(op.operands[index])
        want = self.assignment.conversions.get((op, index))
        if want is not None and isinstance(value, Regs) and value.layout != want:
            value = materialize(self, op.operands[index], want)
        return value

    def operands(self, op: Operation) -> list[Any]:
        return [self.operand(op, i) for i in range(len(op.operands))]

    def define(self, result: Value, lowered: Any, op: Operation | None = None) -> None:
        """Bind tile-IR `result` to its lowered form, converting to the assigned layout if needed."""
        if isinstance(lowered, Regs):
            want = self.assignment.layout(result)
            if lowered.layout != want:
                lowered = convert(self, lowered, want, op)
        thread_value = lowered.value if isinstance(lowered, Regs) else lowered
        if (isinstance(thread_value, Value) and not thread_value.name_hint and result.name_hint
                and not self.is_hoisted(thread_value)):
            thread_value.name_hint = result.name_hint
        self.env[result] = lowered

    def thread_value(self, lowered: Any) -> Value:
        """The thread-IR value of a lowered operand (a Regs' registers, or the scalar itself)."""
        if isinstance(lowered, Regs):
            return lowered.value
        if isinstance(lowered, ViewParts):
            raise LoweringError("a tensor view cannot be carried through control flow or stored yet",
                                kernel=self.src.name)
        return lowered

    def error(self, op: Operation | None, message: str) -> LoweringError:
        return LoweringError(message, op, self.src.name)

    # -- regions ---------------------------------------------------------------------

    def lower_block(self, block: Block, into: Block, args: Sequence[Any]) -> None:
        """Lower the ops of tile-IR `block` into thread-IR block `into`, its arguments bound to `args`."""
        from . import lower_op
        for old, new in zip(block.args, args):
            self.env[old] = new
        with self.b.at(into):
            for op in block.ops:
                if op not in self.deferred:
                    lower_op(self, op)

    def region_args(self, block: Block, into: Block) -> list[Any]:
        """Lowered forms of `block`'s arguments, given the thread-IR block whose arguments stand for them."""
        out = []
        for old, new in zip(block.args, into.args):
            out.append(Regs(new, self.assignment.layout(old)) if isinstance(old.type, TileType) else new)
        return out

    def new_block(self, block: Block) -> Block:
        """A thread-IR block with the lowered types of `block`'s arguments."""
        return Block([self.thread_type(a) for a in block.args], [a.name_hint for a in block.args])
