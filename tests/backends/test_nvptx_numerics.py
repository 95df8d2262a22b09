"""The NVPTX lowerings compute what the IR's numerics say, checked without a GPU.

The lowering functions emit target-independent LLVM IR for elementwise ops
and casts, so the same IR, wrapped in a loop over arrays, is JIT-compiled
for this CPU and run on edge cases (NaN, inf, -0, MIN / -1, division by
zero, out-of-range shifts and casts). The reference is `DType.quantize` for
casts and the rules in `tessera/ir/ops.py` / `dtypes.py` for the rest.
(f16 and bf16 need conversion routines this CPU's JIT may lack; the
NVPTX-only parts, like math functions, are covered by the PTX tests.)
"""

import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tessera.backends.llvm import codegen as llvm_codegen
from tessera.backends.nvptx import intrinsics
from tessera.backends.llvm.types import memory_type
from tessera.backends.nvptx.codegen_table import CODEGEN
from tessera.ir import dtypes as dt
from tessera.ir.core import Operation, Value
from tessera.ir.target import get_target
from tessera.ir.types import ScalarType

INTS = (dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64)
CAST_TYPES = (dt.bool_, *INTS, dt.f32, dt.f64)


class _HostCodegen:
    """What codegen functions use of `llvm_codegen.Codegen`, for a plain CPU function."""

    map_lanes = llvm_codegen.Codegen.map_lanes

    codegen_table = CODEGEN

    def __init__(self, builder):
        self.builder = builder
        self.target = get_target("sm_90a")
        self.float_flags = ()
        self.use_libdevice = False

    def intrinsic(self, name, args, overloads=()):
        return intrinsics.call(self.builder, name, args, overloads)


def _elementwise(module: ir.Module, name: str, op: Operation) -> None:
    """`void name(in0*, in1*, out*, i64 n)`: out[i] = op(in0[i], in1[i])."""
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, ir.IntType(64)]), name)
    *inputs, out, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    entry = b.block
    loop, body, done = fn.append_basic_block("loop"), fn.append_basic_block("body"), fn.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    values = []
    for value, base in zip(op.operands, inputs):
        d = value.type.dtype
        x = b.load(b.gep(base, [i], source_etype=memory_type(d)), typ=memory_type(d))
        values.append(b.icmp_unsigned("!=", x, ir.Constant(x.type, 0)) if d.is_bool else x)
    result = llvm_codegen.generate_op(_HostCodegen(b), op, values)
    d = op.result.type.dtype
    if d.is_bool:
        result = b.zext(result, ir.IntType(8))
    b.store(result, b.gep(out, [i], source_etype=memory_type(d)))
    i.add_incoming(b.add(i, ir.Constant(ir.IntType(64), 1)), b.block)
    b.branch(loop)
    b.position_at_end(done)
    b.ret_void()


class _Jit:
    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.module = ir.Module("host")
        self.module.triple = llvm.get_process_triple()
        self.ops: dict[str, Operation] = {}
        self.engine = None

    def add(self, name: str, op_name: str, in_dtypes, out_dtype, attrs=None) -> None:
        operands = [Value(ScalarType(d)) for d in in_dtypes]
        op = Operation(op_name, operands, [ScalarType(out_dtype)], attrs or {})
        self.ops[name] = op
        _elementwise(self.module, name, op)

    def run(self, name: str, *arrays) -> np.ndarray:
        if self.engine is None:
            host = llvm.Target.from_default_triple()
            tm = host.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                            features=llvm.get_host_cpu_features().flatten())
            parsed = llvm.parse_assembly(str(self.module))
            parsed.verify()
            self.engine = llvm.create_mcjit_compiler(parsed, tm)
            self.engine.finalize_object()
        op = self.ops[name]
        ins = [np.ascontiguousarray(a, dtype=v.type.dtype.storage_dtype) for a, v in zip(arrays, op.operands)]
        ins += [ins[0]] * (2 - len(ins))
        out = np.zeros(len(ins[0]), dtype=op.result.type.dtype.storage_dtype)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address(name))
        fn(ins[0].ctypes.data, ins[1].ctypes.data, out.ctypes.data, len(out))
        return out


def _edge_values(d: dt.DType) -> np.ndarray:
    if d.is_bool:
        return np.array([False, True])
    if d.is_float:
        return np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 127.5, 128.0, -128.5, 255.5, 256.0, 32767.9, 65535.5,
                         2.0**31, -2.0**31 - 1000, 2.0**32 + 7, 2.0**63, -2.0**63, 2.0**64, 1e30, -1e30, 3.4e38,
                         1e300, np.inf, -np.inf, np.nan], dtype=d.compute_dtype if d.bits == 64 else np.float64)
    lo, hi = int(d.min_value), int(d.max_value)
    picks = {lo, lo + 1, -1 if lo < 0 else 0, 0, 1, 2, 7, 100, hi - 1, hi, (lo + hi) // 3}
    return np.array(sorted(v for v in picks if lo <= v <= hi), dtype=d.compute_dtype)


@pytest.fixture(scope="module")
def jit():
    j = _Jit()
    for src in CAST_TYPES:
        for dst in CAST_TYPES:
            if src != dst:
                j.add(f"cast_{src.name}_{dst.name}", "cast", [src], dst)
    for d in INTS:
        for name in ("div", "rem", "shl", "shr", "min", "max"):
            j.add(f"{name}_{d.name}", name, [d, d], d)
    for d in (dt.f32, dt.f64):
        for name in ("min", "max", "div"):
            j.add(f"{name}_{d.name}", name, [d, d], d)
        for pred in ("eq", "ne", "lt", "ge"):
            j.add(f"cmp_{pred}_{d.name}", "cmp", [d, d], dt.bool_, {"pred": pred})
    j.add("bitcast_u8_bool", "bitcast", [dt.u8], dt.bool_)
    j.add("bitcast_bool_i8", "bitcast", [dt.bool_], dt.i8)
    return j


@pytest.mark.parametrize("src", CAST_TYPES, ids=str)
def test_casts_match_quantize(jit, src):
    x = src.quantize(_edge_values(src))
    for dst in CAST_TYPES:
        if dst == src:
            continue
        got = jit.run(f"cast_{src.name}_{dst.name}", x)
        want = dst.quantize(x)
        same = (got == want) | (np.isnan(want) & np.isnan(got)) if dst.is_float else got == want
        assert same.all(), f"cast {src.name} -> {dst.name}: {x[~same]} gave {got[~same]}, expected {want[~same]}"


def _pairs(d: dt.DType):
    v = d.quantize(_edge_values(d))
    a, b = np.meshgrid(v, v)
    return a.ravel(), b.ravel()


@pytest.mark.parametrize("d", INTS, ids=str)
def test_integer_division_truncates_and_a_zero_divisor_gives_zero(jit, d):
    a, b = _pairs(d)
    wide_a, wide_b = a.astype(object), b.astype(object)
    q = [0 if y == 0 else abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(wide_a, wide_b)]
    r = [0 if y == 0 else x - y * qq for x, y, qq in zip(wide_a, wide_b, q)]
    assert (jit.run(f"div_{d.name}", a, b) == _wrap(q, d)).all()
    assert (jit.run(f"rem_{d.name}", a, b) == _wrap(r, d)).all()


def _wrap(values, d: dt.DType) -> np.ndarray:
    mask = (1 << d.bits) - 1
    out = []
    for v in values:
        v &= mask
        out.append(v - (1 << d.bits) if d.kind == "int" and v >> (d.bits - 1) else v)
    return np.array(out, dtype=d.compute_dtype)


@pytest.mark.parametrize("d", INTS, ids=str)
def test_shifts_out_of_range_give_zero_or_the_sign(jit, d):
    a = np.repeat(_edge_values(d), 8)
    amounts = _wrap([0, 1, d.bits - 1, d.bits, d.bits + 1, 3, -1, 2], d)  # -1: negative or huge
    b = np.tile(amounts, len(a) // 8)
    wide_a, wide_b = [int(x) for x in a], [int(x) for x in b]
    shl = [0 if not 0 <= s < d.bits else x << s for x, s in zip(wide_a, wide_b)]
    shr = [(-1 if x < 0 else 0) if not 0 <= s < d.bits else x >> s for x, s in zip(wide_a, wide_b)]
    assert (jit.run(f"shl_{d.name}", a, b) == _wrap(shl, d)).all()
    assert (jit.run(f"shr_{d.name}", a, b) == _wrap(shr, d)).all()
    assert (jit.run(f"min_{d.name}", a, b) == np.minimum(a, b)).all()
    assert (jit.run(f"max_{d.name}", a, b) == np.maximum(a, b)).all()


@pytest.mark.parametrize("d", [dt.f32, dt.f64], ids=str)
def test_float_min_max_ignore_nan_and_ne_is_unordered(jit, d):
    a, b = _pairs(d)
    np.testing.assert_array_equal(jit.run(f"min_{d.name}", a, b), np.fmin(a, b))
    np.testing.assert_array_equal(jit.run(f"max_{d.name}", a, b), np.fmax(a, b))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(jit.run(f"div_{d.name}", a, b), a / b)
    for pred, ref in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("ge", np.greater_equal)):
        np.testing.assert_array_equal(jit.run(f"cmp_{pred}_{d.name}", a, b).astype(bool), ref(a, b))


def test_bool_bitcasts_are_bytes(jit):
    np.testing.assert_array_equal(jit.run("bitcast_u8_bool", np.array([0, 1, 2, 255], dtype=np.uint8)),
                                  [0, 1, 1, 1])
    np.testing.assert_array_equal(jit.run("bitcast_bool_i8", np.array([False, True])), [0, 1])
