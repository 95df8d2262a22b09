"""Data races between blocks in global memory, checked when asked (`run_threads(..., global_races=True)`).

Blocks run one after another here, so a block always sees what earlier blocks wrote; on a GPU it sees another
block's plain writes only through synchronization: that block's release after the writes (a `store_release`, an
atomic), read by this block's acquire before its access (a `load_acquire`, an atomic). So each block keeps a
vector clock (its own count of releases, and the counts of the blocks it has acquired from): a release publishes
the block's clock at its addresses and ticks its own count; an acquire joins what was published there. A plain
access to an element that another block last wrote (an ordered op meeting an ordered write excepted) at a count
this block has not acquired raises InterpreterError naming both ops and the fix. A tma_store's writes count when
its issuing thread's full wait completes them (`tma_store.py`), so only a release after that wait publishes them.
Not followed: one block's own threads (a block is one unit: the lowering puts a barrier before a program's ordered
op), write-after-read, and other copies by TMA or cp.async. Scopes narrower than the GPU are `scopes.py`'s check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.ir.core import Operation
from tessera.ir.ops import OPS

from ..interp.values import Pointers
from .scopes import global_addresses

_ACQUIRES = frozenset({"load_acquire", "atomic_rmw", "atomic_cas"})
_RELEASES = frozenset({"store_release", "atomic_rmw", "atomic_cas"})


@dataclass
class Clocks:
    """One launch's happens-before state."""

    clock: dict[tuple, dict[tuple, int]] = field(default_factory=dict)     # block -> its vector clock
    published: dict[int, dict[tuple, int]] = field(default_factory=dict)  # address -> what releases there published
    writes: dict[int, tuple[tuple, int, Operation]] = field(default_factory=dict)  # address -> (block, count, op)

    def of(self, block: tuple) -> dict[tuple, int]:
        return self.clock.setdefault(block, {block: 1})


def _join(into: dict, other: dict) -> None:
    for block, count in other.items():
        if into.get(block, 0) < count:
            into[block] = count


def _tracked(ctx, ptr: Pointers, live):
    """(clocks, the global addresses of `ptr`'s live lanes, this block, its clock), or None when the launch does
    not check happens-before or the pointers are not global memory."""
    clocks: Clocks | None = ctx.launch.happens_before
    if clocks is None:
        return None
    addresses = global_addresses(ptr, live)
    if addresses is None:
        return None
    me = tuple(ctx.program_id)
    return clocks, addresses, me, clocks.of(me)


def before(ctx, op: Operation, ptr: Pointers, live) -> None:
    """Before `op` touches `ptr`'s live lanes: none is one this block's tma_store may still be writing; then, when
    the launch checks happens-before, acquire (if `op` does) and check each element's last writer."""
    proxy = ctx.shared.async_proxy
    if proxy is not None and proxy.writing:
        addresses = global_addresses(ptr, live)
        if addresses is not None:
            _check_not_writing(ctx, op, proxy.writing, addresses)
    tracked = _tracked(ctx, ptr, live)
    if tracked is None:
        return
    clocks, addresses, me, mine = tracked
    if op.name in _ACQUIRES:
        for address in addresses:
            published = clocks.published.get(address)
            if published:
                _join(mine, published)
    ordered = OPS[op.name].orders_programs
    for address in addresses:
        last = clocks.writes.get(address)
        if last is None or last[0] == me or (ordered and OPS[last[2].name].orders_programs):
            continue
        if mine.get(last[0], 0) < last[1]:
            raise ctx.error(op, _message(op, me, last, ptr))


def after(ctx, op: Operation, ptr: Pointers, live) -> None:
    """After `op` wrote `ptr`'s live lanes: remember the writer, and for a release publish the block's clock."""
    tracked = _tracked(ctx, ptr, live) if OPS[op.name].writes_memory else None
    if tracked is None:
        return
    clocks, addresses, me, mine = tracked
    writer = (me, mine[me], op)
    for address in addresses:
        clocks.writes[address] = writer
    if op.name in _RELEASES:
        for address in addresses:
            _join(clocks.published.setdefault(address, {}), mine)
        mine[me] += 1


def _check_not_writing(ctx, op: Operation, writing: dict, addresses: list[int]) -> None:
    """Before a load, store or atomic of global byte `addresses`: none may be one a tma_store of this block is
    still writing (`tma_store.py`: its issuing thread has not waited with bulk_wait_group, the full wait)."""
    hit = next((a for a in addresses if a in writing), None)
    if hit is not None:
        store = writing[hit]
        where = f" at {store.loc}" if store.loc is not None else ""
        raise ctx.error(op, f"global-memory race: this {op.name} touches memory that the tma_store{where} may "
                            f"still be writing: bulk_wait_group_read (cp.async.bulk.wait_group.read) waits only "
                            f"for its reads of shared memory; its issuing thread must wait with bulk_wait_group "
                            f"(cp.async.bulk.wait_group, the full wait), then a barrier, before any thread "
                            f"touches what it wrote")


def completed(ctx, op: Operation, addresses: list[int]) -> None:
    """The global writes of tma_store `op` at `addresses` are complete (its issuing thread's full wait, or the
    block's end): they count as this block's writes at its current release count."""
    clocks: Clocks | None = ctx.launch.happens_before
    if clocks is None:
        return
    me = tuple(ctx.program_id)
    writer = (me, clocks.of(me)[me], op)
    for address in addresses:
        clocks.writes[address] = writer


def _message(op: Operation, reader: tuple, last: tuple, ptr: Pointers) -> str:
    writer_block, _, writer_op = last
    where = f" at {writer_op.loc}" if writer_op.loc is not None else ""
    return (f"global-memory race: this {op.name} in block {reader} touches '{ptr.memory.name or 'memory'}' that "
            f"block {writer_block} wrote with {writer_op.name}{where}, and nothing orders the two: no release of "
            f"block {writer_block} after its write was acquired by this block before this access. Publish the "
            f"write with a release (tessera.store(flag, 1, sem='release') or an atomic) and read the flag with an "
            f"acquire (tessera.load(flag, sem='acquire') or an atomic) before touching the data")
