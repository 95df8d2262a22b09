"""AMD MFMA fragments: which lane of a 64-lane wave holds which element of A, B and C/D.

`v_mfma_f32_{32x32x8,16x16x16}_{f16,bf16}` (LLVM `llvm.amdgcn.mfma.f32.32x32x8f16`,
`...32x32x8bf16.1k`, `...16x16x16f16`, `...16x16x16bf16.1k`; gfx90a, gfx942,
gfx950) compute D = A @ B + C for an m x k A, a k x n B and an m x n f32 C,
spread over the 64 lanes of a wave. Every lane holds 4 A and 4 B elements
(two 32-bit VGPRs of packed halves: element i is the low half of VGPR
i // 2 for even i, the high half for odd i) and m*n/64 C/D elements (one VGPR each). For lane l and
element/VGPR index i (AMD Matrix Instruction Calculator, `--detail-instruction`
for these instructions on CDNA2/CDNA3, "Register to matrix element mapping
with no modifiers"; the same formulas appear in composable_kernel's
ck_tile warp-gemm attributes and in IREE's wave MMA index tables):

    16x16x16   A[l % 16][4 * (l // 16) + i]       i < 4
               B[4 * (l // 16) + i][l % 16]       i < 4
               D[4 * (l // 16) + i][l % 16]       i < 4
    32x32x8    A[l % 32][4 * (l // 32) + i]       i < 4
               B[4 * (l // 32) + i][l % 32]       i < 4
               D[8 * (i // 4) + 4 * (l // 32) + i % 4][l % 32]    i < 16

(the calculator spells the 32x32 row `(8 * floor(GPR_num / 4) % 32) +
4 * floor(lane / 32) + (GPR_num % 4)`). The bf16 `_1k` variants use the same
mappings as f16 (four bf16 per lane); the pre-`_1k` bf16 ones (two per lane)
are not modelled.

gfx950 (CDNA4, feature "mfma.wide") adds the double-K forms
`v_mfma_f32_32x32x16_{f16,bf16}` and `v_mfma_f32_16x16x32_{f16,bf16}`
(`llvm.amdgcn.mfma.f32.32x32x16.f16` / `.bf16`, `...16x16x32.f16` / `.bf16`,
operands <8 x half> / <8 x bfloat>, twice the flops of the narrow form per
instruction): every lane holds 8 consecutive k of A and of B (four VGPRs),
with the lane grouping of the narrow forms, and C/D exactly as before. This is
the rule the Matrix Instruction Calculator applies to every single-block MFMA
(k_per_lane = K / (64 / M) consecutive k per lane, lane group g = l // M
holding k = g * k_per_lane + i); the public calculator has no CDNA4 tables
yet, so the sources are composable_kernel's ck_tile
`WarpGemmAttributeMfmaImpl{F16F16,Bf16Bf16}F32M16N16K32` (gfx950: kAMLane 16,
kABKLane 4, kABKPerLane 8, in the convention where its 16x16x16 reads
kABKPerLane 4) and Triton's gfx950 operand layout (`kWidth = 8`):

    16x16x32   A[l % 16][8 * (l // 16) + i]       i < 8
               B[8 * (l // 16) + i][l % 16]       i < 8
               D as 16x16x16
    32x32x16   A[l % 32][8 * (l // 32) + i]       i < 8
               B[8 * (l // 32) + i][l % 32]       i < 8
               D as 32x32x8

gfx950 ("mfma.fp8") multiplies OCP fp8, e4m3 (AMD's "fp8") and e5m2
("bf8") in either mix: `v_mfma_f32_{32x32x16,16x16x32}_{fp8,bf8}_{fp8,bf8}`
(8 bytes a lane as an i64; the 16-bit double-K layouts above, as ck_tile's
`WarpGemmAttributeMfmaImpl_f32_32x32x16_f8_base`: kABKLane 2, kABKPerLane
8) and the double-rate `v_mfma_f32_{32x32x64,16x16x128}_f8f6f4` (32 bytes a
lane as <8 x i32>; LLVM 22 has only the scaled intrinsic for them and
selects the unscaled instruction for zero scales; the formats are its
cbsz / blgp immediates):

    16x16x128  A[l % 16][32 * (l // 16) + i]      B[32 * (l // 16) + i][l % 16]      i < 32
    32x32x64   A[l % 32][32 * (l // 32) + i]      B[32 * (l // 32) + i][l % 32]      i < 32

with D as the 16x16 / 32x32 forms above. Which k byte i of a lane stands
for cannot change D: every MFMA gives A and B mirrored fragments (lane
l % m holds row m of A and column n of B, and both assign k to (lane group,
element) alike), so it multiplies element i of A's group g by element i of
B's group g, and any one assignment of k used for both sums the same
products. Tessera's keeps a lane's bytes consecutive (16-byte LDS reads);
aiter's gfx950 kernels use [16 g, +16) and [64 + 16 g, +16), to the same
effect. gfx942 has the k16 / k32 fp8 instructions but reads the fnuz
formats in them (bias 8 / 16, 0x80 the only NaN, no infinities): an OCP
e4m3 byte there is half its value, -0 a NaN, e5m2's infinity 32768; so
gfx942 lacks "mfma.fp8" and its fp8 dots stay exact on FMA.

In the layout algebra these are products of `spatial` / `local` factors (lane
= the thread index within the wave), so they compose with the warp tiling of
`passes/mma.py` like the mma.sync fragments do.

`MFMA_SHAPES` lists the (m, n, k) of the f16 / bf16 forms (`MFMA_WIDE_SHAPES`
the gfx950-only ones among them), `MFMA_FP8_SHAPES` those that take fp8;
`mfma_fragments(m, n, k)` gives the (A, B, C) layouts of one of them and
`mfma_accepts` the input dtypes a shape takes.
"""

from __future__ import annotations

from . import dtypes as dt
from .layouts import LayoutError, RegisterLayout, column_spatial, local, spatial

WAVE = 64
MFMA_WIDE_SHAPES = ((32, 32, 16), (16, 16, 32))     # gfx950 ("mfma.wide") only
MFMA_SHAPES = ((32, 32, 8), (16, 16, 16)) + MFMA_WIDE_SHAPES        # the f16 / bf16 forms
MFMA_F8F6F4_SHAPES = ((32, 32, 64), (16, 16, 128))  # gfx950's double-rate fp8 forms: 32 bytes a lane
MFMA_INPUTS = (dt.f16, dt.bf16)
MFMA_FP8 = (dt.f8e4m3, dt.f8e5m2)                    # OCP formats: gfx950 ("mfma.fp8") only
MFMA_FP8_SHAPES = MFMA_F8F6F4_SHAPES + MFMA_WIDE_SHAPES


def mfma_accepts(shape: tuple[int, int, int], a: dt.DType, b: dt.DType) -> bool:
    """Whether the MFMA of `shape` multiplies an `a` A by a `b` B: f16 or bf16 (both the same) at every
    shape, e4m3 / e5m2 (either mix) at the fp8 shapes."""
    if a in MFMA_FP8 or b in MFMA_FP8:
        return a in MFMA_FP8 and b in MFMA_FP8 and shape in MFMA_FP8_SHAPES
    return a == b and a in MFMA_INPUTS and shape in MFMA_SHAPES


def is_mfma_shape(shape: tuple[int, int, int]) -> bool:
    """Whether some MFMA modelled here is m x n x k (`mfma_accepts` says for which dtypes)."""
    return shape in MFMA_SHAPES or shape in MFMA_F8F6F4_SHAPES


def mfma_16x16x16_a() -> RegisterLayout:
    """A of v_mfma_f32_16x16x16_{f16,bf16}, a 16x16 (m, k) tile: lane l, element i -> A[l % 16][4 (l // 16) + i]."""
    return column_spatial(16, 4).local(1, 4)


def mfma_16x16x16_b() -> RegisterLayout:
    """B of v_mfma_f32_16x16x16_{f16,bf16}, a 16x16 (k, n) tile: lane l, element i -> B[4 (l // 16) + i][l % 16]."""
    return spatial(4, 16).local(4, 1)


def mfma_16x16x16_c() -> RegisterLayout:
    """C/D of v_mfma_f32_16x16x16_{f16,bf16}, a 16x16 (m, n) f32 tile: lane l, VGPR i -> D[4 (l // 16) + i][l % 16]."""
    return spatial(4, 16).local(4, 1)


def mfma_32x32x8_a() -> RegisterLayout:
    """A of v_mfma_f32_32x32x8_{f16,bf16}, a 32x8 (m, k) tile: lane l, element i -> A[l % 32][4 (l // 32) + i]."""
    return column_spatial(32, 2).local(1, 4)


def mfma_32x32x8_b() -> RegisterLayout:
    """B of v_mfma_f32_32x32x8_{f16,bf16}, an 8x32 (k, n) tile: lane l, element i -> B[4 (l // 32) + i][l % 32]."""
    return spatial(2, 32).local(4, 1)


def mfma_32x32x8_c() -> RegisterLayout:
    """C/D of v_mfma_f32_32x32x8_{f16,bf16}, a 32x32 (m, n) f32 tile: lane l, VGPR i ->
    D[8 (i // 4) + 4 (l // 32) + i % 4][l % 32] (four blocks of 8 rows, each lane 4 rows of a block)."""
    return local(4, 1).spatial(2, 32).local(4, 1)


def mfma_16x16x32_a() -> RegisterLayout:
    """A of v_mfma_f32_16x16x32_{f16,bf16} (gfx950), a 16x32 (m, k) tile: lane l, element i ->
    A[l % 16][8 (l // 16) + i]."""
    return column_spatial(16, 4).local(1, 8)


def mfma_16x16x32_b() -> RegisterLayout:
    """B of v_mfma_f32_16x16x32_{f16,bf16} (gfx950), a 32x16 (k, n) tile: lane l, element i ->
    B[8 (l // 16) + i][l % 16]."""
    return spatial(4, 16).local(8, 1)


def mfma_32x32x16_a() -> RegisterLayout:
    """A of v_mfma_f32_32x32x16_{f16,bf16} (gfx950), a 32x16 (m, k) tile: lane l, element i ->
    A[l % 32][8 (l // 32) + i]."""
    return column_spatial(32, 2).local(1, 8)


def mfma_32x32x16_b() -> RegisterLayout:
    """B of v_mfma_f32_32x32x16_{f16,bf16} (gfx950), a 16x32 (k, n) tile: lane l, element i ->
    B[8 (l // 32) + i][l % 32]."""
    return spatial(2, 32).local(8, 1)


def mfma_16x16x128_a() -> RegisterLayout:
    """A of v_mfma_f32_16x16x128_f8f6f4 on fp8 (gfx950), a 16x128 (m, k) tile: lane l, byte i ->
    A[l % 16][32 (l // 16) + i]."""
    return column_spatial(16, 4).local(1, 32)


def mfma_16x16x128_b() -> RegisterLayout:
    """B of v_mfma_f32_16x16x128_f8f6f4 on fp8 (gfx950), a 128x16 (k, n) tile: lane l, byte i ->
    B[32 (l // 16) + i][l % 16]."""
    return spatial(4, 16).local(32, 1)


def mfma_32x32x64_a() -> RegisterLayout:
    """A of v_mfma_f32_32x32x64_f8f6f4 on fp8 (gfx950), a 32x64 (m, k) tile: lane l, byte i ->
    A[l % 32][32 (l // 32) + i]."""
    return column_spatial(32, 2).local(1, 32)


def mfma_32x32x64_b() -> RegisterLayout:
    """B of v_mfma_f32_32x32x64_f8f6f4 on fp8 (gfx950), a 64x32 (k, n) tile: lane l, byte i ->
    B[32 (l // 32) + i][l % 32]."""
    return spatial(2, 32).local(32, 1)


_FRAGMENTS = {
    (32, 32, 8): (mfma_32x32x8_a, mfma_32x32x8_b, mfma_32x32x8_c),
    (16, 16, 16): (mfma_16x16x16_a, mfma_16x16x16_b, mfma_16x16x16_c),
    (32, 32, 16): (mfma_32x32x16_a, mfma_32x32x16_b, mfma_32x32x8_c),      # D: the same as the narrow form's
    (16, 16, 32): (mfma_16x16x32_a, mfma_16x16x32_b, mfma_16x16x16_c),
    (32, 32, 64): (mfma_32x32x64_a, mfma_32x32x64_b, mfma_32x32x8_c),
    (16, 16, 128): (mfma_16x16x128_a, mfma_16x16x128_b, mfma_16x16x16_c),
}


def mfma_fragments(m: int, n: int, k: int) -> tuple[RegisterLayout, RegisterLayout, RegisterLayout]:
    """The (A, B, C/D) fragment layouts of the m x n x k MFMA; LayoutError for a shape not in MFMA_SHAPES."""
    try:
        return tuple(make() for make in _FRAGMENTS[(m, n, k)])
    except KeyError:
        shapes = ", ".join("x".join(map(str, s)) for s in MFMA_SHAPES + MFMA_F8F6F4_SHAPES)
        raise LayoutError(f"no MFMA fragment layouts for {m}x{n}x{k}; supported: {shapes}") from None


# Kernels may call the constructors on compile-time arguments, like those of `layouts`.
for _constructor in (mfma_16x16x16_a, mfma_16x16x16_b, mfma_16x16x16_c, mfma_32x32x8_a, mfma_32x32x8_b,
                     mfma_32x32x8_c, mfma_16x16x32_a, mfma_16x16x32_b, mfma_32x32x16_a, mfma_32x32x16_b,
                     mfma_16x16x128_a, mfma_16x16x128_b, mfma_32x32x64_a, mfma_32x32x64_b, mfma_fragments):
    _constructor.__tessera_constexpr__ = True
