"""NVIDIA mma.sync fragments for every (m, n, k, dtypes) the `mma` thread op runs.

`mma.sync.aligned.m16n8k{8,16,32}.row.col` computes D = A @ B + C for a
16 x k A, a k x 8 B and a 16 x 8 C/D spread over the 32 lanes of a warp.
Every lane holds m*k/32 A, k*n/32 B and m*n/32 C elements; with groupID =
lane >> 2 and tid = lane % 4, element (or register) i of a lane is (PTX ISA
9.7.14.5, "Matrix Fragments for mma.m16n8k8", "... for mma.m16n8k16 with
floating point type" and "... for mma.m16n8k32"):

    m16n8k8   .tf32       A  row = g (+8 for a1, a3)         col = t (+4 for a2, a3)
                          B  row = t (+4 for b1)             col = g
    m16n8k16  .f16/.bf16  A  row = g (+8 for a2,a3,a6,a7)    col = 2t + (i & 1) (+8 for i >= 4)
                          B  row = 2t + (i & 1) (+8 for b2, b3)   col = g
    m16n8k32  .s8/.u8/    A  row = g (+8 for 4 <= i < 8, 12 <= i < 16)
              .e4m3/.e5m2    col = 4t + (i & 3) (+16 for i >= 8)
                          B  row = 4t + (i & 3) (+16 for i >= 4)  col = g
    all       C/D (.f32 or .s32)  row = g (+8 for c2, c3)     col = 2t + (i & 1)

The 16-bit and 8-bit fragments pack 2 or 4 consecutive elements into one
32-bit register, lowest index in the low bits; tf32 takes one element per
register. The three shapes share one pattern — the 16x8x(8*w) instruction
for w elements per 32-bit register: A `column_local(2, 2).spatial(8, 4).
local(1, w)`, B `local(2, 1).column_spatial(4, 8).local(w, 1)` — which is
why the thread op's type rule and the simulator handle them all alike.

`mma_fragments(m, n, k)` gives the (A, B, C) layouts of one shape.

ldmatrix (`ldmatrix_layout`) moves 8x8 matrices of 16-bit words: row r of
matrix j is 16 bytes at the address lane 8j + r gives, and lane l receives
the 32-bit word (l // 4, l % 4) of it. Read as elements of `bits` bits, a
row holds 128 / bits of them and the word w = 32 / bits consecutive ones:
lane l holds row l // 4, columns w * (l % 4) .. + w - 1, in registers
w*j .. w*j + w - 1 (`local(num, 1) . spatial(8, 4) . local(1, w)`). That is
exactly the A fragment above for a 16 x k tile stored row-major (K
contiguous): matrices 0..3 of m16n8k32 A are (rows 0-7 | 8-15) x (cols
0-15 | 16-31) in register order a0-3, a4-7, a8-11, a12-15, and of m16n8k8
.tf32 A (rows 0-7 | 8-15) x (cols 0-3 | 4-7) for a0..a3; and the B fragment
for an 8 x k tile stored N-major (B^T row-major, K contiguous): m16n8k32 B
b0-3 / b4-7 are k 0-15 / 16-31 of rows n = groupID, m16n8k8 B b0 / b1 are
k 0-3 / 4-7. `.trans` swaps 16-bit elements, so it only serves 16-bit
fragments; an 8-bit or tf32 operand contiguous along M or N has no ldmatrix
read.
"""

from __future__ import annotations

from . import dtypes as dt
from .layouts import (LayoutError, RegisterLayout, column_local, ldmatrix, local, mma_m16n8k16_a, mma_m16n8k16_b,
                      mma_m16n8k16_c, spatial)

WARP = 32

# (m, n, k) -> the input dtype pairs (A, B) it multiplies and the accumulator dtype. f32 inputs mean tf32: the
# instruction reads the f32 registers as tf32, so the `mma` op rounds them first (cvt.rna.tf32.f32).
FP8 = (dt.f8e4m3, dt.f8e5m2)
MMA_SHAPES: dict[tuple[int, int, int], tuple[tuple[tuple[dt.DType, dt.DType], ...], dt.DType]] = {
    (16, 8, 8): (((dt.f32, dt.f32),), dt.f32),
    (16, 8, 16): (((dt.f16, dt.f16), (dt.bf16, dt.bf16)), dt.f32),
    (16, 8, 32): (((dt.i8, dt.i8), (dt.u8, dt.u8)), dt.i32),
}
MMA_FP8_INPUTS = tuple((x, y) for x in FP8 for y in FP8)     # m16n8k32 with an f32 accumulator, sm_89+
# Elements ldmatrix rows may hold: 16-bit ones (plain or .trans), 8-bit and 32-bit ones (plain only).
LDMATRIX_ELEMENTS = (dt.f16, dt.bf16, dt.i8, dt.u8, *FP8, dt.f32)


def ldmatrix_layout(num: int = 4, trans: bool = False, bits: int = 16) -> RegisterLayout:
    """Registers of ldmatrix.sync.m8n8.x{num}[.trans].b16 read as `bits`-bit elements, matrices stacked by rows:
    (8 * num, 128 / bits); see the module docstring. 16-bit: `layouts.ldmatrix(num, trans)`."""
    if bits == 16:
        return ldmatrix(num, trans)
    if trans or bits not in (8, 32):
        raise LayoutError(f"ldmatrix reads {bits}-bit elements only without .trans, as 8- or 32-bit elements")
    if num not in (1, 2, 4):
        raise LayoutError(f"ldmatrix: num must be 1, 2 or 4, got {num}")
    return local(num, 1) * spatial(8, 4).local(1, 32 // bits)


def mma_accepts(shape: tuple[int, int, int], a: dt.DType, b: dt.DType, acc: dt.DType) -> bool:
    """Whether mma.sync has an m x n x k instruction for A, B and C of these dtypes."""
    if shape == (16, 8, 32) and (a, b) in MMA_FP8_INPUTS:
        return acc == dt.f32
    pairs, accumulator = MMA_SHAPES.get(shape, ((), None))
    return (a, b) in pairs and acc == accumulator


def mma_m16n8k8_a() -> RegisterLayout:
    """A of mma.sync m16n8k8 .tf32, a 16x8 (m, k) tile: row = groupID (+8 for a1, a3), col = tid (+4 for a2, a3)."""
    return column_local(2, 2).spatial(8, 4)


def mma_m16n8k8_b() -> RegisterLayout:
    """B of mma.sync m16n8k8 .tf32, an 8x8 (k, n) tile: row = tid (+4 for b1), col = groupID."""
    return local(2, 1).column_spatial(4, 8)


def mma_m16n8k32_a() -> RegisterLayout:
    """A of mma.sync m16n8k32 .s8/.u8/.e4m3/.e5m2, a 16x32 (m, k) tile: row = groupID (+8 for 4 <= i < 8 and
    12 <= i < 16), col = 4 tid + (i & 3) (+16 for i >= 8); elements 4r..4r+3 share 32-bit register r."""
    return column_local(2, 2).spatial(8, 4).local(1, 4)


def mma_m16n8k32_b() -> RegisterLayout:
    """B of mma.sync m16n8k32 .s8/.u8/.e4m3/.e5m2, a 32x8 (k, n) tile: row = 4 tid + (i & 3) (+16 for i >= 4),
    col = groupID; elements 4r..4r+3 share 32-bit register r."""
    return local(2, 1).column_spatial(4, 8).local(4, 1)


_FRAGMENTS = {
    (16, 8, 8): (mma_m16n8k8_a, mma_m16n8k8_b),
    (16, 8, 16): (mma_m16n8k16_a, mma_m16n8k16_b),
    (16, 8, 32): (mma_m16n8k32_a, mma_m16n8k32_b),
}


def mma_fragments(m: int, n: int, k: int) -> tuple[RegisterLayout, RegisterLayout, RegisterLayout]:
    """The (A, B, C/D) fragment layouts of mma.sync m x n x k; LayoutError for a shape not in MMA_SHAPES."""
    try:
        a, b = _FRAGMENTS[(m, n, k)]
    except KeyError:
        shapes = ", ".join("m{}n{}k{}".format(*s) for s in MMA_SHAPES)
        raise LayoutError(f"no mma.sync fragment layouts for m{m}n{n}k{k}; supported: {shapes}") from None
    return a(), b(), mma_m16n8k16_c()


for _constructor in (mma_m16n8k8_a, mma_m16n8k8_b, mma_m16n8k32_a, mma_m16n8k32_b, mma_fragments, ldmatrix_layout):
    _constructor.__tessera_constexpr__ = True
