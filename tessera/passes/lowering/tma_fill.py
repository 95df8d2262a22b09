"""Pipelined ring slots filled by TMA (sm_90+): which view loads qualify, and the fill they get.

`async_pipeline.py` fills the ring slots of a pipelined view load with
cp.async; on a target with TMA a load whose map is decidable at compile
time from the kernel's specialization is filled by the Tensor Memory
Accelerator instead (`tma_plan` says which; `TmaRing` emits the fill):

    maps: one hidden `tensormap` parameter per (view, box) with its recipe
          (`tessera.ir.tensor_map.TensorMapRecipe`) in the kernel's `tensor_maps` attribute
    bars = shared_alloc (S mbarriers)                     one per slot, shared by the TMA loads
    if thread 0: mbarrier_init bars[s], 1 (each s); fence_mbarrier_init
    barrier
    ... issuing the blocks of iteration iv into slot s (prologue, then one refill per iteration):
    if thread 0 and iv < ub:
        fence_proxy_async                                 the slot's earlier generic reads come first
        mbarrier_arrive_expect_tx bars[s], <bytes of the TMA boxes of one slot>
        tma_load ring[s], map, <block offsets, innermost dim last>, bars[s]   (one per TMA load)
    ... before the body reads slot s:
    mbarrier_wait bars[s], phase                          phase flips each time the ring wraps
    ... after the loop:
    if thread 0: mbarrier_inval bars[s] (each s)          before the bytes are reused (or the loop re-entered)

A box past the tensor's edge lands zero-filled, so the view's bounds mask
holds by construction. Blocks past the loop end are not issued at all: no
arrival and no bytes, so no phase is left half-counted and no copy is left
in flight; nobody waits for those phases.

A view load qualifies when (everything else as for cp.async, `pipeline_plan`):

* the target has TMA, the view is a `make_view` of a pointer *parameter* of
  the kernel that the specialization knows is 16-byte aligned, and its sizes
  and strides are parameters, constants or products of them with constants
  (the host evaluates them from the launch arguments);
* the view is 2-D, its contiguous dim has stride 1 and the other stride is a
  multiple of 16 bytes (`divisible_by_16` of the parameter, or a constant);
* the element size is 1, 2 or 4 bytes, the box (the block, with the
  contiguous dim innermost) has dims <= 256 and rows of a multiple of 16 bytes;
* the slot's layout is one TMA writes: the slot is the block row-major along
  the contiguous dim, XOR-swizzled in 16-byte chunks by `Swizzle<b, 4, 3>`
  on bytes, which is TMA's 32B/64B/128B swizzle (b = 1, 2, 3) when a slot row
  spans exactly that many bytes (unswizzled slots: TMA's "none").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Block, Function, Operation, Value
from tessera.ir.smem_layouts import SmemLayout, swizzle_bytes
from tessera.ir.target import Target
from tessera.ir.tensor_map import KERNEL_ATTR, MAX_BOX_DIM, Extent, TensorMapRecipe, kernel_recipes
from tessera.ir.types import ScalarType, TensorMapType

from .context import I32

TMA_ELEMENT_BYTES = (1, 2, 4)
SLOT_ALIGN = {"none": 128, "32B": 256, "64B": 512, "128B": 1024}


@dataclass(frozen=True)
class TmaBox:
    """How one pipelined load's slot is filled by TMA: the map's recipe (its `param` not yet assigned), and which
    view dims give the box coordinates, outermost first."""

    recipe: TensorMapRecipe
    dims: tuple[int, int]               # (outer view dim, contiguous view dim)

    @property
    def box_bytes(self) -> int:
        return math.prod(self.recipe.box_shape) * self.recipe.dtype.bits // 8

    @property
    def slot_align(self) -> int:
        return SLOT_ALIGN[self.recipe.swizzle]


def tma_plan(load: Operation, dim: int, slot: SmemLayout, target: Target, facts: dict) -> TmaBox | None:
    """The TMA fill of pipelined view load `load` (contiguous view dim `dim`, slot layout `slot`), or None."""
    if not target.has("tma"):
        return None
    view = load.operands[0]
    make_view = view.owner
    fn = _function_of(load)
    if not isinstance(make_view, Operation) or make_view.name != "make_view" or fn is None:
        return None
    tile = load.result.type
    dtype = tile.element.dtype
    size = dtype.bits // 8
    if len(tile.shape) != 2 or dtype.bits % 8 or size not in TMA_ELEMENT_BYTES:
        return None
    base, sizes, strides = make_view.operands[0], make_view.operands[1:3], make_view.operands[3:5]
    if base not in fn.args or fn.args.index(base) not in fn.attrs.get("divisible_by_16", ()):
        return None
    info = facts.get(view)
    outer = 1 - dim
    if info is None or not info.unit_stride[dim] or info.stride_divisibility[outer] * size % 16:
        return None
    extents = [_extent(v, fn, facts) for v in (sizes[outer], sizes[dim], strides[outer])]
    if None in extents:
        return None
    box = (tile.shape[outer], tile.shape[dim])
    row_bytes = box[1] * size
    if max(box) > MAX_BOX_DIM or row_bytes % 16:
        return None
    swizzle = _tma_swizzle(slot, row_bytes, size)
    if swizzle is None or math.prod(box) * size % SLOT_ALIGN[swizzle]:
        return None
    recipe = TensorMapRecipe(-1, fn.args.index(base), dtype, (extents[0], extents[1]), (extents[2], Extent(None, 1)),
                             box, swizzle)
    return TmaBox(recipe, (outer, dim))


def _tma_swizzle(slot: SmemLayout, row_bytes: int, size: int) -> str | None:
    """TMA's swizzle mode that writes a slot with rows of `row_bytes` exactly as `slot` lays it out, or None."""
    rows, cols = slot.shape
    if slot.strides != (cols, 1) or cols * size != row_bytes:
        return None                     # not plain row-major rows of the box
    if slot.swizzle is None:
        return "none"
    for nbytes in (128, 64, 32):
        if slot.swizzle == swizzle_bytes(nbytes, size) and row_bytes == nbytes:
            return f"{nbytes}B"
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


def _function_of(op: Operation) -> Function | None:
    item = op.parent
    while item is not None and not isinstance(item, Function):
        item = item.parent
    return item


class TmaRing:
    """The TMA side of one pipelined loop: the map parameters, the slots' mbarriers and the fill."""

    def __init__(self, ctx, loads, stages: int):
        self.loads = [load for load in loads if load.tma is not None]
        self.maps = {load.load: _map_parameter(ctx, load.tma.recipe) for load in self.loads}
        self.tx_bytes = sum(load.tma.box_bytes for load in self.loads)
        self.stages = stages
        self.bars = ctx.shared_alloc(dt.i64, stages, align=8)
        then = Block()
        with ctx.b.at(then):
            for s in range(stages):
                ctx.create("mbarrier_init", [self._bar(ctx, ctx.const(s)), ctx.const(1)])
            ctx.create("fence_mbarrier_init")
            ctx.create("yield")
        _if(ctx, ctx.first_thread(), then)
        ctx.barrier()

    def _bar(self, ctx, slot: Value) -> Value:
        return ctx.emit("addptr", self.bars, slot)

    def issue(self, ctx, rings: dict, offsets: dict, slot: Value, live: Value) -> None:
        """Thread 0 starts the TMA boxes of the iteration whose slice was just lowered into `slot`, if `live`
        (`rings`, `offsets`: per tile-IR load op)."""
        then = Block()
        with ctx.b.at(then):
            bar = self._bar(ctx, slot)
            ctx.create("fence_proxy_async")
            ctx.create("mbarrier_arrive_expect_tx", [bar, ctx.const(self.tx_bytes)])
            for load in self.loads:
                starts = [ctx.lookup(v) for v in load.load.operands[1:]]
                coords = [_i32(ctx, starts[d]) for d in load.tma.dims]
                dst = ctx.emit("addptr", rings[load.load], offsets[load.load])
                ctx.create("tma_load", [dst, self.maps[load.load], *coords, bar])
            ctx.create("yield")
        _if(ctx, ctx.emit("and", ctx.first_thread(), live), then)

    def release(self, ctx) -> None:
        """After the loop: thread 0 ends the slots' mbarriers (every thread is past its last wait, since it passed
        the last iteration's barrier), so that their bytes may be reused or initialized again; the loop's final
        barrier orders this before any reuse."""
        then = Block()
        with ctx.b.at(then):
            for s in range(self.stages):
                ctx.create("mbarrier_inval", [self._bar(ctx, ctx.const(s))])
            ctx.create("yield")
        _if(ctx, ctx.first_thread(), then)

    def wait(self, ctx, slot: Value, phase: Value) -> None:
        """Every thread waits until the boxes of `slot`'s current fill (phase parity `phase`) have landed."""
        ctx.create("mbarrier_wait", [self._bar(ctx, slot), phase])


def _map_parameter(ctx, recipe: TensorMapRecipe) -> Value:
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


def _if(ctx, cond: Value, then: Block) -> None:
    otherwise = Block()
    with ctx.b.at(otherwise):
        ctx.create("yield")
    ctx.create("if", [cond], None, [], [then, otherwise])


def _i32(ctx, value: Value) -> Value:
    return value if value.type == I32 else ctx.cast(value, dt.i32)

