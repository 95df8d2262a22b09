"""Block loads that only wgmma reads, put into its shared-memory tile by one TMA load (sm_90+).

Input: a `view_load` of the kernel's body (not in a loop or an `if`), or of
the body of a plain loop over tiles there (a persistent kernel's), whose
result every user reads as a wgmma operand from shared memory (A or B of a
dot `mma_plan` puts on wgmma): attention's Q block before the key loop.
Without this the threads load it into registers and
`stage_invariant_operands` stores them into wgmma's tile behind a barrier.
Job: when the host can build the view's tensor map (`tma_fill.view_block_box`,
the rules pipelined TMA loads follow) for the tile the pipeline would give
the block as a ring slot (`pipeline_plan._slot_layout`), emit instead

    bar = shared_alloc (1 mbarrier, whole kernel); init by thread 0 in the kernel's prologue, barrier
          (the ring's inits join it there, behind the same fence and barrier: `merge_mbarrier_inits`)
    tile = shared_alloc (wgmma's tile, whole kernel: no barrier ends its last read, so no buffer reuses it)
    if thread 0:
        mbarrier_arrive_expect_tx bar, <bytes of the tile's boxes>
        tma_load tile + j * <box>, map, <block offsets + (0, j * box width)>, bar     (each box j)

and bind the result to that tile (`ctx.staged`, a `SharedOperand`); its
wait, `mbarrier_wait bar, 0`, is owed (`ctx.landing`) and emitted by the
first lowering that reads the tile: `stage_invariant_operands` before a
loop whose dots read it, or the dot itself outside loops.

Guarantees: the box clips at the tensor's edges and lands zero-filled, as
the view's bounds mask (fill 0) says; the mbarrier completes one phase in
the kernel, waited for with parity 0. In a tile loop it completes one phase
a tile, waited for with parity k mod 2 in the loop's k-th tile
(k = (tile - lb) / step), and a barrier before each issue orders it after
every thread's reads of the previous tile's block (each warpgroup retired
its wgmmas before the barrier). The load runs before the loop of a warp-specialized
kernel, so every thread of the CTA sees the init and thread 0, a consumer,
issues the load while the producer starts its fills
(`consumer_prologue.producer_may_run` lets it stay there). In the tile loop
around a warp-specialized K loop, the producer warpgroup issues the loads
whose reads all lie on one side of the K loop's end instead (`tile_operands.py`),
and in a one-tile kernel those read only after the warp-specialized loop
(`tail_operands.py`); the load then lowers to nothing here. Kept out: other
users of the registers (an elementwise op, a store), a nonzero fill,
targets without TMA, and kernels whose programs may hand data to each other:
an ordered op (`orders_programs`: acquire load, release store, atomic) at a
scope wider than the block (`ordered_handoff`; a lowering note names it, the
load and the fix). What another program wrote through the generic proxy and
this one acquired, TMA (the async proxy) may read only after the issuing
thread's `fence.proxy.async.global`, and only if that thread's issue follows
the acquire, which the block load's position does not promise (the acquiring
thread may be another one, or the acquire come later). Ordered ops that are
all `scope="cta"` synchronize only with this block's threads (PTX: two
accesses are morally strong only if each one's scope holds the other's
thread), so no other program's write is ordered before the load by them;
what this block's own threads wrote and ordered before it (by them or by a
barrier) thread 0 makes visible to the async proxy with
`fence.proxy.async.global` right before the issue (`fence_global`), as the
pipelined TMA fills do (`tma_fill.TmaRing`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation
from tessera.ir.ops import OPS, scope_of
from tessera.ir.types import TileType
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..lowering.memory import VIEW_LOAD_STRATEGIES
from ..lowering.wgmma_dot import SharedOperand
from ..mma import mma_plan
from .pipeline_plan import _slot_layout
from .shortfalls import place
from .tma_fill import TmaBox, map_parameter, view_block_box


@dataclass(frozen=True)
class TmaOperand:
    """How one block load lands in wgmma's tile: the tile's layout and the TMA boxes that write it."""

    tile: WgmmaTileLayout
    box: TmaBox
    fence_global: bool = False      # the kernel has (block-scoped) ordered ops: fence the async proxy first


def tile_loop_of(ctx, op: Operation) -> Operation | None:
    """The loop over tiles whose body holds `op`: a plain `for` (not a pipeline) of the kernel's body."""
    holder = op.parent.parent
    if isinstance(holder, Operation) and holder.name == "for" and holder.parent is ctx.src.body and \
            "stages" not in holder.attrs and not holder.attrs.get("warp_specialize"):
        return holder
    return None


def tma_operand(ctx, op: Operation) -> TmaOperand | None:
    """The TMA load of `view_load` `op` straight into the wgmma tile its users read, or None (module docstring)."""
    if op.name != "view_load" or not ctx.target.has("tma"):
        return None
    if op.parent is not ctx.src.body and tile_loop_of(ctx, op) is None:
        return None
    if op in ctx.tma_operands:
        return ctx.tma_operands[op]
    ctx.tma_operands[op] = plan = _plan(ctx, op)
    return plan


def _plan(ctx, op: Operation) -> TmaOperand | None:
    tile_type = op.result.type
    if not isinstance(tile_type, TileType) or len(tile_type.shape) != 2 or op.attrs.get("fill", 0) != 0:
        return None
    ordered = [o for o in ctx.src.walk() if OPS[o.name].orders_programs]
    handoff = ordered_handoff(ordered)
    if handoff is not None:
        ctx.notes.append(_handoff_note(ctx, op, handoff))
        return None
    info = ctx.facts.facts.get(op.operands[0])
    if info is None or not any(info.unit_stride):
        return None
    dim = 1 if info.unit_stride[1] else 0
    size = tile_type.element.dtype.bits // 8
    slot_shape = tile_type.shape if dim == 1 else tile_type.shape[::-1]
    tiles = set()
    uses = [(user, i) for user in ctx.src.walk() for i, v in enumerate(user.operands) if v is op.result]
    for user, index in uses:
        mma = mma_plan(user, ctx.target, ctx.num_threads // ctx.warp_size) if user.name == "dot" else None
        if mma is None or index > 1 or mma.a is not None:       # only wgmma reads its operands from shared memory
            return None
        slot = _slot_layout(mma, index, dim, slot_shape, size, ctx.target.warp_size)
        if slot is None:
            return None
        tiles.add(slot[1])
    if len(tiles) != 1:
        return None
    tile = tiles.pop()
    box = view_block_box(op.operands[0], tile_type.shape, tile_type.element.dtype, dim, tile, ctx.target,
                         ctx.facts.facts)
    return None if box is None else TmaOperand(tile, box, fence_global=bool(ordered))


def ordered_handoff(ordered: list[Operation]) -> Operation | None:
    """The first of the kernel's ordered ops whose scope reaches past the block (a hand-off between programs a
    TMA read could miss), or None when they are all `scope="cta"`."""
    return next((o for o in ordered if scope_of(o) != "cta"), None)


def _handoff_note(ctx, load: Operation, ordered: Operation) -> str:
    where = f" at {load.loc}" if load.loc else ""
    return (f"kernel '{ctx.src.name}': the block load{where} that a wgmma reads is loaded by the threads, not by "
            f"TMA: this kernel's {ordered.name} at {place(ordered)} orders memory at scope "
            f"\"{scope_of(ordered)}\", so other programs may hand it data, which a TMA read issued here need not "
            f"see; if every ordered access only synchronizes threads of one program, give them scope=\"cta\"")


def _tma_operand_load(ctx, op: Operation) -> bool:
    if op.result in ctx.staged:     # bound to the tile the producer loads (`tail_operands.py`)
        return True
    plan = tma_operand(ctx, op)
    if plan is None:
        return False
    box, dtype = plan.box, op.result.type.element.dtype
    with ctx.in_prologue():         # before any warp-specialized split: every thread of the block runs it
        bar = ctx.smem.alloc(dt.i64, 1, align=8, whole_kernel=True)
        with ctx.when(ctx.index.first_thread()):
            ctx.create("mbarrier_init", [bar, ctx.const(1)])
            ctx.create("fence_mbarrier_init")
        ctx.create("barrier")
    tensor_map = map_parameter(ctx, box.recipe)
    # whole_kernel: no barrier closes the last wgmma read of the tile, so its bytes go to no later buffer
    # (`passes/shared_memory.py`)
    buf = ctx.smem.alloc(dtype, plan.tile.rows * plan.tile.cols, align=max(plan.tile.alignment, box.slot_align),
                         whole_kernel=True)
    starts = [ctx.lookup(v) for v in op.operands[1:]]
    parity = ctx.const(0)
    tiles = tile_loop_of(ctx, op)
    if tiles is not None:
        # the barrier's phase k lands tile k's block: parity k mod 2, k = (tile - lb) / step; and every thread
        # is done with tile k - 1's block (its wgmmas retired) before thread 0 overwrites it
        tile, lb, step = (ctx.thread_value(ctx.lookup(v)) for v in (tiles.regions[0].args[0], *tiles.operands[:3:2]))
        count = ctx.emit("div", ctx.emit("sub", tile, lb), step)
        parity = ctx.emit("rem", count, ctx.const(2))
        ctx.threads.barrier()
    with ctx.when(ctx.index.first_thread()):
        if plan.fence_global:       # this block's generic-proxy writes ordered before the load (module docstring)
            ctx.create("fence_proxy_async_global")
        ctx.create("mbarrier_arrive_expect_tx", [bar, ctx.const(box.slot_bytes)])
        for j in range(box.boxes):
            dst = buf if j == 0 else ctx.emit("addptr", buf, ctx.const(j * box.box_elements))
            ctx.create("tma_load", [dst, tensor_map, *box.coordinates(ctx, starts, j), bar])
    ctx.staged[op.result] = SharedOperand(buf, plan.tile)
    ctx.landing[op.result] = (bar, parity)
    return True


VIEW_LOAD_STRATEGIES.append(_tma_operand_load)
