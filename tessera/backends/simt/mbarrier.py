"""mbarriers and TMA box copies in the SIMT simulator (sm_90 `mbarrier.*`, `cp.async.bulk.tensor`).

Each mbarrier the kernel initializes is an `MBarrier` keyed by its shared
byte address, holding what PTX says the hardware holds: the expected
arrival count, the arrivals still pending in the current phase, the
transaction bytes still expected (tx-count) and the current phase. A phase
completes when pending arrivals and tx-count are both zero; the barrier then
re-arms (pending = expected) and the phase number goes up by one, flipping
its parity.

A `tma_load` is executed when it is issued: the box is read from the
tensor map's array (out-of-bounds elements as zeros), written to shared
memory (swizzled as the map says), and its bytes are subtracted from the
barrier's tx-count. That is one legal schedule of the asynchronous copy
(it finished at once), and the only one a program can tell apart from
others through reads, so those are checked instead: the destination bytes
stay *in flight* until a thread's `mbarrier_wait` observes the completion
of the phase that counted them, and any access to them before that is
reported, as are copies never waited for when the block ends.

`mbarrier_wait` for parity p returns when the current phase's parity is not
p (the phase with parity p completed). A wait whose phase is incomplete
lets the other paths of a warp-specialized block run (`paths.py`:
the producer and consumer sides of a divergent `if` are scheduled
cooperatively; an arriving path also gives way, so that waiters run as
early as they could) until the phase completes; when no path can run, or the
waiting threads are all there is (copies have already landed), it is a
DEADLOCK naming the barrier, the phase, the arrivals seen and expected and
the transaction bytes outstanding, for every blocked path. Waits
that return at once for the wrong reason are reported as phase errors:
waiting for parity 1 before any phase completed (the wait does not wait),
or for a phase this thread has already seen complete (the parity was not
flipped when the barrier was reused).

Also checked: use of an mbarrier before it is initialized, or by other
threads before a `barrier` orders the init before them (the init counts as
a write of the barrier's 8 bytes, every other use as a read, through the
shared-memory race check); a `tma_load` on a barrier whose init was not
fenced for the async proxy; more arrivals than a phase expects; tx-count
out of PTX's range; misaligned destinations; destinations of another
element size than the map's.

A wait that observes a phase orders what the threads that arrived in
that phase did before (their shared-memory accesses) before what the
waiting threads do next (`SharedMemory.order_after`): that is how a
consumer's release lets the producer refill a stage. An arrival from a
cluster peer (`mbarrier_arrive_cluster`) orders the arriving threads'
accesses of their own block's shared memory the same way, before the
waiter's multicast writes into it. The ordering is
approximate: bytes whose accessors since the last `barrier` all arrived
are forgotten by the race check, including accesses an arriving thread
made after it arrived.

Limits of the model: threads of one loop run in lockstep, so a wait in a
loop only some threads still run cannot be helped by the threads that
left it (a divergent `if` is what splits a block into paths). Visibility
of landed bytes to threads that did not wait themselves is not checked.
Waits that differ in barrier or parity between threads of one lockstep
wait are rejected. im2col is not modelled; TMA stores are `tma_store.py`'s,
multicast and remote arrivals across a cluster `cluster.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.core import Function
from tessera.ir.tensor_map import UNBOUNDED, TensorMapDescription, TensorMapError, kernel_recipes, swizzle_offsets

from ..interp.errors import InterpreterError
from ..interp.storage import Memory
from ..interp.values import Pointers
from . import wgmma
from .ops import simt
from .cluster import peer_block
from .paths import let_others_run, span, wait_until
from .shared import SharedRegion

TX_LIMIT = 2 ** 20 - 1          # PTX: tx-count and arrival counts lie in [-(2^20 - 1), 2^20 - 1]
MBARRIER_BYTES = 8


class TensorMapMemory(Memory):
    """A tensor-map parameter in the simulator: 128 bytes of 'global memory' standing for the encoded
    CUtensorMap, and the `TensorMapDescription` the simulator copies boxes with."""

    def __init__(self, description: TensorMapDescription, name: str | None = None):
        super().__init__(np.zeros(128, np.int8), dt.i8, name=name)
        self.description = description

    def named(self, name: str) -> "TensorMapMemory":
        return TensorMapMemory(self.description, name)


def as_argument(value):
    """A kernel argument for the simulator: a TensorMapDescription becomes its TensorMapMemory."""
    return TensorMapMemory(value) if isinstance(value, TensorMapDescription) else value


def with_tensor_maps(fn: Function, args: list) -> list:
    """`args`, completed with the maps of the compiler-added `tensormap` parameters when the caller passed only
    the kernel's own arguments: each built from its recipe (`tessera.ir.tensor_map.TensorMapRecipe`, as a GPU
    launch builds it) over the pointer argument's array."""
    recipes = kernel_recipes(fn.attrs)
    if not recipes or len(args) != len(fn.args) - len(recipes):
        return list(args)
    args = list(args)
    for recipe in sorted(recipes, key=lambda r: r.param):
        args.insert(recipe.param, _describe(fn, recipe, args))
    return args


def _describe(fn: Function, recipe, args: list) -> TensorMapDescription:
    name = fn.args[recipe.pointer].name_hint
    array = args[recipe.pointer]
    array = array.array if isinstance(array, Memory) else array
    if not isinstance(array, np.ndarray):
        raise InterpreterError(f"argument '{name}' must be a numpy array (a tensor map describes it)", kernel=fn.name)
    flat = array.reshape(-1).view(np.uint8)
    try:
        desc = recipe.describe(args, array.ctypes.data)
    except TensorMapError as e:
        raise InterpreterError(f"the tensor map of argument '{name}': {e}", kernel=fn.name) from None
    desc, narrowed = _narrowed(desc, recipe, flat.size)
    reach = sum((n - 1) * s for n, s in zip(desc.shape, desc.strides)) + desc.element_bytes
    writeback = None
    if recipe.is_empty(args):           # nothing to read: its boxes land as zeros, as the view's mask says
        flat = np.zeros(reach, np.uint8)
    elif narrowed and reach > flat.size:    # each unbounded dim reaches the array's end on its own, not together
        writeback = flat if flat.flags.writeable else None      # a tma_store writes through to the argument
        flat = np.concatenate([flat, np.zeros(reach - flat.size, np.uint8)])
    if reach > flat.size:
        raise InterpreterError(f"the tensor map of argument '{name}' spans {reach} bytes, but the array holds "
                               f"{flat.size}", kernel=fn.name)
    if array.dtype.itemsize != desc.element_bytes:
        raise InterpreterError(f"argument '{name}' holds {array.dtype.itemsize}-byte elements, its tensor map "
                               f"{desc.dtype.name}", kernel=fn.name)
    # writable (for tma_store) where it is the argument's own memory or a padded copy written through to it
    # (`writeback`), not where it is a zero-filled stand-in
    own = np.shares_memory(flat, array) or writeback is not None
    source = np.lib.stride_tricks.as_strided(flat.view(array.dtype), desc.shape, desc.strides,
                                             writeable=flat.flags.writeable and own)
    return TensorMapDescription(desc.global_address, desc.dtype, desc.shape, desc.strides, desc.box_shape,
                                desc.swizzle, source=source, writeback=writeback)


@dataclass(eq=False)   # compared by identity: it holds arrays
class BoxCopy:
    """The bytes one tma_load wrote, in flight until a wait observes `phase` of the barrier at `barrier`."""

    barrier: int
    phase: int
    addrs: np.ndarray
    issuer: int


@dataclass
class MBarrier:
    address: int
    expected: int
    init_thread: int
    pending: int = 0
    tx: int = 0
    phase: int = 0
    fenced: bool = False
    cluster_visible: bool = False       # its fenced init was published by a cluster_arrive (`cluster.py`)
    seen: dict[int, int] = field(default_factory=dict)   # thread -> newest phase it saw complete
    arriving: list[int] = field(default_factory=list)    # threads that arrived in the current phase
    arrivers: dict[int, np.ndarray] = field(default_factory=dict)   # completed phase -> who arrived in it
    remote_arriving: list = field(default_factory=list)   # (peer block, thread) arriving from another block
    remote_arrivers: dict[int, list] = field(default_factory=dict)  # completed phase -> those of its arrivals

    def __post_init__(self):
        self.pending = self.expected

    def describe(self) -> str:
        return f"the mbarrier at shared byte {self.address}"

    def complete_if_done(self) -> None:
        """End the phase once every arrival and every transaction byte is in; re-arm for the next."""
        if self.pending == 0 and self.tx == 0:
            self.arrivers[self.phase] = np.unique(np.asarray(self.arriving, np.int64))
            self.arrivers.pop(self.phase - 2, None)
            self.arriving = []
            self.remote_arrivers[self.phase] = self.remote_arriving
            self.remote_arrivers.pop(self.phase - 2, None)
            self.remote_arriving = []
            self.phase += 1
            self.pending = self.expected


class AsyncProxy:
    """One block's mbarriers and the TMA copies still in flight (`SharedMemory.async_proxy`)."""

    def __init__(self, nbytes: int):
        self.barriers: dict[int, MBarrier] = {}
        self.copies: list[BoxCopy] = []
        self.in_flight_bytes = np.zeros(nbytes, dtype=np.int32)
        self.store_reads = np.zeros(nbytes, dtype=np.int32)     # tma_stores reading each byte (`tma_store.py`)
        self.store_groups: dict[int, list[list[np.ndarray]]] = {}   # issuer -> its bulk groups, open one last
        # issuer -> its bulk groups' global writes not yet complete, (tma_store, byte addresses) each, open one
        # last; and every such byte address -> its tma_store (`tma_store.py`)
        self.store_writes: dict[int, list[list[tuple]]] = {}
        self.writing: dict[int, object] = {}

    def describe_in_flight(self, addrs: np.ndarray, threads: np.ndarray, verb: str, place) -> str | None:
        """The hook `SharedMemory` calls before every access: an error if it touches bytes a TMA is writing,
        or writes bytes a tma_store may still be reading."""
        if verb != "reads":
            reading = self.store_reads[addrs] > 0
            if reading.any():
                i = int(np.argmax(reading))
                return (f"thread {int(threads[i])} {verb} {place(int(addrs[i]))}, which a tma_store may still be "
                        "reading: its issuing thread must bulk_commit_group and bulk_wait_group_read (then a "
                        "barrier) before the buffer is rewritten")
        busy = self.in_flight_bytes[addrs] > 0
        if not busy.any():
            return None
        i = int(np.argmax(busy))
        addr = int(addrs[i])
        copy = next(c for c in self.copies if (c.addrs == addr).any())
        what = "read of" if verb == "reads" else "access to"
        return (f"{what} shared memory before the mbarrier_wait that completes its tma_load: thread "
                f"{int(threads[i])} {verb} {place(addr)}, which a tma_load counted on the mbarrier at shared byte "
                f"{copy.barrier} (phase {copy.phase}) is writing; add mbarrier_wait on that barrier for parity "
                f"{copy.phase & 1} first")

    def observe(self, bar: MBarrier, threads: np.ndarray) -> None:
        """`threads` saw phase bar.phase - 1 complete: the copies it counted are now safe to use."""
        done_phase = bar.phase - 1
        for t in threads.tolist():
            bar.seen[t] = done_phase
        landed = [c for c in self.copies if c.barrier == bar.address and c.phase <= done_phase]
        if landed:
            self.copies = [c for c in self.copies if c not in landed]
            for c in landed:
                self.in_flight_bytes[c.addrs] -= 1


def _proxy(ctx) -> AsyncProxy:
    shared = ctx.shared
    if shared.async_proxy is None:
        shared.async_proxy = AsyncProxy(shared.size)
    return shared.async_proxy


def _active(ctx) -> np.ndarray:
    return np.arange(ctx.num_threads) if ctx.mask is None else np.flatnonzero(ctx.mask)


def _addresses(ctx, op, bar: Pointers, threads: np.ndarray) -> np.ndarray:
    """Shared byte addresses of `threads`' mbarrier operands, checked to be 8-byte aligned and in bounds."""
    region = bar.memory
    if not isinstance(region, SharedRegion):
        raise ctx.error(op, f"{op.name}: the mbarrier operand does not point into shared memory")
    offsets = bar.offsets[threads]
    bad = (offsets < 0) | (offsets >= region.size)
    if bad.any():
        raise ctx.error(op, f"{op.name}: thread {int(threads[np.argmax(bad)])}'s mbarrier lies outside {region.name}")
    return region.byte_offset + offsets * MBARRIER_BYTES


def _touch(ctx, op, bar: Pointers, threads: np.ndarray, value=None) -> None:
    """Record the use of the barrier's bytes with the race check: init writes them, everything else reads."""
    region = bar.memory
    if value is None:
        race = region.shared.record_read(region, threads, bar.offsets[threads])
    else:
        race = region.shared.record_write(region, threads, bar.offsets[threads], value)
    if race is not None:
        raise ctx.error(op, f"{op.name}: the mbarrier is used before its initialization is visible to this thread "
                            f"({race}); initialize it in one thread, then `barrier`, then use it")


def _barrier_at(ctx, op, address: int) -> MBarrier:
    bar = _proxy(ctx).barriers.get(address)
    if bar is None:
        raise ctx.error(op, f"{op.name} on the mbarrier at shared byte {address}, which was never initialized: "
                            "add mbarrier_init (in one thread) and a `barrier` before its first use")
    return bar


# -- the ops ---------------------------------------------------------------------------

@simt("mbarrier_init")
def _init(ctx, op, bar, count):
    threads = _active(ctx)
    if threads.size == 0:
        return
    addrs = _addresses(ctx, op, bar, threads)
    for t, address in zip(threads.tolist(), addrs.tolist()):
        expected = int(count[t])
        if not 1 <= expected <= TX_LIMIT:
            raise ctx.error(op, f"mbarrier_init count must be in [1, {TX_LIMIT}], got {expected} (thread {t})")
        if address in _proxy(ctx).barriers:
            raise ctx.error(op, f"mbarrier_init on the mbarrier at shared byte {address}, which is still valid: "
                                "end it with mbarrier_inval first (PTX: initializing a valid mbarrier is undefined)")
        _proxy(ctx).barriers[address] = MBarrier(address, expected, t)
    _touch(ctx, op, bar, threads, np.asarray(count, np.int64)[threads])


@simt("mbarrier_inval")
def _inval(ctx, op, bar):
    threads = _active(ctx)
    if threads.size == 0:
        return
    proxy = _proxy(ctx)
    for address in _addresses(ctx, op, bar, threads).tolist():
        _barrier_at(ctx, op, address)
        if any(c.barrier == address for c in proxy.copies):
            raise ctx.error(op, f"mbarrier_inval on the mbarrier at shared byte {address} while a tma_load it counts "
                                "is in flight: wait for its phase first")
        proxy.barriers.pop(address, None)
    _touch(ctx, op, bar, threads, np.zeros(threads.size, np.int64))


@simt("fence_mbarrier_init")
def _fence_mbarrier_init(ctx, op):
    _publish_barrier_inits(ctx)


@simt("fence_proxy_async_global")
def _fence_proxy_async_global(ctx, op):
    """fence.proxy.async.global: the simulator's global memory has one proxy, so there is nothing to order."""


@simt("fence_proxy_async")
def _fence_proxy_async(ctx, op):
    """fence.proxy.async orders every earlier shared-memory access of the thread before the async proxy:
    mbarrier inits (for TMA) and operand writes (for wgmma) alike."""
    _publish_barrier_inits(ctx)
    wgmma.snapshot_async_view(ctx)


def publish_to_cluster(ctx) -> None:
    """A cluster_arrive: the block's fenced mbarrier inits become visible to its cluster's peers."""
    for bar in _proxy(ctx).barriers.values():
        if bar.fenced:
            bar.cluster_visible = True


def _publish_barrier_inits(ctx) -> None:
    threads = set(_active(ctx).tolist())
    for bar in _proxy(ctx).barriers.values():
        if bar.init_thread in threads:
            bar.fenced = True


@simt("mbarrier_arrive")
def _arrive(ctx, op, bar):
    _arrivals(ctx, op, bar, None)


@simt("mbarrier_arrive_expect_tx")
def _arrive_expect_tx(ctx, op, bar, tx_bytes):
    _arrivals(ctx, op, bar, tx_bytes)


@simt("mbarrier_expect_tx")
def _expect_tx(ctx, op, bar, tx_bytes):
    """Each active thread raises its mbarrier's tx-count, without arriving (the phase cannot complete meanwhile)."""
    threads = _active(ctx)
    if threads.size == 0:
        return
    addrs = _addresses(ctx, op, bar, threads)
    _touch(ctx, op, bar, threads)
    for t, address in zip(threads.tolist(), addrs.tolist()):
        _add_tx(ctx, op, _barrier_at(ctx, op, address), int(tx_bytes[t]))
    let_others_run(ctx, op)


@simt("mbarrier_arrive_cluster")
def _arrive_cluster(ctx, op, bar, cta):
    """Each active thread arrives on the mbarrier at its `bar` offset in block `cta` of the cluster (`cluster.py`);
    an arrival on the block's own barrier is a local one."""
    threads = _active(ctx)
    if threads.size == 0:
        return
    addrs = _addresses(ctx, op, bar, threads)
    for t, address, rank in zip(threads.tolist(), addrs.tolist(), np.asarray(cta)[threads].tolist()):
        target = peer_block(ctx, op, int(rank), "arrives on an mbarrier of")
        b = _remote_barrier(ctx, op, target, address)
        if b.pending == 0:
            raise ctx.error(op, f"thread {t} arrives on {b.describe()} of cluster rank {rank} in phase {b.phase}, "
                                f"whose {b.expected} expected arrivals have all happened: more arrivals than "
                                "mbarrier_init's count is undefined behaviour")
        if target is ctx:
            b.arriving.append(t)
        else:
            b.remote_arriving.append((ctx, t))
        b.pending -= 1
        b.complete_if_done()
    let_others_run(ctx, op)


def _remote_barrier(ctx, op, target, address: int) -> MBarrier:
    """The mbarrier at shared byte `address` of cluster block `target`: initialized, and, in a peer, published
    to the cluster."""
    if target is ctx:
        return _barrier_at(ctx, op, address)
    b = _proxy(target).barriers.get(address)
    if b is None or not b.cluster_visible:
        state = "was never initialized" if b is None else "has an init not yet visible to the cluster"
        raise ctx.error(op, f"{op.name} reaches the mbarrier at shared byte {address} of block {target.program_id} "
                            f"(cluster rank {target.cluster_rank}), which {state}: initialize it there, "
                            "fence_mbarrier_init, then cluster_arrive and cluster_wait in every block before "
                            "peers use it")
    return b


def _arrivals(ctx, op, bar, tx_bytes) -> None:
    threads = _active(ctx)
    if threads.size == 0:
        return
    addrs = _addresses(ctx, op, bar, threads)
    _touch(ctx, op, bar, threads)
    for t, address in zip(threads.tolist(), addrs.tolist()):   # one thread at a time, in thread order
        b = _barrier_at(ctx, op, address)
        if b.pending == 0:
            raise ctx.error(op, f"thread {t} arrives on {b.describe()} in phase {b.phase}, whose {b.expected} "
                                f"expected arrivals have all happened (it still waits for {b.tx} transaction "
                                "bytes): more arrivals than mbarrier_init's count is undefined behaviour")
        if tx_bytes is not None:
            _add_tx(ctx, op, b, int(tx_bytes[t]))
        b.arriving.append(t)
        b.pending -= 1
        b.complete_if_done()
    let_others_run(ctx, op)


def _add_tx(ctx, op, b: MBarrier, delta: int) -> None:
    b.tx += delta
    if abs(b.tx) > TX_LIMIT:
        raise ctx.error(op, f"{b.describe()}: tx-count {b.tx} is outside PTX's range [-{TX_LIMIT}, {TX_LIMIT}]")
    b.complete_if_done()


@simt("mbarrier_wait")
def _wait(ctx, op, bar, parity):
    threads = _active(ctx)
    if threads.size == 0:
        return
    addrs = _addresses(ctx, op, bar, threads)
    parities = np.asarray(parity, np.int64)[threads] & 1
    if (addrs != addrs[0]).any() or (parities != parities[0]).any():
        raise ctx.error(op, "mbarrier_wait: the threads of one lockstep wait differ in barrier or parity; the SIMT "
                            "simulator needs them uniform (use one wait per barrier)")
    _touch(ctx, op, bar, threads)
    b = _barrier_at(ctx, op, int(addrs[0]))
    p = int(parities[0])
    for t in threads.tolist():
        _check_phase(ctx, op, b, t, p)
    if (b.phase & 1) == p:   # not complete yet: other paths may arrive meanwhile (paths.py)
        wait_until(ctx, op, lambda: (b.phase & 1) != p, lambda: _waiting_for(b, p),
                   lambda: _deadlock(ctx, b, p, threads))
        for t in threads.tolist():
            _check_phase(ctx, op, b, t, p)
    _proxy(ctx).observe(b, threads)
    released = b.arrivers.get(b.phase - 1)
    if released is not None:     # what the arriving threads did before arriving is ordered before what we do next
        ctx.shared.order_after(released)
    peers: dict = {}
    for peer, thread in b.remote_arrivers.get(b.phase - 1, ()):     # ... in their own block's shared memory
        peers.setdefault(peer, []).append(thread)                   # too (a cluster peer's release: `cluster.py`)
    for peer, threads_of_peer in peers.items():
        peer.shared.order_after(np.unique(np.asarray(threads_of_peer, np.int64)))


def _check_phase(ctx, op, b: MBarrier, t: int, p: int) -> None:
    """Thread `t` should wait for the next phase it has not seen complete; parity alone cannot name another."""
    n = b.seen.get(t, -1) + 1
    if p != n & 1:
        why = ("no phase has completed yet, so the first wait is for parity 0" if n == 0 else
               f"it already waited for phase {n - 1}, so this wait returns at once instead of waiting for phase "
               f"{n}: flip the parity each time the barrier is reused (parity = use count & 1)")
        raise ctx.error(op, f"phase error: thread {t} waits on {b.describe()} for parity {p}, but the next phase it "
                            f"has not seen complete is phase {n} (parity {n & 1}); {why}")
    if b.phase >= n + 2:
        raise ctx.error(op, f"phase error: thread {t} waits on {b.describe()} for phase {n} (parity {p}), but phases "
                            f"{n} and {n + 1} have both completed since it last waited; a parity wait cannot tell "
                            f"them apart (on the GPU it would wait for phase {n + 2}): wait for every phase")


def _waiting_for(b: MBarrier, parity: int) -> str:
    tx = (f"{b.tx} transaction bytes outstanding" if b.tx > 0 else
          f"{-b.tx} more transaction bytes delivered than announced by arrive_expect_tx" if b.tx < 0 else
          "no transaction bytes outstanding")
    return (f"mbarrier_wait on {b.describe()} for phase {b.phase} (parity {parity}), which cannot complete: "
            f"{b.expected - b.pending} of {b.expected} arrivals seen, {tx}")


def _deadlock(ctx, b: MBarrier, parity: int, threads: np.ndarray) -> str:
    """The DEADLOCK message of a wait that no other path can help (`paths.wait_until`)."""
    others = np.setdiff1d(np.arange(ctx.num_threads), threads)
    if others.size:
        who = (f"threads {span(threads)} wait, and threads {span(others)} are not executing this code (they left "
               "a loop the waiting threads are still in); threads of one loop run in lockstep in the simulator, so "
               "their arrivals cannot come while the others wait")
    else:
        who = "every thread of the block is waiting here, so no arrival can come"
    return f"DEADLOCK: {_waiting_for(b, parity)}, and {who}"


def tma_operands(ctx, op, shared, tensor_map, coords, access: str, role: str):
    """(the shared region, the tensor map's description) of a tma_load ("writes", "destination") or tma_store
    ("reads", "source"), checked: shared memory on one side, a simulator tensor map on the other, one
    coordinate per dim, and elements of the map's width."""
    region, memory = shared.memory, tensor_map.memory
    if not isinstance(region, SharedRegion):
        raise ctx.error(op, f"{op.name} {access} shared memory, but its {role} points elsewhere")
    if not isinstance(memory, TensorMapMemory):
        raise ctx.error(op, f"{op.name}'s tensor map argument must be a tessera.runtime.tensor_map."
                            f"TensorMapDescription in the simulator, got {memory!r}")
    desc = memory.description
    if len(coords) != desc.rank:
        raise ctx.error(op, f"{op.name} gives {len(coords)} coordinates for a rank-{desc.rank} tensor map")
    if region.dtype.bits != desc.dtype.bits:
        raise ctx.error(op, f"{op.name} {role} holds {region.dtype.name} but the tensor map's elements are "
                            f"{desc.dtype.name}: the box would be reinterpreted; use a ptr<{desc.dtype.name}, shared>")
    return region, desc


@simt("tma_load")
def _tma_load(ctx, op, dst, tensor_map, *rest):
    *coords, bar = rest
    threads = _active(ctx)
    if threads.size == 0:
        return
    region, desc = tma_operands(ctx, op, dst, tensor_map, coords, "writes", "destination")
    source = _source(ctx, op, desc)
    bar_addrs = _addresses(ctx, op, bar, threads)
    _touch(ctx, op, bar, threads)
    mask = op.attrs.get("multicast", 0)
    ranks = [r for r in range(16) if mask >> r & 1] if mask else [ctx.cluster_rank]
    for i, t in enumerate(threads.tolist()):
        if int(tensor_map.offsets[t]) != 0:
            raise ctx.error(op, "tma_load's tensor map pointer must point at the start of the map")
        start = int(dst.offsets[t])
        numel = int(np.prod(desc.box_shape))
        if start < 0 or start + numel > region.size:
            raise ctx.error(op, f"tma_load box of {numel} {desc.dtype.name} elements at element {start} does not fit "
                                f"in {region.name} ({region.size} elements)")
        base = region.byte_offset + start * desc.element_bytes
        if base % desc.shared_alignment:
            raise ctx.error(op, f"tma_load destination at shared byte {base} is not {desc.shared_alignment}-byte "
                                f"aligned, as a box with swizzle {desc.swizzle!r} needs")
        data = _read_box(desc, source, [int(c[t]) for c in coords])
        addrs = base + swizzle_offsets(np.arange(data.size, dtype=np.int64), desc.swizzle)
        for rank in ranks:              # multicast: the same offsets in every block of the mask (`cluster.py`)
            target = ctx if rank == ctx.cluster_rank else peer_block(ctx, op, rank, "multicasts into")
            b = _remote_barrier(ctx, op, target, int(bar_addrs[i]))
            if not b.fenced:
                raise ctx.error(op, f"tma_load signals {b.describe()}, whose mbarrier_init was not made visible to "
                                    "the async proxy: add fence_mbarrier_init (or fence_proxy_async) after "
                                    "mbarrier_init")
            _land(target, op, target.shared, _proxy(target), b, t, addrs, data)
            _add_tx(target, op, b, -desc.box_bytes)


def _narrowed(desc: TensorMapDescription, recipe, nbytes: int) -> tuple[TensorMapDescription, bool]:
    """`desc` with each `UNBOUNDED` dim (a base offset of the view: a batch or head index) cut to the coordinates
    at which a box still starts inside the `nbytes` of the array, the other dims at their first coordinate; and
    whether any was. A GPU map reads what the pointer arithmetic reaches; a numpy source needs finite extents.
    (Where two such dims together reach past the array, the simulator reads zeros: see `_describe`.)"""
    unbounded = [i for i, e in enumerate(recipe.shape) if e.param is None and e.scale == UNBOUNDED]
    if not unbounded:
        return desc, False
    shape = list(desc.shape)
    for i in unbounded:
        shape[i] = 1
    rest = nbytes - sum((n - 1) * s for n, s in zip(shape, desc.strides)) - desc.element_bytes
    for i in unbounded:
        shape[i] = max(1, rest // desc.strides[i] + 1) if rest >= 0 else 1
    return replace(desc, shape=tuple(shape)), True


def _source(ctx, op, desc: TensorMapDescription) -> np.ndarray:
    source = desc.source
    if not isinstance(source, np.ndarray):
        raise ctx.error(op, "the simulator copies boxes out of the tensor map's `source` numpy array; build the "
                            "description with TensorMapDescription.for_array(array, box_shape)")
    if source.shape != desc.shape or source.strides != desc.strides or source.dtype.itemsize != desc.element_bytes:
        raise ctx.error(op, f"the tensor map describes shape {desc.shape} with strides {desc.strides}, but its source "
                            f"array has shape {source.shape} and strides {source.strides}")
    return source


def _read_box(desc: TensorMapDescription, source: np.ndarray, start: list[int]) -> np.ndarray:
    """The box at element `start` as bytes in row-major box order, out-of-bounds elements zero."""
    index = np.indices(desc.box_shape).reshape(desc.rank, -1) + np.asarray(start)[:, None]
    inside = np.all((index >= 0) & (index < np.asarray(desc.shape)[:, None]), axis=0)
    values = np.zeros(index.shape[1], dtype=source.dtype)
    values[inside] = source[tuple(index[:, inside])]
    return values.view(np.uint8).reshape(index.shape[1], desc.element_bytes).reshape(-1)


def _land(ctx, op, shared, proxy: AsyncProxy, b: MBarrier, thread: int, addrs: np.ndarray, data: np.ndarray) -> None:
    """The box's bytes land in block `ctx`'s shared memory `shared` (the issuer's, or a multicast peer's)."""
    if (addrs >= shared.size).any():
        raise ctx.error(op, "tma_load box lies beyond the block's shared memory")
    threads = np.full(addrs.size, thread)
    busy = shared._in_flight(addrs, threads, "copies to", None)
    if busy:
        raise ctx.error(op, f"shared-memory race: {busy}")
    # The copy lands while other threads may still use those bytes: that must be ordered by a barrier.
    race = shared._write_grouped(addrs, threads, threads, data.astype(np.int64), lambda a: f"shared byte {int(a)}",
                                 merge=False)
    if race:
        raise ctx.error(op, f"shared-memory race: the tma_load overwrites bytes in use: {race}")
    shared.bytes[addrs] = data
    wgmma.async_proxy_wrote(ctx, addrs)
    proxy.in_flight_bytes[addrs] += 1
    proxy.copies.append(BoxCopy(b.address, b.phase, addrs, thread))


def finish_block(block) -> None:
    """At the end of a block: TMA copies no wait observed are an error (the GPU may still be writing)."""
    proxy = block.shared.async_proxy
    if proxy is None or not proxy.copies:
        return
    c = proxy.copies[0]
    raise InterpreterError(f"{len(proxy.copies)} tma_load copies never waited for: the kernel ends before an "
                           f"mbarrier_wait on the mbarrier at shared byte {c.barrier} for parity {c.phase & 1} "
                           f"(phase {c.phase}) observed them", kernel=block.fn.name, program_id=block.program_id)
