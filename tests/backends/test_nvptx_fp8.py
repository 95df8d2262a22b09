"""fp8 in the NVPTX backend: i8 bit patterns in registers, conversions that match `tessera.ir.dtypes` bit for bit.

The conversion IR (`tessera.backends.llvm.small_floats`) is target-independent integer arithmetic, so
the very lowering the GPU gets is JIT-compiled for this CPU (the harness of
`test_nvptx_numerics.py`) and checked against `DType.quantize`/`encode`: all
256 patterns of each format decode exactly, and encoding rounds to nearest
even (ties, subnormals, overflow: e4m3 saturates at +-448, e5m2 gives inf;
NaN gives the canonical NaN). A thread-IR kernel that loads fp8, scales in
f32 and stores fp8 then goes through ptxas for sm_80, sm_89 and sm_90a.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.backends.nvptx import CodegenError
from tessera.ir import dtypes as dt

from test_nvptx import compile_ir
from test_nvptx_numerics import CAST_TYPES, INTS, _edge_values, _Jit

FP8 = (dt.f8e4m3, dt.f8e5m2)
ALL_PATTERNS = np.arange(256, dtype=np.uint8)
# f16 and bf16 reach fp8 through an exact fpext to f32; this CPU's JIT may lack their runtime routines.
PARTNERS = (*CAST_TYPES, *FP8)


@pytest.fixture(scope="module")
def jit():
    j = _Jit()
    for f in FP8:
        for other in PARTNERS:
            if other != f:
                j.add(f"cast_{f.name}_{other.name}", "cast", [f], other)
                if other not in FP8:
                    j.add(f"cast_{other.name}_{f.name}", "cast", [other], f)
    return j


def _same(got, want, d: dt.DType) -> np.ndarray:
    if d.is_float and d not in FP8:
        return (got == want) | (np.isnan(got) & np.isnan(want))
    return got == want


@pytest.mark.parametrize("src", FP8, ids=str)
def test_every_pattern_converts_exactly(jit, src):
    values = src.decode(ALL_PATTERNS)
    for dst in PARTNERS:
        if dst == src:
            continue
        got = jit.run(f"cast_{src.name}_{dst.name}", ALL_PATTERNS)
        want = dst.encode(values) if dst in FP8 else dst.quantize(values)
        same = _same(got, want, dst)
        assert same.all(), f"{src.name} -> {dst.name}: {ALL_PATTERNS[~same]} gave {got[~same]}, expected {want[~same]}"


def _encode_inputs(src: dt.DType, f: dt.DType) -> np.ndarray:
    """Edge values, every fp8 value, the midpoints between neighbours (ties) and a nudge either side."""
    exact = f.decode(ALL_PATTERNS[ALL_PATTERNS < 0x7F]).astype(np.float64)  # the positive half, NaN left out
    exact = np.sort(exact[np.isfinite(exact)])
    ties = (exact[:-1] + exact[1:]) / 2
    top = float(f.max_value)
    beyond = [top * 1.0625, top * 1.125, top * 1.5, top * 2, 1e30, f.decode(np.uint8(1)) / 2, 2.0**-30]
    xs = np.concatenate([exact, ties, ties * (1 + 2.0**-20), ties * (1 - 2.0**-20), beyond])
    xs = np.concatenate([xs, -xs, _edge_values(src)])
    return src.quantize(xs)


@pytest.mark.parametrize("f", FP8, ids=str)
@pytest.mark.parametrize("src", [dt.f32, dt.f64], ids=str)
def test_encode_rounds_to_nearest_even_with_the_overflow_rule(jit, f, src):
    x = _encode_inputs(src, f)
    got = jit.run(f"cast_{src.name}_{f.name}", x)
    want = f.encode(x)
    assert (got == want).all(), f"{src.name} -> {f.name}: {x[got != want]} gave {got[got != want]}"
    big = np.array([1e6, -1e6, np.inf, -np.inf, np.nan], dtype=src.compute_dtype)
    expected = {dt.f8e4m3: [0x7E, 0xFE, 0x7E, 0xFE, 0x7F], dt.f8e5m2: [0x7C, 0xFC, 0x7C, 0xFC, 0x7E]}[f]
    assert list(jit.run(f"cast_{src.name}_{f.name}", big)) == expected


@pytest.mark.parametrize("f", FP8, ids=str)
@pytest.mark.parametrize("src", INTS, ids=str)
def test_integers_round_once(jit, f, src):
    lo, hi = int(src.min_value), int(src.max_value)
    picks = [v for v in (lo, -2**21, -449, -464, -20, -1, 0, 1, 17, 19, 240, 248, 255, 456, 464, 57343, 61440,
                         2**20 + 1, 2**31, hi) if lo <= v <= hi]
    x = np.array(picks, dtype=src.compute_dtype)
    np.testing.assert_array_equal(jit.run(f"cast_{src.name}_{f.name}", x), f.encode(x))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_encode_matches_quantize_on_arbitrary_f32(jit, values):
    x = np.array(values, dtype=np.float32)
    for f in FP8:
        np.testing.assert_array_equal(jit.run(f"cast_f32_{f.name}", x), f.encode(x))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=64, min_value=-2e5, max_value=2e5), min_size=1, max_size=64))
def test_encode_matches_quantize_on_arbitrary_f64(jit, values):
    x = np.array(values, dtype=np.float64)
    for f in FP8:
        np.testing.assert_array_equal(jit.run(f"cast_f64_{f.name}", x), f.encode(x))


# -- kernels ----------------------------------------------------------------------------------

SCALE_FP8 = """\
func @scale(%x: ptr<{t}>, %out: ptr<{t}>, %s: f32) attributes {{noalias = [0, 1], num_threads = 128, shared_bytes = 0, warp_size = 32}} {{
  %tid = thread_id : i32
  %pid = program_id {{axis = 0}} : i32
  %block = constant {{value = 512}} : i32
  %four = constant {{value = 4}} : i32
  %base = mul %pid, %block : i32
  %first = mul %tid, %four : i32
  %start = add %base, %first : i32
  %starts = splat %start : regs<4xi32>
  %xs = splat %x : regs<4xptr<{t}>>
  %xp = addptr %xs, %starts : regs<4xptr<{t}>>
  %os = splat %out : regs<4xptr<{t}>>
  %op = addptr %os, %starts : regs<4xptr<{t}>>
  %a = load %xp {{vector = 4}} : regs<4x{t}>
  %w = cast %a : regs<4xf32>
  %ss = splat %s : regs<4xf32>
  %y = mul %w, %ss : regs<4xf32>
  %b = cast %y : regs<4x{t}>
  %h = cast %b : regs<4xf16>
  %c = cast %h : regs<4x{t}>
  store %op, %c {{vector = 4}}
  return
}}
"""


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a"])
@pytest.mark.parametrize("t", ["f8e4m3", "f8e5m2"])
def test_fp8_scale_kernel_compiles(target, t):
    a = compile_ir(SCALE_FP8.format(t=t), target)
    assert "load <4 x i8>, ptr addrspace(1)" in a.llvm_ir and "align 4" in a.llvm_ir
    assert re.search(r"ld\.global\.nc\.(v4\.u8|u32|b32|v4\.b8)", a.ptx), "one 32-bit access for 4 fp8 values"
    assert "st.global" in a.ptx


def test_fp8_constants_are_bit_patterns():
    text = """\
func @k(%out: ptr<f8e4m3>) attributes {num_threads = 32, shared_bytes = 0, warp_size = 32} {
  %c = constant {value = 1000.0} : f8e4m3
  store %out, %c
  return
}
"""
    a = compile_ir(text, "sm_80")
    assert "store i8 126" in a.llvm_ir  # 1000 saturates to 448 = 0x7E


def test_arithmetic_on_fp8_asks_for_a_cast():
    text = """\
func @k(%x: ptr<f8e5m2>) attributes {num_threads = 32, shared_bytes = 0, warp_size = 32} {
  %v = load %x : f8e5m2
  %w = add %v, %v : f8e5m2
  store %x, %w
  return
}
"""
    with pytest.raises(CodegenError, match=r"`add` on f8e5m2: .* cast to f32"):
        compile_ir(text, "sm_90a")


def test_fp8_moves_through_shuffles_registers_and_scalar_parameters():
    text = """\
func @k(%x: ptr<f8e5m2>, %c: f8e4m3) attributes {num_threads = 32, shared_bytes = 0, warp_size = 32} {
  %v = load %x : f8e5m2
  %one = constant {value = 1} : i32
  %w = shuffle %v, %one {mode = "bfly"} : f8e5m2
  %r = splat %w : regs<2xf8e5m2>
  %e = extract %r {index = 1} : f8e5m2
  %b = bitcast %e : u8
  %y = bitcast %b : f8e5m2
  store %x, %y
  %d = cast %c : f8e5m2
  store %x, %d
  return
}
"""
    a = compile_ir(text, "sm_80")
    assert "shfl.sync.bfly" in a.ptx
    assert re.search(r"\.param \.[ub]8 k_param_1", a.ptx), "the fp8 scalar parameter is one byte"
