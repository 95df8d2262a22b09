"""`SharedExchange`: values that threads exchange through shared memory, and the mbarriers they wait on.

A tile that must reach threads that do not hold it (another layout, the
replicas of an owner's result) goes through a fresh shared buffer: its
owners (replica 0 of each element) store it row-major, a barrier, every
thread loads what it needs, and a second barrier so that the bytes can be
reused. Accesses are vectorized (up to the target's widest access) where
the layout's registers are contiguous. Shared memory holds no pointers, so a
tile of pointers never comes here (`relayout.materialize` rebuilds it).
Buffers come out unplaced (`shared_alloc {offset = -1}`); the allocator
(`passes/shared_memory.py`) places them.
"""

from __future__ import annotations

import math
from typing import Sequence

from tessera.ir import dtypes as dt
from tessera.ir.core import Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.target import Target
from tessera.ir.types import PointerType

from ..errors import LoweringError
from .emitter import Emitter
from .layout_math import row_major_strides, shared_dtype, shared_vector_width
from .thread_groups import ThreadGroups
from .thread_index import ThreadIndex
from .values import Regs


class SharedExchange:
    """Shared-memory buffers, exchanges and mbarriers of kernel `kernel` on `target`."""

    def __init__(self, out: Emitter, index: ThreadIndex, threads: ThreadGroups, target: Target, kernel: str):
        self.out, self.index, self.threads = out, index, threads
        self.target = target
        self.kernel = kernel

    def alloc(self, dtype: dt.DType, count: int, align: int | None = None, whole_kernel: bool = False,
              ring_stages: int | None = None) -> Value:
        """An unplaced buffer of `count` elements of `dtype` (a pointer to its first); `whole_kernel`: its bytes
        are never given to another buffer; `ring_stages`: it is a pipelined loop's ring of that many slots."""
        nbytes = max(1, (count * dtype.bits + 7) // 8)
        attrs = {"bytes": nbytes, "offset": -1} | ({"align": align} if align else {}) | \
            ({"whole_kernel": True} if whole_kernel else {}) | ({"ring_stages": ring_stages} if ring_stages else {})
        return self.out.emit("shared_alloc", attrs=attrs, type=PointerType(dtype, "shared"))

    def mbarriers(self, count: int, arrivals: int, whole_kernel: bool = False) -> Value:
        """`count` mbarriers in shared memory, each expecting `arrivals` arrivals a phase, initialized by
        thread 0 and made visible to every thread and to the async proxy (TMA) before anyone uses them."""
        bars = self.alloc(dt.i64, count, align=8, whole_kernel=whole_kernel)
        self.init_mbarriers(bars, count, arrivals)
        return bars

    def init_mbarriers(self, bars: Value, count: int, arrivals: int) -> None:
        out = self.out
        with out.when(self.index.first_thread()):
            for s in range(count):
                out.create("mbarrier_init", [out.emit("addptr", bars, out.const(s)), out.const(arrivals)])
            out.create("fence_mbarrier_init")
        self.threads.barrier()

    def vector_width(self, layout: RegisterLayout, weights: Sequence[int], dtype: dt.DType) -> int:
        """Registers one shared-memory access may move when register j goes to element sum_d w_d * coord_d."""
        return shared_vector_width(layout, tuple(weights), dtype.bits, self.target.max_vector_bits)

    def access(self, name: str, base: Value, layout: RegisterLayout, weights: Sequence[int],
               value: Value | None = None, mask: Value | None = None, offset: Value | None = None) -> Value | None:
        """Load (value None) or store registers of `layout` at elements sum_d w_d * coord_d (+ offset) of `base`."""
        out, count = self.out, layout.local_size
        index = self.index.regs(layout, weights, offset)
        ptrs = out.emit("addptr", out.splat(base, count), index)
        k = self.vector_width(layout, weights, base.type.pointee) if offset is None else 1
        attrs = {"vector": k} if k > 1 else None
        if name == "load":
            return out.emit("load", ptrs, attrs=attrs)
        operands = [ptrs, value] + ([mask] if mask is not None else [])
        out.create("store", operands, attrs)
        return None

    def to_shared(self, regs: Regs, dtype: dt.DType | None = None) -> Value:
        """Store a tile row-major into a fresh shared buffer (owners only), then a barrier; the buffer."""
        layout = regs.layout
        if isinstance(regs.element, PointerType):
            raise LoweringError("a tile of pointers cannot go through shared memory; build the pointers "
                                "after the layout change (convert the offsets instead)", kernel=self.kernel)
        source = regs.element.dtype
        dtype = dtype or shared_dtype(source)
        buf = self.alloc(dtype, math.prod(layout.shape))
        owner = self.index.owner_predicate(layout)
        mask = self.out.splat(owner, regs.count) if owner is not None else None
        self.access("store", buf, layout, row_major_strides(layout.shape), self.out.cast(regs.value, dtype), mask)
        self.threads.barrier()
        return buf

    def from_shared(self, buf: Value, layout: RegisterLayout, weights: Sequence[int], dtype: dt.DType) -> Value:
        """Load registers of `layout` from a buffer `to_shared` filled, then a barrier; cast back to `dtype`."""
        loaded = self.access("load", buf, layout, weights)
        self.threads.barrier()
        return self.out.cast(loaded, dtype)

    def broadcast_from_owners(self, regs: Regs) -> Regs:
        """Give replicas the values their owners hold (after an op only the owners performed)."""
        if regs.layout.is_bijective:
            return regs
        buf = self.to_shared(regs)
        layout = regs.layout
        return Regs(self.from_shared(buf, layout, row_major_strides(layout.shape), regs.element.dtype), layout)

    def broadcast_scalar_from_first(self, value: Value) -> Value:
        """Every thread gets thread 0's `value` (through one element of shared memory)."""
        out, dtype = self.out, value.type.dtype
        sdtype = shared_dtype(dtype)
        buf = self.alloc(sdtype, 1)
        out.create("store", [buf, out.cast(value, sdtype), self.index.first_thread()])
        self.threads.barrier()
        loaded = out.emit("load", buf)
        self.threads.barrier()
        return out.cast(loaded, dtype)
