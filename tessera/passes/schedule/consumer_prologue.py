"""The consumers' prologue of a warp-specialized loop: the reads before it that only the consumers need.

Input: a tile-IR kernel whose body holds a `for {warp_specialize = true}`
(`warp_specialization.py`), or a loop over tiles holding one
(`warp_specialized_tiles.py`). Every thread, the producer warpgroup included,
runs what precedes that loop, so a load there (attention's Q block, an fp8
descale) would be executed by the producer's 128 threads too, which have no
place in the tile layouts. `consumer_prologue` picks the ops before the loop
that the producer may not run -- memory reads, tiles changing layout -- and
the ops computed from them; `lower_to_threads` skips them where they stand
(`Lowering.deferred`), and the warp-specialized loop lowers them at the top
of the consumers' branch, after `setmaxnreg inc`, where it then stages the
loop's invariant dot operands among them (attention's Q, into wgmma's
shared-memory tile) behind a consumers-only barrier.

Guarantee: deferring moves reads later, never across a write: nothing is
deferred when an op before the loop writes memory or holds a region (the
refusal then names it, as before). Whether the producer needs a deferred
value (a loop bound, a pipelined block's address) is the refusal's check
(`producer_reads_deferred`); when the loop is refused, `lower_deferred` lowers
the deferred ops just before it, in their order.
"""

from __future__ import annotations

from tessera.ir.core import Operation, Value
from tessera.ir.ops import OPS
from tessera.ir.types import TileType

from .tma_operand import tma_operand

REGISTER_ONLY_TILE_OPS = frozenset({"constant", "splat", "arange"})   # plus the elementwise ops (a trait)


def warp_specialized_loop(body) -> Operation | None:
    """The first of the kernel body's own ops that is a `for {warp_specialize = true}` or a loop over tiles
    directly holding one (a persistent kernel: `warp_specialized_tiles.py`), or None."""
    for op in body.ops:
        if op.name == "for" and (op.attrs.get("warp_specialize") or specialized_in(op) is not None):
            return op
    return None


def specialized_in(op: Operation) -> Operation | None:
    """The `for {warp_specialize = true}` among the ops of `for` `op`'s body, or None."""
    return next((inner for inner in op.regions[0].ops if inner.name == "for" and inner.attrs.get("warp_specialize")),
                None)


def producer_may_run(ctx, op: Operation) -> bool:
    """Whether every thread, the producer's included, may run `op` before the loop: scalar arithmetic, views and
    register-only tile ops (zeros, arange, elementwise) that change no operand's layout."""
    if tma_operand(ctx, op) is not None:       # thread 0 issues its TMA load; the consumers wait for it
        return True
    tiles = any(isinstance(v.type, TileType) for v in (*op.operands, *op.results))
    if not tiles:
        return not op.regions and OPS[op.name].pure
    register_only = op.name in REGISTER_ONLY_TILE_OPS or OPS[op.name].elementwise
    return register_only and not _converts(ctx, op)


def consumer_prologue(ctx) -> frozenset[Operation]:
    """The ops before the kernel's warp-specialized loop to lower in the consumers' branch instead (see the
    module docstring); empty without TMA (no warp specialization there) or when an op before it writes."""
    body = ctx.src.body
    loop = warp_specialized_loop(body)
    if loop is None or not ctx.target.has("tma"):
        return frozenset()
    prologue = body.ops[:body.ops.index(loop)]
    if any(op.regions or OPS[op.name].writes_memory for op in prologue):
        return frozenset()
    deferred: set[Operation] = set()
    produced: set[Value] = set()
    for op in prologue:
        if not producer_may_run(ctx, op) or any(v in produced for v in op.operands):
            deferred.add(op)
            produced.update(op.results)
    return frozenset(deferred)


def producer_reads_deferred(ctx, loop: Operation, plan, outer: Operation | None = None) -> Value | None:
    """A value computed by a deferred op that the producer needs (a loop bound, the bounds of the tile loop
    `outer` around it, or the address of a block it fills: `plan.loads`' slices and views), or None."""
    produced = {v for op in ctx.deferred for v in op.results}
    if not produced:
        return None
    todo = list(loop.operands[:3]) + (list(outer.operands[:3]) if outer is not None else [])
    for load in plan.loads:
        todo += load.load.operands
        for op in load.slice:
            todo += op.operands
    seen: set[Value] = set()
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in produced:
            return value
        if isinstance(value.owner, Operation):
            todo += value.owner.operands
    return None


def lower_deferred(ctx) -> None:
    """Lower the deferred ops here, in kernel order (once)."""
    from ..lowering import lower_op
    ops = [op for op in ctx.src.body.ops if op in ctx.deferred]
    ctx.deferred = frozenset()
    for op in ops:
        lower_op(ctx, op)


def _converts(ctx, op: Operation) -> bool:
    """Whether an operand of `op` changes layout on the way in (possibly through shared memory)."""
    for i, value in enumerate(op.operands):
        want = ctx.assignment.conversions.get((op, i))
        if want is not None and isinstance(value.type, TileType) and ctx.assignment.layout(value) != want:
            return True
    return False
