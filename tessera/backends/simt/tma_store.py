"""TMA stores in the SIMT simulator: `tma_store`, `bulk_commit_group`, `bulk_wait_group_read`, `bulk_wait_group`.

A `tma_store` is executed when it is issued: the box is read from shared
memory (through the map's swizzle, as `tma_load` writes it) and the
elements that lie inside the tensor are written to the map's `source`
array; the others are dropped, as TMA clips stores. (Where `source` is a
padded copy, a map whose batch and head dims are unbounded, they are also
written at their byte offsets into the argument itself, `writeback`; one
past its end is an error.) What the GPU does later
is checked instead:

* the bytes it reads must have been written before the last barrier (no
  thread but the issuer wrote them since) and be visible to the async proxy,
  i.e. unchanged since the last `fence_proxy_async` (the view `wgmma.py`
  keeps for the same rule);
* until the issuing thread's `bulk_wait_group_read` retires the store's
  group, the copy may still be reading: any write to those bytes, by any
  thread, a cp.async or a tma_load, is a race (`AsyncProxy.describe_in_flight`),
  and a block that ends with stores not retired is an error (the GPU would
  free the shared memory under them). The wait may come late -- a loop's
  next iteration may run first (`passes/schedule/tma_store.py`) -- as long
  as it comes before the next write;
* once retired, the reads are the issuing thread's (`SharedMemory.record_retired_read`):
  another thread writing those bytes before a barrier with it races, as
  only the issuer knows the read is over;
* its global writes are complete only once the issuing thread's
  `bulk_wait_group` (the full wait, not .read) retires the group: until
  then a load, store or atomic of this block touching them is an error,
  and for the happens-before check between blocks (`happens_before.py`)
  they count as written at completion, so only a release after the full
  wait publishes them (writes never waited for complete when the block
  ends, after its last release: no block may read them in this launch).
"""

from __future__ import annotations

import numpy as np

from ..interp.errors import InterpreterError
from . import happens_before, wgmma
from .mbarrier import _active, _proxy, _source, tma_operands
from .ops import simt
from .shared import _NONE
from tessera.ir.tensor_map import swizzle_offsets

_FENCE_ADVICE = ("every thread that wrote the box must run fence_proxy_async after its writes, then a barrier, "
                 "before the tma_store is issued")


@simt("tma_store")
def _tma_store(ctx, op, src, tensor_map, *coords):
    threads = _active(ctx)
    region, desc = tma_operands(ctx, op, src, tensor_map, coords, "reads", "source")
    target = _source(ctx, op, desc)
    if not target.flags.writeable:
        raise ctx.error(op, "tma_store writes the tensor map's source array, but it is read-only; build the map "
                            "with TensorMapDescription.for_array over the output array")
    proxy = _proxy(ctx)
    numel = int(np.prod(desc.box_shape))
    for t in threads.tolist():
        if int(tensor_map.offsets[t]) != 0:
            raise ctx.error(op, "tma_store's tensor map pointer must point at the start of the map")
        start = int(src.offsets[t])
        if start < 0 or start + numel > region.size:
            raise ctx.error(op, f"tma_store box of {numel} {desc.dtype.name} elements at element {start} does not "
                                f"fit in {region.name} ({region.size} elements)")
        base = region.byte_offset + start * desc.element_bytes
        if base % desc.shared_alignment:
            raise ctx.error(op, f"tma_store source at shared byte {base} is not {desc.shared_alignment}-byte "
                                f"aligned, as a box with swizzle {desc.swizzle!r} needs")
        addrs = base + swizzle_offsets(np.arange(numel * desc.element_bytes, dtype=np.int64), desc.swizzle)
        _check_readable(ctx, op, t, addrs)
        start = [int(c[t]) for c in coords]
        written = _write_box(desc, target, start, ctx.shared.bytes[addrs])
        if desc.writeback is not None:
            written = _write_through(ctx, op, desc, start, ctx.shared.bytes[addrs])
        proxy.store_reads[addrs] += 1
        groups = proxy.store_groups.setdefault(t, [[]])
        groups[-1].append(addrs)
        proxy.store_writes.setdefault(t, [[]])[-1].append((op, written))
        proxy.writing.update(dict.fromkeys(written, op))


def _check_readable(ctx, op, thread: int, addrs: np.ndarray) -> None:
    """The box's bytes are ordered before the store: written before a barrier and fenced for the async proxy."""
    shared = ctx.shared
    busy = shared._in_flight(addrs, np.full(addrs.size, thread), "reads", None)
    if busy:
        raise ctx.error(op, f"shared-memory race: {busy}")
    wlo, whi = shared._writer_lo[addrs], shared._writer_hi[addrs]
    other = (wlo != _NONE) & ~((wlo == thread) & (whi == thread))
    if other.any():
        i = int(np.argmax(other))
        raise ctx.error(op, f"shared-memory race: thread {thread}'s tma_store reads shared byte {int(addrs[i])}, "
                            f"which thread {int(wlo[i]) if wlo[i] != thread else int(whi[i])} wrote since the last "
                            f"barrier; {_FENCE_ADVICE}")
    view = wgmma._state(ctx).async_view
    if view is None:
        raise ctx.error(op, f"tma_store reads shared memory, but no fence_proxy_async has run; {_FENCE_ADVICE}")
    stale = shared.bytes[addrs] != view[addrs]
    if stale.any():
        raise ctx.error(op, f"tma_store reads shared byte {int(addrs[np.argmax(stale)])}, written after the last "
                            f"fence_proxy_async, so the async proxy may not see it; {_FENCE_ADVICE}")


def _write_box(desc, target: np.ndarray, start: list[int], raw: np.ndarray) -> list[int]:
    """Write the box (row-major bytes `raw`) at element `start` of `target`, skipping elements outside it; return
    the byte addresses of the elements written (as `scopes.global_addresses` names them)."""
    index = np.indices(desc.box_shape).reshape(desc.rank, -1) + np.asarray(start)[:, None]
    inside = np.all((index >= 0) & (index < np.asarray(desc.shape)[:, None]), axis=0)
    values = raw.astype(np.uint8).view(target.dtype)
    target[tuple(index[:, inside])] = values[inside]
    base = target.__array_interface__["data"][0]
    return (base + (index[:, inside] * np.asarray(target.strides)[:, None]).sum(axis=0)).tolist()


def _write_through(ctx, op, desc, start: list[int], raw: np.ndarray) -> None:
    """The box's elements inside the map, written at their byte offsets (the map's strides) into the argument's
    own bytes (`desc.writeback`, where `source` is a padded copy); one past the argument's end is an error, as
    the GPU would write out of bounds there."""
    index = np.indices(desc.box_shape).reshape(desc.rank, -1) + np.asarray(start)[:, None]
    inside = np.all((index >= 0) & (index < np.asarray(desc.shape)[:, None]), axis=0)
    offsets = (index[:, inside] * np.asarray(desc.strides)[:, None]).sum(axis=0)
    size = desc.element_bytes
    if offsets.size and int(offsets.max()) + size > desc.writeback.size:
        raise ctx.error(op, f"tma_store writes byte {int(offsets.max())} of a tensor map over an argument of "
                            f"{desc.writeback.size} bytes: its coordinates {start} (outermost first) are out of range")
    elements = raw.astype(np.uint8).reshape(-1, size)[inside]
    desc.writeback[offsets[:, None] + np.arange(size)] = elements
    return (desc.writeback.__array_interface__["data"][0] + offsets).tolist()


@simt("bulk_commit_group")
def _bulk_commit_group(ctx, op):
    proxy = _proxy(ctx)
    for t in _active(ctx).tolist():
        groups = proxy.store_groups.setdefault(t, [[]])
        groups.append([])
        proxy.store_writes.setdefault(t, [[]]).append([])


@simt("bulk_wait_group")
def _bulk_wait_group(ctx, op):
    """The full wait: the groups' reads retire as with .read, and their global writes complete."""
    _bulk_wait_group_read(ctx, op)
    proxy, pending = _proxy(ctx), op.attrs["pending"]
    for t in _active(ctx).tolist():
        for group in _retire(proxy.store_writes, t, pending):
            _complete(ctx, proxy, group)


def _retire(groups_of: dict, t: int, pending: int) -> list:
    """Take thread `t`'s committed groups older than its last `pending` out of `groups_of` (thread -> its
    committed groups, then the open one) and return them, oldest first."""
    groups = groups_of.get(t)
    if not groups:
        return []
    committed, open_group = groups[:-1], groups[-1]
    done = committed[:max(len(committed) - pending, 0)]
    groups_of[t] = committed[len(done):] + [open_group]
    return done


def _complete(ctx, proxy, group: list[tuple]) -> None:
    """The global writes of a group of tma_stores are complete: no longer in flight, and written (for the
    happens-before check) at this block's current release count."""
    for op, written in group:
        for address in written:
            proxy.writing.pop(address, None)
        happens_before.completed(ctx, op, written)


@simt("bulk_wait_group_read")
def _bulk_wait_group_read(ctx, op):
    proxy, pending = _proxy(ctx), op.attrs["pending"]
    for t in _active(ctx).tolist():
        for group in _retire(proxy.store_groups, t, pending):
            for addrs in group:
                proxy.store_reads[addrs] -= 1
                ctx.shared.record_retired_read(addrs, t)     # the others write them after a barrier with t


def finish_block(block) -> None:
    """At the end of a block: tma_stores no bulk_wait_group_read retired are an error (the GPU may still be
    reading the shared memory the block gives up); global writes no full wait completed complete now, after
    every release of the block."""
    proxy = block.shared.async_proxy
    if proxy is None:
        return
    for groups in proxy.store_writes.values():
        for group in groups:
            _complete(block, proxy, group)
    proxy.store_writes.clear()
    if not proxy.store_groups:
        return
    for t, groups in proxy.store_groups.items():
        left = sum(len(g) for g in groups)
        if left:
            uncommitted = len(groups[-1])
            how = ("bulk_commit_group, then " if uncommitted else "") + "bulk_wait_group_read {pending = 0}"
            raise InterpreterError(f"{left} tma_store copies of thread {t} never waited for: the kernel ends while "
                                   f"they may still read shared memory; add {how} before it returns",
                                   kernel=block.fn.name, program_id=block.program_id)
