"""Explicit shared buffers and async copies (`smem_*` ops, `tessera.shared`) lowered to threads.

Input: a kernel's explicit shared buffers (`smem_alloc`, from
`tessera.shared`) and every load, store and async copy of them. Job: give
each buffer one shared allocation for the whole kernel with the XOR
swizzle that minimizes bank conflicts for its accesses (or the one ldmatrix
or TMA needs), and lower each access per thread: vectorized loads and
stores, ldmatrix into mma fragments, cp.async chunks. Guarantees: 16-byte
chunks stay whole under the swizzle, so vector accesses never split; the
schedule (commits, waits, barriers) is the author's, unchanged. Per op:

* `smem_alloc` -> one `shared_alloc {whole_kernel}` of the buffer's bytes
  (live for the whole kernel: see `shared_memory.py`; a buffer larger
  than the target's shared memory per block is a LoweringError at its
  line). The buffer is row-major, its 16-byte chunks XOR-swizzled
  (`smem_layouts.Swizzle`): the swizzle is chosen, from the register
  layouts of every load, store and copy of the buffer, to minimize bank
  conflicts (`smem_layouts.bank_conflicts` with the target's
  `shared_memory_banks`); an ldmatrix read fixes it to the one ldmatrix
  needs. Chunks of 16 bytes stay whole, so vector accesses never split.
* `smem_slot` -> an element offset (index x slot size) added to the
  addresses; the swizzle repeats within every slot, so slots share it.
* `smem_load` -> ld.shared straight into the result's register layout
  (vectorized where the layout holds contiguous registers), or `ldmatrix`
  when the layout is an mma operand fragment it can produce (layout
  assignment gives a load that feeds a tensor-core dot the fragment layout).
* `smem_store` -> st.shared by the owners (replica 0) of each element.
* `smem_async_copy` on targets with cp.async (sm_80+): the slot is cut into
  chunks of w elements along its last dim, w the widest of 16 / 8 / 4 bytes
  that the view's (or pointers') alignment, contiguity and bounds allow;
  each thread issues `async_copy {bytes}` for its chunks (for a view block:
  blocked over the chunk grid, neighbouring threads on neighbouring chunks;
  for pointers: runs of w registers of the pointer tile's own layout), the
  predicate false (zero fill) for chunks outside the view or masked off. Threads that
  replicate another's chunks (more threads than chunks) skip them.
  On gfx942 / gfx950 (`lds.dma`) the chunks are direct-to-LDS loads
  (`global_load_lds`, 4 bytes a lane; 16 on gfx950) when every wave's
  lanes then fill consecutive chunks, the rule of its M0-based LDS address;
  such a buffer keeps no swizzle (it would break the rule).
  Narrower than 4 bytes, on gfx90a, and where an AMD copy's lanes are not
  consecutive, the copy is a synchronous global load (0 where masked) and
  shared store, and on targets with no async copy at all
  `smem_async_commit` / `smem_async_wait` become nothing; a wait still
  needs the barrier after it, which the author writes anyway.
* a buffer that a copy with an mbarrier (`barrier=`) fills from a view on a
  TMA target gets a swizzle TMA writes (`tma_swizzles`: none, or the
  32/64/128B one its rows span) and 1024-byte alignment, so that the
  mbarrier lowering (`mbarriers.py`) can fill its slots by TMA; the
  threads' copy here (`thread_copy`) serves every other copy.
* `smem_async_commit` / `smem_async_wait` -> `async_commit` /
  `async_wait {pending}`; `smem_barrier` -> `barrier`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.layouts import RegisterLayout, local
from tessera.ir.shared_ops import copy_barrier
from tessera.ir.smem_layouts import SmemLayout, Swizzle, bank_conflicts, swizzle_bytes
from tessera.ir.target import has_async_copies, lds_dma_bytes
from tessera.ir.types import PointerType, RegsType, ScalarType, SharedType, ViewType

from .. import alignment
from ..layout_assignment import blocked_layout
from ..lowering import lowering
from ..lowering.layout_math import row_major_strides
from ..lowering.memory import view_lanes
from ..lowering.mma_operands import LDMATRIX_DTYPES, ldmatrix_plan, read_fragment, swizzle_offsets
from ..lowering.values import Regs

MAX_COPY_BYTES = 16
MIN_ASYNC_COPY_BYTES = 4
TMA_BUFFER_ALIGN = 1024     # a TMA-filled buffer: every swizzle mode's slot alignment (tma_fill.SLOT_ALIGN)
SAMPLED_GROUPS = 8          # register groups per access scored for bank conflicts (they repeat; keeps it fast)


@dataclass(frozen=True)
class SharedParts:
    """A lowered (sub-)buffer: `shape` elements at element `offset` (None: 0) of the allocation `base`."""

    base: Value
    offset: Value | None
    shape: tuple[int, ...]
    swizzle: Swizzle | None

    @property
    def dtype(self) -> dt.DType:
        return self.base.type.pointee

    def addresses(self, ctx, index: Value) -> Value:
        """Pointers to the (row-major, unswizzled) element numbers `index` of this sub-buffer."""
        index = swizzle_offsets(ctx, index, self.swizzle)
        count = index.type.count
        if self.offset is not None:
            index = ctx.emit("add", index, ctx.splat(self.offset, count))
        return ctx.emit("addptr", ctx.splat(self.base, count), index)

    def slot_base(self, ctx) -> Value:
        return self.base if self.offset is None else ctx.emit("addptr", self.base, self.offset)


# -- the accesses of a buffer, and its swizzle -----------------------------------------------------


@dataclass(frozen=True)
class Access:
    """One kind of access to a sub-buffer of `numel` elements: (groups * threads, vector, 1) element numbers.

    `needs` holds the swizzle an ldmatrix read of it requires (empty for other accesses).
    """

    numel: int
    elements: np.ndarray
    needs: tuple[Swizzle | None, ...] = ()


def _users(fn) -> dict[Value, list[Operation]]:
    users: dict[Value, list[Operation]] = {}
    for op in fn.walk():
        for v in op.operands:
            users.setdefault(v, []).append(op)
    return users


def buffer_accesses(ctx, alloc: Operation) -> list[Access]:
    """Every load, store and copy of the buffer `alloc` (through slots), as access patterns."""
    users = _users(ctx.src)
    out, work = [], [alloc.result]
    while work:
        value = work.pop()
        shape = value.type.shape
        for op in users.get(value, ()):
            if op.name == "smem_slot" and op.operands[0] is value:
                work.append(op.result)
            elif op.name == "smem_load":
                layout = ctx.assignment.layout(op.result)
                plan = _ldmatrix(ctx, layout, value.type.dtype)
                out.append(Access(math.prod(shape), _pattern(layout, shape, _vector(ctx, layout, value.type)),
                                  (plan.smem.swizzle,) if plan is not None else ()))
            elif op.name == "smem_store":
                layout = ctx.assignment.operand_layout(op, 1)
                out.append(Access(math.prod(shape), _pattern(layout, shape, _vector(ctx, layout, value.type))))
            elif op.name == "smem_async_copy":
                plan = copy_plan(ctx, op)
                out.append(Access(math.prod(shape), _pattern(plan.layout, shape, plan.width)))
    return out


def _pattern(layout: RegisterLayout, shape, vector: int) -> np.ndarray:
    """(groups * threads, vector, 1) element numbers: each thread's registers in groups of `vector`."""
    weights = np.asarray(row_major_strides(shape), np.int64)
    flat = (layout.table() * weights).sum(-1)                          # (threads, registers)
    threads, count = flat.shape
    groups = flat.reshape(threads, count // vector, vector)
    return groups.transpose(1, 0, 2).reshape(-1, vector)[..., None]   # group-major, then threads


def choose_swizzle(accesses: list[Access], dtype: dt.DType, banks: int, warp: int, threads: int,
                   allowed: tuple[Swizzle | None, ...] | None = None) -> Swizzle | None:
    """The XOR swizzle of 16-byte chunks with the fewest bank conflicts over `accesses` (None: none better).

    ldmatrix reads win: when they agree on the swizzle they need (and it repeats within every accessed
    sub-buffer, so that slots can share it), that is the buffer's swizzle. `allowed` (the swizzles TMA writes,
    for a buffer TMA fills) limits the choice to the one ldmatrix needs if allowed, else the last allowed.
    """
    if allowed is not None:
        needed = {swizzle for a in accesses for swizzle in a.needs}
        if len(needed) == 1 and next(iter(needed)) in allowed:
            return next(iter(needed))
        return allowed[-1]
    if not accesses:
        return None
    smallest = min(a.numel for a in accesses)
    needed = {swizzle for a in accesses for swizzle in a.needs}
    if len(needed) == 1:
        swizzle = needed.pop()
        if swizzle is None or smallest % _period(swizzle) == 0:
            return swizzle
    element_bytes = dtype.bits // 8
    base = int(math.log2(max(1, 16 // element_bytes)))
    period_bits = int(math.log2(smallest & -smallest))     # the swizzle must repeat within every sub-buffer
    candidates: list[Swizzle | None] = [None]
    for bits in (1, 2, 3):
        for shift in range(bits, period_bits - base - bits + 1):
            candidates.append(Swizzle(bits, base, shift))

    def cost(swizzle: Swizzle | None) -> int:
        total = 0
        for a in accesses:
            layout = SmemLayout((a.numel,), (1,), swizzle)
            per_group = a.elements.reshape(-1, threads, *a.elements.shape[1:])
            for group in per_group[::max(1, len(per_group) // SAMPLED_GROUPS)]:
                total += max(bank_conflicts(layout, group[w:w + warp], element_bytes, banks)
                             for w in range(0, threads, warp))
        return total

    return min(candidates, key=cost)      # (min keeps the first of equals: no swizzle, then the fewest bits)


def _period(swizzle: Swizzle) -> int:
    """The swizzle of offset o + k * period is o's plus k * period: slots of a multiple of it share it."""
    return 1 << (swizzle.base + swizzle.shift + swizzle.bits)


# -- ops ---------------------------------------------------------------------------------------


@lowering("smem_alloc")
def _alloc(ctx, op):
    t: SharedType = op.result.type
    nbytes = t.numel * t.dtype.bits // 8
    if nbytes > ctx.target.shared_memory_bytes:
        raise ctx.error(op, f"the shared buffer {t} needs {nbytes} bytes, more than the "
                            f"{ctx.target.shared_memory_bytes} bytes of shared memory a block has on "
                            f"{ctx.target.name}; use smaller tiles or fewer slots")
    swizzle = buffer_swizzle(ctx, op)
    align = {"align": TMA_BUFFER_ALIGN} if tma_swizzles(ctx, op) is not None else {}
    base = ctx.emit("shared_alloc", attrs={"bytes": nbytes, "offset": -1, "whole_kernel": True} | align,
                    type=PointerType(t.dtype, "shared"))
    base.name_hint = op.result.name_hint
    ctx.env[op.result] = SharedParts(base, None, t.shape, swizzle)


def buffer_swizzle(ctx, alloc: Operation) -> Swizzle | None:
    """The swizzle of the buffer `alloc` (see `choose_swizzle`); the same answer every time it is asked."""
    t: SharedType = alloc.result.type
    allowed = (None,) if lds_dma_fills(ctx, alloc) else tma_swizzles(ctx, alloc)
    return choose_swizzle(buffer_accesses(ctx, alloc), t.dtype, ctx.target.shared_memory_banks, ctx.warp_size,
                          ctx.num_threads, allowed)


def tma_swizzles(ctx, alloc: Operation) -> tuple[Swizzle | None, ...] | None:
    """The swizzles TMA can write a slot of `alloc` with (unswizzled first), when the target has TMA and an
    mbarrier copy of a 2-D view block fills it; else None (the buffer's swizzle is free)."""
    t: SharedType = alloc.result.type
    if not ctx.target.has("tma") or len(t.shape) < 2:
        return None
    if not any(op.name == "smem_async_copy" and copy_barrier(op) is not None and root(op.operands[0]) is alloc
               and isinstance(op.operands[1].type, ViewType) for op in ctx.src.walk()):
        return None
    row_bytes = t.shape[-1] * t.dtype.bits // 8
    fits = row_bytes in (32, 64, 128) and t.dtype.bits in (8, 16, 32)
    return (None, swizzle_bytes(row_bytes, t.dtype.bits // 8)) if fits else (None,)


def root(value: Value) -> Operation:
    """The smem_alloc (or smem_mbarriers) a (sub-)buffer value is a slot of."""
    while value.owner.name == "smem_slot":
        value = value.owner.operands[0]
    return value.owner


@lowering("smem_slot")
def _slot(ctx, op):
    parts: SharedParts = ctx.lookup(op.operands[0])
    index = ctx.cast(ctx.lookup(op.operands[1]), dt.i32)
    size = math.prod(parts.shape[1:])
    offset = ctx.emit("mul", index, ctx.const(size))
    if parts.offset is not None:
        offset = ctx.emit("add", parts.offset, offset)
    ctx.env[op.result] = SharedParts(parts.base, offset, parts.shape[1:], parts.swizzle)


def _vector(ctx, layout: RegisterLayout, t: SharedType) -> int:
    """Registers one ld/st.shared of `layout` moves (as `_load` and `_store` emit them)."""
    return ctx.smem.vector_width(layout, row_major_strides(t.shape), t.dtype)


def _ldmatrix(ctx, layout: RegisterLayout, dtype: dt.DType):
    """The ldmatrix plan that reads `layout` from a row-major buffer, or None."""
    if not ctx.target.has("ldmatrix") or dtype not in LDMATRIX_DTYPES or layout.rank != 2:
        return None
    for trans in (False, True):
        plan = ldmatrix_plan(layout, trans, ctx.warp_size, dtype.bits // 8)
        if plan is not None:
            return plan
    return None


@lowering("smem_load")
def _load(ctx, op):
    parts: SharedParts = ctx.lookup(op.operands[0])
    layout = ctx.assignment.layout(op.result)
    plan = _ldmatrix(ctx, layout, parts.dtype)
    if plan is not None and plan.smem.swizzle == parts.swizzle:
        ctx.define(op.result, read_fragment(ctx, parts.slot_base(ctx), plan, parts.dtype), op)
        return
    weights = row_major_strides(parts.shape)
    ptrs = parts.addresses(ctx, ctx.index.regs(layout, weights))
    k = ctx.smem.vector_width(layout, weights, parts.dtype)
    t = RegsType(ScalarType(parts.dtype), layout.local_size)
    value = ctx.create("load", [ptrs], {"vector": k} if k > 1 else None, [t]).result
    ctx.define(op.result, Regs(value, layout), op)


@lowering("smem_store")
def _store(ctx, op):
    parts: SharedParts = ctx.lookup(op.operands[0])
    value: Regs = ctx.operand(op, 1)
    layout = value.layout
    weights = row_major_strides(parts.shape)
    ptrs = parts.addresses(ctx, ctx.index.regs(layout, weights))
    k = ctx.smem.vector_width(layout, weights, parts.dtype)
    owner = ctx.index.owner_predicate(layout)
    operands = [ptrs, value.value] + ([ctx.splat(owner, layout.local_size)] if owner is not None else [])
    ctx.create("store", operands, {"vector": k} if k > 1 else None)


@lowering("smem_async_commit")
def _commit(ctx, op):
    if has_async_copies(ctx.target):
        ctx.create("async_commit")


@lowering("smem_async_wait")
def _wait(ctx, op):
    if has_async_copies(ctx.target):
        ctx.create("async_wait", attrs={"pending": op.attrs["pending"]})


@lowering("smem_barrier")
def _barrier(ctx, op):
    ctx.threads.barrier()


# -- async copies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyPlan:
    """How the threads copy a block: registers of `layout` in chunks of `width` along the last dim."""

    layout: RegisterLayout          # each thread's registers come in runs of `width` consecutive elements
    width: int
    asynchronous: bool              # cp.async or LDS DMA (else a load and a shared store)


def copy_plan(ctx, op: Operation) -> CopyPlan:
    """The chunking of `smem_async_copy` `op` (see the module docstring)."""
    t: SharedType = op.operands[0].type
    source = op.operands[1]
    operands = copy_operands(op)
    facts = ctx.facts.facts
    bits = t.dtype.bits
    max_bits = MAX_COPY_BYTES * 8
    if isinstance(source.type, ViewType):
        offsets = [facts.get(v) for v in operands[2:]]
        view = facts.get(source)
        width = 1 if view is None or None in offsets else alignment.view_vector_width(
            view, offsets, t.shape, bits, max_bits)
        width = _pow2_floor(math.gcd(width, t.shape[-1]))
        layout = _chunk_layout(ctx, t.shape, width)
    else:
        layout = ctx.assignment.layout(source)
        info = facts.get(source)
        width = 1 if info is None else alignment.vector_width(info, bits, max_bits)
        if len(operands) > 2 and facts.get(operands[2]) is not None:
            width = min(width, alignment.mask_constancy(facts[operands[2]]))
        width = _pow2_floor(min(width, layout.local_contiguity(-1)))
    if ctx.target.has("lds.dma"):
        return _lds_dma_plan(ctx, layout, width, t, isinstance(source.type, ViewType))
    asynchronous = ctx.target.has("cp.async") and width * bits >= MIN_ASYNC_COPY_BYTES * 8
    return CopyPlan(layout, width, asynchronous)


def _chunk_layout(ctx, shape, width: int) -> RegisterLayout:
    """A view block's copy layout: blocked over its chunks of `width` elements, neighbouring threads on
    neighbouring chunks."""
    chunks = shape[:-1] + (shape[-1] // width,)
    layout = blocked_layout(chunks, 1, ctx.assignment.num_warps, ctx.warp_size)
    return layout * local(*([1] * (len(chunks) - 1) + [width])) if width > 1 else layout


def _lds_dma_plan(ctx, layout: RegisterLayout, width: int, t: SharedType, view: bool) -> CopyPlan:
    """AMD's direct-to-LDS copy: the widest width the target's lanes copy (`lds_dma_bytes`) that the
    alignment allows, if every wave's lanes then fill consecutive chunks of the (unswizzled) buffer, the M0
    rule of `global_load_lds`; else the synchronous copy at the alignment's width."""
    bits = t.dtype.bits
    for nbytes in lds_dma_bytes(ctx.target):
        elements = nbytes * 8 // bits
        if nbytes * 8 % bits or elements > width:
            continue
        chunked = _chunk_layout(ctx, t.shape, elements) if view else layout
        if lanes_consecutive(chunked, t.shape, elements, ctx.warp_size):
            return CopyPlan(chunked, elements, True)
    return CopyPlan(layout, width, False)


def lanes_consecutive(layout: RegisterLayout, shape, width: int, warp: int) -> bool:
    """Whether chunk j of every thread of each wave starts `width` elements after its lower lane's."""
    if layout.local_size % width or layout.local_contiguity(-1) % width:
        return False
    starts = _pattern(layout, shape, width)[:, 0, 0]                 # (groups * threads,) chunk starts
    threads = layout.table().shape[0]
    if threads % warp:
        return False
    waves = starts.reshape(-1, warp)
    return bool((waves - waves[:, :1] == np.arange(warp) * width).all())


def lds_dma_fills(ctx, alloc: Operation) -> bool:
    """Whether a direct-to-LDS copy fills the buffer `alloc` (which then stays unswizzled: see `copy_plan`)."""
    return ctx.target.has("lds.dma") and any(
        op.name == "smem_async_copy" and root(op.operands[0]) is alloc and copy_plan(ctx, op).asynchronous
        for op in ctx.src.walk())


def copy_operands(op: Operation) -> list[Value]:
    """`smem_async_copy`'s operands without its mbarrier (if any): buffer, source, offsets or mask."""
    return op.operands[:-1] if copy_barrier(op) is not None else list(op.operands)


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def thread_copy(ctx, op):
    """`smem_async_copy` `op` by every thread (cp.async chunks or load and store; see the module docstring).
    Registered by `mbarriers.py`, which sends mbarrier copies that TMA can do elsewhere."""
    parts: SharedParts = ctx.lookup(op.operands[0])
    plan = copy_plan(ctx, op)
    layout = plan.layout
    count = len(copy_operands(op))
    if isinstance(op.operands[1].type, ViewType):
        view = ctx.lookup(op.operands[1])
        starts = [ctx.operand(op, i) for i in range(2, count)]
        src, ok = view_lanes(ctx, op, layout, view, starts)
    else:
        src = ctx.operand(op, 1).value
        ok = ctx.operand(op, 2).value if count > 2 else None
    dst = parts.addresses(ctx, ctx.index.regs(layout, row_major_strides(parts.shape)))
    owner = ctx.index.owner_predicate(layout)
    if owner is None:
        _issue(ctx, plan, parts.dtype, src, ok, dst)
        return
    with ctx.when(owner):
        _issue(ctx, plan, parts.dtype, src, ok, dst)


def _issue(ctx, plan: CopyPlan, dtype: dt.DType, src: Value, ok: Value | None, dst: Value) -> None:
    """This thread's chunks: cp.async each (zero-filled where `ok` is false), or load and store them now."""
    count, width = plan.layout.local_size, plan.width
    if plan.asynchronous:
        nbytes = width * dtype.bits // 8
        true = ctx.const(True, dt.bool_)
        for j in range(0, count, width):
            pred = ctx.extract(ok, j) if ok is not None else true
            ctx.create("async_copy", [ctx.extract(dst, j), ctx.extract(src, j), pred], {"bytes": nbytes})
        return
    t = RegsType(ScalarType(dtype), count)
    vector = {"vector": width} if width > 1 else None
    if ok is None:
        value = ctx.create("load", [src], vector, [t]).result
    else:
        value = ctx.create("load", [src, ok, ctx.const_regs([0] * count, dtype)], vector, [t]).result
    ctx.create("store", [dst, value], vector)
