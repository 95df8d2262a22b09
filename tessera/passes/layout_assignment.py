"""Layout assignment: pick a register layout for every tile value of a function.

Before tile IR can become per-thread code, every tile needs a
`RegisterLayout` (see `tessera.ir.layouts`): which of the block's
`num_warps * warp_size` threads holds which element, in which register.
This pass chooses them; `lower_to_threads` then follows them.

The default is Triton's "blocked" layout (`blocked_layout`): each thread
holds `v` elements contiguous along the last dim (one vector access), the
lanes of a warp spread over the last dim first and then the outer dims, the
warps over the outer dims first, and what is left over repeats as more
registers per thread (or, for tiles smaller than the block, as replicated
threads). In the layout algebra, for a 2-D tile:

    local(R0, R1) . replicated(rw) . spatial(W0, W1) . replicated(rl) . spatial(T0, T1) . local(1, v)

Rules, applied to a fixpoint (each rule only fills values that have no
layout yet, so the first layout to reach a value wins):

1. pinned: `overrides` (value -> layout) are set first and never change
   (`pinned_layouts(fn)` gives the pins of the IR's `convert_layout` ops,
   which `thread_passes.lower` passes). The operand of a pinned
   `convert_layout` that nothing else uses takes the pinned layout too, so
   that `load(..., layout=L)` loads straight into L.
2. anchors: a dot that runs on a matrix instruction (`mma.mma_plan`:
   f16/bf16 inputs, f32 accumulator, multiples of the instruction's shape:
   mma.sync 16x8x16 on NVIDIA, MFMA 32x32x8 or 16x16x16 on AMD, 32x32x16
   or 16x16x32 on gfx950) gets the
   instruction's accumulator layout on its result, and asks for its A and
   B operands in the matching fragment layouts (as conversions, below).
   The tiles of memory ops (pointer loads/stores/atomics: the
   pointer, value, mask and result; view loads: the result; view stores:
   the value) get `blocked_layout(shape, v)`, where `v` is how many
   elements along the last dim the alignment analysis proves contiguous
   (pointer tiles; for views: 128 bits' worth when the last stride is the
   constant 1, else 1), at most 128 bits / element bits (see
   `lowering/vector_facts.py`). Whether the access is then one wide
   instruction (alignment, masks) is the lowering's business. Program
   order decides between anchors; an anchor whose tiles already have a
   layout adds nothing.
3. propagation, forward and backward:
   * elementwise ops (arithmetic, math, cmp, select, cast, bitcast,
     addptr), the operands and results of one memory op, a scan's
     operand and result, a dot's accumulator and result, and each carried
     value of `for`/`while`/`if` (initial value, region argument, yielded
     value, result) share one layout;
   * reduce / arg_reduce: result = `operand.reduce(axis, keepdims=False)`
     (the reduced dim's threads become replication);
   * expand_dims and reshape: the same layout with a size-1 dim inserted,
     or its modes regrouped into the new dims (`RegisterLayout.reshape`;
     both directions), so that splitting K into groups of a block scale
     and merging them back moves no data;
   * permute: `operand.permute(order)` (both directions);
   * broadcast: operand = `result.reduce(broadcast dims)` (backward only:
     the replicated operand then broadcasts without moving data);
   * convert_layout: the same layout (both directions; the pin usually
     decides the result).
   Loops first: a loop's carried group (rule 3's `for`/`while` slots)
   takes the layout of its slots inside the loop -- the region argument
   and the yielded value -- whenever one has a layout, even when the loop's
   result already has another (a store after the loop anchored it). The
   first propagation runs to a fixpoint with that preference only (a group
   whose in-loop slots are all open waits), the next lets the initial
   value and the result decide what the body leaves open. The walk ties a
   loop's groups when it enters the loop and again when it leaves it, so
   what the body decided reaches the result before the code after the loop
   is visited. So a K loop's accumulator keeps the dot's accumulator
   layout rather than that of the store of `acc` after the loop: a
   conversion inside the body costs once per iteration, one at the loop's
   boundary once.
4. defaults: while some tile has no layout, the first one in program
   order gets `blocked_layout(shape, 128 bits / element bits)` and rule 3
   runs again.

Where an op's operand ends up with a layout other than the one the op
needs (two anchors that disagree, a pinned layout, a carried value whose
initial and yielded layouts differ), the assignment records a conversion
for that operand in `conversions`: the lowering moves it through shared
memory (or, when each thread already holds what it needs, by renaming
registers). A view store whose anchor gave its value a layout that the
loops-first rule then overruled (the value is a loop's result) converts
the value back to the anchor's layout, once, after the loop. A store that
may take its value as it is (`STORE_KEEPS_LAYOUT`: a 16-bit accumulator
stored by stmatrix, or a 32-bit one by register pairs, for a TMA store) anchors softly: the value takes what
propagation gives it; if the store cannot take that, the assignment runs
again with that store anchored like any other. Shape ops
(broadcast, expand_dims, reshape, permute, convert_layout), reduce operands and FMA dot operands accept any layout: the
lowering re-indexes or goes through shared memory as needed, so they never
need a conversion; tensor-core dot operands are converted to their
fragment layouts.
Pointer tiles lead their groups (a load's or store's pointer, an addptr's
base come before masks and offsets), so conflicts land on data rather than
on pointers, which can only be rebuilt, not moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.layouts import LayoutError, RegisterLayout, local, parse_layout, replicated, spatial
from tessera.ir.ops import OPS
from tessera.ir.target import Target
from tessera.ir.types import PointerType, TileType, Type, element_of

from .alignment_lattice import pow2_at_most
from .errors import LoweringError
from .mma import RESIDENT_OPERAND_REGISTERS, mma_plan

LOOPS = frozenset(["for", "while"])

# Predicates (view_store, the layout its value ended up with, target, `VectorFacts`, num_warps) -> whether the
# store takes the value in that layout as it is, so the anchor's conversion back is not recorded: the TMA
# store's stmatrix and pair paths (`schedule/tma_store.py`) store a 16-bit or 32-bit accumulator straight from
# its registers.
# Asked with layout None first (may the store take some layout as it is?): if so the store's anchor is soft,
# it gives the value no layout and only converts back to it after propagation when the store cannot take
# what the value got.
STORE_KEEPS_LAYOUT: list = []


def element_bits(t: Type) -> int:
    """Bits of one element in memory: the pointee for pointers; bool takes a byte, and sub-byte types their
    packed width (so 128 bits' worth of u4 is 32 elements, one wide load of packed bytes)."""
    elem = element_of(t)
    return elem.pointee.bits if isinstance(elem, PointerType) else elem.dtype.bits


def _split(available: int, extent: int) -> int:
    """How many of `available` threads to put on a dim of `extent` groups (a common divisor)."""
    return math.gcd(available, extent)


def blocked_layout(shape: tuple[int, ...], vector: int, num_warps: int, warp_size: int) -> RegisterLayout:
    """Triton's blocked layout of `shape` over num_warps * warp_size threads (see the module docstring).

    `vector` elements per thread along the last dim (reduced to a divisor of
    it, and to what leaves every thread an element when the tile is small);
    lanes fill the last dim first, warps the first dim first; the rest
    repeats as registers, and too few elements leave threads replicated.
    """
    rank = len(shape)
    # Fewer elements per thread when the tile is small, so that every thread gets some (as Triton does).
    vector = min(vector, max(math.prod(shape) // (num_warps * warp_size), 1))
    v = math.gcd(max(vector, 1), shape[-1])
    per_thread = [1] * (rank - 1) + [v]
    rest = [n // p for n, p in zip(shape, per_thread)]
    lanes, left = [1] * rank, warp_size
    for d in reversed(range(rank)):
        lanes[d] = _split(left, rest[d])
        rest[d] //= lanes[d]
        left //= lanes[d]
    lane_replication = left
    warps, left = [1] * rank, num_warps
    for d in range(rank):
        warps[d] = _split(left, rest[d])
        rest[d] //= warps[d]
        left //= warps[d]
    warp_replication = left
    return (local(*rest) * replicated(warp_replication) * spatial(*warps) * replicated(lane_replication)
            * spatial(*lanes) * local(*per_thread))


def default_vector(t: Type, max_bits: int = 128) -> int:
    """128 bits' worth of elements (a power of two), capped by the last dim."""
    shape = t.shape
    return math.gcd(pow2_at_most(max_bits // element_bits(t)), shape[-1])


@dataclass
class LayoutAssignment:
    """The layouts chosen for one function.

    layouts: every tile-typed value (op results and region arguments) -> layout.
    conversions: (op, operand index) -> the layout that operand must be
      converted to before the op uses it (absent: the operand's own layout).
    """

    function: Function
    num_warps: int
    warp_size: int
    layouts: dict[Value, RegisterLayout] = field(default_factory=dict)
    conversions: dict[tuple[Operation, int], RegisterLayout] = field(default_factory=dict)
    overrides: dict[Value, RegisterLayout] = field(default_factory=dict)

    @property
    def num_threads(self) -> int:
        return self.num_warps * self.warp_size

    def layout(self, value: Value) -> RegisterLayout:
        return self.layouts[value]

    def operand_layout(self, op: Operation, index: int) -> RegisterLayout:
        """The layout `op` reads operand `index` in (after any recorded conversion)."""
        return self.conversions.get((op, index)) or self.layouts[op.operands[index]]

    def describe(self) -> str:
        """One line per tile value and per conversion, in program order (for debugging and tests)."""
        from tessera.ir.printer import print_value
        lines = []
        for value in _tile_values(self.function):
            lines.append(f"{print_value(value)}: {self.layouts[value]}")
        for (op, i), layout in self.conversions.items():
            lines.append(f"convert operand {i} of {op.name} ({print_value(op.operands[i])}): "
                         f"{self.layouts[op.operands[i]]} -> {layout}")
        return "\n".join(lines)


def pinned_layouts(fn: Function) -> dict[Value, RegisterLayout]:
    """The layout each `convert_layout` of `fn` pins on its result, as `overrides` for `assign_layouts`."""
    pins = {}
    for op in fn.walk():
        if op.name == "convert_layout":
            try:
                pins[op.result] = parse_layout(op.attrs["layout"])
            except LayoutError as exc:
                raise LoweringError(str(exc), op, fn.name) from None
    return pins


def assign_layouts(fn: Function, target: Target, num_warps: int = 4,
                   overrides: Mapping[Value, RegisterLayout] | None = None,
                   facts=None) -> LayoutAssignment:
    """Choose a layout for every tile value of `fn` (see the module docstring)."""
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise LoweringError(f"num_warps must be a power of two, got {num_warps}", kernel=fn.name)
    threads = num_warps * target.warp_size
    if threads > target.max_threads_per_block:
        raise LoweringError(f"{num_warps} warps of {target.warp_size} threads exceed {target.name}'s "
                            f"{target.max_threads_per_block} threads per block; use fewer warps", kernel=fn.name)
    if facts is None:
        from .lowering.vector_facts import VectorFacts   # (lowering imports this module)
        facts = VectorFacts(fn)
    result = LayoutAssignment(fn, num_warps, target.warp_size)
    assigner = _Assigner(result, target, facts, dict(overrides or {}))
    assigner.run()
    if assigner.unkept_soft_stores:     # anchored softly, the store could not take what its value got:
        result = LayoutAssignment(fn, num_warps, target.warp_size)      # anchor those as every other store
        _Assigner(result, target, facts, dict(overrides or {}), hard_stores=assigner.unkept_soft_stores).run()
    return result


class _Assigner:
    def __init__(self, out: LayoutAssignment, target: Target, facts,
                 overrides: dict[Value, RegisterLayout], hard_stores: frozenset[Operation] = frozenset()):
        self.out = out
        self.target = target
        self.facts = facts
        self.layouts = out.layouts
        # (view_store, value index) -> the layout the store's anchor gave its value
        self.store_anchors: dict[tuple[Operation, int], RegisterLayout] = {}
        # view stores anchored softly (`STORE_KEEPS_LAYOUT`) unless listed in `hard_stores`, and those of them
        # that could not take their value's layout after all (`assign_layouts` then anchors them hard: a
        # conversion at the store would undo what the soft anchor was for, and costs more than one made early)
        self.hard_stores = hard_stores
        self.unkept_soft_stores: frozenset[Operation] = frozenset()
        for value, layout in overrides.items():
            self._check_pinned(value, layout)
        out.overrides = overrides
        self.layouts.update(overrides)

    def run(self) -> None:
        fn = self.out.function
        self.pin_sole_operands()
        self.hoist_invariant_operands()
        for op in fn.walk():
            self.anchor(op)
        self.propagate(loop_bodies_first=True)
        self.propagate()
        for value in _tile_values(fn):
            if value not in self.layouts:
                self.set(value, self.blocked(value.type.shape, default_vector(value.type, self.target.max_vector_bits)))
                self.propagate()
        self.record_conversions()

    # -- building blocks --------------------------------------------------------

    def blocked(self, shape: tuple[int, ...], vector: int) -> RegisterLayout:
        return blocked_layout(shape, vector, self.out.num_warps, self.out.warp_size)

    def set(self, value: Value, layout: RegisterLayout) -> bool:
        if not isinstance(value.type, TileType) or value in self.layouts:
            return False
        self.layouts[value] = layout
        return True

    def _check_pinned(self, value: Value, layout: RegisterLayout) -> None:
        t = value.type
        where = value.owner if isinstance(value.owner, Operation) else None
        if not isinstance(t, TileType):
            raise LoweringError(f"a layout was pinned on {t}, which is not a tile", where, self.out.function.name)
        if layout.shape != t.shape or layout.num_threads != self.out.num_threads:
            raise LoweringError(
                f"pinned layout {layout} covers shape {layout.shape} with {layout.num_threads} threads, but the "
                f"tile is {t} and the block has {self.out.num_threads} threads "
                f"({self.out.num_warps} warps of {self.out.warp_size}); {self._pin_fix(layout, t)}",
                where, self.out.function.name)

    def _pin_fix(self, layout: RegisterLayout, t: TileType) -> str:
        """What to change about a pin that does not fit the tile or the block."""
        threads = self.out.num_threads
        fixes = [f"pin a layout of shape {t.shape} for {threads} threads"]
        if layout.shape == t.shape:
            warps, rest = divmod(layout.num_threads, self.out.warp_size)
            if not rest and warps >= 1 and warps & (warps - 1) == 0:
                fixes.append(f"compile with num_warps={warps}")
            if layout.num_threads < threads and threads % layout.num_threads == 0:
                copies = threads // layout.num_threads
                fixes.append(f"replicate it over the other threads (`.replicated({copies})`)")
        return ", or ".join(fixes)

    def pin_sole_operands(self) -> None:
        """Rule 1, second part: a pinned convert_layout's operand used nowhere else takes the pin."""
        uses: dict[Value, int] = {}
        for op in self.out.function.walk():
            for v in op.operands:
                uses[v] = uses.get(v, 0) + 1
        for op in self.out.function.walk():
            if op.name == "convert_layout" and op.result in self.layouts and uses[op.operands[0]] == 1:
                self.set(op.operands[0], self.layouts[op.result])

    def hoist_invariant_operands(self) -> None:
        """Rule 2, first part: a tensor-core dot operand computed outside the loop the dot is in (and used
        nowhere else) takes its fragment layout where it is defined, so it is converted once rather than in
        every iteration (attention's Q block). Where ldmatrix can read it again in every iteration, such
        operands stay in registers only while they take at most `RESIDENT_OPERAND_REGISTERS` registers per
        thread together (first come, first served); the others the lowering keeps in shared memory
        (`lowering/invariant_operands.py`)."""
        uses: dict[Value, int] = {}
        for op in self.out.function.walk():
            for v in op.operands:
                uses[v] = uses.get(v, 0) + 1
        budget = RESIDENT_OPERAND_REGISTERS if self.target.has("ldmatrix") else None
        for op in self.out.function.walk():
            plan = mma_plan(op, self.target, self.out.num_warps) if op.name == "dot" else None
            if plan is None:
                continue
            for index, want in ((0, plan.a), (1, plan.b)):
                value = op.operands[index]
                if want is None or uses[value] != 1 or not _outside_loop_of(value, op):
                    continue
                registers = want.local_size * element_bits(value.type) // 32
                if budget is None or registers <= budget:
                    self.set(value, want)
                    budget = None if budget is None else budget - registers

    # -- rule 2: anchors --------------------------------------------------------

    def anchor(self, op: Operation) -> None:
        name = op.name
        if name == "dot":
            plan = mma_plan(op, self.target, self.out.num_warps)
            if plan is not None:
                self.set(op.result, plan.c)
                # A tile loaded from an explicit shared buffer is loaded straight into its fragment.
                for index, want in ((0, plan.a), (1, plan.b)):
                    producer = op.operands[index].owner
                    if want is not None and isinstance(producer, Operation) and producer.name == "smem_load":
                        self.set(op.operands[index], want)
        elif name == "smem_async_copy" and isinstance(op.operands[1].type, TileType):
            ptr = op.operands[1]        # a copy from a tile of pointers anchors it like a load
            vector = self.facts.pointer_layout_width(ptr, element_bits(ptr.type), self.target.max_vector_bits)
            self.set(ptr, self.blocked(ptr.type.shape, vector))
        elif OPS[name].pointer_lanes:
            tiles = [v for v in [*op.operands, *op.results] if isinstance(v.type, TileType)]
            if not tiles:
                return
            ptr = op.operands[0]
            vector = self.facts.pointer_layout_width(ptr, element_bits(ptr.type), self.target.max_vector_bits)
            if not any(v in self.layouts for v in tiles):
                self.set(tiles[0], self.blocked(ptr.type.shape, vector))
        elif name == "view_load":
            t = op.result.type
            self.set(op.result, self.blocked(t.shape, self.facts.view_layout_width(op, element_bits(t),
                                                                                    self.target.max_vector_bits)))
        elif name == "view_store":
            value = op.operands[-1]
            layout = self.blocked(value.type.shape, self.facts.view_layout_width(
                op, element_bits(value.type), self.target.max_vector_bits))
            if op not in self.hard_stores and self._store_keeps(op, None):
                self.store_anchors[(op, len(op.operands) - 1)] = layout     # soft: see STORE_KEEPS_LAYOUT
            elif self.set(value, layout):
                self.store_anchors[(op, len(op.operands) - 1)] = layout

    def _store_keeps(self, op: Operation, layout: RegisterLayout | None) -> bool:
        return any(keeps(op, layout, self.target, self.facts, self.out.num_warps) for keeps in STORE_KEEPS_LAYOUT)

    # -- rule 3: propagation ----------------------------------------------------

    def propagate(self, loop_bodies_first: bool = False) -> None:
        """Rule 3 to a fixpoint, loops first (see the module docstring) when `loop_bodies_first`.

        A loop's carried groups are tied when the walk enters the loop and again
        when it leaves it, so what its body decided reaches the loop's results
        before the code after the loop is visited.
        """
        changed = True
        while changed:
            changed = False
            for op in _enter_and_leave_loops(self.out.function.body):
                changed |= self.step(op, loop_bodies_first)

    def step(self, op: Operation, loop_bodies_first: bool = False) -> bool:
        changed = False
        for group, inside in tied_groups(op):
            # a loop's carried value takes what its body decided; the initial value and result only
            # decide what the body leaves open, and not before the body had its say
            known = next((self.layouts[v] for v, _in in zip(group, inside) if _in and v in self.layouts), None)
            if known is None and not (loop_bodies_first and any(inside)):
                known = next((self.layouts[v] for v in group if v in self.layouts), None)
            if known is not None:
                for v in group:
                    changed |= self.set(v, known)
        for source, target, derive in derived(op):
            if source in self.layouts and target not in self.layouts:
                try:
                    layout = derive(self.layouts[source])
                except LayoutError:
                    continue
                changed |= self.set(target, layout)
        return changed

    # -- conversions ------------------------------------------------------------

    def record_conversions(self) -> None:
        """Give defined members their group's layout; operands that differ get a conversion.

        Two sweeps, so operands are compared with every group's final layout.
        """
        for want, slots in self._tile_groups():
            for v, site, _ in slots:
                if site is None:
                    self.layouts[v] = want
        for want, slots in self._tile_groups():
            for v, site, index in slots:
                if site is not None and self.layouts[v] != want:
                    self.out.conversions[(site, index)] = want
        # A view store whose anchor a loop-carried group overruled converts its value back (once, after the loop).
        unkept = set()
        for (op, index), want in self.store_anchors.items():
            have = self.layouts[op.operands[index]]
            if have != want and not self._store_keeps(op, have):
                self.out.conversions[(op, index)] = want
                if op not in self.hard_stores and self._store_keeps(op, None):
                    unkept.add(op)
        self.unkept_soft_stores = frozenset(unkept)

    def _tile_groups(self):
        """(the group's layout, its slots) for every layout group of tiles, read as the walk goes."""
        for op in self.out.function.walk():
            for slots in _groups(op):
                rep = next((v for v, site, _ in slots if site is None), None)
                if rep is not None and isinstance(rep.type, TileType):
                    yield self.layouts[rep], slots
            if op.name == "dot":
                plan = mma_plan(op, self.target, self.out.num_warps)
                for index, want in ((0, plan and plan.a), (1, plan and plan.b)):
                    if want is not None and self.layouts[op.operands[index]] != want:
                        self.out.conversions[(op, index)] = want


def tied_groups(op: Operation) -> list[tuple[list[Value], list[bool]]]:
    """Groups of tile values `op` requires to share one layout (see the module docstring).

    Each group comes with, per value, whether it is a loop's carried slot
    inside the loop (a region argument or a yielded value), which the
    loops-first rule prefers.
    """
    out = []
    for slots in _groups(op):
        slots = [s for s in slots if isinstance(s[0].type, TileType)]
        if len(slots) > 1:
            out.append(([v for v, _, _ in slots], [op.name in LOOPS and _inside(s, op) for s in slots]))
    return out


def _groups(op: Operation):
    """Tied groups as slots; the first definition slot is the representative whose layout wins."""
    name = op.name
    if OPS[name].elementwise or OPS[name].pointer_lanes:      # operand and result lanes correspond
        defs = [(r, None, 0) for r in op.results]
        uses = [(v, op, i) for i, v in enumerate(op.operands)]
        if defs:
            yield defs + uses
        elif uses:  # store: the pointer operand leads
            yield [(uses[0][0], None, 0)] + uses[1:]
    elif name == "smem_async_copy" and isinstance(op.operands[1].type, TileType):
        # pointers and their mask; an mbarrier operand (a shared buffer, not a tile) has no layout
        masks = [(v, op, i) for i, v in enumerate(op.operands) if i >= 2 and isinstance(v.type, TileType)]
        if masks:
            yield [(op.operands[1], None, 0)] + masks
    elif name in ("scan", "multiple_of", "max_contiguous"):     # the result's lanes are the operand's
        yield [(op.result, None, 0), (op.operands[0], op, 0)]
    elif name == "dot":
        yield [(op.result, None, 0), (op.operands[2], op, 2)]
    elif name == "for":
        body = op.regions[0]
        term = body.terminator
        for i, arg in enumerate(body.args[1:]):
            yield [(arg, None, 0), (op.results[i], None, 0), (op.operands[3 + i], op, 3 + i),
                   (term.operands[i], term, i)]
    elif name == "if":
        terms = [r.terminator for r in op.regions]
        for i, res in enumerate(op.results):
            yield [(res, None, 0)] + [(t.operands[i], t, i) for t in terms]
    elif name == "while":
        before, after = op.regions
        cond, term = before.terminator, after.terminator
        for i, arg in enumerate(before.args):
            yield [(arg, None, 0), (op.operands[i], op, i), (term.operands[i], term, i)]
        for i, arg in enumerate(after.args):
            yield [(arg, None, 0), (op.results[i], None, 0), (cond.operands[i + 1], cond, i + 1)]


def _enter_and_leave_loops(block: Block):
    """The ops of `block` in program order (pre-order), each loop once more after its regions."""
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from _enter_and_leave_loops(region)
        if op.name in LOOPS and op.regions:
            yield op


def _inside(slot, loop: Operation) -> bool:
    """Whether a carried slot of `loop` lives in its regions (a region argument or a terminator's operand)."""
    value, site, _ = slot
    if site is None:
        return value not in loop.results
    return site is not loop


def derived(op: Operation):
    """(source, target, derive) triples: a layout for `target` computed from `source`'s."""
    name = op.name
    if name in ("reduce", "arg_reduce") and isinstance(op.result.type, TileType):
        axis = op.attrs["axis"]
        yield op.operands[0], op.result, lambda l: l.reduce(axis, keepdims=False)
    elif name == "expand_dims":
        axis = op.attrs["axis"]
        yield op.operands[0], op.result, lambda l: insert_unit_dim(l, axis)
        yield op.result, op.operands[0], lambda l: drop_unit_dim(l, axis)
    elif name == "reshape" and isinstance(op.result.type, TileType):
        src, res = op.operands[0].type.shape, op.result.type.shape
        yield op.operands[0], op.result, lambda l: l.reshape(res)
        yield op.result, op.operands[0], lambda l: l.reshape(src)
    elif name == "permute":
        order = list(op.attrs["order"])
        inverse = [order.index(d) for d in range(len(order))]
        yield op.operands[0], op.result, lambda l: l.permute(order)
        yield op.result, op.operands[0], lambda l: l.permute(inverse)
    elif name == "broadcast":
        src, res = op.operands[0].type.shape, op.result.type.shape
        dims = [d for d, (s, r) in enumerate(zip(src, res)) if s != r]
        yield op.result, op.operands[0], lambda l: l.reduce(dims, keepdims=True) if dims else l
    elif name == "convert_layout":
        yield op.operands[0], op.result, lambda l: l
        yield op.result, op.operands[0], lambda l: l


def insert_unit_dim(layout: RegisterLayout, axis: int) -> RegisterLayout:
    """`layout` with a size-1 dim inserted at `axis` (size-1 dims own no modes)."""
    return RegisterLayout(layout.shape[:axis] + (1,) + layout.shape[axis:],
                          layout.modes[:axis] + ((),) + layout.modes[axis:],
                          layout.spatial_modes, layout.local_modes)


def drop_unit_dim(layout: RegisterLayout, axis: int) -> RegisterLayout:
    if layout.shape[axis] != 1:
        raise LayoutError(f"dim {axis} of {layout} is not of size 1")
    return RegisterLayout(layout.shape[:axis] + layout.shape[axis + 1:],
                          layout.modes[:axis] + layout.modes[axis + 1:],
                          layout.spatial_modes, layout.local_modes)


def _outside_loop_of(value: Value, op: Operation) -> bool:
    """Whether `op` is in the body of a loop that `value` is defined outside of."""
    home = value.owner if isinstance(value.owner, Block) else value.owner.parent
    block = op.parent
    while block is not None and block is not home:
        parent = block.parent
        if isinstance(parent, Operation) and parent.name in LOOPS:
            return True
        block = parent.parent if isinstance(parent, Operation) else None
    return False


def _tile_values(fn: Function) -> list[Value]:
    """Every tile-typed value of `fn` in program order: region arguments, then each op's results."""
    out: list[Value] = []

    def visit(block: Block) -> None:
        out.extend(a for a in block.args if isinstance(a.type, TileType))
        for op in block.ops:
            out.extend(r for r in op.results if isinstance(r.type, TileType))
            for region in op.regions:
                visit(region)

    visit(fn.body)
    return out
