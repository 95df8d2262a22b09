"""MFMA operands into their fragments: through LDS, in a padded layout picked by counting bank conflicts.

AMD has no ldmatrix: a dot's A or B tile that is not already in its MFMA
fragment layout is stored by the owners of its elements into an LDS buffer,
a barrier, and every lane loads its fragment registers with plain (vector)
loads, then a barrier so the buffer can be reused.

The generic conversion would store the tile row-major, which the fragment
reads hit hard: lane l of A reads row l % 16 (or % 32) at one column, so with
rows of 64 bytes every second row starts in the same bank. Here the buffer
is row-major or column-major (the tile's dims swapped, which lets B's four
consecutive k of one column be one 8-byte load), with the contiguous dim
padded by 0..8 elements; `plan_lds` scores each candidate by the LDS cycles
of the store plus the loads (`lds_cycles`: for every vector access of every
wave, its phases times its worst bank-conflict degree from
`smem_layouts.bank_conflicts` with the target's `shared_memory_banks`) and
keeps the cheapest (then the one with wider accesses, then the smallest).
The model takes a wave's lanes in order, 4 * banks bytes per phase, as
`bank_conflicts` documents; the hardware's exact phase grouping for wide
LDS accesses is not modelled.

`lds_transpose_read`: on gfx950 ("lds.read.tr") a 16-bit fragment whose
four consecutive registers hold four consecutive k of one m / n, with the 16
lanes of each group on 16 consecutive m / n, while LDS holds the tile
MN-major (B row-major, attention's V), is read with `lds_read_tr`
(ds_read_b64_tr_b16): one 8-byte read per four registers where plain loads
need one `ds_read_u16` per register and a pack per pair. The ring slots are
unpadded (direct-to-LDS fills write rows back to back), so the four rows a
16-lane group reads lie a row pitch apart: at a 256-byte pitch (128 bf16)
they share banks, and the model (`bench/amd_lds_transpose_banks.py`) gives
16 cycles for a 32x32x16 B fragment's 2 reads, what its 8 `ds_read_u16`
cost; 8 against 16 at a 128-byte pitch. A padded or swizzled slot would make
them conflict-free, but the DMA fill cannot write one.

The same reads take a 16-bit register tile that has to move on gfx950 when the bank model
prices it cheaper (`plan_lds_transpose_read`): attention's P, the first MFMA's accumulator (4 consecutive
rows of one key column a lane) on its way to P @ V's A fragment (8 consecutive keys of one row a lane), is
stored keys-major, one 8-byte write per 4 elements where the row-major buffer needs a 2-byte write per
element (the key loop at BM=128, BN=64: 32 ds_write_b16 -> 8 ds_write_b64), in rows grouped by 4 so that
both the writes and the reads are conflict-free. Keeping P in registers instead would need S's accumulator
transposed (lane: one row, consecutive keys), i.e. S^T = K Q^T with the operands swapped.

gfx942 has no transpose read: such operands stay on `ds_read_u16` + one
`v_perm_b32` / `v_lshl_or_b32` per pair (the library GEMM's 128x128x64 K
loop: 64 + 32 of its 482 instructions). LLVM would pair
`ds_read_u16_d16_hi` into the high half instead, but only without SRAM ECC
("-sramecc"), which MI300 parts run with: a D16 load there does not keep the
other half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.ir.core import Value
from tessera.ir.layouts import LayoutError, RegisterLayout
from tessera.ir.smem_layouts import SmemLayout, bank_conflicts
from tessera.ir.types import PointerType

from .layout_math import layout_digits, register_map, row_major_strides, shared_vector_width
from .values import Regs

PADS = (0, 1, 2, 4, 8)                      # elements added to the contiguous dim
ORDERS = ((0, 1), (1, 0))                   # storage dims, major first: row-major, column-major


@dataclass(frozen=True)
class LdsPlan:
    """Where a tile lives in LDS on its way to a fragment, and what the trip costs."""

    order: tuple[int, int]      # tile dims, major first, as stored
    pad: int                    # elements after each stored row
    store_vector: int
    load_vector: int
    cycles: int                 # modelled LDS cycles of the store plus the loads
    transpose_read: bool = False    # the fragment is read with `lds_read_tr` (gfx950), not plain loads
    split: int = 1              # stored rows taken `split` at a time, each group `group_pad` elements apart
    group_pad: int = 0

    @property
    def cost(self) -> tuple[int, float]:
        """Cycles first, then fewer (wider) access instructions."""
        return self.cycles, 1 / self.store_vector + 1 / self.load_vector

    def storage(self, shape: tuple[int, int]) -> SmemLayout:
        """The buffer as a layout of the tile in storage order (the tile transposed when column-major), its
        rows split into (groups, `split`) when split > 1."""
        rows, cols = (shape[d] for d in self.order)
        pitch = cols + self.pad
        if self.split == 1:
            return SmemLayout((rows, cols), (pitch, 1))
        return SmemLayout((rows // self.split, self.split, cols), (self.split * pitch + self.group_pad, pitch, 1))

    def view(self, layout: RegisterLayout) -> RegisterLayout:
        """`layout` (a layout of the tile) in the storage's dims; the registers keep their order."""
        stored = layout.permute(self.order)
        if self.split == 1:
            return stored
        rows, cols = stored.shape
        return stored.reshape((rows // self.split, self.split, cols))


def lds_operand(ctx, regs: Regs, want: RegisterLayout) -> Regs | None:
    """`regs` in fragment layout `want` through the LDS layout `plan_lds` picks; None when no data has to
    move (a register renaming does it) or the tile is not a 2-D tile of numbers."""
    layout = regs.layout
    if (isinstance(regs.element, PointerType) or layout.rank != 2 or layout == want
            or register_map(layout, want, row_major_strides(want.shape)) is not None):
        return None
    dtype = regs.element.dtype
    banks, max_bits, warp = ctx.target.shared_memory_banks, ctx.target.max_vector_bits, ctx.warp_size
    plan = plan_lds(layout, want, dtype.bits, banks, max_bits, warp)
    if ctx.target.has("lds.read.tr") and dtype.bits == 16 and warp % TR_LANES == 0:
        transposed = plan_lds_transpose_read(layout, want, banks, max_bits, warp)
        if transposed is not None and transposed.cost < plan.cost:
            plan = transposed
    smem = plan.storage(layout.shape)
    buf = ctx.smem.alloc(dtype, smem.cosize)
    owner = ctx.index.owner_predicate(layout)
    mask = ctx.splat(owner, regs.count) if owner is not None else None
    ctx.smem.access("store", buf, plan.view(layout), smem.strides, regs.value, mask)
    ctx.threads.barrier()
    loaded = lds_transpose_read(ctx, buf, plan.view(want), smem.strides, dtype) if plan.transpose_read else None
    if loaded is None:
        loaded = ctx.smem.access("load", buf, plan.view(want), smem.strides)
    ctx.threads.barrier()
    return Regs(loaded, want)


@lru_cache(maxsize=256)
def plan_lds(src: RegisterLayout, want: RegisterLayout, bits: int, banks: int, max_vector_bits: int,
             warp: int) -> LdsPlan:
    """The cheapest storage (order, pad) for moving a tile of `bits`-bit elements from `src` to `want`."""
    best = None
    for pad in PADS:
        for order in ORDERS:
            rows, cols = (src.shape[d] for d in order)
            smem = SmemLayout((rows, cols), (cols + pad, 1))
            ks, kl = (shared_vector_width(x.permute(order), smem.strides, bits, max_vector_bits) for x in (src, want))
            cycles = (lds_cycles(smem, src.permute(order), ks, bits, banks, warp, owners_only=True)
                      + lds_cycles(smem, want.permute(order), kl, bits, banks, warp))
            candidate = LdsPlan(order, pad, ks, kl, cycles)
            if best is None or candidate.cost < best.cost:
                best = candidate
    return best


@lru_cache(maxsize=256)
def plan_lds_transpose_read(src: RegisterLayout, want: RegisterLayout, banks: int, max_vector_bits: int,
                            warp: int) -> LdsPlan | None:
    """The cheapest storage for a 16-bit tile whose fragment `want` is read with `lds_read_tr` (gfx950), or
    None if no storage allows those reads.

    This is how an MFMA accumulator (attention's P: four consecutive rows of one column a lane) becomes the
    next MFMA's A operand (consecutive columns of one row a lane): stored column-major, each lane writes its
    four rows with one 8-byte store, where the row-major buffer takes a 2-byte store per element. The two
    sides want different row pitches: the 32 lanes of a store phase write 32 consecutive stored rows (an odd
    pitch in 8-byte units spreads them over the banks), a read phase takes 4 consecutive rows x 32 bytes from
    each of two 16-lane groups (a pitch of a quarter of the banks does). Storing the rows in groups of
    `TR_ROW`, the groups `group_pad` elements apart, gives both: the pitch within a group serves the reads,
    the groups' pitch (one unit past a whole bank row) the stores. Pads are whole 8-byte units (the reads'
    alignment)."""
    best = None
    for order in ORDERS:
        for pad in reversed(TR_PADS):
            for split, group_pad in ((1, 0), *((TR_ROW, g) for g in TR_PADS)):
                candidate = LdsPlan(order, pad, 1, TR_ROW, 0, True, split, group_pad)
                try:
                    stored, fragment = candidate.view(src), candidate.view(want)
                except LayoutError:
                    continue
                smem = candidate.storage(src.shape)
                if transpose_read_starts(fragment, smem.strides) is None:
                    continue
                reads = transpose_read_cycles(fragment, smem.strides, banks, warp)
                if best is not None and reads >= best.cycles:
                    continue
                ks = shared_vector_width(stored, smem.strides, 16, max_vector_bits)
                cycles = lds_cycles(smem, stored, ks, 16, banks, warp, owners_only=True) + reads
                candidate = LdsPlan(order, pad, ks, TR_ROW, cycles, True, split, group_pad)
                if best is None or candidate.cost < best.cost:
                    best = candidate
                ideal = (lds_cycles(smem, stored, ks, 16, banks, warp, owners_only=True, conflicts=False)
                         + transpose_read_cycles(fragment, smem.strides, banks, warp, conflicts=False))
                if cycles == ideal and ks == min(stored.local_contiguity(-1), max_vector_bits // 16):
                    return best         # conflict-free with the widest stores this order allows: stop searching
    return best


def transpose_read_cycles(want: RegisterLayout, weights: tuple[int, ...], banks: int, warp: int,
                          conflicts: bool = True) -> int:
    """Modelled LDS cycles of reading `want` with `lds_read_tr` at `weights` (as `lds_cycles`: phases x worst
    bank-conflict degree, each lane reading the 4 elements from its row's start; phases alone without
    `conflicts`)."""
    terms, consts = transpose_read_starts(want, weights)
    t = np.arange(want.num_threads)
    part = sum(((t // stride) % size) * scale for stride, size, scale in terms) if terms else np.zeros_like(t)
    flat = SmemLayout((1 << 30,), (1,))
    cycles = 0
    for c in consts:
        access = (part + c)[:, None, None] + np.arange(TR_ROW)[None, :, None]       # (threads, 4, 1)
        for w in range(0, want.num_threads, warp):
            phases = math.ceil(warp / _lanes_per_phase(TR_ROW * 2, banks))
            cycles += phases * (bank_conflicts(flat, access[w:w + warp], 2, banks) if conflicts else 1)
    return cycles


def lds_cycles(smem: SmemLayout, layout: RegisterLayout, vector: int, bits: int, banks: int, warp: int,
               owners_only: bool = False, conflicts: bool = True) -> int:
    """Modelled LDS cycles for every thread of `layout` to access its registers at `smem` (coordinates in
    the layout's dims), `vector` registers per access: the sum over accesses and warps of phases x worst
    bank-conflict degree (phases alone without `conflicts`: the conflict-free bound). With `owners_only`,
    replicas (which do not store) are left out."""
    table = layout.table()                                       # (threads, registers, 2)
    active = _owners(layout) if owners_only else np.ones(layout.num_threads, bool)
    cycles = 0
    for first in range(0, layout.local_size, vector):
        access = table[:, first:first + vector]
        for w in range(0, layout.num_threads, warp):
            lanes = np.flatnonzero(active[w:w + warp]) + w
            if lanes.size == 0:
                continue
            phases = math.ceil(lanes.size / _lanes_per_phase(vector * bits // 8, banks))
            cycles += phases * (bank_conflicts(smem, access[lanes], bits / 8, banks) if conflicts else 1)
    return cycles


TR_LANES, TR_ROW = 16, 4          # ds_read_b64_tr_b16: groups of 16 lanes, 4 16-bit elements a lane
# pads for a buffer read by `lds_read_tr`: whole 8-byte units (the reads' alignment), up to the 64 bytes that
# put a 16-lane group's 4 rows x 32 bytes (and the phase's other group's) in 64 different banks
TR_PADS = (0, 4, 8, 16, 32)


def lds_transpose_read(ctx, base, want: RegisterLayout, weights, dtype) -> Value | None:
    """The registers of fragment layout `want`, register j at element sum_d weights[d] * coord_d of `base`
    (a shared pointer), read with `lds_read_tr` where the target has it and the layout allows
    (`transpose_read_starts`); None otherwise (the caller falls back to plain loads)."""
    if not ctx.target.has("lds.read.tr") or dtype.bits != 16 or ctx.warp_size % TR_LANES:
        return None
    plan = transpose_read_starts(want, tuple(weights))
    if plan is None:
        return None
    terms, consts = plan
    part = None
    for stride, size, scale in terms:
        term = ctx.index.affine(ctx.index.digit(stride, size), scale)
        part = term if part is None else ctx.hoist("add", [part, term])
    registers = []
    for c in consts:
        offset = ctx.const(c) if part is None else (part if c == 0 else ctx.emit("add", part, ctx.const(c)))
        row = ctx.emit("lds_read_tr", ctx.emit("addptr", base, offset))
        registers += ctx.unpack(row)
    return ctx.pack(registers)


@lru_cache(maxsize=256)
def transpose_read_starts(want: RegisterLayout, weights: tuple[int, ...]):
    """Where each lane's `lds_read_tr` rows start, as (thread terms, per-read constants), or None if the reads
    cannot give `want`.

    Register 4q + e of lane 16h + d must be element d % 4 of the row that lane 16h + 4e + d // 4 addresses in
    read q; so lane 16h + s addresses start[16h + s, q] = offset of (lane 16h + 4 (s % 4), register 4q + s // 4),
    and every register is checked against that. The starts must split into a thread part that is linear in the
    thread id's bits (emitted as digits: (stride, size, scale) terms) plus a constant per read, and be 8-byte
    aligned (a multiple of 4 elements; the ring slots are 16-byte aligned)."""
    threads, count = want.num_threads, want.local_size
    if threads % TR_LANES or count % TR_ROW or threads & (threads - 1):
        return None
    offsets = (want.table() * np.asarray(weights, np.int64)).sum(-1)            # (threads, registers)
    t = np.arange(threads)
    group, s = t // TR_LANES * TR_LANES, t % TR_LANES
    reads = np.arange(count // TR_ROW)
    starts = offsets[(group + TR_ROW * (s % TR_ROW))[:, None], TR_ROW * reads[None, :] + (s // TR_ROW)[:, None]]
    e = np.arange(TR_ROW)
    source = group[:, None] + TR_ROW * e[None, :] + (s // TR_ROW)[:, None]      # (threads, 4): who addressed it
    got = starts[source] + (s % TR_ROW)[:, None, None]                           # (threads, 4, reads)
    if (got.transpose(0, 2, 1).reshape(threads, count) != offsets).any() or (starts % TR_ROW).any():
        return None
    consts = starts[0]
    part = starts - consts
    if (part != part[:, :1]).any():
        return None
    part = part[:, 0]
    bits = threads.bit_length() - 1
    coeff = [int(part[1 << i]) for i in range(bits)]
    linear = sum(((t >> i) & 1) * c for i, c in enumerate(coeff))
    if (linear != part).any():
        return None
    terms, i = [], 0
    while i < bits:                  # runs of bits with doubling coefficients are one digit
        j = i + 1
        while j < bits and coeff[j] == 2 * coeff[j - 1]:
            j += 1
        if coeff[i]:
            terms.append((1 << i, 1 << (j - i), coeff[i]))
        i = j
    return tuple(terms), tuple(int(c) for c in consts)


def _lanes_per_phase(nbytes: int, banks: int) -> int:
    """Lanes one LDS phase serves when each accesses `nbytes` (as `bank_conflicts` groups them)."""
    return banks if nbytes <= 4 else max(1, 4 * banks // nbytes)


def _owners(layout: RegisterLayout) -> np.ndarray:
    """Which threads are replica 0 of what they hold (those that store it)."""
    t = np.arange(layout.num_threads)
    owner = np.ones(layout.num_threads, bool)
    for digit in layout_digits(layout):
        if digit.dim < 0:
            owner &= (t // digit.stride) % digit.size == 0
    return owner
