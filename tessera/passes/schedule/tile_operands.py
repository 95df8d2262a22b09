"""Tile-invariant TMA operands of a warp-specialized persistent tile loop, loaded by the producer warpgroup.

Input: a tile loop `outer` around a warp-specialized K loop (`warp_specialized_tiles.py`) whose body loads a
block, once a tile, that only wgmma reads and that one TMA load can put in wgmma's tile (`tma_operand.py`:
attention's Q block; with the overlapped order also the peeled first K block). Without this module the
consumers issue that load at the top of each tile, behind a barrier, so the tile's first wgmma waits for a
load issued after the previous tile's epilogue. Job (FlashAttention-3's producer): the producer warpgroup
issues it in its own tile loop, one tile ahead of the consumers wherever the consumers let it, into one
buffer guarded by two mbarriers:

    full  (count 1): the TMA's bytes of tile k landed; phase k, the consumers wait with parity k mod 2
                     at the first read (`ctx.landing`, as for `tma_operand.py`'s loads)
    empty (count W, one per consumer warpgroup): every warpgroup retired its last wgmma reading the
                     buffer in tile k; the producer waits with parity (k - 1) mod 2 before issuing tile k's
                     load (not before tile 0's: a wait for parity 1 of a fresh barrier would not wait)

Which loads move (`movable_operands`): a `view_load` of the tile body itself, before the K loop, that
`tma_operand` plans for, whose address is scalar math of the tile index (`persistent.tile_slice`, what the
producer can compute), and whose every reader is in the K loop or an op of the tile body before it (not
nested in an `if`: every tile must wait for its phase of `full`), so that all of a tile's reads are retired
by the K loop's final `wgmma_wait {pending = 0}`; the consumers arrive on `empty` right after that wait
(`release`). A load read after the K loop (the overlapped order's last V block) stays with
the consumers, as do the loads of a kernel with (block-scoped) ordered ops (`tma_operand.py`): issued a
tile ahead, such a load would no longer follow the previous tile's accesses that its proxy fence is to
order before it. All moved loads share the buffer pair of barriers (one expect_tx of their summed bytes).

Why it is race-free. The producer's write of tile k's block waits for the release of tile k - 1's, which
each warpgroup's first thread gives after `wgmma_wait {pending = 0}` retired every wgmma group of that
warpgroup (a wgmma group is the warpgroup's, as for the ring's releases); nothing else reads the buffer,
and its bytes are `whole_kernel` (no buffer after the loop reuses them: the race `end_staged_reads` once
closed, an epilogue buffer placed on bytes another warpgroup's wgmma still read, cannot arise). The SIMT
simulator checks both directions (a write over bytes in use, a read before the landing).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir.core import Operation, Value

from .persistent import tile_slice
from .tma_fill import map_parameter
from .tma_operand import TmaOperand, tma_operand

WARPGROUP = 128


@dataclass(frozen=True)
class TileOperands:
    """The loads the producer issues each tile, their wgmma tiles (`bufs`), and the full and empty mbarriers."""

    loads: tuple[Operation, ...]
    plans: tuple[TmaOperand, ...]
    bufs: tuple[Value, ...]
    full: Value
    empty: Value

    @property
    def bytes(self) -> int:
        return sum(plan.box.slot_bytes for plan in self.plans)


def movable_operands(ctx, outer: Operation, loop: Operation, consumers: int) -> tuple[Operation, ...]:
    """The view loads of tile loop `outer`'s body that the producer can issue for warp-specialized loop `loop`
    (see the module docstring); () when none (the consumers then load them as `tma_operand.py` says)."""
    if consumers % WARPGROUP:
        return ()
    body = outer.regions[0].ops
    end = body.index(loop)
    moved = []
    for op in body[:end]:
        plan = tma_operand(ctx, op) if op.name == "view_load" else None
        if plan is None or plan.fence_global:   # (ordered ops: see the module docstring)
            continue
        _, blocker = tile_slice(outer, [*op.operands, *plan.box.leading])
        # every reader in the K loop (whose staging waits before it) or an op of the body before it, so that
        # each tile waits for the landing once, in the tile body itself, and all reads end with the K loop
        readers = _users(ctx, op.result)
        if blocker is None and all(_top(user, outer) == end or user.parent is outer.regions[0] and
                                   _top(user, outer) < end for user in readers):
            moved.append(op)
    return tuple(moved)


def allocate(ctx, loads: tuple[Operation, ...], consumers: int) -> TileOperands | None:
    """Before the roles split: the loads' wgmma tiles (`whole_kernel`) and the two mbarriers; None without loads."""
    if not loads:
        return None
    plans = tuple(ctx.tma_operands[op] for op in loads)
    bufs = tuple(ctx.smem.alloc(op.result.type.element.dtype, plan.tile.rows * plan.tile.cols,
                                align=max(plan.tile.alignment, plan.box.slot_align), whole_kernel=True)
                 for op, plan in zip(loads, plans))
    full = ctx.smem.mbarriers(1, 1)
    empty = ctx.smem.mbarriers(1, consumers // WARPGROUP)
    return TileOperands(loads, plans, bufs, full, empty)


def issue(ctx, operands: TileOperands, tile: Value, lo: Value, parity: Value) -> None:
    """The producer's issuing thread, in its tile loop after the tile's scalar math: wait for the release of
    the previous tile's blocks (from the second tile on), then load this tile's (tile-loop parity `parity`)."""
    later = ctx.emit("cmp", tile, lo, attrs={"pred": "gt"})
    with ctx.when(later):
        await_release(ctx, operands, parity)
    ctx.create("mbarrier_arrive_expect_tx", [operands.full, ctx.const(operands.bytes)])
    for op, plan, buf in zip(operands.loads, operands.plans, operands.bufs):
        box = plan.box
        tensor_map = map_parameter(ctx, box.recipe)
        starts = [ctx.lookup(v) for v in op.operands[1:]]
        for j in range(box.boxes):
            dst = buf if j == 0 else ctx.emit("addptr", buf, ctx.const(j * box.box_elements))
            ctx.create("tma_load", [dst, tensor_map, *box.coordinates(ctx, starts, j), operands.full])


def await_release(ctx, operands: TileOperands, parity: Value) -> None:
    """The producer waits for the consumers' release of the previous tile's blocks: phase k - 1 of `empty`."""
    ctx.create("mbarrier_wait", [operands.empty, ctx.emit("sub", ctx.const(1), parity)])


def bind(ctx, operands: TileOperands, op: Operation, parity: Value) -> None:
    """The consumers' lowering of moved load `op`: its value is the buffer, its wait (parity `parity` of `full`)
    owed to the first read (`wgmma_dot.await_operands`)."""
    from ..lowering.wgmma_dot import SharedOperand
    i = operands.loads.index(op)
    ctx.staged[op.result] = SharedOperand(operands.bufs[i], operands.plans[i].tile)
    ctx.landing[op.result] = (operands.full, parity)


def release(ctx, operands: TileOperands, in_flight: bool) -> None:
    """The consumers, after the K loop: once every wgmma group is retired (`in_flight`: the loop's final
    `wgmma_wait {pending = 0}` was just emitted), the first thread of each warpgroup arrives on `empty`."""
    if not in_flight:
        ctx.create("wgmma_wait", attrs={"pending": 0})     # (a no-op where the loop's dots waited for theirs)
    leader = ctx.emit("cmp", ctx.index.digit(1, WARPGROUP), ctx.const(0), attrs={"pred": "eq"})
    with ctx.when(leader):
        ctx.create("mbarrier_arrive", [operands.empty])


def flip(ctx, parity: Value) -> Value:
    return ctx.emit("xor", parity, ctx.const(1))


def _users(ctx, value: Value) -> list[Operation]:
    return [user for user in ctx.src.walk() if value in user.operands]


def _top(op: Operation, outer: Operation) -> int:
    """The index, in tile loop `outer`'s body, of the op that is or holds `op` (past the end when outside)."""
    body = outer.regions[0]
    while op.parent is not body:
        holder = op.parent.parent if op.parent is not None else None
        if not isinstance(holder, Operation):
            return len(body.ops)
        op = holder
    return body.ops.index(op)
