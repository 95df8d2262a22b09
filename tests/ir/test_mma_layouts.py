"""mma.sync fragments for tf32 (m16n8k8) and 8-bit inputs (m16n8k32), and the `mma` op's type rule.

The tables below are written from the PTX ISA's "Matrix Fragments for
mma.m16n8k8" (.tf32) and "Matrix Fragments for mma.m16n8k32" (.s8/.u8,
.e4m3/.e5m2) formulas, independently of the layout algebra: for every lane
and every fragment element, the (row, col) it holds. The layouts in
`tessera.ir.mma_layouts` must reproduce them exactly.
"""

import pytest

from tessera.ir import dtypes as dt
from tessera.ir.errors import IRError
from tessera.ir.layouts import LayoutError, mma_m16n8k16_c
from tessera.ir.mma_layouts import mma_fragments, mma_m16n8k8_a, mma_m16n8k8_b, mma_m16n8k32_a, mma_m16n8k32_b
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module


def isa_table(count, row, col):
    """{(lane, i): (row, col)} from the ISA's formulas in groupID = lane >> 2, threadID_in_group = lane % 4."""
    return {(lane, i): (row(lane >> 2, lane % 4, i), col(lane >> 2, lane % 4, i))
            for lane in range(32) for i in range(count)}


TF32_A = isa_table(4, lambda g, t, i: g if i in (0, 2) else g + 8,       # a0, a2: groupID; a1, a3: +8
                   lambda g, t, i: t if i in (0, 1) else t + 4)         # a0, a1: threadID_in_group; a2, a3: +4
TF32_B = isa_table(2, lambda g, t, i: t if i == 0 else t + 4, lambda g, t, i: g)
I8_A = isa_table(16, lambda g, t, i: g if (0 <= i < 4 or 8 <= i < 12) else g + 8,
                 lambda g, t, i: t * 4 + (i & 3) if i < 8 else t * 4 + (i & 3) + 16)
I8_B = isa_table(8, lambda g, t, i: t * 4 + (i & 3) if i < 4 else t * 4 + (i & 3) + 16, lambda g, t, i: g)
ACC = isa_table(4, lambda g, t, i: g if i < 2 else g + 8, lambda g, t, i: t * 2 + (i & 1))


def layout_table(layout):
    table = layout.table()
    assert table.shape[0] == 32, "one warp"
    return {(lane, i): tuple(int(x) for x in table[lane, i]) for lane in range(32) for i in range(table.shape[1])}


@pytest.mark.parametrize("layout, shape, isa", [
    (mma_m16n8k8_a(), (16, 8), TF32_A), (mma_m16n8k8_b(), (8, 8), TF32_B),
    (mma_m16n8k32_a(), (16, 32), I8_A), (mma_m16n8k32_b(), (32, 8), I8_B),
    (mma_m16n8k16_c(), (16, 8), ACC),
], ids=["tf32-A", "tf32-B", "8bit-A", "8bit-B", "C"])
def test_every_lane_and_register_holds_the_element_the_isa_says(layout, shape, isa):
    assert layout.shape == shape and layout.num_threads == 32
    assert layout_table(layout) == isa


def test_mma_fragments_by_shape():
    assert mma_fragments(16, 8, 8) == (mma_m16n8k8_a(), mma_m16n8k8_b(), mma_m16n8k16_c())
    assert mma_fragments(16, 8, 32) == (mma_m16n8k32_a(), mma_m16n8k32_b(), mma_m16n8k16_c())
    with pytest.raises(LayoutError, match="no mma.sync fragment layouts for m16n8k4"):
        mma_fragments(16, 8, 4)


def mma_op(a, b, c, k):
    return f"""\
func @k() attributes {{num_threads = 32}} {{
  %a = constant {{value = 1}} : {a}
  %b = constant {{value = 1}} : {b}
  %c = constant {{value = 0}} : {c}
  %d = mma %a, %b, %c {{k = {k}, m = 16, n = 8}} : {c}
  return
}}
"""


@pytest.mark.parametrize("a, b, c, k", [
    ("regs<8xf16>", "regs<4xf16>", "regs<4xf32>", 16),
    ("regs<8xbf16>", "regs<4xbf16>", "regs<4xf32>", 16),
    ("regs<4xf32>", "regs<2xf32>", "regs<4xf32>", 8),
    ("regs<16xi8>", "regs<8xi8>", "regs<4xi32>", 32),
    ("regs<16xu8>", "regs<8xu8>", "regs<4xi32>", 32),
    ("regs<16xf8e4m3>", "regs<8xf8e4m3>", "regs<4xf32>", 32),
    ("regs<16xf8e4m3>", "regs<8xf8e5m2>", "regs<4xf32>", 32),
    ("regs<16xf8e5m2>", "regs<8xf8e5m2>", "regs<4xf32>", 32),
])
def test_the_mma_op_takes_every_instruction_and_round_trips(a, b, c, k):
    text = mma_op(a, b, c, k)
    module = parse_module(text)
    verify_module(module)
    assert print_module(module).strip() == text.strip()


@pytest.mark.parametrize("a, b, c, k, message", [
    ("regs<8xf16>", "regs<4xf16>", "regs<4xf32>", 32, r"takes regs<16>, regs<8>, regs<4>"),
    ("regs<4xf32>", "regs<2xf32>", "regs<4xf16>", 8, r"no instruction for f32 x f32 accumulating in f16"),
    ("regs<16xi8>", "regs<8xu8>", "regs<4xi32>", 32, r"no instruction for i8 x u8"),
    ("regs<16xi8>", "regs<8xi8>", "regs<4xf32>", 32, r"no instruction for i8 x i8 accumulating in f32"),
    ("regs<16xf8e4m3>", "regs<8xf8e4m3>", "regs<4xi32>", 32, r"accumulating in i32"),
    ("regs<8xf16>", "regs<4xf16>", "regs<4xf32>", 4, r"mma shape \(m, n, k\) = \(16, 8, 4\) is not one of"),
])
def test_the_mma_op_rejects_what_no_instruction_computes(a, b, c, k, message):
    with pytest.raises(IRError, match=message):
        verify_module(parse_module(mma_op(a, b, c, k)))
