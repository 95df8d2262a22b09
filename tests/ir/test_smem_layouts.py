"""Specification of tessera.ir.smem_layouts: offsets, XOR swizzles, bank conflicts.

Offsets are checked against the formulas written here; swizzles as laws
(involution, bijection onto [0, size)); bank conflicts on the standard cases
of a 64x64 f16 tile: ldmatrix-style 16-byte row reads and column reads,
row-major vs padded vs 128-byte swizzled.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.ir.layouts import LayoutError
from tessera.ir.smem_layouts import (
    SmemLayout, Swizzle, bank_conflicts, col_major, parse_smem_layout, row_major, strided, swizzle_bytes,
)  # fmt: skip

FAST = settings(max_examples=60, deadline=None)
POW2 = st.sampled_from((1, 2, 4, 8, 16, 32, 64, 128))


@st.composite
def swizzles(draw) -> Swizzle:
    bits = draw(st.integers(1, 3))
    return Swizzle(bits, draw(st.integers(0, 4)), draw(st.integers(bits, bits + 3)))


@st.composite
def smem_layouts(draw) -> SmemLayout:
    shape = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    kind = draw(st.sampled_from(("row", "col", "strided")))
    if kind == "strided":
        layout = strided(shape, draw(st.lists(st.integers(0, 50), min_size=len(shape), max_size=len(shape))))
    else:
        layout = (row_major if kind == "row" else col_major)(*shape, pad=draw(st.integers(0, 4)))
    if draw(st.booleans()):
        s = draw(swizzles())
        layout = layout.with_swizzle(s.bits, s.base, s.shift)
    return layout


# -- offsets ----------------------------------------------------------------------


def test_offsets_of_row_major_col_major_and_padded_tiles():
    r, c = np.meshgrid(np.arange(8), np.arange(16), indexing="ij")
    assert np.array_equal(row_major(8, 16).offsets(), r * 16 + c)
    assert np.array_equal(col_major(8, 16).offsets(), r + c * 8)
    assert np.array_equal(row_major(8, 16, pad=4).offsets(), r * 20 + c)
    assert np.array_equal(col_major(8, 16, pad=1).offsets(), r + c * 9)
    assert row_major(8, 16, pad=4).cosize == 7 * 20 + 16
    assert row_major(8, 16)(3, 5) == 53 and row_major(4, 8, 16).strides == (128, 16, 1)


def test_swizzle_formula_and_the_128_byte_f16_pattern():
    s = Swizzle(3, 3, 3)
    assert s(0b101_000_111) == 0b101_101_111  # bits 6..8 xor into bits 3..5
    layout = row_major(64, 64).with_swizzle(3, 3, 3)  # f16: 64 elements = one 128-byte row
    for row in range(64):
        for col in range(64):
            chunk, within = divmod(col, 8)  # 16-byte chunks of 8 f16
            assert layout(row, col) == row * 64 + (chunk ^ (row % 8)) * 8 + within
    assert swizzle_bytes(128, 2) == s
    assert swizzle_bytes(128, 4) == Swizzle(3, 2, 3) and swizzle_bytes(64, 2) == Swizzle(2, 3, 3)
    assert swizzle_bytes(32, 1) == Swizzle(1, 4, 3)


@FAST
@given(swizzles(), st.lists(st.integers(0, 1 << 20), min_size=1, max_size=50))
def test_swizzle_is_an_involution(s, offsets):
    assert [s(s(o)) for o in offsets] == offsets
    assert np.array_equal(s(s(np.array(offsets))), offsets)


@FAST
@given(POW2, POW2, st.booleans(), swizzles())
def test_swizzled_compact_layouts_are_bijections(rows, cols, column, s):
    base = (col_major if column else row_major)(rows, cols)
    layout = base.with_swizzle(s.bits, s.base, s.shift)
    if (rows * cols) % s.block == 0:
        assert layout.is_bijective and layout.cosize == rows * cols
    assert len(np.unique(layout.offsets())) == rows * cols  # injective always


def test_padding_and_strides_that_alias():
    assert not row_major(4, 4, pad=1).is_bijective
    assert len(np.unique(row_major(4, 4, pad=1).offsets())) == 16
    assert not strided((4, 4), (1, 1)).is_bijective


# -- text form --------------------------------------------------------------------


@FAST
@given(smem_layouts())
def test_print_parse_round_trip(layout):
    text = str(layout)
    assert parse_smem_layout(text) == layout and str(parse_smem_layout(text)) == text


def test_text_form_examples():
    assert str(row_major(64, 64)) == "row_major(64,64)"
    assert str(row_major(64, 64, pad=8).with_swizzle(3, 3, 3)) == "row_major(64,64,pad=8).swizzle(3,3,3)"
    assert str(col_major(32, 16)) == "col_major(32,16)"
    assert str(strided((4, 8), (3, 100))) == "strided(shape=[4,8],strides=[3,100])"
    assert str(strided((4, 8), (1, 5))) == "col_major(4,8,pad=1)"
    assert row_major(1, 64) == col_major(1, 64)  # strides of size-1 dims do not matter


@pytest.mark.parametrize(
    "text, message",
    [
        ("row_major(64,64).swizzle(3,3)", "swizzle"),
        ("row_major(64,64).swizzle(3,3,2)", "shift >= bits"),
        ("tiled(4)", "unknown smem layout"),
        ("row_major(4,pad=-1)", "non-negative"),
        ("row_major(4).swizzle(1,0,1).swizzle(1,0,1)", "only one"),
    ],
)
def test_bad_text_is_a_layout_error(text, message):
    with pytest.raises(LayoutError, match=message):
        parse_smem_layout(text)


# -- bank conflicts ------------------------------------------------------------------

F16 = 2
ROW_MAJOR = row_major(64, 64)
SWIZZLED = ROW_MAJOR.with_swizzle(3, 3, 3)  # swizzle_bytes(128, F16)


def ldmatrix_rows(chunk: int) -> np.ndarray:
    """ldmatrix.x4: lane l reads 16 bytes (8 f16) of row l at 16-byte chunk `chunk`."""
    lanes = np.arange(32)[:, None]
    return np.stack(np.broadcast_arrays(lanes, chunk * 8 + np.arange(8)[None, :]), axis=-1)


def column(col: int) -> np.ndarray:
    """Lane l reads element (l, col): a column of a row-major tile."""
    return np.stack([np.arange(32), np.full(32, col)], axis=-1)


@pytest.mark.parametrize("chunk", range(8))
def test_128_byte_swizzle_removes_ldmatrix_bank_conflicts(chunk):
    # 8 lanes per phase read the same chunk of 8 rows 128 bytes apart: all in the same 4 banks
    assert bank_conflicts(ROW_MAJOR, ldmatrix_rows(chunk), F16) == 8
    assert bank_conflicts(SWIZZLED, ldmatrix_rows(chunk), F16) == 1


def test_column_reads_of_a_f16_tile():
    assert bank_conflicts(ROW_MAJOR, column(0), F16) == 32  # every row starts at bank 0
    assert bank_conflicts(row_major(64, 64, pad=2), column(0), F16) == 1  # rows 33 words apart
    assert bank_conflicts(SWIZZLED, column(0), F16) == 4  # 8 distinct chunks for 32 rows


def test_bank_conflict_counting_rules():
    row = np.stack([np.zeros(32, int), np.arange(32)], axis=-1)
    assert bank_conflicts(ROW_MAJOR, row, F16) == 1  # 16 words, pairs of lanes share a word
    assert bank_conflicts(row_major(64, 64), np.zeros((32, 2), int), F16) == 1  # broadcast
    assert bank_conflicts(row_major(64, 32), row, 4) == 1
    assert bank_conflicts(row_major(64, 32), column(0), 4) == 32
    f64 = np.stack([np.zeros(32, int), np.arange(32)], axis=-1)  # 8-byte elements: 2 phases of 16
    assert bank_conflicts(row_major(2, 32), f64, 8) == 1
    with pytest.raises(LayoutError, match="coordinates"):
        bank_conflicts(ROW_MAJOR, np.zeros((32, 3), int), F16)
