"""Explicit shared memory and asynchronous copies: the author stages data herself.

    smem = tessera.shared((2, BM, BK), tessera.f16)             # one buffer per program, 2 slots
    tessera.async_copy(smem[s], a.block((BM, BK), (pid_m, k)))  # view block -> shared, asynchronously
    tessera.async_copy(smem[s], ptrs, mask=m)                   # or pointers; masked-off lanes write 0
    tessera.async_commit()                                      # close the group of copies issued so far
    tessera.async_wait(1)                                       # until at most 1 group is in flight
    tessera.barrier()                                           # every thread of the program
    x = smem[s].load()                                          # shared -> registers (layout= optional)
    smem[s].store(tile)                                         # registers -> shared
    bars = tessera.mbarriers(2)                                 # 2 mbarriers (one per slot), at the top level
    tessera.async_copy(smem[s], a.block(...), barrier=bars[s])  # the copy completes on bars[s], not in a group
    bars[s].wait(phase)                                         # until bars[s]'s phase of parity `phase` lands

`smem[s]` (s an int or an integer scalar) is slot s of the leading dim, a
buffer of the remaining shape; `.load()` / `.store()` / `async_copy` move a
whole (sub-)buffer. A copy's bytes are in flight until a wait retires its
group: reading or overwriting them earlier is a race (the CPU interpreter
reports it with the wait to add). Other threads' bytes are visible after
`tessera.barrier()`. Mbarriers count *phases* instead of groups: every
copy issued onto `bars[s]` since its previous phase belongs to its current
phase; `bars[s].wait(p)` returns when all of them have landed (for every
thread of the program: no barrier is needed after it), and the phase
number goes up by one, so its parity p (0 or 1) alternates: a 2-slot ring
waits on parity (k // 2) % 2 in iteration k. `tessera.pipeline` builds all of this for `dot`
operands automatically; these primitives are for kernels that want the
schedule in their own hands. Semantics: `tessera/ir/shared_ops.py`.
"""

from __future__ import annotations

from typing import Any

from ...ir import dtypes as dt
from ...ir.core import Function
from ...ir.target import TARGETS
from ...ir.types import PointerType, SharedType, element_of
from .. import operators
from ..constexpr_args import describe, static_dtype, static_int, static_shape
from ..errors import TypeMismatchError
from ..values import Context, Tensor, builtin
from .layouts import pin_layout
from .memory import BlockRef, _fit, _mask

LARGEST_SHARED_MEMORY = max(t.shared_memory_bytes for t in TARGETS.values())
SHARED_ATTRIBUTES = ("dtype", "shape", "load", "store")
MBARRIER_ATTRIBUTES = ("wait",)


@builtin
def shared(ctx: Context, shape, dtype) -> Tensor:
    """shared(shape, dtype) -> a buffer of `shape` `dtype` elements in this program's shared memory.

    `shape` and `dtype` are compile-time; the leading dim usually counts
    slots (`(stages, BM, BK)`), selected with `buf[s]`. Allocate buffers at
    the top level of the kernel (not in a loop or branch): there is one per
    program, live for the whole kernel. Elements are at least a byte wide.
    """
    shape = static_shape(ctx, shape, "the shared buffer's shape", power_of_two=False)
    static_shape(ctx, shape[1:] or shape, "the shared buffer's shape after the slot dim (a tile's shape)")
    dtype = static_dtype(ctx, dtype, "the shared buffer's dtype")
    if not isinstance(ctx.builder.block.parent, Function):
        ctx.error("tessera.shared inside a loop or branch: a shared buffer lives for the whole program; "
                  "allocate it once at the top level of the kernel, before the loop, and reuse its slots")
    if dtype.bits < 8:
        ctx.error(f"shared buffers hold elements of at least one byte, got {dtype.name}; keep packed "
                  f"{dtype.name} data as u8 (or widen it) in shared memory", TypeMismatchError)
    nbytes = SharedType(dtype, shape).numel * dtype.bits // 8
    if nbytes > LARGEST_SHARED_MEMORY:
        ctx.error(f"the shared buffer {shape} of {dtype.name} needs {nbytes} bytes, more than any GPU's "
                  f"{LARGEST_SHARED_MEMORY} bytes of shared memory per block; use smaller tiles or fewer slots")
    return operators.emit(ctx, "smem_alloc", result_type=SharedType(dtype, shape))


def slot(ctx: Context, buf: Tensor, index: Any) -> Tensor:
    """`buf[index]`: the sub-buffer at `index` of the leading dim (an int or an integer scalar)."""
    shape = buf.type.shape
    if isinstance(index, tuple) or not (isinstance(index, int) and not isinstance(index, bool)
                                        or isinstance(index, Tensor) and not index.is_tile
                                        and index.dtype is not None and index.dtype.is_int):
        ctx.error(f"a shared buffer is indexed by one slot number along its leading dim (an int or an integer "
                  f"scalar), as in buf[s]; got [{describe(index)}]", TypeMismatchError)
    if len(shape) < 2:
        ctx.error(f"{buf.type} has one dim, so it has no slots; load or copy it whole (buf.load())")
    if isinstance(index, int):
        index = static_int(ctx, index, "the slot")
        if not 0 <= index < shape[0]:
            ctx.error(f"slot {index} of {buf.type}, which has {shape[0]} slots (0 to {shape[0] - 1})")
    return operators.emit(ctx, "smem_slot", buf, operators.to_tensor(ctx, index))


def attribute(ctx: Context, buf: Tensor, name: str) -> Any:
    """`buf.dtype`, `buf.shape`, `buf.load(layout=None)`, `buf.store(tile)`; `bars[s].wait(phase)`."""
    t = buf.type
    if is_mbarriers(buf):
        return _mbarrier_attribute(ctx, buf, name)
    if name == "dtype":
        return t.dtype
    if name == "shape":
        return t.shape
    if name == "load":
        def load(layout=None) -> Tensor:
            """The buffer as a tile; `layout` pins its register layout."""
            return pin_layout(ctx, operators.emit(ctx, "smem_load", buf), layout, "load's layout")
        return load
    if name == "store":
        def store(value) -> None:
            """Write `value`, converted to the buffer's dtype and broadcast to its shape."""
            operators.emit(ctx, "smem_store", buf, _fit(ctx, value, t.dtype, t.shape, "the stored tile"))
        return store
    ctx.error(f"{t} has no attribute {name!r}; shared buffers have: {', '.join(SHARED_ATTRIBUTES)}")


def _shared_buffer(ctx: Context, value: Any, what: str) -> Tensor:
    if not (isinstance(value, Tensor) and value.is_shared) or is_mbarriers(value):
        ctx.error(f"{what} must be a shared buffer (tessera.shared(...), or a slot of one: buf[s]), got "
                  f"{'mbarriers' if isinstance(value, Tensor) and is_mbarriers(value) else describe(value)}",
                  TypeMismatchError)
    return value


# -- mbarriers -----------------------------------------------------------------------------------


def is_mbarriers(value: Tensor) -> bool:
    """`value` is `tessera.mbarriers(...)` or one of its mbarriers (`bars[s]`)."""
    v = value.value
    while v.owner is not None and getattr(v.owner, "name", None) == "smem_slot":
        v = v.owner.operands[0]
    return getattr(v.owner, "name", None) == "smem_mbarriers"


@builtin
def mbarriers(ctx: Context, count) -> Tensor:
    """mbarriers(count) -> `count` mbarriers for this program, each in phase 0; `bars[s]` is mbarrier s.

    A copy issued with `async_copy(..., barrier=bars[s])` joins the current
    phase of bars[s]; `bars[s].wait(p)` returns once every copy of that phase
    has landed (visible to every thread), and the phase number goes up by
    one. `p` is the parity (phase number % 2) of the phase waited for: it
    must be the current phase's (waiting for the previous phase, already
    complete, is reported), and the phase must have copies (else the wait
    never returns: a deadlock). Allocate at the top level of the kernel.

    PTX: on sm_90 an mbarrier (mbarrier.init count 1, by one thread, then
    fence.mbarrier_init and bar.sync; mbarrier.inval at the end), TMA copies
    (cp.async.bulk.tensor ... mbarrier::complete_tx) of view blocks that
    qualify, and `wait` = mbarrier.try_wait.parity by every thread.
    Elsewhere the copies are cp.async groups (sm_80), direct-to-LDS loads
    (gfx942/gfx950) or synchronous (gfx90a), and `wait` waits for all of
    this thread's copies, then bar.sync (s_barrier).
    """
    count = static_int(ctx, count, "the number of mbarriers")
    if count < 1:
        ctx.error(f"tessera.mbarriers needs at least one mbarrier, got {count}")
    if not isinstance(ctx.builder.block.parent, Function):
        ctx.error("tessera.mbarriers inside a loop or branch: mbarriers live for the whole program; allocate them "
                  "once at the top level of the kernel, before the loop")
    return operators.emit(ctx, "smem_mbarriers", result_type=SharedType(dt.i64, (count, 1)))


def _mbarrier_attribute(ctx: Context, bar: Tensor, name: str) -> Any:
    if name != "wait" or bar.type.shape != (1,):
        what = "an array of mbarriers (index one: bars[s])" if bar.type.shape != (1,) else "an mbarrier"
        ctx.error(f"{what} has no attribute {name!r}; an mbarrier bars[s] has: {', '.join(MBARRIER_ATTRIBUTES)}")

    def wait(phase) -> None:
        """Wait until this mbarrier's current phase, of parity `phase` (0 or 1), completes."""
        if isinstance(phase, int) and not isinstance(phase, bool) and phase not in (0, 1):
            ctx.error(f"an mbarrier's wait takes the parity of the phase (0 or 1), got {phase}")
        if not (isinstance(phase, int) and not isinstance(phase, bool)
                or isinstance(phase, Tensor) and not phase.is_tile and phase.dtype is not None
                and phase.dtype.is_int):
            ctx.error(f"an mbarrier's wait takes the phase's parity as an int or an integer scalar, got "
                      f"{describe(phase)}", TypeMismatchError)
        operators.emit(ctx, "smem_mbarrier_wait", bar, operators.to_tensor(ctx, phase))
    return wait


def _barrier_operand(ctx: Context, barrier: Any) -> list:
    if barrier is None:
        return []
    if not (isinstance(barrier, Tensor) and barrier.is_shared and is_mbarriers(barrier)
            and barrier.type.shape == (1,)):
        whole = isinstance(barrier, Tensor) and barrier.is_shared and is_mbarriers(barrier)
        ctx.error(f"async_copy's barrier= is one mbarrier (bars[s] of bars = tessera.mbarriers(n)), got "
                  f"{'the whole array; index it' if whole else describe(barrier)}", TypeMismatchError)
    return [barrier]


@builtin
def async_copy(ctx: Context, dst, src, mask=None, barrier=None) -> None:
    """async_copy(dst, src, mask=None, barrier=None): copy global memory into the shared buffer `dst`, asynchronously.

    `src` is a view block (`v.block(shape, index)`, lanes outside the view
    write 0) or a tile of pointers (lanes where the bool `mask` is false
    write 0). Its shape and dtype must be `dst`'s: a copy converts nothing.
    The copy joins the open group: `async_commit()` closes it and
    `async_wait(n)` waits for it. Until then its bytes may be neither read
    nor written. Lowered to cp.async (16-byte chunks where alignment allows)
    on sm_80+, to direct-to-LDS loads (global_load_lds: 4 bytes a lane, 16 on
    gfx950, each wave filling consecutive chunks) on gfx942/gfx950, and to a
    plain load and shared store where the GPU has neither (gfx90a).

    With `barrier=bars[s]` (an mbarrier of `tessera.mbarriers`) the copy
    joins bars[s]'s current phase instead of the group, and `bars[s].wait(p)`
    waits for it. On sm_90 a view block whose view TMA can address (a 2-D
    `tessera.view` of a 16-byte aligned pointer argument, or of one plus
    `index * stride` terms with strides that are arguments known to be multiples
    of 16 bytes -- each becomes a leading dim of the tensor map with that index
    as its coordinate; unit stride inner dim) is one TMA copy issued by one
    thread.
    """
    dst = _shared_buffer(ctx, dst, "async_copy's destination")
    t = dst.type
    if isinstance(src, BlockRef):
        if mask is not None:
            ctx.error("async_copy from a view block takes no mask: lanes outside the view are zero-filled; "
                      "to mask lanes, copy from a tile of pointers")
        _same_block(ctx, t, src.dtype, src.shape, f"the view block {src.shape} of {src.dtype.name}")
        operators.emit(ctx, "smem_async_copy", dst, src.view, *src.offsets, *_barrier_operand(ctx, barrier))
        return
    if not (operators.is_pointer(src) and src.is_tile):
        hint = "; name a block of the view: v.block(shape, index)" if isinstance(src, Tensor) and src.is_view else ""
        ctx.error(f"async_copy copies from a view block (v.block(shape, index)) or a tile of pointers, got "
                  f"{describe(src)}{hint}", TypeMismatchError)
    pointee = element_of(src.type)
    assert isinstance(pointee, PointerType)
    if pointee.address_space != "global":
        ctx.error(f"async_copy reads global memory, but {src.type} points to {pointee.address_space} memory",
                  TypeMismatchError)
    _same_block(ctx, t, pointee.pointee, src.shape, f"the pointer tile {src.type}")
    operands = [dst, src] + ([_mask(ctx, mask, src.shape, "async_copy")] if mask is not None else []) \
        + _barrier_operand(ctx, barrier)
    operators.emit(ctx, "smem_async_copy", *operands)


def _same_block(ctx: Context, t: SharedType, dtype, shape, what: str) -> None:
    if tuple(shape) != t.shape:
        fix = (f"index a slot of the buffer (buf[s] has shape {t.shape[1:]})" if t.shape[1:] == tuple(shape)
               else f"copy a block of shape {t.shape}")
        ctx.error(f"async_copy of {what} into {t}: the shapes differ; {fix}", TypeMismatchError)
    if dtype != t.dtype:
        ctx.error(f"async_copy of {what} into {t}: a copy converts nothing, so the dtypes must match; allocate "
                  f"the buffer as tessera.shared({t.shape}, tessera.{dtype.name}), and convert after .load()",
                  TypeMismatchError)


@builtin
def async_commit(ctx: Context) -> None:
    """async_commit(): close the group of async copies issued since the last commit (cp.async.commit_group).

    Waits count groups, so commit once per stage of a pipeline, even when
    the stage copied nothing. Copies never committed are never waited for.
    """
    operators.emit(ctx, "smem_async_commit")


@builtin
def async_wait(ctx: Context, pending=0) -> None:
    """async_wait(pending=0): wait until at most `pending` committed groups are still in flight.

    Groups complete oldest first, so `async_wait(n)` guarantees that every
    group but the n newest has landed (cp.async.wait_group n). It makes this
    thread's copies visible to itself; call `tessera.barrier()` after it
    before reading bytes other threads copied.
    """
    pending = static_int(ctx, pending, "async_wait's pending")
    if pending < 0:
        ctx.error(f"async_wait's pending counts groups still allowed in flight, so it is >= 0, got {pending}")
    operators.emit(ctx, "smem_async_wait", pending=pending)


@builtin
def barrier(ctx: Context) -> None:
    """barrier(): wait for every thread of the program (bar.sync / s_barrier).

    Shared memory written by one thread (a store or a waited-for copy) is
    visible to the others after it; place one between the last write of a
    slot and its reads, and between its last reads and the next write.
    """
    operators.emit(ctx, "smem_barrier")
