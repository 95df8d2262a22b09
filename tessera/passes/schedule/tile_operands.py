"""Once-a-tile TMA operands of a warp-specialized persistent tile loop, loaded by the producer warpgroup.

Input: a tile loop `outer` around a warp-specialized K loop (`warp_specialized_tiles.py`) whose body loads
blocks, once a tile, that only wgmma reads and that one TMA load each can put in wgmma's tile
(`tma_operand.py`): attention's Q block; with the overlapped order also the peeled first K block, read before
the K loop, and the last V block, read after it. Without this module the consumers issue such a load at the
top of each tile, behind a barrier. Job (FlashAttention-3's producer): the producer warpgroup issues them in
its own tile loop, one tile ahead wherever the consumers let it, in three groups by where their reads end
(`Group`), each with its buffers and two mbarriers:

    HEAD (read only before the K loop: the peeled K)      released before the K loop, issued first
    LOOP (read in the K loop, maybe before it: Q)         released after the K loop's final wait
    TAIL (read only after the K loop: the last V block)   released at the end of the tile body, issued last

    full  (count 1): the TMA's bytes of tile k landed; phase k, the consumers wait with parity k mod 2 at the
                     group's first read (`ctx.landing`, as for `tma_operand.py`'s loads)
    empty (count W, one per consumer warpgroup): every warpgroup retired its last wgmma reading the group's
                     buffers in tile k (`wgmma_wait {pending = 0}` just before the arrival); the producer waits
                     with parity (k - 1) mod 2 before issuing tile k's (not before tile 0's: a wait for
                     parity 1 of a fresh barrier would not wait)

The producer's tile k (FlashAttention-3's order: the next tile's first K before the wait for Q's release):

    [HEAD: wait empty, k - 1; load]   [the first ring fill]   [LOOP: wait empty, k - 1; load]
    [the other ring fills]            [TAIL: wait empty, k - 1; load]

(with no LOOP group the fills are not split). Which loads move (`movable_operands`): a `view_load` of the
tile body that `tma_operand` plans for, whose address is scalar math of the tile index
(`persistent.tile_slice`: what the producer can compute), and whose readers are ops of the tile body itself
(not nested in an `if`: every tile must wait for its phase of `full`) or are in the K loop, all on one side
as the groups say. A block read both in or before the K loop and after it stays with the consumers (issued
with the LOOP group and released with the TAIL group, it would hold the next tile's ring fills behind this
tile's epilogue), as do the loads of a kernel with (block-scoped) ordered ops (`tma_operand.py`): issued a
tile ahead, such a load would no longer follow the previous tile's accesses its proxy fence orders before it.

Why it cannot deadlock. Every producer wait in tile k is for a release the consumers give in an earlier tile,
or in tile k only after reads of what the producer issued before that wait: HEAD's, LOOP's and TAIL's empty
waits are for tile k - 1's releases, which need only tiles <= k - 1's loads (all issued before tile k's); the
first ring fill g0 waits for the release of fill g0 - S, of an earlier tile; a later fill g may wait for a
release of tile k, which follows the consumers' waits for HEAD, LOOP and fills < g only, all issued before it;
TAIL is first read after the K loop, when tile k's fills are all issued. So the producer always goes on, and
issues everything the consumers wait for.

Why it is race-free. A group's buffers are written for tile k only after its empty phase k - 1 completed: each
warpgroup's first thread arrives after a `wgmma_wait {pending = 0}` that follows, in program order, every
read of them in tile k - 1 (a wgmma group is the warpgroup's, as for the ring's releases); nothing else reads
them, and their bytes are `whole_kernel` (no later buffer reuses them). The consumers read them only after the
phase's landing. The ring's fills keep their own protocol; only their place among these loads changed. The
SIMT simulator checks both directions (a write over bytes in use, a read before the landing).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir.core import Operation, Value

from .persistent import tile_slice
from .tma_fill import map_parameter
from .tma_operand import TmaOperand, tma_operand

WARPGROUP = 128
HEAD, LOOP, TAIL = "head", "loop", "tail"       # where a group's reads end: before, with or after the K loop


@dataclass(frozen=True)
class Group:
    """Loads the producer issues each tile at one place (`where`), their wgmma tiles (`bufs`), and their full and
    empty mbarriers."""

    where: str
    loads: tuple[Operation, ...]
    plans: tuple[TmaOperand, ...]
    bufs: tuple[Value, ...]
    full: Value
    empty: Value

    @property
    def bytes(self) -> int:
        return sum(plan.box.slot_bytes for plan in self.plans)


@dataclass(frozen=True)
class TileOperands:
    """The groups of a tile loop's producer-loaded blocks (at most one per place)."""

    groups: tuple[Group, ...]

    def at(self, where: str) -> Group | None:
        return next((g for g in self.groups if g.where == where), None)

    def group_of(self, op: Operation) -> Group | None:
        return next((g for g in self.groups if op in g.loads), None)

    @property
    def mbarriers(self) -> tuple[Value, ...]:
        return tuple(bar for g in self.groups for bar in (g.full, g.empty))


def movable_operands(ctx, outer: Operation, loop: Operation, consumers: int) -> tuple[tuple[Operation, str], ...]:
    """The view loads of tile loop `outer`'s body that the producer can issue for warp-specialized loop `loop`,
    each with its group's place (see the module docstring); () when none (the consumers then load them as
    `tma_operand.py` says)."""
    if consumers % WARPGROUP:
        return ()
    body = outer.regions[0].ops
    end = body.index(loop)
    moved = []
    for op in body:
        plan = tma_operand(ctx, op) if op.name == "view_load" else None
        if plan is None or plan.fence_global:   # (ordered ops: see the module docstring)
            continue
        _, blocker = tile_slice(outer, [*op.operands, *plan.box.leading])
        where = _place(ctx, op, outer, end)
        if blocker is None and where is not None:
            moved.append((op, where))
    return tuple(moved)


def _place(ctx, op: Operation, outer: Operation, end: int) -> str | None:
    """HEAD, LOOP or TAIL for load `op` of the tile body whose K loop is op `end` of it, or None when its readers
    are nested elsewhere or on both sides of the K loop."""
    places = set()
    for user in _users(ctx, op.result):
        at = _top(user, outer)
        if at == end:
            places.add(LOOP)
        elif user.parent is not outer.regions[0]:
            return None
        else:
            places.add(HEAD if at < end else TAIL)
    if not places or (TAIL in places and len(places) > 1):
        return None
    return LOOP if LOOP in places else places.pop()


def allocate(ctx, moved: tuple[tuple[Operation, str], ...], consumers: int) -> TileOperands | None:
    """Before the roles split: each group's wgmma tiles (`whole_kernel`) and two mbarriers; None without loads."""
    groups = []
    for where in (HEAD, LOOP, TAIL):
        loads = tuple(op for op, place in moved if place == where)
        if not loads:
            continue
        plans = tuple(ctx.tma_operands[op] for op in loads)
        bufs = tuple(ctx.smem.alloc(op.result.type.element.dtype, plan.tile.rows * plan.tile.cols,
                                    align=max(plan.tile.alignment, plan.box.slot_align), whole_kernel=True)
                     for op, plan in zip(loads, plans))
        full = ctx.smem.mbarriers(1, 1)
        empty = ctx.smem.mbarriers(1, consumers // WARPGROUP)
        groups.append(Group(where, loads, plans, bufs, full, empty))
    return TileOperands(tuple(groups)) if groups else None


def issue(ctx, group: Group | None, tile: Value, lo: Value, parity: Value) -> None:
    """The producer's issuing thread, in its tile loop after the tile's scalar math: wait for the release of
    the previous tile's blocks of `group` (from the second tile on), then load this tile's (tile-loop parity
    `parity`). Nothing without a group."""
    if group is None:
        return
    later = ctx.emit("cmp", tile, lo, attrs={"pred": "gt"})
    with ctx.when(later):
        await_release(ctx, group, parity)
    ctx.create("mbarrier_arrive_expect_tx", [group.full, ctx.const(group.bytes)])
    for op, plan, buf in zip(group.loads, group.plans, group.bufs):
        box = plan.box
        tensor_map = map_parameter(ctx, box.recipe)
        starts = [ctx.lookup(v) for v in op.operands[1:]]
        for j in range(box.boxes):
            dst = buf if j == 0 else ctx.emit("addptr", buf, ctx.const(j * box.box_elements))
            ctx.create("tma_load", [dst, tensor_map, *box.coordinates(ctx, starts, j), group.full])


def await_release(ctx, group: Group, parity: Value) -> None:
    """The producer waits for the consumers' release of the previous tile's blocks: phase k - 1 of `empty`."""
    ctx.create("mbarrier_wait", [group.empty, ctx.emit("sub", ctx.const(1), parity)])


def bind(ctx, group: Group, op: Operation, parity: Value) -> None:
    """The consumers' lowering of moved load `op`: its value is the buffer, its wait (parity `parity` of the
    group's `full`) owed to the first read (`wgmma_dot.await_operands`)."""
    from ..lowering.wgmma_dot import SharedOperand
    i = group.loads.index(op)
    ctx.staged[op.result] = SharedOperand(group.bufs[i], group.plans[i].tile)
    ctx.landing[op.result] = (group.full, parity)


def release(ctx, group: Group | None, in_flight: bool = False) -> None:
    """The consumers, where `group`'s reads of the tile are over: once every wgmma group is retired (`in_flight`:
    a `wgmma_wait {pending = 0}` was just emitted, the K loop's final one), the first thread of each warpgroup
    arrives on the group's `empty`. Nothing without a group."""
    if group is None:
        return
    if not in_flight:
        ctx.create("wgmma_wait", attrs={"pending": 0})     # (it absorbs an earlier one: `defer_wgmma_wait`)
    leader = ctx.emit("cmp", ctx.index.digit(1, WARPGROUP), ctx.const(0), attrs={"pred": "eq"})
    with ctx.when(leader):
        ctx.create("mbarrier_arrive", [group.empty])


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
