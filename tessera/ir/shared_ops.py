"""Tile-level ops for explicit shared memory and asynchronous copies (`tessera.shared` and friends).

A kernel author who wants to stage data through shared memory herself
(ThunderKittens / TileLang style, instead of `tessera.pipeline`) writes

    %buf = smem_alloc : smem<2x64x32xf16>            one buffer per program, at the kernel's top level
    %s1  = smem_slot %buf, %i                        smem<64x32xf16>: slot %i of the leading dim
    smem_async_copy %s1, %view, %m0, %k0             global view block at element offsets -> shared
    smem_async_copy %s1, %ptrs, %mask                or a tile of pointers; masked lanes write 0
    smem_async_commit                                close the open group of copies
    smem_async_wait {pending = 1}                    retire groups, oldest first, until <= 1 in flight
    smem_barrier                                     every thread of the program
    %x = smem_load %s1 : tile<64x32xf16>              shared -> registers
    smem_store %s1, %x                               registers -> shared
    %bars = smem_mbarriers : smem<2x1xi64>           2 mbarriers (one per slot), at the kernel's top level
    %b1  = smem_slot %bars, %i                       smem<1xi64>: mbarrier %i
    smem_async_copy %s1, %view, %m0, %k0, %b1        a copy that completes on mbarrier %b1 (not in a group)
    smem_mbarrier_wait %b1, %parity                  until %b1's phase of parity %parity completes

Async semantics (the tile interpreter enforces them exactly; the lowering
maps them onto cp.async groups, or onto synchronous copies where the target
has no cp.async):

* a copy's bytes are *in flight* from `smem_async_copy` until a
  `smem_async_wait` retires its group; they may be neither read
  (`smem_load`) nor written (`smem_store`, another copy) meanwhile;
* `smem_async_commit` closes the open group; copies not yet committed are
  never retired by a wait (as cp.async.wait_group in PTX);
* `smem_async_wait {pending = n}` retires committed groups oldest first
  until at most n are left in flight;
* mbarriers (`smem_mbarriers`) count phases. A copy whose last operand
  is an mbarrier joins that mbarrier's *current phase* instead of the open
  group (issuing it is the arrival). `smem_mbarrier_wait %b, %p` waits for
  the current phase, whose parity (phase number % 2) must be %p: it
  completes when every copy of the phase has landed; then the phase number
  goes up by one (parity flips). A wait on a phase with no copies never
  returns (a deadlock), and a wait whose parity is the previous phase's
  (already completed: PTX would return at once) is a wrong-phase error;
  the tile interpreter reports both;
* `smem_barrier` orders the accesses of different threads; the tile
  interpreter runs a program as one, so for it the barrier orders nothing
  (the SIMT simulator checks cross-thread races after lowering).

Registered into `ops.OPS` like `thread_ops`; the interpreter semantics are
`backends/interp/shared.py`, the lowering `passes/schedule/shared_buffers.py`.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import READS, SYNCHRONIZES, WRITES, _check_int_scalar, _check_mask, define, require
from .types import PointerType, ScalarType, SharedType, TileType, ViewType

# Elements narrower than a byte would let two threads share a byte of shared memory.
MIN_ELEMENT_BITS = 8


def _check_alloc(op) -> None:
    require(len(op.results) == 1, "smem_alloc has one result")
    t = op.results[0].type
    require(isinstance(t, SharedType), f"smem_alloc produces a shared buffer (smem<...>), got {t}")
    require(len(t.shape) >= 1 and all(d >= 1 for d in t.shape), f"smem_alloc needs a positive shape, got {t}")
    require(t.dtype.bits >= MIN_ELEMENT_BITS, f"shared buffers hold elements of at least one byte, got {t}")


def _buffer(t, op: str) -> SharedType:
    require(isinstance(t, SharedType), f"{op} needs a shared buffer (smem<...>), got {t}")
    return t


def _infer_slot(ts, a):
    buf = _buffer(ts[0], "smem_slot")
    require(len(buf.shape) >= 2, f"smem_slot selects along the leading dim of a buffer of rank >= 2, got {buf}")
    _check_int_scalar(ts[1], "smem_slot index")
    return [SharedType(buf.dtype, buf.shape[1:])]


def _infer_load(ts, a):
    buf = _buffer(ts[0], "smem_load")
    return [TileType(ScalarType(buf.dtype), buf.shape)]


def _infer_store(ts, a):
    buf = _buffer(ts[0], "smem_store")
    want = TileType(ScalarType(buf.dtype), buf.shape)
    require(ts[1] == want, f"smem_store of {ts[1]} into {buf}: the value must be {want}")
    return []


MBARRIER = SharedType(dt.i64, (1,))        # one mbarrier: a slot of a smem_mbarriers array


def is_mbarrier_array(t) -> bool:
    """`t` is the type `smem_mbarriers` produces: smem<N x 1 x i64>."""
    return isinstance(t, SharedType) and t.dtype == dt.i64 and len(t.shape) == 2 and t.shape[1] == 1


def copy_barrier(op):
    """The mbarrier operand of `smem_async_copy` `op` (its trailing smem<1xi64> operand), or None."""
    last = op.operands[-1]
    return last if len(op.operands) > 2 and isinstance(last.type, SharedType) else None


def _check_mbarriers(op) -> None:
    require(len(op.results) == 1 and is_mbarrier_array(op.results[0].type),
            f"smem_mbarriers produces an array of mbarriers, smem<N x 1 x i64>, got "
            f"{[str(r.type) for r in op.results]}")


def _infer_mbarrier_wait(ts, a):
    require(ts[0] == MBARRIER, f"smem_mbarrier_wait waits on one mbarrier ({MBARRIER}, a slot of smem_mbarriers), "
                               f"got {ts[0]}")
    _check_int_scalar(ts[1], "smem_mbarrier_wait parity")
    return []


def _infer_async_copy(ts, a):
    buf = _buffer(ts[0], "smem_async_copy")
    if len(ts) > 2 and isinstance(ts[-1], SharedType):
        require(ts[-1] == MBARRIER, f"smem_async_copy completes on one mbarrier ({MBARRIER}), got {ts[-1]}")
        ts = ts[:-1]
    src = ts[1]
    if isinstance(src, ViewType):
        require(src.dtype == buf.dtype, f"smem_async_copy from {src} into {buf}: the element types differ")
        require(len(ts) == 2 + src.rank and src.rank == len(buf.shape),
                f"smem_async_copy from a rank-{src.rank} view into {buf} takes {len(buf.shape)} element offsets "
                f"(and the view must have the buffer's rank), got {len(ts) - 2}")
        for t in ts[2:]:
            _check_int_scalar(t, "smem_async_copy offsets")
        return []
    want = TileType(PointerType(buf.dtype), buf.shape)
    require(src == want, f"smem_async_copy into {buf} copies from a view (and offsets) or from a {want}, got {src}")
    require(len(ts) <= 3, f"smem_async_copy from pointers takes the buffer, the pointers and a mask, got {len(ts)}")
    if len(ts) == 3:
        _check_mask(ts[2], src)
    return []


def _infer_wait(ts, a):
    require(a["pending"] >= 0, f"smem_async_wait pending must be >= 0, got {a['pending']}")
    return []


define("smem_alloc", "A shared-memory buffer of the result's shape and dtype for this program (contents undefined "
       "until written).", 0, check=_check_alloc, pure=False)
define("smem_slot", "The sub-buffer at `index` of the buffer's leading dim (no data moves).", 2, infer=_infer_slot)
define("smem_load", "The buffer's elements as a tile (every element must have been written, and no async copy into "
       "it may be in flight).", 1, infer=_infer_load, pure=False, **READS)
define("smem_store", "Write a tile into the buffer (no async copy into it may be in flight).", 2,
       infer=_infer_store, pure=False, **WRITES)
define("smem_async_copy", "Copy global memory into the buffer asynchronously: the view's block at element offsets "
       "(lanes outside the view write 0), or the elements a tile of pointers addresses (masked-off lanes write 0). "
       "The copy joins the open group (its bytes land when a smem_async_wait retires that group), or, with a trailing "
       "mbarrier operand, that mbarrier's current phase.", (2, -1),
       infer=_infer_async_copy, pure=False, **READS, **WRITES)
define("smem_async_commit", "Close the open group of smem_async_copy ops (later waits count it).", 0,
       infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define("smem_async_wait", "Retire committed copy groups, oldest first, until at most `pending` are in flight.", 0,
       attrs={"pending": "int"}, infer=_infer_wait, pure=False, **SYNCHRONIZES)
define("smem_barrier", "Wait for every thread of the program; orders shared-memory accesses around it.", 0,
       infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define("smem_mbarriers", "An array of mbarriers (smem<N x 1 x i64>) for this program, each in phase 0 with no "
       "copies.", 0, check=_check_mbarriers, pure=False)
define("smem_mbarrier_wait", "Wait until the current phase of the mbarrier, whose parity must be `parity`, completes "
       "(every copy issued onto it in that phase has landed); the phase then advances.", 2,
       infer=_infer_mbarrier_wait, pure=False, **SYNCHRONIZES)

# A whole program's buffers: no per-thread meaning (the lowering turns them into shared_alloc and friends).
SHARED_TILE_OPS = frozenset(("smem_alloc", "smem_slot", "smem_load", "smem_store", "smem_async_copy",
                             "smem_async_commit", "smem_async_wait", "smem_barrier", "smem_mbarriers",
                             "smem_mbarrier_wait"))
