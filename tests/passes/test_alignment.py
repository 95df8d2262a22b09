"""The alignment analysis: divisibility, contiguity and constancy per tile dimension.

Specifications in three forms: IR text with the facts each value must get,
real traced tutorial kernels with the vector widths their accesses allow,
and a property: on random index arithmetic, every fact claimed holds of the
values the tile interpreter actually computes, for several program ids.
"""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.backends.interp import Pointers, ProgramInstance, bind_arguments
from tessera.ir.builder import Builder
from tessera.ir.core import Function, Module, Value
from tessera.ir.parser import parse_module
from tessera.ir.dtypes import dtype_from_name
from tessera.ir.types import PointerType, ScalarType, TileType, element_of
from tessera.ir.verifier import verify_module
from tessera.passes.alignment import (
    MAX_DIVISIBILITY, AxisInfo, ViewInfo, access_width, analyze, mask_constancy, vector_width,
)

ROOT = Path(__file__).resolve().parents[2]


def named_facts(fn: Function) -> dict[str, AxisInfo | ViewInfo]:
    """The analysis' facts keyed by each value's name hint (block arguments included)."""
    facts = analyze(fn)
    named = {}
    values = list(fn.args)
    for op in fn.walk():
        values += op.results
        for region in op.regions:
            values += region.args
    for v in values:
        if v.name_hint and v in facts:
            named[v.name_hint] = facts[v]
    return named


def facts_of(text: str) -> dict[str, AxisInfo | ViewInfo]:
    module = parse_module(text)
    verify_module(module)
    return named_facts(module.functions[0])


def cdk(info: AxisInfo) -> tuple[tuple, tuple, tuple]:
    """(contiguity, divisibility, constancy): the three per-dimension facts."""
    return info.contiguity, info.divisibility, info.constancy


# ---------------------------------------------------------------------------
# Sources and propagation, on IR text

OFFSETS = """\
func @k(%x: ptr<f32>, %y: ptr<f16>, %n: i32, %odd: i32) attributes {divisible_by_16 = [0, 2]} {
  %pid = program_id {axis = 0} : i32
  %block = constant {value = 128} : i32
  %start = mul %pid, %block : i32
  %lanes = arange {end = 128, start = 0} : tile<128xi32>
  %starts = splat %start : tile<128xi32>
  %offs = add %starts, %lanes : tile<128xi32>
  %bound = splat %n : tile<128xi32>
  %mask = cmp %offs, %bound {pred = "lt"} : tile<128xbool>
  %mask_le = cmp %offs, %bound {pred = "le"} : tile<128xbool>
  %rbound = splat %odd : tile<128xi32>
  %mask_odd = cmp %offs, %rbound {pred = "lt"} : tile<128xbool>
  %xs = splat %x : tile<128xptr<f32>>
  %xp = addptr %xs, %offs : tile<128xptr<f32>>
  %ys = splat %y : tile<128xptr<f16>>
  %yp = addptr %ys, %offs : tile<128xptr<f16>>
  %v = load %xp, %mask : tile<128xf32>
  return
}
"""


def test_constants_program_ids_and_arange():
    f = facts_of(OFFSETS)
    assert f["block"].constant == 128 and f["block"].element_divisibility == 128
    assert f["pid"].element_divisibility == 1 and f["pid"].nonnegative
    assert f["start"].element_divisibility == 128                   # pid * 128
    assert cdk(f["lanes"]) == ((128,), (MAX_DIVISIBILITY,), (1,))  # arange from 0
    assert cdk(f["starts"]) == ((1,), (128,), (128,))              # a splat is constant along the dim


def test_program_offsets_are_contiguous_runs_of_block_size():
    f = facts_of(OFFSETS)
    assert cdk(f["offs"]) == ((128,), (128,), (1,))


def test_argument_divisibility_comes_from_the_specialization_only():
    f = facts_of(OFFSETS)
    assert f["x"].element_divisibility == 16 and f["n"].element_divisibility == 16
    assert f["y"].element_divisibility == 1 and f["odd"].element_divisibility == 1


def test_addptr_measures_pointer_divisibility_in_bytes():
    f = facts_of(OFFSETS)
    assert cdk(f["xp"]) == ((128,), (16,), (1,))     # gcd(16 bytes, 128 * 4 bytes)
    assert vector_width(f["xp"], 32) == 4 and vector_width(f["xp"], 32, max_bits=64) == 2
    assert cdk(f["yp"]) == ((128,), (1,), (1,))      # y's base alignment is unknown
    assert vector_width(f["yp"], 16) == 1


PACKED = """\
func @k(%w: ptr<u4>, %v: ptr<u3>, %one: i32) attributes {divisible_by_16 = [0, 1]} {
  %pid = program_id {axis = 0} : i32
  %block = constant {value = 128} : i32
  %start = mul %pid, %block : i32
  %lanes = arange {end = 128, start = 0} : tile<128xi32>
  %starts = splat %start : tile<128xi32>
  %offs = add %starts, %lanes : tile<128xi32>
  %ws = splat %w : tile<128xptr<u4>>
  %wp = addptr %ws, %offs : tile<128xptr<u4>>
  %vs = splat %v : tile<128xptr<u3>>
  %vp = addptr %vs, %offs : tile<128xptr<u3>>
  %shifts = splat %one : tile<128xi32>
  %shifted = add %offs, %shifts : tile<128xi32>
  %wq = addptr %ws, %shifted : tile<128xptr<u4>>
  return
}
"""


def test_sub_byte_pointers_align_in_elements_of_their_width():
    f = facts_of(PACKED)
    assert vector_width(f["wp"], 4) == 32            # 128 bits of u4: 16 bytes, aligned
    assert vector_width(f["vp"], 3) == 32            # 3-bit groups of 32 (12 bytes) start on 4 bytes
    assert vector_width(f["wq"], 4) == 1             # one byte of divisibility says nothing about the nibble


def test_a_mask_against_a_divisible_bound_is_constant_in_aligned_groups():
    f = facts_of(OFFSETS)
    assert mask_constancy(f["mask"]) == 16           # offs < n flips only at a multiple of 16
    assert mask_constancy(f["mask_odd"]) == 1        # n of unknown divisibility: any lane may flip
    assert mask_constancy(f["mask_le"]) == 1         # offs <= n flips at n + 1


def test_access_width_is_limited_by_alignment_contiguity_and_mask():
    module = parse_module(OFFSETS)
    fn = module.functions[0]
    facts = analyze(fn)
    (load,) = [op for op in fn.walk() if op.name == "load"]
    assert access_width(facts, load) == 4            # f32: 16 bytes aligned, mask constant in 16s


def test_regrouping_a_run_lowers_its_divisibility():
    # [0, 1, 2, 3, 4, ...] + [0, 0, 0, 0, 128, 128, 128, 128]: runs of 4 starting at 0 and 132,
    # so divisibility 4 (gcd of the operands' 2**12 and 128 would wrongly claim 128).
    f = facts_of("""\
func @k() {
  %lanes = arange {end = 8, start = 0} : tile<8xi32>
  %two = constant {value = 2} : tile<8xi32>
  %seven = constant {value = 7} : tile<8xi32>
  %quads = shr %lanes, %two : tile<8xi32>
  %steps = shl %quads, %seven : tile<8xi32>
  %sum = add %lanes, %steps : tile<8xi32>
  return
}
""")
    assert cdk(f["quads"]) == ((1,), (1,), (4,))
    assert cdk(f["steps"]) == ((1,), (128,), (4,))
    assert cdk(f["sum"]) == ((4,), (4,), (1,))


DIVISION = """\
func @k() {
  %nat = arange {end = 128, start = 0} : tile<128xi32>
  %int = arange {end = 64, start = -64} : tile<128xi32>
  %four = constant {value = 4} : tile<128xi32>
  %thirty_two = constant {value = 32} : tile<128xi32>
  %two = constant {value = 2} : tile<128xi32>
  %low = constant {value = 31} : tile<128xi32>
  %high = constant {value = -8} : tile<128xi32>
  %nat_div = div %nat, %four : tile<128xi32>
  %int_div = div %int, %four : tile<128xi32>
  %int_shr = shr %int, %two : tile<128xi32>
  %nat_rem = rem %nat, %thirty_two : tile<128xi32>
  %int_rem = rem %int, %thirty_two : tile<128xi32>
  %int_and = and %int, %low : tile<128xi32>
  %int_floor = and %int, %high : tile<128xi32>
  %scaled = mul %nat, %four : tile<128xi32>
  %exact = div %scaled, %two : tile<128xi32>
  return
}
"""


def test_division_and_remainder_respect_truncation_toward_zero():
    f = facts_of(DIVISION)
    assert f["nat_div"].constancy == (4,)            # [0..3] / 4, [4..7] / 4, ...
    assert f["int_div"].constancy == (1,)            # -4 / 4 == -1 but -3 / 4 == 0
    assert f["int_shr"].constancy == (4,)            # >> rounds down, negative or not
    assert cdk(f["nat_rem"]) == ((32,), (32,), (1,))
    assert f["int_rem"].contiguity == (1,)           # -33 % 32 == -1, -32 % 32 == 0
    assert cdk(f["int_and"]) == ((32,), (32,), (1,))  # & 31 is a floor modulo
    assert cdk(f["int_floor"]) == ((1,), (8,), (8,))
    assert cdk(f["scaled"]) == ((1,), (4,), (1,)) and cdk(f["exact"]) == ((1,), (2,), (1,))


def test_two_dimensional_offsets_keep_facts_per_dimension():
    f = facts_of("""\
func @k(%p: ptr<f16>, %stride: i32) attributes {divisible_by_16 = [0, 1]} {
  %rows = arange {end = 16, start = 0} : tile<16xi32>
  %cols = arange {end = 64, start = 0} : tile<64xi32>
  %r1 = expand_dims %rows {axis = 1} : tile<16x1xi32>
  %s = splat %stride : tile<16x1xi32>
  %r2 = mul %r1, %s : tile<16x1xi32>
  %r3 = broadcast %r2 : tile<16x64xi32>
  %c1 = expand_dims %cols {axis = 0} : tile<1x64xi32>
  %c2 = broadcast %c1 : tile<16x64xi32>
  %offs = add %r3, %c2 : tile<16x64xi32>
  %ps = splat %p : tile<16x64xptr<f16>>
  %ptrs = addptr %ps, %offs : tile<16x64xptr<f16>>
  %t = permute %ptrs {order = [1, 0]} : tile<64x16xptr<f16>>
  return
}
""")
    assert cdk(f["r3"]) == ((1, 1), (16, 16), (1, 64))
    assert cdk(f["c2"]) == ((1, 64), (1, MAX_DIVISIBILITY), (16, 1))
    assert cdk(f["offs"]) == ((1, 64), (1, 16), (1, 1))
    assert cdk(f["ptrs"]) == ((1, 64), (2, 16), (1, 1))
    assert vector_width(f["ptrs"], 16) == 8 and vector_width(f["ptrs"], 16, dim=0) == 1
    assert cdk(f["t"]) == ((64, 1), (16, 2), (1, 1))


def test_select_keeps_runs_where_the_condition_is_constant():
    f = facts_of("""\
func @k(%n: i32) attributes {divisible_by_16 = [0]} {
  %lanes = arange {end = 64, start = 0} : tile<64xi32>
  %later = arange {end = 128, start = 64} : tile<64xi32>
  %bound = splat %n : tile<64xi32>
  %in = cmp %lanes, %bound {pred = "lt"} : tile<64xbool>
  %zero = constant {value = 0} : tile<64xi32>
  %pick = select %in, %lanes, %later : tile<64xi32>
  %safe = select %in, %lanes, %zero : tile<64xi32>
  return
}
""")
    assert cdk(f["pick"]) == ((16,), (16,), (1,))       # both runs, switched in aligned 16s
    assert cdk(f["safe"]) == ((1,), (1,), (1,))         # zero is constant, not a run


# ---------------------------------------------------------------------------
# Control flow: facts at merges are what every path guarantees

def test_loop_carried_values_reach_a_fixpoint():
    f = facts_of("""\
func @k(%x: ptr<f32>) attributes {divisible_by_16 = [0]} {
  %lanes = arange {end = 128, start = 0} : tile<128xi32>
  %xs = splat %x : tile<128xptr<f32>>
  %p0 = addptr %xs, %lanes : tile<128xptr<f32>>
  %lb = constant {value = 0} : i32
  %ub = constant {value = 10} : i32
  %step = constant {value = 1} : i32
  %c32 = constant {value = 32} : tile<128xi32>
  %c2 = constant {value = 2} : tile<128xi32>
  %c4 = constant {value = 4} : i32
  %o, %p = for %lb, %ub, %step, %lanes, %p0 : tile<128xi32>, tile<128xptr<f32>> {
  ^(%i: i32, %off: tile<128xi32>, %ptr: tile<128xptr<f32>>):
    %next = add %off, %c32 : tile<128xi32>
    %ahead = addptr %ptr, %c2 : tile<128xptr<f32>>
    %i4 = mul %i, %c4 : i32
    yield %next, %ahead
  }
  return
}
""")
    assert cdk(f["off"]) == ((128,), (32,), (1,))      # 0, 32, 64, ...: the join of every iteration
    assert cdk(f["o"]) == ((128,), (32,), (1,))
    assert cdk(f["ptr"]) == ((128,), (8,), (1,))       # 16-byte base, 8 bytes per iteration
    assert f["i"].element_divisibility == 1 and f["i"].nonnegative
    assert f["i4"].element_divisibility == 4


def test_if_joins_both_branches_and_while_iterates():
    f = facts_of("""\
func @k(%c: bool, %n: i32) attributes {divisible_by_16 = [1]} {
  %c64 = constant {value = 64} : i32
  %c8 = constant {value = 8} : i32
  %r = if %c : i32 {
    yield %c64
  } {
    yield %c8
  }
  %w = while %n : i32 {
  ^(%k: i32):
    %go = cmp %k, %c64 {pred = "lt"} : bool
    condition %go, %k
  } {
  ^(%k_1: i32):
    %next = add %k_1, %c8 : i32
    yield %next
  }
  return
}
""")
    assert f["r"].element_divisibility == 8 and f["r"].constant is None
    assert f["k"].element_divisibility == 8 and f["w"].element_divisibility == 8


# ---------------------------------------------------------------------------
# Real traced kernels

def _tutorial(name: str):
    return runpy.run_path(str(ROOT / "tutorials" / name), run_name="tutorial")


@pytest.fixture(scope="module")
def vector_add():
    return _tutorial("01-vector-add.py")["add"]


def _loads(fn: Function):
    return [op for op in fn.walk() if op.name == "load"]


@pytest.mark.parametrize("dtype, width", [(np.float32, 4), (np.float16, 8)])
def test_vector_add_with_aligned_arrays_vectorizes(vector_add, dtype, width):
    x = np.zeros(4096, dtype)
    fn = vector_add.specialize(x, x, x, 4096, BLOCK=1024).function
    facts = analyze(fn)
    load = _loads(fn)[0]
    ptrs, mask = facts[load.operands[0]], facts[load.operands[1]]
    assert cdk(ptrs) == ((1024,), (16,), (1,))
    assert vector_width(ptrs, np.dtype(dtype).itemsize * 8) == width
    assert mask_constancy(mask) == 16
    assert access_width(facts, load) == width


def test_vector_add_with_a_misaligned_pointer_does_not(vector_add):
    x = np.zeros(4097, np.float32)
    fn = vector_add.specialize(x[1:], x[:4096], x[:4096], 4096, BLOCK=1024).function
    facts = analyze(fn)
    first, second = _loads(fn)
    assert facts[first.operands[0]].divisibility == (1,)
    assert access_width(facts, first) == 1 and access_width(facts, second) == 4


def test_vector_add_with_n_not_divisible_by_16_masks_lane_by_lane(vector_add):
    x = np.zeros(4095, np.float32)
    fn = vector_add.specialize(x, x, x, 4095, BLOCK=1024).function
    facts = analyze(fn)
    load = _loads(fn)[0]
    assert vector_width(facts[load.operands[0]], 32) == 4     # the addresses would allow 4
    assert mask_constancy(facts[load.operands[1]]) == 1
    assert access_width(facts, load) == 1


def test_matmul_views_record_strides_and_block_loads_vectorize():
    matmul = _tutorial("03-matmul.py")["matmul"]
    a = np.zeros((64, 64), np.float16)
    fn = matmul.specialize(a, a, a, 64, 64, 64, BM=32, BN=32, BK=16).function
    facts = named_facts(fn)
    assert facts["a"] == ViewInfo(16, (16, 16), (16, 1), (False, True))
    full = analyze(fn)
    widths = [access_width(full, op) for op in fn.walk() if op.name in ("view_load", "view_store")]
    assert widths == [8, 8, 8]


def test_softmax_rows_of_odd_length_are_not_aligned():
    softmax = _tutorial("02-fused-softmax.py")["softmax"]
    widths = {}
    for cols in (64, 781):
        x = np.zeros((4, cols), np.float32)
        fn = softmax.specialize(x, x, 4, cols, BLOCK=1024).function
        facts = analyze(fn)
        widths[cols] = [access_width(facts, op) for op in fn.walk() if op.name in ("view_load", "view_store")]
    assert widths == {64: [4, 4], 781: [1, 1]}


def test_every_random_program_gets_facts_of_the_right_rank():
    """Robustness: the IR tests' random programs (every dtype, casts, regions) analyze without error."""
    spec = importlib.util.spec_from_file_location("program_strategies", ROOT / "tests/ir/program_strategies.py")
    strategies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strategies)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(strategies.programs())
    def check(module):
        for fn in module.functions:
            for value, info in analyze(fn).items():
                if isinstance(info, AxisInfo):
                    assert info.rank == len(getattr(value.type, "shape", ()))
    check()


# ---------------------------------------------------------------------------
# Soundness: claimed facts hold of the values the interpreter computes

SHAPES = ((16,), (4, 8))
STARTS = (0, 0, 16, -16, 32, -32, 8, -8, 4, -4, 3, -5, 64, -64, 12)
CONSTANTS = (0, 1, -1, 2, 4, 8, 16, 32, 64, -4, -16, -64, 3, 5, -7, 12, 48)
PROGRAM_IDS = (0, 1, 3, 6)
POINTERS = {"p32": 4, "p16": 2}          # argument name -> element bytes


class _Recorder(ProgramInstance):
    """A program instance that keeps every value every region run defined (each loop iteration too)."""

    def __init__(self, *args, seen: list):
        super().__init__(*args)
        self.seen = seen

    def run_region(self, block, args):
        try:
            return super().run_region(block, args)
        finally:
            for value in list(block.args) + [r for op in block.ops for r in op.results]:
                if value in self.env:
                    self.seen.append((value, self.env[value]))


def _tile(shape, element="i32") -> str:
    return "tile<" + "".join(f"{d}x" for d in shape) + element + ">"


class _Program:
    """Draws random index arithmetic as IR text, keeping |values| well inside i32."""

    LIMIT = 1 << 28

    def __init__(self, draw):
        self.draw = draw
        self.lines: list[str] = []
        self.count = 0
        self.indent = "  "
        self.scalars = [("%pid", 8), ("%n", 128), ("%m", 128)]

    def emit(self, text: str, type_: str) -> str:
        name = f"%v{self.count}"
        self.count += 1
        self.lines.append(f"{self.indent}{name} = {text} : {type_}")
        return name

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def splat(self, shape, scalar: str) -> str:
        return self.emit(f"splat {scalar}", _tile(shape))

    def constant(self, shape, value: int) -> str:
        return self.emit(f"constant {{value = {value}}}", _tile(shape) if shape else "i32")

    def leaf(self, shape) -> tuple[str, int]:
        kind = self.pick(["arange", "scalar", "constant", "lift"] if len(shape) == 2 else
                         ["arange", "arange", "scalar", "constant"])
        if kind == "arange" and len(shape) == 1:
            start = self.pick(STARTS)
            name = self.emit(f"arange {{end = {start + shape[0]}, start = {start}}}", _tile(shape))
            return name, abs(start) + shape[0]
        if kind == "scalar":
            name, bound = self.pick(self.scalars)
            return self.splat(shape, name), bound
        if kind in ("constant", "arange"):
            value = self.pick(CONSTANTS)
            return self.splat(shape, self.constant((), value)), abs(value)
        axis = self.pick([0, 1])                      # a 1-D value repeated along the other dim
        inner, bound = self.expr((shape[1 - axis],), 1)
        expanded = self.emit(f"expand_dims {inner} {{axis = {axis}}}",
                             _tile((1, shape[1]) if axis == 0 else (shape[0], 1)))
        return self.emit(f"broadcast {expanded}", _tile(shape)), bound

    def small(self, shape, values) -> str:
        return self.splat(shape, self.emit(f"constant {{value = {self.pick(values)}}}", "i32"))

    def expr(self, shape, depth: int) -> tuple[str, int]:
        if depth == 0 or self.draw(st.integers(0, 3)) == 0:
            return self.leaf(shape)
        return self.node(shape, depth)

    def operand(self, shape, depth: int) -> tuple[str, int]:
        """An operand of a `depth` node: often a leaf, so that runs, splats and bounds meet directly."""
        return self.leaf(shape) if self.draw(st.booleans()) else self.expr(shape, depth - 1)

    def node(self, shape, depth: int) -> tuple[str, int]:
        kind = self.pick(["add", "sub", "mul", "div", "rem", "shl", "shr", "and", "mask", "or", "xor",
                          "min", "max", "select"] + ["permute"] * (len(shape) == 2))
        t = _tile(shape)
        if kind == "permute":
            inner, bound = self.expr(shape[::-1], depth - 1)
            return self.emit(f"permute {inner} {{order = [1, 0]}}", t), bound
        x, bx = self.operand(shape, depth)
        if kind in ("div", "rem"):
            divisor = self.pick(["constant", "scalar", "expr"])
            if divisor == "constant":
                y = self.small(shape, [-8, -4, -3, -1, 1, 2, 3, 4, 8, 16, 32])
            elif divisor == "scalar":
                y = self.splat(shape, self.pick(["%n", "%m"]))
            else:      # a positive tile: 1 + |e|
                e, _ = self.expr(shape, depth - 1)
                absolute = self.emit(f"abs {e}", t)
                y = self.emit(f"add {absolute}, {self.small(shape, [1])}", t)
            return self.emit(f"{kind} {x}, {y}", t), bx
        if kind in ("shl", "shr"):
            y = self.small(shape, [0, 1, 2, 3, 4, 40])
            return self.emit(f"{kind} {x}, {y}", t), bx * 16 if kind == "shl" else bx
        if kind == "mask":
            y = self.small(shape, [1, 3, 15, 31, -2, -8, -16, -1, 5])
            return self.emit(f"and {x}, {y}", t), bx + 32
        if kind == "select":           # often a mask: a run against a bound
            a, ba = self.operand(shape, depth)
            b, bb = self.operand(shape, depth)
            pred = self.pick(["lt", "le", "gt", "ge", "eq", "ne"])
            cond = self.emit(f"cmp {a}, {b} {{pred = \"{pred}\"}}", _tile(shape, "bool"))
            y, by = self.operand(shape, depth)
            return self.emit(f"select {cond}, {x}, {y}", t), max(bx, by)
        if kind == "mul":
            y, by = self.leaf(shape)
        else:
            y, by = self.operand(shape, depth)
        bound = {"mul": bx * by, "add": bx + by, "sub": bx + by}.get(kind, 2 * max(bx, by) + 2)
        if bound > self.LIMIT:
            return x, bx
        op = "and" if kind == "mask" else kind
        return self.emit(f"{op} {x}, {y}", t), bound

    def pointer(self, shape, offsets: str) -> str:
        base = self.pick(sorted(POINTERS))
        element = "f32" if base == "p32" else "f16"
        splat = self.emit(f"splat %{base}", _tile(shape, f"ptr<{element}>"))
        return self.emit(f"addptr {splat}, {offsets}", _tile(shape, f"ptr<{element}>")), element

    def kernel(self, shape) -> str:
        for _ in range(self.draw(st.integers(1, 4))):      # independent expressions: more facts per run
            offsets, _ = self.expr(shape, 3)
        pointer, element = self.pointer(shape, offsets)
        structure = self.pick(["plain", "for", "if"])
        if structure == "for":
            trips = self.draw(st.integers(1, 3))
            lb, ub, step = (self.constant((), v) for v in (0, trips, 1))
            ptr_t, int_t = _tile(shape, f"ptr<{element}>"), _tile(shape)
            self.lines.append(f"  %acc_out, %ptr_out = for {lb}, {ub}, {step}, {offsets}, {pointer} : "
                              f"{int_t}, {ptr_t} {{")
            self.lines.append(f"  ^(%i: i32, %acc: {int_t}, %ptr: {ptr_t}):")
            self.indent = "    "
            self.scalars.append(("%i", 3))
            delta, _ = self.expr(shape, 2)
            op = self.pick(["add", "sub"])
            nxt = self.emit(f"{op} %acc, {delta}", int_t)
            step_ptr = self.emit(f"addptr %ptr, {self.expr(shape, 2)[0]}", ptr_t)
            self.lines.append(f"    yield {nxt}, {step_ptr}")
            self.lines.append("  }")
            self.indent = "  "
        elif structure == "if":
            bound = self.emit(f"constant {{value = {self.draw(st.integers(0, 5))}}}", "i32")
            cond = self.emit(f"cmp %pid, {bound} {{pred = \"lt\"}}", "bool")
            self.lines.append(f"  %chosen = if {cond} : {_tile(shape)} {{")
            self.indent = "    "
            then, _ = self.expr(shape, 2)
            self.lines.append(f"    yield {then}")
            self.lines.append("  } {")
            other, _ = self.expr(shape, 2)
            self.lines.append(f"    yield {other}")
            self.lines.append("  }")
            self.indent = "  "
        return "\n".join(self.lines)


@st.composite
def index_kernels(draw):
    """IR text of a kernel computing random index arithmetic, and its (n, m, aligned-pointer) arguments."""
    n, m = (draw(st.sampled_from([1, 3, 16, 32, 48, 64, 100, 7, 128])) for _ in range(2))
    aligned = draw(st.sets(st.sampled_from(sorted(POINTERS))))
    program = _Program(draw)
    body = program.kernel(draw(st.sampled_from(SHAPES)))
    divisible = sorted({0 if "p32" in aligned else None, 1 if "p16" in aligned else None,
                        2 if n % 16 == 0 else None, 3 if m % 16 == 0 else None} - {None})
    text = (f"func @k(%p32: ptr<f32>, %p16: ptr<f16>, %n: i32, %m: i32) "
            f"attributes {{divisible_by_16 = [{', '.join(map(str, divisible))}]}} {{\n"
            f"  %pid = program_id {{axis = 0}} : i32\n{body}\n  return\n}}\n")
    return text, n, m, aligned


def _lane_values(value: Value, runtime, aligned: set[str]) -> np.ndarray:
    """A runtime value as int64 lanes; pointers as byte addresses (16-aligned bases, or 16-aligned plus
    one element for the misaligned ones)."""
    if isinstance(runtime, Pointers):
        elem = element_of(value.type)
        assert isinstance(elem, PointerType)
        name = runtime.memory.name
        size = POINTERS[name]
        base = 1 << 16 if name in aligned else (1 << 16) + size
        return base + runtime.offsets.astype(np.int64) * size
    return np.asarray(runtime).astype(np.int64)


def check_facts(info: AxisInfo, runs: np.ndarray, step: int, what: str) -> None:
    """Every fact of `info` holds of each of `runs` (the value's lanes in several runs, stacked on axis 0;
    `step`: what one contiguity step adds)."""
    assert runs.ndim == info.rank + 1, what
    assert (runs % info.element_divisibility == 0).all(), f"{what}: element divisibility {info}\n{runs}"
    if info.constant is not None:
        assert (runs == info.constant).all(), f"{what}: constant {info}\n{runs}"
    if info.nonnegative:
        assert (runs >= 0).all(), f"{what}: nonnegative {info}\n{runs}"
    for d in range(info.rank):
        axis = d + 1
        index = np.arange(runs.shape[axis])
        c, k = info.contiguity[d], info.constancy[d]
        starts = np.take(runs, np.nonzero(index % c == 0)[0], axis=axis)
        assert (starts % info.divisibility[d] == 0).all(), f"{what}: divisibility along {d}: {info}\n{runs}"
        if c == 1 and k == 1:
            continue
        steps = np.diff(runs, axis=axis)
        inside_run = np.nonzero(index[1:] % c != 0)[0]
        assert (np.take(steps, inside_run, axis=axis) == step).all(), f"{what}: contiguity along {d}: {info}\n{runs}"
        inside_constant = np.nonzero(index[1:] % k != 0)[0]
        assert (np.take(steps, inside_constant, axis=axis) == 0).all(), \
            f"{what}: constancy along {d}: {info}\n{runs}"


def assert_facts_hold(fn: Function, n: int, m: int, aligned: set[str], text: str = "") -> None:
    """Run the kernel for several program ids; every fact analyze() claims holds of every value seen."""
    verify_module(Module([fn]))
    facts = analyze(fn)
    args = [np.zeros(1, np.float32), np.zeros(1, np.float16), n, m]
    grid = (max(PROGRAM_IDS) + 1, 1, 1)
    seen: list = []
    for pid in PROGRAM_IDS:
        _Recorder(fn, (pid, 0, 0), grid, {}, seen=seen).run(bind_arguments(fn, args))
    observed: dict[Value, list[np.ndarray]] = {}
    for value, runtime in seen:
        if isinstance(facts.get(value), AxisInfo):
            observed.setdefault(value, []).append(_lane_values(value, runtime, aligned))
    for value, lanes in observed.items():
        elem = element_of(value.type)
        step = elem.pointee.bits // 8 if isinstance(elem, PointerType) else 1
        check_facts(facts[value], np.stack(lanes), step, f"{value.name_hint}\n{text}")


def _signature(aligned: set[str], n: int, m: int) -> str:
    divisible = [i for i, ok in enumerate(["p32" in aligned, "p16" in aligned, n % 16 == 0, m % 16 == 0]) if ok]
    return (f"func @k(%p32: ptr<f32>, %p16: ptr<f16>, %n: i32, %m: i32) "
            f"attributes {{divisible_by_16 = [{', '.join(map(str, divisible))}]}} {{\n"
            f"  %pid = program_id {{axis = 0}} : i32\n")


# Operands of 16 lanes that exercise every rule: runs at aligned and unaligned, negative and
# program-dependent starts; splats of constants and arguments; constant groups with large divisibility.
CATALOG = {
    "c0": "splat %s0", "c1": "splat %s1", "cm1": "splat %sm1", "c2": "splat %s2", "c3": "splat %s3",
    "c4": "splat %s4", "c6": "splat %s6", "c8": "splat %s8", "c16": "splat %s16", "cm4": "splat %sm4",
    "c40": "splat %s40", "n16": "splat %n", "m16": "splat %m", "pid1": "splat %pid",
    "pid16": "splat %pid16s",
    "pid4": "splat %pid4s",
    "run0": "arange {end = 16, start = 0}",
    "run16": "arange {end = 32, start = 16}",
    "run_neg": "arange {end = 0, start = -16}",
    "run_neg4": "arange {end = 12, start = -4}",
    "run3": "arange {end = 19, start = 3}",
    "run120": "arange {end = 136, start = 120}",
    "run_pid": "add %pid16, %run0",
    "run_pid4": "add %pid4, %run0",
    "quarter": "shr %run0, %c2",
    "quads": "shl %quarter, %c6",
    "floor4": "and %run_neg, %cm4",
    "mod8": "rem %run16, %c8",
}
NONZERO = [k for k in CATALOG if k.startswith("c") and k != "c0" or k in ("n16", "m16", "run16", "run3")]
SHIFTS = ["c0", "c1", "c2", "c3", "c4", "c40", "pid1", "m16"]     # m is 7: unknown amounts too


def _catalog_kernel(op: str, n: int, m: int) -> Function:
    """The catalog, then `op` applied to every pair of catalog operands (built directly: parsing is slow)."""
    lines = [_signature({"p32"}, n, m)]
    for value in (0, 1, -1, 2, 3, 4, 6, 8, 16, -4, 40):
        lines.append(f"  %s{'m' if value < 0 else ''}{abs(value)} = constant {{value = {value}}} : i32\n")
    lines.append("  %pid16s = mul %pid, %s16 : i32\n  %pid4s = mul %pid, %s4 : i32\n")
    lines.append(f"  %ptrs = splat %p32 : {_tile((16,), 'ptr<f32>')}\n")
    lines += [f"  %{name} = {text} : {_tile((16,))}\n" for name, text in CATALOG.items()]
    fn = parse_module("".join(lines) + "  return\n}\n").functions[0]
    operands = {v.name_hint: v for op_ in fn.body.ops for v in op_.results}
    ret = fn.body.ops.pop()
    b = Builder()
    rhs = NONZERO if op in ("div", "rem") else SHIFTS if op in ("shl", "shr") else list(CATALOG)
    with b.at(fn.body):
        if op in UNARY:
            name, _, dtype = op.partition(":")
            for x in CATALOG:
                if dtype:
                    b.create(name, [operands[x]], result_types=[_tile_type(dtype)])
                else:
                    b.create(name, [operands[x]])
            rhs = []
        for x in CATALOG:
            for y in rhs:
                a, c = operands[x], operands[y]
                if op.startswith("cmp_"):
                    cond = b.create("cmp", [a, c], {"pred": op[4:]}).result
                    b.create("select", [cond, a, c])
                elif op == "addptr":
                    base = b.create("addptr", [operands["ptrs"], c]).result
                    b.create("addptr", [base, a])
                else:
                    b.create(op, [a, c])
    fn.body.append(ret)
    return fn


UNARY = ("neg", "abs", "not", "cast:i64", "cast:i8", "cast:u16", "cast:bool", "bitcast:u32")


def _tile_type(dtype: str) -> TileType:
    return TileType(ScalarType(dtype_from_name(dtype)), (16,))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "rem", "shl", "shr", "and", "or", "xor", "min", "max",
                                "cmp_lt", "cmp_le", "cmp_gt", "cmp_ge", "cmp_eq", "cmp_ne", "addptr", *UNARY])
def test_every_rule_is_sound_on_every_pair_of_catalog_operands(op):
    n, m = 48, 7
    assert_facts_hold(_catalog_kernel(op, n, m), n, m, {"p32"})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index_kernels())
def test_every_claimed_fact_holds_of_the_computed_values(kernel):
    text, n, m, aligned = kernel
    assert_facts_hold(parse_module(text).functions[0], n, m, aligned, text)
