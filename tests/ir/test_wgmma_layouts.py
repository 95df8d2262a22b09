"""wgmma layouts as specifications: the accumulator fragment, the K-major shared-memory tiles in every
swizzle mode, the MN-major ones, and the 64-bit matrix descriptors, each against an independently written
definition (the PTX table, CuTe's canonical GMMA layouts written as shape:stride)."""

import numpy as np
import pytest

from tessera.ir.layouts import LayoutError, local, mma_m16n8k16_c, spatial
from tessera.ir.smem_layouts import swizzle_bytes
from tessera.ir.wgmma_layouts import (WGMMA_NS, MatrixDescriptor, WgmmaSmemLayout, WgmmaTileLayout, wgmma_a_fragment,
                                      operand_addresses, wgmma_accumulator, wgmma_tile_swizzle)


def ptx_accumulator_table(n):
    """PTX ISA 9.7.15.5.1.1.1 (Figure 149), written out loop by loop: thread -> register -> (row, col)."""
    table = np.zeros((128, n // 2, 2), int)
    for t in range(128):
        warp, lane = divmod(t, 32)
        group, in_group = divmod(lane, 4)
        for i in range(n // 2):
            row = 16 * warp + group + (8 if i % 4 >= 2 else 0)
            col = 8 * (i >> 2) + in_group * 2 + (i & 1)
            table[t, i] = row, col
    return table


@pytest.mark.parametrize("n", WGMMA_NS)
def test_accumulator_matches_the_ptx_table(n):
    layout = wgmma_accumulator(n)
    assert layout.shape == (64, n) and layout.num_threads == 128 and layout.local_size == n // 2
    assert layout.is_bijective
    np.testing.assert_array_equal(layout.table(), ptx_accumulator_table(n))


def test_accumulator_n8_is_the_mma_c_fragment_per_warp():
    assert wgmma_accumulator(8) == spatial(4, 1) * mma_m16n8k16_c()


def test_register_a_fragment_matches_the_ptx_table():
    """PTX ISA "Register fragment of matrix A" (m64nNk16, f16/bf16): thread 32 w + l, register i holds
    A[16 w + l // 4 + 8 ((i // 2) % 2)][8 (i // 4) + 2 (l % 4) + i % 2]: the accumulator's first 16 columns."""
    layout = wgmma_a_fragment()
    assert layout.shape == (64, 16) and layout.num_threads == 128 and layout.local_size == 8 and layout.is_bijective
    np.testing.assert_array_equal(layout.table(), ptx_accumulator_table(32)[:, :8])
    rk = 4          # RK slices stacked along K hold the registers of a 64 x 16 RK accumulator, in order
    np.testing.assert_array_equal((local(1, rk) * wgmma_a_fragment()).table(), wgmma_accumulator(16 * rk).table())


@pytest.mark.parametrize("n", [0, 4, 12, 264])
def test_accumulator_rejects_n_outside_8_to_256(n):
    with pytest.raises(LayoutError, match="N = 8, 16, ..., 256"):
        wgmma_accumulator(n)


# -- descriptors -------------------------------------------------------------------------------

def test_descriptor_fields_hand_computed():
    # A 128B-swizzled tile at shared byte 0x4400 (= 17408), SBO 1024, LBO 16 (unused for swizzled K-major).
    desc = MatrixDescriptor(start=0x4400, lbo=16, sbo=1024, swizzle=128)
    bits = desc.encode()
    assert bits & 0x3FFF == 0x440                  # start >> 4
    assert (bits >> 16) & 0x3FFF == 1              # lbo >> 4
    assert (bits >> 32) & 0x3FFF == 64             # sbo >> 4
    assert (bits >> 49) & 7 == 0
    assert bits >> 62 == 1                         # 128B swizzle
    assert bits == 0x4000_0040_0001_0440
    assert desc.signed() == bits                   # bit 63 clear: a positive i64
    assert MatrixDescriptor(0, 16, 512, 64).signed() == (2 << 62) + (32 << 32) + (1 << 16) - (1 << 64)
    assert MatrixDescriptor(0, 16, 1024, 64).encode() >> 62 == 2
    assert MatrixDescriptor(0, 16, 256, 32).encode() >> 62 == 3
    assert MatrixDescriptor(0, 128, 256, 0).encode() >> 62 == 0


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("start, lbo, sbo, base", [(0, 16, 1024, 0), (0x3FFF0, 0x3FFF0, 0x3FFF0, 0), (1024, 128, 512, 3)])
def test_descriptor_round_trips(swizzle, start, lbo, sbo, base):
    desc = MatrixDescriptor(start, lbo, sbo, swizzle, base)
    assert MatrixDescriptor.decode(desc.encode()) == desc
    assert MatrixDescriptor.decode(desc.signed()) == desc


@pytest.mark.parametrize("fields", [dict(start=8, lbo=16, sbo=16), dict(start=1 << 18, lbo=16, sbo=16),
                                    dict(start=0, lbo=16, sbo=16, swizzle=96)])
def test_descriptor_rejects_unencodable_fields(fields):
    with pytest.raises(LayoutError):
        MatrixDescriptor(**fields)


# -- shared-memory tiles -------------------------------------------------------------------------

def cutlass_k_major_sw128_offset(row, col):
    """CUTLASS GMMA::Layout_K_SW128_Atom<bf16>: 8 x 64 row-major atom under Swizzle<3,4,3> on bytes, i.e.
    16-byte chunk c of 128-byte row r lands at chunk c ^ (r % 8)."""
    chunk, within = divmod(col, 8)
    return row * 64 + (chunk ^ (row % 8)) * 8 + within


def test_sw128_tile_is_chunk_xor_row():
    layout = WgmmaSmemLayout(rows=64, k=64, element_bytes=2, swizzle=128)
    expected = np.array([[cutlass_k_major_sw128_offset(r, c) for c in range(64)] for r in range(64)])
    np.testing.assert_array_equal(layout.offsets(), expected)
    np.testing.assert_array_equal(layout.smem_layout().offsets(), expected)
    assert layout.smem_layout().swizzle == swizzle_bytes(128, 2)
    assert (layout.sbo, layout.nbytes) == (1024, 64 * 128)


@pytest.mark.parametrize("swizzle, rows_per_xor", [(64, 2), (32, 4)])
def test_sw64_and_sw32_tiles_xor_chunks_by_the_128_byte_line(swizzle, rows_per_xor):
    # A row of `swizzle` bytes; chunk c of row r moves to c ^ ((r // rows_per_xor) % (swizzle // 16)).
    k = swizzle // 2
    layout = WgmmaSmemLayout(rows=16, k=k, element_bytes=2, swizzle=swizzle)
    chunks = swizzle // 16
    for r in range(16):
        for c in range(k):
            chunk, within = divmod(c, 8)
            moved = chunk ^ ((r // rows_per_xor) % chunks)
            assert layout.offsets()[r, c] == r * k + moved * 8 + within
    np.testing.assert_array_equal(layout.smem_layout().offsets(), layout.offsets())


def test_unswizzled_tile_is_core_matrices():
    layout = WgmmaSmemLayout(rows=16, k=32, element_bytes=2, swizzle=0)
    offsets = layout.offsets()
    # Each 8x8 core matrix is 64 contiguous elements, row-major; K-neighbours are 64 apart, row groups 256.
    for r in range(16):
        for c in range(32):
            assert offsets[r, c] == (r // 8) * 256 + (c // 8) * 64 + (r % 8) * 8 + c % 8
    assert (layout.lbo, layout.sbo) == (128, 512)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("rows", [64, 128])
def test_descriptor_addresses_are_the_layout(swizzle, rows):
    """What the hardware reads through each K slice's descriptor is exactly where the layout put it."""
    k = 64
    layout = WgmmaSmemLayout(rows=rows, k=k, element_bytes=2, swizzle=swizzle)
    start = 2048
    every = start + np.asarray(layout.offsets()) * 2
    for s in range(k // 16):
        desc = layout.descriptor(start, s)
        np.testing.assert_array_equal(operand_addresses(desc, rows, 2), every[:, 16 * s:16 * s + 16])
    assert np.unique(every).size == rows * k and every.max() < start + layout.nbytes


def test_sw128_descriptor_k_slices_advance_the_start_by_32_bytes():
    layout = WgmmaSmemLayout(rows=64, k=64, element_bytes=2, swizzle=128)
    assert [layout.descriptor(4096, s).start for s in range(4)] == [4096, 4128, 4160, 4192]
    assert {(d.lbo, d.sbo, d.swizzle) for d in (layout.descriptor(4096, s) for s in range(4))} == {(16, 1024, 128)}


def test_misaligned_swizzled_tile_is_an_error():
    with pytest.raises(LayoutError, match="1024-byte boundary"):
        WgmmaSmemLayout(64, 64).descriptor(512)


# -- MN-major operands and the tiles of both majors (`WgmmaTileLayout`) -------------------------------------


def cute_offset(coord, shape, stride):
    """A CuTe layout shape:stride (nested tuples) at a 1-D coordinate per mode: colexicographic digits."""
    if isinstance(shape, int):
        return coord * stride
    total = 0
    for s, d in zip(shape, stride):
        size = int(np.prod(_flat(s)))
        total += cute_offset(coord % size, s, d)
        coord //= size
    return total


def _flat(shape):
    return [shape] if isinstance(shape, int) else [x for s in shape for x in _flat(s)]


def ptx_mn_major_address(desc, mn, k, element_bytes=2):
    """CUTLASS `make_gmma_desc<Major::MN>` canonical layouts, in elements (T = 16 bytes of them), LBO/SBO
    in elements too, then the swizzle on byte addresses:
        INTERLEAVE: Swizzle<0,4,3> o ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
        B32/64/128: Swizzle<x',4,3> o ((T,x,m),(8,k)):((1,T,LBO),(xT,SBO))   x = swizzle / 16
    """
    t = 16 // element_bytes
    lbo, sbo = desc.lbo // element_bytes, desc.sbo // element_bytes
    if desc.swizzle == 0:
        offset = cute_offset(mn, (t, 1, 64), (1, t, sbo)) + cute_offset(k, (8, 2), (t, lbo))
    else:
        x = desc.swizzle // 16
        offset = cute_offset(mn, (t, x, 64), (1, t, lbo)) + cute_offset(k, (8, 2), (x * t, sbo))
    address = desc.start + offset * element_bytes
    bits = {0: 0, 32: 1, 64: 2, 128: 3}[desc.swizzle]
    return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)


def ptx_k_major_address(desc, mn, k, element_bytes=2):
    """CUTLASS `make_gmma_desc<Major::K>`: INTERLEAVE ((8,m),(T,2)):((1T,SBO),(1,LBO)); B32/64/128
    ((8,m),(T,2)):((xT,SBO),(1,T)), in elements, then the byte swizzle."""
    t = 16 // element_bytes
    lbo, sbo = desc.lbo // element_bytes, desc.sbo // element_bytes
    if desc.swizzle == 0:
        offset = cute_offset(mn, (8, 64), (t, sbo)) + cute_offset(k, (t, 2), (1, lbo))
    else:
        x = desc.swizzle // 16
        offset = cute_offset(mn, (8, 64), (x * t, sbo)) + cute_offset(k, (t, 2), (1, t))
    address = desc.start + offset * element_bytes
    bits = {0: 0, 32: 1, 64: 2, 128: 3}[desc.swizzle]
    return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("rows", [64, 128, 256])
@pytest.mark.parametrize("lbo, sbo", [(2048, 1024), (4096, 128), (256, 8192)])
def test_mn_major_addresses_are_the_ptx_canonical_layout(swizzle, rows, lbo, sbo):
    """Element (mn, k) of an MN-major operand, for any LBO / SBO, where the canonical layout puts it."""
    desc = MatrixDescriptor(8192, lbo, sbo, swizzle)
    at = operand_addresses(desc, rows, 2, mn_major=True)
    for mn in range(rows):
        for k in range(16):
            assert at[mn, k] == ptx_mn_major_address(desc, mn, k), (mn, k)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_k_major_addresses_are_the_ptx_canonical_layout(swizzle):
    desc = MatrixDescriptor(4096, 512 if swizzle == 0 else 16, 1024 if swizzle else 256, swizzle)
    at = operand_addresses(desc, 64, 2)
    expected = [[ptx_k_major_address(desc, mn, k) for k in range(16)] for mn in range(64)]
    np.testing.assert_array_equal(at, expected)


TILES = [(rows, cols, swizzle, major) for swizzle in (0, 32, 64, 128) for major in ("K", "MN")
         for rows, cols in ((64, 128), (32, 256), (128, 64)) if cols * 2 % (swizzle or 16) == 0]


@pytest.mark.parametrize("rows, cols, swizzle, major", TILES, ids=str)
def test_wgmma_tile_descriptors_read_the_tile_element_by_element(rows, cols, swizzle, major):
    """Every descriptor of a tile (each K slice; each 8-row group or column block where an operand may
    start) reads exactly the elements the layout put there; the layout is a bijection onto its bytes."""
    tile = WgmmaTileLayout(rows, cols, 2, swizzle, major)
    start = 3 * 1024
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    every = start + np.asarray(tile.byte_offset(r, c))
    assert np.unique(every).size == rows * cols and every.min() == start and every.max() < start + tile.nbytes
    k_extent, mn_extent = (cols, rows) if major == "K" else (rows, cols)
    for s in range(k_extent // 16):
        for mn_first in range(0, mn_extent - 63, 64):
            desc = tile.descriptor(start, s, mn_first)
            at = operand_addresses(desc, 64, 2, mn_major=major == "MN")
            mn, k = np.arange(64)[:, None] + mn_first, np.arange(16)[None, :] + 16 * s
            expected = every[mn, k] if major == "K" else every[k, mn]
            np.testing.assert_array_equal(at, expected)


def test_mn_major_sw128_tile_spelled_out():
    """A 16 x 128 (K x N) MN-major tile, 128-byte swizzle: N in two 64-wide column blocks of 16 x 128 bytes;
    16-byte chunk c of K row k moves to chunk c ^ (k % 8); LBO = a block (2048), SBO = 8 rows (1024)."""
    tile = WgmmaTileLayout(16, 128, 2, 128, "MN")
    for k in range(16):
        for n in range(128):
            block, inner = divmod(n, 64)
            chunk, within = divmod(inner, 8)
            assert tile.byte_offset(k, n) == block * 2048 + k * 128 + (chunk ^ (k % 8)) * 16 + within * 2
    d = tile.descriptor(0, 1, 64)
    assert (d.start, d.lbo, d.sbo, d.swizzle) == (2048 + 16 * 128, 2048, 1024, 128)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_a_16_byte_chunk_of_a_tile_row_stays_one_chunk(swizzle):
    """What lets one 16-byte cp.async fill a swizzled tile: 8 contiguous elements stay contiguous."""
    tile = WgmmaTileLayout(16, 128, 2, swizzle, "MN")
    for row in range(16):
        for col in range(0, 128, 8):
            chunk = [tile.byte_offset(row, col + i) for i in range(8)]
            assert chunk == list(range(chunk[0], chunk[0] + 16, 2)) and chunk[0] % 16 == 0


def test_tile_swizzle_is_the_widest_dividing_the_block_and_the_descriptor_starts():
    assert wgmma_tile_swizzle(64, 2, 64) == 128        # K-major 64-wide K, or an MN-major 64-row slab
    assert wgmma_tile_swizzle(128, 2, 64) == 128
    assert wgmma_tile_swizzle(32, 2, 32) == 64
    assert wgmma_tile_swizzle(48, 2, 48) == 32         # 96 bytes: 32-byte atoms
    assert wgmma_tile_swizzle(8, 2, 8) == 0            # 16 bytes: core matrices
    assert wgmma_tile_swizzle(128, 2, 16) == 32        # B with N = 16 per wgmma


def test_a_misplaced_tile_descriptor_is_an_error():
    with pytest.raises(LayoutError, match="1024-byte boundary"):
        WgmmaTileLayout(16, 128, 2, 128, "MN").descriptor(512, 0, 0)
    with pytest.raises(LayoutError, match="column block of 64"):
        WgmmaTileLayout(16, 128, 2, 128, "MN").descriptor(0, 0, 32)
    with pytest.raises(LayoutError, match="whole 128-byte atoms"):
        WgmmaTileLayout(16, 96, 2, 128, "MN")
