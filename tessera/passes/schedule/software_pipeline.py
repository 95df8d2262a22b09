"""Software pipelining: a `for {stages = S}` whose tensor-core operands are copied ahead into ring buffers.

Input: a tile-IR `for` and the `PipelinePlan` that `pipeline_plan.py` made
for it (which loads, in which slot layout, how far ahead). Job: give each
pipelined load a ring of S slots in shared memory, fill the slots of later
iterations with cp.async (or TMA, `tma_fill.py`) while the body computes,
and let the dot read the current slot directly (ldmatrix for mma.sync,
descriptors for wgmma). Guarantees: a slot is read only after every
thread's copies into it have landed, and refilled only after every read of
it (wgmma groups included) is over; the loop computes what the plain loop
computes (the SIMT simulator checks it). The emitted loop and the argument
for its safety are the comment above `lower_pipelined_for`.
"""

from __future__ import annotations

from tessera.ir.core import Block, Operation, Value
from tessera.ir.types import TileType
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from ..lowering import lower_op
from ..lowering.invariant_operands import await_loop_operands
from ..lowering.memory import view_lanes
from ..lowering.mma_operands import swizzle_offsets, wgmma_tile_offsets
from ..lowering.values import I32, Regs, RingOperand
from .persistent import RingStart, for_next_tile, next_tile_slice, persistent_outer_loop, ring_start
from .pipeline_plan import PipelinedLoad, PipelinePlan
from .tma_fill import TmaRing


# A loop the author wrote as `for k in tessera.pipeline(lo, hi, stages=S)`
# carries `stages = S` in the tile IR. When lowering it to threads,
# `pipeline_plan.pipeline_plan` picks the loads to pipeline (the A and B
# blocks of a tensor-core dot: see its docstring for the conditions) and this
# emits, instead of load -> registers -> swizzled shared -> ldmatrix
# in every iteration:
#
#     ring_a = shared_alloc (S slots of the A block)        ... one ring per pipelined load
#     for s in 0 .. S-2:                                     prologue: iterations lo .. lo+(S-2)*step
#         async_copy ring_a[s], A(lo + s*step), pred        16 (else 8 / 4) bytes per copy, zero-filled
#         ...                                                where the view's bounds mask the chunk or
#         async_commit                                       the iteration is past the end
#     for iv, ..., slot = 0:
#         async_wait {pending = S-2}                         iteration iv's group has landed (own copies)
#         barrier                                            ... and everyone's; and every thread is done
#                                                            reading slot iv-1, the slot refilled next
#         async_copy ring_a[slot-1 mod S], A(iv + (S-1)*step), pred
#         async_commit                                       (one group per iteration, possibly empty of
#                                                            live bytes, so the group count stays exact)
#         ... body, with the pipelined loads read from ring[slot] by ldmatrix straight into the mma
#             fragments (`mma_operands.read_fragment`: the same swizzle and row plan as the
#             non-pipelined path) ...
#         yield ..., (slot + 1) mod S
#     async_wait {pending = 0}                               drain the (zero-filling) copies past the end
#     barrier                                                before later buffers reuse the rings' bytes
#
# Slot s of a ring holds the block row-major along the view's contiguous dim
# (for a dim-0-contiguous operand, the transposed block, read with ldmatrix's
# .trans flipped), XOR-swizzled in 16-byte chunks so that the ldmatrix row
# reads are bank-conflict free; each copy moves one chunk of contiguous
# elements, so the swizzle never splits it. The view and offsets of
# iteration iv + (S-1)*step come from re-lowering the body's scalar address
# ops (the plan's `slice`) with the induction variable replaced.
#
# On targets with TMA, loads whose view qualifies are filled by TMA instead
# (one thread issues a box per slot and signals the slot's mbarrier; every
# thread waits on it before reading the slot): see `tma_fill.py`. The group
# bookkeeping above then covers only the cp.async loads, and the loop also
# carries the mbarriers' phase parity: slot s's k-th fill is iteration
# s + k*S's blocks, so the wait of iteration i is for parity (i // S) mod 2,
# flipped each time the slot index wraps, whatever the prefetch distance (a
# prologue of fewer than S - 1 fills leaves the later slots' first phases to
# the loop's refills, which come before their waits). Both slot kinds take
# TMA: an mma.sync slot as one box, a wgmma slot as one box per column block.
#
# One barrier per iteration replaces the two per operand of the plain path:
# the barrier after the wait both publishes the landed slot and orders the
# previous iteration's ldmatrix reads of the slot about to be refilled
# before the copies into it (the SIMT simulator checks both).
#
# wgmma (sm_90a; `PipelinePlan.on_wgmma`). The slots hold the blocks in a
# wgmma layout (`PipelinedLoad.slot_layout`: K- or MN-major, swizzled in
# 16-byte chunks, so the chunk-per-copy fill is unchanged) and the dot reads
# them through matrix descriptors (`wgmma_dot`), with no register round trip.
# cp.async writes through the generic proxy and wgmma reads through the async
# proxy, so every thread fences its landed copies before the barrier that
# publishes them. TMA (sm_90a's usual fill) writes through the async proxy
# itself, so its slots need no fence on either side (neither after the
# landing nor before a refill, since wgmma's reads are async-proxy reads too);
# their wait is the slot's mbarrier, which every thread waits on itself.
# When the plan keeps a group in flight (F = `plan.in_flight` = 1) the refill
# moves after the wgmmas' wait, as in Triton's and CUTLASS's mainloops:
#
#         cp.async:  async_wait {pending = D-1}; fence_proxy_async; barrier
#         TMA:       mbarrier_wait bars[slot], phase
#         wgmma_fence; %acc' = wgmma ... %acc ...; wgmma_commit; wgmma_wait {pending = 1}
#         barrier; refill slot+D (cp.async by every thread, TMA by thread 0)
#     (after the loop) wgmma_wait {pending = 0}; async_wait {pending = 0} or mbarrier_inval; barrier
#
# (F = 0: the wgmma dot waits for its own group, and the refill stays at the
# top, after the barrier, as in the mma.sync loop.) One group stays in flight
# across the back edge, the accumulator carried in the wgmma registers, and
# the copies run D = `plan.prefetch` = S - 1 iterations ahead (the prologue
# fills slots 0 .. D-1; iteration i refills slot (i + D) mod S = (i - 1) mod
# S). Why no slot is refilled while a wgmma may read it: the refill in
# iteration i comes after the barrier that every thread reaches only after
# its warpgroup's `wgmma_wait {pending = 1}` of iteration i; so every group up
# to i-1, in every warpgroup, has retired, and only group i reads its slot
# i. Slots i+1 .. i+D-1 hold landed or pending copies, and the refilled slot
# i+D = i-1 (mod S) is the one left, so S = 2 works too. With TMA the same
# barrier follows every thread's mbarrier wait of iteration i-1 for that
# slot's previous fill, so the refill's arrive_expect_tx opens the next phase
# of an mbarrier whose last phase has completed and been observed by every
# thread; and each thread waits on the mbarrier itself before reading a
# slot, so the top of the loop needs no barrier. The SIMT simulator checks
# the argument for both fills: refilling a slot an in-flight wgmma reads is
# reported when that wgmma retires.
def lower_pipelined_for(ctx, op: Operation, plan: PipelinePlan) -> None:
    """Lower the tile-IR `for` `op` as the pipelined loop `plan` describes (see the comment above; nested in a
    persistent tile loop: `persistent.py`)."""
    lb, ub, step, *inits = [ctx.thread_value(ctx.operand(op, i)) for i in range(len(op.operands))]
    stages = plan.stages
    outer = persistent_outer_loop(op) if plan.tma_loads else None     # tiles share the mbarriers
    ahead = next_tile_slice(outer, plan.loads) if outer is not None and not plan.copy_loads else None
    if ahead is not None:                       # the rings outlive the tile: the next one's fills overlap its end
        with ctx.in_prologue():                 # (live until the tile loop ends: `persistent.py`)
            rings = _rings(ctx, plan)
    else:
        rings = _rings(ctx, plan)
    tma = TmaRing(ctx, plan.loads, stages, outer, prefetch=plan.prefetch) if plan.tma_loads else None
    start = ring_start(ctx, outer, op, stages) if outer is not None else None
    if ahead is not None:
        with ctx.when(start.first):             # later tiles' first fills came from the tile before
            _prologue(ctx, plan, rings, lb, ub, start, tma)
    else:
        _prologue(ctx, plan, rings, lb, ub, start, tma, released=start is not None)
    await_loop_operands(ctx, op)                # Q's TMA load (`tma_operand.py`) in flight beside the first fills

    body = _body(ctx, op, plan, rings, ub, tma)
    extra = [I32] + ([I32] if tma else [])
    result_types = [ctx.thread_type(r) for r in op.results] + extra
    starts = [start.slot, start.phase] if start else [ctx.const(0)] + ([ctx.const(0)] if tma else [])
    new = ctx.create("for", [lb, ub, step, *inits, *starts], {"stages": stages}, result_types, [body])
    if plan.in_flight:
        ctx.create("wgmma_wait", attrs={"pending": 0})
    if plan.copy_loads:
        ctx.create("async_wait", attrs={"pending": 0})
    if tma:
        tma.release(ctx)                           # the slots' mbarriers end before the bytes are reused
    ctx.threads.barrier()
    if ahead is not None:
        multicast = tma is not None and tma.cluster is not None      # (the count only a multicast ring uses)
        end = RingStart(new.results[len(op.results)], new.results[len(op.results) + 1], None,
                        ctx.emit("add", start.count, start.per_tile) if multicast else None)
        for_next_tile(ctx, outer, ahead,
                      lambda live: _prologue(ctx, plan, rings, lb, ub, end, tma, live, released=True))
    for old, result in zip(op.results, new.results):
        result.name_hint = old.name_hint
        ctx.define(old, Regs(result, ctx.assignment.layout(old)) if isinstance(old.type, TileType) else result, op)


def _rings(ctx, plan: PipelinePlan) -> list[Value]:
    """One ring of `plan.stages` slots per pipelined load."""
    return [ctx.smem.alloc(load.dtype, plan.stages * load.slot_elements,
                           align=load.slot_alignment if load.on_wgmma or load.tma else None)
            for load in plan.loads]


def _prologue(ctx, plan: PipelinePlan, rings, lb: Value, ub: Value, start, tma: TmaRing | None,
              also: Value | None = None, released: bool = False) -> None:
    """The fills of the loop's first `plan.prefetch` iterations, into slots 0, 1, ... (or from `start.slot`
    on); `also`: a further condition on them (the tile they are for exists). `released`: a persistent tile's
    fills, which on a multicast ring (`multicast.py`) release their slots as the loop's refills do (below)."""
    cluster = released and tma is not None and tma.cluster is not None
    for stage in range(plan.prefetch):
        iv = lb if stage == 0 else ctx.emit("add", lb, ctx.const(stage * plan.step, lb.type.dtype))
        slot = start.slot_after(ctx, stage, plan.stages) if start else ctx.const(stage)
        phase, when = _prologue_release(ctx, start, stage, plan) if cluster else (None, None)
        _issue(ctx, plan, rings, iv, ub, slot, tma, also, phase, when)


# A multicast ring in a persistent kernel (`multicast.py`) counts its empty barriers' phases across tiles: the
# fill of program-wide iteration f (slot f mod S) is the one that an unbroken pipeline would have issued in
# iteration g = f - D (D = S - 1 ahead), so it releases its slot as that refill would, waiting for parity
# (g div S) mod 2, when g >= 0; the program's first D fills (g < 0) take fresh slots and release nothing. A
# tile's own first D fills come outside its loop (its prologue, or the tile before's `for_next_tile`), yet
# keep that count, so every fill of every block of the cluster passes the empty barrier of its slot in the same
# order, and the loop's refills wait for the parity they would without tiles.
def _prologue_release(ctx, start: RingStart, stage: int, plan: PipelinePlan) -> tuple[Value, Value]:
    """(parity, condition) of the empty-slot wait before the tile's fill `stage` (see above)."""
    g = ctx.emit("add", start.count, ctx.const(stage - plan.prefetch))
    when = ctx.emit("cmp", g, ctx.const(0), attrs={"pred": "ge"})
    parity = ctx.emit("and", ctx.emit("div", ctx.emit("max", g, ctx.const(0)), ctx.const(plan.stages)),
                      ctx.const(1))
    return parity, when


def _body(ctx, op: Operation, plan: PipelinePlan, rings, ub: Value, tma: TmaRing | None) -> Block:
    """The pipelined loop's body: wait for the slot, compute on it, refill (before or after the dot)."""
    region = op.regions[0]
    body = ctx.new_block(region)
    slot = body.add_arg(I32, "slot")
    phase = body.add_arg(I32, "phase") if tma else None
    with ctx.b.at(body):
        if plan.copy_loads:
            ctx.create("async_wait", attrs={"pending": plan.prefetch - 1})
        if tma:
            tma.wait(ctx, slot, phase)
        if any(load.on_wgmma for load in plan.copy_loads):
            ctx.create("fence_proxy_async")     # the landed copies (generic proxy) -> wgmma's async proxy
        if plan.copy_loads or not plan.in_flight:
            ctx.threads.barrier()
        if not plan.in_flight:
            _refill(ctx, plan, rings, body, ub, slot, tma, phase)
        carried = next_slot_and_phase(ctx, slot, phase, plan.stages)
        reads = {load.load: RingOperand(ring, _times(ctx, slot, load.slot_elements), load, plan.in_flight)
                 for load, ring in zip(plan.loads, rings)}
        for old, new in zip(region.args, ctx.region_args(region, body)):
            ctx.env[old] = new
        for body_op in region.ops[:-1]:
            lower_body_op(ctx, body_op, reads)
        if plan.in_flight:                      # after the dot's wgmma_wait {pending = 1}: see above
            ctx.threads.barrier()
            _keeping_env(ctx, plan, lambda: _refill(ctx, plan, rings, body, ub, slot, tma, phase))
        lower_body_op(ctx, region.ops[-1], reads)
    body.ops[-1].operands.extend(carried)       # the yield carries the slot (and phase) too
    return body


def _refill(ctx, plan: PipelinePlan, rings, body, ub: Value, slot: Value, tma: TmaRing | None,
            phase: Value | None = None) -> None:
    """Issue the copies of iteration iv + prefetch * step into the slot `prefetch` ahead of `slot` (`phase`: this
    iteration's mbarrier parity, which a cluster's multicast ring also waits on its empty barriers with)."""
    ahead = ctx.emit("add", body.args[0], ctx.const(plan.prefetch * plan.step, body.args[0].type.dtype))
    _issue(ctx, plan, rings, ahead, ub, slot_ahead(ctx, slot, plan.prefetch, plan.stages), tma, refill_phase=phase)


def _keeping_env(ctx, plan: PipelinePlan, emit) -> None:
    """Run `emit` (a refill, which re-lowers the loads' address ops for an iteration ahead) and then bind the
    induction variable and those ops' results back to this iteration's values, for the ops after it."""
    region = plan.loop.regions[0]
    values = [region.args[0]] + [r for load in plan.loads for op in load.slice for r in op.results]
    saved = {v: ctx.env[v] for v in values if v in ctx.env}
    emit()
    ctx.env.update(saved)


def lower_body_op(ctx, op: Operation, reads: dict) -> None:
    """A body op: pipelined loads (and layout conversions of them) become their ring slot."""
    if op in reads:
        ctx.env[op.result] = reads[op]
    elif op.name == "convert_layout" and isinstance(ctx.env.get(op.operands[0]), RingOperand):
        ctx.env[op.result] = ctx.env[op.operands[0]]
    else:
        lower_op(ctx, op)


def next_slot_and_phase(ctx, slot: Value, phase: Value | None, stages: int) -> list[Value]:
    """(slot + 1) mod S, and, for a ring with mbarriers, their phase parity, flipped when the ring wraps."""
    at_last = ctx.emit("cmp", slot, ctx.const(stages - 1), attrs={"pred": "eq"})
    carried = [ctx.emit("select", at_last, ctx.const(0), ctx.emit("add", slot, ctx.const(1)))]
    if phase is not None:
        carried.append(ctx.emit("select", at_last, ctx.emit("sub", ctx.const(1), phase), phase))
    return carried


def _times(ctx, value: Value, n: int) -> Value:
    return ctx.emit("mul", value, ctx.const(n))


def slot_ahead(ctx, slot: Value, ahead_by: int, stages: int) -> Value:
    """(slot + ahead_by) mod stages, for 0 <= slot < stages."""
    if ahead_by == stages - 1:                  # slot - 1, wrapping
        at_first = ctx.emit("cmp", slot, ctx.const(0), attrs={"pred": "eq"})
        return ctx.emit("select", at_first, ctx.const(stages - 1), ctx.emit("sub", slot, ctx.const(1)))
    wraps = ctx.emit("cmp", slot, ctx.const(stages - ahead_by), attrs={"pred": "ge"})
    return ctx.emit("select", wraps, ctx.emit("add", slot, ctx.const(ahead_by - stages)),
                    ctx.emit("add", slot, ctx.const(ahead_by)))


def _issue(ctx, plan: PipelinePlan, rings, iv: Value, ub: Value, slot: Value, tma: TmaRing | None,
           also: Value | None = None, refill_phase: Value | None = None, release_when: Value | None = None) -> None:
    """Copy every pipelined block of iteration `iv` into ring slot `slot`: the cp.async ones as one group, the
    TMA ones on the slot's mbarrier; none past the loop's end, or where `also` is false. `refill_phase`,
    `release_when`: a multicast ring's empty-slot wait (`TmaRing.issue`)."""
    live = ctx.emit("cmp", iv, ub, attrs={"pred": "lt"})
    if also is not None:
        live = ctx.emit("and", live, also)
    body = plan.loop.regions[0]
    ctx.env[body.args[0]] = iv
    order = {op: i for i, op in enumerate(body.ops)}
    for slice_op in sorted({op for load in plan.loads for op in load.slice}, key=order.__getitem__):
        if slice_op.name == "load":
            _speculative_load(ctx, slice_op, live)
        else:
            lower_op(ctx, slice_op)
    offsets = {load.load: _times(ctx, slot, load.slot_elements) for load in plan.loads}
    for load, ring in zip(plan.loads, rings):
        if load.tma is None:
            _copy_block(ctx, load, ring, offsets[load.load], live)
    if plan.copy_loads:
        ctx.create("async_commit")
    if tma:
        tma.issue(ctx, {load.load: ring for load, ring in zip(plan.loads, rings)}, offsets, slot, live, refill_phase,
                  release_when)


def _speculative_load(ctx, op: Operation, live: Value) -> None:
    """A scalar load of the address slice (a block table's entry) for an iteration that may lie past the end of
    the loop: read only where `live`, else 0 (that iteration's copies are predicated off), so a table exactly as
    long as the loop is never read out of bounds."""
    ptr, *rest = [ctx.thread_value(ctx.operand(op, i)) for i in range(len(op.operands))]
    pred = live if not rest else ctx.emit("and", live, rest[0])
    new = ctx.create("load", [ptr, pred, *rest[1:]], op.attrs, [op.result.type])
    new.result.name_hint = op.result.name_hint
    ctx.define(op.result, new.result)


def _copy_block(ctx, load: PipelinedLoad, ring: Value, offset: Value, live: Value) -> None:
    """async_copy of each chunk this thread owns under `load.copies`, zero-filled where masked."""
    tile_op, copies, dim = load.load, load.copies, load.contiguous_dim
    view = ctx.lookup(tile_op.operands[0])
    starts = [ctx.lookup(v) for v in tile_op.operands[1:]]
    steps = [1, 1]
    steps[dim] = load.width
    src, inside = view_lanes(ctx, tile_op, copies, view, starts, steps)
    count = copies.local_size
    pred = ctx.emit("and", inside, ctx.splat(live, count))
    index = ctx.emit("add", _slot_index(ctx, load), ctx.splat(offset, count))
    dst = ctx.emit("addptr", ctx.splat(ring, count), index)
    for j in range(count):
        ctx.create("async_copy", [ctx.extract(dst, j), ctx.extract(src, j), ctx.extract(pred, j)],
                   {"bytes": load.copy_bytes})


def _slot_index(ctx, load: PipelinedLoad) -> Value:
    """Element offset in the slot (`load.slot_layout`) of each copy chunk this thread owns."""
    copies, dim, layout = load.copies, load.contiguous_dim, load.slot_layout
    rows, cols = [0, 0], [0, 0]                     # slot row and column of a chunk, from its copy coordinates
    rows[1 - dim], cols[dim] = 1, load.width
    if isinstance(layout, WgmmaTileLayout):
        return wgmma_tile_offsets(ctx, layout, copies, rows, cols)
    weights = [0, 0]                                # row-major along `dim`, swizzled for ldmatrix
    weights[dim] = load.width
    weights[1 - dim] = load.load.result.type.shape[dim]
    return swizzle_offsets(ctx, ctx.index.regs(copies, weights), layout.swizzle)
