"""Memory scopes between blocks in the SIMT simulator: a release and an acquire that cannot synchronize.

Blocks run one at a time here, so every global access is ordered and a
handoff between blocks always "works"; on a GPU it works only when the
release (a `store_release`, an atomic) and the acquire that reads its value
(a `load_acquire`, an atomic) are each in the other's scope (PTX: "morally
strong"): "cta" holds the threads of one block, "cluster" those of one
thread-block cluster, "gpu" and "sys" every block of the launch. A "cta"
pair between two blocks is a data race on the flag itself, and hands over
nothing written before it.

So each ordered write to global memory records its block, cluster and
scope at the element's byte address (a plain store there forgets it), and
each ordered read of an element another block wrote that way checks that
both scopes hold both blocks, else it raises InterpreterError naming both
ops, their source lines and the fix. Kernels whose ordered ops are all at
"gpu" or "sys" scope cannot fail the check and skip the bookkeeping.

Not modelled: ordering through plain (relaxed) accesses, and distributed
shared memory between the blocks of a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.ir.core import Operation
from tessera.ir.ops import OPS, scope_of

from ..interp.storage import Memory
from ..interp.values import Pointers
from .cluster import cluster_dims
from .shared import SharedRegion

_NARROW = ("cta", "cluster")          # the scopes that leave some blocks of the launch out


@dataclass(frozen=True)
class _Access:
    """An ordered access: the block and cluster it ran in, its scope and its op."""

    block: tuple[int, int, int]
    cluster: tuple[int, ...]
    scope: str
    op: Operation


def new_record(fn) -> dict[int, _Access] | None:
    """A launch's record of ordered writes (byte address -> writer), or None when no op of kernel `fn` has a
    narrow scope (then no pair can fail the check)."""
    narrow = any(op.name in OPS and OPS[op.name].orders_programs and scope_of(op) in _NARROW for op in fn.walk())
    return {} if narrow else None


def _cluster_of(ctx) -> tuple[int, ...]:
    return tuple(p // d for p, d in zip(ctx.program_id, cluster_dims(ctx.fn)))


def global_addresses(ptr: Pointers, live) -> list[int] | None:
    """Byte addresses of the live lanes' elements, or None for memory this check does not follow (shared
    memory, packed sub-byte elements). Shared memory is each block's own and is freed when the block ends, so
    numpy may hand the same bytes to a later block: its addresses name no element of the launch."""
    memory = ptr.memory
    if not isinstance(memory, Memory) or isinstance(memory, SharedRegion) or memory.dtype.is_subbyte:
        return None
    offsets = ptr.offsets if live is None else ptr.offsets[np.broadcast_to(live, ptr.offsets.shape)]
    base = memory.array.__array_interface__["data"][0]
    return (base + np.asarray(offsets, dtype=np.int64).reshape(-1) * (memory.dtype.bits // 8)).tolist()


def _holds(a: _Access, b: _Access) -> bool:
    """Whether `a`'s scope holds `b`'s thread."""
    if a.scope == "cta":
        return a.block == b.block
    if a.scope == "cluster":
        return a.cluster == b.cluster
    return True


def observe(ctx, op: Operation, ptr: Pointers, live) -> None:
    """Before an ordered read (`load_acquire`, an atomic) of `ptr`'s live lanes: each element another block
    last wrote with an ordered write must be one this read synchronizes with."""
    writes = ctx.launch.scoped
    if not writes:
        return
    addresses = global_addresses(ptr, live)
    if addresses is None:
        return
    me = _Access(tuple(ctx.program_id), _cluster_of(ctx), scope_of(op), op)
    for address in addresses:
        writer = writes.get(address)
        if writer is None or writer.block == me.block:
            continue
        if not (_holds(writer, me) and _holds(me, writer)):
            raise ctx.error(op, _message(me, writer, ptr))


def record(ctx, op: Operation, ptr: Pointers, live) -> None:
    """After a write of `ptr`'s live lanes: an ordered one (`store_release`, an atomic) is remembered with its
    block and scope, a plain one forgets what was there."""
    writes = ctx.launch.scoped
    if writes is None or (not writes and not OPS[op.name].orders_programs):
        return
    addresses = global_addresses(ptr, live)
    if addresses is None:
        return
    if OPS[op.name].orders_programs:
        writer = _Access(tuple(ctx.program_id), _cluster_of(ctx), scope_of(op), op)
        writes.update(dict.fromkeys(addresses, writer))
    else:
        for address in addresses:
            writes.pop(address, None)


def _where(op: Operation) -> str:
    return f" at {op.loc}" if op.loc is not None else ""


def _message(reader: _Access, writer: _Access, ptr: Pointers) -> str:
    name = ptr.memory.name or "memory"
    narrow = writer if not _holds(writer, reader) else reader
    holds = "its own block" if narrow.scope == "cta" else "the blocks of its own cluster"
    same_cluster = writer.cluster == reader.cluster
    fix = "scope='cluster' (the blocks share a cluster) or 'gpu' (the default)" if same_cluster else \
        "scope='gpu' (the default)"
    return (f"scope race: this {reader.op.name} (scope {reader.scope!r}) in block {reader.block} reads '{name}' "
            f"that block {writer.block} wrote with {writer.op.name} (scope {writer.scope!r}){_where(writer.op)}; "
            f"a release and an acquire synchronize only when each one's scope holds the other's thread, and scope "
            f"{narrow.scope!r} holds {holds}, so nothing is handed over (on a GPU the flag itself is a data race). "
            f"Use {fix} on both sides")
