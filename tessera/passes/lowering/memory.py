"""Memory ops: pointer loads/stores/atomics on tiles and scalars, and tensor views.

* Pointer tiles are per-register pointers. A load or store is vectorized
  (`vector = k`) when the alignment analysis proves that aligned groups of
  k lanes along the last dim are contiguous, aligned to k elements and
  under one mask bit, and the layout holds k such lanes in consecutive
  registers (`local_contiguity`); otherwise k = 1.
* Views: register j of the block at `starts` is element
  index_d = start_d + coord_d (per dim), at offset sum_d index_d * stride_d
  (computed in i64, so any tensor size works; a stride that is the
  constant 1 costs no multiply). Lanes outside [0, size_d) in any dim are
  masked off: loads give `fill`, stores skip them. Vectorized like
  pointers when the last stride is the constant 1 and base, other strides,
  start and size are multiples of the width (`alignment.view_vector_width`).
* Replicated layouts (tiles smaller than the block, reduce results): only
  replica 0 of each element stores or performs an atomic, so an atomic
  updates every element exactly once (stores of equal values would be
  benign, but are masked the same way to save bandwidth). An atomic's old
  values are then handed to the replicas through shared memory when used.
* Scalars: every thread loads (the same address, one value); stores and
  atomics are done by thread 0 only, and an atomic's old value is handed
  to every thread through shared memory when used.
* Ordering between programs is the whole program's, though one thread may
  perform the access: a scalar atomic or any release store follows a
  barrier, so its release covers every thread's earlier writes (the
  pattern of CUTLASS's semaphores: `__syncthreads()`, then thread 0
  releases); a scalar acquire load is thread 0's, handed to every thread
  through shared memory, and a tile one is followed by a barrier, so every
  thread's later accesses come after the acquire. Ordered accesses are one
  register each (never vectorized). Their `scope` attribute (and an
  atomic's) goes to the thread op unchanged: the barriers are the block's
  whatever the scope.
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.core import Block
from tessera.ir.types import RegsType, ScalarType, TileType

from . import copy_scalar_op, lowering
from .values import Regs, ViewParts


def _vector(ctx, op, layout) -> dict | None:
    width = min(ctx.facts.access_width(op, ctx.target.max_vector_bits), layout.local_contiguity(-1))
    width = 1 << (max(width, 1).bit_length() - 1)
    return {"vector": width} if width > 1 else None


def _and_owner(ctx, layout, mask):
    """`mask` (registers or None) restricted to replica 0 of each element."""
    owner = ctx.index.owner_predicate(layout)
    if owner is None:
        return mask
    owner = ctx.splat(owner, layout.local_size)
    return owner if mask is None else ctx.emit("and", mask, owner)


def _scoped(op, attrs: dict | None = None) -> dict | None:
    """`attrs` plus the tile op's `scope`, if it has one (absent: the default GPU scope)."""
    if "scope" not in op.attrs:
        return attrs
    return {**(attrs or {}), "scope": op.attrs["scope"]}


# What must complete before a release (store_release, atomic_rmw, atomic_cas) publishes this block's writes:
# fn(ctx) -> bool, True when it emitted a wait that a barrier must follow (so every thread's release comes after
# it). `passes/schedule/tma_store.py` adds the completion of the block's TMA stores.
BEFORE_RELEASE: list = []


def _complete_before_release(ctx, barrier: bool) -> None:
    """Emit the `BEFORE_RELEASE` waits, then a barrier if `barrier` or any of them asks for one."""
    if any([hook(ctx) for hook in BEFORE_RELEASE]) or barrier:
        ctx.threads.barrier()


def _and_first_thread(ctx, mask):
    first = ctx.index.first_thread()
    return first if mask is None else ctx.emit("and", mask, first)


@lowering("load")
def _load(ctx, op):
    if not isinstance(op.result.type, TileType):
        copy_scalar_op(ctx, op)
        return
    layout = ctx.assignment.layout(op.result)
    operands = [r.value for r in ctx.operands(op)]
    t = RegsType(op.result.type.element, layout.local_size)
    value = ctx.create("load", operands, _vector(ctx, op, layout), [t]).result
    ctx.define(op.result, Regs(value, layout), op)


@lowering("store")
def _store(ctx, op):
    if not isinstance(op.operands[0].type, TileType):
        ptr, value, *mask = [ctx.thread_value(x) for x in ctx.operands(op)]
        ctx.create("store", [ptr, value, _and_first_thread(ctx, mask[0] if mask else None)])
        return
    ptr, value, *mask = ctx.operands(op)
    layout = ptr.layout
    mask = _and_owner(ctx, layout, mask[0].value if mask else None)
    operands = [ptr.value, value.value] + ([mask] if mask is not None else [])
    ctx.create("store", operands, _vector(ctx, op, layout))


@lowering("load_acquire")
def _load_acquire(ctx, op):
    if not isinstance(op.result.type, TileType):
        ptr, *rest = [ctx.thread_value(x) for x in ctx.operands(op)]
        mask = _and_first_thread(ctx, rest[0] if rest else None)
        value = ctx.create("load_acquire", [ptr, mask, *rest[1:]], _scoped(op), [op.result.type]).result
        ctx.define(op.result, ctx.smem.broadcast_scalar_from_first(value), op)
        return
    layout = ctx.assignment.layout(op.result)
    operands = [r.value for r in ctx.operands(op)]
    t = RegsType(op.result.type.element, layout.local_size)
    value = ctx.create("load_acquire", operands, _scoped(op), [t]).result
    ctx.threads.barrier()
    ctx.define(op.result, Regs(value, layout), op)


@lowering("store_release")
def _store_release(ctx, op):
    _complete_before_release(ctx, barrier=True)
    if not isinstance(op.operands[0].type, TileType):
        ptr, value, *mask = [ctx.thread_value(x) for x in ctx.operands(op)]
        ctx.create("store_release", [ptr, value, _and_first_thread(ctx, mask[0] if mask else None)], _scoped(op))
        return
    ptr, value, *mask = ctx.operands(op)
    mask = _and_owner(ctx, ptr.layout, mask[0].value if mask else None)
    ctx.create("store_release", [ptr.value, value.value] + ([mask] if mask is not None else []), _scoped(op))


@lowering("atomic_rmw")
def _atomic_rmw(ctx, op):
    attrs = _scoped(op, {"kind": op.attrs["kind"]})
    tile = isinstance(op.operands[0].type, TileType)
    _complete_before_release(ctx, barrier=not tile)    # a scalar's: thread 0's release covers every thread's writes
    if not tile:
        ptr, value, *mask = [ctx.thread_value(x) for x in ctx.operands(op)]
        mask = _and_first_thread(ctx, mask[0] if mask else None)
        old = ctx.create("atomic_rmw", [ptr, value, mask], attrs, [op.result.type]).result
        ctx.define(op.result, ctx.smem.broadcast_scalar_from_first(old) if op.result in ctx.used else old, op)
        return
    ptr, value, *mask = ctx.operands(op)
    layout = ctx.assignment.layout(op.result)
    mask = _and_owner(ctx, layout, mask[0].value if mask else None)
    operands = [ptr.value, value.value] + ([mask] if mask is not None else [])
    t = RegsType(op.result.type.element, layout.local_size)
    old = Regs(ctx.create("atomic_rmw", operands, attrs, [t]).result, layout)
    ctx.define(op.result, ctx.smem.broadcast_from_owners(old) if op.result in ctx.used else old, op)


@lowering("atomic_cas")
def _atomic_cas(ctx, op):
    """atomic_cas has no mask: threads that must not swap skip it in an `if`."""
    tile = isinstance(op.operands[0].type, TileType)
    lowered = ctx.operands(op)
    operands = [ctx.thread_value(x) for x in lowered]
    layout = ctx.assignment.layout(op.result) if tile else None
    _complete_before_release(ctx, barrier=not tile)    # a scalar's: thread 0's release covers every thread's writes
    pred = ctx.index.owner_predicate(layout) if tile else ctx.index.first_thread()
    t = RegsType(op.result.type.element, layout.local_size) if tile else op.result.type
    if pred is None:
        old = ctx.create("atomic_cas", operands, _scoped(op), [t]).result
    else:
        then_block, else_block = Block(), Block()
        with ctx.b.at(then_block):
            swapped = ctx.create("atomic_cas", operands, _scoped(op), [t]).result
            ctx.create("yield", [swapped])
        dtype = op.result.type.element.dtype if tile else op.result.type.dtype
        zero = ctx.const_regs([0] * t.count, dtype) if tile else ctx.const(0, dtype)
        with ctx.b.at(else_block):
            ctx.create("yield", [zero])
        old = ctx.create("if", [pred], None, [t], [then_block, else_block]).result
    if not tile:
        ctx.define(op.result, ctx.smem.broadcast_scalar_from_first(old) if op.result in ctx.used else old, op)
        return
    regs = Regs(old, layout)
    ctx.define(op.result, ctx.smem.broadcast_from_owners(regs) if op.result in ctx.used else regs, op)


# -- tensor views ------------------------------------------------------------------


@lowering("make_view")
def _make_view(ctx, op):
    base, *rest = [ctx.operand(op, i) for i in range(len(op.operands))]
    rank = len(rest) // 2
    ctx.env[op.result] = ViewParts(base, tuple(rest[:rank]), tuple(rest[rank:]), op)


def view_lanes(ctx, op, layout, view: ViewParts, starts, steps=None):
    """(pointers, inside-mask) registers of the block of `layout` at `starts`: register j addresses element
    start_d + steps[d] * coord_d along each dim d (steps default to 1)."""
    rank = len(view.sizes)
    steps = steps or (1,) * rank
    count = layout.local_size
    inside, offset = None, None
    for d in range(rank):
        start, size, stride = starts[d], view.sizes[d], view.strides[d]
        wide = any(v.type.dtype.bits > 32 for v in (start, size))
        idx_dtype = dt.i64 if wide else dt.i32
        weights = [steps[d] if e == d else 0 for e in range(rank)]
        index = ctx.index.regs(layout, weights, offset=start, dtype=idx_dtype)
        zero = ctx.const_regs([0] * count, idx_dtype)
        above = ctx.emit("cmp", index, zero, attrs={"pred": "ge"})
        below = ctx.emit("cmp", index, ctx.splat(ctx.cast(size, idx_dtype), count), attrs={"pred": "lt"})
        ok = ctx.emit("and", above, below)
        inside = ok if inside is None else ctx.emit("and", inside, ok)
        term = ctx.cast(index, dt.i64)
        if not is_constant_one(ctx, view.source.operands[1 + rank + d]):
            term = ctx.emit("mul", term, ctx.splat(ctx.cast(stride, dt.i64), count))
        offset = term if offset is None else ctx.emit("add", offset, term)
    ptrs = ctx.emit("addptr", ctx.splat(view.base, count), offset)
    return ptrs, inside


def is_constant_one(ctx, value) -> bool:
    info = ctx.facts.facts.get(value)
    return getattr(info, "constant", None) == 1


# Other ways to load a view block, tried in order before the threads' loads: fn(ctx, op) -> bool (True: done).
# `passes/schedule/tma_operand.py` adds the TMA load into a wgmma operand tile (sm_90+).
VIEW_LOAD_STRATEGIES: list = []


@lowering("view_load")
def _view_load(ctx, op):
    if any(strategy(ctx, op) for strategy in VIEW_LOAD_STRATEGIES):
        return
    view = ctx.lookup(op.operands[0])
    starts = [ctx.operand(op, i) for i in range(1, len(op.operands))]
    layout = ctx.assignment.layout(op.result)
    ptrs, inside = view_lanes(ctx, op, layout, view, starts)
    dtype = op.result.type.element.dtype
    fill = ctx.const_regs([op.attrs.get("fill", 0)] * layout.local_size, dtype)
    t = RegsType(ScalarType(dtype), layout.local_size)
    value = ctx.create("load", [ptrs, inside, fill], _vector(ctx, op, layout), [t]).result
    ctx.define(op.result, Regs(value, layout), op)


# Other ways to store a view block, tried in order before the threads' stores: fn(ctx, op) -> bool (True: done).
# `passes/schedule/tma_store.py` adds the TMA store (sm_90+); lowering itself imports nothing of schedule/.
VIEW_STORE_STRATEGIES: list = []


@lowering("view_store")
def _view_store(ctx, op):
    if any(strategy(ctx, op) for strategy in VIEW_STORE_STRATEGIES):
        return
    view = ctx.lookup(op.operands[0])
    n = len(op.operands)
    starts = [ctx.operand(op, i) for i in range(1, n - 1)]
    value = ctx.operand(op, n - 1)
    layout = value.layout
    ptrs, inside = view_lanes(ctx, op, layout, view, starts)
    mask = _and_owner(ctx, layout, inside)
    ctx.create("store", [ptrs, value.value, mask], _vector(ctx, op, layout))
