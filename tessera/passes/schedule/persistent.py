"""A TMA-filled pipelined loop nested in a persistent tile loop: its mbarriers are set up once, not per tile.

Input: a tile-IR `for {stages = S}` whose slots TMA fills, directly inside
an outer `for` (a persistent kernel's loop over tiles) in every iteration
of which its bounds are the same (`persistent_outer_loop`). Job: create the slots' mbarriers once, in
the kernel's prologue (`whole_kernel` bytes, never invalidated or reused),
and number the inner loop's iterations across tiles, so that iteration g
of the program (counting every tile's iterations before it) uses slot
g mod S in phase parity (g div S) mod 2, as if one long pipeline ran
through all the tiles (Triton's and CUTLASS's persistent mainloops count
the same way). `RingStart` gives the tile's first slot and parity; the
pipeline (`software_pipeline.py`) starts its carried slot and phase from
there instead of from 0.

When every pipelined load is TMA-filled and what its addresses take from
the tile is pure scalar math of the tile index (`next_tile_slice`), the
rings are allocated in the kernel's prologue too, and right after a tile's
K loop drains, before its epilogue, thread 0 issues the first S - 1 fills
of the *next* tile (`for_next_tile`: the address math re-lowered for tile
index + step, predicated on that tile existing), so they land while the
epilogue runs; only the program's first tile issues its own prologue. The
rings' bytes are live until the tile loop ends, not for the whole kernel:
the last tile's next-tile fills are predicated off, and its K loop ended
with `wgmma_wait {pending = 0}` and a barrier, so nothing reads or writes
them after the loop and a later buffer may take their bytes (stream-K's
second K loop reuses them for its own ring, `gemm_stream_k.py`).

Why the phases stay right: every iteration of every tile gets exactly one
live fill of its slot (fills past a tile's end are predicated off and
arrive on nothing), so the k-th fill of slot s is global iteration
s + k S, and its wait is for parity k mod 2. A tile's first fills come
after the previous tile's loop drained (`wgmma_wait {pending = 0}`, the
barrier after the loop), so no slot is refilled while read, and the
epilogue's buffers cannot be the rings' bytes. Without an
outer loop, or with bounds that vary per tile, the loop keeps its own
mbarriers (initialized before it, invalidated after).

A warp-specialized loop in a tile loop is `warp_specialized_tiles.py`'s:
its producer warpgroup runs the tile loop too, with only the scalar ops
`tile_slice` picks, and counts the same ring on; which nestings it takes is
`specialized_tile_loop_refusal`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import TileType

from .shortfalls import place


@dataclass(frozen=True)
class RingStart:
    """Where a tile's iterations start in the program-wide count: its first slot, that slot's parity, and
    whether this is the program's first tile."""

    slot: Value
    phase: Value
    first: Value
    count: Value | None = None      # the program-wide index of the tile's first iteration (i32)
    per_tile: Value | None = None   # iterations per tile (i32)

    def slot_after(self, ctx, n: int, stages: int) -> Value:
        """The slot `n` iterations after the tile's first (0 <= n < stages)."""
        from .software_pipeline import slot_ahead      # (which imports this module)
        return self.slot if n == 0 else slot_ahead(ctx, self.slot, n, stages)


def persistent_outer_loop(op: Operation) -> Operation | None:
    """The `for` directly around pipelined loop `op`, if `op`'s bounds are the same in every iteration of it:
    computed outside it, or inside by pure ops from values computed outside."""
    block = op.parent
    outer = getattr(block, "parent", None)
    if not isinstance(outer, Operation) or outer.name != "for":
        return None
    made_by = {r: top for top in block.ops for r in top.results}
    work, seen = list(op.operands[:3]), set()
    while work:
        value = work.pop()
        if value in block.args:
            return None                     # the tile index or a carried value: bounds may vary per tile
        maker = made_by.get(value)
        if maker is None or maker in seen:
            continue                        # defined outside the outer loop
        if maker.regions or not OPS[maker.name].pure:
            return None
        seen.add(maker)
        work.extend(maker.operands)
    return outer


def ring_start(ctx, outer: Operation, op: Operation, stages: int) -> RingStart:
    """Slot and parity of this tile's first iteration: g = (tile's index in the outer loop) x (iterations per
    tile), slot g mod S, parity (g div S) mod 2 (all i32; the loops count in the index dtype)."""
    outer_iv = ctx.lookup(outer.regions[0].args[0])
    outer_lb, outer_step = ctx.lookup(outer.operands[0]), ctx.lookup(outer.operands[2])
    lb, ub, step = (ctx.lookup(v) for v in op.operands[:3])
    tiles_before = ctx.emit("div", ctx.emit("sub", outer_iv, outer_lb), outer_step)
    span = ctx.emit("max", ctx.emit("sub", ub, lb), ctx.const(0, lb.type.dtype))
    per_tile = ctx.emit("div", ctx.emit("sub", ctx.emit("add", span, step), ctx.const(1, lb.type.dtype)), step)
    count = ctx.emit("mul", tiles_before, per_tile)
    count = count if count.type.dtype == dt.i32 else ctx.cast(count, dt.i32)
    per_tile = per_tile if per_tile.type.dtype == dt.i32 else ctx.cast(per_tile, dt.i32)
    s = ctx.const(stages)
    phase = ctx.emit("and", ctx.emit("div", count, s), ctx.const(1))
    first = ctx.emit("cmp", tiles_before, ctx.const(0, tiles_before.type.dtype), attrs={"pred": "eq"})
    return RingStart(ctx.emit("rem", count, s), phase, first, count, per_tile)


def next_tile_slice(outer: Operation, loads) -> tuple[Operation, ...] | None:
    """The ops of the outer loop's body that compute what the pipelined `loads` (their views, offsets and
    address slices) take from the tile: pure scalar ops from the tile index and values defined outside, in
    body order; None when a carried value or anything else feeds them."""
    ops, blocker = tile_slice(outer, [v for load in loads for o in (load.load, *load.slice) for v in o.operands])
    return None if blocker is not None else ops


def tile_slice(outer: Operation, values) -> tuple[tuple[Operation, ...], Operation | Value | None]:
    """The ops of the outer loop's body that compute `values` from the tile index: (those ops in body order,
    None), or ((), what keeps them from being pure scalar math of the tile index and values defined outside
    the loop: a carried argument, or the op that reads memory, holds a region or makes a tile). Values made
    inside nested loops' bodies are followed no further (the loops' own lowering computes them)."""
    block = outer.regions[0]
    made_by = {r: top for top in block.ops for r in top.results}
    needed: set[Operation] = set()
    work = list(values)
    while work:
        value = work.pop()
        if value is block.args[0]:
            continue
        if value in block.args:
            return (), value
        maker = made_by.get(value)
        if maker is None or maker in needed:
            continue                        # defined outside the outer loop, or in a nested loop's body
        if maker.regions or not OPS[maker.name].pure or any(isinstance(r.type, TileType) for r in maker.results):
            return (), maker
        needed.add(maker)
        work.extend(maker.operands)
    return tuple(op for op in block.ops if op in needed), None


def for_next_tile(ctx, outer: Operation, slice_ops, issue) -> None:
    """Lower `slice_ops` (`next_tile_slice`) for the outer loop's next iteration and call `issue(live)` (live:
    that iteration exists); then bind the tile index and those ops' results back to this tile's values, which
    the rest of the tile (its epilogue) uses."""
    from ..lowering import lower_op
    arg = outer.regions[0].args[0]
    upcoming = ctx.emit("add", ctx.lookup(arg), ctx.lookup(outer.operands[2]))
    live = ctx.emit("cmp", upcoming, ctx.lookup(outer.operands[1]), attrs={"pred": "lt"})
    values = [arg] + [r for op in slice_ops for r in op.results]
    saved = {v: ctx.env[v] for v in values if v in ctx.env}
    ctx.env[arg] = upcoming
    for op in slice_ops:
        lower_op(ctx, op)
    issue(live)
    ctx.env.update(saved)


def tile_loop_of(op: Operation) -> Operation | None:
    """The `for` whose body holds `op` directly (a persistent kernel's loop over tiles), or None."""
    outer = getattr(op.parent, "parent", None)
    return outer if isinstance(outer, Operation) and outer.name == "for" else None


def specialized_tile_loop_refusal(ctx, outer: Operation, op: Operation, plan) -> tuple[Operation, str] | None:
    """Why warp-specialized loop `op` (pipeline plan `plan`) cannot run inside tile loop `outer` with its producer
    warpgroup running the tile loop too (`warp_specialized_tiles.py`): (the op to point at, the reason and the
    fix), or None when it can. The producer runs only the scalar math of the tile index that the K loop's
    bounds and the pipelined blocks' addresses need (`tile_slice`); the consumers run the whole body."""
    at = f"the tile loop at {place(outer)}"
    if "stages" in outer.attrs or outer.attrs.get("warp_specialize"):
        return outer, (f"{at} around a tessera.pipeline(warp_specialize=True) loop is itself a tessera.pipeline; "
                       "make it a plain range loop over tiles")
    if op.attrs.get("pingpong"):
        return op, (f"pingpong=True is not supported inside {at} (a persistent kernel); drop pingpong=True or "
                    "launch one tile per program")
    values = list(op.operands[:3])
    for load in plan.loads:
        values += [v for o in (load.load, *load.slice) for v in o.operands]
    _, blocker = tile_slice(outer, values)
    if blocker is None:
        return None
    if isinstance(blocker, Operation):
        what, where = f"'{blocker.name}'", blocker
    else:
        what, where = f"'{blocker.name_hint or 'a value'}', a value the tile loop carries", outer
    return where, (f"the producer warpgroup runs {at} with only the scalar math of the tile index, but the K loop's "
                   f"bounds or a pipelined block's address need {what}, which is not that (it reads memory, makes a "
                   "tile, holds a region or is carried); compute them from the tile index with scalar arithmetic, "
                   "or drop warp_specialize=True")
