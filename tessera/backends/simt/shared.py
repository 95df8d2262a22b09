"""Shared memory of one simulated block, and the data-race check between barriers.

Each block gets `shared_bytes` bytes, filled with 0xFF (NaN for floats, -1
for integers), so that reading shared memory nobody wrote shows up as
garbage rather than as plausible zeros. `shared_alloc {offset, bytes}`
views bytes [offset, offset + bytes) as a `SharedRegion`: a `Memory` of the
pointer's element type, so loads and stores go through the same code as
global memory. Pointer offsets count elements from the region's start; an
access outside the region is out of bounds.

Races. Between two barriers the threads of a block run in no defined order,
so every byte keeps who wrote it (and the value) and who read it since the
last barrier, and an access is reported when its outcome depends on that
order:

* two different threads write different values to a byte (several threads
  writing one value is benign: replicated layouts do it);
* a thread reads a byte another thread wrote, or writes a byte another
  thread read.

A tma_store's reads count as its issuing thread's once its
bulk_wait_group_read retires them (`record_retired_read`): the other
threads may overwrite the buffer only after a barrier with that thread.

A wgmma's reads (`record_warpgroup_read`) belong to its warpgroup as a
whole: once a wgmma_wait of that warpgroup has retired it, any thread of the
warpgroup may release them (an mbarrier arrive, a named barrier), as
CUTLASS's one arrival per consumer warpgroup does; overwriting them before
the wgmma retires is the wgmma checks' to report (`wgmma.py`).

Asynchronous copies (`async_copy`, cp.async) are queued per thread in
groups: their bytes land in shared memory only when an `async_wait` retires
their group, and until then any read or write of those bytes is an error, as
the hardware may still be writing them. Copies never waited for are an
error at the end of the kernel.

Atomics are not tracked. Sub-byte elements are tracked at the byte holding
them: two threads writing different elements of one byte race, as the
read-modify-write byte stores that implement them would.
"""

from __future__ import annotations

import numpy as np

from tessera.ir.dtypes import DType

from ..interp.storage import Memory

POISON = 0xFF
_NONE = -1  # no thread
WARPGROUP_THREADS = 128
_ADVICE = (" (missing barrier?); add a `barrier` between the two accesses (between threads of different paths "
           "of a warp-specialized kernel: an mbarrier the first arrives on and the second waits on, or a "
           "named_barrier)")
_ASYNC_ADVICE = "read of shared memory before cp.async.wait_group: add async_wait"


class SharedRegion(Memory):
    """Bytes [offset, offset + nbytes) of a block's shared memory, as elements of `dtype`."""

    def __init__(self, shared: "SharedMemory", offset: int, nbytes: int, dtype: DType):
        raw = shared.bytes[offset:offset + nbytes]
        if not dtype.is_subbyte:
            size = dtype.bits // 8
            raw = raw[:nbytes // size * size].view(dtype.storage_dtype)
        super().__init__(raw, dtype, name=f"the shared_alloc at byte {offset} ({nbytes} bytes)")
        self.shared = shared
        self.byte_offset = offset


class SharedMemory:
    """One block's shared-memory bytes and who touched them since the last barrier."""

    def __init__(self, nbytes: int):
        self.size = nbytes
        self.bytes = np.full(nbytes, POISON, dtype=np.uint8)
        self._regions: dict[tuple[int, int, DType], SharedRegion] = {}
        # Per byte, since the last barrier: lowest and highest writer, the value
        # last written, lowest and highest reader (_NONE when nobody).
        self._writer_lo = np.full(nbytes, _NONE, dtype=np.int32)
        self._writer_hi = np.full(nbytes, _NONE, dtype=np.int32)
        self._written = np.zeros(nbytes, dtype=np.int32)
        self._reader_lo = np.full(nbytes, _NONE, dtype=np.int32)
        self._reader_hi = np.full(nbytes, _NONE, dtype=np.int32)
        self._dirty = False
        # Per byte, since the last barrier: bit g set when a wgmma of warpgroup g read it (`record_warpgroup_read`)
        self._group_reads = np.zeros(nbytes, dtype=np.uint64)
        # Asynchronous copies: per byte, how many in-flight copies target it; per
        # in-flight copy (thread, group, byte addresses, bytes); per thread, groups committed.
        self._pending = np.zeros(nbytes, dtype=np.int32)
        self._copies: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self._committed: dict[int, int] = {}
        self.async_proxy = None  # mbarriers and TMA copies in flight (mbarrier.AsyncProxy), made on first use

    def region(self, offset: int, nbytes: int, dtype: DType) -> SharedRegion:
        key = (offset, nbytes, dtype)
        region = self._regions.get(key)
        if region is None:
            region = self._regions[key] = SharedRegion(self, offset, nbytes, dtype)
        return region

    def barrier(self) -> None:
        """Every access so far is ordered before every access after."""
        if self._dirty:
            for track in (self._writer_lo, self._writer_hi, self._reader_lo, self._reader_hi):
                track.fill(_NONE)
            self._group_reads.fill(0)
            self._dirty = False

    def order_after(self, threads: np.ndarray, releasing: np.ndarray | None = None) -> None:
        """Accesses so far by `threads` (ids) are ordered before the accesses of whoever synchronized with them
        (an observed mbarrier phase they arrived on, a named barrier): forget the bytes only they touched. The
        wgmma reads of the warpgroups of `releasing` (default: `threads`) count as done too (a thread that
        only arrived at a barrier, `bar.arrive`, may have wgmmas in flight)."""
        if not self._dirty or threads.size == 0:
            return
        groups = np.unique((threads if releasing is None else releasing) // WARPGROUP_THREADS)
        self._group_reads &= ~np.uint64(sum(1 << int(g) for g in groups))     # a member releases its group's wgmmas
        touched = np.flatnonzero((self._writer_lo != _NONE) | (self._reader_lo != _NONE))
        member = np.zeros(max(int(threads.max()), int(self._writer_hi[touched].max(initial=0)),
                              int(self._reader_hi[touched].max(initial=0))) + 1, np.int64)
        member[threads] = 1
        count = np.concatenate([[0], np.cumsum(member)])

        def only_them(lo, hi):   # every thread of lo..hi is one of `threads` (or nobody)
            return (lo == _NONE) | (count[hi + 1] - count[np.maximum(lo, 0)] == hi - lo + 1)

        forget = touched[only_them(self._writer_lo[touched], self._writer_hi[touched])
                         & only_them(self._reader_lo[touched], self._reader_hi[touched])]
        for track in (self._writer_lo, self._writer_hi, self._reader_lo, self._reader_hi):
            track[forget] = _NONE

    # -- recording accesses ---------------------------------------------------

    def record_read(self, region: SharedRegion, threads: np.ndarray, offsets: np.ndarray) -> str | None:
        """Note that `threads` read elements `offsets` of `region`; a race description or None."""
        addrs, threads, _ = _bytes_touched(region, threads, offsets, None)
        if addrs.size == 0:
            return None
        addrs, lo, hi, _, _ = _group(addrs, threads, None)
        in_flight = self._in_flight(addrs, lo, "reads", region)
        if in_flight:
            return in_flight
        wlo, whi = self._writer_lo[addrs], self._writer_hi[addrs]
        clash = (wlo != _NONE) & ~((wlo == whi) & (lo == wlo) & (hi == wlo))
        if clash.any():
            i = int(np.argmax(clash))
            reader, writer = _distinct(lo[i], hi[i], wlo[i], whi[i])
            return (f"thread {reader} reads {_where(region, addrs[i])}, which thread {writer} wrote since "
                    f"the last barrier{_ADVICE}")
        self._merge(self._reader_lo, self._reader_hi, addrs, lo, hi)
        return None

    def record_retired_read(self, addrs: np.ndarray, thread: int) -> None:
        """Note that `thread` has read byte addresses `addrs`: a tma_store it issued, whose read its
        bulk_wait_group_read has just retired. The read is ordered before the thread's next op only, so
        another thread writing those bytes before a barrier with it races (`tma_store.py`)."""
        addrs = np.unique(addrs)
        threads = np.full(addrs.size, thread, dtype=np.int64)
        self._merge(self._reader_lo, self._reader_hi, addrs, threads, threads)

    def record_warpgroup_read(self, addrs: np.ndarray, group: int) -> str | None:
        """Note that a wgmma of warpgroup `group` reads byte addresses `addrs`; a race description or None."""
        busy = self._in_flight(addrs, np.full(addrs.size, group * WARPGROUP_THREADS), "reads", None)
        if busy:
            return busy
        wlo = self._writer_lo[addrs]
        if (wlo != _NONE).any():
            i = int(np.argmax(wlo != _NONE))
            return (f"warpgroup {group}'s wgmma reads shared byte {int(addrs[i])}, which thread {int(wlo[i])} wrote "
                    f"since the last barrier{_ADVICE}")
        self._group_reads[addrs] |= np.uint64(1 << group)
        self._dirty = True
        return None

    def record_write(self, region: SharedRegion, threads: np.ndarray, offsets: np.ndarray,
                     values: np.ndarray) -> str | None:
        """Note that `threads` wrote `values` at elements `offsets` of `region`; a race description or None."""
        addrs, threads, byte_values = _bytes_touched(region, threads, offsets, values)
        if addrs.size == 0:
            return None
        addrs, lo, hi, vlo, vhi = _group(addrs, threads, byte_values)
        in_flight = self._in_flight(addrs, lo, "writes", region)
        if in_flight:
            return in_flight
        torn = (lo != hi) & (vlo != vhi)
        if torn.any():
            i = int(np.argmax(torn))
            return (f"threads {lo[i]} and {hi[i]} write different values to {_where(region, addrs[i])} "
                    "in the same store, so which one lands is undefined; give each address one writer")
        return self._write_grouped(addrs, lo, hi, vlo, lambda a: _where(region, a))

    def _write_grouped(self, addrs, lo, hi, vlo, where, merge: bool = True) -> str | None:
        """The race check and bookkeeping of a write of bytes `addrs` by threads lo..hi with values `vlo`."""
        wlo, whi = self._writer_lo[addrs], self._writer_hi[addrs]
        one_thread = (lo == hi) & (wlo == whi) & (wlo == lo)
        clash = (wlo != _NONE) & ~one_thread & (self._written[addrs] != vlo)
        if clash.any():
            i = int(np.argmax(clash))
            writer, other = _distinct(lo[i], hi[i], wlo[i], whi[i])
            return (f"thread {writer} writes {where(addrs[i])}, which thread {other} wrote with a "
                    f"different value since the last barrier{_ADVICE}")
        own = np.where(lo // WARPGROUP_THREADS == hi // WARPGROUP_THREADS,
                       np.left_shift(np.uint64(1), (lo // WARPGROUP_THREADS).astype(np.uint64)), np.uint64(0))
        other = self._group_reads[addrs] & ~own     # a warpgroup's own thread waited for its wgmmas itself
        if other.any():
            i = int(np.argmax(other != 0))
            group = int(other[i]).bit_length() - 1
            return (f"thread {int(lo[i])} writes {where(addrs[i])}, which a wgmma of warpgroup {group} read since "
                    f"the last barrier and no thread of that warpgroup released{_ADVICE}")
        rlo, rhi = self._reader_lo[addrs], self._reader_hi[addrs]
        clash = (rlo != _NONE) & ~((rlo == rhi) & (lo == rlo) & (hi == rlo))
        if clash.any():
            i = int(np.argmax(clash))
            writer, reader = _distinct(lo[i], hi[i], rlo[i], rhi[i])
            return (f"thread {writer} writes {where(addrs[i])}, which thread {reader} read since "
                    f"the last barrier{_ADVICE}")
        if merge:
            self._merge(self._writer_lo, self._writer_hi, addrs, lo, hi)
            self._written[addrs] = vlo
        return None

    def _in_flight(self, addrs, threads, verb: str, region: SharedRegion | None) -> str | None:
        if self.async_proxy is not None:
            place = (lambda a: _where(region, a)) if region is not None else (lambda a: f"shared byte {int(a)}")
            in_tma = self.async_proxy.describe_in_flight(addrs, threads, verb, place)
            if in_tma:
                return in_tma
        busy = self._pending[addrs] > 0
        if not busy.any():
            return None
        i = int(np.argmax(busy))
        place = _where(region, addrs[i]) if region is not None else f"shared byte {int(addrs[i])}"
        return (f"{_ASYNC_ADVICE} (thread {int(threads[i])} {verb} {place}, which an async_copy not yet "
                "retired by an async_wait is writing)")

    # -- asynchronous copies --------------------------------------------------

    def async_issue(self, threads: np.ndarray, addrs: np.ndarray, data: np.ndarray) -> str | None:
        """Queue copies: thread threads[i] writes bytes data[i] at byte addresses addrs[i] when its group retires."""
        flat, owners = addrs.reshape(-1), np.repeat(threads, addrs.shape[1])
        unique, lo, hi, vlo, vhi = _group(flat, owners, data.reshape(-1).astype(np.int64))
        in_flight = self._in_flight(unique, lo, "copies to", None)
        if in_flight:
            return in_flight
        if unique.size < flat.size:
            return "two async_copy ops in flight write the same shared bytes; give each byte one copy per wait"
        # The copy may land at any moment from now: it must not race with other threads' accesses.
        race = self._write_grouped(unique, lo, hi, vlo, lambda a: f"shared byte {int(a)}", merge=False)
        if race:
            return race
        for t, a, d in zip(threads.tolist(), addrs, data):
            self._copies.append((t, self._committed.get(t, 0), a, d))
        self._pending[flat] += 1
        return None

    def async_commit(self, threads: np.ndarray) -> None:
        for t in threads.tolist():
            self._committed[t] = self._committed.get(t, 0) + 1

    def async_wait(self, threads: np.ndarray, pending: int) -> str | None:
        """Land the copies of `threads`' groups older than their newest `pending` committed ones."""
        limit = {t: self._committed.get(t, 0) - pending for t in threads.tolist()}
        done = [c for c in self._copies if c[0] in limit and c[1] < limit[c[0]]]
        if not done:
            return None
        self._copies = [c for c in self._copies if not (c[0] in limit and c[1] < limit[c[0]])]
        addrs = np.concatenate([c[2] for c in done])
        data = np.concatenate([c[3] for c in done])
        owners = np.concatenate([np.full(c[2].size, c[0]) for c in done])
        self._pending[addrs] -= 1
        self.bytes[addrs] = data
        unique, lo, hi, vlo, _ = _group(addrs, owners, data.astype(np.int64))
        return self._write_grouped(unique, lo, hi, vlo, lambda a: f"shared byte {int(a)}")

    def async_pending(self, addrs: np.ndarray) -> np.ndarray:
        """Which of the byte addresses `addrs` an async_copy not yet retired is writing."""
        return self._pending[addrs] > 0

    def async_outstanding(self) -> int:
        """How many async copies are still in flight."""
        return len(self._copies)

    def _merge(self, lo_track, hi_track, addrs, lo, hi) -> None:
        old_lo, old_hi = lo_track[addrs], hi_track[addrs]
        lo_track[addrs] = np.where(old_lo == _NONE, lo, np.minimum(old_lo, lo))
        hi_track[addrs] = np.maximum(old_hi, hi)
        self._dirty = True


def _bytes_touched(region: SharedRegion, threads, offsets, values):
    """(byte address, thread, value key) for every byte the accesses touch, flat."""
    dtype = region.dtype
    offsets = offsets.astype(np.int64).reshape(-1)
    threads = threads.astype(np.int64).reshape(-1)
    if dtype.is_subbyte:
        bit = region.byte_offset * 8 + offsets * dtype.bits
        keys = None
        if values is not None:  # which bits of the byte, and their pattern
            keys = ((bit & 7) << 8) | dtype.encode(values.reshape(-1)).astype(np.int64)
        return bit >> 3, threads, keys
    size = dtype.bits // 8
    addrs = (region.byte_offset + offsets * size)[:, None] + np.arange(size)
    keys = None
    if values is not None:
        patterns = dtype.encode(values.reshape(-1)).astype(f"<u{size}")
        keys = patterns.view(np.uint8).reshape(-1, size).astype(np.int64).reshape(-1)
    return addrs.reshape(-1), np.repeat(threads, size), keys


def _group(addrs, threads, values):
    """Per distinct address: lowest and highest thread, lowest and highest value."""
    unique, inverse = np.unique(addrs, return_inverse=True)
    n = unique.size
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, _NONE, dtype=np.int64)
    np.minimum.at(lo, inverse, threads)
    np.maximum.at(hi, inverse, threads)
    vlo = vhi = None
    if values is not None:
        vlo = np.full(n, np.iinfo(np.int64).max)
        vhi = np.full(n, np.iinfo(np.int64).min)
        np.minimum.at(vlo, inverse, values)
        np.maximum.at(vhi, inverse, values)
    return unique, lo, hi, vlo, vhi


def _distinct(lo, hi, other_lo, other_hi) -> tuple[int, int]:
    """A thread of the first group and a different one of the second."""
    for mine in (int(lo), int(hi)):
        for theirs in (int(other_lo), int(other_hi)):
            if mine != theirs:
                return mine, theirs
    return int(lo), int(other_lo)


def _where(region: SharedRegion, addr) -> str:
    element = (int(addr) - region.byte_offset) * 8 // region.dtype.bits
    return f"shared byte {int(addr)} (element {element} of {region.name})"
