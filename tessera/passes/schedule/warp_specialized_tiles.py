"""A warp-specialized K loop inside a persistent tile loop: both roles walk the tiles, one ring runs through them.

Input: a tile-IR `for` over tiles (a statement of the kernel: a persistent
kernel's `for tile in range(pid, tiles, num_programs)`) whose body holds a
`for {warp_specialize = true}` that `warp_specialization_refusal` accepted
(`persistent.specialized_tile_loop_refusal` says which nestings are). Job:
CUTLASS's KernelTmaWarpSpecializedCooperative: the producer warpgroup runs
the tile loop with only the scalar tile math its fills need, the consumers
run it with the whole body (the K loop, the epilogue), and the ring's slot
and phase count on across tiles, so the producer fills the next tile's
slots while the consumers run this tile's epilogue, held back only by the
empty barriers; blocks that the K loop reads but that are the same for all
its iterations (attention's Q) the producer loads too, one tile ahead
(`tile_operands.py`, in FlashAttention-3's order: the first K block before
the wait for Q's release). Guarantees: as `warp_specialization.py`'s, with the
mbarriers initialized once before the split and invalidated once after
both branches meet; the emitted code is the comment above
`lower_specialized_tile_loop`. In a thread-block cluster with multicast
loads the ring is `multicast.py`'s (the producer issues its share to every
block, consumers release on every block's empty barriers); the kernel must
run the same tiles on every block of a cluster (the GEMM walks cluster-tiles).
"""

from __future__ import annotations

from tessera.ir.core import Block, Operation, Value
from tessera.ir.types import TileType

from ..lowering import lower_op
from ..lowering.invariant_operands import end_staged_reads, stage_invariant_operands
from ..lowering.values import I32, Regs
from . import tile_operands
from .persistent import tile_slice
from .software_pipeline import slot_ahead
from .warp_specialization import (SpecializedRing, consumer_entry, consumer_loop, end_ring, producer_entry,
                                  producer_exit, producer_fills, producer_first_fill, release, specialized_ring,
                                  split_roles)


# `for tile in range(lo, hi, step) { ...; for k in tessera.pipeline(..., warp_specialize=True) {...}; ... }`
# lowers to (g: the program's count of K iterations over all its tiles so far; each iteration of each tile
# uses slot g mod S with parity (g div S) mod 2, as in `persistent.py`'s non-specialized schedule):
#
#     rings, full[S], empty[S]: allocated and initialized here, once (`specialized_ring`)
#     [k0, q, v1; their full and empty mbarriers: the once-a-tile operands' HEAD, LOOP and TAIL groups, each
#      with its own pair (`tile_operands.py`; attention's overlapped order: K_lo, Q, V_hi-1; the FA2 order: Q)]
#     if thread_id >= C {producer_joins_at = k}               the producer warpgroup
#         [setmaxnreg dec 40]
#         if thread_id == C {
#             for tile = lo .. hi, slot = 0, phase = 0, wrapped = 0, [q_phase = 0]:
#                 ... the scalar ops of the tile body that the K loop's bounds and the blocks' addresses
#                     need (`tile_slice`): pid_m, pid_n, the bounds ...
#                 [if tile > lo: mbarrier_wait k0_empty, 1 - q_phase     (HEAD: the previous tile's release)
#                  arrive_expect_tx k0_full; tma_load k0 ... k0_full]
#                 [slot, phase, wrapped = if lb < ub {the fill of iteration lb, as in the loop below}]
#                 [if tile > lo: mbarrier_wait q_empty, 1 - q_phase      (LOOP: the previous tile's release)
#                  arrive_expect_tx q_full; tma_load q ... q_full]
#                 for iv = lb [+ step] .. ub, slot, phase, wrapped:        (+ step: with a LOOP group)
#                     if wrapped: mbarrier_wait empty[slot], 1 - phase        (the release of fill g - S)
#                     arrive_expect_tx full[slot]; tma_load ... full[slot]
#                     wrapped |= slot == S - 1; slot, phase = next
#                 [if tile > lo: mbarrier_wait v1_empty, 1 - q_phase     (TAIL: the previous tile's release)
#                  arrive_expect_tx v1_full; tma_load v1 ... v1_full]
#         }
#         named_barrier {id = 2, count = C + 128}
#     } else {                                                 the consumers
#         [setmaxnreg inc R]
#         for tile = lo .. hi, carried..., slot = 0, phase = 0, [q_phase = 0]:
#             ... the tile body before the K loop (pid_m, pid_n, acc = 0) ...
#             [mbarrier_wait q_full, q_phase; mbarrier_wait k0_full, q_phase     (at their first reads)]
#             [wgmma_wait {pending = 0}; if thread_id % 128 == 0: mbarrier_arrive k0_empty]
#             %acc, slot', phase' = for iv = lb .. ub, acc, slot, phase:    `consumer_loop`, as without tiles:
#                 mbarrier_wait full[slot], phase; wgmma ...; wgmma_wait {pending = 1}
#                 if iv > lb and thread_id % 128 == 0: mbarrier_arrive empty[slot - 1]
#             wgmma_wait {pending = 0}
#             if lb < ub and thread_id % 128 == 0: mbarrier_arrive empty[slot' - 1]   (the tile's last slot)
#             [if thread_id % 128 == 0: mbarrier_arrive q_empty]
#             ... the rest of the tile body (the epilogue; barriers are the consumers' named barrier 1) ...
#                 [mbarrier_wait v1_full, q_phase                        (at the first read of v1)]
#             [wgmma_wait {pending = 0}; if thread_id % 128 == 0: mbarrier_arrive v1_empty]
#         named_barrier {id = 2}; thread 0 invalidates full[] and empty[]; named_barrier {id = 1}
#         ... the rest of the kernel ...
#     }
#
# Why it is right. Both roles count the same iterations in the same order (the same tiles, the same bounds,
# computed by the same scalar ops), so fill g and its wait use the same slot and parity. Every iteration's
# slot is released exactly once: inside the loop the slot of the iteration before (after the wait that retired
# its wgmma group), and after the loop, once `wgmma_wait {pending = 0}` has retired the last group, the tile's
# last slot (without a group in flight, each iteration releases its own slot in the loop, as before). So the
# producer's k-th fill of a slot (k >= 1) waits for the slot's (k-1)-th release, phase k-1 of empty[slot]:
# parity 1 - phase; its first S fills wait for nothing (`wrapped`: a wait for parity 1 of a fresh barrier would
# not wait). The producer is never more than S fills ahead, so it fills the next tile's first slots while the
# consumers run this tile's epilogue, and the epilogue's buffers cannot share the rings' bytes: the rings are
# live until the branches meet after the tile loop (`shared_memory._lifted_end`). Tiles with no K iteration
# fill, wait and release nothing in the ring; each once-a-tile group (the bracketed parts: attention's Q, and with
# the overlapped order K_lo and V_hi-1) completes one phase of its full and empty barriers every tile, so the
# producer loads tile k + 1's q once the consumers' K loop of tile k is over, its k0 once their first S of
# tile k retired, and its v1 once tile k is done; the tile's first fill goes before the wait for q's release
# (FlashAttention-3's order; `tile_operands.py` says why none of this deadlocks).
def lower_specialized_tile_loop(ctx, outer: Operation, op: Operation) -> None:
    """Lower tile loop `outer` holding warp-specialized loop `op` as the comment above says."""
    ring = specialized_ring(ctx, op)
    operands = tile_operands.allocate(ctx, tile_operands.movable_operands(ctx, outer, op, ring.consumers),
                                      ring.consumers)
    producer, consumer = Block(), Block()
    with ctx.b.at(producer):
        producer_entry(ctx, ring)
        with ctx.when(ctx.emit("cmp", ctx.index.thread_id, ctx.const(ring.consumers), attrs={"pred": "eq"})):
            _producer_tiles(ctx, outer, op, ring, operands)
        producer_exit(ctx, ring)
    with ctx.b.at(consumer):
        consumer_entry(ctx, ring)
        results = _consumer_tiles(ctx, outer, op, ring, operands)
        end_ring(ctx, ring, operands.mbarriers if operands else ())
    split_roles(ctx, ring, producer, consumer)
    for old, result in zip(outer.results, results):
        result.name_hint = old.name_hint
        ctx.define(old, Regs(result, ctx.assignment.layout(old)) if isinstance(old.type, TileType) else result,
                   outer)


def _producer_tiles(ctx, outer: Operation, op: Operation, ring: SpecializedRing,
                    operands: tile_operands.TileOperands | None) -> None:
    """The issuing thread's tile loop: per tile, the scalar ops the fills need, then the fills, and the tile's
    blocks outside the ring (`tile_operands.py`, with their parity carried last) in FlashAttention-3's order:
    HEAD, the first fill, LOOP, the other fills, TAIL."""
    lo, hi, step = [ctx.thread_value(ctx.operand(outer, i)) for i in range(3)]
    values = list(op.operands[:3]) + [v for load in ring.plan.loads for o in (load.load, *load.slice)
                                      for v in o.operands]
    if operands is not None:
        values += [v for group in operands.groups for load, plan in zip(group.loads, group.plans)
                   for v in (*load.operands, *plan.box.leading)]
    slice_ops, _ = tile_slice(outer, values)            # (the refusal and `movable_operands` checked it)
    region = outer.regions[0]
    names = [region.args[0].name_hint or "tile", "slot", "phase", "wrapped"] + (["operand_phase"] if operands else [])
    body = Block([lo.type] + [I32] * (len(names) - 1), names)
    with ctx.b.at(body):
        ctx.env[region.args[0]] = body.args[0]
        for slice_op in slice_ops:
            lower_op(ctx, slice_op)
        lb, ub, k_step = [ctx.thread_value(ctx.operand(op, i)) for i in range(3)]
        start = tuple(body.args[1:4])
        if operands is None:
            fills = producer_fills(ctx, ring, lb, ub, k_step, start).results
        else:
            tile, parity = body.args[0], body.args[4]
            tile_operands.issue(ctx, operands.at(tile_operands.HEAD), tile, lo, parity)
            loop = operands.at(tile_operands.LOOP)
            if loop is not None:        # the tile's first fill before the wait for Q's release (FlashAttention-3)
                start = tuple(producer_first_fill(ctx, ring, lb, ub, start))
                tile_operands.issue(ctx, loop, tile, lo, parity)
                lb = ctx.emit("add", lb, k_step)
            fills = producer_fills(ctx, ring, lb, ub, k_step, start).results
            tile_operands.issue(ctx, operands.at(tile_operands.TAIL), tile, lo, parity)
        carried = list(fills) + ([tile_operands.flip(ctx, body.args[4])] if operands else [])
        ctx.create("yield", carried)
    zero = ctx.const(0)
    ctx.create("for", [lo, hi, step] + [zero] * (len(names) - 1), None, [I32] * (len(names) - 1), [body])


def _consumer_tiles(ctx, outer: Operation, op: Operation, ring: SpecializedRing,
                    operands: tile_operands.TileOperands | None) -> list[Value]:
    """The consumers' tile loop, the whole body with the K loop as `_consumer_k_loop` and the blocks the producer
    loads bound to its buffers (`tile_operands.bind`; those read after the K loop released before the yield);
    its results (the ring's slot and phase, and the producer-loaded blocks' parity, carried last, left out)."""
    inits = [ctx.thread_value(ctx.operand(outer, i)) for i in range(len(outer.operands))]
    region = outer.regions[0]
    body = ctx.new_block(region)
    slot, phase = body.add_arg(I32, "slot"), body.add_arg(I32, "phase")
    carried = [body.add_arg(I32, "operand_phase")] if operands is not None else []
    with ctx.b.at(body):
        for old, new in zip(region.args, ctx.region_args(region, body)):
            ctx.env[old] = new
        for body_op in region.ops:
            group = operands.group_of(body_op) if operands is not None else None
            if body_op is op:
                slot, phase = _consumer_k_loop(ctx, op, ring, slot, phase, operands)
            elif group is not None:
                tile_operands.bind(ctx, group, body_op, carried[0])
            else:
                if body_op is region.ops[-1] and carried:     # (the yield)
                    tile_operands.release(ctx, operands.at(tile_operands.TAIL))   # the tile's last reads are over
                    carried = [tile_operands.flip(ctx, carried[0])]
                lower_op(ctx, body_op)
    body.ops[-1].operands.extend([slot, phase, *carried])   # the yield carries the ring's place too
    zero = ctx.const(0)
    new = ctx.create("for", [*inits, zero, zero] + [zero] * len(carried), None,
                     [ctx.thread_type(r) for r in outer.results] + [I32] * (2 + len(carried)), [body])
    return new.results[:len(outer.results)]


def _consumer_k_loop(ctx, op: Operation, ring: SpecializedRing, slot: Value, phase: Value,
                     operands: tile_operands.TileOperands | None) -> tuple[Value, Value]:
    """One tile's K loop in the consumers' branch, from the ring's `slot` and `phase`, after the release of the
    producer-loaded blocks read only before it (`operands`' HEAD); then, with a wgmma group in flight, its
    retirement and the release of the tile's last slot, and the release of the blocks the loop read (LOOP).
    Returns the ring's slot and phase after it."""
    if operands is not None:     # the blocks read only before the loop (the peeled K): the producer may reload them
        tile_operands.release(ctx, operands.at(tile_operands.HEAD))
    staged = stage_invariant_operands(ctx, op)
    lb, ub, step = [ctx.thread_value(ctx.operand(op, i)) for i in range(3)]
    loop = consumer_loop(ctx, op, ring, lb, ub, step, start=(slot, phase))
    count = len(op.results)
    end_slot, end_phase = loop.results[count:count + 2]
    plan = ring.plan
    if plan.in_flight:
        ctx.create("wgmma_wait", attrs={"pending": 0})     # the last group, before the accumulator is read
        ran = ctx.emit("cmp", lb, ub, attrs={"pred": "lt"})
        release(ctx, ring, slot_ahead(ctx, end_slot, plan.stages - 1, plan.stages), ran)
    if operands is not None:
        tile_operands.release(ctx, operands.at(tile_operands.LOOP), plan.in_flight)
    end_staged_reads(ctx, op, staged)           # (Q's tile, staged by the consumers each tile)
    for old, result in zip(op.results, loop.results):
        result.name_hint = old.name_hint
        ctx.define(old, Regs(result, ctx.assignment.layout(old)) if isinstance(old.type, TileType) else result, op)
    return end_slot, end_phase
