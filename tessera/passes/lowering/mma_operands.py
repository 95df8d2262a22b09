"""mma operands into their fragments: global -> shared (swizzled) -> registers with ldmatrix; wgmma tile offsets.

A dot's A or B tile that is not already in its mma fragment layout is
stored (by the owners of its elements) into a row-major shared-memory
buffer whose 16-byte chunks are XOR-swizzled, then read back with
`ldmatrix` x4 (x2 / x1 for the last matrices): A (M x K, row-major) plain,
B (K x N, row-major) with `.trans`. Each lane gives the address of one
16-byte row, swizzled the same way, so the eight 16-byte rows one phase
of ldmatrix reads fall in eight different 16-byte bank groups: no bank
conflicts (`smem_layouts.bank_conflicts` checks the choice at compile time).
A row is 8 16-bit, 16 8-bit or 4 32-bit elements (`LDMATRIX_DTYPES`): the
plain read gives the m16n8k32 8-bit and m16n8k8 tf32 fragments of a
K-contiguous tile (`mma_layouts` docstring), but `.trans` swaps 16-bit
halves, so a 8-bit / tf32 B is read only from its N x K transpose (a
software-pipelined B^T slot), never from a K x N buffer.

Every 8x8 matrix of the fragment layout is found from the layout itself
(register pairs 2j, 2j+1 of a group of eight registers are matrix j), and
the whole plan is checked against the `layouts.ldmatrix()` semantics for
every thread before anything is emitted; a layout it does not reproduce
(or a row too narrow to swizzle) returns None and the caller keeps the
generic conversion through shared memory.

`wgmma_tile_offsets` is the register-level `WgmmaTileLayout.byte_offset`: where
the owners of a tile's elements (or the copy chunks of a pipelined load) put
them so that wgmma reads them through descriptors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.ir import dtypes as dt
from tessera.ir.layouts import RegisterLayout
from tessera.ir.mma_layouts import LDMATRIX_ELEMENTS
from tessera.ir.smem_layouts import SmemLayout, Swizzle, bank_conflicts, row_major, swizzle_bytes
from tessera.ir.types import PointerType, ScalarType
from tessera.ir.wgmma_layouts import WgmmaTileLayout

from .layout_math import register_map, row_major_strides
from .values import Regs

LDMATRIX_DTYPES = LDMATRIX_ELEMENTS        # 16-bit ones plain or .trans; 8-bit and tf32 (f32) ones plain only


def ldmatrix_operand(ctx, regs: Regs, want: RegisterLayout, trans: bool) -> Regs | None:
    """`regs` in fragment layout `want` through swizzled shared memory and ldmatrix; None: not this way."""
    if (not ctx.target.has("ldmatrix") or isinstance(regs.element, PointerType)
            or regs.element.dtype not in LDMATRIX_DTYPES or regs.layout == want
            or register_map(regs.layout, want, row_major_strides(want.shape)) is not None):
        return None
    element_bytes = regs.element.dtype.bits // 8
    plan = ldmatrix_plan(want, trans, ctx.warp_size, element_bytes, row_keyed=True)
    weights = row_major_strides(want.shape)
    flipped = _flipped_plan(ctx, regs, want, trans, element_bytes)
    if flipped is not None and (plan is None or _store_width(ctx, regs, flipped[1]) > _store_width(ctx, regs, weights)):
        plan, weights = flipped
    if plan is None:
        return None
    buf = store_swizzled(ctx, regs, plan.smem, weights)
    loaded = read_fragment(ctx, buf, plan, regs.element.dtype)
    ctx.threads.barrier()
    return Regs(loaded.value, want)


def _flipped_plan(ctx, regs: Regs, want: RegisterLayout, trans: bool, element_bytes: int):
    """(plan, store weights) for a 2-D tile kept transposed in shared memory (its dim 0 contiguous, read
    with the other ldmatrix flavour), or None. A dequantized B (K x N) whose owners hold runs along K
    stores 16-byte vectors into an N x K buffer, where the K x N one takes a 2-byte store per element
    (64 scalar stores a thread per MoE decode K step, 2026-11-26)."""
    if want.rank != 2 or regs.layout.rank != 2 or (not trans and element_bytes != 2):
        return None
    plan = ldmatrix_plan(want.permute((1, 0)), not trans, ctx.warp_size, element_bytes, row_keyed=True)
    return None if plan is None else (plan, (1, want.shape[0]))


def _store_width(ctx, regs: Regs, weights) -> int:
    """Elements one store of `regs` moves when element (i, j) goes to i * weights[0] + j * weights[1]."""
    return ctx.smem.vector_width(regs.layout, weights, regs.element.dtype)


@dataclass(frozen=True)
class LdmatrixPlan:
    """How a row-major (rows x cols) shared buffer is read into fragment layout `want` with ldmatrix."""

    want: RegisterLayout
    trans: bool
    rows: "RowPlan"
    smem: SmemLayout                    # the buffer's (swizzled) row-major layout
    thread_bits: tuple                  # row address = base[g] + sum_b bit_b(thread) * weight[b]


def ldmatrix_plan(want: RegisterLayout, trans: bool, warp: int = 32, element_bytes: int = 2,
                  row_keyed: bool = False) -> LdmatrixPlan | None:
    """The ldmatrix reads (and the conflict-free swizzle of the buffer) that give exactly the registers of
    `want` (of `element_bytes`-byte elements) from a row-major buffer of its shape (.trans when `trans`); None
    when ldmatrix cannot. `row_keyed`: rows wider than 128 bytes may take a swizzle TMA cannot write
    (`_row_keyed`; for buffers the threads fill)."""
    rows = ldmatrix_rows(want, trans, warp, element_bytes)
    if rows is None:
        return None
    cols = want.shape[1]
    smem = swizzled_row_major(*want.shape, rows.starts, element_bytes, row_keyed)
    thread_bits = thread_bit_weights(np.asarray(rows.starts[..., 0] * cols + rows.starts[..., 1], np.int64))
    if thread_bits is None:
        return None
    return LdmatrixPlan(want, trans, rows, smem, thread_bits)


def read_fragment(ctx, buf, plan: LdmatrixPlan, dtype: dt.DType) -> Regs:
    """The registers of `plan.want` read from `buf` (laid out as `plan.smem`) with ldmatrix; no barrier."""
    loaded = []
    for g, num in enumerate(plan.rows.nums):
        row = ctx.emit("addptr", buf, row_offset(ctx, plan.thread_bits, g, plan.smem.swizzle))
        frag = ctx.emit("ldmatrix", row, attrs={"num": num, "trans": plan.trans})
        loaded += ctx.unpack(frag) if len(plan.rows.nums) > 1 else [frag]
    value = loaded[0] if len(loaded) == 1 else ctx.pack(loaded)
    assert value.type.count == plan.want.local_size and value.type.element == ScalarType(dtype)
    return Regs(value, plan.want)


class RowPlan:
    """Which row each lane addresses in each ldmatrix of a fragment layout."""

    def __init__(self, starts: np.ndarray, nums: tuple[int, ...]):
        self.starts = starts        # (threads, groups, 2): tile coordinate of the row this lane addresses
        self.nums = nums            # matrices per ldmatrix, in register order


def ldmatrix_rows(want: RegisterLayout, trans: bool, warp: int = 32, element_bytes: int = 2) -> RowPlan | None:
    """The ldmatrix row addresses that produce exactly the registers of `want` (`element_bytes`-byte elements,
    w = 4 / element_bytes of them per 32-bit word), or None."""
    per_word = 4 // element_bytes
    if (warp != 32 or want.rank != 2 or want.num_threads % warp or want.local_size % per_word
            or element_bytes not in (1, 2, 4) or (trans and element_bytes != 2)):
        return None
    table = want.table()                                    # (threads, registers, 2)
    threads, count = table.shape[:2]
    nums, left = [], count // per_word                      # matrices still to load
    while left:
        nums.append(4 if left >= 4 else left)
        left -= nums[-1]
    warp_first = (np.arange(threads) // warp) * warp
    lane = np.arange(threads) % warp
    starts = np.zeros((threads, len(nums), 2), np.int64)
    for g, num in enumerate(nums):
        j, r = (lane // 8) % num, lane % 8                  # lane 8j + r addresses row r of matrix j
        # (x1 / x2 ignore lanes 8 * num and up; they repeat the rows so that addresses stay linear in the lane)
        first = per_word * (4 * g + j)                      # register of matrix j's first element
        if trans:   # stored row r of the matrix is what lane r // 2 holds in element r % 2, at column 0
            starts[:, g] = table[warp_first + r // 2, first + r % 2]
        else:       # row r is what lane 4r holds first
            starts[:, g] = table[warp_first + 4 * r, first]
    if not (_reproduces(table, starts, nums, trans, warp, per_word)):
        return None
    return RowPlan(starts, tuple(nums))


def _reproduces(table, starts, nums, trans, warp, per_word=2) -> bool:
    """Whether ldmatrix from these row starts yields `table` (lane l: matrix j, element e -> register w*j + e)."""
    threads = table.shape[0]
    lane = np.arange(threads) % warp
    warp_first = (np.arange(threads) // warp) * warp
    for g, num in enumerate(nums):
        for j in range(num):
            for e in range(per_word):
                r, c = ((2 * (lane % 4) + e, lane // 4) if trans else (lane // 4, per_word * (lane % 4) + e))
                start = starts[warp_first + 8 * j + r, g]
                got = start + np.stack([np.zeros_like(c), c], axis=-1)
                if not np.array_equal(got, table[:, per_word * (4 * g + j) + e]):
                    return False
        if (starts[:, g, 1] % (4 * per_word)).any():            # rows start on 16 bytes
            return False
    return True


def swizzled_row_major(rows: int, cols: int, starts: np.ndarray, element_bytes: int = 2,
                       row_keyed: bool = False) -> SmemLayout:
    """Row-major rows x cols (`element_bytes`-byte elements) with the widest 128/64/32-byte swizzle (then, if
    `row_keyed`, `_row_keyed`'s) whose row reads are conflict-free; plain row-major if none is."""
    plain = row_major(rows, cols)
    extra = _row_keyed(cols, element_bytes) if row_keyed else []
    for swizzle in [swizzle_bytes(n, element_bytes) for n in (128, 64, 32)] + extra:
        if cols * element_bytes < 16 << swizzle.bits or (rows * cols) % swizzle.block:
            continue
        layout = SmemLayout(plain.shape, plain.strides, swizzle)
        if row_conflicts(layout, starts, element_bytes) == 1:
            return layout
    return plain


def is_wide_row_swizzle(swizzle: Swizzle | None) -> bool:
    """Whether `swizzle` keys on rows wider than 128 bytes (`_row_keyed`), which TMA cannot write: the
    32/64/128-byte swizzles shift by 3 chunks' worth of bits, it by more."""
    return swizzle is not None and swizzle.shift > 3


def _row_keyed(cols: int, element_bytes: int) -> list[Swizzle]:
    """For rows wider than 128 bytes (a power of two): the eight 16-byte chunks of each 128 bytes XORed with
    the row index, not the 128-byte index. The standard 128-byte swizzle keys on bits the row index only
    partly reaches (256-byte rows: even keys only), so the eight rows of an ldmatrix matrix, 256 bytes
    apart, fell in two (or, unswizzled, one) 16-byte bank groups: 8-way conflicts (the int4/fp8 MoE
    decode's dequantized 64 x 128 bf16 B, 2026-11-26). TMA cannot write this swizzle (cp.async can)."""
    row_bytes = cols * element_bytes
    if row_bytes <= 128 or row_bytes & (row_bytes - 1):
        return []
    return [Swizzle(3, 4 - (element_bytes.bit_length() - 1), row_bytes.bit_length() - 1 - 4)]


def row_conflicts(layout: SmemLayout, starts: np.ndarray, element_bytes: int = 2) -> int:
    """Worst bank-conflict degree of the ldmatrix row reads: `starts` is (threads, groups, 2), each lane
    reading 16 contiguous bytes (8 lanes per phase) per warp-wide ldmatrix."""
    per_row = 16 // element_bytes
    row = np.stack([np.zeros(per_row, np.int64), np.arange(per_row)], axis=-1)
    worst = 1
    for g in range(starts.shape[1]):
        for warp in range(0, starts.shape[0], 32):
            access = starts[warp:warp + 32, g, None, :] + row[None]
            worst = max(worst, bank_conflicts(layout, access, element_bytes))
    return worst


def thread_bit_weights(offsets: np.ndarray) -> tuple[np.ndarray, list[int]] | None:
    """offsets[t, g] = base[g] + sum_b bit_b(t) * weight[b] (the row address is linear in thread-id bits)."""
    threads = offsets.shape[0]
    if threads & (threads - 1):
        return None
    bits = threads.bit_length() - 1
    base = offsets[0]
    weights = [int(offsets[1 << b, 0] - base[0]) for b in range(bits)]
    t = np.arange(threads)
    predicted = base[None, :] + sum(((t >> b) & 1)[:, None] * w for b, w in enumerate(weights))
    if bits and not np.array_equal(predicted, offsets):
        return None
    return base, weights


def _thread_offset(ctx, weights: list[int]):
    """sum_b bit_b(thread_id) * weights[b], hoisted; runs of bits with doubling weights become one digit."""
    total, b = None, 0
    while b < len(weights):
        if weights[b] == 0:
            b += 1
            continue
        end = b + 1
        while end < len(weights) and weights[end] == 2 * weights[end - 1]:
            end += 1
        term = ctx.index.affine(ctx.index.digit(1 << b, 1 << (end - b)), weights[b])
        total = term if total is None else ctx.hoist("add", [total, term])
        b = end
    return total


def row_offset(ctx, thread_bits, g: int, swizzle: Swizzle | None):
    """This lane's (swizzled) element offset of its row for ldmatrix number g. Unswizzled or under a
    32/64/128-byte swizzle: hoisted. Under a row-keyed swizzle (`_row_keyed`, rows over 128 bytes):
    g's base splits into a multiple of the swizzle's period, added after the XOR (the swizzle of o + k * period
    is o's plus k * period: it folds into the ldmatrix's address immediate), and a remainder; where the
    remainder's bits are clear in every lane's offset and leave the XOR's key alone, it is XORed into the one
    hoisted swizzled lane offset at the read (one ALU op), not hoisted per g: a hoisted offset per read held
    one register each through the loop and spilled the 512-byte rows of head dim 256."""
    base, weights = thread_bits
    if not is_wide_row_swizzle(swizzle):       # unswizzled, or a 32/64/128-byte swizzle: one hoisted offset per g
        lane = _thread_offset(ctx, weights)
        offset = ctx.const(int(base[g])) if lane is None else \
            ctx.hoist("add", [lane, ctx.const(int(base[g]))]) if base[g] else lane
        return offset if swizzle is None else _swizzled(ctx, offset, swizzle)
    return folded_row_offset(ctx, thread_bits, g, swizzle)


def folded_row_offset(ctx, thread_bits, g: int, swizzle: Swizzle):
    """swizzle(lane offset + base[g]) as one hoisted swizzled lane offset shared by every g, XORed with the low
    part of base[g] (below the swizzle's period) where that is the same (one ALU op at the access), plus the
    high part (a multiple of the period: the swizzle leaves it alone, and it folds into the address immediate);
    otherwise a hoisted offset of its own. For many accesses per lane (`row_offset`'s wide rows, the pair
    stores of `pair_store.py`), so that they do not each hold a register for the whole kernel."""
    base, weights = thread_bits
    lane = _thread_offset(ctx, weights)
    period = 1 << (swizzle.base + swizzle.shift + swizzle.bits)
    low, high = int(base[g]) % period, int(base[g]) // period * period
    lanes = _lane_offsets(weights)
    if low and np.array_equal(swizzle(lanes + low), swizzle(lanes) ^ low) and lane is not None:
        swizzled = ctx.emit("xor", _swizzled(ctx, lane, swizzle), ctx.const(low))
    else:
        offset = ctx.const(low) if lane is None else ctx.hoist("add", [lane, ctx.const(low)]) if low else lane
        swizzled = _swizzled(ctx, offset, swizzle)
    return ctx.emit("add", swizzled, ctx.const(high)) if high else swizzled


def _lane_offsets(weights: list[int]) -> np.ndarray:
    """sum_b bit_b(t) * weights[b] for every thread t."""
    t = np.arange(1 << len(weights))
    return sum((((t >> b) & 1) * w for b, w in enumerate(weights)), np.zeros_like(t))


def _swizzled(ctx, offset, swizzle: Swizzle):
    """swizzle(offset), hoisted."""
    moved = ctx.hoist("and", [ctx.hoist("shr", [offset, ctx.const(swizzle.shift)]),
                              ctx.const(((1 << swizzle.bits) - 1) << swizzle.base)])
    return ctx.hoist("xor", [offset, moved])


def swizzle_offsets(ctx, index, swizzle: Swizzle | None):
    """Element offsets `index` (registers) of a row-major buffer moved by the XOR swizzle (16-byte chunks
    stay whole)."""
    if swizzle is None:
        return index
    count = index.type.count
    moved = ctx.emit("and", ctx.emit("shr", index, ctx.const_regs([swizzle.shift] * count, dt.i32)),
                     ctx.const_regs([((1 << swizzle.bits) - 1) << swizzle.base] * count, dt.i32))
    return ctx.emit("xor", index, moved)


def wgmma_tile_offsets(ctx, tile: WgmmaTileLayout, layout: RegisterLayout, row_weights, col_weights):
    """Element offsets in `tile` (`WgmmaTileLayout.byte_offset`, in elements) of the registers of `layout`
    whose tile row is `sum_d row_weights[d] * coord_d` and column `sum_d col_weights[d] * coord_d`: the
    column block, then row-major (rows x atom) inside it, swizzled in 16-byte chunks."""
    atom = tile.atom
    index = ctx.index.regs(layout, [w * atom for w in row_weights])
    col = ctx.index.regs(layout, col_weights)
    if tile.cols > atom:
        count = layout.local_size
        c = lambda v: ctx.const_regs([v] * count, dt.i32)       # noqa: E731
        block = ctx.emit("shr", col, c(atom.bit_length() - 1))
        col = ctx.emit("add", ctx.emit("mul", block, c(tile.rows * atom)), ctx.emit("and", col, c(atom - 1)))
    index = ctx.emit("add", index, col)
    return swizzle_offsets(ctx, index, swizzle_bytes(tile.swizzle, tile.element_bytes) if tile.swizzle else None)


def store_swizzled(ctx, regs: Regs, smem: SmemLayout, weights=None):
    """Store the tile into a fresh buffer at `smem` offsets (owners only, vectors within 16-byte chunks),
    then a barrier; the buffer. `weights`: element (i, j, ..) goes to sum_d w_d * coord_d of the buffer's
    row-major order (default: the tile's own row-major strides; (1, rows) stores a 2-D tile transposed)."""
    layout, dtype = regs.layout, regs.element.dtype
    weights = tuple(weights or row_major_strides(layout.shape))
    buf = ctx.smem.alloc(dtype, smem.cosize)
    count = regs.count
    index = swizzle_offsets(ctx, ctx.index.regs(layout, weights), smem.swizzle)
    ptrs = ctx.emit("addptr", ctx.splat(buf, count), index)
    owner = ctx.index.owner_predicate(layout)
    mask = [ctx.splat(owner, count)] if owner is not None else []
    k = min(_store_width(ctx, regs, weights), 16 // (dtype.bits // 8))
    ctx.create("store", [ptrs, regs.value, *mask], {"vector": k} if k > 1 else None)
    ctx.threads.barrier()
    return buf

