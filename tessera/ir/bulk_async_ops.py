"""Thread-level ops for sm_90 asynchronous data movement: mbarriers and TMA box copies.

An *mbarrier* is an 8-byte object in shared memory (`ptr<i64, shared>`)
that counts arrivals and transaction bytes for its current *phase*. The
phase completes when every expected thread has arrived and every expected
byte has landed; the barrier then moves to the next phase (parity flips)
and re-arms with the same arrival count. Waits name the *parity* of the
phase they wait for, as PTX `mbarrier.try_wait.parity` does: a wait for
parity p returns once the current phase's parity is no longer p, i.e. once
the phase with parity p has completed. A ring of stages therefore waits on
parity 0, 1, 0, 1, ... as it reuses each stage's barrier.

A *TMA load* (`cp.async.bulk.tensor`) copies one box of a global tensor,
described by a 128-byte `CUtensorMap` passed by value as a `tensormap`
kernel parameter (a grid constant in parameter space), into shared memory
and reports its bytes to an mbarrier (`complete_tx`); the box shape, dtype,
strides and swizzle live in the map, so the op carries only coordinates.
Out-of-bounds elements of the box are written as zeros.

A *TMA store* (`tma_store`, cp.async.bulk.tensor ... global.shared::cta ...
bulk_group) is the reverse: one box of shared memory, laid out (and
swizzled) as the map says, is written to the global tensor; elements of the
box outside the tensor are not written (TMA clips stores). It reports to no
mbarrier: the issuing thread groups its stores with `bulk_commit_group` and
`bulk_wait_group_read {pending = N}` waits until all but the N newest groups
have finished *reading* shared memory, after which the buffer may be
rewritten or the block may exit. Their global writes may still be under way:
`bulk_wait_group {pending = N}` (without .read) waits until those groups are
*complete*, writes performed and visible to the issuing thread; PTX follows
the completion with an implicit generic-async proxy fence (ISA, "Async
proxy"), so from then on the thread's generic accesses, and a release after
them, order the writes like its own stores. The shared bytes must be written by the
threads and then made visible to the async proxy by `fence_proxy_async` of
each writing thread and a `barrier`, before the one thread issues the store.

Ordering rules the ops encode (PTX ISA, "mbarrier" and "tensor copy"):

* `mbarrier_init` is a plain write; other threads may use the barrier only
  after a `barrier`, and the TMA engine (the *async proxy*) only after a
  `fence_mbarrier_init` (fence.mbarrier_init.release.cluster) or
  `fence_proxy_async` (fence.proxy.async.shared::cta) by the initializing thread.
* the bytes a `tma_load` writes may be read only after an `mbarrier_wait`
  that observes the completion of the phase that counted them.
* the bytes a `tma_store` reads may be written again (and the block may end)
  only after the issuing thread's `bulk_wait_group_read` retires its group.
* the global memory a `tma_store` writes may be read or written by the
  generic proxy (any thread, this block's or, after a release, another's)
  only after the issuing thread's `bulk_wait_group` completes its group
  (`schedule/tma_store.py` waits so where the kernel reads that memory, and
  before every release).

Coordinates are in elements, outermost dimension first (numpy order, as
tiles are indexed everywhere in Tessera); the backend reverses them into
PTX's innermost-first order. Registered into `ops.OPS` like `thread_ops`.
"""

from __future__ import annotations

from . import dtypes as dt
from .ops import SYNCHRONIZES, require
from .thread_ops import define_thread_op
from .types import PointerType, ScalarType, TensorMapType

MBARRIER = PointerType(dt.i64, "shared")
TENSOR_MAP = TensorMapType()              # the CUtensorMap's 128 bytes, a by-value kernel parameter
TMA_MAX_RANK = 5
_I32 = ScalarType(dt.i32)


def _require_bar(t, op: str) -> None:
    require(t == MBARRIER, f"{op} takes an mbarrier, a {MBARRIER} (8 bytes of shared memory), got {t}")


def _require_i32(t, op: str, what: str) -> None:
    require(t == _I32, f"{op} {what} must be i32, got {t}")


def _infer_init(ts, a):
    bar, count = ts
    _require_bar(bar, "mbarrier_init")
    _require_i32(count, "mbarrier_init", "arrival count")
    return []


def _infer_inval(ts, a):
    _require_bar(ts[0], "mbarrier_inval")
    return []


def _infer_arrive(ts, a):
    _require_bar(ts[0], "mbarrier_arrive")
    return []


def _infer_arrive_expect_tx(ts, a):
    bar, tx = ts
    _require_bar(bar, "mbarrier_arrive_expect_tx")
    _require_i32(tx, "mbarrier_arrive_expect_tx", "transaction byte count")
    return []


def _infer_expect_tx(ts, a):
    bar, tx = ts
    _require_bar(bar, "mbarrier_expect_tx")
    _require_i32(tx, "mbarrier_expect_tx", "transaction byte count")
    return []


def _infer_wait(ts, a):
    bar, parity = ts
    _require_bar(bar, "mbarrier_wait")
    _require_i32(parity, "mbarrier_wait", "phase parity")
    return []


def _infer_tma_load(ts, a):
    dst, tensor_map, *coords, bar = ts
    require(isinstance(dst, PointerType) and dst.address_space == "shared" and dst.pointee.bits >= 8,
            f"tma_load writes a box into shared memory: its first operand is a ptr<T, shared> of a type of at "
            f"least one byte, got {dst}")
    require(tensor_map == TENSOR_MAP, f"tma_load's second operand is the tensor map, a {TENSOR_MAP} kernel "
                                      f"parameter (the 128-byte CUtensorMap, passed by value), got {tensor_map}")
    require(1 <= len(coords) <= TMA_MAX_RANK, f"tma_load takes 1 to {TMA_MAX_RANK} coordinates (one per tensor "
                                              f"dimension), got {len(coords)}")
    for i, c in enumerate(coords):
        _require_i32(c, "tma_load", f"coordinate {i}")
    _require_bar(bar, "tma_load (last operand)")
    mask = a.get("multicast", 0)
    require(0 <= mask < 1 << 16, f"tma_load multicast is a mask of the cluster's (at most 16) block ranks, got {mask}")
    return []


def _infer_tma_store(ts, a):
    src, tensor_map, *coords = ts
    require(isinstance(src, PointerType) and src.address_space == "shared" and src.pointee.bits >= 8,
            f"tma_store reads a box from shared memory: its first operand is a ptr<T, shared> of a type of at "
            f"least one byte, got {src}")
    require(tensor_map == TENSOR_MAP, f"tma_store's second operand is the tensor map, a {TENSOR_MAP} kernel "
                                      f"parameter (the 128-byte CUtensorMap, passed by value), got {tensor_map}")
    require(1 <= len(coords) <= TMA_MAX_RANK, f"tma_store takes 1 to {TMA_MAX_RANK} coordinates (one per tensor "
                                              f"dimension), got {len(coords)}")
    for i, c in enumerate(coords):
        _require_i32(c, "tma_store", f"coordinate {i}")
    return []


def _bulk_wait(name: str):
    def infer(ts, a):
        require(a["pending"] >= 0, f"{name} pending must be >= 0, got {a['pending']}")
        return []
    return infer


define_thread_op("mbarrier_init", "Initialize the mbarrier at `bar` for `count` arrivals per phase, in phase 0 with "
                 "no transaction bytes (mbarrier.init.shared.b64). One thread initializes; the others may use it "
                 "after a `barrier`, TMA after a `fence_mbarrier_init`.", 2, infer=_infer_init, pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_inval", "End the mbarrier at `bar` (mbarrier.inval.shared.b64): required before its "
                 "bytes are initialized again or reused for anything else; no copy may still count on it.", 1,
                 infer=_infer_inval, pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_arrive", "This thread arrives on `bar`'s current phase (mbarrier.arrive.shared.b64, "
                 "release at CTA scope).", 1, infer=_infer_arrive, pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_arrive_expect_tx", "Raise `bar`'s expected transaction bytes by `tx_bytes`, then arrive "
                 "(mbarrier.arrive.expect_tx.shared.b64): the phase completes only when those bytes have also "
                 "landed (see tma_load).", 2, infer=_infer_arrive_expect_tx, pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_expect_tx", "Raise `bar`'s expected transaction bytes by `tx_bytes` without arriving "
                 "(mbarrier.expect_tx.relaxed.cta.shared.b64): copies announced one at a time before the phase's "
                 "arrival (a later mbarrier_arrive).", 2, infer=_infer_expect_tx, pure=False, **SYNCHRONIZES)
define_thread_op("mbarrier_wait", "Block until the phase of `bar` with parity `phase` (0 or 1) has completed "
                 "(a mbarrier.try_wait.parity.shared.b64 loop, acquire at CTA scope); afterwards this thread sees "
                 "every write the phase's arrivals and transactions released.", 2, infer=_infer_wait, pure=False, **SYNCHRONIZES)
define_thread_op("fence_mbarrier_init", "Make this thread's prior mbarrier_init visible to the async proxy (TMA) "
                 "and the cluster (fence.mbarrier_init.release.cluster).", 0, infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("fence_proxy_async", "Order this thread's prior shared-memory accesses (mbarrier inits included) "
                 "before later async-proxy operations such as tma_load (fence.proxy.async.shared::cta).", 0,
                 infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("fence_proxy_async_global", "Order the global memory this thread has seen written by the generic "
                 "proxy (other programs' stores it acquired through an atomic, directly or after a barrier) before "
                 "its later async-proxy reads of global memory such as tma_load (fence.proxy.async.global).", 0,
                 infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("tma_load", "Copy the box at element `coords` (outermost first) of the tensor that `tensor_map` "
                 "describes into shared memory at `dst` (cp.async.bulk.tensor.<rank>d.shared::cluster.global.tile."
                 "mbarrier::complete_tx::bytes), out-of-bounds elements zero-filled, and count its bytes as "
                 "transactions of `bar`'s current phase. Issued by one thread; `dst` must be 128-byte aligned "
                 "(1024 with a 128B swizzle). `multicast` (a mask of cluster ranks, `cluster_ops.py`): the box "
                 "lands at `dst`'s offset, and completes the mbarrier at `bar`'s offset, in every block of the "
                 "cluster whose bit is set (.multicast::cluster).", (4, 3 + TMA_MAX_RANK),
                 optional_attrs={"multicast": "int"}, infer=_infer_tma_load, pure=False, **SYNCHRONIZES)
define_thread_op("tma_store", "Write the box of shared memory at `src` to the tensor that `tensor_map` describes "
                 "at element `coords` (outermost first) (cp.async.bulk.tensor.<rank>d.global.shared::cta.tile."
                 "bulk_group); box elements outside the tensor are not written. Issued by one thread, after the "
                 "writers' fence_proxy_async and a barrier; `src` must be 128-byte aligned (1024 with a 128B "
                 "swizzle). Joins the thread's open bulk group (bulk_commit_group).", (3, 2 + TMA_MAX_RANK),
                 infer=_infer_tma_store, pure=False, **SYNCHRONIZES)
define_thread_op("bulk_commit_group", "Close this thread's open group of tma_stores (cp.async.bulk.commit_group).",
                 0, infer=lambda ts, a: [], pure=False, **SYNCHRONIZES)
define_thread_op("bulk_wait_group_read", "Wait until at most `pending` of this thread's committed bulk groups are "
                 "still reading shared memory (cp.async.bulk.wait_group.read): their source buffers may then be "
                 "rewritten, and with pending = 0 the block may exit.", 0, attrs={"pending": "int"},
                 infer=_bulk_wait("bulk_wait_group_read"), pure=False, **SYNCHRONIZES)
define_thread_op("bulk_wait_group", "Wait until at most `pending` of this thread's committed bulk groups are "
                 "incomplete (cp.async.bulk.wait_group): the others have read their shared memory and their global "
                 "writes are performed and visible to this thread, through the generic proxy too (completion "
                 "implies a generic-async proxy fence), so a release after it publishes them.", 0,
                 attrs={"pending": "int"}, infer=_bulk_wait("bulk_wait_group"), pure=False, **SYNCHRONIZES)
