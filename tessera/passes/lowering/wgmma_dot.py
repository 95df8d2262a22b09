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
moved (row0 / 8) * SBO down for the slab. Every dot waits for its own wgmmas
(no groups in flight across dots or loop iterations) and is not
software-pipelined: a dot in a `for {stages >= 2}` loop keeps mma.sync and
the cp.async pipeline (`mma.mma_plan`), and `pipeline_plan` leaves wgmma
dots alone. Each wgmma
rounds to f32 per K slice in the simulator, so results agree with the tile
interpreter like the mma.sync path's do (to about K ulps of f32).
"""

from __future__ import annotations

from tessera.ir import dtypes as dt
from tessera.ir.types import RegsType
from tessera.ir.wgmma_layouts import WgmmaSmemLayout

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


def wgmma_dot(ctx, op, plan):
    """Lower `op` (a dot) on wgmma as `plan` (from `mma_plan`) says; see the module docstring."""
    inst = plan.instruction
    (m, k), (_, n) = op.operands[0].type.shape, op.operands[1].type.shape
    a, b = ctx.operand(op, 0), ctx.operand(op, 1)
    e = a.element.dtype.bits // 8
    swizzle = wgmma_swizzle(k, e)
    a_tile, b_tile = WgmmaSmemLayout(m, k, e, swizzle), WgmmaSmemLayout(n, k, e, swizzle)
    a_buf, b_buf = store_k_major(ctx, a, a_tile, False), store_k_major(ctx, b, b_tile, True)
    ctx.create("fence_proxy_async")
    ctx.barrier()
    acc = ctx.convert(ctx.operand(op, 2), plan.c, op)
    ctx.create("wgmma_fence")
    c_regs = list(ctx.unpack(acc.value))
    nc = inst.c.local_size
    fragment = RegsType(acc.element, nc)
    group = ctx.thread_digit(inst.lanes, plan.wm) if plan.wm > 1 else None     # this warpgroup's slab block
    results = []                    # (first register, fragment): read only after the wait
    for rm in range(plan.rm):
        a_start = _slab_start(ctx, a_buf, a_tile, group, inst.m, rm * plan.wm * inst.m)
        for rn in range(plan.rn):
            b_start = _slab_start(ctx, b_buf, b_tile, None, 0, rn * inst.n)
            c0 = (rm * plan.rn + rn) * nc
            d = ctx.pack(c_regs[c0:c0 + nc])
            for s in range(plan.rk):
                d = ctx.emit("wgmma", _desc(ctx, a_start, a_tile, s), _desc(ctx, b_start, b_tile, s), d,
                             attrs=dict(inst.attrs), type=fragment)
            results.append((c0, d))
    ctx.create("wgmma_commit")
    ctx.create("wgmma_wait", attrs={"pending": 0})
    for c0, d in results:
        c_regs[c0:c0 + nc] = ctx.unpack(d)
    ctx.barrier()
    ctx.define(op.result, Regs(ctx.pack(c_regs), plan.c), op)


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
