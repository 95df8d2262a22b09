"""dot on wgmma (sm_90a): operands stored K-major and swizzled into shared memory, one wgmma per 16-wide K slice.

`mma.mma_plan` picks wgmma m64nNk16 and puts the accumulator in
`local(RM, RN) . replicated(WR) . spatial(WM, 1) . wgmma_accumulator(n)`:
warpgroup g (thread digit 128, WM) holds the 64-row slabs rm * WM + g
(the local digit is the most significant).
The operands keep whatever layouts they have; their owners store them into
shared memory in the form wgmma reads (`WgmmaSmemLayout`, K-major):

    A (M x K)   as it is: row m, col k of an M x K tile
    B (K x N)   transposed: row n, col k of an N x K tile (wgmma's B is K-major
                without trans_b, and the simulator models only K-major)

swizzled by the widest of 128/64/32 bytes that divides a row's K bytes, each
buffer aligned to its swizzle pattern (1024 bytes for 128B). Then

    fence_proxy_async; barrier; wgmma_fence
    for each slab rm, column block rn, K slice s: %d = wgmma desc(A, rm, s), desc(B, rn, s), %d
    wgmma_commit; wgmma_wait {pending = 0}; barrier

Descriptors start at the slice's first 16-byte chunk (`WgmmaSmemLayout.descriptor`),
moved (row0 / 8) * SBO down for the slab.

Software-pipelined operands. An operand that is a cp.async ring slot
(`async_pipeline.RingOperand` with a `WgmmaTileLayout` slot) is read where
it lies: no store, and the loop already fenced and published the slot
(K-major, or MN-major with the wgmma's trans_a / trans_b set). When both
operands are ring slots and the plan allows it (`RingOperand.in_flight`),
the accumulator stays in the wgmma registers and the dot ends with
`wgmma_wait {pending = 1}` and no barrier: its group is still in flight
when the loop yields the result, and the next iteration's wgmmas chain
onto it (`async_pipeline` says why the rings are safe). Otherwise every dot
waits for its own wgmmas (pending = 0) and the barrier after them lets its
buffers be reused. Each wgmma
rounds to f32 per K slice in the simulator, so results agree with the tile
interpreter like the mma.sync path's do (to about K ulps of f32).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.ir import dtypes as dt
from tessera.ir.core import Value
from tessera.ir.types import RegsType
from tessera.ir.wgmma_layouts import WGMMA_M, WgmmaSmemLayout, WgmmaTileLayout

from .async_pipeline import RingOperand
from .context import Regs, row_major_strides


def wgmma_swizzle(k: int, element_bytes: int) -> int:
    """The widest swizzle (bytes) whose atom row divides a K-major row of `k` elements (0: none)."""
    return next((w for w in (128, 64, 32) if (k * element_bytes) % w == 0), 0)


def store_k_major(ctx, regs: Regs, tile: WgmmaSmemLayout, transpose: bool):
    """Store a 2-D tile (its transpose when `transpose`) into a fresh buffer at `tile`'s K-major offsets, by the
    owners of its elements; no barrier. The buffer."""
    layout, dtype = regs.layout, regs.element.dtype
    e = tile.element_bytes
    buf = ctx.shared_alloc(dtype, tile.nbytes // e, align=8 * tile.row_bytes if tile.swizzle else 16)
    rows_w, cols_w = ((0, 1), (1, 0)) if transpose else ((1, 0), (0, 1))
    row, col = ctx.index_regs(layout, rows_w), ctx.index_regs(layout, cols_w)
    index = _byte_offset(ctx, tile, row, col, regs.count)
    index = ctx.emit("shr", index, ctx.const_regs([e.bit_length() - 1] * regs.count, dt.i32))
    ptrs = ctx.emit("addptr", ctx.splat(buf, regs.count), index)
    owner = ctx.owner_predicate(layout)
    mask = [ctx.splat(owner, regs.count)] if owner is not None else []
    # registers contiguous along K stay in one 16-byte chunk, which every K-major form keeps whole
    shape = layout.shape
    weights = (1, shape[0]) if transpose else row_major_strides(shape)
    k = min(ctx.shared_vector(layout, weights, dtype), 16 // e)
    ctx.create("store", [ptrs, regs.value, *mask], {"vector": k} if k > 1 else None)
    return buf


def _byte_offset(ctx, tile: WgmmaSmemLayout, row, col, count: int):
    """`tile.byte_offset(row, col)` on i32 registers."""
    c = lambda v: ctx.const_regs([v] * count, dt.i32)  # noqa: E731
    log2 = lambda v: c(v.bit_length() - 1)             # noqa: E731  (powers of two)
    e = tile.element_bytes
    if tile.swizzle == 0:
        cb = ctx.emit("mul", col, c(e))
        parts = [ctx.emit("mul", ctx.emit("shr", row, log2(8)), c(tile.sbo)),
                 ctx.emit("mul", ctx.emit("shr", cb, log2(16)), c(tile.lbo)),
                 ctx.emit("mul", ctx.emit("and", row, c(7)), c(16)), ctx.emit("and", cb, c(15))]
    else:
        block, inner = ctx.emit("shr", col, log2(tile.atom_k)), ctx.emit("and", col, c(tile.atom_k - 1))
        parts = [ctx.emit("mul", block, c(tile.rows * tile.row_bytes)), ctx.emit("mul", row, c(tile.row_bytes)),
                 ctx.emit("mul", inner, c(e))]
    plain = parts[0]
    for p in parts[1:]:
        plain = ctx.emit("add", plain, p)
    if not tile.swizzle:
        return plain
    moved = ctx.emit("shl", ctx.emit("and", ctx.emit("shr", plain, c(7)), c(tile.swizzle // 16 - 1)), c(4))
    return ctx.emit("xor", plain, moved)


@dataclass(frozen=True)
class SharedOperand:
    """A wgmma operand tile in shared memory: `base` points at it, laid out as `tile` (a `WgmmaSmemLayout` the
    dot stored, K-major, B transposed; or a ring slot's `WgmmaTileLayout`)."""

    base: Value
    tile: WgmmaSmemLayout | WgmmaTileLayout

    @property
    def mn_major(self) -> bool:
        return isinstance(self.tile, WgmmaTileLayout) and self.tile.major == "MN"

    def descriptor(self, ctx, k_slice: int, mn_first: int, group=None):
        """wgmma_desc of K slice `k_slice`, M/N from `mn_first` (+ 64 x `group`, a thread digit, for A)."""
        e = self.tile.element_bytes
        if isinstance(self.tile, WgmmaSmemLayout):
            return _desc(ctx, _slab_start(ctx, self.base, self.tile, group, WGMMA_M, mn_first), self.tile, k_slice)
        d = self.tile.descriptor(0, k_slice, mn_first)
        ptr = ctx.emit("addptr", self.base, ctx.const(d.start // e)) if d.start else self.base
        if group is not None:       # slab g is 64 rows (K-major) or 64 / atom column blocks (MN) further on
            step = self.tile.descriptor(0, 0, WGMMA_M).start // e
            ptr = ctx.emit("addptr", ptr, ctx.emit("mul", group, ctx.const(step)))
        return ctx.emit("wgmma_desc", ptr, attrs={"lbo": d.lbo, "sbo": d.sbo, "swizzle": d.swizzle})


def wgmma_dot(ctx, op, plan):
    """Lower `op` (a dot) on wgmma as `plan` (from `mma_plan`) says; see the module docstring."""
    inst = plan.instruction
    (m, k), (_, n) = op.operands[0].type.shape, op.operands[1].type.shape
    lowered = [ctx.operand(op, 0), ctx.operand(op, 1)]
    rings = [x for x in lowered if isinstance(x, RingOperand)]
    if len(rings) < 2:
        e = next(x for x in lowered if isinstance(x, Regs)).element.dtype.bits // 8
        swizzle = wgmma_swizzle(k, e)
        tiles = (WgmmaSmemLayout(m, k, e, swizzle), WgmmaSmemLayout(n, k, e, swizzle))
    operands = []
    for i, x in enumerate(lowered):
        if isinstance(x, RingOperand):      # a pipelined slot, fenced and published by the loop
            operands.append(SharedOperand(x.slot(ctx), x.load.slot_layout))
        else:
            operands.append(SharedOperand(store_k_major(ctx, x, tiles[i], i == 1), tiles[i]))
    if len(rings) < 2:
        ctx.create("fence_proxy_async")
        ctx.barrier()
    in_flight = min((r.in_flight for r in rings), default=0) if len(rings) == 2 else 0
    a, b = operands
    acc = ctx.convert(ctx.operand(op, 2), plan.c, op)
    ctx.create("wgmma_fence")
    nc = inst.c.local_size
    fragment = RegsType(acc.element, nc)
    attrs = dict(inst.attrs) | ({"trans_a": True} if a.mn_major else {}) | ({"trans_b": True} if b.mn_major else {})
    group = ctx.thread_digit(inst.lanes, plan.wm) if plan.wm > 1 else None     # this warpgroup's slab block
    single = plan.rm * plan.rn == 1         # the accumulator is one fragment: no unpacking (it may be in flight)
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
    if len(rings) < 2:
        ctx.barrier()               # before the dot's own buffers are written again
    ctx.define(op.result, Regs(result, plan.c), op)


def _slab_start(ctx, buf, tile: WgmmaSmemLayout, group, group_rows: int, rows: int):
    """Pointer to row `group * group_rows + rows` (a multiple of 8) of `tile` at `buf`, K slice 0."""
    step = tile.sbo // 8 // tile.element_bytes                   # elements per row, counted in 8-row groups
    offset = ctx.const(rows * step)
    if group is not None:
        offset = ctx.emit("add", ctx.emit("mul", group, ctx.const(group_rows * step)), offset)
    return ctx.emit("addptr", buf, offset)


def _desc(ctx, start, tile: WgmmaSmemLayout, k_slice: int):
    d = tile.descriptor(0, k_slice)
    ptr = ctx.emit("addptr", start, ctx.const(d.start // tile.element_bytes)) if d.start else start
    return ctx.emit("wgmma_desc", ptr, attrs={"lbo": d.lbo, "sbo": d.sbo, "swizzle": d.swizzle})
