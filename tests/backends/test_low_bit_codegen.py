"""Low-bit values in the LLVM backends: the very IR the GPUs get, run on this CPU, and what the GPUs select.

Specification:

* `unpack_bits` (bytes -> values) computes `DType.decode` then `quantize`
  for every bit pattern of every type of 1 to 8 bits, to its own type and
  to f16, bf16 and f32, for whole and partial 32-bit words: the JIT runs
  the IR `backends/llvm/low_bit.py` emits on this CPU;
* `pack_bits` is its inverse;
* sub-byte integers live in i8 registers: arithmetic wraps to the type's
  bits and casts to and from every type match `quantize`, as do the
  conversions of fp6, fp4 and e8m0 (decode exactly, encode rounding to
  nearest even with the overflow and NaN rules of `dtypes`);
* the fast conversions are the instructions their docstring promises: u4 ->
  f16 is `prmt`, `lop3`-able and/or and packed f16x2 subtraction on NVIDIA
  (no `cvt`), `v_perm_b32` and `v_pk_add_f16` on AMD.
"""

from __future__ import annotations

import ctypes
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tessera.backends.llvm.codegen_table import COMMON
from tessera.backends.llvm.types import register_type
from tessera.backends.nvptx import compile_thread_ir
from tessera.backends.amdgpu import compile_thread_ir as compile_amdgpu
from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.parser import parse_module
from tessera.ir.types import RegsType, ScalarType

from test_nvptx_numerics import CAST_TYPES, _edge_values, _HostCodegen, _Jit

UP_TO_A_BYTE = [d for d in dt.ALL_DTYPES if d.bits <= 8 and not d.is_bool]
SUB_BYTE_INTS = [d for d in dt.ALL_DTYPES if d.is_subbyte and d.is_int]
SMALL_FLOATS = [dt.f6e2m3, dt.f6e3m2, dt.f4e2m1, dt.e8m0]
RESULTS = (dt.f16, dt.bf16, dt.f32)


def _counts(dtype: dt.DType) -> tuple[int, ...]:
    """Element counts per call (whole bytes each): as many as 32 bytes hold, and 8 or 6, whose bytes end
    inside a 32-bit word."""
    return (256 // dtype.bits // 8 * 8, 8 if dtype.bits < 8 else 6)


class _RegisterJit:
    """`void name(i8* bytes_in, T* out)` per (op, types): one register array per call, compiled once."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.module = ir.Module("host")
        self.module.triple = llvm.get_process_triple()
        self.engine = None

    def add(self, name: str, op: Operation) -> None:
        ptr = ir.PointerType()
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [ptr, ptr]), name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        operand = op.operands[0].type
        value = b.load(fn.args[0], typ=register_type(operand), align=1)
        b.store(COMMON[op.name](_HostCodegen(b), op, value), fn.args[1], align=1)
        b.ret_void()

    def run(self, name: str, data: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.engine is None:
            host = llvm.Target.from_default_triple()
            tm = host.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten())
            parsed = llvm.parse_assembly(str(self.module))
            parsed.verify()
            self.engine = llvm.create_mcjit_compiler(parsed, tm)
            self.engine.finalize_object()
        data = np.ascontiguousarray(data)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(self.engine.get_function_address(name))
        fn(data.ctypes.data, out.ctypes.data)
        return out


def _unpack_op(packed: dt.DType, result: dt.DType, count: int) -> Operation:
    data = Value(RegsType(ScalarType(dt.u8), count * packed.bits // 8))
    return Operation("unpack_bits", [data], [RegsType(ScalarType(result), count)], {"packed": packed.name})


@pytest.fixture(scope="module")
def jit():
    j = _RegisterJit()
    for packed in UP_TO_A_BYTE:
        for count in _counts(packed):
            for result in (packed, *RESULTS):
                j.add(f"unpack_{packed.name}_{result.name}_{count}", _unpack_op(packed, result, count))
            values = Value(RegsType(ScalarType(packed), count))
            j.add(f"pack_{packed.name}_{count}", Operation("pack_bits", [values], [
                RegsType(ScalarType(dt.u8), count * packed.bits // 8)]))
    return j


def _patterns(dtype: dt.DType, count: int) -> np.ndarray:
    """Every bit pattern several times over, in shuffled chunks of `count`."""
    every = np.tile(np.arange(1 << dtype.bits), max(4, 4 * count >> dtype.bits))
    every = np.random.default_rng(dtype.bits).permutation(every)
    return every[:len(every) // count * count].reshape(-1, count)


def _registers(values: np.ndarray, dtype: dt.DType) -> np.ndarray:
    """What registers of `dtype` hold for these values: f16/f32 as themselves, bf16 and small floats as bit
    patterns, sub-byte integers as their value in a byte."""
    if dtype.is_int and dtype.is_subbyte:
        return values.astype(np.int8 if dtype.is_signed else np.uint8)
    return dtype.encode(values) if dtype.storage_dtype.kind == "u" and dtype.is_float else values


@pytest.mark.parametrize("packed", UP_TO_A_BYTE, ids=str)
def test_unpack_bits_converts_every_pattern_exactly(jit, packed):
    for count in _counts(packed):
        for result in (packed, *RESULTS):
            name = f"unpack_{packed.name}_{result.name}_{count}"
            out_dtype = np.int8 if result.is_int and result.is_subbyte and result.is_signed else result.storage_dtype
            for chunk in _patterns(packed, count):
                got = jit.run(name, dt.pack(chunk, packed), np.zeros(count, out_dtype))
                want = result.quantize(packed.decode(chunk))
                if result.is_float:     # values, NaN equal to NaN (a NaN pattern may keep its sign)
                    got = result.decode(got) if got.dtype.kind == "u" else got
                    same = (got == want) | (np.isnan(got) & np.isnan(want))
                else:
                    same = got == _registers(want, result)
                assert same.all(), f"{name}: patterns {chunk[~same]} gave {got[~same]}, expected {want[~same]}"


@pytest.mark.parametrize("packed", UP_TO_A_BYTE, ids=str)
def test_pack_bits_inverts_unpack_bits(jit, packed):
    for count in _counts(packed):
        for chunk in _patterns(packed, count)[:4]:
            registers = chunk.astype(np.uint8) if packed.is_float else _registers(packed.decode(chunk), packed)
            got = jit.run(f"pack_{packed.name}_{count}", registers, np.zeros(count * packed.bits // 8, np.uint8))
            np.testing.assert_array_equal(got, dt.pack(chunk, packed))


# -- sub-byte integers and small floats in registers ---------------------------------------------

ARITHMETIC = ("add", "sub", "mul", "div", "rem", "min", "max", "shl", "shr", "and", "xor")


@pytest.fixture(scope="module")
def scalar_jit():
    j = _Jit()
    casts = set()
    for d in SUB_BYTE_INTS:
        for name in ARITHMETIC:
            j.add(f"{name}_{d.name}", name, [d, d], d)
        casts |= {(d, other) for other in (*CAST_TYPES, dt.f16, dt.i3, dt.u5) if other != d}
    casts |= {(f, other) for f in SMALL_FLOATS for other in (dt.f32, dt.f64, dt.i32, dt.i3)}
    for a, b in casts | {(b, a) for a, b in casts}:
        j.add(f"cast_{a.name}_{b.name}", "cast", [a], b)
    return j


def _stored(values: np.ndarray, d: dt.DType) -> np.ndarray:
    """Values as the harness passes them in registers: small floats as bit patterns, others as they are."""
    return d.encode(values) if d.is_float and d.storage_dtype.kind == "u" else values


def _read(got: np.ndarray, d: dt.DType) -> np.ndarray:
    """What the harness hands back, as values (sub-byte signed ints: the byte read as int8)."""
    if d.is_int and d.is_subbyte and d.is_signed:
        return got.view(np.int8)
    return d.decode(got) if d.is_float and got.dtype.kind == "u" else got


def _same(got: np.ndarray, want: np.ndarray, d: dt.DType) -> np.ndarray:
    if d.is_float:
        return (got == want) | (np.isnan(got) & np.isnan(want))
    return got == want.astype(got.dtype)


@pytest.mark.parametrize("d", SUB_BYTE_INTS, ids=str)
def test_sub_byte_integer_arithmetic_wraps_to_the_types_bits(scalar_jit, d):
    values = np.arange(d.min_value, d.max_value + 1)
    a, b = (x.ravel() for x in np.meshgrid(values, values))
    wide = {"add": a + b, "sub": a - b, "mul": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b),
            "and": a & b, "xor": a ^ b,
            "shl": np.where((b >= 0) & (b < d.bits), a << np.clip(b, 0, 7), 0),
            "shr": np.where((b >= 0) & (b < d.bits), a >> np.clip(b, 0, 7), np.where(a < 0, -1, 0)),
            "div": np.where(b == 0, 0, np.trunc(a / np.where(b == 0, 1, b))).astype(np.int64)}
    wide["rem"] = np.where(b == 0, 0, a - b * wide["div"])
    for name, exact in wide.items():
        got = _read(scalar_jit.run(f"{name}_{d.name}", d.quantize(a), d.quantize(b)), d)
        assert (got == d.quantize(exact)).all(), f"{name} on {d.name}"


@pytest.mark.parametrize("d", SUB_BYTE_INTS + SMALL_FLOATS, ids=str)
def test_casts_of_sub_byte_integers_and_small_floats_match_quantize(scalar_jit, d):
    partners = [name.split("_")[2] for name in scalar_jit.ops if name.startswith(f"cast_{d.name}_")]
    mine = d.decode(np.arange(1 << d.bits))
    for other in map(dt.dtype_from_name, partners):
        x = other.decode(np.arange(1 << other.bits)) if other.bits <= 8 else other.quantize(_edge_values(other))
        got = _read(scalar_jit.run(f"cast_{other.name}_{d.name}", _stored(x, other)), d)
        assert _same(got, d.quantize(x), d).all(), f"cast {other.name} -> {d.name}: {x} gave {got}"
        got = _read(scalar_jit.run(f"cast_{d.name}_{other.name}", _stored(mine, d)), other)
        assert _same(got, other.quantize(mine), other).all(), f"cast {d.name} -> {other.name}: {mine} gave {got}"


# -- what the GPUs select ---------------------------------------------------------------------------

def unpack_kernel(warp: int) -> str:
    """Each thread loads 16 bytes (32 u4), unpacks them to f16 and stores the 32 halves."""
    lanes = "\n".join(f"  %l{i} = constant {{value = {i}}} : i32" for i in range(32))
    return f"""\
func @unpack(%src: ptr<u8>, %dst: ptr<f16>) attributes {{num_threads = 128, shared_bytes = 0, warp_size = {warp}}} {{
  %tid = thread_id : i32
  %c16 = constant {{value = 16}} : i32
  %c32 = constant {{value = 32}} : i32
  %b = mul %tid, %c16 : i32
  %h = mul %tid, %c32 : i32
{lanes}
  %bytes_lanes = pack {", ".join(f"%l{i}" for i in range(16))} : regs<16xi32>
  %half_lanes = pack {", ".join(f"%l{i}" for i in range(32))} : regs<32xi32>
  %bs = splat %b : regs<16xi32>
  %hs = splat %h : regs<32xi32>
  %bo = add %bs, %bytes_lanes : regs<16xi32>
  %ho = add %hs, %half_lanes : regs<32xi32>
  %srcs = splat %src : regs<16xptr<u8>>
  %from = addptr %srcs, %bo : regs<16xptr<u8>>
  %bytes = load %from {{vector = 16}} : regs<16xu8>
  %x = unpack_bits %bytes {{packed = "u4"}} : regs<32xf16>
  %dsts = splat %dst : regs<32xptr<f16>>
  %to = addptr %dsts, %ho : regs<32xptr<f16>>
  store %to, %x {{vector = 8}}
  return
}}
"""


def _instructions(assembly: str) -> list[str]:
    return [line.split()[0] for line in assembly.splitlines()
            if line.startswith("\t") and not line.startswith(("\t.", "\t//", "\t;"))]


def test_u4_to_f16_is_byte_permutes_masks_and_packed_subtractions():
    """32 values, 16 pairs: NVIDIA spends one prmt, one and, one or (one lop3 after ptxas) and one add.f16x2
    per pair, plus a shift per word; AMD a v_perm_b32 (or shift and SDWA moves where its selector prefers
    them) and one v_pk_add_f16 per pair. Neither converts an integer to a float."""
    ptx = _instructions(compile_thread_ir(parse_module(unpack_kernel(32)).functions[0], "sm_90a").ptx)
    assert sum(i.startswith("prmt") for i in ptx) == 16
    assert sum(i.startswith("add.rn.f16x2") for i in ptx) == 16
    assert sum(i.startswith(("and.b32", "or.b32", "shr.u32")) for i in ptx) <= 16 * 2 + 4 + 3   # + 3: addresses
    assert not any(i.startswith("cvt") for i in ptx)
    amd = _instructions(compile_amdgpu(parse_module(unpack_kernel(64)).functions[0], "gfx942").assembly)
    assert sum(i == "v_pk_add_f16" for i in amd) == 16
    assert any(i == "v_perm_b32" for i in amd)
    assert sum(i.startswith("v_") for i in amd) <= 16 * 7
    assert not any(i.startswith("v_cvt") for i in amd)
