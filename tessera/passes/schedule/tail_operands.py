"""Blocks a one-tile kernel reads only after its warp-specialized loop, loaded by the producer after its fills.

Input: a kernel whose body holds a `for {warp_specialize = true}` (`warp_specialization.py`) and, after it,
a `view_load` that `tma_operand` plans for (one TMA load into wgmma's tile), read only by ops of the kernel's
body after the loop: attention's overlapped order's last V block, whose P V ends the key loop. Without this
module consumer thread 0 issues that load when the consumers reach it, after the loop, and the next wgmma
waits for its whole latency. Job (FlashAttention-3's producer, which loads the last V block after its loop):
the producer warpgroup's issuing thread computes the block's address (the scalar ops after the loop it needs,
`address_slice`) and issues the load right after its last ring fill, so it lands while the consumers run the
loop's last iterations; the consumers bind the block to its tile and wait at the first read:

    bar  = 1 mbarrier, count 1, `whole_kernel` (init in the kernel's prologue, like `tma_operand.py`'s)
    tile = wgmma's tile, `whole_kernel`
    producer, after its fills:   [the address's scalar ops]; arrive_expect_tx bar; tma_load tile ... bar
    consumers, at the first read: mbarrier_wait bar, 0

Why it is right: the bytes are written once in the kernel, by the producer, and read only after the wait
that observes their landing (phase 0); nothing else uses them (`whole_kernel`). The producer waits for
nothing more, so no deadlock can come of it. Kept out, as in `tma_operand.py`, the loads of a kernel with
ordered ops (`fence_global`), and loads whose address needs a value the producer lacks (one the loop
computes, or one read from memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import TileType

from .tma_fill import map_parameter
from .tma_operand import TmaOperand, tma_operand


@dataclass(frozen=True)
class TailOperand:
    """One block the producer loads after its fills: the load, its plan, its tile, its mbarrier and the scalar
    ops after the loop that its address needs."""

    load: Operation
    plan: TmaOperand
    buf: Value
    bar: Value
    slice: tuple[Operation, ...]


def tail_operands(ctx, loop: Operation) -> tuple[TailOperand, ...]:
    """Before the roles split: the blocks after warp-specialized loop `loop` (an op of the kernel's body) that the
    producer loads, each with its tile and mbarrier allocated and initialized in the prologue."""
    body = ctx.src.body.ops
    end = body.index(loop)
    found = []
    for op in body[end + 1:]:
        plan = tma_operand(ctx, op) if op.name == "view_load" else None
        if plan is None or plan.fence_global:
            continue
        users = [user for user in ctx.src.walk() if op.result in user.operands]
        if not users or any(user.parent is not ctx.src.body for user in users):
            continue
        ops = address_slice(ctx, loop, [*op.operands, *plan.box.leading])
        if ops is None:
            continue
        with ctx.in_prologue():     # before the split: every thread sees the init
            bar = ctx.smem.alloc(dt.i64, 1, align=8, whole_kernel=True)
            with ctx.when(ctx.index.first_thread()):
                ctx.create("mbarrier_init", [bar, ctx.const(1)])
                ctx.create("fence_mbarrier_init")
            ctx.create("barrier")
        buf = ctx.smem.alloc(op.result.type.element.dtype, plan.tile.rows * plan.tile.cols,
                             align=max(plan.tile.alignment, plan.box.slot_align), whole_kernel=True)
        found.append(TailOperand(op, plan, buf, bar, ops))
    return tuple(found)


def address_slice(ctx, loop: Operation, values) -> tuple[Operation, ...] | None:
    """The ops of the kernel's body after `loop` that compute `values` (in body order), all pure scalar math of
    values defined before the loop (and not left to the consumers, `ctx.deferred`); None when a value needs
    anything else."""
    body = ctx.src.body
    after = body.ops[body.ops.index(loop) + 1:]
    made_by = {r: op for op in after for r in op.results}
    before = {r: op for op in body.ops[:body.ops.index(loop) + 1] for r in op.results}
    needed: set[Operation] = set()
    work = list(values)
    while work:
        value = work.pop()
        maker = made_by.get(value)
        if maker is None:
            owner = before.get(value)
            if owner is loop or owner in ctx.deferred:
                return None             # the loop's results, or a value only the consumers compute
            continue
        if maker in needed:
            continue
        if maker.regions or not OPS[maker.name].pure or any(isinstance(r.type, TileType) for r in maker.results):
            return None
        needed.add(maker)
        work.extend(maker.operands)
    return tuple(op for op in after if op in needed)


def issue(ctx, operands: tuple[TailOperand, ...]) -> None:
    """The producer's issuing thread, after its last fill: each block's address, then its TMA load."""
    from ..lowering import lower_op
    for tail in operands:
        for op in tail.slice:
            lower_op(ctx, op)
        box = tail.plan.box
        ctx.create("mbarrier_arrive_expect_tx", [tail.bar, ctx.const(box.slot_bytes)])
        tensor_map = map_parameter(ctx, box.recipe)
        starts = [ctx.lookup(v) for v in tail.load.operands[1:]]
        for j in range(box.boxes):
            dst = tail.buf if j == 0 else ctx.emit("addptr", tail.buf, ctx.const(j * box.box_elements))
            ctx.create("tma_load", [dst, tensor_map, *box.coordinates(ctx, starts, j), tail.bar])


def bind(ctx, operands: tuple[TailOperand, ...]) -> None:
    """The consumers: each block's value is its tile, its wait (phase 0) owed to the first read
    (`wgmma_dot.await_operands`); the load itself then lowers to nothing (`tma_operand._tma_operand_load`)."""
    from ..lowering.wgmma_dot import SharedOperand
    for tail in operands:
        ctx.staged[tail.load.result] = SharedOperand(tail.buf, tail.plan.tile)
        ctx.landing[tail.load.result] = (tail.bar, ctx.const(0))
