"""Hopper wgmma: the accumulator fragment, the shared-memory operand layouts and their matrix descriptors.

`wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}` (sm_90a)
computes D = A @ B + D for a 64x16 A, a 16xN B (N = 8, 16, ..., 256) and a
64xN f32 D over a *warpgroup*: 4 consecutive warps, 128 threads.

Accumulator. Thread t = 32 w + l of the warpgroup holds N/2 f32 registers;
register i holds

    D[16 w + l // 4 + 8 ((i // 2) % 2)][8 (i // 4) + 2 (l % 4) + i % 2]

so warp w owns rows 16w..16w+15 and, within it, the mma.sync m16n8 C
fragment repeats N/8 times along N (PTX ISA 9.7.15.5.1.1.1, "Matrix Fragments
for wgmma.mma_async.m64nNk16", Figure 149; CUTLASS spells the same map
`CLayout_64xN` in include/cute/atom/mma_traits_sm90_gmma.hpp:
((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)) onto m + 64 n). In the layout
algebra: `spatial(4, 1).column_local(2, N // 8).spatial(8, 4).local(1, 2)`.

Shared-memory operands. A (64 x 16) and B (given as its N x 16 transpose) are
read from shared memory through 64-bit *matrix descriptors*; both are
"K-major" here (each row of the operand, 16 K elements, is contiguous: PTX
imm-trans-a/b = 0). PTX ISA 9.7.15.5.1.2 ("Shared Memory Matrix Layout"):
the tile is built of swizzle atoms of 8 rows x W bytes (W = 128, 64 or 32 for
the swizzle modes; for no swizzle, 8 rows x 16 bytes "core matrices"). In a
swizzled mode the hardware forms, for row r and byte b (< 32) of the K slice,

    address = start + (r // 8) * SBO + (r % 8) * W + b

and then XORs address bits [4, 4 + log2(W/16)) with bits [7, ...): the
16-byte chunk index within a 128-byte line is XORed with the line index mod
8 (for 128B), CuTe's Swizzle<3,4,3> / <2,4,3> / <1,4,3> on byte addresses.
The swizzle is a function of the absolute shared address, so a tile must
start on a 1024-byte (128B mode; 512 / 256 for 64B / 32B) boundary, or say
how far it is off in the descriptor's base offset (not modelled here: 0).
Without swizzle a core matrix is 128 contiguous bytes (8 rows of 16):

    address = start + (r // 8) * SBO + (b // 16) * LBO + (r % 8) * 16 + b % 16

For K-major operands the leading-dimension byte offset (LBO) is the step
between K-adjacent core matrices without swizzle and is unused (assumed 1,
i.e. 16 bytes) when swizzled; SBO steps between 8-row groups (PTX ISA
"Strides": the tcgen05 section 9.7.16.3 tabulates the same definitions).

Matrix descriptor (PTX ISA 9.7.15.5.1.2.2, "Matrix Descriptor Format"), with
encode(x) = (x & 0x3FFFF) >> 4:

    bits  0-13  encode(start address)
    bits 16-29  encode(leading dimension byte offset, LBO)
    bits 32-45  encode(stride dimension byte offset, SBO)
    bits 49-51  matrix base offset
    bits 62-63  swizzle mode: 0 none, 1 128B, 2 64B, 3 32B

8-bit operands (e4m3 / e5m2, wgmma m64nNk32) are K-major only: a K slice
is still 32 bytes of each row (32 elements), so every K-major form, its
swizzle and its descriptors are the same bytes as for 16-bit elements.

MN-major operands (imm-trans-a/b = 1, f16/bf16 only: a row-major B, a
column-major A) are stored with M (or N) contiguous: an atom is 8 K-rows x W
bytes of M/N (W = 128/64/32; 16 without swizzle), and LBO / SBO swap roles
with the swizzle (CUTLASS `make_gmma_desc<Major::MN>`: INTERLEAVE
((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), SWx ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO))
for T = 16 bytes of elements). For element (mn, k), with A = W / e:

    swizzled:  swizzle(start + (mn // A) * LBO + (k // 8) * SBO + (k % 8) * W + (mn % A) * e)
    none:      start + (mn // A) * SBO + (k // 8) * LBO + (k % 8) * 16 + (mn % A) * e

`WgmmaSmemLayout(rows, k, element_bytes, swizzle)` places a rows x k tile in
the K-major form (swizzle atoms stacked along rows, then along K) and gives the
descriptor of each 16-wide K slice; `WgmmaTileLayout` places a tile of either
major (the pipelined loops' ring slots) and gives the descriptor of each K
slice and M/N offset. `operand_addresses` is the hardware's side (descriptor
-> byte address of every element, either major), which the SIMT simulator
uses and which the tests check against the layouts and CuTe's canonical forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layouts import LayoutError, RegisterLayout, spatial
from .smem_layouts import SmemLayout, row_major, swizzle_bytes

WARPGROUP = 128
WGMMA_M = 64
WGMMA_K = 16                # K of one wgmma for 16-bit inputs; a K slice is always 32 bytes of K (`wgmma_k`)
WGMMA_NS = tuple(range(8, 257, 8))
SWIZZLE_MODES = {0: 0, 128: 1, 64: 2, 32: 3}   # swizzle bytes -> descriptor bits 62-63
_ADDRESS_LIMIT = 1 << 18                         # encode() keeps bits 4..17


def wgmma_k(element_bytes: int) -> int:
    """K of one wgmma (and of one descriptor's K slice) for inputs of `element_bytes` bytes: 32 bytes of K,
    so k16 for f16/bf16 and k32 for e4m3/e5m2 (PTX: wgmma.mma_async.m64nNk32.f32.e4m3.e5m2 ...)."""
    return 32 // element_bytes


def wgmma_accumulator(n: int) -> RegisterLayout:
    """The 64 x n f32 accumulator of wgmma m64nNk16 over the 128 threads of a warpgroup (see the module doc)."""
    if n not in WGMMA_NS:
        raise LayoutError(f"wgmma has N = 8, 16, ..., 256; got {n}")
    return spatial(4, 1).column_local(2, n // 8).spatial(8, 4).local(1, 2)


def wgmma_a_fragment() -> RegisterLayout:
    """A 64 x 16 f16/bf16 A slice of wgmma m64nNk16 held in registers (the register-A form, `wgmma` with a
    regs<8> first operand) over the 128 threads of a warpgroup: warp w holds rows 16w..16w+15 as the mma.sync
    m16n8k16 A fragment (PTX ISA 9.7.15.5.1.1.1, "Register fragment of matrix A"; CUTLASS `ALayout_64x16`).
    Register i of thread 32 w + l holds A[16 w + l // 4 + 8 ((i // 2) % 2)][8 (i // 4) + 2 (l % 4) + i % 2]:
    the accumulator's map for its first 16 columns, so the RK slices of a 64 x 16 RK tile, stacked as
    `local(1, RK)`, hold in order exactly the registers of a 64 x 16 RK accumulator (FlashAttention-3 feeds
    P = f(S) to the P V product without moving a value)."""
    return spatial(4, 1).column_local(2, 2).spatial(8, 4).local(1, 2)


# -- matrix descriptors -----------------------------------------------------------------------


@dataclass(frozen=True)
class MatrixDescriptor:
    """The fields of a wgmma matrix descriptor, in bytes (start, lbo, sbo) and swizzle bytes (0/32/64/128)."""

    start: int
    lbo: int
    sbo: int
    swizzle: int = 128
    base_offset: int = 0

    def __post_init__(self) -> None:
        for name in ("start", "lbo", "sbo"):
            value = getattr(self, name)
            if not (0 <= value < _ADDRESS_LIMIT and value % 16 == 0):
                raise LayoutError(f"matrix descriptor {name} = {value} must be a multiple of 16 below 2**18")
        if self.swizzle not in SWIZZLE_MODES:
            raise LayoutError(f"matrix descriptor swizzle must be one of {sorted(SWIZZLE_MODES)} bytes, "
                              f"got {self.swizzle}")
        if not 0 <= self.base_offset < 8:
            raise LayoutError(f"matrix descriptor base offset must be in [0, 8), got {self.base_offset}")

    def encode(self) -> int:
        """The 64-bit descriptor, as an unsigned int."""
        return ((self.start >> 4) | (self.lbo >> 4) << 16 | (self.sbo >> 4) << 32
                | self.base_offset << 49 | SWIZZLE_MODES[self.swizzle] << 62)

    def signed(self) -> int:
        """The descriptor as an i64 value (what an IR constant holds)."""
        bits = self.encode()
        return bits - (1 << 64) if bits >= 1 << 63 else bits

    @staticmethod
    def decode(bits: int) -> "MatrixDescriptor":
        """Inverse of `encode` (an i64 or u64 value; reserved bits are ignored)."""
        bits = int(bits) & ((1 << 64) - 1)
        field = lambda lo: (bits >> lo) & 0x3FFF  # noqa: E731
        mode = bits >> 62
        swizzle = next(b for b, m in SWIZZLE_MODES.items() if m == mode)
        return MatrixDescriptor(field(0) << 4, field(16) << 4, field(32) << 4, swizzle, (bits >> 49) & 7)


def operand_addresses(desc: MatrixDescriptor, rows: int, element_bytes: int, mn_major: bool = False) -> np.ndarray:
    """Byte address of every element of the rows x k operand `desc` describes (rows along M or N, columns
    along K; k = `wgmma_k(element_bytes)`: 16, or 32 for 8-bit): (rows, k) ints. K-major unless `mn_major`
    (imm-trans-a/b = 1, 16-bit only); see the module docstring."""
    if desc.base_offset:
        raise LayoutError("matrix descriptors with a non-zero base offset are not modelled; start swizzled "
                          "tiles on a swizzle-pattern boundary (1024 bytes for 128B)")
    r = np.arange(rows)[:, None]
    if mn_major:
        k = np.arange(WGMMA_K)[None, :]
        width = desc.swizzle or 16                  # bytes of M/N per atom row
        per_row = width // element_bytes            # M/N elements per atom row
        b = (r % per_row) * element_bytes
        if desc.swizzle == 0:                       # core matrices: M/N-adjacent SBO apart, K-adjacent LBO
            return desc.start + (r // per_row) * desc.sbo + (k // 8) * desc.lbo + (k % 8) * 16 + b
        address = desc.start + (r // per_row) * desc.lbo + (k // 8) * desc.sbo + (k % 8) * width + b
        return swizzle_address(address, desc.swizzle)
    b = (np.arange(wgmma_k(element_bytes)) * element_bytes)[None, :]
    if desc.swizzle == 0:
        return desc.start + (r // 8) * desc.sbo + (b // 16) * desc.lbo + (r % 8) * 16 + b % 16
    address = desc.start + (r // 8) * desc.sbo + (r % 8) * desc.swizzle + b
    return swizzle_address(address, desc.swizzle)


def swizzle_address(address, swizzle: int):
    """The 32/64/128-byte swizzle of absolute shared byte addresses: CuTe Swizzle<log2(swizzle/16), 4, 3>."""
    mask = swizzle // 16 - 1
    return address ^ (((address >> 7) & mask) << 4)


# -- the shared-memory tiles the descriptors describe --------------------------------------------


@dataclass(frozen=True)
class WgmmaSmemLayout:
    """A K-major rows x k tile of `element_bytes`-byte elements in one of wgmma's shared-memory forms.

    Swizzled (32/64/128): swizzle atoms of 8 rows x `swizzle` bytes, row-major inside, stacked down the
    rows (SBO = 8 rows apart), then along K (a tile's worth apart). None (0): 8 x 16-byte core matrices
    of 128 bytes, K-adjacent ones LBO = 128 bytes apart, 8-row groups SBO = k * element_bytes * 8 apart.
    A k narrower than the swizzle width leaves the rest of each atom row unused. The compiler lays its
    tiles out with `WgmmaTileLayout` (either major; its swizzled K-major form is this one); this class
    serves hand-written kernels (the tests' `wgmma_programs`).
    """

    rows: int
    k: int
    element_bytes: int = 2
    swizzle: int = 128

    def __post_init__(self) -> None:
        if self.swizzle not in SWIZZLE_MODES:
            raise LayoutError(f"wgmma swizzle must be one of {sorted(SWIZZLE_MODES)} bytes, got {self.swizzle}")
        if self.element_bytes not in (1, 2, 4):
            raise LayoutError(f"wgmma operands have 1-, 2- or 4-byte elements, got {self.element_bytes}")
        if self.rows % 8 or self.rows <= 0:
            raise LayoutError(f"a wgmma operand tile has a multiple of 8 rows, got {self.rows}")
        if self.k % self.k_step or self.k <= 0:
            raise LayoutError(f"a wgmma operand tile has a multiple of {self.k_step} K elements, got {self.k}")
        k_bytes = self.k * self.element_bytes
        if self.swizzle and k_bytes > self.row_bytes and k_bytes % self.row_bytes:
            raise LayoutError(f"{self.k} K elements do not fill whole {self.swizzle}-byte swizzle atoms")

    @property
    def k_step(self) -> int:
        """K elements one wgmma reads (32 bytes of them: 16 f16/bf16)."""
        return 32 // self.element_bytes

    @property
    def row_bytes(self) -> int:
        """Bytes from one row of a swizzle atom to the next (the swizzle width; 16 without swizzle)."""
        return self.swizzle or 16

    @property
    def atom_k(self) -> int:
        """K elements per atom row (swizzled), at most the tile's k."""
        return min(self.k, self.row_bytes // self.element_bytes) if self.swizzle else 16 // self.element_bytes

    @property
    def lbo(self) -> int:
        """Leading-dimension byte offset: K-adjacent core matrices (no swizzle); unused (16) when swizzled."""
        return 128 if self.swizzle == 0 else 16

    @property
    def sbo(self) -> int:
        """Stride-dimension byte offset: from one group of 8 rows to the next."""
        return 8 * self.row_bytes if self.swizzle else 8 * self.k * self.element_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.k * self.element_bytes if not self.swizzle else \
            (self.k // self.atom_k) * self.rows * self.row_bytes

    def byte_offset(self, row, col):
        """Byte offset (from a pattern-aligned tile start) of element (row, col); ints or arrays."""
        e = self.element_bytes
        if self.swizzle == 0:
            cb = col * e
            return (row // 8) * self.sbo + (cb // 16) * self.lbo + (row % 8) * 16 + cb % 16
        block, inner = col // self.atom_k, col % self.atom_k
        plain = block * self.rows * self.row_bytes + row * self.row_bytes + inner * e
        return swizzle_address(plain, self.swizzle)

    def offsets(self) -> np.ndarray:
        """Element offset of every (row, col): a (rows, k) int array."""
        r, c = np.meshgrid(np.arange(self.rows), np.arange(self.k), indexing="ij")
        return np.asarray(self.byte_offset(r, c)) // self.element_bytes

    def smem_layout(self) -> SmemLayout:
        """The same map as an `SmemLayout` (strides + swizzle), for tiles of one swizzle atom column."""
        if not self.swizzle or self.k != self.atom_k:
            raise LayoutError(f"{self} is not one strided, swizzled block: only a swizzled tile whose k fits "
                              "one atom row is an SmemLayout")
        pad = self.row_bytes // self.element_bytes - self.k
        layout = row_major(self.rows, self.k, pad=pad)
        return SmemLayout(layout.shape, layout.strides, swizzle_bytes(self.swizzle, self.element_bytes))

    def descriptor(self, start: int, k_slice: int = 0) -> MatrixDescriptor:
        """The descriptor of K elements [k k_slice, k k_slice + k) (k = `k_step`: 16, or 32 for 8-bit elements)
        of the tile placed at byte `start`."""
        align = 8 * self.row_bytes if self.swizzle else 16
        if start % align:
            raise LayoutError(f"a {self.swizzle or 'non'}-swizzled wgmma tile must start on a {align}-byte "
                              f"boundary, got byte {start}")
        if not 0 <= k_slice < self.k // self.k_step:
            raise LayoutError(f"k slice {k_slice} is outside the tile's {self.k // self.k_step} slices")
        col = k_slice * self.k_step
        if self.swizzle:
            block, inner = col // self.atom_k, col % self.atom_k
            offset = block * self.rows * self.row_bytes + inner * self.element_bytes
        else:
            offset = (col * self.element_bytes // 16) * self.lbo
        return MatrixDescriptor(start + offset, self.lbo, self.sbo, self.swizzle)


@dataclass(frozen=True)
class WgmmaTileLayout:
    """A `rows` x `cols` operand tile in shared memory, `cols` its contiguous dim, in a form wgmma reads.

    K-major (`major = "K"`): rows run along M (A) or N (B), cols along K. MN-major (`major = "MN"`, read
    with imm-trans = 1): rows run along K, cols along M or N. Either way the cols are cut into column blocks
    one atom row wide (`row_bytes` = the swizzle width, 16 bytes without swizzle), and each block is a
    rows x atom row-major array with rows `row_bytes` apart, the blocks one after the other:

        byte(row, col) = swizzle((col // atom) * rows * row_bytes + row * row_bytes + (col % atom) * e)

    Read as 8-row x `row_bytes` atoms, that is the PTX canonical layout of both majors (CuTe's
    `Layout_{K,MN}_SW{32,64,128}_Atom` and INTERLEAVE tiled over the tile): a descriptor's strides are
    8 rows = 8 * row_bytes apart, and the next column block rows * row_bytes apart. Which of LBO / SBO
    holds which depends on the major and the swizzle (`descriptor`). Every 16-byte chunk of a row stays
    whole (the swizzle permutes whole chunks), so one 16-byte copy fills one chunk.
    """

    rows: int
    cols: int
    element_bytes: int = 2
    swizzle: int = 128
    major: str = "K"

    def __post_init__(self) -> None:
        if self.swizzle not in SWIZZLE_MODES:
            raise LayoutError(f"wgmma swizzle must be one of {sorted(SWIZZLE_MODES)} bytes, got {self.swizzle}")
        if self.major not in ("K", "MN"):
            raise LayoutError(f"a wgmma operand is K-major or MN-major, got major = {self.major!r}")
        if self.rows % 8 or self.rows <= 0 or self.cols <= 0 or self.cols % self.atom:
            raise LayoutError(f"a wgmma tile of {self.rows} x {self.cols} does not fill whole {self.row_bytes}-"
                              f"byte atoms of 8 rows ({self.atom} elements per atom row)")

    @property
    def row_bytes(self) -> int:
        return self.swizzle or 16

    @property
    def atom(self) -> int:
        """Elements of the contiguous dim per atom row."""
        return self.row_bytes // self.element_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one column block (rows x one atom row)."""
        return self.rows * self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * self.element_bytes

    @property
    def alignment(self) -> int:
        """Byte boundary the tile starts on: the swizzle pattern's period (8 atom rows), 16 without swizzle."""
        return 8 * self.row_bytes if self.swizzle else 16

    def plain_offset(self, row, col):
        """Byte offset of element (row, col) before the swizzle (what a descriptor's start holds)."""
        return (col // self.atom) * self.block_bytes + row * self.row_bytes + (col % self.atom) * self.element_bytes

    def byte_offset(self, row, col):
        """Byte offset of element (row, col) from the tile start (on a pattern boundary); ints or arrays."""
        plain = self.plain_offset(row, col)
        return swizzle_address(plain, self.swizzle) if self.swizzle else plain

    def descriptor(self, start: int, k_slice: int, mn_first: int) -> MatrixDescriptor:
        """The descriptor of K elements [k k_slice, k k_slice + k) (k = `wgmma_k`: 16 for 16-bit elements, 32
        for 8-bit ones) and M/N elements from `mn_first` on, of the tile at byte `start`. `mn_first` must start
        an 8-row group (K-major) or a column block (MN)."""
        if start % self.alignment:
            raise LayoutError(f"this wgmma tile must start on a {self.alignment}-byte boundary, got byte {start}")
        k_first = k_slice * wgmma_k(self.element_bytes)
        if self.major == "K":
            if mn_first % 8:
                raise LayoutError(f"a K-major wgmma operand starts on an 8-row group, not row {mn_first}")
            begin = start + self.plain_offset(mn_first, k_first)
            if self.swizzle:        # K-adjacent chunks within the atom row (LBO unused); 8-row groups SBO apart
                return MatrixDescriptor(begin, 16, 8 * self.row_bytes, self.swizzle)
            return MatrixDescriptor(begin, self.block_bytes, 8 * self.row_bytes, 0)
        if mn_first % self.atom:
            raise LayoutError(f"an MN-major wgmma operand starts on a column block of {self.atom}, not {mn_first}")
        begin = start + self.plain_offset(k_first, mn_first)
        if self.swizzle:            # M/N-adjacent atoms LBO apart, 8-row K groups SBO apart
            return MatrixDescriptor(begin, self.block_bytes, 8 * self.row_bytes, self.swizzle)
        return MatrixDescriptor(begin, 8 * self.row_bytes, self.block_bytes, 0)     # SBO along M/N, LBO along K


def wgmma_tile_swizzle(cols: int, element_bytes: int, granule: int) -> int:
    """The widest swizzle (bytes) whose atom row divides the contiguous extent `cols` and `granule` (a
    descriptor starts every `granule` elements along it: 64 or N for MN-major; `cols` for K-major, whose
    16-wide K slices always lie inside an atom row); 0: none."""
    return next((w for w in (128, 64, 32)
                 if (cols * element_bytes) % w == 0 and (granule * element_bytes) % w == 0), 0)


for _constructor in (wgmma_accumulator,):
    _constructor.__tessera_constexpr__ = True
