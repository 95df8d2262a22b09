"""wgmma in the SIMT simulator: warpgroup-wide, asynchronous, reading shared memory through descriptors.

Each op runs per warpgroup (128 consecutive threads, 4 warps of 32): all of a
warpgroup's threads execute it together or none does, else it is an error,
like the whole-warp rule of mma.sync. What the hardware leaves undefined when
a program breaks the rules is reported instead (`ir/warpgroup_ops.py` shows
the sequence a kernel follows):

* `wgmma` decodes its two descriptors (which must be the same in every thread
  of the warpgroup) with `wgmma_layouts.operand_addresses`, so the swizzle
  mode is honoured exactly, and computes D = A @ B + C in f32, one k at a
  time (like `mma_m16n8k16`). It needs a `wgmma_fence` since the kernel
  start or the warpgroup's last `wgmma_wait` (stricter than the ISA, which
  exempts accumulator chains: every code generator fences each batch anyway).
* the shared bytes it reads must be what the last `fence_proxy_async` saw
  (bytes written after it, by st.shared or cp.async, are invisible to the
  async proxy wgmma reads through), and they count as read by the
  warpgroup for the race check (`SharedMemory.record_warpgroup_read`), so
  the writes need a `barrier` too, and a later write by another thread must
  be ordered after a release by some thread of the warpgroup.
* its result is not ready until a `wgmma_commit` and a `wgmma_wait` retire
  its group: until then it holds NaN, and an op that reads it is an error,
  except another wgmma taking it as its accumulator (chaining in flight is
  what the hardware allows; the chain continues from the true value).
* when a wait retires a wgmma, the shared bytes it read must be unchanged
  and no async_copy may still be on its way to them: writing operands of a
  wgmma in flight (st.shared, or a cp.async that may land any time after
  its issue) is an error. Results never waited for
  are an error at the end of the kernel.
* a wgmma with `offset` updates one fragment of a stack of them and passes
  the others through (their true values: a chain of such wgmmas over a
  warpgroup's fragments is one value in flight);
* a result in flight may be carried around a `for` loop: the `yield` that
  hands it on is not a read, and the loop's block argument and result stand
  for the same in-flight wgmma (a software-pipelined K loop keeps one group
  in flight across iterations and chains the next one onto it).

An f16/bf16 A may come from registers (`wgmma_layouts.wgmma_a_fragment()`):
the 64 x 16 slice is gathered from the warpgroup's registers as the fragment
says (a value still in flight from another wgmma cannot be one: reading it
is an early read, as for any op).

e4m3 / e5m2 wgmmas (k = 32, `dtype_b` for a B of the other type) read
K-major operands of 32 one-byte elements per row and K slice; their
products are exact in f32 and are summed one k at a time like the others.
Operands are K-major, or MN-major with `trans_a` / `trans_b` (imm-trans = 1):
`wgmma_layouts.operand_addresses` gives the hardware's address of every
element for both, so each layout is read exactly as the PTX ISA defines it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.types import RegsType
from tessera.ir.wgmma_layouts import (WARPGROUP, WGMMA_M, MatrixDescriptor, operand_addresses, wgmma_a_fragment,
                                      wgmma_accumulator)

from .ops import live_mask, simt, whole_units
from .shared import SharedRegion

_FENCE_ADVICE = "add fence_proxy_async after the shared-memory writes (then a barrier) before the wgmma"


@dataclass(eq=False)
class _Issued:
    """One wgmma in flight: its true result, per thread its group and whether it is still waiting."""

    op: Operation
    result: np.ndarray        # (T, N/2) f32
    group: np.ndarray         # (T,) the issuing thread's committed-group count at issue
    waiting: np.ndarray       # (T,) bool
    addresses: np.ndarray     # shared byte addresses it read
    data: np.ndarray          # their bytes when it read them
    names: list               # the values that hold its result (its own, and where loops carry it)


class WarpgroupState:
    """Per block: committed groups and fences per thread, wgmmas in flight, the async-proxy view of shared."""

    def __init__(self, num_threads: int):
        self.committed = np.zeros(num_threads, np.int64)
        self.fenced = np.zeros(num_threads, bool)
        self.in_flight: dict[Value, _Issued] = {}  # the newest wgmma in flight whose result each value holds
        self.issued: list[_Issued] = []             # every wgmma in flight (a loop re-issues the same op)
        self.async_view: np.ndarray | None = None   # shared bytes as of the last fence_proxy_async


def _state(ctx) -> WarpgroupState:
    state = ctx.state.get("wgmma")
    if state is None:
        state = ctx.state["wgmma"] = WarpgroupState(ctx.num_threads)
    return state


def _warpgroups(ctx, op) -> list[int]:
    """The warpgroups executing `op`; an error unless each has all 128 threads or none active."""
    if ctx.warp_size != 32:
        raise ctx.error(op, f"{op.name} needs 32-lane warps, but this block's warps have {ctx.warp_size} lanes")
    groups = whole_units(ctx, op, WARPGROUP, "warpgroup", "all 4 warps of a warpgroup must reach it together")
    return [int(g) for g in groups]


@simt("wgmma_desc")
def _wgmma_desc(ctx, op, ptr):
    region = ptr.memory
    if not isinstance(region, SharedRegion) or region.dtype.bits < 8:
        raise ctx.error(op, "wgmma_desc describes a tile in shared memory of whole-byte elements")
    address = region.byte_offset + ptr.offsets.astype(np.int64) * (region.dtype.bits // 8)
    live = live_mask(ctx)
    bad = live & (address % 16 != 0)
    if bad.any():
        t = int(np.argmax(bad))
        raise ctx.error(op, f"wgmma_desc of thread {t}: shared byte {int(address[t])} is not 16-byte aligned")
    fields = MatrixDescriptor(0, op.attrs["lbo"], op.attrs["sbo"], op.attrs["swizzle"]).signed()
    return ((address & 0x3FFFF) >> 4) | np.int64(fields)


@simt("wgmma_fence")
def _wgmma_fence(ctx, op):
    _warpgroups(ctx, op)
    _state(ctx).fenced[live_mask(ctx)] = True


def snapshot_async_view(ctx) -> None:
    """What `fence_proxy_async` means for wgmma: the shared bytes its async proxy may now read
    (the op's semantics are `mbarrier.py`'s, which calls this)."""
    _state(ctx).async_view = ctx.shared.bytes.copy()


def async_proxy_wrote(ctx, addresses: np.ndarray) -> None:
    """Bytes the async proxy itself wrote (a TMA box landing, `mbarrier.py`) are visible to wgmma without a
    fence_proxy_async: both go through the async proxy. Before any fence, the view starts out with every
    other byte stale (its bitwise complement), so generic writes still need a fence."""
    state = _state(ctx)
    if state.async_view is None:
        state.async_view = ~ctx.shared.bytes
    state.async_view[addresses] = ctx.shared.bytes[addresses]


@simt("wgmma_commit")
def _wgmma_commit(ctx, op):
    _warpgroups(ctx, op)
    _state(ctx).committed[live_mask(ctx)] += 1


@simt("wgmma_wait")
def _wgmma_wait(ctx, op):
    _warpgroups(ctx, op)
    state, live = _state(ctx), live_mask(ctx)
    limit = state.committed - op.attrs["pending"]
    for issued in list(state.issued):
        retire = issued.waiting & live & (issued.group < limit)
        if not retire.any():
            continue
        copying = ctx.shared.async_pending(issued.addresses)    # issued while the wgmma was in flight
        if copying.any():
            raise ctx.error(op, f"shared byte {int(issued.addresses[np.argmax(copying)])}, which the wgmma at "
                                f"{issued.op.loc or 'an unknown location'} reads, was written while it was in "
                                "flight: an async_copy to it was issued before a wgmma_wait retired the wgmma; "
                                "wait for the wgmma before refilling its operands (a pipelined loop that keeps "
                                "a wgmma group in flight copies one iteration less far ahead)")
        changed = ctx.shared.bytes[issued.addresses] != issued.data
        if changed.any():
            raise ctx.error(op, f"shared byte {int(issued.addresses[np.argmax(changed)])}, which the wgmma at "
                                f"{issued.op.loc or 'an unknown location'} reads, was written while it was in "
                                "flight; wait for the wgmma (wgmma_wait) before overwriting its operands")
        names = [v for v in dict.fromkeys(issued.names) if state.in_flight.get(v) is issued]
        for value in names:
            if value in ctx.env:
                ctx.env[value] = np.where(retire[:, None], issued.result, ctx.env[value])
        issued.waiting &= ~retire
        if not issued.waiting.any():
            state.issued.remove(issued)
            for value in names:
                del state.in_flight[value]
                del ctx.unready[value]
    state.fenced[live] = False


def _hold(ctx, issued: _Issued, value: Value) -> None:
    """`value` now holds `issued`'s result, still in flight."""
    _state(ctx).in_flight[value] = issued
    issued.names.append(value)
    ctx.unready[value] = (issued.op, lambda reader: _early_read(ctx, reader, value))


@simt("wgmma")
def _wgmma(ctx, op, a_desc, b_desc, acc):
    groups = _warpgroups(ctx, op)
    state, live = _state(ctx), live_mask(ctx)
    if not state.fenced[live].all():
        t = int(np.argmax(live & ~state.fenced))
        raise ctx.error(op, f"wgmma without a wgmma_fence (thread {t}) since the kernel start or the last "
                            "wgmma_wait; add wgmma_fence before the first wgmma of each batch")
    chained = state.in_flight.get(op.operands[2])
    if chained is not None:   # accumulating in flight: continue from the true value
        acc = np.where(chained.waiting[:, None], chained.result, acc)
    n, dtype = op.attrs["n"], dt.dtype_from_name(op.attrs["dtype"])
    dtype_b = dt.dtype_from_name(op.attrs.get("dtype_b", op.attrs["dtype"]))
    rows, cols = wgmma_accumulator(n).table().transpose(2, 0, 1)
    stack = np.array(acc, np.float32)       # with `offset`, the fragment is one slice of a stack of them
    fragment = slice(op.attrs.get("offset", 0), op.attrs.get("offset", 0) + n // 2)
    result = stack[:, fragment].copy()
    read = []
    a_in_registers = isinstance(op.operands[0].type, RegsType)
    for g in groups:
        threads = slice(g * WARPGROUP, (g + 1) * WARPGROUP)
        if a_in_registers:          # 64 x 16 from the warpgroup's registers
            a = np.zeros((WGMMA_M, op.attrs["k"]), np.float32)
            a_rows, a_cols = wgmma_a_fragment().table().transpose(2, 0, 1)
            a[a_rows, a_cols] = a_desc[threads].astype(np.float32)
            read.append(np.zeros(0, np.int64))
        else:
            a, a_at = _operand(ctx, op, "A", a_desc[threads], WGMMA_M, dtype, op.attrs.get("trans_a", False))
            read.append(a_at)
        b, b_at = _operand(ctx, op, "B", b_desc[threads], n, dtype_b, op.attrs.get("trans_b", False))  # n x k
        read.append(b_at)
        d = np.zeros((WGMMA_M, n), np.float32)
        d[rows, cols] = result[threads]
        for k in range(a.shape[1]):
            d = d + a[:, k, None] * b[None, :, k]   # float32 throughout: one rounding per k
        result[threads] = d[rows, cols]
        _check_reads(ctx, op, state, np.concatenate([read[-2].ravel(), b_at.ravel()]), g)
    addresses = np.unique(np.concatenate([r.ravel() for r in read])) if read else np.zeros(0, np.int64)
    stack[:, fragment] = result
    issued = _Issued(op, stack, state.committed.copy(), live.copy(), addresses, ctx.shared.bytes[addresses].copy(),
                     [])
    state.issued.append(issued)
    _hold(ctx, issued, op.result)
    return np.full(stack.shape, np.nan, np.float32)


def _operand(ctx, op, name: str, descs: np.ndarray, rows: int, dtype: dt.DType, mn_major: bool):
    """The rows x k operand (K-major, or MN-major; k = 16 for 16-bit elements, 32 for 8-bit ones) a
    warpgroup's descriptor points at, as f32, and its byte addresses."""
    if (descs != descs[0]).any():
        t = int(np.argmax(descs != descs[0]))
        raise ctx.error(op, f"the {name} descriptor differs between threads of a warpgroup (thread {t}); "
                            "wgmma needs one descriptor per warpgroup")
    desc = MatrixDescriptor.decode(int(descs[0]))
    try:
        at = operand_addresses(desc, rows, dtype.bits // 8, mn_major)
    except ValueError as e:
        raise ctx.error(op, f"{name} descriptor {desc}: {e}") from None
    width = dtype.bits // 8
    if at.min() < 0 or at.max() + width > ctx.shared.size:
        raise ctx.error(op, f"wgmma {name} operand ({desc}) reads shared bytes {int(at.min())}.."
                            f"{int(at.max()) + width - 1}, outside the block's {ctx.shared.size} bytes")
    raw = ctx.shared.bytes
    if dtype.bits == 8:
        return dtype.decode(raw[at]).astype(np.float32), at[..., None]
    bits = raw[at].astype(np.uint16) | (raw[at + 1].astype(np.uint16) << 8)
    values = dtype.decode(bits).astype(np.float32)
    return values, np.stack([at, at + 1], axis=-1)


def _check_reads(ctx, op, state: WarpgroupState, addresses: np.ndarray, group: int) -> None:
    """The bytes must be visible to the async proxy and not racing with other threads' writes."""
    if state.async_view is None:
        raise ctx.error(op, f"wgmma reads shared memory, but no fence_proxy_async has run; {_FENCE_ADVICE}")
    stale = ctx.shared.bytes[addresses] != state.async_view[addresses]
    if stale.any():
        raise ctx.error(op, f"wgmma reads shared byte {int(addresses[np.argmax(stale)])}, written after the last "
                            f"fence_proxy_async, so the async proxy may not see it; {_FENCE_ADVICE}")
    race = ctx.shared.record_warpgroup_read(np.unique(addresses), group)
    if race is not None:
        raise ctx.error(op, f"shared-memory race: {race}")


def _early_read(ctx, reader: Operation, value: Value) -> str | None:
    issued = _state(ctx).in_flight[value]
    early = issued.waiting & live_mask(ctx)
    if not early.any():
        return None
    if reader.name == "wgmma" and reader.operands[2] is value and value not in reader.operands[:2]:
        return None
    loop = getattr(reader.parent, "parent", None)
    if reader.name == "yield" and getattr(loop, "name", None) == "for":     # carried around the loop
        body = loop.regions[0]
        for i, operand in enumerate(reader.operands):
            if operand is value:
                _hold(ctx, issued, body.args[i + 1])
                _hold(ctx, issued, loop.results[i])
        return None
    return (f"{reader.name} reads the result of the wgmma at {issued.op.loc or 'an unknown location'} (thread "
            f"{int(np.argmax(early))}) before a wgmma_wait retired it; add wgmma_commit and wgmma_wait "
            "{pending = 0} (or fewer pending groups than were committed since) before reading the accumulator")
