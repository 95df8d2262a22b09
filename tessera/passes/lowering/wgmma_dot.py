"""dot on wgmma (sm_90a): operands in shared memory in a form wgmma reads, one wgmma per slab and 16-wide K slice.

`mma.mma_plan` picks wgmma m64nNk16 and puts the accumulator in
`local(RM, RN) . replicated(WR) . spatial(WM, 1) . wgmma_accumulator(n)`:
warpgroup g (thread digit 128, WM) holds the 64-row slabs rm * WM + g
(the local digit is the most significant).

Each operand is a tile in shared memory laid out as a `WgmmaTileLayout`
(`SharedOperand`), from one of two places:

* a register tile: its owners store it (`store_operand`) K-major,
      A (M x K)   as it is: row m, col k of an M x K tile
      B (K x N)   transposed: row n, col k of an N x K tile
  swizzled by the widest of 128/64/32 bytes that divides a row's K bytes,
  the buffer aligned to its swizzle pattern (1024 bytes for 128B); except
  a 16-bit B whose registers run along N (a row-major block's load), which
  is stored as it is, MN-major (row k, col n of a K x N tile, swizzled as a
  pipelined MN-major slot is) and read with trans_b: wide stores instead of
  one store per element of a transpose. Then fence_proxy_async and a barrier;
* a software-pipelined load: its cp.async ring slot (`values.RingOperand`),
  K-major, or MN-major with the wgmma's trans_a / trans_b set; no store, and
  the loop already fenced and published the slot.

Then

    wgmma_fence
    for each slab rm, column block rn, K slice s: %d = wgmma desc(A, rm, s), desc(B, rn, s), %d
    wgmma_commit; wgmma_wait {pending = F}; (barrier, if the dot stored a tile)

with descriptors from `WgmmaTileLayout.descriptor`, each made as the tile's (or
ring's) descriptor plus the slice's (and slot's) offset / 16 added to the
start-address field; warpgroup g's slab of A is a constant step further on,
applied to the pointer before the descriptor is made (`SharedOperand.descriptor`
says why). F is 0, except when both operands are ring slots and the
plan allows it (`RingOperand.in_flight`) and the loop carries the
accumulator in the wgmma fragment layout itself (layout assignment may have
given the carried value another layout, e.g. the one of the store after the
loop: then it is converted around the dot every iteration, which reads the
result at once, so F = 0; waiting for more groups than the plan's prefetch
distance assumed is always safe): then the accumulator stays in the
wgmma registers, F = 1 and there is no barrier: the group is still in flight
when the loop yields the result, and the next iteration's wgmmas chain onto
it (`schedule/software_pipeline.py` says why the rings are safe). The barrier after a
stored tile's wgmmas lets its buffer be written again. Each wgmma rounds to
f32 per K slice in the simulator, so results agree with the tile
interpreter like the mma.sync path's do (to about K ulps of f32).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.types import RegsType
from tessera.ir.layouts import RegisterLayout, local, replicated, spatial
from tessera.ir.warpgroup_ops import A_REGISTERS, WGMMA_DTYPES
from tessera.ir.wgmma_layouts import WARPGROUP, WGMMA_K, WGMMA_M, WgmmaTileLayout, wgmma_a_fragment, wgmma_tile_swizzle

from .layout_math import register_map, row_major_strides
from .mma_operands import wgmma_tile_offsets
from .relayout import convert
from .values import Regs, RingOperand


def store_k_major(ctx, regs: Regs, tile: WgmmaTileLayout, transpose: bool):
    """Store a 2-D tile (its transpose when `transpose`) into a fresh buffer laid out as `tile` (K-major, or
    MN-major for a B stored as it is), by the owners of its elements; no barrier. The buffer."""
    layout, dtype = regs.layout, regs.element.dtype
    buf = ctx.smem.alloc(dtype, tile.nbytes // tile.element_bytes, align=tile.alignment)
    rows_w, cols_w = ((0, 1), (1, 0)) if transpose else ((1, 0), (0, 1))
    index = wgmma_tile_offsets(ctx, tile, layout, rows_w, cols_w)
    ptrs = ctx.emit("addptr", ctx.splat(buf, regs.count), index)
    owner = ctx.index.owner_predicate(layout)
    mask = [ctx.splat(owner, regs.count)] if owner is not None else []
    # registers contiguous along K stay in one 16-byte chunk, which every K-major form keeps whole
    shape = layout.shape
    weights = (1, shape[0]) if transpose else row_major_strides(shape)
    k = min(ctx.smem.vector_width(layout, weights, dtype), 16 // tile.element_bytes)
    ctx.create("store", [ptrs, regs.value, *mask], {"vector": k} if k > 1 else None)
    return buf


@dataclass(frozen=True)
class SharedOperand:
    """A wgmma operand tile in shared memory: `base` points at it, laid out as `tile`."""

    base: Value
    tile: WgmmaTileLayout
    offset: Value | None = None     # i32 elements from `base` to the tile (a ring slot's), a multiple of 16 bytes

    @property
    def mn_major(self) -> bool:
        return self.tile.major == "MN"

    def descriptor(self, ctx, k_slice: int, mn_first: int, group=None):
        """wgmma_desc of K slice `k_slice`, M/N from `mn_first` (+ 64 x `group`, a thread digit, for A).

        The tile's own descriptor is made once from its base pointer, and each slice's is that plus its byte
        offset / 16 in the 14-bit start-address field (as CUTLASS's descriptor iterators do): shared
        addresses stay below 2^18 bytes, so the sum never carries out of the field, and the offsets cost an
        integer add instead of 64-bit pointer arithmetic, a shift and two masks per descriptor (issue 19,
        fact 8). The warpgroup's slab offset goes on the pointer instead, before the descriptor is made: added
        to the descriptor as a 64-bit product of the shuffled warpgroup index (`mul.wide`), ptxas (12.9 and
        13.0) lost the descriptor's high word (SBO, swizzle) and the wgmma read A through a stale uniform
        register (wrong attention output and illegal addresses on an H100; `sass.unset_descriptor_words`
        checks for it)."""
        d = self.tile.descriptor(0, k_slice, mn_first)
        base = self.base
        if group is not None:       # slab g is 64 rows (K-major) or 64 / atom column blocks (MN) further on
            step = self.tile.descriptor(0, 0, WGMMA_M).start // self.tile.element_bytes
            base = ctx.emit("addptr", base, ctx.emit("mul", group, ctx.const(step)))
        desc = ctx.emit("wgmma_desc", base, attrs={"lbo": d.lbo, "sbo": d.sbo, "swizzle": d.swizzle})
        if self.offset is not None:
            units = ctx.emit("mul", self.offset, ctx.const(self.tile.element_bytes))
            desc = ctx.emit("add", desc, ctx.cast(ctx.emit("shr", units, ctx.const(4)), dt.i64))
        if d.start:
            desc = ctx.emit("add", desc, ctx.const(d.start >> 4, dt.i64))
        return desc


@dataclass(frozen=True)
class RegisterOperand:
    """A wgmma A operand held in registers: `regs` in `register_a_layout(plan)` (RK K slices per 64-row slab,
    WM warpgroups along M)."""

    regs: Regs
    rk: int
    wm: int

    def descriptor(self, ctx, k_slice: int, mn_first: int, group=None):
        """What the wgmma takes for slab rm (`mn_first` = rm * WM * 64; the warpgroup is the thread's own) and
        K slice `k_slice`: its 8 registers, (rm * RK + k_slice) * 8 + i (`mma.py`'s register order)."""
        first = (mn_first // (WGMMA_M * self.wm) * self.rk + k_slice) * A_REGISTERS
        return ctx.pack([ctx.extract(self.regs.value, first + i) for i in range(A_REGISTERS)])


def a_from_registers(inst, plan, regs) -> bool:
    """Whether register operand A goes to wgmma in registers (its register-A form) rather than through a K-major
    tile in shared memory: when it is f16/bf16 and already where the form wants it, up to a renaming of
    registers -- a product of an earlier wgmma, cast or masked lane by lane (FlashAttention's P = f(S) for
    O += P V). A tile in another layout (a plain load's) is stored by its owners instead: moving it between
    threads would cost a trip through shared memory as well, and registers besides."""
    if not isinstance(regs, Regs) or regs.element.dtype.name not in WGMMA_DTYPES or inst.k != WGMMA_K:
        return False
    dst = register_a_layout(plan)
    return register_map(regs.layout, dst, row_major_strides(dst.shape)) is not None


def register_a_layout(plan) -> RegisterLayout:
    """A's layout for wgmma's register form: `mma.py`'s A layout with the wgmma fragment, RK slices along K,
    which the accumulator's layout (with N = 16 RK) equals register for register (`wgmma_a_fragment`)."""
    wr = plan.c.num_threads // (plan.wm * WARPGROUP)
    return local(plan.rm, plan.rk) * replicated(wr) * spatial(plan.wm, 1) * wgmma_a_fragment()


def k_major_tile(op, index: int, element_bytes: int) -> WgmmaTileLayout:
    """The K-major tile a register operand `index` (0: A, 1: B) of dot `op` is stored into."""
    (m, k), (_, n) = op.operands[0].type.shape, op.operands[1].type.shape
    return WgmmaTileLayout(n if index else m, k, element_bytes, wgmma_tile_swizzle(k, element_bytes, k))


def store_operand(ctx, op, index: int, regs: Regs, n: int) -> SharedOperand:
    """Store register operand `index` (0: A, 1: B) of dot `op` (its wgmma N: `n`) into a tile wgmma reads, by
    the owners of its elements (no barrier): K-major, or for a 16-bit B whose registers make wider stores along
    N than along K, MN-major as it is (read with trans_b; see the module docstring)."""
    element_bytes = regs.element.dtype.bits // 8
    tile = k_major_tile(op, index, element_bytes)
    if index == 1 and element_bytes == 2:
        k, cols = op.operands[1].type.shape
        mn = WgmmaTileLayout(k, cols, element_bytes, wgmma_tile_swizzle(cols, element_bytes, n), "MN")
        along_k = ctx.smem.vector_width(regs.layout, (1, k), regs.element.dtype)
        along_n = ctx.smem.vector_width(regs.layout, row_major_strides((k, cols)), regs.element.dtype)
        if along_n > along_k and cols % mn.atom == 0:
            return SharedOperand(store_k_major(ctx, regs, mn, False), mn)
    return SharedOperand(store_k_major(ctx, regs, tile, index == 1), tile)


def await_operands(ctx, dot: Operation) -> None:
    """Wait for the operands of `dot` a TMA load is still filling (`schedule/tma_operand.py`), once each; one wait
    also lands the other blocks counted on the same barrier phase (`schedule/tile_operands.py`), whose waits are
    dropped (a second wait for a phase already seen would not wait for the next)."""
    for value in dot.operands[:2]:
        landing = ctx.landing.pop(value, None)
        if landing is not None:
            ctx.create("mbarrier_wait", list(landing))
            for other in [v for v, owed in ctx.landing.items() if owed[0] is landing[0] and owed[1] is landing[1]]:
                del ctx.landing[other]


def wgmma_dot(ctx, op, plan):
    """Lower `op` (a dot) on wgmma as `plan` (from `mma_plan`) says; see the module docstring."""
    inst = plan.instruction
    await_operands(ctx, op)                 # a TMA-loaded tile no loop's staging waited for (outside loops)
    lowered = [ctx.staged.get(op.operands[i]) or ctx.operand(op, i) for i in (0, 1)]
    rings = [x for x in lowered if isinstance(x, RingOperand)]
    stored = False                          # whether this dot stores a register operand itself
    operands = []
    for i, x in enumerate(lowered):
        if isinstance(x, RingOperand):      # a pipelined slot, fenced and published by the loop
            operands.append(SharedOperand(x.ring, x.load.slot_layout, x.offset))
        elif isinstance(x, SharedOperand):  # stored before the loop (`invariant_operands.py`)
            operands.append(x)
        elif i == 0 and a_from_registers(inst, plan, x):
            operands.append(RegisterOperand(convert(ctx, x, register_a_layout(plan), op), plan.rk, plan.wm))
        else:
            operands.append(store_operand(ctx, op, i, x, inst.n))
            stored = True
    if stored:
        ctx.create("fence_proxy_async")
        ctx.threads.barrier()
    in_flight = min((r.in_flight for r in rings), default=0) if len(rings) == 2 else 0
    if in_flight and ctx.assignment.layout(op.operands[2]) != plan.c:
        in_flight = 0       # the carried accumulator is converted around the dot, which reads the result at once
    a, b = operands
    acc = convert(ctx, ctx.operand(op, 2), plan.c, op)
    ctx.create("wgmma_fence")
    nc = inst.c.local_size
    fragment = RegsType(acc.element, nc)
    attrs = dict(inst.attrs) | ({"trans_a": True} if getattr(a, "mn_major", False) else {}) \
        | ({"trans_b": True} if b.mn_major else {})
    group = _warp_uniform(ctx, ctx.index.digit(inst.lanes, plan.wm)) if plan.wm > 1 else None  # its slab block
    single = plan.rm * plan.rn == 1         # the accumulator is one fragment: no unpacking (it may be in flight)
    if in_flight and not single:            # a stack of fragments, each wgmma updating its own in place
        return _stacked_in_flight(ctx, op, plan, a, b, acc, attrs, group)
    c_regs = None if single else list(ctx.unpack(acc.value))
    results = []                    # (first register, fragment): read only after the wait
    for rm in range(plan.rm):
        for rn in range(plan.rn):
            c0 = (rm * plan.rn + rn) * nc
            d = acc.value if single else ctx.pack(c_regs[c0:c0 + nc])
            for s in range(plan.rk):
                d = ctx.emit("wgmma", a.descriptor(ctx, s, rm * plan.wm * inst.m, group),
                             b.descriptor(ctx, s, rn * inst.n), d, attrs=attrs, type=fragment)
            results.append((c0, d))
    ctx.create("wgmma_commit")
    ctx.create("wgmma_wait", attrs={"pending": in_flight})
    if single:
        result = results[0][1]
    else:
        for c0, d in results:
            c_regs[c0:c0 + nc] = ctx.unpack(d)
        result = ctx.pack(c_regs)
    if stored:
        ctx.threads.barrier()               # before the dot's own buffers are written again
    ctx.define(op.result, Regs(result, plan.c), op)



def _stacked_in_flight(ctx, op, plan, a, b, acc, attrs: dict, group) -> None:
    """The dot of a loop that keeps its group in flight, with several fragments per warpgroup (a 256 x 128 tile
    on two warpgroups: two m64 fragments each): the wgmmas chain through the whole accumulator, each updating
    its fragment (`offset`) and passing the rest, so no register of it is read before the wait after the loop
    (unpacking it would read the group in flight)."""
    inst = plan.instruction
    nc = inst.c.local_size
    d = acc.value
    for rm in range(plan.rm):
        for rn in range(plan.rn):
            for s in range(plan.rk):
                d = ctx.emit("wgmma", a.descriptor(ctx, s, rm * plan.wm * inst.m, group),
                             b.descriptor(ctx, s, rn * inst.n), d,
                             attrs=attrs | {"offset": (rm * plan.rn + rn) * nc}, type=acc.value.type)
    ctx.create("wgmma_commit")
    ctx.create("wgmma_wait", attrs={"pending": 1})
    ctx.define(op.result, Regs(d, plan.c), op)


def _warp_uniform(ctx, value: Value) -> Value:
    """`value` (the same in every lane of a warp) as lane 0's, through a shuffle: ptxas then knows it is
    warp-uniform and keeps the descriptor arithmetic built on it in uniform registers (CUTLASS's
    canonical_warp_group_idx does the same)."""
    return ctx.hoist("shuffle", [value, ctx.const(0)], {"mode": "idx"}, type=value.type)
