"""The state of one tile -> thread lowering, and the helpers every op family uses.

A lowered tile is a `Regs`: a thread-IR value of type `regs<N x T>` (the N
registers one thread holds) and the layout that says which element each
register is. Scalars stay scalars (every thread computes the same value).

Index math. Under a layout, element coordinate d of (thread t, register j)
is a sum over the layout's modes of digit * (mode stride in the dim), each
digit taken from t or from j. So any linear function of the coordinates,
sum_d w_d * coord_d (a flat index, a shared-memory address, an arange),
splits into a *thread part*, computed once per kernel from `thread_id`
with shifts and masks (or div/rem when a mode is not a power of two) and
hoisted to the top of the kernel, plus a *register part*, a constant per
register. `index_regs` builds `splat(thread part) + pack(constants)`.

Moving a tile to another layout (`relayout`) is free when every thread
already holds the elements it needs, at the same registers in every
thread: then it is a renaming of registers (`extract` + `pack`). Otherwise
it goes through shared memory: the owners (replica 0 of each element)
store it row-major, a barrier, every thread loads what it needs, and a
second barrier so that the bytes can be reused. Shared-memory accesses are
vectorized (up to 16 bytes) where the layout's registers are contiguous.
Shared memory holds no pointers, so a tile of pointers needed in another
layout is rebuilt there from its splat / addptr / select / shape-op parts
(`materialize`); a pointer tile carried through a loop in one layout and
needed in another cannot be, and is a LoweringError.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator, Sequence

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Block, Function, Module, Operation, Value
from tessera.ir.layouts import RegisterLayout
from tessera.ir.target import Target
from tessera.ir.types import PointerType, RegsType, ScalarType, TileType, Type, ViewType

from ..errors import LoweringError
from ..layout_assignment import LayoutAssignment
from .vector_facts import VectorFacts

I32 = ScalarType(dt.i32)
CONSUMER_BARRIER_ID = 1        # the named barrier of a warp-specialized kernel's consumers (0 is bar.sync 0)
BOOL = ScalarType(dt.bool_)


@dataclass(frozen=True)
class Regs:
    """A lowered tile: its registers (a `regs<N x T>` value) and their layout."""

    value: Value
    layout: RegisterLayout

    @property
    def count(self) -> int:
        return self.value.type.count

    @property
    def element(self):
        return self.value.type.element


@dataclass(frozen=True)
class ViewParts:
    """A lowered tensor view: base pointer, sizes and strides as thread-IR scalars (no op of its own)."""

    base: Value
    sizes: tuple[Value, ...]
    strides: tuple[Value, ...]
    source: Operation           # the tile-IR make_view, for what the alignment analysis knows


@dataclass(frozen=True)
class Digit:
    """One digit of a layout: a mode (or a replication) read from the thread or the register index."""

    spatial: bool
    dim: int            # -1 for a replication digit
    size: int
    stride: int         # in the thread index (spatial) or the register index (local)
    dim_stride: int     # coordinate step along `dim` per unit of the digit (0 for replication)


@lru_cache(maxsize=None)
def layout_digits(layout: RegisterLayout) -> tuple[Digit, ...]:
    """Every digit of `layout`: spatial ones (replication included), then local ones."""
    sizes = layout.sizes
    dim_of, dim_stride = {}, {}
    for d, ids in enumerate(layout.dim_mode_ids):
        step = 1
        for e in reversed(ids):
            dim_of[e], dim_stride[e] = d, step
            step *= sizes[e]
    out = []
    for entries, spatial in ((layout.spatial_modes, True), (layout.local_modes, False)):
        stride = 1
        for e in reversed(entries):
            size = sizes[e] if e >= 0 else -e
            if e >= 0:
                out.append(Digit(spatial, dim_of[e], size, stride, dim_stride[e]))
            else:
                out.append(Digit(True, -1, size, stride, 0))
            stride *= size
    return tuple(out)


@lru_cache(maxsize=None)
def local_parts(layout: RegisterLayout) -> np.ndarray:
    """(registers, rank) coordinates each register holds in thread 0 (whose thread digits are all 0)."""
    return layout.table()[0]


@lru_cache(maxsize=4096)
def register_map(src: RegisterLayout, dst: RegisterLayout, weights: tuple[int, ...]) -> tuple[int, ...] | None:
    """Registers of `src` that give each register of `dst`, the same in every thread; None if there are none.

    Register j of `dst` must hold source element number sum_k weights[k] * coord_k
    (row-major in the source) of its own coordinates.
    """
    if src.num_threads != dst.num_threads:
        return None
    threads = np.arange(src.num_threads)[:, None]
    src_flat = (src.table() * np.asarray(row_major_strides(src.shape), np.int64)).sum(-1)
    holder = np.full((src.num_threads, math.prod(src.shape)), -1, np.int64)
    holder[threads, src_flat] = np.arange(src.local_size)[None, :]
    wanted = (dst.table() * np.asarray(weights, np.int64)).sum(-1)
    need = holder[threads, wanted]
    if (need < 0).any() or (need != need[0]).any():
        return None
    return tuple(int(i) for i in need[0])


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def shared_vector_width(layout: RegisterLayout, weights: Sequence[int], bits: int, max_vector_bits: int) -> int:
    """Registers of `bits` bits one shared-memory access may move when register j of `layout` goes to element
    sum_d w_d * coord_d: a power of two of registers contiguous along the last dim (weight 1) that every
    other weight keeps aligned, at most `max_vector_bits` wide."""
    if not layout.rank or weights[-1] != 1:
        return 1
    k = min(layout.local_contiguity(-1), max(1, max_vector_bits // max(bits, 8)))
    k = 1 << (k.bit_length() - 1)
    while k > 1 and any(w % k for w in weights[:-1]):
        k //= 2
    return k


def shared_dtype(dtype: dt.DType) -> dt.DType:
    """What a value of `dtype` is kept as in shared memory: sub-byte types widen to a byte (ints) or f32
    (floats), so that threads never share a byte; everything else is kept as is."""
    if dtype.bits >= 8:
        return dtype
    if dtype.is_float:
        return dt.f32
    return dt.i8 if dtype.is_signed else dt.u8


class Lowering:
    """Lowers one tile-IR function to thread IR; op families add to it through `LOWERINGS`."""

    def __init__(self, fn: Function, assignment: LayoutAssignment, target: Target, facts: VectorFacts | None = None):
        self.src = fn
        self.assignment = assignment
        self.target = target
        self.facts = facts or VectorFacts(fn)
        self.num_threads = assignment.num_threads
        self.warp_size = assignment.warp_size
        self.module = Module()
        self.b = Builder(self.module)
        attrs = dict(fn.attrs)
        attrs.update(num_threads=self.num_threads, warp_size=self.warp_size, target=target.name)
        self.fn = self.b.function(fn.name, [a.type for a in fn.args],
                                  [a.name_hint for a in fn.args], attrs)
        self.fn.loc = fn.loc
        self.env: dict[Value, Any] = {}
        for old, new in zip(fn.args, self.fn.args):
            if isinstance(old.type, TileType):
                raise LoweringError("tiles as kernel parameters have no thread-level form; pass a pointer and "
                                    "load the tile in the kernel", kernel=fn.name)
            if isinstance(old.type, ViewType):
                raise LoweringError("tensor views as kernel parameters are not lowered yet; pass the base "
                                    "pointer, sizes and strides and call make_view in the kernel", kernel=fn.name)
            self.env[old] = new
        self._prologue = 0
        self._hoisted: dict[tuple, Value] = {}
        self._hoisted_values: set[Value] = set()
        self._materialized: dict[tuple[Value, RegisterLayout, int], Regs] = {}
        self._memo: dict[tuple, Value] = {}       # extracts and splats, per block
        self.notes: list[str] = []
        # set by a warp-specialized loop (`warp_specialized.py`): the threads left after its producer
        # warpgroup exited, which every later barrier waits for
        self.consumer_threads: int | None = None
        # per-analysis memos of the lowering modules, keyed by a name of their choosing (e.g. the TMA plan of
        # each language mbarrier array, `smem_mbarriers.tma_boxes`, asked by its alloc, copies and waits)
        self.plans: dict[str, dict] = {}
        self.used: set[Value] = {v for op in fn.walk() for v in op.operands}

    # -- types and values -------------------------------------------------------

    def thread_type(self, value: Value) -> Type:
        t = value.type
        if isinstance(t, TileType):
            return RegsType(t.element, self.assignment.layout(value).local_size)
        return t

    def lookup(self, value: Value) -> Any:
        try:
            return self.env[value]
        except KeyError:
            raise LoweringError(f"internal error: {value!r} was not lowered before its use", kernel=self.src.name)

    def operand(self, op: Operation, index: int) -> Any:
        """Operand `index` of tile op `op`, lowered and converted to the layout `op` reads it in."""
        value = self.lookup(op.operands[index])
        want = self.assignment.conversions.get((op, index))
        if want is not None and isinstance(value, Regs) and value.layout != want:
            value = self.materialize(op.operands[index], want)
        return value

    def operands(self, op: Operation) -> list[Any]:
        return [self.operand(op, i) for i in range(len(op.operands))]

    def define(self, result: Value, lowered: Any, op: Operation | None = None) -> None:
        """Bind tile-IR `result` to its lowered form, converting to the assigned layout if needed."""
        if isinstance(lowered, Regs):
            want = self.assignment.layout(result)
            if lowered.layout != want:
                lowered = self.convert(lowered, want, op)
        thread_value = lowered.value if isinstance(lowered, Regs) else lowered
        if (isinstance(thread_value, Value) and not thread_value.name_hint and result.name_hint
                and thread_value not in self._hoisted_values):
            thread_value.name_hint = result.name_hint
        self.env[result] = lowered

    def thread_value(self, lowered: Any) -> Value:
        """The thread-IR value of a lowered operand (a Regs' registers, or the scalar itself)."""
        if isinstance(lowered, Regs):
            return lowered.value
        if isinstance(lowered, ViewParts):
            raise LoweringError("a tensor view cannot be carried through control flow or stored yet",
                                kernel=self.src.name)
        return lowered

    def error(self, op: Operation | None, message: str) -> LoweringError:
        return LoweringError(message, op, self.src.name)

    # -- creating ops ------------------------------------------------------------

    def create(self, name: str, operands: Sequence[Value] = (), attrs: dict | None = None,
               result_types: list[Type] | None = None, regions: list[Block] | None = None) -> Operation:
        return self.b.create(name, list(operands), attrs, result_types, regions)

    def emit(self, name: str, *operands: Value, attrs: dict | None = None, type: Type | None = None) -> Value:
        """One op with one result at the insertion point."""
        return self.create(name, operands, attrs, [type] if type is not None else None).result

    def hoist(self, name: str, operands: Sequence[Value] = (), attrs: dict | None = None,
              type: Type | None = None) -> Value:
        """One op with one result in the kernel's prologue (operands must be hoisted too), created once."""
        attrs = dict(attrs or {})
        key = (name, tuple(id(v) for v in operands), tuple(sorted((k, repr(v)) for k, v in attrs.items())), type)
        value = self._hoisted.get(key)
        if value is None:
            saved_loc, self.b.loc = self.b.loc, None
            with self.b.at(Block()) as scratch:
                op = self.create(name, operands, attrs, [type] if type is not None else None)
            self.b.loc = saved_loc
            scratch.ops.clear()
            self.fn.body.ops.insert(self._prologue, op)
            op.parent = self.fn.body
            self._prologue += 1
            value = self._hoisted[key] = op.result
            self._hoisted_values.add(value)
        return value

    def const(self, value, dtype: dt.DType = dt.i32) -> Value:
        return self.hoist("constant", attrs={"value": _attr_value(value, dtype)}, type=ScalarType(dtype))

    def const_regs(self, values: Sequence, dtype: dt.DType) -> Value:
        """A regs<N x dtype> holding `values`, hoisted."""
        values = [_attr_value(v, dtype) for v in values]
        t = RegsType(ScalarType(dtype), len(values))
        if all(v == values[0] for v in values):
            return self.hoist("constant", attrs={"value": values[0]}, type=t)
        return self.hoist("pack", [self.const(v, dtype) for v in values])

    def extract(self, regs: Value, index: int) -> Value:
        key = ("extract", regs, index, id(self.b.block))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.emit("extract", regs, attrs={"index": index})
        return value

    def unpack(self, regs: Value) -> list[Value]:
        return [self.extract(regs, i) for i in range(regs.type.count)]

    def pack(self, scalars: Sequence[Value]) -> Value:
        """A register array from scalars (the source array itself when they are all of its registers, in order)."""
        first = scalars[0]
        owner = first.owner
        if isinstance(owner, Operation) and owner.name == "extract":
            source = owner.operands[0]
            if source.type.count == len(scalars) and all(
                    isinstance(s.owner, Operation) and s.owner.name == "extract" and s.owner.operands[0] is source
                    and s.owner.attrs["index"] == i for i, s in enumerate(scalars)):
                return source
        return self.emit("pack", *scalars)

    def splat(self, scalar: Value, count: int) -> Value:
        key = ("splat", scalar, count, id(self.b.block))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self.emit("splat", scalar, type=RegsType(scalar.type, count))
        return value

    def cast(self, value: Value, dtype: dt.DType) -> Value:
        t = value.type
        target = RegsType(ScalarType(dtype), t.count) if isinstance(t, RegsType) else ScalarType(dtype)
        return value if t == target else self.emit("cast", value, type=target)

    # -- thread ids and index math ------------------------------------------------

    @property
    def thread_id(self) -> Value:
        return self.hoist("thread_id")

    def thread_digit(self, stride: int, size: int) -> Value:
        """(thread_id / stride) % size, hoisted."""
        x = self.thread_id
        if _pow2(stride) and _pow2(size):
            if stride > 1:
                x = self.hoist("shr", [x, self.const(stride.bit_length() - 1)])
            if stride * size < self.num_threads:
                x = self.hoist("and", [x, self.const(size - 1)])
            return x
        if stride > 1:
            x = self.hoist("div", [x, self.const(stride)])
        if stride * size < self.num_threads:
            x = self.hoist("rem", [x, self.const(size)])
        return x

    def hoisted_affine(self, x: Value, scale: int = 1, bias: int = 0) -> Value:
        """x * scale + bias for a hoisted i32 `x`, hoisted (no op for the identity parts)."""
        if scale != 1:
            x = self.hoist("mul", [x, self.const(scale)])
        if bias:
            x = self.hoist("add", [x, self.const(bias)])
        return x

    def thread_part(self, layout: RegisterLayout, weights: Sequence[int]) -> Value | None:
        """sum_d weights[d] * (thread part of coord d), as a hoisted i32; None when it is 0."""
        total = None
        for digit in layout_digits(layout):
            if not digit.spatial or digit.dim < 0:
                continue
            scale = digit.dim_stride * weights[digit.dim]
            if scale == 0:
                continue
            term = self.hoisted_affine(self.thread_digit(digit.stride, digit.size), scale)
            total = term if total is None else self.hoist("add", [total, term])
        return total

    def index_regs(self, layout: RegisterLayout, weights: Sequence[int], offset: Value | None = None,
                   bias: int = 0, dtype: dt.DType = dt.i32) -> Value:
        """regs<N x dtype>: sum_d weights[d] * coord_d + offset + bias for each of this thread's registers."""
        count = layout.local_size
        consts = (local_parts(layout) * np.asarray(weights, np.int64)).sum(-1) + bias if layout.rank else \
            np.full(count, bias, np.int64)
        scalar = self.thread_part(layout, weights)
        if scalar is not None and dtype != dt.i32:
            scalar = self.hoist("cast", [scalar], type=ScalarType(dtype))
        if offset is not None:
            offset = self.cast(offset, dtype)
            scalar = offset if scalar is None else self.emit("add", scalar, offset)
        if scalar is None:
            return self.const_regs(consts.tolist(), dtype)
        if not consts.any():
            return self.splat(scalar, count)
        return self.emit("add", self.splat(scalar, count), self.const_regs(consts.tolist(), dtype))

    def owner_predicate(self, layout: RegisterLayout) -> Value | None:
        """A hoisted bool: this thread is replica 0 of the elements it holds; None when nothing is replicated."""
        pred = None
        for digit in layout_digits(layout):
            if digit.dim >= 0:
                continue
            zero = self.hoist("cmp", [self.thread_digit(digit.stride, digit.size), self.const(0)], {"pred": "eq"})
            pred = zero if pred is None else self.hoist("and", [pred, zero])
        return pred

    def first_thread(self) -> Value:
        return self.hoist("cmp", [self.thread_id, self.const(0)], {"pred": "eq"})

    @contextmanager
    def when(self, cond: Value) -> Iterator[None]:
        """Ops emitted in the `with` block run only where `cond` holds: `if cond { ... }`, no else, no results."""
        then, otherwise = Block(), Block()
        with self.b.at(then):
            yield
            self.create("yield")
        with self.b.at(otherwise):
            self.create("yield")
        self.create("if", [cond], None, [], [then, otherwise])

    # -- shared memory -------------------------------------------------------------

    def shared_alloc(self, dtype: dt.DType, count: int, align: int | None = None) -> Value:
        nbytes = max(1, (count * dtype.bits + 7) // 8)
        attrs = {"bytes": nbytes, "offset": -1} | ({"align": align} if align else {})
        return self.emit("shared_alloc", attrs=attrs,
                         type=PointerType(dtype, "shared"))

    def mbarriers(self, count: int, arrivals: int) -> Value:
        """`count` mbarriers in shared memory, each expecting `arrivals` arrivals a phase, initialized by
        thread 0 and made visible to every thread and to the async proxy (TMA) before anyone uses them."""
        bars = self.shared_alloc(dt.i64, count, align=8)
        self.init_mbarriers(bars, count, arrivals)
        return bars

    def init_mbarriers(self, bars: Value, count: int, arrivals: int) -> None:
        with self.when(self.first_thread()):
            for s in range(count):
                self.create("mbarrier_init", [self.emit("addptr", bars, self.const(s)), self.const(arrivals)])
            self.create("fence_mbarrier_init")
        self.barrier()

    def barrier(self) -> None:
        """Every thread of the block waits; after a warp-specialized loop, every consumer thread (the producer
        warpgroup has exited, so a CTA-wide barrier would never complete)."""
        if self.consumer_threads is None:
            self.create("barrier")
        else:
            self.create("named_barrier", attrs={"id": CONSUMER_BARRIER_ID, "count": self.consumer_threads})

    def shared_vector(self, layout: RegisterLayout, weights: Sequence[int], dtype: dt.DType) -> int:
        """Registers one shared-memory access may move when register j goes to element sum_d w_d * coord_d."""
        return shared_vector_width(layout, tuple(weights), dtype.bits, self.target.max_vector_bits)

    def shared_access(self, name: str, base: Value, layout: RegisterLayout, weights: Sequence[int],
                      value: Value | None = None, mask: Value | None = None,
                      offset: Value | None = None) -> Value | None:
        """Load (value None) or store registers of `layout` at elements sum_d w_d * coord_d (+ offset) of `base`."""
        count = layout.local_size
        index = self.index_regs(layout, weights, offset)
        ptrs = self.emit("addptr", self.splat(base, count), index)
        k = self.shared_vector(layout, weights, base.type.pointee) if offset is None else 1
        attrs = {"vector": k} if k > 1 else None
        if name == "load":
            return self.emit("load", ptrs, attrs=attrs)
        operands = [ptrs, value] + ([mask] if mask is not None else [])
        self.create("store", operands, attrs)
        return None

    def to_shared(self, regs: Regs, dtype: dt.DType | None = None) -> Value:
        """Store a tile row-major into a fresh shared buffer (owners only), then a barrier; the buffer."""
        layout = regs.layout
        if isinstance(regs.element, PointerType):
            raise LoweringError("a tile of pointers cannot go through shared memory; build the pointers "
                                "after the layout change (convert the offsets instead)", kernel=self.src.name)
        source = regs.element.dtype
        dtype = dtype or shared_dtype(source)
        buf = self.shared_alloc(dtype, math.prod(layout.shape))
        owner = self.owner_predicate(layout)
        mask = self.splat(owner, regs.count) if owner is not None else None
        self.shared_access("store", buf, layout, row_major_strides(layout.shape), self.cast(regs.value, dtype), mask)
        self.barrier()
        return buf

    def from_shared(self, buf: Value, layout: RegisterLayout, weights: Sequence[int], dtype: dt.DType) -> Value:
        """Load registers of `layout` from a buffer `to_shared` filled, then a barrier; cast back to `dtype`."""
        loaded = self.shared_access("load", buf, layout, weights)
        self.barrier()
        return self.cast(loaded, dtype)

    # -- moving tiles between layouts ---------------------------------------------

    def relayout(self, regs: Regs, dst: RegisterLayout, weights: Sequence[int], op: Operation | None = None) -> Regs:
        """Registers of `dst` where register j holds source element (row-major) sum_k weights[k] * coord_k."""
        weights = tuple(int(w) for w in weights)
        mapping = register_map(regs.layout, dst, weights)
        if mapping is not None:
            if mapping == tuple(range(regs.count)):
                return Regs(regs.value, dst)
            return Regs(self.pack([self.extract(regs.value, i) for i in mapping]), dst)
        if isinstance(regs.element, PointerType):
            raise self.error(op, f"a tile of pointers would have to move from layout {regs.layout} to {dst} "
                                 "through shared memory, which cannot hold pointers; compute the pointers from "
                                 "offsets in the layout they are used in")
        buf = self.to_shared(regs)
        return Regs(self.from_shared(buf, dst, weights, regs.element.dtype), dst)

    def convert(self, regs: Regs, dst: RegisterLayout, op: Operation | None = None) -> Regs:
        """The same tile in layout `dst`."""
        if regs.layout == dst:
            return regs
        return self.relayout(regs, dst, row_major_strides(dst.shape), op)

    def materialize(self, value: Value, layout: RegisterLayout) -> Regs:
        """Tile-IR `value` in registers of `layout`; tiles of pointers are rebuilt from their parts.

        Shared memory holds no pointers, so a tile of pointers needed in
        another layout is recomputed there: a splat is splat again, an addptr
        adds its offsets converted to the layout, and a shape op
        (broadcast, ...) rebuilds its operand in the layout from which it
        needs no data movement.
        """
        lowered = self.env.get(value)
        if isinstance(lowered, Regs) and lowered.layout == layout:
            return lowered
        if not isinstance(value.type.element, PointerType):
            return self.convert(self.lookup(value), layout)
        key = (value, layout, id(self.b.block))
        if key in self._materialized:
            return self._materialized[key]
        op = value.owner
        fail = self.error(op if isinstance(op, Operation) else None,
                          f"a tile of pointers is needed in layout {layout}, but shared memory cannot hold "
                          "pointers and it is not built from a splat, addptr, select or shape op here; compute "
                          "the pointers from offsets in the layout they are used in")
        if not isinstance(op, Operation):
            raise fail
        t = RegsType(value.type.element, layout.local_size)
        if op.name == "splat":
            regs = Regs(self.splat(self.lookup(op.operands[0]), layout.local_size), layout)
        elif op.name in ("addptr", "select"):
            parts = [self.materialize(v, layout).value for v in op.operands]
            regs = Regs(self.emit(op.name, *parts, type=t), layout)
        elif op.name in ("broadcast", "expand_dims", "permute", "reshape"):
            from ..layout_assignment import derived
            from .shape import source_weights
            backward = [derive for source, target, derive in derived(op) if source is value]
            if not backward:
                raise fail
            source = self.materialize(op.operands[0], backward[0](layout))
            regs = self.relayout(source, layout, source_weights(op), op)
        else:
            raise fail
        self._materialized[key] = regs
        return regs

    def broadcast_from_owners(self, regs: Regs) -> Regs:
        """Give replicas the values their owners hold (after an op only the owners performed)."""
        if regs.layout.is_bijective:
            return regs
        buf = self.to_shared(regs)
        layout = regs.layout
        return Regs(self.from_shared(buf, layout, row_major_strides(layout.shape), regs.element.dtype), layout)

    def broadcast_scalar_from_first(self, value: Value) -> Value:
        """Every thread gets thread 0's `value` (through one element of shared memory)."""
        dtype = value.type.dtype
        sdtype = shared_dtype(dtype)
        buf = self.shared_alloc(sdtype, 1)
        self.create("store", [buf, self.cast(value, sdtype), self.first_thread()])
        self.barrier()
        loaded = self.emit("load", buf)
        self.barrier()
        return self.cast(loaded, dtype)

    # -- regions ---------------------------------------------------------------------

    def lower_block(self, block: Block, into: Block, args: Sequence[Any]) -> None:
        """Lower the ops of tile-IR `block` into thread-IR block `into`, its arguments bound to `args`."""
        from . import lower_op
        for old, new in zip(block.args, args):
            self.env[old] = new
        with self.b.at(into):
            for op in block.ops:
                lower_op(self, op)

    def region_args(self, block: Block, into: Block) -> list[Any]:
        """Lowered forms of `block`'s arguments, given the thread-IR block whose arguments stand for them."""
        out = []
        for old, new in zip(block.args, into.args):
            out.append(Regs(new, self.assignment.layout(old)) if isinstance(old.type, TileType) else new)
        return out

    def new_block(self, block: Block) -> Block:
        """A thread-IR block with the lowered types of `block`'s arguments."""
        return Block([self.thread_type(a) for a in block.args], [a.name_hint for a in block.args])


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _attr_value(value, dtype: dt.DType):
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(value)
    return float(value)

