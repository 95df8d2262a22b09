"""Memory ops: pointer arithmetic, masked loads and stores (ordered ones too), atomics, tensor views.

Memory safety is the interpreter's main service to a kernel author:

* masked-off lanes are never read or written;
* a lane that is read or written (no mask, or mask true) at an offset outside
  its memory raises InterpreterError naming the op, its source line, the
  lane, the offset and the memory's size, and suggesting a mask;
* `view_load`/`view_store` are bounds-checked by construction: lanes outside
  the view's sizes read `fill` (default 0) or are skipped, never an error.
  (A view whose sizes/strides reach outside its memory is an error.)

Lanes are processed in row-major order. Where several lanes of one `store`
hit the same element, the last lane wins. Atomics apply lane by lane in
that order within a program instance, so duplicates accumulate; program
instances run one after another (see `interpreter.py`). Masked-off lanes of
an atomic return 0.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.types import scalar_dtype, shape_of

from tessera.ir import numerics
from .registry import semantics
from .values import Pointers, View


@semantics("addptr")
def _addptr(ctx, op, ptr, offset):
    return Pointers(ptr.memory, ptr.offsets + np.asarray(offset).astype(np.int64))


def _check_in_bounds(ctx, op, ptr: Pointers, mask, action: str) -> None:
    """Raise unless every active lane of `ptr` addresses an element of its memory."""
    offsets, memory = ptr.offsets, ptr.memory
    bad = (offsets < 0) | (offsets >= memory.size)
    if mask is not None:
        bad &= mask
    if not bad.any():
        return
    flat = int(np.argmax(bad))
    lane = tuple(int(i) for i in np.unravel_index(flat, bad.shape))
    advice = ("this access has no mask; pass one that is false for out-of-range lanes, e.g. offsets < n"
              if mask is None else "its mask lets this lane through; make the mask false for out-of-range lanes")
    raise ctx.error(op, f"{action} out of bounds: lane {lane} addresses element {int(offsets.reshape(-1)[flat])} "
                        f"of '{memory.name or 'memory'}', which holds {memory.size} {memory.dtype.name} elements; "
                        f"{advice}")


def _zeros(op):
    t = op.result.type
    return np.zeros(shape_of(t), dtype=scalar_dtype(t).compute_dtype)


@semantics("load", "load_acquire")      # one program runs at a time here: every access is ordered
def _load(ctx, op, ptr, mask=None, other=None):
    _check_in_bounds(ctx, op, ptr, mask, "load")
    if mask is None:
        return ptr.memory.load(ptr.offsets)
    result = _zeros(op) if other is None else np.array(other, copy=True)
    result[mask] = ptr.memory.load(ptr.offsets[mask])
    return result


@semantics("store", "store_release")
def _store(ctx, op, ptr, value, mask=None):
    _check_in_bounds(ctx, op, ptr, mask, "store")
    if mask is None:
        ptr.memory.store(ptr.offsets, value)
    else:
        ptr.memory.store(ptr.offsets[mask], np.broadcast_to(value, mask.shape)[mask])


@semantics("nanosleep")
def _nanosleep(ctx, op, ns):
    """Nothing to wait for: a spin loop that changes nothing parks in the cooperative scheduler instead."""


# -- atomics ---------------------------------------------------------------

def combine_atomic(kind: str, old, value, dtype):
    """What atomic `kind` writes over `old` (xchg: `value` itself)."""
    if kind == "xchg":
        return value
    return numerics.binary(kind, old, value, dtype)


def apply_in_lane_order(memory, offsets, update):
    """Read-modify-write each (flat) lane in order; returns the old values.

    With distinct offsets every lane sees memory as it was, so the whole
    tile is done at once; repeated offsets take the sequential path.
    """
    if np.unique(offsets).size == offsets.size:
        old = memory.load(offsets)
        memory.store(offsets, update(old, slice(None)))
        return old
    old = np.empty(offsets.shape, dtype=memory.dtype.compute_dtype)
    for i in range(offsets.size):
        lane = slice(i, i + 1)
        old[lane] = memory.load(offsets[lane])
        memory.store(offsets[lane], update(old[lane], lane))
    return old


@semantics("atomic_rmw")
def _atomic_rmw(ctx, op, ptr, value, mask=None):
    kind, dtype = op.attrs["kind"], ptr.memory.dtype
    _check_in_bounds(ctx, op, ptr, mask, f"atomic {kind}")
    active = np.ones(ptr.shape, dtype=bool) if mask is None else mask
    offsets = ptr.offsets[active]
    values = np.broadcast_to(value, ptr.shape)[active]
    result = _zeros(op)
    result[active] = apply_in_lane_order(
        ptr.memory, offsets, lambda old, lane: combine_atomic(kind, old, values[lane], dtype))
    return result


@semantics("atomic_cas")
def _atomic_cas(ctx, op, ptr, compare, value):
    """Where memory's bits equal `compare`'s bits (so NaN can match), write `value`."""
    dtype = ptr.memory.dtype
    _check_in_bounds(ctx, op, ptr, None, "atomic_cas")
    offsets = ptr.offsets.reshape(-1)
    expected = dtype.encode(np.broadcast_to(compare, ptr.shape).reshape(-1))
    values = np.broadcast_to(value, ptr.shape).reshape(-1)

    def swap(old, lane):
        return np.where(dtype.encode(old) == expected[lane], values[lane], old)

    return apply_in_lane_order(ptr.memory, offsets, swap).reshape(ptr.shape)


# -- tensor views ----------------------------------------------------------


@semantics("make_view")
def _make_view(ctx, op, base, *sizes_and_strides):
    rank = len(sizes_and_strides) // 2
    sizes = tuple(int(s) for s in sizes_and_strides[:rank])
    strides = tuple(int(s) for s in sizes_and_strides[rank:])
    if any(s < 0 for s in sizes):
        raise ctx.error(op, f"view sizes must be >= 0, got {sizes}")
    return View(base.memory, int(base.offsets), sizes, strides)


def _block_lanes(ctx, op, view: View, starts, shape):
    """Element offsets of the block at `starts`, and which lanes lie inside the view."""
    offsets = np.asarray(view.base, dtype=np.int64)
    inside = np.asarray(True)
    for d, (start, n) in enumerate(zip(starts, shape)):
        index = int(start) + np.arange(n, dtype=np.int64).reshape((n,) + (1,) * (len(shape) - d - 1))
        offsets = offsets + index * view.strides[d]
        inside = inside & (index >= 0) & (index < view.sizes[d])
    offsets, inside = np.broadcast_arrays(offsets, inside)
    escaped = inside & ((offsets < 0) | (offsets >= view.memory.size))
    if escaped.any():
        raise ctx.error(op, f"the view (base {view.base}, sizes {view.sizes}, strides {view.strides}) reaches "
                            f"element {int(offsets[escaped][0])} outside '{view.memory.name or 'memory'}', which "
                            f"holds {view.memory.size} elements; check the sizes and strides given to make_view")
    return offsets, inside


@semantics("view_load")
def _view_load(ctx, op, view, *starts):
    if op.attrs.get("multicast"):
        _check_multicast(ctx, op, view, starts)
    shape = tuple(op.attrs["shape"])
    dtype = view.memory.dtype
    offsets, inside = _block_lanes(ctx, op, view, starts, shape)
    result = np.full(shape, dtype.quantize(op.attrs.get("fill", 0)), dtype=dtype.compute_dtype)
    result[inside] = view.memory.load(offsets[inside])
    return result


@semantics("view_store")
def _view_store(ctx, op, view, *starts_and_value):
    *starts, value = starts_and_value
    offsets, inside = _block_lanes(ctx, op, view, starts, value.shape)
    view.memory.store(offsets[inside], value[inside])


def _check_multicast(ctx, op, view, starts) -> None:
    """`load(multicast=True)` promises that every program of a cluster loads the same block at that load's n-th
    execution: the first program of the cluster to get there records it, the others must match."""
    dims = tuple(ctx.fn.attrs.get("cluster_dims") or ()) + (1, 1, 1)
    if dims[0] * dims[1] * dims[2] == 1:
        return
    counts = ctx.__dict__.setdefault("multicast_counts", {})
    n = counts[op] = counts.get(op, -1) + 1
    cluster = tuple(p // d for p, d in zip(ctx.program_id, dims))
    block = (id(view.memory), view.base, tuple(view.sizes), tuple(view.strides), tuple(int(s) for s in starts))
    first = ctx._cache.setdefault(("multicast", op, cluster, n), (block, ctx.program_id))
    if first[0] != block:
        raise ctx.error(op, f"load(multicast=True): program {ctx.program_id} loads the block at offsets {block[4]} "
                            f"(view base {view.base}), but program {first[1]} of the same cluster loaded the one at "
                            f"{first[0][4]} (view base {first[0][1]}) there; every program of a cluster must load the "
                            "same block at a multicast load (or drop multicast=True)")
