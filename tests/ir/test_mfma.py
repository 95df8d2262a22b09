"""AMD MFMA in the IR: the fragment layouts, and the `mfma` thread op's type rule.

Specification:

* every (lane, register) of each fragment layout holds the element the AMD
  Matrix Instruction Calculator gives for v_mfma_f32_16x16x16f16 and
  v_mfma_f32_32x32x8f16 (bf16_1k: the same). The tables below are written
  from its "Register to matrix element mapping" text, not from the algebra;
* gfx950's double-K forms (v_mfma_f32_16x16x32_{f16,bf16},
  v_mfma_f32_32x32x16_{f16,bf16}) follow the calculator's rule for a
  single-block MFMA with 8 k per lane: lane l holds k = 8 * (l // m) + i of
  row (A) or column (B) l % m; C/D as the narrow form of the same m x n;
* the layouts are bijections of their tile onto 64 lanes, with m*k/64 A/B
  (4, or 8 for the double-K forms) and m*n/64 C registers per lane, and
  print and parse back;
* `mfma` takes regs<m*k/64 x f16|bf16> A and B of one dtype, regs<m*n/64 x
  f32> C, for (m, n, k) in {(32, 32, 8), (16, 16, 16), (32, 32, 16),
  (16, 16, 32)}, and gives C's type.
"""

from __future__ import annotations

import itertools

import pytest

from tessera.ir.errors import IRError
from tessera.ir.layouts import LayoutError, parse_layout
from tessera.ir.mfma_layouts import (MFMA_FP8_SHAPES, MFMA_SHAPES, MFMA_WIDE_SHAPES, mfma_16x16x16_a, mfma_16x16x16_b,
                                     mfma_16x16x16_c,
                                     mfma_16x16x32_a, mfma_16x16x32_b, mfma_32x32x8_a, mfma_32x32x8_b, mfma_32x32x8_c,
                                     mfma_32x32x16_a, mfma_32x32x16_b, mfma_fragments)
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module as verify


# From the calculator (CDNA3, --detail-instruction, "Register to matrix element mapping with no
# modifiers"). For A/B the "register" here is the element index 2 * GPR_num + GPR_bits // 16.
def calc_16x16x16(matrix, lane, reg):
    return {
        "A": (lane % 16, 4 * (lane // 16) + reg),                       # A i, A k
        "B": (4 * (lane // 16) + reg, lane % 16),                       # B k, B j
        "C": (4 * (lane // 16) + reg % 4, lane % 16),                   # C or D i, j
    }[matrix]


def calc_32x32x8(matrix, lane, reg):
    return {
        "A": (lane % 32, 4 * (lane // 32) + reg),
        "B": (4 * (lane // 32) + reg, lane % 32),
        "C": ((8 * (reg // 4)) % 32 + 4 * (lane // 32) + reg % 4, lane % 32),
    }[matrix]


# gfx950 (CDNA4) double-K forms, 8 halves per lane (composable_kernel ck_tile's M16N16K32 attributes: kAMLane 16,
# kABKLane 4, kABKPerLane 8): lane group l // m holds k = 8 (l // m) .. 8 (l // m) + 7.
def calc_16x16x32(matrix, lane, reg):
    return {
        "A": (lane % 16, 8 * (lane // 16) + reg),
        "B": (8 * (lane // 16) + reg, lane % 16),
        "C": calc_16x16x16("C", lane, reg),
    }[matrix]


def calc_32x32x16(matrix, lane, reg):
    return {
        "A": (lane % 32, 8 * (lane // 32) + reg),
        "B": (8 * (lane // 32) + reg, lane % 32),
        "C": calc_32x32x8("C", lane, reg),
    }[matrix]


LAYOUTS = {
    ("16x16x16", "A"): (mfma_16x16x16_a, calc_16x16x16, (16, 16), 4),
    ("16x16x16", "B"): (mfma_16x16x16_b, calc_16x16x16, (16, 16), 4),
    ("16x16x16", "C"): (mfma_16x16x16_c, calc_16x16x16, (16, 16), 4),
    ("32x32x8", "A"): (mfma_32x32x8_a, calc_32x32x8, (32, 8), 4),
    ("32x32x8", "B"): (mfma_32x32x8_b, calc_32x32x8, (8, 32), 4),
    ("32x32x8", "C"): (mfma_32x32x8_c, calc_32x32x8, (32, 32), 16),
    ("16x16x32", "A"): (mfma_16x16x32_a, calc_16x16x32, (16, 32), 8),
    ("16x16x32", "B"): (mfma_16x16x32_b, calc_16x16x32, (32, 16), 8),
    ("16x16x32", "C"): (lambda: mfma_fragments(16, 16, 32)[2], calc_16x16x32, (16, 16), 4),
    ("32x32x16", "A"): (mfma_32x32x16_a, calc_32x32x16, (32, 16), 8),
    ("32x32x16", "B"): (mfma_32x32x16_b, calc_32x32x16, (16, 32), 8),
    ("32x32x16", "C"): (lambda: mfma_fragments(32, 32, 16)[2], calc_32x32x16, (32, 32), 16),
}


@pytest.mark.parametrize("key", LAYOUTS, ids=lambda k: "-".join(k))
def test_every_lane_and_register_holds_the_element_amd_documents(key):
    make, calc, shape, registers = LAYOUTS[key]
    layout = make()
    assert (layout.shape, layout.num_threads, layout.local_size) == (shape, 64, registers)
    for lane, reg in itertools.product(range(64), range(registers)):
        assert layout.map(lane, reg) == calc(key[1], lane, reg), (lane, reg)
    assert layout.is_bijective
    assert parse_layout(str(layout)) == layout


def test_spot_checks_from_the_calculator_tables():
    # v_mfma_f32_32x32x8f16 D: v5{33} is D[13][1]; v15{63} is D[31][31]; v0{32} is D[4][0].
    c = mfma_32x32x8_c()
    assert (c.map(33, 5), c.map(63, 15), c.map(32, 0)) == ((13, 1), (31, 31), (4, 0))
    # A[3][6] of 32x32x8 is element 2 (v1.[15:0]) of lane 35; B[5][7] of 16x16x16 is element 1 of lane 23.
    assert mfma_32x32x8_a().inverse((3, 6)) == [(35, 2)]
    assert mfma_16x16x16_b().inverse((5, 7)) == [(23, 1)]
    # Double-K: A[3][14] of 32x32x16 is element 6 (v3.[15:0]) of lane 35; B[27][5] of 16x16x32 is element 3 of
    # lane 53 (lane group 3 holds k 24..31); a lane's 8 elements are 8 consecutive k (one 16-byte load).
    assert mfma_32x32x16_a().inverse((3, 14)) == [(35, 6)]
    assert mfma_16x16x32_b().inverse((27, 5)) == [(53, 3)]
    assert [mfma_16x16x32_a().map(17, i) for i in range(8)] == [(1, 8 + i) for i in range(8)]


def test_fragments_by_shape():
    assert mfma_fragments(32, 32, 8) == (mfma_32x32x8_a(), mfma_32x32x8_b(), mfma_32x32x8_c())
    assert mfma_fragments(16, 16, 16) == (mfma_16x16x16_a(), mfma_16x16x16_b(), mfma_16x16x16_c())
    for m, n, k in MFMA_SHAPES:
        a, b, c = mfma_fragments(m, n, k)
        assert (a.shape, b.shape, c.shape) == ((m, k), (k, n), (m, n))
    assert mfma_fragments(32, 32, 16)[2] == mfma_32x32x8_c() and mfma_fragments(16, 16, 32)[2] == mfma_16x16x16_c()
    # f8f6f4 on fp8: 32 consecutive k a lane (A[3][40] of 32x32x64: lane 35, byte 8), D as the k8 / k16 forms
    assert mfma_fragments(32, 32, 64)[0].inverse((3, 40)) == [(35, 8)]
    assert [mfma_fragments(16, 16, 128)[1].map(53, i) for i in (0, 31)] == [(96, 5), (127, 5)]
    assert mfma_fragments(32, 32, 64)[2] == mfma_32x32x8_c() and mfma_fragments(16, 16, 128)[2] == mfma_16x16x16_c()
    assert set(MFMA_WIDE_SHAPES) < set(MFMA_SHAPES)
    with pytest.raises(LayoutError, match=r"no MFMA fragment layouts for 32x32x32; supported: 32x32x8, 16x16x16, "
                                          r"32x32x16, 16x16x32, 32x32x64, 16x16x128"):
        mfma_fragments(32, 32, 32)


MFMA_IR = """\
func @k() attributes {{num_threads = 64}} {{
  %a = constant {{value = 1.0}} : {a}
  %b = constant {{value = 1.0}} : {b}
  %c = constant {{value = 0.0}} : {c}
  %d = mfma %a, %b, %c {{k = {k}, m = {m}, n = {n}}} : {c}
  return
}}
"""


def mfma_program(a="regs<4xf16>", b="regs<4xf16>", c="regs<16xf32>", m=32, n=32, k=8):
    return parse_module(MFMA_IR.format(a=a, b=b, c=c, m=m, n=n, k=k))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("m,n,k", MFMA_SHAPES)
def test_mfma_type_rule_accepts_the_supported_instructions(m, n, k, dtype):
    c, ab = f"regs<{m * n // 64}xf32>", m * k // 64
    verify(mfma_program(f"regs<{ab}x{dtype}>", f"regs<{ab}x{dtype}>", c, m, n, k))


@pytest.mark.parametrize("a,b", [("f8e4m3", "f8e4m3"), ("f8e5m2", "f8e5m2"), ("f8e4m3", "f8e5m2"),
                                 ("f8e5m2", "f8e4m3")])
@pytest.mark.parametrize("m,n,k", MFMA_FP8_SHAPES)
def test_mfma_type_rule_accepts_fp8_in_any_mix_at_the_fp8_shapes(m, n, k, a, b):
    """gfx950's v_mfma_f32_{32x32x16,16x16x32}_{fp8,bf8}_{fp8,bf8} (eight 8-bit values a lane) and
    v_mfma_f32_{32x32x64,16x16x128}_f8f6f4 (32 a lane), either format."""
    per_lane = m * k // 64
    verify(mfma_program(f"regs<{per_lane}x{a}>", f"regs<{per_lane}x{b}>", f"regs<{m * n // 64}xf32>", m, n, k))


@pytest.mark.parametrize("program,message", [
    (dict(m=32, n=32, k=32), r"mfma shape \(m, n, k\) = \(32, 32, 32\) is not one of"),
    (dict(k=16), r"mfma 32x32x16 takes regs<8>, regs<8>, regs<16>"),
    (dict(c="regs<4xf32>"), r"mfma 32x32x8 takes regs<4>, regs<4>, regs<16>"),
    (dict(a="regs<8xf16>"), r"mfma 32x32x8 takes regs<4>, regs<4>, regs<16>"),
    (dict(a="regs<4xf32>", b="regs<4xf32>"), r"mfma 32x32x8 has no instruction for f32 x f32 \(it multiplies f16 "
                                              r"or bf16 fragments of one dtype, and e4m3/e5m2 in any mix at 32x32x64"),
    (dict(a="regs<4xbf16>"), r"mfma 32x32x8 has no instruction for bf16 x f16"),
    (dict(a="regs<4xf8e4m3>", b="regs<4xf8e4m3>"), r"mfma 32x32x8 has no instruction for f8e4m3 x f8e4m3"),
    (dict(a="regs<8xf8e4m3>", b="regs<8xf16>", k=16), r"mfma 32x32x16 has no instruction for f8e4m3 x f16"),
    (dict(a="regs<32xbf16>", b="regs<32xbf16>", k=64), r"mfma 32x32x64 has no instruction for bf16 x bf16"),
    (dict(c="regs<16xf16>"), r"mfma accumulates in f32"),
], ids=["shape", "wide-a-count", "c-count", "a-count", "f32-inputs", "mixed", "fp8-narrow-k", "fp8-x-f16",
        "f8f6f4-bf16", "f16-acc"])
def test_mfma_type_rule_rejects(program, message):
    with pytest.raises(IRError, match=message):
        verify(mfma_program(**program))
