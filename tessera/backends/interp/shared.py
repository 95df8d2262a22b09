"""Explicit shared memory and async copies (`smem_*` ops; see `ir/shared_ops.py`) in the tile interpreter.

A program instance owns its buffers (`SharedBuffer`: the elements, which of
them were ever written, and which async copy is writing each one) and one
`AsyncCopies` queue. The async semantics are exact, so a kernel that would
race on a GPU fails here with the fix spelled out:

* `smem_async_copy` reads global memory at once (lanes outside the view, or
  masked off, give 0) but its bytes are *in flight*: they land in the
  buffer only when a `smem_async_wait` retires the copy's group;
* `smem_async_commit` closes the open group; `smem_async_wait {pending = n}`
  retires committed groups oldest first until n are left; copies not yet
  committed are never retired (as in PTX);
* reading bytes an in-flight copy writes, writing them (a store or another
  copy), and reading bytes never written raise `InterpreterError` naming
  the op, its line and the `tessera.async_wait(...)` that would fix it; so
  does ending the kernel with copies in flight;
* mbarriers (`smem_mbarriers`, `Mbarriers`) count phases: a copy with an
  mbarrier operand joins that mbarrier's current phase (not a group);
  `smem_mbarrier_wait` lands every copy of the current phase and advances
  it. A wait whose parity is not the current phase's (the previous phase,
  already complete: on a GPU it would return at once and the data would
  not be there) and a wait on a phase with no copies (it could never
  complete: the program would hang) raise `InterpreterError`, as do reads
  and overwrites of a phase's bytes before its wait, naming
  `bars[s].wait(parity)` to add;
* `smem_barrier` orders nothing here: the whole program runs as one (the
  SIMT simulator checks cross-thread races after lowering).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .memory import _block_lanes, _check_in_bounds
from .registry import semantics


class SharedBuffer:
    """The elements of one `smem_alloc` of one program instance, flat in row-major order."""

    def __init__(self, op, dtype, numel: int):
        self.op = op
        self.dtype = dtype
        self.data = np.zeros(numel, dtype=dtype.compute_dtype)
        self.written = np.zeros(numel, dtype=bool)
        self.writer = np.full(numel, -1, dtype=np.int64)     # id of the in-flight copy writing it, or -1

    @property
    def name(self) -> str:
        hint = self.op.result.name_hint
        return f"'{hint}'" if hint else f"the buffer allocated at {self.op.loc or 'unknown location'}"


class Mbarriers:
    """The mbarriers of one `smem_mbarriers` of one program instance: each one's phase and pending copies."""

    def __init__(self, op, count: int):
        self.op = op
        self.phase = [0] * count
        self.pending: list[list[int]] = [[] for _ in range(count)]
        self.completed_at: list[object] = [None] * count       # the wait that completed each one's last phase

    def name(self, i: int) -> str:
        hint = self.op.result.name_hint
        where = self.op.loc or "unknown location"
        return f"{hint}[{i}]" if hint else f"mbarrier {i} of the mbarriers allocated at {where}"


@dataclass(frozen=True, eq=False)
class SharedRef:
    """A (sub-)buffer: `shape` elements of `buffer` starting at element `offset`."""

    buffer: SharedBuffer
    offset: int
    shape: tuple[int, ...]

    def elements(self) -> np.ndarray:
        """Flat element numbers of the sub-buffer, in its shape."""
        return self.offset + np.arange(int(np.prod(self.shape)), dtype=np.int64).reshape(self.shape)


@dataclass(eq=False)
class Copy:
    op: object
    buffer: SharedBuffer
    elements: np.ndarray
    values: np.ndarray
    group: int | None = None        # serial number of its committed group; None while open
    barrier: tuple | None = None    # (Mbarriers, index) whose current phase it joined, if any


@dataclass
class AsyncCopies:
    """One program instance's async copies: the open group and the committed groups in flight."""

    copies: dict[int, Copy] = field(default_factory=dict)
    open: list[int] = field(default_factory=list)
    groups: deque = field(default_factory=deque)          # (serial, [copy ids]), oldest first
    serial: int = 0

    def wait_advice(self, copy: Copy) -> str:
        """The smallest change that makes `copy`'s bytes land."""
        if copy.barrier is not None:
            bars, i = copy.barrier
            return f"add {bars.name(i)}.wait({bars.phase[i] % 2}) (its phase {bars.phase[i]})"
        if copy.group is None:
            return (f"add tessera.async_commit() after the copy at {copy.op.loc or 'unknown location'}, then "
                    f"tessera.async_wait(0)")
        newer = sum(1 for serial, _ in self.groups if serial > copy.group)
        return f"add tessera.async_wait({newer})"

    def retire(self, pending: int) -> None:
        while len(self.groups) > pending:
            _, ids = self.groups.popleft()
            self.land(ids)

    def land(self, ids) -> None:
        """The bytes of copies `ids` arrive in their buffers."""
        for i in ids:
            copy = self.copies.pop(i)
            buf = copy.buffer
            buf.data[copy.elements] = copy.values
            buf.written[copy.elements] = True
            buf.writer[copy.elements] = -1


def state(ctx) -> AsyncCopies:
    """The async-copy queue of program instance `ctx` (made on first use)."""
    queue = getattr(ctx, "async_copies", None)
    if queue is None:
        queue = ctx.async_copies = AsyncCopies()
    return queue


def check_drained(ctx) -> None:
    """At the end of a program: every async copy must have been waited for."""
    queue = getattr(ctx, "async_copies", None)
    if queue is None or not queue.copies:
        return
    copy = next(iter(queue.copies.values()))
    raise ctx.error(copy.op, f"the kernel ends with {len(queue.copies)} async copies in flight (their bytes never "
                             f"land); {queue.wait_advice(copy)} before the kernel returns")


def _in_flight(ctx, op, ref: SharedRef, elements: np.ndarray, action: str) -> None:
    writers = ref.buffer.writer[elements]
    busy = writers >= 0
    if not busy.any():
        return
    queue = state(ctx)
    lane = tuple(int(i) for i in np.argwhere(busy)[0])
    copy = queue.copies[int(writers[lane])]
    raise ctx.error(op, f"{action} shared memory that the async copy at {copy.op.loc or 'unknown location'} is still "
                        f"writing (lane {lane} of {ref.buffer.name}); {queue.wait_advice(copy)} before this "
                        f"{op.name.removeprefix('smem_').replace('_', ' ')}")


@semantics("smem_alloc")
def _alloc(ctx, op):
    t = op.result.type
    return SharedRef(SharedBuffer(op, t.dtype, t.numel), 0, t.shape)


@semantics("smem_mbarriers")
def _mbarriers(ctx, op):
    t = op.result.type
    return SharedRef(Mbarriers(op, t.shape[0]), 0, t.shape)


@semantics("smem_slot")
def _slot(ctx, op, ref, index):
    i, n = int(index), ref.shape[0]
    if not 0 <= i < n:
        raise ctx.error(op, f"slot {i} of a buffer with {n} slots along its leading dim (valid: 0 to {n - 1})")
    inner = ref.shape[1:]
    return SharedRef(ref.buffer, ref.offset + i * int(np.prod(inner)), inner)


@semantics("smem_load")
def _load(ctx, op, ref):
    elements = ref.elements()
    _in_flight(ctx, op, ref, elements, "reads")
    unwritten = ~ref.buffer.written[elements]
    if unwritten.any():
        lane = tuple(int(i) for i in np.argwhere(unwritten)[0])
        raise ctx.error(op, f"reads shared memory never written (lane {lane} of {ref.buffer.name}); copy or store "
                            f"into it first, and wait for its async copies")
    return np.array(ref.buffer.data[elements], copy=True)


@semantics("smem_store")
def _store(ctx, op, ref, value):
    elements = ref.elements()
    _in_flight(ctx, op, ref, elements, "overwrites")
    ref.buffer.data[elements] = value
    ref.buffer.written[elements] = True


@semantics("smem_async_copy")
def _async_copy(ctx, op, ref, source, *rest):
    barrier = None
    if rest and isinstance(rest[-1], SharedRef):
        barrier, rest = (rest[-1].buffer, rest[-1].offset), rest[:-1]
    elements = ref.elements()
    _in_flight(ctx, op, ref, elements, "overwrites")
    values = np.zeros(ref.shape, dtype=ref.buffer.dtype.compute_dtype)
    if hasattr(source, "strides"):                          # a view and element offsets
        offsets, inside = _block_lanes(ctx, op, source, rest, ref.shape)
        values[inside] = source.memory.load(offsets[inside])
    else:                                                   # pointers and an optional mask
        mask = rest[0] if rest else None
        _check_in_bounds(ctx, op, source, mask, "async_copy")
        active = np.ones(ref.shape, dtype=bool) if mask is None else mask
        values[active] = source.memory.load(source.offsets[active])
    queue = state(ctx)
    copy_id = queue.serial
    queue.serial += 1
    queue.copies[copy_id] = Copy(op, ref.buffer, elements, values, barrier=barrier)
    if barrier is None:
        queue.open.append(copy_id)
    else:
        barrier[0].pending[barrier[1]].append(copy_id)
    ref.buffer.writer[elements] = copy_id


@semantics("smem_async_commit")
def _commit(ctx, op):
    queue = state(ctx)
    serial = queue.serial
    queue.serial += 1
    for i in queue.open:
        queue.copies[i].group = serial
    queue.groups.append((serial, queue.open))
    queue.open = []


@semantics("smem_async_wait")
def _wait(ctx, op):
    state(ctx).retire(op.attrs["pending"])


@semantics("smem_barrier")
def _barrier(ctx, op):
    """A whole program runs at once in the tile interpreter: nothing to order."""


@semantics("smem_mbarrier_wait")
def _mbarrier_wait(ctx, op, ref, parity):
    bars, i = ref.buffer, ref.offset
    parity, phase = int(parity), bars.phase[i]
    name = bars.name(i)
    if parity not in (0, 1):
        raise ctx.error(op, f"{name}.wait({parity}): the argument is the parity of a phase, 0 or 1")
    if parity != phase % 2:
        before = (f"phase {phase - 1} (parity {parity}) of {name} already completed at "
                  f"{bars.completed_at[i].loc or 'unknown location'}, so on the GPU this wait returns at once"
                  if phase else f"no phase of parity 1 precedes phase 0 of {name}, so on the GPU this wait returns "
                                f"at once")
        raise ctx.error(op, f"waits for the wrong phase: {before}, before the copies of its current phase {phase} "
                            f"land; wait for parity {phase % 2} ({name}.wait({phase % 2}); a ring of n slots waits "
                            f"on (k // n) % 2 in iteration k)")
    pending = bars.pending[i]
    if not pending:
        raise ctx.error(op, f"deadlock: waits for phase {phase} of {name}, but no copy was issued onto it in that "
                            f"phase, so the phase can never complete and the program would hang here; issue "
                            f"tessera.async_copy(..., barrier={name}) before this wait, or remove the wait")
    state(ctx).land(pending)
    bars.pending[i] = []
    bars.phase[i] += 1
    bars.completed_at[i] = op
