"""The language's mbarriers (`tessera.mbarriers`, `smem_mbarriers` / `smem_mbarrier_wait`, copies with `barrier=`).

Input: the tile-IR mbarrier arrays, the copies issued onto them and their
waits. Job: back each array by TMA and real mbarriers where the target has
TMA and every copy onto it is a view block TMA can fill (`tma_boxes`), and
otherwise by the threads' copies and a wait for all of them. Guarantee: a
wait returns only once every copy of its phase has landed, for every
thread (conservatively more on the fallback); the rules follow.

An mbarrier array is *TMA-backed* when the target has TMA (sm_90, sm_90a)
and every copy issued onto it is a view block that TMA can fill
(`tma_fill.view_block_box`: a 2-D view of a 16-byte aligned pointer
argument, unit-stride rows, the destination buffer laid out as a TMA box
lands: `shared_buffers.tma_swizzles` restricts its swizzle to those). Then

    smem_mbarriers        -> shared_alloc n x 8 bytes; thread 0: mbarrier_init (count 1) each,
                             fence_mbarrier_init; barrier (at the top level, merged with the kernel's
                             first such group: `passes/merge_mbarrier_inits.py`)
    copy onto bars[s]     -> thread 0: fence_proxy_async (earlier generic reads of the slot first),
                             mbarrier_expect_tx bars[s], <box bytes>; tma_load (one per box)
    bars[s].wait(p)       -> thread 0: mbarrier_arrive bars[s] (the phase's one arrival);
                             every thread: mbarrier_wait bars[s], p & 1

The phase's single arrival comes at the wait, after every copy of the phase
has announced its bytes (expect_tx), so the phase cannot complete early
between two copies; it completes when the arrival is in and every byte has
landed. The tile interpreter insists that a wait is for the current phase,
which is exactly what makes this arrival land in the right phase. A
thread may not fall two phases behind on one mbarrier (parity would
alias): the barrier the author writes after reading a slot, before its
refill, keeps them together. The mbarriers live for the whole kernel in
shared memory no one else uses, so they are never invalidated.

Otherwise (sm_80, or an array with a copy TMA cannot do) each copy is the
threads' copy of `shared_buffers.py` followed, on cp.async targets, by
`async_commit`, and `bars[s].wait(p)` is `async_wait {pending = 0}` and a
`barrier`: every copy of this thread has landed, then every thread's. That
waits for more than the phase (conservative, correct); the faithful sm_80
mapping (cp.async.mbarrier.arrive.noinc) is not implemented. Without
cp.async (AMD) copies are synchronous and the wait is the barrier.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation
from tessera.ir.shared_ops import copy_barrier
from tessera.ir.smem_layouts import SmemLayout
from tessera.ir.target import has_async_copies
from tessera.ir.types import PointerType, SharedType, ViewType

from ..lowering import lowering
from .shared_buffers import SharedParts, buffer_swizzle, root, thread_copy
from .tma_fill import TmaBox, map_parameter, view_block_box

MBARRIER_BYTES = 8


def tma_boxes(ctx, bars: Operation) -> dict[Operation, TmaBox] | None:
    """The TMA box of every copy onto the mbarrier array `bars`, or None when it is not TMA-backed."""
    if bars not in ctx.mbarrier_boxes:                                # asked by alloc, copies and waits alike
        ctx.mbarrier_boxes[bars] = _plan(ctx, bars)
    return ctx.mbarrier_boxes[bars]


def _plan(ctx, bars: Operation) -> dict[Operation, TmaBox] | None:
    if not ctx.target.has("tma"):
        return None
    copies = [op for op in ctx.src.walk() if op.name == "smem_async_copy" and copy_barrier(op) is not None
              and root(copy_barrier(op)) is bars]
    boxes = {}
    for op in copies:
        t: SharedType = op.operands[0].type
        if not isinstance(op.operands[1].type, ViewType) or len(t.shape) != 2:
            return None
        rows, cols = t.shape
        slot = SmemLayout((rows, cols), (cols, 1), buffer_swizzle(ctx, root(op.operands[0])))
        box = view_block_box(op.operands[1], t.shape, t.dtype, 1, slot, ctx.target, ctx.facts.facts)
        if box is None or box.boxes != 1:
            return None
        boxes[op] = box
    return boxes or None


@lowering("smem_mbarriers")
def _mbarriers(ctx, op):
    t: SharedType = op.result.type
    count = t.shape[0]
    base = ctx.emit("shared_alloc", attrs={"bytes": count * MBARRIER_BYTES, "offset": -1, "whole_kernel": True,
                                           "align": MBARRIER_BYTES}, type=PointerType(dt.i64, "shared"))
    base.name_hint = op.result.name_hint
    ctx.env[op.result] = SharedParts(base, None, t.shape, None)
    if tma_boxes(ctx, op) is not None:
        ctx.smem.init_mbarriers(base, count, 1)


@lowering("smem_async_copy")
def _async_copy(ctx, op):
    bar = copy_barrier(op)
    boxes = tma_boxes(ctx, root(bar)) if bar is not None else None
    if boxes is None:
        thread_copy(ctx, op)
        if bar is not None and has_async_copies(ctx.target):
            ctx.create("async_commit")
        return
    box = boxes[op]
    parts: SharedParts = ctx.lookup(op.operands[0])
    bar_ptr = ctx.lookup(bar).slot_base(ctx)
    tensor_map = map_parameter(ctx, box.recipe)
    coordinates = box.coordinates(ctx, [ctx.lookup(v) for v in op.operands[2:]])
    dst = parts.slot_base(ctx)

    with ctx.when(ctx.index.first_thread()):
        ctx.create("fence_proxy_async")
        ctx.create("mbarrier_expect_tx", [bar_ptr, ctx.const(box.slot_bytes)])
        ctx.create("tma_load", [dst, tensor_map, *coordinates, bar_ptr])


@lowering("smem_mbarrier_wait")
def _wait(ctx, op):
    bar = op.operands[0]
    if tma_boxes(ctx, root(bar)) is None:
        if has_async_copies(ctx.target):
            ctx.create("async_wait", attrs={"pending": 0})
        ctx.threads.barrier()
        return
    bar_ptr = ctx.lookup(bar).slot_base(ctx)
    with ctx.when(ctx.index.first_thread()):
        ctx.create("mbarrier_arrive", [bar_ptr])
    parity = ctx.emit("and", ctx.cast(ctx.lookup(op.operands[1]), dt.i32), ctx.const(1))
    ctx.create("mbarrier_wait", [bar_ptr, parity])

