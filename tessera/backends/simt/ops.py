"""What each op means in thread IR, for the SIMT simulator (`simulator.py`).

Every runtime value is an array over the block's T threads: a scalar is
shape (T,), `regs<N x T>` is (T, N), and a pointer is `Pointers(memory,
offsets)` with offsets shaped the same way. Ops compute for every thread;
those with side effects (memory, atomics, assert, print) act only for the
threads in the context's active mask (`ctx.mask`, None when all are).

Lane-wise ops (arithmetic, comparisons, math, casts, addptr) reuse the tile
interpreter's semantics unchanged, so thread IR computes bit-for-bit what the
tile IR computes -- except the float32 NaNs that arithmetic returns on NVIDIA
targets, which are the hardware's canonical NaN (see `canonical_nans`). This file adds the thread-level ops: thread_id, registers
(splat, pack, extract), select, shuffles, the warp-wide matrix ops
(`mma` on 32-lane warps, `mfma` on 64-lane waves), barriers, shared_alloc, asynchronous copies and the
debugging ops; memory ops are in `memory.py`, control flow in
`control_flow.py`.

Shuffles follow PTX `shfl.sync` with `width`-lane segments (width 0 = the
warp), for lane `l` of a warp of W threads and operand `b` (taken mod W):

    up    l - b, or l's own value when that falls before l's segment
    down  l + b, or l's own value when that falls after l's segment
    bfly  l ^ b, or l's own value when that falls after l's segment
    idx   lane (b mod width) of l's segment

A shuffle reads its source thread's value whether or not that thread is
active (the value is whatever the thread last computed).
"""

from __future__ import annotations

import numpy as np

from tessera.ir.mfma_layouts import mfma_fragments
from tessera.ir.mma_layouts import mma_fragments
from tessera.ir.numerics import round_to_tf32
from tessera.ir.op_table import OpTable
from tessera.ir.ops import op_names
from tessera.ir.types import shape_of, scalar_dtype

# Importing these fills the tile interpreter's table, whose lane-wise entries we reuse.
from ..interp import debug, elementwise, memory  # noqa: F401
from ..interp.registry import SEMANTICS, Semantics
from ..interp.values import Pointers, map_lanes
from . import lds_dma
from .shared import SharedRegion

SIMT_SEMANTICS = OpTable("SIMT semantics", entry=Semantics)
simt = SIMT_SEMANTICS.register      # the thread-IR meaning of ops: @simt("shuffle")




# NaN results. NVIDIA's float32 arithmetic returns the canonical NaN 0x7FFFFFFF whatever NaN it was given
# (on an H100, 10 * NaN + -NaN came back 0x7FFFFFFF where numpy, keeping the operand's payload, gives
# 0x7FC00000: GPU run 7, tests/language/test_tile_algorithms.py's `joined`), so on NVIDIA targets the
# simulator returns it from the ops that compute (binary arithmetic, math functions): a test that compares
# the simulator's bits with the interpreter's must let NaN match NaN (`tessera.testing.assert_same_bits`), as
# a GPU run must. Moves of bits (select, neg, abs, bitcast, loads and stores) keep them, as do casts (how a
# GPU converts a NaN's payload between widths is not modelled), other float widths, and AMD targets.
CANONICAL_NAN_F32 = 0x7FFFFFFF


def canonical_nans(value):
    """`value` with each float32 NaN replaced by CANONICAL_NAN_F32 (a copy when there are any)."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32:
        return value
    nan = np.isnan(value)
    if not nan.any():
        return value
    value = value.copy()
    value.view(np.uint32)[nan] = CANONICAL_NAN_F32
    return value


def _computing(sem: Semantics) -> Semantics:
    """`sem`, whose NaN results on an NVIDIA target are the canonical NaN (the block says: `canonical_nans`)."""
    def run(ctx, op, *values):
        out = sem.fn(ctx, op, *values)
        return canonical_nans(out) if getattr(ctx, "canonical_nans", False) else out
    return Semantics(run, sem.multi)


# Elementwise ops' tile semantics compute lane by lane, so the same functions serve arrays over threads
# (all but `select`, whose condition may be one value per thread: defined below); so does `breakpoint`. Those
# that compute floats give NVIDIA's NaN on NVIDIA targets (above).
_COMPUTING = {*op_names(numerics="binary"), *op_names(numerics="math")}
for _name in (*op_names(elementwise=True), "breakpoint"):
    if _name != "select":
        SIMT_SEMANTICS[_name] = _computing(SEMANTICS[_name]) if _name in _COMPUTING else SEMANTICS[_name]


def thread_index(mask: np.ndarray) -> tuple[int, ...]:
    """(thread,) or (thread, register) of the first true entry of `mask`."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def describe_lane(index: tuple[int, ...]) -> str:
    return f"thread {index[0]}" + (f", register {index[1]}" if len(index) > 1 else "")


def merge(ctx, op, mask: np.ndarray, a, b):
    """`a` where `mask` (one bool per thread), else `b`: numbers or pointers."""
    if isinstance(a, Pointers):
        if a.memory is not b.memory:
            if mask.all():
                return a
            if not mask.any():
                return b
            raise ctx.error(op, f"threads disagree on which memory a pointer addresses ({a.memory.name} or "
                                f"{b.memory.name}); the simulator needs one memory per pointer value")
        return Pointers(a.memory, np.where(_per_thread(mask, a.offsets), a.offsets, b.offsets))
    return np.where(_per_thread(mask, a), a, b)


def _per_thread(mask: np.ndarray, like: np.ndarray) -> np.ndarray:
    return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


# -- values from nothing -----------------------------------------------------

@simt("constant")
def _constant(ctx, op):
    t = op.result.type
    dtype = scalar_dtype(t)
    shape = (ctx.num_threads, *shape_of(t))
    return ctx.memo(op, lambda: np.full(shape, dtype.quantize(op.attrs["value"]), dtype=dtype.compute_dtype))


@simt("thread_id")
def _thread_id(ctx, op):
    return ctx.memo(op, lambda: np.arange(ctx.num_threads, dtype=np.int32))


@simt("program_id")
def _program_id(ctx, op):
    return np.full(ctx.num_threads, ctx.program_id[op.attrs["axis"]], dtype=np.int32)


@simt("num_programs")
def _num_programs(ctx, op):
    return np.full(ctx.num_threads, ctx.grid[op.attrs["axis"]], dtype=np.int32)


# -- registers ---------------------------------------------------------------

@simt("splat")
def _splat(ctx, op, x):
    count = op.result.type.count
    return map_lanes(x, lambda a: np.repeat(a[:, None], count, axis=1))


@simt("pack")
def _pack(ctx, op, *scalars):
    if isinstance(scalars[0], Pointers):
        target = scalars[0].memory
        if any(p.memory is not target for p in scalars):
            raise ctx.error(op, "pack of pointers into different memories is not supported by the simulator")
        return Pointers(target, np.stack([p.offsets for p in scalars], axis=1))
    return np.stack(scalars, axis=1)


@simt("extract")
def _extract(ctx, op, regs):
    index = op.attrs["index"]
    return map_lanes(regs, lambda a: np.ascontiguousarray(a[:, index]))


@simt("select")
def _select(ctx, op, cond, a, b):
    if isinstance(a, Pointers) and a.memory is not b.memory:
        live = cond if ctx.mask is None else cond[ctx.mask]
        if live.all():
            return a
        if not live.any():
            return b
        raise ctx.error(op, f"select between pointers into different memories ({a.memory.name} and "
                            f"{b.memory.name}) differs between threads; the simulator needs one memory per "
                            "pointer value, so select offsets instead")
    if isinstance(a, Pointers):
        return Pointers(a.memory, np.where(cond, a.offsets, b.offsets))
    return np.where(cond, a, b)


# -- talking to other lanes ----------------------------------------------------

@simt("shuffle")
def _shuffle(ctx, op, value, lane):
    warp = ctx.warp_size
    width = op.attrs.get("width", 0) or warp
    if width > warp:
        raise ctx.error(op, f"shuffle width {width} exceeds the warp size {warp}")
    tid = np.arange(ctx.num_threads, dtype=np.int64)
    lane_id = tid % warp
    first = lane_id & ~(width - 1)          # the segment is [first, last]
    last = first | (width - 1)
    b = lane.astype(np.int64) & (warp - 1)
    mode = op.attrs["mode"]
    if mode == "up":
        src = lane_id - b
        src = np.where(src >= first, src, lane_id)
    elif mode == "down":
        src = lane_id + b
        src = np.where(src <= last, src, lane_id)
    elif mode == "bfly":
        src = lane_id ^ b
        src = np.where(src <= last, src, lane_id)
    else:  # idx
        src = first | (b & (width - 1))
    src = tid - lane_id + src
    missing = src >= ctx.num_threads
    if ctx.mask is not None:
        missing &= ctx.mask
    if missing.any():
        t = int(np.argmax(missing))
        raise ctx.error(op, f"thread {t} reads lane {int(src[t] % warp)} of its warp, but the block has only "
                            f"{ctx.num_threads} threads (the last warp is partial)")
    return value[np.minimum(src, ctx.num_threads - 1)]


# -- tensor cores ----------------------------------------------------------------

@simt("mma")
def _mma(ctx, op, a, b, c):
    """mma.sync m{m}n{n}k{k} per 32-lane warp on the `mma_layouts.mma_fragments(m, n, k)` (see `_warp_matmul`);
    f32 inputs are tf32: rounded first, to nearest with ties away from zero (cvt.rna.tf32.f32)."""
    fragments = mma_fragments(op.attrs["m"], op.attrs["n"], op.attrs["k"])
    if scalar_dtype(op.operands[0].type).name == "f32":
        a, b = round_to_tf32(a), round_to_tf32(b)
    return _warp_matmul(ctx, op, "mma", 32, fragments, a, b, c)


@simt("mfma")
def _mfma(ctx, op, a, b, c):
    """v_mfma_f32_{m}x{n}x{k} per 64-lane wave on the `mfma_layouts.mfma_fragments(m, n, k)` (see `_warp_matmul`)."""
    fragments = mfma_fragments(op.attrs["m"], op.attrs["n"], op.attrs["k"])
    return _warp_matmul(ctx, op, "mfma", 64, fragments, a, b, c)


def _warp_matmul(ctx, op, name: str, lanes: int, fragments, a, b, c):
    """One matrix instruction per warp: gather A (m x k), B (k x n) and C (m x n) from the lanes'
    registers by the fragment layouts, D = A @ B + C, scatter D back the way C came.

    Float inputs (f16, bf16, tf32, fp8) have products that are exact in f32;
    the simulator adds them to C one k at a time, in k order, rounding to f32
    each step. The hardware's order and intermediate precision are unspecified
    (mma.sync) or not documented per step (MFMA): results agree with it, and
    with the tile interpreter's single rounding of the exact sum, to a few f32
    ulps times k. Integer inputs (i8, u8) accumulate exactly and wrap to the
    i32 accumulator, like mma.sync's .s32 without .satfinite.
    """
    warp = ctx.warp_size
    if warp != lanes:
        raise ctx.error(op, f"{name} needs {lanes}-lane warps, but this block's warps have {warp} lanes")
    _require_whole_warps(ctx, op)
    a_at, b_at, c_at = (_fragment_coords(layout) for layout in fragments)
    (m, k), (_, n) = fragments[0].shape, fragments[1].shape
    warps = ctx.num_threads // warp
    acc_dtype = scalar_dtype(op.result.type)
    exact = not acc_dtype.is_float
    work = np.int64 if exact else np.float32
    A = np.zeros((warps, m, k), work)
    B = np.zeros((warps, k, n), work)
    D = np.zeros((warps, m, n), work)
    A[:, a_at[0], a_at[1]] = a.reshape(warps, warp, -1).astype(work)
    B[:, b_at[0], b_at[1]] = b.reshape(warps, warp, -1).astype(work)
    D[:, c_at[0], c_at[1]] = c.reshape(warps, warp, -1).astype(work)
    if exact:
        D = D + A @ B
    else:
        for kk in range(k):
            D = D + A[:, :, kk, None] * B[:, None, kk, :]   # float32 throughout: one rounding per k
    out = D[:, c_at[0], c_at[1]].reshape(ctx.num_threads, -1)
    return acc_dtype.quantize(out) if exact else out


@simt("ldmatrix")
def _ldmatrix(ctx, op, rows):
    """ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16 per warp (PTX ISA 9.7.9.x, the ldmatrix fragments).

    Lane 8j + r gives the address of row r of matrix j (16 contiguous bytes,
    16-byte aligned: w = 32 / bits elements per 32-bit word). Lane l receives,
    in registers w*j .. w*j + w - 1, elements (l // 4, w * (l % 4) + e) of
    matrix j; with .trans (16-bit only) the transposed ones, (2 * (l % 4) + e,
    l // 4): the `mma_layouts.ldmatrix_layout()` registers. The reads count as
    reads of every lane that receives the bytes, so the race check sees them as
    the warp-wide access they are.
    """
    warp, num, trans = ctx.warp_size, op.attrs["num"], op.attrs["trans"]
    _require_whole_warps(ctx, op)
    region = rows.memory
    if not isinstance(region, SharedRegion):
        raise ctx.error(op, "ldmatrix reads shared memory, but its operand points into global memory")
    per_word = 32 // region.dtype.bits
    warps = ctx.num_threads // warp
    live = live_mask(ctx)
    starts = np.where(live, rows.offsets, 0).reshape(warps, warp)[:, :8 * num].reshape(warps, num, 8)
    if ((starts * region.dtype.bits) % 128).any():
        w, j, r = (int(i) for i in np.argwhere((starts * region.dtype.bits) % 128)[0])
        raise ctx.error(op, f"ldmatrix row address of lane {8 * j + r} of warp {w} (element {int(starts[w, j, r])}) "
                            "is not 16-byte aligned")
    lane = np.arange(warp)
    row, col = lane // 4, per_word * (lane % 4)
    element = np.arange(per_word)
    if trans:   # lane l, element e: stored row 2 * (l % 4) + e, column l // 4
        src_row, src_col = col[:, None] + element, np.broadcast_to(row[:, None], (warp, per_word))
    else:
        src_row, src_col = np.broadcast_to(row[:, None], (warp, per_word)), col[:, None] + element
    # offsets[w, l, j, e] = starts[w, j, src_row[l, e]] + src_col[l, e]
    offsets = np.empty((warps, warp, num, per_word), np.int64)
    for j in range(num):
        offsets[:, :, j, :] = starts[:, j, :][:, src_row] + src_col
    return _read_for_lanes(ctx, op, region, offsets.reshape(ctx.num_threads, per_word * num), live)


def _read_for_lanes(ctx, op, region, offsets, live):
    """Each live thread's row of shared-memory element `offsets` (threads x elements), read as that thread's
    (bounds- and race-checked; dead threads' rows are zeros): the values a cooperative read (ldmatrix,
    lds_read_tr) hands each lane."""
    outside = live[:, None] & ((offsets < 0) | (offsets >= region.size))
    if outside.any():
        raise ctx.error(op, f"{op.name} reads outside {region.name} (elements {int(offsets.min())}.."
                            f"{int(offsets.max())} of {region.size})")
    threads = np.broadcast_to(np.arange(ctx.num_threads)[:, None], offsets.shape)
    race = region.shared.record_read(region, threads[live], offsets[live])
    if race is not None:
        raise ctx.error(op, f"shared-memory race: {race}")
    result = np.zeros(offsets.shape, region.dtype.compute_dtype)
    result[live] = region.load(offsets[live])
    return result


@simt("lds_read_tr")
def _lds_read_tr(ctx, op, rows):
    """ds_read_b64_tr_b16 per 64-lane wave, in groups of 16 lanes (the `lds_read_tr` op's semantics).

    Lane 16h + s addresses 4 contiguous 16-bit elements (8-byte aligned): row
    s // 4, columns 4 (s % 4) .. + 3 of the group's 4 x 16 tile. Lane 16h + d
    receives column d: register e is element d % 4 of the row lane
    16h + 4e + d // 4 addressed. Like ldmatrix's, the reads count as reads of
    the lanes that receive the bytes.
    """
    _require_whole_warps(ctx, op)
    region = rows.memory
    if not isinstance(region, SharedRegion) or region.dtype.bits != 16:
        raise ctx.error(op, "lds_read_tr reads 16-bit elements from LDS, but its operand points elsewhere")
    live = live_mask(ctx)
    starts = np.where(live, rows.offsets, 0)
    if (starts % 4).any():
        t = int(np.argmax(starts % 4))
        raise ctx.error(op, f"lds_read_tr row address of lane {t % ctx.warp_size} (thread {t}, element "
                            f"{int(starts[t])}) is not 8-byte aligned")
    t = np.arange(ctx.num_threads)
    e = np.arange(4)
    source = (t // 16 * 16)[:, None] + 4 * e[None, :] + (t % 16 // 4)[:, None]     # (threads, 4)
    return _read_for_lanes(ctx, op, region, starts[source] + (t % 4)[:, None], live)


@simt("stmatrix")
def _stmatrix(ctx, op, rows, regs):
    """stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 per warp: `ldmatrix` backwards (16-bit only).

    Lane 8j + r gives the address of row r of matrix j (16 contiguous bytes,
    16-byte aligned). Lane l's registers 2j, 2j + 1 land at elements (l // 4,
    2 (l % 4) + e) of matrix j; with .trans at (2 (l % 4) + e, l // 4). The
    writes count as writes of the lane that held the registers, so the race
    check sees which thread's data went where.
    """
    warp, num, trans = ctx.warp_size, op.attrs["num"], op.attrs["trans"]
    _require_whole_warps(ctx, op)
    region = rows.memory
    if not isinstance(region, SharedRegion):
        raise ctx.error(op, "stmatrix writes shared memory, but its operand points into global memory")
    warps = ctx.num_threads // warp
    live = live_mask(ctx)
    starts = np.where(live, rows.offsets, 0).reshape(warps, warp)[:, :8 * num].reshape(warps, num, 8)
    if (starts % 8).any():
        w, j, r = (int(i) for i in np.argwhere(starts % 8)[0])
        raise ctx.error(op, f"stmatrix row address of lane {8 * j + r} of warp {w} (element {int(starts[w, j, r])}) "
                            "is not 16-byte aligned")
    lane = np.arange(warp)
    element = np.arange(2)
    if trans:   # lane l, element e: stored row 2 * (l % 4) + e, column l // 4
        dst_row, dst_col = 2 * (lane % 4)[:, None] + element, np.broadcast_to((lane // 4)[:, None], (warp, 2))
    else:
        dst_row, dst_col = np.broadcast_to((lane // 4)[:, None], (warp, 2)), 2 * (lane % 4)[:, None] + element
    offsets = np.empty((warps, warp, num, 2), np.int64)
    for j in range(num):
        offsets[:, :, j, :] = starts[:, j, :][:, dst_row] + dst_col
    offsets = offsets.reshape(ctx.num_threads, 2 * num)
    outside = live[:, None] & ((offsets < 0) | (offsets >= region.size))
    if outside.any():
        raise ctx.error(op, f"stmatrix writes outside {region.name} (elements {int(offsets.min())}.."
                            f"{int(offsets.max())} of {region.size})")
    values = np.asarray(regs).reshape(ctx.num_threads, 2 * num)
    threads = np.broadcast_to(np.arange(ctx.num_threads)[:, None], offsets.shape)
    race = region.shared.record_write(region, threads[live], offsets[live], values[live])
    if race is not None:
        raise ctx.error(op, f"shared-memory race: {race}")
    region.store(offsets[live], values[live])


def live_mask(ctx) -> np.ndarray:
    """Which threads execute the current op: all of them outside divergent code."""
    return np.ones(ctx.num_threads, bool) if ctx.mask is None else ctx.mask


def whole_units(ctx, op, size: int, unit: str, rule: str, member: str = "threads") -> np.ndarray:
    """The indices of the `unit`s (runs of `size` consecutive threads: warps, warpgroups) executing `op`.

    An error if the block is not made of whole units, or if a unit is only partly active (`rule` says
    why that matters for this op); `member` names a unit's threads in the message ("lanes" of a warp)."""
    if ctx.num_threads % size:
        raise ctx.error(op, f"{op.name} runs on whole {unit}s of {size} threads, but the block has "
                            f"{ctx.num_threads}; use a multiple of {size}")
    per_unit = live_mask(ctx).reshape(-1, size)
    partial = per_unit.any(axis=1) & ~per_unit.all(axis=1)
    if partial.any():
        u = int(np.argmax(partial))
        raise ctx.error(op, f"{op.name} in divergent code: only {int(per_unit[u].sum())} of the {size} {member} "
                            f"of {unit} {u} execute it; {rule}")
    return np.flatnonzero(per_unit.all(axis=1))


def _require_whole_warps(ctx, op) -> None:
    whole_units(ctx, op, ctx.warp_size, "warp", "every lane of a warp must reach it together", member="lanes")


def _fragment_coords(layout):
    """(rows, cols), each (lanes, registers): the element lane l's register j holds."""
    rows, cols = layout.table().transpose(2, 0, 1)
    return rows, cols


# -- shared memory and barriers --------------------------------------------------

@simt("barrier")
def _barrier(ctx, op):
    if ctx.mask is not None:
        idle = np.flatnonzero(~ctx.mask)
        raise ctx.error(op, f"barrier in divergent code: {idle.size} of {ctx.num_threads} threads (thread "
                            f"{int(idle[0])} first) do not reach it, so the block would hang; every thread must "
                            "execute the same barriers, so move it out of the branch or loop whose condition "
                            "differs between threads (to synchronize only some threads, such as the consumer "
                            "warpgroups of a warp-specialized kernel, use named_barrier {id, count})")
    ctx.shared.barrier()


@simt("shared_alloc")
def _shared_alloc(ctx, op):
    offset, nbytes = op.attrs["offset"], op.attrs["bytes"]
    dtype = op.result.type.pointee
    if offset < 0:
        raise ctx.error(op, "shared_alloc has no offset yet (-1): run the shared-memory allocator on the "
                            "thread IR before simulating it")
    if offset + nbytes > ctx.shared.size:
        raise ctx.error(op, f"shared_alloc of bytes [{offset}, {offset + nbytes}) lies outside the block's "
                            f"{ctx.shared.size} bytes of shared memory (the kernel's `shared_bytes` attribute)")
    if (offset * 8) % max(dtype.bits, 8):
        raise ctx.error(op, f"shared_alloc at byte {offset} is not aligned to its {dtype.name} elements")
    region = ctx.shared.region(offset, nbytes, dtype)
    return Pointers(region, np.zeros(ctx.num_threads, dtype=np.int64))


# -- asynchronous copies (cp.async) ------------------------------------------------

def _active_threads(ctx) -> np.ndarray:
    return np.arange(ctx.num_threads) if ctx.mask is None else np.flatnonzero(ctx.mask)


@simt("async_copy")
def _async_copy(ctx, op, dst, src, pred):
    """Snapshot `bytes` bytes of global memory now (zeros where `pred` is false: then nothing is read, and
    the source address may lie outside memory); they land in shared memory when an `async_wait` retires
    the copy's group (`SharedMemory.async_issue`)."""
    size, region, source = op.attrs["bytes"], dst.memory, src.memory
    if not isinstance(region, SharedRegion) or isinstance(source, SharedRegion):
        raise ctx.error(op, "async_copy copies from global to shared memory, but its pointers point elsewhere")
    threads = _active_threads(ctx)
    if threads.size == 0:
        return
    width = region.dtype.bits // 8
    count = size // width
    dst_el, src_el = dst.offsets[threads], src.offsets[threads]
    reads = np.asarray(pred, bool)[threads]         # a predicated-off copy reads nothing (src-size 0)
    for name, offsets, mem, checked in (("destination", dst_el, region, True), ("source", src_el, source, reads)):
        bad = checked & ((offsets < 0) | (offsets + count > mem.size))
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.error(op, f"async_copy {name} out of bounds: thread {int(threads[i])} copies elements "
                                f"{int(offsets[i])}..{int(offsets[i]) + count - 1} of '{mem.name or 'memory'}', "
                                f"which holds {mem.size} {mem.dtype.name} elements")
    dst_bytes = region.byte_offset + dst_el * width
    src_bytes = src_el * width
    for name, at in (("destination", dst_bytes), ("source", src_bytes)):
        bad = at % size != 0
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.error(op, f"async_copy {name} of thread {int(threads[i])} is at byte {int(at[i])}, which is "
                                f"not aligned to the copy's {size} bytes")
    lds_dma.check_lanes(ctx, op, threads, dst_bytes, size)
    lanes = np.arange(size)
    raw = source.array.reshape(-1).view(np.uint8)
    data = np.zeros((threads.size, size), np.uint8)
    data[reads] = raw[src_bytes[reads][:, None] + lanes]
    failure = region.shared.async_issue(threads, dst_bytes[:, None] + lanes, data.astype(np.uint8))
    if failure is not None:
        raise ctx.error(op, f"shared-memory race: {failure}")


@simt("async_commit")
def _async_commit(ctx, op):
    ctx.shared.async_commit(_active_threads(ctx))


@simt("async_wait")
def _async_wait(ctx, op):
    failure = ctx.shared.async_wait(_active_threads(ctx), op.attrs["pending"])
    if failure is not None:
        raise ctx.error(op, f"shared-memory race: {failure}")


# -- debugging -------------------------------------------------------------------

@simt("print")
def _print(ctx, op, *values):
    """One line per active thread: "pid (x, y, z) thread t <prefix> <values...>"."""
    prefix = [op.attrs["prefix"]] if op.attrs["prefix"] else []
    for t in range(ctx.num_threads):
        if ctx.mask is None or ctx.mask[t]:
            shown = [v.offsets[t] if isinstance(v, Pointers) else v[t] for v in values]
            print(f"pid {ctx.program_id} thread {t}", *prefix, *shown, flush=True)


@simt("assert")
def _assert(ctx, op, cond):
    failed = ~np.asarray(cond, dtype=bool)
    if ctx.mask is not None:
        failed &= _per_thread(ctx.mask, failed)
    if failed.any():
        where = describe_lane(thread_index(failed))
        raise ctx.error(op, f"assertion failed: {op.attrs['message']} ({where}; {int(failed.sum())} of "
                            f"{failed.size} lanes false)")
