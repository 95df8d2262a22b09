"""Loads, stores and atomics in thread IR: global memory (`Memory`) and shared memory (`SharedRegion`).

A lane here is one register of one thread. A lane is live when its thread
is active and the op's mask (if any) is true; other lanes never touch
memory, and a live lane outside its memory raises InterpreterError naming
the thread and register. Loads give dead lanes `other` (zero if absent).
Where lanes of one store hit the same element, the last in thread order,
then register order, wins; atomics apply in that order too. Shared-memory
loads and stores are also checked for races (see `shared.py`).

`vector = V` promises that each group of V consecutive registers is one
wide access: within every live group the element addresses are
consecutive, the first is aligned to V elements (counting from the base
of global memory, assumed aligned as allocators make it, or from the
start of shared memory), and the mask is the same for the whole group.
The simulator checks the promise, which is how a vectorized lowering is
proved right on the CPU.
"""

from __future__ import annotations

import numpy as np

from ..interp.memory import apply_in_lane_order, combine_atomic
from ..interp.values import Pointers
from . import happens_before, scopes
from .ops import describe_lane, simt, thread_index
from .shared import SharedRegion


def live_lanes(ctx, shape: tuple[int, ...], mask) -> np.ndarray | None:
    """The lanes an access touches (thread active and mask true), or None for all of them."""
    if ctx.mask is None:
        return mask
    active = ctx.mask.reshape(ctx.mask.shape + (1,) * (len(shape) - 1))
    return np.broadcast_to(active, shape) if mask is None else mask & active


def _check_in_bounds(ctx, op, ptr: Pointers, live, has_mask: bool, action: str) -> None:
    offsets, memory = ptr.offsets, ptr.memory
    bad = (offsets < 0) | (offsets >= memory.size)
    if live is not None:
        bad &= live
    if not bad.any():
        return
    index = thread_index(bad)
    advice = ("its mask lets this lane through; make it false for out-of-range lanes" if has_mask
              else "give it a mask that is false for out-of-range lanes")
    raise ctx.error(op, f"{action} out of bounds: {describe_lane(index)} addresses element {int(offsets[index])} "
                        f"of '{memory.name or 'memory'}', which holds {memory.size} {memory.dtype.name} elements; "
                        f"{advice}")


def _check_vector(ctx, op, ptr: Pointers, live, mask) -> None:
    width = op.attrs.get("vector")
    if width is None:
        return
    offsets = ptr.offsets
    count = offsets.shape[1] if offsets.ndim == 2 else 1
    if count % width:
        raise ctx.error(op, f"vector = {width} needs registers in groups of {width}, but the pointer has {count}")
    groups = offsets.reshape(offsets.shape[0], count // width, width)
    if live is None:
        group_live = np.ones(groups.shape[:2], dtype=bool)
    else:
        live = np.broadcast_to(live, offsets.shape).reshape(groups.shape)
        group_live = live.any(axis=2)
        split = group_live & ~live.all(axis=2)
        if split.any():
            t, g = thread_index(split)
            raise ctx.error(op, f"vector = {width} promise broken: thread {t} has a mask that differs within "
                                f"registers {g * width}..{g * width + width - 1}; a vector access has one mask")
    step = groups - groups[:, :, :1]
    broken = group_live & (step != np.arange(width)).any(axis=2)
    if broken.any():
        t, g = thread_index(broken)
        raise ctx.error(op, f"vector = {width} promise broken: thread {t}, registers {g * width}.."
                            f"{g * width + width - 1} address elements {groups[t, g].tolist()}, which are not "
                            "consecutive")
    bits = ptr.memory.dtype.bits
    base = ptr.memory.byte_offset * 8 if isinstance(ptr.memory, SharedRegion) else 0
    misaligned = group_live & ((base + groups[:, :, 0] * bits) % (width * bits) != 0)
    if misaligned.any():
        t, g = thread_index(misaligned)
        raise ctx.error(op, f"vector = {width} promise broken: thread {t}, registers {g * width}.."
                            f"{g * width + width - 1} start at element {int(groups[t, g, 0])}, which is not "
                            f"aligned to {width * bits // 8 or 1} bytes ({width} {ptr.memory.dtype.name} elements)")


def _owner_threads(shape: tuple[int, ...]) -> np.ndarray:
    threads = np.arange(shape[0], dtype=np.int64)
    return np.broadcast_to(threads.reshape((-1,) + (1,) * (len(shape) - 1)), shape)


def _record_shared(ctx, op, ptr: Pointers, live, values=None) -> None:
    region = ptr.memory
    if not isinstance(region, SharedRegion):
        return
    threads, offsets = _owner_threads(ptr.offsets.shape), ptr.offsets
    if live is not None:
        threads, offsets = threads[live], offsets[live]
        values = None if values is None else np.broadcast_to(values, live.shape)[live]
    if values is None:
        race = region.shared.record_read(region, threads, offsets)
    else:
        race = region.shared.record_write(region, threads, offsets, values)
    if race is not None:
        raise ctx.error(op, f"shared-memory race: {race}")


def _access(ctx, op, ptr, mask, action: str):
    live = live_lanes(ctx, ptr.offsets.shape, mask)
    _check_in_bounds(ctx, op, ptr, live, mask is not None, action)
    _check_vector(ctx, op, ptr, live, mask)
    return live


@simt("load", "load_acquire")        # lockstep blocks, one running at a time: every access is ordered
def _load(ctx, op, ptr, mask=None, other=None):     # (but an acquire's scope may not reach the writer: scopes.py)
    live = _access(ctx, op, ptr, mask, "load")
    _record_shared(ctx, op, ptr, live)
    if op.name == "load_acquire":
        scopes.observe(ctx, op, ptr, live)
    happens_before.before(ctx, op, ptr, live)
    if live is None:
        return ptr.memory.load(ptr.offsets)
    if other is None:
        result = np.zeros(ptr.offsets.shape, dtype=ptr.memory.dtype.compute_dtype)
    else:
        result = np.array(other, copy=True)
    result[live] = ptr.memory.load(ptr.offsets[live])
    return result


@simt("store", "store_release")
def _store(ctx, op, ptr, value, mask=None):
    live = _access(ctx, op, ptr, mask, "store")
    _record_shared(ctx, op, ptr, live, value)
    happens_before.before(ctx, op, ptr, live)
    if live is None:
        ptr.memory.store(ptr.offsets, value)
    else:
        ptr.memory.store(ptr.offsets[live], value[live])
    scopes.record(ctx, op, ptr, live)
    happens_before.after(ctx, op, ptr, live)


@simt("nanosleep")
def _nanosleep(ctx, op, ns):
    """Nothing to wait for: a spin loop that changes nothing parks in the cooperative scheduler instead."""


@simt("atomic_rmw")
def _atomic_rmw(ctx, op, ptr, value, mask=None):
    kind, dtype = op.attrs["kind"], ptr.memory.dtype
    live = _access(ctx, op, ptr, mask, f"atomic {kind}")
    if live is None:
        live = np.ones(ptr.offsets.shape, dtype=bool)
    values = value[live]
    scopes.observe(ctx, op, ptr, live)
    happens_before.before(ctx, op, ptr, live)
    result = np.zeros(ptr.offsets.shape, dtype=dtype.compute_dtype)
    result[live] = apply_in_lane_order(ptr.memory, ptr.offsets[live],
                                       lambda old, lane: combine_atomic(kind, old, values[lane], dtype))
    scopes.record(ctx, op, ptr, live)
    happens_before.after(ctx, op, ptr, live)
    return result


@simt("atomic_cas")
def _atomic_cas(ctx, op, ptr, compare, value):
    """Where memory's bits equal `compare`'s bits (so NaN can match), write `value`."""
    dtype = ptr.memory.dtype
    live = _access(ctx, op, ptr, None, "atomic_cas")
    if live is None:
        live = np.ones(ptr.offsets.shape, dtype=bool)
    expected, values = dtype.encode(compare[live]), value[live]

    def swap(old, lane):
        return np.where(dtype.encode(old) == expected[lane], values[lane], old)

    scopes.observe(ctx, op, ptr, live)
    happens_before.before(ctx, op, ptr, live)
    result = np.zeros(ptr.offsets.shape, dtype=dtype.compute_dtype)
    result[live] = apply_in_lane_order(ptr.memory, ptr.offsets[live], swap)
    scopes.record(ctx, op, ptr, live)
    happens_before.after(ctx, op, ptr, live)
    return result
