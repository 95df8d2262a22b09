"""Ring slots filled by TMA (sm_90+): which pipelined view loads qualify, and the fill they get.

Input: a pipelined view load and its slot layout (from `pipeline_plan.py`)
on a target with TMA. Job: decide whether the host can build the load's
tensor map from the kernel's specialization and TMA can write the slot's
layout (`tma_plan`, `view_block_box`, `slot_boxes`); if so, add the hidden
`tensormap` parameters with their recipes and emit the fill (`TmaRing`:
one mbarrier per slot, one thread issuing the boxes). Guarantees: a box
past the tensor's edge lands zero-filled, so the view's bounds hold by
construction; blocks past the loop end are not issued, so no phase is left
half-counted and no copy is left in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Function, Operation, Value, enclosing_function
from tessera.ir.ops import OPS
from tessera.ir.smem_layouts import SmemLayout, swizzle_bytes
from tessera.ir.target import Target
from tessera.ir.tensor_map import (KERNEL_ATTR, MAX_BOX_DIM, MAX_RANK, UNBOUNDED, Extent, TensorMapRecipe,
                                  kernel_recipes)
from tessera.ir.types import ScalarType, TensorMapType
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..lowering.values import I32
from .multicast import ClusterMulticast, cluster_size, share_of, why_not
from .shortfalls import refuse

TMA_ELEMENT_BYTES = (1, 2, 4)
SLOT_ALIGN = {"none": 128, "32B": 256, "64B": 512, "128B": 1024}


@dataclass(frozen=True)
class TmaBox:
    """How one pipelined load's slot is filled by TMA: the map's recipe (its `param` not yet assigned), which
    view dims give the box coordinates, outermost first, and how many boxes fill a slot (stacked one after
    the other, each `box_shape[-1]` elements further along the contiguous dim)."""

    recipe: TensorMapRecipe
    dims: tuple[int, int]               # (outer view dim, contiguous view dim)
    boxes: int = 1                      # boxes per slot
    leading: tuple[Value, ...] = ()     # the coordinates of the map's dims before the view's (`pointer_offsets`)

    @property
    def box_elements(self) -> int:
        return math.prod(self.recipe.box_shape)

    @property
    def box_bytes(self) -> int:
        return self.box_elements * self.recipe.dtype.bits // 8

    @property
    def slot_bytes(self) -> int:
        """The transaction bytes of one slot's fill (every box, out-of-bounds zeros included)."""
        return self.boxes * self.box_bytes

    @property
    def slot_align(self) -> int:
        return SLOT_ALIGN[self.recipe.swizzle]

    def coordinates(self, ctx, starts: list[Value], j: int = 0) -> list[Value]:
        """The i32 coordinates of box j of the block whose view offsets (thread IR) are `starts`, outermost
        first: the leading dims' indices, then the block's outer and contiguous offsets (box j: j box widths
        further along the contiguous dim)."""
        outer, inner = (_i32(ctx, starts[d]) for d in self.dims)
        if j:
            inner = ctx.emit("add", inner, ctx.const(j * self.recipe.box_shape[-1]))
        return [*(_i32(ctx, ctx.lookup(v)) for v in self.leading), outer, inner]


NO_BOX = "no TMA box writes its slot layout"     # the refusal a TMA-writable swizzle can answer


def tma_plan(load: Operation, dim: int, slot: SmemLayout | WgmmaTileLayout, target: Target,
             facts: dict, why: list[str] | None = None) -> TmaBox | None:
    """The TMA fill of pipelined view load `load` (contiguous view dim `dim`, slot layout `slot`), or None
    (with the reason in `why`, when given)."""
    tile = load.result.type
    return view_block_box(load.operands[0], tile.shape, tile.element.dtype, dim, slot, target, facts, why)


def view_block_box(view: Value, shape: tuple[int, ...], dtype: dt.DType, dim: int,
                   slot: SmemLayout | WgmmaTileLayout, target: Target, facts: dict,
                   why: list[str] | None = None) -> TmaBox | None:
    """The TMA fill of a `shape` block of `view` (elements `dtype`, contiguous view dim `dim`) into a slot laid
    out as `slot`, or None when it does not qualify (the rules are in the comment above `TmaRing`; the reason
    goes into `why`, when given). Shared by pipelined loads (`tma_plan`) and the language's mbarrier copies
    (`shared_buffers.py`)."""
    why = [] if why is None else why
    if not target.has("tma"):
        return refuse(why, f"{target.name} has no TMA")
    make_view = view.owner
    if not isinstance(make_view, Operation) or make_view.name != "make_view":
        return refuse(why, "its view is not a tessera.view made in the kernel")
    fn = enclosing_function(make_view)
    size = dtype.bits // 8
    if fn is None or len(shape) != 2 or dtype.bits % 8 or size not in TMA_ELEMENT_BYTES:
        return refuse(why, f"TMA copies 2-D blocks of 1-, 2-, 4- or 8-byte elements, not {shape} of {dtype.name}")
    sizes, strides = make_view.operands[1:3], make_view.operands[3:5]
    base, offsets = pointer_offsets(make_view.operands[0], fn, facts, size)
    if base not in fn.args or fn.args.index(base) not in fn.attrs.get("divisible_by_16", ()):
        return refuse(why, "its view's base is not a 16-byte aligned pointer argument of the kernel (the host "
                            "builds the tensor map from that argument)")
    if offsets is None:
        return refuse(why, "its view's base is offset from the kernel's pointer argument by more than sums of "
                            "index * stride, with each stride a kernel argument (times a constant) known to be "
                            "a multiple of 16 bytes (state it with tessera.multiple_of, or specialize it)")
    info = facts.get(view)
    outer = 1 - dim
    if info is None or not info.unit_stride[dim] or info.stride_divisibility[outer] * size % 16:
        return refuse(why, "its view's rows are not proven to start on 16-byte boundaries (the row stride must "
                            "be a multiple of 16 bytes: state it with tessera.multiple_of or tessera.assume)")
    extents = [_extent(v, fn, facts) for v in (sizes[outer], sizes[dim], strides[outer])]
    if None in extents:
        return refuse(why, "its view's sizes and row stride are not constants or kernel arguments (times a "
                            "constant), which the host needs to build the tensor map")
    boxes = slot_boxes(slot, shape[outer], shape[dim], size)
    if boxes is None:
        return refuse(why, NO_BOX)
    swizzle, width, count = boxes
    box = (shape[outer], width)
    if max(box) > MAX_BOX_DIM or width * size % 16 or math.prod(box) * size % SLOT_ALIGN[swizzle]:
        return refuse(why, f"its box {box} is outside what TMA copies (dims <= {MAX_BOX_DIM}, rows of a "
                            f"multiple of 16 bytes)")
    unbounded = Extent(None, UNBOUNDED)
    recipe = TensorMapRecipe(-1, fn.args.index(base), dtype,
                             (*(unbounded for _ in offsets), extents[0], extents[1]),
                             (*(stride for _, stride in offsets), extents[2], Extent(None, 1)),
                             (*(1 for _ in offsets), *box), swizzle)
    if len(recipe.shape) > MAX_RANK:
        return refuse(why, f"its view's base is offset along {len(offsets)} dims: with the view's two, more than "
                            f"the {MAX_RANK} a tensor map has")
    return TmaBox(recipe, (outer, dim), count, tuple(index for index, _ in offsets))


def pointer_offsets(pointer: Value, fn: Function, facts: dict, size: int) \
        -> tuple[Value, tuple[tuple[Value, Extent], ...] | None]:
    """`pointer` as `base + sum(index_i * stride_i)` (`addptr`s of products, outermost first): the base, and
    the (index, stride) terms, or None when an offset is not such a product with `stride` a kernel argument
    (times a constant) whose `size`-byte elements make a multiple of 16 bytes. A term becomes a dim of the
    tensor map with coordinate `index`, extent `UNBOUNDED` and box 1: the map then reads what `pointer`
    reads, the view's dims bounded as before (FlashAttention's K at (b, h): a 4-D (B, S, H, D) map). (A
    negative index, a view before the argument's first element, would read zeros: no tensor is there.)"""
    terms: list[tuple[Value, Extent]] = []
    while isinstance(pointer.owner, Operation) and pointer.owner.name == "addptr":
        pointer, offset = pointer.owner.operands
        if getattr(facts.get(offset), "constant", None) == 0:
            continue
        term = _product_term(offset, fn, facts, size)
        if term is None:
            return _root(pointer), None
        terms.append(term)
    return pointer, tuple(reversed(terms))


def _product_term(offset: Value, fn: Function, facts: dict, size: int) -> tuple[Value, Extent] | None:
    """`offset` as (index, stride): `index * stride` with the stride a 16-byte multiple argument (see above)."""
    op = offset.owner
    if not isinstance(op, Operation) or op.name != "mul":
        return None
    for index, stride in (op.operands, reversed(op.operands)):
        extent = _extent(stride, fn, facts)
        divisibility = getattr(facts.get(stride), "element_divisibility", 1)
        if extent is not None and extent.param is not None and divisibility * size % 16 == 0:
            return index, extent
    return None


def _root(pointer: Value) -> Value:
    while isinstance(pointer.owner, Operation) and pointer.owner.name == "addptr":
        pointer = pointer.owner.operands[0]
    return pointer


def slot_boxes(slot: SmemLayout | WgmmaTileLayout, rows: int, cols: int, size: int) -> tuple[str, int, int] | None:
    """How TMA writes a `rows` x `cols` slot (cols: the contiguous dim, `size`-byte elements) laid out as `slot`:
    (swizzle mode, box width in elements, boxes per slot), or None when no TMA box lands that way (see the
    `TmaRing`)."""
    if isinstance(slot, WgmmaTileLayout):       # column blocks of one atom row each: a box per block
        if (slot.rows, slot.cols, slot.element_bytes) != (rows, cols, size):
            return None
        mode = f"{slot.swizzle}B" if slot.swizzle else "none"
        return mode, slot.atom, cols // slot.atom
    if slot.strides != (cols, 1) or slot.shape != (rows, cols):
        return None                             # not plain row-major rows of the block
    if slot.swizzle is None:
        return "none", cols, 1
    for nbytes in (128, 64, 32):
        if slot.swizzle == swizzle_bytes(nbytes, size) and cols * size == nbytes:
            return f"{nbytes}B", cols, 1
    return None


def _extent(value: Value, fn: Function, facts: dict) -> Extent | None:
    """`value` as scale * (an integer parameter) or a constant, from the IR that computes it."""
    constant = getattr(facts.get(value), "constant", None)
    if constant is not None:
        return Extent(None, int(constant))
    if value in fn.args:
        t = value.type
        return Extent(fn.args.index(value)) if isinstance(t, ScalarType) and t.dtype.is_int else None
    op = value.owner
    if isinstance(op, Operation) and op.name == "mul":
        a, b = (_extent(v, fn, facts) for v in op.operands)
        if a is not None and b is not None and (a.param is None or b.param is None):
            param = a.param if a.param is not None else b.param
            return Extent(param, a.scale * b.scale)
    return None


# `software_pipeline.py` fills the ring slots of a pipelined view load with
# cp.async; on a target with TMA a load whose map is decidable at compile
# time from the kernel's specialization is filled by the Tensor Memory
# Accelerator instead (`tma_plan` says which; `TmaRing` emits the fill):
#
#     maps: one hidden `tensormap` parameter per (view, box) with its recipe
#           (`tessera.ir.tensor_map.TensorMapRecipe`) in the kernel's `tensor_maps` attribute
#     bars = shared_alloc (S mbarriers)                     one per slot, shared by the TMA loads
#     if thread 0: mbarrier_init bars[s], 1 (each s); fence_mbarrier_init
#     barrier
#     ... issuing the blocks of iteration iv into slot s (prologue, then one refill per iteration):
#     if thread 0 and iv < ub:
#         fence_proxy_async                                 the slot's earlier generic (ldmatrix) reads come
#                                                           first; not for wgmma slots, read by the async proxy
#         fence_proxy_async_global                          in a kernel with an op that `orders_programs`
#                                                           (atomics, acquire loads): what it acquired, other
#                                                           programs wrote through the generic proxy
#         mbarrier_arrive_expect_tx bars[s], <bytes of the TMA boxes of one slot>
#         tma_load ring[s] + j * <box>, map, <block offsets + (0, j * box width)>, bars[s]
#                                                           (one per box j of each TMA load's slot)
#     ... before the body reads slot s:
#     mbarrier_wait bars[s], phase                          phase flips each time the ring wraps
#     ... after the loop:
#     if thread 0: mbarrier_inval bars[s] (each s)          before the bytes are reused (or the loop re-entered)
#
# A box past the tensor's edge lands zero-filled, so the view's bounds mask
# holds by construction. Blocks past the loop end are not issued at all: no
# arrival and no bytes, so no phase is left half-counted and no copy is left
# in flight; nobody waits for those phases.
#
# A view load qualifies when (everything else as for cp.async, `pipeline_plan`):
#
# * the target has TMA, the view is a `make_view` of a pointer *parameter* of
#   the kernel that the specialization knows is 16-byte aligned, and its sizes
#   and strides are parameters, constants or products of them with constants
#   (the host evaluates them from the launch arguments);
# * the view is 2-D, its contiguous dim has stride 1 and the other stride is a
#   multiple of 16 bytes (`divisible_by_16` of the parameter, or a constant);
# * the element size is 1, 2 or 4 bytes, the box has dims <= 256 and rows of a
#   multiple of 16 bytes;
# * the slot's layout is one TMA writes (`slot_boxes`). A TMA box lands
#   row-major, its rows (the contiguous dim innermost) packed one after the
#   other, and with a 32B/64B/128B swizzle its 16-byte chunks XORed by
#   `Swizzle<b, 4, 3>` on byte addresses (b = 1, 2, 3) while a box row is at
#   most the swizzle span. So TMA writes
#   - an mma.sync slot (`SmemLayout`): the whole block as one box, when the
#     slot is plain row-major and its rows span exactly the swizzle's bytes
#     (or it is unswizzled: TMA's "none");
#   - a wgmma slot (`WgmmaTileLayout`, either major): the slot is a sequence
#     of column blocks, each rows x (one atom row = the swizzle span, 16 bytes
#     without swizzle) laid out row-major and swizzled by the same
#     `Swizzle<b, 4, 3>` (a block is a whole number of swizzle periods, so the
#     absolute-address swizzle wgmma reads is the box's own). Each column block
#     is one box of rows x (span / element size) elements, written with the
#     slot's swizzle mode ("none" for the interleaved 8 x 16-byte core
#     matrices: a box of 16-byte rows lands exactly as one column of them), the
#     boxes stacked at their block offsets, coordinates advanced along the
#     contiguous dim by the box width. All boxes of a slot share one shape,
#     so one map per load serves them; they all count on the slot's mbarrier.
class TmaRing:
    """The TMA side of one pipelined loop (see the comment above): map parameters, slots' mbarriers, the fill."""

    def __init__(self, ctx, loads, stages: int, tile_loop=None, *, specialized: bool = False,
                 prefetch: int | None = None):
        """`tile_loop`: the persistent tile loop (tile-IR `for`) around this loop; its mbarriers are created in the
        kernel's prologue and live for the whole kernel (its tiles share them: `persistent.py`); without one,
        here, for this loop alone. `specialized`: a
        producer warpgroup issues the fills; `prefetch`: how many iterations ahead they run (multicast:
        `multicast.py`)."""
        self.loads = [load for load in loads if load.tma is not None]
        self.stages = stages
        self.tile_loop = tile_loop
        self.once = once = tile_loop is not None
        shared = self._multicast_loads(ctx, specialized, prefetch)
        # each load's map; a load the cluster shares by row slices issues only slices, through their map
        self.maps = {load.load: map_parameter(ctx, share_of(load.tma, cluster_size(ctx.src)).recipe
                                              if load in shared else load.tma.recipe) for load in self.loads}
        self.tx_bytes = sum(load.tma.slot_bytes for load in self.loads)
        # TMA writes through the async proxy: only slots the generic proxy reads (ldmatrix) need their reads
        # ordered before the refill by a proxy fence; wgmma reads through the async proxy itself
        self.fence_before_fill = any(not load.on_wgmma for load in self.loads)
        # A kernel whose programs hand data to each other (atomics, acquire loads: a persistent kernel's tickets
        # and counters) may TMA-read global memory another program wrote through the generic proxy in this very
        # launch; the issuing thread orders what it has acquired before its TMA reads with a global proxy fence
        self.fence_global = any(OPS[op.name].orders_programs for op in ctx.src.walk())
        if once:
            with ctx.in_prologue():
                self.bars = ctx.smem.mbarriers(stages, 1, whole_kernel=True)
        else:
            self.bars = ctx.smem.mbarriers(stages, 1)
        self.cluster = ClusterMulticast(ctx, self, shared, cluster_size(ctx.src), specialized, once) \
            if shared else None

    def _multicast_loads(self, ctx, specialized: bool, prefetch: int | None) -> list:
        """The loads marked `multicast` whose slots the cluster's blocks share (`multicast.py`); none when the
        kernel has no cluster, or (with a lowering note saying why) when this loop cannot share them."""
        shared = [load for load in self.loads if load.load.attrs.get("multicast")]
        if not shared or cluster_size(ctx.src) == 1:
            return []
        why = why_not(ctx, shared, specialized=specialized,
                      prefetch=self.stages - 1 if prefetch is None else prefetch, stages=self.stages)
        if why is not None:
            ctx.notes.append(f"multicast loads are issued by every block of the cluster: {why}")
            return []
        return shared

    def _bar(self, ctx, slot: Value) -> Value:
        return ctx.emit("addptr", self.bars, slot)

    def issue(self, ctx, rings: dict, offsets: dict, slot: Value, live: Value, refill_phase: Value | None = None,
              release_when: Value | None = None) -> None:
        """Thread 0 starts the TMA boxes of the iteration whose slice was just lowered into `slot`, if `live`
        (`rings`, `offsets`: per tile-IR load op). `refill_phase`: the slot is refilled, the loop's phase parity
        then (a cluster ring first waits until every block is done with the slot; only where `release_when`
        holds too, if given: a persistent tile's first fills, `software_pipeline._prologue_release`)."""
        if self.cluster is not None and refill_phase is not None:     # every block done with the slot first
            when = live if release_when is None else ctx.emit("and", live, release_when)
            self.cluster.release_slot(ctx, slot, refill_phase, when, self.fence_before_fill)
        with ctx.when(ctx.emit("and", ctx.index.first_thread(), live)):
            self.start(ctx, self._bar(ctx, slot), rings, offsets)

    def start(self, ctx, bar: Value, rings: dict, offsets: dict) -> None:
        """Announce a slot's bytes on `bar` and start every load's boxes into it at `offsets` (the calling
        thread only; the loads' slices must be lowered for the iteration). A refill of slots the generic
        proxy read (ldmatrix) is fenced first (`fence_before_fill`)."""
        if self.fence_before_fill:
            ctx.create("fence_proxy_async")
        if self.fence_global:
            ctx.create("fence_proxy_async_global")
        ctx.create("mbarrier_arrive_expect_tx", [bar, ctx.const(self.tx_bytes)])
        for load in self.loads:
            starts = [ctx.lookup(v) for v in load.load.operands[1:]]
            box = load.tma
            if self.cluster is not None and load.load in self.cluster.shares:    # this block's share, to all
                self.cluster.issue_share(ctx, load, ctx.emit("addptr", rings[load.load], offsets[load.load]),
                                         starts, bar)
                continue
            for j in range(box.boxes):      # column block j: the box j widths along the contiguous dim
                offset = offsets[load.load] if j == 0 else \
                    ctx.emit("add", offsets[load.load], ctx.const(j * box.box_elements))
                dst = ctx.emit("addptr", rings[load.load], offset)
                ctx.create("tma_load", [dst, self.maps[load.load], *box.coordinates(ctx, starts, j), bar])

    def release(self, ctx) -> None:
        """After the loop: thread 0 ends the slots' mbarriers (every thread is past its last wait, since it passed
        the last iteration's barrier), so that their bytes may be reused or initialized again; the loop's final
        barrier orders this before any reuse. Mbarriers made `once` stay for the next tile.

        A multicast ring then waits on the cluster barrier, so that no peer writes into this block or arrives on
        its barriers any more; in a persistent tile loop only once, after it (CUTLASS's persistent cluster
        kernels too): between tiles the empty barriers order every peer write into a slot after this block's
        release of it, the next tile's first fills included (`software_pipeline._prologue_release`), and each
        tile's loop has waited for every byte of its own fills; the epilogue's buffers that may share bytes
        with a per-tile ring are thus this block's alone from the loop's end until the next tile releases its
        slots (`multicast.py`)."""
        if self.cluster is not None and self.tile_loop is None:
            self.cluster.sync(ctx)
        elif self.cluster is not None:
            ctx.after.setdefault(self.tile_loop, {})["cluster barrier"] = lambda: self.cluster.sync(ctx)
        if self.once:
            return
        with ctx.when(ctx.index.first_thread()):
            for s in range(self.stages):
                ctx.create("mbarrier_inval", [self._bar(ctx, ctx.const(s))])

    def wait(self, ctx, slot: Value, phase: Value) -> None:
        """Every thread waits until the boxes of `slot`'s current fill (phase parity `phase`) have landed."""
        ctx.create("mbarrier_wait", [self._bar(ctx, slot), phase])


def map_parameter(ctx, recipe: TensorMapRecipe) -> Value:
    """The hidden tensormap parameter of `recipe`, appended to the kernel (one per distinct map)."""
    fn = ctx.fn
    known = kernel_recipes(fn.attrs)
    for other in known:
        if other.to_attr()[1:] == recipe.to_attr()[1:]:
            return fn.args[other.param]
    pointer = fn.args[recipe.pointer].name_hint or f"arg{recipe.pointer}"
    arg = fn.body.add_arg(TensorMapType(), f"{pointer}_tma{len(known)}")
    placed = TensorMapRecipe(len(fn.args) - 1, recipe.pointer, recipe.dtype, recipe.shape, recipe.strides,
                             recipe.box_shape, recipe.swizzle)
    fn.attrs[KERNEL_ATTR] = (*fn.attrs.get(KERNEL_ATTR, ()), placed.to_attr())
    return arg


def _i32(ctx, value: Value) -> Value:
    return value if value.type == I32 else ctx.cast(value, dt.i32)

